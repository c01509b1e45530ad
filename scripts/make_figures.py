"""Draw the book's headline figure (book/images/headline.png) from the committed H200 tables.

Runs anywhere: it reads results/, it times nothing. One panel per family that declares a HEADLINE
(a `kernels.bench.Panel` in its bench.py): the book's kernel against its strongest peers, in the unit
that chapter reads best.
"""
import importlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernels.bench import families, load, select  # noqa: E402
from kernels.plot import plot_providers, plot_roofline, styled  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "images" / "headline.png"
LABELS = {"tflops": "TFLOP/s (higher is better)", "ms": "time, ms (lower is better)"}


def panels():
    """Every family's HEADLINE, in the order of the families' names."""
    found = [getattr(importlib.import_module(f"kernels.{f}.bench"), "HEADLINE", None) for f in families()]
    return [p for p in found if p is not None]


@styled
def main():
    chosen = panels()
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.7 * len(chosen), 4.0), squeeze=False)
    gpu = None
    for ax, panel in zip(axes[0], chosen):
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
        ax.legend(fontsize=8, loc="best")
        ax.set_ylabel(LABELS[panel.y])
        ax.set_xscale("log", base=2)
        ax.set_xlabel(panel.xlabel)
        ax.set_title(panel.title, fontsize=10)
    fig.suptitle(f"The book's kernels (blue) against their peers — measured on {gpu or 'the GPU'}", fontsize=12)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
