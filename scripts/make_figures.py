"""Draw the book's headline figure (book/images/headline.png) from the committed H200 tables.

Runs anywhere: it reads results/, it times nothing. One panel per family that declares a HEADLINE
(a `attention_kernels.bench.Panel` in its bench.py), in a grid of two columns at the width of the book's text
column, so the whole figure fits one screen: the book's kernel against its strongest peers, in the unit
that chapter reads best, in the style of every other figure of the book (attention_kernels.plot).
"""
import importlib
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attention_kernels.bench import families, load, select  # noqa: E402
from attention_kernels.plot import COLUMN_INCHES, DPI, log2_axis, plot_providers, plot_roofline, styled, y_label  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "images" / "headline.png"


def panels():
    """Every family's HEADLINE, in the order of the families' names."""
    found = [getattr(importlib.import_module(f"attention_kernels.{f}.bench"), "HEADLINE", None) for f in families()]
    return [p for p in found if p is not None]


GRID_COLUMNS = 2
PANEL_HEIGHT = 2.45  # inches: three rows of panels and the title fit a 1280 x 900 px window


@styled
def main():
    chosen = panels()
    rows = -(-len(chosen) // GRID_COLUMNS)
    fig, grid = plt.subplots(rows, GRID_COLUMNS, figsize=(COLUMN_INCHES, PANEL_HEIGHT * rows + 0.4), squeeze=False)
    axes = list(grid.flat)
    gpu = None
    for ax, panel in zip(axes, chosen):
        ax.set_title("\n".join(textwrap.fill(line, 40) for line in panel.title.splitlines()), loc="left", fontsize=9)
        try:
            df = load(panel.benchmark)
        except (FileNotFoundError, ValueError) as e:
            ax.text(0.5, 0.5, f"no results\n({e.__class__.__name__})", ha="center", transform=ax.transAxes)
            continue
        gpu = df.attrs["meta"]["gpu"]
        df = select(df, **panel.where)
        plot_providers(ax, df, panel.x, panel.y, panel.providers)
        if panel.y == "tflops":
            # in TFLOP/s the roofline is the matmul ceiling, which the intro's caption explains; a prefill's
            # time roofline lies far below every kernel (the linear families are bound by their chunks'
            # sequence, not by the H200's rate) and would only squash the lines
            plot_roofline(ax, df, panel.x, panel.y)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        ax.legend(loc="best", fontsize=7.5, handlelength=1.6, borderaxespad=0.3)
        ax.set_ylabel("\n(".join(y_label(panel.y).rsplit(" (", 1)), fontsize=9)
        log2_axis(ax, df[panel.x].unique())
        ax.tick_params(labelsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=9)
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    fig.suptitle(f"The book's kernels (blue) against their peers, measured on {gpu or 'the GPU'}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=DPI)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
