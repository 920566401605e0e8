"""flashbook.split (reached as flashbook.tiled.split_forward): split-K attention in NumPy
against flashbook.reference and torch's logsumexp, float64.

Tolerances as in test_tiled.py: everything is float64; the merge rescales each
split's result once by exp(lse_s - lse) <= 1, so the error stays a few ulps times
the number of splits (below ~1e-13 here); 1e-10 leaves a wide margin while a wrong
split boundary, mask or rescale is off by O(1).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from flashbook import reference, split, tiled
from test_tiled import close, make_inputs, torch_attention


def check_against_references(q, k, v, do, *, num_splits, causal, scale=None):
    o, lse = tiled.split_forward(q, k, v, num_splits=num_splits, causal=causal, scale=scale)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    close(o, reference.attention(q, k, v, causal=causal, scale=scale), what="o vs reference")
    t_o, t_lse, *_ = torch_attention(q, k, v, do, causal=causal, scale=scale)
    close(o, t_o, what="o vs torch")
    close(lse, t_lse, what="lse vs torch.logsumexp")
    return o, lse


def test_reached_from_tiled():
    assert tiled.split_forward is split.split_forward
    with pytest.raises(AttributeError, match="no_such_name"):
        tiled.no_such_name  # noqa: B018


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lead=st.sampled_from([(), (2,), (1, 3)]), n_q=st.integers(1, 12), n_k=st.integers(1, 40),
       d=st.integers(1, 8), d_v=st.integers(1, 8), num_splits=st.integers(1, 50),
       causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_any_sizes_and_splits(lead, n_q, n_k, d, d_v, num_splits, causal, seed):
    """Any split count, including more splits than keys and (causal, N_q > N_k) rows
    that see no key: the same o and lse as the whole softmax, never NaN."""
    rng = np.random.default_rng(seed)
    check_against_references(*make_inputs(rng, lead, n_q, n_k, d, d_v),
                             num_splits=num_splits, causal=causal)


def test_splits_that_see_no_key(rng):
    """Causal, a few queries at the end of 64 keys: with 64 splits of one key, the last
    splits are hidden from the first rows; with 100 splits, 36 splits hold no key."""
    q, k, v, do = make_inputs(rng, (2,), 4, 64, 8, 8)
    for num_splits in (64, 100):
        partials = split.split_partials(q, k, v, num_splits=num_splits, causal=True)
        last_o, last_lse = partials[63]          # key 63: only the last query row sees it
        assert np.all(last_lse[..., :3] == -np.inf) and np.all(last_o[..., :3, :] == 0)
        assert np.isfinite(last_lse[..., 3]).all()
        check_against_references(q, k, v, do, num_splits=num_splits, causal=True)
    assert sum(len(r) == 0 for r in split.split_bounds(64, 100)) == 36
    # 4 queries, 2 keys, causal: rows 0 and 1 see nothing at all
    o, lse = tiled.split_forward(q, k[..., :2, :], v[..., :2, :], num_splits=3, causal=True)
    assert np.all(lse[..., :2] == -np.inf) and np.all(o[..., :2, :] == 0)
    assert np.isfinite(lse[..., 2:]).all()


def test_each_split_is_attention_over_its_own_keys(rng):
    q, k, v, _ = make_inputs(rng, (3,), 5, 23, 6, 4)
    bounds = split.split_bounds(23, 4)
    assert [len(r) for r in bounds] == [6, 6, 6, 5]
    for keys, (o_s, lse_s) in zip(bounds, split.split_partials(q, k, v, num_splits=4)):
        cols = slice(keys.start, keys.stop)
        close(o_s, reference.attention(q, k[..., cols, :], v[..., cols, :]), what=f"split {keys}")
        assert np.isfinite(lse_s).all()


def test_split_bounds_cover_the_keys_once():
    for n_k in (0, 1, 7, 64, 65):
        for num_splits in (1, 2, 3, 8, 100):
            bounds = split.split_bounds(n_k, num_splits)
            assert len(bounds) == num_splits
            assert [j for r in bounds for j in r] == list(range(n_k))


def test_large_scores_do_not_overflow(rng):
    """Scores around +-1000: each split's exp and the merge's exp(lse_s - lse) stay <= 1."""
    q, k, v, do = make_inputs(rng, (), 6, 30, 4, 4, magnitude=30.0)
    check_against_references(q, k, v, do, num_splits=7, causal=True)


def test_custom_scale_and_float32_inputs(rng):
    q, k, v, do = make_inputs(rng, (2,), 7, 19, 5, 3)
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    o, _ = check_against_references(q, k, v, do, num_splits=5, causal=False, scale=0.3)
    assert o.dtype == np.float64


@pytest.mark.parametrize("num_splits, error, match", [
    (0, ValueError, "num_splits must be >= 1"),
    (-2, ValueError, "num_splits must be >= 1"),
    (2.5, TypeError, "num_splits must be an integer"),
    (True, TypeError, "num_splits must be an integer"),
    (None, TypeError, "num_splits must be an integer"),
])
def test_bad_num_splits(rng, num_splits, error, match):
    q, k, v, _ = make_inputs(rng, (), 3, 5, 4, 4)
    with pytest.raises(error, match=match):
        tiled.split_forward(q, k, v, num_splits=num_splits)


def test_bad_inputs(rng):
    q, k, v, _ = make_inputs(rng, (), 3, 5, 4, 4)
    with pytest.raises(TypeError, match="causal must be True or False"):
        tiled.split_forward(q, k, v, num_splits=2, causal="yes")
    with pytest.raises(ValueError, match="q and k must have the same head dimension"):
        tiled.split_forward(q[:, :3], k, v, num_splits=2)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        tiled.split_forward(q, k, v, num_splits=2, scale=-1.0)
    with pytest.raises(TypeError, match="k must be a floating-point array"):
        tiled.split_forward(q, k.astype(int), v, num_splits=2)
    with pytest.raises(TypeError, match="num_splits"):
        tiled.split_forward(q, k, v)  # keyword-only and required


def test_tile_split_bounds_are_whole_tiles_that_cover_the_keys_once():
    """flash_decode's cut: each split a whole number of key tiles (only the sequence's last
    tile ragged), the splits in order, every key in exactly one."""
    for n_k in (0, 1, 31, 32, 33, 200, 1000):
        for num_splits in (1, 3, 8):
            for block in (16, 32, 64):
                bounds = split.tile_split_bounds(n_k, num_splits, block)
                assert len(bounds) == num_splits
                assert [k for r in bounds for k in r] == list(range(n_k))
                assert all(r.start % block == 0 for r in bounds if len(r))
                assert all(len(r) % block == 0 for r in bounds if len(r) and r.stop < n_k)
    assert [len(r) for r in split.tile_split_bounds(200, 3, 32)] == [96, 96, 8]


def test_paged_reads_give_each_key_of_a_sequence_to_one_split():
    from flashbook import plots

    table = [[5, 2, 9, 0], [5, 2, 7, 3], [4, 8, 1, 6]]
    lengths = [256, 200, 90]
    reads = plots.paged_reads(table, lengths, 64, 3, 32)
    for b, row in enumerate(reads):
        assert [page for page, _ in row] == table[b]
        assert sum(k for _, by_split in row for k in by_split.values()) == lengths[b]
    assert reads[0][1][1] == {0: 32, 1: 32}     # seq 0's second page: half split 0's, half split 1's
    assert reads[2][2][1] == {}                  # seq 2 has no keys in its third page yet
