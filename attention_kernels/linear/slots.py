"""The serving step for the linear families (GLA, Lightning, KDA): a pool of recurrent states, each batch
row's slot in it, and the final state written back where the initial one was read. The names are fla's
(`fused_recurrent_kda_fwd` in fla.ops.kda): inplace_final_state and ssm_state_indices.

    initial_state        fp32 [B, H, K, V], or with ssm_state_indices a pool [S, H, K, V] (any S)
    ssm_state_indices    int32 or int64 [B] on q's device: batch row b starts from initial_state[idx[b]]
    inplace_final_state  the final state is written into the rows it was read from (initial_state[b], or
                         initial_state[idx[b]]): one read and one write of each state, no copy, and the
                         returned final state is initial_state itself (whatever output_final_state says)
    without it           the final state, when output_final_state, is a new fp32 [B, H, K, V]

The kernel reads the slot at the start and writes it after the last token, whatever T is: a row's T tokens
are one sequence continuing its slot's state (fla's per-token writes for speculative decoding, 2-D indices
with num_accepted_tokens, are not taken). A slot named twice is refused for an in-place step (two rows
would write one state); reading one slot from several rows is allowed. The slot values are checked only
where the table is on the CPU: on the GPU the check would wait for the device on every step (as Mamba-2's
state_batch_indices, attention_kernels/mamba2/interface.py); there an index outside [0, S) or a slot named twice is
the caller's error, as in fla and mamba_ssm. Packed sequences (cu_seqlens) are refused with either option:
a decode batch is one token a row, which the batch rows already hold. The pool is read where it lies when
it is contiguous (as a serving engine's is); a call that only reads slots of a pool that is not copies it
whole first, and an in-place call refuses it.
"""
from __future__ import annotations

import torch

from ..checks import check_bool, check_dims, check_same_device, check_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def check_serving_options(form: str, inplace_final_state, ssm_state_indices, cu_seqlens,
                          state_v_first=False) -> bool:
    """The options' combinations, refused before anything else is looked at; returns inplace_final_state."""
    inplace = check_bool("inplace_final_state", inplace_final_state)
    if not inplace and ssm_state_indices is None:
        return False
    option = "inplace_final_state" if ssm_state_indices is None else "ssm_state_indices"
    if cu_seqlens is not None:
        raise ValueError(f"{form}: {option} does not take packed sequences (cu_seqlens); a decode batch puts "
                         "one sequence in each batch row")
    if check_bool("state_v_first", state_v_first):
        raise ValueError(f"{form}: {option} keeps the states as the kernels do, [K, V] (state_v_first=False)")
    return inplace


def check_state_slots(form: str, q, initial_state, inplace_final_state: bool, ssm_state_indices) -> None:
    """Validate the state, the pool and the slot table, after the shared input check (q is known good).
    The pool's H, K, V are checked by `check_pool` once the sizes are known."""
    if not inplace_final_state and ssm_state_indices is None:
        return
    option = "inplace_final_state" if ssm_state_indices is None else "ssm_state_indices"
    if initial_state is None:
        raise ValueError(f"{form}: {option} needs initial_state (the states, or the pool the slots index)")
    check_tensor("initial_state", initial_state, ndim=4, dtypes=(torch.float32,))
    if inplace_final_state and not initial_state.is_contiguous():
        raise ValueError(f"{form}: inplace_final_state writes initial_state where it lies, which must be "
                         f"contiguous (got strides {tuple(initial_state.stride())})")
    if ssm_state_indices is not None:
        check_tensor("ssm_state_indices", ssm_state_indices, ndim=1, dtypes=INDEX_DTYPES)
        check_dims("ssm_state_indices", ssm_state_indices, (q.shape[0],), "B")
        check_same_device(q=q, initial_state=initial_state, ssm_state_indices=ssm_state_indices)
        if ssm_state_indices.device.type == "cpu":
            _check_slot_values(ssm_state_indices, initial_state.shape[0], inplace_final_state)


def check_pool(initial_state, ssm_state_indices, H: int, K: int, V: int) -> None:
    """initial_state is [B, H, K, V] (checked with the other inputs) or, with slots, [S, H, K, V]."""
    if ssm_state_indices is not None:
        check_dims("initial_state", initial_state, (initial_state.shape[0], H, K, V), "S, H, K, V")


def _check_slot_values(indices: torch.Tensor, slots: int, written: bool) -> None:
    """A CPU slot table's values: each in [0, slots); none twice when the slots are written."""
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= slots:
        raise ValueError(f"ssm_state_indices must lie in [0, {slots - 1}] (initial_state has {slots} slots), "
                         f"got values in [{lo}, {hi}]")
    if written:
        ordered = indices.sort().values
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if twice.numel():
            raise ValueError(f"ssm_state_indices holds slot {int(twice[0])} more than once: with "
                             "inplace_final_state two batch rows would write one state")


def pooled_state(form: str, q, initial_state, inplace: bool, ssm_state_indices, h0, H: int, K: int, V: int):
    """The state a step reads and its slot table, checked (`check_state_slots`, `check_pool`): (h0, None)
    without slots, h0 being the checked initial state; (the pool, the slot table) with them, both contiguous."""
    check_state_slots(form, q, initial_state, inplace, ssm_state_indices)
    check_pool(initial_state, ssm_state_indices, H, K, V)
    if ssm_state_indices is None:
        return h0, None
    return initial_state.contiguous(), ssm_state_indices.contiguous()


def step_outputs(q, v, h0, output_final_state: bool, inplace: bool):
    """A step's output o (like v) and where its final states go: h0 itself in place (written where they
    were read), a new fp32 [B, H, K, V] when asked for, else None."""
    o = torch.empty_like(v)
    if inplace:
        return o, h0
    B, _, H, K = q.shape
    ht = torch.empty(B, H, K, v.shape[-1], dtype=torch.float32, device=q.device) if output_final_state else None
    return o, ht


__all__ = ["check_serving_options", "check_state_slots", "check_pool", "pooled_state", "step_outputs",
           "INDEX_DTYPES"]
