"""Small Sphinx fixes for the book's HTML.

Jupyter Book registers sphinx-thebe's inline configuration script twice; the second
copy re-declares a `const` and raises a JavaScript error on every page. Keep the
first copy of each script.
"""


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        # the copies differ only in filename None vs "": compare what is rendered
        key = (getattr(js, "filename", None) or "",
               repr(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept  # in place: Sphinx renders from this very list


def setup(app):
    # first: html-page-context stops at the first handler that returns a value
    app.connect("html-page-context", _dedupe_scripts, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
