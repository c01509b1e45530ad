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


def _reads_a_cache(kind: str) -> bool:
    """Whether a layer kind's decode step reads a cache that grows with the context (GQA, MLA)."""
    return bool(models.LAYERS[kind].cache_bytes_per_token())


def layer_times(decode: pd.DataFrame, B: int, T: int) -> dict[str, float]:
    """kind -> the fastest provider's ms for one step at batch B (cache layers at context T, fixed-state
    layers at whatever context they were timed); kinds without a timed row are left out."""
    timed = decode[decode["ms"].notna() & (decode["B"] == B)]
    times = {}
    for kind, rows in timed.groupby("layer"):
        if _reads_a_cache(kind):
            rows = rows[rows["T"] == T]
        if len(rows):
            times[kind] = float(rows["ms"].min())
    return times


def step_against_context(decode: pd.DataFrame) -> pd.DataFrame:
    """µs of one decode step of each layer kind (columns: the fastest provider's time, `layer_times`) against
    the context (rows), for each batch the table holds: the cache layers as timed at each context, each
    fixed-state layer's one time at every context (its step does not read the context). Rows (B, T)."""
    timed = decode[decode["ms"].notna()]
    contexts = sorted(timed.loc[timed["layer"].map(_reads_a_cache), "T"].unique())
    batches = sorted(timed["B"].unique())
    rows = {(int(B), int(T)): {kind: ms * 1000 for kind, ms in layer_times(decode, B, T).items()}
            for B in batches for T in contexts}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(list(rows), names=["B", "T"])
    return table


def _crossing(times: pd.Series, fixed: float) -> str:
    """Where a cache layer's step times (µs, indexed by context) pass `fixed`, on log-log axes between the two
    measured contexts around it; below the shortest or past the longest context timed, a bound; "not timed"
    where either side has no time at this batch."""
    from ..plot import size_label

    times = times.dropna()
    if times.empty or math.isnan(fixed):
        return "not timed"
    T, t = times.index.to_numpy(float), times.to_numpy(float)
    if t[0] >= fixed:
        return f"< {size_label(T[0])}"
    for (T0, t0), (T1, t1) in zip(zip(T, t), zip(T[1:], t[1:])):
        if t1 >= fixed:
            at = T0 * (T1 / T0) ** (math.log(fixed / t0) / math.log(t1 / t0))
            return f"≈ {size_label(round(at / 1024) * 1024)}"
    return f"> {size_label(T[-1])}"


def time_crossovers(decode: pd.DataFrame) -> pd.DataFrame:
    """The context at which each cache layer's decode step (columns, per batch) becomes slower than each
    fixed-state layer's (rows), from `step_against_context`: "≈ 9K" interpolated between two measured contexts,
    "< 4K" where the cache layer is already slower at the shortest context timed, "> 64K" where it is still
    faster at the longest, "not timed" where either layer has no time at that batch."""
    steps = step_against_context(decode)
    pairs = [(B, c) for B in steps.index.unique("B") for c in steps if _reads_a_cache(c)]
    states = [k for k in steps if not _reads_a_cache(k)]
    return pd.DataFrame([[_crossing(steps.loc[B, c], steps.loc[B, s].iloc[0]) for B, c in pairs] for s in states],
                        index=pd.Index([models.layer_label(s) for s in states], name="fixed state"),
                        columns=pd.MultiIndex.from_tuples([(B, models.layer_label(c)) for B, c in pairs],
                                                          names=["B", "cache slower than the state from T ="]))


def plot_step_against_context(decode: pd.DataFrame):
    """One decode step's time against the context (log-log), one panel per batch: the cache layers' steps
    (solid) grow with the context, the fixed-state layers' (dashed) do not. None before the table is
    measured."""
    from ..plot import column_figure, figure_title, log2_axis, styled

    if decode.empty or not decode["ms"].notna().any():
        return None
    steps = step_against_context(decode)
    markers = dict(zip(models.LAYERS, "osDv^p"))

    @styled
    def draw():
        import matplotlib.pyplot as plt

        batches = list(steps.index.unique("B"))
        fig, axes = column_figure(len(batches), height=2.9, sharex=True)
        for ax, B in zip(axes, batches):
            part = steps.loc[B]
            for kind in sorted(part, key=lambda k: not _reads_a_cache(k)):      # the caches first
                cache = _reads_a_cache(kind)
                ax.plot(part.index, part[kind], marker=markers.get(kind, "o") if cache else None,
                        linestyle="-" if cache else "--", label=models.layer_label(kind))
            ax.set_yscale("log")
            log2_axis(ax, part.index)
            ax.set_ylabel("µs per step")
            ax.set_title(f"B = {B}", loc="left")
        axes[-1].set_xlabel("context length T (tokens)")
        entries = {}
        for ax in axes:     # every kind once, whichever panel drew it
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=2, fontsize=8)
        fig.suptitle(figure_title("One decode step of one layer, the fastest kernel of each kind",
                                  decode.attrs.get("meta", {}).get("gpu", "")), fontsize=11)
        plt.close(fig)  # shown once, as the cell's value
        return fig
    return draw()


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
