"""Attention kernels for the executable book: references, Triton kernels, and the benchmark and
plotting helpers the chapters share.

`import attention_kernels` works in any Python process: it needs torch and triton, not Jupyter. The only
global it sets is TRITON_INTERPRET=1 on a machine without a CUDA GPU (and only if unset), so the
same notebooks and tests run there under Triton's interpreter (slowly, on small shapes).
Notebook helpers (`show_source`, the widgets) are in `attention_kernels.notebook`.
"""
import os
import sys
import warnings

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    # Must happen before the first `import triton`: @triton.jit reads it at decoration.
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        warnings.warn("triton was imported before kernels on a machine without a CUDA GPU, so Triton's "
                      "interpreter is off and the book's kernels cannot run here: import attention_kernels first, "
                      "or set TRITON_INTERPRET=1 before starting Python", stacklevel=2)

from .common import DEVICE, INTERPRET, ON_GPU, assert_close, device_name, pick, rel_err, tolerance  # noqa: E402

__all__ = ["DEVICE", "INTERPRET", "ON_GPU", "assert_close", "device_name", "pick", "rel_err", "tolerance"]
