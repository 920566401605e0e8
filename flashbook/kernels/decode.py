"""Flash-decoding: a few new tokens against a long KV cache, split over the keys (chapter 11).

    o = flash_decode(q, k_cache, v_cache, cache_seqlens=lengths)   # q: (batch, heads, n_new, d)

While a model generates text, each step brings one new token (or a few, 1 to 16,
with speculative decoding) whose query must read the whole KV cache. The forward
kernel of chapter 7 gives one program a tile of query rows; here there is one
query row per head, so it would start batch x heads programs, each walking the
whole cache alone: at batch 1 a handful of programs on a GPU of 132 SMs, most
of the chip idle. Decoding is limited by how fast the cache can be read, and
reading it fast needs every SM.

So the keys are cut into ``num_splits`` ranges (split-K, ``flashbook.split`` in
NumPy): one program per (split, batch, KV head) folds its range of keys into
its own (o, lse) with the forward kernel's two stages (``attend``: exp2,
unmasked main stage, masked last tile), and a second small kernel merges the
splits with chapter 3's merge. Three choices make the cache be read once, at
full speed:

* GQA: the ``group = heads / kv_heads`` query heads that share a KV head are
  the rows of one tile (``group * n_new`` rows, padded to 16 for the tensor
  cores), so each K/V tile is loaded once for all of them;
* the number of splits is chosen from the number of SMs and the work
  (``choose_num_splits``, a pure function), so that batch x kv_heads x splits
  programs fill the GPU in whole waves; ``num_splits=`` overrides it;
* ragged batches: ``cache_seqlens[b]`` is sequence b's length; its keys are cut
  into splits of its own length (whole key tiles), so the programs of one
  sequence share its work evenly, and only its last tile is masked.

The combine is a second small kernel rather than torch operations: merging with
torch takes about six launches (max, subtract, exp, multiply, two sums, divide)
of a few microseconds each, which at batch 1 is as long as reading a 32K-token
cache, and writes intermediates; one kernel reads each partial result once.
With one split there is nothing to merge: the kernel writes the output itself.
More than ``MAX_ROWS`` query rows per KV head (MQA with many heads and new
tokens) take several row tiles, each reading the cache.

Causal (the default): the new tokens are the last ``n_new`` positions of each
sequence, so new token i sees cache positions j <= length - n_new + i: the
book's bottom-right alignment, with seq_k = length. Only the last n_new - 1
keys are hidden from any row: they fall in the masked last tile.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import runtime
from ..validation import check_count
from .autograd import LOG2E, last_dim_contiguous, check_inputs, dot_precision, new_buffer
from .configs import block_d
from .forward import attend, for_lengths, load_tile, normalised_rows

MAX_NEW_TOKENS = 16   # new tokens per step that flash_decode accepts
MAX_SPLITS = 128      # the combine kernel holds every split of a row at once
MAX_ROWS = 64         # query rows (group * n_new) per tile; more rows take more tiles


# ------------------------------------------------------------------ the kernels

@triton.jit
def _decode_fwd(Q, K, V, O, LSE, SEQLENS,
                stride_qb, stride_qh, stride_qm,
                stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn,
                stride_ob, stride_oh, stride_os, stride_om,
                kv_heads, n_rows, seq_max, num_splits, qk_scale,
                N_NEW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_SEQLENS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program: one split of the keys, one tile of query rows, one (batch, KV head).

    Grid (num_splits, cdiv(n_rows, BLOCK_M), batch * kv_heads). Q is viewed as
    (batch, kv_heads, n_rows, d) with n_rows = group * n_new: row r is new token
    r % N_NEW of query head r // N_NEW of the group. Writes the split's normalised
    output rows to O (indexed by split with stride_os) and their lse to LSE
    (batch, kv_heads, num_splits, n_rows).
    """
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    split = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    bh = tl.program_id(2)
    b = (bh // kv_heads).to(tl.int64)
    h_kv = (bh % kv_heads).to(tl.int64)
    if HAS_SEQLENS:
        seq_k = tl.load(SEQLENS + b).to(tl.int32)
    else:
        seq_k = seq_max

    # This split's keys [lo, hi): whole tiles of this sequence's own length.
    split_len = tl.cdiv(tl.cdiv(seq_k, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_k)
    # Keys below full_end are seen by every row (main stage, no mask): all but the
    # last n_new - 1 keys when causal, all keys but a ragged last tile otherwise.
    diagonal = seq_k - N_NEW
    if CAUSAL:
        full_end = tl.maximum(diagonal + 1, 0)
    else:
        full_end = seq_k
    full_end = (full_end // BLOCK_N) * BLOCK_N
    mid = tl.minimum(tl.maximum(full_end, lo), hi)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    token = rows % N_NEW   # the row's new token: its causal diagonal is token + seq_k - N_NEW

    q = load_tile(Q + b * stride_qb + h_kv * stride_qh, rows, stride_qm, n_rows, offs_d, HEAD_DIM,
                  True, not EVEN_D)
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, row_max, row_sum = attend(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        token, offs_n, offs_d, seq_k, diagonal, lo, mid, hi, qk_scale,
        HEAD_DIM, BLOCK_N, CAUSAL, EVEN_D, DOT_PRECISION)
    acc, lse = normalised_rows(acc, row_max, row_sum)

    row_ok = rows < n_rows
    tl.store(LSE + (bh.to(tl.int64) * num_splits + split) * n_rows + rows, lse, mask=row_ok)
    o_ptrs = (O + b * stride_ob + h_kv * stride_oh + split.to(tl.int64) * stride_os
              + rows[:, None] * stride_om + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _decode_combine(O_PART, LSE, O, stride_ob, stride_oh, stride_om, kv_heads, n_rows, num_splits,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Chapter 3's merge of every split's (o_s, lse_s) for one query row.

    Grid (n_rows, batch * kv_heads). With m = max_s lse_s (0 if every split is empty):

        o = sum_s exp(lse_s - m) o_s / sum_s exp(lse_s - m)

    the merge of the states (m, l, o) = (lse_s, 1, o_s). An empty split has lse_s =
    -inf, weight 0; a row that no split saw gets 0.
    """
    r = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(LSE + (bh * num_splits + offs_s) * n_rows + r, mask=offs_s < num_splits,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    weight = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))   # <= 1; 0 for an empty split
    row_sum = tl.sum(weight, 0)
    o_part = load_tile(O_PART + (bh * num_splits * n_rows + r) * HEAD_DIM, offs_s, n_rows * HEAD_DIM,
                       num_splits, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    o = tl.sum(weight[:, None] * o_part, 0) / tl.where(row_sum > 0.0, row_sum, 1.0)
    b, h_kv = bh // kv_heads, bh % kv_heads
    tl.store(O + b * stride_ob + h_kv * stride_oh + r * stride_om + offs_d, o.to(O.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


# ------------------------------------------------------------------ choices

def choose_num_splits(batch: int, kv_heads: int, seq_k: int, *, sm_count: int, block_n: int,
                      programs_per_sm: int = 2, min_tiles_per_split: int = 2,
                      max_splits: int = MAX_SPLITS) -> int:
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
    """
    for name, value, minimum in (("batch", batch, 1), ("kv_heads", kv_heads, 1), ("seq_k", seq_k, 0),
                                 ("sm_count", sm_count, 1), ("block_n", block_n, 1),
                                 ("programs_per_sm", programs_per_sm, 1),
                                 ("min_tiles_per_split", min_tiles_per_split, 1), ("max_splits", max_splits, 1)):
        check_count(value, name, minimum)
    slots = sm_count * programs_per_sm
    programs = batch * kv_heads
    tiles = math.ceil(seq_k / block_n)
    most = min(max_splits, max(1, tiles // min_tiles_per_split))

    def time(s):
        return math.ceil(programs * s / slots) * (math.ceil(tiles / s) + 1)

    best = min(time(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if time(s) <= 1.05 * best)


def decode_tiles(head_dim: int, elem_bytes: int, n_rows: int, *,
                 interpreter: bool | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a head_dim, an element size and
    ``n_rows = group * n_new`` query rows.

    BLOCK_M: the rows, padded to a power of two >= 16 (the tensor cores' smallest
    tile), at most ``MAX_ROWS``. BLOCK_N: keys per tile such that one K and one V
    tile together are 32 KiB (64 keys at d = 128 in 16-bit), 3 stages deep: the
    loads of about two tiles are in flight while one is used, which the memory
    system needs to stream at full speed. The interpreter takes 16 keys, so that
    small test caches span several tiles (``interpreter``: None means "if it runs here").
    """
    bd = block_d(head_dim)
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(n_rows)))
    if runtime.INTERPRET if interpreter is None else interpreter:
        return block_m, 16, 4, 1
    block_n = max(16, min(128, 32768 // (2 * bd * elem_bytes)))
    return block_m, block_n, 4, 3 if elem_bytes == 2 else 2


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 1 on the interpreter (it runs one program at a time)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# ------------------------------------------------------------------ checks

def _check_seqlens(cache_seqlens, batch: int, n_max: int, device) -> torch.Tensor | None:
    if cache_seqlens is None:
        return None
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be a torch.Tensor of ints or None, got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if cache_seqlens.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape ({batch},) (one length per sequence), "
                         f"got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != device:
        raise ValueError(f"cache_seqlens must be on q's device {device}, got {cache_seqlens.device}")
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return cache_seqlens.to(torch.int32).contiguous()   # no sync inside a CUDA graph: values unchecked
    lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())   # one device sync
    if lo < 0 or hi > n_max:
        raise ValueError(f"cache_seqlens must be in [0, {n_max}] (the cache's length), got values in [{lo}, {hi}]")
    return cache_seqlens.to(torch.int32).contiguous()


# ------------------------------------------------------------------ the entry point

def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, num_splits=None, causal: bool = True,
                 scale=None):
    """Attention of a few new tokens over a KV cache, split over the keys: returns o.

    Args:
        q: (batch, heads, n_new, head_dim), 1 <= n_new <= 16, float16, bfloat16 or float32.
        k_cache, v_cache: (batch, kv_heads, n_max, head_dim), same dtype and device;
            kv_heads divides heads (GQA; 1 is multi-query). The last axis contiguous
            is best (anything else is copied).
        cache_seqlens: (batch,) int32/int64 tensor on q's device, each sequence's length
            in [0, n_max] (the keys past it are never read); None means n_max for all.
            The values are checked (one device synchronisation), except while a CUDA
            graph is being captured.
        num_splits: how many ranges the keys of each sequence are cut into, 1 to 128;
            None chooses from the GPU's SM count (``choose_num_splits``).
        causal: new token i (of n_new) sits at position length - n_new + i and sees the
            cache up to there (bottom-right alignment); rows that see no key give 0.
        scale: multiplies the scores; None means 1/sqrt(head_dim).

    Returns:
        o, (batch, heads, n_new, head_dim), q's dtype, contiguous.
    """
    scale = check_inputs(q, k_cache, v_cache, causal, scale, names=("q", "k_cache", "v_cache"))
    batch, heads, n_new, head_dim = q.shape
    kv_heads, n_max = k_cache.shape[1], k_cache.shape[2]
    if n_new > MAX_NEW_TOKENS:
        raise ValueError(f"q must hold 1 to {MAX_NEW_TOKENS} new tokens per sequence (axis 2), "
                         f"got shape {tuple(q.shape)}; use flash_attention for longer queries")
    if batch == 0 or n_new == 0:   # nobody attending: an empty output, nothing launched
        return torch.zeros_like(q)
    seqlens = _check_seqlens(cache_seqlens, batch, n_max, q.device)
    group = heads // kv_heads
    n_rows = group * n_new
    block_m, block_n, num_warps, num_stages = decode_tiles(head_dim, q.element_size(), n_rows)
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, n_max, sm_count=sm_count(q.device), block_n=block_n)
    elif check_count(num_splits, "num_splits") > MAX_SPLITS:
        raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")

    # (batch, heads, n_new, d) -> (batch, kv_heads, group * n_new, d): a group's rows side by side
    q_rows = last_dim_contiguous(q.reshape(batch, kv_heads, n_rows, head_dim))
    k_cache, v_cache = last_dim_contiguous(k_cache), last_dim_contiguous(v_cache)
    o = new_buffer((batch, kv_heads, n_rows, head_dim), device=q.device, dtype=q.dtype)
    if num_splits == 1:   # one split: the kernel writes the output itself
        o_part = o
        o_part_strides = (o.stride(0), o.stride(1), 0, o.stride(2))
    else:
        o_part = new_buffer((batch, kv_heads, num_splits, n_rows, head_dim), device=q.device,
                            dtype=torch.float32)
        o_part_strides = (o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3))
    lse = new_buffer((batch, kv_heads, num_splits, n_rows), device=q.device, dtype=torch.float32)
    precision = dot_precision(q.dtype)

    grid = (num_splits, triton.cdiv(n_rows, block_m), batch * kv_heads)
    lengths = (n_rows, n_max, num_splits)   # a length of 1 takes the unspecialised twin (forward.LENGTH_ARGS)
    for_lengths(_decode_fwd, lengths, ("n_rows", "seq_max", "num_splits"))[grid](
        q_rows, k_cache, v_cache, o_part, lse, seqlens if seqlens is not None else lse,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *o_part_strides,
        kv_heads, n_rows, n_max, num_splits, scale * LOG2E,
        N_NEW=n_new, HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=causal, HAS_SEQLENS=seqlens is not None, DOT_PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages)
    if num_splits > 1:
        for_lengths(_decode_combine, lengths, ("n_rows", "num_splits"))[(n_rows, batch * kv_heads)](
            o_part, lse, o, o.stride(0), o.stride(1), o.stride(2), kv_heads, n_rows, num_splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=triton.next_power_of_2(num_splits),
            num_warps=4)
    return o.view(batch, heads, n_new, head_dim)
