"""Execute chapter notebooks in place (on the GPU box), printing progress per cell.

    python scripts/execute_notebooks.py book/flash_attention.ipynb book/gla.ipynb

Widget state is dropped after execution: the rendered book shows the static figures,
and saved widget state would make the site load widget JavaScript from a CDN. Progress
bars are collapsed to their final state, so the page shows one line per sweep, not
every redraw.
Exit status 1 if any notebook raised, ran past a cell's time limit (KERNELS_CELL_TIMEOUT_S, default
1800 s) or lost its kernel (as `timeout` stopping this script does): its partial outputs are still
written, so the traceback, or how far it got, can be read. Each cell's first line is printed as it
starts, so a cell that never ends is named in the log.
"""
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError


def tidy_streams(nb) -> None:
    """Merge consecutive stream outputs and keep only what a terminal would show after each
    carriage return (the last redraw of a progress bar)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for out in cell.outputs:
            if out.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                    and merged[-1].name == out.name:
                merged[-1].text += out.text
            else:
                merged.append(out)
        for out in merged:
            if out.output_type == "stream":
                out.text = "\n".join(line.rsplit("\r", 1)[-1] for line in out.text.split("\n"))
        cell.outputs = [o for o in merged if o.output_type != "stream" or o.text.strip()]


def execute(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    done = 0

    def on_cell_start(cell, cell_index):
        first = cell.source.strip().split("\n", 1)[0][:80]
        print(f"  {path.name}: cell {done + 1}/{n_code} starts at {time.time() - start:6.1f} s: {first}", flush=True)

    def on_cell_executed(cell, cell_index, execute_reply):
        nonlocal done
        if cell.cell_type == "code":
            done += 1
            print(f"  {path.name}: cell {done}/{n_code} done at {time.time() - start:6.1f} s", flush=True)

    client = NotebookClient(nb, timeout=int(os.environ.get("KERNELS_CELL_TIMEOUT_S", 1800)), kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}, on_cell_start=on_cell_start,
                            on_cell_executed=on_cell_executed)
    ok = True
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError, AssertionError) as e:
        # SIGTERM (from `timeout`) ends the kernel, whose process group it reaches, while nbclient ignores it
        # here; its clean-up of the dead kernel then fails an assertion of its own
        ok = False
        print(f"{path}: FAILED after {done} of {n_code} code cells ({type(e).__name__})\n{str(e)[-3000:]}",
              flush=True)
    nb.metadata.pop("widgets", None)
    tidy_streams(nb)
    nbformat.write(nb, path)
    print(f"{path}: {'ok' if ok else 'error'} in {time.time() - start:.0f} s", flush=True)
    return ok


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(Path("book").glob("*.ipynb"))
    results = [execute(p) for p in paths]
    sys.exit(0 if all(results) else 1)
