"""Linear attention across ranks, for contrast with the ring: what crosses between GPUs is a state.

GLA's recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t is linear in the state
it starts from. So a rank holding tokens [a, b) can run `chunk_gla` from a zero state, and fix its
output afterwards with the state S_a that the ranks before it produced:
    o_t = o_t(zero start) + scale · (q_t ⊙ exp(Σ_{a<=s<=t} g_s))ᵀ S_a.
And S_a comes from a scan over ranks of two small tensors each rank computes alone: its final state
from a zero start, L_r (fp32 [B, H, K, V]), and the total decay of its slice, Γ_r = exp(Σ_t g_t)
(fp32 [B, H, K]):  S_in(r + 1) = diag(Γ_r) S_in(r) + L_r.
Those are K·V numbers per head, whatever T is: one all-gather of them replaces the W - 1 ring steps
that softmax attention needs to move all of K and V. Forward only (prefill / inference).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..gla.interface import chunk_gla
from ..linear.inputs import check_linear_inputs


def scan_states(local_states, log_decays, initial_state=None):
    """The state entering each rank, and the final one: S_in(0) = initial_state (or zeros),
    S_in(r + 1) = exp(log_decays[r])[..., None] · S_in(r) + local_states[r].

    local_states: W tensors [B, H, K, V] (fp32); log_decays: W tensors [B, H, K] (Σ_t g_t of each slice).
    Returns (entering: a list of W states, final state), fp32.
    """
    S = torch.zeros_like(local_states[0]) if initial_state is None else initial_state.to(local_states[0].dtype)
    entering = []
    for L, log_gamma in zip(local_states, log_decays):
        entering.append(S)
        S = log_gamma.exp()[..., None] * S + L
    return entering, S


def gla_context_parallel(q, k, v, gk, scale=None, group=None, initial_state=None, output_final_state=False):
    """GLA forward over a sequence split contiguously across the ranks of `group` (default: the world).

    q, k, gk: [B, T/W, H, K]; v: [B, T/W, H, V]: this rank's tokens [r·T/W, (r+1)·T/W) (`contiguous_split`);
    shapes, dtypes and the scale as in attention_kernels.gla. initial_state: fp32 [B, H, K, V], the state before the
    whole sequence (give it on every rank; only rank 0's path uses it directly). Returns (o [B, T/W, H, V]
    in v's dtype, the state after the whole sequence (fp32 [B, H, K, V], the same on every rank) when
    output_final_state, else None). Every rank of the group must call it.

    >>> q, k, v, gk = (contiguous_split(t, rank, world) for t in (Q, K, V, GK))
    >>> o, S = gla_context_parallel(q, k, v, gk, output_final_state=True)
    """
    _, _, _, _, _, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B T H K")}, scale, initial_state,
                                               output_final_state)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialized (call dist.init_process_group first)")
    o, local = chunk_gla(q, k, v, gk, scale, output_final_state=True)  # from a zero state, no communication
    g = gk.float().cumsum(dim=1)  # [B, T/W, H, K]: decay from the slice's start to each token, in log
    log_decay = g[:, -1].contiguous()
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    states = [torch.empty_like(local) for _ in range(world)]
    decays = [torch.empty_like(log_decay) for _ in range(world)]
    dist.all_gather(states, local, group=group)
    dist.all_gather(decays, log_decay, group=group)
    entering, final = scan_states(states, decays, initial_state)
    o = o.float() + scale * torch.einsum("bthk,bhkv->bthv", q.float() * g.exp(), entering[rank])
    return o.to(v.dtype), (final if output_final_state else None)


__all__ = ["gla_context_parallel", "scan_states"]
