"""flashbook.tiled: the tiled forward and backward against flashbook.reference and
torch autograd (float64), and the I/O counts against closed-form formulas.

Tolerances: everything is float64 (unit roundoff 1.1e-16). The tiled algorithm
reorders sums (over tiles, with rescaling by exp(m_old - m_new)) and our sizes keep
every sum under a few hundred terms, so errors stay below ~1e-13 relative to the
largest value; 1e-10 leaves a wide margin while any real mistake (a wrong mask, a
missed rescale, an off-by-one ragged tile) is off by O(1).
"""
import math
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from flashbook import reference, tiled

RTOL, ATOL = 1e-10, 1e-10


def close(ours, theirs, rtol=RTOL, atol=ATOL, what=""):
    """assert_allclose with atol relative to the largest magnitude, finite-aware."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    finite = np.isfinite(theirs)
    assert np.array_equal(ours[~finite], theirs[~finite]), f"{what}: infinities differ"
    scale = max(1.0, float(np.abs(theirs[finite]).max(initial=0.0)))
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=rtol, atol=atol * scale,
                               err_msg=what)


def torch_attention(q, k, v, do, *, causal=False, scale=None):
    """Independent reference: torch float64; lse by torch.logsumexp; grads by autograd."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    n_q, n_k = s.shape[-2:]
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    allowed = (j <= i + (n_k - n_q)) if causal else torch.ones(n_q, n_k, dtype=torch.bool)
    sees_any = allowed.any(-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                      # -inf for rows that see nothing
    p = torch.softmax(s.masked_fill(~sees_any, 0.0), dim=-1) * sees_any
    o = p @ v
    o.backward(torch.tensor(do, dtype=torch.float64))
    return (o.detach().numpy(), lse.detach().numpy(),
            q.grad.numpy(), k.grad.numpy(), v.grad.numpy())


def make_inputs(rng, lead, n_q, n_k, d, d_v, magnitude=1.0):
    """Fresh standard-normal inputs (never zeros, never a constant)."""
    q = magnitude * rng.standard_normal(lead + (n_q, d))
    k = magnitude * rng.standard_normal(lead + (n_k, d))
    v = rng.standard_normal(lead + (n_k, d_v))
    do = rng.standard_normal(lead + (n_q, d_v))
    return q, k, v, do


def check_all(q, k, v, do, *, block_q, block_k, causal, scale=None, rtol=RTOL):
    """Both forward orders and both dQ strategies against reference and torch."""
    o_t, lse_t, dq_t, dk_t, dv_t = torch_attention(q, k, v, do, causal=causal, scale=scale)
    o_ref = reference.attention(q, k, v, causal=causal, scale=scale)
    grads_ref = reference.attention_backward(q, k, v, do, causal=causal, scale=scale)
    kw = dict(block_q=block_q, block_k=block_k, causal=causal, scale=scale)
    for order in tiled.ORDERS:
        o, lse = tiled.forward(q, k, v, order=order, **kw)
        assert not np.isnan(o).any() and not np.isnan(lse).any()
        close(o, o_ref, rtol=rtol, what=f"o vs reference ({order})")
        close(o, o_t, rtol=rtol, what=f"o vs torch ({order})")
        close(lse, lse_t, rtol=rtol, what=f"lse vs torch.logsumexp ({order})")
    for strategy in tiled.DQ_STRATEGIES:
        grads = tiled.backward(q, k, v, o, lse, do, dq_strategy=strategy, **kw)
        for name, ours, ref, tor in zip(("dq", "dk", "dv"), grads, grads_ref, (dq_t, dk_t, dv_t)):
            assert not np.isnan(ours).any(), name
            close(ours, ref, rtol=rtol, what=f"{name} vs reference ({strategy})")
            close(ours, tor, rtol=rtol, what=f"{name} vs torch autograd ({strategy})")


# ----------------------------------------------------------------- correctness

shapes = st.fixed_dictionaries({
    "lead": st.sampled_from([(), (2,), (2, 3)]),
    "n_q": st.integers(1, 20), "n_k": st.integers(1, 20),
    "d": st.integers(1, 6), "d_v": st.integers(1, 6),
    "block_q": st.integers(1, 24), "block_k": st.integers(1, 24),   # up to larger than N
    "causal": st.booleans(),
    "scale": st.one_of(st.none(), st.floats(0.05, 3.0)),
    "seed": st.integers(0, 2**32 - 1),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_matches_reference_and_torch(c):
    rng = np.random.default_rng(c["seed"])
    q, k, v, do = make_inputs(rng, c["lead"], c["n_q"], c["n_k"], c["d"], c["d_v"])
    check_all(q, k, v, do, block_q=c["block_q"], block_k=c["block_k"],
              causal=c["causal"], scale=c["scale"])


@pytest.mark.parametrize("block", [1, 2, 5, 12, 13, 14, 40])  # N = 13: ragged, = N, > N
@pytest.mark.parametrize("causal", [False, True])
def test_block_sizes_from_one_to_larger_than_n(rng, block, causal):
    q, k, v, do = make_inputs(rng, (2,), 13, 13, 4, 4)
    check_all(q, k, v, do, block_q=block, block_k=max(1, 13 - block), causal=causal)


@pytest.mark.parametrize("n_q,n_k", [(5, 17), (17, 5), (1, 9), (9, 1)])
def test_causal_with_different_lengths_is_bottom_right(rng, n_q, n_k):
    q, k, v, do = make_inputs(rng, (3,), n_q, n_k, 3, 2)
    check_all(q, k, v, do, block_q=4, block_k=3, causal=True)


def test_fully_masked_rows_give_zeros_and_minus_inf(rng):
    n_q, n_k = 11, 4                     # causal, N_q > N_k: rows 0..6 see no key
    q, k, v, do = make_inputs(rng, (2,), n_q, n_k, 3, 3)
    blind = ~reference.causal_mask(n_q, n_k).any(-1)
    assert blind.sum() == n_q - n_k
    for order in tiled.ORDERS:
        o, lse = tiled.forward(q, k, v, block_q=3, block_k=2, causal=True, order=order)
        assert np.all(o[:, blind] == 0) and np.all(lse[:, blind] == -np.inf)
        assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse[:, ~blind]))
    for strategy in tiled.DQ_STRATEGIES:
        dq, dk, dv = tiled.backward(q, k, v, o, lse, do, block_q=3, block_k=2, causal=True,
                                    dq_strategy=strategy)
        assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
        assert np.all(dq[:, blind] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits(rng, causal):
    """Scores of order +-1e4: exp would overflow without the running max.

    The scores themselves carry a rounding error of ~1e4 * 1.1e-16 ~ 1e-12 absolute,
    which becomes a relative error of that size in exp(s - m); 1e-8 is a safe bound.
    """
    q, k, v, do = make_inputs(rng, (2,), 19, 23, 4, 3, magnitude=70.0)
    s = reference.scores(q, k, scale=1.0)
    assert np.abs(s).max() > 5e3
    check_all(q, k, v, do, block_q=4, block_k=5, causal=causal, scale=1.0, rtol=1e-8)


def test_both_orders_agree_and_lse_is_logsumexp(rng):
    q, k, v, _ = make_inputs(rng, (2, 2), 26, 30, 8, 8)   # every row sees a key
    o2, lse2 = tiled.forward(q, k, v, block_q=7, block_k=9, causal=True, order="fa2")
    o1, lse1 = tiled.forward(q, k, v, block_q=7, block_k=9, causal=True, order="fa1")
    close(o1, o2, rtol=1e-13, atol=1e-13)
    close(lse1, lse2, rtol=1e-13, atol=1e-13)
    # lse really is log sum exp of the scaled, masked row: o = exp(S - lse) V
    s = np.where(reference.causal_mask(26, 30), reference.scores(q, k, scale=8 ** -0.5), -np.inf)
    close(np.exp(s - lse2[..., None]) @ v, o2)


def test_input_dtypes_and_leading_dimensions_survive(rng):
    q, k, v, do = make_inputs(rng, (2, 1, 3), 6, 7, 4, 5)
    o, lse = tiled.forward(q.astype(np.float32), k.astype(np.float32), v, block_q=4, block_k=4)
    assert o.shape == (2, 1, 3, 6, 5) and lse.shape == (2, 1, 3, 6) and o.dtype == np.float64
    dq, dk, dv = tiled.backward(q, k, v, o, lse, do, block_q=4, block_k=4)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_nothing_n_by_n_is_allocated(rng):
    """Peak extra memory stays far below one N x N float64 matrix."""
    n, d = 1024, 16
    q, k, v, do = make_inputs(rng, (), n, n, d, d)
    o, lse = tiled.forward(q, k, v, block_q=64, block_k=64)
    one_matrix = 8 * n * n
    for run in (lambda: tiled.forward(q, k, v, block_q=64, block_k=64),
                lambda: tiled.backward(q, k, v, o, lse, do, block_q=64, block_k=64)):
        tracemalloc.start()
        run()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < one_matrix / 8, f"peak {peak} bytes vs N^2 matrix {one_matrix}"


# ----------------------------------------------------------------- tiles and the schedule

@pytest.mark.parametrize("n_q,n_k,bq,bk", [(13, 13, 4, 3), (5, 17, 2, 4), (17, 5, 3, 2),
                                          (8, 8, 8, 8), (9, 30, 20, 7)])
def test_skipped_and_partial_tiles_match_the_mask(n_q, n_k, bq, bk):
    mask = reference.causal_mask(n_q, n_k)
    kinds = tiled.tile_kinds(n_q, n_k, bq, bk, causal=True)
    schedule = set(tiled.tile_schedule(n_q, n_k, bq, bk, causal=True))
    for i, rows in enumerate(tiled.tile_slices(n_q, bq)):
        for j, cols in enumerate(tiled.tile_slices(n_k, bk)):
            tile = mask[rows, cols]
            want = "skipped" if not tile.any() else "full" if tile.all() else "partial"
            assert kinds[i, j] == want, (i, j)
            assert ((i, j) in schedule) == tile.any()
            np.testing.assert_array_equal(tiled.tile_mask(rows, cols, n_q, n_k), tile)


def test_tile_slices_cover_the_axis_with_a_ragged_last_tile():
    assert tiled.tile_slices(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert tiled.tile_slices(3, 8) == [slice(0, 3)]
    assert tiled.tile_slices(0, 8) == []


@pytest.mark.parametrize("order", tiled.ORDERS)
def test_visits_follow_the_schedule_and_trace_the_watched_row(rng, order):
    n_q, n_k, row = 10, 14, 6
    q, k, v, _ = make_inputs(rng, (2,), n_q, n_k, 3, 3)
    io = tiled.IOCounter(watch_row=row)
    o, lse = tiled.forward(q, k, v, block_q=4, block_k=3, causal=True, order=order, io=io)
    assert io.visits == tiled.tile_schedule(n_q, n_k, 4, 3, causal=True, order=order)
    steps = [s for s, (i, j) in enumerate(io.visits) if i == row // 4]
    assert [t[0] for t in io.trace] == steps
    # after the last step, m is the row's max score and m + log(l) its lse
    s = reference.scores(q[0], k[0], scale=3 ** -0.5)[row, : row + (n_k - n_q) + 1]
    _, m_last, l_last = io.trace[-1]
    assert m_last == pytest.approx(s.max(), rel=1e-13)
    assert m_last + math.log(l_last) == pytest.approx(lse[0, row], rel=1e-13)
    ms = [t[1] for t in io.trace]
    assert all(a <= b for a, b in zip(ms, ms[1:]))      # the running max never decreases


# ----------------------------------------------------------------- I/O accounting

IO_CASES = [  # (n_q, n_k, d, d_v, block_q, block_k, causal)
    (64, 64, 16, 16, 16, 16, False), (37, 53, 8, 5, 7, 6, False), (20, 20, 4, 4, 32, 32, False),
    (29, 29, 6, 6, 5, 4, True), (12, 31, 4, 3, 5, 4, True), (31, 12, 4, 4, 5, 4, True),
]


@pytest.mark.parametrize("n_q,n_k,d,d_v,bq,bk,causal", IO_CASES)
def test_counted_io_matches_closed_form(rng, n_q, n_k, d, d_v, bq, bk, causal):
    q, k, v, do = make_inputs(rng, (3,), n_q, n_k, d, d_v)
    kw = dict(block_q=bq, block_k=bk, causal=causal)
    for order in tiled.ORDERS:
        io = tiled.IOCounter()
        o, lse = tiled.forward(q, k, v, order=order, io=io, **kw)
        want = tiled.io_flash(n_q, n_k, d, bq, bk, d_v=d_v, causal=causal, order=order, batch=3)
        assert io.stats() == want, order
    for strategy in tiled.DQ_STRATEGIES:
        io = tiled.IOCounter()
        tiled.backward(q, k, v, o, lse, do, dq_strategy=strategy, io=io, **kw)
        want = tiled.io_flash_backward(n_q, n_k, d, bq, bk, d_v=d_v, causal=causal,
                                       dq_strategy=strategy, batch=3)
        assert io.stats() == want, strategy


def test_closed_forms_by_hand():
    """The formulas, worked out by hand for N = 256, d = 64, B_r = B_c = 64 (T = 4)."""
    n, d, b, t = 256, 64, 64, 4
    fa2 = tiled.io_flash(n, n, d, b, b, order="fa2")
    assert fa2.reads == {"Q": n * d, "K": t * n * d, "V": t * n * d}
    assert fa2.writes == {"O": n * d, "lse": n}
    fa1 = tiled.io_flash(n, n, d, b, b, order="fa1")
    assert fa1.hbm_reads == 2 * n * d + t * n * (2 * d + 2) + 2 * n
    assert fa1.hbm_writes == (t + 1) * n * (d + 2) + n
    assert fa2.tile_visits == fa1.tile_visits == t * t
    assert fa2.matmul_flops == 4 * n * n * d
    naive = tiled.io_naive(n, n, d)
    assert naive.hbm_reads == 3 * n * d + 2 * n * n and naive.hbm_writes == 2 * n * n + n * d
    # causal, N = 8, blocks of 4: tiles (0,0), (1,0), (1,1) are visited, (0,1) skipped
    c = tiled.io_flash(8, 8, 2, 4, 4, causal=True)
    assert c.tile_visits == 3 and c.reads["K"] == (4 + 8) * 2
    # backward: 5 matmuls per tile (atomic) vs 4 reading a stored P: a ratio of 5/4
    bwd, naive_bwd = tiled.io_flash_backward(n, n, d, b, b), tiled.io_naive_backward(n, n, d)
    assert bwd.matmul_flops == 10 * n * n * d and naive_bwd.matmul_flops == 8 * n * n * d
    assert tiled.io_flash_backward(n, n, d, b, b, dq_strategy="second_pass").matmul_flops \
        == 14 * n * n * d
    assert bwd.reads["dQ"] == t * n * d and bwd.writes["dQ"] == (t + 1) * n * d


def test_fa2_traffic_depends_on_block_q_and_fa1_on_block_k():
    base2 = tiled.io_flash(512, 512, 64, 64, 64, order="fa2").hbm_total
    assert tiled.io_flash(512, 512, 64, 64, 16, order="fa2").hbm_total == base2
    assert tiled.io_flash(512, 512, 64, 128, 64, order="fa2").hbm_total < base2
    base1 = tiled.io_flash(512, 512, 64, 64, 64, order="fa1").hbm_total
    assert tiled.io_flash(512, 512, 64, 16, 64, order="fa1").hbm_total == base1
    assert tiled.io_flash(512, 512, 64, 64, 128, order="fa1").hbm_total < base1


def test_onchip_bytes_by_hand(rng):
    # B_r = B_c = 64, d = 128, fp16 inputs, fp32 accumulators
    want = (64 * 128 * 2) * 3 + 64 * 64 * 4 + 64 * 128 * 4 + 2 * 64 * 4
    assert tiled.onchip_bytes(64, 64, 128, 2) == want == 98816
    assert tiled.onchip_bytes(64, 64, 128, 2) < 64 * 64 * 128 * 2   # not B_r x B_c x d
    q, k, v, _ = make_inputs(rng, (), 100, 100, 128, 128)
    io = tiled.IOCounter()
    tiled.forward(q, k, v, block_q=64, block_k=64, io=io)
    assert io.stats().onchip_bytes(dtype_bytes=2, acc_bytes=4) == want


def test_paper_block_rule_and_bound():
    assert tiled.paper_blocks(32 * 1024, 128) == (64, 64)      # M / 4d = 64
    assert tiled.paper_blocks(100_000, 64) == (64, 391)        # B_r capped at d
    assert tiled.io_bound(1024, 64, 4096) == 1024**2 * 64**2 / 4096


def test_hbm_bytes_uses_fp32_for_statistics(rng):
    # N = 64, d = 16, 16 x 16 tiles, fp16 data: Q read once (64 x 16 x 2 B = 2048 B), K and V
    # once per query tile (4 x 2048 B each), O written once (2048 B), lse one fp32 per row
    # (64 x 4 B = 256 B): 20736 B. Counted on a real run with an IOCounter, and closed form.
    want = 2048 + 4 * 2048 + 4 * 2048 + 2048 + 256
    s = tiled.io_flash(64, 64, 16, 16, 16)
    assert s.hbm_bytes(dtype_bytes=2, stat_bytes=4) == want == 20736
    q, k, v = (rng.standard_normal((64, 16)) for _ in range(3))
    io = tiled.IOCounter()
    tiled.forward(q, k, v, block_q=16, block_k=16, io=io)
    assert io.stats().hbm_bytes(dtype_bytes=2, stat_bytes=4) == want


# ----------------------------------------------------------------- bad input

@pytest.fixture
def arrays(rng):
    q, k, v, do = make_inputs(rng, (2,), 5, 6, 3, 4)
    o, lse = tiled.forward(q, k, v, block_q=2, block_k=2)
    return q, k, v, o, lse, do


@pytest.mark.parametrize("kw,error,word", [
    ({"block_q": 0}, ValueError, "block_q"),
    ({"block_k": -3}, ValueError, "block_k"),
    ({"block_q": 2.5}, TypeError, "block_q"),
    ({"block_k": "64"}, TypeError, "block_k"),
    ({"block_q": True}, TypeError, "block_q"),
    ({"causal": "yes"}, TypeError, "causal"),
    ({"scale": -1.0}, ValueError, "scale"),
])
def test_bad_keywords_are_named(arrays, kw, error, word):
    q, k, v, o, lse, do = arrays
    with pytest.raises(error, match=word):
        tiled.forward(q, k, v, **kw)
    with pytest.raises(error, match=word):
        tiled.backward(q, k, v, o, lse, do, **kw)


def test_bad_forward_arguments(arrays):
    q, k, v, *_ = arrays
    with pytest.raises(ValueError, match="q and k"):
        tiled.forward(q, k[..., :2], v)
    with pytest.raises(ValueError, match="k and v"):
        tiled.forward(q, k, v[..., :4, :])
    with pytest.raises(TypeError, match="q"):
        tiled.forward(q.astype(int), k, v)
    with pytest.raises(ValueError, match="order"):
        tiled.forward(q, k, v, order="fa3")
    with pytest.raises(TypeError, match="io"):
        tiled.forward(q, k, v, io="counter")


def test_bad_backward_arguments(arrays):
    q, k, v, o, lse, do = arrays
    with pytest.raises(ValueError, match="lse"):
        tiled.backward(q, k, v, o, lse[..., :-1], do)
    with pytest.raises(ValueError, match="lse"):
        tiled.backward(q, k, v, o, lse[..., None], do)
    with pytest.raises(TypeError, match="lse"):
        tiled.backward(q, k, v, o, lse.astype(int), do)
    with pytest.raises(ValueError, match="o must"):
        tiled.backward(q, k, v, o[..., :2], lse, do)
    with pytest.raises(ValueError, match="do must"):
        tiled.backward(q, k, v, o, lse, do[:, :3])
    with pytest.raises(ValueError, match="dq_strategy"):
        tiled.backward(q, k, v, o, lse, do, dq_strategy="magic")


def test_bad_closed_form_arguments():
    with pytest.raises(ValueError, match="block_q"):
        tiled.io_flash(8, 8, 4, 0, 4)
    with pytest.raises(TypeError, match="d"):
        tiled.onchip_bytes(4, 4, 2.0)
    with pytest.raises(ValueError, match="order"):
        tiled.tile_schedule(8, 8, 4, 4, order="sideways")
    with pytest.raises(ValueError, match="watch_row"):
        tiled.IOCounter(watch_row=-1)


def test_onchip_breakdown_matches_the_counter(rng):
    q, k, v, _ = make_inputs(rng, (2,), 50, 70, 16, 8)
    io = tiled.IOCounter()
    tiled.forward(q, k, v, block_q=32, block_k=16, io=io)
    want = tiled.onchip_breakdown(32, 16, 16, 2, d_v=8, acc_bytes=4)
    assert io.stats().onchip_bytes_by_buffer(2, 4) == want
    assert want["Q"] == 32 * 16 * 2 and want["S/P"] == 32 * 16 * 4 and want["V"] == 16 * 8 * 2
