"""The input checks of the Mamba-2 entry points (the decode step and the SSD chunk scan), on the
shared checks (attention_kernels/checks.py): TypeError for a wrong type or dtype, ValueError for a wrong value
or shape, every message naming the argument, all before anything is launched.

Layouts, as mamba_ssm names them:

    step   state [S, H, P, N] fp32 (S slots: b, or any number with state_batch_indices [b]);
           x, dt, z [b, H, P]; A [H, P, N]; B, C [b, G, N]; D, dt_bias [H, P]
    scan   x, z [Bt, T, H, P]; dt [Bt, T, H]; A [H]; B, C [Bt, T, G, N]; D [H, P] or [H];
           dt_bias [H]; initial_states [Bt, H, P, N] fp32; or packed: Bt = 1, cu_seqlens int32
           [S + 1] and initial_states [S, H, P, N] for S sequences

H heads of P channels (headdim), N the state size (dstate), G groups (G divides H: heads h of one
group share B and C, as GQA shares keys).
"""
from __future__ import annotations

from collections import Counter

import torch

from ..checks import (FLOATS, REFERENCE_FLOATS, check_bool, check_dims, check_has_values, check_kernel_device,
                      check_no_grad, check_not_empty, check_once_per_signature, check_same_device,
                      check_packed_layout, check_same_device_and_dtype, check_tensor)

MAX_DSTATE = 256    # the decode kernel holds a whole state row (padded to a power of two) in registers
CHUNK_SIZES = (16, 32, 64, 128, 256)    # the scan's chunk lengths: mamba_ssm's models use 256
INDEX_DTYPES = (torch.int32, torch.int64)


def _devices(kernel: bool, **tensors):
    tensors = {n: t for n, t in tensors.items() if t is not None}
    check_has_values(**tensors)          # meta tensors first: they name themselves
    check_same_device(**tensors)
    if kernel:
        check_kernel_device(**tensors)


def _groups(H: int, G: int):
    if H % G != 0:
        raise ValueError(f"B and C have {G} groups, which must divide nheads = {H}")


def _agreed_size(**sizes: int) -> int:
    """The size most of the named arguments agree on (ties: the first named). dstate is carried by
    several arguments; checking them all against the majority names the one that differs (an A of
    [nheads, 1, 1] is A's error, not state's)."""
    return Counter(sizes.values()).most_common(1)[0][0]


def _check_not_expanded(name: str, t: torch.Tensor) -> None:
    """A tensor updated in place must hold each element once: stride 0 on a dimension of size > 1
    (a broadcast) makes several elements one, and the update's result undefined."""
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            raise ValueError(f"{name} is updated in place and must not be expanded: stride 0 on dim {d} "
                             f"(size {size}) makes its elements share memory; pass {name}.contiguous()")


def _check_slot_values(state_batch_indices: torch.Tensor, slots: int) -> None:
    """A CPU slot table's values: each in [0, slots), none twice (two rows updating one slot in place
    have no defined result). Read on the CPU only (interface.py says why)."""
    lo, hi = int(state_batch_indices.min()), int(state_batch_indices.max())
    if lo < 0 or hi >= slots:
        raise ValueError(f"state_batch_indices must lie in [0, {slots - 1}] (state has {slots} slots), "
                         f"got values in [{lo}, {hi}]")
    ordered = state_batch_indices.sort().values
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if twice.numel():
        raise ValueError(f"state_batch_indices holds slot {int(twice[0])} more than once: two batch rows "
                         "would update one slot in place")


@check_once_per_signature(strides=True)
def _check_step_layout(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, kernel,
                       writes_state):
    floats = FLOATS if kernel else REFERENCE_FLOATS
    check_tensor("state", state, ndim=4, dtypes=(torch.float32,) if kernel else (torch.float32, torch.float64))
    check_tensor("x", x, ndim=3, dtypes=floats)
    for name, t, nd in (("dt", dt, 3), ("A", A, 3), ("B", B, 3), ("C", C, 3)):
        check_tensor(name, t, ndim=nd, dtypes=floats)
    for name, t, nd in (("D", D, 2), ("z", z, 3), ("dt_bias", dt_bias, 2)):
        if t is not None:
            check_tensor(name, t, ndim=nd, dtypes=floats)
    check_bool("dt_softplus", dt_softplus)
    if state_batch_indices is not None:
        check_tensor("state_batch_indices", state_batch_indices, ndim=1, dtypes=INDEX_DTYPES)
    _devices(kernel, state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
             state_batch_indices=state_batch_indices)
    check_same_device_and_dtype(**{n: t for n, t in (("x", x), ("B", B), ("C", C), ("z", z)) if t is not None})
    if kernel:
        check_no_grad("selective_state_update", state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z,
                       dt_bias=dt_bias)

    b, H, P = x.shape
    check_not_empty("x", x, "b, nheads, headdim")
    S = state.shape[0]
    N = _agreed_size(B=B.shape[-1], C=C.shape[-1], state=state.shape[-1], A=A.shape[-1])
    check_not_empty("state", state, "slots, nheads, headdim, dstate")
    G = B.shape[1]
    if state_batch_indices is None:
        check_dims("state", state, (b, H, P, N), "b, nheads, headdim, dstate")
    else:
        check_dims("state", state, (S, H, P, N), "slots, nheads, headdim, dstate")
        check_dims("state_batch_indices", state_batch_indices, (b,), "b")
    if writes_state:
        _check_not_expanded("state", state)
    check_dims("dt", dt, (b, H, P), "b, nheads, headdim")
    check_dims("A", A, (H, P, N), "nheads, headdim, dstate")
    if G < 1:
        raise ValueError(f"B must have ngroups >= 1, got shape {list(B.shape)}")
    check_dims("B", B, (b, G, N), "b, ngroups, dstate")
    check_dims("C", C, (b, G, N), "b, ngroups, dstate")
    _groups(H, G)
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_dims(name, t, (H, P), "nheads, headdim")
    if z is not None:
        check_dims("z", z, (b, H, P), "b, nheads, headdim")
    if kernel and N > MAX_DSTATE:
        raise ValueError(f"state has dstate = {N}; the kernel takes dstate <= {MAX_DSTATE}")
    return b, H, P, N, G


def check_step_inputs(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                      state_batch_indices=None, *, kernel: bool = True, writes_state: bool = True):
    """Validate a selective_state_update call; return (b, H, P, N, G).

    kernel: the call launches a Triton kernel (state fp32; inputs fp16, bf16, fp32; the machine rule;
    N <= 256; no input that requires grad). Otherwise a PyTorch reference: fp64 too, any device but
    meta. writes_state: the state is updated in place, so it must not be expanded (stride 0). The
    layout's verdict is remembered per call signature (`attention_kernels.checks.check_once_per_signature`); the slot table's
    values are checked on every call where they can be read without waiting for the GPU: on the CPU
    (see interface.py).
    """
    sizes = _check_step_layout(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                               kernel, writes_state)
    if state_batch_indices is not None and state_batch_indices.device.type == "cpu":
        _check_slot_values(state_batch_indices, state.shape[0])
    return sizes


def check_scan_inputs(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                      initial_states=None, return_final_states=False, cu_seqlens=None, *, kernel: bool = True):
    """Validate an ssd_chunk_scan call; return (Bt, T, H, P, N, G). kernel: as check_step_inputs, but
    inputs that require grad are accepted (the scan trains). The verdict is remembered per call
    signature, as the step's is. cu_seqlens: the offsets' layout only (int32 [N + 1] on x's device, batch
    1, initial_states [N, ...]); their values are checked where they are read (`check_offset_values`)."""
    return _check_scan_layout(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                              return_final_states, cu_seqlens, kernel)


@check_once_per_signature(strides=True)
def _check_scan_layout(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                       return_final_states, cu_seqlens, kernel):
    floats = FLOATS if kernel else REFERENCE_FLOATS
    check_tensor("x", x, ndim=4, dtypes=floats)
    check_tensor("dt", dt, ndim=3, dtypes=floats)
    check_tensor("A", A, ndim=1, dtypes=floats)
    check_tensor("B", B, ndim=4, dtypes=floats)
    check_tensor("C", C, ndim=4, dtypes=floats)
    if D is not None:
        check_tensor("D", D, dtypes=floats)
        if D.dim() not in (1, 2):
            raise ValueError(f"D must have 1 or 2 dims ([nheads] or [nheads, headdim]), got shape {tuple(D.shape)}")
    if z is not None:
        check_tensor("z", z, ndim=4, dtypes=floats)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, ndim=1, dtypes=floats)
    if initial_states is not None:
        check_tensor("initial_states", initial_states, ndim=4,
                     dtypes=(torch.float32,) if kernel else (torch.float32, torch.float64))
    check_bool("dt_softplus", dt_softplus)
    check_bool("return_final_states", return_final_states)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if kernel and chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {', '.join(map(str, CHUNK_SIZES))} (the kernels' "
                         f"chunk lengths), got {chunk_size}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _devices(kernel, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    check_same_device_and_dtype(**{n: t for n, t in (("x", x), ("B", B), ("C", C), ("z", z)) if t is not None})

    check_not_empty("x", x, "batch, seqlen, nheads, headdim")
    Bt, T, H, P = x.shape
    G = B.shape[2]
    N = _agreed_size(B=B.shape[3], C=C.shape[3],
                     **({} if initial_states is None else {"initial_states": initial_states.shape[3]}))
    check_not_empty("B", B, "batch, seqlen, ngroups, dstate")
    check_dims("dt", dt, (Bt, T, H), "batch, seqlen, nheads")
    check_dims("A", A, (H,), "nheads")
    check_dims("B", B, (Bt, T, G, N), "batch, seqlen, ngroups, dstate")
    check_dims("C", C, (Bt, T, G, N), "batch, seqlen, ngroups, dstate")
    _groups(H, G)
    if D is not None and list(D.shape) not in ([H], [H, P]):
        raise ValueError(f"D must be [nheads] or [nheads, headdim] = [{H}] or [{H}, {P}], got {list(D.shape)}")
    if z is not None:
        check_dims("z", z, (Bt, T, H, P), "batch, seqlen, nheads, headdim")
    if dt_bias is not None:
        check_dims("dt_bias", dt_bias, (H,), "nheads")
    n_states = Bt
    if cu_seqlens is not None:
        n_states = check_packed_layout(cu_seqlens, name="x", batch=Bt, device=x.device)
    if initial_states is not None:
        check_dims("initial_states", initial_states, (n_states, H, P, N),
                   "batch, nheads, headdim, dstate" if cu_seqlens is None else "sequences, nheads, headdim, dstate")
    if kernel and (N > 256 or P > 256):
        raise ValueError(f"x and B have headdim = {P} and dstate = {N}; the kernels take both <= 256")
    return Bt, T, H, P, N, G


__all__ = ["check_step_inputs", "check_scan_inputs", "MAX_DSTATE", "CHUNK_SIZES",
           "SIGNATURES_REMEMBERED"]
