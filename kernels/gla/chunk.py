"""Chunk-parallel GLA forward (Triton): the algorithm flash-linear-attention uses.

The sequence is cut into chunks of BT = 64 tokens. Three kernels:

1. `_chunk_cumsum_kernel`   b = cumulative sum of gk inside each chunk (fp32).
2. `_chunk_h_kernel`        the inter-chunk recurrence: the state at the start of every
                            chunk, S_next = Diag(e^{b_C}) S + (K ⊙ e^{b_C - b})^T V, one
                            program per (K-tile, V-tile, batch*head) walking the chunks.
3. `_chunk_o_kernel`        every chunk in parallel: o = (Q ⊙ e^{b}) S_chunk_start
                            + A V, with the intra-chunk scores A computed on tensor cores
                            for sub-block pairs below the diagonal (re-based so every
                            exponent is <= 0) and elementwise on the 16x16 diagonal blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import INTERPRET
from .naive import check_gla_inputs

BT, BC = 64, 16  # chunk length, sub-chunk length (secondary chunking on the diagonal)


def _configs(space, warps, stages):
    """Autotune configs; under the interpreter a single one (the first)."""
    if INTERPRET:
        return [triton.Config(space[0], num_warps=4)]
    return [triton.Config(kw, num_warps=w, num_stages=s) for kw in space for w in warps for s in stages]


def _fits(configs, named_args, **kwargs):
    K, V = named_args["K"], named_args["V"]
    pk, pv = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    keep = [c for c in configs if c.kwargs.get("BK", 16) <= pk and c.kwargs.get("BV", 16) <= pv]
    return keep or configs[:1]


@triton.jit
def _chunk_cumsum_kernel(gk, g, T, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_ = (o_t < T)[:, None] & (o_k < K)[None, :]
    p_ = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_g = tl.load(gk + p_, mask=m_, other=0.0).to(tl.float32)
    tl.store(g + p_, tl.cumsum(b_g, axis=0), mask=m_)


_H_SPACE = [{"BK": bk, "BV": bv} for bk in (32, 64) for bv in (32, 64)]


@triton.autotune(configs=_configs(_H_SPACE, (2, 4), (2, 3)), key=["K", "V", "NBH"], prune_configs_by={"early_config_prune": _fits})
@triton.jit
def _chunk_h_kernel(
    k, v, g, h, h0, ht, T, H, NT, NBH,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * V + o_v[None, :]
    if USE_H0:
        b_h = tl.load(h0 + i_bh * K * V + p_h, mask=m_h, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    for i_t in range(NT):
        # the state at the start of chunk i_t, for the output kernel (in the input dtype)
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_h, b_h.to(h.dtype.element_ty), mask=m_h)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        # K^T and b^T as [BK, BT] tiles, V as [BT, BV]
        p_kt = ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None]
        m_kt = m_k[:, None] & m_t[None, :]
        b_kt = tl.load(k + p_kt, mask=m_kt, other=0.0)
        b_gt = tl.load(g + p_kt, mask=m_kt, other=0.0)
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        b_gl = tl.load(g + ((i_b * T + t_last) * H + i_h) * K + o_k, mask=m_k, other=0.0)
        b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.0)
        # decay to the chunk end; every exponent b_last - b_t <= 0
        b_kt = (b_kt * tl.exp(b_gl[:, None] - b_gt)).to(b_v.dtype)
        b_h = b_h * tl.exp(b_gl)[:, None] + tl.dot(b_kt, b_v, input_precision=DOT_PREC)

    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_h, b_h, mask=m_h)


_O_SPACE = [{"BK": bk, "BV": bv} for bk in (32, 64) for bv in (64, 128)]


@triton.autotune(configs=_configs(_O_SPACE, (4, 8), (2,)), key=["K", "V"], prune_configs_by={"early_config_prune": _fits})
@triton.jit
def _chunk_o_kernel(
    q, k, v, g, h, o, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_r = tl.arange(0, BC)            # row inside a sub-chunk
    o_j = tl.arange(0, BT)            # row inside the chunk
    o_tt = i_t * BT + o_j
    m_tt = o_tt < T
    p_hc = h + ((i_b * NT + i_t) * H + i_h) * K * V

    for i_i in tl.static_range(BT // BC):          # sub-chunk i of the chunk: rows t0 .. t0+BC
        t0 = i_t * BT + i_i * BC
        if t0 < T:
            o_tc = t0 + o_r
            m_tc = o_tc < T
            b_o = tl.zeros([BC, BV], dtype=tl.float32)
            b_Aoff = tl.zeros([BC, BT], dtype=tl.float32)   # scores against earlier sub-chunks
            b_Ad = tl.zeros([BC, BC], dtype=tl.float32)     # scores inside the sub-chunk
            for i_k in range(tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                m_k = o_k < K
                p_qc = ((i_b * T + o_tc[:, None]) * H + i_h) * K + o_k[None, :]
                m_qc = m_tc[:, None] & m_k[None, :]
                b_q = tl.load(q + p_qc, mask=m_qc, other=0.0).to(tl.float32) * scale
                b_gq = tl.load(g + p_qc, mask=m_qc, other=0.0)
                # inter-chunk: (q ⊙ e^{b}) S_start, exponent b <= 0
                b_hs = tl.load(p_hc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
                b_o += tl.dot((b_q * tl.exp(b_gq)).to(b_hs.dtype), b_hs, input_precision=DOT_PREC)
                if i_i > 0:
                    # earlier sub-chunks, re-based at this sub-chunk's first row b_n:
                    # q ⊙ e^{b - b_n} (<= 0 after the start) and k ⊙ e^{b_n - b} (<= 0 before it)
                    b_gn = tl.load(g + ((i_b * T + t0) * H + i_h) * K + o_k, mask=m_k, other=0.0)
                    p_kc = ((i_b * T + o_tt[:, None]) * H + i_h) * K + o_k[None, :]
                    m_prev = (o_j < i_i * BC)[:, None] & m_k[None, :]
                    b_kc = tl.load(k + p_kc, mask=m_prev, other=0.0)
                    b_gk = tl.load(g + p_kc, mask=m_prev, other=0.0)
                    b_kn = b_kc * tl.exp(tl.where(m_prev, b_gn[None, :] - b_gk, 0.0))
                    b_qn = b_q * tl.exp(tl.where(m_tc[:, None], b_gq - b_gn[None, :], 0.0))
                    b_Aoff += tl.dot(b_qn.to(b_kc.dtype), tl.trans(b_kn.to(b_kc.dtype)), input_precision=DOT_PREC)
                # the diagonal sub-chunk, pair by pair: A[r, j] = sum_k q_rk k_jk e^{b_rk - b_jk}, j <= r
                for j in range(0, BC):
                    p_j = ((i_b * T + t0 + j) * H + i_h) * K + o_k
                    m_j = m_k & (t0 + j < T)
                    b_kj = tl.load(k + p_j, mask=m_j, other=0.0).to(tl.float32)
                    b_gj = tl.load(g + p_j, mask=m_j, other=0.0)
                    m_lo = (o_r >= j)[:, None] & m_tc[:, None]
                    b_e = tl.exp(tl.where(m_lo, b_gq - b_gj[None, :], float("-inf")))
                    b_a = tl.sum(b_q * b_kj[None, :] * b_e, axis=1)
                    b_Ad += tl.where(o_r[None, :] == j, b_a[:, None], 0.0)
            # assemble: A_off @ V_chunk + A_diag @ V_subchunk
            if i_i > 0:
                b_vc = tl.load(v + ((i_b * T + o_tt[:, None]) * H + i_h) * V + o_v[None, :],
                               mask=m_tt[:, None] & m_v[None, :], other=0.0)
                b_o += tl.dot(b_Aoff.to(b_vc.dtype), b_vc, input_precision=DOT_PREC)
            p_vc = ((i_b * T + o_tc[:, None]) * H + i_h) * V + o_v[None, :]
            m_vc = m_tc[:, None] & m_v[None, :]
            b_vi = tl.load(v + p_vc, mask=m_vc, other=0.0)
            b_o += tl.dot(b_Ad.to(b_vi.dtype), b_vi, input_precision=DOT_PREC)
            tl.store(o + p_vc, b_o.to(o.dtype.element_ty), mask=m_vc)


def chunk_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """Chunk-parallel GLA forward (Triton, chunk 64, sub-chunk 16): the prefill kernel.

    q, k, gk: [B, T, H, K]; v: [B, T, H, V]; gk = log of the per-channel decay (<= 0).
    Any T >= 1; K, V <= 256. fp32 / fp16 / bf16 inputs; gates and the carried state in fp32,
    the per-chunk state snapshots in the input dtype (they feed tensor-core matmuls).
    scale defaults to K**-0.5. initial_state / final state: fp32 [B, H, K, V].
    Returns (o [B, T, H, V] in v's dtype, final_state fp32 or None).

        >>> q, k, v, gk = torch.randn(4, 1, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).unbind(0)
        >>> gk = torch.nn.functional.logsigmoid(gk.float()) / 16
        >>> o, _ = chunk_gla(q, k, v, gk)
    """
    B, T, H, K, V, scale = check_gla_inputs(q, k, v, gk, scale, initial_state)
    q, k, v, gk = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v, gk))
    if initial_state is not None and not initial_state.is_contiguous():
        initial_state = initial_state.contiguous()
    NT = triton.cdiv(T, BT)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    # 1. cumulative log-gates inside each chunk
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    BKc = min(64, max(16, triton.next_power_of_2(K)))
    _chunk_cumsum_kernel[(triton.cdiv(K, BKc), NT, B * H)](gk, g, T, H, K, BT=BT, BK=BKc)
    # 2. the state at every chunk start (and the final state)
    h = torch.empty(B, NT, H, K, V, dtype=q.dtype, device=q.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    _chunk_h_kernel[lambda m: (triton.cdiv(K, m["BK"]), triton.cdiv(V, m["BV"]), B * H)](
        k, v, g, h, initial_state, ht, T, H, NT, B * H, K, V, BT=BT,
        USE_H0=initial_state is not None, STORE_HT=output_final_state, DOT_PREC=prec)
    # 3. every chunk's output in parallel
    o = torch.empty_like(v)
    _chunk_o_kernel[lambda m: (triton.cdiv(V, m["BV"]), NT, B * H)](
        q, k, v, g, h, o, scale, T, H, NT, K, V, BT=BT, BC=BC, DOT_PREC=prec)
    return o, ht
