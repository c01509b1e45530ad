"""FlashAttention's maths in plain PyTorch: the yardstick every kernel in this chapter is tested against.

Layout [B, T, H, D] (sequence-major, as flash-attn uses). GQA: query head h reads KV head
h // (Hq // Hkv). Causal masks are bottom-right aligned (flash-attn >= 2.1): query i sees
key j iff j <= i + S - T; a query row that sees no key at all gets an output of 0.
"""
from __future__ import annotations

import math

import torch


def causal_mask(T: int, S: int, device=None) -> torch.Tensor:
    """Bool [T, S]: True where query i may see key j, i.e. j <= i + S - T (bottom-right aligned)."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j <= i + (S - T)


def attention_ref(q, k, v, causal=False, softmax_scale=None, *, compute_dtype=torch.float64, out_dtype=None):
    """Softmax attention written from the formula, O = softmax(Q Kᵀ · scale + mask) V.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D] with Hq a multiple of Hkv (MHA, GQA, MQA).
    The maths runs in `compute_dtype` (fp64 by default, fp32 for big GPU shapes); the result
    comes back in `out_dtype` (default: q's dtype). softmax_scale defaults to 1/sqrt(D).
    Differentiable (plain autograd), so it also gives the reference gradients.

    >>> q = torch.randn(1, 77, 4, 64); k = v = torch.randn(1, 77, 2, 64)
    >>> o = attention_ref(q, k, v, causal=True)          # [1, 77, 4, 64]
    >>> o.shape == q.shape
    True
    """
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    group = Hq // Hkv
    qc, kc, vc = (t.to(compute_dtype) for t in (q, k, v))
    # GQA: every KV head serves `group` consecutive query heads.
    kc = kc.repeat_interleave(group, dim=2)
    vc = vc.repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bshd->bhts", qc, kc) * scale  # [B, H, T, S]
    if causal:
        visible = causal_mask(T, S, device=q.device)
        any_visible = visible.any(dim=1)[:, None]  # [T, 1]: rows that see at least one key
        s = s.masked_fill(~visible, float("-inf"))
        s = s.masked_fill(~any_visible, 0.0)  # keep softmax finite on empty rows ...
        p = torch.softmax(s, dim=-1) * any_visible  # ... then zero them: output 0 there
    else:
        p = torch.softmax(s, dim=-1)
    o = torch.einsum("bhts,bshd->bthd", p, vc)
    return o.to(out_dtype or q.dtype)


def attention_eager(q, k, v, causal=False, softmax_scale=None):
    """The 'eager' baseline: einsum + softmax in the input dtype, the full [B, H, T, S] score matrix
    materialised in GPU memory. Same layout and mask as `attention_ref`; for benchmarks only."""
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    if Hq != Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=2)
        v = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        s = s.masked_fill(~causal_mask(T, S, device=q.device), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v)


def online_softmax_steps(x: torch.Tensor, block: int):
    """The online softmax on one row of scores, a block at a time (the forward kernel's inner
    loop, without the V product). Returns (steps, p): steps is a list of dicts with the block's
    scores, the running max m and running sum l after that block (l = sum exp(x_j - m) so far);
    p = exp(x - m) / l is the softmax computed from the final (m, l) alone.

    >>> steps, p = online_softmax_steps(torch.randn(12, dtype=torch.float64), block=4)
    >>> torch.allclose(p, torch.softmax(x, 0))   # the block-wise result is the full softmax
    """
    m, l, steps = float("-inf"), 0.0, []
    for start in range(0, x.numel(), block):
        xb = x[start:start + block]
        m_new = max(m, xb.max().item())
        l = l * math.exp(m - m_new) + torch.exp(xb - m_new).sum().item()  # rescale the old sum
        m = m_new
        steps.append({"block": start // block, "scores": xb.tolist(), "m": m, "l": l})
    return steps, torch.exp(x - m) / l
