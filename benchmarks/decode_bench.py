"""Time flash-decoding on a GPU: flash_decode against SDPA's backends and flash_attention.

    PYTHONPATH=. python3 benchmarks/decode_bench.py --out DIR [--sweep-splits] [--sweep-tiles]
    PYTHONPATH=. python3 benchmarks/decode_bench.py --dry-run      # the plan, on any machine

One decoding step of a model with 32 query heads sharing 8 KV heads (GQA),
head_dim 128, bf16, one new token per sequence (N_new = 1), for batch 1, 8, 64
and cache lengths N = 1K, 2K, ..., 128K. Every implementation gets the same
fresh standard-normal q and cache and is timed as

* ``flash_decode``: this book's split-K kernel, the split count its own choice;
* ``flash_decode-paged``: the same call on the same cache cut into shuffled pages of
  ``PAGE_SIZE`` tokens (``decode.paginate``, not timed) read through ``block_table``;
* ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``, ``sdpa-math``: torch's
  ``scaled_dot_product_attention`` held to one backend, with ``enable_gqa=True``
  where the backend takes it, else with K/V repeated to 32 heads beforehand (the
  repeat is not timed; the ``gqa`` column says which);
* ``flash_attention``: the book's forward kernel (chapter 7), one program per
  query tile of each head, no split of the keys;
* ``flash_decode-softcap``, ``flash_decode-lse``: flash_decode with ``softcap=SOFTCAP``
  (checked against a capped reference), and with ``return_softmax_lse=True`` (its lse
  checked too): what the two options cost;
* ``kvcache``, ``kvcache-append``, ``kvcache-rotary``, ``kvcache-paged-append``:
  ``flashbook.flash_attn_with_kvcache`` called as flash-attn's, with the caches in its
  layout (batch, N, kv_heads, d): reading only; appending the step's token in place;
  appending and rotating q and k (tables of angle 0: the work of a rotation, the same
  output); appending into shuffled pages. What flash-attn's front door costs over
  ``flash_decode`` (host work, and the writes: ``kernels.append``, a launch or two).

With one new token the causal mask hides nothing (the token is the last
position), so SDPA runs without a mask (its ``is_causal`` is top-left aligned)
and the book's kernels with ``causal=True``: the same attention.

Two times per implementation, both the median over calls with the L2 cache
flushed before each (``flashbook.bench.CudaTimer``): ``ms``, the call from Python
(CPU overheads included when they exceed the GPU's work), and ``graph_ms``, the
same call captured in a CUDA graph and replayed (the GPU's time alone, as
serving engines run their decoding steps). Bandwidth: KV-cache bytes read
(2 x batch x 8 x N x 128 x 2 bytes) per second, against the device-to-device
copy bandwidth measured here with a 4 GiB ``torch`` copy, counting the bytes read
plus the bytes written (the convention of ``cudaMemcpy`` bandwidth tests).

Correctness of every timed output: batch 0 against a float64 reference on the
GPU, by the book's criterion (``checks.within_twice_yardstick``: at most twice
the error of PyTorch attention computed in bf16), and its relative error; an lse
returned is held to 1e-3 of the float64 one.

Writes DIR/decode.csv, DIR/provenance.json (GPU, driver, torch, triton, date,
command, git commit...), and with ``--sweep-splits`` DIR/decode_splits.csv (the
time of every split count at a few shapes, and which one ``choose_num_splits``
picks), with ``--sweep-tiles`` DIR/decode_tiles.csv (key tile, warps, stages).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
from flashbook import bench  # noqa: E402
from flashbook.bench import graph_replay  # noqa: E402
from flashbook.kernels import checks, decode, flash_decode  # noqa: E402
from flashbook.kernels.autograd import flash_attention  # noqa: E402  (the Triton kernel)
from flashbook.reference import torch_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, N_NEW = 32, 8, 128, 1
BATCHES = (1, 8, 64)
SEQS = tuple(1024 * 2**i for i in range(8))            # 1K ... 128K
IMPLS = ("flash_decode", "flash_decode-paged", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flash_attention",
         "flash_decode-softcap", "flash_decode-lse", "kvcache", "kvcache-append", "kvcache-rotary", "kvcache-paged-append")
SOFTCAP = 30.0                                         # the cap of the -softcap row (Grok-1's; Gemma-2 uses 50)
SOFTCAP_OF = {"flash_decode-softcap": SOFTCAP}         # implementations whose attention is soft-capped
SPLIT_SHAPES = ((1, 8192), (1, 32768), (1, 131072), (8, 32768), (64, 8192))
SPLIT_COUNTS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128)
TILE_SHAPES = ((1, 32768), (8, 32768), (64, 16384))
TILE_GRID = [(bn, w, s) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4, 5)]
BYTES = 2                                              # bf16
PAGE_SIZE = 64                                         # tokens per page of the paged cache
COPY_BYTES = 4 * 2**30


@dataclasses.dataclass
class Row:
    batch: int
    seq: int
    impl: str
    status: str = "ok"            # ok, oom, unsupported, error, skipped-memory, skipped-time
    ms: float | None = None       # median time of the call from Python
    graph_ms: float | None = None  # median time of the call replayed from a CUDA graph
    kv_bytes: int = 0
    kv_tb_s: float | None = None          # KV-cache bytes / ms
    kv_tb_s_graph: float | None = None    # KV-cache bytes / graph_ms
    copy_fraction: float | None = None        # kv_tb_s / measured copy bandwidth
    copy_fraction_graph: float | None = None  # kv_tb_s_graph / measured copy bandwidth
    num_splits: int | None = None
    gqa: str | None = None        # how GQA reached the implementation
    max_error: float | None = None
    rel_error: float | None = None
    check: str | None = None      # "pass" / the book's criterion's complaint
    note: str | None = None


FIELDS = [f.name for f in dataclasses.fields(Row)]


def kv_bytes(batch: int, seq: int) -> int:
    """Bytes of the K and V caches one decoding step reads."""
    return 2 * batch * KV_HEADS * seq * HEAD_DIM * BYTES


def plan(batches=BATCHES, seqs=SEQS, memory_bytes: float = 141e9) -> list[tuple[int, int, str | None]]:
    """(batch, seq, why skipped or None): caches that fit in half the GPU's memory run
    (the other half is room for the outputs, the expanded K/V of SDPA backends
    without GQA, and the float64 reference)."""
    return [(b, n, None if kv_bytes(b, n) <= memory_bytes / 2 else "skipped-memory")
            for b in batches for n in seqs]


# ------------------------------------------------------------------ timing

def copy_bandwidth(timer) -> dict:
    """Device-to-device copy of COPY_BYTES: (read + written bytes) / median time."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_copied": COPY_BYTES, "ms": ms, "tb_s_read_plus_write": 2 * COPY_BYTES / ms / 1e9,
            "convention": "bytes read + bytes written per second (2 x bytes copied / time)"}


# ------------------------------------------------------------------ the implementations

def _sdpa(backend: str):
    """SDPA on one backend: GQA as enable_gqa if the backend takes it, else K/V repeated
    (outside the timed call). Returns (call, gqa mode)."""
    attention = bench.sdpa_attention(backend)

    def prepare(q, k, v):
        try:
            attention(q, k, v)
            return (lambda: attention(q, k, v)), "enable_gqa"
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:  # this backend has no GQA: repeat the heads
            g = q.shape[1] // k.shape[1]
            ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            return (lambda: attention(q, ke, ve)), "repeated"
    return prepare


def _flash_attn_layout(k, v):
    """The caches as flash-attn holds them: (batch, capacity, kv_heads, head_dim), contiguous."""
    return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()


def _kvcache(append: bool = False, rotary: bool = False, paged: bool = False):
    """flash_attn_with_kvcache as a flash-attn caller makes it: q (batch, 1, heads, d), caches in
    flash-attn's layout. With ``append``, the step's k and v are the cache's last token, written in
    place at position N - 1 on every call (the same values, so every call attends to the same cache
    and the output is checked against the same reference). ``rotary``: tables of cos 1 and sin 0 over
    all 128 features (a rotation by zero: the work of a rotation, and the same output). ``paged``:
    pages of PAGE_SIZE tokens, shuffled, as ``flash_decode-paged``. The output is transposed back to
    (batch, heads, 1, d) by the harness, outside the timed call."""
    def prepare(q, k, v):
        qt = q.transpose(1, 2).contiguous()
        kwargs = {"causal": True}
        note = "flash-attn layout"
        if paged:
            gen = torch.Generator().manual_seed(0)
            k_pages, v_pages, table = decode.paginate(k, v, PAGE_SIZE, generator=gen)
            k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in (k_pages, v_pages))
            kwargs["block_table"] = table.to(q.device)
            note += f", pages of {PAGE_SIZE}, shuffled"
        else:
            k_cache, v_cache = _flash_attn_layout(k, v)
        if append:
            kwargs.update(k=k[:, :, -1:].transpose(1, 2).contiguous(), v=v[:, :, -1:].transpose(1, 2).contiguous(),
                          cache_seqlens=k.shape[2] - 1)
            note += ", appends 1 token"
        if rotary:
            kwargs["rotary_cos"] = torch.ones(k.shape[2], HEAD_DIM // 2, device=q.device, dtype=q.dtype)
            kwargs["rotary_sin"] = torch.zeros_like(kwargs["rotary_cos"])
            note += ", rotary (angle 0) on q and k"
        from flashbook import flash_attn_with_kvcache

        return (lambda: flash_attn_with_kvcache(qt, k_cache, v_cache, **kwargs)), note
    return prepare


def implementations():
    def ours(q, k, v):
        return (lambda: flash_decode(q, k, v)), "one tile per KV head"

    def forward_kernel(q, k, v):
        return (lambda: flash_attention(q, k, v, causal=True)), "kernel indexes the KV head"

    def paged(q, k, v):
        gen = torch.Generator().manual_seed(0)
        k_pages, v_pages, table = decode.paginate(k, v, PAGE_SIZE, generator=gen)
        table = table.to(q.device)
        return (lambda: flash_decode(q, k_pages, v_pages, block_table=table)), f"pages of {PAGE_SIZE}, shuffled"

    def softcapped(q, k, v):
        return (lambda: flash_decode(q, k, v, softcap=SOFTCAP)), f"softcap {SOFTCAP:g}"

    def with_lse(q, k, v):
        return (lambda: flash_decode(q, k, v, return_softmax_lse=True)), "returns (o, lse)"

    found = {"flash_decode": ours, "flash_decode-paged": paged, "flash_attention": forward_kernel,
             "flash_decode-softcap": softcapped, "flash_decode-lse": with_lse,
             "kvcache": _kvcache(), "kvcache-append": _kvcache(append=True),
             "kvcache-rotary": _kvcache(append=True, rotary=True),
             "kvcache-paged-append": _kvcache(append=True, paged=True)}
    for backend in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"):
        found[backend] = _sdpa(backend)
    return found


def reference_batch0(q, k, v, softcap=None):
    """float64 truth (o and each row's lse) and the bf16 PyTorch yardstick for batch 0 (on the GPU);
    ``softcap``: the scores capped as the implementation caps them."""
    q0, k0, v0 = q[:1], k[:1], v[:1]
    want, lse = torch_attention(q0.double(), k0.double(), v0.double(), softcap=softcap, return_lse=True)
    return want.cpu(), checks.torch_attention(q0, k0, v0, softcap=softcap).cpu(), lse.cpu()


def _output(name: str, result):
    """(o in (batch, heads, new tokens, d), lse or None) of one implementation's result."""
    o, lse = result if isinstance(result, tuple) else (result, None)
    return (o.transpose(1, 2) if name.startswith("kvcache") else o), lse


def judge(row: Row, o, want, yardstick, lse=None, want_lse=None):
    got = o[:1].detach().cpu()
    row.max_error, _ = checks.max_error(got, want)
    row.rel_error = float((got.double() - want).norm() / want.norm())
    problem = checks.within_twice_yardstick("o", got, want, yardstick, head_dim=HEAD_DIM)
    row.check = "pass" if problem is None else problem
    if lse is not None:   # float32 logsumexp of ~N(0, 1) scores over N keys: a few float32 steps
        error = float((lse[:1].detach().cpu().double() - want_lse).abs().max())
        row.note = f"{row.note + '; ' if row.note else ''}max lse error {error:.2e}"
        if error > 1e-3 and row.check == "pass":
            row.check = f"lse off by {error:.2e} (> 1e-3)"


def decode_inputs(batch: int, seq: int, device="cuda", generator=None):
    """One decoding step's q (N_NEW new tokens) and its K and V caches of ``seq`` tokens,
    standard normal in bf16."""
    def randn(*size):
        return torch.randn(*size, device=device, dtype=torch.bfloat16, generator=generator)
    return randn(batch, HEADS, N_NEW, HEAD_DIM), randn(batch, KV_HEADS, seq, HEAD_DIM), \
        randn(batch, KV_HEADS, seq, HEAD_DIM)


def run_shape(batch, seq, impls, timer, copy_tb_s, deadline) -> list[Row]:
    gen = torch.Generator(device="cuda").manual_seed(batch * 1_000_003 + seq)
    q, k, v = decode_inputs(batch, seq, generator=gen)
    references = {cap: reference_batch0(q, k, v, softcap=cap) for cap in {SOFTCAP_OF.get(name) for name in impls}}
    rows = []
    for name, prepare in impls.items():
        row = Row(batch, seq, name, kv_bytes=kv_bytes(batch, seq))
        if name == "flash_decode":
            tiles = decode.decode_tiles(HEAD_DIM, BYTES, HEADS // KV_HEADS * N_NEW)
            row.num_splits = decode.choose_num_splits(batch, KV_HEADS, seq, sm_count=decode.sm_count(q.device),
                                                      block_n=tiles[1])
        if time.time() > deadline and name not in ("flash_decode", "flash_decode-paged", "sdpa-cudnn"):
            row.status = "skipped-time"
            rows.append(row)
            continue
        try:
            call, row.gqa = prepare(q, k, v)
            want, yardstick, want_lse = references[SOFTCAP_OF.get(name)]
            o, lse = _output(name, call())
            judge(row, o, want, yardstick, lse, want_lse)
            row.ms = timer(call)
            try:
                replay, _ = graph_replay(call)
                row.graph_ms = timer(replay)
            except Exception as e:  # noqa: BLE001 - the eager time stands; say why there is no graph time
                status, note = bench.classify_error(e, name)
                if status == "cuda-error":
                    raise
                row.note = f"no CUDA graph: {note}"
        except Exception as e:  # noqa: BLE001 - recorded (oom, unsupported, ...), and the table goes on
            row.status, row.note = bench.classify_error(e, name)
            if row.status == "cuda-error":  # the CUDA context is lost: nothing after this can run
                raise
        for t, bw, frac in (("ms", "kv_tb_s", "copy_fraction"), ("graph_ms", "kv_tb_s_graph", "copy_fraction_graph")):
            if getattr(row, t):
                setattr(row, bw, row.kv_bytes / getattr(row, t) / 1e9)
                setattr(row, frac, getattr(row, bw) / copy_tb_s)
        rows.append(row)
        torch.cuda.empty_cache()
    del q, k, v
    torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ the goals

def goals(rows, min_seq: int = 32768, fraction: float = 0.8) -> dict:
    """The issue's two goals, read from the rows (graph times, and the eager ones beside them):
    flash_decode at >= ``fraction`` of the copy bandwidth for every batch at N >= ``min_seq``,
    and faster than every SDPA backend that ran at batch 1."""
    ours = {(r.batch, r.seq): r for r in rows if r.impl == "flash_decode" and r.status == "ok"}
    out = {}
    for key in ("graph_ms", "ms"):
        frac = "copy_fraction_graph" if key == "graph_ms" else "copy_fraction"
        long = {f"B{b}-N{n}": round(getattr(r, frac), 3) for (b, n), r in ours.items()
                if n >= min_seq and getattr(r, frac) is not None}
        slower = []
        for r in rows:
            mine = ours.get((r.batch, r.seq))
            if (r.batch == 1 and r.impl.startswith("sdpa") and r.status == "ok" and mine
                    and getattr(r, key) is not None and getattr(mine, key) is not None
                    and getattr(r, key) <= getattr(mine, key)):
                slower.append(f"N{r.seq}: {r.impl} {getattr(r, key):.4f} ms <= {getattr(mine, key):.4f} ms")
        out[key] = {f"copy_fraction_at_N>={min_seq}": long,
                    f"all_at_least_{fraction}": bool(long) and min(long.values()) >= fraction,
                    "batch1_sdpa_not_slower": slower,
                    "batch1_faster_than_every_sdpa": bool(ours) and not slower}
    return out


# ------------------------------------------------------------------ sweeps

@contextlib.contextmanager
def _reading(cache):
    """flash_decode as a sweep's cache kind reads: "paged-rows" is a paged cache read with
    one page index per key row (``decode.TILE_IN_PAGE`` off); plans made under the other
    setting are forgotten on the way in and out."""
    original = decode.TILE_IN_PAGE
    decode.TILE_IN_PAGE = original and cache != "paged-rows"
    decode._PLANS.clear()
    try:
        yield
    finally:
        decode.TILE_IN_PAGE = original
        decode._PLANS.clear()


def _sweep_inputs(batch, seq, cache):
    """q and the cache of one sweep shape, dense or cut into shuffled pages; the call's
    extra arguments (block_table) as a dict."""
    q, k, v = decode_inputs(batch, seq)
    if cache == "dense":
        return q, k, v, {}
    k, v, table = decode.paginate(k, v, PAGE_SIZE, generator=torch.Generator().manual_seed(0))
    return q, k, v, {"block_table": table.to(q.device)}


def sweep_splits(timer, copy_tb_s, shapes=SPLIT_SHAPES, caches=("dense",), counts=SPLIT_COUNTS) -> list[dict]:
    rows = []
    for batch, seq in shapes:
        for cache in caches:
            q, k, v, extra = _sweep_inputs(batch, seq, cache)
            block_n = decode.decode_tiles(HEAD_DIM, BYTES, HEADS // KV_HEADS * N_NEW)[1]
            chosen = decode.choose_num_splits(batch, KV_HEADS, seq, sm_count=decode.sm_count(q.device),
                                              block_n=block_n)
            with _reading(cache):
                for s in sorted(set(counts) | {chosen}):
                    if s > max(1, seq // block_n):
                        continue
                    replay, _ = graph_replay(lambda: flash_decode(q, k, v, num_splits=s, **extra))
                    ms = timer(replay)
                    rows.append({"batch": batch, "seq": seq, "cache": cache, "num_splits": s,
                                 "chosen": s == chosen, "graph_ms": ms,
                                 "copy_fraction_graph": kv_bytes(batch, seq) / ms / 1e9 / copy_tb_s})
                    print(rows[-1], flush=True)
            del q, k, v, extra
            torch.cuda.empty_cache()
    return rows


@contextlib.contextmanager
def tiles_fixed(block_n, num_warps, num_stages):
    """flash_decode with other key tiles, warps and stages (for the sweep only)."""
    original = decode.decode_tiles

    def fixed(head_dim, elem_bytes, n_rows, *, page_size=0, interpreter=None):
        return original(head_dim, elem_bytes, n_rows)[0], block_n, num_warps, num_stages
    decode.decode_tiles = fixed
    decode._PLANS.clear()   # a plan of the same call signature would launch the old tiles
    try:
        yield
    finally:
        decode.decode_tiles = original
        decode._PLANS.clear()


def sweep_tiles(timer, copy_tb_s, shapes=TILE_SHAPES, caches=("dense",), grid=TILE_GRID) -> list[dict]:
    rows = []
    for batch, seq in shapes:
        for cache in caches:
            q, k, v, extra = _sweep_inputs(batch, seq, cache)
            default = decode.decode_tiles(HEAD_DIM, BYTES, HEADS // KV_HEADS * N_NEW,
                                          page_size=PAGE_SIZE if extra else 0)
            for block_n, warps, stages in grid:
                row = {"batch": batch, "seq": seq, "cache": cache, "block_n": block_n, "num_warps": warps,
                       "num_stages": stages, "default": (block_n, warps, stages) == tuple(default[1:])}
                try:
                    with _reading(cache), tiles_fixed(block_n, warps, stages):
                        replay, _ = graph_replay(lambda: flash_decode(q, k, v, **extra))
                        row["num_splits"] = decode.choose_num_splits(
                            batch, KV_HEADS, seq, sm_count=decode.sm_count(q.device), block_n=block_n)
                        row["graph_ms"] = timer(replay)
                    row["copy_fraction_graph"] = kv_bytes(batch, seq) / row["graph_ms"] / 1e9 / copy_tb_s
                except Exception as e:  # noqa: BLE001 - out of shared memory, say
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(row, flush=True)
            del q, k, v, extra
            torch.cuda.empty_cache()
    return rows


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """'64x2K,1x32K' -> ((64, 2048), (1, 32768))."""
    out = []
    for part in text.split(","):
        batch, _, seq = part.strip().partition("x")
        if not seq:
            raise argparse.ArgumentTypeError(f"a shape is BATCHxSEQ (e.g. 64x32K), got {part!r}")
        out.append((int(batch), bench.parse_seq_list(seq)[0]))
    return tuple(out)


# ------------------------------------------------------------------ main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="directory for decode.csv and provenance.json (required unless --dry-run)")
    p.add_argument("--batches", type=bench.parse_int_list, default=BATCHES, help="comma-separated, e.g. 1,8,64")
    p.add_argument("--seqs", type=bench.parse_seq_list, default=SEQS, help="comma-separated, e.g. 1K,32K")
    p.add_argument("--impl", type=lambda s: tuple(x.strip() for x in s.split(",")), default=IMPLS,
                   help=f"comma-separated subset of {','.join(IMPLS)}")
    p.add_argument("--sweep-splits", action="store_true", help="time every split count at a few shapes")
    p.add_argument("--sweep-tiles", action="store_true", help="time key tiles x warps x stages at a few shapes")
    p.add_argument("--split-shapes", type=parse_shapes, default=SPLIT_SHAPES,
                   help="BATCHxSEQ list for --sweep-splits, e.g. 64x2K,64x32K")
    p.add_argument("--tile-shapes", type=parse_shapes, default=TILE_SHAPES,
                   help="BATCHxSEQ list for --sweep-tiles")
    p.add_argument("--tile-block-n", type=bench.parse_int_list, default=(32, 64, 128),
                   help="key tiles for --sweep-tiles (x warps 4, 8 x stages 2-5)")
    p.add_argument("--sweep-caches", type=lambda s: tuple(x.strip() for x in s.split(",")), default=("dense",),
                   help="dense, paged, paged-rows (pages read with an index per key row): the caches the sweeps time")
    p.add_argument("--rep-ms", type=float, default=60.0, help="timed calls per measurement, in ms of work")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="after this many seconds only flash_decode and sdpa-flash are still timed")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = p.parse_args(argv)
    unknown = set(args.impl) - set(IMPLS)
    if unknown:
        p.error(f"--impl: unknown {sorted(unknown)}; choose from {IMPLS}")
    if not args.dry_run and not args.out:
        p.error("--out DIR is required")
    if set(args.sweep_caches) - {"dense", "paged", "paged-rows"}:
        p.error(f"--sweep-caches: dense, paged, paged-rows, got {','.join(args.sweep_caches)}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 141e9
    shapes = plan(args.batches, args.seqs, memory)
    if args.dry_run:
        for b, n, skip in shapes:
            print(f"batch {b:3d}  N {n:7d}  KV cache {kv_bytes(b, n) / 1e9:7.2f} GB  {skip or 'run'}")
        return 0
    if flashbook.runtime.device() != "cuda":
        print("decode_bench.py needs a CUDA GPU (--dry-run prints the plan anywhere)", file=sys.stderr)
        return 2
    start = time.time()
    os.makedirs(args.out, exist_ok=True)
    prov = bench.collect_provenance(argv, program="python3 benchmarks/decode_bench.py")
    prov["settings"] = {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "n_new": N_NEW,
                        "dtype": "bf16", "batches": list(args.batches), "seqs": list(args.seqs),
                        "impl": list(args.impl), "rep_ms": args.rep_ms, "budget_s": args.budget_s,
                        "decode_tiles": decode.decode_tiles(HEAD_DIM, BYTES, HEADS // KV_HEADS * N_NEW),
                        "sm_count": decode.sm_count(torch.device("cuda"))}
    prov["timing"] = {"method": "flashbook.bench.CudaTimer: CUDA events around each call, a 256 MB buffer "
                                "written before each timed call (L2 flushed), median",
                      "ms": "the call from Python", "graph_ms": "the same call captured in a CUDA graph, replayed",
                      "rep_ms": args.rep_ms}
    prov["conventions"] = {
        "kv_bytes": "2 * batch * kv_heads * seq * head_dim * 2 (K and V caches, bf16), read once",
        "kv_tb_s": "kv_bytes / time",
        "copy_bandwidth": "device-to-device torch copy of 4 GiB: (bytes read + bytes written) / median time",
        "copy_fraction": "kv_tb_s / copy bandwidth",
        "causal": "one new token sees the whole cache: SDPA unmasked, the book's kernels causal=True (same)",
        "check": "batch 0 vs float64: within twice the max error of PyTorch attention in bf16 "
                 "(flashbook.kernels.checks.within_twice_yardstick)",
    }
    timer = bench.CudaTimer(rep_ms=args.rep_ms)
    copy = copy_bandwidth(timer)
    prov["copy_bandwidth"] = copy
    print(f"copy bandwidth {copy['tb_s_read_plus_write']:.2f} TB/s (read + write)", flush=True)
    impls = {k: fn for k, fn in implementations().items() if k in args.impl}
    deadline = start + args.budget_s
    rows = []
    for batch, seq, skip in shapes:
        if skip:
            rows += [Row(batch, seq, name, status=skip, kv_bytes=kv_bytes(batch, seq)) for name in impls]
            continue
        for row in run_shape(batch, seq, impls, timer, copy["tb_s_read_plus_write"], deadline):
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in dataclasses.asdict(row).items()
                   if k in ("batch", "seq", "impl", "status", "ms", "graph_ms", "copy_fraction_graph",
                            "num_splits", "check")}, flush=True)
        bench.write_csv(rows, os.path.join(args.out, "decode.csv"), FIELDS)
    prov["files"]["decode.csv"] = "one row per (batch, seq, impl)"
    prov["goals"] = goals(rows)
    print(json.dumps(prov["goals"], indent=1), flush=True)
    if args.sweep_splits:
        split_rows = sweep_splits(timer, copy["tb_s_read_plus_write"], args.split_shapes, args.sweep_caches)
        bench.write_csv(split_rows, os.path.join(args.out, "decode_splits.csv"), list(split_rows[0]))
        prov["files"]["decode_splits.csv"] = "flash_decode graph time for each num_splits at a few shapes"
    if args.sweep_tiles:
        grid = [t for t in TILE_GRID if t[0] in args.tile_block_n]
        tile_rows = sweep_tiles(timer, copy["tb_s_read_plus_write"], args.tile_shapes, args.sweep_caches, grid)
        fields = ["batch", "seq", "cache", "block_n", "num_warps", "num_stages", "default", "num_splits", "graph_ms",
                  "copy_fraction_graph", "error"]
        bench.write_csv(tile_rows, os.path.join(args.out, "decode_tiles.csv"), fields)
        prov["files"]["decode_tiles.csv"] = "flash_decode graph time for key tile x warps x stages"
    prov["elapsed_s"] = round(time.time() - start, 1)
    bench.write_provenance(prov, os.path.join(args.out, "provenance.json"))
    print(json.dumps({"elapsed_s": prov["elapsed_s"], "out": args.out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
