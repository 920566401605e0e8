"""Measuring on a GPU: one implementation on one shape, timed, its memory and its error.

``bench_case`` runs one implementation on one shape and never raises for the
kernel's sake (a failure becomes a ``status`` of ``STATUSES`` and a note);
``run_sweep`` runs every shape and implementation. ``CudaTimer`` (``time_ms``) is
the one timer (CUDA events, L2 flushed, median) behind every time the benchmarks
record.
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import warnings
from dataclasses import dataclass

# The timer lives in flashbook.timing (the kernels' autotuner uses it too, and kernels never
# import the benchmark package); it is re-exported here, where the benchmarks look for it.
from ..timing import CudaTimer, graph_replay, time_ms  # noqa: F401
from .costs import GB, attention_flops, attention_memory_bytes, naive_memory_estimate, tflops
from .impls import SDPA_BACKENDS, naive_attention, resolve_impl

@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool

    @property
    def flops_fwd(self) -> int:
        return attention_flops(self.batch, self.heads, self.seq, self.seq, self.head_dim,
                               self.causal, "fwd")

    @property
    def flops_bwd(self) -> int:
        return attention_flops(self.batch, self.heads, self.seq, self.seq, self.head_dim,
                               self.causal, "bwd")

    def label(self) -> str:
        return shape_label(self.head_dim, self.seq, self.causal, self.batch, self.heads)


def shape_label(head_dim, seq, causal, batch=None, heads=None) -> str:
    """``"d=128 N=4096 causal"`` (with ``B=.. H=..`` when given)."""
    text = f"d={int(head_dim)} N={int(seq)} {'causal' if causal else 'full'}"
    if batch is not None and heads is not None:
        text += f" B={int(batch)} H={int(heads)}"
    return text


TOKENS = 32768        # batch * seq: every shape does work on the same number of tokens
MODEL_WIDTH = 2048    # heads * head_dim: 16 heads at d=128, 32 at d=64


def heads_for(head_dim: int, model_width: int = MODEL_WIDTH) -> int:
    return max(1, model_width // head_dim)


def make_shapes(seqs, head_dims, causals, *, tokens=TOKENS, heads=None) -> list:
    """Every (head_dim, seq, causal) shape; batch = tokens // seq."""
    shapes = []
    for d in head_dims:
        for n in seqs:
            batch = tokens // n
            if batch < 1:
                raise ValueError(f"seq {n} is longer than --tokens {tokens}: batch would be 0")
            for causal in causals:
                shapes.append(Shape(batch, heads or heads_for(d), n, d, causal))
    return shapes


#: What a row's ``status`` can say ("out-of-resources": a block config that needs more
#: shared memory or registers than the chip has; only the block sweep writes it).
STATUSES = ("ok", "unsupported", "oom", "oom-skipped", "out-of-resources", "error",
            "unavailable", "cuda-error", "not-run")

# A loose bound on the relative (Frobenius) error against float64 that the block sweep
# and the ladder record (``err_out``) and chapter 10 asserts on them; the pass/fail of
# ``bench_case`` is the kernel tests' rule (``kernels.checks.within_twice_yardstick``).
# bf16 keeps 8 significant bits (unit roundoff 2**-8 = 0.0039): rounding Q, K, V, P and
# O alone gives errors of a few 1e-3, and gradients pass through more rounded products.
TOLERANCE = {"out": 2e-2, "grad": 5e-2}


@dataclass
class ShapeRow:
    """The shape columns every recorded row starts with (results, blocks, ladder)."""

    seq: int
    head_dim: int
    batch: int
    heads: int
    causal: bool
    dtype: str

    @classmethod
    def of(cls, shape: Shape, dtype: str, **fields):
        """A row of this class for ``shape`` (a ``Shape``) in ``dtype``, with ``fields``."""
        return cls(seq=shape.seq, head_dim=shape.head_dim, batch=shape.batch, heads=shape.heads,
                   causal=shape.causal, dtype=dtype, **fields)


@dataclass
class Result(ShapeRow):
    """One implementation on one shape. Times in ms, memory in bytes."""

    impl: str
    status: str = "ok"
    fwd_ms: float | None = None
    bwd_ms: float | None = None
    fwd_tflops: float | None = None
    bwd_tflops: float | None = None
    peak_fwd_bytes: int | None = None       # peak beyond the inputs, forward (with grad)
    peak_fwd_bwd_bytes: int | None = None   # peak beyond the inputs, forward + backward
    floor_fwd_bwd_bytes: int | None = None  # attention_memory_bytes lower bound, same terms
    err_out: float | None = None
    err_grad: float | None = None
    check: str = ""                         # "pass", "FAIL" or "" (not checked)
    note: str = ""


RESULT_FIELDS = [f.name for f in dataclasses.fields(Result)]


def classify_error(exc: BaseException, impl: str) -> tuple:
    """(status, note) for an exception raised while running ``impl``.

    Out of memory is "oom"; an SDPA backend that refuses a shape is
    "unsupported"; kernels that cannot be imported are "unavailable"; a CUDA
    error that poisons the context is "cuda-error" (the sweep stops); anything
    else is "error".
    """
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    low = text.lower()
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in low:
        return "oom", first
    if type(exc).__name__ == "OutOfResources":
        return "out-of-resources", first
    if ("illegal memory access" in low or "device-side assert" in low
            or "unspecified launch failure" in low or "cuda error: an illegal" in low):
        return "cuda-error", first
    if isinstance(exc, ImportError):
        return "unavailable", first
    if impl in SDPA_BACKENDS:
        return "unsupported", first
    return "error", first


def rel_err(x, ref) -> float:
    """Relative (Frobenius) error of ``x`` against a float64 ``ref``."""
    x = x.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


class CudaMemory:
    """Peak device memory beyond what was allocated when ``start`` was called."""

    def __init__(self):
        import torch

        self.torch = torch
        self.base = 0

    def start(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        self.base = self.torch.cuda.memory_allocated()

    def peak(self) -> int:
        self.torch.cuda.synchronize()
        return int(self.torch.cuda.max_memory_allocated() - self.base)

    def free_bytes(self) -> int:
        free, _total = self.torch.cuda.mem_get_info()
        return int(free)

    def release(self):
        gc.collect()
        self.torch.cuda.empty_cache()


def make_inputs(shape: Shape, dtype, device, generator=None):
    """Fresh standard-normal q, k, v (requiring grad) and dO for one shape."""
    import torch

    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    q, k, v, do = (torch.randn(size, dtype=dtype, device=device, generator=generator)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def reference_slice(q, k, v, do, causal, heads=1, dtype=None):
    """Output and gradients of batch 0, the first ``heads`` heads, by plain PyTorch math
    (``naive_attention``) in ``dtype``: float64 (the default) for the truth, the inputs'
    own dtype for the yardstick (gradients None when ``do`` is None)."""
    import torch

    dtype = torch.float64 if dtype is None else dtype
    sl = (slice(0, 1), slice(0, heads))
    q_, k_, v_ = (t.detach()[sl].to(dtype).requires_grad_(do is not None) for t in (q, k, v))
    o = naive_attention(q_, k_, v_, causal=causal)
    if do is None:
        return o.detach(), None
    grads = torch.autograd.grad(o, (q_, k_, v_), do[sl].to(dtype))
    return o.detach(), [g.detach() for g in grads]


def check_slice(out, grads, ref, yardstick, head_dim: int) -> list:
    """What differs (empty: pass) when batch 0's slice of ``out`` and ``grads`` is held to
    the kernel tests' rule (``kernels.checks.within_twice_yardstick``): each of o, dq, dk,
    dv within twice the error of the ``yardstick`` (same math in the inputs' dtype) against
    the float64 ``ref``, plus the rule's floors. ``ref`` and ``yardstick`` are
    ``reference_slice`` results."""
    from ..kernels.checks import within_twice_yardstick

    (o_ref, g_ref), (o_yard, g_yard) = ref, yardstick
    hs = o_ref.shape[1]
    got = [out[:1, :hs], *(g[:1, :hs] for g in grads)]
    problems = (within_twice_yardstick(name, a, w, y, head_dim=head_dim)
                for name, a, w, y in zip(("o", "dq", "dk", "dv"), got,
                                         [o_ref, *g_ref], [o_yard, *g_yard]))
    return [p for p in problems if p]


def skip_reason(impl: str, shape: Shape, dtype_bytes: int, limit_bytes: float):
    """Why ``impl`` is not even tried on ``shape`` (None: try it)."""
    if impl not in ("naive", "sdpa-math"):
        return None
    # sdpa-math computes half-precision inputs in fp32 (PyTorch's default)
    elem = 4 if impl == "sdpa-math" else dtype_bytes
    need = naive_memory_estimate(shape.batch, shape.heads, shape.seq, shape.seq,
                                 shape.head_dim, elem_bytes=elem)
    if need > limit_bytes:
        return (f"needs about {need / GB:.1f} GB (4 N x N matrices of {elem} bytes), "
                f"over the {limit_bytes / GB:.0f} GB limit")
    return None


def bench_case(name, fn, shape: Shape, inputs, *, dtype_name, timer, memory,
               ref=None, skip=None) -> Result:
    """Measure one implementation on one shape. Never raises for the kernel's
    sake: failures become a status and a note.

    Steps: one forward + backward (compiles, warms up, shows unsupported shapes
    early); one more to measure peak memory (beyond the inputs) and check the
    result against ``ref``; then the forward time and the backward alone
    (``torch.autograd.grad`` on a kept graph, ``retain_graph=True``).
    """
    import torch

    q, k, v, do = inputs
    res = Result.of(shape, dtype_name, impl=name)
    res.floor_fwd_bwd_bytes = attention_memory_bytes(
        shape.batch, shape.heads, shape.seq, shape.seq, shape.head_dim,
        impl="naive" if name in ("naive", "sdpa-math") else "flash", pass_="fwd+bwd",
        dtype_bytes=q.element_size(), include_inputs=False)
    if skip:
        res.status, res.note = "oom-skipped", skip
        return res

    def forward():
        return fn(q, k, v, causal=shape.causal)

    stage = "first run"
    out = grads = None
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = forward()
            grads = torch.autograd.grad(out, (q, k, v), do)
            out = grads = None

            stage = "memory"
            memory.start()
            out = forward()
            res.peak_fwd_bytes = memory.peak()
            grads = torch.autograd.grad(out, (q, k, v), do)
            res.peak_fwd_bwd_bytes = memory.peak()
            if ref is not None:
                o_ref, g_ref = ref
                hs = o_ref.shape[1]
                out = out.detach()
                res.err_out = rel_err(out[:1, :hs], o_ref)
                res.err_grad = max(rel_err(g[:1, :hs], r) for g, r in zip(grads, g_ref))
                yardstick = reference_slice(q, k, v, do, shape.causal, heads=hs, dtype=q.dtype)
                problems = check_slice(out, grads, ref, yardstick, shape.head_dim)
                res.check = "FAIL" if problems else "pass"
                if problems:
                    res.note = "; ".join(problems)[:400]
            out = grads = None

            stage = "forward timing"
            res.fwd_ms = timer(forward)
            res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)

            stage = "backward timing"
            out = forward()
            res.bwd_ms = timer(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                               backward=True)
            res.bwd_tflops = tflops(shape.flops_bwd, res.bwd_ms)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the sweep
        res.status, res.note = classify_error(exc, name)
        # SDPA says why a backend refused a shape in warnings, before it raises
        reasons = [str(w.message).strip().splitlines()[0] for w in caught
                   if str(w.message).strip()]
        if res.status == "unsupported" and reasons:
            res.note = "; ".join(dict.fromkeys(reasons + [res.note]))[:400]
        res.note = f"{stage}: {res.note}"
    finally:
        out = grads = None
        memory.release()
    return res


def run_tools(args):
    """What every run measures with, from its arguments: (torch dtype, ``CudaTimer``,
    ``CudaMemory``, a CUDA generator seeded with ``args.seed``)."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    return dtype, CudaTimer(args.warmup_ms, args.rep_ms, graph=getattr(args, "graph", False)), CudaMemory(), gen


def run_sweep(args, impls, *, progress=True):
    """Run every shape x implementation; returns the list of ``Result``."""
    import torch

    dtype, timer, memory, gen = run_tools(args)
    total_mem = torch.cuda.get_device_properties(0).total_memory

    functions, unavailable = {}, {}
    for name in impls:
        try:
            functions[name] = resolve_impl(name)
        except Exception as exc:  # noqa: BLE001
            unavailable[name] = classify_error(exc, name)

    cases = [(s, name) for s in args.shapes for name in impls]
    bar = progress_bar(len(cases), progress)
    results, stop = [], None
    for shape in args.shapes:
        inputs = make_inputs(shape, dtype, "cuda", gen)
        try:
            ref = reference_slice(*inputs, shape.causal)
        except Exception:  # noqa: BLE001 - no check for this shape rather than no run
            ref = None
        memory.release()
        limit = min(args.max_naive_gb * GB, 0.9 * total_mem)
        for name in impls:
            bar.set_description(f"{shape.label()} {name}")
            if stop:
                res = Result.of(shape, args.dtype, impl=name, status="not-run", note=stop)
            elif name in unavailable:
                status, note = unavailable[name]
                res = Result.of(shape, args.dtype, impl=name, status=status, note=note)
            else:
                res = bench_case(name, functions[name], shape, inputs, dtype_name=args.dtype,
                                 timer=timer, memory=memory, ref=ref,
                                 skip=skip_reason(name, shape, inputs[0].element_size(), limit))
                if res.status == "cuda-error":
                    stop = f"not run: an earlier CUDA error ({name}, {shape.label()})"
            results.append(res)
            bar.update(1)
        del inputs, ref
        memory.release()
    bar.close()
    return results


class _NoBar:
    def set_description(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def progress_bar(total, enabled):
    """A tqdm bar on stderr, or one that shows nothing (disabled, or no tqdm)."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr)
