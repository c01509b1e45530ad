"""GLA's figure: the chunk decomposition of the causal matrix, in the chunks of `attention_kernels.linear.chunk`.

    >>> from attention_kernels.gla.diagram import gla_chunks
    >>> gla_chunks()                     # four chunks: the diagonal inside, the rest through the state
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..drawing import C_LIGHT, C_SKIP, C_WORK, C_WORK2, draw_arrow, draw_box, draw_lower_triangle, finish_figure
from ..plot import COLUMN_INCHES, styled


@styled
def gla_chunks(n_chunks: int = 4):
    """GLA's chunk decomposition: the T x T causal matrix in chunks of CHUNK tokens (attention_kernels.linear.chunk).
    The diagonal blocks are computed inside the chunk (a causal, decayed product of the chunk's own
    queries and keys); everything below them reaches the chunk through the state S_n, passed from chunk
    to chunk and decayed on the way."""
    from ..linear.chunk import CHUNK

    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 5.8))
    n = n_chunks
    for i in range(n):
        for j in range(n):
            if j < i:
                draw_box(ax, j, -i - 1, 1, 1, "", C_LIGHT, edge="white")
            elif j == i:
                draw_lower_triangle(ax, j, -i, C_WORK2)
                ax.text(j + 0.3, -i - 0.72, "intra", color="white", fontsize=9.5, ha="center")
            else:
                draw_box(ax, j, -i - 1, 1, 1, "", "white", edge=C_SKIP)
    for i in range(1, n):
        ax.text(i / 2, -i - 0.5, f"through $S_{i}$", ha="center", va="center", fontsize=10)
    # the state pass, under the matrix: S_0 -> S_1 -> ... at the chunk boundaries
    y = -n - 0.75
    for k in range(n + 1):
        ax.add_patch(plt.Circle((k, y), 0.2, facecolor=C_WORK, edgecolor="none"))
        ax.text(k, y, f"$S_{k}$", color="white", ha="center", va="center", fontsize=10)
        if k < n:
            draw_arrow(ax, (k + 0.22, y), (k + 0.78, y))
            ax.text(k + 0.5, y - 0.38, f"chunk {k}", ha="center", fontsize=9.5)
    ax.text(n + 0.3, y + 0.05, "$S_{n+1} = \\mathrm{diag}(\\gamma_n) S_n + \\tilde K_n^\\top V_n$", fontsize=10,
            va="center")
    ax.text(n + 0.3, -0.5, f"{CHUNK} tokens\na chunk", fontsize=10, va="center")
    ax.text(n + 0.3, -1.9, "$O_n = \\tilde Q_n S_n$\n  $+ (\\tilde Q_n \\tilde K_n^\\top \\odot M) V_n$", fontsize=10.5,
            va="center")
    ax.set_xlim(-0.3, n + 2.9)
    ax.set_ylim(y - 0.65, 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"GLA in chunks of {CHUNK}: causal blocks inside a chunk, the rest through the state", loc="left")
    return finish_figure(fig)


__all__ = ["gla_chunks"]
