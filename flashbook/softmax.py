"""Softmax that never overflows, computed in one pass (chapter 3).

    softmax(x)_j = exp(x_j - m) / l,    m = max_j x_j,    l = sum_j exp(x_j - m)

Subtracting the row maximum m changes nothing mathematically (exp(-m) cancels
between numerator and denominator) and everything numerically: every exponent is
<= 0, so exp never overflows, and the largest term is exp(0) = 1, so l >= 1 never
underflows to 0.

The *online* form keeps (m, l), and for attention the unnormalised output
o = sum_j exp(x_j - m) v_j, as a running ``SoftmaxState`` that is updated one
block of scores at a time. The state of two disjoint blocks merges into the state
of their union (``merge``); the merge is commutative bit for bit and associative up to
rounding, so blocks can be processed in any order, or in parallel and combined at the
end, with results that differ only by rounding. That is the whole numerical trick of
FlashAttention's forward pass.

Names follow the notation page: ``row_max`` is m, ``row_sum`` is l, ``acc`` is o,
``lse = m + log l``. A score of -inf means "masked": its weight is exactly 0. A row
whose scores are all -inf attends to nothing: its softmax is all zeros (not NaN),
its state is (m, l) = (-inf, 0) and its logsumexp is -inf. NaN and +inf scores are
refused with a ValueError rather than silently turned into NaN weights.

Everything is computed in the dtype of the input (float16 stays float16), so the
chapter can show what each format does; the tests compare against float64.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .reference import check_qkv
from .validation import check_count


# ----------------------------------------------------------------- input checks

def _as_float(x, name: str, *, min_ndim: int = 1) -> np.ndarray:
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), "
                         f"got shape {arr.shape}")
    return arr


def _check_scores(x, name: str = "x") -> np.ndarray:
    """Floating-point scores with no NaN and no +inf (-inf means 'masked')."""
    arr = _as_float(x, name)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise ValueError(f"{name} must not contain NaN or +inf "
                         f"(-inf is allowed: it means 'masked')")
    return arr


def _check_axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must be in [{-ndim}, {ndim}) for an array with {ndim} "
                         f"dimension(s), got {axis}")
    return int(axis) % ndim


def _frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only copy: a state never changes once made."""
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


def _finite_or_zero(m: np.ndarray) -> np.ndarray:
    """The reference point to subtract: m itself, or 0 where m = -inf.

    A row that has seen only -inf scores has nothing to rescale. Subtracting 0
    there gives exp(-inf - 0) = 0, where subtracting m would give
    exp(-inf - (-inf)) = exp(NaN).
    """
    return np.where(m == -np.inf, 0, m)


# ----------------------------------------------------------------- softmax, three ways

def naive_softmax(x, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)), exactly as the formula is written. Do not use it.

    It is here to show what goes wrong: where exp(x) overflows to inf the result
    is inf / inf = NaN, and where every exp(x) underflows to 0 it is 0 / 0 = NaN.
    Like a GPU, it does so silently (NumPy's warnings are switched off).
    """
    x = _as_float(x, "x")
    axis = _check_axis(axis, x.ndim)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=axis, keepdims=True)


def softmax(x, axis: int = -1) -> np.ndarray:
    """Stable softmax along ``axis``: exp(x - max) / sum(exp(x - max)).

    -inf entries get weight 0; a slice whose entries are all -inf gets all zeros.
    """
    x = _check_scores(x)
    axis = _check_axis(axis, x.ndim)
    if x.shape[axis] == 0:
        return x.copy()
    m = _finite_or_zero(np.max(x, axis=axis, keepdims=True))
    p = np.exp(x - m)                          # every exponent <= 0: no overflow
    l = p.sum(axis=axis, keepdims=True)        # >= 1 unless the slice is all -inf
    return np.divide(p, l, out=np.zeros_like(p), where=l > 0)


def logsumexp(x, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) along ``axis``, computed as m + log(sum(exp(x - m))).

    A slice whose entries are all -inf (or that is empty) gives -inf.
    """
    x = _check_scores(x)
    axis = _check_axis(axis, x.ndim)
    if x.shape[axis] == 0:
        return np.full(np.delete(x.shape, axis), -np.inf, dtype=x.dtype)
    m = _finite_or_zero(np.max(x, axis=axis))
    l = np.exp(x - np.expand_dims(m, axis)).sum(axis=axis)
    with np.errstate(divide="ignore"):         # log(0) = -inf for an all -inf slice
        return m + np.log(l)


# ----------------------------------------------------------------- the running state

@dataclass(frozen=True, eq=False)
class SoftmaxState:
    """What a softmax needs to remember about the scores seen so far, per row.

    row_max: m, the largest score seen (-inf: no unmasked score yet).
    row_sum: l = sum_j exp(x_j - m) over the scores seen (0 while m = -inf).
    acc:     o = sum_j exp(x_j - m) v_j, shape row_max.shape + (d_v,); None when
             there are no values (a plain softmax).

    The arrays are copied and made read-only: a state never changes, ``merge``
    makes a new one.
    """

    row_max: np.ndarray
    row_sum: np.ndarray
    acc: np.ndarray | None = None

    def __post_init__(self):
        m = _frozen(_as_float(self.row_max, "row_max", min_ndim=0))
        l = _frozen(_as_float(self.row_sum, "row_sum", min_ndim=0))
        if m.shape != l.shape:
            raise ValueError(f"row_max and row_sum must have the same shape, "
                             f"got {m.shape} and {l.shape}")
        if np.isnan(m).any() or np.isposinf(m).any():
            raise ValueError("row_max must not contain NaN or +inf")
        if not np.all(np.isfinite(l) & (l >= 0)):
            raise ValueError("row_sum must be finite and >= 0")
        if np.any((m == -np.inf) & (l != 0)):
            raise ValueError("row_sum must be 0 where row_max is -inf (nothing seen yet)")
        object.__setattr__(self, "row_max", m)
        object.__setattr__(self, "row_sum", l)
        if self.acc is not None:
            o = _frozen(_as_float(self.acc, "acc"))
            if o.shape[:-1] != m.shape:
                raise ValueError(f"acc must have shape row_max.shape + (d_v,) = "
                                 f"{m.shape} + (d_v,), got {o.shape}")
            if np.isnan(o).any():
                raise ValueError("acc must not contain NaN")
            object.__setattr__(self, "acc", o)

    @property
    def lse(self) -> np.ndarray:
        """log(sum_j exp(x_j)) = m + log l; -inf for a row that has seen nothing."""
        with np.errstate(divide="ignore"):
            return _finite_or_zero(self.row_max) + np.log(self.row_sum)

    def output(self) -> np.ndarray:
        """The normalised output o / l (zeros for a row that has seen nothing)."""
        if self.acc is None:
            raise ValueError("this state has no acc (it was built without values)")
        l = self.row_sum[..., None]
        return np.divide(self.acc, l, out=np.zeros_like(self.acc), where=l > 0)


def empty_state(shape=(), value_dim: int | None = None, dtype=np.float64) -> SoftmaxState:
    """The state of no scores at all, (m, l, o) = (-inf, 0, 0): merge's identity."""
    shape = tuple(shape) if np.iterable(shape) else (shape,)
    acc = None
    if value_dim is not None:
        acc = np.zeros(shape + (check_count(value_dim, "value_dim", 1),), dtype=dtype)
    return SoftmaxState(np.full(shape, -np.inf, dtype=dtype), np.zeros(shape, dtype=dtype), acc)


def block_state(scores, v=None) -> SoftmaxState:
    """The state of one block of scores (along the last axis) and their values.

    ``scores`` is (..., n); ``v``, if given, is (n, d_v) or (..., n, d_v).
    """
    s = _check_scores(scores, "scores")
    if v is not None:
        v = _as_float(v, "v", min_ndim=2)
        if v.shape[-2] != s.shape[-1]:
            raise ValueError(f"v must have one row per score: scores {s.shape} "
                             f"needs v of shape (..., {s.shape[-1]}, d_v), got {v.shape}")
    if s.shape[-1] == 0:
        return empty_state(s.shape[:-1], None if v is None else v.shape[-1], s.dtype)
    m = np.max(s, axis=-1)
    p = np.exp(s - _finite_or_zero(m)[..., None])   # this block's own weights, <= 1
    acc = None if v is None else (p[..., None, :] @ v)[..., 0, :]
    return SoftmaxState(m, p.sum(axis=-1), acc)


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """(m1, l1, o1) (+) (m2, l2, o2): the state of the union of two disjoint blocks.

        m = max(m1, m2)
        l = exp(m1 - m) l1 + exp(m2 - m) l2
        o = exp(m1 - m) o1 + exp(m2 - m) o2

    Each side is moved from its own reference point to the common maximum; both
    factors are <= 1, so nothing overflows. Commutative bit for bit; associative
    exactly in real arithmetic and to a few ulps in floating point. The identity
    is ``empty_state`` (-inf, 0, 0), and two empty states merge without NaN.
    """
    if not (isinstance(a, SoftmaxState) and isinstance(b, SoftmaxState)):
        raise TypeError(f"a and b must be SoftmaxState, got {type(a).__name__} "
                        f"and {type(b).__name__}")
    if a.row_max.shape != b.row_max.shape:
        raise ValueError(f"a and b must hold the same rows, got shapes "
                         f"{a.row_max.shape} and {b.row_max.shape}")
    if (a.acc is None) != (b.acc is None):
        raise ValueError("a and b must both have acc or both have none")
    if a.acc is not None and a.acc.shape != b.acc.shape:
        raise ValueError(f"a.acc and b.acc must have the same shape, "
                         f"got {a.acc.shape} and {b.acc.shape}")
    m = np.maximum(a.row_max, b.row_max)
    m_ref = _finite_or_zero(m)          # both sides empty: factors exp(-inf) = 0
    alpha = np.exp(a.row_max - m_ref)   # <= 1: shrink a to the common reference
    beta = np.exp(b.row_max - m_ref)    # <= 1: shrink b to the common reference
    l = alpha * a.row_sum + beta * b.row_sum
    acc = None
    if a.acc is not None:
        acc = alpha[..., None] * a.acc + beta[..., None] * b.acc
    return SoftmaxState(m, l, acc)


# ----------------------------------------------------------------- streaming

def online_softmax(x, block_size: int = 1, axis: int = -1, *, return_trace: bool = False):
    """Softmax by streaming over ``x`` along ``axis`` in blocks of ``block_size``.

    Pass 1 folds the blocks into one state with ``merge``: a single read of x
    gives m and l together. Pass 2 writes exp(x - m) / l. (Attention needs no
    pass 2: it wants sum_j p_j v_j, and ``acc`` accumulates that in pass 1.)

    Returns ``(p, state)``; ``state.row_max`` and ``state.row_sum`` have x's shape
    without ``axis``. With ``return_trace=True`` returns ``(p, state, trace)``
    where ``trace[t]`` is the state after block t (for figures).

    Like a kernel, it keeps the statistics in at least float32 (fp16 input gets
    fp32 m and l); p is returned in x's dtype.
    """
    x = _check_scores(x)
    block_size = check_count(block_size, "block_size", 1)
    axis = _check_axis(axis, x.ndim)
    xs = np.moveaxis(x, axis, -1).astype(np.promote_types(x.dtype, np.float32), copy=False)
    state = empty_state(xs.shape[:-1], dtype=xs.dtype)
    trace = []
    for start in range(0, xs.shape[-1], block_size):
        state = merge(state, block_state(xs[..., start:start + block_size]))
        trace.append(state)
    p = np.exp(xs - _finite_or_zero(state.row_max)[..., None])
    l = state.row_sum[..., None]
    p = np.divide(p, l, out=np.zeros_like(p), where=l > 0).astype(x.dtype, copy=False)
    p = np.moveaxis(p, -1, axis)
    return (p, state, trace) if return_trace else (p, state)


# ----------------------------------------------------------------- chapter 2's worked example

@dataclass(frozen=True, eq=False)
class TraceStep:
    """One step of the online pass of one query over a block of keys.

    keys:    the key indices j of this block
    dot:     q . k_j for those keys
    score:   s_j = scale * q . k_j
    row_max: m after this block, max(m_old, max_j s_j)
    rescale: exp(m_old - m), the factor applied to the old l and o
             (0 on the first step: there is nothing old yet)
    weight:  exp(s_j - m), this block's contribution before normalising
    row_sum: l = rescale * l_old + sum_j weight_j
    acc:     o = rescale * o_old + sum_j weight_j v_j
    """

    keys: range
    dot: np.ndarray
    score: np.ndarray
    row_max: float
    rescale: float
    weight: np.ndarray
    row_sum: float
    acc: np.ndarray

    @property
    def output(self) -> np.ndarray:
        """o / l: the attention output over the keys seen so far."""
        return self.acc / self.row_sum


def online_attention_trace(q_row, k, v, *, scale=None, block_k: int = 1) -> list[TraceStep]:
    """One query's attention, computed online over blocks of ``block_k`` keys (float64).

    ``q_row`` is (d,), ``k`` is (N_k, d), ``v`` is (N_k, d_v). Each step is the
    update a FlashAttention kernel makes in its inner loop:

        m_new = max(m, max_j s_j)
        l     = exp(m - m_new) l + sum_j exp(s_j - m_new)
        o     = exp(m - m_new) o + sum_j exp(s_j - m_new) v_j

    which equals ``merge(state, block_state(s, v))`` with one exp fewer.
    ``trace[-1].output`` is the row of softmax(scale q K^T) V.
    """
    q_row = np.asarray(q_row)
    if q_row.ndim != 1:
        raise ValueError(f"q_row must be one query vector of shape (d,), got shape {q_row.shape}")
    q2, k, v, scale = check_qkv(q_row[None, :], k, v, scale)  # k, v: (N_k, d), (N_k, d_v)
    block_k = check_count(block_k, "block_k", 1)
    q_row, k, v = (x.astype(np.float64) for x in (q2[0], k, v))
    m, l, o = -np.inf, 0.0, np.zeros(v.shape[-1])
    steps = []
    for start in range(0, k.shape[0], block_k):
        keys = range(start, min(start + block_k, k.shape[0]))
        dot = k[start:keys.stop] @ q_row
        s = scale * dot
        m_new = max(m, float(s.max()))
        rescale = float(np.exp(m - m_new))    # exp(-inf) = 0 on the first step
        p = np.exp(s - m_new)                 # every exponent <= 0
        l = rescale * l + float(p.sum())
        o = rescale * o + p @ v[start:keys.stop]
        m = m_new
        steps.append(TraceStep(keys, dot, s, m, rescale, p, l, o.copy()))
    return steps
