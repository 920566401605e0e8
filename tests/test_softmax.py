"""flashbook.softmax against SciPy and PyTorch (float64), on random and extreme rows.

Tolerances. All comparisons are in float64 (eps = 2.2e-16). A softmax weight is
exp(x - m) / l: one exp (about 1 ulp in NumPy, SciPy and torch alike) and a
division by l, a sum of at most a few dozen terms each <= 1, whose rounding error
is at most about n * eps relative. So two correct implementations agree to
~1e-14 relative; we ask for rtol = 1e-12, 50x looser than that bound and 10^4x
tighter than any real mistake would pass. Weights below ~1e-300 are subnormal,
where relative error means nothing: atol = 1e-300 covers them. logsumexp is
m + log(l): its absolute error is about eps * (|m| + log n), so for |x| <= 1e4 an
absolute tolerance of 1e-11 (plus rtol 1e-13) is ~5x the bound.
"""
import math

import numpy as np
import pytest
import scipy.special
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flashbook import softmax as sm

RTOL, ATOL = 1e-12, 1e-300
EPS = np.finfo(np.float64).eps

# Scores as attention produces them: finite, sometimes huge, sometimes masked (-inf).
finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
score = st.one_of(finite, finite, finite, st.just(-np.inf))


def rows(max_n=24, min_n=1):
    """A (rows, n) float64 array of scores; some rows may contain -inf entries."""
    shape = st.tuples(st.integers(1, 4), st.integers(min_n, max_n))
    return arrays(np.float64, shape, elements=score)


def assert_close(got, want, rtol=RTOL, atol=ATOL, what=""):
    got, want = np.asarray(got), np.asarray(want)
    both_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):        # inf - inf where both are -inf
        err = np.where(both_inf, 0.0, np.abs(got - want))
    bound = atol + rtol * np.abs(np.where(both_inf, 0.0, want))
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} entries differ; worst at {i}: "
                             f"got {got[i]!r}, want {want[i]!r}, |error| {err[i]:.3e}")


def not_all_masked(x):
    return np.isfinite(x).any(axis=-1)


# ----------------------------------------------------------------- softmax and logsumexp

@settings(max_examples=300, deadline=None)
@given(rows())
def test_softmax_matches_scipy_and_torch(x):
    ok = not_all_masked(x)                     # SciPy and torch give NaN for all -inf rows
    got = sm.softmax(x)
    assert_close(got[ok], scipy.special.softmax(x[ok], axis=-1), what="vs scipy")
    assert_close(got[ok], torch.softmax(torch.from_numpy(x[ok]), dim=-1).numpy(), what="vs torch")
    assert np.all(got[~ok] == 0), "an all -inf row must give zeros"
    assert not np.isnan(got).any()
    assert np.all(got[x == -np.inf] == 0), "a masked score must get exactly 0 weight"
    assert_close(got[ok].sum(-1), np.ones(ok.sum()), rtol=1e-13, what="rows sum to 1")


@settings(max_examples=300, deadline=None)
@given(rows())
def test_logsumexp_matches_scipy_and_torch(x):
    got = sm.logsumexp(x)
    want = scipy.special.logsumexp(x, axis=-1)   # -inf for all -inf rows, as ours
    assert_close(got, want, rtol=1e-13, atol=1e-11, what="vs scipy")
    assert_close(got, torch.logsumexp(torch.from_numpy(x), dim=-1).numpy(),
                 rtol=1e-13, atol=1e-11, what="vs torch")
    assert np.all(got[~not_all_masked(x)] == -np.inf)


def test_random_rows_fresh(rng):
    """Longer rows than hypothesis draws, with a spread from tame to extreme."""
    for n in [1, 2, 7, 64, 1000]:
        x = rng.normal(scale=rng.uniform(0.1, 50), size=(5, n))
        assert_close(sm.softmax(x), scipy.special.softmax(x, axis=-1), what=f"n={n}")
        assert_close(sm.logsumexp(x), scipy.special.logsumexp(x, axis=-1),
                     rtol=1e-13, atol=1e-11, what=f"lse n={n}")


def test_extreme_values():
    x = np.array([1e4, -1e4, 0.0, 1e4])
    assert_close(sm.softmax(x), [0.5, 0.0, 0.0, 0.5])
    assert sm.logsumexp(x) == pytest.approx(1e4 + math.log(2), rel=1e-15)
    # the naive formula overflows at exactly these inputs
    assert np.isnan(sm.naive_softmax(x)).any()
    # a very negative row: naive underflows to 0/0, stable does not
    y = np.array([-1e4, -1e4 - 1.0])
    assert np.isnan(sm.naive_softmax(y)).all()
    assert_close(sm.softmax(y), scipy.special.softmax(y))


def test_all_masked_row_is_defined():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    p = sm.softmax(x)
    assert np.all(p[0] == 0) and not np.isnan(p).any()
    lse = sm.logsumexp(x)
    assert lse[0] == -np.inf and np.isfinite(lse[1])
    for b in [1, 2, 3, 5]:
        p2, state = sm.online_softmax(x, block_size=b)
        assert np.all(p2[0] == 0) and not np.isnan(p2).any()
        assert state.row_max[0] == -np.inf and state.row_sum[0] == 0
        assert state.lse[0] == -np.inf


def test_empty_axis():
    x = np.zeros((3, 0))
    assert sm.softmax(x).shape == (3, 0)
    assert np.all(sm.logsumexp(x) == -np.inf)
    p, state = sm.online_softmax(x)
    assert p.shape == (3, 0) and np.all(state.row_max == -np.inf)


def test_axis_argument(rng):
    x = rng.normal(size=(3, 4, 5))
    for axis in range(-3, 3):
        want = scipy.special.softmax(x, axis=axis)
        assert_close(sm.softmax(x, axis=axis), want, what=f"axis {axis}")
        assert_close(sm.online_softmax(x, 2, axis=axis)[0], want, what=f"online axis {axis}")
        assert_close(sm.logsumexp(x, axis=axis), scipy.special.logsumexp(x, axis=axis),
                     rtol=1e-13, atol=1e-13, what=f"lse axis {axis}")


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_keeps_dtype_and_accuracy(rng, dtype):
    x = (rng.normal(size=(4, 50)) * 8).astype(dtype)
    p = sm.softmax(x)
    assert p.dtype == dtype
    # exp and the sum run in the input dtype: errors of a few ulps per weight plus
    # the sum's rounding, at most ~n ulps; 4 * n * eps of the dtype bounds it.
    tol = 4 * x.shape[-1] * float(np.finfo(dtype).eps)
    want = scipy.special.softmax(x.astype(np.float64), axis=-1)
    assert_close(p, want, rtol=tol, atol=float(np.finfo(dtype).tiny), what=str(dtype))
    # the online version keeps m and l in >= float32 (as kernels do) and returns x's dtype
    p2, state = sm.online_softmax(x, block_size=7)
    assert p2.dtype == dtype and state.row_sum.dtype == np.promote_types(dtype, np.float32)
    assert_close(p2, want, rtol=tol, atol=float(np.finfo(dtype).tiny), what=f"online {dtype}")


def test_naive_softmax_overflows_in_fp16():
    x = np.array([3.2, 12.5, -1.0, 8.7], dtype=np.float16)   # exp(12.5) > 65504
    assert np.isnan(sm.naive_softmax(x)).any()
    assert np.isfinite(sm.softmax(x)).all()
    y = np.array([0.5, 1.0, -2.0])
    assert_close(sm.naive_softmax(y), sm.softmax(y), rtol=1e-15, what="naive where it works")


# ----------------------------------------------------------------- online softmax

@settings(max_examples=200, deadline=None)
@given(rows(max_n=20), st.data())
def test_online_softmax_any_block_size(x, data):
    n = x.shape[-1]
    block_size = data.draw(st.integers(1, n + 2), label="block_size")
    p, state, trace = sm.online_softmax(x, block_size=block_size, return_trace=True)
    want = sm.softmax(x)
    assert_close(p, want, what=f"block_size={block_size}")
    assert not np.isnan(p).any()
    assert len(trace) == math.ceil(n / block_size)
    assert trace[-1] is state
    assert_close(state.lse, scipy.special.logsumexp(x, axis=-1), rtol=1e-13, atol=1e-11,
                 what="state.lse")
    assert np.array_equal(state.row_max, x.max(axis=-1)), "m is the exact maximum"
    # the running max never decreases, and l >= 1 once a finite score was seen
    maxima = np.stack([t.row_max for t in trace])
    assert np.all(maxima[1:] >= maxima[:-1])
    seen = np.isfinite(state.row_max)
    assert np.all(state.row_sum[seen] >= 1.0)


def test_online_softmax_every_block_size_fresh(rng):
    n = 37
    x = rng.normal(scale=10, size=(3, n))
    x[1, rng.integers(0, n, 5)] = -np.inf
    want = scipy.special.softmax(x, axis=-1)
    for b in range(1, n + 1):
        assert_close(sm.online_softmax(x, block_size=b)[0], want, what=f"block_size={b}")


# ----------------------------------------------------------------- merge

@st.composite
def split_row(draw, n_blocks=3):
    """A row of scores with values, cut into n_blocks contiguous (maybe empty) blocks."""
    x = draw(arrays(np.float64, st.integers(0, 15), elements=score))
    d_v = draw(st.integers(1, 3))
    v = draw(arrays(np.float64, (x.size, d_v), elements=st.floats(-10, 10)))
    cuts = sorted(draw(st.lists(st.integers(0, x.size), min_size=n_blocks - 1,
                                max_size=n_blocks - 1)))
    bounds = [0, *cuts, x.size]
    blocks = [sm.block_state(x[a:b], v[a:b]) for a, b in zip(bounds, bounds[1:])]
    return x, v, blocks


# Associativity tolerance: each side applies at most two merges, each with one exp
# (~1 ulp), one multiply and one add per term; a few ulps on each side, so
# 64 * eps (1.4e-14) bounds the difference with room to spare. acc entries can
# cancel (v has both signs), so they also get an absolute slack of 64 eps * |v| * l.
MERGE_RTOL = 64 * EPS


@settings(max_examples=300, deadline=None)
@given(split_row())
def test_merge_is_commutative_bit_for_bit(case):
    _, _, (a, b, _) = case
    ab, ba = sm.merge(a, b), sm.merge(b, a)
    # max is symmetric and IEEE addition is commutative: identical bits, not just close
    assert np.array_equal(ab.row_max, ba.row_max)
    assert np.array_equal(ab.row_sum, ba.row_sum)
    assert np.array_equal(ab.acc, ba.acc)


@settings(max_examples=300, deadline=None)
@given(split_row())
def test_merge_is_associative_and_exact(case):
    x, v, (a, b, c) = case
    left = sm.merge(sm.merge(a, b), c)
    right = sm.merge(a, sm.merge(b, c))
    assert not np.isnan(left.row_sum) and not np.isnan(left.acc).any()
    assert np.array_equal(left.row_max, right.row_max)
    assert_close(left.row_sum, right.row_sum, rtol=MERGE_RTOL, what="assoc l")
    slack = MERGE_RTOL * (np.abs(v).max(initial=0) * float(left.row_sum) + 1e-300)
    assert_close(left.acc, right.acc, rtol=MERGE_RTOL, atol=slack, what="assoc o")
    # and the merged state is the state of the whole row
    whole = sm.block_state(x, v)
    assert np.array_equal(left.row_max, whole.row_max)
    assert_close(left.row_sum, whole.row_sum, rtol=MERGE_RTOL * 4, what="whole l")
    assert_close(left.acc, whole.acc, rtol=MERGE_RTOL * 4, atol=4 * slack, what="whole o")


@settings(max_examples=100, deadline=None)
@given(split_row())
def test_empty_state_is_the_identity(case):
    _, _, (a, _, _) = case
    e = sm.empty_state((), value_dim=a.acc.shape[-1])
    for s in (sm.merge(a, e), sm.merge(e, a)):
        assert np.array_equal(s.row_max, a.row_max)
        assert np.array_equal(s.row_sum, a.row_sum)
        assert np.array_equal(s.acc, a.acc)
    ee = sm.merge(e, e)
    assert ee.row_max == -np.inf and ee.row_sum == 0 and not np.isnan(ee.acc).any()


def test_merge_any_order_fresh(rng):
    """Blocks merged sequentially, in reverse, shuffled and as a tree agree."""
    n, d_v, block = 103, 4, 8
    x = rng.normal(scale=5, size=(6, n))
    v = rng.normal(size=(6, n, d_v))
    blocks = [sm.block_state(x[:, i:i + block], v[:, i:i + block]) for i in range(0, n, block)]

    def fold(states):
        out = sm.empty_state((6,), d_v)
        for s in states:
            out = sm.merge(out, s)
        return out

    def tree(states):
        while len(states) > 1:
            states = [sm.merge(*states[i:i + 2]) if i + 1 < len(states) else states[i]
                      for i in range(0, len(states), 2)]
        return states[0]

    want_o = scipy.special.softmax(x, axis=-1)[:, None, :] @ v
    order = rng.permutation(len(blocks))
    for name, s in [("sequential", fold(blocks)), ("reversed", fold(blocks[::-1])),
                    ("shuffled", fold([blocks[i] for i in order])), ("tree", tree(blocks))]:
        assert_close(s.output(), want_o[:, 0, :], rtol=1e-12, atol=1e-14, what=name)
        assert_close(s.lse, scipy.special.logsumexp(x, axis=-1), rtol=1e-13, atol=1e-12,
                     what=name)


# ----------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, exc, word", [
    (lambda: sm.softmax(np.arange(4)), TypeError, "x"),
    (lambda: sm.softmax([1, 2, 3]), TypeError, "x"),
    (lambda: sm.softmax(np.float64(1.0)), ValueError, "x"),
    (lambda: sm.softmax([1.0, np.nan]), ValueError, "x"),
    (lambda: sm.softmax([1.0, np.inf]), ValueError, "x"),
    (lambda: sm.softmax([1.0, 2.0], axis=1), ValueError, "axis"),
    (lambda: sm.softmax([1.0, 2.0], axis=0.0), TypeError, "axis"),
    (lambda: sm.logsumexp(np.arange(3)), TypeError, "x"),
    (lambda: sm.naive_softmax(np.arange(3)), TypeError, "x"),
    (lambda: sm.online_softmax([1.0, 2.0], block_size=0), ValueError, "block_size"),
    (lambda: sm.online_softmax([1.0, 2.0], block_size=-3), ValueError, "block_size"),
    (lambda: sm.online_softmax([1.0, 2.0], block_size=1.5), TypeError, "block_size"),
    (lambda: sm.online_softmax([1.0, 2.0], block_size=2.0), TypeError, "block_size"),
    (lambda: sm.online_softmax([1.0, 2.0], block_size=True), TypeError, "block_size"),
    (lambda: sm.online_softmax(np.arange(3), block_size=1), TypeError, "x"),
    (lambda: sm.block_state([1.0, 2.0], np.ones((3, 2))), ValueError, "v"),
    (lambda: sm.SoftmaxState(np.array([np.nan]), np.array([1.0])), ValueError, "row_max"),
    (lambda: sm.SoftmaxState(np.array([0.0]), np.array([-1.0])), ValueError, "row_sum"),
    (lambda: sm.SoftmaxState(np.array([-np.inf]), np.array([1.0])), ValueError, "row_sum"),
    (lambda: sm.SoftmaxState(np.array([0.0]), np.array([1.0]), np.ones(3)), ValueError, "acc"),
    (lambda: sm.merge(sm.empty_state(2), sm.empty_state(3)), ValueError, "same rows"),
    (lambda: sm.merge(sm.empty_state(2, 1), sm.empty_state(2)), ValueError, "acc"),
    (lambda: sm.merge(sm.empty_state(), (0.0, 1.0)), TypeError, "SoftmaxState"),
    (lambda: sm.empty_state(2).output(), ValueError, "acc"),
])
def test_bad_input_names_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def test_states_are_immutable():
    s = sm.block_state(np.array([1.0, 2.0]), np.ones((2, 3)))
    with pytest.raises(ValueError):
        s.acc[0] = 5.0
    with pytest.raises(AttributeError):
        s.row_max = np.array(0.0)
