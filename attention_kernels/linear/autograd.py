"""The autograd Function of the chunk forms that take q, k, v and one gate (GLA's gk, Lightning's fixed log
decay): the forward op saves its inputs and whatever its family keeps for the backward (GLA's scores A,
Lightning nothing), and the backward op recomputes the rest from them. Both are ops of their own
(`attention_kernels.custom_ops.compiled_as_op`), so torch.compile traces the Function and finds each as one node,
forward and backward alike.

    >>> ChunkGLAFunction = chunk_function("ChunkGLAFunction", _chunk_gla_fwd_keeping_scores, _chunk_gla_bwd,
    ...                                   kept=("A",))
    >>> o, ht = ChunkGLAFunction.apply(q, k, v, gk, scale, h0, output_final_state, cu_seqlens)
"""
from __future__ import annotations

from typing import Callable

import torch


def chunk_function(name: str, forward: Callable, backward: Callable,
                   kept: tuple[str, ...] = ()) -> type[torch.autograd.Function]:
    """A `torch.autograd.Function` called `name`, applied as (q, k, v, gate, scale, h0, output_final_state,
    cu_seqlens) and returning (o, final_state or None).

    forward: the same arguments, returns (o, *kept tensors, final_state or None): the tensors named in `kept`,
    which the backward takes instead of recomputing them, sit between o and the final state (last, since an
    op's result may end in None only: `custom_ops.compiled_as_op`). backward: (q, k, v, gate, scale, h0, do,
    dht, cu_seqlens, *kept tensors), do as o's dtype and dht fp32 (or None), both contiguous; returns the
    gradients of q, k, v, then of the gate where it has one (a fixed decay has none), then of h0 (or None).
    Apply it only where a gradient is needed (the families call their forward op directly otherwise), so that
    what it keeps never outlives an inference call."""

    class ChunkFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, gate, scale, h0, output_final_state, cu_seqlens):
            o, *kept_tensors, ht = forward(q, k, v, gate, scale, h0, output_final_state, cu_seqlens)
            ctx.save_for_backward(q, k, v, gate, h0, cu_seqlens, *kept_tensors)
            ctx.scale = scale
            ctx.set_materialize_grads(False)
            return o, ht

        @staticmethod
        def backward(ctx, do, dht):
            q, k, v, gate, h0, cu_seqlens, *kept_tensors = ctx.saved_tensors
            do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
            dht = None if dht is None else dht.to(torch.float32).contiguous()
            dq, dk, dv, *dgate, dh0 = backward(q, k, v, gate, ctx.scale, h0, do, dht, cu_seqlens, *kept_tensors)
            return dq, dk, dv, (dgate[0] if dgate else None), None, dh0, None, None

    ChunkFunction.__name__ = ChunkFunction.__qualname__ = name
    saved = "the inputs and " + ", ".join(kept) if kept else "the inputs only"
    ChunkFunction.__doc__ = (f"Forward: `{forward.__name__}`, saving {saved}. Backward: `{backward.__name__}`,"
                             " which recomputes the rest from them.")
    return ChunkFunction


__all__ = ["chunk_function"]
