"""Documents packed along one sequence (flash-attn's varlen layout): where each document's
queries and keys are, and which document and tile each program of a kernel takes.

``cu_seqlens`` holds the documents' boundaries: document b is rows ``cu_seqlens[b]`` to
``cu_seqlens[b + 1] - 1``. The forward, dK/dV and dQ kernels (``VARLEN``) read it here.
"""
import triton
import triton.language as tl


@triton.jit
def document(CU_SEQLENS, b):
    """Where document ``b`` of a packed batch starts and how long it is: ``cu_seqlens[b]``
    and ``cu_seqlens[b + 1] - cu_seqlens[b]`` (flash-attn's varlen layout)."""
    start = tl.load(CU_SEQLENS + b)
    return start.to(tl.int64), tl.load(CU_SEQLENS + b + 1) - start


@triton.jit
def document_tile(CU_SEQLENS, position, n_docs, BLOCK: tl.constexpr, DOCS: tl.constexpr,
                  CAUSAL: tl.constexpr, KEY_SIDE: tl.constexpr = False, HEAVY_LAST: tl.constexpr = False):
    """Packed documents: ``(document, tile)`` for the program at launch ``position`` of a grid
    that holds every document's tiles one after the other (``autograd.launch_shape``).

    Each document has cdiv(length, BLOCK) tiles on this side (``KEY_SIDE``: keys, else queries);
    the grid holds their sum and a few more, which get a tile past document 0's end (they visit
    nothing). Under a causal mask the tiles are taken longest first: query tile j sees about
    j + 1 key tiles (key tile j, the tiles from j to its document's end), so the grid takes all
    documents' last query tiles (first key tiles) first, then the ones before them, and so on;
    "level" j holds each document's tile j counted from its light end. ``DOCS``: a power of
    two >= ``n_docs``, the vector every program reads ``cu_seqlens`` into. ``HEAVY_LAST``
    (no causal mask): each document's query tiles last first (``query_tile_index``)."""
    d = tl.arange(0, DOCS)
    ok = d < n_docs
    start = tl.load(CU_SEQLENS + d, mask=ok, other=0)
    tiles = tl.cdiv(tl.load(CU_SEQLENS + d + 1, mask=ok, other=0) - start, BLOCK)
    if CAUSAL:
        # find level j with (tiles above level j) <= position < (tiles at level j or above)
        low = position * 0
        high = tl.max(tiles, 0)
        while low < high:
            mid = (low + high) // 2
            above = tl.sum(tl.maximum(tiles - mid - 1, 0), 0)
            low = tl.where(above <= position, low, mid + 1)
            high = tl.where(above <= position, mid, high)
        # the k-th document (in packing order) that has a tile at level `low`
        k = position - tl.sum(tl.maximum(tiles - low - 1, 0), 0)
        has = tiles > low
        pick = has & (tl.cumsum(has.to(tl.int32), 0) == k + 1)
        level = low
    else:
        ends = tl.cumsum(tiles, 0)
        pick = (ends - tiles <= position) & (position < ends)
        level = position - tl.sum(tl.where(pick, ends - tiles, 0), 0)
    doc = tl.sum(tl.where(pick, d, 0), 0)
    count = tl.sum(tl.where(pick, tiles, 0), 0)
    if CAUSAL:
        tile = level if not KEY_SIDE else count - 1 - level
    elif HEAVY_LAST:
        tile = count - 1 - level
    else:
        tile = level
    # past the last tile: no document picked (count 0), so the tile just past document 0's end
    tile = tl.where(count > 0, tile, tl.sum(tl.where(d == 0, tiles, 0), 0))
    return doc, tile


@triton.jit
def documents(CU_SEQLENS_Q, CU_SEQLENS_K, b, first, last):
    """Document ``b``'s queries and keys, ``(q_start, seq_q, k_start, seq_k, first, last)``:
    where each starts, how many there are, and the window's offsets moved onto this
    document's own diagonal (the host passes them relative to a diagonal of 0)."""
    q_start, seq_q = document(CU_SEQLENS_Q, b)
    k_start, seq_k = document(CU_SEQLENS_K, b)
    return q_start, seq_q, k_start, seq_k, first + seq_k - seq_q, last + seq_k - seq_q
