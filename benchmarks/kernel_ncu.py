"""One forward and one backward per kernel, for Nsight Compute: why each is as fast as it is.

    python3 benchmarks/kernel_ncu.py --count OUT/steps.json          # once, without ncu
    ncu --profile-from-start off --clock-control none --csv --page raw --metrics METRICS \\
        python3 benchmarks/kernel_ncu.py > OUT/raw.csv

(the command as run is in the results folder's README.) For each shape (bf16, B x H x N x d,
causal and not) and each implementation (``triton``: chapters 7-8, ``gluon``: chapter 10's
forward, ``sdpa-cudnn``, ``sdpa-flash``) one forward and (except gluon, whose backward is
chapter 8's) one backward run between ``cudaProfilerStart`` and ``cudaProfilerStop``; each is
called twice first (compiling, planning). A pass may launch several kernels (chapter 8's
backward: delta, dK/dV, dQ); ``--count`` records how many each pass launches (the PyTorch
profiler, which cannot run under ncu), so that ``flashbook.bench.profiles.kernel_rows`` can
give every row of ncu's CSV its pass. ``METRICS`` asks for time, DRAM bytes, the L2 hit rate,
the tensor pipe's busy share, occupancy, registers and spills, and the warps' stall reasons;
``--metrics --available FILE`` keeps only those ``ncu --query-metrics`` lists.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402
from flashbook import bench  # noqa: E402
from flashbook.timing import profile_once  # noqa: E402

METRICS = (
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "sm__cycles_active.avg", "sm__cycles_elapsed.avg",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size",
    "launch__registers_per_thread", "launch__block_size", "launch__waves_per_multiprocessor",
    "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "smsp__inst_executed.sum",
    # the math ops the tensor pipe executed (2 per multiply-add): the products a kernel really does
    "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum",
) + tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in (
    "long_scoreboard", "barrier", "math_pipe_throttle", "wait", "short_scoreboard", "mio_throttle",
    "not_selected", "selected", "dispatch_stall", "lg_throttle", "no_instruction", "membar",
    "branch_resolving", "sleeping", "tex_throttle", "drain", "imc_miss", "misc"))

IMPLS = ("triton", "gluon", "sdpa-cudnn", "sdpa-flash")


def parse_shape(text: str):
    """``B,H,N,d`` -> four ints (N may end in K)."""
    parts = text.split(",")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"a shape is B,H,N,d; got {text!r}")
    return tuple(int(p[:-1]) * 1024 if p.upper().endswith("K") else int(p) for p in parts)


def available(metrics, query_text: str):
    """The metrics whose base name (before the first dot) ``ncu --query-metrics`` lists."""
    names = set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", query_text, re.M))
    # launch__ metrics describe the launch, not a counter: ncu takes them on every chip
    return [m for m in metrics if m.split(".")[0] in names or m.startswith("launch__")]


def passes(shapes, impls):
    """(label, call) per profiled pass, in order; a call takes no arguments."""
    for batch, heads, seq, dim in shapes:
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16,
                                   generator=gen) for _ in range(3))
            do = torch.randn_like(q)
            for impl in impls:
                if impl in ("triton", "gluon"):
                    def fwd(q=q, k=k, v=v, impl=impl, causal=causal):
                        return flashbook.flash_attention(q, k, v, causal=causal, backend=impl)
                else:
                    attend = bench.sdpa_attention(impl)

                    def fwd(q=q, k=k, v=v, attend=attend, causal=causal):
                        return attend(q, k, v, causal=causal)
                label = {"impl": impl, "batch": batch, "heads": heads, "seq": seq, "dim": dim, "causal": causal}
                yield dict(label, pass_="forward"), (lambda fwd=fwd: fwd())
                if impl == "gluon":
                    continue
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                held = {}

                def bwd(fwd=fwd, leaves=leaves, held=held, do=do):
                    if "o" not in held:   # the forward outside the profiled range
                        held["o"] = fwd(*leaves)
                    for t in leaves:      # no .grad to add to: the pass launches only its own kernels
                        t.grad = None
                    held.pop("o").backward(do)
                yield dict(label, pass_="backward"), (bwd, lambda fwd=fwd, leaves=leaves, held=held:
                                                      held.__setitem__("o", fwd(*leaves)))


def dkdv_passes(shape, configs_text: str, masks=("causal", "window")):
    """Chapter 8's backward at one shape with each dK/dV configuration ``B_M,B_N,warps,stages``
    (``;``-separated), under the causal mask and a causal window of N/4: the spills and the time
    of each, in one profile."""
    from flashbook.kernels import autograd, configs
    batch, heads, seq, dim = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    for mask in masks:
        kw = dict(causal=True, window=(seq // 4, 0) if mask == "window" else None)
        o, lse = autograd.flash_forward(q, k, v, **kw)
        for text in filter(None, configs_text.split(";")):
            cfg = configs.Config(*(int(x) for x in text.split(",")))
            label = {"impl": "triton-dkdv", "batch": batch, "heads": heads, "seq": seq, "dim": dim,
                     "causal": True, "mask": mask, "config_dkdv": list(dataclasses.astuple(cfg)), "pass_": "backward"}
            yield label, (lambda kw=kw, cfg=cfg, o=o, lse=lse:
                          autograd.flash_backward(q, k, v, o, lse, do, **kw, config_dkdv=cfg))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[(8, 16, 4096, 128), (8, 32, 4096, 64)])
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--metrics", action="store_true", help="print METRICS for ncu's --metrics and exit")
    p.add_argument("--available", help="with --metrics: the output of `ncu --query-metrics`")
    p.add_argument("--dkdv-configs", default="", help="also chapter 8's backward at the first shape with "
                   "these dK/dV configurations, e.g. '64,64,4,2;64,128,8,3'")
    p.add_argument("--count", help="count each pass's kernels (no ncu) and write them to this JSON file")
    args = p.parse_args(argv)
    if args.metrics:
        chosen = available(METRICS, open(args.available).read()) if args.available else list(METRICS)
        print(",".join(chosen))
        return 0
    impls = args.impls.split(",")
    steps = []
    todo = passes(args.shapes, impls) if impls != [""] else iter(())
    if args.dkdv_configs:
        todo = itertools.chain(todo, dkdv_passes(args.shapes[0], args.dkdv_configs))
    for label, call in todo:
        run, prepare = call if isinstance(call, tuple) else (call, lambda: None)
        for _ in range(2):
            prepare(), run()
        torch.cuda.synchronize()
        prepare()
        torch.cuda.synchronize()
        if args.count:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and not e.name.startswith(("Memcpy", "Memset"))]
            steps.append(dict(label, kernels=len(names), names=names))
            print(f"{label}: {len(names)} kernels", file=sys.stderr, flush=True)
        else:
            profile_once(run, warmups=0)   # prepare() above compiled and warmed it
            print(f"profiled {label}", file=sys.stderr, flush=True)
    if args.count:
        with open(args.count, "w") as f:
            json.dump({"about": "the passes kernel_ncu.py profiles, in order, with the kernels each launches",
                       "steps": steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
