"""The public entry point: input validation, then an autograd Function around the Triton kernels."""
from __future__ import annotations

import math
import numbers

import torch

from ..common import INTERPRET, ON_GPU, check_tensor
from .backward import attention_bwd
from .forward import attention_fwd

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _validate(q, k, v, causal, softmax_scale) -> float:
    """Raise TypeError/ValueError naming the problem; return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4, dtypes=SUPPORTED_DTYPES)
    if not (k.dtype == v.dtype == q.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (k.device == v.device == q.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if ON_GPU and not INTERPRET and q.device.type != "cuda":
        raise ValueError(f"q, k, v must be CUDA tensors on this machine, got {q.device}")
    if INTERPRET and q.device.type != "cpu":
        raise ValueError(f"under the Triton interpreter q, k, v must be CPU tensors, got {q.device}")
    if INTERPRET and q.dtype == torch.bfloat16:
        raise TypeError("bfloat16 needs a GPU: the Triton interpreter computes bf16 dots wrongly; use fp16 or fp32")
    B, T, HQ, D = q.shape
    Bk, S, HKV, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k and v must have the same shape [B, S, Hkv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B:
        raise ValueError(f"batch size mismatch: q has {B}, k/v have {Bk}")
    if Dk != D:
        raise ValueError(f"head dim mismatch: q has D={D}, k/v have D={Dk}")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim D={D} is not supported; supported: {SUPPORTED_HEAD_DIMS}")
    if HKV == 0 or HQ % HKV != 0:
        raise ValueError(f"number of query heads Hq={HQ} must be a multiple of KV heads Hkv={HKV}")
    if T == 0 or S == 0 or B == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    return float(softmax_scale)


class FlashAttnFunction(torch.autograd.Function):
    """Forward: Triton FlashAttention-2 (saves O and the fp32 log-sum-exp, not P).
    Backward: `attention_bwd` (one Triton kernel, launched once or twice), recomputing P."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the kernels derive strides from shapes
        o, lse = attention_fwd(q, k, v, causal, softmax_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.softmax_scale = causal, softmax_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.softmax_scale)
        return dq, dk, dv, None, None


def flash_attn_func(q, k, v, causal=False, softmax_scale=None):
    """FlashAttention-2 (Triton), GQA-aware, differentiable.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D], Hq a multiple of Hkv (MHA, GQA, MQA); query head h
    reads KV head h // (Hq // Hkv). D in (32, 64, 128, 256); fp16 or bf16 on a GPU, fp32 too (TF32
    dots on a GPU; exact under the interpreter). Any T, S >= 1. causal=True masks bottom-right
    aligned (flash-attn >= 2.1): query i sees key j iff j <= i + S - T; rows that see no key
    output 0. softmax_scale defaults to 1/sqrt(D). Returns o: [B, T, Hq, D] in q's dtype.
    Non-contiguous inputs (e.g. a transposed [B, H, T, D] view) are copied to contiguous first.

    >>> q = torch.randn(2, 1000, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    >>> k, v = (torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    >>> flash_attn_func(q, k, v, causal=True).sum().backward()   # q.grad: [2, 1000, 32, 128]
    """
    scale = _validate(q, k, v, causal, softmax_scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttnFunction.apply(q, k, v, causal, scale)
    # inference: skip autograd's bookkeeping (a few microseconds a call, which matter at short N)
    return attention_fwd(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)[0]
