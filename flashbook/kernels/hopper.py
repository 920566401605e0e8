"""A Hopper-only forward kernel in Gluon: what the compiler could not do for us (chapter 10).

Chapter 7's kernel is plain Triton: it says *what* to compute per tile, and the
compiler decides *when* each load, matrix product and exponential runs. On an
H100/H200 the compiler pipelines the K/V loads, but it runs the two matrix
products of each step and the softmax between them one after the other: the
tensor cores wait while the softmax runs, and the softmax waits for them.

This kernel is written in Gluon (``triton.experimental.gluon``), Triton's
lower-level dialect, where the program says when things happen:

* K and V tiles arrive by TMA (the Hopper copy engine) into a ring of ``STAGES``
  shared-memory slots, each with an mbarrier that says "this slot is full".
* Both matrix products are asynchronous warpgroup MMAs (``wgmma``). Step j issues
  ``S_j = Q K_j^T`` and then ``O += P_{j-1} V_{j-1}`` (the *previous* tile's
  weights) before it waits for anything, and computes the softmax of ``S_j``
  while the tensor cores are still busy with ``P_{j-1} V_{j-1}``. That is the
  "intra-warpgroup overlap" of FlashAttention-3 (Shah et al., 2024, section 3.2).
* The output tile leaves by TMA too, through the shared memory Q no longer needs.
* Who loads and who waits for whom is the *schedule* (``SCHEDULES``): every warp
  loads its own tiles ("overlap"), or ``gl.warp_specialize`` gives the loads to one
  producer warp and the computing to two or three consumer warpgroups, with registers
  moved from the one to the others ("producer"). Both run the one loop of ``attend_tiles``.

What chapter 10 measured slower stays in ``benchmarks/gluon_lab.py``, beside its recorded
runs: consumers that take turns ("pingpong"), programs that walk from query tile to query
tile ("persistent"), and exponentials on the FMA units (FlashAttention-4's ``exp2``).

It runs on sm_90 only, for float16 and bfloat16, head_dim 64 or 128, any length from one
tile up (a last query or key tile that does not fit overlaps the one before), and no
causal row that sees no key; ``flash_attention`` gives everything else to the Triton
kernel (its choices: ``hopper_choices``). The GPU tests check it against float64. Gluon
changes between Triton releases: this file was measured with the Triton recorded beside
its numbers. ``available()`` says whether this machine can run it.
"""
from __future__ import annotations

import functools

import torch

try:  # Gluon ships with Triton >= 3.4
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAS_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

from ..reference import resolve_scale
from ..validation import check_choice, check_flag
from .autograd import FlashAttention, check_shapes, new_buffer
from .forward import LN2, LOG2E
from .hopper_choices import (  # noqa: F401  (hopper.DEFAULTS, hopper.default_config, ... as before)
    HEAD_DIMS, DTYPES, BLOCK_MS, WG_ROWS, BLOCK_NS, STAGES, SCHEDULES, CONSUMER_REGS,
    DEFAULTS, WIDE_FROM, SHORT_DEFAULT, SHORT_CAUSAL, SHORT_CAUSAL_BELOW, default_config, slower_than_triton)


def available(device: torch.device | str | None = None) -> bool:
    """True when Gluon is installed and ``device`` (default: the current CUDA device) is a Hopper GPU."""
    if not HAS_GLUON or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


if HAS_GLUON:
    # Gluon renames things between Triton releases: the same operations under either name
    cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
    _jit = gluon.jit
    WG_ROWS_C = gl.constexpr(WG_ROWS)
else:  # the functions below stay plain Python (readable, not runnable) without Gluon
    def _jit(fn):
        return fn


@_jit
def load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row, slot, pred):
    """Start the TMA copies of the key/value tile that begins at ``row`` into ring slot
    ``slot`` (if ``pred``); the slot's barriers complete when its bytes have landed."""
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred)
    tma_load(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot), pred)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred)
    tma_load(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot), pred)


@_jit
def key_start(t, seq_k, BLOCK_N: gl.constexpr, RAGGED: gl.constexpr):
    """The first key of key tile ``t``: ``t * BLOCK_N``, except (``RAGGED``: seq_k is not a
    whole number of tiles) that a last tile which would run past ``seq_k`` ends at ``seq_k``
    instead and overlaps the tile before. So no copy reads past this head's keys; the keys
    the two tiles share are masked away in the later one (``attend_tiles``).
    Needs seq_k >= BLOCK_N."""
    if RAGGED:
        start = gl.minimum(t * BLOCK_N, seq_k - BLOCK_N)
    else:
        start = t * BLOCK_N
    return start


@_jit
def refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, n_tiles, kv_row, seq_k,
           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RAGGED: gl.constexpr):
    """Load the key/value tile numbered ``issued`` of this query tile's ``n_tiles`` (keys from
    row ``kv_row``), if there is one; returns the next number to load. Tile number t goes
    to ring slot t % STAGES, so its barriers' phase is (t // STAGES) & 1."""
    pred = issued < n_tiles
    # (a number past the last tile loads nothing; its row counts back by n_tiles, as the lab's
    # persistent walk counts it, so that this stays the code chapter 10 measured)
    tile = issued - n_tiles * (1 - pred.to(gl.int32))
    row = kv_row + key_start(tile, seq_k, BLOCK_N, RAGGED)
    load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row, issued % STAGES, pred)
    return issued + pred.to(gl.int32)


@_jit
def on_diagonal(start_n, full_end, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether the key tile at ``start_n`` needs the causal mask (a compile-time False when not causal)."""
    if CAUSAL:
        masked = start_n + BLOCK_N > full_end
    else:
        masked = False
    return masked


@_jit
def shifted_scores(s, row_max, rows, cols, diagonal, qk_scale, masked):
    """The raw scores ``s`` scaled to base 2 and shifted by the new running max (chapter 3):
    returns them and that max. ``masked`` (a tile on the causal diagonal, or a last key tile
    that overlaps the one before: ``attend_tiles``) hides key j from row i when j > i + diagonal.
    Both cases round alike, so a row gets the same bits from a masked tile as from an unmasked
    one (the last query tile may overlap the one before: ``item_plan``)."""
    if masked:
        visible = gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + diagonal
        # key 0 is visible to every row, so the running max is finite from tile 0 on; a row that
        # sees no key of this tile gets weights exp2(-inf) = 0 from it
        s = gl.where(visible, s, float("-inf"))
    new_max = gl.maximum(row_max, gl.max(s, 1) * qk_scale)
    return s * qk_scale - gl.expand_dims(new_max, 1), new_max


@_jit
def softmax_step(s, row_max, row_sum, rows, cols, diagonal, qk_scale, masked):
    """One online-softmax step on the raw scores ``s`` (chapter 3, in base 2).

    Returns the weights p, the new running max and sum, and ``alpha``, the
    factor that rescales what was accumulated under the old max."""
    s, new_max = shifted_scores(s, row_max, rows, cols, diagonal, qk_scale, masked)
    p = gl.exp2(s)
    alpha = gl.exp2(row_max - new_max)
    row_sum = row_sum * alpha + gl.sum(p, 1)
    return p, new_max, row_sum, alpha


@_jit
def item_plan(pid_m, bh, seq_q, seq_k, n_heads, group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr):
    """Query tile ``pid_m`` of (batch*heads) index ``bh``, and the key tiles it visits (as in chapter 7).

    Returns (start_m, q_row, kv_row, n_tiles): the tile's first query row, its row in
    the (batch*heads*seq_q, d) view of Q and O, the first row of its K/V head in the
    (batch*kv_heads*seq_k, d) view of K and V, and how many key tiles it visits. When
    seq_q is not a whole number of tiles the last tile ends at seq_q and overlaps the one
    before: the rows they share are computed twice, to the same bits (``shifted_scores``),
    and stored twice.
    """
    b = bh // n_heads
    h = bh % n_heads
    start_m = gl.minimum(pid_m * BLOCK_M, seq_q - BLOCK_M)
    q_row = bh * seq_q + start_m
    kv_row = (b * (n_heads // group) + h // group) * seq_k
    if CAUSAL:  # the tile's last row sees keys up to start_m + BLOCK_M - 1 + (seq_k - seq_q)
        hi = gl.minimum(start_m + BLOCK_M + seq_k - seq_q, seq_k)
    else:
        hi = seq_k
    return start_m, q_row, kv_row, gl.cdiv(hi, BLOCK_N)


@_jit
def tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr):
    """``item_plan`` for this program of a grid of (query tiles, batch*heads) programs."""
    pid_m = gl.program_id(0)
    if CAUSAL:  # the query tiles with the most keys first, as in chapter 7
        pid_m = gl.num_programs(0) - 1 - pid_m
    return item_plan(pid_m, gl.program_id(1), seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)


@_jit
def release_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_empty, slot, issued, n_tiles, kv_row, seq_k,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PRODUCER: gl.constexpr, RAGGED: gl.constexpr):
    """The key tile in ring slot ``slot`` is finished with. With a producer warp, say so on
    the slot's ``kv_empty`` barrier; without one, once every warp of this program is done
    with it, load the next tile (``refill``) into it. Returns the next number to load."""
    if PRODUCER:
        mbarrier.arrive(kv_empty.index(slot))
    else:
        cta_barrier()
        issued = refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, n_tiles, kv_row, seq_k, BLOCK_N,
                        STAGES, RAGGED)
    return issued


@_jit
def empty_rows(first_row, diagonal, n_tiles, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """What ``attend_tiles`` starts from for ``ROWS`` query rows from ``first_row`` on, in the
    warpgroup products' layouts (each warp owns 16 rows of every tile; the MMA's n is the tile's
    width): (row_max, row_sum, o) before any key, the zero score tile, the rows' and the tile's
    column numbers, and ``full_end``, below which every key is visible to every row."""
    warps: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, HEAD_DIM, 16])
    row_of_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    full_end = gl.minimum(first_row + diagonal + 1, n_tiles * BLOCK_N)
    rows = first_row + gl.arange(0, ROWS, layout=row_of_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    row_max = gl.full([ROWS], float("-inf"), gl.float32, row_of_s)
    row_sum = gl.zeros([ROWS], gl.float32, row_of_s)
    o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    return row_max, row_sum, o, s_zero, rows, offs_n, full_end


@_jit
def attend_tiles(q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, kv_empty, k_desc, v_desc, kv_row, first_row,
                 n_tiles, diagonal, qk_scale, issued, seq_k, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, PRODUCER: gl.constexpr,
                 RAGGED: gl.constexpr):
    """The online softmax over all key tiles for ``ROWS`` query rows (in q_smem),
    held by the warps that call it (one or two warpgroups). Returns (o, row_max,
    row_sum), o not yet divided by row_sum. Its key tiles are numbers 0 to n_tiles - 1
    of the ring (``refill``); ``issued`` is the next number to load.

    Step j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} without waiting, then runs
    the softmax of S_j while the tensor cores compute P_{j-1} V_{j-1}. ``RAGGED``: seq_k is
    not a whole number of key tiles, so the last one overlaps the one before (``key_start``).
    """
    dtype: gl.constexpr = k_smem.dtype
    # (the order the loop's running values are defined in is the order the compiler keeps them in)
    row_max, row_sum, o, s_zero, rows, offs_n, full_end = empty_rows(first_row, diagonal, n_tiles, ROWS, HEAD_DIM,
                                                                     BLOCK_N)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o.type.layout, k_width=2)

    # tile 0: S_0 = Q K_0^T and its softmax; nothing to overlap with yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    p, row_max, row_sum, alpha = softmax_step(s, row_max, row_sum, rows, offs_n, diagonal, qk_scale,
                                              on_diagonal(0, full_end, BLOCK_N, CAUSAL))
    p = gl.convert_layout(p.to(dtype), p_layout)
    if CAUSAL:
        band = diagonal
    else:   # no causal mask: a ragged last tile is masked by its first key alone
        band = seq_k

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        # issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; wait only for S_j
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o = warpgroup_mma(p, v_smem.index(prev), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))
        # the softmax of S_j runs while the tensor cores compute P_{j-1} V_{j-1}
        if RAGGED:   # a last tile that ends at seq_k: its keys below j * BLOCK_N were seen in tile j - 1,
            # so they are numbered past every row's last key (one compare per score, as the diagonal's)
            start_n = key_start(j, seq_k, BLOCK_N, RAGGED)
            masked = (start_n < j * BLOCK_N) | on_diagonal(start_n, full_end, BLOCK_N, CAUSAL)
            cols = gl.where(offs_n >= j * BLOCK_N - start_n, start_n + offs_n, 1 << 30)
        else:
            masked = on_diagonal(j * BLOCK_N, full_end, BLOCK_N, CAUSAL)
            cols = j * BLOCK_N + offs_n
        p_next, row_max, row_sum, alpha = softmax_step(s, row_max, row_sum, rows, cols, band, qk_scale, masked)
        o = warpgroup_mma_wait(0, deps=(o,))
        issued = release_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_empty, prev, issued, n_tiles,
                              kv_row, seq_k, BLOCK_N, STAGES, PRODUCER, RAGGED)
        o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout)), 1)
        p = gl.convert_layout(p_next.to(dtype), p_layout)

    # the last tile's P V
    last = n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    o = warpgroup_mma(p, v_smem.index(last % STAGES), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o,))
    if PRODUCER:
        mbarrier.arrive(kv_empty.index(last % STAGES))
    return o, row_max, row_sum


@_jit
def finish_rows(o, row_max, row_sum, LSE, o_row):
    """Store lse = ln(sum of exp) of the query rows from row ``o_row`` of the (batch*heads*seq_q)
    view on, and return o divided by the row sums. Every row saw at least one key: the
    wrapper refuses inputs where one would not."""
    rows = gl.arange(0, o.shape[0], layout=row_max.type.layout)
    gl.store(LSE + o_row.to(gl.int64) + rows, (row_max + gl.log2(row_sum)) * LN2)
    row_sum_o = gl.convert_layout(row_sum, gl.SliceLayout(1, o.type.layout))
    return o / gl.expand_dims(row_sum_o, 1)


@_jit
def write_rows(o, row_max, row_sum, o_smem, o_desc, o_row, LSE):
    """``finish_rows``, then O out by TMA through ``o_smem`` (Q's buffer, which no product
    reads any more)."""
    o = finish_rows(o, row_max, row_sum, LSE, o_row)
    o_smem.store(o.to(o_smem.dtype))
    fence_async_shared()
    cta_barrier()
    tma_store(o_desc, [o_row, 0], o_smem)
    tma.store_wait(0)


@_jit
def init_barriers(bars, NUM: gl.constexpr, COUNT: gl.constexpr):
    """Initialise NUM mbarriers, each completing after COUNT arrivals."""
    for i in gl.static_range(NUM):
        mbarrier.init(bars.index(i), count=COUNT)


@_jit
def allocate_ring(q_desc, k_desc, v_desc, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
    """Shared memory of a program whose own warps load: Q's tile, the ring of STAGES K and V
    slots, and a barrier for Q and for each slot's K and V (each completes on one arrival)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    init_barriers(k_bars, STAGES, 1)
    init_barriers(v_bars, STAGES, 1)
    fence_async_shared()
    return q_smem, k_smem, v_smem, q_bar, k_bars, v_bars


@_jit
def load_first(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, q_row, kv_row, n_tiles,
               seq_k, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RAGGED: gl.constexpr = False):
    """Q, then the first STAGES key/value tiles (as many as there are), all in flight at once."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row + key_start(i, seq_k, BLOCK_N, RAGGED), i, i < n_tiles)


@_jit
def _gluon_attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE,
                    n_heads, group, seq_q, seq_k, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, RAGGED: gl.constexpr):
    """One program: one BLOCK_M-row query tile of one (batch, head), chapter 7's grid;
    its warps load the K/V tiles themselves. q/o descriptors view Q and O as
    (batch*heads*seq_q, HEAD_DIM), k/v as (batch*kv_heads*seq_k, HEAD_DIM)."""
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars = allocate_ring(q_desc, k_desc, v_desc, BLOCK_M, HEAD_DIM, BLOCK_N,
                                                                  STAGES)
    load_first(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, q_row, kv_row, n_tiles,
               seq_k, BLOCK_N, STAGES, RAGGED)
    o, row_max, row_sum = attend_tiles(
        q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_bars, k_desc, v_desc, kv_row, start_m, n_tiles,
        seq_k - seq_q, qk_scale, gl.minimum(n_tiles, STAGES), seq_k, BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
        False, RAGGED)
    write_rows(o, row_max, row_sum, q_smem, o_desc, q_row, LSE)


@_jit
def consumer(shared, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, RAGGED: gl.constexpr, WG: gl.constexpr):
    """Warpgroup ``WG`` of the warp-specialised kernel: rows [WG*ROWS, (WG+1)*ROWS) of the tile.
    ``shared`` holds the tensors and numbers every consumer takes (see ``_gluon_attn_fwd_ws``)."""
    (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, k_desc, v_desc, o_desc, LSE,
     kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale) = shared
    # (the producer warp loads every tile: no number to keep, n_tiles stands in)
    o, row_max, row_sum = attend_tiles(
        q_smem.index(WG), k_smem, v_smem, q_bars.index(WG), k_bars, v_bars, kv_empty, k_desc, v_desc, kv_row,
        start_m + WG * ROWS, n_tiles, seq_k - seq_q, qk_scale, n_tiles, seq_k, ROWS, HEAD_DIM, BLOCK_N, STAGES,
        CAUSAL, True, RAGGED)
    write_rows(o, row_max, row_sum, q_smem.index(WG), o_desc, q_row + WG * ROWS, LSE)


@_jit
def producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
             q_row, kv_row, n_tiles, seq_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             NUM_WG: gl.constexpr, RAGGED: gl.constexpr = False):
    """The producer warp: each consumer warpgroup's ROWS rows of Q, then every K/V tile
    into the ring as soon as every consumer has released the slot's previous tile."""
    for wg in gl.static_range(NUM_WG):
        mbarrier.expect(q_bars.index(wg), q_desc.block_type.nbytes)
        tma_load(q_desc, [q_row + wg * ROWS, 0], q_bars.index(wg), q_smem.index(wg))
    for t in range(n_tiles):
        mbarrier.wait(kv_empty.index(t % STAGES), ((t // STAGES) - 1) & 1, pred=t >= STAGES)
        load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row + key_start(t, seq_k, BLOCK_N, RAGGED),
                t % STAGES, True)


@_jit
def allocate_ws(q_desc, k_desc, v_desc, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):
    """Shared memory of a warp-specialised program: each consumer warpgroup's 64 rows of Q,
    the ring of STAGES K and V slots, a barrier for each Q and each slot's K and V (one
    arrival: the copy's), one that says the slot is empty again (one arrival per consumer), and
    two ``turns`` that only the lab's ping-pong uses (kept: this is the code chapter 10 measured)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, WG_ROWS_C, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_barriers(q_bars, NUM_WG, 1)
    init_barriers(k_bars, STAGES, 1)
    init_barriers(v_bars, STAGES, 1)
    init_barriers(kv_empty, STAGES, NUM_WG)
    init_barriers(turns, 2, 1)
    fence_async_shared()
    return q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, turns


@_jit
def _gluon_attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE,
                       n_heads, group, seq_q, seq_k, qk_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       RAGGED: gl.constexpr):
    """Warp-specialised: BLOCK_M/64 consumer warpgroups of 64 rows each (the default
    partition and 4-warp workers) and a 1-warp producer that does every load."""
    ROWS: gl.constexpr = WG_ROWS_C
    NUM_WG: gl.constexpr = BLOCK_M // WG_ROWS_C
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, turns = allocate_ws(q_desc, k_desc, v_desc, NUM_WG,
                                                                                  HEAD_DIM, BLOCK_N, STAGES)
    # what every consumer warpgroup takes (a tuple keeps no compile-time constants: those go one by one)
    shared = (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, k_desc, v_desc, o_desc, LSE,
              kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale)
    if NUM_WG == 2:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RAGGED, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RAGGED, 1)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, seq_k, ROWS, BLOCK_N, STAGES, NUM_WG, RAGGED))], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RAGGED, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RAGGED, 1)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RAGGED, 2)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, seq_k, ROWS, BLOCK_N, STAGES, NUM_WG, RAGGED))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple, dtype: torch.dtype):
    """The shared-memory layout (swizzle) a TMA tile of this shape lands in; computed once."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16 if dtype == torch.float16 else gl.bfloat16)


def _descriptor(x2d: torch.Tensor, block: tuple):
    return TensorDescriptor.from_tensor(x2d, list(block), _shared_layout(block, x2d.dtype))


def _launch_plan(schedule: str, block_m: int):
    """What a schedule launches: (kernel, compile options, rows one TMA copy of Q or O moves,
    the kernel's extra compile-time constants)."""
    if schedule == "overlap":
        return _gluon_attn_fwd, {"num_warps": block_m // 16}, block_m, {}
    return _gluon_attn_fwd_ws, {"num_warps": 4}, WG_ROWS, dict(CONSUMER_REGS=CONSUMER_REGS[block_m // WG_ROWS])


def check_inputs(q, k, v, causal: bool, block_m: int = 64, block_n: int = 128, stages: int = 3,
                 schedule: str = "overlap", whole_tiles: bool = False) -> None:
    """Everything this kernel assumes, each with an error that names the argument: the shared
    checks (``autograd.check_shapes``), this kernel's limits, the device last (so that every
    other error shows on any machine). ``whole_tiles``: the lab's kernels' lengths."""
    check_shapes(q, k, v)
    check_flag(causal, "causal")
    if q.dtype not in DTYPES:
        raise TypeError(f"q, k and v must be float16 or bfloat16 for the Gluon kernel, got {q.dtype}")
    check_choice(q.shape[3], "head_dim", HEAD_DIMS)
    check_choice(schedule, "schedule", SCHEDULES)
    check_choice(block_m, "block_m", BLOCK_MS)
    if schedule == "overlap" and block_m == 192:
        raise ValueError(f"schedule={schedule!r} takes block_m 64 or 128 (one program, its own warps), got 192")
    if schedule == "producer" and block_m == 64:
        raise ValueError("schedule='producer' takes block_m 128 or 192 (two or three consumer warpgroups), got 64")
    check_choice(block_n, "block_n", BLOCK_NS)
    check_choice(stages, "stages", STAGES)
    seq_q, seq_k = q.shape[2], k.shape[2]
    if whole_tiles and (seq_q % WG_ROWS or seq_k % block_n):
        raise ValueError(f"this kernel needs seq_q a multiple of {WG_ROWS} and seq_k a multiple of block_n={block_n}, "
                         f"got seq_q={seq_q}, seq_k={seq_k}; flash_attention takes any length")
    if seq_q < block_m or seq_k < block_n:
        raise ValueError(f"the Gluon kernel needs seq_q >= block_m={block_m} and seq_k >= block_n={block_n} (one "
                         f"tile each), got seq_q={seq_q}, seq_k={seq_k}; flash_attention takes any length")
    if causal and seq_q > seq_k:
        raise ValueError(f"the causal Gluon kernel needs seq_q <= seq_k (every row must see a key), got "
                         f"seq_q={seq_q}, seq_k={seq_k}; flash_attention handles rows that see no key")
    if not HAS_GLUON:
        raise RuntimeError("the Gluon kernel needs Triton's Gluon (triton >= 3.4); use flash_attention")
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        raise ValueError(f"q, k and v must be on a Hopper GPU (sm_90) for the Gluon kernel, got {q.device}; "
                         "flash_attention runs everywhere")


def configuration(q, causal, block_m=None, block_n=None, stages=None, schedule=None, seq_k=None) -> tuple:
    """(block_m, block_n, stages, schedule): those given, the others ``default_config``'s for
    q (and ``seq_k`` keys)."""
    masked = bool(causal) if causal in (True, False) else False   # check_inputs names a wrong causal
    default = (default_config(q.shape[-1], q.shape[2], masked, seq_k) if isinstance(q, torch.Tensor)
               and q.dim() == 4 else DEFAULTS[128])
    return tuple(d if x is None else x for x, d in zip((block_m, block_n, stages, schedule), default))


def operands(q, k, v, scale, q_rows: int, block_n: int):
    """What a kernel here takes besides O and its compile-time constants, for checked inputs:
    (o and lse to fill, the q, k and v descriptors, the run-time numbers after O and LSE)."""
    batch, heads, seq_q, d = q.shape
    q2, k2, v2 = (x.contiguous().view(-1, d) for x in (q, k, v))
    o = new_buffer(q.shape, device=q.device, dtype=q.dtype)
    lse = new_buffer((batch, heads, seq_q), device=q.device, dtype=torch.float32)
    descriptors = (_descriptor(q2, (q_rows, d)), *(_descriptor(x, (block_n, d)) for x in (k2, v2)))
    numbers = (heads, heads // k.shape[1], seq_q, k.shape[2], resolve_scale(scale, d) * LOG2E.value)
    return o, lse, descriptors, numbers


def gluon_forward(q, k, v, *, causal: bool = False, scale=None, block_m: int | None = None,
                  block_n: int | None = None, stages: int | None = None,
                  schedule: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on a Hopper GPU with the Gluon kernel: returns ``(o, lse)`` as ``flash_forward`` does.

    q: (batch, heads, seq_q, d); k, v: (batch, kv_heads, seq_k, d), heads a multiple
    of kv_heads (GQA). ``block_m`` query rows per program (64: one warpgroup, so
    that several programs share an SM, "overlap" only; 128: two warpgroups; 192:
    three, "producer" only), ``block_n`` keys per tile (64 or 128), ``stages`` K/V tiles in flight (2 to
    4), ``schedule`` one of ``SCHEDULES``. Any seq_q >= block_m and seq_k >= block_n: a last
    query tile that does not fit overlaps the one before (``item_plan``), and so does a last
    key tile (``key_start``). What is not given comes from
    ``default_config(head_dim, seq_q, causal, seq_k)``.
    """
    seq_k = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
    block_m, block_n, stages, schedule = configuration(q, causal, block_m, block_n, stages, schedule, seq_k)
    check_inputs(q, k, v, causal, block_m, block_n, stages, schedule)
    kernel, options, q_rows, extra = _launch_plan(schedule, block_m)
    o, lse, descriptors, numbers = operands(q, k, v, scale, q_rows, block_n)
    d = q.shape[-1]
    grid = (-(-q.shape[2] // block_m), q.shape[0] * q.shape[1])   # the last tile may overlap the one before (tile_plan)
    kernel[grid](*descriptors, _descriptor(o.view(-1, d), (q_rows, d)), lse, *numbers, HEAD_DIM=d, BLOCK_M=block_m,
                 BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal), RAGGED=k.shape[2] % block_n != 0, **extra,
                 **options)
    return o, lse


def signature(dtype: str, head_dim: int, q_rows: int, block_n: int) -> dict:
    """The run-time arguments of a kernel here, typed as ``triton.compile`` takes them (O by TMA)."""
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def desc(rows):
        return f"tensordesc<{dtype}[{rows}, {head_dim}],{_shared_layout((rows, head_dim), torch_dtype)!r}>"

    return {"q_desc": desc(q_rows), "k_desc": desc(block_n), "v_desc": desc(block_n), "o_desc": desc(q_rows),
            "LSE": "*fp32", "n_heads": "i32", "group": "i32", "seq_q": "i32", "seq_k": "i32", "qk_scale": "fp32"}


def compile_kernel(cc: int, fn, options: dict, signature: dict, constexprs: dict):
    """``fn`` compiled for compute capability ``cc`` with these run-time argument types and
    compile-time constants, without that GPU (Triton ships its own ``ptxas``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src = GluonASTSource(fn, {**signature, **{name: "constexpr" for name in constexprs}}, constexprs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def compile_for(cc: int = 90, *, head_dim: int = 128, block_m: int = 128, block_n: int = 128, stages: int = 3,
                schedule: str = "producer", causal: bool = True, dtype: str = "fp16", ragged: bool = False):
    """Compile the kernel for compute capability ``cc`` without that GPU; returns Triton's
    compiled kernel (``metadata.shared`` in bytes, ``asm["ptx"]``). Needs TRITON_INTERPRET=0
    when triton was imported: ``targets.compile_elsewhere`` runs it in a process of its own."""
    fn, options, q_rows, extra = _launch_plan(schedule, block_m)
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
                  "RAGGED": ragged, **extra}
    return compile_kernel(cc, fn, options, signature(dtype, head_dim, q_rows, block_n), constexprs)


def gluon_attention(q, k, v, *, causal: bool = False, scale=None):
    """Differentiable attention whose forward is the Gluon kernel and whose backward is
    chapter 8's (``flash_backward``, from the o and lse the Gluon kernel saved)."""
    return FlashAttention.apply(q, k, v, causal, scale, "separate", gluon_forward)   # gluon_forward checks
