"""Where the book runs, and how it checks numbers.

On a machine without a CUDA GPU the Triton kernels run under Triton's interpreter
(`TRITON_INTERPRET=1`, which `kernels/__init__.py` sets before Triton is imported),
so every notebook and test picks small shapes there and real ones on the GPU.
"""
from __future__ import annotations

import os

import torch

ON_GPU: bool = torch.cuda.is_available()
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE: str = "cuda" if ON_GPU else "cpu"


def pick(cpu, gpu):
    """Return `gpu` on a CUDA machine and `cpu` under the interpreter.

    >>> N = pick(cpu=77, gpu=4096)
    """
    return gpu if ON_GPU and not INTERPRET else cpu


def device_name() -> str:
    """'NVIDIA H200' on the GPU box, 'CPU (Triton interpreter)' here."""
    return torch.cuda.get_device_name() if ON_GPU else "CPU (Triton interpreter)"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error ||out - ref|| / ||ref|| in float64; NaN anywhere gives inf.

    Shapes must match exactly: broadcasting would hide a layout bug.
    """
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out64).all() or not torch.isfinite(ref64).all():
        return float("inf")
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / denom


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, name: str = "output") -> float:
    """Assert rel_err(out, ref) <= tol (NaN or inf always fails); return the error."""
    err = rel_err(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {tol:.1e}")
    return err


def check_tensor(name: str, t, *, ndim: int | None = None, dtypes=None, device=None) -> None:
    """Raise TypeError/ValueError naming `name` if `t` is not the tensor a kernel expects."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {allowed}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all inputs on one device)")
