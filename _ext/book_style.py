"""The book's own CSS (_ext/static/book.css), added to every page.

Kept out of a folder named _static on purpose: Jupyter Book adds every file of a source _static
folder to every page, which is how stray scripts end up loaded twice.
"""
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


def _add_static_path(app, config):
    config.html_static_path = list(config.html_static_path) + [str(STATIC)]


def setup(app):
    app.connect("config-inited", _add_static_path)
    app.add_css_file("book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
