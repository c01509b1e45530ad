"""GLA references in plain PyTorch: the recurrence as written, one token at a time.

    S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_t^T        (S: [K, V])
    o_t = S_t^T (q_t * scale)

They run on any device and take fp16, bf16, fp32 and fp64; the math is fp32, or fp64 when any
input is fp64 (then they serve as the high-precision reference).
"""
from __future__ import annotations

import torch

from ..linear.inputs import check_linear_inputs


def _math_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def naive_recurrent_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """GLA forward as a PyTorch loop over time (the book's reference).

    q, k, gk: [B, T, H, K]; v: [B, T, H, V]; gk = log of the per-channel
    decay (<= 0; -inf resets the channel). scale defaults to K**-0.5.
    initial_state: [B, H, K, V] fp32 (or fp64), or None for zeros. Math in
    fp32 (fp64 if any input is fp64). Returns (o [B, T, H, V] in v's dtype,
    final state [B, H, K, V] in the math dtype, or None).

        >>> q, k, gk = (torch.randn(1, 8, 2, 16) for _ in range(3))
        >>> gk = -gk.abs()
        >>> v = torch.randn(1, 8, 2, 16)
        >>> o, S = naive_recurrent_gla(q, k, v, gk, output_final_state=True)
    """
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B T H K")}, scale, initial_state,
                                               output_final_state, kernel=False)
    dt = _math_dtype(q, k, v, gk, initial_state)
    q, k, v, gk = (x.to(dt) for x in (q, k, v, gk))
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    if initial_state is not None:
        S = S + initial_state
    o = torch.empty(B, T, H, V, dtype=dt, device=q.device)
    for t in range(T):
        # decay each key row of the state, then add the outer product k_t
        # v_t^T
        S = gk[:, t, :, :, None].exp() * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o.to(v.dtype), (S if output_final_state else None)


def torch_gla_step(q, k, v, gk, state, scale=None):
    """One decode step in PyTorch ops (the 'PyTorch step' baseline).

    q, k, gk: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] fp32 (or fp64), not modified.
    scale defaults to K**-0.5. Math in fp32 (fp64 if any input is fp64).
    Returns (o [B, H, V] in v's dtype, the new state [B, H, K, V] in the math dtype).

        >>> S = torch.zeros(1, 2, 16, 16)
        >>> q, k, v, gk = torch.randn(4, 1, 2, 16).unbind(0)
        >>> o, S = torch_gla_step(q, k, v, -gk.abs(), S)
    """
    *_, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B H K")}, scale, state,
                                    kernel=False, step=True, state_name="state")
    dt = _math_dtype(q, k, v, gk, state)
    S = gk.to(dt).exp().unsqueeze(-1) * state + k.to(dt).unsqueeze(-1) * v.to(dt).unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q.to(dt) * scale, S)
    return o.to(v.dtype), S
