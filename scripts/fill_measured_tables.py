"""Refresh the table cells whose tables a GPU run has saved since the chapter last ran on a GPU.

    python scripts/fill_measured_tables.py book/mamba2.ipynb book/flash_attention.ipynb

A table cell prints a saved table (`print(provenance(...))` and the table), or, for a table not yet measured,
one line ("Not measured yet: ..."). After a GPU run has saved tables under results/, this executes the chapter
here (results loaded, never measured: the CPU times nothing) and puts the fresh output into the table cells
whose output changed, and into the figure cell that follows a table cell and draws its frame (`plot_results`)
when that table changed or the figure has never been drawn: every other output, GPU-made or not, stays as
committed. The cells' text and figures come from the saved tables and their provenance, so they are what the
GPU would print and draw from the same files. Prints what it refreshed; exits 1 if a chapter fails to execute.
"""
import copy
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOT_MEASURED = "Not measured yet"


def _text(outputs) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in outputs)


def _drew(outputs) -> bool:
    """Whether a cell's outputs hold a figure and no error."""
    return (any("image/png" in o.get("data", {}) for o in outputs)
            and not any(o.get("output_type") == "error" for o in outputs))


def fill(path: Path) -> list[int]:
    """Execute a copy of the chapter and copy the outputs of its table cells whose saved tables changed (or
    are measured now), and of the figure cells drawn from them; returns their indices."""
    nb = nbformat.read(path, as_version=4)
    waiting = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "print(provenance(" in c.source]
    if not waiting:
        return []
    run = copy.deepcopy(nb)
    os.environ.setdefault("KERNELS_BENCH", "load")
    NotebookClient(run, timeout=1800, resources={"metadata": {"path": str(path.parent)}}).execute()
    filled = [i for i in waiting if NOT_MEASURED not in _text(run.cells[i].outputs)
              and _text(run.cells[i].outputs) != _text(nb.cells[i].outputs)]
    # a figure drawn from those tables (the next code cell, a `plot_results` of the table's frame): redrawn when
    # its table was refreshed, or drawn when it has no output yet
    for i in waiting:
        j = next((j for j in range(i + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"), None)
        frame = nb.cells[i].source.split("=", 1)[0].strip()
        if (j is not None and "plot_results(" in nb.cells[j].source and frame in nb.cells[j].source
                and (i in filled or not nb.cells[j].outputs) and _drew(run.cells[j].outputs)):
            filled.append(j)
    for i in sorted(set(filled)):
        nb.cells[i].outputs = run.cells[i].outputs
        nb.cells[i].execution_count = run.cells[i].execution_count   # nbval skips a cell with none
    if filled:
        nbformat.write(nb, path)
    return filled


def main(paths: list[str]) -> int:
    for p in map(Path, paths):
        print(f"{p}: refreshed table cells {fill(p) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
