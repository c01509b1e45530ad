"""What the dense and the packed FlashAttention tests of return_lse share: the fp64 log-sum-exp from the formula,
and the checks every returned LSE passes.

    >>> o, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    >>> check_returned_lse(o, lse, (B, HQ, T), flash_attn_func(q, k, v, causal=True))
"""
from __future__ import annotations

import math

import torch

from attention_kernels.flash_attn import causal_mask


def lse_reference(q, k, causal):
    """log sum_j exp(s_ij * scale) per (batch, head, row), natural log, in fp64: q [B, T, Hq, D],
    k [B, S, Hkv, D] -> [B, Hq, T] (-inf where a row sees no key; the kernels say +inf)."""
    HQ, D = q.shape[2], q.shape[3]
    kk = k.double().repeat_interleave(HQ // k.shape[2], dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.double(), kk) * D ** -0.5
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1], device=q.device), -math.inf)
    return torch.logsumexp(s, dim=-1)


def check_returned_lse(o, lse, shape, o_without_lse) -> None:
    """The LSE a call returned beside o: `shape`, fp32, taking no gradient; and o is, bit for bit, the same call's
    output without return_lse (`o_without_lse`)."""
    assert lse.shape == shape and lse.dtype == torch.float32 and not lse.requires_grad
    assert torch.equal(o, o_without_lse)
