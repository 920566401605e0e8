"""FlashAttention in NumPy: the forward pass over tiles (chapter 4), the backward
pass with recomputation (chapter 5), and the bookkeeping that says what each costs.

The GPU picture this code simulates
-----------------------------------
Q, K, V and O live in HBM: large and slow. A *program* (a CUDA thread block)
copies tiles of them into on-chip memory (shared memory and registers, "SRAM"),
works there, and writes its results back. Here "HBM" is the full NumPy arrays
and "on chip" is the tile-sized arrays a loop holds. Pass an ``IOCounter`` as
``io=`` and it counts every element that crosses between the two, the matrix
multiplications, and the largest set of tiles one program holds at once.

The N_q x N_k score matrix S = scale * Q K^T is cut into T_r x T_c tiles:
``block_q`` (B_r) query rows by ``block_k`` (B_c) key rows. The last row and
column of tiles are ragged when N is not a multiple of the block. S is never
built whole: at any moment one B_r x B_c tile of it exists.

Everything is computed in float64, like ``flashbook.reference``, so that the
comparison tests the algorithm and not the rounding.

The module follows the book:

1. tiles, and which ones a causal mask lets us skip   ``tile_slices``, ``tile_schedule``
2. the counter (``flashbook.io_counter``)             ``IOCounter``, ``IOStats``
3. forward, FlashAttention-2 order (Q tiles outer)     ``forward(order="fa2")``
4. forward, FlashAttention-1 order (K/V tiles outer)   ``forward(order="fa1")``
5. backward, recomputing P from Q, K and lse           ``backward``
6. the same counts in closed form                      ``io_naive``, ``io_flash``, ...
"""
from __future__ import annotations

import math

import numpy as np

from .io_counter import IOCounter, IOStats, as_counter, buffer_bytes, merge_counts, nonzero_counts
from .reference import check_array, check_qkv
from .smem import TILE_DS, largest_tile, smem_bytes, tile_d  # noqa: F401
from .validation import check_choice, check_count, check_flag

ORDERS = ("fa2", "fa1")                       # forward loop orders
DQ_STRATEGIES = ("atomic", "second_pass")    # how the backward accumulates dQ


# ============================================================ 1. tiles and the causal mask

def tile_slices(n: int, block: int) -> list[slice]:
    """The tiles of a length-n axis: ``ceil(n / block)`` slices, the last one ragged."""
    n, block = check_count(n, "n", 0), check_count(block, "block")
    return [slice(start, min(start + block, n)) for start in range(0, n, block)]


def visible_key_tiles(n_q: int, n_k: int, block_q: int, block_k: int,
                      causal: bool = False) -> list[int]:
    """For each query tile i, how many key tiles it must visit: J_i.

    Without a mask, all of them. With the causal mask, query row r sees keys
    j <= r + (N_k - N_q) (bottom-right aligned), so query tile i, whose last row
    is r1 - 1, sees a *prefix* of the key tiles: those starting at or before key
    r1 - 1 + (N_k - N_q). Tiles past the prefix are wholly masked and skipped.
    """
    n_k_tiles = len(tile_slices(n_k, block_k))
    if not causal:
        return [n_k_tiles] * len(tile_slices(n_q, block_q))
    counts = []
    for rows in tile_slices(n_q, block_q):
        last_key = rows.stop - 1 + (n_k - n_q)     # the last key this tile's last row may see
        counts.append(0 if last_key < 0 else min(last_key // block_k + 1, n_k_tiles))
    return counts


def tile_mask(rows: slice, cols: slice, n_q: int, n_k: int) -> np.ndarray:
    """The causal mask of one tile: True where query i may attend to key j.

    The same rule as ``reference.causal_mask``, j <= i + (N_k - N_q), evaluated for
    this tile's rows and columns only, so no N_q x N_k array is ever built.
    """
    i = np.arange(rows.start, rows.stop)[:, None]
    j = np.arange(cols.start, cols.stop)[None, :]
    return j <= i + (n_k - n_q)


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, *,
                  causal: bool = False, order: str = "fa2") -> list[tuple[int, int]]:
    """The tiles (i, j) in the order the forward loop visits them.

    ``"fa2"``: query tiles outer, key tiles inner (row by row);
    ``"fa1"``: key tiles outer, query tiles inner (column by column).
    Wholly masked tiles never appear. The backward's main loop uses the "fa1" order.
    """
    check_choice(order, "order", ORDERS)
    counts = visible_key_tiles(check_count(n_q, "n_q", 0), check_count(n_k, "n_k", 0),
                               check_count(block_q, "block_q"), check_count(block_k, "block_k"),
                               check_flag(causal, "causal"))
    if order == "fa2":
        return [(i, j) for i, n_j in enumerate(counts) for j in range(n_j)]
    n_k_tiles = len(tile_slices(n_k, block_k))
    return [(i, j) for j in range(n_k_tiles) for i, n_j in enumerate(counts) if j < n_j]


def tile_kinds(n_q: int, n_k: int, block_q: int, block_k: int, *,
               causal: bool = False) -> np.ndarray:
    """A (T_r, T_c) array of "full", "partial" (needs the mask) or "skipped" per tile."""
    counts = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    row_tiles, col_tiles = tile_slices(n_q, block_q), tile_slices(n_k, block_k)
    kinds = np.full((len(row_tiles), len(col_tiles)), "skipped", dtype="<U7")
    for i, rows in enumerate(row_tiles):
        for j in range(counts[i]):
            # the tile is fully visible when its last key is visible to its first row
            full = not causal or col_tiles[j].stop - 1 <= rows.start + (n_k - n_q)
            kinds[i, j] = "full" if full else "partial"
    return kinds


def _mask_scores(s: np.ndarray, rows: slice, cols: slice, n_q: int, n_k: int) -> np.ndarray:
    allowed = tile_mask(rows, cols, n_q, n_k)
    return s if allowed.all() else np.where(allowed, s, -np.inf)


# ============================================================ shared pieces of the loops

def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _no_inf(m: np.ndarray) -> np.ndarray:
    """-inf (a row that has seen no key yet) -> 0, so that exp(s - m) stays exp(-inf) = 0
    instead of exp(-inf - (-inf)) = NaN."""
    return np.where(m == -np.inf, 0.0, m)


def _normalise(acc: np.ndarray, row_sum: np.ndarray) -> np.ndarray:
    """acc / l, row by row; a row that saw no key (l = 0) gives zeros. A NaN in l stays
    NaN (the test is l != 0, not l > 0, which NaN fails): a bug must show, not become 0."""
    l = row_sum[..., None]
    return np.divide(acc, l, out=np.zeros_like(acc), where=l != 0)


def _lse(row_max: np.ndarray, row_sum: np.ndarray) -> np.ndarray:
    """lse = m + log(l); a row that saw no key (l = 0) gets -inf, and a NaN stays NaN."""
    seen = row_sum != 0
    return np.where(seen, row_max + np.log(np.where(seen, row_sum, 1.0)), -np.inf)


def _flatten(x: np.ndarray) -> np.ndarray:
    """(..., N, d) -> (programs, N, d): the leading dimensions become one axis."""
    return x.reshape((-1,) + x.shape[-2:]).astype(np.float64, copy=False)


# ============================================================ 3. forward, FlashAttention-2 order

def _forward_fa2(q, k, v, scale, causal, block_q, block_k, io):
    """Outer loop over query tiles; each keeps O_i, m_i, l_i on chip and divides once."""
    programs, n_q, _ = q.shape
    n_k, d_v = v.shape[-2:]
    o = np.zeros((programs, n_q, d_v))
    lse = np.full((programs, n_q), -np.inf)
    n_visible = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    key_tiles = tile_slices(n_k, block_k)
    for i, rows in enumerate(tile_slices(n_q, block_q)):
        with io.program():  # on a GPU: one program per (batch, head, query tile), in parallel
            h = rows.stop - rows.start
            q_i = io.read("Q", q[:, rows])
            row_max = io.hold("m", np.full((programs, h), -np.inf))  # m: running max
            row_sum = io.hold("l", np.zeros((programs, h)))          # l: running sum of exp(s - m)
            acc = io.hold("O", np.zeros((programs, h, d_v)))         # O_i, not yet divided by l
            for j in range(n_visible[i]):       # tiles past n_visible[i] are wholly masked
                cols = key_tiles[j]
                k_j = io.read("K", k[:, cols])
                v_j = io.read("V", v[:, cols])
                s = io.hold("S/P", scale * io.matmul(q_i, _t(k_j)))  # S_ij = scale Q_i K_j^T
                if causal:
                    s = _mask_scores(s, rows, cols, n_q, n_k)
                m_new = np.maximum(row_max, s.max(axis=-1))          # m_new = max(m, rowmax(S_ij))
                p = io.hold("S/P", np.exp(s - _no_inf(m_new)[..., None]))  # P_ij = exp(S_ij - m_new)
                alpha = np.exp(row_max - _no_inf(m_new))             # old statistics, rescaled
                row_sum = alpha * row_sum + p.sum(axis=-1)           # l = alpha l + rowsum(P_ij)
                acc = alpha[..., None] * acc + io.matmul(p, v_j)     # O_i = alpha O_i + P_ij V_j
                row_max = m_new
                io.visit(i, j, rows, row_max, row_sum)
            o[:, rows] = io.write("O", _normalise(acc, row_sum))     # the one division, at the end
            lse[:, rows] = io.write("lse", _lse(row_max, row_sum))
    return o, lse


# ============================================================ 4. forward, FlashAttention-1 order

def _forward_fa1(q, k, v, scale, causal, block_q, block_k, io):
    """Algorithm 1 of Dao et al. (2022): outer loop over K/V tiles.

    O, m and l live in HBM: every visit of a tile reads O_i, m_i, l_i and writes them
    back, kept normalised (divided by l) after every step. The paper returns m and l;
    our API returns lse = m + log l, one extra elementwise pass at the end.
    """
    programs, n_q, _ = q.shape
    n_k, d_v = v.shape[-2:]
    n_visible = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    row_tiles = tile_slices(n_q, block_q)
    with io.program():  # one program per (batch, head); its loops run in sequence
        o = io.write("O", np.zeros((programs, n_q, d_v)))                # line 2: O = 0,
        row_sum = io.write("l", np.zeros((programs, n_q)))               #   l = 0,
        row_max = io.write("m", np.full((programs, n_q), -np.inf))       #   m = -inf, in HBM
        for j, cols in enumerate(tile_slices(n_k, block_k)):
            k_j = io.read("K", k[:, cols])                               # line 6
            v_j = io.read("V", v[:, cols])
            for i, rows in enumerate(row_tiles):
                if j >= n_visible[i]:
                    continue                                             # wholly masked: skip
                q_i = io.read("Q", q[:, rows])                           # line 8
                o_i = io.read("O", o[:, rows])
                l_i = io.read("l", row_sum[:, rows])
                m_i = io.read("m", row_max[:, rows])
                s = io.hold("S/P", scale * io.matmul(q_i, _t(k_j)))      # line 9
                if causal:
                    s = _mask_scores(s, rows, cols, n_q, n_k)
                m_tile = s.max(axis=-1)                                  # line 10: this tile's
                p = io.hold("S/P", np.exp(s - _no_inf(m_tile)[..., None]))  # own max, P and sum
                l_tile = p.sum(axis=-1)
                m_new = np.maximum(m_i, m_tile)                          # line 11
                alpha = np.exp(m_i - _no_inf(m_new))
                beta = np.exp(m_tile - _no_inf(m_new))
                l_new = alpha * l_i + beta * l_tile
                o_new = _normalise((l_i * alpha)[..., None] * o_i        # line 12: rescale, add,
                                   + beta[..., None] * io.matmul(p, v_j), l_new)  # and divide
                o[:, rows] = io.write("O", o_new)                        # lines 12-13
                row_sum[:, rows] = io.write("l", l_new)
                row_max[:, rows] = io.write("m", m_new)
                io.visit(i, j, rows, m_new, l_new)
    lse = np.empty((programs, n_q))
    for rows in row_tiles:
        with io.program():
            lse[:, rows] = io.write("lse", _lse(io.read("m", row_max[:, rows]),
                                                io.read("l", row_sum[:, rows])))
    return o, lse


# ============================================================ the public forward

def forward(q, k, v, *, block_q: int = 64, block_k: int = 64, causal: bool = False,
            scale=None, order: str = "fa2", io: IOCounter | None = None):
    """FlashAttention forward over tiles: returns (o, lse), both float64.

    q is (..., N_q, d), k is (..., N_k, d), v is (..., N_k, d_v). ``block_q`` (B_r)
    and ``block_k`` (B_c) are any integers >= 1; the last tiles are ragged. With
    ``causal=True`` the mask is bottom-right aligned and wholly masked tiles are
    skipped. ``lse`` (..., N_q) is the natural-log logsumexp of each scaled row; a
    row that sees no key gets o = 0 and lse = -inf. ``order`` is "fa2" (query
    tiles outer) or "fa1" (key/value tiles outer): same results, different traffic.
    ``io``: an ``IOCounter`` to fill in.
    """
    q, k, v, scale = check_qkv(q, k, v, scale)
    block_q, block_k = check_count(block_q, "block_q"), check_count(block_k, "block_k")
    causal = check_flag(causal, "causal")
    run = {"fa2": _forward_fa2, "fa1": _forward_fa1}[check_choice(order, "order", ORDERS)]
    lead = q.shape[:-2]
    o, lse = run(_flatten(q), _flatten(k), _flatten(v), scale, causal, block_q, block_k,
                 as_counter(io))
    return o.reshape(lead + o.shape[-2:]), lse.reshape(lead + lse.shape[-1:])


# ============================================================ 5. backward, with recomputation

def _recompute_p(q_i, k_j, lse_i, rows, cols, n_q, n_k, scale, causal, io):
    """P_ij = exp(S_ij - lse_i), from Q_i, K_j and the saved lse: no max, no sum needed.

    A row that sees no key has lse = -inf and all its scores masked to -inf, so
    with -inf -> 0 its P is exp(-inf) = 0, never NaN.
    """
    s = io.hold("S/P", scale * io.matmul(q_i, _t(k_j)))    # S_ij, recomputed
    if causal:
        s = _mask_scores(s, rows, cols, n_q, n_k)
    return io.hold("S/P", np.exp(s - _no_inf(lse_i)[..., None]))


def _delta(o, do, block_q, io):
    """delta = rowsum(dO * O), one pass over the query tiles before the main loop."""
    delta = np.empty(o.shape[:-1])
    for rows in tile_slices(o.shape[-2], block_q):
        with io.program():
            o_i, do_i = io.read("O", o[:, rows]), io.read("dO", do[:, rows])
            delta[:, rows] = io.write("delta", np.sum(do_i * o_i, axis=-1))
    return delta


def _backward_kv_outer(q, k, v, o, lse, do, scale, causal, block_q, block_k, io, dq_strategy):
    """Outer loop over K/V tiles: dK_j and dV_j accumulate on chip, dQ_i in HBM."""
    programs, n_q, d = q.shape
    n_k, d_v = v.shape[-2:]
    delta = _delta(o, do, block_q, io)
    n_visible = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    row_tiles, key_tiles = tile_slices(n_q, block_q), tile_slices(n_k, block_k)
    atomic = dq_strategy == "atomic"
    dq = io.write("dQ", np.zeros((programs, n_q, d))) if atomic else np.zeros((programs, n_q, d))
    dk = np.zeros((programs, n_k, d))
    dv = np.zeros((programs, n_k, d_v))
    for j, cols in enumerate(key_tiles):
        with io.program():  # on a GPU: one program per (batch, head, key tile), in parallel
            w = cols.stop - cols.start
            k_j, v_j = io.read("K", k[:, cols]), io.read("V", v[:, cols])
            dk_j = io.hold("dK", np.zeros((programs, w, d)))
            dv_j = io.hold("dV", np.zeros((programs, w, d_v)))
            for i, rows in enumerate(row_tiles):
                if j >= n_visible[i]:
                    continue                                        # wholly masked: skip
                q_i, do_i = io.read("Q", q[:, rows]), io.read("dO", do[:, rows])
                lse_i, delta_i = io.read("lse", lse[:, rows]), io.read("delta", delta[:, rows])
                p = _recompute_p(q_i, k_j, lse_i, rows, cols, n_q, n_k, scale, causal, io)
                dv_j += io.matmul(_t(p), do_i)                      # dV_j += P_ij^T dO_i
                dp = io.hold("dP/dS", io.matmul(do_i, _t(v_j)))     # dP_ij = dO_i V_j^T
                ds = io.hold("dP/dS", p * (dp - delta_i[..., None]))  # dS_ij = P_ij * (dP_ij - delta_i)
                dk_j += scale * io.matmul(_t(ds), q_i)              # dK_j += scale dS_ij^T Q_i
                if atomic:                                          # dQ_i += scale dS_ij K_j, a
                    dq_i = io.read("dQ", dq[:, rows])               # read-modify-write of HBM
                    dq[:, rows] = io.write("dQ", dq_i + scale * io.matmul(ds, k_j))
                io.visit(i, j)
            dk[:, cols] = io.write("dK", dk_j)
            dv[:, cols] = io.write("dV", dv_j)
    if not atomic:
        dq = _dq_second_pass(q, k, v, lse, do, delta, scale, causal, block_q, block_k, io)
    return dq, dk, dv


def _dq_second_pass(q, k, v, lse, do, delta, scale, causal, block_q, block_k, io):
    """dQ without atomics: a second loop, query tiles outer, that recomputes P and dS."""
    programs, n_q, d = q.shape
    n_k = k.shape[-2]
    dq = np.zeros((programs, n_q, d))
    n_visible = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    key_tiles = tile_slices(n_k, block_k)
    for i, rows in enumerate(tile_slices(n_q, block_q)):
        with io.program():  # one program per (batch, head, query tile): dQ_i stays on chip
            q_i, do_i = io.read("Q", q[:, rows]), io.read("dO", do[:, rows])
            lse_i, delta_i = io.read("lse", lse[:, rows]), io.read("delta", delta[:, rows])
            dq_i = io.hold("dQ", np.zeros(q_i.shape))
            for j in range(n_visible[i]):
                cols = key_tiles[j]
                k_j, v_j = io.read("K", k[:, cols]), io.read("V", v[:, cols])
                p = _recompute_p(q_i, k_j, lse_i, rows, cols, n_q, n_k, scale, causal, io)
                dp = io.hold("dP/dS", io.matmul(do_i, _t(v_j)))   # dP again: the price of
                ds = io.hold("dP/dS", p * (dp - delta_i[..., None]))  # not using atomics
                dq_i += scale * io.matmul(ds, k_j)
                io.visit(i, j)
            dq[:, rows] = io.write("dQ", dq_i)
    return dq


def backward(q, k, v, o, lse, do, *, block_q: int = 64, block_k: int = 64,
             causal: bool = False, scale=None, dq_strategy: str = "atomic",
             io: IOCounter | None = None):
    """Gradients (dq, dk, dv) of ``forward``, recomputing S and P tile by tile.

    ``o`` and ``lse`` are what ``forward`` returned; ``do`` is the upstream gradient,
    shaped like ``o``. Only the per-row ``lse`` and ``delta = rowsum(dO * O)`` are
    kept between tiles: nothing N_q x N_k is stored. ``dq_strategy`` says how dQ
    accumulates across key tiles: "atomic" (read-modify-write into HBM, as atomic
    adds would) or "second_pass" (a second loop, query tiles outer).
    """
    q, k, v, scale = check_qkv(q, k, v, scale)
    o = check_array(o, "o", shape=q.shape[:-1] + (v.shape[-1],))
    do = check_array(do, "do", shape=o.shape)
    lse = check_array(lse, "lse", shape=q.shape[:-1])  # one value per query row
    block_q, block_k = check_count(block_q, "block_q"), check_count(block_k, "block_k")
    causal = check_flag(causal, "causal")
    check_choice(dq_strategy, "dq_strategy", DQ_STRATEGIES)
    lead = q.shape[:-2]
    lse2 = np.asarray(lse, dtype=np.float64).reshape((-1, q.shape[-2]))
    grads = _backward_kv_outer(_flatten(q), _flatten(k), _flatten(v), _flatten(o), lse2,
                               _flatten(do), scale, causal, block_q, block_k, as_counter(io),
                               dq_strategy)
    return tuple(g.reshape(lead + g.shape[-2:]) for g in grads)


# ============================================================ 6. the same counts, in closed form

def _tile_sums(n_q, n_k, d, block_q, block_k, causal):
    """Sums over visited tiles that every formula below needs.

    row_visits: sum over visited tiles of their height  (query rows loaded, K/V-outer order)
    key_visits: sum over visited tiles of their width   (key rows loaded, Q-outer order)
    area:       sum over visited tiles of height * width (score entries computed)
    """
    counts = visible_key_tiles(n_q, n_k, block_q, block_k, causal)
    heights = [r.stop - r.start for r in tile_slices(n_q, block_q)]
    row_visits = sum(h * c for h, c in zip(heights, counts))
    key_visits = sum(min(c * block_k, n_k) for c in counts)
    area = sum(h * min(c * block_k, n_k) for h, c in zip(heights, counts))
    return row_visits, key_visits, area, sum(counts)


def _check_sizes(n_q, n_k, d, d_v, block_q=1, block_k=1, batch=1):
    d_v = d if d_v is None else d_v
    return (check_count(n_q, "n_q"), check_count(n_k, "n_k"), check_count(d, "d"),
            check_count(d_v, "d_v"), check_count(block_q, "block_q"),
            check_count(block_k, "block_k"), check_count(batch, "batch"))


def _scaled(stats: IOStats, batch: int) -> IOStats:
    """Per (batch, head) counts -> counts for ``batch`` independent problems."""
    return IOStats({a: n * batch for a, n in stats.reads.items()},
                   {a: n * batch for a, n in stats.writes.items()},
                   stats.onchip, stats.matmul_flops * batch, stats.tile_visits)


def onchip_elements(block_q: int, block_k: int, d: int, d_v: int | None = None) -> dict:
    """The buffers one forward program holds at once, in elements.

    Q_i (B_r x d), K_j (B_c x d), V_j (B_c x d_v), the score tile S_ij (which P_ij
    overwrites, B_r x B_c), the output accumulator O_i (B_r x d_v), and m, l (B_r).
    """
    _, _, d, d_v, block_q, block_k, _ = _check_sizes(1, 1, d, d_v, block_q, block_k)
    return {"Q": block_q * d, "K": block_k * d, "V": block_k * d_v, "S/P": block_q * block_k,
            "O": block_q * d_v, "m": block_q, "l": block_q}


def onchip_breakdown(block_q: int, block_k: int, d: int, dtype_bytes: int = 2, *,
                     d_v: int | None = None, acc_bytes: int = 4) -> dict:
    """``onchip_elements`` in bytes: Q, K, V tiles in the input dtype (``dtype_bytes``),
    S/P, O, m and l as accumulators (``acc_bytes``, fp32 by default)."""
    return buffer_bytes(onchip_elements(block_q, block_k, d, d_v),
                         check_count(dtype_bytes, "dtype_bytes"),
                         check_count(acc_bytes, "acc_bytes"))


def onchip_bytes(block_q: int, block_k: int, d: int, dtype_bytes: int = 2, *,
                 d_v: int | None = None, acc_bytes: int = 4) -> int:
    """Bytes one forward program needs on chip, all buffers together.
    (Not B_r x B_c x d: nothing that size ever exists.)"""
    return sum(onchip_breakdown(block_q, block_k, d, dtype_bytes, d_v=d_v,
                                acc_bytes=acc_bytes).values())


# ----------------------------------------------------------------- what fits a real chip
#
# ``onchip_bytes`` is the algorithm's footprint; which tiles fit a real chip is the
# kernel's shared memory, one model for the whole book in ``flashbook.smem`` (named
# here too): ``smem_bytes``, ``largest_tile``, ``tile_d``, ``TILE_DS``.


def io_naive(n_q: int, n_k: int, d: int, d_v: int | None = None, *, batch: int = 1) -> IOStats:
    """Standard attention (Algorithm 0 of Dao et al. 2022), materialising S and P in HBM.

    1. read Q, K; write S = scale Q K^T.   2. read S; write P = softmax(S).
    3. read P, V; write O = P V.
    Each matrix is counted once per pass (the matmuls' own tiling re-reads are ignored,
    which flatters the naive algorithm). A causal mask changes nothing: S is built whole.
    """
    n_q, n_k, d, d_v, *_, batch = _check_sizes(n_q, n_k, d, d_v, batch=batch)
    reads = {"Q": n_q * d, "K": n_k * d, "S": n_q * n_k, "P": n_q * n_k, "V": n_k * d_v}
    writes = {"S": n_q * n_k, "P": n_q * n_k, "O": n_q * d_v}
    flops = 2 * n_q * n_k * d + 2 * n_q * n_k * d_v
    return _scaled(IOStats(reads, writes, {}, flops, 0), batch)


def io_flash(n_q: int, n_k: int, d: int, block_q: int, block_k: int, *,
             d_v: int | None = None, causal: bool = False, order: str = "fa2",
             batch: int = 1) -> IOStats:
    """What ``forward(..., order=order, io=IOCounter())`` counts, in closed form.

    FA2 order: Q read once, K and V once per query tile, O and lse written once.
    FA1 order: K and V read once; Q, O, m, l read and O, m, l written once per tile
    visited, plus the initial write of O, m, l and the final lse pass.
    """
    n_q, n_k, d, d_v, block_q, block_k, batch = _check_sizes(n_q, n_k, d, d_v, block_q,
                                                            block_k, batch)
    check_choice(order, "order", ORDERS)
    row_visits, key_visits, area, tiles = _tile_sums(n_q, n_k, d, block_q, block_k,
                                                     check_flag(causal, "causal"))
    if order == "fa2":
        reads = {"Q": n_q * d, "K": key_visits * d, "V": key_visits * d_v}
        writes = {"O": n_q * d_v, "lse": n_q}
    else:
        reads = {"K": n_k * d, "V": n_k * d_v, "Q": row_visits * d, "O": row_visits * d_v,
                 "m": row_visits + n_q, "l": row_visits + n_q}
        writes = {"O": (n_q + row_visits) * d_v, "m": n_q + row_visits,
                  "l": n_q + row_visits, "lse": n_q}
    onchip = onchip_elements(min(block_q, n_q), min(block_k, n_k), d, d_v)
    flops = 2 * area * (d + d_v)
    return _scaled(IOStats(nonzero_counts(reads), nonzero_counts(writes), onchip, flops, tiles), batch)


def io_naive_backward(n_q: int, n_k: int, d: int, d_v: int | None = None, *,
                      batch: int = 1) -> IOStats:
    """Standard attention backward (Algorithm 3 of Dao et al. 2022), reading the stored P.

    1. read P, dO; write dV = P^T dO.   2. read dO, V; write dP = dO V^T.
    3. read P, dP; write dS = P * (dP - rowsum(P * dP)).
    4. read dS, K; write dQ = scale dS K.   5. read dS, Q; write dK = scale dS^T Q.
    """
    n_q, n_k, d, d_v, *_, batch = _check_sizes(n_q, n_k, d, d_v, batch=batch)
    nn = n_q * n_k
    reads = {"P": 2 * nn, "dO": 2 * n_q * d_v, "V": n_k * d_v, "dP": nn, "dS": 2 * nn,
             "K": n_k * d, "Q": n_q * d}
    writes = {"dV": n_k * d_v, "dP": nn, "dS": nn, "dQ": n_q * d, "dK": n_k * d}
    flops = 2 * nn * (2 * d + 2 * d_v)
    return _scaled(IOStats(reads, writes, {}, flops, 0), batch)


def io_flash_backward(n_q: int, n_k: int, d: int, block_q: int, block_k: int, *,
                      d_v: int | None = None, causal: bool = False,
                      dq_strategy: str = "atomic", batch: int = 1) -> IOStats:
    """What ``backward(..., dq_strategy=..., io=IOCounter())`` counts, in closed form.

    Both: a delta pass (read O, dO; write delta), K and V read once, and per tile
    visited Q_i, dO_i, lse_i, delta_i read; dK, dV written once. Five matmuls per tile
    (S again, dV, dP, dK, dQ). "atomic" adds a read and a write of dQ_i per tile;
    "second_pass" instead re-reads K, V per query tile and recomputes S and dP:
    seven matmuls per tile.
    """
    n_q, n_k, d, d_v, block_q, block_k, batch = _check_sizes(n_q, n_k, d, d_v, block_q,
                                                            block_k, batch)
    check_choice(dq_strategy, "dq_strategy", DQ_STRATEGIES)
    row_visits, key_visits, area, tiles = _tile_sums(n_q, n_k, d, block_q, block_k,
                                                     check_flag(causal, "causal"))
    br, bc = min(block_q, n_q), min(block_k, n_k)
    reads = {"O": n_q * d_v, "dO": n_q * d_v + row_visits * d_v, "K": n_k * d,
             "V": n_k * d_v, "Q": row_visits * d, "lse": row_visits, "delta": row_visits}
    writes = {"delta": n_q, "dK": n_k * d, "dV": n_k * d_v, "dQ": n_q * d}
    main = {"K": bc * d, "V": bc * d_v, "dK": bc * d, "dV": bc * d_v, "Q": br * d,
            "dO": br * d_v, "lse": br, "delta": br, "S/P": br * bc, "dP/dS": br * bc}
    passes = [{"O": br * d_v, "dO": br * d_v}]            # the delta pass holds O_i, dO_i
    if dq_strategy == "atomic":
        reads["dQ"] = row_visits * d
        writes["dQ"] += row_visits * d
        passes.append({**main, "dQ": br * d})
        flops = 2 * area * (3 * d + 2 * d_v)
    else:
        reads = merge_counts(reads, {"Q": n_q * d, "dO": n_q * d_v, "lse": n_q, "delta": n_q,
                               "K": key_visits * d, "V": key_visits * d_v})
        passes += [main, {"Q": br * d, "dO": br * d_v, "lse": br, "delta": br, "dQ": br * d,
                          "K": bc * d, "V": bc * d_v, "S/P": br * bc, "dP/dS": br * bc}]
        flops = 2 * area * (4 * d + 3 * d_v)
        tiles *= 2
    onchip = max(passes, key=lambda b: sum(b.values()))   # the first of equals, as counted
    return _scaled(IOStats(nonzero_counts(reads), nonzero_counts(writes), onchip, flops, tiles), batch)


def io_bound(n: int, d: int, smem_elements: int) -> float:
    """The paper's Theta(N^2 d^2 / M) count of HBM accesses, without its constant."""
    return n * n * d * d / smem_elements


def paper_blocks(smem_elements: int, d: int) -> tuple[int, int]:
    """The block sizes of Algorithm 1: B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d)."""
    block_k = math.ceil(check_count(smem_elements, "smem_elements") / (4 * check_count(d, "d")))
    return min(block_k, d), block_k


# ============================================================ split-K (chapter 11)

def __getattr__(name):
    # split_forward lives in flashbook.split (it builds on this module's checks), and
    # is reached here too, loaded on first use: flashbook.tiled.split_forward.
    if name == "split_forward":
        from .split import split_forward

        return split_forward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
