"""A hybrid stack's decode step, modelled from the per-layer times of the DECODE table, and the memory
its sequences hold, as a table of the main cases (the notebook's control: `attention_kernels.notebook.hybrid_explorer`).

    >>> decode = run(bench.DECODE)
    >>> hybrid_table(decode)                   # every pair, ratio, context and batch below
    >>> attention_kernels.notebook.hybrid_explorer(decode)   # the same, one case at a time (ipywidgets)

The time model is `models.stack_time`: count x the fastest measured step of each layer kind at that
batch and context (the fixed-state steps measured once, at any context). Every layer is timed at the
shape of `models.LAYERS` (Kimi Linear's MLA layers have 32 heads, the timed one DeepSeek-V3's 128: an
upper bound there).
"""
from __future__ import annotations

import math

import pandas as pd

from . import models
from .models import GIB, ratio_stack, stack_bytes, stack_time

# name -> (fixed-state layer, cache layer, attention layers of the model)
PAIRS = {
    "Kimi Linear": (models.KIMI_KDA, models.KIMI_MLA, 27),
    "MiniMax-01": (models.MINIMAX_LIGHTNING, models.MINIMAX_GQA, 80),
    "Nemotron-H 8B": (models.NEMOTRON_MAMBA2, models.NEMOTRON_GQA, 28),
}
RATIOS = {"all softmax": 0, "1 : 1": 1, "3 : 1": 3, "7 : 1": 7, "all linear": None}
CONTEXTS = (16384, 65536)
BATCHES = (1, 64)


def layer_times(decode: pd.DataFrame, B: int, T: int) -> dict[str, float]:
    """kind -> the fastest provider's ms for one step at batch B (cache layers at context T, fixed-state
    layers at whatever context they were timed); kinds without a timed row are left out."""
    timed = decode[decode["ms"].notna() & (decode["B"] == B)]
    times = {}
    for kind, rows in timed.groupby("layer"):
        if kind in ("GQA", "MLA"):
            rows = rows[rows["T"] == T]
        if len(rows):
            times[kind] = float(rows["ms"].min())
    return times


def hybrid_case(decode: pd.DataFrame, pair: str, linear_per_softmax: int | None, T: int, B: int) -> dict:
    """One case: the stack's layer mix, its memory for B sequences of T tokens (GiB) and its modelled
    decode step (ms; NaN where a layer's time is not measured)."""
    linear, cache, layers = PAIRS[pair]
    stack = ratio_stack(linear, cache, linear_per_softmax, layers)
    times = layer_times(decode, B, T)
    try:
        ms = stack_time(stack, times)
    except ValueError:  # a layer kind without a measured step
        ms = math.nan
    return {"stack": " + ".join(f"{n} {layer.kind}" for layer, n in stack),
            "GiB": stack_bytes(stack, T, batch=B) / GIB, "step ms": ms}


def hybrid_table(decode: pd.DataFrame, pairs=tuple(PAIRS), ratios=("all softmax", "3 : 1", "7 : 1", "all linear"),
                 contexts=CONTEXTS, batches=BATCHES) -> pd.DataFrame:
    """Every combination of the given pairs, ratios, contexts and batches, one row each."""
    rows = [{"model": pair, "ratio": r, "T": T, "B": B, **hybrid_case(decode, pair, RATIOS[r], T, B)}
            for pair in pairs for r in ratios for T in contexts for B in batches]
    return pd.DataFrame(rows).set_index(["model", "ratio", "T", "B"])


def describe(case: dict) -> str:
    step = "not measured" if math.isnan(case["step ms"]) else f"{case['step ms'] * 1000:.0f} µs"
    return f"{case['stack']}: {case['GiB']:.1f} GiB, step {step}"


def plot_memory(contexts=(4096, 16384, 65536, 262144, 1048576), model_names=tuple(models.MODELS)):
    """GiB one sequence holds against its context length, one line per model (log-log): caches rise
    with T, fixed states stay flat."""
    from ..plot import column_figure, log2_axis, styled

    @styled
    def draw():
        import matplotlib.pyplot as plt

        fig, (ax,) = column_figure(height=3.4)
        for name in model_names:
            m = models.MODELS[name]
            ax.plot(contexts, [m.bytes_per_sequence(T) / GIB for T in contexts], marker="o", label=name)
        ax.set_yscale("log")
        log2_axis(ax, contexts)
        ax.set_xlabel("context length T (tokens)")
        ax.set_ylabel("GiB per sequence")
        ax.set_title("Cache and state of one sequence, whole model", fontsize=11)
        ax.legend(fontsize=8, ncol=2)
        plt.close(fig)  # shown once, as the cell's value
        return fig
    return draw()


def plot_layer_memory(contexts=models.LAYER_CONTEXTS, layers=models.LAYERS):
    """MiB one sequence keeps in one layer of each kind against its context length (log-log), at the layer
    shapes the decode table times (`models.layer_memory`): the caches (solid) rise with T, the fixed states
    (dashed) stay flat. `models.memory_crossovers` gives where they cross."""
    from ..plot import column_figure, figure_title, log2_axis, styled

    memory = models.layer_memory(contexts, layers) / models.MIB
    markers = dict(zip(layers, "osDv^p"))

    @styled
    def draw():
        import matplotlib.pyplot as plt

        fig, (ax,) = column_figure(height=3.6)
        for kind, layer in layers.items():
            cache = bool(layer.cache_bytes_per_token())
            ax.plot(memory.index, memory[kind], marker=markers.get(kind, "o"), linestyle="-" if cache else "--",
                    label=models.layer_label(kind, layers) + (" (cache)" if cache else " (state)"))
        ax.set_yscale("log")
        log2_axis(ax, contexts)
        ax.set_xlabel("context length T (tokens)")
        ax.set_ylabel("MiB per sequence, one layer")
        ax.set_title(figure_title("Cache or state of one sequence in one layer of each kind"), fontsize=11)
        ax.legend(fontsize=8, ncol=2, loc="upper left")
        plt.close(fig)  # shown once, as the cell's value
        return fig
    return draw()
