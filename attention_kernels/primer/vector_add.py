"""Step 1 of the primer: add two vectors, BLOCK elements per program.

The launch grid has cdiv(n, BLOCK) programs. Program i reads elements [i*BLOCK, (i+1)*BLOCK);
the mask turns off the lanes of the last program that fall past n.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add_kernel(p_x, p_y, p_out, n, BLOCK: tl.constexpr):
    i_n = tl.program_id(0)                      # which block of the vector this program owns
    o_n = i_n * BLOCK + tl.arange(0, BLOCK)     # its BLOCK element offsets
    m_n = o_n < n                               # lanes past the end do nothing
    b_x = tl.load(p_x + o_n, mask=m_n)
    b_y = tl.load(p_y + o_n, mask=m_n)
    tl.store(p_out + o_n, b_x + b_y, mask=m_n)


def add_fwd(x, y, out, block: int) -> None:
    """out = x + y for contiguous vectors of n elements, `block` (a power of
    two) per program."""
    n = x.numel()
    grid = (triton.cdiv(n, block),)             # enough programs to cover n
    _add_kernel[grid](x, y, out, n, BLOCK=block)
