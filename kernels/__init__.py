"""Attention kernels for the executable book: references, Triton kernels, and the
benchmark and plotting helpers the chapters share.

Importing `kernels` on a machine without a CUDA GPU switches Triton to its
interpreter, so the same notebooks and tests run (slowly, on small shapes) on a CPU.
"""
import os

import torch

if not torch.cuda.is_available():
    # Must happen before the first `import triton`: @triton.jit reads it at decoration.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .common import DEVICE, INTERPRET, ON_GPU, assert_close, device_name, pick, rel_err  # noqa: E402
from .show import show_source  # noqa: E402

__all__ = ["DEVICE", "INTERPRET", "ON_GPU", "assert_close", "device_name", "pick", "rel_err", "show_source"]
