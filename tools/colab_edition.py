"""Write the Colab edition of the book: notebooks that read and run without Jupyter Book.

    python tools/colab_edition.py [OUT_DIR]            (default: _build/colab)
    python tools/colab_edition.py --student [OUT_DIR]  (default: _build/student)
    python tools/colab_edition.py --sync-setup         (rewrite the book's setup cells)

Generated from the book's notebooks (the single source), after `make book`:
- every glued value is put into the Markdown as the rendered book shows it, read from
  the glue records that the book build writes beside its executed notebooks
  (_build/jupyter_execute/notebooks/NN_slug.glue.json; nothing is executed again);
- citations become "(Dao et al., 2022)" linked to the book's references page;
  {doc}/{ref} roles and relative links become links into the online book;
- MyST fences become plain Markdown: admonitions quote blocks, dropdowns <details>;
- a Colab badge and a link to the chapter in the book open each notebook;
- solutions are folded: code hidden in Colab (cellView form) and Jupyter
  (source_hidden), prose in <details>; the student edition drops them instead;
- outputs are stripped; the first cell is the setup cell of tools/setup_cell.py.
"""
from __future__ import annotations

import argparse
import copy
import functools
import glob
import json
import os
import posixpath
import re
import sys

import nbformat
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from setup_cell import setup_cell  # noqa: E402
from student_edition import strip_solutions  # noqa: E402

NOTEBOOKS = os.path.join(ROOT, "notebooks")
EXECUTED = os.path.join(ROOT, "_build", "jupyter_execute", "notebooks")
#: The branch the workflow publishes the editions to; badges and launch buttons point there.
COLAB_BRANCH = "colab"
COLAB = "https://colab.research.google.com/github"

#: What no Markdown cell of the edition may contain (MyST that only Jupyter Book reads).
#: (A role is `{name}` followed by a backquote: math such as $O_{\text{ref}}$ is no role.)
FORBIDDEN = (
    ("{glue", re.compile(r"\{glue[\w:-]*\}")),
    ("{cite", re.compile(r"\{cite[\w:-]*\}`")),
    ("{doc", re.compile(r"\{doc\}`")),
    ("{ref", re.compile(r"\{ref\}`")),
    (":::", re.compile(r":::")),
    ("a directive fence", re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*\{", re.M)),
    ("a (label)= target", re.compile(r"^\s*\([\w.:-]+\)=\s*$", re.M)),
    ("a MyST role", re.compile(r"\{[a-z][\w:-]*\}`")),
)

ROLE = re.compile(r"\{([a-z][\w:-]*)\}`([^`]*)`")
FENCE_OPEN = re.compile(r"^(?P<fence>:{3,}|`{3,})\{(?P<name>[\w:-]+)\}\s*(?P<arg>.*?)\s*$")
LABEL = re.compile(r"^\s*\(([\w.:-]+)\)=\s*$")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
ADMONITIONS = {"admonition", "note", "tip", "hint", "important", "warning", "caution",
               "attention", "danger", "error", "seealso"}


# ---------------------------------------------------------------------------
# The book's configuration: the one repository URL and the online book's URL
# ---------------------------------------------------------------------------

def config() -> dict:
    with open(os.path.join(ROOT, "_config.yml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def repo_url(cfg: dict | None = None) -> str:
    return (cfg or config())["repository"]["url"]


def book_url(cfg: dict | None = None) -> str:
    """The online book's base URL (``html.baseurl`` of _config.yml), ending in '/'."""
    return (cfg or config())["html"]["baseurl"].rstrip("/") + "/"


def colab_url(slug: str, cfg: dict | None = None, student: bool = False) -> str:
    """Where Colab opens the published Colab edition of one chapter (``student``: the
    student edition, published beside it under ``student/``)."""
    path = repo_url(cfg).removeprefix("https://github.com/")
    return f"{COLAB}/{path}/blob/{COLAB_BRANCH}/{'student/' if student else ''}{slug}.ipynb"


def is_chapter(slug: str) -> bool:
    """A chapter (NN_slug), which ends with exercises; not an appendix page (An_slug)."""
    return slug[:1].isdigit()


def version() -> str:
    text = open(os.path.join(ROOT, "flashbook", "__init__.py"), encoding="utf-8").read()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def uses_triton(nb) -> bool:
    """The chapter runs Triton kernels (so it wants a GPU, and Linux)."""
    code = "\n".join(c.source for c in nb.cells[1:] if c.cell_type == "code")
    return bool(re.search(r"\bimport triton\b|flashbook\.kernels|from flashbook import [^\n]*\bbench\b", code))


def book_setup_cell(nb, cfg: dict | None = None, source: str | None = None) -> str:
    return setup_cell(repo_url(cfg), version(), uses_triton(nb), source=source)


def colab_metadata(nb) -> dict:
    """Notebook metadata: a GPU runtime (Colab's T4) for the Triton chapters only."""
    meta = {k: v for k, v in nb.metadata.items() if k not in ("accelerator", "colab")}
    if uses_triton(nb):
        meta["accelerator"] = "GPU"
        meta["colab"] = {"gpuType": "T4", "provenance": []}
    else:
        meta["colab"] = {"provenance": []}
    return meta


# ---------------------------------------------------------------------------
# Glue values, as the book build recorded them
# ---------------------------------------------------------------------------

def _code_sources(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def glue_records(slug: str, executed_dir: str = EXECUTED) -> dict:
    """name -> the glued output (mime bundle) that the book build rendered.

    Read from the build's ``<slug>.glue.json``; the executed copy beside it must have
    the same code as the source notebook (else the build is stale: run `make book`).
    """
    path = os.path.join(executed_dir, slug + ".glue.json")
    executed = os.path.join(executed_dir, slug + ".ipynb")
    source = nbformat.read(os.path.join(NOTEBOOKS, slug + ".ipynb"), as_version=4)
    if not os.path.exists(executed):
        if "{glue" not in json.dumps([c.source for c in source.cells]):
            return {}
        raise SystemExit(f"{slug}: the book is not built (no {executed}): run `make book` first")
    done = nbformat.read(executed, as_version=4)
    # the setup cell is not compared: the book build runs the same code either way
    if _code_sources(done)[1:] != _code_sources(source)[1:]:
        raise SystemExit(f"{slug}: the built book is older than the notebook: run `make book` first")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def smartquotes_action() -> str:
    """The book's ``smartquotes_action`` (_config.yml; Sphinx's default is "qDe")."""
    with open(os.path.join(ROOT, "_config.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    return ((config.get("sphinx") or {}).get("config") or {}).get("smartquotes_action", "qDe")


def _as_rendered(text: str) -> str:
    """What Sphinx's smart quotes (the book's action) make of a text."""
    from docutils.utils.smartquotes import smartyPants

    return smartyPants(text, smartquotes_action(), "en")


def glued_text(records: dict, key: str, role: str, slug: str) -> str:
    """The text the book shows for one glue role (myst-nb's own formatting, then
    Sphinx's smart quotes)."""
    return _as_rendered(_glued(records, key, role, slug))


def _glue_data(records: dict, name: str, slug: str) -> dict:
    """The mime bundle glued as ``name`` (a role's or a directive's), or a SystemExit naming it."""
    if name not in records:
        raise SystemExit(f"{slug}: nothing was glued as {name!r}")
    return records[name]["data"]


def _glued(records: dict, key: str, role: str, slug: str) -> str:
    from myst_nb.core.variables import format_plain_text

    name, _, fmt = key.rpartition(":") if role == "glue:text" and ":" in key else (key, "", "")
    data = _glue_data(records, name, slug)
    if role == "glue:text":
        return format_plain_text(data["text/plain"], fmt or "s")
    if role == "glue:md" and "text/markdown" in data:
        return data["text/markdown"]
    if "text/plain" in data and len(data) == 1:
        return data["text/plain"]
    raise SystemExit(f"{slug}: {{{role}}}`{key}` pastes {sorted(data)}, which Markdown cannot show")


def pasted_block(records: dict, name: str, slug: str) -> list[str]:
    """A ```{glue}``` directive's output as Markdown lines: its Markdown, else its HTML (a
    DataFrame's table, without the style block pandas puts first; one HTML block, so no
    blank or indented line that Markdown would read as text or code), else its text in a
    code block."""
    data = _glue_data(records, name, slug)
    if "text/markdown" in data:
        return data["text/markdown"].split("\n")
    if "text/html" in data:
        html = re.sub(r"<style.*?</style>", "", data["text/html"], flags=re.S)
        return [line.strip() for line in html.split("\n") if line.strip()]
    if "text/plain" in data:
        return ["```"] + data["text/plain"].split("\n") + ["```"]
    raise SystemExit(f"{slug}: {{glue}} {name} pastes {sorted(data)}, which Markdown cannot show")


# ---------------------------------------------------------------------------
# Citations, from book/references.bib in the book's author-year style
# ---------------------------------------------------------------------------

_BIB: dict | None = None


def bibliography() -> dict:
    """key -> (authors as the book cites them, year)."""
    global _BIB
    if _BIB is None:
        from pybtex.database import parse_file

        db = parse_file(os.path.join(ROOT, "book", "references.bib"))
        _BIB = {}
        for key, entry in db.entries.items():
            people = entry.persons.get("author", [])
            last = [" ".join(str(p.rich_prelast_names[i]) for i in range(len(p.rich_prelast_names)))
                    .strip() + " " + " ".join(str(n) for n in p.rich_last_names) for p in people]
            last = [re.sub(r"\s+", " ", n).strip() for n in last]
            if len(last) >= 3:
                who = f"{last[0]} et al."
            elif len(last) == 2:
                who = f"{last[0]} and {last[1]}"
            else:
                who = last[0] if last else key
            _BIB[key] = (who, entry.fields.get("year", "n.d."))
    return _BIB


def cite(keys: str, textual: bool, refs_url: str) -> str:
    bib = bibliography()
    items = []
    for key in (k.strip() for k in keys.split(",")):
        if key not in bib:
            raise SystemExit(f"{{cite}}`{key}`: no such entry in book/references.bib")
        items.append(bib[key])
    if textual:
        text = "; ".join(f"{who} ({year})" for who, year in items)
    else:
        text = "(" + "; ".join(f"{who}, {year}" for who, year in items) + ")"
    return f"[{text}]({refs_url})"


# ---------------------------------------------------------------------------
# Links into the online book
# ---------------------------------------------------------------------------

def _page(doc: str) -> str:
    """A source path relative to the book root -> its page's path in the online book."""
    base, ext = posixpath.splitext(doc)
    return (base if ext in (".md", ".ipynb") else doc) + (".html" if ext in (".md", ".ipynb", "") else "")


def absolute_link(target: str, here: str, base: str) -> str:
    """A link of the notebook ``here`` (relative to the book root) made absolute."""
    if re.match(r"^[a-z][\w+.-]*:", target) or target.startswith("#"):
        return target
    path, _, anchor = target.partition("#")
    doc = posixpath.normpath(posixpath.join(posixpath.dirname(here), path))
    return base + _page(doc) + (f"#{anchor}" if anchor else "")


_LABELS: dict | None = None


def labels() -> dict:
    """label -> (page path, heading text) for every `(label)=` target in the book."""
    global _LABELS
    if _LABELS is None:
        _LABELS = {}
        sources = glob.glob(os.path.join(ROOT, "book", "*.md")) + glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))
        for path in sources:
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            if path.endswith(".ipynb"):
                text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                                 if c.cell_type == "markdown")
            else:
                text = open(path, encoding="utf-8").read()
            lines = text.splitlines()
            for i, line in enumerate(lines):
                m = LABEL.match(line)
                if m:
                    heading = next((ln.lstrip("#").strip() for ln in lines[i + 1:] if ln.strip()), m.group(1))
                    _LABELS[m.group(1)] = (rel, heading)
    return _LABELS


def _explicit(text: str) -> tuple[str | None, str]:
    m = re.fullmatch(r"(.*?)\s*<([^>]+)>", text, re.S)
    return (m.group(1), m.group(2)) if m else (None, text)


def _title(doc_rel: str) -> str:
    path = os.path.join(ROOT, doc_rel)
    for ext in ("", ".md", ".ipynb"):
        if os.path.exists(path + ext):
            path += ext
            break
    if path.endswith(".ipynb"):
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    else:
        text = open(path, encoding="utf-8").read()
    m = re.search(r"^#\s+(.+)$", text, re.M)
    return m.group(1).strip() if m else doc_rel


# ---------------------------------------------------------------------------
# Markdown: roles, fences, labels, links
# ---------------------------------------------------------------------------

class Converter:
    """Turns one notebook's MyST Markdown into plain (Colab) Markdown."""

    def __init__(self, slug: str, records: dict, cfg: dict | None = None):
        self.slug = slug
        self.here = f"notebooks/{slug}.ipynb"
        self.records = records
        self.base = book_url(cfg)
        self.glued: list[str] = []  # every glued text, in the order of the prose

    def role(self, m: re.Match) -> str:
        name, text = m.group(1), m.group(2)
        if name in ("glue", "glue:", "glue:any", "glue:text", "glue:md"):
            value = glued_text(self.records, text, name, self.slug)
            self.glued.append(value)
            return value
        if name in ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts"):
            return cite(text, name.startswith("cite:t"), self.base + "book/references.html")
        if name == "doc":
            title, target = _explicit(text)
            doc = posixpath.normpath(posixpath.join(posixpath.dirname(self.here), target))
            return f"[{title or _title(doc)}]({self.base + _page(doc)})"
        if name == "ref":
            title, label = _explicit(text)
            if label not in labels():
                raise SystemExit(f"{self.slug}: {{ref}}`{text}` names no (label)= target")
            page, heading = labels()[label]
            return f"[{title or heading}]({self.base + _page(page)}#{label.replace('_', '-')})"
        if name == "math":
            return f"${text}$"
        if name in ("term",):
            title, _ = _explicit(text)
            return f"[{title or text}]({self.base}book/glossary.html)"
        raise SystemExit(f"{self.slug}: the role {{{name}}} has no Colab rendering (add one in {__file__})")

    def inline(self, text: str) -> str:
        text = ROLE.sub(self.role, text)
        return LINK.sub(lambda m: m.group(1) + absolute_link(m.group(2), self.here, self.base) + m.group(3), text)

    def blocks(self, lines: list[str]) -> list[str]:
        out, i = [], 0
        while i < len(lines):
            line = lines[i]
            m = FENCE_OPEN.match(line.strip())
            if LABEL.match(line):
                i += 1
                continue
            if not m:
                out.append(self.inline(line))
                i += 1
                continue
            fence, name, arg = m.group("fence"), m.group("name"), m.group("arg")
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                j += 1
            if j == len(lines):
                raise SystemExit(f"{self.slug}: unclosed {fence}{{{name}}}")
            body = lines[i + 1:j]
            while body and re.match(r"^:[\w-]+:", body[0].strip()):  # directive options
                body = body[1:]
            inner = self.blocks(body)
            if name == "dropdown":
                out += ["<details>", f"<summary>{self.inline(arg) or 'Show'}</summary>", ""]
                out += inner + ["", "</details>"]
            elif name in ADMONITIONS:
                title = self.inline(arg) if name == "admonition" else name.capitalize()
                out += [f"> **{title}**" if title else ">", ">"]
                out += [f"> {ln}" if ln.strip() else ">" for ln in inner]
            elif name == "math":
                out += ["$$"] + body + ["$$"]
            elif name in ("code", "code-block"):
                out += ["```" + arg] + body + ["```"]
            elif name in ("glue", "glue:any"):
                out += pasted_block(self.records, arg, self.slug)
            else:
                raise SystemExit(f"{self.slug}: the directive {{{name}}} has no Colab rendering")
            i = j + 1
        return out

    def markdown(self, text: str) -> str:
        return "\n".join(self.blocks(text.split("\n")))


def forbidden(text: str) -> list[str]:
    """The MyST bits left in one Markdown text (empty: plain Markdown)."""
    return [what for what, pattern in FORBIDDEN if pattern.search(text)]


# ---------------------------------------------------------------------------
# One notebook
# ---------------------------------------------------------------------------

def header(nb, slug: str, cfg: dict | None = None, student: bool = False) -> str:
    title = nb.cells[1].source.splitlines()[0].lstrip("#").strip()
    text = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(slug, cfg, student)})\n\n"
            f"Read this chapter in the book, with its figures and numbers rendered: "
            f"[{title}]({book_url(cfg)}notebooks/{slug}.html)")
    if is_chapter(slug):
        text += ("\n\nThis is the student edition: the exercises without their solutions. "
                 f"[The chapter with the solutions]({colab_url(slug, cfg)})." if student else
                 "\n\nThe exercises alone, without the solutions, for a class: "
                 f"[open the exercises in Colab]({colab_url(slug, cfg, student=True)}).")
    return text


def fold_solution(cell) -> None:
    """A solution code cell: hidden in Colab (form view) and in JupyterLab."""
    cell.metadata["cellView"] = "form"
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    if not cell.source.startswith("#@title"):
        cell.source = "#@title Solution (double-click to show the code)\n" + cell.source


def edition(path: str, student: bool = False, cfg: dict | None = None,
            executed_dir: str = EXECUTED, source: str | None = None):
    """The Colab (or student) edition of one notebook, and the glued texts in order."""
    cfg = cfg or config()
    slug = os.path.basename(path)[: -len(".ipynb")]
    nb = nbformat.read(path, as_version=4)
    conv = Converter(slug, glue_records(slug, executed_dir), cfg)
    out = copy.deepcopy(nb)
    if student:
        strip_solutions(out)
    out.metadata = colab_metadata(nb)
    for cell in out.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            cell.source = conv.markdown(cell.source)
            left = forbidden(cell.source)
            if left:
                raise SystemExit(f"{slug}: a Markdown cell still holds {left}:\n{cell.source[:300]}")
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if "solution" in tags:
                fold_solution(cell)
    out.cells[0].source = book_setup_cell(nb, cfg, source=source)
    out.cells[0].metadata = {}
    out.cells.insert(0, nbformat.v4.new_markdown_cell(header(nb, slug, cfg, student)))
    return out, conv.glued


def book_notebooks() -> list[str]:
    """The book's notebooks: the chapters (NN_slug) and the appendix pages (An_slug)."""
    return sorted(glob.glob(os.path.join(NOTEBOOKS, "[0-9][0-9]_*.ipynb"))
                  + glob.glob(os.path.join(NOTEBOOKS, "A[0-9]_*.ipynb")))


def write(out_dir: str, student: bool = False, notebooks: list[str] | None = None) -> dict:
    """Write every chapter's edition into out_dir; returns slug -> glued texts."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = config()
    glued = {}
    for path in notebooks or book_notebooks():
        nb, values = edition(path, student=student, cfg=cfg)
        slug = os.path.basename(path)[: -len(".ipynb")]
        glued[slug] = values
        nbformat.write(nb, os.path.join(out_dir, slug + ".ipynb"))
    with open(os.path.join(out_dir, "glued.json"), "w", encoding="utf-8") as f:
        json.dump(glued, f, indent=1, ensure_ascii=False)
    return glued


#: The line a book page's code cell names the release with (``sync_setup_cells`` keeps it).
RELEASE_LINE = re.compile(r'^RELEASE = "v[^"]*"', re.M)


def sync_setup_cells() -> list[str]:
    """Rewrite the book notebooks' first cell (and GPU metadata) from the template;
    returns the notebooks that changed."""
    cfg = config()
    changed = []
    for path in book_notebooks():
        nb = nbformat.read(path, as_version=4)
        cell_text, meta = book_setup_cell(nb, cfg), colab_metadata(nb)
        if nb.cells[0].source != cell_text or nb.metadata != meta:
            nb.cells[0].source = cell_text
            nb.metadata = meta
            nbformat.write(nb, path)
            changed.append(os.path.basename(path))
    # the book's Markdown pages with code name the release in a line of their own, so a new
    # release changes the cell and the build's cache runs it again
    for path in sorted(glob.glob(os.path.join(ROOT, "book", "*.md"))):
        text = open(path, encoding="utf-8").read()
        new = RELEASE_LINE.sub(f'RELEASE = "v{version()}"', text)
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(os.path.relpath(path, ROOT))
    return changed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--student", action="store_true", help="drop the solutions instead of folding them")
    ap.add_argument("--sync-setup", action="store_true", help="rewrite the book notebooks' setup cells")
    args = ap.parse_args(argv)
    if args.sync_setup:
        print("setup cells rewritten:", sync_setup_cells() or "none")
        return
    out = args.out_dir or os.path.join(ROOT, "_build", "student" if args.student else "colab")
    glued = write(out, student=args.student)
    n = sum(len(v) for v in glued.values())
    print(f"{'student' if args.student else 'Colab'} edition: {len(glued)} notebooks, "
          f"{n} glued values, written to {os.path.abspath(out)}")


if __name__ == "__main__":
    main()
