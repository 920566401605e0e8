"""Notebook helpers: show the library's code in a chapter instead of retyping it.

A chapter calls ``show_source(flashbook.reference.attention)`` and the reader sees
the very code that the tests check, syntax-highlighted, in Jupyter, in Colab and in
the rendered book.
"""
from __future__ import annotations

import inspect
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


def glue(name: str, value, display: bool = True):
    """Name a computed value so the book's prose can quote it (``{glue:text}`name```).

    In the book build this is myst-nb's ``glue``. Where myst-nb is not installed
    (Colab, a plain Jupyter) there is no prose to fill in: the value is shown
    when ``display`` is true, and otherwise nothing happens.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as show

            show(value)
        return
    myst_glue(name, value, display=display)
