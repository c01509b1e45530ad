"""FlashAttention-2 backward in Triton: recompute P from Q, K and the saved log-sum-exp.

One kernel, `_attn_bwd_kernel`, with two kinds of program:
- dK/dV programs: one per block of BN keys of one KV head and one part of its GQA group's query
  heads. Each keeps K, V, dK, dV in registers and walks the query blocks of its part's query heads,
  BM rows at a time. With the group in one part (MHA, or enough programs without splitting), the
  group's sum lands in dK/dV directly; split into P parts (`bwd_plan`), each program writes its
  partial sums to an fp32 workspace [.., S, Hkv, P, D] and one sum over P follows the launch:
  deterministic, without atomics. A group walked by one program alone would leave MQA with 1/Hq of
  MHA's programs, each doing Hq times the work.
- dQ programs: one per block of BN queries of one query head, walking the keys BM at a time,
  like the forward.
Both need delta_i = rowsum(dO_i ∘ O_i), the softmax correction term. The kernel is launched
twice (the dQ programs first, which compute delta for their rows and store it, then the dK/dV
programs, which read it) or once, with both kinds of program side by side and the dK/dV
programs computing delta themselves from O and dO: `interface.py` decides which.
With P = exp2(s * scale * log2e - lse), dP = dO Vᵀ, dS = P ∘ (dP - delta):
dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K.
Packed sequences (VARLEN) take the same programs: each first finds its sequence and block by a
search over the offsets (`forward.varlen_block`), then works inside that sequence alone.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import LOG2E, cdiv, launch, on_machine
from .forward import _key_ranges, varlen_key_block, varlen_query_block

# Tiles (BM, BN, num_warps, num_stages): a program owns BN keys (dK/dV) or BN queries (dQ) and steps
# over the other axis BM at a time. Fixed from what autotuning picked on the H200 (bf16, D = 128):
# with 1024 or more dK/dV programs (T >= 4K at B = 1, H = 32) 128 keys against 64 query rows with
# 8 warps, which also is the dQ tile that won there (128 queries against 64 keys); with fewer,
# twice as many programs of half the size. D = 256 needs half-size tiles (registers, shared memory).
BWD_TILES = (64, 128, 8, 3)
BWD_TILES_FEW = (32, 64, 4, 3)  # when BWD_TILES would give fewer than MIN_PROGRAMS dK/dV programs
BWD_TILES_D256 = (32, 64, 8, 2)
# The dK/dV program count from which the autotuner kept the large tile (above): about eight waves of
# programs on the 132 SMs of an H100 or H200, so the uneven causal work of the last wave costs little.
# The same count sets the GQA split (`bwd_plan`): a group is cut into no more parts than it takes to
# reach it, which keeps the fp32 workspace near MIN_PROGRAMS · BN · D · 8 bytes (128 MiB at D = 128;
# under twice that for groups of a power of two).
MIN_PROGRAMS = 1024
BWD_FALLBACK = (16, 32, 4, 1)  # used only if a tile does not fit in shared memory (e.g. fp32, D = 256)
INTERPRET_BWD_TILES = (16, 32, 4, 1)  # the interpreter runs one program at a time: small tiles


def group_parts(group: int, programs: int) -> int:
    """Into how many parts to split a GQA group of `group` query heads, when one part gives `programs`
    dK/dV programs: the fewest parts (a divisor of group) that reach MIN_PROGRAMS, else one head a part."""
    return next((p for p in range(1, group + 1) if group % p == 0 and programs * p >= MIN_PROGRAMS), group)


def bwd_plan(D: int, group: int, n_kv_blocks):
    """(parts, tiles) for the dK/dV programs (and the one launch): how many parts each GQA group of
    `group` query heads is split into (`group_parts`), and the (BM, BN, num_warps, num_stages)
    candidates, best first. n_kv_blocks(BN): key blocks times KV heads (times B), unsplit."""
    interpreter = group_parts(group, n_kv_blocks(INTERPRET_BWD_TILES[1])), [INTERPRET_BWD_TILES]
    if D == 256:
        best = BWD_TILES_D256
    else:  # the large tile if, split, it gives enough programs
        best = BWD_TILES if n_kv_blocks(BWD_TILES[1]) * group >= MIN_PROGRAMS else BWD_TILES_FEW
    gpu = group_parts(group, n_kv_blocks(best[1])), [best, BWD_FALLBACK]
    return on_machine(gpu=gpu, interpreter=interpreter)


def dq_tiles(D: int):
    """Candidates for the launch of dQ programs alone (BN queries per program, keys BM at a time)."""
    best = BWD_TILES_D256 if D == 256 else BWD_TILES
    return on_machine(gpu=[best, BWD_FALLBACK], interpreter=[INTERPRET_BWD_TILES])


@triton.jit
def _row_delta(b_do, b_o):
    """delta_i = rowsum(dO ∘ O) in fp32."""
    return tl.sum(b_do.to(tl.float32) * b_o.to(tl.float32), 1)


@triton.jit
def _finite_or_zero(b):
    """b with its NaN and inf entries replaced by 0. In the dQ kernel's masked path, dS @ K would
    otherwise carry a NaN in K at a hidden key into every row (0 * NaN is NaN); the rows that see
    that key lose nothing, since their score, and so their dS, is NaN already."""
    return tl.where(tl.abs(b.to(tl.float32)) < float("inf"), b, 0.0).to(b.dtype)


# ---------------------------------------------------------------- dK, dV
@triton.jit
def _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, p_q0, p_o0, p_do0, p_lse0, p_delta0, stride_t, o_n, o_d,
                         lo, hi, T, shift, qk_scale, BM: tl.constexpr, MASKED: tl.constexpr,
                         DELTA_FROM_O: tl.constexpr):
    """Visit query blocks [lo, hi) for one key block: recompute Pᵀ,
    accumulate dV and dK. delta comes from O and dO (DELTA_FROM_O; p_delta0
    is then None) or from p_delta0. MASKED (the causal diagonal): a pair the
    mask hides has P = 0 and dS = 0, so a NaN or inf in dO at a row that
    cannot see a key stays out of that key's dK, and one in Q out of its dV.
    (Not the other way round: dV = Pᵀ dO and dK = dSᵀ Q still meet 0 * NaN;
    `dot_visible` there made the causal backward slower on the H200:
    book/what_did_not_work.md.)"""
    o_mb = tl.arange(0, BM)
    for i_m in range(lo, hi, BM):
        o_m = i_m + o_mb
        m_m = o_m < T  # rows past T load as zeros: they add nothing to dK, dV
        p_row = o_m[:, None] * stride_t + o_d[None, :]  # Q, O and dO share the layout
        b_q = tl.load(p_q0 + p_row, mask=m_m[:, None], other=0.0)
        b_lse = tl.load(p_lse0 + o_m, mask=m_m, other=0.0)
        b_sT = tl.dot(b_k, tl.trans(b_q)) * qk_scale - b_lse[None, :]  # [BN, BM], log2 of Pᵀ
        if MASKED:  # causal diagonal: key j reaches query i iff j <= i + S - T; mask before exp2
            keep = o_n[:, None] <= o_m[None, :] + shift
            b_sT = tl.where(keep, b_sT, float("-inf"))
        b_pT = tl.math.exp2(b_sT)
        b_do = tl.load(p_do0 + p_row, mask=m_m[:, None], other=0.0)
        b_dv = tl.dot(b_pT.to(b_do.dtype), b_do, b_dv)
        if DELTA_FROM_O:
            b_delta = _row_delta(b_do, tl.load(p_o0 + p_row, mask=m_m[:, None], other=0.0))
        else:
            b_delta = tl.load(p_delta0 + o_m, mask=m_m, other=0.0)
        b_dpT = tl.dot(b_v, tl.trans(b_do))  # [BN, BM] = (dO Vᵀ)ᵀ
        b_dsT = b_pT * (b_dpT - b_delta[None, :])
        if MASKED:  # 0 * NaN is NaN: a hidden pair's dS is 0 whatever V, dO or delta hold there
            b_dk = tl.dot(tl.where(keep, b_dsT, 0.0).to(b_q.dtype), b_q, b_dk)
        else:
            b_dk = tl.dot(b_dsT.to(b_q.dtype), b_q, b_dk)
    return b_dk, b_dv


@triton.jit
def _attn_bwd_dkdv(q, k, v, o, do, dk, dv, lse, delta, cu_seqlens_q, cu_seqlens_k, i_n, i_bh, B, T, S, HQ, GROUP,
                   PARTS, qk_scale, sm_scale, D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, DELTA_FROM_O: tl.constexpr, VARLEN: tl.constexpr, PARTIAL: tl.constexpr):
    """dK, dV for keys [i_n*BN, i_n*BN + BN) of KV head i_bh % HKV in batch
    i_bh // HKV; VARLEN: for key block i_n of the packed numbering
    (`varlen_block`) of KV head i_bh. PARTIAL: i_bh also numbers the PARTS
    parts of the group (fastest), and dk, dv are the fp32 workspace [.., S,
    HKV, PARTS, D] that takes this part's sums."""
    HKV = HQ // GROUP
    if PARTIAL:  # this program walks GROUP // PARTS of the group's query heads
        i_part = i_bh % PARTS
        i_bh = i_bh // PARTS
        g_lo = i_part * (GROUP // PARTS)
        g_hi = g_lo + GROUP // PARTS
    else:
        g_lo = 0
        g_hi = GROUP
    i_hk = i_bh % HKV
    if VARLEN:  # from here on T and S are this sequence's lengths
        T_packed = T  # lse and delta: [HQ, T_packed]
        i_n, q_row0, T, k_row0, S = varlen_key_block(cu_seqlens_q, cu_seqlens_k, B, i_n, BN)
        if i_n * BN >= S:  # a spare block
            return
    else:
        i_b = (i_bh // HKV).to(tl.int64)
        q_row0 = i_b * T
        k_row0 = i_b * S
    n0 = i_n * BN
    o_n = n0 + tl.arange(0, BN)
    o_d = tl.arange(0, D)
    m_n = o_n < S
    kv_offset = (k_row0 * HKV + i_hk) * D + o_n[:, None] * (HKV * D) + o_d[None, :]
    b_k = tl.load(k + kv_offset, mask=m_n[:, None], other=0.0)
    b_v = tl.load(v + kv_offset, mask=m_n[:, None], other=0.0)
    b_dk = tl.zeros([BN, D], dtype=tl.float32)
    b_dv = tl.zeros([BN, D], dtype=tl.float32)

    shift = S - T
    t_end = tl.cdiv(T, BM) * BM
    if CAUSAL:
        # rows below `lo` see none of these keys; rows from `full` on see all
        # of them
        lo = tl.maximum(n0 - shift, 0) // BM * BM
        full = tl.minimum(tl.cdiv(tl.maximum(n0 + BN - 1 - shift, 0), BM) * BM, t_end)
    else:
        lo = 0
        full = 0
    for g in range(g_lo, g_hi):  # query heads of this KV head's group (of this part): their sum, no atomics
        i_h = i_hk * GROUP + g
        q_offset = (q_row0 * HQ + i_h) * D
        if VARLEN:
            row0 = i_h.to(tl.int64) * T_packed + q_row0
        else:
            row0 = (i_b * HQ + i_h) * T  # lse and delta: [B, HQ, T]
        if DELTA_FROM_O:
            p_delta0 = delta  # None: not read
        else:
            p_delta0 = delta + row0
        if CAUSAL:
            b_dk, b_dv = _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q + q_offset, o + q_offset, do + q_offset,
                                              lse + row0, p_delta0, HQ * D, o_n, o_d, lo, full, T, shift,
                                              qk_scale, BM, True, DELTA_FROM_O)
        b_dk, b_dv = _attn_bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q + q_offset, o + q_offset, do + q_offset,
                                          lse + row0, p_delta0, HQ * D, o_n, o_d, full, t_end, T, shift,
                                          qk_scale, BM, False, DELTA_FROM_O)

    if PARTIAL:  # this part's row of the workspace: head i_hk * PARTS + i_part of HKV * PARTS
        out_offset = ((k_row0 * HKV + i_hk) * PARTS + i_part) * D + o_n[:, None] * (HKV * PARTS * D) + o_d[None, :]
    else:
        out_offset = kv_offset
    tl.store(dk + out_offset, (b_dk * sm_scale).to(dk.dtype.element_ty), mask=m_n[:, None])
    tl.store(dv + out_offset, b_dv.to(dv.dtype.element_ty), mask=m_n[:, None])


# ---------------------------------------------------------------- dQ
@triton.jit
def _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, stride_s, o_m, o_d,
                       lo, hi, S, shift, qk_scale, BK: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key blocks [lo, hi), BK keys at a time, for one query block:
    recompute P, accumulate dQ (unscaled). MASKED (the causal diagonal, keys
    >= S): a pair the mask hides adds nothing, even where K or V hold NaN or
    inf."""
    o_kb = tl.arange(0, BK)
    for i_n in range(lo, hi, BK):
        o_s = i_n + o_kb
        p_k = p_k0 + o_s[:, None] * stride_s + o_d[None, :]
        p_v = p_v0 + o_s[:, None] * stride_s + o_d[None, :]
        if MASKED:
            m_s = o_s < S
            b_k = tl.load(p_k, mask=m_s[:, None], other=0.0)
            b_v = tl.load(p_v, mask=m_s[:, None], other=0.0)
        else:
            b_k = tl.load(p_k)
            b_v = tl.load(p_v)
        b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale - b_lse[:, None]  # [BQ, BK], log2 of P
        if MASKED:  # mask before exp2: a hidden future score may exceed lse by far
            keep = m_s[None, :]
            if CAUSAL:
                keep = keep & (o_s[None, :] <= o_m[:, None] + shift)
            b_s = tl.where(keep, b_s, float("-inf"))
        b_p = tl.math.exp2(b_s)
        b_dp = tl.dot(b_do, tl.trans(b_v))
        b_ds = b_p * (b_dp - b_delta[:, None])
        if MASKED:  # 0 * NaN is NaN: a hidden pair's dS is 0 whatever V holds there, and so is a NaN in K
            b_dq = tl.dot(tl.where(keep, b_ds, 0.0).to(b_k.dtype), _finite_or_zero(b_k), b_dq)
        else:
            b_dq = tl.dot(b_ds.to(b_k.dtype), b_k, b_dq)
    return b_dq


@triton.jit
def _attn_bwd_dq(q, k, v, o, do, dq, lse, delta, cu_seqlens_q, cu_seqlens_k, i_m, i_bh, n_qblocks, B, T, S, HQ,
                 GROUP, qk_scale, sm_scale, D: tl.constexpr, CAUSAL: tl.constexpr, BQ: tl.constexpr,
                 BK: tl.constexpr, STORE_DELTA: tl.constexpr, VARLEN: tl.constexpr):
    """dQ for the i_m-th of n_qblocks blocks of BQ queries (from the last
    when causal: those see the most keys, so they start first) of query head
    i_bh % HQ in batch i_bh // HQ, BK keys a step;
    VARLEN: of the packed numbering (`varlen_block`), of query head i_bh.
    STORE_DELTA: store delta (else delta may be None)."""
    if CAUSAL:
        i_m = n_qblocks - 1 - i_m
    i_h = i_bh % HQ
    HKV = HQ // GROUP
    i_hk = i_h // GROUP
    if VARLEN:  # from here on T and S are this sequence's lengths
        i_m, q_row0, T, k_row0, S, lse_row0 = varlen_query_block(cu_seqlens_q, cu_seqlens_k, B, i_m, i_h, T, BQ)
        if i_m * BQ >= T:  # a spare block
            return
    else:
        i_b = (i_bh // HQ).to(tl.int64)
        q_row0 = i_b * T
        k_row0 = i_b * S
        lse_row0 = i_bh.to(tl.int64) * T  # lse and delta: [B, HQ, T]
    o_m = i_m * BQ + tl.arange(0, BQ)
    o_d = tl.arange(0, D)
    m_m = o_m < T
    q_offset = (q_row0 * HQ + i_h) * D + o_m[:, None] * (HQ * D) + o_d[None, :]
    b_q = tl.load(q + q_offset, mask=m_m[:, None], other=0.0)
    b_do = tl.load(do + q_offset, mask=m_m[:, None], other=0.0)
    b_delta = _row_delta(b_do, tl.load(o + q_offset, mask=m_m[:, None], other=0.0))
    if STORE_DELTA:  # for the dK/dV programs of the next launch
        tl.store(delta + lse_row0 + o_m, b_delta, mask=m_m)
    b_lse = tl.load(lse + lse_row0 + o_m, mask=m_m, other=0.0)
    b_dq = tl.zeros([BQ, D], dtype=tl.float32)
    kv_base = (k_row0 * HKV + i_hk) * D
    p_k0 = k + kv_base
    p_v0 = v + kv_base
    full_end, hi = _key_ranges(i_m * BQ, T, S, BQ, BK, CAUSAL)
    shift = S - T
    b_dq = _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, HKV * D, o_m, o_d,
                              0, full_end, S, shift, qk_scale, BK, False, CAUSAL)
    b_dq = _attn_bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, p_k0, p_v0, HKV * D, o_m, o_d,
                              full_end, hi, S, shift, qk_scale, BK, True, CAUSAL)
    tl.store(dq + q_offset, (b_dq * sm_scale).to(dq.dtype.element_ty), mask=m_m[:, None])


# ---------------------------------------------------------------- the kernel
@triton.jit(do_not_specialize=["B", "T", "S", "HQ", "GROUP", "PARTS"])
def _attn_bwd_kernel(q, k, v, o, do, dq, dk, dv, lse, delta, cu_seqlens_q, cu_seqlens_k, B, T, S, HQ, GROUP,
                     PARTS, qk_scale, sm_scale, D: tl.constexpr, CAUSAL: tl.constexpr, DQ: tl.constexpr,
                     DKDV: tl.constexpr, VARLEN: tl.constexpr, PARTIAL: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr):
    """q, o, do, dq: [B, T, HQ, D]; k, v, dk, dv: [B, S, HQ // GROUP, D]; all
    contiguous;
    lse, delta: fp32 [B, HQ, T]. DQ and DKDV say which programs this launch
    runs: DQ alone stores delta, DKDV alone reads it, both (one launch)
    compute it where needed (delta is then None).
    PARTIAL: each group of GROUP query heads is split into PARTS parts, a
    dK/dV program per part, and dk, dv are fp32 workspaces [B, S, HQ //
    GROUP, PARTS, D] of the parts' sums. VARLEN (packed sequences): q, o, do,
    dq: [T, HQ, D] and k, v, dk, dv: [S, HQ // GROUP, D] hold B sequences one
    after another, cu_seqlens_q and cu_seqlens_k their int32 offsets [B + 1];
    lse, delta: [HQ, T]. Dense launches pass None for the offsets."""
    pid = tl.program_id(0)
    HKV = HQ // GROUP
    if VARLEN:  # blocks in the packed numbering (`varlen_block`), heads without a batch axis
        n_qblocks = T // BN + B
        n_kblocks = S // BN + B
        n_qheads = HQ
        n_kvheads = HKV
    else:
        n_qblocks = tl.cdiv(T, BN)
        n_kblocks = tl.cdiv(S, BN)
        n_qheads = B * HQ
        n_kvheads = B * HKV
    if PARTIAL:  # a dK/dV program per part of each group
        n_kvheads *= PARTS
    if DQ and DKDV:
        # One launch, a small problem: dQ programs first, and the head varies
        # fastest, so every head's heaviest blocks start in the first wave
        # (faster at causal 1K on the H200: the chapter, section 4).
        n_dq = n_qblocks * n_qheads
        if pid < n_dq:
            _attn_bwd_dq(q, k, v, o, do, dq, lse, delta, cu_seqlens_q, cu_seqlens_k, pid // n_qheads, pid % n_qheads,
                         n_qblocks, B, T, S, HQ, GROUP, qk_scale, sm_scale, D, CAUSAL,
                         BQ=BN, BK=BM, STORE_DELTA=False, VARLEN=VARLEN)
        else:
            pid -= n_dq
            _attn_bwd_dkdv(q, k, v, o, do, dk, dv, lse, delta, cu_seqlens_q, cu_seqlens_k, pid // n_kvheads,
                           pid % n_kvheads, B, T, S, HQ, GROUP, PARTS, qk_scale, sm_scale, D, CAUSAL, BM, BN, True,
                           VARLEN, PARTIAL)
    elif DQ:
        # Long sequences: the block varies fastest, so the programs running
        # together share one head's K and V (or Q and dO) through L2.
        _attn_bwd_dq(q, k, v, o, do, dq, lse, delta, cu_seqlens_q, cu_seqlens_k, pid % n_qblocks, pid // n_qblocks,
                     n_qblocks, B, T, S, HQ, GROUP, qk_scale, sm_scale, D, CAUSAL,
                     BQ=BN, BK=BM, STORE_DELTA=True, VARLEN=VARLEN)
    else:
        _attn_bwd_dkdv(q, k, v, o, do, dk, dv, lse, delta, cu_seqlens_q, cu_seqlens_k, pid % n_kblocks,
                       pid // n_kblocks, B, T, S, HQ, GROUP, PARTS, qk_scale, sm_scale, D, CAUSAL, BM, BN, False,
                       VARLEN, PARTIAL)


def attention_bwd(do, q, k, v, o, lse, causal: bool, softmax_scale: float, one_launch: bool,
                  cu_seqlens_q=None, cu_seqlens_k=None):
    """Launch the backward. Dense: do, q, o: [B, T, Hq, D]; k, v: [B, S, Hkv,
    D]; lse: fp32 [B, Hq, T] (base 2) from `attention_fwd`. Packed: do, q, o:
    [T, Hq, D]; k, v: [S, Hkv, D] hold N sequences, cu_seqlens_q and
    cu_seqlens_k (int32 [N + 1]) their offsets; lse: [Hq, T]. q, k, v, o
    contiguous.
    one_launch: both kinds of program in one launch, or the dQ launch and
    then the dK/dV launch. Returns (dq, dk, dv) in the input dtype; for GQA,
    dk and dv are summed over the query heads of each group (in the kernel,
    or, where the group is split over programs (`bwd_plan`), by a sum over
    the parts' fp32 workspace after it)."""
    varlen = cu_seqlens_q is not None
    if varlen:  # the kernel reads B as the number of sequences and numbers their blocks (`varlen_block`)
        (T, HQ, D), (S, HKV) = q.shape, k.shape[:2]
        B = cu_seqlens_q.shape[0] - 1
        n_kv_blocks = lambda BN: (S // BN + B) * HKV  # noqa: E731
        n_dq = lambda BN: (T // BN + B) * HQ  # noqa: E731
    else:
        B, T, HQ, D = q.shape
        S, HKV = k.shape[1], k.shape[2]
        n_kv_blocks = lambda BN: cdiv(S, BN) * B * HKV  # noqa: E731
        n_dq = lambda BN: cdiv(T, BN) * B * HQ  # noqa: E731
    parts, tiles = bwd_plan(D, HQ // HKV, n_kv_blocks)
    partial = parts > 1
    do = do.contiguous()  # e.g. the gradient of out.sum() arrives as a stride-0 view
    dq = torch.empty_like(q)
    if partial:  # [.., S, HKV, parts, D]: each part's sums, added up below
        dk_parts, dv_parts = (torch.empty((*k.shape[:-1], parts, D), device=q.device, dtype=torch.float32)
                              for _ in "kv")
    else:
        dk_parts, dv_parts = torch.empty_like(k), torch.empty_like(v)
    args = (q, k, v, o, do, dq, dk_parts, dv_parts, lse)
    rest = (cu_seqlens_q, cu_seqlens_k, B, T, S, HQ, HQ // HKV, parts, softmax_scale * LOG2E, softmax_scale)
    flags = dict(D=D, CAUSAL=causal, VARLEN=varlen, PARTIAL=partial)
    n_dkdv = lambda BN: n_kv_blocks(BN) * parts  # noqa: E731
    if one_launch:  # the dK/dV programs compute delta from O: no delta buffer (None)
        launch(_attn_bwd_kernel, lambda BM, BN: (n_dkdv(BN) + n_dq(BN),), tiles,
               ("bwd", q.device, q.dtype, D, causal, varlen, partial, tiles[0]),
               *args, None, *rest, DQ=True, DKDV=True, **flags)
    else:
        delta = torch.empty(lse.shape, device=q.device, dtype=torch.float32)
        launch(_attn_bwd_kernel, lambda BM, BN: (n_dq(BN),), dq_tiles(D),
               ("bwd dq", q.device, q.dtype, D, causal, varlen), *args, delta, *rest, DQ=True, DKDV=False,
               **{**flags, "PARTIAL": False})
        launch(_attn_bwd_kernel, lambda BM, BN: (n_dkdv(BN),), tiles,
               ("bwd dkdv", q.device, q.dtype, D, causal, varlen, partial, tiles[0]), *args, delta, *rest,
               DQ=False, DKDV=True, **flags)
    if not partial:
        return dq, dk_parts, dv_parts
    return dq, dk_parts.sum(-2).to(k.dtype), dv_parts.sum(-2).to(v.dtype)


def dq_and_delta(do, q, k, v, o, lse, causal: bool, softmax_scale: float):
    """The dQ programs alone on dense inputs (do, q, o [B, T, Hq, D], k, v [B, S, Hkv, D], all contiguous;
    lse fp32 [B, Hq, T], base 2), for a dK/dV pass launched elsewhere (the Gluon one, `gluon_backward.py`).
    Returns (dq in q's dtype, delta fp32 [B, Hq, T] = rowsum(dO ∘ O))."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    delta = torch.empty(lse.shape, device=q.device, dtype=torch.float32)
    # dk and dv None: with DKDV off the kernel never traces the dK/dV programs that would write them (as the one
    # launch passes None for delta, which its dK/dV programs compute)
    launch(_attn_bwd_kernel, lambda BM, BN: (cdiv(T, BN) * B * HQ,), dq_tiles(D),
           ("bwd dq alone", q.device, q.dtype, D, causal), q, k, v, o, do, dq, None, None, lse, delta, None, None,
           B, T, S, HQ, HQ // HKV, 1, softmax_scale * LOG2E, softmax_scale, D=D, CAUSAL=causal, DQ=True, DKDV=False,
           VARLEN=False, PARTIAL=False)
    return dq, delta
