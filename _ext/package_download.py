"""Ship the `kernels` package with the site.

Every chapter notebook imports `kernels`, so a reader who downloads a notebook needs the package
too. At the start of every HTML build this extension builds a wheel and an sdist of the
repository's package (setuptools' PEP 517 backend, from a scratch copy of the tree's sources, so the
working tree gets no build/ or egg-info folders) into `<site>/downloads/`: the wheel holds `kernels`,
the sdist the whole book (MANIFEST.in), from which `make book` and `make test` run. It then offers them

* in the download menu of every page, next to the notebook's `.ipynb`, and
* through the role {package}`wheel` / {package}`sdist` / {package}`results`, a link to the file
  (its name carries the version from pyproject.toml, so no page hard-codes it). `results` is a
  zip of results/, the measured tables the chapters' figures are drawn from.

A failed build stops the site build: a site that cannot hand out its code is broken.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
FOLDER = "downloads"
_BUILD = """
import sys, setuptools.build_meta as backend
out = sys.argv[1]
wheel = backend.build_wheel(out)
sdist = backend.build_sdist(out)
print("KERNELS_DOWNLOADS", wheel, sdist)
"""


def _sources(root: Path) -> tuple[list[str], list[str]]:
    """The files and folders the build needs: the package's own (pyproject.toml, README.md, LICENSE, attention_kernels/)
    and what MANIFEST.in adds to the sdist (its `include` and `graft` lines), so the list lives in one place."""
    files, folders = ["pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"], ["attention_kernels"]
    for line in (root / "MANIFEST.in").read_text().splitlines():
        command, *names = line.split("#", 1)[0].split() or [""]
        if command == "include":
            files += names
        elif command == "graft":
            folders += names
    return list(dict.fromkeys(files)), list(dict.fromkeys(folders))


def _build_package(app):
    if app.builder.format != "html":
        return
    root = Path(app.srcdir)
    out = Path(app.outdir) / FOLDER
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="kernels-pkg-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        files, folders = _sources(root)
        for name in files:
            if (root / name).exists():
                shutil.copy2(root / name, src / name)
        for name in folders:
            shutil.copytree(root / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        proc = subprocess.run([sys.executable, "-c", _BUILD, str(out)], cwd=src, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExtensionError(f"building the kernels package for the site failed:\n{proc.stderr[-3000:]}")
    # setuptools talks on stdout too: the names are on the one line that starts with the marker
    wheel, sdist = next(line.split()[1:3] for line in proc.stdout.splitlines()
                        if line.startswith("KERNELS_DOWNLOADS "))
    app.kernels_downloads = {"wheel": f"{FOLDER}/{wheel}", "sdist": f"{FOLDER}/{sdist}"}
    # The H200 tables the figures are drawn from: a CPU reader's notebooks load them.
    if (root / "results").is_dir():
        archive = shutil.make_archive(str(out / "results"), "zip", root_dir=root, base_dir="results")
        app.kernels_downloads["results"] = f"{FOLDER}/{Path(archive).name}"
    LOGGER.info(f"kernels package for the site: {wheel}, {sdist}")


def _relative(docname, target):
    return "../" * docname.count("/") + target


def package_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{package}`wheel`, {package}`sdist` or {package}`results`: a link to that download."""
    env = inliner.document.settings.env
    kind = text.strip()
    downloads = getattr(env.app, "kernels_downloads", None)
    if downloads is None:  # a non-HTML builder: name the package instead of linking
        return [nodes.literal(rawtext, "attention_kernels")], []
    if kind not in downloads:
        msg = inliner.reporter.error(f"{{package}} takes one of {sorted(downloads)}, not {kind!r}", line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    target = downloads[kind]
    filename = target.rsplit("/", 1)[-1]
    node = nodes.reference(rawtext, "", refuri=_relative(env.docname, target),
                           classes=["kernels-download"])
    node += nodes.literal(filename, filename)
    return [node], []


def _add_header_button(app, pagename, templatename, context, doctree):
    downloads = getattr(app, "kernels_downloads", None)
    if not downloads:
        return
    for group in context.get("header_buttons", []):
        if group.get("label") == "download-buttons":
            # right after the page's own download (.ipynb for a chapter), before "print to PDF"
            labels = [button.get("label") for button in group["buttons"]]
            after = max((i for i, label in enumerate(labels)
                         if label in ("download-notebook-button", "download-source-button")), default=-1)
            group["buttons"].insert(after + 1, {
                "type": "link",
                "url": context["pathto"](downloads["wheel"], 1),
                "text": "kernels .whl",
                "tooltip": "Download the kernels package that the notebooks import (pip install it)",
                "icon": "fas fa-box",
                "label": "download-kernels-button",
            })


def _outdated(app, env, added, changed, removed):
    """Re-read the pages that link a download when its file name changed (a new version)."""
    downloads = getattr(app, "kernels_downloads", None)
    if getattr(env, "kernels_downloads", None) == downloads:
        return []
    env.kernels_downloads = downloads
    return [doc for doc in env.found_docs
            if doc not in added and "{package}" in Path(env.doc2path(doc)).read_text(errors="ignore")]


def setup(app):
    app.connect("builder-inited", _build_package)
    app.connect("env-get-outdated", _outdated)
    app.add_role("package", package_role)
    # after sphinx-book-theme has filled the header's download menu (priority 501)
    app.connect("html-page-context", _add_header_button, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
