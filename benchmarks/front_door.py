"""What ``flashbook.flash_attention`` gives a user on a GPU: which kernel it ran, how fast.

    PYTHONPATH=. python3 benchmarks/front_door.py --out DIR [--dtypes bf16,fp16] [--lengths N,N,...] [--specialise]

For every shape of the Hopper comparison (head_dim 64 and 128; N = 1K, 4K, 16K; causal or
not; B*N = 32K tokens, 32 heads at d = 64 and 16 at d = 128): the front door's backend
("auto"), then forward and backward times of ``backend="auto"``, ``backend="triton"``,
SDPA's cuDNN and flash backends (``flashbook.bench.time_ms``: CUDA events, L2 flushed,
median), in TFLOP/s by the usual convention (forward 4*B*H*N^2*d, halved when causal;
backward 2.5 times that).

``--lengths 1000,1024,4096,4097`` times those sequence lengths instead of 1K, 4K and 16K
(B = 32K // N): lengths that are not whole tiles against their whole-tile neighbours, so
that a cliff in ``backend="auto"`` shows.

``--specialise`` also times the Triton kernels compiled with Triton's default
specialisation of the length arguments against the library's (``forward.LENGTH_ARGS``:
never specialised), forward and backward: what the fix of the seq = 1 bug costs.

DIR/front_door.json: every row, the provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
from flashbook import bench  # noqa: E402
from flashbook.bench.records import collect_provenance  # noqa: E402
from flashbook.kernels import autograd, backward, forward  # noqa: E402

SHAPES = [(d, n, causal) for d in (64, 128) for n in (1024, 4096, 16384) for causal in (False, True)]


def tflops(flops, ms):
    return flops / ms / 1e9


def time_pair(fn, q, k, v, do):
    """(forward ms, backward ms) of ``fn(q, k, v)`` with q, k, v requiring grad."""
    out = fn(q, k, v)
    fwd = bench.time_ms(lambda: fn(q, k, v))
    bwd = bench.time_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    return fwd, bwd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--lengths", default=None, help="sequence lengths instead of 1K, 4K, 16K, e.g. 1000,1024")
    p.add_argument("--specialise", action="store_true")
    args = p.parse_args(argv)
    shapes = SHAPES if not args.lengths else [(d, n, causal) for d in (64, 128)
                                              for n in map(int, args.lengths.split(",")) for causal in (False, True)]
    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/front_door.py"),
              "rows": [], "specialisation": []}
    impls = {"auto": lambda q, k, v, c: flashbook.flash_attention(q, k, v, causal=c),
             "triton": lambda q, k, v, c: flashbook.flash_attention(q, k, v, causal=c, backend="triton"),
             "sdpa-cudnn": lambda q, k, v, c: bench.sdpa_attention("sdpa-cudnn")(q, k, v, causal=c),
             "sdpa-flash": lambda q, k, v, c: bench.sdpa_attention("sdpa-flash")(q, k, v, causal=c)}
    for dtype_name in args.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for d, n, causal in shapes:
            b, h = 32768 // n, 2048 // d
            gen = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v, do = (torch.randn(b, h, n, d, generator=gen, device="cuda").to(dtype) for _ in range(4))
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            flops = bench.attention_flops(b, h, n, n, d, causal=causal)
            row = {"dtype": dtype_name, "head_dim": d, "seq": n, "batch": b, "heads": h, "causal": causal}
            flashbook.flash_attention(q, k, v, causal=causal)
            row["backend"], row["why"] = flashbook.kernels.explain_backend()
            for name, fn in impls.items():
                try:
                    fwd, bwd = time_pair(lambda a, b_, c_: fn(a, b_, c_, causal), q, k, v, do)
                except Exception as exc:  # noqa: BLE001 - a backend that cannot run is recorded
                    row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    continue
                row[name] = {"fwd_ms": fwd, "bwd_ms": bwd, "fwd_tflops": tflops(flops, fwd),
                             "bwd_tflops": tflops(2.5 * flops, bwd)}
            for pass_ in ("fwd", "bwd"):
                for name in ("auto", "triton"):
                    if "error" not in row[name] and "error" not in row["sdpa-cudnn"]:
                        row[f"{name}_over_cudnn_{pass_}"] = row["sdpa-cudnn"][f"{pass_}_ms"] / row[name][f"{pass_}_ms"]
            record["rows"].append(row)
            print(f"{dtype_name} d={d} N={n} {'causal' if causal else 'full'}: {row['backend']}; "
                  + ", ".join(f"{x} {row[x].get('fwd_tflops', float('nan')):.0f}/{row[x].get('bwd_tflops', float('nan')):.0f}"
                              for x in impls)
                  + f"; auto/cuDNN fwd {row.get('auto_over_cudnn_fwd', float('nan')):.2f} "
                    f"bwd {row.get('auto_over_cudnn_bwd', float('nan')):.2f}", flush=True)
            del q, k, v, do
    if args.specialise:
        plain = {"fwd": forward._attn_fwd, "dkdv": backward._bwd_dkdv, "dq": backward._bwd_dq}
        special = {name: triton.jit(fn.fn) for name, fn in plain.items()}   # Triton's default specialisation
        for d, n, causal in [(64, 4096, False), (64, 4096, True), (128, 4096, False), (128, 4096, True)]:
            b, h = 32768 // n, 2048 // d
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda").to(torch.bfloat16) for _ in range(4))
            row = {"head_dim": d, "seq": n, "causal": causal}
            for label, kernels in (("unspecialised", plain), ("specialised", special)):
                autograd._attn_fwd, autograd._bwd_dkdv, autograd._bwd_dq = kernels["fwd"], kernels["dkdv"], kernels["dq"]
                try:
                    o, lse = autograd.flash_forward(q, k, v, causal=causal)
                    row[f"{label}_fwd_ms"] = bench.time_ms(lambda: autograd.flash_forward(q, k, v, causal=causal))
                    row[f"{label}_bwd_ms"] = bench.time_ms(
                        lambda: autograd.flash_backward(q, k, v, o, lse, do, causal=causal))
                finally:
                    autograd._attn_fwd, autograd._bwd_dkdv, autograd._bwd_dq = plain["fwd"], plain["dkdv"], plain["dq"]
            for pass_ in ("fwd", "bwd"):
                row[f"{pass_}_specialised_over_unspecialised"] = row[f"unspecialised_{pass_}_ms"] / row[f"specialised_{pass_}_ms"]
            record["specialisation"].append(row)
            print(f"specialisation d={d} N={n} {'causal' if causal else 'full'}: "
                  f"specialised/unspecialised time fwd {1 / row['fwd_specialised_over_unspecialised']:.3f} "
                  f"bwd {1 / row['bwd_specialised_over_unspecialised']:.3f}", flush=True)
    with open(os.path.join(args.out, "front_door.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
