"""The rendered site: it builds without a warning, and every chapter works in a real browser.

The browser check serves the built HTML on localhost and opens each page in headless Chromium
(Debian's /usr/bin/chromium, driven by Playwright): no JavaScript error, no failed request,
math typeset by the local MathJax, every image loaded.
"""
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.site


def _pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return files


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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test output
        pass


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_pages_work_in_headless_chromium(site):
    proc, html = site
    assert proc.returncode == 0, "the site did not build"
    if not _chromium():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: `make test` installs it when run as root")
        pytest.skip("chromium not installed: install Debian's chromium (make test does, as root)")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    problems = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            for page_name in _pages():
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda e, errors=errors: errors.append(f"JS error: {e}"))
                page.on("console", lambda m, errors=errors: m.type == "error" and errors.append(f"console: {m.text}"))
                page.on("requestfailed", lambda r, errors=errors: errors.append(f"failed request: {r.url}"))
                page.on("response", lambda r, errors=errors: r.status >= 400 and errors.append(f"HTTP {r.status}: {r.url}"))
                page.goto(f"{base}/{page_name}.html", wait_until="networkidle")
                if page.locator(".math").count():  # the page has math: MathJax must have typeset it
                    try:
                        page.wait_for_selector("mjx-container", state="attached", timeout=20000)
                    except PlaywrightTimeout:
                        errors.append("math was not typeset (no mjx-container after 20 s)")
                broken = page.eval_on_selector_all(
                    "img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
                errors += [f"image not loaded: {src}" for src in broken]
                problems += [f"{page_name}: {e}" for e in errors]
                page.close()
            browser.close()
    finally:
        server.shutdown()
    assert not problems, "\n".join(problems)
