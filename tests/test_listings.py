"""Every listing a chapter shows is the package's current code.

The chapters show the package's code with `show_source(obj)`. When a kernel changes, the page would
show old code until its listings are refreshed: `make listings` (scripts/refresh_listings.py) rewrites
those outputs from the source on any machine, without executing another cell. This test reads each
committed notebook, binds the names its import statements bind (no kernel is launched), and compares
what `show_source` returns now with the text stored in the cell. A failure names the chapter, the
cell and the object, and says to run `make listings`.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

pytest.importorskip("IPython")  # attention_kernels.notebook needs it, as the chapters do

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
