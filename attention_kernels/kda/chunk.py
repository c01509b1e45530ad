"""KDA's own pieces of the chunk-parallel forward: the two score matrices of every chunk and the WY/UT
solve inside it. The gate pass (with the L2 norm of q and k), the state pass (with its delta-rule
switch) and the output are the linear families' shared ones (attention_kernels/linear/chunk.py).

Inside a chunk of C = 64 tokens, with b_t the in-chunk cumulative log gate and S the state at the
chunk's start, unroll the step S_t = Diag(e^{g_t}) S_{t-1} + k_t û_tᵀ, with û_t, what the token writes,
û_t = β_t (v_t - k_tᵀ Diag(e^{g_t}) S_{t-1}):

    û_t = β_t (v_t - (k_t ⊙ e^{b_t})ᵀ S - Σ_{j<t} (k_t · (k_j ⊙ e^{b_t - b_j})) û_j)

Every û_t depends on the earlier ones through a strictly lower-triangular matrix
A_tj = β_t Σ_c k_tc k_jc e^{b_tc - b_jc} (j < t), so in matrices (I + A) U = diag(β) (V - (K ⊙ e^b) S):

    U = Ũ - W S,     Ũ = (I + A)⁻¹ diag(β) V,     W = (I + A)⁻¹ diag(β) (K ⊙ e^b)

W and Ũ (the pseudo-values) do not depend on S: every chunk computes them in parallel, with one
64 x 64 triangular solve (`kda_wy`). Then the walk over chunks (`chunk_state_pass` with w and v_new)
is GLA's, with U = Ũ - W S formed on the way in place of V: one more matmul per chunk. The chain of T rank-1
updates has become matmuls of 64 rows. The output is GLA's with U in place of V:
o = (Q ⊙ e^b) S · scale + A_qk U, A_qk being GLA's intra-chunk scores.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..launch import autotune_configs, cdiv, pow2_at_least_16
from ..linear.chunk import (CHUNK, SUB_CHUNK, chunk_at, chunk_local_cumsum, chunk_row, chunk_state_pass, dot_precision,
                            n_chunks, varlen)
from ..tl_helpers import dot_causal
from .reference import L2NORM_EPS


# ------------------------------------------------------------------ 1. the scores inside a chunk
# Both score matrices KDA needs, Aqk[t, j] = scale Σ_c q_tc k_jc e^{b_tc - b_jc} and
# Akk[t, j] = Σ_c k_tc k_jc e^{b_tc - b_jc} (j <= t), in two kernels that write disjoint entries: the
# blocks below the chunk's diagonal 16 x 16 blocks on tensor cores, and the diagonal blocks, where the
# exponent cannot be split, elementwise with one program per token.

# num_warps: at K = 128 and bf16, ptxas (sm_90) fits 4 warps without a spill.
@triton.autotune(configs=autotune_configs([({}, 4, 1), ({}, 2, 1)]), key=["K"])
@triton.jit(do_not_specialize=["T", "H"])
def _kda_scores_kernel(
    q, k, b, Aqk, Akk, scale, T, H,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: the BC rows of sub-chunk i_c >= 1 of chunk i_t (of a batch
    # row or a packed sequence: linear/chunk.py's chunk_at) against the
    # earlier sub-chunks, re-based at b_n = b[t0] as GLA's scores are: the
    # rows times e^{b - b_n}, the columns times e^{b_n - b}, every exponent
    # <= 0; both products share the columns
    i_c, i_b, i_h = tl.program_id(0) + 1, tl.program_id(2) // H, tl.program_id(2) % H
    tok0, i_t, T = chunk_at(tl.program_id(1), i_b, T, cu_seqlens, chunk_indices, VARLEN)
    t0 = i_t * BT + i_c * BC                       # first row of the sub-chunk
    if t0 < T:
        o_r = tl.arange(0, BC)
        o_t = t0 + o_r
        m_t = o_t < T
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        m_q = m_t[:, None] & m_k[None, :]
        # the sub-chunk's first row, 64-bit (linear/chunk.py's chunk_row);
        # rows and columns after it 32-bit
        r_s = chunk_row(0, tok0 + t0, i_h, T, H)
        q, k, b, Aqk, Akk = q + r_s * K, k + r_s * K, b + r_s * K, Aqk + r_s * BT, Akk + r_s * BT
        p_q = (o_r[:, None] * H) * K + o_k[None, :]
        b_gn = tl.load(b + o_k, mask=m_k, other=0.0)
        b_e = tl.exp(tl.where(m_q, tl.load(b + p_q, mask=m_q, other=0.0) - b_gn[None, :], 0.0))
        b_qn = (tl.load(q + p_q, mask=m_q, other=0.0).to(tl.float32) * b_e * scale).to(k.dtype.element_ty)
        b_krn = (tl.load(k + p_q, mask=m_q, other=0.0).to(tl.float32) * b_e).to(k.dtype.element_ty)
        p_row = (o_r * H) * BT
        for i_j in range(0, i_c):
            p_k = (((i_j - i_c) * BC + o_r[:, None]) * H) * K + o_k[None, :]     # before t0: negative
            b_k = tl.load(k + p_k, mask=m_k[None, :], other=0.0)
            b_kn = tl.trans((b_k * tl.exp(b_gn[None, :] - tl.load(b + p_k, mask=m_k[None, :], other=0.0)))
                            .to(k.dtype.element_ty))
            p_A = p_row[:, None] + i_j * BC + o_r[None, :]
            tl.store(Aqk + p_A, tl.dot(b_qn, b_kn, input_precision=DOT_PREC).to(Aqk.dtype.element_ty),
                     mask=m_t[:, None])
            tl.store(Akk + p_A, tl.dot(b_krn, b_kn, input_precision=DOT_PREC).to(Akk.dtype.element_ty),
                     mask=m_t[:, None])


# BH (heads per program) and num_warps: the autotuner picks on the first call (the H200 run did not record which).
@triton.autotune(configs=autotune_configs([({"BH": 4}, 4, 1), ({"BH": 2}, 2, 1), ({"BH": 8}, 4, 1),
                                           ({"BH": 4}, 2, 1)], interpreter={"BH": 2}),
                 key=["K", "H"])
@triton.jit(do_not_specialize=["T"])
def _kda_diag_scores_kernel(
    q, k, b, Aqk, Akk, scale, T, H,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: token t of one batch row, BH heads (adjacent in memory),
    # against the tokens j <= t of its own sub-chunk, one column per step.
    # Every exponent b_tc - b_jc is <= 0, and no later token is ever read, so
    # a NaN or inf in one reaches no earlier row. Packed sequences: program
    # c·BT + r takes row r of chunk c (linear/chunk.py's chunk_at), if the
    # sequence has that row.
    i_bt, i_hb = tl.program_id(0), tl.program_id(1)
    if VARLEN:
        tok0, i_c, T = chunk_at(i_bt // BT, 0, T, cu_seqlens, chunk_indices, VARLEN)
        i_t = i_c * BT + i_bt % BT                   # t's place in its sequence
    else:
        tok0, i_t = i_bt // T * T, i_bt % T
    if i_t < T:
        o_h = i_hb * BH + tl.arange(0, BH)
        o_k = tl.arange(0, BK)
        m = (o_h < H)[:, None] & (o_k < K)[None, :]
        r_t = chunk_row(0, tok0 + i_t, 0, T, H)     # token t's head 0, 64-bit (linear/chunk.py's chunk_row)
        q, k, b, Aqk, Akk = q + r_t * K, k + r_t * K, b + r_t * K, Aqk + r_t * BT, Akk + r_t * BT
        p_t = o_h[:, None] * K + o_k[None, :]
        b_q = tl.load(q + p_t, mask=m, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k + p_t, mask=m, other=0.0).to(tl.float32)
        b_g = tl.load(b + p_t, mask=m, other=0.0)
        p_A = o_h * BT
        t_sub = i_t // BC * BC                      # the first token of t's sub-chunk
        for j in range(t_sub, i_t + 1):
            p_j = p_t + (j - i_t) * H * K
            b_ke = tl.load(k + p_j, mask=m, other=0.0).to(tl.float32) \
                * tl.exp(b_g - tl.load(b + p_j, mask=m, other=0.0))
            tl.store(Aqk + p_A + j % BT, tl.sum(b_q * b_ke, axis=1).to(Aqk.dtype.element_ty), mask=o_h < H)
            tl.store(Akk + p_A + j % BT, tl.sum(b_k * b_ke, axis=1).to(Akk.dtype.element_ty), mask=o_h < H)


def kda_scores(q, k, b, Aqk, Akk, scale: float, packed=None) -> None:
    """The two intra-chunk score matrices KDA needs, in two launches: the blocks below the diagonal
    16 x 16 blocks (one program per sub-chunk), the diagonal blocks (one program per token and group
    of heads).

    q, k: [B, T, H, K]; b: fp32 [B, T, H, K], the in-chunk cumulative gates. Written, on and below the
    diagonal of each chunk (the rest is left as it was): Aqk [B, T, H, CHUNK] in q's dtype, the
    query-key scores with scale (GLA's A); Akk fp32 [B, T, H, CHUNK], the key-key scores without β.
    Row t, column c holds the score against token (t // CHUNK) * CHUNK + c. packed: packed sequences
    (`packed_chunks`, B = 1), whose chunks start at each sequence's first token.
    """
    B, T, H, K = q.shape
    BK = pow2_at_least_16(K)
    _kda_scores_kernel[(CHUNK // SUB_CHUNK - 1, n_chunks(T, packed), B * H)](
        q, k, b, Aqk, Akk, scale, T, H, K, BT=CHUNK, BC=SUB_CHUNK, BK=BK, DOT_PREC=dot_precision(q.dtype),
        **varlen(packed))
    rows = B * T if packed is None else packed.n_chunks * CHUNK     # a program per token (and padding row)
    _kda_diag_scores_kernel[lambda m: (rows, cdiv(H, m["BH"]))](
        q, k, b, Aqk, Akk, scale, T, H, K, BT=CHUNK, BC=SUB_CHUNK, BK=BK, **varlen(packed))


# ------------------------------------------------------------------ 2. the in-chunk solve
@triton.jit
def _kda_solve(Akk, beta, b_beta, tok0, i_h, i_t, o_c, m_t, T, H, BT: tl.constexpr, BS: tl.constexpr,
               NB: tl.constexpr, SOLVE_PREC: tl.constexpr):
    """X = (I + A)⁻¹ of one chunk, fp32 [BT, BT], A = diag(β) Akk strictly
    below the diagonal (Akk at the chunk's first row), its rows from the
    first non-finite row of A on set to NaN."""
    # A = diag(β) (K Kᵀ ⊙ decay), strictly below the diagonal (a select: the
    # rest was never written)
    b_A = tl.load(Akk + (o_c[:, None] * H) * BT + o_c[None, :], mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_c[:, None] > o_c[None, :], b_A, 0.0) * b_beta[:, None]
    # A NaN or inf in k, g or β at token t makes row t of A (and the rows
    # after it) non-finite. The products of the solve would multiply the
    # earlier rows' zeros by it (0 · NaN = NaN), so the non-finite entries
    # are cleared before it and X's rows from the first such row on are set
    # to NaN after it: the NaN reaches the rows at and after t, as the
    # recurrence carries it, no earlier.
    m_bad = b_A * 0.0 != 0.0                                                 # NaN or ±inf
    first_bad = tl.min(tl.min(tl.where(m_bad, o_c[:, None], BT), axis=1), axis=0)
    b_A = tl.where(m_bad, 0.0, b_A)

    # X = (I + A)⁻¹ in two stages, with the chunk cut into NB blocks of
    # BS = 16 rows.
    # (a) The block-diagonal part D = (I + A_d)⁻¹ by forward substitution on
    #     the NB diagonal blocks, held as one [NB, BS, BS] tile (a quarter of
    #     the 64 x 64 one), a column at a time: when local column s is
    #     reached, local row s of each block is final, and it is subtracted
    #     from the block's later rows with weight A_is. 16 rank-1 updates of
    #     16 x 16 blocks.
    o_n = tl.arange(0, NB)
    o_s = tl.arange(0, BS)
    t3 = i_t * BT + o_n[:, None, None] * BS + o_s[None, :, None]            # the token of (block, row)
    m3 = t3 < T
    b_A3 = tl.load(Akk + ((t3 - i_t * BT) * H) * BT + o_n[:, None, None] * BS + o_s[None, None, :],
                   mask=m3, other=0.0)
    b_beta3 = tl.load(beta + (tok0 + t3) * H + i_h, mask=m3, other=0.0).to(tl.float32)
    # select before multiplying: the entries on and above the diagonal were
    # never written
    b_A3 = tl.where(o_s[None, :, None] > o_s[None, None, :], b_A3, 0.0) * b_beta3
    b_A3 = tl.where(b_A3 * 0.0 == 0.0, b_A3, 0.0)                        # cleared as b_A is
    b_X3 = tl.where(o_s[None, :, None] == o_s[None, None, :], 1.0, 0.0) + tl.zeros([NB, BS, BS], dtype=tl.float32)
    for s in range(0, BS):
        b_xs = tl.sum(tl.where(o_s[None, :, None] == s, b_X3, 0.0), axis=1)      # [NB, BS]: row s of each block
        b_as = tl.sum(tl.where(o_s[None, None, :] == s, b_A3, 0.0), axis=2)      # [NB, BS]: column s of each block
        b_X3 = b_X3 - b_as[:, :, None] * b_xs[:, None, :]
    # back to a [BT, BT] tile, the blocks on its diagonal: [NB, BS, NB, BS]
    # with block n in row-block n
    b_X = tl.reshape(tl.where(o_n[:, None, None, None] == o_n[None, None, :, None], b_X3[:, :, None, :], 0.0),
                     [BT, BT])
    o_blk = o_c // BS
    m_same = o_blk[:, None] == o_blk[None, :]
    # (b) The rest from I + A = D⁻¹ (I + N), N = D A_o (A_o: the blocks below
    #     the diagonal). N is strictly block-lower with four blocks, so
    #     N⁴ = 0 and X = (I - N + N² - N³) D: four products of 64 x 64 tiles
    #     on tensor cores (IEEE fp32 for fp32 inputs; TF32 for 16-bit ones,
    #     whose X is rounded to 16 bits next anyway).
    b_N = tl.dot(b_X, tl.where(m_same, 0.0, b_A), input_precision=SOLVE_PREC)
    b_N2 = tl.dot(b_N, b_N, input_precision=SOLVE_PREC)
    b_N3 = tl.dot(b_N2, b_N, input_precision=SOLVE_PREC)
    b_M = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0) - b_N + b_N2 - b_N3
    b_X = tl.dot(b_M, b_X, input_precision=SOLVE_PREC)
    return tl.where(o_c[:, None] >= first_bad, float("nan"), b_X)


# num_warps, num_stages: not yet measured with the [NB, BS, BS] forward substitution. The form that loads X
# (the backward's) tunes apart from the one that solves.
@triton.autotune(configs=autotune_configs([({}, 4, 1), ({}, 8, 1)]), key=["K", "V", "LOAD_INVERSE", "GATED_Q"])
@triton.jit(do_not_specialize=["T", "H"])
def _kda_wy_kernel(
    k, v, b, beta, Akk, w, u, kg, T, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    NB: tl.constexpr, DOT_PREC: tl.constexpr, SOLVE_PREC: tl.constexpr,
    inverse=None, STORE_INVERSE: tl.constexpr = False, LOAD_INVERSE: tl.constexpr = False,
    q=None, qg=None, scale=1.0, GATED_Q: tl.constexpr = False,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: the BT rows of chunk i_t of one (batch, head), or of a
    # packed sequence (linear/chunk.py's chunk_at)
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(tl.program_id(0), i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    b_beta = tl.load(beta + (tok0 + o_t) * H + i_h, mask=m_t, other=0.0).to(tl.float32)    # [B, T, H]: 32-bit
    # the chunk's first row, 64-bit (linear/chunk.py's chunk_row); rows and
    # columns after it 32-bit
    r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)
    if LOAD_INVERSE:
        # the backward's recomputation: X as an earlier launch of this kernel
        # stored it, no solve
        b_Xd = tl.load(inverse + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :], mask=m_t[:, None], other=0.0)
    else:
        b_Xd = _kda_solve(Akk + r_c * BT, beta, b_beta, tok0, i_h, i_t, o_c, m_t, T, H, BT, BS, NB, SOLVE_PREC
                          ).to(k.dtype.element_ty)
        if STORE_INVERSE:
            # for the backward, which multiplies by Xᵀ and recomputes W and Ũ
            # from it: as W and Ũ take it
            tl.store(inverse + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :], b_Xd, mask=m_t[:, None])
    k, b, kg, w, v, u = k + r_c * K, b + r_c * K, kg + r_c * K, w + r_c * K, v + r_c * V, u + r_c * V

    # W = X diag(β) (K ⊙ e^b): b <= 0, so every factor e^b <= 1
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_k = (o_c[:, None] * H) * K + o_k[None, :]
    b_k = tl.load(k + p_k, mask=m_tk, other=0.0).to(tl.float32)
    b_g = tl.load(b + p_k, mask=m_tk, other=0.0)
    b_kb = (b_k * tl.exp(b_g) * b_beta[:, None]).to(k.dtype.element_ty)
    # the keys decayed to the chunk's last token, K ⊙ e^{b_last - b}, for the
    # state pass: computed here, in parallel over chunks, they leave the
    # sequential pass no exponential but one per key row
    b_gl = tl.load(b + ((tl.minimum(i_t * BT + BT, T) - 1 - i_t * BT) * H) * K + o_k, mask=m_k, other=0.0)
    tl.store(kg + p_k, (b_k * tl.exp(b_gl[None, :] - b_g)).to(kg.dtype.element_ty), mask=m_tk)
    if GATED_Q:
        # the queries decayed from the chunk's start and scaled, for the
        # backward's reverse state pass (linear/chunk_backward.py's
        # _DELTA_GATED_QUERIES), beside the gates this program holds
        q, qg = q + r_c * K, qg + r_c * K
        b_q = tl.load(q + p_k, mask=m_tk, other=0.0).to(tl.float32)
        tl.store(qg + p_k, (b_q * tl.exp(b_g) * scale).to(qg.dtype.element_ty), mask=m_tk)
    # X is lower triangular: dot_causal keeps a NaN or inf in a later token
    # out of the earlier rows
    b_w = dot_causal(b_Xd, b_kb, tl.zeros([BT, BK], dtype=tl.float32), DOT_PREC)
    tl.store(w + p_k, b_w.to(w.dtype.element_ty), mask=m_tk)

    # Ũ = X diag(β) V, V in tiles of BV columns
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = (o_c[:, None] * H) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_u = dot_causal(b_Xd, (b_v * b_beta[:, None]).to(k.dtype.element_ty), tl.zeros([BT, BV], dtype=tl.float32),
                         DOT_PREC)
        tl.store(u + p_v, b_u.to(u.dtype.element_ty), mask=m_tv)


# The solve's products for 16-bit inputs: TF32 (dot_precision's), since X is rounded to 16 bits right after;
# "ieee" runs them in fp32 throughout (fla's solve_tril default). `scripts/tune_probe.py kda_solve_precision`
# times both and measures each output's error.
_SOLVE_PRECISION = None


def kda_wy(k, v, b, beta, Akk, w, u, kg, inverse=None, inverse_computed: bool = False, q=None, q_gated=None,
           scale: float = 1.0, packed=None) -> None:
    """The pseudo-values of every chunk, all chunks in parallel (one program per chunk and batch·head).

    k: [B, T, H, K]; v: [B, T, H, V]; b: fp32 [B, T, H, K], the in-chunk cumulative gates; beta:
    [B, T, H]; Akk: fp32 [B, T, H, CHUNK], the key-key scores Σ_c k_tc k_jc e^{b_tc - b_jc} (GLA's
    scores with k for q and scale 1), read strictly below the diagonal. Written, in k's dtype: w and kg
    [B, T, H, K], u [B, T, H, V]: W = (I + A)⁻¹ diag(β) (K ⊙ e^b), Ũ = (I + A)⁻¹ diag(β) V (in u), and the
    keys decayed to their chunk's last token, K ⊙ e^{b_last - b}, which the state pass adds with. inverse: [B, T,
    H, CHUNK] in k's dtype, or None; given, it receives X = (I + A)⁻¹ as W and Ũ take it (Akk's layout, zeros
    above the diagonal; from a chunk's first non-finite row of A on, NaN), which the backward multiplies by.
    inverse_computed: inverse holds that X already (the backward's recomputation): no solve, and Akk is not
    read (None will do). q_gated ([B, T, H, K], written in its dtype, with q given): it also writes
    scale · q ⊙ e^b, the queries as the delta rule's reverse state pass takes them gated
    (linear/chunk_backward.py's `delta_walk_takes_gated_queries`). packed: packed sequences
    (`packed_chunks`, B = 1).
    """
    if q_gated is not None and q is None:
        raise ValueError("kda_wy writes q_gated from q: give q too")
    B, T, H, K = k.shape
    V = v.shape[-1]
    _kda_wy_kernel[(n_chunks(T, packed), B * H)](
        k, v, b, beta, Akk, w, u, kg, T, H, K, V, BT=CHUNK, BK=pow2_at_least_16(K),
        BV=min(64, pow2_at_least_16(V)), BS=SUB_CHUNK, NB=CHUNK // SUB_CHUNK, DOT_PREC=dot_precision(k.dtype),
        SOLVE_PREC=_SOLVE_PRECISION or dot_precision(k.dtype), inverse=inverse,
        STORE_INVERSE=inverse is not None and not inverse_computed, LOAD_INVERSE=inverse_computed, q=q, qg=q_gated,
        scale=scale, GATED_Q=q_gated is not None, **varlen(packed))


# ------------------------------------------------------------------ 3. the forward up to its output
class ChunkIntermediates(NamedTuple):
    """What the forward computes before its output, and the backward recomputes: the (normalised) q and k,
    the in-chunk cumulative gates b (fp32), the query-key scores Aqk, the solve's W, Ũ and K_g, the
    chunk-start states, the corrected values U = Ũ - W S, the final state (or None), and the solve's
    inverse X = (I + A)⁻¹ (k's dtype, [B, T, H, CHUNK], or None)."""
    q: torch.Tensor
    k: torch.Tensor
    b: torch.Tensor
    Aqk: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    kg: torch.Tensor
    states: torch.Tensor
    v_new: torch.Tensor
    final_state: torch.Tensor | None
    inverse: torch.Tensor | None


def chunk_kda_intermediates(q, k, v, g, beta, scale: float, h0, *, l2norm: bool, state_dtype: torch.dtype,
                            output_final_state: bool = False, store_inverse: bool = False,
                            kept: tuple[torch.Tensor, torch.Tensor] | None = None, kept_computed: bool = False,
                            gated_queries: torch.Tensor | None = None, packed=None) -> ChunkIntermediates:
    """The forward's first five launches on contiguous, checked inputs: the gate pass (q and k normalised
    when l2norm), the scores, the solve, the state pass with the delta rule. The chunk-start states are kept
    in state_dtype: the input dtype for the forward's output product, `chunk_state_dtype` for the backward.
    store_inverse: the solve also writes its inverse X. kept: (Aqk, X), [B, T, H, CHUNK] in q's dtype, buffers
    the scores launch and the solve write (the training forward's, which keeps them), or, with kept_computed,
    which an earlier forward wrote (the backward's: no scores launch and no solve); None: allocated here.
    gated_queries: like q, or None: receives scale · q ⊙ e^b (q normalised when l2norm), from the launch that
    forms W (`kda_wy`'s q_gated), for the backward's reverse state pass.
    packed: packed sequences (`packed_chunks`, B = 1; h0 and the final state one per sequence)."""
    B, T, H, K = q.shape
    V, dev = v.shape[-1], q.device
    N = B if packed is None else packed.n_sequences
    b = torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
    if l2norm:
        qn, kn = torch.empty_like(q), torch.empty_like(k)
        chunk_local_cumsum(g, b, q=q, k=k, q_normed=qn, k_normed=kn, eps=L2NORM_EPS, packed=packed)
        q, k = qn, kn
    else:
        chunk_local_cumsum(g, b, packed=packed)
    if kept is not None:
        Aqk, inverse = kept
    else:     # the blocks above the diagonal stay unwritten
        Aqk = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=dev)
        inverse = torch.empty(B, T, H, CHUNK, dtype=k.dtype, device=dev) if store_inverse else None
    Akk = None
    if not kept_computed:
        Akk = torch.empty(B, T, H, CHUNK, dtype=torch.float32, device=dev)
        kda_scores(q, k, b, Aqk, Akk, scale, packed=packed)
    w, kg, u = torch.empty_like(k), torch.empty_like(k), torch.empty_like(v)
    kda_wy(k, v, b, beta, Akk, w, u, kg, inverse, inverse_computed=kept_computed,
           q=q, q_gated=gated_queries, scale=scale, packed=packed)
    del Akk
    states = torch.empty(B, n_chunks(T, packed), H, K, V, dtype=state_dtype, device=dev)
    v_new = torch.empty_like(v)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    chunk_state_pass(kg, u, b, states, h0, ht, w=w, v_new=v_new, decayed_keys=True, packed=packed)
    return ChunkIntermediates(q, k, b, Aqk, w, u, kg, states, v_new, ht, inverse)


__all__ = ["kda_scores", "kda_wy", "ChunkIntermediates", "chunk_kda_intermediates"]
