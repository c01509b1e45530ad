"""Mamba-2 references in plain PyTorch: the step as published (MATH.md, Mamba-2), the same step in
the form mamba_ssm calls it (the state updated in place), a step-by-step loop over a whole prompt,
the chunked (SSD) form in PyTorch, the layer's gated RMSNorm, and Mamba-1's step, the predecessor.

Per head h, with A_h < 0 a scalar (the caller's A = -exp(A_log)):

    dt  = softplus(dt + dt_bias)                 (when dt_softplus; dt_bias optional)
    h_t = exp(dt · A_h) · h_{t-1} + dt · x_t ⊗ B_t    ([headdim, dstate] per head)
    y_t = h_t · C_t + D · x_t,  then  y_t ⊙ silu(z_t)   (D and z optional)

B and C belong to a group of heads (ngroups divides nheads). Math in fp32, or fp64 when any input is
fp64 (then the functions are the high-precision references the tests use).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import check_norm_inputs, check_scan_inputs, check_step_inputs


def _math_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _per_head(t, H):
    """B or C [..., G, N] -> [..., H, N]: head h reads its group h // (H / G)."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def mamba2_step(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """One Mamba-2 step, a pure function: returns (y [b, H, P] in x's dtype,
    the new state in the math dtype). state [b, H, P, N]; x, dt, z [b, H, P];
    A [H, P, N] (mamba_ssm's decode layout: a Mamba-2 model passes one scalar
    per head, broadcast); B, C [b, G, N]; D, dt_bias [H, P].

        >>> y, h = mamba2_step(torch.zeros(1, 2, 4, 8), x, dt, A, B, C,
        ...                    dt_softplus=True)
    """
    check_step_inputs(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, kernel=False, writes_state=False)
    md = _math_dtype(state, x, dt, A, B, C, D, z, dt_bias)
    H = x.shape[1]
    dt = dt.to(md) + (0 if dt_bias is None else dt_bias.to(md))
    if dt_softplus:
        dt = F.softplus(dt)
    Bh, Ch = (_per_head(t.to(md), H) for t in (B, C))                     # [b, H, N]
    decay = torch.exp(dt[..., None] * A.to(md))                            # [b, H, P, N]
    h = decay * state.to(md) + (dt * x.to(md))[..., None] * Bh[:, :, None, :]
    y = (h * Ch[:, :, None, :]).sum(-1)
    if D is not None:
        y = y + D.to(md) * x.to(md)
    if z is not None:
        y = y * F.silu(z.to(md))
    return y.to(x.dtype), h


def selective_state_update_ref(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None):
    """The step as mamba_ssm's `selective_state_update` calls it: the state (row
    state_batch_indices[i] for batch row i, when given) is updated in place; returns y [b, H, P]."""
    check_step_inputs(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, kernel=False)
    rows = torch.arange(x.shape[0], device=x.device) if state_batch_indices is None else state_batch_indices.long()
    y, h = mamba2_step(state[rows], x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state[rows] = h.to(state.dtype)
    return y


def ssd_scan_ref(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                 initial_states=None, return_final_states=False):
    """The SSD layer as a loop over tokens, one Mamba-2 step each (the scan's reference).

    x, z [Bt, T, H, P]; dt [Bt, T, H]; A [H]; B, C [Bt, T, G, N]; D [H, P] or [H]; dt_bias [H];
    initial_states [Bt, H, P, N]. chunk_size is accepted and unused (the loop has no chunks).
    Returns y [Bt, T, H, P] in x's dtype, or (y, final_states) in the math dtype.
    """
    Bt, T, H, P, N, G = check_scan_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus,
                                          initial_states, return_final_states, kernel=False)
    md = _math_dtype(x, dt, A, B, C, D, z, dt_bias, initial_states)
    h = torch.zeros(Bt, H, P, N, dtype=md, device=x.device) if initial_states is None else initial_states.to(md)
    Ahpn = A.to(md)[:, None, None].expand(H, P, N)                       # one scalar per head, broadcast
    Dhp = None if D is None else (D.to(md) if D.dim() == 2 else D.to(md)[:, None].expand(H, P))
    bias = None if dt_bias is None else dt_bias.to(md)[:, None].expand(H, P)
    y = torch.empty(Bt, T, H, P, dtype=md, device=x.device)
    for t in range(T):
        y[:, t], h = mamba2_step(h, x[:, t].to(md), dt[:, t, :, None].to(md).expand(Bt, H, P), Ahpn, B[:, t].to(md),
                                 C[:, t].to(md), Dhp, None if z is None else z[:, t].to(md), bias, dt_softplus)
    y = y.to(x.dtype)
    return (y, h) if return_final_states else y


def segsum(a):
    """segsum(a)[..., i, j] = a[..., j+1] + … + a[..., i] for j <= i, -inf above the diagonal:
    exp(segsum) is the 1-semiseparable decay mask L of SSD."""
    T = a.shape[-1]
    a = a[..., None].expand(*a.shape, T)
    below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    s = torch.cumsum(a.masked_fill(~below, 0), dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device)), float("-inf"))


def ssd_chunked_torch(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                      initial_states=None, return_final_states=False):
    """The SSD chunk form in PyTorch ops, after the paper's minimal listing (Dao & Gu 2024, §7): the
    intra-chunk (L ∘ C Bᵀ) X, the chunk states, the recurrence between chunks, the state-to-output
    term. Arguments and returns as ssd_scan_ref; any chunk_size >= 1 and any T (padded to chunks)."""
    Bt, T, H, P, N, G = check_scan_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus,
                                          initial_states, return_final_states, kernel=False)
    md = _math_dtype(x, dt, A, B, C, D, z, dt_bias, initial_states)
    L = chunk_size
    dtv = dt.to(md) + (0 if dt_bias is None else dt_bias.to(md))
    if dt_softplus:
        dtv = F.softplus(dtv)
    pad = (-T) % L
    xs = F.pad(x.to(md) * dtv[..., None], (0, 0, 0, 0, 0, pad))            # X = x · dt
    a = F.pad(dtv * A.to(md), (0, 0, 0, pad))                              # the log decay per token
    Bh, Ch = (F.pad(_per_head(t.to(md), H), (0, 0, 0, 0, 0, pad)) for t in (B, C))
    c = (T + pad) // L
    xs, Bh, Ch = (t.reshape(Bt, c, L, H, -1) for t in (xs, Bh, Ch))
    a = a.reshape(Bt, c, L, H).permute(0, 3, 1, 2)                         # [Bt, H, c, L]
    a_cum = torch.cumsum(a, dim=-1)
    Lmask = torch.exp(segsum(a))                                           # [Bt, H, c, L, L]
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Ch, Bh, Lmask, xs)
    to_end = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, to_end, xs)       # each chunk's contribution
    h0 = torch.zeros(Bt, 1, H, P, N, dtype=md, device=x.device) if initial_states is None \
        else initial_states.to(md)[:, None]
    states = torch.cat([h0, states], dim=1)
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))         # [Bt, H, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    states, final = states[:, :-1], states[:, -1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(Bt, c * L, H, P)[:, :T]
    if D is not None:
        y = y + x.to(md) * (D.to(md) if D.dim() == 2 else D.to(md)[:, None])
    if z is not None:
        y = y * F.silu(z.to(md))
    y = y.to(x.dtype)
    return (y, final) if return_final_states else y


def rmsnorm_ref(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """A Mamba-2 layer's output norm in PyTorch, mamba_ssm's gated RMSNorm (`rmsnorm_fn`'s reference): each
    group of group_size channels (None: the whole row) divided by its root mean square, times weight, plus bias.
    norm_before_gate=False (a Mamba-2 layer's call): g = x · silu(z) is normalised; True: the normalised x is
    multiplied by silu(z) after. x, z [..., N]; weight, bias [N]. Returns out in x's shape and dtype.

        >>> out = rmsnorm_ref(y, weight, None, z=z, eps=1e-5, group_size=y.shape[-1], norm_before_gate=False)
    """
    _, N, size = check_norm_inputs(x, weight, bias, z, eps, group_size, norm_before_gate, kernel=False)
    md = _math_dtype(x, weight, bias, z)
    v = x.to(md)
    gate = None if z is None else F.silu(z.to(md))
    if gate is not None and not norm_before_gate:
        v = v * gate
    groups = v.unflatten(-1, (N // size, size))
    out = (groups * torch.rsqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2) * weight.to(md)
    if bias is not None:
        out = out + bias.to(md)
    if gate is not None and norm_before_gate:
        out = out * gate
    return out.to(x.dtype)


def mamba1_step(state, x, dt, A, B, C):
    """Mamba-1's selective step, the predecessor (Gu & Dao 2023): A is [D,
    N], one value per (channel, state), so the decay exp(dt·A) is a full [D,
    N] matrix per token and the scan cannot be written as a matmul. The
    source article's 'Mamba-2 step' is this one.

    state [b, D, N]; x, dt [b, D] (dt already positive); A [D, N]; B, C [b,
    N]. Returns (y [b, D], the new state)."""
    h = torch.exp(dt[..., None] * A) * state + (dt * x)[..., None] * B[:, None, :]
    return (h * C[:, None, :]).sum(-1), h


__all__ = ["mamba2_step", "selective_state_update_ref", "ssd_scan_ref", "ssd_chunked_torch", "segsum", "rmsnorm_ref",
           "mamba1_step"]
