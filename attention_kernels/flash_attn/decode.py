"""Decoding against a KV cache in Triton: split-KV ("flash-decoding") with the GQA group packed.

The forward (`forward.py`) gives each (batch, query head) one program that walks the keys with a tile of
query rows. A decode step has one query row per head: the forward's 128-row tile then holds one row, the
B·Hq programs each read their KV head's whole cache, so every K/V tile is read once per query head of the
group, and at B = 1 the 32 programs of a layer leave most of a GPU's SMs idle.

Here one program owns a (batch, KV head) pair and one slice of the cache:
- its rows are the query heads that share the KV head (the GQA group), times the query tokens, padded to
  16 for `tl.dot`: each K/V tile is read once for the whole group;
- the cache is cut into `num_splits` slices when B·Hkv programs would not fill the GPU; each slice writes
  its partial output and log-sum-exp, and MLA's merge kernel (`attention_kernels.mla.decode.launch_combine`, the same
  layout: rows in the output's order, base-2 partial LSEs) weighs them by their LSEs.
With several query tokens (a speculative step, a short chunk) and causal=True, query i of S_q sees the
keys j <= i + S - S_q (bottom-right aligned): the tiles cover the keys every row sees, and the last
S_q - 1 keys follow with the causal mask.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import LN2, LOG2E, cdiv, launch, on_machine, pow2_at_least_16, sm_count
from ..mla.decode import launch_combine
from ..mla.planning import PLAN_SM_COUNT, workspace
from ..mla.planning import num_splits as split_cost_model
from ..tl_helpers import dot_visible, log2_sum_exp2

_LN2 = tl.constexpr(LN2)  # a kernel reads a module-level number only as a constexpr

# (BN, num_warps, num_stages): a decode step is bound by reading K and V, and a program's rows are few
# (one group, 16 after padding), so 4 warps and three tiles of 64 keys in flight. Not yet tuned on a GPU.
DECODE_TILES = [(64, 4, 3), (32, 4, 2)]
INTERPRET_TILES = [(16, 4, 1)]  # the interpreter runs one program at a time: small tiles
MOST_ROWS = 64  # rows (query tokens x group heads) per program; more rows take more programs


@triton.jit
def _decode_tiles(b_acc, b_m, b_l, b_q, p_k, p_v, stride_kt, stride_vt, o_d, o_tok, lo, hi, shift, qk_scale,
                  BN: tl.constexpr, CAUSAL_TAIL: tl.constexpr):
    """Keys [lo, hi) of one cache slice, a tile of BN at a time: one
    online-softmax update per tile for all the program's rows. CAUSAL_TAIL:
    the keys only the later query tokens see (row token t sees key j iff j <=
    t + shift); a NaN or inf in V at a key a row cannot see does not reach
    that row."""
    o_t = tl.arange(0, BN)
    for n0 in range(lo, hi, BN):
        o_n = n0 + o_t
        m_n = o_n < hi  # never read past the slice: the cache holds anything there
        b_k = tl.load(p_k + o_n[:, None] * stride_kt + o_d[None, :], mask=m_n[:, None], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN] raw scores, fp32
        keep = m_n[None, :]
        if CAUSAL_TAIL:
            keep = keep & (o_n[None, :] <= o_tok[:, None] + shift)
        b_s = tl.where(keep, b_s * qk_scale, float("-inf"))
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_mn0 = tl.where(b_mn == float("-inf"), 0.0, b_mn)  # rows that have seen no key yet
        b_p = tl.math.exp2(b_s - b_mn0[:, None])
        b_alpha = tl.math.exp2(b_m - b_mn0)
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_v = tl.load(p_v + o_n[:, None] * stride_vt + o_d[None, :], mask=m_n[:, None], other=0.0)
        if CAUSAL_TAIL:
            b_acc = dot_visible(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None], "tf32")
        else:
            b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None])
        b_m = b_mn
    return b_acc, b_m, b_l


@triton.jit(do_not_specialize=["HKV", "num_splits"])  # one compiled kernel for every head count and split
def _decode_split_kernel(q, k_cache, v_cache, seqlens, o, lse, ws_o, ws_lse, HKV, num_splits, qk_scale,
                         stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                         S_Q: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                         SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Program (b * HKV + kv head, slice, row block). q, o: [B, S_Q, HKV *
    GROUP, D] contiguous; the caches [B, T_cache, HKV, D] with unit-stride
    rows (their other strides given); seqlens int32 [B], the keys each
    sequence attends to. Row r of a program is query token r // GROUP of
    query head kv head * GROUP + r % GROUP.
    SPLIT: write the slice's output and base-2 LSE to ws_o [rows, num_splits,
    D], ws_lse [rows, num_splits] (rows in o's order) for the merge; else o
    and lse [B, HQ, S_Q] (natural log) directly."""
    i_bh, i_s, i_rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b = i_bh // HKV
    i_hk = i_bh % HKV
    HQ = HKV * GROUP
    ROWS: tl.constexpr = S_Q * GROUP
    o_r = i_rb * BM + tl.arange(0, BM)
    m_r = o_r < ROWS
    o_tok = o_r // GROUP
    o_h = i_hk * GROUP + o_r % GROUP
    o_d = tl.arange(0, D)
    o_row = (i_b.to(tl.int64) * S_Q + o_tok) * HQ + o_h  # the row's place in o (and in the workspace)
    b_q = tl.load(q + o_row[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.0)

    # This program's slice of the sequence: [start, end), a multiple of BN
    # long.
    S = tl.load(seqlens + i_b)
    split_len = tl.cdiv(tl.cdiv(S, num_splits), BN) * BN
    start = i_s * split_len
    end = tl.minimum(start + split_len, S)
    shift = S - S_Q  # causal: token t sees keys j <= t + shift; every token sees those below shift + 1
    shared_end = end
    if CAUSAL:
        shared_end = tl.minimum(tl.maximum(shift + 1, start), end)
    p_k = k_cache + i_b.to(tl.int64) * stride_kb + i_hk * stride_kh
    p_v = v_cache + i_b.to(tl.int64) * stride_vb + i_hk * stride_vh

    b_m = tl.full([BM], float("-inf"), dtype=tl.float32)  # running max (base-2 units)
    b_l = tl.zeros([BM], dtype=tl.float32)  # running sum of exp2(s - m)
    b_acc = tl.zeros([BM, D], dtype=tl.float32)  # running, unnormalised output
    b_acc, b_m, b_l = _decode_tiles(b_acc, b_m, b_l, b_q, p_k, p_v, stride_kt, stride_vt, o_d, o_tok,
                                    start, shared_end, shift, qk_scale, BN, False)
    if CAUSAL:
        b_acc, b_m, b_l = _decode_tiles(b_acc, b_m, b_l, b_q, p_k, p_v, stride_kt, stride_vt, o_d, o_tok,
                                        shared_end, end, shift, qk_scale, BN, True)

    b_lse = log2_sum_exp2(b_m, b_l)  # -inf for a row that saw no key (an empty slice)
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]  # 0 there
    if SPLIT:  # this slice's partial, merged by the combine kernel
        p_w = ws_o + (o_row * num_splits + i_s)[:, None] * D + o_d[None, :]
        tl.store(p_w, b_o, mask=m_r[:, None])
        tl.store(ws_lse + o_row * num_splits + i_s, b_lse, mask=m_r)
    else:
        tl.store(o + o_row[:, None] * D + o_d[None, :], b_o.to(o.dtype.element_ty), mask=m_r[:, None])
        tl.store(lse + (i_b * HQ + o_h) * S_Q + o_tok, b_lse * _LN2, mask=m_r)


def decode_splits(B: int, HKV: int, S_Q: int, group: int, max_len: int, device) -> int:
    """How many slices to cut each sequence into: MLA's cost model (`attention_kernels.mla.planning.num_splits`:
    waves of programs over the SMs, a fixed cost per program, the merge's launch and partials) with one
    program per (batch, KV head, block of rows). The SM count is the GPU's; off the GPU, an H200's.

    >>> decode_splits(1, 8, 1, 4, 65536, q.device)     # one sequence, 8 KV heads: 16 slices
    >>> decode_splits(64, 8, 1, 4, 4096, q.device)     # 512 programs fill the GPU: 1
    """
    n_sm = sm_count(device) if device.type == "cuda" else PLAN_SM_COUNT
    return split_cost_model(B, HKV * cdiv(S_Q * group, MOST_ROWS), max_len, n_sm)


def decode_fwd(q, k_cache, v_cache, seqlens, causal: bool, softmax_scale: float, num_splits: int):
    """Launch the decode kernel (and the merge, num_splits > 1) on checked inputs: q [B, S_q, Hq, D]
    contiguous, k_cache and v_cache [B, T_cache, Hkv, D] with unit-stride rows, seqlens int32 [B] (the keys
    each sequence attends to, <= T_cache). Returns (o [B, S_q, Hq, D] in q's dtype, lse fp32 [B, Hq, S_q],
    natural log, -inf on a row that sees no key)."""
    B, S_Q, HQ, D = q.shape
    HKV = k_cache.shape[2]
    group = HQ // HKV
    rows = S_Q * group
    bm = min(pow2_at_least_16(rows), MOST_ROWS)
    o = q.new_empty(q.shape)
    lse = q.new_empty((B, HQ, S_Q), dtype=torch.float32)
    split = num_splits > 1
    ws_o, ws_lse = workspace(B, S_Q * HQ, num_splits, D, q.device) if split else (lse, lse)
    strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    # the caches' strides are specialised (16-divisible or not): the key names which, so a cache
    # of another layout compiles its own variant instead of launching one compiled for this
    key = ("decode", q.device, q.dtype, D, S_Q, group, causal, split, tuple(s % 16 == 0 for s in strides))
    tiles = [(bm, *tile) for tile in on_machine(gpu=DECODE_TILES, interpreter=INTERPRET_TILES)]
    launch(_decode_split_kernel, lambda BM, BN: (B * HKV, num_splits, cdiv(rows, BM)), tiles, key,
           q, k_cache, v_cache, seqlens, o, lse, ws_o, ws_lse, HKV, num_splits, softmax_scale * LOG2E, *strides,
           S_Q=S_Q, GROUP=group, D=D, CAUSAL=causal and S_Q > 1, SPLIT=split)
    if split:
        launch_combine(ws_o, ws_lse, o, lse, num_splits)
    return o, lse


__all__ = ["decode_fwd", "decode_splits", "DECODE_TILES", "MOST_ROWS"]
