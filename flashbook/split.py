"""Split-K attention in NumPy: the keys cut into splits, each attended to on its own,
the partial results combined with chapter 3's merge (chapter 11).

A query that reads a long sequence of keys (one new token against a long KV cache)
gives a GPU too little parallel work if one program walks all the keys. Cut the
keys into ``num_splits`` contiguous ranges instead: each split computes the
attention of the queries over its own keys alone, an output ``o_s`` and the
logsumexp ``lse_s`` of its scores, independently of the others. Then

    o = sum_s exp(lse_s - lse) o_s,    lse = log sum_s exp(lse_s)

which is ``softmax.merge`` applied to the states (m, l, o) = (lse_s, 1, o_s): a
normalised result is the state whose reference point is its own logsumexp.

Splits are ``ceil(N_k / num_splits)`` keys long, the last one shorter; with more
splits than keys (or a causal mask that hides a split from some rows) a split sees
no key: its state is (-inf, 0, 0), merge's identity, and it changes nothing.

This is how ``split_forward`` is reached in the book: ``flashbook.tiled.split_forward``.
"""
from __future__ import annotations

import functools

import numpy as np

from .reference import causal_mask, check_qkv, scores
from .softmax import SoftmaxState, block_state, merge
from .validation import check_count, check_flag


def split_bounds(n_k: int, num_splits: int) -> list[range]:
    """The key range of each split: ``num_splits`` contiguous ranges of
    ``ceil(n_k / num_splits)`` keys, the last ones shorter or empty (``tile_split_bounds``
    with tiles of one key)."""
    return tile_split_bounds(n_k, num_splits, 1)


def tile_split_bounds(n_k: int, num_splits: int, block: int) -> list[range]:
    """The key range of each split as ``flash_decode``'s kernel cuts them: ``num_splits``
    contiguous ranges of ``ceil(n_k / num_splits)`` keys rounded up to whole key tiles of
    ``block`` keys, so that only a sequence's last tile is ragged (some last splits may be
    empty)."""
    n_k, num_splits, block = (check_count(n_k, "n_k", 0), check_count(num_splits, "num_splits"),
                              check_count(block, "block"))
    per_split = -(-n_k // num_splits)          # ceil(n_k / num_splits)
    size = -(-per_split // block) * block      # rounded up to whole tiles
    return [range(min(s * size, n_k), min((s + 1) * size, n_k)) for s in range(num_splits)]


def split_partials(q, k, v, *, num_splits: int, causal: bool = False, scale=None):
    """Each split's own (o_s, lse_s), float64: the attention of every query over that
    split's keys alone (o_s = 0 and lse_s = -inf for a row that sees none of them)."""
    q, k, v, scale = check_qkv(q, k, v, scale)
    causal = check_flag(causal, "causal")
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)
    partials = []
    for keys in split_bounds(n_k, num_splits):
        cols = slice(keys.start, keys.stop)
        s = np.where(allowed[:, cols], scores(q, k[..., cols, :], scale=scale), -np.inf)
        state = block_state(s, v[..., None, cols, :])  # every query row shares the values
        partials.append((state.output(), state.lse))
    return partials


def as_state(o, lse) -> SoftmaxState:
    """A normalised result (o, lse) as a softmax state: (m, l, o) = (lse, 1, o), or
    (-inf, 0, 0) for a row that saw no key."""
    seen = np.isfinite(lse)
    return SoftmaxState(lse, seen.astype(np.float64), o)


def combine(partials) -> tuple[np.ndarray, np.ndarray]:
    """Merge the splits' (o_s, lse_s) into the (o, lse) of all the keys together."""
    state = functools.reduce(merge, (as_state(o, lse) for o, lse in partials))
    return state.output(), state.lse


def split_forward(q, k, v, *, num_splits: int, causal: bool = False, scale=None):
    """Attention over ``num_splits`` splits of the keys, combined: returns (o, lse), float64.

    Same shapes and meaning as ``tiled.forward``: q is (..., N_q, d), k and v are
    (..., N_k, d) and (..., N_k, d_v); ``causal`` is bottom-right aligned; ``lse`` is
    the natural-log logsumexp of each scaled row (-inf, with o = 0, for a row that
    sees no key). Any ``num_splits >= 1`` gives the same result, up to rounding.
    """
    return combine(split_partials(q, k, v, num_splits=num_splits, causal=causal, scale=scale))
