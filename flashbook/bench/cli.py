"""``python -m flashbook.bench``: time attention on this GPU and record it with provenance.

    python -m flashbook.bench                 # the full sweep (a few minutes on an H200)
    python -m flashbook.bench --quick         # four shapes
    python -m flashbook.bench --impl naive,sdpa-flash,flashbook,flashbook-atomic --seq 4K,8K
    python -m flashbook.bench --sweep-blocks  # block sizes of our forward kernel
    python -m flashbook.bench --ladder        # chapter 10's performance ladder
    python -m flashbook.bench --peer .peer/06-fused-attention.py   # beside a peer's kernel
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

from .. import runtime
from .harness import MODEL_WIDTH, RESULT_FIELDS, TOKENS, make_shapes, run_sweep
from .impls import IMPLEMENTATIONS, flashbook_impls
from .peer import (COMPARED, PEER_DTYPE, PEER_FIELDS, PEER_HEAD_DIMS, PEER_SEQS, SHAPES_HELP,
                   format_peer_table, load_peer, peer_provenance, peer_shapes, run_peer)
from .records import (collect_provenance, default_out_dir, format_block_table, format_ladder_table,
                      format_table, gpu_info, write_csv, write_provenance)
from .sweeps import (BLOCK_FIELDS, LADDER_FIELDS, LADDER_SEQS, SWEEP_SEQS, block_configs,
                     run_block_sweep, run_ladder)

DEFAULT_SEQS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_HEAD_DIMS = (64, 128)
QUICK_SEQS = (1024, 4096)
QUICK_HEAD_DIMS = (128,)


_SEQ_RE = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


def parse_seq_list(text: str) -> tuple:
    """``"1K,2k,4096"`` -> (1024, 2048, 4096). K means 1024."""
    out = []
    for part in str(text).split(","):
        m = _SEQ_RE.match(part)
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated positive sequence lengths such as "
                f"'1024,4K' (K = 1024), got {text!r}")
        out.append(value)
    return tuple(out)


def parse_int_list(text: str) -> tuple:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated positive integers such as '64,128', got {text!r}")
        out.append(int(part))
    return tuple(out)


def parse_causal(text: str) -> tuple:
    choices = {"both": (False, True), "yes": (True,), "true": (True,), "no": (False,),
               "false": (False,)}
    try:
        return choices[str(text).strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"expected one of both, yes, no; got {text!r}") from None


def parse_impl_list(text: str) -> tuple:
    if str(text).strip() == "all":
        return ("all",)
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if part not in IMPLEMENTATIONS and not re.fullmatch(r"flashbook-[\w.-]+", part):
            raise argparse.ArgumentTypeError(
                f"unknown implementation {part!r}; choose from "
                f"{', '.join(IMPLEMENTATIONS)} (comma-separated) or 'all'")
        out.append(part)
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flashbook.bench",
        description="Time attention forward and backward on this GPU: naive PyTorch, "
                    "PyTorch SDPA backends and flashbook's Triton kernel.")
    p.add_argument("--quick", action="store_true",
                   help="a short run: d=128, seq 1K and 4K, causal and not")
    p.add_argument("--seq", type=parse_seq_list, default=None,
                   help="sequence lengths, e.g. 1K,2K,4K,8K,16K (the default)")
    p.add_argument("--head-dim", type=parse_int_list, default=None,
                   help="head dimensions, e.g. 64,128 (the default)")
    p.add_argument("--causal", type=parse_causal, default=None,
                   help="both (default), yes or no")
    p.add_argument("--impl", type=parse_impl_list, default=("all",),
                   help=f"implementations, comma-separated: {', '.join(IMPLEMENTATIONS)}, "
                        f"flashbook-atomic (the atomic-dQ backward) (default: all)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default=None,
                   help=f"bf16 (default) or fp16 ({PEER_DTYPE} with --peer)")
    p.add_argument("--tokens", type=int, default=TOKENS,
                   help=f"batch * seq for every shape (default {TOKENS})")
    p.add_argument("--heads", type=int, default=None,
                   help=f"heads (default {MODEL_WIDTH} // head_dim)")
    p.add_argument("--warmup-ms", type=float, default=25.0,
                   help="warm-up time per measurement, ms (default 25)")
    p.add_argument("--rep-ms", type=float, default=None,
                   help="timed repetitions per measurement, ms (default 100, 50 with "
                        "--quick; at least 5 reps)")
    p.add_argument("--max-naive-gb", type=float, default=60.0,
                   help="skip naive and sdpa-math where they would need more memory "
                        "than this, recording 'oom-skipped' (default 60)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default benchmarks/results/<date>-<gpu>/)")
    p.add_argument("--sweep-blocks", action="store_true",
                   help="instead: sweep block sizes of flashbook's forward kernel "
                        "(default seq 4K, d 64 and 128, not causal)")
    p.add_argument("--ladder", action="store_true",
                   help="time each rung of chapter 10's performance ladder (forward) and "
                        "the two dQ strategies (backward); writes ladder.csv")
    p.add_argument("--peer", metavar="PATH[:FUNC]", default=None,
                   help="instead: time a peer's attention, a Python file you supply (e.g. "
                        "Triton's python/tutorials/06-fused-attention.py), beside flashbook "
                        "and sdpa-flash; FUNC (default attention) is called as "
                        "FUNC(q, k, v, causal, scale). Shapes: d 64,128, N 1K,4K,16K, both "
                        f"causal, fp16, {SHAPES_HELP}; --seq, --head-dim, --causal, --dtype "
                        "and --heads override them. Writes peer.csv")
    p.add_argument("--graph", action="store_true",
                   help="time each call replayed from a CUDA graph: the GPU's work alone, "
                        "without the host's (Python, input checks, the launch); by default a "
                        "call is timed as Python makes it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and complete the arguments; bad values exit with a clear message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"--tokens must be a positive integer, got {args.tokens}")
    if args.heads is not None and args.heads < 1:
        parser.error(f"--heads must be a positive integer, got {args.heads}")
    if args.rep_ms is None:
        args.rep_ms = 50.0 if args.quick else 100.0
    if args.rep_ms <= 0 or args.warmup_ms < 0:
        parser.error("--rep-ms must be > 0 and --warmup-ms >= 0")
    if args.peer is not None and (args.ladder or args.sweep_blocks):
        parser.error("--peer cannot be combined with --ladder or --sweep-blocks")
    args.dtype = args.dtype or (PEER_DTYPE if args.peer is not None else "bf16")
    if args.peer is not None:
        try:
            args.peer = load_peer(args.peer)
        except (TypeError, ValueError) as err:
            parser.error(f"argument --peer: {err}")
        args.shapes = peer_shapes(args.seq or PEER_SEQS, args.head_dim or PEER_HEAD_DIMS,
                                  args.causal or (False, True), heads=args.heads)
        return args
    if args.ladder:
        seqs = args.seq or LADDER_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False, True)
    elif args.sweep_blocks:
        seqs = args.seq or SWEEP_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False,)
    elif args.quick:
        seqs = args.seq or QUICK_SEQS
        head_dims = args.head_dim or QUICK_HEAD_DIMS
        causals = args.causal or (False, True)
    else:
        seqs = args.seq or DEFAULT_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False, True)
    try:
        args.shapes = make_shapes(seqs, head_dims, causals, tokens=args.tokens,
                                  heads=args.heads)
    except ValueError as err:
        parser.error(f"--seq: {err}")
    return args


NO_GPU_MESSAGE = (
    "No CUDA GPU on this machine: there is nothing to time here, so nothing was run.\n"
    "Run `python -m flashbook.bench` on a machine with an NVIDIA GPU; results measured "
    "on real GPUs, with their provenance, are in benchmarks/results/.")


def _resolve_impl_names(requested) -> list:
    if tuple(requested) != ("all",):
        return list(dict.fromkeys(requested))
    names = [n for n in IMPLEMENTATIONS if n != "flashbook"]
    try:
        names += list(flashbook_impls())
    except Exception:  # noqa: BLE001 - recorded as unavailable by run_sweep
        names.append("flashbook")
    return names


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE)
        return 0
    if runtime.INTERPRET:
        print("TRITON_INTERPRET is set: Triton kernels would run in the CPU interpreter, "
              "and their times would mean nothing. Unset it and run again.")
        return 1

    gpu = gpu_info()
    out_dir = args.out or default_out_dir(gpu["name"])
    progress = not args.no_progress

    if args.ladder:
        headline = f"Performance ladder of flashbook's kernels on {gpu['name']}: {len(args.shapes)} shapes"
        run, table, csv_name, fields, row = run_ladder, format_ladder_table, "ladder.csv", LADDER_FIELDS, "rung"
    elif args.sweep_blocks:
        headline = (f"Block-size sweep of flashbook's forward kernel on {gpu['name']}: "
                    f"{len(block_configs())} configs x {len(args.shapes)} shapes")
        run, table, csv_name, fields, row = run_block_sweep, format_block_table, "blocks.csv", BLOCK_FIELDS, "config"
    elif args.peer is not None:
        headline = (f"{args.peer.path}:{args.peer.func} beside {', '.join(COMPARED)} on "
                    f"{gpu['name']}, {args.dtype}: {len(args.shapes)} shapes")
        run, table, csv_name, fields, row = run_peer, format_peer_table, "peer.csv", PEER_FIELDS, "implementation"
    else:
        impls = _resolve_impl_names(args.impl)
        headline = (f"Attention on {gpu['name']} ({gpu['capability']}), {args.dtype}: "
                    f"{len(args.shapes)} shapes x {len(impls)} implementations")
        run, table, csv_name, fields, row = (functools.partial(run_sweep, impls=impls), format_table,
                                             "results.csv", RESULT_FIELDS, "implementation")
    print(headline)
    results = run(args, progress=progress)
    print(table(results))

    write_csv(results, out_dir / csv_name, fields)
    prov = collect_provenance(argv, args)
    prov["files"] = {csv_name: f"one row per {row} and shape"}
    if args.peer is not None:
        peer_provenance(prov, args)
    write_provenance(prov, out_dir / "provenance.json")
    print(f"\nWrote {out_dir / csv_name} and {out_dir / 'provenance.json'}")
    if args.ladder:  # every rung is our own exact kernel: a rung that did not run is a bug
        broken = [r for r in results if r.status != "ok"]
        if broken:
            print(f"{len(broken)} of {len(results)} ladder rows did not run: {broken[0].status} {broken[0].note}")
            return 1
    return 0

