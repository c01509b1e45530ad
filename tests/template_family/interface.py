"""The template family's public entry point: validate the inputs, allocate
what is returned, launch.

q, k: [B, T, H, K]; v: [B, T, H, V] (sequence-major, as in fla); one dtype
(fp16, bf16 on a GPU, fp32); K, V <= 256, any T >= 1. scale defaults to
K ** -0.5. initial_state: fp32 [B, H, K, V] or None (zeros).
"""
from __future__ import annotations

import torch

from ..linear.inputs import check_linear_inputs
from .fused_recurrent import fused_recurrent_fwd


def fused_recurrent_linear(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """Fused recurrent linear attention forward (Triton): one kernel walks
    the tokens with the state in registers; with T = 1 it is the decode step.
    Math and state in fp32.

    Returns (o [B, T, H, V] in v's dtype, final_state fp32 [B, H, K, V] when
    output_final_state, else None).

        >>> q, k, v = torch.randn(3, 1, 1, 32, 128, device="cuda").unbind(0)
        >>> S = torch.zeros(1, 32, 128, 128, device="cuda")
        >>> o, S = fused_recurrent_linear(q, k, v, initial_state=S,
        ...                               output_final_state=True)
    """
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {}, scale, initial_state, output_final_state)
    h0 = None if initial_state is None else initial_state.contiguous()
    o = torch.empty_like(v)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    fused_recurrent_fwd(q.contiguous(), k.contiguous(), v.contiguous(), o, scale, h0, ht)
    return o, ht
