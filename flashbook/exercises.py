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
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

NOT_ATTEMPTED = "not attempted"
WRONG = "wrong"
CORRECT = "correct"
STATUSES = (NOT_ATTEMPTED, WRONG, CORRECT)

#: Answers that mean "the stub is still there".
_STUB_VALUES = (NotImplemented, Ellipsis, None)


@dataclass(frozen=True)
class Result:
    """What ``check`` found: ``status`` is one of ``STATUSES``."""

    name: str
    status: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        if self.status == WRONG:
            return f"{self.name}: wrong: {self.message}"
        return f"{self.name}: {self.status}" + (f" ({self.message})" if self.message else "")


def _is_stub(value) -> bool:
    return any(value is s for s in _STUB_VALUES)


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
        return (f"{here} is {a[idx]:.6g}{at}, expected {e[idx]:.6g} "
                f"({int(bad.sum())} of {e.size} values differ)")
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
          args: tuple = (), kwargs: dict | None = None, rtol: float = 1e-7, atol: float = 0.0,
          show: bool = True) -> Result:
    """Check one exercise; never raises.

    ``answer`` is the student's value, or their function, called as
    ``answer(*args, **kwargs)``. The result is compared with ``expected`` (see
    ``compare``), or passed to ``test``, which returns None (or True) when it is
    right, and a message saying what is wrong (or False, or raises
    AssertionError with a message) otherwise. ``show`` prints the one-line report.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if test is None and expected is None:
        raise ValueError("check needs an expected answer or a test")
    result = _check(name, answer, expected, test, args, kwargs or {}, rtol, atol)
    if show:
        print(result)
    return result


def _check(name, answer, expected, test, args, kwargs, rtol, atol) -> Result:
    value = answer
    if callable(answer) and not isinstance(answer, type):
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
    except AssertionError as exc:
        return Result(name, WRONG, str(exc) or f"an assertion failed{_where_raised(exc)}")
    except Exception as exc:
        return Result(name, WRONG, f"checking it raised {type(exc).__name__}: {exc}")
    return Result(name, CORRECT) if why is None else Result(name, WRONG, why)
