"""The one GPU timer: CUDA events, the L2 cache flushed before each call, the median.

``time_ms`` (``CudaTimer``) times every number the benchmarks record
(``flashbook.bench`` re-exports it) and the kernels' autotuner
(``kernels.autograd.set_autotune``); ``graph_replay`` captures a call in a CUDA graph, so
that the GPU's work is timed without the host's. It sits below both packages, so that the
kernels never import the benchmarks.
"""
from __future__ import annotations

import functools
import statistics
import time


class CudaTimer:
    """Median time of ``fn`` in ms, timed with CUDA events.

    Warm-up first (``warmup_ms`` worth of calls), then at least ``min_reps``
    timed calls (``rep_ms`` worth, at most ``max_reps``), each after writing a
    256 MiB buffer so that no input sits in the L2 cache from the call before.

    The events time the GPU, but a call whose host side (Python, checks, the launch)
    takes longer than the GPU's flush before it makes the GPU wait, and the wait is
    timed. With ``graph=True`` each forward call is captured once in a CUDA graph and
    the graph is replayed instead: the GPU's work alone. A backward (``backward=True``)
    is always called as Python makes it: autograd runs it on its forward's stream, so
    it cannot be captured without its forward.
    """

    def __init__(self, warmup_ms=25.0, rep_ms=100.0, min_reps=5, max_reps=200, graph=False):
        import torch

        self.torch = torch
        self.graph = bool(graph)
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps = min_reps, max_reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def __call__(self, fn, grad_to_none=(), backward: bool = False) -> float:
        """Median ms of ``fn()``; the ``.grad`` of each tensor in ``grad_to_none`` is reset
        before every call (outside the timed region), so backward passes do not accumulate.
        ``backward``: ``fn`` runs a backward pass (never captured in a graph)."""
        torch = self.torch

        def reset():
            for t in grad_to_none or ():
                t.grad = None

        if self.graph and not backward:
            fn = graph_replay(fn)[0]
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            reset()
            self.flush.zero_()
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 3, 1e-3)
        n_warm = min(self.max_reps, max(1, int(self.warmup_ms / estimate)))
        n_rep = min(self.max_reps, max(self.min_reps, int(self.rep_ms / estimate)))
        for _ in range(n_warm):
            reset()
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            reset()
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_replay(fn):
    """``fn`` captured in a CUDA graph (after two calls on a side stream, which compile
    and autotune); returns the graph's replay function and the output the graph writes to."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


@functools.lru_cache(maxsize=None)
def _timer(warmup_ms: float, rep_ms: float, graph: bool = False) -> CudaTimer:
    return CudaTimer(warmup_ms, rep_ms, graph=graph)


def time_ms(fn, *, grad_to_none=(), warmup_ms: float = 25.0, rep_ms: float = 100.0, graph: bool = False) -> float:
    """Median time of ``fn()`` in ms, by ``CudaTimer``: the one timer behind every time the
    benchmarks record (``python -m flashbook.bench`` and ``benchmarks/*.py``); ``graph``:
    replayed from a CUDA graph (the GPU's work alone)."""
    return _timer(float(warmup_ms), float(rep_ms), bool(graph))(fn, grad_to_none)


def host_us(fn, calls: int = 500, rounds: int = 5) -> dict:
    """CPU microseconds per call of ``fn`` while the GPU only receives work: ``calls``
    calls back to back, one synchronisation after them, ``rounds`` times. Returns the
    median, min and max per call (``median_us``, ``min_us``, ``max_us``)."""
    import torch

    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return {"median_us": statistics.median(per), "min_us": min(per), "max_us": max(per)}


def profile_once(fn, warmups: int = 2) -> None:
    """``fn`` called ``warmups`` times (compiling, planning), then once between
    ``cudaProfilerStart`` and ``cudaProfilerStop``: what Nsight Compute run with
    ``--profile-from-start off`` profiles (benchmarks/*_ncu.py, causal_cost.py)."""
    import torch

    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
