"""flashbook.masks: windows, soft-capping, documents and prefixes against truths written
as plain loops, the backward against central finite differences, the tile counts
against flashbook.tiled.

Tolerances: everything is float64 (unit roundoff 1.1e-16) on rows of at most ~20 keys,
so the vectorised code and the loops differ by rounding only, ~1e-15 relative; 1e-12
leaves a wide margin while a wrong mask entry or a missing tanh is off by O(1e-2) or
more. Finite differences with eps = 1e-6 carry a truncation error ~eps^2 * f''' ~ 1e-12
and a rounding error ~1e-16 / eps ~ 1e-10, far below the 1e-6 we allow.
"""
import itertools
import math
import os

import numpy as np
import pytest

from flashbook import masks, reference, tiled

TOL = 1e-12


@pytest.fixture
def rngs():
    """Three fresh generators per test (their seeds are printed when a test fails)."""
    seeds = [int.from_bytes(os.urandom(4), "little") for _ in range(3)]
    print(f"random seeds: {seeds}")
    return [np.random.default_rng(seed) for seed in seeds]


def close(ours, theirs, tol=TOL):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape
    assert not np.isnan(ours).any()
    scale = max(1.0, float(np.abs(theirs).max(initial=0.0)))
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol * scale)


def qkv(rng, n_q, n_k, d=4, d_v=3, lead=()):
    return (rng.standard_normal(lead + (n_q, d)), rng.standard_normal(lead + (n_k, d)),
            rng.standard_normal(lead + (n_k, d_v)))


# ------------------------------------------------------------------ the truth, as loops

def doc_spans(ids):
    """Per token: (start, length) of its document, found by scanning."""
    spans = []
    for t, doc in enumerate(ids):
        start = t
        while start > 0 and ids[start - 1] == doc:
            start -= 1
        spans.append((start, sum(1 for x in ids if x == doc)))
    return spans


def allowed_loop(n_q, n_k, causal=False, window=(-1, -1), prefix=0, doc_q=None, doc_k=None):
    """The rule of flash-attn, one (i, j) at a time."""
    left, right = window
    if causal:
        right = 0                       # flash-attn: window_size_right = 0 under causal
    out = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        for j in range(n_k):
            if doc_q is not None:
                if doc_q[i] != doc_k[j]:
                    continue
                start_q, len_q = doc_spans(doc_q)[i]
                start_k, len_k = doc_spans(doc_k)[j]
                pi, pj, diag = i - start_q, j - start_k, len_k - len_q
            else:
                pi, pj, diag = i, j, n_k - n_q
            inside = ((left < 0 or pj >= pi + diag - left)
                      and (right < 0 or pj <= pi + diag + right))
            out[i, j] = inside or pj < prefix
    return out


def attention_loop(q, k, v, mask, softcap=None, scale=None):
    """Row by row, key by key, with math.exp and math.tanh (2-D inputs)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    o = np.zeros((q.shape[0], v.shape[1]))
    lse = np.full(q.shape[0], -np.inf)
    for i in range(q.shape[0]):
        keys = [j for j in range(k.shape[0]) if mask[i, j]]
        s = {}
        for j in keys:
            s[j] = scale * sum(q[i, c] * k[j, c] for c in range(q.shape[1]))
            if softcap is not None:
                s[j] = softcap * math.tanh(s[j] / softcap)
        if not keys:
            continue
        m = max(s.values())
        w = {j: math.exp(s[j] - m) for j in keys}
        total = sum(w.values())
        for j in keys:
            o[i] += w[j] / total * v[j]
        lse[i] = m + math.log(total)
    return o, lse


WINDOWS = [(-1, -1), (0, 0), (3, 0), (2, 5), (-1, 4), (5, -1), (1, 1), (0, -1), (20, 20)]
SHAPES = [(1, 1), (4, 4), (5, 9), (9, 5), (7, 1), (1, 7), (6, 6), (3, 11)]


# ------------------------------------------------------------------ allowed

@pytest.mark.parametrize("n_q,n_k", SHAPES)
def test_allowed_equals_the_loops(n_q, n_k):
    for window, causal, prefix in itertools.product(WINDOWS, (False, True), (0, 2, 20)):
        ours = masks.allowed(n_q, n_k, causal=causal, window=window, prefix=prefix)
        truth = allowed_loop(n_q, n_k, causal, window, prefix)
        assert ours.dtype == bool and ours.shape == (n_q, n_k)
        assert np.array_equal(ours, truth), (window, causal, prefix)


def test_allowed_by_hand():
    """The conventions spelled out on small cases (1 = visible)."""
    band = masks.allowed(4, 4, window=(1, 0))
    assert np.array_equal(band, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    # fewer queries than keys: bottom-right, so row 0 is key 2's position
    assert np.array_equal(masks.allowed(2, 4, causal=True), [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert np.array_equal(masks.allowed(2, 4, window=(0, 0)), [[0, 0, 1, 0], [0, 0, 0, 1]])
    # more queries than keys: the first rows see nothing
    assert np.array_equal(masks.allowed(3, 1, causal=True), [[0], [0], [1]])
    # prefix-LM: the first two keys are seen by everyone, the rest causally
    assert np.array_equal(masks.allowed(4, 4, causal=True, prefix=2),
                          [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])


@pytest.mark.parametrize("n_q,n_k", SHAPES)
def test_causal_and_trivial_windows_reduce_to_the_known_masks(n_q, n_k):
    causal = reference.causal_mask(n_q, n_k)
    assert np.array_equal(masks.allowed(n_q, n_k, causal=True), causal)
    assert masks.allowed(n_q, n_k).all()
    assert masks.allowed(n_q, n_k, window=None).all()
    # a side as long as the keys is no limit at all (flash-attn turns it into -1)
    assert masks.allowed(n_q, n_k, window=(n_k + n_q, n_k + n_q)).all()
    # causal + window: the right side is 0 whatever was asked
    for left in (-1, 0, 2):
        ours = masks.allowed(n_q, n_k, causal=True, window=(left, 5))
        assert np.array_equal(ours, masks.allowed(n_q, n_k, window=(left, 0)))
    assert np.array_equal(masks.allowed(n_q, n_k, causal=True, window=(-1, -1)), causal)


def test_allowed_with_documents_equals_the_loops(rngs):
    for rng in rngs:
        lengths_q = rng.integers(0, 5, size=4)
        lengths_k = lengths_q + rng.integers(0, 3, size=4)     # varlen: a KV cache per doc
        doc_q = masks.doc_ids_from_cu_seqlens(np.concatenate([[0], np.cumsum(lengths_q)]))
        doc_k = masks.doc_ids_from_cu_seqlens(np.concatenate([[0], np.cumsum(lengths_k)]))
        for window, causal, prefix in itertools.product(WINDOWS[:6], (False, True), (0, 1)):
            ours = masks.allowed(doc_q.size, doc_k.size, causal=causal, window=window,
                                 prefix=prefix, doc_ids_q=doc_q, doc_ids_k=doc_k)
            truth = allowed_loop(doc_q.size, doc_k.size, causal, window, prefix, doc_q, doc_k)
            assert np.array_equal(ours, truth), (lengths_q, lengths_k, window, causal, prefix)


def test_documents_are_block_diagonal_with_their_own_alignment():
    """Each document is attended to as if alone, with its own N_k - N_q (flash-attn varlen)."""
    cu_q, cu_k = [0, 2, 2, 5, 6], [0, 4, 5, 8, 8]
    doc_q, doc_k = masks.doc_ids_from_cu_seqlens(cu_q), masks.doc_ids_from_cu_seqlens(cu_k)
    assert list(doc_q) == [0, 0, 2, 2, 2, 3] and list(doc_k) == [0, 0, 0, 0, 1, 2, 2, 2]
    ours = masks.allowed(6, 8, causal=True, doc_ids_q=doc_q, doc_ids_k=doc_k)
    truth = np.zeros((6, 8), dtype=bool)
    for b in range(4):
        rows, cols = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        truth[rows, cols] = reference.causal_mask(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b])
    assert np.array_equal(ours, truth)
    assert not ours[5].any()            # document 3 has a query but no key


# ------------------------------------------------------------------ forward

def test_no_mask_and_causal_equal_the_reference(rngs):
    for rng, (n_q, n_k) in itertools.product(rngs, SHAPES):
        q, k, v = qkv(rng, n_q, n_k)
        close(masks.attention(q, k, v), reference.attention(q, k, v))
        close(masks.attention(q, k, v, window=(-1, -1)), reference.attention(q, k, v))
        close(masks.attention(q, k, v, causal=True), reference.attention(q, k, v, causal=True))
        close(masks.attention(q, k, v, causal=True, scale=0.3),
              reference.attention(q, k, v, causal=True, scale=0.3))


def test_huge_softcap_is_no_softcap(rngs):
    """c tanh(s/c) = s - s^3 / (3 c^2) + ...: with |s| < 10 and c = 1e9 the change is
    ~1e-16 relative, below float64 rounding; tanh itself is accurate to ~1 ulp."""
    for rng in rngs:
        q, k, v = qkv(rng, 6, 9)
        close(masks.attention(q, k, v, softcap=1e9), masks.attention(q, k, v), tol=1e-13)
    capped = masks.attention(q, k, v, softcap=0.5)
    assert np.abs(capped - masks.attention(q, k, v)).max() > 1e-3   # a small cap matters


@pytest.mark.parametrize("rule", [
    dict(window=(0, 0)), dict(window=(3, 0)), dict(window=(2, 5)), dict(window=(-1, 4)),
    dict(window=(5, -1)), dict(causal=True, window=(2, 3)), dict(causal=True, prefix=3),
    dict(prefix=2, window=(1, 1)), dict(softcap=0.7), dict(causal=True, softcap=2.0),
    dict(causal=True, window=(4, 0), softcap=1.5, prefix=1),
])
@pytest.mark.parametrize("n_q,n_k", [(6, 6), (4, 9), (9, 4)])
def test_each_rule_equals_the_loop(rngs, rule, n_q, n_k):
    softcap = rule.get("softcap")
    mask_rule = {key: value for key, value in rule.items() if key != "softcap"}
    mask = allowed_loop(n_q, n_k, mask_rule.get("causal", False),
                        mask_rule.get("window", (-1, -1)), mask_rule.get("prefix", 0))
    for rng in rngs:
        q, k, v = qkv(rng, n_q, n_k)
        q *= 3.0                                   # scores of a few units: the cap bites
        o, lse = masks.attention(q, k, v, return_lse=True, **rule)
        o_loop, lse_loop = attention_loop(q, k, v, mask, softcap)
        close(o, o_loop)
        assert np.array_equal(np.isinf(lse), np.isinf(lse_loop))
        close(lse[np.isfinite(lse)], lse_loop[np.isfinite(lse_loop)])


def test_documents_equal_each_document_alone(rngs):
    """Packed documents == each document through reference.attention on its own."""
    cu_q, cu_k = np.array([0, 3, 3, 7, 8]), np.array([0, 5, 6, 10, 10])
    doc_q, doc_k = masks.doc_ids_from_cu_seqlens(cu_q), masks.doc_ids_from_cu_seqlens(cu_k)
    for rng in rngs:
        q, k, v = qkv(rng, 8, 10)
        o, lse = masks.attention(q, k, v, causal=True, doc_ids_q=doc_q, doc_ids_k=doc_k,
                                 return_lse=True)
        for b in range(4):
            rows, cols = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            if rows.stop > rows.start and cols.stop > cols.start:
                close(o[rows], reference.attention(q[rows], k[cols], v[cols], causal=True))
        assert np.array_equal(o[7], np.zeros(3)) and lse[7] == -np.inf   # no keys: nothing
        mask = allowed_loop(8, 10, True, (-1, -1), 0, doc_q, doc_k)
        close(o, attention_loop(q, k, v, mask)[0])


def test_rows_that_see_no_key_give_zero_and_minus_inf(rngs):
    for rng in rngs:
        q, k, v = qkv(rng, 7, 3)
        o, lse = masks.attention(q, k, v, causal=True, window=(0, 0), softcap=1.0,
                                 return_lse=True)
        assert not np.isnan(o).any() and not np.isnan(lse).any()
        assert np.array_equal(o[:4], np.zeros((4, 3))) and (lse[:4] == -np.inf).all()
        assert np.isfinite(lse[4:]).all() and (np.abs(o[4:]) > 0).any()
        grads = masks.attention_backward(q, k, v, rng.standard_normal((7, 3)), causal=True,
                                         window=(0, 0), softcap=1.0)
        assert all(np.isfinite(g).all() for g in grads)
        assert np.array_equal(grads[0][:4], np.zeros((4, 4)))


def test_leading_dimensions_are_each_their_own_attention(rngs):
    rule = dict(causal=True, window=(2, 0), softcap=1.3, prefix=1)
    for rng in rngs:
        q, k, v = qkv(rng, 5, 7, lead=(2, 3))
        o, lse = masks.attention(q, k, v, return_lse=True, **rule)
        do = rng.standard_normal(o.shape)
        grads = masks.attention_backward(q, k, v, do, **rule)
        assert o.shape == (2, 3, 5, 3) and lse.shape == (2, 3, 5)
        for b, h in itertools.product(range(2), range(3)):
            o_bh, lse_bh = masks.attention(q[b, h], k[b, h], v[b, h], return_lse=True, **rule)
            close(o[b, h], o_bh)
            close(lse[b, h], lse_bh)
            for g, g_bh in zip(grads, masks.attention_backward(q[b, h], k[b, h], v[b, h],
                                                               do[b, h], **rule)):
                close(g[b, h], g_bh)


# ------------------------------------------------------------------ backward

def finite_differences(q, k, v, do, rule, eps=1e-6):
    """Central differences of L = sum(O * dO) in every entry of q, k and v."""
    grads = []
    for x in (q, k, v):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            saved = x[idx]
            x[idx] = saved + eps
            up = np.sum(masks.attention(q, k, v, **rule) * do)
            x[idx] = saved - eps
            down = np.sum(masks.attention(q, k, v, **rule) * do)
            x[idx] = saved
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


DOCS = masks.doc_ids_from_cu_seqlens([0, 2, 5]), masks.doc_ids_from_cu_seqlens([0, 3, 6])


@pytest.mark.parametrize("rule", [
    dict(causal=True, window=(2, 0), softcap=0.8),
    dict(window=(1, 2), softcap=1.5),
    dict(causal=True, doc_ids_q=DOCS[0], doc_ids_k=DOCS[1]),
    dict(window=(1, -1), softcap=2.0, doc_ids_q=DOCS[0], doc_ids_k=DOCS[1]),
    dict(causal=True, prefix=2),
    dict(causal=True, prefix=1, softcap=1.0, scale=0.9),
])
def test_backward_matches_finite_differences(rngs, rule):
    for rng in rngs[:2]:
        q, k, v = qkv(rng, 5, 6, d=3, d_v=2)
        q *= 2.0
        do = rng.standard_normal((5, 2))
        ours = masks.attention_backward(q, k, v, do, **rule)
        for g, fd in zip(ours, finite_differences(q, k, v, do, rule)):
            close(g, fd, tol=1e-6)
            assert np.abs(g).max() > 1e-3          # a real gradient, not zeros


def test_backward_without_mask_equals_the_reference(rngs):
    for rng, (n_q, n_k), causal in itertools.product(rngs, SHAPES[:5], (False, True)):
        q, k, v = qkv(rng, n_q, n_k, lead=(2,))
        do = rng.standard_normal((2, n_q, 3))
        for ours, theirs in zip(masks.attention_backward(q, k, v, do, causal=causal),
                                reference.attention_backward(q, k, v, do, causal=causal)):
            close(ours, theirs)


# ------------------------------------------------------------------ tiles

@pytest.mark.parametrize("n_q,n_k", [(1, 1), (16, 16), (13, 29), (29, 13), (64, 7), (3, 40)])
def test_tile_kinds_equal_the_tiled_module(n_q, n_k):
    for block_q, block_k, causal in itertools.product((1, 3, 8, 16, 64), (1, 4, 7, 64),
                                                      (False, True)):
        ours = masks.tile_kinds(n_q, n_k, block_q, block_k, causal=causal)
        theirs = tiled.tile_kinds(n_q, n_k, block_q, block_k, causal=causal)
        assert np.array_equal(ours, theirs), (block_q, block_k, causal)


@pytest.mark.parametrize("rule", [
    dict(window=(3, 0)), dict(causal=True, window=(5, 0), prefix=2), dict(window=(2, 6)),
    dict(causal=True, doc_ids_q=DOCS[0], doc_ids_k=DOCS[1]),
])
def test_tile_kinds_follow_their_definition(rule):
    n_q, n_k = (5, 6) if "doc_ids_q" in rule else (19, 23)
    mask = masks.allowed(n_q, n_k, **rule)
    for block_q, block_k in itertools.product((1, 2, 4, 32), (1, 3, 5, 32)):
        kinds = masks.tile_kinds(n_q, n_k, block_q, block_k, **rule)
        # the same kinds read off the whole array at once (what the chapter 12 explorer does)
        assert np.array_equal(masks.kinds_of(mask, block_q, block_k), kinds)
        for a, rows in enumerate(tiled.tile_slices(n_q, block_q)):
            for b, cols in enumerate(tiled.tile_slices(n_k, block_k)):
                tile = mask[rows, cols]
                want = "full" if tile.all() else "partial" if tile.any() else "skipped"
                assert kinds[a, b] == want
        counts = masks.tile_counts(n_q, n_k, block_q, block_k, **rule)
        assert counts["total"] == kinds.size == counts["visited"] + counts["skipped"]
        assert counts["visited"] == counts["full"] + counts["partial"]
        assert counts["work_fraction"] == counts["visited"] / counts["total"]


def test_window_tiles_grow_with_the_window_not_with_n_squared():
    """Causal band of w + 1 keys, w a multiple of the block: query tile r sees key tiles
    r - W .. r (W = w / block), the first W rows fewer, so visited = T (W + 1) - W (W + 1) / 2
    with T = n / block: linear in w. Partial: the diagonal tile, and the band's left
    edge tile in every row that has one."""
    n, block = 4096, 64
    T = n // block
    for w in (256, 512, 1024):
        counts = masks.tile_counts(n, n, block, block, causal=True, window=(w, 0))
        W = w // block
        assert counts["visited"] <= (w / block + 2) * (n / block)
        assert counts["visited"] == T * (W + 1) - W * (W + 1) // 2
        assert counts["partial"] == T + (T - W)
        assert counts["total"] == T * T and counts["work_fraction"] < 0.25
    causal = masks.tile_counts(n, n, block, block, causal=True)
    assert causal["visited"] == T * (T + 1) // 2                 # n^2 / 2: many more
    assert causal["partial"] == T


def test_tile_counts_without_tiles():
    counts = masks.tile_counts(0, 5, 4, 4)
    assert counts["total"] == 0 and counts["work_fraction"] == 0.0


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("window,exc,words", [
    ("3, 0", TypeError, "window must be a pair"), (3, TypeError, "window must be a pair"),
    ({1, 2}, TypeError, "window must be a pair"), ((1,), ValueError, "window must be a pair"),
    ((1, 2, 3), ValueError, "window must be a pair"), ((1.0, 0), TypeError, r"window\[0\]"),
    ((0, 2.5), TypeError, r"window\[1\]"), ((True, 0), TypeError, r"window\[0\]"),
    ((-5, 0), ValueError, r"window\[0\] = -5: use -1 for no limit"),
    ((0, -2), ValueError, r"window\[1\] = -2"),
])
def test_bad_window_names_it(window, exc, words):
    with pytest.raises(exc, match=words):
        masks.check_window(window)
    with pytest.raises(exc, match="window"):
        masks.allowed(3, 3, window=window)


def test_good_windows_come_back_as_python_ints():
    for window in [(np.int64(3), np.int32(-1)), [2, 0], np.array([4, 1]), None]:
        checked = masks.check_window(window)
        assert all(type(side) is int for side in checked)
    assert masks.check_window(None) == (-1, -1)
    assert masks.check_window([np.int64(3), 0]) == (3, 0)


@pytest.mark.parametrize("softcap,exc", [
    (-1.0, ValueError), (-1e-9, ValueError), (float("nan"), ValueError),
    (float("inf"), ValueError), ("30", TypeError), (True, TypeError), ([1.0], TypeError),
])
def test_bad_softcap_names_it(rngs, softcap, exc):
    with pytest.raises(exc, match="softcap"):
        masks.check_softcap(softcap)
    q, k, v = qkv(rngs[0], 3, 3)
    with pytest.raises(exc, match="softcap"):
        masks.attention(q, k, v, softcap=softcap)


def test_softcap_off_and_on():
    assert masks.check_softcap(None) is None and masks.check_softcap(0) is None
    assert masks.check_softcap(0.0) is None
    assert masks.check_softcap(30) == 30.0 and type(masks.check_softcap(np.float32(2))) is float


@pytest.mark.parametrize("cu,exc,words", [
    ([1, 3], ValueError, "cu_seqlens must start at 0"), ([], ValueError, "at least one value .0, for no document., got an empty"),
    ([0, 3, 2], ValueError, r"cu_seqlens must be nondecreasing.*cu_seqlens\[2\] = 2"),
    ([[0, 3]], ValueError, "cu_seqlens must be a 1-D"), ([0.0, 3.0], TypeError, "cu_seqlens"),
    (np.array([False, True]), TypeError, "cu_seqlens"),
])
def test_bad_cu_seqlens_names_it(cu, exc, words):
    with pytest.raises(exc, match=words):
        masks.doc_ids_from_cu_seqlens(cu)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: masks.allowed(3, 4, doc_ids_q=[0, 0], doc_ids_k=[0] * 4), ValueError, "doc_ids_q"),
    (lambda: masks.allowed(3, 4, doc_ids_q=[0] * 3, doc_ids_k=[0] * 5), ValueError, "doc_ids_k"),
    (lambda: masks.allowed(3, 4, doc_ids_q=[0] * 3), ValueError, "doc_ids_k is missing"),
    (lambda: masks.allowed(3, 2, doc_ids_q=[0, 1, 0], doc_ids_k=[0, 1]), ValueError,
     "doc_ids_q must be nondecreasing"),
    (lambda: masks.allowed(2, 2, doc_ids_q=[0.0, 1.0], doc_ids_k=[0, 1]), TypeError,
     "doc_ids_q"),
    (lambda: masks.allowed(3, 3, prefix=-1), ValueError, "prefix"),
    (lambda: masks.allowed(3, 3, prefix=1.5), TypeError, "prefix"),
    (lambda: masks.allowed(3, 3, causal=1), TypeError, "causal"),
    (lambda: masks.allowed(-1, 3), ValueError, "n_q"),
    (lambda: masks.tile_kinds(4, 4, 0, 2), ValueError, "block_q"),
    (lambda: masks.tile_counts(4, 4, 2, 2, window=(0, -3)), ValueError, "window"),
])
def test_bad_mask_arguments_name_them(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_attention_checks_its_arrays(rngs):
    q, k, v = qkv(rngs[0], 3, 4)
    with pytest.raises(ValueError, match="doc_ids_q"):
        masks.attention(q, k, v, doc_ids_q=[0, 0], doc_ids_k=[0] * 4)
    with pytest.raises(ValueError, match="number of keys"):
        masks.attention(q, k, v[:3])
    with pytest.raises(ValueError, match="do must have shape"):
        masks.attention_backward(q, k, v, q, causal=True)
    with pytest.raises(TypeError, match="return_lse"):
        masks.attention(q, k, v, return_lse="yes")


# ------------------------------------------------------------------ ALiBi

def alibi_loop(q, k, v, slope, causal=False, softcap=None, scale=None):
    """ALiBi as flash-attn states it, one (i, j) at a time (2-D inputs): the score of row i
    and key j is cap(scale * q_i . k_j) - slope * |i + N_k - N_q - j|, causal keeping
    j <= i + N_k - N_q; then the softmax, with math.exp."""
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = np.zeros((n_q, v.shape[1])), np.full(n_q, -np.inf)
    for i in range(n_q):
        s = {}
        for j in range(n_k):
            if causal and j > i + n_k - n_q:
                continue
            s[j] = scale * sum(q[i, c] * k[j, c] for c in range(q.shape[1]))
            if softcap is not None:
                s[j] = softcap * math.tanh(s[j] / softcap)
            s[j] -= slope * abs(i + n_k - n_q - j)
        if s:
            m = max(s.values())
            total = sum(math.exp(x - m) for x in s.values())
            o[i] = sum(math.exp(s[j] - m) / total * v[j] for j in s)
            lse[i] = m + math.log(total)
    return o, lse


@pytest.mark.parametrize("n_q,n_k", [(4, 5), (5, 4), (4, 4)])
@pytest.mark.parametrize("rule", [dict(), dict(causal=True), dict(softcap=0.8), dict(causal=True, softcap=1.5)],
                         ids=["plain", "causal", "softcap", "causal-softcap"])
def test_alibi_equals_the_loop(rngs, n_q, n_k, rule):
    """(heads,) and (batch, heads) slopes on (batch, heads, N, d) inputs, and one slope
    for a 2-D input, each head against the loop with its own slope."""
    for rng in rngs:
        q, k, v = qkv(rng, n_q, n_k, lead=(2, 3))
        q *= 3.0
        for slopes in (rng.uniform(0.1, 1.5, 3), rng.uniform(0.1, 1.5, (2, 3))):
            o, lse = masks.attention(q, k, v, alibi_slopes=slopes, return_lse=True, **rule)
            for b, h in itertools.product(range(2), range(3)):
                o_loop, lse_loop = alibi_loop(q[b, h], k[b, h], v[b, h], slopes[..., h] if slopes.ndim == 1
                                              else slopes[b, h], **rule)
                close(o[b, h], o_loop)
                assert np.array_equal(np.isinf(lse[b, h]), np.isinf(lse_loop))
                close(lse[b, h][np.isfinite(lse_loop)], lse_loop[np.isfinite(lse_loop)])
        slope = float(rng.uniform(0.1, 1.5))
        close(masks.attention(q[0, 0], k[0, 0], v[0, 0], alibi_slopes=slope, **rule),
              alibi_loop(q[0, 0], k[0, 0], v[0, 0], slope, **rule)[0])
    assert np.abs(masks.attention(q, k, v, alibi_slopes=slopes, **rule) - masks.attention(q, k, v, **rule)).max() > 1e-2


def test_alibi_in_documents_counts_positions_from_each_document_start(rngs):
    """Packed documents with (heads,) slopes == each document alone with the same slopes."""
    cu_q, cu_k = np.array([0, 3, 3, 7, 8]), np.array([0, 5, 6, 10, 10])
    ids = dict(doc_ids_q=masks.doc_ids_from_cu_seqlens(cu_q), doc_ids_k=masks.doc_ids_from_cu_seqlens(cu_k))
    for rng in rngs:
        q, k, v = qkv(rng, 8, 10, lead=(2,))
        slopes = rng.uniform(0.1, 1.5, 2)
        o = masks.attention(q, k, v, causal=True, alibi_slopes=slopes, **ids)
        for b in (0, 2):   # the documents with queries and keys
            rows, cols = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            close(o[:, rows], masks.attention(q[:, rows], k[:, cols], v[:, cols], causal=True, alibi_slopes=slopes))


@pytest.mark.parametrize("rule", [dict(), dict(causal=True, window=(2, 0), softcap=1.2),
                                  dict(window=(1, 2), doc_ids_q=DOCS[0], doc_ids_k=DOCS[1])],
                         ids=["plain", "causal-window-softcap", "window-documents"])
def test_alibi_backward_matches_finite_differences(rngs, rule):
    for rng in rngs[:2]:
        q, k, v = qkv(rng, 5, 6, d=3, d_v=2, lead=(2,))
        q *= 2.0
        do = rng.standard_normal((2, 5, 2))
        rule = dict(rule, alibi_slopes=rng.uniform(0.2, 1.0, 2))
        ours = masks.attention_backward(q, k, v, do, **rule)
        for g, fd in zip(ours, finite_differences(q, k, v, do, rule)):
            close(g, fd, tol=1e-6)
            assert np.abs(g).max() > 1e-3


@pytest.mark.parametrize("slopes,exc,words", [
    (np.ones(4), ValueError, r"alibi_slopes must have shape \(heads,\) or \(batch, heads\).*got \(4,\)"),
    (np.ones((3, 3)), ValueError, "alibi_slopes must have shape"), (np.ones((1, 2, 3)), ValueError, "alibi_slopes"),
    (np.array([True, False, True]), TypeError, "alibi_slopes must be real numbers"),
    (["a", "b", "c"], TypeError, "alibi_slopes"),
])
def test_bad_alibi_slopes_name_them(rngs, slopes, exc, words):
    q, k, v = qkv(rngs[0], 3, 4, lead=(2, 3))
    with pytest.raises(exc, match=words):
        masks.attention(q, k, v, alibi_slopes=slopes)
    with pytest.raises(exc, match="alibi_slopes"):
        masks.check_alibi(slopes, (2, 3))
    assert masks.check_alibi(None, (2, 3)) is None
    assert masks.check_alibi([1, 2, 3], (2, 3)).shape == (3, 1, 1)
