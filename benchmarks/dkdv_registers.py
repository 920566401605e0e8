"""Registers and spills of chapter 8's dK/dV kernel, with and without atomic dQ, compiled for sm_90.

Chapter 10 compares the atomic dQ mode (dQ added from inside the dK/dV kernel) with the
separate dQ kernel. This script compiles the dK/dV kernel both ways (``ATOMIC_DQ`` off and
on; bf16, d = 64 and 128, full and causal, each mask's default tiles for sm_90) with the
Triton installed here, specialised as the atomic-dQ experiment's launches were (Triton's own
binder on the launch's arguments: length 4096, heads 32 at d = 64 and 16 at d = 128, one head
per K/V head), and reads what ``ptxas -v`` reports: registers per thread, the stack frame in
local memory, and the bytes a thread spills and reloads. No GPU is needed: Triton ships
``ptxas``. On a GPU, Triton's ``n_regs`` is the registers and its ``n_spills`` the local memory
per thread over 4 (its driver reads ``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``): here the stack
frame over 4.

    TRITON_INTERPRET=0 python3 benchmarks/dkdv_registers.py --out OUT/dkdv_registers.json [--source DIR] \
        [--extra 128,full,64,128,8,3 ...]

``--source``: import flashbook from DIR (e.g. a ``git archive`` of the commit a recorded run
timed) instead of this checkout. ``--extra D,MASK,BLOCK_M,BLOCK_N,WARPS,STAGES`` (MASK: full or
causal; repeatable): also compile, both ways, tiles other than the default, as the atomic-dQ
experiment's ``64x128`` variants launched them; their rows have ``"default_tiles": false``.
Writes the counts with their provenance.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loop_sass import checkout_commit, compile_bound, write_record  # noqa: E402  (beside this script)
#: the atomic-dQ experiment's shapes at N = 4096 (benchmarks/atomic_dq_experiment.py)
HEADS = {64: 32, 128: 16}
SEQ = 4096


def dkdv_launch(kern, head_dim: int, causal: bool, atomic: bool, config):
    """The positional arguments and keywords ``autograd.flash_backward`` gives the dK/dV
    kernel (batch 1: the strides a batch of 8 has, but for the batch's own)."""
    import torch

    from flashbook.kernels import configs

    heads = HEADS[head_dim]
    x = torch.empty(1, heads, SEQ, head_dim, dtype=torch.bfloat16)
    rows = torch.empty(1, heads, SEQ, dtype=torch.float32)
    dq = torch.empty(1, heads, SEQ, head_dim, dtype=torch.float32 if atomic else torch.bfloat16)
    value = {"Q": x, "K": x, "V": x, "DO": x, "LSE": rows, "DELTA": rows, "DK": x, "DV": x, "DQ": dq,
             "n_heads": heads, "n_kv_heads": heads, "group": 1, "seq_q": SEQ, "seq_k": SEQ,
             "qk_scale": head_dim ** -0.5 * 1.4426950408889634, "scale": head_dim ** -0.5}
    args = []
    for name in kern.arg_names:
        if name in value:
            args.append(value[name])
        elif name.startswith("stride_"):
            t = dq if name.startswith("stride_dq") else x
            args.append(t.stride("bhm".index(name[-1]) if name[-1] in "bh" else 2))
        else:
            break              # the rest: keywords and defaults, as the launch leaves them
    kw = dict(HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_M=config.block_m, BLOCK_N=config.block_n,
              CAUSAL=causal, ATOMIC_DQ=atomic, DOT_PRECISION="tf32", num_warps=config.num_warps,
              num_stages=config.num_stages)
    return args, kw


def ptxas_usage(compiled, cc: int = 90) -> dict:
    """``ptxas -v`` on the compiled PTX, as Triton runs it: registers, stack frame, spill
    stores and loads (bytes per thread)."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([ptxas, "-lineinfo", "-v", f"--gpu-name=sm_{cc}a", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    regs = re.search(r"Used (\d+) registers", log)
    stack, stores, loads = (int(x) for x in frame.groups())
    return {"n_regs": int(regs[1]), "stack_bytes": stack, "spill_store_bytes": stores, "spill_load_bytes": loads,
            "n_spills": stack // 4}


def extra_config(text: str):
    """``--extra``'s "D,MASK,BLOCK_M,BLOCK_N,WARPS,STAGES" as (head_dim, causal, Config)."""
    from flashbook.kernels.configs import Config

    d, mask, *tiles = text.split(",")
    if mask not in ("full", "causal") or len(tiles) != 4:
        raise ValueError(f"--extra {text!r}: want D,full|causal,BLOCK_M,BLOCK_N,WARPS,STAGES")
    return int(d), mask == "causal", Config(*(int(x) for x in tiles))


def record(head_dims=(64, 128), extra=()) -> list[dict]:
    """Both modes at each head size and mask with the default tiles, then with each of ``extra``
    ((head_dim, causal, Config), ``extra_config``'s)."""
    from flashbook.kernels import configs
    from flashbook.kernels.backward import _bwd_dkdv

    jobs = [(d, causal, configs.default("backward_dkdv", cc=90, block_d=configs.block_d(d), elem_bytes=2, causal=causal),
             True) for d in head_dims for causal in (False, True)]
    rows = []
    for d, causal, cfg, default in jobs + [(d, causal, cfg, False) for d, causal, cfg in extra]:
        for atomic in (False, True):
            compiled = compile_bound(_bwd_dkdv, *dkdv_launch(_bwd_dkdv, d, causal, atomic, cfg))
            got = ptxas_usage(compiled)
            rows.append({"head_dim": d, "causal": causal, "atomic_dq": atomic, "default_tiles": default,
                         "config": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages],
                         "shared_bytes": int(compiled.metadata.shared), **got})
            print(f"d={d} causal={causal} atomic={atomic} {cfg}: {got}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--source", help="import flashbook from this directory (default: this checkout)")
    parser.add_argument("--extra", action="append", default=[], metavar="D,MASK,BLOCK_M,BLOCK_N,WARPS,STAGES",
                        help="also compile these dK/dV tiles (repeatable; MASK: full or causal)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("set TRITON_INTERPRET=0 to compile for sm_90", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(args.source or HERE))
    import triton

    extra = [extra_config(x) for x in args.extra]
    out = {"about": "chapter 8's dK/dV kernel compiled for sm_90 (bf16, each mask's default tiles"
                    + (", then the --extra tiles" if extra else "") + ") without and with "
                    "atomic dQ: ptxas -v's registers, stack frame and spill bytes per thread",
           "triton": triton.__version__, "target": "sm_90", "dtype": "bf16",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           # no machine's paths: another source folder is SRC (a git archive, see the README)
           "command": "TRITON_INTERPRET=0 python3 benchmarks/dkdv_registers.py --out " + os.path.relpath(args.out, HERE)
                      + (" --source SRC" if args.source else "") + "".join(f" --extra {x}" for x in args.extra),
           "flashbook_from": "SRC/flashbook" if args.source else "this checkout's flashbook",
           "script_commit": checkout_commit(),   # this checkout's
           "launch": {"seq_q": SEQ, "seq_k": SEQ, "heads": {str(d): h for d, h in HEADS.items()}, "group": 1},
           "kernels": record(extra=extra)}
    write_record(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
