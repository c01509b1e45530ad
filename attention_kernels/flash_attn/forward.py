"""FlashAttention-2 forward in Triton: tiling, online softmax in base 2, GQA without copying K/V.

One program computes one block of BM query rows of one (batch, query head). It walks over the
keys BN at a time, keeps a running max `b_m`, a running sum `b_l` and an fp32 accumulator
`b_acc` in registers, and never writes the T x S score matrix anywhere. It also stores the
row log-sum-exp (base 2, fp32 [B, Hq, T]) that the backward needs to recompute P.
Packed sequences (VARLEN) run through the same kernel: a program first finds its sequence and
block by a search over the offsets (`varlen_block`), then works as a dense one does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import LOG2E, cdiv, launch, on_machine
from ..tl_helpers import dot_visible

# Tile sizes per head dim: (BM, BN, num_warps, num_stages). Fixed, not autotuned: on the H200
# (bf16, D = 128, T = 1K..16K) autotuning over eight configs picked BM = 128, BN = 64, 8 warps
# at every length, with 4 pipeline stages without the causal mask and 3 with it. Smaller head
# dims need fewer warps; D = 256 needs a smaller query tile (registers and shared memory).
FWD_TILES = {32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 4), 256: (64, 64, 8, 2)}
FWD_FALLBACK = (64, 32, 4, 1)  # used only if a tile does not fit in shared memory (e.g. fp32, D = 256)
INTERPRET_TILES = (32, 16, 4, 1)  # the interpreter runs one program at a time: small tiles, few steps


def fwd_tiles(D: int, causal: bool):
    """The forward's (BM, BN, num_warps, num_stages) candidates for head dim D, best first."""
    bm, bn, warps, stages = FWD_TILES[D]
    if causal and D == 128:
        stages = 3  # what the autotuner picked with the mask
    return on_machine(gpu=[(bm, bn, warps, stages), FWD_FALLBACK], interpreter=[INTERPRET_TILES])


@triton.jit
def _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, stride_s, o_m, o_d, lo, hi, S, shift, qk_scale,
                    BN: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key blocks [lo, hi): one online-softmax update per block.
    MASKED=False is the fast path for blocks every row of the tile may fully
    see; MASKED=True handles the causal diagonal and the ragged last block
    (keys >= S): a hidden key's score is -inf before exp2, and its value (NaN
    and inf included) adds nothing to a row that cannot see it."""
    o_n = tl.arange(0, BN)
    for i_n in range(lo, hi, BN):
        o_s = i_n + o_n
        p_k = p_k0 + o_s[:, None] * stride_s + o_d[None, :]  # K and V share the layout
        p_v = p_v0 + o_s[:, None] * stride_s + o_d[None, :]
        if MASKED:
            m_s = o_s < S
            b_k = tl.load(p_k, mask=m_s[:, None], other=0.0)
        else:
            b_k = tl.load(p_k)
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN] raw scores, fp32
        if MASKED:
            keep = m_s[None, :]
            if CAUSAL:  # bottom-right aligned: query i sees key j iff j <= i + S - T
                keep = keep & (o_s[None, :] <= o_m[:, None] + shift)
            b_s = tl.where(keep, b_s * qk_scale, float("-inf"))
            b_mn = tl.maximum(b_m, tl.max(b_s, 1))
            b_mn0 = tl.where(b_mn == float("-inf"), 0.0, b_mn)  # rows that have seen no key yet
            b_p = tl.math.exp2(b_s - b_mn0[:, None])
            b_alpha = tl.math.exp2(b_m - b_mn0)
        else:
            b_mn = tl.maximum(b_m, tl.max(b_s, 1) * qk_scale)
            b_p = tl.math.exp2(b_s * qk_scale - b_mn[:, None])
            b_alpha = tl.math.exp2(b_m - b_mn)
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        if MASKED:
            b_v = tl.load(p_v, mask=m_s[:, None], other=0.0)  # keys >= S load as 0: finite
        else:
            b_v = tl.load(p_v)
        if MASKED and CAUSAL:
            # a NaN or inf in V at a key a row cannot see must not reach that
            # row (0 * NaN is NaN); "tf32" is what tl.dot uses by default for
            # fp32, and fp16/bf16 ignore it
            b_acc = dot_visible(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None], "tf32")
        else:
            b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None])
        b_m = b_mn
    return b_acc, b_m, b_l


@triton.jit
def _key_ranges(m0, T, S, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    """For query rows [m0, m0+BM): keys [0, full_end) are visible to every
    row (no mask needed); keys [full_end, hi) need the mask. Shared by the
    forward and the dQ kernel."""
    if CAUSAL:
        shift = S - T
        full_end = tl.minimum(tl.maximum(m0 + shift + 1, 0), S) // BN * BN
        hi = tl.maximum(tl.minimum(m0 + BM + shift, S), full_end)
    else:
        full_end = S // BN * BN
        hi = S
    return full_end, hi


@triton.jit
def varlen_block(cu_seqlens, n_seqs, i_blk, BLOCK: tl.constexpr):
    """Packed sequences: which sequence, and which of its blocks of BLOCK
    rows, program `i_blk` owns.

    Sequence n's blocks are numbered from a(n) = cu_seqlens[n] // BLOCK + n
    on: a(n + 1) - a(n) is at least cdiv(length, BLOCK), so every block has a
    number, and at most one number per sequence is spare. A launch of
    cu_seqlens[N] // BLOCK + N programs covers them all, and a binary search
    over the offsets, on the GPU, finds a program's sequence: no table,
    nothing read back to the host. Returns (n, the block's index in n); a
    spare block starts at or past n's length."""
    lo = n_seqs * 0  # the last n with a(n) <= i_blk lies in [lo, hi] (lo a runtime int, as the loop needs)
    hi = n_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(cu_seqlens + mid) // BLOCK + mid <= i_blk:
            lo = mid
        else:
            hi = mid - 1
    return lo, i_blk - (tl.load(cu_seqlens + lo) // BLOCK + lo)


@triton.jit
def sequence_rows(cu_seqlens, i_n):
    """Packed sequence i_n's first row (64-bit: it scales offsets into the whole batch) and its length."""
    bos = tl.load(cu_seqlens + i_n)
    return bos.to(tl.int64), tl.load(cu_seqlens + i_n + 1) - bos


@triton.jit
def varlen_query_block(cu_seqlens_q, cu_seqlens_k, n_seqs, i_blk, i_h, T, BM: tl.constexpr):
    """Packed sequences, for a program that owns BM query rows of query head i_h (`varlen_block`'s
    block i_blk; T: the packed query rows): (its block's index in its sequence, the sequence's first
    query row and length, first key row and length, and where its row 0 of head i_h sits in the
    log-sum-exp [HQ, T])."""
    i_n, i_m = varlen_block(cu_seqlens_q, n_seqs, i_blk, BM)
    q_row0, T_n = sequence_rows(cu_seqlens_q, i_n)
    k_row0, S_n = sequence_rows(cu_seqlens_k, i_n)
    return i_m, q_row0, T_n, k_row0, S_n, i_h.to(tl.int64) * T + q_row0


@triton.jit
def varlen_key_block(cu_seqlens_q, cu_seqlens_k, n_seqs, i_blk, BN: tl.constexpr):
    """Packed sequences, for a program that owns BN key rows (`varlen_block`'s block i_blk, numbered over
    the keys' offsets): (its block's index in its sequence, the sequence's first query row and length,
    first key row and length). The key-side twin of `varlen_query_block`, for the backward's dK/dV."""
    i_n, i_k = varlen_block(cu_seqlens_k, n_seqs, i_blk, BN)
    q_row0, T_n = sequence_rows(cu_seqlens_q, i_n)
    k_row0, S_n = sequence_rows(cu_seqlens_k, i_n)
    return i_k, q_row0, T_n, k_row0, S_n


@triton.jit(do_not_specialize=["T", "S", "HQ", "GROUP"])  # one compiled kernel for every length
def _attn_fwd_kernel(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, T, S, HQ, GROUP, qk_scale,
                     D: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr):
    """q, o: [B, T, HQ, D], k, v: [B, S, HQ // GROUP, D], all contiguous: the
    strides follow from the shape, so the launch passes twelve arguments
    instead of twenty-four; lse: [B, HQ, T]. VARLEN (packed sequences): q, o:
    [T, HQ, D] and k, v: [S, HQ // GROUP, D] hold N sequences one after
    another, cu_seqlens_q and cu_seqlens_k their int32 offsets [N + 1], lse
    is [HQ, T]; each program finds its sequence (`varlen_block`). Dense
    launches pass None for the offsets."""
    i_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks see the most keys: start them first
        i_m = tl.num_programs(0) - 1 - i_m
    i_bh = tl.program_id(1)
    i_h = i_bh % HQ
    HKV = HQ // GROUP
    i_hk = i_h // GROUP  # GQA: this query head reads KV head h // (Hq / Hkv), no copy of K/V
    if VARLEN:  # from here on T and S are this sequence's lengths
        n_seqs = tl.num_programs(0) - T // BM  # the launch: T // BM + N programs on this axis
        i_m, q_row0, T, k_row0, S, lse_row0 = varlen_query_block(cu_seqlens_q, cu_seqlens_k, n_seqs, i_m, i_h, T,
                                                                 BM)
        if i_m * BM >= T:  # a spare block
            return
    else:
        i_b = (i_bh // HQ).to(tl.int64)
        q_row0 = i_b * T
        k_row0 = i_b * S
        lse_row0 = i_bh.to(tl.int64) * T
    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, D)
    m_m = o_m < T

    q_offset = (q_row0 * HQ + i_h) * D + o_m[:, None] * (HQ * D) + o_d[None, :]  # O has Q's layout
    b_q = tl.load(q + q_offset, mask=m_m[:, None], other=0.0)
    kv_base = (k_row0 * HKV + i_hk) * D  # K and V share their layout
    p_k0 = k + kv_base
    p_v0 = v + kv_base

    b_m = tl.full([BM], float("-inf"), dtype=tl.float32)  # running max (base-2 units)
    b_l = tl.zeros([BM], dtype=tl.float32)  # running sum of exp2(s - m)
    b_acc = tl.zeros([BM, D], dtype=tl.float32)  # running, unnormalised output
    full_end, hi = _key_ranges(i_m * BM, T, S, BM, BN, CAUSAL)
    shift = S - T
    b_acc, b_m, b_l = _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, HKV * D, o_m, o_d,
                                      0, full_end, S, shift, qk_scale, BN, False, CAUSAL)
    b_acc, b_m, b_l = _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, HKV * D, o_m, o_d,
                                      full_end, hi, S, shift, qk_scale, BN, True, CAUSAL)

    empty = b_l == 0.0  # causal with T > S: a row that sees no key; its output is 0
    b_l1 = tl.where(empty, 1.0, b_l)
    b_o = b_acc / b_l1[:, None]
    b_lse = tl.where(empty, float("inf"), b_m + tl.math.log2(b_l1))  # +inf makes P = 0 in the backward
    tl.store(o + q_offset, b_o.to(o.dtype.element_ty), mask=m_m[:, None])
    tl.store(lse + lse_row0 + o_m, b_lse, mask=m_m)


def attention_fwd(q, k, v, causal: bool, softmax_scale: float, cu_seqlens_q=None, cu_seqlens_k=None):
    """Launch the forward (inputs validated and contiguous). Returns (o in
    q's shape and dtype, lse fp32 in base 2: lse = log2 sum_j exp2(s_ij *
    scale * log2 e)).
    Dense: q [B, T, Hq, D], k, v [B, S, Hkv, D]; lse [B, Hq, T].
    Packed: q [T, Hq, D], k, v [S, Hkv, D] hold N sequences, cu_seqlens_q and
    cu_seqlens_k (int32 [N + 1], contiguous, on q's device) their offsets;
    lse [Hq, T]."""
    varlen = cu_seqlens_q is not None
    if varlen:
        (T, HQ, D), (S, HKV) = q.shape, k.shape[:2]
        n_seqs = cu_seqlens_q.shape[0] - 1
        grid = lambda BM, BN: (T // BM + n_seqs, HQ)  # noqa: E731  (see varlen_block)
        lse = torch.empty((HQ, T), device=q.device, dtype=torch.float32)
    else:
        B, T, HQ, D = q.shape
        S, HKV = k.shape[1], k.shape[2]
        grid = lambda BM, BN: (cdiv(T, BM), B * HQ)  # noqa: E731
        lse = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    tiles = fwd_tiles(D, causal)
    launch(_attn_fwd_kernel, grid, tiles, ("fwd", q.device, q.dtype, D, causal, varlen),
           q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, T, S, HQ, HQ // HKV, softmax_scale * LOG2E,
           D=D, CAUSAL=causal, VARLEN=varlen)
    return o, lse


__all__ = ["attention_fwd", "fwd_tiles", "varlen_block", "sequence_rows", "varlen_query_block", "varlen_key_block"]
