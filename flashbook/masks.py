"""Masks beyond causal, in NumPy: windows, soft-capping, documents, prefixes.

The causal mask of chapter 1 is one rule about which key j a query row i may see.
Real models use a few more, and FlashAttention supports each of them by the same
trick: a tile of the score matrix that the rule hides entirely is never computed.
This module is the float64 truth for those rules, and the bookkeeping that says
how many tiles each one lets a kernel skip.

The conventions are flash-attn's, so that code written against it carries over:

* **Alignment.** Query row i (0..N_q-1) and key column j (0..N_k-1) are aligned at
  the bottom-right corner: with ``diag = N_k - N_q``, row i's own position among
  the keys is ``i + diag``. Causal means ``j <= i + diag`` (``reference.causal_mask``).
* **Sliding window** ``window=(left, right)``: row i sees key j when
  ``i + diag - left <= j <= i + diag + right``. A side given as -1 has no limit;
  ``(-1, -1)`` is no window. Under ``causal=True`` the right side is 0 whatever was
  asked (flash-attn sets ``window_size_right = 0``), so causal + ``(left, r)`` is a
  causal band of ``left + 1`` keys.
* **Soft-capping** ``softcap=c``: each scaled score s = scale * q.k becomes
  ``c * tanh(s / c)`` before the softmax (Gemma 2, Grok). Scores stay in (-c, c).
* **Documents** ``doc_ids_q``, ``doc_ids_k``: several sequences packed into one
  (flash-attn's "varlen" with ``cu_seqlens``). Row i sees key j only when both
  belong to the same document, and causal, window and prefix are measured from
  each document's own start with each document's own bottom-right alignment,
  exactly as if it were attended to alone. ``doc_ids_from_cu_seqlens`` turns
  ``cu_seqlens`` into these ids.
* **Prefix-LM** ``prefix=p``: the first p keys (of each document) are visible to
  every row, whatever the causal or window rule says: a bidirectional prompt
  followed by causal generation.
* **ALiBi** ``alibi_slopes``: a bias, not a mask (Press et al. 2022; flash-attn's
  ``alibi_slopes``): the score of row i and key j gets ``-slope * |i + diag - j|``,
  one slope per head (or per batch entry and head), positions and diag per document.
  It is added after the soft cap, uncapped, as flash-attn's kernels add it
  (Dao-AILab/flash-attention, csrc/flash_attn/src/flash_fwd_kernel.h as of commit
  0251105: ``apply_softcap``, then the mask of mask.h that adds the bias, with the slope
  divided by the softmax scale there; the backward takes tanh's derivative before it).

A row that sees no key at all attends to nothing: its output is 0 and its
logsumexp is -inf, never NaN.

1. the arguments, checked     ``check_window``, ``check_softcap``, ``check_alibi``, ``doc_ids_from_cu_seqlens``
2. the rule                   ``allowed``
3. forward and backward       ``attention``, ``attention_backward``
4. what a kernel may skip     ``tile_kinds``, ``tile_counts``
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import reference, softmax, tiled
from .validation import check_count, check_flag

__all__ = ["check_window", "check_softcap", "check_alibi", "check_prefix", "check_cu_seqlens",
           "doc_ids_from_cu_seqlens", "allowed", "alibi_bias", "attention", "attention_backward", "tile_kinds",
           "tile_counts", "kind_counts"]

NO_WINDOW = (-1, -1)


# ============================================================ 1. the arguments, checked

def check_window(window) -> tuple[int, int]:
    """``window`` as a pair of Python ints ``(left, right)``; None means ``(-1, -1)``.

    Each side is a count of keys >= 0, or -1 for no limit on that side. Other
    negative numbers are refused: flash-attn reads any of them as "no limit", which
    hides typos such as -5.
    """
    if window is None:
        return NO_WINDOW
    if isinstance(window, np.ndarray) and window.ndim == 1:
        window = tuple(window.tolist())
    if not isinstance(window, (tuple, list)):
        raise TypeError(f"window must be a pair (left, right) of ints (-1 for no limit), "
                        f"got {type(window).__name__} {window!r}")
    if len(window) != 2:
        raise ValueError(f"window must be a pair (left, right), got {len(window)} "
                         f"values: {tuple(window)!r}")
    sides = []
    for side, value in enumerate(window):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"window[{side}] must be an int (-1 for no limit), "
                            f"got {type(value).__name__} {value!r}")
        if value < -1:
            raise ValueError(f"window[{side}] = {value}: use -1 for no limit, "
                             f"or a count >= 0")
        sides.append(int(value))
    return sides[0], sides[1]


def check_softcap(softcap) -> float | None:
    """``softcap`` as a float c > 0, or None when it is off (None or 0)."""
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number > 0, or None or 0 for off, "
                        f"got {type(softcap).__name__} {softcap!r}")
    if softcap == 0:
        return None
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number > 0 (or None or 0 for off), "
                         f"got {softcap}")
    return float(softcap)


def check_alibi(alibi_slopes, lead: tuple = ()) -> np.ndarray | None:
    """``alibi_slopes`` as a float64 array of shape ``(*shape, 1, 1)``, to broadcast against
    scores (..., N_q, N_k); None when off. Its shape must be the last dimensions of ``lead``
    (q's dimensions before (N_q, d)): (heads,) or (batch, heads) for q (batch, heads, N, d)
    as flash-attn takes them, or () for one slope everywhere."""
    if alibi_slopes is None:
        return None
    arr = np.asarray(alibi_slopes)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"alibi_slopes must be real numbers (one per head), got dtype {arr.dtype}")
    lead = tuple(lead)
    if arr.ndim > len(lead) or arr.shape != lead[len(lead) - arr.ndim:]:
        raise ValueError(f"alibi_slopes must have shape (heads,) or (batch, heads), the last of q's leading "
                         f"dimensions {lead}, got {arr.shape}")
    return arr.astype(np.float64).reshape(arr.shape + (1, 1))


def check_prefix(prefix) -> int:
    """``prefix`` (prefix-LM: keys every row sees) as an int >= 0; None means 0 (none)."""
    return 0 if prefix is None else check_count(prefix, "prefix", 0)


def _int_vector(x, name: str) -> np.ndarray:
    """``x`` as a 1-D integer array; bool and float are refused."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        if arr.size == 0:   # np.asarray([]) is float64: an empty list is still integers
            return arr.astype(np.int64)
        raise TypeError(f"{name} must be an array of integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _nondecreasing(arr: np.ndarray, name: str) -> np.ndarray:
    drops = np.flatnonzero(np.diff(arr) < 0)
    if drops.size:
        at = int(drops[0]) + 1
        raise ValueError(f"{name} must be nondecreasing, but {name}[{at}] = {arr[at]} "
                         f"< {name}[{at - 1}] = {arr[at - 1]}")
    return arr


def check_cu_seqlens(cu_seqlens, name: str = "cu_seqlens", total: int | None = None) -> np.ndarray:
    """flash-attn's ``cu_seqlens`` as a 1-D int64 array, checked: integers, starting at 0,
    nondecreasing, and ending at ``total`` (the packed length) when it is given."""
    cu = _int_vector(cu_seqlens, name)
    if cu.size == 0:
        raise ValueError(f"{name} must hold at least one value (0, for no document), got an empty tensor")
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {int(cu[0])}")
    _nondecreasing(cu, name)
    if total is not None and cu[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total}, got {int(cu[-1])} (rows after the "
                         f"last document are not allowed: every row belongs to one)")
    return cu


def doc_ids_from_cu_seqlens(cu_seqlens, name: str = "cu_seqlens") -> np.ndarray:
    """Per-token document ids from flash-attn's ``cu_seqlens``.

    ``cu_seqlens = [0, 3, 3, 7]`` packs documents of lengths 3, 0 and 4 and gives
    ``[0, 0, 0, 2, 2, 2, 2]``: token t belongs to document b when
    ``cu_seqlens[b] <= t < cu_seqlens[b + 1]``. Ids from ``cu_seqlens_q`` and
    ``cu_seqlens_k`` of one batch therefore name the same documents.
    """
    cu = check_cu_seqlens(cu_seqlens, name)
    return np.repeat(np.arange(cu.size - 1), np.diff(cu))


def random_documents(n: int, seed: int, shortest: int = 256) -> np.ndarray:
    """cu_seqlens of documents of mixed lengths that fill ``n`` tokens: lengths drawn
    log-uniform between ``shortest`` and n / 2 from ``numpy.random.default_rng(seed)``, the last
    one cut to fit (the packed documents of ``benchmarks/masks_bench.py`` and the lab notes)."""
    rng = np.random.default_rng(seed)
    cuts, total = [0], 0
    while total < n:
        length = int(np.exp(rng.uniform(np.log(shortest), np.log(max(shortest, n // 2)))))
        total = min(n, total + length)
        cuts.append(total)
    return np.array(cuts, dtype=np.int32)


def _check_doc_ids(doc_ids, name: str, n: int) -> np.ndarray:
    ids = _int_vector(doc_ids, name)
    if ids.size != n:
        what = "n_q" if name.endswith("_q") else "n_k"
        raise ValueError(f"{name} must have one id per token ({what} = {n}), "
                         f"got {ids.size}")
    return _nondecreasing(ids, name)


# ============================================================ 2. the rule

def _layout(n_q, n_k, doc_ids_q, doc_ids_k):
    """Where each token sits: per query row (document, position, diag), per key
    (document, position). Positions count from the token's own document start;
    diag is the document's own N_k - N_q. ``None`` documents when there are none."""
    if doc_ids_q is None and doc_ids_k is None:
        return None, np.arange(n_q), np.full(n_q, n_k - n_q), None, np.arange(n_k)
    if doc_ids_q is None or doc_ids_k is None:
        missing = "doc_ids_q" if doc_ids_q is None else "doc_ids_k"
        raise ValueError(f"doc_ids_q and doc_ids_k go together: {missing} is missing")
    ids_q = _check_doc_ids(doc_ids_q, "doc_ids_q", n_q)
    ids_k = _check_doc_ids(doc_ids_k, "doc_ids_k", n_k)
    start_q = np.searchsorted(ids_q, ids_q, side="left")
    length_q = np.searchsorted(ids_q, ids_q, side="right") - start_q
    length_k = (np.searchsorted(ids_k, ids_q, side="right")     # keys of row i's document
                - np.searchsorted(ids_k, ids_q, side="left"))
    pos_k = np.arange(n_k) - np.searchsorted(ids_k, ids_k, side="left")
    return ids_q, np.arange(n_q) - start_q, length_k - length_q, ids_k, pos_k


def _rule(causal, window, prefix):
    """The checked (left, right, prefix); under causal the right side is 0."""
    left, right = check_window(window)
    if check_flag(causal, "causal"):
        right = 0
    return left, right, check_prefix(prefix)


def _visible(layout, rows, cols, left, right, prefix) -> np.ndarray:
    """The rule on one block of rows x cols: True where row i may see key j."""
    docs_q, pos_q, diag, docs_k, pos_k = layout
    i = (pos_q[rows] + diag[rows])[:, None]     # row i's own position among its keys
    j = pos_k[cols][None, :]
    ok = np.ones((i.shape[0], j.shape[1]), dtype=bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    if prefix:
        ok |= j < prefix
    if docs_q is not None:
        ok &= docs_q[rows][:, None] == docs_k[cols][None, :]
    return ok


def allowed(n_q: int, n_k: int, *, causal: bool = False, window=NO_WINDOW, prefix: int = 0,
            doc_ids_q=None, doc_ids_k=None) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may attend to key j.

    All the rules of the module docstring at once: within the same document, row i
    sees key j when the window (with causal, right side 0) admits it or when j is
    one of the document's first ``prefix`` keys. No rule given: everything.
    """
    n_q, n_k = check_count(n_q, "n_q", 0), check_count(n_k, "n_k", 0)
    left, right, prefix = _rule(causal, window, prefix)
    layout = _layout(n_q, n_k, doc_ids_q, doc_ids_k)
    return _visible(layout, slice(None), slice(None), left, right, prefix)


# ============================================================ 3. forward and backward

def _capped_scores(q, k, scale, softcap, bias=None):
    """(pre-cap scores s, the scores the softmax sees: capped, plus ``bias``, tanh(s / c) or None)."""
    s = reference.scores(q, k, scale=scale)
    t = None if softcap is None else np.tanh(s / softcap)
    seen = s if t is None else softcap * t
    return s, seen if bias is None else seen + bias, t


def alibi_bias(alibi_slopes, lead, n_q: int, n_k: int, doc_ids_q=None, doc_ids_k=None):
    """ALiBi's bias (..., N_q, N_k), -slope * |i + diag - j| with positions and diag per
    document (``_layout``), float64; None without slopes (``check_alibi``)."""
    slopes = check_alibi(alibi_slopes, lead)
    if slopes is None:
        return None
    _, pos_q, diag, _, pos_k = _layout(n_q, n_k, doc_ids_q, doc_ids_k)
    return -slopes * np.abs((pos_q + diag)[:, None] - pos_k[None, :])


def _prepare(q, k, v, scale, causal, window, softcap, prefix, doc_ids_q, doc_ids_k, alibi_slopes=None):
    q, k, v, scale = reference.check_qkv(q, k, v, scale)
    softcap = check_softcap(softcap)
    mask = allowed(q.shape[-2], k.shape[-2], causal=causal, window=window, prefix=prefix,
                   doc_ids_q=doc_ids_q, doc_ids_k=doc_ids_k)
    bias = alibi_bias(alibi_slopes, q.shape[:-2], q.shape[-2], k.shape[-2], doc_ids_q, doc_ids_k)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    return q, k, v, scale, softcap, mask, bias


def attention(q, k, v, *, causal: bool = False, window=NO_WINDOW, softcap=None, scale=None,
              prefix: int = 0, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None, return_lse: bool = False):
    """O = softmax(cap(scale * Q K^T) + bias, restricted to ``allowed``) V, in float64.

    q is (..., N_q, d), k is (..., N_k, d), v is (..., N_k, d_v), leading dimensions
    equal (as ``reference.attention``); the mask is the same for all of them. With
    ``return_lse`` also the logsumexp (..., N_q) of the scores the softmax sees. A row
    that sees no key gets o = 0 and lse = -inf. ``alibi_slopes``: ALiBi's bias, one slope
    per head, (heads,) or (batch, heads) for q (batch, heads, N_q, d) (``check_alibi``).
    """
    q, k, v, scale, softcap, mask, bias = _prepare(q, k, v, scale, causal, window, softcap,
                                                   prefix, doc_ids_q, doc_ids_k, alibi_slopes)
    _, s, _ = _capped_scores(q, k, scale, softcap, bias)
    o = reference.softmax_rows(s, mask) @ v
    if check_flag(return_lse, "return_lse"):
        return o, softmax.logsumexp(np.where(mask, s, -np.inf))   # -inf for a row that sees no key
    return o


def attention_backward(q, k, v, do, *, causal: bool = False, window=NO_WINDOW, softcap=None,
                       scale=None, prefix: int = 0, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None):
    """Analytic gradients (dq, dk, dv) of ``attention`` for an upstream gradient ``do``.

    As ``reference.attention_backward``, with one more link in the chain for the cap.
    With s the scaled score and t = tanh(s / c), the capped score is c t, whose
    derivative is 1 - t^2:

        dV = P^T dO,   dP = dO V^T,   delta = rowsum(dO * O)
        dS_capped = P * (dP - delta)
        dS = dS_capped * (1 - t^2)            (just dS_capped without a cap)
        dQ = scale * dS K,   dK = scale * dS^T Q

    Masked entries have P = 0, so they pass no gradient. ALiBi's bias does not depend on
    q or k: it changes P, and nothing else in these formulas (the cap's 1 - t^2 is taken
    before the bias is added).
    """
    q, k, v, scale, softcap, mask, bias = _prepare(q, k, v, scale, causal, window, softcap,
                                                   prefix, doc_ids_q, doc_ids_k, alibi_slopes)
    do = reference.check_array(do, "do", shape=q.shape[:-1] + (v.shape[-1],))
    do = do.astype(np.float64)
    _, s, t = _capped_scores(q, k, scale, softcap, bias)
    p = reference.softmax_rows(s, mask)
    return reference.gradients(p, q, k, v, do, scale=scale, score_slope=None if t is None else 1.0 - t * t)


# ============================================================ 4. what a kernel may skip

def tile_kinds(n_q: int, n_k: int, block_q: int, block_k: int, *, causal: bool = False,
               window=NO_WINDOW, prefix: int = 0, doc_ids_q=None, doc_ids_k=None) -> np.ndarray:
    """A (T_r, T_c) array of "full", "partial" (needs the mask) or "skipped" per tile.

    A tile is skipped when the rule hides all of it, full when it hides none of its
    entries (rows < N_q, keys < N_k: a ragged tile is judged on what it holds), and
    partial otherwise. The rule is evaluated one row of tiles at a time (B_r x N_k
    entries), so no N_q x N_k array is built. With ``causal`` alone it equals
    ``tiled.tile_kinds``.
    """
    n_q, n_k = check_count(n_q, "n_q", 0), check_count(n_k, "n_k", 0)
    block_q, block_k = check_count(block_q, "block_q"), check_count(block_k, "block_k")
    left, right, prefix = _rule(causal, window, prefix)
    layout = _layout(n_q, n_k, doc_ids_q, doc_ids_k)
    row_tiles = tiled.tile_slices(n_q, block_q)
    kinds = np.full((len(row_tiles), -(-n_k // block_k)), "skipped", dtype="<U7")
    for a, rows in enumerate(row_tiles):
        kinds[a] = kinds_of(_visible(layout, rows, slice(None), left, right, prefix), block_q, block_k)[0]
    return kinds


def kinds_of(ok: np.ndarray, block_q: int, block_k: int) -> np.ndarray:
    """``tile_kinds`` of a boolean (rows, keys) array that is already built (``allowed``, or
    one row of tiles of it): "full", "partial" or "skipped" per block_q x block_k tile, a
    ragged last tile judged on what it holds. Each tile's allowed entries are counted (keys
    first, along the rows in memory, then rows; a ragged edge padded with zeros): a tile is
    full when it counts all of its entries."""
    rows, keys = ok.shape
    t_r, t_c = -(-rows // block_q), -(-keys // block_k)
    counts = np.ascontiguousarray(ok, dtype=bool).view(np.uint8)
    if t_r * block_q != rows or t_c * block_k != keys:
        counts = np.pad(counts, ((0, t_r * block_q - rows), (0, t_c * block_k - keys)))
    counts = counts.reshape(t_r * block_q, t_c, block_k).sum(axis=2, dtype=np.int32)
    counts = counts.reshape(t_r, block_q, t_c).sum(axis=1)
    heights = np.minimum(block_q, rows - block_q * np.arange(t_r))
    widths = np.minimum(block_k, keys - block_k * np.arange(t_c))
    return np.where(counts == heights[:, None] * widths[None, :], "full",
                    np.where(counts > 0, "partial", "skipped"))


def tile_counts(n_q: int, n_k: int, block_q: int, block_k: int, *, causal: bool = False,
                window=NO_WINDOW, prefix: int = 0, doc_ids_q=None, doc_ids_k=None) -> dict:
    """How many tiles of each kind ``tile_kinds`` finds, and the share left to compute.

    Keys: ``skipped``, ``full``, ``partial``, ``visited`` (full + partial: the tiles
    a kernel computes), ``total`` and ``work_fraction`` (visited / total; 0.0 when
    there are no tiles). The arguments are those of ``tile_kinds``.
    """
    return kind_counts(tile_kinds(n_q, n_k, block_q, block_k, causal=causal, window=window,
                                  prefix=prefix, doc_ids_q=doc_ids_q, doc_ids_k=doc_ids_k))


def kind_counts(kinds: np.ndarray) -> dict:
    """``tile_counts``' dict for a (T_r, T_c) array of ``tile_kinds``."""
    counts = {kind: int(np.count_nonzero(kinds == kind))
              for kind in ("skipped", "full", "partial")}
    counts["visited"] = counts["full"] + counts["partial"]
    counts["total"] = int(kinds.size)
    counts["work_fraction"] = counts["visited"] / kinds.size if kinds.size else 0.0
    return counts
