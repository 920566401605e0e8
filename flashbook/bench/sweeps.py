"""Runs beyond the implementation table: block sizes of the forward kernel, and
chapter 10's performance ladder (``--sweep-blocks``, ``--ladder``).
"""
from __future__ import annotations

import dataclasses
import functools
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


def run_steps(args, steps, measure, *, progress=True) -> list:
    """Run every step on every shape of ``args.shapes`` and return the rows, in order.

    ``steps``: ``(label, row)`` pairs, ``row(shape)`` making the step's empty result row.
    Each shape gets fresh inputs ``(q, k, v, do)`` (``make_inputs``) and batch 0's output
    in float64 (``reference_slice``); ``measure(res, shape, inputs, o_ref, timer)`` fills
    ``res``. A failure becomes the row's status and note (``classify_error``); a CUDA
    error ends the run, since the context is lost.
    """
    dtype, timer, memory, gen = run_tools(args)
    bar = progress_bar(len(steps) * len(args.shapes), progress)
    results = []
    for shape in args.shapes:
        inputs = make_inputs(shape, dtype, "cuda", gen)
        o_ref, _ = reference_slice(*inputs[:3], None, shape.causal)
        for label, row in steps:
            bar.set_description(f"{shape.label()} {label}")
            res = row(shape)
            try:
                measure(res, shape, inputs, o_ref, timer)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded
                res.status, res.note = classify_error(exc, "flashbook")
            finally:
                memory.release()
            results.append(res)
            bar.update(1)
            if res.status == "cuda-error":
                bar.close()
                return results
        del inputs, o_ref
    bar.close()
    return results


def run_block_sweep(args, *, progress=True) -> list:
    """Time the forward kernel (``kernels.flash_forward(config=...)``) with every config
    of ``BLOCK_GRID`` on every shape; registers, spills and shared memory come from the
    same kernel compiled for this GPU (``kernels.targets.compile_kernel``)."""
    import torch

    from ..kernels import flash_forward, targets
    from ..kernels.configs import Config

    major, minor = torch.cuda.get_device_capability()

    def measure(res, shape, inputs, o_ref, timer):
        q, k, v = (t.detach() for t in inputs[:3])
        config = Config(res.block_m, res.block_n, res.num_warps, res.num_stages)

        def launch():
            return flash_forward(q, k, v, causal=shape.causal, config=config)
        compiled = targets.compile_kernel("forward", cc=10 * major + minor, config=config,
                                          head_dim=shape.head_dim, dtype=args.dtype,
                                          causal=shape.causal)
        res.__dict__.update(targets.resources(compiled, load=True))
        with torch.no_grad():
            res.err_out = rel_err(launch()[0][:1, :1], o_ref)
            res.fwd_ms = timer(launch)
        res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)

    steps = [(str(cfg), functools.partial(BlockResult.of, dtype=args.dtype, **cfg))
             for cfg in block_configs()]
    return run_steps(args, steps, measure, progress=progress)


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

    from ..kernels.autograd import flash_attention   # the Triton kernels (chapter 10's ladder)
    from ..kernels.ladder import RUNGS, run_rung

    def measure(res, shape, inputs, o_ref, timer):
        q, k, v, do = inputs
        if res.pass_ == "fwd":
            def call():
                return run_rung(RUNGS[res.rung], q, k, v, causal=shape.causal)
            with torch.no_grad():
                res.err_out = rel_err(call()[0][:1, :1], o_ref)
                res.ms = timer(call)
            res.tflops = tflops(shape.flops_fwd, res.ms)
        else:
            out = flash_attention(q, k, v, causal=shape.causal, dq_mode=res.name.split()[-1])
            res.err_out = rel_err(out[:1, :1].detach(), o_ref)
            res.ms = timer(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), backward=True)
            res.tflops = tflops(shape.flops_bwd, res.ms)

    rungs = [("fwd", r.name) for r in RUNGS] + [("bwd", f"dQ {mode}") for mode in ("atomic", "separate")]
    steps = [(name, functools.partial(LadderResult.of, dtype=args.dtype, rung=index, name=name,
                                      pass_=pass_))
             for index, (pass_, name) in enumerate(rungs)]
    return run_steps(args, steps, measure, progress=progress)
