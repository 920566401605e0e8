"""Where the host's time goes in one eager ``flash_decode`` call (GPU machine).

    PYTHONPATH=. python3 benchmarks/decode_host.py --out DIR

At small caches a decoding step called from Python costs more on the CPU than on the
GPU: the GPU finishes each kernel before the host has issued the next. This script
takes the call apart at batch 1 (32 query heads on 8 KV heads, head_dim 128, bf16, one
new token, cache lengths 2K and 32K) and times each piece on the host alone, over
``--calls`` back-to-back calls with one synchronisation at the end:

* ``call``: the whole ``flash_decode`` call, as a decoding loop makes it (the same call
  signature every time: the short path of ``decode._signature``);
* ``checked_path``: the call with its remembered plan forgotten first (every check,
  the choices, and Triton's own launches), as every call was before the short path;
* ``checks``: the argument checks alone (``check_inputs``);
* ``launch_jit:<kernel>``: each of its two launches as Triton makes it (``kernel[grid](...)``:
  Triton's argument binding and cache lookup), with the call's arguments;
* ``launch_compiled:<kernel>``: the same launch from the compiled kernel's own launcher
  (``CompiledKernel[grid](*args)``), which the short path uses;
* ``empty``: one ``torch.empty`` (the call makes two);
* ``sdpa_cudnn``: ``scaled_dot_product_attention`` on the cuDNN backend, the yardstick.

Writes DIR/host.json (microseconds per call, median of ``--repeats`` repeats, with
the spread), DIR/profile.txt (cProfile of the call, by own time) and
DIR/provenance.json.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
from flashbook import bench  # noqa: E402
from flashbook.timing import host_us  # noqa: E402
from flashbook.kernels import decode  # noqa: E402
from flashbook.kernels.autograd import check_inputs  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
SEQS = (2048, 32768)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    prov = bench.collect_provenance(sys.argv[1:] if argv is None else argv,
                                    program="python3 benchmarks/decode_host.py")
    results, profiles = {}, []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for seq in SEQS:
        def randn(*shape):
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        q, k, v = randn(1, HEADS, 1, HEAD_DIM), randn(1, KV_HEADS, seq, HEAD_DIM), randn(1, KV_HEADS, seq, HEAD_DIM)
        lengths = torch.full((1,), seq, device="cuda", dtype=torch.int32)
        row = {}

        def call():
            return decode.flash_decode(q, k, v, cache_seqlens=lengths)
        row["call"] = host_us(call, args.calls, args.repeats)
        row["checks"] = host_us(lambda: check_inputs(q, k, v, True, None, names=("q", "k_cache", "v_cache")),
                                args.calls, args.repeats)
        row["empty"] = host_us(lambda: torch.empty((1, KV_HEADS, 4, HEAD_DIM), device="cuda", dtype=torch.bfloat16),
                               args.calls, args.repeats)
        # the call's plan (decode._PLANS): its two launches, with the arguments of this call
        decode._PLANS.clear()
        call()
        (plan,) = decode._PLANS.values()
        row["checked_path"] = host_us(lambda: (decode._PLANS.clear(), call()), args.calls, args.repeats)
        torch.cuda.synchronize()
        o, work = torch.empty(plan.rows, device="cuda", dtype=q.dtype), torch.empty(plan.n_part + plan.n_lse, device="cuda")
        o_part, lse = work[:plan.n_part], work[plan.n_part:]
        tensors = {"split": (q.reshape(plan.rows), k, v, o_part, lse, lengths, lse), "combine": (o_part, lse, o)}
        for name, launch in (("split", plan.split), ("combine", plan.combine)):
            if launch is None:
                continue
            a = launch.bind(*tensors[name])
            row[f"launch_jit:{name}"] = host_us(lambda: launch.kernel[launch.grid](*a, **launch.kwargs),
                                                args.calls, args.repeats)
            row[f"launch_compiled:{name}"] = host_us(lambda: launch.launcher(*a, *launch.constexprs),
                                                     args.calls, args.repeats)
        row["grids"] = {name: list(x.grid) for name, x in (("split", plan.split), ("combine", plan.combine)) if x}
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            f = torch.nn.functional.scaled_dot_product_attention
            row["sdpa_cudnn"] = host_us(lambda: f(q, k, v, enable_gqa=True), args.calls, args.repeats)
        results[str(seq)] = row
        print(seq, json.dumps(row), flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            call()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        profiles.append(f"== seq {seq}, 500 calls ==\n{s.getvalue()}")
    with open(os.path.join(args.out, "host.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "profile.txt"), "w") as f:
        f.write("\n".join(profiles))
    prov["timing"] = {"method": "host time.perf_counter over back-to-back calls, one synchronisation after them",
                      "statistic": "median of the repeats, with min and max", "calls": args.calls,
                      "repeats": args.repeats}
    prov.setdefault("files", {}).update({"host.json": "host microseconds per call of each piece",
                                         "profile.txt": "cProfile of the call"})
    bench.write_provenance(prov, os.path.join(args.out, "provenance.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
