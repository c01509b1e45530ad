"""The book's figures: one style for every chart and diagram.

One panel per figure at the full width of the book's text column (a chapter with two panels stacks
them), a colour *and* a marker fixed per provider (the book's kernels in cool hues from indigo to
teal, each with its own marker; every peer its own warmer or greyer hue), the ceiling as a dashed line always called
"roofline", a log-2 length axis, and a title that names the GPU and the shape.

The style lives in a context (`styled`), never in matplotlib's global settings.
"""
from __future__ import annotations

import dataclasses
import functools
import textwrap

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from .bench import UNITS

# The text column of the rendered book is about 730-760 px wide at a 1280 px window. A figure 7 inches
# wide at 110 dpi is a 770 px PNG: shown at the column width (scaled by 0.9 at most), 10-point tick
# labels stay 13-15 px tall.
COLUMN_INCHES = 7.0
DPI = 110
COLUMN_PX = int(COLUMN_INCHES * DPI)
PANEL_HEIGHT = 3.6  # inches per stacked panel

STYLE = {
    "figure.dpi": DPI, "savefig.dpi": DPI, "font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11,
    "xtick.labelsize": 10, "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 12,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
    "legend.frameon": False, "figure.constrained_layout.use": True,
}


def styled(figure_function):
    """Decorator: draw under the house style (STYLE), leaving matplotlib's global settings as they were."""
    @functools.wraps(figure_function)
    def draw(*args, **kwargs):
        with plt.rc_context(STYLE):
            return figure_function(*args, **kwargs)
    return draw


def column_figure(nrows: int = 1, height: float = PANEL_HEIGHT, **kwargs):
    """A figure the width of the text column with `nrows` panels stacked (call inside `styled`).
    Returns (fig, axes) with axes a list of length nrows."""
    fig, axes = plt.subplots(nrows, 1, figsize=(COLUMN_INCHES, height * nrows), squeeze=False, **kwargs)
    return fig, list(axes[:, 0])


# ------------------------------------------------------------------ who is drawn how
@dataclasses.dataclass(frozen=True)
class LineStyle:
    color: str
    marker: str
    linestyle: str = "-"
    linewidth: float = 1.8


# The book's kernels in figures of measurements: cool hues from indigo to teal, each variant its own hue and
# marker (the first, navy, the boldest), so that a chapter's six variants stay apart. Diagrams shade their
# boxes with the blues.
BOOK_HUES = ["#0b3d91", "#2b9bd8", "#138d90", "#5b5bd6", "#7a9cc6", "#5fc4c9"]
BOOK_MARKERS = ["o", "D", "p", "H", "8", "d"]  # none of them a peer's marker
BOOK_BLUES = ["#0b3d91", "#3a7bd5", "#79aee8", "#1d5fa8", "#a9cdf2"]
BOOK_COLOR = BOOK_HUES[0]
# Peers: a hue each, learnt once and kept in every chapter. Prefix matches ("fla chunk_gla" is fla).
PEERS = {
    "SDPA flash": LineStyle("#e6862e", "s"),
    "SDPA cuDNN": LineStyle("#2e9e5b", "^"),
    "eager": LineStyle("#6f6f6f", "x"),
    "PyTorch absorbed": LineStyle("#8c564b", "P"),
    "PyTorch naive": LineStyle("#d6a05c", "X"),
    "PyTorch step loop": LineStyle("#d6a05c", "X"),
    "PyTorch step": LineStyle("#8c564b", "P"),
    "PyTorch": LineStyle("#8c564b", "P"),
    "fla": LineStyle("#c0392b", "v"),
    "FlashMLA": LineStyle("#8e44ad", "*"),
    "TileLang": LineStyle("#17a2b8", "h"),
}
# For a peer the book has not met yet: colours none of the above uses.
SPARE = [LineStyle("#e377c2", "<"), LineStyle("#bcbd22", ">"), LineStyle("#9467bd", "1"), LineStyle("#ff9896", "2")]
ROOFLINE = "roofline"  # the one name of the ceiling, in every figure and table
ROOFLINE_STYLE = {"color": "#222222", "linestyle": "--", "linewidth": 1.3}


def is_book(provider: str) -> bool:
    """The book's own kernels are labelled 'book' or 'book: <variant>'."""
    return provider == "book" or provider.startswith("book:")


def _peer_style(provider: str) -> LineStyle | None:
    for name in sorted(PEERS, key=len, reverse=True):  # the longest matching name wins
        if provider == name or provider.startswith(name + " "):
            return PEERS[name]
    return None


def provider_style(providers) -> dict[str, LineStyle]:
    """provider -> LineStyle for one figure: the book's kernels in distinct cool hues and markers (in the
    order given), each peer its fixed colour and marker; no two providers of a figure look alike."""
    style, book_i, spare_i = {}, 0, 0
    for p in dict.fromkeys(providers):
        if is_book(p):
            i = book_i % len(BOOK_HUES)
            style[p] = LineStyle(BOOK_HUES[i], BOOK_MARKERS[i], "-", 2.6 if i == 0 else 2.0)
            book_i += 1
            continue
        s = _peer_style(p)
        taken = {(v.color, v.marker) for v in style.values()}
        if s is None or (s.color, s.marker) in taken:
            s = SPARE[spare_i % len(SPARE)]
            spare_i += 1
        style[p] = s
    return style


# ------------------------------------------------------------------ lines
def plot_providers(ax, df: pd.DataFrame, x: str, y: str, providers) -> None:
    """One line per provider (in the house style) of `y` against `x`; providers with no data are skipped."""
    styles = provider_style(providers)
    for p in providers:
        rows = df[df["provider"] == p].sort_values(x)
        if y in rows and rows[y].notna().any():
            s = styles[p]
            ax.plot(rows[x], rows[y], linestyle=s.linestyle, color=s.color, lw=s.linewidth, marker=s.marker,
                    ms=6, label=p, zorder=3 if is_book(p) else 2)


def plot_roofline(ax, df: pd.DataFrame, x: str, y: str) -> None:
    """The roofline, dashed: for each x, the best any implementation could do for that shape (max of FLOPs
    at the matmul ceiling and bytes at the copy ceiling, both measured in the same run). Drawn for y in
    ms, us, tflops and gbps."""
    if y in ("ms", "us"):
        ref = df.drop_duplicates(x).sort_values(x)
        ax.plot(ref[x], ref["roofline_ms"] * (1000.0 if y == "us" else 1.0), label=ROOFLINE, **ROOFLINE_STYLE)
    elif y in ("tflops", "gbps"):  # every provider does the same work: any timed row converts
        ref = df[df["ms"].notna()].drop_duplicates(x).sort_values(x)
        ax.plot(ref[x], ref[y] * ref["ms"] / ref["roofline_ms"], label=ROOFLINE, **ROOFLINE_STYLE)


def size_label(v) -> str:
    """1024 -> '1K', 32768 -> '32K', 1048576 -> '1M', 8 -> '8'."""
    v = float(v)
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if v >= n and v % (n // 4 or 1) == 0:
            return f"{v / n:g}{unit}"
    return f"{v:g}"


def log2_axis(ax, values) -> None:
    """A log-2 x axis with a tick at each measured value, labelled 1K, 2K, ..."""
    ticks = sorted({float(v) for v in values if v == v and v > 0})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: size_label(v)))


BETTER = {"ms": "lower is better", "us": "lower is better", "tflops": "higher is better", "gbps": "higher is better",
          "pct_roofline": "higher is better", "peak_gib": "lower is better", "tokens_per_s": "higher is better"}
# the columns a figure may draw: the tables' own, and a throughput a chapter derives from a table's times
AXIS_UNITS = {**UNITS, "tokens_per_s": "tokens per second"}


def y_label(y: str) -> str:
    """The unit of y and which way is better: 'TFLOP/s (higher is better)'."""
    return f"{AXIS_UNITS.get(y, y)} ({BETTER[y]})" if y in BETTER else AXIS_UNITS.get(y, y)


def figure_title(title: str, gpu: str = "", width: int = 72) -> str:
    """The title, the GPU appended, wrapped to fit the column."""
    text = f"{title} — {gpu}" if gpu and gpu != "cpu" else title
    return "\n".join(textwrap.wrap(text, width))


@styled
def plot_results(df: pd.DataFrame, x: str = "T", y: str = "tflops", col: str | None = None,
                 title: str = "", roofline: bool = True, logy: bool = False, xlabel: str | None = None):
    """Draw `y` against `x` (log-2 axis), one line per provider; with `col`, one panel per value of
    `col`, stacked, each the full column width.

    df: a table from `attention_kernels.bench.run` (its metadata names the GPU).
    y: 'ms', 'us', 'tflops', 'gbps', 'pct_roofline', 'peak_gib', or 'tokens_per_s' (a column the caller
        adds: tokens a second, B·T over the time). The roofline is drawn for ms/us,
        tflops and gbps: the fastest any implementation could go for that shape.
    Returns the matplotlib Figure (a notebook shows it as a PNG the width of the text column), or None
    for a table with no rows (not measured yet).

    >>> fwd = run(fab.FORWARD)
    >>> plot_results(fwd, y="tflops", col="causal", title="Attention forward, B=1, H=32, D=128, bf16")
    """
    if df.empty:  # a table not measured yet: its provenance line says so, and there is nothing to draw
        return None
    data = df.copy()
    data["us"] = data["ms"] * 1000
    panels = sorted(data[col].unique(), key=natural_order) if col else [None]
    fig, axes = column_figure(len(panels), sharex=True)
    providers = list(dict.fromkeys(data["provider"]))
    for ax, value in zip(axes, panels):
        part = data if col is None else data[data[col] == value]
        plot_providers(ax, part, x, y, providers)
        if roofline:
            plot_roofline(ax, part, x, y)
        log2_axis(ax, data[x].unique())
        if logy:
            ax.set_yscale("log")
        elif y in ("tflops", "gbps", "pct_roofline", "tokens_per_s"):
            ax.set_ylim(bottom=0)
        if y == "tokens_per_s":   # millions, without an offset label above the axis
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / 1e6:g}M" if v else "0"))
        ax.set_ylabel(y_label(y))
        if col:
            ax.set_title(f"{col} = {value}", loc="left")
    axes[-1].set_xlabel(xlabel or x)
    entries = {}
    for ax in axes:  # every provider once: the book's kernels first, then the peers, the roofline last
        for h, lab in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(lab, h)
    labels = sorted(entries, key=lambda lab: (lab == ROOFLINE, not is_book(lab)))
    handles = [entries[lab] for lab in labels]
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3))
    fig.suptitle(figure_title(title, df.attrs.get("meta", {}).get("gpu", "")))
    plt.close(fig)  # shown once, as the cell's value, not again by the inline backend
    return fig


def natural_order(value):
    """Numbers in numeric order, then strings: panels read 1, 32, 128, not 1, 128, 32."""
    return (isinstance(value, str), value if not isinstance(value, str) else 0, str(value))
