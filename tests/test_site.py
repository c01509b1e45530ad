"""The rendered site: it builds without a warning, it hands the reader the code, and every page works
and reads well in a real browser.

The browser checks serve the built HTML on localhost and open each page at 1280 px in headless
Chromium (Debian's /usr/bin/chromium, driven by Playwright): no JavaScript error, no failed request,
math typeset by the local MathJax, every image loaded; no display equation and no table wider than
the text column; no code cell, output or code block wider than the column; every figure as wide as the
column and not shrunk below legibility. The committed notebooks hold no output on stderr.
"""
import functools
import http.server
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.site

WIDTH = 1280  # the browser window every layout check uses, in CSS px
TOLERANCE_PX = 3  # rounding of borders and sub-pixel layout
# The figure helper draws 10-point tick labels at 110 dpi (15 px in the PNG). Shown at less than
# 0.65 of its pixel width, such a label drops below 10 px on screen: the figure was drawn too wide
# (two panels side by side, say) and the browser shrank it to fit.
MIN_FIGURE_SCALE = 0.65


def _site_tool(module):
    """Import a module that only the book's site toolchain provides (`make setup` installs it from
    requirements.txt: jupyter-book brings yaml and pybtex, playwright drives the browser). Where it is
    missing the test skips, as the `site` fixture does without jupyter-book (e.g. a GPU box that carries
    only the kernels' and notebooks' wheels); under CI a missing toolchain fails."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing in CI ({e}): `make setup` installs the book's toolchain")
        pytest.skip(f"the book's toolchain ({module}) is not installed here: `make setup` installs it")


def _pages():
    yaml = _site_tool("yaml")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return files


def _chapters():
    """Every page of the table of contents except the intro itself."""
    return _pages()[1:]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    jb = Path(sys.executable).with_name("jupyter-book")
    if not jb.exists() and not os.environ.get("CI"):
        # e.g. a GPU box that carries only the kernels' and notebooks' wheels: the site is built by `make test`
        pytest.skip("the book's toolchain (jupyter-book) is not installed here: `make setup` installs it")
    if not (ROOT / "_vendor" / "mathjax" / "tex-chtml.js").exists():
        pytest.fail("_vendor/mathjax is missing: run `make setup` (it copies MathJax into the site)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(jb), "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(out)],
                          capture_output=True, text=True, timeout=900)
    return proc, out / "_build" / "html"


def test_site_builds_without_warnings(site):
    proc, html = site
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "WARNING" not in log, [line for line in log.splitlines() if "WARNING" in line]
    for page in _pages():
        assert (html / f"{page}.html").exists(), f"{page}.html was not built"


# ------------------------------------------------------------------------------------------------
# The reader's vocabulary: the glossary and the bibliography the chapters link to (no build needed).

def _book_text() -> str:
    """What the reader reads: every page of book/, the markdown cells of its notebooks included."""
    parts = [path.read_text() for path in sorted((ROOT / "book").glob("*.md"))]
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        parts += ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
                  if cell["cell_type"] == "markdown"]
    return "\n".join(parts)


def _roles(role: str) -> set[str]:
    """The targets of a MyST role across the book: {term}`tiles <tile>` names "tile"; a citation may list keys."""
    found = set()
    for body in re.findall(r"\{" + role + r"(?::[a-z]+)?\}`([^`]+)`", _book_text()):
        named = re.search(r"<([^<>]+)>\s*$", body)
        target = named.group(1) if named else body
        found |= {key.strip() for key in target.split(",")} if role == "cite" else {target.strip()}
    return found


def _glossary_terms() -> list[str]:
    """The terms book/notation.md's glossary defines (a term is a line of its own, its definition indented)."""
    text = (ROOT / "book" / "notation.md").read_text()
    body = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip() and not line.startswith(" ")]


# Read from the pages, never listed by hand: a page that links a term or cites a key is what makes it needed.
GLOSSARY_TERMS = _glossary_terms()
BIB_KEYS = sorted(_roles("cite"))
# Cited for what they say, though no author, date or address of theirs is known: the source article the book
# grew from (a copy of its text, in Chinese) is identified by its title and where it appeared.
UNDATED = {"attnkernels_zh"}


def test_glossary_defines_the_terms_the_chapters_link():
    assert len(GLOSSARY_TERMS) == len(set(GLOSSARY_TERMS)), "a glossary term is defined twice"
    linked = _roles("term")
    assert linked, "no page links the glossary: the {term} roles were not found"
    assert not linked - set(GLOSSARY_TERMS), f"linked but not in the glossary: {sorted(linked - set(GLOSSARY_TERMS))}"


def test_bibliography_has_every_key_with_a_title_year_and_link():
    pybtex = _site_tool("pybtex.database")

    bib = pybtex.parse_file(str(ROOT / "book" / "references.bib"))
    assert BIB_KEYS, "no page cites: the {cite} roles were not found"
    assert not set(BIB_KEYS) - set(bib.entries), f"cited but not in references.bib: {set(BIB_KEYS) - set(bib.entries)}"
    for key, entry in bib.entries.items():
        fields = {name.lower() for name in entry.fields}
        if key in UNDATED:
            assert {"title", "howpublished"} <= fields, f"{key}: needs a title and where it appeared"
            continue
        assert {"title", "year", "url"} <= fields, f"{key}: needs a title, a year and a url"
        assert entry.persons.get("author"), f"{key}: no author"
    # every page that cites ends with its own bibliography, so each citation resolves on its page
    for page in _pages():
        path = next(ROOT.glob(f"{page}.*"), None)
        if path is None:  # a page missing from the tree fails the build test
            continue
        text = path.read_text()
        if re.search(r"\{cite(:[pt])?\}`", text):
            assert "{bibliography}" in text and ":filter: docname in docnames" in text, \
                f"{path.name} cites but has no per-page bibliography"


# ------------------------------------------------------------------------------------------------
# The code in the reader's hands: the package, the tables, and the way to them.

def _downloads(html):
    folder = html / "downloads"
    wheels, sdists = sorted(folder.glob("*.whl")), sorted(folder.glob("*.tar.gz"))
    return folder, wheels, sdists


def test_site_offers_the_kernels_package(site):
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    folder, wheels, sdists = _downloads(html)
    assert len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist in {folder}"
    assert (folder / "results.zip").exists(), "the measured tables (results.zip) are not offered"

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
        assert "attention_kernels/__init__.py" in names
        # every module of the package is in the wheel
        missing = [str(p.relative_to(ROOT)) for p in (ROOT / "attention_kernels").rglob("*.py")
                   if str(p.relative_to(ROOT)).replace(os.sep, "/") not in names]
        assert not missing, f"modules missing from the wheel: {missing}"
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Version: {project['version']}" in metadata
    requires = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)(.*)$", metadata, re.M)
    core = {name.lower() for name, rest in requires if "extra ==" not in rest}
    assert {"torch", "triton", "numpy"} <= core, f"`pip install` of the wheel must bring torch, triton, numpy: {core}"
    assert not core & {"jupyter", "jupyterlab", "notebook", "ipykernel", "ipywidgets", "jupyter-book"}, \
        f"the package itself must not require Jupyter: {core}"

    # the sdist carries what its README promises: the book, its tests and the Makefile of `make book` / `make test`
    with tarfile.open(sdists[0]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        carried = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    wanted = ["Makefile", "requirements.txt", "_config.yml", "_toc.yml", "book/intro.md", "attention_kernels/__init__.py",
              "results/mla_decode.csv", "tests/test_site.py", "scripts/make_figures.py", "_ext/package_download.py"]
    wanted += [str(p.relative_to(ROOT)) for p in (ROOT / "book").glob("*.ipynb")]
    assert not set(wanted) - carried, f"{top}: missing {sorted(set(wanted) - carried)}"

    # the page that explains the two commands names the wheel the site actually offers
    running = (ROOT / "book" / "running.md").read_text()
    named = set(re.findall(r"attention_kernels_book-[^\s\"'\[]+\.whl", running))
    assert named == {wheels[0].name}, f"book/running.md names {named}, the site offers {wheels[0].name}"

    # every chapter's download menu offers the package next to the notebook, and the link resolves
    for page in _chapters():
        text = (html / f"{page}.html").read_text()
        link = re.search(r'<a href="([^"]+\.whl)"[^>]*\n?[^>]*download-kernels-button', text)
        assert link, f"{page}: no kernels download in the page's download menu"
        assert (html / Path(page).parent / link.group(1)).resolve() == wheels[0].resolve(), link.group(1)


def test_no_repository_or_launch_buttons_without_a_repository(site):
    """Until `repository.url` is set in _config.yml, no page links a repository or a launch service."""
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    config = _site_tool("yaml").safe_load((ROOT / "_config.yml").read_text())
    if (config.get("repository") or {}).get("url"):
        pytest.skip("a repository is configured: its buttons are wanted")
    for page in _pages():
        text = (html / f"{page}.html").read_text()
        for marker in ("btn-source-repository-button", "btn-source-edit-button", "btn-source-issues-button",
                       "dropdown-launch-buttons", 'href="https://mybinder.org',
                       'href="https://colab.research.google.com'):
            assert marker not in text, f"{page}: {marker} without a repository to point at"


def test_intro_links_every_chapter_and_the_downloads(site):
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    root = _site_tool("yaml").safe_load((ROOT / "_toc.yml").read_text())["root"]
    page = html / f"{root}.html"
    article = page.read_text().split('<article class="bd-article">', 1)[-1].split("</article>", 1)[0]
    targets = {(page.parent / href.split("#")[0]).resolve()
               for href in re.findall(r'<a[^>]+href="([^"#:]+)', article)}
    missing = [p for p in _chapters() if (html / f"{p}.html").resolve() not in targets]
    assert not missing, f"the intro does not link {missing}"
    _, wheels, sdists = _downloads(html)
    for file in [*wheels, *sdists, html / "downloads" / "results.zip"]:
        assert file.resolve() in targets, f"the intro does not link the download {file.name}"


# ------------------------------------------------------------------------------------------------
# In the browser.

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test output
        pass


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Before measuring, every folded block is opened, as a reader opens an exercise's solution: a <details>
# (a sphinx-design dropdown) and an admonition with the `dropdown` class (sphinx-togglebutton hides its body).
_OPEN_FOLDED_JS = """
() => {
  document.querySelectorAll("details").forEach((d) => { d.open = true; });
  document.querySelectorAll(".toggle-hidden").forEach((el) => el.classList.remove("toggle-hidden"));
}
"""

# Measured in the page once MathJax has typeset it and every folded block is open. The text column is the
# article's content box.
_LAYOUT_JS = """
() => {
  const article = document.querySelector("article.bd-article");
  if (!article) return null;
  const cs = getComputedStyle(article), box = article.getBoundingClientRect();
  const left = box.left + parseFloat(cs.paddingLeft), right = box.right - parseFloat(cs.paddingRight);
  const where = (el) => { const s = el.closest("section"); return s ? s.id : ""; };
  const snippet = (el) => (el.textContent || "").replace(/\\s+/g, " ").trim().slice(0, 70);
  const wide = [];
  const kind = (el) => el.tagName === "TABLE" ? "table" : el.tagName !== "PRE" ? "equation"
    : el.closest(".cell_input") ? "code cell" : el.closest(".cell_output") ? "cell output" : "code block";
  for (const el of article.querySelectorAll('mjx-container[display="true"], table, pre')) {
    const r = el.getBoundingClientRect();
    // scrollWidth catches content cut off or scrolled inside the element, the box what sticks out; a block
    // inside a narrower box (a solution's admonition) scrolls before it reaches the column: `clipped`
    const width = Math.max(r.width, el.scrollWidth), clipped = el.scrollWidth - el.clientWidth;
    wide.push({kind: kind(el), width, clipped, left: r.left, right: r.right, section: where(el), text: snippet(el)});
  }
  const figures = [...article.querySelectorAll("img")].map((img) => ({
    src: img.getAttribute("src"), width: img.getBoundingClientRect().width, natural: img.naturalWidth,
    section: where(img)}));
  return {column: right - left, left, right, blocks: wide, figures};
}
"""


@pytest.fixture(scope="module")
def browsed(site):
    """Open every page once at 1280 px: the errors each page raised and its layout measurements."""
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    if not _chromium():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: `make test` installs it when run as root")
        pytest.skip("chromium not installed: install Debian's chromium (make test does, as root)")
    playwright = _site_tool("playwright.sync_api")
    PlaywrightTimeout, sync_playwright = playwright.TimeoutError, playwright.sync_playwright

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    results = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            for page_name in _pages():
                page = browser.new_page(viewport={"width": WIDTH, "height": 900})
                errors = []
                page.on("pageerror", lambda e, errors=errors: errors.append(f"JS error: {e}"))
                page.on("console", lambda m, errors=errors: m.type == "error" and errors.append(f"console: {m.text}"))
                page.on("requestfailed", lambda r, errors=errors: errors.append(f"failed request: {r.url}"))
                page.on("response",
                        lambda r, errors=errors: r.status >= 400 and errors.append(f"HTTP {r.status}: {r.url}"))
                page.goto(f"{base}/{page_name}.html", wait_until="networkidle")
                if page.locator(".math").count():  # the page has math: MathJax must have typeset it
                    try:
                        page.wait_for_selector("mjx-container", state="attached", timeout=20000)
                        page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
                    except PlaywrightTimeout:
                        errors.append("math was not typeset (no mjx-container after 20 s)")
                broken = page.eval_on_selector_all(
                    "img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
                errors += [f"image not loaded: {src}" for src in broken]
                page.evaluate(_OPEN_FOLDED_JS)
                results[page_name] = {"errors": errors, "layout": page.evaluate(_LAYOUT_JS)}
                page.close()
            browser.close()
    finally:
        server.shutdown()
    return results


def test_pages_work_in_headless_chromium(browsed):
    problems = [f"{name}: {e}" for name, page in browsed.items() for e in page["errors"]]
    problems += [f"{name}: no article column found" for name, page in browsed.items() if page["layout"] is None]
    assert not problems, "\n".join(problems)


def test_nothing_overflows_its_column(browsed):
    """At 1280 px, with every dropdown open, every display equation, table, code cell, cell output and code
    block fits the text column and the box it sits in: nothing is cut off on the right or hidden behind a
    horizontal scroll bar (break long equations over lines; narrow tables; code cells and printed lines
    within TEXT_WIDTH characters, code in a solution's box shorter still; listings from show_source wrap by
    themselves)."""
    problems = []
    for name, page in browsed.items():
        layout = page["layout"]
        if layout is None:
            continue
        for block in layout["blocks"]:
            if (block["width"] > layout["column"] + TOLERANCE_PX or block["right"] > layout["right"] + TOLERANCE_PX
                    or block["left"] < layout["left"] - TOLERANCE_PX):
                problems.append(f"{name} §{block['section']}: {block['kind']} {block['width']:.0f} px wide in a "
                                f"{layout['column']:.0f} px column: {block['text']!r}")
            elif block["clipped"] > TOLERANCE_PX:
                problems.append(f"{name} §{block['section']}: {block['kind']} scrolls {block['clipped']:.0f} px "
                                f"inside its box: {block['text']!r}")
    assert not problems, "\n".join(problems)


def test_figures_span_the_text_column(browsed):
    """Every figure is shown at the width of the text column (one panel per figure, or panels stacked),
    and is not shrunk so far that its labels become unreadable."""
    problems = []
    for name, page in browsed.items():
        layout = page["layout"]
        if layout is None:
            continue
        for fig in layout["figures"]:
            where = f"{name} §{fig['section']}: {Path(fig['src']).name}"
            if abs(fig["width"] - layout["column"]) > TOLERANCE_PX:
                problems.append(f"{where} is {fig['width']:.0f} px wide, the column {layout['column']:.0f} px "
                                f"(drawn {fig['natural']} px wide)")
            elif fig["natural"] and fig["width"] / fig["natural"] < MIN_FIGURE_SCALE:
                problems.append(f"{where} is drawn {fig['natural']} px wide and shown at {fig['width']:.0f} px "
                                f"(x{fig['width'] / fig['natural']:.2f}): its labels are too small to read")
    assert not problems, "\n".join(problems)


def test_rendered_pages_show_no_test_markers_or_nan(site):
    """nbval's markers are cell tags, not comments the reader sees; tables say "—" where nothing was measured."""
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    problems = []
    for page in _pages():
        text = (html / f"{page}.html").read_text()
        article = text.split('<article class="bd-article">', 1)[-1].split("</article>", 1)[0]
        if "NBVAL_" in article:
            problems.append(f"{page}: an nbval marker is visible")
        nan_cells = re.findall(r"<td[^>]*>\s*(?:NaN|nan)\s*</td>", article)
        if nan_cells:
            problems.append(f"{page}: {len(nan_cells)} table cells read NaN")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# The committed notebooks themselves (no build needed).

def _notebooks():
    return sorted((ROOT / "book").glob("*.ipynb"))


def test_committed_outputs_hold_nothing_from_stderr():
    """A progress bar or a warning belongs to the terminal that ran the chapter, not to the page."""
    problems = []
    for path in _notebooks():
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream" and out.get("name") == "stderr":
                    problems.append(f"{path.name} cell {i}: {''.join(out['text'])[:80]!r}")
    assert not problems, "\n".join(problems)


def test_every_cell_with_outputs_has_an_execution_count():
    """nbval fails a code cell whose committed outputs have no execution count ("unrun reference cell has
    outputs"): a cell whose output was written by hand must be numbered like the executed ones."""
    problems = [f"{path.name} cell {i}" for path in _notebooks()
                for i, cell in enumerate(json.loads(path.read_text())["cells"])
                if cell["cell_type"] == "code" and cell.get("outputs") and cell.get("execution_count") is None]
    assert not problems, "\n".join(problems)


def test_code_cells_and_printed_lines_fit_the_text_column():
    """What a chapter's code cells say and print stays within TEXT_WIDTH characters (the browser check
    measures the rendered page; this one names the cell)."""
    from attention_kernels.bench import TEXT_WIDTH

    problems = []
    for path in _notebooks():
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            texts = ["".join(cell["source"])] + ["".join(out["text"]) for out in cell.get("outputs", [])
                                                 if out.get("output_type") == "stream"]
            problems += [f"{path.name} cell {i}: {len(line)} characters: {line[:60]!r}"
                         for text in texts for line in text.splitlines() if len(line) > TEXT_WIDTH]
    assert not problems, "\n".join(problems)
