"""Drop repeated <script> entries from each page.

Jupyter Book 1.0 with sphinx-thebe registers thebe's inline configuration twice, and the
second `const THEBE_JS_URL` is a JavaScript error on every page. One copy is enough.
"""


def _dedupe(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for js in context.get("script_files", []):
        attributes = getattr(js, "attributes", {}) or {}
        # the copies differ only in filename None vs "" (an inline script has neither)
        key = (getattr(js, "filename", str(js)) or "", tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _dedupe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
