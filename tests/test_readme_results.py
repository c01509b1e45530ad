"""The README's results table is written from results/ (scripts/readme_results.py): every number in it is
read from a committed table, never typed by hand."""
import importlib.util
import sys
from pathlib import Path

import pytest

from attention_kernels.bench import load

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts" / "readme_results.py")
readme_results = sys.modules["readme_results"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(readme_results)


def test_readme_table_is_the_one_results_gives():
    assert readme_results.current() == readme_results.render(), (
        "README.md's results table differs from what results/ says: run `make readme` "
        "(python scripts/readme_results.py) and commit README.md")


def test_a_changed_time_changes_the_table():
    """A number off in one table shows: the rendering reads every number from the frame it is given."""
    def tampered(name):
        df = load(name)
        if name == "gla_prefill":
            book_8k = (df["provider"] == "book: chunk") & (df["T"] == 8192) & (df["H"] == 32) & (df["B"] == 1)
            df.loc[book_8k, "ms"] *= 1.5
        return df

    honest, changed = readme_results.render(), readme_results.render(tampered)
    assert honest != changed
    gla = next(line for line in changed.splitlines() if line.startswith("| GLA prefill |"))
    assert "1.475 / 1.948 ms" in gla


def test_each_row_names_the_card_of_its_tables():
    rows = [line for line in readme_results.render().splitlines() if line.startswith("| ") and "---" not in line]
    cards = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[2] for line in rows[1:]}
    assert cards["GLA decode step"] == "H100" and cards["FlashAttention-2 forward"] == "H200"
    assert set(cards.values()) <= {"H100", "H200"}


def test_a_missing_case_is_refused():
    bad = readme_results.Number("gla_prefill", "book: chunk", "ms", {"T": 3})
    with pytest.raises(ValueError, match="no row"):
        bad.text(load)
