"""Where the book runs, and how it checks numbers.

On a machine without a CUDA GPU the Triton kernels run under Triton's interpreter
(`TRITON_INTERPRET=1`, which `attention_kernels/__init__.py` sets before Triton is imported),
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


# Relative-error tolerances by input dtype. fp32 dot products run as TF32 on a GPU (10-bit mantissa,
# unit roundoff 2^-11) unless a kernel asks for IEEE; under the interpreter they are exact fp32.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 3e-3
TF32: bool = ON_GPU and not INTERPRET  # fp32 `tl.dot` without input_precision="ieee" rounds inputs to TF32 here


def tolerance(dtype: torch.dtype, *, tf32_dots: bool = False) -> float:
    """The relative error a kernel's output may show against an fp32/fp64 reference, for its input
    dtype on this machine. tf32_dots: the kernel multiplies fp32 inputs in TF32 (on a GPU).

    >>> tol = tolerance(torch.bfloat16)          # 1e-2
    """
    if dtype == torch.float32 and tf32_dots and TF32:
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, name: str = "output") -> float:
    """Assert rel_err(out, ref) <= tol (NaN or inf always fails); return the error."""
    err = rel_err(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {tol:.1e}")
    return err
