"""Runs beyond the implementation table: block sizes of the forward kernel, and
chapter 10's performance ladder (``--sweep-blocks``, ``--ladder``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .harness import (ShapeRow, classify_error, make_inputs, progress_bar, reference_slice, rel_err,
                      run_tools, tflops)

SWEEP_SEQS = (4096,)

#: The grid the sweep walks: B_r (block_m), B_c (block_n), warps, pipeline stages.
BLOCK_GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8),
              "num_stages": (2, 3, 4)}


@dataclass
class BlockResult(ShapeRow):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    status: str = "ok"
    fwd_ms: float | None = None
    fwd_tflops: float | None = None
    n_regs: int | None = None
    n_spills: int | None = None
    shared_bytes: int | None = None
    err_out: float | None = None
    note: str = ""


BLOCK_FIELDS = [f.name for f in dataclasses.fields(BlockResult)]


def block_configs(grid=None) -> list:
    """Every combination of the grid, as dicts."""
    grid = grid or BLOCK_GRID
    keys = list(grid)
    combos = [{}]
    for key in keys:
        combos = [dict(c, **{key: v}) for c in combos for v in grid[key]]
    return combos


def run_block_sweep(args, *, progress=True) -> list:
    """Time the forward kernel (``kernels.flash_forward(config=...)``) with every config
    of ``BLOCK_GRID`` on every shape; registers, spills and shared memory come from the
    same kernel compiled for this GPU (``kernels.targets.compile_kernel``)."""
    import torch

    from ..kernels import flash_forward, targets
    from ..kernels.configs import Config

    dtype, timer, memory, gen = run_tools(args)
    major, minor = torch.cuda.get_device_capability()
    configs = block_configs()
    bar = progress_bar(len(configs) * len(args.shapes), progress)
    results = []
    for shape in args.shapes:
        q, k, v, _do = make_inputs(shape, dtype, "cuda", gen)
        q, k, v = (t.detach() for t in (q, k, v))
        o_ref, _ = reference_slice(q, k, v, None, shape.causal)
        for cfg in configs:
            bar.set_description(f"{shape.label()} {cfg}")
            res = BlockResult.of(shape, args.dtype, **cfg)
            config = Config(cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["num_stages"])

            def launch(config=config):
                return flash_forward(q, k, v, causal=shape.causal, config=config)
            try:
                compiled = targets.compile_kernel("forward", cc=10 * major + minor, config=config,
                                                  head_dim=shape.head_dim, dtype=args.dtype,
                                                  causal=shape.causal)
                res.__dict__.update(targets.resources(compiled, load=True))
                with torch.no_grad():
                    res.err_out = rel_err(launch()[0][:1, :1], o_ref)
                    res.fwd_ms = timer(launch)
                res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)
            except Exception as exc:  # noqa: BLE001
                res.status, res.note = classify_error(exc, "flashbook")
            finally:
                memory.release()
            results.append(res)
            bar.update(1)
            if res.status == "cuda-error":
                bar.close()
                return results
        del q, k, v
    bar.close()
    return results


LADDER_SEQS = (4096, 16384)


@dataclass
class LadderResult(ShapeRow):
    """One rung of chapter 10's ladder on one shape (``pass_`` "fwd" or "bwd")."""

    rung: int
    name: str
    pass_: str
    status: str = "ok"
    ms: float | None = None
    tflops: float | None = None
    err_out: float | None = None
    note: str = ""


LADDER_FIELDS = [f.name for f in dataclasses.fields(LadderResult)]


def run_ladder(args, *, progress=True) -> list:
    """Time every forward rung of ``kernels.ladder.RUNGS`` and both backward dQ
    strategies on every shape; each output is checked against float64."""
    import torch

    from ..kernels import flash_attention
    from ..kernels.ladder import RUNGS, run_rung

    dtype, timer, memory, gen = run_tools(args)
    steps = [("fwd", i, r.name) for i, r in enumerate(RUNGS)]
    steps += [("bwd", len(RUNGS) + i, f"dQ {mode}") for i, mode in enumerate(("atomic", "separate"))]
    bar = progress_bar(len(steps) * len(args.shapes), progress)
    results = []
    for shape in args.shapes:
        q, k, v, do = make_inputs(shape, dtype, "cuda", gen)
        o_ref, _ = reference_slice(q, k, v, None, shape.causal)
        for pass_, index, name in steps:
            bar.set_description(f"{shape.label()} {name}")
            res = LadderResult.of(shape, args.dtype, rung=index, name=name, pass_=pass_)
            try:
                if pass_ == "fwd":
                    rung = RUNGS[index]
                    with torch.no_grad():
                        def call(rung=rung):
                            return run_rung(rung, q, k, v, causal=shape.causal)
                        res.err_out = rel_err(call()[0][:1, :1], o_ref)
                        res.ms = timer(call)
                    res.tflops = tflops(shape.flops_fwd, res.ms)
                else:
                    mode = name.split()[-1]
                    out = flash_attention(q, k, v, causal=shape.causal, dq_mode=mode)
                    res.err_out = rel_err(out[:1, :1].detach(), o_ref)
                    res.ms = timer(lambda out=out: torch.autograd.grad(out, (q, k, v), do,
                                                                       retain_graph=True))
                    res.tflops = tflops(shape.flops_bwd, res.ms)
                    del out
            except Exception as exc:  # noqa: BLE001
                res.status, res.note = classify_error(exc, "flashbook")
            finally:
                memory.release()
            results.append(res)
            bar.update(1)
        del q, k, v, do
    bar.close()
    return results
