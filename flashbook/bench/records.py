"""Writing down what was measured, and where: CSV rows, provenance, text tables.

Every run writes its rows and a ``provenance.json`` (GPU, driver, CUDA, torch,
triton, date, command, git commit, a digest of the sources) into one directory;
``results_root`` is the one place that says where recorded runs are found.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .. import runtime
from ..resources import RESULTS_ENV, results_dir  # noqa: F401  (RESULTS_ENV: re-exported by bench)
from .costs import GB
from .harness import shape_label

#: flashbook's own directory, and the checkout that holds it.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
CHECKOUT_DIR = PACKAGE_DIR.parent


def results_root(root=None):
    """The directory that holds recorded runs, or None: ``flashbook.resources.results_dir``."""
    return results_dir(root)


#: Keys every provenance.json has.
PROVENANCE_KEYS = ("date_utc", "command", "gpu", "driver", "cuda", "cudnn", "torch",
                   "triton", "python", "flashbook", "git_commit", "source_sha256",
                   "settings", "timing", "conventions", "files")


def _driver_version():
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - not installed, or no GPU
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, check=False)
        first = done.stdout.strip().splitlines()
        return first[0].strip() if done.returncode == 0 and first else None
    except (OSError, subprocess.SubprocessError):
        return None


#: Names the commit of the sources that ran, where the copy's git history is missing
#: or not the one that was sent (a GPU machine given a copy of a working tree).
COMMIT_ENV = "FLASHBOOK_COMMIT"


def git_commit(paths=("flashbook",)):
    """``$FLASHBOOK_COMMIT`` when set; else HEAD's commit, with "+changes" when
    ``paths`` differ from it (``source_sha256`` then names the sources that ran)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    root = CHECKOUT_DIR
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
        commit = (done.stdout.strip() or None) if done.returncode == 0 else None
        if commit:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *paths],
                                   capture_output=True, text=True, timeout=10, check=False)
            if dirty.returncode == 0 and dirty.stdout.strip():
                commit += "+changes"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest() -> str:
    """SHA-256 of flashbook's Python sources: ties results to the code that made
    them, also where the checkout has no git history."""
    import hashlib

    package = PACKAGE_DIR
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def gpu_info() -> dict | None:
    """Name, compute capability, SMs, memory of GPU 0 (None without one)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    info = {"name": props.name, "capability": f"sm_{props.major}{props.minor}",
            "sms": props.multi_processor_count, "memory_bytes": int(props.total_memory)}
    for attr in ("shared_memory_per_block_optin", "L2_cache_size"):
        if hasattr(props, attr):
            info[attr] = int(getattr(props, attr))
    chip = match_chip(props.name)
    if chip:
        c = runtime.chip(chip)
        info["datasheet"] = {"chip": chip, "bf16_tflops": c.bf16_tflops,
                             "fp16_tflops": c.fp16_tflops, "hbm_tb_s": c.hbm_tb_s}
    return info


def match_chip(gpu_name: str):
    """The ``runtime.CHIPS`` key whose name appears in a GPU's name, if any."""
    for key in runtime.CHIPS:
        if key.lower() in str(gpu_name).lower():
            return key
    return None


def command_line(argv, program: str = "python -m flashbook.bench") -> str:
    """The command that reproduces this run: ``program`` and its arguments, with the folder
    after ``--out`` written OUT_DIR (no paths of this machine in it)."""
    shown, hide = [], False
    for arg in argv:
        if hide:
            arg, hide = "OUT_DIR", False
        elif arg == "--out":
            hide = True
        elif arg.startswith("--out="):
            arg = "--out=OUT_DIR"
        shown.append(shlex.quote(arg))
    return " ".join([program, *shown])


def collect_provenance(argv, args=None, program: str = "python -m flashbook.bench", graph: bool | None = None) -> dict:
    """Everything needed to judge or repeat a run. No hostname, no user name. ``program``
    starts the recorded command (a script's own, e.g. ``python3 benchmarks/x.py``);
    ``graph``: whether forwards were replayed from CUDA graphs (default: ``args.graph``)."""
    if graph is None:
        graph = bool(getattr(args, "graph", False))
    versions = {}
    for mod in ("torch", "triton"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    cuda = cudnn = None
    math_upcasts = None
    try:
        import torch

        cuda = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        math_upcasts = not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    except Exception:  # noqa: BLE001
        pass
    from .. import __version__

    settings = {}
    if args is not None:
        settings = {
            "dtype": args.dtype, "tokens": args.tokens, "seed": args.seed,
            "max_naive_gb": args.max_naive_gb, "sweep_blocks": bool(args.sweep_blocks),
            "shapes": [dataclasses.asdict(s) for s in args.shapes],
            "impl": list(args.impl),
        }
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(argv, program),
        "gpu": gpu_info(),
        "driver": _driver_version(),
        "cuda": cuda,
        "cudnn": cudnn,
        "torch": versions["torch"],
        "triton": versions["triton"],
        "python": sys.version.split()[0],
        "flashbook": __version__,
        "git_commit": git_commit(),
        "source_sha256": source_digest(),
        "settings": settings,
        "timing": {
            "method": "CUDA events around each call, a 256 MiB buffer written before each "
                      "timed call (L2 flushed)",
            "replay": ("a CUDA graph of each forward call, captured once (the GPU's work alone); "
                       "each backward as Python makes it (autograd runs it on its forward's stream)"
                       if graph else "each call as Python makes it"),
            "statistic": "median",
            "warmup_ms": getattr(args, "warmup_ms", None),
            "rep_ms": getattr(args, "rep_ms", None),
            "min_reps": 5,
            "forward": "inputs require grad (a training forward)",
            "backward": "torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) alone",
            "memory": "torch.cuda.max_memory_allocated after reset, minus memory "
                      "allocated before the call (inputs q, k, v, dO)",
            "sdpa_math_upcasts_to_fp32": math_upcasts,
        },
        "conventions": {
            "flops_fwd": "4 * batch * heads * seq**2 * head_dim, halved when causal",
            "flops_bwd": "2.5 * flops_fwd",
            "check": "batch 0, head 0 against float64: pass if each of o, dq, dk, dv is within "
                     "twice the max error of PyTorch math in the input dtype, plus small floors "
                     "(flashbook.kernels.checks.within_twice_yardstick); err_out and err_grad "
                     "are relative Frobenius errors against float64",
        },
        "files": {},
    }


def _to_cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_csv(rows, path, fields) -> Path:
    """Write dataclass rows (or dicts) to CSV, None as an empty cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        writer.writeheader()
        for row in rows:
            data = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
            writer.writerow({k: _to_cell(data.get(k)) for k in fields})
    return path


def _from_cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def read_csv(path) -> list:
    """Rows of a CSV written by ``write_csv``, as dicts of Python values."""
    with Path(path).open(newline="") as fh:
        return [{k: _from_cell(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def write_provenance(prov: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    missing = [k for k in PROVENANCE_KEYS if k not in prov]
    if missing:
        raise ValueError(f"provenance is missing keys {missing}")
    path.write_text(json.dumps(prov, indent=2, sort_keys=False) + "\n")
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "gpu"


def default_out_dir(gpu_name: str, date: str | None = None, base=None) -> Path:
    """``benchmarks/results/<date>-<gpu>/`` in this checkout (or the current
    directory when flashbook is installed elsewhere); ``-2``, ``-3``... when
    that directory already holds results."""
    date = date or _dt.date.today().isoformat()
    if base is None:
        base = CHECKOUT_DIR / "benchmarks" / "results" if (CHECKOUT_DIR / "benchmarks").is_dir() \
            else Path.cwd() / "benchmarks" / "results"
    base = Path(base)
    name = f"{date}-{_slug(gpu_name)}"
    out, n = base / name, 1
    while out.exists() and any(out.iterdir()):
        n += 1
        out = base / f"{name}-{n}"
    return out


def format_cell(value, spec):
    """``value`` formatted by ``spec`` ("9.3f"), or blanks of the same width."""
    if value is None:
        return " " * int(re.match(r"\d*", spec).group() or 0)
    return format(value, spec)


def format_table(results) -> str:
    """The results as a fixed-width text table, one block per shape."""
    head = (f"{'impl':<16}{'fwd ms':>9}{'TFLOP/s':>9}{'bwd ms':>9}{'TFLOP/s':>9}"
            f"{'peak GB':>9}{'floor GB':>9}  {'check':<6}status")
    lines, last = [], None
    for r in results:
        key = (r.head_dim, r.seq, r.causal, r.batch, r.heads)
        if key != last:
            lines += ["", f"d={r.head_dim}  N={r.seq}  {'causal' if r.causal else 'not causal'}"
                          f"  batch={r.batch}  heads={r.heads}  {r.dtype}", head]
            last = key
        peak = None if r.peak_fwd_bwd_bytes is None else r.peak_fwd_bwd_bytes / GB
        floor = None if r.floor_fwd_bwd_bytes is None else r.floor_fwd_bwd_bytes / GB
        status = r.status if r.status == "ok" else f"{r.status}: {r.note}"[:70]
        lines.append(f"{r.impl:<16}{format_cell(r.fwd_ms, '9.3f')}{format_cell(r.fwd_tflops, '9.1f')}"
                     f"{format_cell(r.bwd_ms, '9.3f')}{format_cell(r.bwd_tflops, '9.1f')}"
                     f"{format_cell(peak, '9.2f')}{format_cell(floor, '9.2f')}  {r.check:<6}{status}")
    return "\n".join(lines).lstrip("\n")


def format_block_table(results) -> str:
    head = (f"{'B_r':>5}{'B_c':>5}{'warps':>6}{'stages':>7}{'ms':>9}{'TFLOP/s':>9}"
            f"{'regs':>6}{'spills':>7}{'smem KiB':>9}  status")
    lines, last = [], None
    for r in results:
        key = (r.head_dim, r.seq, r.causal)
        if key != last:
            lines += ["", f"d={r.head_dim}  N={r.seq}  {'causal' if r.causal else 'not causal'}"
                          f"  batch={r.batch}  heads={r.heads}", head]
            last = key
        smem = None if r.shared_bytes is None else r.shared_bytes / 1024
        status = r.status if r.status == "ok" else f"{r.status}: {r.note}"[:60]
        lines.append(f"{r.block_m:>5}{r.block_n:>5}{r.num_warps:>6}{r.num_stages:>7}"
                     f"{format_cell(r.fwd_ms, '9.3f')}{format_cell(r.fwd_tflops, '9.1f')}"
                     f"{format_cell(r.n_regs, '6d')}{format_cell(r.n_spills, '7d')}{format_cell(smem, '9.1f')}"
                     f"  {status}")
    return "\n".join(lines).lstrip("\n")


def format_ladder_table(results) -> str:
    """The ladder's rows (``LadderResult``) as a fixed-width text table."""
    lines = [f"{'shape':<28} {'pass':<4} {'rung':<22} {'ms':>9} {'TFLOP/s':>8} {'err':>9}"]
    for r in results:
        shape = shape_label(r.head_dim, r.seq, r.causal)
        lines.append(f"{shape:<28} {r.pass_:<4} {r.name:<22} {format_cell(r.ms, '.3f'):>9} "
                     f"{format_cell(r.tflops, '.1f'):>8} {format_cell(r.err_out, '.1e'):>9}"
                     + ("" if r.status == "ok" else f"  {r.status}: {r.note[:60]}"))
    return "\n".join(lines)
