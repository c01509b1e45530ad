"""GLA references in plain PyTorch: the recurrence as written, one token at a time.

    S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_t^T        (S: [K, V], fp32)
    o_t = S_t^T (q_t * scale)

Also the input checks every GLA entry point shares (cheap: shapes, dtypes, devices
only; nothing that would synchronise with the GPU).
"""
from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def check_gla_inputs(q, k, v, gk, scale, initial_state):
    """Validate GLA inputs; return (B, T, H, K, V, scale). Raises TypeError / ValueError naming the problem."""
    for name, t in (("q", q), ("k", k), ("v", v), ("gk", gk)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, T, H, D], got shape {tuple(t.shape)}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if gk.shape != q.shape:
        raise ValueError(f"gk must have the shape of q {tuple(q.shape)}, got {tuple(gk.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V], got {tuple(v.shape)}")
    if T < 1 or B < 1 or H < 1:
        raise ValueError(f"empty input: q has shape {tuple(q.shape)}")
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"head dims K={K}, V={V} must be in [1, {MAX_HEAD_DIM}]")
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    dev = q.device
    if k.device != dev or v.device != dev or gk.device != dev:
        raise ValueError(f"q, k, v, gk must be on one device, got {q.device}, {k.device}, {v.device}, {gk.device}")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor):
            raise TypeError(f"initial_state must be a torch.Tensor or None, got {type(initial_state).__name__}")
        if initial_state.dtype != torch.float32:
            raise TypeError(f"initial_state must be float32 (the state is kept in fp32), got {initial_state.dtype}")
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        if initial_state.device != dev:
            raise ValueError(f"initial_state is on {initial_state.device}, inputs on {dev}")
    if scale is None:
        scale = K ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    return B, T, H, K, V, float(scale)


def naive_recurrent_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """GLA forward as a PyTorch loop over time, fp32 math (the book's reference).

    q, k, gk: [B, T, H, K]; v: [B, T, H, V]; gk = log of the per-channel decay (<= 0).
    scale defaults to K**-0.5. initial_state / final state: fp32 [B, H, K, V].
    Returns (o [B, T, H, V] in q's dtype, final_state fp32 or None).

        >>> q, k, gk = (torch.randn(1, 8, 2, 16) for _ in range(3)); gk = -gk.abs()
        >>> v = torch.randn(1, 8, 2, 16)
        >>> o, S = naive_recurrent_gla(q, k, v, gk, output_final_state=True)
    """
    B, T, H, K, V, scale = check_gla_inputs(q, k, v, gk, scale, initial_state)
    q, k, v, gk = (x.float() for x in (q, k, v, gk))
    S = torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device)
    if initial_state is not None:
        S = S + initial_state
    o = torch.empty(B, T, H, V, dtype=torch.float32, device=q.device)
    for t in range(T):
        # decay each key row of the state, then add the outer product k_t v_t^T
        S = gk[:, t, :, :, None].exp() * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o.to(v.dtype), (S if output_final_state else None)


def torch_gla_step(q, k, v, gk, state, scale=None):
    """One decode step in PyTorch ops (the 'PyTorch step' baseline), fp32 state.

    q, k, gk: [B, H, K]; v: [B, H, V]; state: fp32 [B, H, K, V]. Returns (o [B, H, V], new state).

        >>> S = torch.zeros(1, 2, 16, 16)
        >>> q, k, v, gk = torch.randn(4, 1, 2, 16).unbind(0)
        >>> o, S = torch_gla_step(q, k, v, -gk.abs(), S)
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = gk.float().exp().unsqueeze(-1) * state + k.float().unsqueeze(-1) * v.float().unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q.float() * scale, S)
    return o.to(v.dtype), S
