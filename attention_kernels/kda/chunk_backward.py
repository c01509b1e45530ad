"""chunk_kda's backward. It takes from the training forward what fla's chunk_kda keeps from its own: the
query-key scores A_qk and the solve's inverse X = (I + A)⁻¹, both in the input dtype (computed again when not
given). The forward's own launches (`chunk_kda_intermediates`, attention_kernels/kda/chunk.py) recompute the
in-chunk cumulative gates b, the solve's W and Ũ (from the kept X: no scores launch and no solve), the keys
decayed to their chunk's end K_g, and the state S at every chunk start (in `chunk_state_dtype`, the input dtype
for 16-bit inputs, as are the state gradients). The forward of one chunk (attention_kernels/kda/chunk.py has
the derivation):

    U = Ũ - W S,                         W = (I + A)⁻¹ diag(β) (K ⊙ e^b),  Ũ = (I + A)⁻¹ diag(β) V
    S_next = e^{b_last} ⊙ S + K_gᵀ U,     K_g = K ⊙ e^{b_last - b}
    O = scale (Q ⊙ e^b) S + A_qk U

The reverse state pass is the shared one with its delta-rule switch (attention_kernels/linear/chunk_backward.py,
Triton): from the last chunk to the first, dU = A_qkᵀ dO + K_g dS_next and
dS = scale (Q ⊙ e^b)ᵀ dO + e^{b_last} ⊙ dS_next - Wᵀ dU.

The scores' gradients go through the exponent b_t - b_j of every pair j <= t per channel: both matrices
are GLA's per-channel-gated scores A_tj = Σ_c a_tc k_jc e^{b_tc - b_jc}, with a = q (A_qk, scale folded in
its gradient) and a = k (A_kk, under β, strictly below the diagonal), so their pairs j < t go to GLA's own
sub-chunk launch (`chunk_dqk_intra`, attention_kernels/linear/chunk_backward.py: sub-chunks of 16 rows,
every exponent <= 0), both matrices in one launch, which share every exponential and every load of k and b;
the pair j = t (A_qk's diagonal) has no exponent. They take q and k in fp32 (as the L2 norm's gradient needs
them), in products of IEEE fp32 for fp32 inputs and TF32 for 16-bit ones (more bits than the inputs had).
A_kk's value is needed nowhere: its share of dβ, Σ_j dA_tj A_kk,tj for A = diag(β) A_kk, equals
k_t · Σ_j dA_tj k_j ⊙ e^{b_t - b_j}, the sub-chunk launch's rows taken without β.

Two kernels of this module do the rest, one program per chunk and batch·head each, in fp32 registers (the
states and their gradients read as stored, 16-bit for 16-bit inputs), their products IEEE fp32 for fp32 inputs
and TF32 for 16-bit ones, as the sub-chunk launch's. `_kda_chunk_grad_kernel`, before the sub-chunk launch:
the read-out's and the state update's gradients (products with S and dS' over the value dim in tiles); the
solve's, as products with the transpose of its inverse X (dR = Xᵀ dW: dR_k = -Xᵀ (dU Sᵀ), dR_v = Xᵀ dU, so dv
= β dR_v; no triangular solve), and dA = -(dR_k Wᵀ + dR_v Ũᵀ) below the diagonal; dR's shares of dβ; and
the scores' gradients dA_qk = scale dO Uᵀ (on and below the diagonal) and dA, which the sub-chunk launch
reads. It writes dv (in v's dtype), partial dq, dk, db (the gradient to b) and dβ in fp32, and q and k in fp32
(normalised when the L2 norm is on) for the sub-chunk launch. `_kda_dqk_combine_kernel`, after it: the
partials and the pairs j < t summed, the pair j = t added, A_kk's share of dβ, db's in-chunk reverse
cumulative sum (b = the in-chunk cumsum of g) for dg, and the L2 norm's gradient, with the norms recomputed
from the raw rows. A gate below GATE_FLOOR (-inf: a reset) counts as the floor, as in the forward, and gets
gradient 0. A NaN or inf in an input can make every row of its chunk's gradients NaN (X's rows from the
first non-finite one on are NaN, and the products with Xᵀ reach every row), where the recurrence's gradient
keeps the rows after it finite.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import on_machine, pow2_at_least_16
from ..linear.chunk import (CHUNK, GATE_FLOOR, chunk_at, chunk_row, chunk_state_base, chunk_state_dtype, dot_precision,
                            n_chunks, varlen)
from ..linear.chunk_backward import chunk_dqk_intra, chunk_state_grad_pass, delta_walk_takes_gated_queries
from .chunk import chunk_kda_intermediates
from .reference import L2NORM_EPS


@triton.jit
def _row_square_sums(x, o_c, m_t, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """Σ x² of the chunk's rows o_c of x ([B, T, H, K], x at the chunk's first row), [BT] fp32, over K in tiles
    of BK."""
    b_ss = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_x = tl.load(x + (o_c[:, None] * H) * K + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :],
                      other=0.0).to(tl.float32)
        b_ss += tl.sum(b_x * b_x, axis=1)
    return b_ss


# ------------------------------------------------------------------ 1. every gradient but the pairs j < t
@triton.jit(do_not_specialize=["T", "H", "NT"])
def _kda_chunk_grad_kernel(
    q, k, v, b, beta, inverse, w, u, v_new, states, dstates, do, du,
    dq, dk, db, dv, dbeta, dAqk, dA, qn, kn, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    L2NORM: tl.constexpr, EPS: tl.constexpr, STORE_QK: tl.constexpr, DOT_PREC: tl.constexpr,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: chunk i_t of one (batch, head), or of packed sequences' chunk program i_c (linear/chunk.py's
    # chunk_at), the key dim in tiles of BK (outer), the value dim in tiles of BV (inner): each state tile is
    # read once, the chunk's value rows once per key tile
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    # the chunk's first row, 64-bit (linear/chunk.py's chunk_row); rows and columns after it 32-bit
    r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)
    q, k, b, w, qn, kn = q + r_c * K, k + r_c * K, b + r_c * K, w + r_c * K, qn + r_c * K, kn + r_c * K
    dq, dk, db = dq + r_c * K, dk + r_c * K, db + r_c * K
    v, u, v_new, do, du, dv = v + r_c * V, u + r_c * V, v_new + r_c * V, do + r_c * V, du + r_c * V, dv + r_c * V
    inverse, dAqk, dA = inverse + r_c * BT, dAqk + r_c * BT, dA + r_c * BT
    p_h = chunk_state_base(i_b, i_c, i_h, NT, H, K, V)                 # this chunk's state, 64-bit
    states, dstates = states + p_h, dstates + p_h
    p_A = (o_c[:, None] * H) * BT + o_c[None, :]
    b_beta = tl.load(beta + (tok0 + o_t) * H + i_h, mask=m_t, other=0.0).to(tl.float32)    # [B, T, H]: 32-bit
    # Xᵀ, X = (I + A)⁻¹ lower triangular (the forward's solve wrote it in k's dtype), read again in the key
    # loop rather than held through it
    p_At = (o_c[None, :] * H) * BT + o_c[:, None]
    b_Xt = tl.load(inverse + p_At, mask=m_t[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        b_rq = tl.rsqrt(_row_square_sums(q, o_c, m_t, H, K, BT, BK) + EPS)
        b_rk = tl.rsqrt(_row_square_sums(k, o_c, m_t, H, K, BT, BK) + EPS)
    else:
        b_rq = tl.full([BT], 1.0, tl.float32)
        b_rk = b_rq

    # the value side, over the value dim: dO Uᵀ (A_qk's gradient) and Ũ = X diag(β) V's: dR_v = Xᵀ dU,
    # dv = β dR_v, and dR_v's shares of dβ (Σ dR_v ⊙ v) and of dA (dR_v Ũᵀ). Every product takes fp32
    # operands at DOT_PREC: TF32 holds a 16-bit input exactly (as many mantissa bits as fp16, more than bf16),
    # so a product of two 16-bit inputs is what 16-bit tensor cores give, and all the accumulators share one
    # register layout
    b_dAqk = tl.zeros([BT, BT], dtype=tl.float32)
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = (o_c[:, None] * H) * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_u = tl.load(v_new + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_dAqk += tl.dot(b_do, tl.trans(b_u), input_precision=DOT_PREC)
        b_dRv = tl.dot(b_Xt, tl.load(du + p_v, mask=m_tv, other=0.0), input_precision=DOT_PREC)
        tl.store(dv + p_v, (b_dRv * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)
        b_dbeta += tl.sum(b_dRv * tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32), axis=1)
        b_wv = tl.load(u + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_dA += tl.dot(b_dRv, tl.trans(b_wv), input_precision=DOT_PREC)
    # A_qk's gradient, scale folded in, on and below the diagonal (the sub-chunk launch reads the pairs j < t,
    # the combine the diagonal)
    tl.store(dAqk + p_A, tl.where(o_c[:, None] >= o_c[None, :], b_dAqk * scale, 0.0), mask=m_t[:, None])

    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        # the key side, over the value dim: dO Sᵀ (the read-out), U dS'ᵀ (the state update), dU Sᵀ (Ũs share
        # of U = Ũ - W S) and rowsum(S ⊙ dS') (b_last's); the states as stored (16-bit for 16-bit inputs),
        # multiplied in fp32
        b_dqs = tl.zeros([BT, BK], dtype=tl.float32)
        b_dkg = tl.zeros([BT, BK], dtype=tl.float32)
        b_dus = tl.zeros([BT, BK], dtype=tl.float32)
        b_sds = tl.zeros([BK], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m_t[:, None] & m_v[None, :]
            p_v = (o_c[:, None] * H) * V + o_v[None, :]
            p_s = o_k[:, None] * V + o_v[None, :]
            b_s = tl.load(states + p_s, mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
            b_ds = tl.load(dstates + p_s, mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
            b_dqs += tl.dot(tl.load(do + p_v, mask=m_tv, other=0.0).to(tl.float32), tl.trans(b_s),
                            input_precision=DOT_PREC)
            b_dkg += tl.dot(tl.load(v_new + p_v, mask=m_tv, other=0.0).to(tl.float32), tl.trans(b_ds),
                            input_precision=DOT_PREC)
            b_dus += tl.dot(tl.load(du + p_v, mask=m_tv, other=0.0), tl.trans(b_s), input_precision=DOT_PREC)
            b_sds += tl.sum(b_s * b_ds, axis=1)

        # this key tile's partials, each stored as soon as it is whole
        # W = X diag(β) (K ⊙ e^b), dW = -dU Sᵀ: dR_k = -Xᵀ (dU Sᵀ), dkb = β dR_k, and dR_k's shares of dA
        # (dR_k Wᵀ) and dβ (Σ dR_k ⊙ K ⊙ e^b)
        p_k = (o_c[:, None] * H) * K + o_k[None, :]
        b_Xt = tl.load(inverse + p_At, mask=m_t[None, :], other=0.0).to(tl.float32)
        b_dRk = -tl.dot(b_Xt, b_dus, input_precision=DOT_PREC)
        b_w = tl.load(w + p_k, mask=m_tk, other=0.0).to(tl.float32)
        b_dA += tl.dot(b_dRk, tl.trans(b_w), input_precision=DOT_PREC)
        b_g = tl.load(b + p_k, mask=m_tk, other=0.0)
        b_eb = tl.exp(b_g)                                              # every b <= 0
        b_k = tl.load(k + p_k, mask=m_tk, other=0.0).to(tl.float32) * b_rk[:, None]
        b_kb = b_k * b_eb
        b_dbeta += tl.sum(b_dRk * b_kb, axis=1)
        b_dkb = b_dRk * b_beta[:, None]
        # through K_gᵀ U, K_g = K ⊙ e^{b_last - b}: dk = e^{b_last - b} ⊙ U dS'ᵀ, -k ⊙ dk to b, and to b_last
        # the same summed over the rows, plus e^{b_last} rowsum(S ⊙ dS') (S' = e^{b_last} ⊙ S + ...)
        b_gl = tl.load(b + ((t_last - i_t * BT) * H) * K + o_k, mask=m_k, other=0.0)
        b_dk = b_dkg * tl.exp(tl.where(m_tk, b_gl[None, :] - b_g, 0.0))
        b_kdk = b_k * b_dk
        b_dbl = tl.sum(b_kdk, axis=0) + tl.exp(b_gl) * b_sds
        # b_last is the last real token's b
        b_db = b_dkb * b_kb - b_kdk + tl.where(o_c[:, None] == t_last - i_t * BT, b_dbl[None, :], 0.0)
        tl.store(dk + p_k, b_dk + b_dkb * b_eb, mask=m_tk)
        if STORE_QK:
            tl.store(kn + p_k, b_k, mask=m_tk)
        # through scale (Q ⊙ e^b) S: dq = scale e^b ⊙ dO Sᵀ, and q ⊙ dq to b
        b_dq = b_dqs * b_eb * scale
        tl.store(dq + p_k, b_dq, mask=m_tk)
        b_q = tl.load(q + p_k, mask=m_tk, other=0.0).to(tl.float32) * b_rq[:, None]
        if STORE_QK:
            tl.store(qn + p_k, b_q, mask=m_tk)
        tl.store(db + p_k, b_db + b_dq * b_q, mask=m_tk)

    # dA = -(dR_k Wᵀ + dR_v Ũᵀ) for A = diag(β) A_kk, strictly below the diagonal, for the sub-chunk launch:
    # its share of dβ, Σ_j dA_tj A_kk,tj, is k_t · Σ_j dA_tj k_j ⊙ e^{b_t - b_j}, that launch's rows (A_kk
    # itself is neither kept nor recomputed). dβ's other shares, here, in fp32
    b_dA = tl.where((o_c[:, None] > o_c[None, :]) & m_t[:, None], -b_dA, 0.0)
    tl.store(dbeta + (tok0 + o_t) * H + i_h, b_dbeta, mask=m_t)
    tl.store(dA + p_A, b_dA, mask=m_t[:, None])


# ------------------------------------------------------------------ 2. the sums, the gate's and the L2 norm's
@triton.jit(do_not_specialize=["T", "H"])
def _kda_dqk_combine_kernel(
    q, k, g, beta, dAqk, dq_part, dk_part, db_part, dbeta_part, dq_qk, dk_rows, dk_cols, dq, dk, dg, dbeta, T, H,
    K: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr,
    EPS: tl.constexpr, FLOOR: tl.constexpr, cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: chunk i_t of one (batch, head) (or of packed sequences' chunk program i_c, `chunk_at`), all
    # of K (BK >= K: the L2 norm sums over it), the rows in blocks of BR from the chunk's last, carrying the sum
    # of db over the rows after the block
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)    # 64-bit; the rows after it 32-bit
    q, k, g, dq, dk, dg = q + r_c * K, k + r_c * K, g + r_c * K, dq + r_c * K, dk + r_c * K, dg + r_c * K
    dq_part, dk_part, db_part = dq_part + r_c * K, dk_part + r_c * K, db_part + r_c * K
    dq_qk, dk_rows, dk_cols = dq_qk + r_c * K, dk_rows + r_c * K, dk_cols + r_c * K
    dAqk = dAqk + r_c * BT
    b_after = tl.zeros([BK], dtype=tl.float32)
    for i_r in range(BT // BR):
        o_r = BT - BR - i_r * BR + tl.arange(0, BR)
        m_r = i_t * BT + o_r < T
        m_rk = m_r[:, None] & m_k[None, :]
        p_k = (o_r[:, None] * H) * K + o_k[None, :]
        b_q = tl.load(q + p_k, mask=m_rk, other=0.0).to(tl.float32)
        b_k = tl.load(k + p_k, mask=m_rk, other=0.0).to(tl.float32)
        if L2NORM:
            b_rq = tl.rsqrt(tl.sum(b_q * b_q, axis=1) + EPS)
            b_rk = tl.rsqrt(tl.sum(b_k * b_k, axis=1) + EPS)
            b_q, b_k = b_q * b_rq[:, None], b_k * b_rk[:, None]
        # A_qk's diagonal pairs, which have no exponent: dA_tt k_t to dq, dA_tt q_t to dk, and to b two shares
        # that cancel exactly, left out
        b_dAd = tl.load(dAqk + (o_r * H) * BT + o_r, mask=m_r, other=0.0)
        # the pairs j < t of both matrices: A_qk's rows to dq and columns to dk, A_kk's rows and columns to dk;
        # to b, a ⊙ da of the rows minus k ⊙ dk of the columns
        b_dqs = tl.load(dq_qk + p_k, mask=m_rk, other=0.0)
        b_dq = tl.load(dq_part + p_k, mask=m_rk, other=0.0) + b_dqs + b_dAd[:, None] * b_k
        b_db = tl.load(db_part + p_k, mask=m_rk, other=0.0) + b_dqs * b_q
        if L2NORM:
            # through x / sqrt(Σ x² + eps): (dx̂ - x̂ (x̂ · dx̂)) / sqrt(Σ x² + eps)
            b_dq = (b_dq - b_q * tl.sum(b_q * b_dq, axis=1)[:, None]) * b_rq[:, None]
        tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_rk)
        # A_kk's rows, Σ_{j<t} dA_tj k_j ⊙ e^{b_t - b_j} for A = diag(β) A_kk: k_t · it to β_t, β_t times it
        # to k_t
        b_dkr = tl.load(dk_rows + p_k, mask=m_rk, other=0.0)
        o_bt = (tok0 + i_t * BT + o_r) * H + i_h                       # [B, T, H]: 32-bit
        b_dbeta = tl.load(dbeta_part + o_bt, mask=m_r, other=0.0) + tl.sum(b_k * b_dkr, axis=1)
        tl.store(dbeta + o_bt, b_dbeta.to(dbeta.dtype.element_ty), mask=m_r)
        b_dkr *= tl.load(beta + o_bt, mask=m_r, other=0.0).to(tl.float32)[:, None]
        b_dkc = tl.load(dk_cols + p_k, mask=m_rk, other=0.0)          # both matrices' columns
        b_dk = tl.load(dk_part + p_k, mask=m_rk, other=0.0) + b_dkr + b_dkc + b_dAd[:, None] * b_q
        b_db += (b_dkr - b_dkc) * b_k
        if L2NORM:
            b_dk = (b_dk - b_k * tl.sum(b_k * b_dk, axis=1)[:, None]) * b_rk[:, None]
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_rk)
        # b = the in-chunk cumulative sum of g: dg_s = Σ_{t >= s} db_t (rows past T hold 0). A gate under the
        # floor (-inf) is not a variable
        b_dg = tl.cumsum(b_db, axis=0, reverse=True) + b_after[None, :]
        b_after += tl.sum(b_db, axis=0)
        b_graw = tl.load(g + p_k, mask=m_rk, other=0.0)
        tl.store(dg + p_k, tl.where(b_graw < FLOOR, 0.0, b_dg).to(dg.dtype.element_ty), mask=m_rk)


# Tiles and warps from ptxas (sm_90a, bf16, K = V = 128, scripts/linear_bwd_compile.py). The chunk kernel: key
# tiles of 32, value tiles of 64, 8 warps, one stage: 255 registers and two of them spilled (8 bytes stored
# before the loops, loaded once after them). Key tiles of 64 spilled 1.5 KB, inside the loops; 4 warps, or 2
# and 3 stages, spilled more. The combine: rows in blocks of 16 on 4 warps, 168 registers, no spills (the whole
# chunk at once spilled at 4 and 8 warps).
_GRAD_BK, _GRAD_BV, _GRAD_WARPS = 32, 64, 8
_COMBINE_ROWS, _COMBINE_WARPS = 16, 4


def chunk_kda_bwd(q, k, v, g, beta, scale: float, h0, do, dht, use_qk_l2norm_in_kernel: bool, kept=None,
                  packed=None):
    """The gradients of chunk_kda (see the module docstring): the recomputed forward, the reverse state pass,
    every chunk's gradients but the scores' pairs j < t, those pairs (GLA's sub-chunk kernel, both score
    matrices in one launch), then the sums with the gate's and the L2 norm's gradients. Triton throughout;
    torch allocates.

    q, k, g: [B, T, H, K]; v, do: [B, T, H, V] (do in v's dtype); beta: [B, T, H]; h0, dht: fp32
    [B, H, K, V] or None (zeros); all contiguous. do and dht are the gradients of o and of the final state.
    kept: (Aqk, X), the query-key scores and the solve's inverse as the training forward wrote them
    (`chunk_kda_intermediates`), or None to compute them again. packed: packed sequences (`packed_chunks`,
    B = 1; h0 and dht one per sequence, [N, H, K, V]): every launch reads the chunk table.
    Returns (dq, dk, dv, dg, dbeta, dh0 or None), each in its input's dtype (dh0 fp32).

        >>> q, k, v, g = torch.randn(4, 1, 70, 2, 32, device="cuda").unbind(0)
        >>> beta = torch.rand(1, 70, 2, device="cuda")
        >>> dq, dk, dv, dg, dbeta, _ = chunk_kda_bwd(q, k, v, -g.abs(), beta, 32 ** -0.5, None,
        ...                                          torch.randn_like(v), None, True)
    """
    B, T, H, K = q.shape
    V, NT = v.shape[-1], n_chunks(T, packed)
    dev, state_dtype = q.device, chunk_state_dtype(q.dtype)
    f32 = dict(dtype=torch.float32, device=dev)
    # ---- the forward's intermediates, by the forward's kernels (the solve's inverse too; from the kept one,
    # no scores launch and no solve)
    gated_q = torch.empty_like(q) if delta_walk_takes_gated_queries(K, dev) else None
    x = chunk_kda_intermediates(q, k, v, g, beta, scale, h0, l2norm=use_qk_l2norm_in_kernel,
                                state_dtype=state_dtype, store_inverse=True, kept=kept,
                                kept_computed=kept is not None, gated_queries=gated_q, packed=packed)
    # ---- the reverse state pass (the delta rule's): dS' at every chunk's end, dS at the start, and dU
    dstates = torch.empty(B, NT, H, K, V, dtype=state_dtype, device=dev)
    dU = torch.empty(B, T, H, V, **f32)
    dh0 = None if h0 is None else torch.empty_like(h0)
    chunk_state_grad_pass(x.q, do, x.b, dstates, scale, dht, dh0, Aqk=x.Aqk, kg=x.kg, w=x.w, du=dU,
                          gated_queries=gated_q, packed=packed)
    del gated_q

    # ---- every chunk's gradients but the scores' pairs j < t: dv, the partial dq, dk, db and dbeta, dA_qk
    # and dA. The sub-chunk launch takes q and k in fp32 (normalised when the L2 norm is on): written here
    # unless q and k are those already
    store_qk = use_qk_l2norm_in_kernel or q.dtype != torch.float32
    qn, kn = (torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, K, **f32)) if store_qk else (q, k)
    dq_part, dk_part, db_part = (torch.empty(B, T, H, K, **f32) for _ in range(3))
    dAqk, dA = torch.empty(B, T, H, CHUNK, **f32), torch.empty(B, T, H, CHUNK, **f32)
    dv, dbeta_part = torch.empty_like(v), torch.empty(B, T, H, **f32)
    precision = dot_precision(q.dtype)
    _kda_chunk_grad_kernel[(NT, B * H)](
        q, k, v, x.b, beta, x.inverse, x.w, x.u, x.v_new, x.states, dstates, do, dU,
        dq_part, dk_part, db_part, dv, dbeta_part, dAqk, dA, qn, kn, scale, T, H, NT, K, V, BT=CHUNK,
        BK=on_machine(gpu=min(_GRAD_BK, pow2_at_least_16(K)), interpreter=16),
        BV=on_machine(gpu=min(_GRAD_BV, pow2_at_least_16(V)), interpreter=16), L2NORM=use_qk_l2norm_in_kernel,
        EPS=L2NORM_EPS, STORE_QK=store_qk, DOT_PREC=precision, **varlen(packed), num_warps=_GRAD_WARPS,
        num_stages=1)
    b = x.b
    # the state-sized and per-token buffers go back before the next ones (the kept scores, when the training
    # forward handed them in, stay with autograd until the backward returns)
    del x, dstates, dU

    # ---- the scores' pairs j < t, GLA's sub-chunk kernel on [B, T, H, ·] tensors, both matrices in one launch:
    # A_qk's rows to dq_qk, A_kk's (k in both places) to dk_rows without β, the columns of both summed into
    # dk_cols (A_kk's under β); in products of IEEE fp32 for fp32 inputs and TF32 for 16-bit ones
    dq_qk, dk_rows, dk_cols = (torch.empty(B, T, H, K, **f32) for _ in range(3))
    chunk_dqk_intra(qn, kn, b, dAqk, dq_qk, dk_cols, input_precision=precision, dA_kk=dA, dk_rows=dk_rows,
                    beta=beta, packed=packed)

    # ---- the sums, the diagonal pairs, dβ, the gate's reverse cumulative sum and the L2 norm's gradient
    dq, dk, dg, dbeta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(g), torch.empty_like(beta)
    _kda_dqk_combine_kernel[(NT, B * H)](
        q, k, g, beta, dAqk, dq_part, dk_part, db_part, dbeta_part, dq_qk, dk_rows, dk_cols, dq, dk, dg, dbeta,
        T, H, K, BT=CHUNK,
        BR=_COMBINE_ROWS, BK=pow2_at_least_16(K), L2NORM=use_qk_l2norm_in_kernel, EPS=L2NORM_EPS, FLOOR=GATE_FLOOR,
        **varlen(packed), num_warps=_COMBINE_WARPS)
    return dq, dk, dv, dg, dbeta, dh0


__all__ = ["chunk_kda_bwd"]
