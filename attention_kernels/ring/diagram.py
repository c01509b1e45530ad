"""The ring chapter's diagram, drawn from `ring_plan` itself so it stays true if the schedule changes.

    >>> from attention_kernels.ring.diagram import zigzag_schedule
    >>> zigzag_schedule(world=4)          # a matplotlib Figure
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..drawing import C_SKIP, draw_lower_triangle, finish_figure
from ..plot import BOOK_BLUES, COLUMN_INCHES, PEERS, styled
from .zigzag import chunk_pairs, ring_plan

RANK_COLORS = [BOOK_BLUES[0], PEERS["SDPA flash"].color, "#2ca02c", "#9467bd", BOOK_BLUES[2], "#8c564b",
               "#e377c2", "#7f7f7f"]


def work_per_rank(world: int, layout: str) -> list[float]:
    """Causal work of each rank over the whole ring, in units of one (T/2W x T/2W) chunk pair (a diagonal
    pair counts one half). layout: "zigzag" (the ring's plan) or "contiguous" (rank r holds chunks 2r, 2r+1)."""
    if layout == "zigzag":
        return [sum(1.0 if kind == "full" else 0.5 for s in range(world)
                    for *_, kind in chunk_pairs(ring_plan(r, s, world, True), world)) for r in range(world)]
    if layout == "contiguous":
        return [sum(1.0 if j < i else 0.5 for i in (2 * r, 2 * r + 1) for j in range(i + 1)) for r in range(world)]
    raise ValueError(f"layout must be 'zigzag' or 'contiguous', got {layout!r}")


@styled
def zigzag_schedule(world: int = 4):
    """Left: the causal (query chunk x key chunk) grid of a sequence cut into 2·world chunks; each visible
    block is coloured by the rank that computes it and labelled with the ring step at which it does.
    Right: the work of each rank over the whole ring, zig-zag against the contiguous split."""
    n = 2 * world
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(COLUMN_INCHES, 3.9), gridspec_kw={"width_ratios": [1.25, 1]})
    for i in range(n):
        for j in range(i + 1, n):
            ax.add_patch(Rectangle((j, -i - 1), 1, 1, facecolor=C_SKIP, edgecolor="white"))
    for rank in range(world):
        for step in range(world):
            for i, j, kind in chunk_pairs(ring_plan(rank, step, world, True), world):
                color = RANK_COLORS[rank % len(RANK_COLORS)]
                if kind == "full":
                    ax.add_patch(Rectangle((j, -i - 1), 1, 1, facecolor=color, edgecolor="white"))
                    ax.text(j + 0.5, -i - 0.5, f"{step}", color="white", ha="center", va="center", fontsize=9)
                else:  # the diagonal: the causal mask keeps its lower triangle
                    draw_lower_triangle(ax, j, -i, color)
                    ax.text(j + 0.3, -i - 0.72, f"{step}", color="white", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, n)
    ax.set_ylim(-n, 0)
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(n)], [str(j) for j in range(n)])
    ax.set_yticks([-i - 0.5 for i in range(n)], [str(i) for i in range(n)])
    ax.tick_params(length=0)
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    ax.set_title(f"zig-zag over {world} ranks: who computes each block,\nand at which ring step", loc="left",
                 fontsize=10)
    handles = [Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}: chunks {r}, {n - 1 - r}")
               for r in range(world)]
    ax.legend(handles=handles, loc="upper right", fontsize=8, handlelength=1.0, borderaxespad=0.1)

    x = range(world)
    width = 0.38
    bx.bar([r - width / 2 for r in x], work_per_rank(world, "contiguous"), width, color="#bbbbbb", label="contiguous")
    bx.bar([r + width / 2 for r in x], work_per_rank(world, "zigzag"), width, color=BOOK_BLUES[0], label="zig-zag")
    bx.set_xticks(list(x), [str(r) for r in x])
    bx.set_xlabel("rank")
    bx.set_ylabel("work (chunk pairs)")
    bx.set_title("causal work per rank", loc="left", fontsize=10)
    bx.legend(loc="upper left", fontsize=9)
    return finish_figure(fig)


__all__ = ["zigzag_schedule", "work_per_rank"]
