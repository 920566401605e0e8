"""Chapter 2's worked example: every number the chapter prints, asserted.

Q = K = V = [[1, 0], [0, 1], [1, 1], [0.5, 0.5]], d = 2, scale = 1/sqrt(2).
The expected values are written here as the chapter prints them (rounded to 3 or
4 decimals), so a change in the library that moved a printed digit fails here.
Rounded values are compared with ``np.round(x, k) == printed``; exact relations
(online = standard, un-shifted = shifted * exp(m)) are compared in float64 with
tolerances of a few ulps, justified where they appear.
"""
import math

import numpy as np
import pytest

from flashbook import reference
from flashbook import softmax as sm

X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])
Q = K = V = X
SCALE = 1 / math.sqrt(2)
EPS = np.finfo(np.float64).eps


def rounded(x, k):
    return np.round(np.asarray(x, dtype=np.float64), k)


# ----------------------------------------------------------------- the standard path

def test_standard_path_matches_the_seed_where_the_seed_is_right():
    qk = Q @ K.T
    assert np.array_equal(qk, [[1, 0, 1, 0.5], [0, 1, 1, 0.5], [1, 1, 2, 1], [0.5, 0.5, 1, 0.5]])
    s = reference.scores(Q, K, scale=SCALE)
    assert np.array_equal(rounded(s[0], 3), [0.707, 0.0, 0.707, 0.354])
    p = sm.softmax(s)
    assert np.array_equal(rounded(p[0], 3), [0.313, 0.154, 0.313, 0.220])
    o = p @ V
    assert np.array_equal(rounded(o[0], 3), [0.736, 0.577])
    assert np.array_equal(rounded(o[1], 3), [0.577, 0.736])
    assert np.array_equal(rounded(o, 4), [[0.7358, 0.5772], [0.5772, 0.7358],
                                          [0.7017, 0.7017], [0.6609, 0.6609]])
    # the reference attention agrees to float64 rounding (a handful of ulps)
    assert np.abs(reference.attention(Q, K, V) - o).max() < 1e-15


def test_seed_sums_are_rounding_artifacts():
    """The seed's 6.481, 4.7685 and 3.7405 are not the exact values.

    They are what one gets after rounding each score to 3 decimals (0.354 for
    0.35355...) and each exponential to 3 decimals (2.028, 1.425) before adding.
    """
    s0 = SCALE * (K @ Q[0])
    e = np.exp(s0)
    assert rounded(e.sum(), 4) == 6.4803            # exact: 6.48035 (to 3 dp: 6.480, not 6.481)
    assert rounded(e.sum(), 3) == 6.480
    assert np.array_equal(rounded(e @ V, 4), [4.7683, 3.7402])
    seed_e = np.round(np.exp(np.round(s0, 3)), 3)   # [2.028, 1.0, 2.028, 1.425]
    assert np.array_equal(seed_e, [2.028, 1.0, 2.028, 1.425])
    assert rounded(seed_e.sum(), 4) == 6.481
    assert np.array_equal(rounded(seed_e @ V, 4), [4.7685, 3.7405])
    # ... and the ratio, which is what matters, survives the rounding
    assert np.array_equal(rounded(seed_e @ V / seed_e.sum(), 3), [0.736, 0.577])
    assert rounded(np.exp(SCALE / 2), 3) == 1.424   # e^0.35355..., not e^0.354 = 1.425


# ----------------------------------------------------------------- the flash path, token by token

def test_token_0_trace():
    t = sm.online_attention_trace(Q[0], K, V, scale=SCALE)
    assert [list(s.keys) for s in t] == [[0], [1], [2], [3]]
    assert np.array_equal([float(s.dot[0]) for s in t], [1.0, 0.0, 1.0, 0.5])
    assert np.array_equal(rounded([s.score[0] for s in t], 4), [0.7071, 0.0, 0.7071, 0.3536])
    assert np.array_equal(rounded([s.row_max for s in t], 4), [0.7071] * 4)
    assert [s.rescale for s in t] == [0.0, 1.0, 1.0, 1.0]     # the max never moves
    assert np.array_equal(rounded([s.weight[0] for s in t], 4), [1.0, 0.4931, 1.0, 0.7022])
    assert np.array_equal(rounded([s.row_sum for s in t], 4), [1.0, 1.4931, 2.4931, 3.1953])
    assert np.array_equal(rounded([s.acc for s in t], 4),
                          [[1.0, 0.0], [1.0, 0.4931], [2.0, 1.4931], [2.3511, 1.8442]])
    assert np.array_equal(rounded(t[-1].output, 3), [0.736, 0.577])


def test_token_1_trace_rescales_once():
    t = sm.online_attention_trace(Q[1], K, V, scale=SCALE)
    assert np.array_equal(rounded([s.row_max for s in t], 4), [0.0, 0.7071, 0.7071, 0.7071])
    assert np.array_equal(rounded([s.rescale for s in t], 4), [0.0, 0.4931, 1.0, 1.0])
    assert t[1].rescale == pytest.approx(math.exp(-SCALE), rel=2 * EPS)
    assert np.array_equal(rounded([s.row_sum for s in t], 4), [1.0, 1.4931, 2.4931, 3.1953])
    assert np.array_equal(rounded([s.acc for s in t], 4),
                          [[1.0, 0.0], [0.4931, 1.0], [1.4931, 2.0], [1.8442, 2.3511]])
    assert np.array_equal(rounded(t[-1].output, 3), [0.577, 0.736])


def unshifted_running_sums(q_row):
    """The seed's table, exactly: running sums of exp(s_j) and exp(s_j) v_j, no max."""
    e = np.exp(SCALE * (K @ q_row))
    return np.cumsum(e), np.cumsum(e[:, None] * V, axis=0)


@pytest.mark.parametrize("i", range(4))
def test_shifted_and_unshifted_differ_by_exp_m(i):
    t = sm.online_attention_trace(Q[i], K, V, scale=SCALE)
    big_l, big_o = unshifted_running_sums(Q[i])
    for j, step in enumerate(t):
        f = math.exp(step.row_max)
        # Both sides are sums of <= 4 positive terms, each with ~2 roundings: a few
        # ulps apart; 16 eps relative is a safe bound for such short sums.
        assert step.row_sum * f == pytest.approx(big_l[j], rel=16 * EPS)
        np.testing.assert_allclose(step.acc * f, big_o[j], rtol=16 * EPS, atol=0)
    # only the ratio is the answer, and both give it
    np.testing.assert_allclose(t[-1].output, big_o[-1] / big_l[-1], rtol=16 * EPS)
    if i in (0, 1):
        assert rounded(big_l[-1], 4) == 6.4803
        assert rounded(t[-1].row_sum, 4) == 3.1953
        assert rounded(math.exp(t[-1].row_max), 4) == 2.0281


def test_all_four_tokens_agree_with_standard():
    want = reference.attention(Q, K, V)
    for block_k in (1, 2, 3, 4, 5):
        got = np.stack([sm.online_attention_trace(q, K, V, block_k=block_k)[-1].output
                        for q in Q])
        # same float64 operations in another order: a few ulps of values <= 1
        assert np.abs(got - want).max() < 1e-15, f"block_k={block_k}"


def test_trace_step_is_a_merge():
    """The kernel-style update equals merging in the block's own state."""
    for q in Q:
        state = sm.empty_state((), value_dim=2)
        for step in sm.online_attention_trace(q, K, V, block_k=2):
            state = sm.merge(state, sm.block_state(step.score, V[step.keys.start:step.keys.stop]))
            assert state.row_max == step.row_max
            assert float(state.row_sum) == pytest.approx(step.row_sum, rel=4 * EPS)
            np.testing.assert_allclose(state.acc, step.acc, rtol=4 * EPS)


# ----------------------------------------------------------------- blocks of 2 queries x 2 keys

def test_tiles_of_two_by_two():
    s = reference.scores(Q, K, scale=SCALE)
    out = np.zeros_like(V)
    for i in (0, 2):                              # query blocks
        state = sm.empty_state((2,), value_dim=2)
        for j in (0, 2):                          # key blocks
            tile = sm.block_state(s[i:i + 2, j:j + 2], V[j:j + 2])
            state = sm.merge(state, tile)
        out[i:i + 2] = state.output()
        np.testing.assert_allclose(state.lse, sm.logsumexp(s[i:i + 2]), rtol=4 * EPS)
    assert np.abs(out - reference.attention(Q, K, V)).max() < 1e-15
    # the first tile of the first query block: rows 0 and 1 see keys 0 and 1
    first = sm.block_state(s[0:2, 0:2], V[0:2])
    assert np.array_equal(rounded(first.row_max, 4), [0.7071, 0.7071])
    assert np.array_equal(rounded(first.row_sum, 4), [1.4931, 1.4931])


# ----------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, exc, word", [
    (lambda: sm.online_attention_trace(Q, K, V), ValueError, "q_row"),
    (lambda: sm.online_attention_trace(Q[0], K, V, block_k=0), ValueError, "block_k"),
    (lambda: sm.online_attention_trace(Q[0], K, V, block_k=1.0), TypeError, "block_k"),
    (lambda: sm.online_attention_trace(Q[0], K[:, :1], V), ValueError, "head dimension"),
    (lambda: sm.online_attention_trace(Q[0], K, V[:3]), ValueError, "keys"),
    (lambda: sm.online_attention_trace(Q[0].astype(int), K, V), TypeError, "q"),
    (lambda: sm.online_attention_trace(Q[0], K, V, scale=-1.0), ValueError, "scale"),
])
def test_trace_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
