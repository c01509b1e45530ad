"""FlashAttention-2 forward in Triton: tiling, online softmax in base 2, GQA without copying K/V.

One program computes one block of BM query rows of one (batch, query head). It walks over the
keys BN at a time, keeps a running max `b_m`, a running sum `b_l` and an fp32 accumulator
`b_acc` in registers, and never writes the T x S score matrix anywhere. It also stores the
row log-sum-exp (base 2, fp32 [B, Hq, T]) that the backward needs to recompute P.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..common import INTERPRET

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): fold log2(e) into the softmax scale

# Tile sizes per head dim: (BM, BN, num_warps, num_stages). Fixed, not autotuned: on the H200
# (bf16, D = 128, N = 1K..16K) autotuning over eight configs picked BM = 128, BN = 64, 8 warps
# at every length, with 4 pipeline stages without the causal mask and 3 with it. Smaller head
# dims need fewer warps; D = 256 needs a smaller query tile (registers and shared memory).
FWD_TILES = {32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 4), 256: (64, 64, 8, 2)}
FWD_FALLBACK = (64, 32, 4, 1)  # used only if a tile does not fit in shared memory (e.g. fp32, D = 256)
INTERPRET_TILES = (32, 16, 4, 1)  # the interpreter runs one program at a time: small tiles, few steps


def attention_flops(B: int, H: int, T: int, S: int, D: int, causal: bool, backward: bool = False) -> float:
    """Matmul FLOPs: 4·B·H·T·S·D for the forward (QKᵀ and PV), half that when causal (T = S);
    the backward counts 2.5× the forward (it recomputes QKᵀ, then makes dV, dP, dQ and dK)."""
    flops = 4.0 * B * H * T * S * D / (2 if causal else 1)
    return flops * (2.5 if backward else 1.0)


def fwd_tiles(D: int, causal: bool):
    """The forward's (BM, BN, num_warps, num_stages) candidates for head dim D, best first."""
    if INTERPRET:
        return [INTERPRET_TILES]
    bm, bn, warps, stages = FWD_TILES[D]
    if causal and D == 128:
        stages = 3  # what the autotuner picked with the mask
    return [(bm, bn, warps, stages), FWD_FALLBACK]


_VARIANTS = {}  # key -> (index of the candidate that fits, compiled kernel or None, its constexpr values)


def _aligned(args) -> bool:
    return all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))


def launch(kernel, grid, candidates, key, *args, **constexprs):
    """Launch `kernel` with the first of `candidates` (BM, BN, num_warps, num_stages) that fits in
    this GPU's shared memory (BM: query rows per tile, BN: keys per tile, in every kernel).
    `grid(BM, BN)` gives the launch grid; `key` names the compiled variant (device, dtype and the
    constexprs), so a candidate that does not fit is compiled and rejected once, not on every call.

    After the first call, a key's compiled kernel is launched directly. Triton's dispatcher
    re-derives every argument's specialisation on each call: about 20 us of host time per launch
    with 15 arguments on the H200's CPU, and at N = 1K the backward's host time is what bounds it.
    Skipping the dispatcher is safe here because these kernels specialise on nothing that changes
    between calls with one key: lengths are `do_not_specialize`, floats are never specialised, and
    pointers are checked to be 16-byte aligned, as they were when the kernel was compiled."""
    i, compiled, tail = _VARIANTS.get(key, (0, None, ()))
    if compiled is not None and _aligned(args):
        bm, bn = candidates[i][:2]
        compiled[(*grid(bm, bn), 1, 1)[:3]](*args, *tail)  # this path wants all three grid sides
        return
    while True:
        bm, bn, warps, stages = candidates[i]
        try:
            compiled = kernel[grid(bm, bn)](*args, **constexprs, BM=bm, BN=bn, num_warps=warps, num_stages=stages)
        except OutOfResources:
            if i + 1 == len(candidates):
                raise
            i += 1
            continue
        if compiled is not None and _aligned(args):  # (the interpreter compiles nothing)
            # the compiled kernel takes every parameter, constexprs too, in signature order
            values = {**constexprs, "BM": bm, "BN": bn}
            _VARIANTS[key] = (i, compiled, tuple(values[name] for name in kernel.arg_names[len(args):]))
        elif key not in _VARIANTS:
            _VARIANTS[key] = (i, None, ())
        return


@triton.jit
def _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, stride_s, o_m, o_d, lo, hi, S, shift, qk_scale,
                    BN: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key blocks [lo, hi): one online-softmax update per block. MASKED=False is the fast
    path for blocks every row of the tile may fully see; MASKED=True handles the causal diagonal
    and the ragged last block (keys >= S)."""
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
            b_v = tl.load(p_v, mask=m_s[:, None], other=0.0)
        else:
            b_v = tl.load(p_v)
        b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None])
        b_m = b_mn
    return b_acc, b_m, b_l


@triton.jit
def _key_ranges(m0, T, S, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    """For query rows [m0, m0+BM): keys [0, full_end) are visible to every row (no mask needed);
    keys [full_end, hi) need the mask. Shared by the forward and the dQ kernel."""
    if CAUSAL:
        shift = S - T
        full_end = tl.minimum(tl.maximum(m0 + shift + 1, 0), S) // BN * BN
        hi = tl.maximum(tl.minimum(m0 + BM + shift, S), full_end)
    else:
        full_end = S // BN * BN
        hi = S
    return full_end, hi


@triton.jit(do_not_specialize=["T", "S", "HQ", "GROUP"])  # one compiled kernel for every length
def _attn_fwd_kernel(q, k, v, o, lse, T, S, HQ, GROUP, qk_scale,
                     D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """q, o: [B, T, HQ, D], k, v: [B, S, HQ // GROUP, D], all contiguous: the strides follow
    from the shape, so the launch passes ten arguments instead of twenty-two."""
    i_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks see the most keys: start them first
        i_m = tl.num_programs(0) - 1 - i_m
    i_bh = tl.program_id(1)
    i_b = (i_bh // HQ).to(tl.int64)
    i_h = i_bh % HQ
    HKV = HQ // GROUP
    i_hk = i_h // GROUP  # GQA: this query head reads KV head h // (Hq / Hkv), no copy of K/V
    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, D)
    m_m = o_m < T

    q_offset = (i_b * T * HQ + i_h) * D + o_m[:, None] * (HQ * D) + o_d[None, :]  # O has Q's layout
    b_q = tl.load(q + q_offset, mask=m_m[:, None], other=0.0)
    kv_base = (i_b * S * HKV + i_hk) * D  # K and V share their layout
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
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


def attention_fwd(q, k, v, causal: bool, softmax_scale: float):
    """Launch the forward (inputs validated and contiguous). Returns (o [B, T, Hq, D] in q's dtype,
    lse fp32 [B, Hq, T] in base 2: lse = log2 sum_j exp2(s_ij * scale * log2 e))."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    o = torch.empty((B, T, HQ, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    tiles = fwd_tiles(D, causal)
    launch(_attn_fwd_kernel, lambda BM, BN: (triton.cdiv(T, BM), B * HQ), tiles, ("fwd", q.device, q.dtype, D, causal),
           q, k, v, o, lse, T, S, HQ, HQ // HKV, softmax_scale * LOG2E, D=D, CAUSAL=causal)
    return o, lse


__all__ = ["attention_fwd", "launch", "fwd_tiles", "LOG2E"]
