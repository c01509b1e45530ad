"""The primer's three operations in plain PyTorch, written to be read: the kernels and the tests
compare against these.

    add_ref(x, y)                     x + y, elementwise
    softmax_naive(x)                  exp(x) / sum exp(x) along each row, as the formula reads
    softmax_ref(x)                    the same after subtracting each row's maximum, in float64
    attention_tile_ref(q, k, v)       softmax(q k^T * scale) v per (batch, head), in float64

    >>> x = torch.randn(4, 100)
    >>> torch.allclose(softmax_ref(x), torch.softmax(x.double(), -1))   # True
"""
from __future__ import annotations

import torch

from ..checks import (REFERENCE_FLOATS, check_has_values, check_not_empty, check_same_device, check_tensor,
                      softmax_scale_or_default)


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two vectors of one length, in their dtype."""
    check_tensor("x", x, ndim=1, dtypes=REFERENCE_FLOATS)
    check_tensor("y", y, ndim=1, dtypes=REFERENCE_FLOATS, shape=tuple(x.shape))
    check_same_device(x=x, y=y)
    check_has_values(x=x, y=y)
    return x + y


def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """Row softmax straight from the formula, in x's dtype. exp overflows
    once an entry passes ~88.7 in float32 (~11.1 in float16): the row then
    reads inf / inf = NaN."""
    check_tensor("x", x, ndim=2, dtypes=REFERENCE_FLOATS)
    check_has_values(x=x)
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of a [rows, cols] matrix in float64, each row shifted by
    its maximum first (the result is the same; no exp of a positive number
    can overflow)."""
    check_tensor("x", x, ndim=2, dtypes=REFERENCE_FLOATS)
    check_has_values(x=x)
    x = x.double()
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def attention_tile_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None):
    """softmax(q k^T * scale) v for every (batch, head), in float64, no mask.

    q: [B, T, H, D]; k, v: [B, S, H, D] (the book's sequence-major layout);
    scale defaults to D ** -0.5. Returns float64 [B, T, H, D].
    """
    check_tensor("q", q, ndim=4, dtypes=REFERENCE_FLOATS)
    B, T, H, D = q.shape
    check_tensor("k", k, ndim=4, dtypes=REFERENCE_FLOATS, shape=(B, None, H, D))
    check_tensor("v", v, ndim=4, dtypes=REFERENCE_FLOATS, shape=tuple(k.shape))
    check_same_device(q=q, k=k, v=v)
    check_has_values(q=q, k=k, v=v)
    check_not_empty("q", q, "B, T, H, D")
    check_not_empty("k", k, "B, S, H, D")
    scale = softmax_scale_or_default(softmax_scale, D)
    s = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) * scale
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhts,bshd->bthd", p, v.double())


__all__ = ["add_ref", "softmax_naive", "softmax_ref", "attention_tile_ref"]
