"""MLA decode in Triton: MQA over a shared latent cache (576-dim keys, 512-dim values).

One program owns a block of BH query rows (rows = (query, head) pairs of one batch
element) and one slice of the cache. It walks its slice in tiles of BN positions,
loading each tile once for all BH rows, and keeps an online softmax in fp32.
With more than one slice per sequence (split-KV, "flash-decoding") every slice
writes a partial output and its log-sum-exp, and a second small kernel merges them.
A contiguous cache is read through TMA tensor descriptors (Hopper's copy engine);
a paged cache through a block table and ordinary pointer loads.
On a Hopper GPU, the common serving case (bf16, one query token, DeepSeek's 576/512 dims, a
contiguous cache) goes instead to a hand-scheduled Gluon kernel (`gluon_decode.py`) with a copy
warp and two ping-pong warpgroups; it splits sequences the same way and shares the combine kernel.
"""
from __future__ import annotations

import functools
import math
import numbers

import torch
import triton
import triton.language as tl

from ..common import DEVICE, INTERPRET, ON_GPU, check_tensor
from . import gluon_decode
from .gluon_decode import BLOCK_H as GLUON_BLOCK_H, D_QK as GLUON_D_QK, D_V as GLUON_D_V, tma_ready

LN2 = math.log(2.0)

# Descriptors made inside a kernel (`tl.make_tensor_descriptor`) need a little scratch memory per
# program, which Triton asks for through an allocator. Install one backed by PyTorch's.
triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=DEVICE))


@triton.jit
def _mla_decode_kernel(
    q, kv, block_table, seqlens, o, lse, ws_o, ws_lse,
    scale_log2,                       # softmax_scale * log2(e): scores go straight into exp2
    stride_kb, stride_kt, stride_bt,  # cache: per batch element (or per page), per token; block table row
    num_splits,
    S_Q: tl.constexpr, H: tl.constexpr, D_QK: tl.constexpr, D_V: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
    BH: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, BP: tl.constexpr,
):
    ROWS: tl.constexpr = S_Q * H       # (query, head) pairs share every cache tile
    D_PE: tl.constexpr = D_QK - D_V    # the RoPE part of the key (64 for DeepSeek)
    # Head blocks vary fastest, so the programs reading the same cache slice run
    # side by side and the second read comes from L2.
    i_hb, i_s, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)

    # This program's slice of the sequence: [start, end), a multiple of BN long.
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
    if CAUSAL:
        seen = seqlen - S_Q + o_r // H + 1  # query i sees positions < seqlen - s_q + i + 1

    b_m = tl.full([BH], float("-inf"), tl.float32)  # running max of the scaled scores (log2 units)
    b_l = tl.zeros([BH], tl.float32)                # running sum of exp2
    b_acc = tl.zeros([BH, BV], tl.float32)          # running sum of p * value
    o_t = tl.arange(0, BN)
    if TMA:
        # This sequence's cache as a [seqlen, D_QK] matrix: the copy engine fetches whole tiles
        # and fills rows past seqlen with zeros, so nothing past the sequence is ever read.
        # Columns past D_V in a [BN, BV] tile (BV > D_V) meet zeros in the query and are not stored.
        seq = kv + i_b.to(tl.int64) * stride_kb
        d_c = tl.make_tensor_descriptor(seq, shape=[seqlen, D_QK], strides=[stride_kt, 1], block_shape=[BN, BV])
        if D_PE > 0:
            d_p = tl.make_tensor_descriptor(seq, shape=[seqlen, D_QK], strides=[stride_kt, 1], block_shape=[BN, BP])
    elif not PAGED:
        # Contiguous cache without TMA: one 64-bit base per program; each tile moves it by BN rows.
        p_c = kv + i_b.to(tl.int64) * stride_kb + (start + o_t).to(tl.int64)[:, None] * stride_kt
    for n0 in range(start, end, BN):
        o_n = n0 + o_t
        m_n = o_n < end                               # never read past the sequence
        # One cache tile, read once for all BH rows: latent c [BN, 512] (key part and value).
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
        m_s = m_n[None, :]
        if CAUSAL:
            m_s = m_s & (o_n[None, :] < seen[:, None])
        b_s = tl.where(m_s, b_s, float("-inf"))
        # Online softmax; a row with nothing visible yet keeps m = -inf, l = 0, acc = 0.
        # The scale is positive, so max(s) * scale is the max of the scaled scores, and
        # s * scale - m is one fused multiply-add per score.
        b_m_new = tl.maximum(b_m, tl.max(b_s, 1) * scale_log2)
        b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_alpha = tl.exp2(b_m - b_m_safe)
        b_p = tl.exp2(b_s * scale_log2 - b_m_safe[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = tl.dot(b_p.to(b_c.dtype), b_c, b_acc * b_alpha[:, None])  # value = the same tile
        b_m = b_m_new
        if not PAGED and not TMA:
            p_c += BN * stride_kt

    b_lse = tl.where(b_l > 0, b_m + tl.log2(tl.where(b_l > 0, b_l, 1.0)), float("-inf"))  # -inf: nothing seen
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
    m_o = m_r[:, None]
    if BV != D_V:
        m_o = m_o & (o_v < D_V)[None, :]
    o_br = (i_b * ROWS + o_r).to(tl.int64)
    if SPLIT:
        # Partial result of this slice, merged later by `_mla_combine_kernel`.
        p_w = ws_o + (o_br * num_splits + i_s)[:, None] * D_V + o_v[None, :]
        tl.store(p_w, b_o, mask=m_o)
        tl.store(ws_lse + o_br * num_splits + i_s, b_lse, mask=m_r)
    else:
        tl.store(o + o_br[:, None] * D_V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_o)
        # lse is [B, H, s_q]: row r is query r // H of head r % H; natural log.
        tl.store(lse + (i_b * H + o_r % H) * S_Q + o_r // H, b_lse * 0.6931471805599453, mask=m_r)


@triton.jit
def _mla_combine_kernel(
    ws_o, ws_lse, o, lse, num_splits,
    S_Q: tl.constexpr, H: tl.constexpr, D_V: tl.constexpr,
    BS: tl.constexpr, BV: tl.constexpr,
):
    """Merge the split-KV partials of one (batch, query, head) row, one BV chunk of the value."""
    ROWS: tl.constexpr = S_Q * H
    i_br, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_r = i_br // ROWS, i_br % ROWS
    o_s = tl.arange(0, BS)
    m_s = o_s < num_splits
    b_lse = tl.load(ws_lse + i_br.to(tl.int64) * num_splits + o_s, mask=m_s, other=float("-inf"))
    b_m = tl.max(b_lse, 0)
    b_m = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_w = tl.exp2(b_lse - b_m)                        # each slice's share, up to a common factor
    b_sum = tl.sum(b_w, 0)
    b_w = b_w / tl.where(b_sum > 0, b_sum, 1.0)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D_V
    p_w = ws_o + (i_br.to(tl.int64) * num_splits + o_s)[:, None] * D_V + o_v[None, :]
    b_o = tl.load(p_w, mask=m_s[:, None] & m_v[None, :], other=0.0)
    b_out = tl.sum(b_o * b_w[:, None], 0)
    tl.store(o + i_br.to(tl.int64) * D_V + o_v, b_out.to(o.dtype.element_ty), mask=m_v)
    if i_v == 0:
        b_lse_all = tl.where(b_sum > 0, b_m + tl.log2(tl.where(b_sum > 0, b_sum, 1.0)), float("-inf"))
        tl.store(lse + (i_b * H + i_r % H) * S_Q + i_r // H, b_lse_all * 0.6931471805599453)


# On the GPU: four tile shapes, tried once per (shape, mode) and remembered.
# BH=64 rows with 8 warps: the [64, 512] fp32 accumulator is 128 registers a thread,
# and two warpgroups share the value columns (256 each), as FlashMLA does by hand.
# Shared memory per stage is one cache tile, BN x 576 bf16 (72 KB at BN=64), next to the
# query block (72 KB at BH=64): BN=64 fits two stages (216 KB of 227), BN=32 fits four.
# Triton issues the copy of tile i+1 at the end of iteration i, so with two stages the copy is
# waited for almost at once; three or four stages leave one or two tiles of slack.
_GPU_CONFIGS = [
    triton.Config({"BH": 64, "BN": 64}, num_warps=8, num_stages=2),
    triton.Config({"BH": 64, "BN": 32}, num_warps=8, num_stages=3),
    triton.Config({"BH": 64, "BN": 32}, num_warps=8, num_stages=4),
    triton.Config({"BH": 32, "BN": 64}, num_warps=4, num_stages=2),  # split-KV slices: more programs
]
_mla_decode_tuned = triton.autotune(
    configs=_GPU_CONFIGS, key=["S_Q", "H", "D_QK", "D_V", "PAGED", "TMA", "CAUSAL", "SPLIT"],
)(_mla_decode_kernel)
# Under the interpreter: one small fixed tile (tl.dot needs every side >= 16).
_CPU_CONFIG = {"BH": 16, "BN": 16}
_BH_PLAN = 64  # the head block the split heuristic assumes


@functools.lru_cache(maxsize=1024)  # a decode loop asks the same question every step: answer it once
def _num_splits(B: int, n_hblocks: int, max_len: int, n_sm: int) -> int:
    """How many slices to cut each sequence into, by a small cost model in units of
    'one cache position processed by one program' (about 30 ns for 64 heads on an H200 SM):
    waves * (positions per slice + ~64 fixed per program), plus, when splitting, a
    second launch (~160) and the fp32 partials written and read back (~3 per program-slice)."""
    progs = B * n_hblocks
    best, best_cost = 1, float("inf")
    for s in range(1, 129):
        per = math.ceil(max_len / s)
        if s > 1 and per < 64:
            break
        waves = math.ceil(progs * s / n_sm)
        cost = waves * (per + 64) + (0 if s == 1 else 160 + 3 * progs * s)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


@functools.lru_cache(maxsize=None)
def _sm_count(dev: torch.device) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count


@functools.lru_cache(maxsize=None)
def _is_hopper(dev: torch.device) -> bool:
    return torch.cuda.get_device_capability(dev)[0] == 9


def _launch_triton(q, kv_cache, block_table, cache_seqlens, softmax_scale, out, lse, ws_o, ws_lse, num_splits,
                   causal, page, stride_kb, stride_kt, stride_bt):
    """The Triton kernel's launch: the portable path (any dtype, s_q, head dims, paged caches)."""
    B, S_Q, H, D_QK = q.shape
    D_V = out.shape[-1]
    BV = triton.next_power_of_2(D_V)
    BP = max(16, triton.next_power_of_2(max(D_QK - D_V, 1)))
    bt = block_table if block_table is not None else cache_seqlens  # unused when not paged
    args = (q, kv_cache, bt, cache_seqlens, out, lse, ws_o, ws_lse,
            softmax_scale * 1.4426950408889634, stride_kb, stride_kt, stride_bt, num_splits)
    tma = block_table is None and tma_ready(kv_cache)  # a contiguous cache always is
    consts = dict(S_Q=S_Q, H=H, D_QK=D_QK, D_V=D_V, PAGE=page, PAGED=block_table is not None, TMA=tma,
                  CAUSAL=causal and S_Q > 1, SPLIT=num_splits > 1, BV=BV, BP=BP)
    if ON_GPU and not INTERPRET:
        grid = lambda meta: (triton.cdiv(S_Q * H, meta["BH"]), num_splits, B)  # noqa: E731
        _mla_decode_tuned[grid](*args, **consts)
    else:
        grid = (triton.cdiv(S_Q * H, _CPU_CONFIG["BH"]), num_splits, B)
        _mla_decode_kernel[grid](*args, **consts, **_CPU_CONFIG)


def _gluon_misfit(q, kv_cache, block_table, head_dim_v):
    """Why the Gluon kernel cannot take this call (a phrase), or None if it can."""
    B, S_Q, H, D_QK = q.shape
    if INTERPRET or q.device.type != "cuda" or not _is_hopper(q.device):
        return "it needs a Hopper GPU (sm_90)"
    if q.dtype != torch.bfloat16:
        return f"it needs bfloat16, got {q.dtype}"
    if S_Q != 1 or D_QK != GLUON_D_QK or head_dim_v != GLUON_D_V or H % GLUON_BLOCK_H:
        return f"it needs s_q = 1, D_qk = {GLUON_D_QK}, head_dim_v = {GLUON_D_V} and H % {GLUON_BLOCK_H} == 0"
    if block_table is not None or not tma_ready(kv_cache):
        return "it needs a contiguous cache with 16-byte aligned rows (no block table)"
    return None


def mla_decode(q, kv_cache, cache_seqlens, softmax_scale, head_dim_v=512, block_table=None, causal=False,
               *, num_splits=None, check_seqlens=True, backend="auto"):
    """MLA decode attention over a latent cache (absorbed form), FlashMLA's contract.

    q: [B, s_q, H, D_qk] (D_qk = 576 for DeepSeek: the absorbed 512 then the 64 RoPE dims), s_q >= 1.
    kv_cache: [B, T_max, D_qk]; or, with block_table (int32 [B, max_blocks]), a paged cache
        [num_blocks, page_size, D_qk] where position t of sequence b is in page block_table[b, t // page_size].
        The value is the first head_dim_v columns of the cache (the latent c_kv).
    cache_seqlens: int32 [B], 1 <= seqlen <= capacity; positions past a sequence's length are never read.
    softmax_scale: required (DeepSeek-V3 with YaRN: ~0.1352; FlashMLA's default: 576 ** -0.5).
    causal: query i of s_q sees cache positions < seqlen - s_q + i + 1.
    num_splits: slices per sequence (split-KV); None picks from B, H, length and the SM count.
    check_seqlens: validate seqlens / block table values (one device sync); False in graphs and timing loops.
    backend: "auto" (the Gluon kernel where it applies, see the module docstring; else Triton), "triton",
        or "gluon" (ValueError, saying why, where it does not apply).
    A contiguous cache with 16-byte aligned rows is read with TMA (the copy engine bounds every tile by the
    sequence length); a paged or unaligned one with pointer loads.
    Returns out [B, s_q, H, head_dim_v] in q's dtype and lse fp32 [B, H, s_q] (natural log).
    bf16/fp16 on the GPU (fp32 runs, with tf32 products); fp32/fp16 under the interpreter.

    >>> q = torch.randn(4, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(4, 8192, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode(q, kv, torch.full((4,), 8192, dtype=torch.int32, device="cuda"), 576 ** -0.5)
    """
    # ---- validate before any launch
    check_tensor("q", q, ndim=4, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    dev = q.device
    check_tensor("kv_cache", kv_cache, ndim=3, dtypes=(q.dtype,), device=dev)
    check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,), device=dev)
    B, S_Q, H, D_QK = q.shape
    if B < 1 or S_Q < 1 or H < 1:
        raise ValueError(f"q must have B, s_q, H >= 1, got shape {tuple(q.shape)}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, numbers.Integral):
        raise TypeError(f"head_dim_v must be an int, got {type(head_dim_v).__name__}")
    if not 0 < head_dim_v <= D_QK:
        raise ValueError(f"head_dim_v must be in [1, D_qk={D_QK}], got {head_dim_v}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if kv_cache.shape[-1] != D_QK:
        raise ValueError(f"kv_cache head dim {kv_cache.shape[-1]} != q head dim {D_QK}")
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last dim")
    if cache_seqlens.shape[0] != B:
        raise ValueError(f"cache_seqlens has {cache_seqlens.shape[0]} entries, q has batch {B}")
    if block_table is None:
        if kv_cache.shape[0] != B:
            raise ValueError(f"kv_cache batch {kv_cache.shape[0]} != q batch {B} (no block_table given)")
        capacity, page = kv_cache.shape[1], 1
        stride_kb, stride_kt, stride_bt = kv_cache.stride(0), kv_cache.stride(1), 0
    else:
        check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table has {block_table.shape[0]} rows, q has batch {B}")
        if block_table.stride(-1) != 1:
            raise ValueError("block_table must be contiguous in its last dim")
        page = kv_cache.shape[1]
        capacity = block_table.shape[1] * page
        stride_kb, stride_kt, stride_bt = kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0)
    if backend not in ("auto", "triton", "gluon"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'gluon', got {backend!r}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    max_len = capacity
    if check_seqlens:
        checks = [cache_seqlens.min(), cache_seqlens.max()]
        if block_table is not None:  # the pages a sequence uses must exist
            used = torch.arange(block_table.shape[1], device=dev)[None, :] * page < cache_seqlens[:, None].long()
            bad = used & ((block_table < 0) | (block_table >= kv_cache.shape[0]))
            checks.append(bad.any().to(cache_seqlens.dtype))
        lo, hi, *bad_page = torch.stack(checks).tolist()
        if lo < 1:
            raise ValueError(f"cache_seqlens must be >= 1, got min {lo}")
        if hi > capacity:
            what = "block_table too short: " if block_table is not None else ""
            raise ValueError(f"{what}cache_seqlens max {hi} exceeds the cache capacity {capacity}")
        if bad_page and bad_page[0]:
            raise ValueError(f"block_table holds page indices outside [0, {kv_cache.shape[0]}) for used pages")
        if causal and lo < S_Q:
            raise ValueError(f"causal=True needs every cache_seqlens >= s_q={S_Q}, got min {lo}")
        max_len = hi

    # ---- pick the split and the kernel, allocate, launch
    D_V = head_dim_v
    ROWS = S_Q * H
    if num_splits is None:
        n_sm = _sm_count(dev) if dev.type == "cuda" else 132
        num_splits = _num_splits(B, triton.cdiv(ROWS, _BH_PLAN), max_len, n_sm)
    gluon = False
    if backend != "triton":
        misfit = _gluon_misfit(q, kv_cache, block_table, head_dim_v)
        gluon = misfit is None  # the checks above and _gluon_misfit cover all of the Gluon kernel's constraints
        if backend == "gluon" and not gluon:
            raise ValueError(f"backend='gluon' does not apply here: {misfit}")
    q = q.contiguous()
    out = torch.empty(B, S_Q, H, D_V, device=dev, dtype=q.dtype)
    lse = torch.empty(B, H, S_Q, device=dev, dtype=torch.float32)
    split = num_splits > 1
    if split:
        ws_o = torch.empty(B, ROWS, num_splits, D_V, device=dev, dtype=torch.float32)
        ws_lse = torch.empty(B, ROWS, num_splits, device=dev, dtype=torch.float32)
    else:
        ws_o = ws_lse = out  # unused
    if gluon:
        gluon_decode.launch(q, kv_cache, cache_seqlens, softmax_scale, out, lse, ws_o, ws_lse, num_splits)
    else:
        _launch_triton(q, kv_cache, block_table, cache_seqlens, softmax_scale, out, lse, ws_o, ws_lse, num_splits,
                       causal, page, stride_kb, stride_kt, stride_bt)
    if split:
        BVC = min(triton.next_power_of_2(D_V), 128)
        _mla_combine_kernel[(B * ROWS, triton.cdiv(D_V, BVC))](
            ws_o, ws_lse, out, lse, num_splits, S_Q=S_Q, H=H, D_V=D_V,
            BS=max(2, triton.next_power_of_2(num_splits)), BV=BVC)
    return out, lse


__all__ = ["mla_decode"]
