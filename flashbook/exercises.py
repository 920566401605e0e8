"""Exercises that check themselves: one stub convention, one check.

A stub is a function whose body is ``raise NotImplementedError`` (or which
returns ``NotImplemented``); an answer left as ``NotImplemented``, ``...`` or
``None`` counts the same. ``check`` runs the student's function (or takes their
value), compares it with the expected answer or runs a test on it, and reports
one of three things, without ever raising, so that *Run all* always finishes:

- ``not attempted``: the stub is still there;
- ``wrong: <what and where>``: the largest error and its index, the shape or the
  key that differs, the exception and the line that raised it;
- ``correct``.

    >>> check("ex1", lambda n: n * n, expected=16, args=(4,), show=False).status
    'correct'

The stub convention, everywhere in the book: a function to write raises
``NotImplementedError``; a value to give is ``NotImplemented``; a Triton kernel to
write has the body ``pass`` and its check says "not attempted" while the kernel
stores nothing (the launcher fills the output with NaN).

Where the answer is an argument, the check is a question with a few choices, and
its answer is given as a ``key`` (see ``answer_key``), so that the check cell does
not print the answer.

When the environment variable ``FLASHBOOK_SOLUTIONS`` is ``1`` (the book build
sets it, through ``book/_ext``, while it executes the notebooks with their
solutions; so does ``tools/run_notebooks.py``), a check that does not report
"correct" raises AssertionError after its report, so that a wrong solution fails
the build. In a student's notebook it is unset and a check never raises; the
grader unsets it and reads the reports instead.

Each report is displayed with a machine-readable copy, the mime type
``application/vnd.flashbook.check+json``, which ``flashbook.grade`` collects.
"""
from __future__ import annotations

import hashlib
import os
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

NOT_ATTEMPTED = "not attempted"
WRONG = "wrong"
CORRECT = "correct"
STATUSES = (NOT_ATTEMPTED, WRONG, CORRECT)

#: Answers that mean "the stub is still there".
_STUB_VALUES = (NotImplemented, Ellipsis, None)

#: The environment variable that says "the solutions ran: every check must be correct".
SOLUTIONS_ENV = "FLASHBOOK_SOLUTIONS"
#: The mime type of a check's machine-readable report (read by flashbook.grade).
MIME = "application/vnd.flashbook.check+json"


@dataclass(frozen=True)
class Result:
    """What ``check`` found: ``status`` is one of ``STATUSES``."""

    name: str
    status: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == CORRECT

    def _ipython_display_(self) -> None:
        """A check shows its report itself: as a cell's last line it adds no second copy."""
        if not getattr(self, "_shown", False):
            _show(self)

    def __str__(self) -> str:
        if self.status == WRONG:
            return f"{self.name}: wrong: {self.message}"
        return f"{self.name}: {self.status}" + (f" ({self.message})" if self.message else "")


def _is_stub(value) -> bool:
    """A stub value, or a tuple/list with a stub in it (an answer left half done)."""
    if isinstance(value, (tuple, list)):
        return len(value) > 0 and any(_is_stub(v) for v in value)
    return any(value is s for s in _STUB_VALUES)


def answer_key(name: str, answer: Any) -> str:
    """A short digest of an answer: a choice letter, an integer, a number, a tuple of them.

    A check compares keys, so the check cell shows the key, not the answer.
    Letters ignore case and surrounding blanks; a number counts to four
    significant digits (32.0001 and 32 have the same key), an integer exactly.
    """
    return hashlib.sha256(f"{name}:{_canonical(answer)}".encode()).hexdigest()[:12]


def _canonical(answer) -> str:
    if isinstance(answer, str):
        return repr(answer.strip().lower())
    if isinstance(answer, (bool, np.bool_)):
        return repr(bool(answer))
    if isinstance(answer, (int, np.integer)):
        return repr(int(answer))
    if isinstance(answer, (float, np.floating)):
        x = float(answer)
        return repr(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:.4g}"
    if isinstance(answer, (tuple, list)):
        return "(" + ", ".join(_canonical(a) for a in answer) + ")"
    return repr(answer)


def solutions_expected() -> bool:
    """True where the solutions ran (the book build): checks must then be correct."""
    return os.environ.get(SOLUTIONS_ENV, "") == "1"


def _where_raised(exc: BaseException) -> str:
    """The innermost frame of the traceback, as 'line N of fn'."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (line {f.lineno} of {f.name})"


def compare(answer, expected, *, rtol: float = 1e-7, atol: float = 0.0, path: str = "") -> str | None:
    """None if ``answer`` matches ``expected``, else what differs and where.

    Numbers and arrays are compared with ``rtol``/``atol`` (the largest error and
    its index are reported); tuples, lists and dicts element by element; anything
    else with ``==``.
    """
    here = "the answer" + path
    if isinstance(expected, dict):
        if not isinstance(answer, dict):
            return f"{here} is a {type(answer).__name__}, expected a dict"
        missing = [k for k in expected if k not in answer]
        if missing:
            return f"{here} lacks the key {missing[0]!r}"
        for key in expected:
            why = compare(answer[key], expected[key], rtol=rtol, atol=atol, path=f"{path}[{key!r}]")
            if why:
                return why
        return None
    if isinstance(expected, (tuple, list)) and not _numeric(expected):
        if not isinstance(answer, (tuple, list)) or len(answer) != len(expected):
            n = len(answer) if isinstance(answer, (tuple, list)) else type(answer).__name__
            return f"{here} has {n} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(answer, expected)):
            why = compare(a, e, rtol=rtol, atol=atol, path=f"{path}[{i}]")
            if why:
                return why
        return None
    if _numeric(expected):
        try:
            a = np.asarray(_to_numpy(answer), dtype=np.float64)
        except (TypeError, ValueError):
            return f"{here} is a {type(answer).__name__}, expected a number or an array"
        e = np.asarray(_to_numpy(expected), dtype=np.float64)
        if a.shape != e.shape:
            return f"{here} has shape {a.shape}, expected {e.shape}"
        bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        if not bad.any():
            return None
        err = np.where(bad, np.abs(a - e), 0.0)
        err = np.where(np.isnan(err), np.inf, err)
        idx = np.unravel_index(int(np.argmax(err)), e.shape) if e.shape else ()
        at = f" at index {tuple(int(i) for i in idx)}" if e.shape else ""
        count = f" ({int(bad.sum())} of {e.size} values differ)" if e.shape else ""
        return f"{here} is {a[idx]:.6g}{at}, expected {e[idx]:.6g}{count}"
    return None if answer == expected else f"{here} is {answer!r}, expected {expected!r}"


def _to_numpy(x):
    detach = getattr(x, "detach", None)          # a torch tensor, without importing torch
    return detach().cpu().numpy() if callable(detach) else x


def _numeric(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, float, np.number, np.ndarray)) or hasattr(x, "detach"):
        return True
    return (isinstance(x, (list, tuple)) and len(x) > 0
            and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                    for v in x))


def check(name: str, answer: Any, expected: Any = None, *, test: Callable | None = None,
          key: str | None = None, call: bool = True, args: tuple = (),
          kwargs: dict | None = None, rtol: float = 1e-7, atol: float = 0.0,
          show: bool = True) -> Result:
    """Check one exercise; never raises in a student's notebook.

    ``answer`` is the student's value, or their function, called as
    ``answer(*args, **kwargs)`` (with ``call=False`` the function itself is
    passed to ``test``). The result is compared with ``expected`` (see
    ``compare``), with ``key`` (see ``answer_key``), or passed to ``test``, which
    returns None (or True) when it is right, and a message saying what is wrong
    (or False, or raises AssertionError with a message) otherwise; a test that
    raises NotImplementedError says the stub is still there. ``show`` displays
    the one-line report and its machine-readable copy. Where the solutions ran
    (``solutions_expected()``), a report other than "correct" raises
    AssertionError after it is shown.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if sum(x is not None for x in (expected, test, key)) != 1:
        raise ValueError("check needs exactly one of an expected answer, a test or a key")
    if key is not None:
        want = key
        expected, test = None, lambda value: (
            None if answer_key(name, value) == want else f"{value!r} is not the answer")
    result = _check(name, answer, expected, test, call, args, kwargs or {}, rtol, atol)
    if show:
        _show(result)
    if solutions_expected() and not result.ok:
        raise AssertionError(f"with the solutions in place, {result}")
    return result


def _show(result: Result) -> None:
    """The report as text, with a JSON copy for flashbook.grade (plain print outside IPython)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:                                       # pragma: no cover
        get_ipython = None
    object.__setattr__(result, "_shown", True)               # frozen: not a field, a mark
    if get_ipython is None or get_ipython() is None:
        print(result)
        return
    display({"text/plain": str(result), MIME: asdict(result)}, raw=True)


def _check(name, answer, expected, test, call, args, kwargs, rtol, atol) -> Result:
    value = answer
    if call and callable(answer) and not isinstance(answer, type):
        try:
            value = answer(*args, **kwargs)
        except NotImplementedError:
            return Result(name, NOT_ATTEMPTED, "the stub raises NotImplementedError")
        except Exception as exc:   # a student's bug is a wrong answer, not a crash
            return Result(name, WRONG, f"it raised {type(exc).__name__}: {exc}{_where_raised(exc)}")
    if _is_stub(value):
        return Result(name, NOT_ATTEMPTED, f"the answer is still {value!r}")
    try:
        if test is not None:
            verdict = test(value)
            if verdict is None or verdict is True:
                return Result(name, CORRECT)
            return Result(name, WRONG, "the test says no" if verdict is False else str(verdict))
        why = compare(value, expected, rtol=rtol, atol=atol)
    except NotImplementedError as exc:
        return Result(name, NOT_ATTEMPTED, str(exc) or "the stub raises NotImplementedError")
    except AssertionError as exc:
        return Result(name, WRONG, str(exc) or f"an assertion failed{_where_raised(exc)}")
    except Exception as exc:
        return Result(name, WRONG, f"checking it raised {type(exc).__name__}: {exc}{_where_raised(exc)}")
    return Result(name, CORRECT) if why is None else Result(name, WRONG, why)
