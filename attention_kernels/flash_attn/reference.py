"""FlashAttention's maths in plain PyTorch: the yardstick every kernel in this chapter is tested against.

Layout [B, T, H, D] (sequence-major, as flash-attn uses). GQA: query head h reads KV head
h // (Hq // Hkv). Causal masks are bottom-right aligned (flash-attn >= 2.1): query i sees
key j iff j <= i + S - T; a query row that sees no key at all gets an output of 0.
Packed sequences (flash-attn's "varlen" form): q [total_q, Hq, D] and k, v [total_k, Hkv, D] hold N
sequences one after another, and int32 offsets cu_seqlens_q, cu_seqlens_k [N + 1] say where each
starts; sequence n is q[cu_seqlens_q[n]:cu_seqlens_q[n + 1]] against the matching keys, alone.
Every function checks its inputs first (TypeError for a wrong type or dtype, ValueError for a
wrong value or shape); they run on any device and take fp16, bf16, fp32 and fp64.
"""
from __future__ import annotations

import math

import torch

from ..checks import (REFERENCE_FLOATS, check_bool, check_has_values, check_int, check_not_empty,
                      check_same_device_and_dtype, check_tensor, softmax_scale_or_default)


def check_attention_args(q, k, v, causal, softmax_scale, dtypes=REFERENCE_FLOATS) -> float:
    """The checks every attention function here shares (the kernel adds its own): q [B, T, Hq, D],
    k and v [B, S, Hkv, D] of one dtype (in `dtypes`) on one device, every size >= 1, Hq a multiple
    of Hkv, causal a bool. Returns the softmax scale: softmax_scale, or 1/sqrt(D) for None."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4, dtypes=dtypes)
    check_same_device_and_dtype(q=q, k=k, v=v)
    check_not_empty("q", q, "B, T, Hq, D")
    check_not_empty("k", k, "B, S, Hkv, D")
    B, _, HQ, D = q.shape
    check_tensor("k", k, shape=(B, None, None, D))  # q's batch and head dim
    check_tensor("v", v, shape=tuple(k.shape))
    if HQ % k.shape[2]:
        raise ValueError(f"q's heads Hq={HQ} must be a multiple of k's and v's heads Hkv={k.shape[2]}")
    check_bool("causal", causal)
    return softmax_scale_or_default(softmax_scale, D)


def check_offsets(name: str, cu_seqlens, total: int, device) -> None:
    """Offsets of packed sequences: int32 [N + 1], N >= 1, on `device`; where they live on the CPU,
    also 0 first, `total` (the packed rows) last, non-decreasing (a sequence may be empty). The values
    of offsets on a GPU are not read: that would wait for the device; a wrong one there is the
    caller's error. Nor are they while torch.compile traces the call (a value is not known then)."""
    check_tensor(name, cu_seqlens, ndim=1, dtypes=(torch.int32,))
    if cu_seqlens.device != device:
        raise ValueError(f"{name} is on {cu_seqlens.device}, q, k and v on {device}: they must share a device")
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"{name} must hold N + 1 >= 2 offsets (N sequences), got {cu_seqlens.shape[0]}")
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        first, last = cu_seqlens[0].item(), cu_seqlens[-1].item()
        if first != 0:
            raise ValueError(f"{name} must start at 0, got {first}")
        if last != total:
            raise ValueError(f"{name} must end at the packed length {total} (dim 0 of its tensors), got {last}")
        if (cu_seqlens[1:] < cu_seqlens[:-1]).any():
            raise ValueError(f"{name} must be non-decreasing (every sequence's length >= 0)")


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, dtypes=REFERENCE_FLOATS) -> float:
    """The checks the packed form shares: q [total_q, Hq, D], k and v [total_k, Hkv, D] of one dtype
    (in `dtypes`) on one device, every size >= 1, Hq a multiple of Hkv; cu_seqlens_q and
    cu_seqlens_k as `check_offsets` says, both N + 1 long; causal a bool. Returns the softmax scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=3, dtypes=dtypes)
    check_same_device_and_dtype(q=q, k=k, v=v)
    check_not_empty("q", q, "total_q, Hq, D")
    check_not_empty("k", k, "total_k, Hkv, D")
    HQ, D = q.shape[1], q.shape[2]
    check_tensor("k", k, shape=(None, None, D))  # q's head dim
    check_tensor("v", v, shape=tuple(k.shape))
    if HQ % k.shape[1]:
        raise ValueError(f"q's heads Hq={HQ} must be a multiple of k's and v's heads Hkv={k.shape[1]}")
    check_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    check_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both be N + 1 long (one query and one key sequence "
                         f"each), got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    check_bool("causal", causal)
    return softmax_scale_or_default(softmax_scale, D)


def visible_pairs(T: int, S: int, causal: bool) -> int:
    """How many (query, key) pairs of one head the mask lets through: T·S, or, causal (bottom-right
    aligned: query i sees the i + S - T + 1 keys j <= i + S - T, none if that is <= 0), with
    m = min(T, S) rows that see anything, m·S - m(m - 1)/2; T(T + 1)/2 when T = S.

    >>> visible_pairs(3, 5, causal=True)    # rows see 3, 4 and 5 keys
    12
    """
    if not causal:
        return T * S
    m = min(T, S)
    return m * S - m * (m - 1) // 2


def attention_flops(B: int, H: int, T: int, S: int, D: int, causal: bool, backward: bool = False) -> float:
    """Matmul FLOPs of the work attention needs, the same for every implementation: 4·B·H·D per visible
    (query, key) pair for the forward (QKᵀ and PV; `visible_pairs`, about half of T·S when causal and
    T = S), and 2.5× that for the backward: five matmuls (QKᵀ recomputed, dV, dP, dK, dQ). The book's
    backward does seven, 3.5× the forward: its dQ programs recompute QKᵀ and dP instead of adding into
    dQ with atomics from the dK/dV programs, which keeps every gradient deterministic. The count stays
    at 2.5×, the work the operation must do, so that TFLOP/s compare across providers."""
    flops = 4.0 * B * H * D * visible_pairs(T, S, causal)
    return flops * (2.5 if backward else 1.0)


def causal_mask(T: int, S: int, device=None) -> torch.Tensor:
    """Bool [T, S]: True where query i may see key j, i.e. j <= i + S - T (bottom-right aligned).
    T, S: ints >= 1.

    >>> causal_mask(2, 3)
    tensor([[ True,  True, False],
            [ True,  True,  True]])
    """
    T, S = check_int("T", T, low=1), check_int("S", S, low=1)
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j <= i + (S - T)


def attention_ref(q, k, v, causal=False, softmax_scale=None, *, compute_dtype=torch.float64, out_dtype=None):
    """Softmax attention written from the formula, O = softmax(Q Kᵀ · scale +
    mask) V.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D] with Hq a multiple of Hkv (MHA,
    GQA, MQA). The maths runs in `compute_dtype` (fp64 by default, fp32 for
    big GPU shapes); the result comes back in `out_dtype` (default: q's
    dtype). softmax_scale defaults to 1/sqrt(D). A key a row cannot see adds
    nothing to it, even a NaN or inf in K or V there. Differentiable (plain
    autograd), so it also gives the reference gradients (of finite inputs:
    autograd's products do carry a hidden NaN into every row).

    >>> q = torch.randn(1, 77, 4, 64); k = v = torch.randn(1, 77, 2, 64)
    >>> o = attention_ref(q, k, v, causal=True)          # [1, 77, 4, 64]
    >>> o.shape == q.shape
    True
    """
    scale = check_attention_args(q, k, v, causal, softmax_scale)
    check_has_values(q=q, k=k, v=v)
    _check_float_dtype("compute_dtype", compute_dtype)
    if out_dtype is not None:
        _check_float_dtype("out_dtype", out_dtype)
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    qc, kc, vc = (t.to(compute_dtype) for t in (q, k, v))
    # GQA: every KV head serves `group` consecutive query heads.
    kc = kc.repeat_interleave(group, dim=2)
    vc = vc.repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bshd->bhts", qc, kc) * scale  # [B, H, T, S]
    visible = causal_mask(T, S, device=q.device) if causal else torch.ones(T, S, dtype=torch.bool, device=q.device)
    any_visible = visible.any(dim=1)[:, None]  # [T, 1]: rows that see at least one key
    s = s.masked_fill(~visible, float("-inf"))
    s = s.masked_fill(~any_visible, 0.0)  # keep softmax finite on empty rows ...
    p = torch.softmax(s, dim=-1) * any_visible  # ... then zero them: output 0 there
    o = torch.einsum("bhts,bshd->bthd", p, vc)
    bad = ~torch.isfinite(vc).all(dim=-1)  # [B, S, H]: keys whose value holds NaN or inf
    if bad.any():  # 0 * NaN is NaN: rows that cannot see such a key take the product without it
        sees_bad = torch.einsum("ts,bsh->bth", visible.to(vc.dtype), bad.to(vc.dtype)) > 0
        clean = torch.einsum("bhts,bshd->bthd", p, vc.masked_fill(bad[..., None], 0.0))
        o = torch.where(sees_bad[..., None], o, clean)
    return o.to(out_dtype or q.dtype)


def attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, softmax_scale=None, *,
                         compute_dtype=torch.float64, out_dtype=None):
    """Packed sequences, each alone through `attention_ref`, the results packed again.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D]; cu_seqlens_q, cu_seqlens_k: int32 [N + 1] offsets
    (sequence n: query rows cu_seqlens_q[n]:cu_seqlens_q[n + 1], key rows likewise). Lengths may be 0,
    and query and key lengths may differ (causal: bottom-right aligned within each sequence); a row of a
    sequence without keys outputs 0. Returns o [total_q, Hq, D] in `out_dtype` (default q's dtype);
    differentiable. Reads the offsets on the host.

    >>> cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)      # lengths 3, 0 and 7
    >>> q = torch.randn(10, 4, 32); k = v = torch.randn(10, 2, 32)
    >>> o = attention_varlen_ref(q, k, v, cu, cu, causal=True)   # [10, 4, 32]
    """
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale)
    check_has_values(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    pieces = []
    for (q0, q1), (k0, k1) in zip(_spans(cu_seqlens_q), _spans(cu_seqlens_k)):
        if q1 == q0:
            continue
        if k1 == k0:  # rows that see no key
            pieces.append(torch.zeros((q1 - q0, *q.shape[1:]), device=q.device, dtype=compute_dtype))
            continue
        pieces.append(attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, softmax_scale,
                                    compute_dtype=compute_dtype, out_dtype=compute_dtype)[0])
    return torch.cat(pieces).to(out_dtype or q.dtype)


def _spans(cu_seqlens):
    """[(start, end)] of each packed sequence, read on the host."""
    offsets = cu_seqlens.tolist()
    return list(zip(offsets[:-1], offsets[1:]))


def _check_float_dtype(name, dtype) -> None:
    if dtype not in REFERENCE_FLOATS:
        raise TypeError(f"{name} must be one of {', '.join(str(d) for d in REFERENCE_FLOATS)}, got {dtype!r}")


def attention_eager(q, k, v, causal=False, softmax_scale=None):
    """The 'eager' baseline: einsum + softmax in the input dtype, the full
    [B, H, T, S] score matrix materialised in GPU memory. Same layout,
    shapes, defaults and mask as `attention_ref`, for benchmarks only: causal
    needs T <= S here (a row that sees no key would be 0 / 0), and, as in any
    plain softmax-then-product, a NaN or inf in V reaches every row (0 · NaN
    is NaN).

    >>> q, k, v = (torch.randn(1, 64, 2, 32) for _ in "qkv")
    >>> o = attention_eager(q, k, v, causal=True)        # [1, 64, 2, 32]
    >>> (o - attention_ref(q, k, v, causal=True)).abs().max() < 1e-5
    """
    scale = check_attention_args(q, k, v, causal, softmax_scale)
    check_has_values(q=q, k=k, v=v)
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    if causal and T > S:
        raise ValueError(f"attention_eager: causal with T={T} > S={S} leaves rows that see no key; "
                         "use attention_ref, which defines their output as 0")
    if Hq != Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=2)
        v = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        s = s.masked_fill(~causal_mask(T, S, device=q.device), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v)


def online_softmax_steps(x: torch.Tensor, block: int):
    """The online softmax on one row of scores, a block at a time (the forward kernel's inner
    loop, without the V product). x: a 1-D float tensor of finite scores (any device), block: an
    int >= 1. Returns (steps, p): steps is a list of dicts with the block's scores, the running max
    m and running sum l after that block (l = sum exp(x_j - m) so far); p = exp(x - m) / l is the
    softmax computed from the final (m, l) alone.

    >>> x = torch.randn(12, dtype=torch.float64)
    >>> steps, p = online_softmax_steps(x, block=4)
    >>> torch.allclose(p, torch.softmax(x, 0))   # the block-wise result is the full softmax
    True
    """
    check_tensor("x", x, ndim=1, dtypes=REFERENCE_FLOATS)
    check_has_values(x=x)
    check_not_empty("x", x, "T")
    block = check_int("block", block, low=1)
    if not torch.isfinite(x).all():
        raise ValueError("x must hold finite scores (a row of -inf, NaN or inf has no softmax here)")
    m, l, steps = float("-inf"), 0.0, []
    for start in range(0, x.numel(), block):
        xb = x[start:start + block]
        m_new = max(m, xb.max().item())
        l = l * math.exp(m - m_new) + torch.exp(xb - m_new).sum().item()  # rescale the old sum
        m = m_new
        steps.append({"block": start // block, "scores": xb.tolist(), "m": m, "l": l})
    return steps, torch.exp(x - m) / l
