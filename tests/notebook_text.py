"""Reading the book's notebooks as stored (the JSON under notebooks/, nothing executed).

The tests that check what a chapter says read it through these few functions::

    from notebook_text import cell_source, markdown, notebook

    nb = notebook("10_making_it_fast")               # or "10_making_it_fast.ipynb", or a path
    assert "{glue:text}`ladder_best`" in cell_source(nb, "a9a89247")
    assert "Gluon" in markdown(nb)

Every function that takes ``nb`` takes a notebook as :func:`notebook` returns it (a notebook
read with ``nbformat.read`` works too: it is a dict whose sources are already joined), or
anything :func:`notebook` accepts, which it then reads.

Hidden cells compute the numbers the prose quotes; :func:`run_glued` runs such cells with the
chapter's glue functions captured, so a test can compare what a page would show::

    glued, ns = run_glued(cell_source(nb, "1791dcf8"), bench=bench)
"""
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
BOOK = os.path.join(ROOT, "book")


def notebook_path(name_or_path) -> str:
    """The file a notebook name stands for: a bare name ("10_making_it_fast.ipynb", or without
    the ".ipynb") is a notebook under notebooks/; anything with a folder in it is a path."""
    path = os.fspath(name_or_path)
    if os.path.dirname(path):
        return path
    return os.path.join(NOTEBOOKS, path if path.endswith(".ipynb") else path + ".ipynb")


def notebook(name_or_path) -> dict:
    """The notebook's JSON, as stored (see :func:`notebook_path` for the names it takes)."""
    with open(notebook_path(name_or_path), encoding="utf-8") as f:
        return json.load(f)


def _read(nb) -> dict:
    return notebook(nb) if isinstance(nb, (str, os.PathLike)) else nb


def cells(nb) -> list:
    """The notebook's cells, in order."""
    return _read(nb)["cells"]


def source_of(cell) -> str:
    """One cell's source as one string (stored, it is a list of lines)."""
    return "".join(cell["source"])


def find_cell(nb, cell_id: str) -> dict:
    """The one cell whose id is ``cell_id``; an AssertionError naming the id when there are none
    or several."""
    found = [c for c in cells(nb) if c.get("id") == cell_id]
    assert len(found) == 1, f"{len(found)} cells have the id {cell_id!r}, not one"
    return found[0]


def cell_source(nb, cell_id: str) -> str:
    """The source of the one cell whose id is ``cell_id`` (see :func:`find_cell`)."""
    return source_of(find_cell(nb, cell_id))


def cell_ids(nb) -> list:
    """Every cell's id, in order (None for a cell without one)."""
    return [c.get("id") for c in cells(nb)]


def sources_by_id(nb) -> dict:
    """{cell id: the cell's source} for every cell, in order."""
    return {c.get("id"): source_of(c) for c in cells(nb)}


def source_text(nb, kind=None, sep: str = "\n") -> str:
    """The sources of the cells of one kind ("markdown", "code"; None: every cell), in order,
    joined by ``sep``."""
    return sep.join(source_of(c) for c in cells(nb) if kind is None or c["cell_type"] == kind)


def markdown(nb, sep: str = "\n") -> str:
    """The notebook's prose: its Markdown cells, joined by ``sep``."""
    return source_text(nb, "markdown", sep)


def glue_text_value(value, fmt: str = "") -> str:
    """The text ``flashbook.display.glue_text(name, value, fmt)`` puts in the prose."""
    return "n/a" if value is None else format(value, fmt)


def run_glued(code, quiet: bool = False, **names) -> tuple:
    """Run notebook code (a cell's source, or a list of them, in order, in one namespace) with
    ``names`` defined and the glue functions captured: ``g`` and ``glue_text`` as the text the
    prose shows (:func:`glue_text_value`), ``glue`` as the value itself. ``quiet``: ``print``
    and ``display`` do nothing. Returns (what was glued, by name; the namespace)."""
    glued = {}

    def text(name, value, fmt=""):
        glued[name] = glue_text_value(value, fmt)

    def glue(name, value, display=True):
        glued[name] = value

    ns = {"g": text, "glue_text": text, "glue": glue}
    if quiet:
        ns.update(print=lambda *a, **k: None, display=lambda *a, **k: None)
    ns.update(names)
    for i, one in enumerate([code] if isinstance(code, str) else code):
        exec(compile(one, f"<cell {i}>", "exec"), ns)
    return glued, ns


def glue_role(name: str) -> str:
    """How a page's Markdown quotes a glued value: {glue:text}`name`."""
    return "{glue:text}`" + name + "`"


def flat(text: str) -> str:
    """Prose with its line breaks and indents folded to single spaces: what a sentence check
    compares, wherever the source happens to wrap."""
    return " ".join(text.split())


def book_page(name: str) -> str:
    """The source of a book page that is not a notebook (``book/NAME``, e.g. "which_kernel.md")."""
    with open(os.path.join(BOOK, name), encoding="utf-8") as f:
        return f.read()


def glossary_entry(term: str) -> str:
    """The glossary's text for ``term`` (one of the names an entry is listed under), folded to
    one line."""
    block = book_page("glossary.md").split("```{glossary}")[1].split("```")[0]
    lines = block.splitlines()
    body = []
    for line in lines[lines.index(term) + 1:]:
        if line and not line.startswith(" "):
            if body:
                break
            continue          # another name of the same entry
        body.append(line.strip())
    return " ".join(body)


class NoPlot:
    """A stand-in for pyplot and the figure helpers when a test runs a cell for its numbers:
    every call returns something that takes any call."""

    def __getattr__(self, name):
        return NoPlot()

    def __call__(self, *a, **k):
        return NoPlot()

    def __iter__(self):
        return iter((NoPlot(), NoPlot()))


def page_glued(name):
    """Every code cell of a book page run with ``glue_text`` captured: {name: the text shown}."""
    import flashbook.display

    glued = {}

    def capture(key, value, fmt=""):
        glued[key] = glue_text_value(value, fmt)

    real, cwd = flashbook.display.glue_text, os.getcwd()
    flashbook.display.glue_text = capture
    try:
        os.chdir(BOOK)                    # where the book build runs a page
        ns = {"display": lambda *a, **k: None, "print": lambda *a, **k: None}
        for cell in re.findall(r"```\{code-cell\} ipython3\n(.*?)```", book_page(name), re.S):
            exec("\n".join(line for line in cell.splitlines() if not line.startswith(":tags:")), ns)
    finally:
        os.chdir(cwd)
        flashbook.display.glue_text = real
    return glued
