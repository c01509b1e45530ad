"""Draw the book's headline figure (book/images/headline.png) from the committed H200 tables.

Runs anywhere: it reads results/, it times nothing. One panel per chapter, the book's
kernel against its strongest peer, in % of the roofline measured in the same run.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernels.bench import load  # noqa: E402
from kernels.plot import provider_style  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "images" / "headline.png"

# (results table, rows to keep, x column, panel title)
PANELS = [
    ("flash_attn_fwd", {"causal": False}, "N", "FlashAttention-2 forward\nB=1, H=32, D=128, bf16"),
    ("mla_decode", {"B": 128}, "T", "MLA decode\nB=128, H=128, s_q=1, bf16"),
    ("gla_prefill", {"B": 1}, "T", "GLA chunked prefill\nB=1, H=32, D=128, bf16"),
]


def main():
    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 4.0))
    gpu = None
    handles = {}
    for ax, (name, keep, x, title) in zip(axes, PANELS):
        try:
            df = load(name)
        except (FileNotFoundError, ValueError) as e:
            ax.text(0.5, 0.5, f"no results\n({e.__class__.__name__})", ha="center", transform=ax.transAxes)
            continue
        gpu = df.attrs["meta"]["gpu"]
        for col, value in keep.items():
            if col in df.columns:
                df = df[df[col] == value]
        styles = provider_style(df["provider"].unique())
        for provider, rows in df.groupby("provider", sort=False):
            rows = rows.sort_values(x)
            if rows["pct_roofline"].notna().any():
                c, ls, lw = styles[provider]
                (h,) = ax.plot(rows[x], rows["pct_roofline"], ls, color=c, lw=lw, marker="o", ms=3.5, label=provider)
                ax.legend(fontsize=8, loc="lower right")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 100)
        ax.set_xlabel("sequence length" if x == "N" else "context length T")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("% of roofline (higher is better)")
    fig.suptitle(f"The book's kernels (blue) against their peers — measured on {gpu or 'the GPU'}", fontsize=12)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
