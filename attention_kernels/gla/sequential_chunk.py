"""The source article's "chunk-wise" GLA prefill: tokens sequential inside a chunk.

One launch per chunk of CHUNK = 64 tokens; inside it one program per (batch*head, V-tile)
loads the fp32 state from HBM, steps through the chunk's tokens with the state in
registers, and writes the state back for the next launch. It is the recurrence with
the state round-trip amortised over a chunk: no matmuls, no tensor cores. The book
keeps it as a labelled variant to measure against the chunk-parallel form.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import cdiv, pow2_at_least_16
from ..linear.chunk import CHUNK


@triton.jit
def _sequential_chunk_kernel(
    q, k, v, gk, o, state, scale, t_start, T, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_s = state + i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.0)           # carried state from the previous chunk
    for t in range(t_start, tl.minimum(t_start + BT, T)):
        p_k = ((i_b * T + t) * H + i_h) * K + o_k
        p_v = ((i_b * T + t) * H + i_h) * V + o_v
        b_q = tl.load(q + p_k, mask=m_k, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k + p_k, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.load(gk + p_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_v, mask=m_v, other=0.0).to(tl.float32)
        b_s = tl.exp(b_g)[:, None] * b_s + b_k[:, None] * b_v[None, :]
        tl.store(o + p_v, tl.sum(b_q[:, None] * b_s, axis=0).to(o.dtype.element_ty), mask=m_v)
    tl.store(p_s, b_s, mask=m_s)                        # hand the state to the next launch


def sequential_chunk_fwd(q, k, v, gk, o, state, scale: float) -> None:
    """Launch one kernel per chunk of CHUNK tokens, one after another.

    q, k, gk: [B, T, H, K]; v, o: [B, T, H, V] (o written); state: fp32 [B, H, K, V], the
    initial state on entry and the final state on return (updated in place). All contiguous.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    BV = min(32, pow2_at_least_16(V))
    grid = (cdiv(V, BV), B * H)
    for t_start in range(0, T, CHUNK):   # the chunks run one launch after another
        _sequential_chunk_kernel[grid](q, k, v, gk, o, state, scale, t_start, T, H, K, V,
                                       BT=CHUNK, BK=pow2_at_least_16(K), BV=BV, num_warps=4)
