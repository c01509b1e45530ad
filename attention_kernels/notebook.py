"""Helpers for the chapters' notebooks: show the package's code, and the interactive widgets.

Only notebooks import this module (it needs IPython, and ipywidgets for the widgets); the kernels,
references and benchmarks work in a plain Python process without it.
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from pathlib import Path

import pandas as pd
import torch
from IPython.display import Code, display

from .flash_attn.diagram import (ONLINE_SOFTMAX_BLOCK, online_softmax_blocks, online_softmax_example,
                                 online_softmax_table)
from .compare import hybrid
from .plot import natural_order, plot_results


def _unwrapped(obj):
    """A Triton or Gluon kernel's Python function (JITFunction, Autotuner and Heuristics wrap it as .fn)."""
    target = getattr(obj, "fn", obj)
    while hasattr(target, "fn") and not inspect.isfunction(target):
        target = target.fn
    return target


class Listing(Code):
    """Highlighted source whose long lines wrap inside the text column instead of running past it: each
    line is a `span.listing-line` carrying its indentation plus four as `--hang`, which the book's CSS
    (_ext/static/book.css) uses as a hanging indent, so a wrapped line continues under its own code."""

    def _repr_html_(self):
        from pygments import highlight
        from pygments.formatters import HtmlFormatter

        formatter = HtmlFormatter(linespans="line")
        lines = self.data.splitlines()

        def line_span(match):
            text = lines[int(match.group(1)) - 1]
            return f'<span class="listing-line" style="--hang: {len(text) - len(text.lstrip()) + 4}ch">'

        body = re.sub(r'<span id="line-(\d+)">', line_span, highlight(self.data, self._get_lexer(), formatter))
        return f"<style>{formatter.get_style_defs('.output_html')}</style>{body}"


def show_source(obj) -> Listing:
    """Return the source of a function, class or module as a highlighted Python block.

    Triton kernels are unwrapped first, so `show_source(_attn_fwd_kernel)` shows the
    `@triton.jit` function as written, decorators included.
    """
    return Listing(inspect.getsource(_unwrapped(obj)), language="python")


def _cell_source(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def shown_listings(notebook: str | Path) -> list[tuple[int, str]]:
    """The chapter's listings: (index among all its cells, the argument as written) for every code cell
    that ends with the expression `show_source(x)`, whose output the notebook displays."""
    found = []
    for index, cell in enumerate(json.loads(Path(notebook).read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_cell_source(cell))
        except SyntaxError:  # a cell with IPython magics shows no listing
            continue
        last = tree.body[-1] if tree.body else None
        call = last.value if isinstance(last, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "show_source"
                and len(call.args) == 1):
            found.append((index, ast.unparse(call.args[0])))
    return found


def chapter_names(notebook: str | Path) -> dict:
    """The names a chapter's top-level import statements bind, with no other cell run (no kernel
    launched); an import that fails (a peer library absent here) is left out."""
    names: dict = {}
    for cell in json.loads(Path(notebook).read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_cell_source(cell))
        except SyntaxError:
            continue
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                try:
                    exec(compile(ast.Module(body=[stmt], type_ignores=[]), str(notebook), "exec"), names)
                except ImportError:
                    pass
    return names


def listing_output(obj, execution_count: int) -> dict:
    """The output a Jupyter kernel stores for a cell ending with `show_source(obj)`."""
    from IPython.core.formatters import DisplayFormatter

    data, metadata = DisplayFormatter().format(show_source(obj))
    return {"output_type": "execute_result", "execution_count": execution_count,
            "data": data, "metadata": metadata}


def refresh_listings(notebook: str | Path) -> list[str]:
    """Rewrite the outputs of the chapter's `show_source` cells from the package's current source,
    without executing any other cell; every other output (the GPU run's) stays as it is. Returns the
    expressions whose listing changed. A cell never executed gets an execution count one past the
    code cell before it, so that strict nbval compares it from now on."""
    import nbformat

    path = Path(notebook)
    nb = nbformat.read(path, as_version=4)
    names = chapter_names(path)
    changed, count = [], 0
    listings = dict(shown_listings(path))
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        count = cell.execution_count or count + 1
        if index not in listings:
            continue
        fresh = nbformat.from_dict(listing_output(eval(listings[index], names), count))
        if cell.outputs != [fresh]:
            changed.append(listings[index])
            cell.execution_count, cell.outputs = count, [fresh]
    if changed:
        nbformat.write(nb, path)
    return changed


def code_lines(*objs) -> int:
    """Lines of code of the given functions or kernels, or of every Triton/Gluon kernel a given module
    defines: the lines that are not blank, comments or docstrings (decorators and signatures count)."""
    functions = []
    for obj in objs:
        if inspect.ismodule(obj):
            functions += [_unwrapped(f) for f in vars(obj).values()
                          if hasattr(f, "fn") and getattr(_unwrapped(f), "__module__", None) == obj.__name__]
        else:
            functions.append(_unwrapped(obj))
    total = 0
    for function in dict.fromkeys(functions):  # once each (an autotuned kernel wraps a kernel listed too)
        source = textwrap.dedent(inspect.getsource(function))
        docstrings = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
                docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
        total += sum(1 for number, line in enumerate(source.splitlines(), 1)
                     if line.strip() and not line.strip().startswith("#") and number not in docstrings)
    return total


class WithStaticFallback:
    """An ipywidget with a static form for pages that have no kernel (the rendered book).

    A live kernel shows `figure` (if any) and then the controls. Without a kernel the widget view cannot
    be drawn, so the page shows `figure` as a PNG and `text` (the widget's text/plain) instead; the
    site's configuration must rank the widget view below text/plain for that (in Jupyter Book, the
    mime type "application/vnd.jupyter.widget-view+json" given the priority null under
    `nb_mime_priority_overrides`: lower numbers win there, so a negative one would pick the widget).
    """

    def __init__(self, widget, text: str, figure=None):
        self.widget, self.text, self.figure = widget, text, figure

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text
        return bundle

    def _ipython_display_(self):
        if self.figure is not None:
            display(self.figure)  # its own output: a PNG, which every page can show
        display(self._repr_mimebundle_(), raw=True)


def explore(df: pd.DataFrame, x: str = "T", title: str = "", filters: tuple[str, ...] = ()):
    """ipywidgets controls to change the metric and filters of the standard figure, drawn below them.

    The figure lives inside the widget (first drawn with the first choices, redrawn when a control
    changes), so the cell's one output is the widget; a page without a kernel (the rendered book) shows
    its plain-text form, which says how to use it, and no second copy of a figure the chapter has drawn.
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
    out.append_display_data(plot_results(_subset(df, {f: v[0] for f, v in choices.items()}), x=x, y=metrics[0],
                                         title=title))
    return WithStaticFallback(w.VBox([w.HBox(list(controls.values())), out]),
                              "Interactive explorer: run the notebook in Jupyter to use the controls.")


def _subset(df, picked):
    part = df
    for f, v in picked.items():
        part = part[part[f] == v]
    part = part.copy()
    part.attrs = df.attrs
    return part


def online_softmax_text(x: torch.Tensor | None = None, block: int = ONLINE_SOFTMAX_BLOCK) -> str:
    """The online softmax of `x` a block at a time, as a text table: per block its scores, the running max
    m, the factor alpha = e^(m_old - m) that rescaled the running sum, and the running sum l after it."""
    x = online_softmax_example() if x is None else x
    rows = online_softmax_table(x, block)
    width = max(len(_scores(r["scores"])) for r in rows)
    lines = [f"{'block':<6} {'scores':<{width}}  {'m (max)':>8}  {'α (rescale)':>11}  {'ℓ (sum)':>8}"]
    for r in rows:
        alpha = "—" if r["alpha"] is None else f"{r['alpha']:.4f}"
        lines.append(f"{r['block']:<6} {_scores(r['scores']):<{width}}  {r['m']:>8.4f}  {alpha:>11}  {r['l']:>8.4f}")
    rescaled = [str(r["block"]) for r in rows if r["rescaled"]]
    lines.append("the max rose in block(s) " + ", ".join(rescaled) + ": the sum so far was multiplied by α there"
                 if rescaled else "the max never rose after block 0: no rescale was needed")
    p = torch.exp(x - rows[-1]["m"]) / rows[-1]["l"]
    lines.append(f"softmax from the final m and ℓ equals torch.softmax(x): {torch.allclose(p, torch.softmax(x, 0))}")
    return "\n".join(lines)


def _scores(values) -> str:
    return " ".join(f"{v:+.2f}" for v in values)


def online_softmax_explorer(x: torch.Tensor | None = None, block: int = ONLINE_SOFTMAX_BLOCK, figure: bool = True):
    """Step through `online_softmax_steps` with a slider (how many blocks have been seen): the running max
    and sum, the rescale factor, and the partial softmax they imply so far. Without a kernel (the rendered
    book) it shows the figure `online_softmax_blocks` and every step as a text table instead.

    x: 1-D float scores (default: the book's worked example, whose maximum is not in the first block);
    block: keys per block (default 4); figure: show `online_softmax_blocks(x, block)` above the controls
    (False where the chapter has drawn it already).

    >>> online_softmax_explorer()                  # the worked example, blocks of 4
    >>> online_softmax_explorer(torch.randn(20, dtype=torch.float64), block=5)
    """
    import ipywidgets as w

    x = online_softmax_example() if x is None else x
    rows = online_softmax_table(x, block)

    def describe(seen):
        r = rows[seen - 1]
        n = min(seen * block, x.numel())
        partial = torch.exp(x[:n] - r["m"]) / r["l"]
        alpha = "no earlier sum" if r["alpha"] is None else f"the old sum times α = {r['alpha']:.4f}"
        lines = [f"after block {seen - 1}: m = {r['m']:.4f}, ℓ = {r['l']:.4f} ({alpha})",
                 "softmax over the keys seen so far: " + " ".join(f"{p:.3f}" for p in partial.tolist())]
        if seen == len(rows):
            lines.append(f"all blocks seen: equals torch.softmax(x): {torch.allclose(partial, torch.softmax(x, 0))}")
        return "\n".join(lines)

    slider = w.IntSlider(value=1, min=1, max=len(rows), description="blocks seen")
    out = w.Output()
    out.append_stdout(describe(1) + "\n")  # the first view, without executing anything

    def on_change(change):
        out.clear_output()
        out.append_stdout(describe(change["new"]) + "\n")

    slider.observe(on_change, names="value")
    return WithStaticFallback(w.VBox([slider, out]), online_softmax_text(x, block),
                              figure=online_softmax_blocks(x, block) if figure else None)


def hybrid_explorer(decode: pd.DataFrame):
    """Dropdowns for the pair, the ratio, the context and the batch; the modelled case printed below them.
    Without a kernel (the rendered book) the page shows `hybrid_table`'s main cases as text instead."""
    import ipywidgets as w

    controls = {"pair": w.Dropdown(options=list(hybrid.PAIRS), description="model"),
                "ratio": w.Dropdown(options=list(hybrid.RATIOS), value="3 : 1", description="linear : softmax"),
                "T": w.Dropdown(options=[4096, 16384, 65536, 262144, 1048576], value=16384, description="context"),
                "B": w.Dropdown(options=list(hybrid.BATCHES), description="batch")}
    out = w.Output()

    def show(_change=None):
        c = {k: v.value for k, v in controls.items()}
        out.clear_output()
        case = hybrid.hybrid_case(decode, c["pair"], hybrid.RATIOS[c["ratio"]], c["T"], c["B"])
        out.append_stdout(hybrid.describe(case) + "\n")

    for control in controls.values():
        control.observe(show, names="value")
    show()
    static = hybrid.hybrid_table(decode, contexts=(16384,), batches=(64,))
    text = "\n".join(f"{m}, {r}: {hybrid.describe(row)}" for (m, r, _, _), row in static.iterrows())
    return WithStaticFallback(w.VBox([w.HBox(list(controls.values())[:2]), w.HBox(list(controls.values())[2:]), out]),
                              "Run the notebook to choose a case. At T = 16K, B = 64:\n" + text)
