"""KDA's own pieces of the chunk-parallel forward: the WY/UT solve inside each chunk, and the state
pass that turns its pseudo-values into the values the state really receives.

Inside a chunk of C = 64 tokens, with b_t the in-chunk cumulative log gate and S the state at the
chunk's start, unroll the step S_t = Diag(e^{g_t}) S_{t-1} + k_t u_tᵀ,
u_t = β_t (v_t - k_tᵀ Diag(e^{g_t}) S_{t-1}):

    u_t = β_t (v_t - (k_t ⊙ e^{b_t})ᵀ S - Σ_{j<t} (k_t · (k_j ⊙ e^{b_t - b_j})) u_j)

Every u_t depends on the earlier ones through a strictly lower-triangular matrix
A_tj = β_t Σ_c k_tc k_jc e^{b_tc - b_jc} (j < t), so in matrices (I + A) U = diag(β) (V - (K ⊙ e^b) S):

    U = W' - W S,     W' = (I + A)⁻¹ diag(β) V,     W = (I + A)⁻¹ diag(β) (K ⊙ e^b)

W and W' (the pseudo-values) do not depend on S: every chunk computes them in parallel, with one
64 x 64 triangular solve (`kda_wy`). Then the walk over chunks (`kda_state_pass`) is GLA's, with
U = W' - W S formed on the way in place of V: one more matmul per chunk. The chain of T rank-1
updates has become matmuls of 64 rows. The output is GLA's with U in place of V:
o = (Q ⊙ e^b) S · scale + A_qk U, A_qk being GLA's intra-chunk scores.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import autotune_configs, cdiv, pow2_at_least_16
from ..linear.chunk import CHUNK, GATE_FLOOR, SUB_CHUNK, dot_precision, tiles_that_fit
from ..linear.recurrent import state_tile, store_state
from ..tl_helpers import dot_causal


# ------------------------------------------------------------------ 0. one pass over q, k and g
@triton.jit(do_not_specialize=["T", "H"])
def _kda_prepare_kernel(
    q, k, g, qn, kn, b, T, H,
    K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, EPS: tl.constexpr,
    FLOOR: tl.constexpr,
):
    # one program: the BT tokens of chunk i_t of one (batch, head), every key channel
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m = (o_t < T)[:, None] & (o_k < K)[None, :]
    p = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    # the in-chunk cumulative gate, as chunk_local_cumsum computes it (-inf raised to FLOOR)
    b_g = tl.load(g + p, mask=m, other=0.0).to(tl.float32)
    b_g = tl.where(b_g < FLOOR, FLOOR, b_g)
    tl.store(b + p, tl.cumsum(b_g, axis=0), mask=m)
    if L2NORM:
        b_q = tl.load(q + p, mask=m, other=0.0).to(tl.float32)
        b_k = tl.load(k + p, mask=m, other=0.0).to(tl.float32)
        tl.store(qn + p, (b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + EPS)[:, None]).to(qn.dtype.element_ty), mask=m)
        tl.store(kn + p, (b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + EPS)[:, None]).to(kn.dtype.element_ty), mask=m)


def kda_prepare(q, k, g, b, qn=None, kn=None, eps: float = 0.0) -> None:
    """The in-chunk cumulative gates b, and, when qn and kn are given, q and k divided by their L2 norm,
    in one pass over the inputs (one program per chunk and batch·head).

    q, k, g: [B, T, H, K], contiguous; b: fp32 [B, T, H, K], written (what `chunk_local_cumsum` writes);
    qn, kn: like q, written with q / sqrt(Σ q² + eps) and the same for k, or both None (no norm)."""
    B, T, H, K = g.shape
    l2norm = qn is not None
    _kda_prepare_kernel[(cdiv(T, CHUNK), B * H)](
        q, k, g, qn if l2norm else q, kn if l2norm else k, b, T, H, K, BT=CHUNK, BK=pow2_at_least_16(K),
        L2NORM=l2norm, EPS=eps, FLOOR=GATE_FLOOR, num_warps=8 if K > 64 else 4)


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
):
    # one program: the BC rows of sub-chunk i_c >= 1 of chunk i_t against the earlier sub-chunks, re-based
    # at b_n = b[t0] as GLA's scores are: the rows times e^{b - b_n}, the columns times e^{b_n - b}, every
    # exponent <= 0; both products share the columns
    i_c, i_t, i_bh = tl.program_id(0) + 1, tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_t * BT + i_c * BC                       # first row of the sub-chunk
    if t0 < T:
        o_r = tl.arange(0, BC)
        o_t = t0 + o_r
        m_t = o_t < T
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        m_q = m_t[:, None] & m_k[None, :]
        p_q = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_gn = tl.load(b + ((i_b * T + t0) * H + i_h) * K + o_k, mask=m_k, other=0.0)
        b_e = tl.exp(tl.where(m_q, tl.load(b + p_q, mask=m_q, other=0.0) - b_gn[None, :], 0.0))
        b_qn = (tl.load(q + p_q, mask=m_q, other=0.0).to(tl.float32) * b_e * scale).to(k.dtype.element_ty)
        b_krn = (tl.load(k + p_q, mask=m_q, other=0.0).to(tl.float32) * b_e).to(k.dtype.element_ty)
        p_row = ((i_b * T + o_t) * H + i_h) * BT
        for i_j in range(0, i_c):
            p_k = ((i_b * T + i_t * BT + i_j * BC + o_r[:, None]) * H + i_h) * K + o_k[None, :]
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
):
    # one program: token t of one batch row, BH heads (adjacent in memory), against the tokens j <= t of
    # its own sub-chunk, one column per step. Every exponent b_tc - b_jc is <= 0, and no later token is
    # ever read, so a NaN or inf in one reaches no earlier row.
    i_bt, i_hb = tl.program_id(0), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    o_h = i_hb * BH + tl.arange(0, BH)
    o_k = tl.arange(0, BK)
    m = (o_h < H)[:, None] & (o_k < K)[None, :]
    p_t = ((i_b * T + i_t) * H + o_h[:, None]) * K + o_k[None, :]
    b_q = tl.load(q + p_t, mask=m, other=0.0).to(tl.float32) * scale
    b_k = tl.load(k + p_t, mask=m, other=0.0).to(tl.float32)
    b_g = tl.load(b + p_t, mask=m, other=0.0)
    p_A = ((i_b * T + i_t) * H + o_h) * BT
    t_sub = i_t // BC * BC                          # the first token of t's sub-chunk
    for j in range(t_sub, i_t + 1):
        p_j = p_t + (j - i_t) * H * K
        b_ke = tl.load(k + p_j, mask=m, other=0.0).to(tl.float32) * tl.exp(b_g - tl.load(b + p_j, mask=m, other=0.0))
        tl.store(Aqk + p_A + j % BT, tl.sum(b_q * b_ke, axis=1).to(Aqk.dtype.element_ty), mask=o_h < H)
        tl.store(Akk + p_A + j % BT, tl.sum(b_k * b_ke, axis=1).to(Akk.dtype.element_ty), mask=o_h < H)


def kda_scores(q, k, b, Aqk, Akk, scale: float) -> None:
    """The two intra-chunk score matrices KDA needs, in two launches: the blocks below the diagonal
    16 x 16 blocks (one program per sub-chunk), the diagonal blocks (one program per token and group
    of heads).

    q, k: [B, T, H, K]; b: fp32 [B, T, H, K], the in-chunk cumulative gates. Written, on and below the
    diagonal of each chunk (the rest is left as it was): Aqk [B, T, H, CHUNK] in q's dtype, the
    query-key scores with scale (GLA's A); Akk fp32 [B, T, H, CHUNK], the key-key scores without β.
    Row t, column c holds the score against token (t // CHUNK) * CHUNK + c.
    """
    B, T, H, K = q.shape
    BK = pow2_at_least_16(K)
    _kda_scores_kernel[(CHUNK // SUB_CHUNK - 1, cdiv(T, CHUNK), B * H)](
        q, k, b, Aqk, Akk, scale, T, H, K, BT=CHUNK, BC=SUB_CHUNK, BK=BK, DOT_PREC=dot_precision(q.dtype))
    _kda_diag_scores_kernel[lambda m: (B * T, cdiv(H, m["BH"]))](
        q, k, b, Aqk, Akk, scale, T, H, K, BT=CHUNK, BC=SUB_CHUNK, BK=BK)


# ------------------------------------------------------------------ 2. the in-chunk solve
# num_warps, num_stages: not yet measured with the [NB, BS, BS] forward substitution.
@triton.autotune(configs=autotune_configs([({}, 4, 1), ({}, 8, 1)]), key=["K", "V"])
@triton.jit(do_not_specialize=["T", "H"])
def _kda_wy_kernel(
    k, v, b, beta, Akk, w, u, kg, T, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    NB: tl.constexpr, DOT_PREC: tl.constexpr, SOLVE_PREC: tl.constexpr,
):
    # one program: the BT rows of chunk i_t of one (batch, head)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    b_beta = tl.load(beta + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0).to(tl.float32)

    # A = diag(β) (K Kᵀ ⊙ decay), strictly below the diagonal (a select: the rest was never written)
    b_A = tl.load(Akk + ((i_b * T + o_t[:, None]) * H + i_h) * BT + o_c[None, :], mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_c[:, None] > o_c[None, :], b_A, 0.0) * b_beta[:, None]
    # A NaN or inf in k, g or β at token t makes row t of A (and the rows after it) non-finite. The
    # products of the solve would multiply the earlier rows' zeros by it (0 · NaN = NaN), so the
    # non-finite entries are cleared before it and X's rows from the first such row on are set to
    # NaN after it: the NaN reaches the rows at and after t, as the recurrence carries it, no earlier.
    m_bad = b_A * 0.0 != 0.0                                                 # NaN or ±inf
    first_bad = tl.min(tl.min(tl.where(m_bad, o_c[:, None], BT), axis=1), axis=0)
    b_A = tl.where(m_bad, 0.0, b_A)

    # X = (I + A)⁻¹ in two stages, with the chunk cut into NB blocks of BS = 16 rows.
    # (a) The block-diagonal part D = (I + A_d)⁻¹ by forward substitution on the NB diagonal blocks,
    #     held as one [NB, BS, BS] tile (a quarter of the 64 x 64 one), a column at a time: when local
    #     column s is reached, local row s of each block is final, and it is subtracted from the
    #     block's later rows with weight A_is. 16 rank-1 updates of 16 x 16 blocks.
    o_n = tl.arange(0, NB)
    o_s = tl.arange(0, BS)
    t3 = i_t * BT + o_n[:, None, None] * BS + o_s[None, :, None]            # the token of (block, row)
    m3 = t3 < T
    b_A3 = tl.load(Akk + ((i_b * T + t3) * H + i_h) * BT + o_n[:, None, None] * BS + o_s[None, None, :],
                   mask=m3, other=0.0)
    b_beta3 = tl.load(beta + (i_b * T + t3) * H + i_h, mask=m3, other=0.0).to(tl.float32)
    # select before multiplying: the entries on and above the diagonal were never written
    b_A3 = tl.where(o_s[None, :, None] > o_s[None, None, :], b_A3, 0.0) * b_beta3
    b_A3 = tl.where(b_A3 * 0.0 == 0.0, b_A3, 0.0)                        # cleared as b_A is
    b_X3 = tl.where(o_s[None, :, None] == o_s[None, None, :], 1.0, 0.0) + tl.zeros([NB, BS, BS], dtype=tl.float32)
    for s in range(0, BS):
        b_xs = tl.sum(tl.where(o_s[None, :, None] == s, b_X3, 0.0), axis=1)      # [NB, BS]: row s of each block
        b_as = tl.sum(tl.where(o_s[None, None, :] == s, b_A3, 0.0), axis=2)      # [NB, BS]: column s of each block
        b_X3 = b_X3 - b_as[:, :, None] * b_xs[:, None, :]
    # back to a [BT, BT] tile, the blocks on its diagonal: [NB, BS, NB, BS] with block n in row-block n
    b_X = tl.reshape(tl.where(o_n[:, None, None, None] == o_n[None, None, :, None], b_X3[:, :, None, :], 0.0),
                     [BT, BT])
    o_blk = o_c // BS
    m_same = o_blk[:, None] == o_blk[None, :]
    # (b) The rest from I + A = D⁻¹ (I + N), N = D A_o (A_o: the blocks below the diagonal). N is
    #     strictly block-lower with four blocks, so N⁴ = 0 and X = (I - N + N² - N³) D: four products
    #     of 64 x 64 tiles on tensor cores (IEEE fp32 for fp32 inputs; TF32 for 16-bit ones, whose X is
    #     rounded to 16 bits next anyway).
    b_N = tl.dot(b_X, tl.where(m_same, 0.0, b_A), input_precision=SOLVE_PREC)
    b_N2 = tl.dot(b_N, b_N, input_precision=SOLVE_PREC)
    b_N3 = tl.dot(b_N2, b_N, input_precision=SOLVE_PREC)
    b_M = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0) - b_N + b_N2 - b_N3
    b_X = tl.dot(b_M, b_X, input_precision=SOLVE_PREC)
    b_X = tl.where(o_c[:, None] >= first_bad, float("nan"), b_X)
    b_Xd = b_X.to(k.dtype.element_ty)

    # W = X diag(β) (K ⊙ e^b): b <= 0, so every factor e^b <= 1
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_k = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_k = tl.load(k + p_k, mask=m_tk, other=0.0).to(tl.float32)
    b_g = tl.load(b + p_k, mask=m_tk, other=0.0)
    b_kb = (b_k * tl.exp(b_g) * b_beta[:, None]).to(k.dtype.element_ty)
    # the keys decayed to the chunk's last token, K ⊙ e^{b_last - b}, for the state pass: computed here,
    # in parallel over chunks, they leave the sequential pass no exponential but one per key row
    b_gl = tl.load(b + ((i_b * T + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h) * K + o_k, mask=m_k, other=0.0)
    tl.store(kg + p_k, (b_k * tl.exp(b_gl[None, :] - b_g)).to(kg.dtype.element_ty), mask=m_tk)
    # X is lower triangular: dot_causal keeps a NaN or inf in a later token out of the earlier rows
    b_w = dot_causal(b_Xd, b_kb, tl.zeros([BT, BK], dtype=tl.float32), DOT_PREC)
    tl.store(w + p_k, b_w.to(w.dtype.element_ty), mask=m_tk)

    # W' = X diag(β) V, V in tiles of BV columns
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_u = dot_causal(b_Xd, (b_v * b_beta[:, None]).to(k.dtype.element_ty), tl.zeros([BT, BV], dtype=tl.float32),
                         DOT_PREC)
        tl.store(u + p_v, b_u.to(u.dtype.element_ty), mask=m_tv)


def kda_wy(k, v, b, beta, Akk, w, u, kg) -> None:
    """The pseudo-values of every chunk, all chunks in parallel (one program per chunk and batch·head).

    k: [B, T, H, K]; v: [B, T, H, V]; b: fp32 [B, T, H, K], the in-chunk cumulative gates; beta:
    [B, T, H]; Akk: fp32 [B, T, H, CHUNK], the key-key scores Σ_c k_tc k_jc e^{b_tc - b_jc} (GLA's
    scores with k for q and scale 1), read strictly below the diagonal. Written, in k's dtype: w and kg
    [B, T, H, K], u [B, T, H, V]: W = (I + A)⁻¹ diag(β) (K ⊙ e^b), W' = (I + A)⁻¹ diag(β) V, and the keys
    decayed to their chunk's last token, K ⊙ e^{b_last - b}, which the state pass adds with.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    _kda_wy_kernel[(cdiv(T, CHUNK), B * H)](
        k, v, b, beta, Akk, w, u, kg, T, H, K, V, BT=CHUNK, BK=pow2_at_least_16(K),
        BV=min(64, pow2_at_least_16(V)), BS=SUB_CHUNK, NB=CHUNK // SUB_CHUNK, DOT_PREC=dot_precision(k.dtype),
        SOLVE_PREC=dot_precision(k.dtype))


# ------------------------------------------------------------------ 3. the state pass
_fits = tiles_that_fit()


# BV, num_warps, num_stages. At K = 128 and bf16, ptxas (sm_90) fits BV = 32 and 16 in registers with
# 8 warps (245 and 217 per thread); BV = 32 with 4 warps spills 480 bytes, BV = 64 spills at 4 and 8.
_STATE_CONFIGS = autotune_configs([({"BV": 32}, 8, 3), ({"BV": 32}, 8, 2), ({"BV": 16}, 4, 2)],
                                  interpreter={"BV": 32})


@triton.autotune(configs=_STATE_CONFIGS, key=["K", "V", "NBH"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "NBH"])
def _kda_state_kernel(
    kg, w, u, b, h, vn, h0, ht, T, H, NT, NBH,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: every key row (U = W' - W S sums over K) and BV value columns of one (batch, head)
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * V + o_v[None, :]
    b_h = state_tile(h0, i_bh * K * V + p_h, m_h, USE_H0, BK, BV)

    for i_t in range(NT):
        # the state at the start of chunk i_t, for the output kernel (in the input dtype)
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_h, b_h.to(h.dtype.element_ty), mask=m_h)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        # the values the state really receives: U = W' - W S, [BT, BV]
        m_tk = m_t[:, None] & m_k[None, :]
        b_w = tl.load(w + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_u = tl.load(u + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_u -= tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT_PREC)
        b_ud = b_u.to(vn.dtype.element_ty)
        tl.store(vn + p_v, b_ud, mask=m_tv)
        # then GLA's update: decay the state to the chunk end, add (K ⊙ e^{b_last - b})ᵀ U (kg, from the solve)
        p_kt = ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None]
        b_kgt = tl.load(kg + p_kt, mask=m_k[:, None] & m_t[None, :], other=0.0)
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        b_gl = tl.load(b + ((i_b * T + t_last) * H + i_h) * K + o_k, mask=m_k, other=0.0)
        b_h = b_h * tl.exp(b_gl)[:, None] + tl.dot(b_kgt, b_ud, input_precision=DOT_PREC)

    store_state(ht, i_bh * K * V + p_h, m_h, b_h, STORE_HT)


def kda_state_pass(kg, w, u, b, states, v_new, initial_state=None, final_state=None) -> None:
    """The state at every chunk start and after the last, and the values it receives (sequential
    over chunks; one program per V-tile and batch·head walks them).

    kg, w: [B, T, H, K]; u: [B, T, H, V] (`kda_wy`); b: fp32 [B, T, H, K], the in-chunk cumulative
    gates (the pass reads each chunk's last row). Written: states [B, NT, H, K, V] and v_new [B, T, H, V]
    (U = W' - W S, per chunk) in kg's dtype; final_state fp32 [B, H, K, V] unless None. initial_state:
    fp32 [B, H, K, V] or None.
    """
    B, T, H, K = kg.shape
    V = u.shape[-1]
    NT = cdiv(T, CHUNK)
    _kda_state_kernel[lambda m: (cdiv(V, m["BV"]), B * H)](
        kg, w, u, b, states, v_new, initial_state, final_state, T, H, NT, B * H, K, V, BT=CHUNK,
        BK=pow2_at_least_16(K), USE_H0=initial_state is not None, STORE_HT=final_state is not None,
        DOT_PREC=dot_precision(kg.dtype))


__all__ = ["kda_prepare", "kda_scores", "kda_wy", "kda_state_pass"]
