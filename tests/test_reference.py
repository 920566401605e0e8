"""flashbook.reference against torch (float64, autograd): forward and backward."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashbook import reference

# float64 throughout: both sides round each operation at ~1.1e-16 relative; with
# sums over at most a few hundred terms, 1e-10 relative leaves a wide margin while
# still catching any real mistake (a wrong mask or scale is off by O(1)).
RTOL, ATOL = 1e-10, 1e-10


def torch_attention(q, k, v, do=None, *, causal=False, scale=None):
    """Independent of the NumPy code: ``reference.torch_attention`` (PyTorch, float64),
    with autograd for the gradients."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    o = reference.torch_attention(q, k, v, causal=causal, scale=scale)
    if do is None:
        return o.detach().numpy()
    o.backward(torch.tensor(do))
    return o.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def close(ours, theirs, rtol=RTOL, atol=ATOL):
    scale = max(1.0, float(np.abs(theirs).max(initial=0.0)))
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol * scale)


SHAPES = [  # (n_q, n_k, d): odd sizes on purpose
    (1, 1, 1), (7, 7, 3), (1, 129, 16), (129, 7, 64), (33, 65, 128), (129, 129, 5),
]


@pytest.mark.parametrize("n_q,n_k,d", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_match_torch(rng, n_q, n_k, d, causal):
    q = rng.standard_normal((2, n_q, d))
    k = rng.standard_normal((2, n_k, d))
    v = rng.standard_normal((2, n_k, d))
    do = rng.standard_normal((2, n_q, d))
    o_t, dq_t, dk_t, dv_t = torch_attention(q, k, v, do, causal=causal)
    close(reference.attention(q, k, v, causal=causal), o_t)
    dq, dk, dv = reference.attention_backward(q, k, v, do, causal=causal)
    close(dq, dq_t); close(dk, dk_t); close(dv, dv_t)


def test_batched_heads_and_value_dim(rng):
    q = rng.standard_normal((2, 3, 9, 8))
    k = rng.standard_normal((2, 3, 13, 8))
    v = rng.standard_normal((2, 3, 13, 5))  # d_v may differ from d
    do = rng.standard_normal((2, 3, 9, 5))
    o_t, dq_t, dk_t, dv_t = torch_attention(q, k, v, do, scale=0.3)
    close(reference.attention(q, k, v, scale=0.3), o_t)
    for ours, theirs in zip(reference.attention_backward(q, k, v, do, scale=0.3), (dq_t, dk_t, dv_t)):
        close(ours, theirs)


def test_matches_torch_sdpa(rng):
    q, k, v = (rng.standard_normal((2, 4, 31, 16)) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)), is_causal=True).numpy()
    close(reference.attention(q, k, v, causal=True), sdpa)


def test_fully_masked_rows_are_zero_not_nan(rng):
    # n_q > n_k with causal: the first n_q - n_k rows see no key at all
    q = rng.standard_normal((10, 4)); k = rng.standard_normal((3, 4))
    v = rng.standard_normal((3, 4)); do = rng.standard_normal((10, 4))
    o = reference.attention(q, k, v, causal=True)
    assert not np.isnan(o).any()
    assert np.all(o[:7] == 0) and np.all(np.abs(o[7:]).sum(-1) > 0)
    dq, dk, dv = reference.attention_backward(q, k, v, do, causal=True)
    assert np.all(dq[:7] == 0) and not np.isnan(dk).any() and not np.isnan(dv).any()
    _, dq_t, dk_t, dv_t = torch_attention(q, k, v, do, causal=True)
    close(dq, dq_t); close(dk, dk_t); close(dv, dv_t)


def test_causal_mask_bottom_right():
    m = reference.causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert reference.causal_mask(3, 3).tolist() == np.tril(np.ones((3, 3), bool)).tolist()
    assert reference.causal_mask(4, 2)[:2].sum() == 0


@settings(max_examples=40, deadline=None)
@given(
    n_q=st.integers(1, 40), n_k=st.integers(1, 40), d=st.integers(1, 24),
    magnitude=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    causal=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes_and_ranges(n_q, n_k, d, magnitude, causal, seed):
    """Values up to +-1e4 (scores up to ~1e8): stable, no overflow, still exact."""
    r = np.random.default_rng(seed)
    q = r.uniform(-magnitude, magnitude, (n_q, d))
    k = r.uniform(-magnitude, magnitude, (n_k, d))
    v = r.standard_normal((n_k, d))
    do = r.standard_normal((n_q, d))
    o = reference.attention(q, k, v, causal=causal)
    assert np.isfinite(o).all()
    o_t, dq_t, dk_t, dv_t = torch_attention(q, k, v, do, causal=causal)
    # Scores of size ~magnitude^2 carry absolute rounding ~1e-16 * magnitude^2 that
    # the two implementations may round differently; exp turns it into a relative
    # change of that size in P. Allow it, plus the float64 floor.
    tol = 1e-10 + 1e-15 * magnitude**2 * d
    close(o, o_t, rtol=tol, atol=tol)
    grads = reference.attention_backward(q, k, v, do, causal=causal)
    for ours, theirs in zip(grads, (dq_t, dk_t, dv_t)):
        assert np.isfinite(ours).all()
        close(ours, theirs, rtol=tol, atol=tol)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("call,exc,words", [
    (lambda q, k, v: reference.attention(q, k[:, :3], v), ValueError, "head dimension"),
    (lambda q, k, v: reference.attention(q, k, v[:4]), ValueError, "number of keys"),
    (lambda q, k, v: reference.attention(q.astype(np.int32), k, v), TypeError, "q must be a floating"),
    (lambda q, k, v: reference.attention(q, k.astype(bool), v), TypeError, "k must be a floating"),
    (lambda q, k, v: reference.attention(q[0], k, v), ValueError, "q must have at least 2"),
    (lambda q, k, v: reference.attention(q, k, v, scale=0.0), ValueError, "scale"),
    (lambda q, k, v: reference.attention(q, k, v, scale=-2.0), ValueError, "scale"),
    (lambda q, k, v: reference.attention(q, k, v, scale=float("nan")), ValueError, "scale"),
    (lambda q, k, v: reference.attention(q, k, v, scale="big"), TypeError, "scale"),
    (lambda q, k, v: reference.attention(q[None], k, v), ValueError, "leading"),
    (lambda q, k, v: reference.attention_backward(q, k, v, q[:, :2]), ValueError, "do must have shape"),
])
def test_bad_input_names_the_argument(rng, call, exc, words):
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    with pytest.raises(exc, match=words):
        call(q, k, v)


def test_show_source_returns_library_code():
    from flashbook.display import source
    text = source(reference.attention)
    assert text.startswith("def attention(") and "softmax_rows" in text
    assert source(reference.attention, lines=(1, 1)).strip().startswith("def attention(")
    with pytest.raises(ValueError, match="lines"):
        source(reference.attention, lines=(5, 1))
    with pytest.raises(TypeError, match="obj"):
        source(42)


def test_source_helpers_find_lines_by_content(monkeypatch):
    from flashbook import display
    assert display.line_of(reference.attention, "def attention(").split()[1] == "def"
    number = int(display.line_of(reference.attention, "def attention(").split()[0][1:])
    import inspect
    assert number == inspect.getsourcelines(reference.attention)[1]
    with pytest.raises(ValueError, match="not one"):
        display.line_of(reference.attention, "q")           # on many lines
    with pytest.raises(ValueError, match="no occurrence"):
        display.show_between(reference.attention, "no such text", "return")
    shown = {}
    monkeypatch.setattr(display, "show_source", lambda obj, lines, without=None: shown.update(lines=lines))
    display.show_between(reference.attention, "def attention(", "return p @ v")
    first, last = shown["lines"]
    text = display.source(reference.attention, lines=(first, last))
    assert text.startswith("def attention(") and text.rstrip().endswith("return p @ v")
