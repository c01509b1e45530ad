"""The input checks of the Mamba-2 entry points (the decode step and the SSD chunk scan), on the
shared checks (kernels/checks.py): TypeError for a wrong type or dtype, ValueError for a wrong value
or shape, every message naming the argument, all before anything is launched.

Layouts, as mamba_ssm names them:

    step   state [S, H, P, N] fp32 (S slots: b, or any number with state_batch_indices [b]);
           x, dt, z [b, H, P]; A [H, P, N]; B, C [b, G, N]; D, dt_bias [H, P]
    scan   x, z [Bt, T, H, P]; dt [Bt, T, H]; A [H]; B, C [Bt, T, G, N]; D [H, P] or [H];
           dt_bias [H]; initial_states [Bt, H, P, N] fp32

H heads of P channels (headdim), N the state size (dstate), G groups (G divides H: heads h of one
group share B and C, as GQA shares keys).
"""
from __future__ import annotations

import torch

from ..checks import (FLOATS, REFERENCE_FLOATS, check_bool, check_dims, check_has_values, check_kernel_device,
                      check_not_empty, check_same_device, check_same_device_and_dtype, check_tensor)
from ..common import INTERPRET, ON_GPU

MAX_DSTATE = 256    # the decode kernel holds a whole state row (padded to a power of two) in registers
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


def step_accepted_at_once(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                          device_type: str = "cuda"):
    """(b, H, P, N, G) when a kernel call is plainly valid, else None. A decode step is bound by host
    time, and the checks one by one (which name what is wrong) cost about 20 µs: this asks each tensor
    the fewest questions and accepts only what check_step_inputs accepts; anything else, a slot table
    included, goes through the full check. device_type: the machine's kernel device ("cuda" on a GPU;
    the tests pass "cpu" to exercise it under the interpreter)."""
    Tensor = torch.Tensor
    if not (type(state) is Tensor and type(x) is Tensor and type(dt) is Tensor and type(A) is Tensor
            and type(B) is Tensor and type(C) is Tensor and state_batch_indices is None
            and (dt_softplus is True or dt_softplus is False)):
        return None
    opt = [t for t in (D, z, dt_bias) if t is not None]
    if any(type(t) is not Tensor for t in opt):
        return None
    dev = x.device
    if dev.type != device_type or any(t.device != dev for t in (state, dt, A, B, C, *opt)):
        return None
    floats = FLOATS if device_type == "cuda" else (torch.float16, torch.float32)
    xd = x.dtype
    if (state.dtype is not torch.float32 or xd not in floats or B.dtype is not xd or C.dtype is not xd
            or (z is not None and z.dtype is not xd)
            or any(t.dtype not in floats for t in (dt, A, *[t for t in (D, dt_bias) if t is not None]))):
        return None
    if x.dim() != 3 or A.dim() != 3 or B.dim() != 3:
        return None
    b, H, P = x.shape
    N, G = A.shape[2], B.shape[1]
    if (b == 0 or H == 0 or P == 0 or N == 0 or N > MAX_DSTATE or G == 0 or H % G != 0
            or state.shape != (b, H, P, N) or dt.shape != (b, H, P) or A.shape != (H, P, N)
            or B.shape != (b, G, N) or C.shape != (b, G, N)
            or (z is not None and z.shape != (b, H, P))
            or any(t is not None and t.shape != (H, P) for t in (D, dt_bias))):
        return None
    return b, H, P, N, G


def check_step_inputs(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                      state_batch_indices=None, *, kernel: bool = True):
    """Validate a selective_state_update call; return (b, H, P, N, G).

    kernel: the call launches a Triton kernel (state fp32; inputs fp16, bf16, fp32; the machine rule;
    N <= 256). Otherwise a PyTorch reference: fp64 too, any device but meta. The slot table's values
    are checked where they can be read without waiting for the GPU: on the CPU (see interface.py).
    """
    if kernel and ON_GPU and not INTERPRET:
        sizes = step_accepted_at_once(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
        if sizes is not None:
            return sizes
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

    b, H, P = x.shape
    check_not_empty("x", x, "b, nheads, headdim")
    S, N = state.shape[0], A.shape[-1]
    check_not_empty("state", state, "slots, nheads, headdim, dstate")
    G = B.shape[1]
    if state_batch_indices is None:
        check_dims("state", state, (b, H, P, N), "b, nheads, headdim, dstate")
    else:
        check_dims("state", state, (S, H, P, N), "slots, nheads, headdim, dstate")
        check_dims("state_batch_indices", state_batch_indices, (b,), "b")
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
    if state_batch_indices is not None and state_batch_indices.device.type == "cpu":
        lo, hi = int(state_batch_indices.min()), int(state_batch_indices.max())
        if lo < 0 or hi >= S:
            raise ValueError(f"state_batch_indices must lie in [0, {S - 1}] (state has {S} slots), "
                             f"got values in [{lo}, {hi}]")
    return b, H, P, N, G


def check_scan_inputs(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                      initial_states=None, return_final_states=False, *, kernel: bool = True):
    """Validate an ssd_chunk_scan call; return (Bt, T, H, P, N, G)."""
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
    if kernel and chunk_size != 64:
        raise ValueError(f"chunk_size must be 64 (the book's chunk), got {chunk_size}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _devices(kernel, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    check_same_device_and_dtype(**{n: t for n, t in (("x", x), ("B", B), ("C", C), ("z", z)) if t is not None})

    check_not_empty("x", x, "batch, seqlen, nheads, headdim")
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
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
    if initial_states is not None:
        check_dims("initial_states", initial_states, (Bt, H, P, N), "batch, nheads, headdim, dstate")
    if kernel and (N > 256 or P > 256):
        raise ValueError(f"x and B have headdim = {P} and dstate = {N}; the kernels take both <= 256")
    return Bt, T, H, P, N, G


__all__ = ["check_step_inputs", "step_accepted_at_once", "check_scan_inputs", "MAX_DSTATE"]
