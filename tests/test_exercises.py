"""flashbook.exercises: the stub convention and the check that never raises."""
import re

import numpy as np
import pytest

from flashbook import reference
from flashbook.exercises import (CORRECT, MIME, NOT_ATTEMPTED, SOLUTIONS_ENV, WRONG, answer_key, check,
                                 compare)


def stub_raises(q, k, v):
    raise NotImplementedError


def stub_returns(q, k, v):
    return NotImplemented


def test_stubs_are_not_attempted(rng):
    q, k, v = (rng.standard_normal((5, 3)) for _ in range(3))
    want = reference.attention(q, k, v)
    for answer in (stub_raises, stub_returns, lambda q, k, v: None, NotImplemented, None, ...):
        r = check("ex", answer, want, args=(q, k, v), show=False)
        assert r.status == NOT_ATTEMPTED, (answer, r)


def test_a_right_answer_is_correct(rng, capsys):
    q, k, v = (rng.standard_normal((2, 7, 4)) for _ in range(3))
    want = reference.attention(q, k, v)

    def mine(q, k, v):
        s = q @ k.swapaxes(-1, -2) / 2.0                  # d = 4: scale 1/2
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    r = check("attention", mine, want, args=(q, k, v), rtol=1e-12, atol=1e-14)
    assert r.status == CORRECT and r.ok
    assert capsys.readouterr().out.strip() == "attention: correct"


def test_a_wrong_array_says_what_and_where(rng):
    want = rng.standard_normal((4, 6))
    got = want.copy()
    got[2, 5] += 0.5
    r = check("ex", got, want, show=False)
    assert r.status == WRONG
    assert "at index (2, 5)" in r.message and "1 of 24 values differ" in r.message
    assert str(r).startswith("ex: wrong: ")
    r = check("ex", want.T, want, show=False)
    assert r.status == WRONG and "shape (6, 4), expected (4, 6)" in r.message


def test_nested_answers_name_the_item_that_differs():
    assert compare({"fwd": 1.0, "bwd": (2, 3.0)}, {"fwd": 1.0, "bwd": (2, 3.5)}) \
        .startswith("the answer['bwd'] is 3 at index (1,), expected 3.5")
    assert compare({"fwd": 1.0, "bwd": (2, "x")}, {"fwd": 1.0, "bwd": (2, "y")}) \
        == "the answer['bwd'][1] is 'x', expected 'y'"
    assert "lacks the key 'bwd'" in compare({"fwd": 1.0}, {"fwd": 1.0, "bwd": 2.0})
    assert compare("fa2", "fa1") == "the answer is 'fa2', expected 'fa1'"
    assert compare([0.313, 0.154], [0.313, 0.154]) is None


def test_a_crashing_answer_is_wrong_with_the_line_not_an_exception():
    def buggy(n):
        return [1, 2][n]

    r = check("ex", buggy, 1, args=(5,), show=False)
    assert r.status == WRONG and "IndexError" in r.message and "of buggy" in r.message


def test_a_test_function_reports_its_message(rng):
    x = rng.standard_normal(10)

    def is_sorted(a):
        bad = np.flatnonzero(np.diff(a) < 0)
        return None if bad.size == 0 else f"not sorted at index {bad[0]}"

    assert check("sort", np.sort(x), test=is_sorted, show=False).status == CORRECT
    r = check("sort", x[::-1] if x[0] < x[-1] else x, test=is_sorted, show=False)
    assert r.status == WRONG and r.message.startswith("not sorted at index")

    def asserts(a):
        assert a.shape == (3,), f"shape {a.shape}"

    r = check("shape", x, test=asserts, show=False)
    assert r.status == WRONG and r.message.startswith("shape (10,)")


def test_bad_calls_to_check_raise_naming_the_parameter():
    with pytest.raises(TypeError, match="name"):
        check("", 1, 1)
    with pytest.raises(ValueError, match="exactly one of an expected answer, a test or a key"):
        check("ex", 1)


def test_torch_tensors_are_compared_too(rng):
    torch = pytest.importorskip("torch")
    want = rng.standard_normal((3, 3))
    assert check("t", torch.from_numpy(want), want, show=False).ok


def test_a_key_checks_an_answer_without_showing_it():
    k = answer_key("q", "b")
    assert re.fullmatch(r"[0-9a-f]{12}", k)                           # an opaque digest
    assert check("q", " B ", key=k, show=False).ok                     # case and blanks ignored
    r = check("q", "a", key=k, show=False)
    assert r.status == WRONG and r.message == "'a' is not the answer"
    assert check("q", NotImplemented, key=k, show=False).status == NOT_ATTEMPTED
    # numbers to four significant digits, integers and tuples exactly
    assert answer_key("x", 32.0) == answer_key("x", 32.00001) == answer_key("x", 32)
    assert answer_key("x", 32.1) != answer_key("x", 32)
    assert answer_key("x", (21, 6)) == answer_key("x", [np.int64(21), 6]) != answer_key("x", (6, 21))
    assert answer_key("x", 1) != answer_key("y", 1)                    # the name salts the key


def test_a_half_done_answer_is_not_attempted():
    r = check("pair", (3, NotImplemented), test=lambda a: None, show=False)
    assert r.status == NOT_ATTEMPTED


def test_call_false_hands_the_function_to_the_test(rng):
    x = rng.standard_normal(7)

    def stub(a):
        raise NotImplementedError("your code")

    def tester(fn):
        got = fn(x)
        assert np.allclose(got, np.sort(x)), f"index {int(np.argmax(got != np.sort(x)))} differs"

    assert check("sort", np.sort, test=tester, call=False, show=False).ok
    r = check("sort", stub, test=tester, call=False, show=False)
    assert r.status == NOT_ATTEMPTED and r.message == "your code"
    r = check("sort", lambda a: a, test=tester, call=False, show=False)
    assert r.status == WRONG and r.message.startswith("index ")
    r = check("sort", lambda a: a[99], test=tester, call=False, show=False)
    assert r.status == WRONG and "IndexError" in r.message and "line" in r.message


def test_with_the_solutions_a_check_that_is_not_correct_raises(monkeypatch, capsys):
    monkeypatch.setenv(SOLUTIONS_ENV, "1")
    assert check("ex", 4, 4).ok
    for answer in (5, NotImplemented):
        with pytest.raises(AssertionError, match="with the solutions in place, ex: "):
            check("ex", answer, 4)
    assert "ex: wrong: the answer is 5, expected 4" in capsys.readouterr().out
    monkeypatch.delenv(SOLUTIONS_ENV)
    assert check("ex", 5, 4, show=False).status == WRONG                # a student's run: no raise


def test_in_a_kernel_the_report_carries_a_machine_readable_copy(monkeypatch):
    shown = []
    import IPython
    import IPython.display
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    check("ex", "x", "y")
    (bundle, raw), = shown
    assert raw and bundle["text/plain"] == "ex: wrong: the answer is 'x', expected 'y'"
    assert bundle[MIME] == {"name": "ex", "status": "wrong", "message": "the answer is 'x', expected 'y'"}


def test_a_check_as_a_cells_last_line_shows_its_report_once(monkeypatch):
    shown = []
    import IPython
    import IPython.display
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    r = check("ex", 4, 4)
    r._ipython_display_()             # what IPython does with the cell's value: nothing more
    assert len(shown) == 1
    check("ex", 4, 4, show=False)._ipython_display_()                 # never shown: now it is
    assert len(shown) == 2 and shown[1]["text/plain"] == "ex: correct"
