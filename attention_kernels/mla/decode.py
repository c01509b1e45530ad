"""MLA decode in Triton: MQA over a shared latent cache (576-dim keys, 512-dim values).

One program owns a block of BH query rows (rows = (query, head) pairs of one batch
element) and one slice of the cache. It walks its slice in tiles of BN positions,
loading each tile once for all BH rows, and keeps an online softmax in fp32.
With more than one slice per sequence (split-KV, "flash-decoding") every slice
writes a partial output and its log-sum-exp, and a second small kernel merges them.
A contiguous cache is read through TMA tensor descriptors (Hopper's copy engine);
a paged cache through a block table and ordinary pointer loads. With causal=True the tiles cover
the positions every query sees, and the last s_q - 1 positions (seen by the later queries only)
follow one at a time, so the tile loop needs no causal mask.
The kernels and their launches only: `interface.py` checks the inputs, `planning.py` chooses the kernel and the split.
"""
from __future__ import annotations

import contextlib

import triton
import triton.language as tl

from ..launch import (LN2, LOG2E, autotune_configs, cdiv, launch_direct, next_power_of_2, pow2_at_least_16,
                      tma_scratch)
from ..tl_helpers import log2_sum_exp2

_LN2 = tl.constexpr(LN2)  # a kernel reads a module-level number only as a constexpr


@triton.jit
def _cache_row(kv, block_table, i_b, t, stride_kb, stride_kt, stride_bt, PAGE: tl.constexpr, PAGED: tl.constexpr):
    """Where position t of sequence i_b starts in the cache."""
    if PAGED:
        i_page = tl.load(block_table + i_b * stride_bt + t // PAGE)
        return kv + i_page.to(tl.int64) * stride_kb + (t % PAGE) * stride_kt
    return kv + i_b.to(tl.int64) * stride_kb + t * stride_kt


@triton.jit
def _mla_decode_kernel(
    q, kv, block_table, seqlens, o, lse, ws_o, ws_lse,
    scale_log2,                       # softmax_scale * log2(e): scores go straight into exp2
    stride_kb, stride_kt, stride_bt,  # cache: per batch element (or per page), per token; block table row
    num_splits,
    S_Q: tl.constexpr, H: tl.constexpr, D_QK: tl.constexpr, D_V: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
    BH: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, BP: tl.constexpr, BX: tl.constexpr,
):
    ROWS: tl.constexpr = S_Q * H       # (query, head) pairs share every cache tile
    D_PE: tl.constexpr = D_QK - D_V    # the RoPE part of the key (64 for DeepSeek)
    # Head blocks vary fastest, so the programs reading the same cache slice
    # run side by side and the second read comes from L2.
    i_hb, i_s, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)

    # This program's slice of the sequence: [start, end), a multiple of BN
    # long.
    seqlen = tl.load(seqlens + i_b)
    split_len = tl.cdiv(tl.cdiv(seqlen, num_splits), BN) * BN
    start = i_s * split_len
    end = tl.minimum(start + split_len, seqlen)

    # The query block: BH rows of [absorbed 512 | RoPE 64], loaded once.
    o_r = i_hb * BH + tl.arange(0, BH)
    m_r = o_r < ROWS
    o_v = tl.arange(0, BV)
    o_p = tl.arange(0, BP)
    p_q = q + (i_b * ROWS + o_r).to(tl.int64)[:, None] * D_QK
    m_qv = m_r[:, None]
    if BV != D_V:
        m_qv = m_qv & (o_v < D_V)[None, :]
    b_qc = tl.load(p_q + o_v[None, :], mask=m_qv, other=0.0)
    if D_PE > 0:
        b_qp = tl.load(p_q + D_V + o_p[None, :], mask=m_r[:, None] & (o_p < D_PE)[None, :], other=0.0)
    # Every query sees the positions below shared_end. With causal=True query
    # i sees positions < seqlen - s_q + i + 1, so the last s_q - 1 positions
    # are seen by the later queries only: the tile loop leaves them (this
    # slice's share: x0 ... end) to single steps after it.
    shared_end = seqlen
    if CAUSAL:
        shared_end = seqlen - S_Q + 1
        x0 = tl.maximum(start, shared_end)
        o_x = tl.arange(0, BX)
        # Their scores now, while the query block is in registers: position
        # x0 + j in column j.
        b_xs = tl.full([BH, BX], float("-inf"), tl.float32)
        for j in range(0, end - x0):
            p_x = _cache_row(kv, block_table, i_b, x0 + j, stride_kb, stride_kt, stride_bt, PAGE, PAGED)
            b_kc = tl.load(p_x + o_v, mask=o_v < D_V, other=0.0).to(tl.float32)
            b_sx = tl.sum(b_qc.to(tl.float32) * b_kc[None, :], 1)
            if D_PE > 0:
                b_kp = tl.load(p_x + D_V + o_p, mask=o_p < D_PE, other=0.0).to(tl.float32)
                b_sx += tl.sum(b_qp.to(tl.float32) * b_kp[None, :], 1)
            b_xs = tl.where(o_x[None, :] == j, b_sx[:, None], b_xs)
    loop_end = tl.minimum(end, shared_end)

    b_m = tl.full([BH], float("-inf"), tl.float32)  # running max of the scaled scores (log2 units)
    b_l = tl.zeros([BH], tl.float32)                # running sum of exp2
    b_acc = tl.zeros([BH, BV], tl.float32)          # running sum of p * value
    o_t = tl.arange(0, BN)
    if TMA:
        # This sequence's cache as a [shared_end, D_QK] matrix: the copy
        # engine fetches whole tiles and fills rows past shared_end with
        # zeros, so nothing past them is ever read. Columns past D_V in a
        # [BN, BV] tile (BV > D_V) meet zeros in the query and are not
        # stored.
        seq = kv + i_b.to(tl.int64) * stride_kb
        d_c = tl.make_tensor_descriptor(seq, shape=[shared_end, D_QK], strides=[stride_kt, 1], block_shape=[BN, BV])
        if D_PE > 0:
            d_p = tl.make_tensor_descriptor(seq, shape=[shared_end, D_QK], strides=[stride_kt, 1],
                                            block_shape=[BN, BP])
    elif not PAGED:
        # Contiguous cache without TMA: one 64-bit base per program; each
        # tile moves it by BN rows.
        p_c = kv + i_b.to(tl.int64) * stride_kb + (start + o_t).to(tl.int64)[:, None] * stride_kt
    for n0 in range(start, loop_end, BN):
        o_n = n0 + o_t
        m_n = o_n < loop_end                          # never read past the sequence
        # One cache tile, read once for all BH rows: latent c [BN, 512] (key
        # part and value).
        if TMA:
            b_c = d_c.load([n0, 0])
        else:
            if PAGED:
                i_page = tl.load(block_table + i_b * stride_bt + o_n // PAGE, mask=m_n, other=0)
                p_c = kv + (i_page.to(tl.int64) * stride_kb + (o_n % PAGE) * stride_kt)[:, None]
            m_c = m_n[:, None]
            if BV != D_V:
                m_c = m_c & (o_v < D_V)[None, :]
            b_c = tl.load(p_c + o_v[None, :], mask=m_c, other=0.0)
        b_s = tl.dot(b_qc, tl.trans(b_c))
        if D_PE > 0:
            if TMA:
                b_pe = d_p.load([n0, D_V])
            else:
                b_pe = tl.load(p_c + D_V + o_p[None, :], mask=m_n[:, None] & (o_p < D_PE)[None, :], other=0.0)
            b_s = tl.dot(b_qp, tl.trans(b_pe), b_s)
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
        # Online softmax; a row with nothing visible yet keeps m = -inf, l =
        # 0, acc = 0. The scale is positive, so max(s) * scale is the max of
        # the scaled scores, and s * scale - m is one fused multiply-add per
        # score.
        b_m_new = tl.maximum(b_m, tl.max(b_s, 1) * scale_log2)
        b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_alpha = tl.exp2(b_m - b_m_safe)
        b_p = tl.exp2(b_s * scale_log2 - b_m_safe[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = tl.dot(b_p.to(b_c.dtype), b_c, b_acc * b_alpha[:, None])  # value = the same tile
        b_m = b_m_new
        if not PAGED and not TMA:
            p_c += BN * stride_kt

    if CAUSAL:
        # The positions only some rows see, in fp32. A row's weight for a
        # position it cannot see is dropped by a select, never multiplied by
        # 0, so even a NaN there stays out of its row (0 * NaN is NaN).
        seen = seqlen - S_Q + o_r // H + 1                       # row r sees positions < seen[r]
        m_x = ((x0 + o_x)[None, :] < seen[:, None]) & ((x0 + o_x)[None, :] < end)
        b_xs = tl.where(m_x, b_xs, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_xs, 1) * scale_log2)
        b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_alpha = tl.exp2(b_m - b_m_safe)
        b_xp = tl.exp2(b_xs * scale_log2 - b_m_safe[:, None])
        b_l = b_l * b_alpha + tl.sum(b_xp, 1)
        b_acc = b_acc * b_alpha[:, None]
        b_m = b_m_new
        for j in range(0, end - x0):
            p_x = _cache_row(kv, block_table, i_b, x0 + j, stride_kb, stride_kt, stride_bt, PAGE, PAGED)
            b_vx = tl.load(p_x + o_v, mask=o_v < D_V, other=0.0).to(tl.float32)          # [BV]: its value
            b_px = tl.sum(tl.where(o_x[None, :] == j, b_xp, 0.0), 1)                    # [BH]: its weights
            b_acc += tl.where((x0 + j < seen)[:, None], b_px[:, None] * b_vx[None, :], 0.0)

    b_lse = log2_sum_exp2(b_m, b_l)  # -inf: nothing seen; NaN: saw a NaN score; +inf: saw a +inf one
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
    m_o = m_r[:, None]
    if BV != D_V:
        m_o = m_o & (o_v < D_V)[None, :]
    o_br = (i_b * ROWS + o_r).to(tl.int64)
    if SPLIT:
        # Partial result of this slice, merged later by
        # `_mla_combine_kernel`.
        p_w = ws_o + (o_br * num_splits + i_s)[:, None] * D_V + o_v[None, :]
        tl.store(p_w, b_o, mask=m_o)
        tl.store(ws_lse + o_br * num_splits + i_s, b_lse, mask=m_r)
    else:
        tl.store(o + o_br[:, None] * D_V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_o)
        # lse is [B, H, s_q]: row r is query r // H of head r % H; natural
        # log.
        tl.store(lse + (i_b * H + o_r % H) * S_Q + o_r // H, b_lse * _LN2, mask=m_r)


@triton.jit
def _mla_combine_kernel(
    ws_o, ws_lse, o, lse, num_splits,
    S_Q: tl.constexpr, H: tl.constexpr, D_V: tl.constexpr,
    BS: tl.constexpr, BV: tl.constexpr,
):
    """Merge the num_splits partials of one (batch, query, head) row: its
    whole value, all D_V columns.

    ws_o fp32 [rows, num_splits, D_V] and ws_lse fp32 [rows, num_splits]
    (base 2, -inf for an empty slice), rows = B * S_Q * H in o's order; o [B,
    S_Q, H, D_V] (its own dtype), lse fp32 [B, H, S_Q] (natural log).
    """
    ROWS: tl.constexpr = S_Q * H
    i_br = tl.program_id(0)
    i_b, i_r = i_br // ROWS, i_br % ROWS
    # The slices' weights, exp2(lse - max) / their sum: first the max and the
    # sum, from the lse vector.
    p_lse = ws_lse + i_br.to(tl.int64) * num_splits
    o_s = tl.arange(0, BS)
    b_lse = tl.load(p_lse + o_s, mask=o_s < num_splits, other=float("-inf"))
    b_m = tl.max(b_lse, 0)
    b_m = tl.where(b_m == float("-inf"), 0.0, b_m)   # every slice empty: all weights exp2(-inf) = 0
    b_sum = tl.sum(tl.exp2(b_lse - b_m), 0)
    b_norm = tl.where(b_sum > 0, b_sum, 1.0)
    # Then the slices one at a time, each a contiguous run of D_V floats (one
    # coalesced load), so the registers hold one slice, not all of them. The
    # loop's stages keep the loads of the next slices in flight while this
    # one is added: without them a program waits a memory latency per slice.
    o_v = tl.arange(0, BV)
    m_v = o_v < D_V
    p_w = ws_o + i_br.to(tl.int64) * num_splits * D_V + o_v
    b_out = tl.zeros([BV], tl.float32)
    for i_s in tl.range(num_splits, num_stages=3):
        b_w = tl.exp2(tl.load(p_lse + i_s) - b_m) / b_norm   # its lse read again, as a scalar (cached)
        b_out += b_w * tl.load(p_w + i_s * D_V, mask=m_v, other=0.0)
    tl.store(o + i_br.to(tl.int64) * D_V + o_v, b_out.to(o.dtype.element_ty), mask=m_v)
    tl.store(lse + (i_b * H + i_r % H) * S_Q + i_r // H, log2_sum_exp2(b_m, b_sum) * _LN2)


# On the GPU: four tile shapes, tried once per (shape, mode) and remembered.
# BH=64 rows with 8 warps: the [64, 512] fp32 accumulator is 128 registers a thread,
# and two warpgroups share the value columns (256 each), as FlashMLA does by hand.
# Shared memory per stage is one cache tile, BN x 576 bf16 (72 KB at BN=64), next to the
# query block (72 KB at BH=64): BN=64 fits two stages (216 KB of 227), BN=32 fits four.
# Triton issues the copy of tile i+1 at the end of iteration i, so with two stages the copy is
# waited for almost at once; three or four stages leave one or two tiles of slack.
# Under the interpreter: one small tile (tl.dot needs every side >= 16).
_mla_decode_tuned = triton.autotune(
    configs=autotune_configs([
        ({"BH": 64, "BN": 64}, 8, 2),
        ({"BH": 64, "BN": 32}, 8, 3),
        ({"BH": 64, "BN": 32}, 8, 4),
        ({"BH": 32, "BN": 64}, 4, 2),  # split-KV slices: more programs
    ], interpreter={"BH": 16, "BN": 16}),
    # num_splits in the key: the best tile depends on how many programs share the GPU (B=1 cut into 36 slices
    # against B=32 cut into 2), and the batch itself is no argument of the kernel.
    key=["S_Q", "H", "D_QK", "D_V", "PAGED", "TMA", "CAUSAL", "SPLIT", "num_splits"],
)(_mla_decode_kernel)


def launch_triton(q, kv_cache, block_table, cache_seqlens, softmax_scale, causal, out, lse, ws_o, ws_lse, num_splits,
                  tma):
    """The Triton kernel, for inputs `interface.py` has checked (FlashMLA's argument order, then the outputs and
    the workspace): any dtype, s_q, head dims, paged caches. q, cache_seqlens and block_table dense;
    kv_cache rows unit-stride. tma: read the (contiguous, 16-byte aligned) cache through tensor descriptors.
    With num_splits > 1 it writes partials to ws_o fp32 [B, s_q * H, num_splits, D_V] and ws_lse (base 2).
    It goes through Triton's autotuner and dispatcher on every call, so it returns nothing to launch again."""
    B, S_Q, H, D_QK = q.shape
    D_V = out.shape[-1]
    paged = block_table is not None
    args = (q, kv_cache, block_table if paged else cache_seqlens,  # (the block table is not read unless paged)
            cache_seqlens, out, lse, ws_o, ws_lse, softmax_scale * LOG2E, kv_cache.stride(0), kv_cache.stride(1),
            block_table.stride(0) if paged else 0, num_splits)
    consts = dict(S_Q=S_Q, H=H, D_QK=D_QK, D_V=D_V, PAGE=kv_cache.shape[1] if paged else 1, PAGED=paged, TMA=tma,
                  CAUSAL=causal and S_Q > 1, SPLIT=num_splits > 1, BV=next_power_of_2(D_V),
                  BP=pow2_at_least_16(max(D_QK - D_V, 1)), BX=next_power_of_2(max(S_Q - 1, 1)))
    grid = lambda meta: (cdiv(S_Q * H, meta["BH"]), num_splits, B)  # noqa: E731
    with tma_scratch() if tma else contextlib.nullcontext():
        _mla_decode_tuned[grid](*args, **consts)


def launch_combine(ws_o, ws_lse, out, lse, num_splits):
    """Merge the num_splits partials of every row into out [B, s_q, H, D_V] and lse [B, H, s_q].
    Launched directly after the first call with a key (`attention_kernels.launch.launch_direct`, whose result it returns):
    its one integer argument, num_splits, is in the key, and its pointers, the workspace's and fresh allocations',
    are 16-byte aligned."""
    B, S_Q, H, D_V = out.shape
    BV = next_power_of_2(D_V)
    constexprs = dict(S_Q=S_Q, H=H, D_V=D_V, BS=max(2, next_power_of_2(num_splits)), BV=BV)
    return launch_direct(_mla_combine_kernel, (B * S_Q * H, 1, 1),
                         (out.device.index, num_splits, S_Q, H, D_V, out.dtype), (ws_o, ws_lse, out, lse, num_splits),
                         constexprs, num_warps=min(max(BV // 128, 1), 8))  # a 16-byte load (4 fp32) a thread per slice


__all__ = ["launch_triton", "launch_combine"]
