"""Chunk-parallel GLA forward (Triton): the algorithm flash-linear-attention uses.

The sequence is cut into chunks of BT = 64 tokens, each chunk into sub-chunks of BC = 16.
Four kernels, each as parallel as its data dependencies allow:

1. `_chunk_cumsum_kernel`  b = cumulative sum of gk inside each chunk (fp32);
                           one program per (K-tile, chunk, batch*head).
2. `_chunk_h_kernel`       the only sequential pass: the state at the start of every chunk,
                           S_next = Diag(e^{b_C}) S + (K ⊙ e^{b_C - b})^T V; one program per
                           (K-tile, V-tile, batch*head) walks the chunks.
3. `_chunk_a_kernel`       the intra-chunk scores A[t, j] = sum_k q_tk k_jk e^{b_tk - b_jk}, j <= t;
                           one program per (sub-chunk, chunk, batch*head): tensor-core products
                           against earlier sub-chunks (re-based so every exponent is <= 0),
                           elementwise on its own 16x16 diagonal block.
4. `_chunk_o_kernel`       every chunk's output, two matmuls: o = (Q ⊙ e^{b}) S_start + A V;
                           one program per (V-tile, chunk, batch*head).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import INTERPRET
from .naive import check_gla_inputs

BT, BC = 64, 16  # chunk length, sub-chunk length (secondary chunking inside a chunk)


def _configs(space):
    """Autotune configs from (meta-params, num_warps, num_stages) triples; the first only under the interpreter."""
    if INTERPRET:
        return [triton.Config(space[0][0], num_warps=4)]
    return [triton.Config(kw, num_warps=w, num_stages=s) for kw, w, s in space]


def _fits(configs, named_args, **kwargs):
    """Drop configs whose tiles are wider than the (power-of-two padded) head dims."""
    K, V = named_args["K"], named_args["V"]
    pk, pv = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    keep = [c for c in configs if c.kwargs.get("BK", 16) <= pk and c.kwargs.get("BV", 16) <= pv]
    return keep or configs[:1]


# T, H and the chunk count NT change with every prompt; they only enter address arithmetic
# (always multiplied by the constexpr head dims), so `do_not_specialize` lets one compiled
# kernel serve every length instead of one per divisibility class of T.
@triton.jit(do_not_specialize=["T", "H"])
def _chunk_cumsum_kernel(gk, g, T, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_ = (o_t < T)[:, None] & (o_k < K)[None, :]
    p_ = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_g = tl.load(gk + p_, mask=m_, other=0.0).to(tl.float32)
    tl.store(g + p_, tl.cumsum(b_g, axis=0), mask=m_)


# (BK, BV), num_warps, num_stages. The H200 picked (64, 32) at B·H = 32 and (64, 64) at 64.
_H_CONFIGS = _configs([({"BK": 64, "BV": 32}, 2, 3), ({"BK": 64, "BV": 32}, 2, 4), ({"BK": 64, "BV": 64}, 2, 3)])


@triton.autotune(configs=_H_CONFIGS, key=["K", "V", "NBH"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "NBH"])
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


@triton.autotune(configs=_configs([({}, 2, 1), ({}, 4, 1)]), key=["K"])
@triton.jit(do_not_specialize=["T", "H"])
def _chunk_a_kernel(
    q, k, g, A, scale, T, H,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: the BC rows of sub-chunk i_c of chunk i_t, against every column j <= t
    i_c, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_t * BT + i_c * BC                       # first row of the sub-chunk
    if t0 < T:
        o_r = tl.arange(0, BC)
        o_t = t0 + o_r
        m_t = o_t < T
        o_k = tl.arange(0, BK)                     # the whole key dim (padded to a power of 2)
        m_k = o_k < K
        m_q = m_t[:, None] & m_k[None, :]
        p_q = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_q = tl.load(q + p_q, mask=m_q, other=0.0).to(tl.float32) * scale
        b_g = tl.load(g + p_q, mask=m_q, other=0.0)
        p_A = A + ((i_b * T + o_t[:, None]) * H + i_h) * BT + i_c * BC + o_r[None, :]

        # (a) earlier sub-chunks j < i_c, on tensor cores, re-based at b_n = b[t0]:
        #     q ⊙ e^{b - b_n} (rows at or after t0: exponent <= 0),
        #     k ⊙ e^{b_n - b} (rows before t0: exponent <= 0).
        b_gn = tl.load(g + ((i_b * T + t0) * H + i_h) * K + o_k, mask=m_k, other=0.0)
        b_qn = (b_q * tl.exp(tl.where(m_q, b_g - b_gn[None, :], 0.0))).to(k.dtype.element_ty)
        for i_j in range(0, i_c):
            p_k = ((i_b * T + i_t * BT + i_j * BC + o_r[:, None]) * H + i_h) * K + o_k[None, :]
            b_k = tl.load(k + p_k, mask=m_k[None, :], other=0.0)
            b_gk = tl.load(g + p_k, mask=m_k[None, :], other=0.0)
            b_kn = (b_k * tl.exp(b_gn[None, :] - b_gk)).to(k.dtype.element_ty)
            b_s = tl.dot(b_qn, tl.trans(b_kn), input_precision=DOT_PREC)     # [BC, BC]
            tl.store(p_A + (i_j - i_c) * BC, b_s.to(A.dtype.element_ty), mask=m_t[:, None])

        # (b) the diagonal BC x BC block, one column j at a time, elementwise in fp32:
        #     A[t, j] = sum_k q_tk k_jk e^{b_tk - b_jk} for j <= t (exponent <= 0), 0 above.
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for j in tl.static_range(BC):
            p_j = ((i_b * T + t0 + j) * H + i_h) * K + o_k
            m_j = m_k & (t0 + j < T)
            b_kj = tl.load(k + p_j, mask=m_j, other=0.0).to(tl.float32)
            b_gj = tl.load(g + p_j, mask=m_j, other=0.0)
            m_lo = (o_r >= j) & m_t
            b_e = tl.exp(tl.where(m_lo[:, None], b_g - b_gj[None, :], float("-inf")))
            b_a = tl.sum(b_q * b_kj[None, :] * b_e, axis=1)
            b_A += tl.where(o_r[None, :] == j, b_a[:, None], 0.0)
        tl.store(p_A, b_A.to(A.dtype.element_ty), mask=m_t[:, None])
        # the blocks above the diagonal are never written: the output kernel masks them


# (BK, BV), num_warps, num_stages. V = 64 keeps only the BV = 64 one.
_O_CONFIGS = _configs([({"BK": 64, "BV": 128}, 4, 3), ({"BK": 64, "BV": 128}, 8, 3), ({"BK": 64, "BV": 64}, 4, 3)])


@triton.autotune(configs=_O_CONFIGS, key=["K", "V"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT"])
def _chunk_o_kernel(
    q, v, g, h, A, o, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)                     # row (or column) inside the chunk
    o_t = i_t * BT + o_c
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_hc = h + ((i_b * NT + i_t) * H + i_h) * K * V

    # inter-chunk: (Q ⊙ e^{b}) S_start · scale, a [BT, K] x [K, BV] product (exponent b <= 0)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_q = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        m_q = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + p_q, mask=m_q, other=0.0).to(tl.float32)
        b_g = tl.load(g + p_q, mask=m_q, other=0.0)
        b_h = tl.load(p_hc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot((b_q * tl.exp(b_g) * scale).to(b_h.dtype), b_h, input_precision=DOT_PREC)

    # intra-chunk: A V, a [BT, BT] x [BT, BV] product; A is causal (lower triangle)
    b_A = tl.load(A + ((i_b * T + o_t[:, None]) * H + i_h) * BT + o_c[None, :], mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_c[:, None] >= o_c[None, :], b_A, 0.0)
    p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    m_ov = m_t[:, None] & m_v[None, :]
    b_v = tl.load(v + p_v, mask=m_ov, other=0.0)
    b_o += tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_ov)


def chunk_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """Chunk-parallel GLA forward (Triton, chunk 64, sub-chunk 16): the prefill kernel.

    q, k, gk: [B, T, H, K]; v: [B, T, H, V]; gk = log of the per-channel decay (<= 0).
    Any T >= 1; K, V <= 256. fp32 / fp16 / bf16 inputs; gates and the carried state in fp32,
    the per-chunk state snapshots and the scores A in the input dtype (they feed tensor-core matmuls).
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
    prec = "ieee" if q.dtype == torch.float32 else "tf32"   # 16-bit inputs ignore it
    # 1. cumulative log-gates inside each chunk
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    BKc = min(64, max(16, triton.next_power_of_2(K)))
    _chunk_cumsum_kernel[(triton.cdiv(K, BKc), NT, B * H)](gk, g, T, H, K, BT=BT, BK=BKc)
    # 2. the state at every chunk start (and the final state): sequential over chunks
    h = torch.empty(B, NT, H, K, V, dtype=q.dtype, device=q.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    _chunk_h_kernel[lambda m: (triton.cdiv(K, m["BK"]), triton.cdiv(V, m["BV"]), B * H)](
        k, v, g, h, initial_state, ht, T, H, NT, B * H, K, V, BT=BT,
        USE_H0=initial_state is not None, STORE_HT=output_final_state, DOT_PREC=prec)
    # 3. the intra-chunk scores, every sub-chunk in parallel (upper blocks left unwritten)
    A = torch.empty(B, T, H, BT, dtype=q.dtype, device=q.device)
    _chunk_a_kernel[(BT // BC, NT, B * H)](
        q, k, g, A, scale, T, H, K, BT=BT, BC=BC, BK=max(16, triton.next_power_of_2(K)), DOT_PREC=prec)
    # 4. every chunk's output in parallel
    o = torch.empty_like(v)
    _chunk_o_kernel[lambda m: (triton.cdiv(V, m["BV"]), NT, B * H)](
        q, v, g, h, A, o, scale, T, H, NT, K, V, BT=BT, DOT_PREC=prec)
    return o, ht
