"""The primer's figure: a vector in blocks, one program per block, the tail masked off.

    >>> from attention_kernels.primer.diagram import primer_grid
    >>> primer_grid()                    # n = 2600 in blocks of `vector_add`'s default
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt

from ..drawing import C_SKIP, C_TEXT, draw_box, finish_figure
from ..plot import BOOK_BLUES, COLUMN_INCHES, styled


@styled
def primer_grid(n: int = 2600, block: int | None = None):
    """A vector of n elements in blocks of BLOCK (default: `vector_add`'s block), one program per block
    (the grid is cdiv(n, BLOCK)); the last program's offsets past n are masked off."""
    import inspect

    if block is None:
        from .interface import vector_add
        block = inspect.signature(vector_add).parameters["block"].default
    programs = math.ceil(n / block)
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 2.6))
    for p in range(programs):
        a = p * block
        live = min(block, n - a)
        draw_box(ax, a, 0, live, 1, f"program {p}\n{a}–{a + live - 1}", BOOK_BLUES[p % 2],
             text_color="white", edge="white")
        if live < block:
            draw_box(ax, a + live, 0, block - live, 1, "masked", C_SKIP, edge=C_TEXT, hatch="//")
    ax.annotate(f"n = {n}", xy=(n, 1.0), xytext=(n, 1.45), ha="center", arrowprops=dict(arrowstyle="-|>"))
    ax.set_xlim(0, programs * block)
    ax.set_ylim(-0.1, 1.8)
    ax.set_yticks([])
    ax.set_xticks([p * block for p in range(programs + 1)])
    ax.grid(False)
    ax.set_xlabel(f"element index (BLOCK = {block}, grid = cdiv({n}, {block}) = {programs} programs)")
    ax.set_title("offs = pid * BLOCK + tl.arange(0, BLOCK);  mask = offs < n", loc="left", family="monospace",
                 fontsize=10)
    return finish_figure(fig)


__all__ = ["primer_grid"]
