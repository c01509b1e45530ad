"""The input checks every public function shares: one place, one exception policy.

TypeError for a wrong type or dtype, ValueError for a wrong value or shape; every message names the
argument. The checks look at shapes, dtypes and devices only, never at values on the GPU (that would
be a device sync), and run before anything is launched.

    >>> check_tensor("q", q, ndim=4, dtypes=FLOATS)
    >>> check_same_device_and_dtype(q=q, k=k, v=v)
    >>> check_kernel_device(q=q, k=k)        # the machine rule, for kernels only
    >>> scale = softmax_scale_or_default(softmax_scale, q.shape[-1])

A family's whole check, which reads no value, is wrapped in `check_once_per_signature`: a decode step
calls it with the same shapes every time, and then pays a read of each argument's metadata and a dict
lookup instead of the checks.
"""
from __future__ import annotations

import functools
import math
import numbers
import operator

import torch

from .common import INTERPRET, ON_GPU

FLOATS = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels take
REFERENCE_FLOATS = FLOATS + (torch.float64,)  # what the plain-PyTorch references take


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_tensor(name: str, t, *, ndim: int | None = None, dtypes=None, shape=None) -> torch.Tensor:
    """Raise TypeError/ValueError naming `name` unless `t` is a tensor of that rank, dtype and shape.

    shape: a tuple whose entries are sizes or None (any size), e.g. (B, None, H, K).
    Returns `t`, so a check can sit inside an expression.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(_dtype_name(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {_dtype_name(t.dtype)}; supported: {allowed}")
    if shape is not None:
        if len(shape) != t.dim() or any(want is not None and want != got for want, got in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    return t


def check_gradient(name: str, grad, shape, dtype: torch.dtype, device) -> None:
    """The incoming gradient of an output, as a backward operator takes it: a tensor of the output's
    shape and dtype on its device (TypeError/ValueError naming `name`). Called as a cheap host check by the
    backward launchers, which are ops of their own (torch.ops.kernels.*_bwd) and so reachable directly."""
    check_tensor(name, grad, dtypes=(dtype,), shape=tuple(shape))
    if grad.device != device:
        raise ValueError(f"{name} is on {grad.device}; the output it is the gradient of is on {device}")


def check_dims(name: str, t: torch.Tensor, want, dims: str) -> None:
    """ValueError unless `t` has exactly the sizes `want`; `dims` names them, e.g. "B, T, H, K", and the
    message shows both: "k must be [B, T, H, K] = [1, 8, 2, 16], got [1, 4, 2, 16]"."""
    if list(t.shape) != list(want):
        raise ValueError(f"{name} must be [{dims}] = {list(want)}, got {list(t.shape)}")


def check_not_empty(name: str, t: torch.Tensor, dims: str) -> None:
    """ValueError unless every size of `t` is >= 1; `dims` names them, e.g. "B, T, H, D"."""
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{name} must have every size >= 1 ([{dims}]), got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """All on one device (ValueError naming each)."""
    if len({t.device for t in tensors.values()}) > 1:
        got = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise ValueError(f"{', '.join(tensors)} must be on one device, got {got}")


def check_same_device_and_dtype(**tensors: torch.Tensor) -> None:
    """All on one device (ValueError) and of one dtype (TypeError); the message names them all."""
    check_same_device(**tensors)
    if len({t.dtype for t in tensors.values()}) > 1:
        got = ", ".join(f"{n} {_dtype_name(t.dtype)}" for n, t in tensors.items())
        raise TypeError(f"{', '.join(tensors)} must share one dtype, got {got}")


def check_has_values(**tensors: torch.Tensor) -> None:
    """The rule for references, which compute on any device: not on the meta device, which holds
    shapes but no values (ValueError naming the first such tensor)."""
    for name, t in tensors.items():
        if t.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (the meta device holds shapes, no values): "
                             "the reference computes on values")


def check_kernel_device(**tensors: torch.Tensor) -> None:
    """The machine rule for Triton kernels. On a CUDA machine: CUDA tensors. Under the interpreter:
    CPU tensors, and no bfloat16 (the interpreter computes bf16 `tl.dot` wrongly). Meta tensors
    and other devices are refused with the argument named."""
    for name, t in tensors.items():
        if INTERPRET:
            if t.device.type != "cpu":
                raise ValueError(f"{name} is on {t.device}: under the Triton interpreter (no CUDA GPU here) "
                                 "the kernels take CPU tensors")
            if t.dtype == torch.bfloat16:
                raise TypeError(f"{name} is bfloat16, which needs a GPU: the Triton interpreter computes bf16 "
                                "dot products wrongly; use float16 or float32 here")
        elif ON_GPU and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: the kernels run on the GPU and take CUDA tensors")


def check_no_grad(form: str, **tensors: torch.Tensor | None) -> None:
    """ValueError naming the first tensor that requires grad while grad mode is on: `form` (a public
    function's name) has no backward, so its output could not carry the gradient. Entries that are not
    tensors (None, or a wrong type that the form's own checks then name) are skipped.

        >>> check_no_grad("fused_recurrent_gla", q=q, k=k, v=v, gk=gk, initial_state=h0)
    """
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise ValueError(f"{name} requires grad, and {form} has no backward: pass {name}.detach() "
                                 "or call it under torch.no_grad()")


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_int(name: str, value, *, low: int | None = None, high: int | None = None, allow_none=False):
    """An int (not a bool) in [low, high]; None passes through when allow_none."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{name} must be in {bounds}, got {value}")
    return int(value)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def softmax_scale_or_default(scale, head_dim: int | None, name: str = "softmax_scale") -> float:
    """The scale rule, the same everywhere: a real, finite number > 0. None means head_dim ** -0.5
    where the function has a default (head_dim given), and is a TypeError where it has none."""
    if scale is None:
        if head_dim is None:
            raise TypeError(f"{name} is required (a float > 0), got None")
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be a float{' or None' if head_dim is not None else ''}, "
                        f"got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{name} must be finite and > 0, got {scale}")
    return float(scale)


def check_packed_layout(cu_seqlens, *, name: str, batch: int, device) -> int:
    """Packed sequences' offsets, their layout only (nothing read from the GPU): int32 [N + 1] on the
    inputs' device, with the sequences concatenated in one batch row (batch 1). Returns N. ValueError or
    TypeError naming cu_seqlens; `name` is the first input's, for the batch and device messages."""
    check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32,))
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, {name} on {device}: they must share a device")
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold N + 1 >= 2 offsets (N sequences), got {cu_seqlens.shape[0]}")
    if batch != 1:
        raise ValueError(f"with cu_seqlens the sequences are packed along seqlen in one batch row: {name} must "
                         f"have batch 1, got {batch}")
    return cu_seqlens.shape[0] - 1


def check_offset_values(offsets: list[int], T: int, name: str = "x") -> None:
    """The values of packed sequences' offsets, read on the host: 0 first, the packed length T last,
    non-decreasing (a sequence may be empty). ValueError naming cu_seqlens; `name` is the input whose
    seqlen T is."""
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    if offsets[-1] != T:
        raise ValueError(f"cu_seqlens must end at the packed length {T} ({name}'s seqlen), got {offsets[-1]}")
    if any(b < a for a, b in zip(offsets[:-1], offsets[1:])):
        raise ValueError("cu_seqlens must be non-decreasing (every sequence's length >= 0)")


class _Unusual(Exception):
    """An argument the signature does not describe (a tensor subclass, an object of another type)."""


_SCALARS = frozenset((bool, int, float, str, type(None)))   # by exact type: True, 1 and 1.0 are one dict key
_TENSOR_META = operator.attrgetter("shape", "dtype", "device", "requires_grad")   # one C call a tensor


def _tensor_meta_and_strides(t: torch.Tensor) -> tuple:
    return *_TENSOR_META(t), t.stride()


def _signature(values, tensor_meta, key: list) -> list:
    """Append to `key` what a check can read of `values` without reading their values: each tensor's
    `tensor_meta` (its shape, dtype, device and requires_grad; and strides where asked), each scalar's type
    and value, each tuple, list or dict's type and length, then its items (a dict's keys, then its values).
    _Unusual for anything else. One flat list, a loop rather than a call per value: it runs on every call."""
    for value in values:
        kind = type(value)
        if kind is torch.Tensor:
            key.append(tensor_meta(value))
        elif kind in _SCALARS:
            key += kind, value
        elif kind is tuple or kind is list:
            key += kind, len(value)
            _signature(value, tensor_meta, key)
        elif kind is dict:
            key += kind, len(value), *value
            _signature(value.values(), tensor_meta, key)
        else:
            raise _Unusual
    return key


def check_once_per_signature(check=None, *, strides: bool = False, most: int = 512):
    """Wrap a check that reads no value (types, shapes, dtypes, devices, requires_grad, scalars) so that
    its verdict is remembered per call signature (`_signature` of every argument, plus the grad mode):
    a call like an accepted one returns that call's result from a dict, at the cost of reading each
    tensor's metadata (about 0.3 us a tensor on a CPU core) and one lookup. A refusal is not
    remembered (the check runs again and raises afresh, with its own message), nor is a call with an
    argument the signature cannot describe (a tensor subclass, say): the check judges those every time.

    strides: the check reads the tensors' strides, so they belong to the signature. most: how many
    signatures are kept (the oldest is dropped first). The result must be immutable (it is shared).
    The wrapper has `verdicts` (the dict) and `cache_clear()`.

    >>> @check_once_per_signature
    ... def check_inputs(q, k, scale=None): ...
    >>> check_inputs(q, k)   # the checks run; the same shapes again: a lookup
    """
    if check is None:
        return functools.partial(check_once_per_signature, strides=strides, most=most)
    verdicts: dict = {}
    tensor_meta = _tensor_meta_and_strides if strides else _TENSOR_META
    grad_enabled = torch.is_grad_enabled

    @functools.wraps(check)
    def checked(*args, **kwargs):
        if torch.compiler.is_compiling():   # a traced call is checked once, when it is traced
            return check(*args, **kwargs)
        try:
            if kwargs:   # their names, then every value
                key = tuple(_signature((*args, *kwargs.values()), tensor_meta, [grad_enabled(), *kwargs]))
            else:
                key = tuple(_signature(args, tensor_meta, [grad_enabled()]))
        except (_Unusual, RuntimeError):   # (RuntimeError: the strides of a tensor that has none)
            return check(*args, **kwargs)
        verdict = verdicts.get(key, _UNSEEN)
        if verdict is _UNSEEN:
            verdict = check(*args, **kwargs)
            while len(verdicts) >= most:
                del verdicts[next(iter(verdicts))]   # the oldest
            verdicts[key] = verdict
        return verdict

    checked.verdicts = verdicts
    checked.cache_clear = verdicts.clear
    return checked


_UNSEEN = object()


__all__ = ["FLOATS", "REFERENCE_FLOATS", "check_tensor", "check_packed_layout", "check_offset_values", "check_not_empty", "check_same_device_and_dtype",
           "check_same_device", "check_has_values", "check_kernel_device", "check_bool", "check_int", "check_choice",
           "check_no_grad", "check_gradient", "softmax_scale_or_default", "check_once_per_signature"]
