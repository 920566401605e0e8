"""Notebook helpers: show the library's code in a chapter instead of retyping it.

A chapter calls ``show_source(flashbook.reference.attention)`` and the reader sees
the very code that the tests check, syntax-highlighted, in Jupyter, in Colab and in
the rendered book.
"""
from __future__ import annotations

import inspect
import os
import re
import textwrap


def _falsy(condition: str, names: set) -> bool:
    """Whether ``condition`` (Python) is false when every name in ``names`` is False: a
    name itself, ``not``-free ``and`` with one of them, ``or`` of them only."""
    import ast

    def false(node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.BoolOp):
            parts = [false(v) for v in node.values]
            return any(parts) if isinstance(node.op, ast.And) else all(parts)
        return False
    try:
        return false(ast.parse(condition, mode="eval").body)
    except SyntaxError:
        return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _switched_off_if(line: str, names: set) -> bool:
    """Whether ``line`` opens an ``if``/``elif`` block that is false with the switches off."""
    match = re.fullmatch(r"(?:el)?if (.+):(\s*#.*)?", line.strip())
    return bool(match) and _falsy(match.group(1), names)


def _block_end(lines: list[str], i: int) -> int:
    """One past the last line of the block that ``lines[i]`` opens (blank lines included)."""
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > _indent(lines[i])):
        j += 1
    return j


def _without_paragraphs(lines: list[str], switches) -> list[str]:
    """``lines`` less the docstring paragraphs that are about a switch: those whose first
    line names one as ````NAME````."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].count('"""') != 1:   # not the opening line of a docstring over several lines
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and '"""' not in lines[j]:
            j += 1
        doc, paragraph = [], []
        for line in lines[i:j + 1] + [""]:
            if line.strip():
                paragraph.append(line)
                continue
            about = paragraph and doc and any(f"``{name}``" in paragraph[0] for name in switches)
            if paragraph and not about:
                doc += paragraph + [line]
            elif about and paragraph[-1].rstrip().endswith('"""'):   # it closed the docstring
                while doc and not doc[-1].strip():
                    doc.pop()
                doc[-1] = doc[-1].rstrip() + '"""'
                doc.append(line)
            paragraph = []
        out.extend(doc[:-1])
        i = j + 1
    return out


def _without_blocks(lines: list[str], names: set) -> list[str]:
    """One pass of ``without_switches``: each ``if``/``elif`` block that is false with the
    switches off goes, an ``else`` after it stays one level less indented; the body of an
    ``if not SWITCH:`` stays, one level less indented (and its ``else`` goes)."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        negated = re.fullmatch(r"if not (\w+):(\s*#.*)?", line.strip())
        if negated and negated.group(1) in names:
            depth, j = _indent(line), _block_end(lines, i)
            out += [body[4:] if body.strip() else body for body in lines[i + 1:j]]
            if j < len(lines) and _indent(lines[j]) == depth and lines[j].strip().startswith("else:"):
                j = _block_end(lines, j)
            i = j
            continue
        if _switched_off_if(line, names):
            depth, j = _indent(line), _block_end(lines, i)
            if j < len(lines) and _indent(lines[j]) == depth and lines[j].strip().startswith("else:"):
                end = _block_end(lines, j)
                out += [body[4:] if body.strip() else body for body in lines[j + 1:end]]
                j = end
            elif j < len(lines) and _indent(lines[j]) == depth and lines[j].strip().startswith("elif "):
                lines[j] = lines[j].replace("elif ", "if ", 1)
            i = j
            continue
        out.append(line)
        i += 1
    return out


def without_switches(text: str, switches) -> str:
    """``text`` as it reads with the compile-time switches ``switches`` off and their
    arguments gone: a chapter shows a kernel before later chapters added to it.

    ``switches`` maps a switch (a ``tl.constexpr`` name) to the run-time arguments only it
    uses. Dropped: each ``if``/``elif`` block whose condition is false with the switches
    off (an ``else`` after it is kept, one level less indented; the body of ``if not
    SWITCH:`` likewise), and the switches and
    their arguments from every parameter and argument list (``NAME``, ``NAME=default``,
    ``NAME: tl.constexpr = default``)."""
    names = set(switches) | {a for args in switches.values() for a in args}
    lines = _without_paragraphs(text.splitlines(), switches)
    while True:   # until no switched-off block is left (an else body may hold another)
        out = _without_blocks(lines, names)
        if out == lines:
            break
        lines = out
    item = r"\s*(?:%s)(?:\s*:\s*tl\.constexpr)?(?:\s*=\s*[^,()]+)?\s*" % "|".join(sorted(names, key=len, reverse=True))
    text = "\n".join(out)
    text = re.sub(r",(?:%s)(?=[,)\n])" % item, "", text)             # ", NAME" after another argument
    text = re.sub(r"(?<=[(\n])(?:%s),[ \t]*" % item, "", text)        # "NAME, " opening a list or a line
    kept = []
    for line in text.splitlines():   # a continuation line left empty, or with only the closing bracket
        if kept and re.fullmatch(r"\s*\)?:?", line) and line.strip() and kept[-1].rstrip().endswith(","):
            kept[-1] = kept[-1].rstrip()[:-1] + line.strip()
        elif line.strip() or not kept or kept[-1].strip():
            kept.append(line)
    return "\n".join(kept) + "\n"


def source(obj, *, lines: tuple[int, int] | None = None, without: dict | None = None) -> str:
    """The source code of a function, class or module, dedented.

    ``lines=(first, last)`` keeps only those lines (1-based, inclusive) of it (counted after
    ``without``). ``without``: compile-time switches to show switched off
    (``without_switches``).
    """
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function as .fn
    try:
        text = inspect.getsource(obj)
    except (TypeError, OSError) as err:
        raise TypeError(f"obj must be a Python function, class or module with source, "
                        f"got {obj!r}") from err
    text = textwrap.dedent(text)
    if without:
        text = without_switches(text, without)
    if lines is not None:
        first, last = lines
        all_lines = text.splitlines()
        if not (1 <= first <= last <= len(all_lines)):
            raise ValueError(f"lines must satisfy 1 <= first <= last <= {len(all_lines)}, "
                             f"got {lines}")
        text = "\n".join(all_lines[first - 1:last])
    return text.rstrip() + "\n"


def show_source(obj, *, lines: tuple[int, int] | None = None, without: dict | None = None):
    """Display ``obj``'s source as a highlighted code block (Markdown output); ``lines`` and
    ``without`` as ``source``."""
    from IPython.display import Markdown, display

    obj = getattr(obj, "fn", obj)
    where = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    header = f"*Source: `{where}.{name}`*\n\n" if where and name and where != name else ""
    display(Markdown(f"{header}```python\n{source(obj, lines=lines, without=without)}```"))


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


def show_figure(fig) -> None:
    """Display a matplotlib Figure as the inline backend shows a pyplot one (a PNG cut to
    its contents), without pyplot: shown once, nothing left open."""
    from IPython.core.pylabtools import print_figure
    from IPython.display import display

    display({"image/png": print_figure(fig, "png", bbox_inches="tight", base64=True),
             "text/plain": repr(fig)}, raw=True)


def span(values, fmt: str = ".0f", collapse: bool = False) -> str:
    """``values``' range as the prose quotes it, "low to high" ("n/a" when there are none);
    with ``collapse``, one value alone where both ends print the same."""
    if not len(values):
        return "n/a"
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if collapse and lo == hi else f"{lo} to {hi}"


def bound_up(value: float) -> str:
    """``value`` rounded *up* to one significant digit, as "6e-07" for 5.4e-07: a bound the
    prose can quote ("agree to 6e-07") that no printed error exceeds; "0" for 0."""
    import math

    if value <= 0:
        return "0" if value == 0 else format(value, ".0e")
    exp = math.floor(math.log10(value))
    digit = math.ceil(round(value / 10.0 ** exp, 9))   # round(): 5.0 stays 5, not 6
    return format(digit * 10.0 ** exp, ".0e")


def listed(items) -> str:
    """Items as prose: ["a", "b", "c"] -> "a, b and c"; one item alone; none -> "none"."""
    items = [str(x) for x in items]
    return "none" if not items else items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _lines_with(obj, needle: str, without: dict | None = None) -> list[int]:
    """1-based numbers of the lines of ``obj``'s (dedented) source that contain ``needle``."""
    return [i for i, line in enumerate(source(obj, without=without).splitlines(), 1) if needle in line]


def show_between(obj, start: str, end: str, nth: int = 0, without: dict | None = None):
    """Show ``obj``'s source from the ``nth`` line containing ``start`` to the next line
    containing ``end``. The lines are searched for, so they follow the code when it changes.
    ``without``: as ``source``."""
    starts = _lines_with(obj, start, without)
    if len(starts) <= nth:
        raise ValueError(f"start {start!r} is on {len(starts)} lines of {obj!r}, "
                         f"so there is no occurrence number {nth}")
    first = starts[nth]
    ends = [i for i in _lines_with(obj, end, without) if i >= first]
    if not ends:
        raise ValueError(f"end {end!r} does not follow line {first} of {obj!r}")
    show_source(obj, lines=(first, ends[0]), without=without)


def _switched_off(lines: list[str], switches) -> set[int]:
    """Indices of ``lines`` inside an ``if`` block that ``without_switches`` would drop."""
    names = set(switches) | {a for args in switches.values() for a in args}
    hidden, i = set(), 0
    while i < len(lines):
        if _switched_off_if(lines[i], names):
            end = _block_end(lines, i)
            hidden.update(range(i + 1, end))
            i = end
        else:
            i += 1
    return hidden


def line_of(obj, needle: str, without: dict | None = None) -> str:
    """``"L<number>  <code>"``: the one line of ``obj``'s file that contains ``needle``,
    numbered as in the file (a chapter's line-by-line table uses it, and fails loudly
    if the code changed under it). ``without``: lines that ``source(obj, without=...)``
    drops do not count."""
    fn = getattr(obj, "fn", obj)  # a @triton.jit kernel keeps its Python function in .fn
    lines, first = inspect.getsourcelines(fn)
    off = _switched_off(lines, without) if without else set()
    hits = [i for i, line in enumerate(lines) if needle in line and i not in off]
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
