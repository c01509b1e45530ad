"""Lightning Attention references in plain PyTorch: the recurrence as published, one token at a time,
the per-layer decay slopes, the Katharopoulos-style variant the source article shows, and the pieces
of the MiniMax-01 block around the attention.

    kv_t = λ_h kv_{t-1} + k_t v_t^T,   λ_h = exp(-s_h)      (kv: [K, V] per head)
    o_t  = kv_t^T (q_t · scale)                              (scale = 1: no 1/√d, no denominator)

They run on any device and take fp16, bf16, fp32 and fp64; the math is fp32, or fp64 when any
input is fp64 (then they serve as the high-precision reference).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import REFERENCE_FLOATS, check_int, check_tensor
from ..linear.inputs import check_linear_inputs


def _math_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def lightning_slopes(num_heads: int, layer_idx: int = 0, num_layers: int = 1) -> torch.Tensor:
    """MiniMax-01's decay slopes for one layer: s_h = base^(h+1) · factor, h
    = 0 … H-1, with base = 2^(-8/H) (ALiBi's geometric series) and factor = 1
    - l / (L - 1 + 1e-5) + 1e-5 (MiniMax's code; the 1e-5 in the denominator
    keeps L = 1 defined). The decay per step is exp(-s_h): the first layer
    forgets fastest, the last barely at all (its factor is about 1e-5).

    Returns fp32 [num_heads] on the CPU (move it with `.to(device)`).

        >>> s = lightning_slopes(32, layer_idx=0, num_layers=80)
        >>> s[0], s[-1]
        ...     # 2^(-1/4) ≈ 0.841 and 2^(-8) ≈ 0.0039 (times 1 + 1e-5)
        >>> torch.exp(-s)        # the per-head decay λ_h
    """
    H = check_int("num_heads", num_heads, low=1)
    L = check_int("num_layers", num_layers, low=1)
    layer = check_int("layer_idx", layer_idx, low=0, high=L - 1)
    base = 2.0 ** (-8.0 / H)
    factor = 1.0 - layer / (L - 1 + 1e-5) + 1e-5
    exponent = torch.arange(1, H + 1, dtype=torch.float64)
    return (base ** exponent * factor).to(torch.float32)


def naive_recurrent_lightning(q, k, v, slopes, scale=1.0, initial_state=None, output_final_state=False):
    """Lightning Attention forward as a PyTorch loop over time (the book's
    reference).

    q, k: [B, T, H, K]; v: [B, T, H, V]; slopes: [H], s_h >= 0 (the decay per
    step is exp(-s_h); 0 means no decay). scale: a float > 0, default 1.0
    (None also means 1.0). initial_state: [B, H, K, V] fp32 (or fp64), or
    None for zeros. Math in fp32 (fp64 if any input is fp64). Returns (o [B,
    T, H, V] in v's dtype, final state [B, H, K, V] in the math dtype, or
    None).

        >>> q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
        >>> o, S = naive_recurrent_lightning(q, k, v, lightning_slopes(2),
        ...                                  output_final_state=True)
        >>> S.shape              # torch.Size([1, 2, 16, 16])
    """
    scale = 1.0 if scale is None else scale
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"slopes": (slopes, "H")}, scale, initial_state,
                                               output_final_state, kernel=False)
    dt = _math_dtype(q, k, v, slopes, initial_state)
    q, k, v = (x.to(dt) for x in (q, k, v))
    lam = torch.exp(-slopes.to(dt))[None, :, None, None]          # [1, H, 1, 1]: one decay per head
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    if initial_state is not None:
        S = S + initial_state
    o = torch.empty(B, T, H, V, dtype=dt, device=q.device)
    for t in range(T):
        # decay the whole state of each head by λ_h, then add the outer
        # product k_t v_t^T
        S = lam * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o.to(v.dtype), (S if output_final_state else None)


def torch_lightning_step(q, k, v, slopes, state, scale=1.0):
    """One decode step in PyTorch ops (the 'PyTorch step' baseline).

    q, k: [B, H, K]; v: [B, H, V]; slopes: [H]; state: [B, H, K, V] fp32 (or fp64), not modified.
    scale defaults to 1.0. Math in fp32 (fp64 if any input is fp64).
    Returns (o [B, H, V] in v's dtype, the new state [B, H, K, V] in the math dtype).

        >>> S = torch.zeros(1, 2, 16, 16)
        >>> q, k, v = torch.randn(3, 1, 2, 16).unbind(0)
        >>> o, S = torch_lightning_step(q, k, v, lightning_slopes(2), S)
    """
    scale = 1.0 if scale is None else scale
    *_, scale = check_linear_inputs(q, k, v, {"slopes": (slopes, "H")}, scale, state,
                                    kernel=False, step=True, state_name="state")
    dt = _math_dtype(q, k, v, slopes, state)
    lam = torch.exp(-slopes.to(dt))[None, :, None, None]
    S = lam * state + k.to(dt).unsqueeze(-1) * v.to(dt).unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q.to(dt) * scale, S)
    return o.to(v.dtype), S


# ------------------------------------------------------------------ the source article's variant
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = ELU(x) + 1: positive everywhere, so a sum of φ(q)·φ(k) never vanishes."""
    return F.elu(x) + 1.0


def naive_recurrent_elu_linear(q, k, v, eps=1e-6, initial_state=None, output_final_state=False):
    """Katharopoulos et al.'s causal linear attention with the ELU+1 feature
    map, correctly normalised:

        S_t = S_{t-1} + φ(k_t) v_t^T,   z_t = z_{t-1} + φ(k_t),
        o_t = φ(q_t)^T S_t / (φ(q_t)·z_t + eps)

    (no decay; the denominator is the sum of the positive weights
    φ(q_t)·φ(k_j), j <= t, so each o_t is a weighted mean of the values
    seen). This is the source article's "Lightning" step, which instead
    divides by the L2 norm of o_t + eps: that is neither this normalisation
    nor Lightning.

    q, k: [B, T, H, K]; v: [B, T, H, V]; eps: a float > 0. initial_state:
    None, or a pair (S [B, H, K, V], z [B, H, K]) in fp32/fp64. Math in fp32
    (fp64 if any input is fp64). Returns (o [B, T, H, V] in v's dtype, (S, z)
    or None).

        >>> q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
        >>> o, (S, z) = naive_recurrent_elu_linear(q, k, v,
        ...                                        output_final_state=True)
        >>> z.min() > 0          # tensor(True): every weight is positive
    """
    S0, z0 = (None, None) if initial_state is None else initial_state
    B, T, H, K, V, _ = check_linear_inputs(q, k, v, {}, 1.0, S0, output_final_state, kernel=False)
    if z0 is not None or S0 is not None:
        check_tensor("initial_state[1] (z)", z0, ndim=3, dtypes=REFERENCE_FLOATS, shape=(B, H, K))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a float > 0, got {eps!r}")
    dt = _math_dtype(q, k, v, S0)
    fq, fk, v = elu_feature_map(q.to(dt)), elu_feature_map(k.to(dt)), v.to(dt)
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device) if S0 is None else S0.to(dt).clone()
    z = torch.zeros(B, H, K, dtype=dt, device=q.device) if z0 is None else z0.to(dt).clone()
    o = torch.empty(B, T, H, V, dtype=dt, device=q.device)
    for t in range(T):
        S = S + fk[:, t, :, :, None] * v[:, t, :, None, :]
        z = z + fk[:, t]
        num = torch.einsum("bhk,bhkv->bhv", fq[:, t], S)
        den = (fq[:, t] * z).sum(-1, keepdim=True) + eps
        o[:, t] = num / den
    return o.to(v.dtype), ((S, z) if output_final_state else None)


def article_lightning_step(q_t, k_t, v_t, kv_state, eps=1e-6):
    """The source article's step, kept only to show what it computes (not Lightning Attention).

    q_t, k_t, v_t: [B, H, D]; kv_state: [B, H, D, D]. ELU+1 on q and k, no decay, and the output
    divided by ‖o_t + eps‖ + eps: eps is added to every element before the norm (it shifts the
    vector), and a per-head L2 norm is √D smaller than an RMSNorm. Returns (o_t, new state).
    """
    fq, fk = elu_feature_map(q_t), elu_feature_map(k_t)
    kv_state = kv_state + fk.unsqueeze(-1) * v_t.unsqueeze(-2)
    o_t = torch.einsum("bhi,bhij->bhj", fq, kv_state)
    return o_t / ((o_t + eps).norm(dim=-1, keepdim=True) + eps), kv_state


# ------------------------------------------------------------------ the MiniMax-01 block around it
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x²) + eps) · weight, in fp32, returned in x's dtype."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(y.dtype)
    return y.to(x.dtype)


def minimax_lightning_block(x, w_qkv, w_gate, w_out, norm_weight, slopes, attention=None, eps=1e-6):
    """MiniMax-01's Lightning Attention layer around the kernel, in plain
    PyTorch:

        q, k, v = SiLU(x W_qkv)               (split into H heads of D)
        o = Lightning(q, k, v, slopes)        (scale 1)
        o = RMSNorm(o over all H·D channels) · sigmoid(x W_gate)
        y = o W_out

    x: [B, T, C]; w_qkv: [C, 3·H·D]; w_gate: [C, H·D]; w_out: [H·D, C];
    norm_weight: [H·D];
    slopes: [H]. attention: f(q, k, v, slopes) -> (o, _), default
    `naive_recurrent_lightning` (pass `chunk_lightning` to run the kernel).
    Returns y [B, T, C].

        >>> C, H, D = 64, 4, 16
        >>> x = torch.randn(1, 10, C)
        >>> y = minimax_lightning_block(x, torch.randn(C, 3 * H * D) / 8,
        ...                             torch.randn(C, H * D) / 8,
        ...                             torch.randn(H * D, C) / 8,
        ...                             torch.ones(H * D),
        ...                             lightning_slopes(H))
    """
    H = slopes.shape[0]
    B, T, C = x.shape
    qkv = F.silu(x @ w_qkv)
    D = qkv.shape[-1] // (3 * H)
    q, k, v = qkv.view(B, T, 3, H, D).unbind(2)
    attention = naive_recurrent_lightning if attention is None else attention
    o, _ = attention(q.contiguous(), k.contiguous(), v.contiguous(), slopes)
    o = rms_norm(o.reshape(B, T, H * D), norm_weight, eps)       # one norm over all heads, not per head
    o = o * torch.sigmoid(x @ w_gate)
    return o @ w_out
