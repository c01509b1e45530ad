"""Every listing a chapter shows is the package's current code.

The chapters show the package's code with `show_source(obj)`. When a kernel changes, the page would
show old code until its listings are refreshed: `make listings` (scripts/refresh_listings.py) rewrites
those outputs from the source on any machine, without executing another cell. This test reads each
committed notebook, binds the names its import statements bind (no kernel is launched), and compares
what `show_source` returns now with the text stored in the cell. A failure names the chapter, the
cell and the object, and says to run `make listings`. The listings' prose (docstrings and comment lines)
is also held to the text column's width, TEXT_WIDTH characters.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import io
import json
import textwrap
import tokenize
from pathlib import Path

import pytest

pytest.importorskip("IPython")  # attention_kernels.notebook needs it, as the chapters do

from attention_kernels.bench import TEXT_WIDTH  # noqa: E402
from attention_kernels.notebook import chapter_names, show_source, shown_listings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def _stored_text(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") in ("execute_result", "display_data") and "text/plain" in out.get("data", {}):
            text = out["data"]["text/plain"]
            return "".join(text) if isinstance(text, list) else text
    return None


def _cases():
    return [pytest.param(path, index, expr, id=f"{path.stem}-{expr}")
            for path in CHAPTERS for index, expr in shown_listings(path)]


_NAMES: dict[Path, dict] = {}


def test_chapters_show_listings():
    """The collection below is not empty: the chapters do show code (or this test reads nothing)."""
    assert _cases(), "no show_source(...) cell found in book/*.ipynb"


@pytest.mark.parametrize("path, index, expr", _cases())
def test_listing_is_current(path, index, expr):
    names = _NAMES.setdefault(path, chapter_names(path))
    cell = json.loads(path.read_text())["cells"][index]
    stored = _stored_text(cell)
    if stored is None:
        pytest.fail(f"{path.name}: the cell `show_source({expr})` has no stored output; run `make listings`")
    now = show_source(eval(expr, names)).data
    if stored.rstrip("\n") != now.rstrip("\n"):
        diff = "\n".join(difflib.unified_diff(stored.splitlines(), now.splitlines(), "in the notebook",
                                              "in the package", lineterm="", n=1))
        pytest.fail(f"{path.name}: the listing of `{expr}` is stale; run `make listings`.\n{diff[:3000]}")


def test_refresh_rewrites_a_stale_listing(tmp_path):
    """`make listings` mends what this file catches: a listing made stale is rewritten from the source
    and every other cell's outputs are left byte for byte."""
    from attention_kernels.notebook import refresh_listings

    chapter = next(p for p in CHAPTERS if shown_listings(p))
    index, expr = shown_listings(chapter)[0]
    nb = json.loads(chapter.read_text())
    nb["cells"][index]["outputs"][0]["data"]["text/plain"] = ["def stale():\n", "    pass\n"]
    copy = tmp_path / chapter.name
    copy.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    assert refresh_listings(copy) == [expr]
    fresh = json.loads(copy.read_text())["cells"]
    assert "".join(fresh[index]["outputs"][0]["data"]["text/plain"]).rstrip("\n") == \
        show_source(eval(expr, chapter_names(chapter))).data.rstrip("\n")
    others = [c.get("outputs") for i, c in enumerate(nb["cells"]) if i != index]
    assert others == [c.get("outputs") for i, c in enumerate(fresh) if i != index]


def _listed_name(obj) -> str:
    """The module and qualified name of what `show_source(obj)` shows (a kernel's Python function, a
    cached or registered function's own)."""
    while hasattr(obj, "fn") and not inspect.isfunction(obj):
        obj = obj.fn
    obj = inspect.unwrap(obj)
    return obj.__name__ if inspect.ismodule(obj) else f"{obj.__module__}.{obj.__qualname__}"


def prose_lines(source: str) -> list[tuple[int, str]]:
    """(line number, line) of a listing's prose: the docstrings of its module, classes and functions, and
    the lines that hold only a comment (a comment after code belongs to a code line)."""
    text = textwrap.dedent(source)
    numbers = set()
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(node, clean=False) is not None):
            numbers.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    lines = source.splitlines()
    numbers.update(token.start[0] for token in tokenize.generate_tokens(io.StringIO(text).readline)
                   if token.type == tokenize.COMMENT and not token.line[:token.start[1]].strip())
    return [(number, lines[number - 1]) for number in sorted(numbers)]


def test_prose_lines_finds_docstrings_and_comment_lines():
    source = textwrap.dedent('''\
        @decorator
        def f(x):
            """One line,
            and two."""
            # a comment line
            y = "# not a comment"  # after code: part of a code line
            return y
        ''')
    assert [number for number, _ in prose_lines(source)] == [3, 4, 5]
    assert [number for number, _ in prose_lines(textwrap.indent(source, "    "))] == [3, 4, 5]


@pytest.mark.parametrize("path, index, expr", _cases())
def test_listing_prose_fits_the_column(path, index, expr):
    """A listing's docstrings and comment lines are within TEXT_WIDTH characters, the width of the text
    column (attention_kernels.bench): prose wrapped by the browser breaks mid-phrase under a hanging indent.
    Code lines are not held to it: they wrap in the column by themselves (`Listing`)."""
    obj = eval(expr, _NAMES.setdefault(path, chapter_names(path)))
    wide = [f"line {number}: {len(line)} characters: {line.strip()[:60]!r}"
            for number, line in prose_lines(show_source(obj).data) if len(line) > TEXT_WIDTH]
    name = _listed_name(obj)
    assert not wide, (f"{path.name}: `{expr}` ({name}) has docstring or comment lines over {TEXT_WIDTH} "
                      "characters; rewrap them (then `make listings`):\n" + "\n".join(wide))
