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

from ..common import INTERPRET

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): fold log2(e) into the softmax scale
SMEM_LIMIT = 200 * 1024  # bytes of shared memory we let one program use (H200: 227 KB per block)


def length_bucket(n: int) -> int:
    """Autotune key for a length: the next power of two, capped, so each new N does not re-tune."""
    return min(triton.next_power_of_2(max(int(n), 16)), 16384)


def _fwd_configs():
    if INTERPRET:  # the interpreter would time every config slowly: one small fixed config
        return [triton.Config({"BM": 32, "BN": 16}, num_warps=4, num_stages=1)]
    cfgs = [triton.Config({"BM": 128, "BN": bn}, num_warps=w, num_stages=s)
            for bn in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
    # smaller tiles, kept only for D = 256 (registers and shared memory run out otherwise)
    cfgs += [triton.Config({"BM": 64, "BN": bn}, num_warps=w, num_stages=2) for bn in (32, 64) for w in (4, 8)]
    return cfgs


def _prune_fwd(configs, nargs, **kw):
    D, elt = kw["D"], nargs["q"].element_size()
    keep = []
    for c in configs:
        bm, bn, st = c.kwargs["BM"], c.kwargs["BN"], c.num_stages
        if (bm == 64) != (D > 128):
            continue
        if (bm * D + st * 2 * bn * D) * elt <= SMEM_LIMIT:  # Q tile + pipelined K and V tiles
            keep.append(c)
    return keep or [min(configs, key=lambda c: c.kwargs["BM"] * c.kwargs["BN"] * c.num_stages)]


@triton.jit
def _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, stride_ks, stride_vs, o_m, o_d, lo, hi, S, shift, qk_scale,
                    BN: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key blocks [lo, hi): one online-softmax update per block. MASKED=False is the fast
    path for blocks every row of the tile may fully see; MASKED=True handles the causal diagonal
    and the ragged last block (keys >= S)."""
    o_n = tl.arange(0, BN)
    for i_n in range(lo, hi, BN):
        o_s = i_n + o_n
        p_k = p_k0 + o_s[:, None] * stride_ks + o_d[None, :]
        p_v = p_v0 + o_s[:, None] * stride_vs + o_d[None, :]
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


@triton.autotune(configs=_fwd_configs(), key=["D", "CAUSAL", "T_BUCKET", "S_BUCKET"],
                 prune_configs_by={"early_config_prune": _prune_fwd})
@triton.jit
def _attn_fwd_kernel(q, k, v, o, lse,
                     stride_qb, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
                     stride_vb, stride_vs, stride_vh, stride_ob, stride_ot, stride_oh,
                     T, S, HQ, GROUP, qk_scale, T_BUCKET, S_BUCKET,
                     D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    i_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks see the most keys: start them first
        i_m = tl.num_programs(0) - 1 - i_m
    i_bh = tl.program_id(1)
    i_b = (i_bh // HQ).to(tl.int64)
    i_h = i_bh % HQ
    i_hk = i_h // GROUP  # GQA: this query head reads KV head h // (Hq / Hkv), no copy of K/V
    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, D)
    m_m = o_m < T

    p_q = q + i_b * stride_qb + i_h * stride_qh + o_m[:, None] * stride_qt + o_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None], other=0.0)
    p_k0 = k + i_b * stride_kb + i_hk * stride_kh
    p_v0 = v + i_b * stride_vb + i_hk * stride_vh

    b_m = tl.full([BM], float("-inf"), dtype=tl.float32)  # running max (base-2 units)
    b_l = tl.zeros([BM], dtype=tl.float32)  # running sum of exp2(s - m)
    b_acc = tl.zeros([BM, D], dtype=tl.float32)  # running, unnormalised output
    full_end, hi = _key_ranges(i_m * BM, T, S, BM, BN, CAUSAL)
    shift = S - T
    b_acc, b_m, b_l = _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, stride_ks, stride_vs, o_m, o_d,
                                      0, full_end, S, shift, qk_scale, BN, False, CAUSAL)
    b_acc, b_m, b_l = _attn_fwd_inner(b_acc, b_m, b_l, b_q, p_k0, p_v0, stride_ks, stride_vs, o_m, o_d,
                                      full_end, hi, S, shift, qk_scale, BN, True, CAUSAL)

    empty = b_l == 0.0  # causal with T > S: a row that sees no key; its output is 0
    b_l1 = tl.where(empty, 1.0, b_l)
    b_o = b_acc / b_l1[:, None]
    b_lse = tl.where(empty, float("inf"), b_m + tl.math.log2(b_l1))  # +inf makes P = 0 in the backward
    p_o = o + i_b * stride_ob + i_h * stride_oh + o_m[:, None] * stride_ot + o_d[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_m[:, None])
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


def attention_fwd(q, k, v, causal: bool, softmax_scale: float):
    """Launch the forward (inputs already validated). Returns (o [B, T, Hq, D] in q's dtype,
    lse fp32 [B, Hq, T] in base 2: lse = log2 sum_j exp2(s_ij * scale * log2 e))."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    o = torch.empty((B, T, HQ, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(T, meta["BM"]), B * HQ)  # noqa: E731
    _attn_fwd_kernel[grid](
        q, k, v, o, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        T, S, HQ, HQ // HKV, softmax_scale * LOG2E, length_bucket(T), length_bucket(S),
        D=D, CAUSAL=bool(causal))
    return o, lse


__all__ = ["attention_fwd", "LOG2E", "length_bucket"]
