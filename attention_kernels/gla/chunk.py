"""GLA's own piece of the chunk-parallel forward: the intra-chunk scores A.

The cumulative gates, the state pass and the output assembly are shared by the linear-attention
families (attention_kernels/linear/chunk.py). What is GLA's alone is the score of row t against an earlier
token j of its chunk, with a decay per key channel inside the sum:

    A[t, j] = scale · Σ_k q_tk k_jk e^{b_tk - b_jk}   for j <= t   (b: the in-chunk cumulative gate)

One program owns the BC = 16 rows of one sub-chunk (secondary chunking): tensor-core products
against the earlier sub-chunks, re-based so that every exponent is <= 0, and its own 16 x 16
diagonal block elementwise in fp32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import autotune_configs, pow2_at_least_16
from ..linear.chunk import CHUNK, SUB_CHUNK, chunk_at, chunk_row, dot_precision, n_chunks, varlen

BC = SUB_CHUNK  # rows per sub-chunk


@triton.autotune(configs=autotune_configs([({}, 2, 1), ({}, 4, 1)]), key=["K"])
@triton.jit(do_not_specialize=["T", "H"])
def _chunk_gla_scores_kernel(
    q, k, g, A, scale, T, H,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: the BC rows of sub-chunk i_c of chunk i_t (of a batch row,
    # or of a packed sequence: linear/chunk.py's chunk_at), against every
    # column j <= t
    i_c, i_b, i_h = tl.program_id(0), tl.program_id(2) // H, tl.program_id(2) % H
    tok0, i_t, T = chunk_at(tl.program_id(1), i_b, T, cu_seqlens, chunk_indices, VARLEN)
    t0 = i_t * BT + i_c * BC                       # first row of the sub-chunk
    if t0 < T:
        o_r = tl.arange(0, BC)
        o_t = t0 + o_r
        m_t = o_t < T
        o_k = tl.arange(0, BK)                     # the whole key dim (padded to a power of 2)
        m_k = o_k < K
        m_q = m_t[:, None] & m_k[None, :]
        # the sub-chunk's first row, 64-bit (linear/chunk.py's chunk_row);
        # rows and columns after it 32-bit
        r_s = chunk_row(0, tok0 + t0, i_h, T, H)
        q, k, g = q + r_s * K, k + r_s * K, g + r_s * K
        p_q = (o_r[:, None] * H) * K + o_k[None, :]
        b_q = tl.load(q + p_q, mask=m_q, other=0.0).to(tl.float32) * scale
        b_g = tl.load(g + p_q, mask=m_q, other=0.0)
        p_A = A + r_s * BT + (o_r[:, None] * H) * BT + i_c * BC + o_r[None, :]

        # (a) earlier sub-chunks j < i_c, on tensor cores, re-based at b_n =
        # b[t0]:
        #     q ⊙ e^{b - b_n} (rows at or after t0: exponent <= 0),
        #     k ⊙ e^{b_n - b} (rows before t0: exponent <= 0).
        b_gn = tl.load(g + o_k, mask=m_k, other=0.0)
        b_qn = (b_q * tl.exp(tl.where(m_q, b_g - b_gn[None, :], 0.0))).to(k.dtype.element_ty)
        for i_j in range(0, i_c):
            p_k = (((i_j - i_c) * BC + o_r[:, None]) * H) * K + o_k[None, :]     # before t0: negative
            b_k = tl.load(k + p_k, mask=m_k[None, :], other=0.0)
            b_gk = tl.load(g + p_k, mask=m_k[None, :], other=0.0)
            b_kn = (b_k * tl.exp(b_gn[None, :] - b_gk)).to(k.dtype.element_ty)
            b_s = tl.dot(b_qn, tl.trans(b_kn), input_precision=DOT_PREC)     # [BC, BC]
            tl.store(p_A + (i_j - i_c) * BC, b_s.to(A.dtype.element_ty), mask=m_t[:, None])

        # (b) the diagonal BC x BC block, one column j at a time, elementwise
        # in fp32:
        #     A[t, j] = sum_k q_tk k_jk e^{b_tk - b_jk} for j <= t
        #     (exponent <= 0), exactly 0 above. Above the diagonal the factor
        #     e^-inf = 0 still leaves 0 * NaN = NaN where a later key holds a
        #     NaN or inf, so one select on the finished block clears it (a
        #     select per column inside the loop costs registers the loop does
        #     not have).
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        # A rolled loop over the rows present: unrolled, it needs 255
        # registers at 2 warps and spills.
        for j in range(0, tl.minimum(BC, T - t0)):
            # key j's row loaded into every row of a [BC, BK] tile, so that
            # it lands in the tile's layout: a [BK] row broadcast from a
            # vector is converted to that layout through shared memory, each
            # column
            p_j = (j * H) * K + o_r[:, None] * 0 + o_k[None, :]
            b_kj = tl.load(k + p_j, mask=m_k[None, :], other=0.0).to(tl.float32)
            b_gj = tl.load(g + p_j, mask=m_k[None, :], other=0.0)
            m_lo = (o_r >= j) & m_t
            b_e = tl.exp(tl.where(m_lo[:, None], b_g - b_gj, float("-inf")))
            b_a = tl.sum(b_q * b_kj * b_e, axis=1)
            b_A += tl.where(o_r[None, :] == j, b_a[:, None], 0.0)
        b_A = tl.where(o_r[:, None] >= o_r[None, :], b_A, 0.0)
        tl.store(p_A, b_A.to(A.dtype.element_ty), mask=m_t[:, None])
        # the blocks above the diagonal are never written: the output kernel
        # masks them


def chunk_gla_scores(q, k, g, A, scale: float, packed=None) -> None:
    """GLA's intra-chunk scores, every sub-chunk of every chunk in parallel.

    q, k: [B, T, H, K]; g: fp32 [B, T, H, K], the in-chunk cumulative gates. Written: A
    [B, T, H, CHUNK] in q's dtype, A[b, t, h, c] = the score of token t against token
    (t // CHUNK) * CHUNK + c, scale included, on and below the diagonal (the rest is left as it was).
    packed: packed sequences (`packed_chunks`, B = 1), whose chunks start at each sequence's first token.

        >>> A = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=q.device)
        >>> chunk_gla_scores(q, k, g, A, scale=K ** -0.5)
    """
    B, T, H, K = q.shape
    _chunk_gla_scores_kernel[(CHUNK // BC, n_chunks(T, packed), B * H)](
        q, k, g, A, scale, T, H, K, BT=CHUNK, BC=BC, BK=pow2_at_least_16(K), DOT_PREC=dot_precision(q.dtype),
        **varlen(packed))
