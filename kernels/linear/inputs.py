"""The input check every linear-attention family shares (GLA now; Lightning, KDA and Mamba-2 next).

The layout is sequence-major, as in fla: q, k [B, T, H, K], v [B, T, H, V], and a recurrent state
S [B, H, K, V] kept in fp32. Each family names its own gates and their shapes in the letters of
that layout: GLA's gk is "B T H K" (one decay per key channel), Mamba-2's dt "B T H" (one per
head). The check looks at types, shapes, dtypes and devices only (nothing that would wait for the
GPU) and raises TypeError for a wrong type or dtype, ValueError for a wrong value or shape.

    >>> B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B T H K")}, scale, h0, True)
"""
from __future__ import annotations

import math

import torch

from ..checks import (FLOATS, REFERENCE_FLOATS, check_bool, check_dims, check_has_values, check_kernel_device,
                      check_not_empty, check_same_device, check_same_device_and_dtype, check_tensor,
                      softmax_scale_or_default)
from ..common import INTERPRET, ON_GPU

MAX_HEAD_DIM = 256  # the kernels hold a whole key row (padded to a power of two) in registers
_INTERPRETER_FLOATS = (torch.float16, torch.float32)  # the interpreter computes bf16 dot products wrongly


def _check_dims(name: str, t: torch.Tensor, letters: str, sizes: dict) -> None:
    letters = letters.split()
    check_dims(name, t, [sizes[c] for c in letters], ", ".join(letters))


def check_linear_inputs(q, k, v, gates, scale=None, initial_state=None, output_final_state=False, *,
                        kernel: bool = True, step: bool = False, state_name: str = "initial_state"):
    """Validate a linear-attention call; return (B, T, H, K, V, scale).

    q, k: [B, T, H, K]; v: [B, T, H, V], one dtype (fp16, bf16, fp32; fp64 too when kernel=False).
    gates: {name: (tensor, letters)}, each gate any float dtype of the same list, its shape given in
        the letters B, T, H, K, V (e.g. {"gk": (gk, "B T H K")}); an empty dict for none.
    scale: a float > 0, default K ** -0.5 (the shared scale rule: bool, str -> TypeError; <= 0, nan,
        inf -> ValueError). initial_state: None, or [B, H, K, V] in fp32 (fp32 or fp64 when
        kernel=False), named `state_name` in messages. output_final_state: a bool.
    kernel: the call launches a Triton kernel: K, V <= 256, and the machine rule (CPU tensors and no
        bf16 under the interpreter, CUDA tensors on a GPU). Otherwise (a PyTorch reference) any
        device but meta. step: one decode step, no T axis (q, k [B, H, K], v [B, H, V]; T is 1).
    """
    sizes = _accepted_at_once(q, k, v, gates, scale, initial_state, output_final_state, kernel, step)
    if sizes is not None:
        return sizes
    return _checked_one_by_one(q, k, v, gates, scale, initial_state, output_final_state, kernel, step, state_name)


def _accepted_at_once(q, k, v, gates, scale, h0, output_final_state, kernel, step):
    """(B, T, H, K, V, scale) when the call is plainly valid, else None. A decode step is bound by
    host time, and the checks one by one, which name what is wrong, would add 10 us to it: this asks
    each tensor the fewest questions and accepts only what `_checked_one_by_one` accepts (where the
    machine rule does not plainly hold, for one, it leaves the verdict to check_kernel_device)."""
    Tensor = torch.Tensor
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and (output_final_state is True or output_final_state is False)):
        return None
    shape, dtype, device = q.shape, q.dtype, q.device
    if (len(shape) != (3 if step else 4) or k.shape != shape or k.dtype != dtype or v.dtype != dtype
            or k.device != device or v.device != device):
        return None
    K, V = shape[-1], v.shape[-1]
    if v.shape[:-1] != shape[:-1] or 0 in shape or V == 0:
        return None
    if kernel:
        dtypes = _INTERPRETER_FLOATS if INTERPRET else FLOATS
        if not (q.is_cpu if INTERPRET else ON_GPU and q.is_cuda) or K > MAX_HEAD_DIM or V > MAX_HEAD_DIM:
            return None
    else:
        dtypes = REFERENCE_FLOATS
        if q.is_meta:
            return None
    if dtype not in dtypes:
        return None
    B, H, T = shape[0], shape[-2], 1 if step else shape[1]
    sizes = {"B": B, "T": T, "H": H, "K": K, "V": V}
    for g, letters in gates.values():
        if not (type(g) is Tensor and g.dtype in dtypes and g.device == device
                and (g.shape == shape if letters == ("B H K" if step else "B T H K") else
                     list(g.shape) == [sizes[c] for c in letters.split()])):
            return None
    if h0 is None:
        if step:
            return None
    elif not (type(h0) is Tensor and (h0.dtype == torch.float32 or (not kernel and h0.dtype == torch.float64))
              and h0.device == device and h0.shape == (B, H, K, V)):
        return None
    if scale is None:
        scale = K ** -0.5
    elif not (type(scale) is float and 0.0 < scale < math.inf):
        return None
    return B, T, H, K, V, scale


def _checked_one_by_one(q, k, v, gates, scale, initial_state, output_final_state, kernel, step, state_name):
    """The checks in order, each raising TypeError/ValueError with the argument named."""
    dtypes = FLOATS if kernel else REFERENCE_FLOATS
    layout = "B H" if step else "B T H"
    check_tensor("q", q, ndim=len(layout.split()) + 1, dtypes=dtypes)
    check_tensor("k", k, ndim=q.dim(), dtypes=dtypes)
    check_tensor("v", v, ndim=q.dim(), dtypes=dtypes)
    for name, (g, letters) in gates.items():
        check_tensor(name, g, ndim=len(letters.split()), dtypes=dtypes)
    tensors = {"q": q, "k": k, "v": v, **{name: g for name, (g, _) in gates.items()}}
    if initial_state is not None or step:
        check_tensor(state_name, initial_state, ndim=4,
                     dtypes=(torch.float32,) if kernel else (torch.float32, torch.float64))
        tensors[state_name] = initial_state
    check_bool("output_final_state", output_final_state)

    check_not_empty("q", q, ", ".join(layout.split() + ["K"]))
    check_not_empty("v", v, ", ".join(layout.split() + ["V"]))
    sizes = {"T": 1, **dict(zip(layout.split() + ["K"], q.shape)), "V": v.shape[-1]}  # T = 1 for a step
    _check_dims("k", k, f"{layout} K", sizes)
    _check_dims("v", v, f"{layout} V", sizes)
    for name, (g, letters) in gates.items():
        _check_dims(name, g, letters, sizes)
    if state_name in tensors:
        _check_dims(state_name, initial_state, "B H K V", sizes)
    if kernel and not (sizes["K"] <= MAX_HEAD_DIM and sizes["V"] <= MAX_HEAD_DIM):
        raise ValueError(f"head dims K={sizes['K']}, V={sizes['V']} must be at most {MAX_HEAD_DIM}")

    check_same_device_and_dtype(q=q, k=k, v=v)
    check_same_device(**tensors)
    if kernel:
        check_kernel_device(**tensors)
    else:
        check_has_values(**tensors)
    scale = softmax_scale_or_default(scale, sizes["K"], name="scale")
    return sizes["B"], sizes["T"], sizes["H"], sizes["K"], sizes["V"], scale


def check_no_grad(form: str, **tensors) -> None:
    """Refuse, by name, an input that requires grad on a form without a backward (while autograd records):
    its output would silently carry no gradient. None entries are skipped.

        >>> check_no_grad("fused_recurrent_gla", q=q, k=k, v=v, gk=gk, initial_state=h0)
    """
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ValueError(f"{name} requires grad, but {form} has no backward: train with the chunk form, "
                             f"or call it under torch.no_grad()")


__all__ = ["MAX_HEAD_DIM", "check_linear_inputs", "check_no_grad"]
