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
* The output tile leaves by TMA too, through the shared memory Q no longer needs
  (the persistent schedule stores it straight from the registers).
* Who loads and who waits for whom is the *schedule* (``SCHEDULES``): every warp
  loads its own tiles ("overlap"; "persistent" is the same with only as many programs
  as the GPU holds, each going from query tile to query tile), or
  ``gl.warp_specialize`` gives the loads to one producer warp and the computing to two
  or three consumer warpgroups, with registers moved from the one to the others
  ("producer"), optionally taking turns on the tensor cores ("pingpong"). All of them
  run the one loop of ``attend_tiles``.
* Optionally (``fma_share``), part of each score tile's exponentials is computed with
  a polynomial on the FMA units instead of the special-function unit (``exp2_fma``,
  FlashAttention-4's trick). Chapter 10 measures it: on the H200 it made the kernel
  slower, so it is off by default.

It is a second kernel, not a replacement: it runs only on sm_90, for float16 and
bfloat16, head_dim 64 or 128, query lengths that are multiples of 64 (the last tile
may overlap the one before), key lengths that are whole key tiles, and no
causal row that sees no key. Everything else stays with ``flash_attention``.
Its results are checked against float64 like every kernel in the book (the GPU
tests), and chapter 10 measures it beside the Triton kernel.

Gluon is experimental and changes between Triton releases; this file was written
for and measured with the Triton recorded beside its numbers. ``available()``
says whether this machine can run it.
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

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
BLOCK_MS = (64, 128, 192)   # query rows per program: one warpgroup (4 warps) per 64 rows
WG_ROWS = 64           # query rows per consumer warpgroup under warp specialisation
BLOCK_NS = (64, 128)   # keys per tile
STAGES = (2, 3, 4)     # K/V tiles in flight
#: how the work of one program is laid out in time (chapter 10):
#: "overlap"  every warp loads and computes; S_{j} and P_{j-1} V_{j-1} overlap the softmax
#: "producer" a producer warp does every load; two or three consumer warpgroups compute
#: "pingpong" as "producer", and the consumers take turns on the tensor cores
#: "persistent" as "overlap", but as many programs as fit on the GPU, each going from one query
#:            tile to the next without a pause (the next tile's K/V and Q load during this one)
SCHEDULES = ("overlap", "producer", "pingpong", "persistent")
#: 1/share of each score tile's exponentials computed on the FMA units (0: none; exp2_fma)
FMA_SHARES = (0, 2, 4)
EXP2_DEGREES = (3, 4)  # degrees of exp2_fma's polynomial
#: registers per thread of the persistent schedule's 64-row programs: three fit on an SM
PERSISTENT_REGS = 168
#: registers per consumer thread under warp specialisation, by the number of consumer
#: warpgroups (the producer warp keeps 24); what is left of the SM's 64K for one program
CONSUMER_REGS = {2: 240, 3: 160}
#: (block_m, block_n, stages, schedule) used when none is given: the fastest of
#: benchmarks/gluon_experiment.py on the H200 (benchmarks/results/gluon_h200/) at most shapes;
#: at d=64 three consumer warpgroups (FlashAttention-3's 192-row tile) for long sequences
DEFAULTS = {128: (128, 128, 3, "producer"), 64: (192, 128, 4, "producer")}
#: below these query lengths (full, causal) the 192-row tiles measured slower than
#: SHORT_DEFAULT (gluon_d64_wg3.json, gluon_d64_run3.json, the --graph peer runs, and timed
#: from CUDA graphs at 1K to 4K: gluon_d64_short_graph.json, gluon_d64_persistent_graph.json)
WIDE_FROM = {False: 2048, True: 6144}
#: what shorter sequences take (one-warpgroup programs, three to an SM)
SHORT_DEFAULT = (64, 128, 2, "overlap")
#: causal, d=64, below SHORT_CAUSAL_BELOW query rows: 64-key tiles, so that less of the
#: diagonal tile is masked away (the two graph-timed sweeps: +1.6% and +2.2% at 1K, -2% at 2K)
SHORT_CAUSAL = (64, 64, 3, "overlap")
SHORT_CAUSAL_BELOW = 2048


def default_config(head_dim: int, seq_q: int, causal: bool = False) -> tuple:
    """(block_m, block_n, stages, schedule) ``gluon_forward`` takes when none is given."""
    config = DEFAULTS.get(head_dim, DEFAULTS[128])
    shortest = max(config[0], WIDE_FROM[bool(causal)] if config[0] > 128 else 0)
    if seq_q >= shortest:
        return config
    return SHORT_CAUSAL if causal and head_dim == 64 and seq_q < SHORT_CAUSAL_BELOW else SHORT_DEFAULT


def exp2_polynomial(degree: int = 4):
    """Coefficients c1..c_degree of 1 + c1 f + ... + c_degree f**degree, close to 2**f on
    [-1/2, 1/2] in relative error: least squares on Chebyshev points, weighted by
    1/2**f (near the minimax fit), with 2**0 = 1 exactly."""
    import numpy as np

    f = 0.5 * np.cos(np.linspace(0.0, np.pi, 1025))
    target = np.exp2(f)
    powers = np.vander(f, degree + 1, increasing=True)[:, 1:]
    coeffs, *_ = np.linalg.lstsq(powers / target[:, None], 1.0 - 1.0 / target, rcond=None)
    return tuple(float(c) for c in coeffs)


def exp2_fma_error(degree: int = 4) -> float:
    """The largest relative error of ``exp2_polynomial(degree)`` against 2**f on [-1/2, 1/2]
    (a fine grid, in float64): what ``exp2_fma`` adds to each weight, float32 rounding aside."""
    import numpy as np

    f = np.linspace(-0.5, 0.5, 100001)
    value = 1.0 + np.polynomial.polynomial.polyval(f, (0.0, *exp2_polynomial(degree)))
    return float(np.abs(value / np.exp2(f) - 1.0).max())


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
    P3_1, P3_2, P3_3 = (gl.constexpr(c) for c in exp2_polynomial(3))
    P4_1, P4_2, P4_3, P4_4 = (gl.constexpr(c) for c in exp2_polynomial(4))
    EXP2_FLOOR = gl.constexpr(-125.0)
    ROUNDER = gl.constexpr(1.5 * 2.0**23)
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
def refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, limit, g, n_tiles, kv_row, kv_row_next,
           BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Load the key/value tile numbered ``issued`` in this program's stream, if ``issued < limit``;
    returns the next number to load.

    The stream is every key tile this program visits, in order: the current query tile's
    ``n_tiles`` tiles (numbers ``g`` on, keys from row ``kv_row``), then the next query
    tile's (from ``kv_row_next``; the persistent schedule). Tile number t goes to ring
    slot t % STAGES, so its barriers' phase is (t // STAGES) & 1.
    """
    here = (issued < g + n_tiles).to(gl.int32)
    tile = issued - g - n_tiles * (1 - here)
    row = kv_row_next + (kv_row - kv_row_next) * here + tile * BLOCK_N
    pred = issued < limit
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
def exp2_fma(x, DEGREE: gl.constexpr):
    """2**x for x <= 0 without the special-function unit (FlashAttention-4's trick).

    x = j + f, j a whole number and f in [-1/2, 1/2]: 2**f is a polynomial of
    degree DEGREE (3 or 4, ``exp2_polynomial``) on the FMA units, and j goes
    straight into the exponent bits. Chapter 10 measures it.
    """
    # 2**-125 stands in for 0: the exponent bits must not underflow
    x = gl.maximum(x, EXP2_FLOOR)
    # adding 1.5 * 2**23 rounds x to j and leaves j in the low bits
    shifted = x + ROUNDER
    j = shifted - ROUNDER
    f = x - j
    if DEGREE == 3:
        p = ((P3_3 * f + P3_2) * f + P3_1) * f + 1.0
    else:
        p = (((P4_4 * f + P4_3) * f + P4_2) * f + P4_1) * f + 1.0
    # multiply by 2**j: add j to the exponent field (bits 23 to 30)
    bits = p.to(gl.int32, bitcast=True) + (shifted.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@_jit
def exp2_shared(x, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr):
    """2**x of a score tile, 1/FMA_SHARE of it on the FMA units (0: none), the
    rest on the special-function unit; the split columns are registers of the same thread."""
    if FMA_SHARE == 0:
        y = gl.exp2(x)
    else:
        ROWS: gl.constexpr = x.shape[0]
        COLS: gl.constexpr = x.shape[1]
        if FMA_SHARE == 2:
            even, odd = gl.split(gl.reshape(x, [ROWS, COLS // 2, 2]))
            y = gl.reshape(gl.join(gl.exp2(even), exp2_fma(odd, DEGREE)), [ROWS, COLS])
        else:
            # columns whose bit 3 is set, then of those the odd ones: a quarter
            x4 = gl.reshape(gl.permute(gl.reshape(x, [ROWS, COLS // 16, 2, 8]), (0, 1, 3, 2)), [ROWS, COLS // 2, 2])
            lo, hi = gl.split(x4)
            hi_even, hi_odd = gl.split(gl.reshape(hi, [ROWS, COLS // 4, 2]))
            hi = gl.reshape(gl.join(gl.exp2(hi_even), exp2_fma(hi_odd, DEGREE)), [ROWS, COLS // 2])
            hi = gl.convert_layout(hi, lo.type.layout)
            y4 = gl.reshape(gl.join(gl.exp2(lo), hi), [ROWS, COLS // 16, 8, 2])
            y = gl.reshape(gl.permute(y4, (0, 1, 3, 2)), [ROWS, COLS])
        y = gl.convert_layout(y, x.type.layout)   # the same registers: no data moves
    return y


@_jit
def softmax_step(s, row_max, row_sum, rows, cols, diagonal, qk_scale, masked, FMA_SHARE: gl.constexpr,
                 DEGREE: gl.constexpr):
    """One online-softmax step on the raw scores ``s`` (chapter 3, in base 2).

    Returns the weights p, the new running max and sum, and ``alpha``, the
    factor that rescales what was accumulated under the old max. ``masked``
    (a tile on the causal diagonal) hides key j from row i when j > i + diagonal.
    Both cases round alike, so a row gets the same bits from a masked tile as from
    an unmasked one (the last query tile may overlap the one before: ``item_plan``).
    """
    if masked:
        visible = gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + diagonal
        s = gl.where(visible, s, float("-inf"))   # key 0 is visible to every row: the max stays finite
    new_max = gl.maximum(row_max, gl.max(s, 1) * qk_scale)
    s = s * qk_scale - gl.expand_dims(new_max, 1)
    p = exp2_shared(s, FMA_SHARE, DEGREE)
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
    before: the rows they share are computed twice, to the same bits (``softmax_step``),
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
def work_item(w, seq_q, seq_k, n_heads, group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr):
    """``item_plan`` for work item ``w`` of the persistent schedule: the query tiles of one head
    after another (its K/V stay in L2 while they are read), the longest first when causal."""
    n_m = gl.cdiv(seq_q, BLOCK_M)
    pid_m = w % n_m
    if CAUSAL:
        pid_m = n_m - 1 - pid_m
    return item_plan(pid_m, w // n_m, seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)


@_jit
def take_turn(pp_bars, step, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until it is this warpgroup's turn to issue its matrix products."""
    if PINGPONG:
        mbarrier.wait(pp_bars.index(WG), step & 1)


@_jit
def pass_turn(pp_bars, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: this warpgroup's products are issued; the other one may issue its own."""
    if PINGPONG:
        mbarrier.arrive(pp_bars.index(1 - WG))


@_jit
def release_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_empty, slot, issued, g, n_tiles, kv_row,
                 kv_row_next, n_next, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PRODUCER: gl.constexpr):
    """The key tile in ring slot ``slot`` is finished with. With a producer warp, say so on
    the slot's ``kv_empty`` barrier; without one, once every warp of this program is done
    with it, load the stream's next tile (``refill``) into it. Returns the stream's next number to load."""
    if PRODUCER:
        mbarrier.arrive(kv_empty.index(slot))
    else:
        cta_barrier()
        issued = refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, g + n_tiles + n_next, g, n_tiles,
                        kv_row, kv_row_next, BLOCK_N, STAGES)
    return issued


@_jit
def attend_tiles(q_smem, k_smem, v_smem, q_bar, q_phase, k_bars, v_bars, kv_empty, pp_bars,
                 k_desc, v_desc, kv_row, first_row, n_tiles, diagonal, qk_scale, g, issued, kv_row_next, n_next,
                 ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, WG: gl.constexpr,
                 PRODUCER: gl.constexpr, PINGPONG: gl.constexpr, FMA_SHARE: gl.constexpr,
                 DEGREE: gl.constexpr):
    """The online softmax over all key tiles for ``ROWS`` query rows (in q_smem),
    held by the warps that call it (one or two warpgroups). Returns (o, row_max,
    row_sum, issued), o not yet divided by row_sum. Its key tiles are numbers ``g`` to
    ``g + n_tiles - 1`` of the program's stream (``refill``); ``issued`` is the next number to load.

    Step j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} without waiting, then runs
    the softmax of S_j while the tensor cores compute P_{j-1} V_{j-1}.
    """
    dtype: gl.constexpr = k_smem.dtype
    warps: gl.constexpr = gl.num_warps()
    # Each warp owns 16 rows of every tile; the MMA's n is the tile's width.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_of_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    # keys below full_end are visible to every row here: no mask needed
    full_end = gl.minimum(first_row + diagonal + 1, n_tiles * BLOCK_N)
    rows = first_row + gl.arange(0, ROWS, layout=row_of_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    row_max = gl.full([ROWS], float("-inf"), gl.float32, row_of_s)
    row_sum = gl.zeros([ROWS], gl.float32, row_of_s)
    o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    # tile 0: S_0 = Q K_0^T and its softmax; nothing to overlap with yet
    mbarrier.wait(q_bar, q_phase)
    mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
    take_turn(pp_bars, 0, WG, PINGPONG)
    s = warpgroup_mma(q_smem, k_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    pass_turn(pp_bars, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s,))
    p, row_max, row_sum, alpha = softmax_step(s, row_max, row_sum, rows, offs_n, diagonal, qk_scale,
                                              on_diagonal(0, full_end, BLOCK_N, CAUSAL), FMA_SHARE, DEGREE)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        slot = (g + j) % STAGES
        prev = (g + j - 1) % STAGES
        # issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; wait only for S_j
        mbarrier.wait(k_bars.index(slot), ((g + j) // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((g + j - 1) // STAGES) & 1)
        take_turn(pp_bars, j, WG, PINGPONG)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o = warpgroup_mma(p, v_smem.index(prev), o, is_async=True)
        pass_turn(pp_bars, WG, PINGPONG)
        s = warpgroup_mma_wait(1, deps=(s,))
        # the softmax of S_j runs while the tensor cores compute P_{j-1} V_{j-1}
        start_n = j * BLOCK_N
        p_next, row_max, row_sum, alpha = softmax_step(
            s, row_max, row_sum, rows, start_n + offs_n, diagonal, qk_scale,
            on_diagonal(start_n, full_end, BLOCK_N, CAUSAL), FMA_SHARE, DEGREE)
        o = warpgroup_mma_wait(0, deps=(o,))
        issued = release_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_empty, prev, issued, g, n_tiles,
                              kv_row, kv_row_next, n_next, BLOCK_N, STAGES, PRODUCER)
        o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p = gl.convert_layout(p_next.to(dtype), p_layout)

    # the last tile's P V
    last = g + n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    take_turn(pp_bars, n_tiles, WG, PINGPONG)
    o = warpgroup_mma(p, v_smem.index(last % STAGES), o, is_async=True)
    pass_turn(pp_bars, WG, PINGPONG)
    o = warpgroup_mma_wait(0, deps=(o,))
    if PRODUCER:
        mbarrier.arrive(kv_empty.index(last % STAGES))
    return o, row_max, row_sum, issued


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
def store_rows(o, row_max, row_sum, O, o_row, LSE):
    """``finish_rows``, then O straight from the registers to global memory (the persistent
    schedule: Q's buffer is already taking the next tile's Q)."""
    o = finish_rows(o, row_max, row_sum, LSE, o_row)
    rows = gl.arange(0, o.shape[0], layout=gl.SliceLayout(1, o.type.layout))
    cols = gl.arange(0, o.shape[1], layout=gl.SliceLayout(0, o.type.layout))
    offsets = (o_row + gl.expand_dims(rows, 1)).to(gl.int64) * o.shape[1] + gl.expand_dims(cols, 0)
    gl.store(O + offsets, o.to(O.dtype.element_ty))


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
def _gluon_attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE,
                    n_heads, group, seq_q, seq_k, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, FMA_SHARE: gl.constexpr,
                    DEGREE: gl.constexpr):
    """One program: one BLOCK_M-row query tile of one (batch, head), chapter 7's grid;
    its warps load the K/V tiles themselves. q/o descriptors view Q and O as
    (batch*heads*seq_q, HEAD_DIM), k/v as (batch*kv_heads*seq_k, HEAD_DIM)."""
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars = allocate_ring(q_desc, k_desc, v_desc, BLOCK_M, HEAD_DIM, BLOCK_N,
                                                                  STAGES)

    # Q, then the first STAGES key/value tiles, all in flight at once
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row + i * BLOCK_N, i, i < n_tiles)

    o, row_max, row_sum, issued = attend_tiles(
        q_smem, k_smem, v_smem, q_bar, 0, k_bars, v_bars, k_bars, k_bars, k_desc, v_desc, kv_row,
        start_m, n_tiles, seq_k - seq_q, qk_scale, 0, gl.minimum(n_tiles, STAGES), kv_row, 0,
        BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, 0, False, False, FMA_SHARE, DEGREE)
    write_rows(o, row_max, row_sum, q_smem, o_desc, q_row, LSE)


@_jit
def _gluon_attn_fwd_persistent(q_desc, k_desc, v_desc, O, LSE,
                               n_heads, group, seq_q, seq_k, qk_scale, n_items,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, FMA_SHARE: gl.constexpr,
                               DEGREE: gl.constexpr):
    """Persistent: as many programs as fit on the GPU at once, each taking work items
    (query tiles) w = program, program + programs, ... of ``n_items``, with the
    "overlap" schedule's warps. Nothing waits between two items: the next tile's K/V
    arrive in the ring while the last ones are used (``refill``), and its Q lands while
    this tile's O leaves."""
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars = allocate_ring(q_desc, k_desc, v_desc, BLOCK_M, HEAD_DIM, BLOCK_N,
                                                                  STAGES)

    first = gl.program_id(0)
    step = gl.num_programs(0)
    start_m, q_row, kv_row, n_tiles = work_item(first, seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    g = gl.to_tensor(0)        # this item's first key tile in the program's stream
    issued = gl.to_tensor(0)   # the stream's next key tile to load
    for w in range(first, n_items, step):
        has_next = w + step < n_items
        start_next, q_row_next, kv_row_next, n_next = work_item(w + step, seq_q, seq_k, n_heads, group,
                                                                BLOCK_M, BLOCK_N, CAUSAL)
        n_next = n_next * has_next.to(gl.int32)
        # the first tiles of this item that the last one had no free slot for
        cta_barrier()
        for i in gl.static_range(STAGES):
            issued = refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, g + gl.minimum(n_tiles, STAGES),
                            g, n_tiles, kv_row, kv_row_next, BLOCK_N, STAGES)
        o, row_max, row_sum, issued = attend_tiles(
            q_smem, k_smem, v_smem, q_bar, ((w - first) // step) & 1, k_bars, v_bars, k_bars, k_bars, k_desc,
            v_desc, kv_row, start_m, n_tiles, seq_k - seq_q, qk_scale, g, issued, kv_row_next, n_next,
            BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, 0, False, False, FMA_SHARE, DEGREE)
        cta_barrier()   # every warp's products have read Q: the next item's Q may land
        mbarrier.expect(q_bar, q_desc.block_type.nbytes, has_next)
        tma_load(q_desc, [q_row_next, 0], q_bar, q_smem, has_next)
        store_rows(o, row_max, row_sum, O, q_row, LSE)
        g += n_tiles
        start_m, q_row, kv_row, n_tiles = start_next, q_row_next, kv_row_next, n_next


@_jit
def consumer(shared, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr,
             WG: gl.constexpr):
    """Warpgroup ``WG`` of the warp-specialised kernel: rows [WG*ROWS, (WG+1)*ROWS) of the tile.
    ``shared`` holds the tensors and numbers every consumer takes (see ``_gluon_attn_fwd_ws``)."""
    (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, pp_bars, k_desc, v_desc, o_desc, LSE,
     kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale) = shared
    # (the producer warp loads every tile: no stream number to keep, n_tiles stands in)
    o, row_max, row_sum, issued = attend_tiles(
        q_smem.index(WG), k_smem, v_smem, q_bars.index(WG), 0, k_bars, v_bars, kv_empty, pp_bars,
        k_desc, v_desc, kv_row, start_m + WG * ROWS, n_tiles, seq_k - seq_q, qk_scale, 0, n_tiles, kv_row, 0,
        ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WG, True, PINGPONG, FMA_SHARE, DEGREE)
    write_rows(o, row_max, row_sum, q_smem.index(WG), o_desc, q_row + WG * ROWS, LSE)


@_jit
def producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
             q_row, kv_row, n_tiles, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             NUM_WG: gl.constexpr):
    """The producer warp: each consumer warpgroup's ROWS rows of Q, then every K/V tile
    into the ring as soon as every consumer has released the slot's previous tile."""
    for wg in gl.static_range(NUM_WG):
        mbarrier.expect(q_bars.index(wg), q_desc.block_type.nbytes)
        tma_load(q_desc, [q_row + wg * ROWS, 0], q_bars.index(wg), q_smem.index(wg))
    for t in range(n_tiles):
        mbarrier.wait(kv_empty.index(t % STAGES), ((t // STAGES) - 1) & 1, pred=t >= STAGES)
        load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row + t * BLOCK_N, t % STAGES, True)


@_jit
def _gluon_attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE,
                       n_heads, group, seq_q, seq_k, qk_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr):
    """Warp-specialised: BLOCK_M/64 consumer warpgroups of 64 rows each (the default
    partition and 4-warp workers) and a 1-warp producer that does every load.
    With PINGPONG the two consumers take turns to issue their matrix products, so that
    one's softmax runs while the other's products occupy the tensor cores."""
    ROWS: gl.constexpr = WG_ROWS_C
    NUM_WG: gl.constexpr = BLOCK_M // WG_ROWS_C
    dtype: gl.constexpr = q_desc.dtype
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pp_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_barriers(q_bars, NUM_WG, 1)
    init_barriers(k_bars, STAGES, 1)
    init_barriers(v_bars, STAGES, 1)
    init_barriers(kv_empty, STAGES, NUM_WG)   # every consumer warpgroup releases each tile
    init_barriers(pp_bars, 2, 1)
    fence_async_shared()
    if PINGPONG:
        mbarrier.arrive(pp_bars.index(0))   # warpgroup 0 takes the first turn

    # what every consumer warpgroup takes (a tuple keeps no compile-time constants: those go one by one)
    shared = (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, pp_bars, k_desc, v_desc, o_desc, LSE,
              kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale)
    if NUM_WG == 2:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 1)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, ROWS, BLOCK_N, STAGES, NUM_WG))], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 1)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 2)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, ROWS, BLOCK_N, STAGES, NUM_WG))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple, dtype: torch.dtype):
    """The shared-memory layout (swizzle) a TMA tile of this shape lands in; computed once."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16 if dtype == torch.float16 else gl.bfloat16)


def _descriptor(x2d: torch.Tensor, block: tuple):
    return TensorDescriptor.from_tensor(x2d, list(block), _shared_layout(block, x2d.dtype))


def _launch_plan(schedule: str, block_m: int):
    """What a schedule launches: (kernel, compile options, rows one TMA copy of Q or O moves,
    the kernel's extra compile-time constants). The persistent kernel stores O without TMA
    and takes the number of work items after the scale (``gluon_forward``)."""
    if schedule == "overlap":
        return _gluon_attn_fwd, {"num_warps": block_m // 16}, block_m, {}
    if schedule == "persistent":   # left alone, ptxas takes 255 registers for the causal loop: one program per SM
        options = {"num_warps": block_m // 16, **({"maxnreg": PERSISTENT_REGS} if block_m == 64 else {})}
        return _gluon_attn_fwd_persistent, options, block_m, {}
    extra = dict(PINGPONG=schedule == "pingpong", CONSUMER_REGS=CONSUMER_REGS[block_m // WG_ROWS])
    return _gluon_attn_fwd_ws, {"num_warps": 4}, WG_ROWS, extra


def check_inputs(q, k, v, causal: bool, block_m: int = 64, block_n: int = 128, stages: int = 3,
                 schedule: str = "overlap", fma_share: int = 0, degree: int = 4, programs: int | None = None) -> None:
    """Everything this kernel assumes, each with an error that names the argument: the
    checks every kernel here shares (``autograd.check_shapes``), then this kernel's own
    limits, the device last, so that every other error shows on any machine."""
    check_shapes(q, k, v)
    check_flag(causal, "causal")
    if q.dtype not in DTYPES:
        raise TypeError(f"q, k and v must be float16 or bfloat16 for the Gluon kernel, got {q.dtype}")
    check_choice(q.shape[3], "head_dim", HEAD_DIMS)
    check_choice(schedule, "schedule", SCHEDULES)
    check_choice(block_m, "block_m", BLOCK_MS)
    if schedule == "pingpong" and block_m != 128:
        raise ValueError(f"schedule={schedule!r} splits a 128-row tile between two warpgroups: block_m must be "
                         f"128, got {block_m}")
    if schedule in ("overlap", "persistent") and block_m == 192:
        raise ValueError(f"schedule={schedule!r} takes block_m 64 or 128 (one program, its own warps), got 192")
    if programs is not None:
        if schedule != "persistent":
            raise ValueError(f"programs sets how many programs the persistent schedule launches; "
                             f"schedule={schedule!r} launches one per query tile")
        if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
            raise ValueError(f"programs must be a positive int (or None: as many as fit on the GPU), got {programs!r}")
    if schedule == "producer" and block_m == 64:
        raise ValueError("schedule='producer' takes block_m 128 or 192 (two or three consumer warpgroups), got 64")
    check_choice(block_n, "block_n", BLOCK_NS)
    check_choice(stages, "stages", STAGES)
    if isinstance(fma_share, bool):   # False == 0 and True == 1 would slip through the choice
        raise TypeError(f"fma_share must be one of {FMA_SHARES}, got {fma_share!r}")
    check_choice(fma_share, "fma_share", FMA_SHARES)
    check_choice(degree, "degree", EXP2_DEGREES)
    seq_q, seq_k = q.shape[2], k.shape[2]
    if seq_q % WG_ROWS or seq_q < block_m or seq_k % block_n:
        raise ValueError(f"the Gluon kernel needs seq_q a multiple of {WG_ROWS} and at least block_m={block_m}, and "
                         f"seq_k a multiple of block_n={block_n}, got seq_q={seq_q}, seq_k={seq_k}; flash_attention "
                         "takes any length")
    if causal and seq_q > seq_k:
        raise ValueError(f"the causal Gluon kernel needs seq_q <= seq_k (every row must see a key), got "
                         f"seq_q={seq_q}, seq_k={seq_k}; flash_attention handles rows that see no key")
    if not HAS_GLUON:
        raise RuntimeError("the Gluon kernel needs Triton's Gluon (triton >= 3.4); use flash_attention")
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        raise ValueError(f"q, k and v must be on a Hopper GPU (sm_90) for the Gluon kernel, got {q.device}; "
                         "flash_attention runs everywhere")


def gluon_forward(q, k, v, *, causal: bool = False, scale=None, block_m: int | None = None,
                  block_n: int | None = None, stages: int | None = None,
                  schedule: str | None = None, fma_share: int = 0,
                  degree: int = 4, programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on a Hopper GPU with the Gluon kernel: returns ``(o, lse)`` as ``flash_forward`` does.

    q: (batch, heads, seq_q, d); k, v: (batch, kv_heads, seq_k, d), heads a multiple
    of kv_heads (GQA). ``block_m`` query rows per program (64: one warpgroup, so
    that several programs share an SM, "overlap" and "persistent" only; 128: two warpgroups; 192:
    three, "producer" only), ``block_n`` keys per tile (64 or 128), ``stages`` K/V tiles in flight (2 to
    4), ``schedule`` one of ``SCHEDULES`` ("pingpong" takes block_m=128; "persistent" launches
    ``programs`` programs, by default as many as fit on the GPU at once). seq_q must be
    a multiple of 64 and at least block_m (a last tile that does not fit overlaps the
    one before), seq_k a multiple of block_n. What is not given comes from
    ``default_config(head_dim, seq_q, causal)``. ``fma_share`` (one of ``FMA_SHARES``): 1/fma_share
    of each score tile's exponentials on the FMA units (0: none), by a polynomial of
    ``degree`` 3 or 4 (relative error ``exp2_fma_error(degree)``).
    """
    masked = bool(causal) if causal in (True, False) else False   # check_inputs names a wrong causal
    default = (default_config(q.shape[-1], q.shape[2], masked) if isinstance(q, torch.Tensor)
               and q.dim() == 4 else DEFAULTS[128])
    block_m, block_n, stages, schedule = (d if x is None else x for x, d in
                                          zip((block_m, block_n, stages, schedule), default))
    check_inputs(q, k, v, causal, block_m, block_n, stages, schedule, fma_share, degree, programs)
    scale = resolve_scale(scale, q.shape[-1])
    batch, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    q2, k2, v2 = (x.contiguous().view(-1, d) for x in (q, k, v))
    o = new_buffer(q.shape, device=q.device, dtype=q.dtype)
    lse = new_buffer((batch, heads, seq_q), device=q.device, dtype=torch.float32)
    kernel, options, q_rows, extra = _launch_plan(schedule, block_m)
    persistent = schedule == "persistent"   # O leaves without TMA; one program per slot, walking the tiles
    q_desc = _descriptor(q2, (q_rows, d))
    o_arg = o if persistent else _descriptor(o.view(-1, d), (q_rows, d))
    k_desc, v_desc = (_descriptor(x, (block_n, d)) for x in (k2, v2))
    grid = (-(-seq_q // block_m), batch * heads)   # the last tile may overlap the one before (tile_plan)
    args = (q_desc, k_desc, v_desc, o_arg, lse, heads, heads // k.shape[1], seq_q, seq_k, scale * LOG2E.value)
    constants = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                     FMA_SHARE=fma_share, DEGREE=degree, **extra)
    if persistent:
        args = (*args, grid[0] * grid[1])
        grid = (min(programs or resident_programs(kernel, args, constants, options, q.device, q.dtype),
                    grid[0] * grid[1]),)
    kernel[grid](*args, **constants, **options)
    return o, lse


_RESIDENT: dict = {}


def resident_programs(kernel, args, constants: dict, options: dict, device, dtype) -> int:
    """How many programs of ``kernel`` (compiled for these arguments) fit on ``device`` at
    once: SMs times what one SM holds by registers, shared memory and threads. Compiles
    without launching the first time, then remembers."""
    key = (kernel, device, dtype, tuple(sorted(constants.items())), tuple(sorted(options.items())))
    if key not in _RESIDENT:
        warps = options["num_warps"]
        compiled = kernel.warmup(*args, grid=(1,), **constants, **options)
        compiled._init_handles()
        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256   # allocated 256 at a time
        per_sm = min(smem // (compiled.metadata.shared + 1024),   # 1 KB of each block's is the system's
                     regs // regs_per_warp // warps, 2048 // (32 * warps))
        _RESIDENT[key] = max(1, per_sm) * props.multi_processor_count
    return _RESIDENT[key]


def compile_for(cc: int = 90, *, head_dim: int = 128, block_m: int = 128, block_n: int = 128, stages: int = 3,
                schedule: str = "producer", causal: bool = True, dtype: str = "fp16", fma_share: int = 0,
                degree: int = 4):
    """Compile the kernel for compute capability ``cc`` without that GPU (Triton ships its
    own ``ptxas``); returns Triton's compiled kernel (``metadata.shared`` in bytes,
    ``asm["ptx"]``). Needs TRITON_INTERPRET=0 when triton was imported:
    ``targets.compile_elsewhere`` runs it in a process of its own."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fn, options, q_rows, extra = _launch_plan(schedule, block_m)

    def desc(rows):
        return f"tensordesc<{dtype}[{rows}, {head_dim}],{_shared_layout((rows, head_dim), torch_dtype)!r}>"

    signature = {"q_desc": desc(q_rows), "k_desc": desc(block_n), "v_desc": desc(block_n), "o_desc": desc(q_rows),
                 "LSE": "*fp32", "n_heads": "i32", "group": "i32", "seq_q": "i32", "seq_k": "i32", "qk_scale": "fp32"}
    if schedule == "persistent":
        signature = {**{name: signature[name] for name in ("q_desc", "k_desc", "v_desc")}, "O": f"*{dtype}",
                     **{name: signature[name] for name in list(signature)[4:]}, "n_items": "i32"}
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
                  "FMA_SHARE": fma_share, "DEGREE": degree, **extra}
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn, signature, constexprs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def gluon_attention(q, k, v, *, causal: bool = False, scale=None):
    """Differentiable attention whose forward is the Gluon kernel and whose backward is
    chapter 8's (``flash_backward``, from the o and lse the Gluon kernel saved)."""
    return FlashAttention.apply(q, k, v, causal, scale, "separate", gluon_forward)   # gluon_forward checks
