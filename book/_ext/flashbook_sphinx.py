"""Small Sphinx additions for the book's HTML.

Cells tagged `gpu` show their output recorded on a GPU when the book is built without
one (``gpu_outputs``, next to this file). ``static/flashbook.css``: wide equations,
code, tables and figures scroll inside their own box on small screens; the style of
the recorded-on-a-GPU box.

The explorers: ``flashbook/explorers/*.js`` is copied into ``_static``, with
``flashbook_explorers_page.js`` beside it (``flashbook.explorers.page_script``: the module as
a classic script), which each page with an explorer loads and which mounts the explorers on
the cells' placeholders. A classic script, because a page opened from disk (``file://``)
may load no module script: the book must work with nothing behind it. Widget state that
nothing on the page uses (the executed notebooks'
``application/vnd.jupyter.widget-state+json``) is left out.

A path of the source repository in inline code (``benchmarks/results/...``,
``tests/test_decode.py``) means nothing to a reader of the web page, who has no checkout:
each one that names a file or folder of the repository becomes a link to it on the
repository's site, at the release tag of this version (``repository_links``).

Search results show no LaTeX source: the titles in ``searchindex.js`` are rewritten as plain
text (``plain_math``: ``\\Theta(N^2d^2/M)`` becomes ``Θ(N²d²/M)``), each math element of a
written page carries the same plain text in ``data-plain``, and ``flashbook_search.js`` (the search
page's) builds the snippets from it instead of from the TeX that MathJax would typeset.

Jupyter Book registers sphinx-thebe's inline configuration script twice; the second
copy re-declares a `const` and raises a JavaScript error on every page. Keep the
first copy of each script.
"""
import html
import json
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


# ----------------------------------------------------------------- search without LaTeX

_SYMBOLS = {
    "times": "×", "cdot": "·", "circ": "∘", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥",
    "ne": "≠", "neq": "≠", "approx": "≈", "sim": "~", "infty": "∞", "to": "→", "in": "∈",
    "leftarrow": "←", "gets": "←", "rightarrow": "→", "Rightarrow": "⇒", "mapsto": "↦",
    "sum": "Σ", "prod": "Π", "sqrt": "√", "partial": "∂", "nabla": "∇", "pm": "±",
    "dots": "…", "ldots": "…", "cdots": "⋯", "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊",
    "rfloor": "⌋", "top": "ᵀ", "prime": "′", "mid": "|", "quad": " ", "qquad": " ",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε",
    "varepsilon": "ε", "theta": "θ", "Theta": "Θ", "lambda": "λ", "mu": "μ", "pi": "π",
    "sigma": "σ", "Sigma": "Σ", "tau": "τ", "phi": "φ", "omega": "ω", "Omega": "Ω",
    "lbrace": "{", "rbrace": "}", "%": "%", "&": "&", "_": "_", "#": "#", "{": "(", "}": ")",
}
#: Relations and operators: written with a space on each side.
_SPACED = "×·∘≤≥≠≈→←⇒↦∈±="
#: Commands that only style or size what follows: they go, their argument stays.
_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr",
         "displaystyle", "textstyle", "limits", "nolimits", "notag", "nonumber", "mathrm",
         "mathbf", "mathit", "mathcal", "mathsf", "mathtt", "operatorname", "text", "textbf",
         "textit", "texttt", "tilde", "widetilde", "hat", "widehat", "bar", "overline", "vec",
         "boldsymbol"}
_SUPER = str.maketrans("0123456789+-=()niT", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵀ")


def plain_math(tex: str) -> str:
    r"""TeX as plain text, for a search snippet or title: ``\(N\times N\)`` -> ``N × N``,
    ``2^{-52}`` -> ``2⁻⁵²``, ``\mathrm{lse}_i`` -> ``lse_i``, ``\frac{d}{2B_r}`` ->
    ``d/(2B_r)``. Symbols become their Unicode characters, styling commands and braces go,
    a superscript of digits and signs becomes superscript characters, an operator's name
    (``\log``, ``\max``) stays a word."""
    t = tex.strip()
    for a, b in (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$")):
        if t.startswith(a) and t.endswith(b) and len(t) >= len(a) + len(b):
            t = t[len(a):len(t) - len(b)]
            break
    t = re.sub(r"\\begin\{[^}]*\}|\\end\{[^}]*\}", " ", t)    # environments: their lines stay
    t = t.replace("\\\\", "; ").replace("&", "")               # line breaks, alignment
    t = re.sub(r"\\[,;:! ]", " ", t)                           # spacing
    t = re.sub(r"\\[dt]?frac\s*([0-9])\s*([0-9])", r"\1/\2", t)       # \frac12
    for _ in range(3):                                          # nested fractions, inside out
        t = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}",
                   lambda m: f"{_group(m.group(1))}/{_group(m.group(2))}", t)

    def command(m):
        name, space = m.group(1), m.group(2)
        if name in _SYMBOLS:
            return _SYMBOLS[name]
        if name in _DROP:
            return ""
        return name + (" " if space else "")                  # \log l -> "log l"
    t = re.sub(r"\\([A-Za-z]+|[%&_#{}])(\s?)", command, t)

    def sup(m):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        if re.fullmatch(r"[0-9+\-=()niTᵀ]+", body):
            return body.translate(_SUPER)
        return "^" + (body if len(body) == 1 else f"({body})")
    t = re.sub(r"\^\{([^{}]*)\}|\^(ᵀ|[0-9A-Za-z+\-])", sup, t)
    t = t.replace("{", "").replace("}", "")
    t = re.sub(r"\s*([%s])\s*" % re.escape(_SPACED), r" \1 ", t)
    return re.sub(r"\s+", " ", t).strip()


def _group(x: str) -> str:
    """A fraction's numerator or denominator: in parentheses unless it is one symbol."""
    x = x.strip()
    return x if re.fullmatch(r"[A-Za-z0-9.]+|\\[A-Za-z]+", x) else f"({x})"


_MATH_ELEMENT = re.compile(r'<(span|div) class="math notranslate nohighlight"([^>]*)>(.*?)</\1>', re.S)


def plain_math_attributes(body: str) -> str:
    """Each math element of a page with its plain text in ``data-plain``."""
    def add(m):
        if " data-plain=" in m.group(2):
            return m.group(0)
        plain = html.escape(plain_math(html.unescape(m.group(3))), quote=True)
        return f'<{m.group(1)} class="math notranslate nohighlight"{m.group(2)} data-plain="{plain}">{m.group(3)}</{m.group(1)}>'
    return _MATH_ELEMENT.sub(add, body)


def _search_script(app, pagename, templatename, context, doctree):
    if pagename == "search":
        app.add_js_file("flashbook_search.js")


def _plain_math_in_pages(app, exception):
    """Every written page, its body and its tables of contents alike (they repeat the
    headings' math), gets its math's plain text."""
    if exception is not None or app.builder.format != "html":
        return
    for folder, _, files in os.walk(app.outdir):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                plain = plain_math_attributes(text)
                if plain != text:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(plain)


_HAS_TEX = re.compile(r"\\[A-Za-z]|\^")


def plain_search_titles(index: dict) -> dict:
    """``searchindex.js``'s page and section titles with their math as plain text."""
    plain = lambda t: plain_math(t) if _HAS_TEX.search(t) else t   # noqa: E731
    index["titles"] = [plain(t) for t in index.get("titles", [])]
    merged = {}
    for title, where in index.get("alltitles", {}).items():
        merged.setdefault(plain(title), []).extend(where)
    index["alltitles"] = merged
    return index


def _plain_search_index(app, exception):
    path = os.path.join(app.outdir, "searchindex.js")
    if exception is not None or app.builder.format != "html" or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    prefix = "Search.setIndex("
    if not (text.startswith(prefix) and text.rstrip().endswith(")")):
        return
    index = plain_search_titles(json.loads(text[len(prefix):text.rstrip().rindex(")")]))
    with open(path, "w", encoding="utf-8") as f:
        f.write(prefix + json.dumps(index, separators=(",", ":"), ensure_ascii=False) + ")")


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
    with open(os.path.join(static, flashbook.explorers.PAGE_SCRIPT), "w", encoding="utf-8") as f:
        f.write(flashbook.explorers.page_script())


def _load_explorers(app, pagename, templatename, context, doctree):
    """A page with an explorer loads the explorers' classic script (this page only)."""
    if 'class="flashbook-explorer"' in (context.get("body") or ""):
        import flashbook.explorers

        app.add_js_file(flashbook.explorers.PAGE_SCRIPT)


#: flashbook.exercises.SOLUTIONS_ENV: the book executes its notebooks with their
#: solutions, so every exercise check must report "correct" (a check that does not
#: raises, and the build fails). The kernels inherit this process's environment.
SOLUTIONS_ENV = "FLASHBOOK_SOLUTIONS"


def _add_static(app, config):
    config.html_static_path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "static"))


def setup(app):
    import flashbook

    os.environ[SOLUTIONS_ENV] = "1"
    # the release the pages link to (repository_links): a new one rebuilds every page, so that no
    # page kept from an incremental build links to the release before
    app.add_config_value("flashbook_version", flashbook.__version__, "env")
    app.setup_extension("gpu_outputs")
    app.connect("config-inited", _add_static)
    app.add_css_file("flashbook.css")
    app.connect("build-finished", _copy_explorers)
    app.connect("build-finished", _plain_search_index)
    app.connect("build-finished", _plain_math_in_pages)
    app.connect("html-page-context", _search_script)
    app.connect("doctree-resolved", _link_repository_paths)
    app.connect("html-page-context", _load_explorers)
    # last: after myst-nb has added the page's own scripts
    app.connect("html-page-context", _drop_widget_state, priority=900)
    # first: html-page-context stops at the first handler that returns a value
    app.connect("html-page-context", _dedupe_scripts, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
