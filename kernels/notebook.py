"""Helpers for the chapters' notebooks: show the package's code, and the interactive widgets.

Only notebooks import this module (it needs IPython, and ipywidgets for the widgets); the kernels,
references and benchmarks work in a plain Python process without it.
"""
from __future__ import annotations

import inspect

import pandas as pd
import torch
from IPython.display import Code, display

from .plot import natural_order, plot_results


def show_source(obj) -> Code:
    """Return the source of a function, class or module as a highlighted Python block.

    Triton kernels are unwrapped first, so `show_source(_attn_fwd_kernel)` shows the
    `@triton.jit` function as written, decorators included.
    """
    target = getattr(obj, "fn", obj)  # triton JITFunction / Autotuner / Heuristics wrap .fn
    while hasattr(target, "fn") and not inspect.isfunction(target):
        target = target.fn
    return Code(inspect.getsource(target), language="python")


class WithStaticFallback:
    """An ipywidget whose plain-text form is `text`. A live kernel shows the controls; the
    rendered (static) book cannot run them and shows `text` instead."""

    def __init__(self, widget, text: str):
        self.widget, self.text = widget, text

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text
        return bundle


def explore(df: pd.DataFrame, x: str = "T", title: str = "", filters: tuple[str, ...] = ()):
    """Show the standard figure, then ipywidgets controls to change the metric and filters.

    The controls redraw below themselves only when changed, so executing the notebook (on
    the GPU, under nbval, or into the rendered HTML) gives the same two outputs: the static
    figure and the widget, whose plain-text form says how to use it.
    """
    import ipywidgets as w

    metrics = [m for m in ("tflops", "gbps", "ms", "pct_roofline") if df[m].notna().any()]
    choices = {f: sorted(df[f].unique().tolist(), key=natural_order) for f in filters}
    controls = {"metric": w.Dropdown(options=metrics, value=metrics[0], description="metric"),
                "logy": w.Checkbox(value=False, description="log y")}
    controls.update({f: w.Dropdown(options=v, value=v[0], description=f) for f, v in choices.items()})
    out = w.Output()

    def redraw(_change):
        picked = {f: controls[f].value for f in choices}
        with out:
            out.clear_output(wait=True)
            display(plot_results(_subset(df, picked), x=x, y=controls["metric"].value, title=title,
                                 logy=controls["logy"].value))

    for control in controls.values():
        control.observe(redraw, names="value")
    display(plot_results(_subset(df, {f: v[0] for f, v in choices.items()}), x=x, y=metrics[0], title=title))
    return WithStaticFallback(w.VBox([w.HBox(list(controls.values())), out]),
                              "Interactive explorer: run the notebook in Jupyter to use the controls.")


def _subset(df, picked):
    part = df
    for f, v in picked.items():
        part = part[part[f] == v]
    part = part.copy()
    part.attrs = df.attrs
    return part


def online_softmax_explorer(x: torch.Tensor, block: int):
    """ipywidgets step-through of `online_softmax_steps`: a slider picks how many blocks have been
    seen; it prints the running max and sum and the partial softmax they imply so far. The
    rendered book, which cannot run the slider, shows every step as text instead."""
    import ipywidgets as w

    from .flash_attn.reference import online_softmax_steps

    steps, _ = online_softmax_steps(x, block)

    def describe(seen):
        s = steps[seen - 1]
        n = min(seen * block, x.numel())
        partial = torch.exp(x[:n] - s["m"]) / s["l"]
        lines = [f"after block {seen - 1}: m = {s['m']:.4f}, l = {s['l']:.4f}",
                 "softmax over the keys seen so far: " + " ".join(f"{p:.3f}" for p in partial.tolist())]
        if seen == len(steps):
            lines.append(f"all blocks seen: equals torch.softmax(x): {torch.allclose(partial, torch.softmax(x, 0))}")
        return "\n".join(lines)

    slider = w.IntSlider(value=1, min=1, max=len(steps), description="blocks seen")
    out = w.Output()
    out.append_stdout(describe(1) + "\n")  # the first view, without executing anything

    def on_change(change):
        out.clear_output()
        out.append_stdout(describe(change["new"]) + "\n")

    slider.observe(on_change, names="value")
    return WithStaticFallback(w.VBox([slider, out]), "\n\n".join(describe(i) for i in range(1, len(steps) + 1)))
