"""Is atomic dQ slow because of atomics, or because of how the book's kernel issues them?

    PYTHONPATH=. python3 benchmarks/atomic_dq_experiment.py --out DIR [--repeat 3]

Chapter 8 measured the backward's ``dq_mode="atomic"`` (dQ added into an fp32 buffer from
the dK/dV kernel, so the separate dQ kernel and its recomputation of S and dP go away) as
2.5-7.6 times slower than the separate dQ kernel. Two things about how it adds are not
how FlashAttention-2 and -3 add:

- ``tl.atomic_add`` defaults to ``sem="acq_rel"``: every add is also a memory fence.
  FlashAttention's ``atomicAdd`` is relaxed: only the sum has to be right, not the order.
- every dK/dV program of a head walks the query tiles in the same order, so without a mask
  all of them start on query tile 0 and add into the same dQ rows at the same time.

This script times the library's backward beside variants of its dK/dV kernel, each the
library's ``_bwd_dkdv`` compiled with its loop helper ``_bwd_dkdv_inner`` rebuilt from the
helper's own source with one text edit (``variant_of_inner``; ``ladder.kernel_with(base=)``
swaps it in), so every other line is the library's:

- ``separate``: the library's default (delta, dK/dV, dQ kernels; deterministic);
- ``atomic``: ``dq_mode="atomic"`` with Triton's default ``sem="acq_rel"`` adds (``FENCE``),
  as the library added until this experiment;
- ``relaxed``: the library's ``dq_mode="atomic"`` as it is now, ``sem="relaxed"``;
- ``relaxed+stagger``: relaxed, and key tile j starts its run of whole query tiles at tile
  j mod (their count), wrapping round, so that programs of one head add into different
  rows at any one time (``STAGGER``).

Each atomic variant runs with the library's dK/dV tiles and with 64 x 128 (fewer programs
per key, so fewer adds: the ``autograd.flash_backward`` docstring's case). Shapes: bf16,
32K tokens (batch 8 x 4K and 2 x 16K), d = 64 (H = 32) and 128 (H = 16), causal or not.
Every variant's gradients are compared with float64 on one head and with ``separate``.
Times are CUDA-event medians (``flashbook.timing.time_ms``, L2 flushed) of the backward
kernels alone (``flash_backward`` on a saved forward), ``--repeat`` rounds taking turns.

Writes DIR/atomic_dq.json: provenance, every time and every error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import torch  # noqa: E402

from flashbook import bench  # noqa: E402
from flashbook.kernels import autograd, flash_backward, flash_forward  # noqa: E402
from flashbook.kernels.backward import _bwd_dkdv  # noqa: E402
from flashbook.kernels.configs import Config  # noqa: E402
from flashbook.kernels.ladder import kernel_with  # noqa: E402
from flashbook.timing import time_ms  # noqa: E402


def variant_of_inner(name: str, edits: dict):
    """``backward._bwd_dkdv_inner`` compiled from its own source with each ``old -> new``
    text edit of ``edits`` applied (each must match once), in the module's globals: the
    library's loop line for line but for the edits. Written to a file, as Triton reads
    the source of what it compiles."""
    import hashlib
    import inspect
    import tempfile

    from flashbook.kernels import backward

    source = inspect.getsource(backward._bwd_dkdv_inner.fn)
    for old, new in edits.items():
        if source.count(old) != 1:
            raise ValueError(f"{name}: the edit's text must stand once in _bwd_dkdv_inner, got {source.count(old)}")
        source = source.replace(old, new)
    source = source.replace("def _bwd_dkdv_inner(", f"def {name}(", 1)
    # one file per source text, reused by every process that builds it (a fresh folder per
    # process left one behind in the temporary directory for every import)
    folder = os.path.join(tempfile.gettempdir(), "flashbook-atomic-dq",
                          hashlib.sha256(source.encode()).hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.py")
    if not os.path.exists(path):
        with open(path + f".{os.getpid()}", "w") as f:
            f.write(source)
        os.replace(path + f".{os.getpid()}", path)   # whole or absent, for a process beside this one
    scope = dict(vars(backward))
    exec(compile(source, path, "exec"), scope)
    return scope[name]


#: Triton's default ordering, as the library's atomic mode added until these runs
FENCE = {'sem="relaxed"': 'sem="acq_rel"'}
#: each key tile's run of whole query tiles (STAGE == MAIN) starts at tile (its index) mod
#: (their count) and wraps round; the masked stages keep their order
STAGGER = {"    for start_m in range(lo, hi, BLOCK_M):\n        start_m = tl.multiple_of(start_m, BLOCK_M)\n":
           "    n_tiles = tl.cdiv(hi - lo, BLOCK_M)\n"
           "    shift = tl.program_id(0) % tl.maximum(n_tiles, 1)\n"
           "    if STAGE != MAIN:\n"
           "        shift = 0\n"
           "    for i in range(0, n_tiles):\n"
           "        t = i + shift\n"
           "        t = tl.where(t >= n_tiles, t - n_tiles, t)\n"
           "        start_m = tl.multiple_of(lo + t * BLOCK_M, BLOCK_M)\n"}


FENCED = kernel_with({"_bwd_dkdv_inner": variant_of_inner("_inner_fenced", FENCE)}, base=_bwd_dkdv)
STAGGERED = kernel_with({"_bwd_dkdv_inner": variant_of_inner("_inner_staggered", STAGGER)}, base=_bwd_dkdv)
WIDE = Config(64, 128, 8, 3)   # 64 queries x 128 keys per program: half the programs (and adds) of 64 x 64


@contextlib.contextmanager
def dkdv_kernel(kernel):
    """flash_backward with ``kernel`` in place of ``_bwd_dkdv``, and no call plans (a plan
    would launch the kernel it kept)."""
    saved = autograd._bwd_dkdv, autograd._plan_key
    autograd._bwd_dkdv = kernel
    autograd._plan_key = lambda *a, **k: None
    try:
        yield
    finally:
        autograd._bwd_dkdv, autograd._plan_key = saved


VARIANTS = [("separate", None, "separate", None), ("atomic", FENCED, "atomic", None),
            ("atomic 64x128", FENCED, "atomic", WIDE), ("relaxed", None, "atomic", None),
            ("relaxed 64x128", None, "atomic", WIDE), ("relaxed+stagger", STAGGERED, "atomic", None),
            ("relaxed+stagger 64x128", STAGGERED, "atomic", WIDE)]


def run_variant(kernel, mode, config, q, k, v, o, lse, do, causal):
    with dkdv_kernel(kernel) if kernel is not None else contextlib.nullcontext():
        return flash_backward(q, k, v, o, lse, do, causal=causal, dq_mode=mode, config_dkdv=config)


def reference_grads(q, k, v, do, causal):
    """float64 gradients of one head (batch 0, head 0) by torch autograd."""
    x = [t[:1, :1].double().detach().requires_grad_() for t in (q, k, v)]
    s = x[0] @ x[1].transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ x[2]).backward(do[:1, :1].double())
    return [t.grad for t in x]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--shapes", default="8:4096:64,8:4096:128,2:16384:64,2:16384:128",
                   help="batch:N:d, comma-separated (heads = 2048 / d)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prov = bench.collect_provenance(sys.argv[1:], program="python3 benchmarks/atomic_dq_experiment.py")
    result = {"what": __doc__.split("\n\n")[0], "environment": prov, "rows": []}
    path = os.path.join(args.out, "atomic_dq.json")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in args.shapes.split(","):
        batch, n, d = (int(x) for x in shape.split(":"))
        heads = 2048 // d
        for causal in (False, True):
            q, k, v, do = (torch.randn(batch, heads, n, d, generator=gen, device="cuda").to(torch.bfloat16)
                           for _ in range(4))
            o, lse = flash_forward(q, k, v, causal=causal)
            ref = reference_grads(q, k, v, do, causal)
            base = run_variant(None, "separate", None, q, k, v, o, lse, do, causal)
            rows = {}
            for name, kernel, mode, config in VARIANTS:
                grads = run_variant(kernel, mode, config, q, k, v, o, lse, do, causal)
                err = {}
                for g, r, b, gname in zip(grads, ref, base, ("dq", "dk", "dv")):
                    scale = r.abs().max().item()
                    err[f"{gname}_vs_float64"] = (g[:1, :1].double() - r).abs().max().item() / scale
                    err[f"{gname}_vs_separate"] = (g.float() - b.float()).abs().max().item() / b.float().abs().max().item()
                    err[f"{gname}_finite"] = bool(torch.isfinite(g).all().item())
                rows[name] = dict(batch=batch, heads=heads, n=n, d=d, causal=causal, variant=name,
                                  dkdv_config=None if config is None else [config.block_m, config.block_n, config.num_warps, config.num_stages], errors=err, ms=[])
            for _ in range(args.repeat):
                for name, kernel, mode, config in VARIANTS:
                    rows[name]["ms"].append(time_ms(
                        lambda: run_variant(kernel, mode, config, q, k, v, o, lse, do, causal)))
            for row in rows.values():
                row["median_ms"] = sorted(row["ms"])[len(row["ms"]) // 2]
                row["vs_separate"] = rows["separate"]["median_ms"] / row["median_ms"]
                result["rows"].append(row)
                print(f"{shape} causal={causal!s:5} {row['variant']:24s} {row['median_ms']:8.3f} ms "
                      f"x{row['vs_separate']:.2f}  spread {(max(row['ms']) - min(row['ms'])) / row['median_ms']:.1%}  "
                      f"dq err {row['errors']['dq_vs_float64']:.1e}", flush=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
            del q, k, v, do, o, lse, base, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
