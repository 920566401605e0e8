"""Where the time of flashbook's masked attention goes on the GPU, beside FlexAttention's.

    PYTHONPATH=. python3 benchmarks/masks_profile.py --out DIR
        [--shapes window:4K:128:1K,documents:4K:128,causal:4K:128,window:4K:128:1K:8]
        [--sweep window:4K:128:1K] [--iters 20]

A shape is ``mask:N:d[:window[:batch]]`` (masks as ``masks_bench``: window, documents,
softcap, window-softcap, causal; batch 1 unless given, H = 2048 / d). For each shape and
each of flashbook and FlexAttention (compiled, with its ``BlockMask``):

- ``fwd_ms``, ``bwd_ms`` (the backward alone, its forward kept: ``retain_graph``) and
  ``fwd_bwd_ms``: CUDA-event medians (``flashbook.timing.time_ms``, L2 flushed);
- ``host_us``: CPU microseconds per forward+backward call while the GPU only queues work
  (``timing.host_us``); where it exceeds the GPU's time the GPU waits for Python;
- ``host_profile``: where that host time goes (``cProfile``, the top functions by own time);
- ``kernels``: every GPU kernel one forward+backward launches, with its GPU time per call
  (``torch.profiler``, ``iters`` calls), and ``gpu_busy_ms``, their sum;
- flashbook only, ``overlap``: the same backward with the dQ kernel on a second stream, so
  that it runs beside the dK/dV kernel (an experiment: the library does not do this; its calls
  take the checked path, ``dq_beside_dkdv``).

``--sweep``: at those shapes, the backward timed with each dK/dV and each dQ configuration
of 64 rows or columns and more (``configs.kept_candidates``; ``--kernels fwd`` the forward with
each of its own), the other kernel at its default (packed documents: the kernels ``flash_attention_varlen`` launches, on the documents
of ``masks_bench.documents``). DIR/masks_profile.json: every number and the provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import masks_bench  # noqa: E402

DEFAULT_SHAPES = "window:4K:128:1K,window-softcap:4K:128:1K,documents:4K:128,causal:4K:128,window:16K:128:1K,window:4K:128:1K:8"


def parse_shape(text: str) -> dict:
    """``mask:N:d[:window[:batch]]`` -> dict(name, n, d, window, batch)."""
    parts = text.split(":")
    if len(parts) < 3 or parts[0] not in masks_bench.MASKS + ("causal",):
        raise ValueError(f"a shape is mask:N:d[:window[:batch]] with mask in {masks_bench.MASKS + ('causal',)}, "
                         f"got {text!r}")
    window = masks_bench._size(parts[3]) if len(parts) > 3 and parts[3] not in ("", "-") else None
    if "window" in parts[0] and window is None:
        raise ValueError(f"the {parts[0]} mask needs a window: {text!r}")
    return dict(name=parts[0], n=masks_bench._size(parts[1]), d=int(parts[2]), window=window,
                batch=int(parts[4]) if len(parts) > 4 else 1)


def _inputs(shape, seed=0):
    heads = 2048 // shape["d"]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(shape["batch"], heads, shape["n"], shape["d"], generator=gen, device="cuda")
                   .to(torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    window = (shape["window"], 0) if shape["window"] else (-1, -1)
    cu = masks_bench.documents(shape["n"], seed)
    ours, flex, mask = masks_bench._calls(shape["name"], shape["n"], window, q, k, v, cu)
    return (q, k, v, do), ours, flex, mask


def host_profile(step, calls: int = 100, top: int = 25) -> list:
    """Where the host's time per call of ``step`` goes (``cProfile``, ``calls`` calls after one
    warm-up, the GPU only queueing work): the ``top`` functions by their own time, each with
    calls and own and cumulative microseconds per call of ``step``."""
    import cProfile
    import pstats

    step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = [{"function": f"{os.path.basename(file)}:{line}:{name}", "calls_per_step": n / calls,
             "own_us": own / calls * 1e6, "cumulative_us": cum / calls * 1e6}
            for (file, line, name), (_, n, own, cum, _) in stats.items()]
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def kernel_times(step, iters: int) -> dict:
    """GPU time per call of every kernel ``step`` launches (torch.profiler), in microseconds."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        total = getattr(event, "self_device_time_total", None)
        if total is None:
            total = getattr(event, "self_cuda_time_total", 0.0)
        if total and event.count:
            out[event.key[:120]] = {"calls_per_step": event.count / iters, "us_per_step": total / iters}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us_per_step"]))


@contextlib.contextmanager
def dq_beside_dkdv():
    """The experiment: the backward's dQ kernel launched on a second stream that waits only
    for the delta kernel, so that it can run while the dK/dV kernel does. Every call takes the
    checked path meanwhile (no call plans: a plan launches without ``_run``, so the experiment
    would not run), as the library's calls did before plans."""
    from flashbook.kernels import autograd

    original, original_key = autograd._run, autograd._plan_key
    side = torch.cuda.Stream()
    state = {}

    def run(kernel, x, *args, **kwargs):
        main = torch.cuda.current_stream()
        if kernel == "backward_dkdv":
            state["ready"] = main.record_event()
            return original(kernel, x, *args, **kwargs)
        if kernel == "backward_dq":
            side.wait_event(state.pop("ready"))
            with torch.cuda.stream(side):
                used = original(kernel, x, *args, **kwargs)
            main.wait_stream(side)
            return used
        return original(kernel, x, *args, **kwargs)

    autograd.forget_plans()
    autograd._run, autograd._plan_key = run, (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        autograd._run, autograd._plan_key = original, original_key
        autograd.forget_plans()


def profile_shape(shape, iters: int) -> dict:
    from flashbook import timing

    tensors, ours, flex, mask = _inputs(shape)
    row = dict(shape, mask=mask["window"], softcap=mask["softcap"])
    for impl, fn in (("flashbook", ours), ("flex", flex)):
        # each in its own API's layout (masks_bench.native)
        q, k, v, do = tensors if impl == "flex" else masks_bench.native_leaves(shape["name"], tensors)
        try:
            def both():
                return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

            out = fn(q, k, v)

            def bwd():
                return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

            res = {"fwd_ms": timing.time_ms(lambda: fn(q, k, v)), "bwd_ms": timing.time_ms(bwd),
                   "fwd_bwd_ms": timing.time_ms(both), "host_us": timing.host_us(both, calls=50, rounds=3),
                   "kernels": kernel_times(both, iters), "host_profile": host_profile(both)}
            res["gpu_busy_ms"] = sum(x["us_per_step"] for x in res["kernels"].values()) / 1e3
            if impl == "flashbook":
                res["backend"] = flashbook.last_backend()
                with dq_beside_dkdv():
                    res["overlap"] = {"bwd_ms": timing.time_ms(bwd), "fwd_bwd_ms": timing.time_ms(both)}
            del out
        except Exception as exc:  # noqa: BLE001 - recorded, the rest still runs
            res = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        row[impl] = res
    return row


def backward_inputs(shape, seed=0):
    """(q, k, v, dO, the mask's keywords for ``autograd.flash_forward`` and ``flash_backward``) at
    one shape, drawn as ``_inputs`` draws them with ``seed``; packed documents as the varlen call
    launches them: (1, H, total, d) tensors and ``packed`` (``varlen.Packed``) with the same
    documents as ``_inputs``'."""
    import numpy as np

    from flashbook.kernels import varlen

    (q, k, v, do), _, _, mask = _inputs(shape, seed)
    q, k, v = (x.detach() for x in (q, k, v))
    if shape["name"] != "documents":
        return q, k, v, do, dict(causal=True, window=mask["window"], softcap=mask["softcap"])
    if shape["batch"] != 1:
        raise ValueError("packed documents are one sequence: batch 1")
    cu = masks_bench.documents(shape["n"], seed)
    longest = int(np.diff(cu).max())
    cu = torch.as_tensor(cu, dtype=torch.int32, device="cuda")
    return q, k, v, do, dict(causal=True, packed=varlen.Packed(cu, cu, longest, longest, varlen.longest_first(cu, cu)))


#: --only's and --kernels' short names
KERNEL_NAMES = {"fwd": "forward", "dkdv": "backward_dkdv", "dq": "backward_dq"}


def _fields(cfg) -> list:
    return [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages]


def sweep_shape(shape, deadline: float = float("inf"), only=None, repeat: int = 1,
                kernels=("backward_dkdv", "backward_dq")) -> dict:
    """The backward at one shape with each dK/dV and dQ configuration of 64 and more (and the
    forward with each of its own, where ``kernels`` names "forward"); ``only``: a list of
    (kernel, [block_m, block_n, warps, stages]) to time instead, ``repeat`` times each, taking turns."""
    from flashbook import timing
    from flashbook.kernels import autograd, configs

    q, k, v, do, kw = backward_inputs(shape)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    bd = configs.block_d(shape["d"])
    out = dict(shape, default={}, rows=[])
    todo = []
    # the tiles the library chooses for this mask (configs.tiles_for: a long window the causal mask's)
    causal, windowed = configs.tiles_for("window" not in shape["name"],
                                         shape["window"] + 1 if "window" in shape["name"] else None, bd)
    for kernel in kernels:
        out["default"][kernel] = _fields(configs.default(kernel, cc=90, block_d=bd, elem_bytes=2, causal=causal,
                                                         window=windowed))
        todo += [(kernel, cfg) for cfg in configs.kept_candidates(kernel, cc=90, block_d=bd, elem_bytes=2)
                 if min(cfg.block_m, cfg.block_n) >= 64 and cfg.num_stages >= 2]
    if only:
        todo = [(kernel, configs.Config(*fields)) for kernel, fields in only] * repeat
    for kernel, cfg in todo:
        if time.perf_counter() > deadline:
            out["stopped"] = "budget"
            return out
        start = time.perf_counter()
        try:
            if kernel == "forward":
                ms = timing.time_ms(lambda: autograd.flash_forward(q, k, v, **kw, config=cfg))
                out["rows"].append({"kernel": kernel, "config": _fields(cfg), "fwd_ms": ms})
            else:
                arg = {"config_dkdv" if kernel == "backward_dkdv" else "config_dq": cfg}
                ms = timing.time_ms(lambda: autograd.flash_backward(q, k, v, o, lse, do, **kw, **arg))
                out["rows"].append({"kernel": kernel, "config": _fields(cfg), "bwd_ms": ms})
        except Exception as exc:  # noqa: BLE001
            out["rows"].append({"kernel": kernel, "config": _fields(cfg), "error": f"{type(exc).__name__}"[:200]})
        print(f"  {kernel} {_fields(cfg)}: {out['rows'][-1].get('fwd_ms', out['rows'][-1].get('bwd_ms', 'error'))} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--sweep", default="")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="configurations to sweep, e.g. dq:64,64,4,2;dkdv:64,64,4,2;fwd:128,64,4,3")
    p.add_argument("--kernels", default="dkdv,dq", help="the kernels --sweep sweeps: fwd, dkdv, dq")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=450.0)
    args = p.parse_args(argv)
    from flashbook.bench.records import collect_provenance

    # FlexAttention's compiled backward donates its buffers unless told not to, and then refuses
    # the backward timed alone (retain_graph=True)
    import torch._functorch.config

    torch._functorch.config.donated_buffer = False

    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/masks_profile.py"),
              "profiles": [], "sweeps": []}
    path = os.path.join(args.out, "masks_profile.json")
    start = time.perf_counter()

    def save():
        with open(path, "w") as f:
            json.dump(record, f, indent=1)

    for text in filter(None, args.shapes.split(",")):
        row = profile_shape(parse_shape(text), args.iters)
        record["profiles"].append(row)
        save()
        brief = {impl: {k: row[impl].get(k) for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms", "gpu_busy_ms", "overlap")}
                 for impl in ("flashbook", "flex")}
        print(text, json.dumps(brief), f"host {row['flashbook'].get('host_us', {}).get('median_us')} us",
              flush=True)
        for name, x in list(row["flashbook"].get("kernels", {}).items())[:6]:
            print(f"    {x['us_per_step']:9.1f} us  {name}", flush=True)
        for impl in ("flashbook", "flex"):
            for x in row[impl].get("host_profile", [])[:12]:
                print(f"    {impl} host {x['own_us']:8.1f} us own {x['cumulative_us']:8.1f} cum "
                      f"{x['calls_per_step']:5.1f}x  {x['function']}", flush=True)
        if time.perf_counter() - start > args.budget_s:
            record["stopped"] = "budget"
            save()
            return 0
    for text in filter(None, args.sweep.split(",")):
        only = [(KERNEL_NAMES[item.split(":")[0]], [int(x) for x in item.split(":")[1].split(",")])
                for item in filter(None, args.only.split(";"))]
        record["sweeps"].append(sweep_shape(parse_shape(text), deadline=start + args.budget_s, only=only,
                                            repeat=args.repeat,
                                            kernels=[KERNEL_NAMES[x] for x in args.kernels.split(",")]))
        save()
        if time.perf_counter() - start > args.budget_s:
            record["stopped"] = "budget"
            break
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
