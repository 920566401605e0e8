"""Notebook helpers: show the library's code in a chapter instead of retyping it.

A chapter calls ``show_source(flashbook.reference.attention)`` and the reader sees
the very code that the tests check, syntax-highlighted, in Jupyter, in Colab and in
the rendered book.
"""
from __future__ import annotations

import inspect
import os
import textwrap


def source(obj, *, lines: tuple[int, int] | None = None) -> str:
    """The source code of a function, class or module, dedented.

    ``lines=(first, last)`` keeps only those lines (1-based, inclusive) of it.
    """
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function as .fn
    try:
        text = inspect.getsource(obj)
    except (TypeError, OSError) as err:
        raise TypeError(f"obj must be a Python function, class or module with source, "
                        f"got {obj!r}") from err
    text = textwrap.dedent(text)
    if lines is not None:
        first, last = lines
        all_lines = text.splitlines()
        if not (1 <= first <= last <= len(all_lines)):
            raise ValueError(f"lines must satisfy 1 <= first <= last <= {len(all_lines)}, "
                             f"got {lines}")
        text = "\n".join(all_lines[first - 1:last])
    return text.rstrip() + "\n"


def show_source(obj, *, lines: tuple[int, int] | None = None):
    """Display ``obj``'s source as a highlighted code block (Markdown output)."""
    from IPython.display import Markdown, display

    obj = getattr(obj, "fn", obj)
    where = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    header = f"*Source: `{where}.{name}`*\n\n" if where and name and where != name else ""
    display(Markdown(f"{header}```python\n{source(obj, lines=lines)}```"))


#: Set by ``tools/run_notebooks.py`` while it records the GPU chapters: glue then stores each
#: value in the notebook even where myst-nb is not installed (the GPU machine), so the
#: book built elsewhere quotes the GPU's numbers, not those of the machine that built it.
RECORD_GLUE = "FLASHBOOK_RECORD_GLUE"
#: how myst-nb (after papermill and scrapbook) marks a glued value that is not displayed
HIDDEN_GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value, display: bool = True):
    """Name a computed value so the book's prose can quote it (``{glue:text}`name```).

    In the book build this is myst-nb's ``glue``. Where myst-nb is not installed
    (Colab, a plain Jupyter) there is no prose to fill in: the value is shown
    when ``display`` is true, and otherwise nothing happens; except while the GPU
    chapters are recorded (``RECORD_GLUE`` set), when the value is stored in the
    cell's outputs as myst-nb stores it (the ``scrapbook`` metadata names it).
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        from IPython.display import display as show

        if os.environ.get(RECORD_GLUE):
            from IPython.core.formatters import format_display_data

            bundle, metadata = format_display_data(value)
            prefix = "" if display else HIDDEN_GLUE_PREFIX
            metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
            show({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
        elif display:
            show(value)
        return
    myst_glue(name, value, display=display)


def glue_text(name: str, value, fmt: str = "") -> None:
    """Glue ``value`` for the prose as text, formatted once by ``fmt`` ("n/a" for None),
    so the number in the text and the number the code computed are the same."""
    glue(name, "n/a" if value is None else format(value, fmt), display=False)


def _lines_with(obj, needle: str) -> list[int]:
    """1-based numbers of the lines of ``obj``'s (dedented) source that contain ``needle``."""
    return [i for i, line in enumerate(source(obj).splitlines(), 1) if needle in line]


def show_between(obj, start: str, end: str, nth: int = 0):
    """Show ``obj``'s source from the ``nth`` line containing ``start`` to the next line
    containing ``end``. The lines are searched for, so they follow the code when it changes."""
    starts = _lines_with(obj, start)
    if len(starts) <= nth:
        raise ValueError(f"start {start!r} is on {len(starts)} lines of {obj!r}, "
                         f"so there is no occurrence number {nth}")
    first = starts[nth]
    ends = [i for i in _lines_with(obj, end) if i >= first]
    if not ends:
        raise ValueError(f"end {end!r} does not follow line {first} of {obj!r}")
    show_source(obj, lines=(first, ends[0]))


def line_of(obj, needle: str) -> str:
    """``"L<number>  <code>"``: the one line of ``obj``'s file that contains ``needle``,
    numbered as in the file (a chapter's line-by-line table uses it, and fails loudly
    if the code changed under it)."""
    fn = getattr(obj, "fn", obj)  # a @triton.jit kernel keeps its Python function in .fn
    lines, first = inspect.getsourcelines(fn)
    hits = [i for i, line in enumerate(lines) if needle in line]
    if len(hits) != 1:
        raise ValueError(f"needle {needle!r} is on {len(hits)} lines of {fn.__name__}, not one")
    return f"L{first + hits[0]}  " + lines[hits[0]].split("  #")[0].strip()


def verdict_text(value: float, threshold: float, met: bool, *, digits: int = 2,
                 marks: tuple[str, str] = ("\u2713", "\u2717")) -> str:
    """``value`` and a tick or cross, with enough digits that the printed number agrees
    with the verdict: 0.796 against a threshold of 0.8 prints "0.796 ✗", never "0.80 ✗".

    More digits are added (up to 6) while the rounded value would read as equal to the
    threshold or on the other side of it than ``met`` says.
    """
    if not isinstance(met, bool) and type(met).__name__ != "bool_":  # numpy.bool_ too
        raise TypeError(f"met must be a bool, got {type(met).__name__}")
    value, threshold = float(value), float(threshold)
    shown = f"{value:.{digits}f}"
    while digits < 6:
        rounded = float(shown)
        if (rounded == threshold and value != threshold) or ((rounded > threshold) != (value > threshold)):
            digits += 1
            shown = f"{value:.{digits}f}"
        else:
            break
    return f"{shown} {marks[0] if met else marks[1]}"
