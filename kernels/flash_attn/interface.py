"""The public entry point: input validation, the choice of backward launch, and an autograd Function
around the Triton kernels."""
from __future__ import annotations

import torch

from ..checks import FLOATS, check_choice, check_kernel_device
from ..custom_ops import attention_bwd_fake, attention_fwd_fake, compiled_as_op
from .backward import attention_bwd
from .forward import attention_fwd
from .reference import attention_flops, check_attention_args

# registered one level down, so that a compiled backward is FlashAttnFunction.backward, as in eager
attention_fwd = compiled_as_op("kernels::attention_fwd", fake=attention_fwd_fake)(attention_fwd)
attention_bwd = compiled_as_op("kernels::attention_bwd", fake=attention_bwd_fake)(attention_bwd)

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_DTYPES = FLOATS

# The backward runs as one launch instead of two below this many FLOPs (`attention_flops`). On the
# H200 that is causal T = 1K at B = 1, H = 32, D = 128 (21 GFLOP, about 0.12 ms of GPU work, as much as
# the host needs for a Python autograd backward). One launch there measured 0.121 ms against 0.209 ms
# for two; at every larger size measured, two launches were faster (re-reading O costs 2-6 %).
ONE_LAUNCH_MAX_FLOPS = 32e9


def _validate(q, k, v, causal, softmax_scale) -> float:
    """Raise TypeError/ValueError naming the argument; return the softmax scale to use."""
    scale = check_attention_args(q, k, v, causal, softmax_scale, dtypes=SUPPORTED_DTYPES)
    check_kernel_device(q=q, k=k, v=v)
    check_choice("head dim D of q, k, v", q.shape[-1], SUPPORTED_HEAD_DIMS)
    return scale


def _one_launch(q, k, causal: bool) -> bool:
    """Whether the backward is small enough to run as one launch (see ONE_LAUNCH_MAX_FLOPS)."""
    B, T, HQ, D = q.shape
    return attention_flops(B, HQ, T, k.shape[1], D, causal, backward=True) < ONE_LAUNCH_MAX_FLOPS


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
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.softmax_scale,
                                   _one_launch(q, k, ctx.causal))
        return dq, dk, dv, None, None


def flash_attn_func(q, k, v, causal=False, softmax_scale=None):
    """FlashAttention-2 (Triton), GQA-aware, differentiable.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D], Hq a multiple of Hkv (MHA, GQA, MQA); query head h
    reads KV head h // (Hq // Hkv). D in (32, 64, 128, 256); fp16 or bf16 on a GPU, fp32 too (TF32
    dots on a GPU; exact under the interpreter, which takes CPU tensors and no bf16). Every size
    >= 1. causal=True masks bottom-right aligned (flash-attn >= 2.1): query i sees key j iff
    j <= i + S - T; rows that see no key output 0, and a NaN or inf at a key a row cannot see does
    not reach that row. softmax_scale defaults to 1/sqrt(D). Returns o: [B, T, Hq, D] in q's dtype.
    Non-contiguous inputs (e.g. a transposed [B, H, T, D] view) are copied to contiguous first.

    >>> q = torch.randn(2, 1000, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    >>> k, v = (torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    >>> flash_attn_func(q, k, v, causal=True).sum().backward()   # q.grad: [2, 1000, 32, 128]
    """
    scale = _validate(q, k, v, causal, softmax_scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttnFunction.apply(q, k, v, causal, scale)
    # inference: skip autograd's bookkeeping (a few microseconds a call, which matter at short T)
    return attention_fwd(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)[0]
