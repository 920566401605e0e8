"""Check and time the kernels on a CUDA GPU, and record what was measured.

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR [--tests] [--bench] [--sweep] [--budget S]

--tests  runs ``pytest -m gpu tests/test_kernels_gpu.py`` (in parallel processes) and
         collects every comparison with SDPA that the tests record;
--bench  times forward and backward against torch's SDPA (flash backend) in bf16,
         head_dim 64 and 128, N = 1K..16K, batch x heads filling the GPU
         (batch = 16384 / N, heads = 2048 / head_dim, as FlashAttention-2's own benchmark);
--sweep  times a short list of block configurations per kernel (what ``configs`` prefers);
--pairs  times the whole backward for a few (dK/dV, dQ) configuration pairs at every
         shape of the full sweep (batch = 32768 / N): what the sm_90 defaults were chosen from;
--autotune  switches ``set_autotune(True)`` on at head_dim 128, N = 4096: how long the
         tuning takes, which configurations it picks, how fast they run against the
         defaults, and that the tuned results agree with the default ones.

Everything lands in DIR/gpu_check.json (environment, command, pass counts, errors,
timings), written after each phase so a run cut short still leaves its numbers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
from flashbook import bench  # noqa: E402
import triton  # noqa: E402
from flashbook.kernels import configs, flash_backward, flash_forward  # noqa: E402
from flashbook.kernels.autograd import flash_attention  # noqa: E402  (the Triton kernels)
from flashbook.kernels.configs import Config  # noqa: E402

START = time.time()


def environment() -> dict:
    smi = {}
    try:
        fields = "name,driver_version,memory.total,clocks.max.sm"
        line = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        smi = dict(zip(fields.split(","), (x.strip() for x in line.split(","))))
    except Exception as e:  # no nvidia-smi: torch still names the GPU
        smi = {"error": repr(e)}
    props = torch.cuda.get_device_properties(0)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "sms": props.multi_processor_count,
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "flashbook": flashbook.__version__,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def save(out: str, result: dict) -> None:
    result["elapsed_s"] = round(time.time() - START, 1)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(result, f, indent=1)


# ------------------------------------------------------------------ tests

def run_tests(out: str, workers: int, timeout: int) -> dict:
    records = os.path.join(out, "gpu_records.jsonl")
    junit = os.path.join(out, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests/test_kernels_gpu.py",
           "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    try:
        import pytest_timeout  # noqa: F401  (a hung test must not eat the whole run)
        cmd += ["--timeout", "200"]
    except ImportError:
        pass
    env = dict(os.environ, FLASHBOOK_GPU_RECORD=records, PYTHONPATH=os.getcwd())
    t = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        tail, rc = (proc.stdout + proc.stderr)[-6000:], proc.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = f"timed out after {timeout} s\n{(e.stdout or b'')[-4000:]!r}", None
    counts = {}
    if os.path.exists(junit):
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    recs = []
    if os.path.exists(records):
        with open(records) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    print(tail[-3000:], flush=True)
    return {"command": " ".join(["python3"] + cmd[1:]), "returncode": rc, "counts": counts,
            "wall_s": round(time.time() - t, 1), "records": recs, "output_tail": tail[-3000:]}


# ------------------------------------------------------------------ timing

def _bench(fn, grad_to_none=()) -> float:
    return bench.time_ms(fn, grad_to_none=grad_to_none)  # the harness's timer: CUDA events, L2 flushed


def _sdpa(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _qkvdo(b, h, n, d, seed, dtype=torch.bfloat16):
    """Fresh standard-normal q, k, v, dO of shape (b, h, n, d) on the GPU, from ``seed``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4)]


def _tflops(flops, ms) -> float:
    return round(bench.tflops(flops, ms), 1)


def time_case(n, d, causal, dtype=torch.bfloat16, modes=("separate", "atomic")) -> dict:
    b, h = 16384 // n, 2048 // d
    q, k, v, do = _qkvdo(b, h, n, d, 0, dtype)
    for x in (q, k, v):
        x.requires_grad_()
    flops_fwd = bench.attention_flops(b, h, n, n, d, causal)
    flops_bwd = bench.attention_flops(b, h, n, n, d, causal, "bwd")  # 2.5 x forward, FlashAttention's convention
    row = {"batch": b, "heads": h, "seq": n, "head_dim": d, "causal": causal, "dtype": str(dtype)}
    grads = [q, k, v]
    row["sdpa_fwd_ms"] = _bench(lambda: _sdpa(q, k, v, causal))
    o = _sdpa(q, k, v, causal)
    row["sdpa_bwd_ms"] = _bench(lambda: o.backward(do, retain_graph=True), grads)
    row["ours_fwd_ms"] = _bench(lambda: flash_attention(q, k, v, causal=causal))
    for mode in modes:
        o = flash_attention(q, k, v, causal=causal, dq_mode=mode)
        row[f"ours_bwd_{mode}_ms"] = _bench(lambda: o.backward(do, retain_graph=True), grads)
    for key in list(row):
        if key.endswith("_ms"):
            flops = flops_fwd if "fwd" in key else flops_bwd
            row[key.replace("_ms", "_tflops")] = _tflops(flops, row[key])
    row["speedup_fwd"] = round(row["sdpa_fwd_ms"] / row["ours_fwd_ms"], 3)
    row["speedup_bwd"] = round(row["sdpa_bwd_ms"] / row["ours_bwd_separate_ms"], 3)
    return row


def run_bench(seqs, dims) -> list[dict]:
    rows = []
    for d in dims:
        for causal in (False, True):
            for n in seqs:
                try:
                    row = time_case(n, d, causal)
                except Exception as e:  # recorded, and the table goes on
                    row = {"seq": n, "head_dim": d, "causal": causal, "error": repr(e)[:500]}
                rows.append(row)
                print({k: row.get(k) for k in ("seq", "head_dim", "causal", "ours_fwd_tflops",
                                               "sdpa_fwd_tflops", "ours_bwd_separate_tflops",
                                               "ours_bwd_atomic_tflops", "sdpa_bwd_tflops",
                                               "speedup_fwd", "speedup_bwd", "error")}, flush=True)
                torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ configuration sweep

SWEEP = {
    "forward": [Config(128, 64, 4, 3), Config(128, 64, 8, 3), Config(128, 128, 8, 3), Config(128, 128, 8, 2),
                Config(128, 64, 4, 4), Config(64, 64, 4, 3), Config(128, 32, 4, 3), Config(64, 128, 4, 3)],
    "backward_dkdv": [Config(32, 128, 8, 3), Config(64, 128, 8, 3), Config(64, 64, 4, 3), Config(32, 64, 4, 3),
                      Config(64, 128, 8, 2), Config(32, 128, 4, 3), Config(128, 128, 8, 2)],
    "backward_dq": [Config(128, 32, 8, 3), Config(128, 64, 8, 3), Config(64, 64, 4, 3), Config(128, 32, 4, 3),
                    Config(64, 32, 4, 3), Config(128, 64, 8, 2), Config(128, 128, 8, 2)],
}


def run_sweep(deadline: float, n=4096, dims=(64, 128)) -> list[dict]:
    rows = []
    for d in dims:
        for causal in (False, True):
            b, h = 16384 // n, 2048 // d
            q, k, v, do = _qkvdo(b, h, n, d, 0)
            o, lse = flash_forward(q, k, v, causal=causal)
            flops = bench.attention_flops(b, h, n, n, d, causal)
            flops_bwd = bench.attention_flops(b, h, n, n, d, causal, "bwd")
            for kernel, cands in SWEEP.items():
                for cfg in cands:
                    if time.time() > deadline:
                        return rows
                    try:
                        if kernel == "forward":
                            ms = _bench(lambda: flash_forward(q, k, v, causal=causal, config=cfg))
                            tf = bench.tflops(flops, ms)
                        else:
                            kw = {"config_dkdv": cfg} if kernel == "backward_dkdv" else {"config_dq": cfg}
                            ms = _bench(lambda: flash_backward(q, k, v, o, lse, do, causal=causal, **kw))
                            tf = bench.tflops(flops_bwd, ms)
                        row = {"kernel": kernel, "config": str(cfg), "seq": n, "head_dim": d,
                               "causal": causal, "ms": round(ms, 4), "tflops": round(tf, 1)}
                    except Exception as e:
                        row = {"kernel": kernel, "config": str(cfg), "seq": n, "head_dim": d,
                               "causal": causal, "error": repr(e)[:300]}
                    rows.append(row)
                    print(row, flush=True)
    return rows


# ------------------------------------------------------------------ backward configuration pairs

PAIRS = {  # head_dim -> (dK/dV config, dQ config) pairs; the first is the default at the time
    128: [(Config(64, 128, 8, 3), Config(128, 64, 8, 3)), (Config(64, 64, 4, 2), Config(128, 64, 8, 3)),
          (Config(64, 128, 8, 3), Config(128, 64, 8, 4)), (Config(64, 64, 4, 2), Config(128, 64, 8, 4)),
          (Config(32, 64, 4, 3), Config(128, 64, 8, 3)), (Config(64, 128, 8, 2), Config(128, 64, 8, 3))],
    64: [(Config(64, 64, 4, 3), Config(128, 64, 8, 3)), (Config(64, 64, 4, 2), Config(128, 64, 8, 3)),
         (Config(64, 64, 4, 3), Config(128, 64, 8, 4)), (Config(64, 128, 8, 3), Config(128, 64, 8, 3))],
}


def run_pairs(deadline: float, seqs=(1024, 2048, 4096, 8192, 16384)) -> list[dict]:
    rows = []
    for d, pairs in PAIRS.items():
        for causal in (False, True):
            for n in seqs:
                b, h = 32768 // n, 2048 // d
                q, k, v, do = _qkvdo(b, h, n, d, 2)
                o, lse = flash_forward(q, k, v, causal=causal)
                flops = bench.attention_flops(b, h, n, n, d, causal, "bwd")
                for dkdv, dq in pairs:
                    if time.time() > deadline:
                        return rows
                    row = {"seq": n, "head_dim": d, "causal": causal, "dkdv": str(dkdv), "dq": str(dq)}
                    try:
                        ms = _bench(lambda: flash_backward(q, k, v, o, lse, do, causal=causal,
                                                           config_dkdv=dkdv, config_dq=dq))
                        row.update(ms=round(ms, 4), tflops=_tflops(flops, ms))
                    except Exception as e:
                        row["error"] = repr(e)[:300]
                    rows.append(row)
                    print(row, flush=True)
                del q, k, v, do, o, lse
                torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ autotuning

def run_autotune(deadline: float, n=4096, d=128) -> list[dict]:
    from flashbook.kernels import autograd, set_autotune

    rows = []
    for causal in (False, True):
        if time.time() > deadline:
            break
        b, h = 16384 // n, 2048 // d
        q, k, v, do = _qkvdo(b, h, n, d, 1)
        flops = bench.attention_flops(b, h, n, n, d, causal)
        flops_bwd = bench.attention_flops(b, h, n, n, d, causal, "bwd")
        row = {"seq": n, "head_dim": d, "batch": b, "heads": h, "causal": causal, "dtype": "bf16"}
        try:
            results = {}
            for tuned in (False, True):
                set_autotune(tuned)
                label = "tuned" if tuned else "default"
                t = time.time()
                o, lse = flash_forward(q, k, v, causal=causal)
                grads = flash_backward(q, k, v, o, lse, do, causal=causal)
                torch.cuda.synchronize()
                row[f"{label}_first_call_s"] = round(time.time() - t, 2)
                results[label] = (o, *grads)
                row[f"{label}_fwd_ms"] = _bench(lambda: flash_forward(q, k, v, causal=causal))
                row[f"{label}_bwd_ms"] = _bench(lambda: flash_backward(q, k, v, o, lse, do, causal=causal))
                row[f"{label}_fwd_tflops"] = _tflops(flops, row[f"{label}_fwd_ms"])
                row[f"{label}_bwd_tflops"] = _tflops(flops_bwd, row[f"{label}_bwd_ms"])
            # the same sums in another tile order: they agree to a few bf16 roundings
            for name, x, y in zip(("o", "dq", "dk", "dv"), results["default"], results["tuned"]):
                row[f"rel_diff_{name}"] = float((x.float() - y.float()).norm() / y.float().norm())
            row["agree"] = all(row[f"rel_diff_{name}"] < 2e-2 for name in ("o", "dq", "dk", "dv"))
            row["tuned_configs"] = {"-".join(str(p) for p in key[:1] + key[4:]): str(c)
                                    for key, c in autograd._chosen.items() if len(key) > 5}
        except Exception as e:
            row["error"] = repr(e)[:500]
        finally:
            set_autotune(False)
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tests", action="store_true")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--pairs", action="store_true")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--test-timeout", type=int, default=300)
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    parser.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result = {"environment": environment(), "defaults": {}}
    for kernel in configs.KERNELS:
        for d in (64, 128):
            result["defaults"][f"{kernel}-d{d}"] = str(configs.default(kernel, cc=90, block_d=d, elem_bytes=2))
    print(json.dumps(result["environment"]), flush=True)
    save(args.out, result)
    if args.bench:  # first: the timings are quick, and worth having even if the tests run long
        result["bench"] = run_bench([int(s) for s in args.seqs.split(",")], (64, 128))
        from flashbook.kernels.autograd import _chosen

        result["configs_used"] = {"-".join(map(str, key[:4])).replace("torch.", "") + str(key[4:]): str(c)
                                  for key, c in _chosen.items()}
        save(args.out, result)
    if args.tests:
        result["tests"] = run_tests(args.out, args.workers, args.test_timeout)
        save(args.out, result)
    if args.sweep:
        result["sweep"] = run_sweep(START + args.budget)
        save(args.out, result)
    if args.pairs:
        result["pairs"] = run_pairs(START + args.budget)
        save(args.out, result)
    if args.autotune:
        result["autotune"] = run_autotune(START + args.budget)
        save(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
