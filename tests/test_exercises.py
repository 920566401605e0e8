"""flashbook.exercises: the stub convention and the check that never raises."""
import numpy as np
import pytest

from flashbook import reference
from flashbook.exercises import CORRECT, NOT_ATTEMPTED, WRONG, check, compare


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
    with pytest.raises(ValueError, match="expected answer or a test"):
        check("ex", 1)


def test_torch_tensors_are_compared_too(rng):
    torch = pytest.importorskip("torch")
    want = rng.standard_normal((3, 3))
    assert check("t", torch.from_numpy(want), want, show=False).ok
