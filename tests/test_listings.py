"""Every listing a chapter shows is the package's current code.

The chapters show the package's code with `show_source(obj)` and are committed with the outputs of
their GPU run. When a kernel changes and the chapter is not re-executed, the page would show old
code. This test reads each committed notebook, rebuilds the names it imports (only its import
statements are run, no kernel), evaluates the argument of each `show_source(...)` cell against the
installed package, and compares what `show_source` returns now with the text stored in the cell.
No GPU and no notebook kernel are needed; a failure names the chapter, the cell and the object.
"""
from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import pytest

pytest.importorskip("IPython")  # kernels.notebook needs it, as the chapters do

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def _source(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def _imports(cells) -> list[ast.stmt]:
    """Every top-level import statement of the notebook's code cells, in order."""
    found = []
    for cell in cells:
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:  # a cell with IPython magics: it cannot hold a plain import we need
            continue
        found += [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return found


def _listing_calls(cell) -> list[ast.expr]:
    """The arguments of the cell's `show_source(x)` if the cell ends with that expression (the
    output the notebook displays), else nothing."""
    try:
        tree = ast.parse(_source(cell))
    except SyntaxError:
        return []
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return []
    call = tree.body[-1].value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "show_source":
        return [call.args[0]] if len(call.args) == 1 else []
    return []


def _stored_text(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") in ("execute_result", "display_data") and "text/plain" in out.get("data", {}):
            text = out["data"]["text/plain"]
            return "".join(text) if isinstance(text, list) else text
    return None


def _cases():
    cases = []
    for path in CHAPTERS:
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(cells):
            for arg in _listing_calls(cell):
                cases.append(pytest.param(path, i, ast.unparse(arg), id=f"{path.stem}-{ast.unparse(arg)}"))
    return cases


_NAMESPACES: dict[Path, dict] = {}


def _namespace(path: Path) -> dict:
    """The names the notebook's import statements bind (computed once per notebook)."""
    if path not in _NAMESPACES:
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        ns: dict = {}
        for stmt in _imports(cells):
            try:
                exec(compile(ast.Module(body=[stmt], type_ignores=[]), str(path), "exec"), ns)
            except ImportError:  # a name no listing needs (a peer library absent here); a listing
                pass             # that needs it fails below with a NameError that names it
        _NAMESPACES[path] = ns
    return _NAMESPACES[path]


def test_chapters_show_listings():
    """The collection below is not empty: the chapters do show code (or this test reads nothing)."""
    assert _cases(), "no show_source(...) cell found in book/*.ipynb"


@pytest.mark.parametrize("path, index, expr", _cases())
def test_listing_is_current(path, index, expr):
    ns = _namespace(path)
    cell = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"][index]
    stored = _stored_text(cell)
    if stored is None:
        pytest.fail(f"{path.name}: the cell `show_source({expr})` has no stored output; execute the chapter")
    now = ns["show_source"](eval(expr, ns)).data
    if stored.rstrip("\n") != now.rstrip("\n"):
        diff = "\n".join(difflib.unified_diff(stored.splitlines(), now.splitlines(), "in the notebook",
                                              "in the package", lineterm="", n=1))
        pytest.fail(f"{path.name}: the listing of `{expr}` is stale; re-execute the chapter.\n{diff[:3000]}")
