"""Draw the book's headline figure (book/images/headline.png) from the committed H200 tables.

Runs anywhere: it reads results/, it times nothing. One panel per family that declares a HEADLINE
(a `kernels.bench.Panel` in its bench.py), stacked at the width of the book's text column: the book's
kernel against its strongest peers, in the unit that chapter reads best, in the style of every other
figure of the book (kernels.plot).
"""
import importlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from kernels.bench import families, load, select  # noqa: E402
from kernels.plot import DPI, column_figure, log2_axis, plot_providers, plot_roofline, styled, y_label  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "images" / "headline.png"


def panels():
    """Every family's HEADLINE, in the order of the families' names."""
    found = [getattr(importlib.import_module(f"kernels.{f}.bench"), "HEADLINE", None) for f in families()]
    return [p for p in found if p is not None]


@styled
def main():
    chosen = panels()
    fig, axes = column_figure(len(chosen), height=3.3)
    gpu = None
    for ax, panel in zip(axes, chosen):
        try:
            df = load(panel.benchmark)
        except (FileNotFoundError, ValueError) as e:
            ax.text(0.5, 0.5, f"no results\n({e.__class__.__name__})", ha="center", transform=ax.transAxes)
            continue
        gpu = df.attrs["meta"]["gpu"]
        df = select(df, **panel.where)
        plot_providers(ax, df, panel.x, panel.y, panel.providers)
        plot_roofline(ax, df, panel.x, panel.y)
        if panel.y == "tflops":
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_ylabel(y_label(panel.y))
        log2_axis(ax, df[panel.x].unique())
        ax.set_xlabel(panel.xlabel)
        ax.set_title(panel.title.replace("\n", ", "), loc="left")
    fig.suptitle(f"The book's kernels (blue) against their peers, measured on {gpu or 'the GPU'}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=DPI)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
