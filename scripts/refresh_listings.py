"""Refresh the code every chapter shows from the package's source, on any machine (no GPU, no
kernel launched): the outputs of the cells ending with `show_source(x)` are rewritten, every other
output stays as the GPU run left it. `make listings` runs it; tests/test_listings.py fails until it has.

    python scripts/refresh_listings.py                  # every chapter
    python scripts/refresh_listings.py book/gla.ipynb   # one
"""
import sys
from pathlib import Path

import attention_kernels  # noqa: F401  (the interpreter on a CPU, before Triton is imported)
from attention_kernels.notebook import refresh_listings

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    chapters = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "book").glob("*.ipynb"))
    for chapter in chapters:
        changed = refresh_listings(chapter)
        print(f"{chapter.name}: " + (f"{len(changed)} listing(s) refreshed: {', '.join(changed)}"
                                     if changed else "every listing current"))
