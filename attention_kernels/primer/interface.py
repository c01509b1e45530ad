"""The primer's public functions: check the inputs (the shared checks, the machine rule
included), allocate the output, launch. The kernel files decide nothing.

    vector_add(x, y, block=1024)            x, y: [n] -> [n]
    softmax_rows(x)                         x: [rows, cols] -> softmax of each row
    attention_tile(q, k, v, softmax_scale)  q: [B, T, H, D]; k, v: [B, S, H, D], S <= 256 -> [B, T, H, D]
                                            (S <= 128 in float32)

Dtypes: float16, bfloat16 (on a GPU) and float32; the output has the input's dtype. On a GPU the
tensors are CUDA tensors; under the Triton interpreter, CPU tensors.
"""
from __future__ import annotations

import torch

from ..checks import (FLOATS, check_int, check_kernel_device, check_not_empty, check_same_device_and_dtype,
                      check_tensor, softmax_scale_or_default)
from ..custom_ops import compiled_as_op, like
from .attention_tile import MAX_HEAD_DIM, MAX_KEYS, attention_tile_fwd, max_keys
from .softmax import softmax_fwd
from .vector_add import add_fwd

MAX_ELEMENTS = 2**31 - 1   # offsets are 32-bit integers in the vector add
MAX_COLS = 2**15           # a row is one block in registers


@compiled_as_op("attention_kernels::vector_add", fake=like("x"))
def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x + y with the primer's Triton kernel.

    x, y: vectors [n] of one dtype (fp16, bf16 on a GPU, fp32), n >= 1; block: elements per
    program, a power of two from 16 to 65536 (default 1024). Returns a new vector [n].

        >>> x, y = torch.randn(2, 100_000, device="cuda").unbind(0)
        >>> out = vector_add(x, y)
        >>> torch.equal(out, x + y)   # True
    """
    check_tensor("x", x, ndim=1, dtypes=FLOATS)
    check_tensor("y", y, ndim=1, dtypes=FLOATS)
    check_same_device_and_dtype(x=x, y=y)
    check_kernel_device(x=x, y=y)
    check_tensor("y", y, shape=tuple(x.shape))
    check_not_empty("x", x, "n")
    if x.numel() > MAX_ELEMENTS:
        raise ValueError(f"x must have at most {MAX_ELEMENTS} elements (32-bit offsets), got {x.numel()}")
    check_int("block", block, low=16, high=65536)
    if block & (block - 1):
        raise ValueError(f"block must be a power of two (tl.arange needs one), got {block}")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    add_fwd(x, y, out, block)
    return out


@compiled_as_op("attention_kernels::softmax_rows", fake=like("x"))
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax of each row of a matrix, with the primer's Triton kernel (one program per row).

    x: [rows, cols] in fp16, bf16 (on a GPU) or fp32, 1 <= cols <= 32768. The maths is fp32; the
    result has x's dtype and shape. A row that holds a NaN, or only -inf, gives NaN, as torch.softmax.

        >>> x = torch.randn(4096, 1000, device="cuda", dtype=torch.bfloat16)
        >>> p = softmax_rows(x)
        >>> p.float().sum(-1)          # ones, to bf16 rounding
    """
    check_tensor("x", x, ndim=2, dtypes=FLOATS)
    check_kernel_device(x=x)
    check_not_empty("x", x, "rows, cols")
    if x.shape[1] > MAX_COLS:
        raise ValueError(f"x must have at most {MAX_COLS} columns (a row is one block), got {x.shape[1]}")
    x = x.contiguous()
    out = torch.empty_like(x)
    softmax_fwd(x, out)
    return out


@compiled_as_op("attention_kernels::attention_tile", fake=like("q"))
def attention_tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None):
    """softmax(q k^T * scale) v, no mask, with every key of a head in one tile (the primer's step 3).

    q: [B, T, H, D]; k, v: [B, S, H, D] with D <= 128 and S <= 256 (fp16, bf16 on a GPU) or S <= 128
    (fp32, whose dot products run as TF32 on a GPU); q, k, v of one dtype. scale defaults to
    D ** -0.5. Returns [B, T, H, D] in q's dtype. Longer key sequences need the online softmax:
    attention_kernels.flash_attn.flash_attn_func.

        >>> q = torch.randn(2, 1000, 8, 64, device="cuda", dtype=torch.float16)
        >>> k, v = torch.randn(2, 2, 200, 8, 64, device="cuda", dtype=torch.float16).unbind(0)
        >>> o = attention_tile(q, k, v)   # [2, 1000, 8, 64]
    """
    check_tensor("q", q, ndim=4, dtypes=FLOATS)
    check_tensor("k", k, ndim=4, dtypes=FLOATS)
    check_tensor("v", v, ndim=4, dtypes=FLOATS)
    check_same_device_and_dtype(q=q, k=k, v=v)
    check_kernel_device(q=q, k=k, v=v)
    B, T, H, D = q.shape
    check_tensor("k", k, shape=(B, None, H, D))
    check_tensor("v", v, shape=tuple(k.shape))
    check_not_empty("q", q, "B, T, H, D")
    check_not_empty("k", k, "B, S, H, D")
    S = k.shape[1]
    if S > max_keys(q.dtype):
        raise ValueError(f"k must have at most {max_keys(q.dtype)} keys (S) in {str(q.dtype)[6:]} to fit one tile, "
                         f"got {S}; longer sequences need the online softmax (attention_kernels.flash_attn)")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"q must have a head dim D of at most {MAX_HEAD_DIM}, got {D}")
    scale = softmax_scale_or_default(softmax_scale, D)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    attention_tile_fwd(q, k, v, out, scale)
    return out


__all__ = ["vector_add", "softmax_rows", "attention_tile", "MAX_ELEMENTS", "MAX_COLS", "MAX_KEYS", "MAX_HEAD_DIM",
           "max_keys"]
