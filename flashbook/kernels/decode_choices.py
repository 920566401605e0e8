"""Flash-decoding's host-side choices and checks (``decode.flash_decode``, chapter 11).

Pure functions of the shapes and the GPU, apart from the value checks: how many splits of
the keys fill the GPU (``choose_num_splits``), which tiles (``decode_tiles``), what a
window tells the kernel (``window_offsets``), and the checks of the index tensors and of
a paged cache. ``flashbook.kernels.decode`` imports them all (``decode.choose_num_splits``...).
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings

import torch
import triton

from .. import masks, runtime
from ..validation import check_choice, check_count
from .autograd import check_shapes, dot_precision, kernel_mask
from .launch import tensor_key
from .configs import block_d

MAX_SPLITS = 128      # the combine kernel holds every split of a row at once
MAX_ROWS = 64         # query rows (group * n_new) per tile; more rows take more tiles
PAGE_SIZES = (16, 32, 64, 128, 256)   # tokens per page of a paged KV cache
PAGED_EXTRA_STAGES = 2   # the page indices take pipeline stages of their own (decode_tiles)
MIN_SPLITS = 4        # the fewest splits of a long cache (choose_num_splits: measured, not modelled)
FLOOR_TILES = 16      # ... each split keeping at least this many key tiles


# ------------------------------------------------------------------ choices

@functools.lru_cache(maxsize=4096)   # a decoding loop asks the same question every step: answer it once
def choose_num_splits(batch: int, kv_heads: int, seq_k: int, *, sm_count: int, block_n: int,
                      programs_per_sm: int = 2, min_tiles_per_split: int = 2,
                      max_splits: int = MAX_SPLITS, min_splits: int = MIN_SPLITS) -> int:
    """How many splits of the keys fill a GPU of ``sm_count`` SMs. A pure function.

    The ``batch * kv_heads`` programs of an unsplit cache are too few to fill the
    ``sm_count * programs_per_sm`` slots that run at once when the batch is small.
    With s splits, each program reads ``ceil(tiles / s)`` key tiles, plus about
    one tile's time of its own (loading q, writing its partial result, its share
    of the combine), and the equal programs run in ``ceil(batch * kv_heads * s /
    slots)`` waves: the time is about the product. The answer is the smallest s
    within 5% of the least such time (a few percent of modelled gain are not
    worth more programs and a bigger combine), keeping at least
    ``min_tiles_per_split`` key tiles per split.

    ``programs_per_sm`` is a fixed guess, not read from the compiled kernel: how many
    programs share an SM depends on the tile. On sm_90 at head_dim 128 in 16-bit, the
    compiled kernels' shared memory fits 3 with 16 query rows (one new token of a group
    of 4; Nsight Compute measured 3 in ``1_ncu``) and 2 with 64 rows (1 at head_dim 256).
    The floor of ``min_splits`` below covers what the guess misses.

    The model is then overruled where the H200 says otherwise. A large batch fills the GPU
    without splits, and the model takes 1; yet at batch 64 (8 KV heads) 4 splits took 8-12%
    less time than 1 at 8K to 128K keys, 18-25% on a paged cache read then a page index per key
    row, before one index per tile (``benchmarks/results/decode_h200-3/1_splits_before``). Nsight Compute says why
    (``1_ncu``): the kernel's shared memory lets 3 programs share an SM, so 512 programs
    are 1.29 waves, and the SMs were busy 75% of the kernel's time; more, shorter programs
    fill the last wave. So a cache long enough gets at least ``min_splits`` splits of
    ``FLOOR_TILES`` key tiles or more (the interpreter, one SM, none).
    """
    for name, value, minimum in (("batch", batch, 1), ("kv_heads", kv_heads, 1), ("seq_k", seq_k, 0),
                                 ("sm_count", sm_count, 1), ("block_n", block_n, 1),
                                 ("programs_per_sm", programs_per_sm, 1),
                                 ("min_tiles_per_split", min_tiles_per_split, 1), ("max_splits", max_splits, 1),
                                 ("min_splits", min_splits, 1)):
        check_count(value, name, minimum)
    slots = sm_count * programs_per_sm
    programs = batch * kv_heads
    tiles = math.ceil(seq_k / block_n)
    most = min(max_splits, max(1, tiles // min_tiles_per_split))

    def time(s):
        return math.ceil(programs * s / slots) * (math.ceil(tiles / s) + 1)

    best = min(time(s) for s in range(1, most + 1))
    chosen = next(s for s in range(1, most + 1) if time(s) <= 1.05 * best)
    if sm_count == 1:   # the interpreter runs one program after another: nothing to gain
        return chosen
    return max(chosen, min(min_splits, most, max(1, tiles // FLOOR_TILES)))


def decode_tiles(head_dim: int, elem_bytes: int, n_rows: int, *, page_size: int = 0,
                 interpreter: bool | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a head_dim, an element size and
    ``n_rows = group * n_new`` query rows.

    BLOCK_M: the rows, padded to a power of two >= 16 (the tensor cores' smallest
    tile), at most ``MAX_ROWS``. BLOCK_N: keys per tile such that one K and one V
    tile together are 32 KiB (64 keys at d = 128 in 16-bit), 3 stages deep: the
    loads of about two tiles are in flight while one is used, which the memory
    system needs to stream at full speed. The interpreter takes 16 keys, so that
    small test caches span several tiles (``interpreter``: None means "if it runs here").
    A paged cache (``page_size`` > 0) takes the same tiles and ``PAGED_EXTRA_STAGES`` more
    stages: its page indices are loads of the loop too, issued two stages before the K/V
    tiles they address, so two more stages keep as many K/V tiles in flight as the dense
    cache (the compiled kernel's shared buffers show it: 2 x 64 x 128 at 3 + 2 stages).
    """
    bd = block_d(head_dim)
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(n_rows)))
    if runtime.INTERPRET if interpreter is None else interpreter:
        return block_m, 16, 4, 1
    block_n = max(16, min(128, 32768 // (2 * bd * elem_bytes)))
    stages = 3 if elem_bytes == 2 else 2
    return block_m, block_n, 4, stages + (PAGED_EXTRA_STAGES if page_size else 0)


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 1 on the interpreter (it runs one program at a time)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# ------------------------------------------------------------------ checks

def check_num_splits(num_splits) -> int:
    """A ``num_splits`` given by the caller (None, the library's choice, is not checked here):
    an integer from 1 to ``MAX_SPLITS``. flash-attn's ``num_splits=0`` asks for its heuristic;
    here that is ``None``, and the message says so."""
    if isinstance(num_splits, numbers.Integral) and not isinstance(num_splits, bool) and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}: pass num_splits=None for the "
                         "library's choice (what flash-attn's num_splits=0 asks for)")
    if check_count(num_splits, "num_splits") > MAX_SPLITS:
        raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    return int(num_splits)


def _check_index_tensor(x, name: str, shape: tuple, device, meaning: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of ints, got {type(x).__name__}")
    if x.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} ({meaning}), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {x.device}")


def _check_same_shape(a, b, names: str) -> None:
    """Two tensors that go together (k_cache and v_cache, k and v, rotary_cos and rotary_sin)."""
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape, got {tuple(a.shape)}, {tuple(b.shape)}")


def _check_range(x, name: str, lo: int, hi: int, what: str) -> None:
    """Every value of ``x`` in [lo, hi]: one device synchronisation (``check_values=True``)."""
    if x.numel() == 0:
        return
    low, high = int(x.min()), int(x.max())
    if low < lo or high > hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}] ({what}), got values in [{low}, {high}]")


def _check_paged(q, k_cache, v_cache, block_table):
    """(the cache as ``check_inputs`` sees it, page_size, pages per sequence) for a paged call."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[0] == 0:
            raise ValueError(f"{name} must be a 4-D tensor of pages (num_pages, kv_heads, page_size, head_dim) "
                             f"with at least one page when block_table is given, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    _check_same_shape(k_cache, v_cache, "k_cache and v_cache")
    page_size = k_cache.shape[2]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"k_cache's page_size (axis 2) must be one of {PAGE_SIZES}, got {page_size}")
    check_shapes(q, q, q, names=("q", "q", "q"))   # q first: the table is checked against its batch
    batch = q.shape[0]
    _check_block_table(block_table, batch, q.device)
    as_dense = tuple(x[:1].expand(batch, -1, -1, -1) for x in (k_cache, v_cache))
    return as_dense, page_size, block_table.shape[1]


def _check_block_table(block_table, batch: int, device) -> None:
    """A page table: a 2-D int tensor (batch, pages per sequence) on ``device``, one page at least."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise ValueError(f"block_table must be a 2-D tensor (batch, pages per sequence), got "
                         f"{tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__}")
    _check_index_tensor(block_table, "block_table", (batch, block_table.shape[1]), device,
                        "batch, pages per sequence")
    if block_table.shape[1] == 0:
        raise ValueError("block_table must list at least one page per sequence, got shape "
                         f"{tuple(block_table.shape)}")


def window_offsets(window, causal: bool, n_new: int, n_max: int) -> tuple[bool, bool, int, int, int]:
    """What the split kernel is told about ``window=(left, right)``: ``(causal, WINDOW,
    first, last, keys)``, with ``keys`` the most keys one sequence's window spans.

    flash-attn's convention (``flash_attn_with_kvcache``): new token i of n_new sits at
    position p = length - n_new + i and sees cache key j when p - left <= j <= p + right;
    -1 is no limit on that side, and ``causal=True`` sets right to 0. The kernel's token t
    sees keys [t + first, t + last] moved onto the sequence's diagonal length - n_new
    (``first`` = -left, ``last`` = right; a far value for no limit). A side that reaches
    past every key of every length up to n_max is no limit (a left side >= n_max, a right
    side >= n_new - 1); what is left of no window, or of (-1, 0), is the plain kernel
    (``WINDOW`` off) without or with its causal mask, so such a call runs exactly the
    kernel it ran before there were windows.
    """
    left, right = masks.check_window(window)
    if causal:
        right = 0
    if left >= n_max:
        left = -1
    if right > 0 and right >= n_new - 1:
        right = -1
    # the attention kernels' reading of a window, with the n_new tokens as rows and the
    # offsets relative to a diagonal of 0 (the kernel adds each sequence's own)
    causal, _, extra = kernel_mask(causal, (left, right), None, n_new, n_max, 1.0, diagonal=0)
    if not extra:
        return causal, False, 0, 0, n_max
    keys = n_max if left < 0 else min(n_max, left + n_new)
    return False, True, extra["first"], extra["last"], keys


def warn_if_flash_attn_layout(q, k_cache) -> None:
    """A q of one head and several new tokens over a cache of one KV head is also what flash-attn's
    (batch, new tokens, heads, head_dim) layout looks like here (one new token, several heads), and
    it would be attended as the wrong thing without an error: say so (once per call signature)."""
    if (isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor) and q.dim() == k_cache.dim() == 4
            and q.shape[1] == 1 < q.shape[2] and k_cache.shape[1] == 1):
        warnings.warn(f"q {tuple(q.shape)} is read as (batch, heads=1, new tokens={q.shape[2]}, head_dim); if it is "
                      "flash-attn's (batch, new tokens, heads, head_dim), pass q.transpose(1, 2) (and the caches as "
                      "(batch, kv_heads, length, head_dim))", stacklevel=3)


# ------------------------------------------------------------------ the layout

def paginate(k, v, page_size: int, *, generator: torch.Generator | None = None, spare: int = 0):
    """A dense cache (batch, kv_heads, n_max, d) cut into pages of ``page_size`` tokens and
    stored in a shuffled order: returns (k_pages, v_pages, block_table), the layout
    ``flash_decode(..., block_table=)`` reads (as vLLM and flash-attn's paged KV cache).

    Sequence b's positions [p * page_size, (p + 1) * page_size) land in physical page
    ``block_table[b, p]`` of k_pages / v_pages (num_pages, kv_heads, page_size, d);
    n_max is padded up to whole pages with zeros. ``spare`` unused pages are added (a
    real cache has free pages); the order is a random permutation from ``generator``."""
    check_choice(page_size, "page_size", PAGE_SIZES)
    batch, kv_heads, n_max, d = k.shape
    per_seq = max(1, -(-n_max // page_size))
    pad = per_seq * page_size - n_max

    def pages(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(batch, kv_heads, per_seq, page_size, d).permute(0, 2, 1, 3, 4).reshape(-1, kv_heads, page_size, d)

    n_pages = batch * per_seq + spare
    order = torch.randperm(n_pages, generator=generator)
    table = order[:batch * per_seq].reshape(batch, per_seq)   # logical page -> physical page

    def place(x):
        out = torch.zeros((n_pages, kv_heads, page_size, d), dtype=x.dtype, device=x.device)
        out[table.reshape(-1).to(x.device)] = pages(x)
        return out

    return place(k), place(v), table.to(torch.int32).to(k.device)


def _cache_length(k_cache, block_table) -> int | None:
    """The positions a cache in flash_decode's layout holds (None: not a 4-D tensor, left to the checks)."""
    if not (isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4):
        return None
    return k_cache.shape[2] * (block_table.shape[-1] if isinstance(block_table, torch.Tensor) else 1)


def _lengths_from_int(n: int, q, n_max: int | None, what: str = "the cache's length"):
    """flash-attn's int ``cache_seqlens``, checked on the host against [0, n_max] (no device
    synchronisation to avoid; None: not checked here) and made the (batch,) int32 tensor the
    kernels read. ``what`` says what n_max is, in the error."""
    if n_max is not None and not 0 <= n <= n_max:
        raise ValueError(f"cache_seqlens must be in [0, {n_max}] ({what}), got {n}")
    return torch.full(q.shape[:1], n, dtype=torch.int32, device=q.device)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, return_lse: bool):
    """What a call gives: its plan run (``decode.plan_of``), or, with no plan (no batch or no new
    token), zeros (and an lse of -inf) with nothing launched."""
    if plan is not None:
        return plan.run(q, k_cache, v_cache, cache_seqlens, block_table)
    o = torch.zeros_like(q)
    return (o, torch.full(q.shape[:3], float("-inf"), device=q.device)) if return_lse else o


def _signature(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values,
               window=None, softcap=None, return_lse=False):
    """Everything the checks and the launch of a call depend on, as a dict key; None when
    the call must take the checked path (a value check asked for, an argument that is
    not a tensor, a scale that is not a plain number, a window that is not None or a
    tuple of two ints, or no GPU).

    A call whose signature matches one that passed the checks would pass them again:
    each property they read (types, shapes, strides, dtypes, devices, the flags) is in
    the key, with what Triton specialises the compiled kernels on (16-byte alignment of
    each pointer; the integers come from the shapes and strides) and the float32 dot
    precision. The values in ``cache_seqlens`` and ``block_table`` are not: they are read
    on the GPU, never by the host."""
    if (check_values is not False or runtime.INTERPRET or (causal is not True and causal is not False)
            or not (num_splits is None or type(num_splits) is int)
            or not (scale is None or type(scale) is float or type(scale) is int)
            or not (softcap is None or type(softcap) is float or type(softcap) is int)
            or (return_lse is not True and return_lse is not False)
            or not (window is None or type(window) is tuple and len(window) == 2
                    and type(window[0]) is int and type(window[1]) is int)):
        return None
    try:
        tensors = tuple(tensor_key(x) for x in (q, k_cache, v_cache, cache_seqlens, block_table))
        return tensors + (num_splits, causal, scale, dot_precision(q.dtype), window, softcap, return_lse)
    except (AttributeError, TypeError):
        return None
