"""Mamba-2's public entry points: validate, allocate what is returned, launch. Names, arguments and
layouts as mamba_ssm's Triton ops (`selective_state_update`, the SSD chunk scan), see inputs.py.

The slot table's values (state_batch_indices) are checked only when it is on the CPU: on the GPU the
check would read device memory and wait for the GPU on every decode step, which is the cost the step
is built to avoid (as the Lightning chapter leaves its slopes unchecked). On the GPU an index outside
[0, slots), or a slot named twice (two rows updating one slot in place: which write lands is
undefined), is the caller's error, as it is in mamba_ssm.
"""
from __future__ import annotations

import torch

from ..custom_ops import compiled_as_op, like, ssd_chunk_scan_fake
from .inputs import check_scan_inputs, check_step_inputs
from .decode import selective_state_update_fwd


def a_is_scalar_per_head(A: torch.Tensor) -> bool:
    """A [nheads, headdim, dstate] holds one number per head, broadcast with stride 0 (how a Mamba-2
    model passes it): the kernel's fast path."""
    return A.stride(1) == 0 and A.stride(2) == 0


@compiled_as_op("kernels::selective_state_update", fake=like("x"), mutates_args=("state",))
def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    """One Mamba-2 decode step (Triton), the state updated in place.

    state: fp32 [b, nheads, headdim, dstate], or [slots, ...] with state_batch_indices (int [b]: batch
    row i reads and writes state[state_batch_indices[i]]; a slot named twice is refused on the CPU and
    undefined on the GPU, as in mamba_ssm). state is updated where it lies (any strides, not
    expanded: stride 0 is refused). x, dt, z: [b, nheads, headdim];
    A: [nheads, headdim, dstate] (stride-0 broadcast of one scalar per head: the fast path);
    B, C: [b, ngroups, dstate], ngroups dividing nheads; D, dt_bias: [nheads, headdim].
    x, B, C, z one dtype (fp16, bf16 on a GPU, fp32); dt, A, D, dt_bias any of them. dstate <= 256.
    Returns y [b, nheads, headdim] in x's dtype.

        >>> A = (-torch.exp(A_log))[:, None, None].expand(80, 64, 128)    # one scalar per head, stride 0
        >>> y = selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    """
    check_step_inputs(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
    z = None if z is None else z.contiguous()
    # the kernel reads the slot table as contiguous (a no-op when it is, as a serving engine's is)
    slots = None if state_batch_indices is None else state_batch_indices.contiguous()
    y = torch.empty_like(x)
    selective_state_update_fwd(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, y,
                               a_is_scalar_per_head(A))
    return y


@compiled_as_op("kernels::ssd_chunk_scan", fake=ssd_chunk_scan_fake)
def ssd_chunk_scan(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                   initial_states=None, return_final_states=False):
    """The SSD chunk scan (Triton): Mamba-2's prefill, in chunks of chunk_size tokens. See chunk.py.

    x, z: [batch, seqlen, nheads, headdim]; dt: [batch, seqlen, nheads]; A: [nheads]; B, C:
    [batch, seqlen, ngroups, dstate], ngroups dividing nheads; D: [nheads, headdim] or [nheads];
    dt_bias: [nheads]; initial_states: fp32 [batch, nheads, headdim, dstate]. x, B, C, z one dtype
    (fp16, bf16 on a GPU, fp32); dt, A, D, dt_bias any of them. chunk_size: 16, 32, 64 (the
    default), 128 or 256 (mamba_ssm's Mamba-2 default); the same answer at each, up to rounding.
    headdim, dstate <= 256. In a Mamba-2 model dt (after dt_bias and the softplus) >= 0 and A <= 0, so every
    decay e^{dt·A} is <= 1; other signs (an A_log passed as A, a negative dt without the softplus)
    give the recurrence's answer too, as the step does, until the growing state overflows. Returns
    y [batch, seqlen, nheads, headdim] in x's dtype, or (y, final_states fp32 [batch, nheads,
    headdim, dstate]) when return_final_states.

        >>> y, h = ssd_chunk_scan(x, dt, -torch.exp(A_log), B, C, chunk_size=256, D=D, z=z,
        ...                       dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
        >>> y_next = selective_state_update(h, x_t, dt_t, A_t, B_t, C_t, ...)   # decode continues from h
    """
    from .chunk import ssd_chunk_scan_fwd

    dims = check_scan_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                             return_final_states)
    y, final = ssd_chunk_scan_fwd(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                                  return_final_states)
    return (y, final) if return_final_states else y


__all__ = ["selective_state_update", "ssd_chunk_scan", "a_is_scalar_per_head"]
