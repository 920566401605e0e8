"""Small Sphinx additions for the book's HTML.

Cells tagged `gpu` show their output recorded on a GPU when the book is built without
one (``gpu_outputs``, next to this file). ``static/flashbook.css``: wide equations,
code, tables and figures scroll inside their own box on small screens; the style of
the recorded-on-a-GPU box.

The explorers: ``flashbook/explorers/*.js`` is copied into ``_static``, and every page loads
``flashbook_mount.js``, which mounts ``flashbook_explorers.js`` on the explorer
cells' placeholders (``flashbook.explorers``). Widget state that nothing on the page
uses (the executed notebooks' ``application/vnd.jupyter.widget-state+json``) is
left out.

A path of the source repository in inline code (``benchmarks/results/...``,
``tests/test_decode.py``) means nothing to a reader of the web page, who has no checkout:
each one that names a file or folder of the repository becomes a link to it on the
repository's site, at the release tag of this version (``repository_links``).

Jupyter Book registers sphinx-thebe's inline configuration script twice; the second
copy re-declares a `const` and raises a JavaScript error on every page. Keep the
first copy of each script.
"""
import os
import re
import shutil

from docutils import nodes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: top-level folders of the repository whose paths the prose may quote
REPO_DIRS = ("benchmarks", "tests", "tools", "flashbook", "book", "notebooks")
_PATH = re.compile(r"^(?:%s)/[\w./-]*$" % "|".join(REPO_DIRS))


def repository_links(doctree, repo_url: str, ref: str, root: str = ROOT) -> int:
    """Wrap each inline-code repository path of ``doctree`` that exists under ``root`` in a
    link to ``repo_url`` at ``ref`` (a folder: ``/tree/``, a file: ``/blob/``). Code
    already inside a link, and paths that name nothing (a pattern, a file a run writes),
    stay as they are. Returns how many were linked."""
    linked = 0
    for literal in list(doctree.findall(nodes.literal)):
        parent, inside = literal.parent, False
        while parent is not None:   # not in a link already, not in a heading (the menus repeat it)
            inside = inside or isinstance(parent, (nodes.reference, nodes.title))
            parent = parent.parent
        if inside:
            continue
        path = literal.astext().strip().rstrip("/")
        if not _PATH.match(path) or ".." in path:
            continue
        where = os.path.join(root, path)
        if not os.path.exists(where):
            continue
        kind = "tree" if os.path.isdir(where) else "blob"
        link = nodes.reference("", "", refuri=f"{repo_url.rstrip('/')}/{kind}/{ref}/{path}",
                               classes=["repository-path"])
        literal.replace_self(link)
        link += literal
        linked += 1
    return linked


def _link_repository_paths(app, doctree, docname):
    repo = (app.config.html_theme_options or {}).get("repository_url")
    if not repo:
        return
    import flashbook

    repository_links(doctree, repo, f"v{flashbook.__version__}")


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


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _drop_widget_state(app, pagename, templatename, context, doctree):
    """The explorers need no ipywidgets state: drop the script that carries it."""
    scripts = context.get("script_files")
    if scripts:
        scripts[:] = [js for js in scripts
                      if (getattr(js, "attributes", None) or {}).get("type") != WIDGET_STATE]


def _copy_explorers(app, exception):
    """Copy the explorers' JavaScript into ``_static`` on every build (Sphinx's own
    static copy keeps a stale file after an incremental build)."""
    if exception is not None or app.builder.format != "html":
        return
    import flashbook.explorers

    static = os.path.join(app.outdir, "_static")
    os.makedirs(static, exist_ok=True)
    for path in sorted(flashbook.explorers.STATIC.glob("*.js")):
        shutil.copyfile(path, os.path.join(static, path.name))


#: flashbook.exercises.SOLUTIONS_ENV: the book executes its notebooks with their
#: solutions, so every exercise check must report "correct" (a check that does not
#: raises, and the build fails). The kernels inherit this process's environment.
SOLUTIONS_ENV = "FLASHBOOK_SOLUTIONS"


def _add_static(app, config):
    config.html_static_path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "static"))


def setup(app):
    os.environ[SOLUTIONS_ENV] = "1"
    app.setup_extension("gpu_outputs")
    app.connect("config-inited", _add_static)
    app.add_css_file("flashbook.css")
    app.connect("build-finished", _copy_explorers)
    app.connect("doctree-resolved", _link_repository_paths)
    app.add_js_file("flashbook_mount.js", type="module")
    # last: after myst-nb has added the page's own scripts
    app.connect("html-page-context", _drop_widget_state, priority=900)
    # first: html-page-context stops at the first handler that returns a value
    app.connect("html-page-context", _dedupe_scripts, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
