"""A peer's attention kernel, timed beside ours: ``python -m flashbook.bench --peer PATH[:FUNC]``.

The user supplies the peer as a Python file (the reference case is Triton's own
tutorial, ``python/tutorials/06-fused-attention.py``, fetched by the user; no peer
code lives in this repository). The file is loaded from its path under a private
module name, so its ``if __name__ == "__main__":`` block does not run, and its
function ``FUNC`` (default ``attention``) is called the tutorial's way:
``FUNC(q, k, v, causal, scale)``, returning the output (or a tuple whose first
element is the output).

Every shape runs the peer, flashbook and sdpa-flash on the same inputs, with the
library's one timer (``harness.time_ms``'s ``CudaTimer``) and its one correctness rule
(``harness.check_slice``: batch 0, head 0 against float64, within twice the error of
PyTorch math in the inputs' dtype). Forward and backward are measured and checked
separately, each with its own status: a peer whose backward is missing, raises or is
wrong for some shapes still has its forward recorded. A row that fails the check is
timed and recorded with ``check = FAIL``, and no ratio is computed against it.
"""
from __future__ import annotations

import gc
import hashlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field, fields as dataclass_fields
from pathlib import Path

from .harness import (ShapeRow, Shape, check_slice, classify_error, make_inputs,
                      progress_bar, reference_slice, rel_err, run_tools)
from .impls import resolve_impl
from .readback import load_results
from .records import format_cell
from .runs import run_path
from .costs import tflops

#: The peer's function when ``--peer PATH`` names none (the tutorial's).
DEFAULT_FUNC = "attention"

#: Rows per head of every default shape: heads = PEER_ROWS // N, batch 1 (same total work
#: at every N: 256 heads at 1K, 64 at 4K, 16 at 16K).
PEER_ROWS = 16 * 16384
PEER_SEQS = (1024, 4096, 16384)
PEER_HEAD_DIMS = (64, 128)
PEER_DTYPE = "fp16"

#: What runs beside the peer, in the order the CSV lists them.
COMPARED = ("flashbook", "flashbook-gluon", "sdpa-flash")

SHAPES_HELP = (f"batch 1, heads = {PEER_ROWS} // N (same total work at every N), because "
               "the Triton tutorial's TMA path is only right at batch 1")


@dataclass
class PeerSpec:
    """A loaded peer: the file as named on the command line, its SHA-256, the function."""

    path: str
    func: str
    sha256: str
    module_name: str
    fn: object = field(repr=False)

    def __call__(self, q, k, v, *, causal=False, scale=None):
        """The peer as an implementation of ``impls``: ``f(q, k, v, *, causal, scale)``."""
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        out = self.fn(q, k, v, causal, scale)
        return out[0] if isinstance(out, (tuple, list)) else out

    def provenance(self) -> dict:
        """What names the peer in ``provenance.json``: enough to fetch and check it again."""
        return {"path": self.path, "sha256": self.sha256, "function": self.func,
                "call": f"{self.func}(q, k, v, causal, scale); a tuple's first element",
                "module_name": self.module_name}


def split_peer(text: str) -> tuple:
    """``"dir/file.py:fn"`` -> ("dir/file.py", "fn"); ``"dir/file.py"`` -> (.., "attention")."""
    text = str(text)
    head, sep, tail = text.rpartition(":")
    if not sep or "/" in tail or "\\" in tail or tail.endswith(".py"):
        return text, DEFAULT_FUNC
    if not tail.isidentifier():
        raise ValueError(f"expected PATH[:FUNC] with FUNC a Python name, got {text!r}")
    return head, tail


def load_peer(text: str) -> PeerSpec:
    """Load ``PATH[:FUNC]``: the file under a private module name (its ``__main__`` block
    does not run) and its callable ``FUNC``. Raises ValueError (missing file, not a
    ``.py``, a file that fails to load, no ``FUNC``) or TypeError (``FUNC`` not callable)."""
    path_text, func = split_peer(text)
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(f"no file at {path_text!r} (expected the peer's Python file, "
                         f"e.g. .peer/06-fused-attention.py)")
    if path.suffix != ".py":
        raise ValueError(f"expected a Python file ending in .py, got {path_text!r}")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    name = f"_flashbook_peer_{sha[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever the peer raises, say where it came from
        del sys.modules[name]
        raise ValueError(f"loading {path_text!r} raised {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, func):
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and not isinstance(v, type))
        raise ValueError(f"{path_text!r} has no {func!r}; callables there: "
                         f"{', '.join(found[:12]) or 'none'} (choose one with PATH:FUNC)")
    fn = getattr(module, func)
    if not callable(fn):
        raise TypeError(f"{path_text}:{func} is of type {type(fn).__name__}, not callable")
    return PeerSpec(path=path_text, func=func, sha256=sha, module_name=name, fn=fn)


def peer_shapes(seqs=PEER_SEQS, head_dims=PEER_HEAD_DIMS, causals=(False, True), *,
                heads=None) -> list:
    """The comparison's shapes: batch 1, ``heads`` or ``PEER_ROWS // N`` heads."""
    return [Shape(1, heads or max(1, PEER_ROWS // n), n, d, causal)
            for d in head_dims for n in seqs for causal in causals]


@dataclass
class PeerResult(ShapeRow):
    """One implementation on one shape, forward and backward each with a status and a
    check. ``*_vs_peer``: this row's throughput over the peer's (peer ms / this ms), only
    where both rows ran and passed the check."""

    impl: str
    fwd_status: str = "ok"
    fwd_check: str = ""                    # "pass", "FAIL" or "" (not checked)
    fwd_ms: float | None = None
    fwd_tflops: float | None = None
    fwd_vs_peer: float | None = None
    err_out: float | None = None
    bwd_status: str = "ok"
    bwd_check: str = ""
    bwd_ms: float | None = None
    bwd_tflops: float | None = None
    bwd_vs_peer: float | None = None
    err_grad: float | None = None
    note: str = ""


PEER_FIELDS = [f.name for f in dataclass_fields(PeerResult)]


def _release():
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _failed(res, pass_, exc, name):
    status, note = classify_error(exc, name)
    setattr(res, f"{pass_}_status", status)
    res.note = "; ".join(filter(None, [res.note, f"{pass_}: {note}"]))[:400]


def measure(name, fn, shape: Shape, inputs, ref, yardstick, *, dtype_name, timer) -> PeerResult:
    """Forward then backward of ``fn`` on ``shape``, each checked and timed on its own.
    Never raises for the implementation's sake (failures become statuses and a note)."""
    import torch

    q, k, v, do = inputs
    res = PeerResult.of(shape, dtype_name, impl=name)

    def forward():
        return fn(q, k, v, causal=shape.causal)

    out = None
    try:
        out = forward()
        hs = ref[0].shape[1]
        res.err_out = rel_err(out.detach()[:1, :hs], ref[0])
        problems = check_slice(out.detach(), [], ref, yardstick, shape.head_dim)
        res.fwd_check = "FAIL" if problems else "pass"
        res.note = "; ".join(problems)[:400]
        res.fwd_ms = timer(forward)
        res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)
    except Exception as exc:  # noqa: BLE001 - recorded, the comparison goes on
        _failed(res, "fwd", exc, name)
    if res.fwd_status != "ok":
        res.bwd_status = "not-run"
        return res
    if not (torch.is_tensor(out) and out.requires_grad):
        res.bwd_status = "unsupported"
        res.note = "; ".join(filter(None, [res.note, "bwd: the output has no autograd graph"]))
        return res
    try:
        grads = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        hs = ref[0].shape[1]
        res.err_grad = max(rel_err(g[:1, :hs], r) for g, r in zip(grads, ref[1]))
        problems = [p for p in check_slice(out.detach(), grads, ref, yardstick, shape.head_dim)
                    if not p.startswith("o:")]
        res.bwd_check = "FAIL" if problems else "pass"
        res.note = "; ".join(filter(None, [res.note, *problems]))[:400]
        grads = None
        res.bwd_ms = timer(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), backward=True)
        res.bwd_tflops = tflops(shape.flops_bwd, res.bwd_ms)
    except Exception as exc:  # noqa: BLE001
        _failed(res, "bwd", exc, name)
    return res


def _ratio(row, peer, pass_):
    ms, peer_ms = getattr(row, f"{pass_}_ms"), getattr(peer, f"{pass_}_ms")
    passed = all(getattr(r, f"{pass_}_check") == "pass" for r in (row, peer))
    return peer_ms / ms if passed and ms and peer_ms else None


def compare(peer, shapes, dtype, dtype_name, *, timer, device="cuda", generator=None,
            impls=None, progress=False, warmup=True) -> list:
    """The peer and ``impls`` (name -> function, default ``COMPARED``) on every shape, on
    the same inputs; returns ``PeerResult`` rows, the peer's first in each shape.

    ``warmup``: the first shape is measured twice and the first measurement thrown away.
    On the H200 a cold run measured our backward at its first shape at 206 TFLOP/s, where
    a run that had warmed up gave 316 and every later shape agreed between the runs: the
    GPU's state, not the kernels (the recorded runs since then have this warm-up).
    """
    functions = {"peer": peer}
    unavailable = {}
    for name in (COMPARED if impls is None else impls):
        try:
            functions[name] = impls[name] if isinstance(impls, dict) else resolve_impl(name)
        except Exception as exc:  # noqa: BLE001 - recorded on every row of that name
            unavailable[name] = classify_error(exc, name)
    names = list(functions) + list(unavailable)
    bar = progress_bar((len(shapes) + bool(warmup and shapes)) * len(names), progress)
    results, stop = [], None
    passes = ([shapes[0]] if warmup and shapes else []) + list(shapes)
    for index, shape in enumerate(passes):
        inputs = make_inputs(shape, dtype, device, generator)
        ref = reference_slice(*inputs, shape.causal)
        yardstick = reference_slice(*inputs, shape.causal, dtype=dtype)
        rows = []
        for name in names:
            bar.set_description(f"{shape.label()} {name}")
            res = PeerResult.of(shape, dtype_name, impl=name)
            if stop or name in unavailable:
                res.fwd_status, res.note = ("not-run", stop) if stop else unavailable[name]
                res.bwd_status = "not-run"
            else:
                res = measure(name, functions[name], shape, inputs, ref, yardstick,
                              dtype_name=dtype_name, timer=timer)
                if "cuda-error" in (res.fwd_status, res.bwd_status):
                    stop = f"not run: an earlier CUDA error ({name}, {shape.label()})"
            rows.append(res)
            _release()
            bar.update(1)
        for res in rows:
            res.fwd_vs_peer, res.bwd_vs_peer = (_ratio(res, rows[0], p) for p in ("fwd", "bwd"))
        if not (warmup and index == 0):
            results += rows
        del inputs, ref, yardstick
        _release()
    bar.close()
    return results


def run_peer(args, *, progress=True) -> list:
    """``python -m flashbook.bench --peer``: ``compare`` on ``args.shapes`` with the
    harness's timer (``CudaTimer``) and seeded CUDA inputs."""
    dtype, timer, _memory, gen = run_tools(args)
    return compare(args.peer, args.shapes, dtype, args.dtype, timer=timer, generator=gen,
                   progress=progress)


def peer_provenance(prov: dict, args) -> dict:
    """``prov`` (``collect_provenance``) completed for a peer run: the peer's file and
    SHA-256, what ran beside it, how rows are checked and divided."""
    prov["peer"] = args.peer.provenance()
    prov["settings"]["impl"] = ["peer", *COMPARED]
    prov["conventions"]["vs_peer"] = (
        "fwd_vs_peer, bwd_vs_peer: the peer's median ms over this row's (> 1: faster than "
        "the peer), only where both rows passed the check; the forward and the backward "
        "are checked and timed separately, each with its own status")
    prov["files"] = {"peer.csv": f"one row per implementation ({', '.join(['peer', *COMPARED])}) "
                                 "and shape"}
    return prov


def _cell(res, pass_):
    """A time in TFLOP/s, or why there is none (or "FAIL" after it)."""
    status, check = getattr(res, f"{pass_}_status"), getattr(res, f"{pass_}_check")
    if status != "ok":
        return status
    text = format_cell(getattr(res, f"{pass_}_tflops"), ".1f").strip()
    return f"{text} FAIL" if check == "FAIL" else text


def format_peer_table(results) -> str:
    """One line per shape: TFLOP/s of each implementation and flashbook / peer, forward
    and backward, then the notes of rows that did not pass."""
    by_shape = {}
    for r in results:
        by_shape.setdefault((r.head_dim, r.seq, r.causal, r.heads), {})[r.impl] = r
    impls = list(dict.fromkeys(r.impl for r in results))
    cols = "".join(f"{n[:12]:>13}" for n in impls)
    lines = [f"TFLOP/s ({results[0].dtype if results else ''}); flashbook / peer = the "
             f"peer's ms over flashbook's", "",
             f"{'shape':<26}{'pass':<5}{cols}{'flashbook/peer':>16}"]
    notes = []
    for (d, n, causal, heads), rows in by_shape.items():
        label = f"d={d} N={n} {'causal' if causal else 'full'} H={heads}"
        fb = rows.get("flashbook")
        for pass_ in ("fwd", "bwd"):
            ratio = getattr(fb, f"{pass_}_vs_peer", None) if fb else None
            cells = "".join(f"{_cell(rows[i], pass_)[:12]:>13}" if i in rows else " " * 13
                            for i in impls)
            lines.append(f"{label if pass_ == 'fwd' else '':<26}{pass_:<5}{cells}"
                         f"{format_cell(ratio, '16.2f') if ratio else '               -'}")
        notes += [f"{label} {r.impl}: {r.note}" for r in rows.values() if r.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


# ------------------------------------------------------------------ recorded peer runs

#: Recorded ``--peer`` runs on the H200 (chapter 10 reads them): each key's run of the index
#: is named ``peer_`` and the key with "_" for "-" ("tutorial-gluon-2": "peer_tutorial_gluon_2").
PEER_RUNS = {key: "peer_" + key.replace("-", "_") for key in (
    "tutorial", "tutorial-d128", "cudnn", "tutorial-gluon", "tutorial-gluon-2", "tutorial-gluon-3",
    "tutorial-gluon-4", "tutorial-gluon-5", "cudnn-bf16-gluon", "tutorial-gluon-graph",
    "tutorial-gluon-graph-2", "tutorial-gluon-graph-3", "tutorial-gluon-graph-4", "tutorial-gluon-graph-5")}
#: the runs of the tutorial beside flashbook-gluon, each call timed as Python makes it
#: (chapter 10 reads them together)
GLUON_PEER_RUNS = ("tutorial-gluon", "tutorial-gluon-2", "tutorial-gluon-3", "tutorial-gluon-4", "tutorial-gluon-5")
#: the same with --graph: every forward replayed from a CUDA graph (the GPU's work alone)
GLUON_GRAPH_RUNS = ("tutorial-gluon-graph", "tutorial-gluon-graph-2")
#: a third --graph run, with d=64 on three consumer warpgroups (192-row tiles) at every length
GLUON_WIDE_GRAPH_RUN = "tutorial-gluon-graph-3"
#: two --graph runs of the defaults hopper.default_config gives now (v0.6.0)
GLUON_DEFAULT_GRAPH_RUNS = ("tutorial-gluon-graph-4", "tutorial-gluon-graph-5")


def load_peer_run(name: str, root=None):
    """``(DataFrame, provenance)`` of the recorded peer run ``name`` (a key of ``PEER_RUNS``),
    or ``(None, {})`` when it is not recorded."""
    if name not in PEER_RUNS:
        raise ValueError(f"name must be one of {sorted(PEER_RUNS)}, got {name!r}")
    run = run_path(PEER_RUNS[name], root)
    path = run / "peer.csv" if run is not None else None
    if path is None or not path.is_file():
        return None, {}
    return load_results(path)


def peer_ratio_table(frame):
    """One row per shape and pass of a recorded peer run: the peer's and flashbook's TFLOP/s,
    whether each passed the float64 check, and flashbook over the peer (NaN where either
    failed its check or did not run). Runs that have a ``flashbook-gluon`` row (chapter 10's
    Gluon forward) get ``gluon`` and ``gluon_over_peer`` columns the same way."""
    import pandas as pd

    keys = ["head_dim", "seq", "causal"]
    out = []
    for key, g in frame.groupby(keys, sort=True):
        by = g.set_index("impl")
        for pass_ in ("fwd", "bwd"):
            peer = by.loc["peer"]
            row = {**dict(zip(keys, key)), "pass": pass_,
                   "peer": peer[f"{pass_}_tflops"], "peer_check": peer[f"{pass_}_check"] or peer[f"{pass_}_status"]}
            for impl, name in (("flashbook", "flashbook"), ("flashbook-gluon", "gluon")):
                if impl not in by.index:
                    continue
                ours = by.loc[impl]
                ok = all(r[f"{pass_}_status"] == "ok" and r[f"{pass_}_check"] == "pass" for r in (peer, ours))
                row[name] = ours[f"{pass_}_tflops"]
                row[f"{name}_over_peer"] = ours[f"{pass_}_vs_peer"] if ok else float("nan")
            out.append(row)
    return pd.DataFrame(out)


def peer_runs_table(names, column: str = "gluon_over_peer", pass_: str = "fwd", root=None):
    """Several recorded peer runs of the same shapes side by side: per shape, ``column`` of
    ``peer_ratio_table`` in each run (columns named after the runs), with their ``min``,
    ``median`` and ``max``, and the peer's TFLOP/s range (``peer_lo``, ``peer_hi``). None
    when any of the runs is not recorded."""
    import pandas as pd

    keys = ["head_dim", "seq", "causal"]
    merged = None
    for name in names:
        frame, _ = load_peer_run(name, root)
        if frame is None:
            return None
        t = peer_ratio_table(frame)
        t = t[t["pass"] == pass_][keys + [column, "peer"]].rename(columns={column: name, "peer": f"peer {name}"})
        merged = t if merged is None else merged.merge(t, on=keys)
    runs, peers = merged[list(names)], merged[[f"peer {n}" for n in names]]
    return merged[keys].assign(**{n: merged[n] for n in names}, min=runs.min(axis=1), median=runs.median(axis=1),
                               max=runs.max(axis=1), peer_lo=peers.min(axis=1), peer_hi=peers.max(axis=1))
