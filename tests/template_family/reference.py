"""The template family's reference in plain PyTorch: the recurrence as
published, one token at a time.

    S_t = S_{t-1} + k_t v_t^T        (S: [K, V] per head)
    o_t = S_t^T (q_t · scale)

It runs on any device and takes fp16, bf16, fp32 and fp64; the math is fp32,
or fp64 when any input is fp64 (then it serves as the high-precision
reference).
"""
from __future__ import annotations

import torch

from ..linear.inputs import check_linear_inputs


def linear_attention_ref(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """Plain linear attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; one float dtype. scale defaults to
    K ** -0.5. initial_state: [B, H, K, V] fp32 (or fp64) or None (zeros).
    Returns (o [B, T, H, V] in v's dtype, the final state [B, H, K, V] in the
    math dtype when output_final_state, else None).

        >>> q, k, v = torch.randn(3, 1, 8, 2, 16).unbind(0)
        >>> o, S = linear_attention_ref(q, k, v, output_final_state=True)
        >>> o.shape, S.shape
        (torch.Size([1, 8, 2, 16]), torch.Size([1, 2, 16, 16]))
    """
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {}, scale, initial_state, output_final_state,
                                               kernel=False)
    dtype = torch.float64 if torch.float64 in (q.dtype, getattr(initial_state, "dtype", None)) else torch.float32
    S = (torch.zeros(B, H, K, V, dtype=dtype, device=q.device) if initial_state is None
         else initial_state.to(dtype).clone())
    o = torch.empty(B, T, H, V, dtype=dtype, device=q.device)
    for t in range(T):
        S = S + k[:, t, :, :, None].to(dtype) * v[:, t, :, None, :].to(dtype)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t].to(dtype) * scale, S)
    return o.to(v.dtype), (S if output_final_state else None)
