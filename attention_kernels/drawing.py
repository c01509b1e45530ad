"""The drawing primitives of the book's diagrams: the colours of their roles, a labelled box, an
arrow, a lower-triangle cell (a causal block on the diagonal), and the last step of every figure.
Each family draws its own figures from its kernels' numbers in `attention_kernels/<family>/diagram.py`.

    >>> fig, ax = plt.subplots()
    >>> draw_box(ax, 0, 0, 1, 1, "program 0", C_WORK, text_color="white")
    >>> finish_figure(fig)               # closed, returned: the notebook shows it once
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Polygon, Rectangle

from .plot import BOOK_BLUES, PEERS

# Roles in every diagram: the book's blues for work, orange for what the mask touches, greys for
# what is skipped or idle.
C_WORK, C_WORK2, C_LIGHT = BOOK_BLUES[0], BOOK_BLUES[1], BOOK_BLUES[4]
C_MASK = PEERS["SDPA flash"].color
C_SKIP = "#e6e6e6"
C_TEXT = "#222222"


def draw_box(ax, x, y, w, h, text="", color=C_LIGHT, edge=C_TEXT, fontsize=10, text_color=C_TEXT, **kw):
    """A w x h rectangle with its lower-left corner at (x, y), filled with color, text at its centre."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=1.0, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def draw_arrow(ax, start, end, text="", color=C_TEXT, fontsize=9.5, **kw):
    """An arrow from start to end ((x, y) pairs), with text beside its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color, lw=1.2, **kw))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.05, (start[1] + end[1]) / 2, text, fontsize=fontsize, va="center",
                color=color)


def draw_lower_triangle(ax, x, y, color, edge="white"):
    """The lower-left half of the unit cell whose upper-left corner is (x, y): a block on the causal
    diagonal, where the mask keeps the lower triangle (the y axis points up, rows go down)."""
    ax.add_patch(Polygon([(x, y), (x, y - 1), (x + 1, y - 1)], facecolor=color, edgecolor=edge))


def finish_figure(fig):
    """Close fig and return it: a notebook shows it once, as the cell's value, not twice."""
    plt.close(fig)  # shown once, as the cell's value
    return fig


__all__ = ["C_WORK", "C_WORK2", "C_LIGHT", "C_MASK", "C_SKIP", "C_TEXT", "draw_box", "draw_arrow",
           "draw_lower_triangle", "finish_figure"]
