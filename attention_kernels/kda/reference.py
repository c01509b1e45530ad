"""KDA references in plain PyTorch: the gated delta rule as published, one token at a time.

    S_t = (I - β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t-1} + β_t k_t v_tᵀ      (S: [K, V] per head)
    o_t = S_tᵀ (q_t · scale)

computed as the step the kernels take: decay, predict, correct by the error, read out,

    S ← Diag(e^{g_t}) S;   u = v_t - Sᵀ k_t;   S ← S + β_t k_t uᵀ;   o_t = Sᵀ (q_t · scale).

g is the log decay per key channel (<= 0), β one number per token and head in [0, 1]. With
use_qk_l2norm_in_kernel, q and k are first divided by their L2 norm (q / sqrt(Σ q² + 1e-6)), as the
model does before calling the kernel. They run on any device and take fp16, bf16, fp32 and fp64; the
math is fp32, or fp64 when any input is fp64 (then they serve as the high-precision reference).
"""
from __future__ import annotations

import torch

from ..checks import check_bool
from ..linear.inputs import check_linear_inputs

L2NORM_EPS = 1e-6  # inside the square root, as fla's l2norm


def _math_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def l2_normalize(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(Σ x² + eps) over the last axis, in x's dtype (the math in fp32, or fp64)."""
    xf = x if x.dtype == torch.float64 else x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def _gates(g, beta, step):
    return {"g": (g, "B H K" if step else "B T H K"), "beta": (beta, "B H" if step else "B T H")}


def naive_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False):
    """KDA forward as a PyTorch loop over time (the book's reference).

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]. g = log of the
    per-channel decay (<= 0), beta in [0, 1]. scale defaults to K**-0.5.
    initial_state: [B, H, K, V] fp32 (or fp64), or None for zeros. Math in
    fp32 (fp64 if any input is fp64). Returns (o [B, T, H, V] in v's dtype,
    final state [B, H, K, V] in the math dtype, or None).

        >>> q, k, v, g = (torch.randn(1, 8, 2, 16) for _ in range(4))
        >>> beta = torch.rand(1, 8, 2)
        >>> o, S = naive_recurrent_kda(q, k, v, -g.abs(), beta,
        ...                            output_final_state=True,
        ...                            use_qk_l2norm_in_kernel=True)
    """
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, _gates(g, beta, False), scale, initial_state,
                                               output_final_state, kernel=False)
    check_bool("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    dt = _math_dtype(q, k, v, g, beta, initial_state)
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    if initial_state is not None:
        S = S + initial_state
    o = torch.empty(B, T, H, V, dtype=dt, device=q.device)
    for t in range(T):
        k_t = k[:, t]
        S = g[:, t, :, :, None].exp() * S                               # forget, per key channel
        u = v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S)             # what the state misses for k_t
        S = S + beta[:, t, :, None, None] * k_t[..., None] * u[..., None, :]   # write β of the error
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o.to(v.dtype), (S if output_final_state else None)


def torch_kda_step(q, k, v, g, beta, state, scale=None, use_qk_l2norm_in_kernel=False):
    """One decode step in PyTorch ops (the 'PyTorch step' baseline).

    q, k, g: [B, H, K]; v: [B, H, V]; beta: [B, H]; state: [B, H, K, V] fp32 (or fp64), not
    modified. scale defaults to K**-0.5. Math in fp32 (fp64 if any input is fp64).
    Returns (o [B, H, V] in v's dtype, the new state [B, H, K, V] in the math dtype).

        >>> S = torch.zeros(1, 2, 16, 16)
        >>> q, k, v, g = torch.randn(4, 1, 2, 16).unbind(0)
        >>> o, S = torch_kda_step(q, k, v, -g.abs(), torch.rand(1, 2), S, use_qk_l2norm_in_kernel=True)
    """
    *_, scale = check_linear_inputs(q, k, v, _gates(g, beta, True), scale, state,
                                    kernel=False, step=True, state_name="state")
    check_bool("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    dt = _math_dtype(q, k, v, g, beta, state)
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    S = g.exp().unsqueeze(-1) * state
    u = v - torch.einsum("bhk,bhkv->bhv", k, S)
    S = S + (beta[..., None] * k).unsqueeze(-1) * u.unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q * scale, S)
    return o.to(v.dtype), S


__all__ = ["naive_recurrent_kda", "torch_kda_step", "l2_normalize", "L2NORM_EPS"]
