"""Lightning Attention-2's output kernel: the intra-block and inter-block parts of a chunk in one
program (Qin et al. 2024). The state at every chunk start comes from the shared state pass
(attention_kernels/linear/chunk.py, `chunk_state_pass(..., gamma=-slopes)`); what is Lightning's own is that
the decay is one number per head, so it factors out of every sum over key channels:

    o_t = λ^(c+1) · (q_t^T kv_prev) · scale  +  Σ_{s ≤ t in the chunk} λ^(t-s) (q_t · k_s) v_s · scale

with c = t's position in its chunk (0 … C-1). In matrices, per chunk of C = 64 tokens:

    O = diag(λ^(c+1)) (Q kv_prev)  +  ((Q K^T) ⊙ M) V,    M_ts = λ^(t-s) for s <= t, else 0

Q K^T is one tensor-core product and M an elementwise mask: no per-channel decay inside the product,
hence none of GLA's sub-chunking or re-basing. Every exponent, -s·(c+1) and -s·(t-s), is <= 0, and
s = +inf (λ = 0) is exact: λ^0 = 1 on the diagonal (`load_log_decay`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import autotune_configs, cdiv
from ..linear.chunk import CHUNK, dot_precision, load_log_decay, n_chunks, output_tile, tiles_that_fit, varlen
from ..tl_helpers import dot_causal

# (BK, BV), num_warps, num_stages: BV = V = 128 computes Q K^T once per chunk and head. On the H200
# (B=1, H=32, D=128, T=16K, graph replay): (64, 128) 4 warps 3 stages 263 µs, 2 stages 277, (64, 64)
# 274, 8 warps 269; (128, 128) 8 warps 503 and (128, 64) 324-433 were dropped.
_CONFIGS = autotune_configs([({"BK": 64, "BV": 128}, 4, 3), ({"BK": 64, "BV": 128}, 4, 2),
                             ({"BK": 64, "BV": 128}, 8, 3), ({"BK": 64, "BV": 64}, 4, 3)],
                            interpreter={"BK": 32, "BV": 32})


_fits = tiles_that_fit()


@triton.autotune(configs=_CONFIGS, key=["K", "V"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT"])
def _chunk_lightning_output_kernel(
    q, k, v, h, gamma, o, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: the BT rows of chunk i_t, value columns [i_v·BV,
    # (i_v+1)·BV), of one (batch, head) or one packed sequence's chunk
    i_h, o_c, o_t, m_t, o_v, m_v, p_hc, r_c = output_tile(h, T, H, NT, K, V, BT, BV, cu_seqlens, chunk_indices,
                                                          VARLEN)
    q, k, v, o = q + r_c * K, k + r_c * K, v + r_c * V, o + r_c * V    # 64-bit (linear/chunk.py's chunk_row)
    p_row = o_c[:, None] * H                   # the chunk's tokens' rows after r_c
    b_g = load_log_decay(gamma, i_h)           # the log decay per step, -s <= 0 (-inf raised to finite)

    # Q kv_prev and Q K^T, both over the key dim in tiles of BK: [BT, BV] and
    # [BT, BT]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_qk = p_row * K + o_k[None, :]
        b_q = tl.load(q + p_qk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_k = tl.load(k + p_qk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_h = tl.load(p_hc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_q, b_h.to(b_q.dtype), input_precision=DOT_PREC)
        b_A += tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC)

    # inter-block: (Q ⊙ λ^(c+1)) kv_prev = diag(λ^(c+1)) (Q kv_prev): the
    # decay is the same on every key channel, so it scales the rows of the
    # product instead of every element of Q
    b_o = b_o * (tl.exp(b_g * (o_c + 1).to(tl.float32)) * scale)[:, None]

    # intra-block: (Q K^T ⊙ M) V, M_ts = λ^(t-s) below and on the diagonal.
    # The select (not a factor 0) clears the pairs s > t, where a later key's
    # NaN or inf would otherwise reach row t.
    m_lo = o_c[:, None] >= o_c[None, :]
    b_M = tl.exp(b_g * tl.maximum(o_c[:, None] - o_c[None, :], 0).to(tl.float32))
    b_A = tl.where(m_lo, b_A * b_M * scale, 0.0)
    p_v = p_row * V + o_v[None, :]
    m_ov = m_t[:, None] & m_v[None, :]
    b_v = tl.load(v + p_v, mask=m_ov, other=0.0)
    b_o = dot_causal(b_A.to(b_v.dtype), b_v, b_o, DOT_PREC)
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_ov)


def chunk_lightning_output(q, k, v, states, gamma, o, scale: float, packed=None) -> None:
    """O = diag(λ^(c+1)) (Q kv_prev) · scale + ((Q K^T) ⊙ M) V · scale for every chunk, all chunks in
    parallel (one program per V-tile, chunk and batch·head).

    q, k: [B, T, H, K]; v: [B, T, H, V]; states: [B, NT, H, K, V], the state at every chunk start
    (`chunk_state_pass` with the same gamma); gamma: fp32 [H], the log decay per step (-slopes).
    Written: o [B, T, H, V]. All contiguous. packed: packed sequences (`packed_chunks`, B = 1; the states as
    `chunk_state_pass` writes them for them).

        >>> states = torch.empty(B, triton.cdiv(T, CHUNK), H, K, V, dtype=q.dtype, device=q.device)
        >>> chunk_state_pass(k, v, None, states, gamma=-slopes)
        >>> chunk_lightning_output(q, k, v, states, -slopes, o := torch.empty_like(v), scale=1.0)
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = n_chunks(T, packed)
    _chunk_lightning_output_kernel[lambda m: (cdiv(V, m["BV"]), NT, B * H)](
        q, k, v, states, gamma, o, scale, T, H, NT, K, V, BT=CHUNK, DOT_PREC=dot_precision(q.dtype),
        **varlen(packed))


__all__ = ["chunk_lightning_output"]
