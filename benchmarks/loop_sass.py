"""What chapter 10's forward rungs issue per score: their inner loops compiled for sm_90 and counted.

Chapter 10 bounds the gains of exp2 (rung 1) and of the unmasked main loop (rung 3) by the
instructions a loop trip issues per score. This script compiles the rungs 0 to 3 (bf16,
d = 64 and 128, full and causal, their 64 x 64 tiles, 4 warps, 2 stages) for sm_90 with the
Triton installed here, specialised as the ladder's launches were (Triton's own binder on the
ladder's arguments: lengths and heads multiples of 16, one head per K/V head), and counts
each loop that holds a tensor-core product (HGMMA) from its label to the branch back
(``flashbook.bench.score_ops.sass_loops``). No GPU is needed: Triton ships ``ptxas``.

    TRITON_INTERPRET=0 python3 benchmarks/loop_sass.py --out OUT/loops.json [--source DIR]

``--source``: import flashbook from DIR (e.g. a ``git archive`` of the commit a recorded run
timed) instead of this checkout; the script's counter is this checkout's either way.
Writes the counts with their provenance (Triton's version, date, command, the source's commit).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
#: the shapes of the ladder (benchmarks/results/<ladder>/provenance.json): every value a
#: launch specialises on (multiples of 16, a GQA group of 1) is the same at both lengths
LADDER = {64: dict(heads=32), 128: dict(heads=16)}
SEQ = 4096


def counter():
    """This checkout's ``sass_loops`` and ``per_score``, whatever flashbook is imported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("score_ops_here", os.path.join(HERE, "flashbook", "bench", "score_ops.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sass_loops, mod.per_score


def compile_bound(kern, args: list, kw: dict, cc: int = 90):
    """``kern`` compiled for ``cc`` from a launch's positional ``args`` and keywords ``kw``,
    specialised by Triton's own binder as that launch would be."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", cc, 32)
    backend = make_backend(target)
    kw = dict(kw, debug=False, instrumentation_mode="")
    binder = create_function_from_signature(kern.signature, kern.params, backend)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = kern._pack_args(backend, kw, bound, spec, opts)
    return triton.compile(ASTSource(kern, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_as_launched(kern, head_dim: int, causal: bool, config, cc: int = 90):
    """``kern`` compiled for ``cc`` with the arguments the ladder's launch passes
    (``autograd.forward_with``), specialised by Triton's binder as a launch would."""
    import torch

    from flashbook.kernels import configs

    heads = LADDER[head_dim]["heads"]
    x = torch.empty(1, heads, SEQ, head_dim, dtype=torch.bfloat16)   # batch 8 in the ladder: the strides alike
    lse = torch.empty(1, heads, SEQ, dtype=torch.float32)
    strides = dict(zip("bhm", x.stride()[:3])) | {"n": x.stride(2)}
    value = {"Q": x, "K": x, "V": x, "O": x, "LSE": lse, "n_heads": heads, "group": 1, "seq_q": SEQ,
             "seq_k": SEQ, "qk_scale": head_dim ** -0.5}
    args = []
    for name in kern.arg_names:
        if name in value:
            args.append(value[name])
        elif name.startswith("stride_"):
            args.append(strides[name[-1]])
        else:
            break              # the rest: keywords and defaults, as forward_with leaves them
    kw = dict(HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_M=config.block_m,
              BLOCK_N=config.block_n, CAUSAL=causal, DOT_PRECISION="tf32", num_warps=config.num_warps,
              num_stages=config.num_stages)
    return compile_bound(kern, args, kw, cc)


def record(rungs=(0, 1, 2, 3), head_dims=(64, 128)) -> list[dict]:
    from flashbook.kernels import ladder

    sass_loops, per_score = counter()
    rows = []
    for i in rungs:
        rung = ladder.RUNGS[i]
        kern = ladder.rung_kernel(rung.features)
        cfg = rung.config
        spt = cfg.block_m * cfg.block_n / (cfg.num_warps * 32)
        for d in head_dims:
            for causal in (False, True):
                loops = sass_loops(triton_sass(kern, d, causal, cfg))
                stages = ["main", "masked"] if rung.features.split else ["masked"]
                if len(loops) != len(stages):
                    raise RuntimeError(f"rung {i}, d={d}, causal={causal}: {len(loops)} loops with HGMMA, "
                                       f"expected {len(stages)} ({stages})")
                for stage, loop in zip(stages, loops):
                    rows.append({"rung": i, "name": rung.name, "head_dim": d, "causal": causal, "stage": stage,
                                 "config": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages],
                                 "scores_per_thread": spt, "instructions": loop["instructions"],
                                 "mufu_ex2": loop["ops"].get("MUFU.EX2", 0),
                                 "per_score": round(per_score(loop, spt), 4),
                                 "mufu_ex2_per_score": round(per_score(loop, spt, "MUFU.EX2"), 4),
                                 "ops": dict(sorted(loop["ops"].items(), key=lambda kv: -kv[1]))})
                print(f"rung {i} d={d} causal={causal}: " + ", ".join(
                    f"{s} {lp['instructions']} ({per_score(lp, spt):.2f}/score)" for s, lp in zip(stages, loops)),
                    file=sys.stderr)
    return rows


def triton_sass(kern, d, causal, cfg) -> str:
    return compile_as_launched(kern, d, causal, cfg).asm["sass"]


def checkout_commit() -> str | None:
    """This checkout's commit (``git describe``, "-dirty" with local changes), or None outside git."""
    try:
        return subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty", "--abbrev=40"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_record(path: str, out: dict) -> None:
    """Write a compiled-count record as indented JSON (the recorded files' format)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--source", help="import flashbook from this directory (default: this checkout)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("set TRITON_INTERPRET=0 to compile for sm_90", file=sys.stderr)
        return 2
    source = os.path.abspath(args.source or HERE)
    sys.path.insert(0, source)
    import triton

    import flashbook

    out = {"about": "chapter 10's forward rungs 0-3 compiled for sm_90 (bf16, 64 x 64 tiles, 4 warps, 2 stages), "
                    "each inner loop with a tensor-core product counted from its label to its back-branch: "
                    "instructions a thread issues per trip, and per score (a trip's 64 x 64 scores over 128 threads)",
           "triton": triton.__version__, "target": "sm_90", "dtype": "bf16",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           # no machine's paths: another source folder is SRC (a git archive, see the README)
           "command": "TRITON_INTERPRET=0 python3 benchmarks/loop_sass.py --out " + os.path.relpath(args.out, HERE)
                      + (" --source SRC" if args.source else ""),
           "flashbook_from": "SRC/flashbook" if args.source else "this checkout's flashbook",
           "counter_commit": checkout_commit(),   # this checkout's
           "launch": {"seq_q": SEQ, "seq_k": SEQ, "heads": {str(d): v["heads"] for d, v in LADDER.items()}, "group": 1},
           "loops": record()}
    write_record(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
