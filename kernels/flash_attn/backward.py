"""FlashAttention-2 backward in Triton: recompute P from Q, K and the saved log-sum-exp.

Two launches, in this order:
1. `_attn_bwd_dq_kernel`: one program per block of BM queries; it first computes
   delta_i = rowsum(dO_i * O_i), the softmax correction term, and stores it, then loops over
   key blocks like the forward and accumulates dQ.
2. `_attn_bwd_dkdv_kernel`: one program per block of BN keys of one KV head. It keeps K, V,
   dK, dV in registers and loops over the query blocks of *every* query head of its GQA group,
   so the group's sum lands in dK/dV without atomics. It reads the delta that launch 1 wrote.
With P = exp2(s * scale * log2e - lse), dP = dO Vᵀ, dS = P ∘ (dP - delta):
dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import INTERPRET
from .forward import INTERPRET_TILES, LOG2E, _key_ranges, launch

# Tiles (BM query rows, BN keys, num_warps, num_stages), fixed from what autotuning picked on the
# H200 (bf16, D = 128, N = 1K..4K). dK/dV: BN = 128 keys, BM = 64, 8 warps, 3 stages when that
# makes at least 1024 programs (N = 4K at B = 1, H = 32); with fewer, 64 keys per program with
# 4 warps and BM = 32 won (1K: 92 against 93 us, causal 83 against 106; 2K causal: 217 against
# 258 us), as it launches twice as many programs. dQ: BM = 128, BN = 64, 8 warps, 3 stages at
# every length. D = 256 needs half-size tiles (registers, shared memory).
DKDV_TILES = (64, 128, 8, 3)
DKDV_TILES_FEW = (32, 64, 4, 3)  # when DKDV_TILES would give fewer than MIN_PROGRAMS programs
DKDV_TILES_D256 = (32, 64, 8, 2)
MIN_PROGRAMS = 1024
DQ_TILES = (128, 64, 8, 3)
DQ_TILES_D256 = (64, 32, 8, 2)
BWD_FALLBACK = (16, 32, 4, 1)  # used only if a tile does not fit in shared memory (e.g. fp32, D = 256)


def dkdv_tiles(D: int, B: int, S: int, HKV: int):
    """The dK/dV kernel's (BM, BN, num_warps, num_stages) candidates, best first."""
    if INTERPRET:
        return [(16, 32, 4, 1)]
    if D == 256:
        return [DKDV_TILES_D256, BWD_FALLBACK]
    enough = triton.cdiv(S, DKDV_TILES[1]) * B * HKV >= MIN_PROGRAMS
    return [DKDV_TILES if enough else DKDV_TILES_FEW, BWD_FALLBACK]


def dq_tiles(D: int):
    """The dQ kernel's (BM, BN, num_warps, num_stages) candidates, best first."""
    if INTERPRET:
        return [INTERPRET_TILES]
    return [DQ_TILES_D256 if D == 256 else DQ_TILES, BWD_FALLBACK]


# ---------------------------------------------------------------- dK, dV
@triton.jit
def _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, p_q0, p_do0, p_lse0, p_delta0, stride_t,
                         o_n, o_d, lo, hi, T, shift, qk_scale, BM: tl.constexpr, MASKED: tl.constexpr):
    """Visit query blocks [lo, hi) for one key block: recompute Pᵀ, accumulate dV and dK."""
    o_mb = tl.arange(0, BM)
    for i_m in range(lo, hi, BM):
        o_m = i_m + o_mb
        m_m = o_m < T  # rows past T load as zeros: they add nothing to dK, dV
        b_q = tl.load(p_q0 + o_m[:, None] * stride_t + o_d[None, :], mask=m_m[:, None], other=0.0)
        b_lse = tl.load(p_lse0 + o_m, mask=m_m, other=0.0)
        b_sT = tl.dot(b_k, tl.trans(b_q)) * qk_scale - b_lse[None, :]  # [BN, BM], log2 of Pᵀ
        if MASKED:  # causal diagonal: key j reaches query i iff j <= i + S - T; mask before exp2
            b_sT = tl.where(o_n[:, None] <= o_m[None, :] + shift, b_sT, float("-inf"))
        b_pT = tl.math.exp2(b_sT)
        b_do = tl.load(p_do0 + o_m[:, None] * stride_t + o_d[None, :], mask=m_m[:, None], other=0.0)
        b_dv = tl.dot(b_pT.to(b_do.dtype), b_do, b_dv)
        b_delta = tl.load(p_delta0 + o_m, mask=m_m, other=0.0)
        b_dpT = tl.dot(b_v, tl.trans(b_do))  # [BN, BM] = (dO Vᵀ)ᵀ
        b_dsT = b_pT * (b_dpT - b_delta[None, :])
        b_dk = tl.dot(b_dsT.to(b_q.dtype), b_q, b_dk)
    return b_dk, b_dv


@triton.jit(do_not_specialize=["T", "S", "HQ", "GROUP"])
def _attn_bwd_dkdv_kernel(q, k, v, do, dk, dv, lse, delta, T, S, HQ, GROUP, qk_scale, sm_scale,
                          D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """q, do: [B, T, HQ, D]; k, v, dk, dv: [B, S, HQ // GROUP, D]; all contiguous."""
    HKV = HQ // GROUP
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = (i_bh // HKV).to(tl.int64)
    i_hk = i_bh % HKV
    n0 = i_n * BN
    o_n = n0 + tl.arange(0, BN)
    o_d = tl.arange(0, D)
    m_n = o_n < S
    kv_offset = (i_b * S * HKV + i_hk) * D + o_n[:, None] * (HKV * D) + o_d[None, :]
    b_k = tl.load(k + kv_offset, mask=m_n[:, None], other=0.0)
    b_v = tl.load(v + kv_offset, mask=m_n[:, None], other=0.0)
    b_dk = tl.zeros([BN, D], dtype=tl.float32)
    b_dv = tl.zeros([BN, D], dtype=tl.float32)

    shift = S - T
    t_end = tl.cdiv(T, BM) * BM
    if CAUSAL:
        # rows below `lo` see none of these keys; rows from `full` on see all of them
        lo = tl.maximum(n0 - shift, 0) // BM * BM
        full = tl.minimum(tl.cdiv(tl.maximum(n0 + BN - 1 - shift, 0), BM) * BM, t_end)
    else:
        lo = 0
        full = 0
    for g in range(GROUP):  # every query head of this KV head's group: the GQA sum, no atomics
        i_h = i_hk * GROUP + g
        q_offset = (i_b * T * HQ + i_h) * D
        p_lse0 = lse + (i_b * HQ + i_h) * T
        p_delta0 = delta + (i_b * HQ + i_h) * T
        if CAUSAL:
            b_dk, b_dv = _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q + q_offset, do + q_offset, p_lse0, p_delta0,
                                              HQ * D, o_n, o_d, lo, full, T, shift, qk_scale, BM, True)
        b_dk, b_dv = _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q + q_offset, do + q_offset, p_lse0, p_delta0,
                                          HQ * D, o_n, o_d, full, t_end, T, shift, qk_scale, BM, False)

    tl.store(dk + kv_offset, (b_dk * sm_scale).to(dk.dtype.element_ty), mask=m_n[:, None])
    tl.store(dv + kv_offset, b_dv.to(dv.dtype.element_ty), mask=m_n[:, None])


# ---------------------------------------------------------------- dQ
@triton.jit
def _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, stride_s, o_m, o_d,
                       lo, hi, S, shift, qk_scale, BN: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key blocks [lo, hi) for one query block: recompute P, accumulate dQ (unscaled)."""
    o_nb = tl.arange(0, BN)
    for i_n in range(lo, hi, BN):
        o_s = i_n + o_nb
        p_k = p_k0 + o_s[:, None] * stride_s + o_d[None, :]
        p_v = p_v0 + o_s[:, None] * stride_s + o_d[None, :]
        if MASKED:
            m_s = o_s < S
            b_k = tl.load(p_k, mask=m_s[:, None], other=0.0)
            b_v = tl.load(p_v, mask=m_s[:, None], other=0.0)
        else:
            b_k = tl.load(p_k)
            b_v = tl.load(p_v)
        b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale - b_lse[:, None]  # [BM, BN], log2 of P
        if MASKED:  # mask before exp2: a hidden future score may exceed lse by far
            keep = m_s[None, :]
            if CAUSAL:
                keep = keep & (o_s[None, :] <= o_m[:, None] + shift)
            b_s = tl.where(keep, b_s, float("-inf"))
        b_p = tl.math.exp2(b_s)
        b_dp = tl.dot(b_do, tl.trans(b_v))
        b_ds = b_p * (b_dp - b_delta[:, None])
        b_dq = tl.dot(b_ds.to(b_k.dtype), b_k, b_dq)
    return b_dq


@triton.jit(do_not_specialize=["T", "S", "HQ", "GROUP"])
def _attn_bwd_dq_kernel(q, k, v, o, do, dq, lse, delta, T, S, HQ, GROUP, qk_scale, sm_scale,
                        D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """q, o, do, dq: [B, T, HQ, D]; k, v: [B, S, HQ // GROUP, D]; all contiguous.
    Also writes delta (fp32 [B, HQ, T]) for the dK/dV kernel that runs next."""
    i_m = tl.program_id(0)
    if CAUSAL:
        i_m = tl.num_programs(0) - 1 - i_m
    i_bh = tl.program_id(1)
    i_b = (i_bh // HQ).to(tl.int64)
    i_h = i_bh % HQ
    HKV = HQ // GROUP
    i_hk = i_h // GROUP
    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, D)
    m_m = o_m < T
    q_offset = (i_b * T * HQ + i_h) * D + o_m[:, None] * (HQ * D) + o_d[None, :]
    b_q = tl.load(q + q_offset, mask=m_m[:, None], other=0.0)
    b_do = tl.load(do + q_offset, mask=m_m[:, None], other=0.0)
    b_o = tl.load(o + q_offset, mask=m_m[:, None], other=0.0)
    b_delta = tl.sum(b_do.to(tl.float32) * b_o.to(tl.float32), 1)  # D_i = rowsum(dO ∘ O)
    tl.store(delta + i_bh.to(tl.int64) * T + o_m, b_delta, mask=m_m)
    b_lse = tl.load(lse + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=0.0)
    b_dq = tl.zeros([BM, D], dtype=tl.float32)
    kv_base = (i_b * S * HKV + i_hk) * D
    p_k0 = k + kv_base
    p_v0 = v + kv_base
    full_end, hi = _key_ranges(i_m * BM, T, S, BM, BN, CAUSAL)
    shift = S - T
    b_dq = _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, HKV * D, o_m, o_d,
                              0, full_end, S, shift, qk_scale, BN, False, CAUSAL)
    b_dq = _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, HKV * D, o_m, o_d,
                              full_end, hi, S, shift, qk_scale, BN, True, CAUSAL)
    tl.store(dq + q_offset, (b_dq * sm_scale).to(dq.dtype.element_ty), mask=m_m[:, None])


def attention_bwd(do, q, k, v, o, lse, causal: bool, softmax_scale: float):
    """Launch the two backward kernels. do, q, o: [B, T, Hq, D]; k, v: [B, S, Hkv, D], q, k, v, o
    contiguous; lse: fp32 [B, Hq, T] (base 2) from `attention_fwd`. Returns (dq, dk, dv) in the
    input dtype; for GQA, dk and dv are already summed over the query heads of each group."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    do = do.contiguous()  # e.g. the gradient of out.sum() arrives as a stride-0 view
    delta = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    qk_scale = softmax_scale * LOG2E
    launch(_attn_bwd_dq_kernel, lambda BM, BN: (triton.cdiv(T, BM), B * HQ), dq_tiles(D),
           ("dq", q.device, q.dtype, D, causal),
           q, k, v, o, do, dq, lse, delta, T, S, HQ, HQ // HKV, qk_scale, softmax_scale, D=D, CAUSAL=causal)
    tiles = dkdv_tiles(D, B, S, HKV)
    launch(_attn_bwd_dkdv_kernel, lambda BM, BN: (triton.cdiv(S, BN), B * HKV), tiles,
           ("dkdv", q.device, q.dtype, D, causal, tiles[0]),
           q, k, v, do, dk, dv, lse, delta, T, S, HQ, HQ // HKV, qk_scale, softmax_scale, D=D, CAUSAL=causal)
    return dq, dk, dv
