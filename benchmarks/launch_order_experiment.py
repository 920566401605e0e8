"""Which program starts first: the heads dealt out a few at a time (``HEAD_GROUP``), and a
window's query tiles last first (``HEAVY_LAST``), timed.

    PYTHONPATH=. python3 benchmarks/launch_order_experiment.py --out DIR [--rounds 3] [--budget-s 420]
        [--groups 1,2,4,8,16 | --variants rule,heavy-off] [--only SHAPE,...] [--no-flex]

The GPU starts the programs of a grid (tiles, batch * heads) in the order tile 0..T-1 of
head 0, then head 1, and so on (``forward.launch_position``). The causal forward and dQ
kernels reverse the tiles within a head so that the heaviest start first, and dK/dV's
heaviest (key tile 0) start first anyway; but across heads the heaviest tiles of the last
heads still start last, and at batch 1 x 16 heads that is most of a wave. ``HEAD_GROUP`` = G
deals the same programs out G heads at a time, tile by tile: the heavy tiles of G heads
start together, while the programs running at one time still share the K/V (forward) or the
Q/dO (backward) of only a few heads in L2. G = 1 is the library's order.

For each shape the forward and the forward + backward are timed (CUDA-event medians,
``flashbook.timing.time_ms``, L2 flushed) for each G, ``--rounds`` rounds taking turns; every
output and gradient is compared bitwise with G = 1's (a launch order changes nothing a
program computes). At the masks chapter's shapes (batch 1, H = 16, d = 128) compiled
FlexAttention with its ``BlockMask`` takes its turn too (``masks_bench``), unless ``--no-flex``.
Writes DIR/launch_order.json (provenance and every row) after each shape.

``--variants`` names the orders instead of ``--groups``: ``G=g`` forces g heads at a time,
``rule`` is the library's own choice of every order, ``heavy-off`` the library's with a
window's query tiles in the plain order (``autograd.heavy_last`` forced off; the causal mask
reverses its tiles either way). Speed-ups and the bitwise checks are against the first variant.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
import torch  # noqa: E402

from flashbook.bench.records import collect_provenance  # noqa: E402
from flashbook.kernels import autograd  # noqa: E402
from flashbook.timing import time_ms  # noqa: E402

#: (name, mask, batch, heads, seq, head_dim, window): the masks chapter's shapes (batch 1), then
#: chapter 9's (B * N = 32K tokens), where the grid has many more programs per wave
SHAPES = (
    ("causal 4K B1", "causal", 1, 16, 4096, 128, None),
    ("causal 16K B1", "causal", 1, 16, 16384, 128, None),
    ("window 1K at 8K", "window", 1, 16, 8192, 128, 1024),
    ("window 4K at 4K", "window", 1, 16, 4096, 128, 4096),
    ("window 4K at 16K", "window", 1, 16, 16384, 128, 4096),
    ("documents 4K", "documents", 1, 16, 4096, 128, None),
    ("documents 8K", "documents", 1, 16, 8192, 128, None),
    ("documents 16K", "documents", 1, 16, 16384, 128, None),
    ("causal 4K B8", "causal", 8, 16, 4096, 128, None),
    ("causal 16K B2", "causal", 2, 16, 16384, 128, None),
    ("full 4K B8", "full", 8, 16, 4096, 128, None),
    ("causal 4K B8 d64", "causal", 8, 32, 4096, 64, None),
    ("causal 8K B1", "causal", 1, 16, 8192, 128, None),
    ("window 1K at 4K", "window", 1, 16, 4096, 128, 1024),
    ("window 4K at 8K", "window", 1, 16, 8192, 128, 4096),
    ("window 1K at 16K", "window", 1, 16, 16384, 128, 1024),
    ("window 1K at 32K", "window", 1, 16, 32768, 128, 1024),
    ("window 4K at 32K", "window", 1, 16, 32768, 128, 4096),
)


def variant(name: str) -> dict | None:
    """The ``autograd._state`` a variant forces (None: FlexAttention's turn)."""
    if name == "flex":
        return None
    if name == "rule":
        return {"head_group": None, "heavy_last": None}
    if name == "heavy-off":
        return {"head_group": None, "heavy_last": False}
    if name.startswith("G=") and name[2:].isdigit():
        return {"head_group": int(name[2:]), "heavy_last": None}
    raise ValueError(f"a variant is G=<heads>, rule, heavy-off or flex, got {name!r}")


def set_state(state: dict) -> None:
    autograd._state.update(state)
    for plans in autograd._PLANS.values():
        plans.clear()


def calls(mask, batch, heads, n, d, window, seed):
    """(inputs, flashbook call, flex call or None)."""
    import masks_bench

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, heads, n, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    flex = None
    if batch == 1 and mask != "full":
        name = {"causal": "causal", "window": "window", "documents": "documents"}[mask]
        ours, flex, _ = masks_bench._calls(name, n, (window, 0) if window else None, q, k, v,
                                           masks_bench.documents(n, seed))
    else:
        def ours(q, k, v):
            return flashbook.flash_attention(q, k, v, causal=mask == "causal", backend="triton")
    return (q, k, v, do), ours, flex


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--groups", default="1,2,4,8,16")
    p.add_argument("--variants", default="", help="e.g. rule,heavy-off (instead of --groups; module docstring)")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    names = args.variants.split(",") if args.variants else [f"G={g}" for g in args.groups.split(",")]
    states = {name: variant(name) for name in names if name != "flex"}
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/launch_order_experiment.py"),
              "variants": dict(states), "rows": []}
    if not args.variants:
        record["groups"] = [int(g) for g in args.groups.split(",")]
    path = os.path.join(args.out, "launch_order.json")
    wanted = set(args.only.split(",")) if args.only else None
    for seed, (label, mask, batch, heads, n, d, window) in enumerate(SHAPES):
        if wanted and label not in wanted:
            continue
        if time.time() - start > args.budget_s:
            record["stopped"] = f"budget reached before {label}"
            break
        (q, k, v, do), ours, flex = calls(mask, batch, heads, n, d, window, seed)
        row = {"shape": label, "mask": mask, "batch": batch, "heads": heads, "seq": n, "head_dim": d,
               "window": window, "times": {}, "exact": {}}
        variants = {name: state for name, state in states.items()
                    if state["head_group"] is None or state["head_group"] <= batch * heads}
        if flex is not None and not args.no_flex:
            variants["flex"] = None
        base = None
        for name, state in variants.items():   # compile and check each once
            fn = flex if state is None else ours
            if state is not None:
                set_state(state)
            out = [fn(q, k, v)]
            out += list(torch.autograd.grad(out[0], (q, k, v), do))
            if state is not None:
                if base is None:
                    base = [x.clone() for x in out]
                else:
                    row["exact"][name] = all(torch.equal(a, b) for a, b in zip(base, out))
            row["times"][name] = {"fwd": [], "fwd_bwd": []}
        for _ in range(args.rounds):
            for name, state in variants.items():
                fn = flex if state is None else ours
                if state is not None:
                    set_state(state)
                t = row["times"][name]
                t["fwd"].append(time_ms(lambda: fn(q, k, v)))
                t["fwd_bwd"].append(time_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do)))
        set_state({"head_group": None, "heavy_last": None})
        for name, t in row["times"].items():
            t["fwd_ms"], t["fwd_bwd_ms"] = statistics.median(t["fwd"]), statistics.median(t["fwd_bwd"])
            t["bwd_ms"] = t["fwd_bwd_ms"] - t["fwd_ms"]
        first = row["times"][next(iter(states))]
        speedups = {name: {"fwd": first["fwd_ms"] / t["fwd_ms"], "fwd_bwd": first["fwd_bwd_ms"] / t["fwd_bwd_ms"]}
                    for name, t in row["times"].items()}
        row["speedup_vs_first"] = speedups
        if not args.variants:
            row["speedup_vs_G1"] = speedups   # the name run1_groups.json uses
        record["rows"].append(row)
        print(label, {k: (round(v["fwd"], 3), round(v["fwd_bwd"], 3)) for k, v in speedups.items()},
              "exact" if all(row["exact"].values()) else f"NOT EXACT {row['exact']}", flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        del q, k, v, do
        torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {path} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
