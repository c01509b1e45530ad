"""What book/adding_a_family.md promises: a family is a folder, a test file, a chapter, its line in _toc.yml and
its link in the intro. The template family (tests/template_family/) is put into a copy of the repository with
those alone, and the suite's checks of a family must pass there: its benchmarks declared and found, its imports
declared, no private name read across modules, its chapter's glossary links, citations, outputs, code width and
listings, the intro's link to it, and its own tests (the one kernel launch: a tiny call under the interpreter).
Without the intro's link, the check of the links fails.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "template_family"
FAMILY = "template"

# The suite's checks that read every family, every chapter or every page (run inside the copy).
FAMILY_CHECKS = [
    "tests/test_helpers.py::test_every_family_declares_its_benchmarks",
    "tests/test_helpers.py::test_every_declared_table_names_its_module_and_a_timer_of_its_kind",
    "tests/test_package.py::test_the_package_declares_everything_it_imports",
    "tests/test_package.py::test_no_module_reads_another_modules_private_names",
    "tests/test_site.py::test_glossary_defines_the_terms_the_chapters_link",
    "tests/test_site.py::test_bibliography_has_every_key_with_a_title_year_and_link",
    "tests/test_site.py::test_committed_outputs_hold_nothing_from_stderr",
    "tests/test_site.py::test_code_cells_and_printed_lines_fit_the_text_column",
    "tests/test_adding_a_family.py::test_the_intro_links_every_chapter",
    f"tests/test_{FAMILY}.py",
]
INTRO_LINE = f"- [Plain linear attention]({FAMILY}.ipynb): the smallest family, one kernel and its reference.\n"


def _toc_files(root: Path) -> list[str]:
    """The pages of _toc.yml, root first, as paths without suffix (book/intro, book/gla, ...)."""
    text = (root / "_toc.yml").read_text()
    return re.findall(r"^root:\s*(\S+)", text, re.M) + re.findall(r"^\s*-\s*file:\s*(\S+)", text, re.M)


def test_the_intro_links_every_chapter(root: Path = ROOT):
    """The intro links every page of the table of contents (the site's browser check says the same after a
    build; this one needs none): a markdown link to the page's .md or .ipynb, relative to book/."""
    intro, *chapters = _toc_files(root)
    text = (root / f"{intro}.md").read_text()
    linked = {str((Path(intro).parent / target).with_suffix(""))
              for target in re.findall(r"\]\(([^)#\s:]+)", text)}
    missing = [page for page in chapters if page not in linked]
    assert not missing, f"{intro}.md does not link {missing}"


def _family_copy(dest: Path, intro_link: bool = True) -> Path:
    """The repository's package, scripts, book, tests and site files, with the template family added as a new family
    adds itself: its folder, its test file, its chapter, its line in _toc.yml and (if asked) the intro's link."""
    for name in ("attention_kernels", "scripts", "tests", "book", "results"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    for name in ("_toc.yml", "pyproject.toml", "_config.yml"):
        shutil.copy(ROOT / name, dest / name)
    family = dest / "attention_kernels" / FAMILY
    family.mkdir()
    for source in TEMPLATE.glob("*.py"):
        if source.name != "family_tests.py":
            shutil.copy(source, family / source.name)
    shutil.copy(TEMPLATE / "family_tests.py", dest / "tests" / f"test_{FAMILY}.py")
    shutil.copy(TEMPLATE / "chapter.ipynb", dest / "book" / f"{FAMILY}.ipynb")
    toc = (dest / "_toc.yml").read_text()
    anchor = "      - file: book/mamba2\n        title: Mamba-2\n"
    assert anchor in toc, "_toc.yml changed: update where the template's chapter goes"
    (dest / "_toc.yml").write_text(toc.replace(anchor, anchor + f"      - file: book/{FAMILY}\n"
                                                                 "        title: Plain linear attention\n"))
    if intro_link:
        intro = (dest / "book" / "intro.md").read_text()
        anchor = next(line for line in intro.splitlines(True) if line.startswith("- [Mamba-2](mamba2.ipynb)"))
        (dest / "book" / "intro.md").write_text(intro.replace(anchor, anchor + INTRO_LINE))
    return dest


def test_a_new_family_passes_the_family_checks(tmp_path):
    pytest.importorskip("IPython")  # the listings' check needs attention_kernels.notebook, as the chapters do
    copy = _family_copy(tmp_path / "with_link")
    # the listings of the template's chapter only: the book's own are the suite's business
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *FAMILY_CHECKS,
                           "tests/test_listings.py", "-k", f"not listing_is_current or {FAMILY}"],
                          cwd=copy, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(copy)})
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    passed = [line for line in done.stdout.splitlines() if " PASSED" in line]
    assert sum(f"listing_is_current[{FAMILY}-" in line for line in passed) == 2, done.stdout[-3000:]
    for check in FAMILY_CHECKS:  # each ran and passed (the template's own tests: both)
        assert any(line.startswith(check) for line in passed), f"{check} did not run: {done.stdout[-3000:]}"


def test_a_new_family_without_the_intro_link_fails(tmp_path):
    copy = _family_copy(tmp_path / "without_link", intro_link=False)
    with pytest.raises(AssertionError, match=f"does not link \\['book/{FAMILY}'\\]"):
        test_the_intro_links_every_chapter(copy)


def test_the_template_chapter_keeps_the_chapter_shape():
    """The template's chapter shows the package's code (listings, no kernel defined), asserts once, and ends
    with its references."""
    cells = json.loads((TEMPLATE / "chapter.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert sum(s.startswith("show_source(") for s in code) == 2
    assert not any("@triton.jit" in s for s in code) and sum("assert_close(" in s for s in code) == 1
    assert "{bibliography}" in "".join(cells[-1]["source"])
