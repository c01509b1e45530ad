"""The book's one figure: a results table drawn the same way in every chapter.

Log-2 length axis, one line per provider with a colour fixed per provider (the
book's own kernels always in the same blue), the roofline as a dashed grey line,
and a title that names the GPU and the shape.
"""
from __future__ import annotations

import functools
import itertools

import matplotlib.pyplot as plt
import pandas as pd

from .bench import UNITS

BOOK_COLOR = "#1f5fbf"
# Peers keep their colour across chapters, so a reader learns them once.
PEER_COLORS = {
    "SDPA flash": "#e6862e",
    "SDPA cuDNN": "#2e9e5b",
    "eager": "#9e9e9e",
    "PyTorch": "#9e9e9e",
    "fla": "#c0392b",
    "FlashMLA": "#8e44ad",
}
_FALLBACK = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728"]
BOOK_STYLES = ["-", "--", ":", "-."]
ROOFLINE_COLOR = "#555555"

# The house style, applied inside the book's figure functions only (never to the caller's process).
STYLE = {"figure.dpi": 110, "savefig.dpi": 110, "axes.spines.top": False, "axes.spines.right": False,
         "axes.grid": True, "grid.alpha": 0.3, "font.size": 10, "legend.frameon": False}


def styled(figure_function):
    """Decorator: draw under the house style (STYLE), leaving matplotlib's global settings as they were."""
    @functools.wraps(figure_function)
    def draw(*args, **kwargs):
        with plt.rc_context(STYLE):
            return figure_function(*args, **kwargs)
    return draw


def is_book(provider: str) -> bool:
    """The book's own kernels are labelled 'book' or 'book: <variant>'."""
    return provider == "book" or provider.startswith("book:")


def provider_style(providers) -> dict:
    """provider -> (colour, linestyle, linewidth): book kernels blue and thick, peers fixed."""
    style, fallback, book_ls = {}, itertools.cycle(_FALLBACK), itertools.cycle(BOOK_STYLES)
    for p in providers:
        if is_book(p):
            style[p] = (BOOK_COLOR, next(book_ls), 2.4)
        else:
            base = next((c for k, c in PEER_COLORS.items() if p == k or p.startswith(k + " ")), None)
            style[p] = (base or next(fallback), "-", 1.6)
    return style


def plot_providers(ax, df: pd.DataFrame, x: str, y: str, providers) -> None:
    """One line per provider (in the house style) of `y` against `x`; providers with no data are skipped."""
    styles = provider_style(providers)
    for p in providers:
        rows = df[df["provider"] == p].sort_values(x)
        if rows[y].notna().any():
            c, ls, lw = styles[p]
            ax.plot(rows[x], rows[y], ls, color=c, lw=lw, marker="o", ms=3.5, label=p)


def plot_roofline(ax, df: pd.DataFrame, x: str, y: str) -> None:
    """The roofline as a dashed grey line named "roofline": for each x, the best any implementation could
    do for that shape (max of FLOPs at the matmul ceiling and bytes at the copy ceiling, both measured in the
    same run). Drawn for y in ms, us, tflops and gbps."""
    if y in ("ms", "us"):
        ref = df.drop_duplicates(x).sort_values(x)
        ax.plot(ref[x], ref["roofline_ms"] * (1000.0 if y == "us" else 1.0), "--", color=ROOFLINE_COLOR, lw=1.2,
                label="roofline")
    elif y in ("tflops", "gbps"):  # every provider does the same work: any timed row converts
        ref = df[df["ms"].notna()].drop_duplicates(x).sort_values(x)
        ax.plot(ref[x], ref[y] * ref["ms"] / ref["roofline_ms"], "--", color=ROOFLINE_COLOR, lw=1.2,
                label="roofline")


@styled
def plot_results(df: pd.DataFrame, x: str = "T", y: str = "tflops", col: str | None = None,
                 title: str = "", roofline: bool = True, logy: bool = False, xlabel: str | None = None):
    """Draw `y` against `x` (log-2 axis), one line per provider, one panel per value of `col`.

    df: a table from `kernels.bench.run` (its metadata names the GPU).
    y: 'ms', 'us', 'tflops', 'gbps' or 'pct_roofline'. The roofline is drawn for ms/us,
        tflops and gbps: the fastest any implementation could go for that shape.
    Returns the matplotlib Figure (a notebook shows it as PNG).
    """
    data = df.copy()
    data["us"] = data["ms"] * 1000
    panels = sorted(data[col].unique(), key=natural_order) if col else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 3.8), squeeze=False, sharey=True)
    providers = list(dict.fromkeys(data["provider"]))
    for ax, value in zip(axes[0], panels):
        part = data if col is None else data[data[col] == value]
        plot_providers(ax, part, x, y, providers)
        if roofline:
            plot_roofline(ax, part, x, y)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel or x)
        if col:
            ax.set_title(f"{col} = {value}", fontsize=10)
    axes[0][0].set_ylabel(UNITS.get(y, y))
    if y in ("tflops", "gbps", "pct_roofline") and not logy:
        axes[0][0].set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5))
    gpu = df.attrs.get("meta", {}).get("gpu", "")
    fig.suptitle(f"{title} — {gpu}" if gpu else title, fontsize=11)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value, not again by the inline backend
    return fig


def natural_order(value):
    """Numbers in numeric order, then strings: panels read 1, 32, 128, not 1, 128, 32."""
    return (isinstance(value, str), value if not isinstance(value, str) else 0, str(value))
