"""Step 2 of the primer: a numerically stable softmax of each row of a matrix, one program per row.

The whole row is one block (BLOCK = the row length rounded up to a power of two), so a program
loads its row once, reduces it twice (max, then sum) in registers, and writes it once. The number
of warps that share a row is autotuned per block size on the GPU.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import LOG2E, autotune_configs

_LOG2E = tl.constexpr(LOG2E)   # a Python float a kernel may read: exp(x) = exp2(x * log2(e))

# (meta-parameters, num_warps, num_stages): the row is one block, so only the number of warps
# that share it varies. num_stages pipelines the loads of a loop; this kernel has no loop.
# Under the interpreter, autotune_configs keeps the first config alone (nothing to time there).
_CONFIGS = autotune_configs([({}, 4, 1), ({}, 8, 1), ({}, 16, 1)])


@triton.autotune(configs=_CONFIGS, key=["BLOCK"])
@triton.jit
def _softmax_kernel(p_x, p_out, n_cols, BLOCK: tl.constexpr):
    i_r = tl.program_id(0).to(tl.int64)          # the row this program owns (int64: rows * cols may pass 2^31)
    o_c = tl.arange(0, BLOCK)
    m_c = o_c < n_cols
    # padding lanes read -inf: they never win the max and exp2(-inf) adds 0
    # to the sum
    b_x = tl.load(p_x + i_r * n_cols + o_c, mask=m_c, other=float("-inf")).to(tl.float32)
    b_x = b_x - tl.max(b_x, axis=0)              # every entry <= 0 now: exp2 cannot overflow
    b_p = tl.exp2(b_x * _LOG2E)
    b_p = b_p / tl.sum(b_p, axis=0)
    tl.store(p_out + i_r * n_cols + o_c, b_p.to(p_out.dtype.element_ty), mask=m_c)


def softmax_fwd(x, out) -> None:
    """out = row softmax of x, both contiguous [rows, cols]; fp32 maths, x's
    dtype out."""
    n_rows, n_cols = x.shape
    _softmax_kernel[(n_rows,)](x, out, n_cols, BLOCK=triton.next_power_of_2(n_cols))
