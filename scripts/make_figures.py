"""Draw the book's headline figure (book/images/headline.png) from the committed H200 tables.

Runs anywhere: it reads results/, it times nothing. One panel per chapter: the book's
kernel against its strongest peers, in the unit that chapter reads best.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernels.bench import load  # noqa: E402
from kernels.plot import plot_providers  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "images" / "headline.png"

# (results table, rows to keep, x column, metric, providers to draw, panel title)
PANELS = [
    ("flash_attn_fwd", {"causal": False}, "N", "tflops", ("book", "SDPA cuDNN", "SDPA flash"),
     "FlashAttention-2 forward, non-causal\nB=1, H=32, D=128"),
    ("mla_decode", {"B": 128}, "T", "tflops", ("book", "PyTorch absorbed"),
     "MLA decode\nB=128, H=128, one query token"),
    ("gla_prefill", {"B": 1}, "T", "ms", ("book: chunk", "fla chunk_gla", "SDPA flash"),
     "GLA prefill (SDPA: causal softmax)\nB=1, H=32, D=128"),
]
LABELS = {"tflops": "TFLOP/s (higher is better)", "ms": "time, ms (lower is better)"}


def main():
    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 4.0))
    gpu = None
    for ax, (name, keep, x, metric, providers, title) in zip(axes, PANELS):
        try:
            df = load(name)
        except (FileNotFoundError, ValueError) as e:
            ax.text(0.5, 0.5, f"no results\n({e.__class__.__name__})", ha="center", transform=ax.transAxes)
            continue
        gpu = df.attrs["meta"]["gpu"]
        for col, value in keep.items():
            if col in df.columns:
                df = df[df[col] == value]
        plot_providers(ax, df, x, metric, providers)
        if metric == "tflops":  # the matmul ceiling measured in the same run
            ax.axhline(df.attrs["meta"]["peak_tflops"], ls="--", color="#555555", lw=1.2, label="bf16 matmul ceiling")
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        ax.legend(fontsize=8, loc="best")
        ax.set_ylabel(LABELS[metric])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length" if x == "N" else "context length T")
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"The book's kernels (blue) against their peers — measured on {gpu or 'the GPU'}", fontsize=12)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
