"""Tests of flashbook.bench that need no GPU: the counting formulas, the seed-table
check, the command line, the writers, and the measuring loop on the CPU."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flashbook import bench, reference
from flashbook.runtime import CHIPS
from notebook_text import cells, source_of, sources_by_id

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ FLOPs

def test_flops_closed_forms_for_a_small_shape():
    # B=2, H=3, N_q=5, N_k=7, d=4: each product is 2*5*7*4 = 280 FLOPs per head,
    # 6 heads -> 1680 per product.
    assert bench.attention_flops(2, 3, 5, 7, 4) == 2 * 1680                     # S, O
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="bwd") == 5 * 1680        # 2.5x
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="bwd", recompute=False) == 4 * 1680
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="fwd+bwd") == 7 * 1680


def test_flops_are_what_pytorch_counts_in_plain_attention():
    """At real sizes, PyTorch's own FLOP counter (``torch.utils.flop_counter``, which
    counts every matrix product an operation runs) over plain attention on meta tensors:
    the forward is ``attention_flops``; autograd's backward, which keeps P, is the count
    without recompute; adding the one product S = Q K^T gives the recomputing count."""
    from torch.utils.flop_counter import FlopCounterMode

    def counted(fn):
        with FlopCounterMode(display=False) as counter:
            fn()
        return counter.get_total_flops()

    for b, h, n, d in [(1, 1, 16, 8), (8, 32, 4096, 128), (3, 5, 100, 64)]:
        q, k, v, do = (torch.empty(b, h, n, d, device="meta", requires_grad=True)
                       for _ in range(4))
        out = []
        fwd = counted(lambda: out.append(bench.naive_attention(q, k, v)))
        bwd_keeping_p = counted(lambda: out[0].backward(do))
        s_again = counted(lambda: q @ k.transpose(-1, -2))
        assert fwd > 0 and bwd_keeping_p > 0 and s_again > 0
        assert bench.attention_flops(b, h, n, n, d) == fwd
        assert bench.attention_flops(b, h, n, n, d, pass_="bwd", recompute=False) == bwd_keeping_p
        assert bench.attention_flops(b, h, n, n, d, pass_="bwd") == bwd_keeping_p + s_again


def test_causal_halves_the_convention_and_exact_counts_the_mask():
    for n_q, n_k in [(6, 6), (5, 9), (9, 5), (1, 4), (128, 128)]:
        full = bench.attention_flops(1, 2, n_q, n_k, 4)
        assert bench.attention_flops(1, 2, n_q, n_k, 4, causal=True) * 2 == full
        kept = int(reference.causal_mask(n_q, n_k).sum())
        assert bench.causal_pairs(n_q, n_k) == kept
        assert bench.attention_flops(1, 2, n_q, n_k, 4, causal=True, exact=True) == \
            1 * 2 * 2 * 2 * kept * 4
    assert bench.causal_pairs(6, 6) == 6 * 7 // 2
    assert bench.causal_pairs(9, 5) == 1 + 2 + 3 + 4 + 5  # the first 4 rows see nothing


def _loop_attention(q, k, v, do, causal, scale):
    """Attention forward and backward (recomputing S) with explicit loops, counting
    each multiply-add as 2 FLOPs. Returns (o, dq, dk, dv, fwd_flops, bwd_flops)."""
    heads, n_q, d = q.shape
    n_k = k.shape[1]
    allowed = reference.causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), bool)
    o, dq, dk, dv = (np.zeros_like(x) for x in (q, q, k, v))
    fwd = bwd = 0
    for h in range(heads):
        s = np.full((n_q, n_k), -np.inf)
        for i, j in itertools.product(range(n_q), range(n_k)):
            if allowed[i, j]:
                s[i, j] = scale * sum(q[h, i, c] * k[h, j, c] for c in range(d))
                fwd += 2 * d
        p = reference.softmax_rows(s, allowed)
        for i, j, c in itertools.product(range(n_q), range(n_k), range(d)):
            if allowed[i, j]:
                o[h, i, c] += p[i, j] * v[h, j, c]
                fwd += 2
        # backward: S again, then dV, dP, dS, dQ, dK
        dp = np.zeros((n_q, n_k))
        for i, j in itertools.product(range(n_q), range(n_k)):
            if allowed[i, j]:
                _ = sum(q[h, i, c] * k[h, j, c] for c in range(d))   # recomputed S
                bwd += 2 * d
                for c in range(d):
                    dv[h, j, c] += p[i, j] * do[h, i, c]
                    dp[i, j] += do[h, i, c] * v[h, j, c]
                    bwd += 4
        delta = (do[h] * o[h]).sum(-1)
        ds = p * (dp - delta[:, None])
        for i, j, c in itertools.product(range(n_q), range(n_k), range(d)):
            if allowed[i, j]:
                dq[h, i, c] += scale * ds[i, j] * k[h, j, c]
                dk[h, j, c] += scale * ds[i, j] * q[h, i, c]
                bwd += 4
    return o, dq, dk, dv, fwd, bwd


@pytest.mark.parametrize("n_q,n_k,d,causal", [(4, 4, 3, False), (3, 5, 2, False),
                                              (5, 5, 2, True), (6, 4, 3, True),
                                              (3, 7, 2, True)])
def test_flops_match_an_explicit_loop(n_q, n_k, d, causal):
    rng = np.random.default_rng(n_q * 100 + n_k * 10 + d)
    heads = 2
    q = rng.standard_normal((heads, n_q, d))
    k = rng.standard_normal((heads, n_k, d))
    v = rng.standard_normal((heads, n_k, d))
    do = rng.standard_normal((heads, n_q, d))
    scale = 1 / math.sqrt(d)
    o, dq, dk, dv, fwd, bwd = _loop_attention(q, k, v, do, causal, scale)
    # the loop is a real attention: same numbers as the float64 reference
    np.testing.assert_allclose(o, reference.attention(q, k, v, causal=causal), atol=1e-12)
    for got, want in zip((dq, dk, dv),
                         reference.attention_backward(q, k, v, do, causal=causal)):
        np.testing.assert_allclose(got, want, atol=1e-12)
    assert fwd == bench.attention_flops(1, heads, n_q, n_k, d, causal, "fwd", exact=True)
    assert bwd == bench.attention_flops(1, heads, n_q, n_k, d, causal, "bwd", exact=True)


def test_bad_dimensions_are_named():
    with pytest.raises(ValueError, match="n_q must be >= 1"):
        bench.attention_flops(1, 1, 0, 4, 4)
    with pytest.raises(TypeError, match="d must be an integer"):
        bench.attention_flops(1, 1, 4, 4, 4.0)
    with pytest.raises(ValueError, match="pass_ must be one of"):
        bench.attention_flops(1, 1, 4, 4, 4, pass_="forward")
    with pytest.raises(ValueError, match="impl must be"):
        bench.attention_hbm_bytes(1, 1, 4, 4, 4, impl="xformers")


# ------------------------------------------------------------------ bytes

def test_hbm_bytes_closed_forms():
    # B=1, H=2, N_q=3, N_k=5, d=4, 2-byte elements:
    #   Q-like (Q, O, dO, dQ) 1*2*3*4*2 = 48 bytes; K-like (K, V, dK, dV) 1*2*5*4*2 = 80;
    #   lse 1*2*3*4 = 24 (fp32); one N_q x N_k matrix 1*2*3*5*2 = 60.
    kw = dict(dtype_bytes=2)
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="flash", pass_="fwd", **kw) == \
        2 * 48 + 2 * 80 + 24
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="naive", pass_="fwd", **kw) == \
        2 * 48 + 2 * 80 + 4 * 60
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="flash", pass_="bwd", **kw) == \
        4 * 48 + 4 * 80 + 24
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="naive", pass_="bwd", **kw) == \
        3 * 48 + 4 * 80 + 7 * 60
    both = bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="naive", pass_="fwd+bwd", **kw)
    assert both == (2 * 48 + 2 * 80 + 4 * 60) + (3 * 48 + 4 * 80 + 7 * 60)
    # GQA: K and V with 1 head instead of 2 halve the K-like terms
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="flash", heads_kv=1, **kw) == \
        2 * 48 + 2 * 40 + 24
    # causal does not change what a plain implementation writes
    assert bench.attention_hbm_bytes(1, 2, 3, 5, 4, impl="naive", **kw) == 496


def test_memory_floor_closed_forms():
    # Same shape: Q-like 48, K-like 80, one fp32 per row 24, matrix 60.
    f = bench.attention_memory_bytes
    assert f(1, 2, 3, 5, 4, impl="flash") == (48 + 2 * 80) + 48 + 24
    assert f(1, 2, 3, 5, 4, impl="flash", include_inputs=False) == 48 + 24
    assert f(1, 2, 3, 5, 4, impl="flash", pass_="fwd+bwd", include_inputs=False) == \
        48 + 24 + 48 + 2 * 80 + 24
    assert f(1, 2, 3, 5, 4, impl="naive", include_inputs=False) == 48 + 60
    # forward + backward: P and dP at once (2 * 60 = 120) beats dQ + dK + dV (208)? no:
    assert f(1, 2, 3, 5, 4, impl="naive", pass_="fwd+bwd", include_inputs=False) == \
        48 + max(2 * 60, 48 + 2 * 80)
    # at a real size the two matrices dominate
    n, d = 4096, 64
    assert f(1, 1, n, n, d, impl="naive", pass_="fwd+bwd", include_inputs=False) == \
        n * d * 2 + 2 * n * n * 2
    with pytest.raises(ValueError, match="'fwd' or 'fwd\\+bwd'"):
        f(1, 1, 4, 4, 4, pass_="bwd")


def test_roofline_uses_the_chip_table():
    a100 = CHIPS["A100"]
    r = bench.roofline_ms(a100.fp16_tflops * 1e12, 0, "A100")    # one second of FLOPs
    assert r["compute_ms"] == pytest.approx(1000.0) and r["bound"] == "compute"
    r = bench.roofline_ms(1.0, a100.hbm_tb_s * 1e12 / 2, "A100")  # half a second of bytes
    assert r["floor_ms"] == pytest.approx(500.0) and r["bound"] == "memory"
    with pytest.raises(ValueError, match="no bf16 tensor cores"):
        bench.roofline_ms(1.0, 1.0, "T4", "bf16")
    assert bench.tflops(3e12, 1000.0) == pytest.approx(3.0)


# ------------------------------------------------------------------ the seed table

def test_seed_table_numbers():
    c = bench.check_seed_table()
    assert (c.batch, c.heads, c.n, c.d, c.chip) == (8, 32, 4096, 128, "A100")
    # 4 * 8 * 32 * 4096^2 * 128 = 2^2 * 2^3 * 2^5 * 2^24 * 2^7
    assert c.flops["fwd"] == 2**41
    assert c.flops["bwd"] == 5 * 2**40
    assert c.flops["fwd_causal"] == 2**40
    # S for every head: 8 * 32 * 4096^2 * 2 bytes = 2^33 bytes = 8.59 GB
    assert c.memory_bytes["score_matrices_all_heads"] == 2**33
    assert c.memory_bytes["score_matrix_one_head"] == 2**25          # 32 MiB, not 64
    # the A100 needs 2^41 / 312e12 s = 7.05 ms for the forward's FLOPs alone
    assert c.floor_ms[("flash", "fwd", False)] == pytest.approx(2**41 / 312e12 * 1e3)
    assert c.floor_ms[("flash", "fwd", False)] == pytest.approx(7.048, abs=1e-3)
    # naive forward moves 4 matrices of 2^33 bytes plus Q, K, V, O (4 * 2^28)
    assert c.hbm_bytes[("naive", "fwd")] == 4 * 2**33 + 4 * 2**28
    assert c.floor_ms[("naive", "fwd", False)] == pytest.approx(
        (4 * 2**33 + 4 * 2**28) / 2.039e12 * 1e3)
    assert c.implied_tflops[("naive", "fwd")] == pytest.approx(2**41 / 4.2e-3 / 1e12)
    assert c.implied_tflops[("flash", "bwd")] == pytest.approx(5 * 2**40 / 9.1e-3 / 1e12)
    for key in [("naive", "fwd"), ("flash", "fwd"), ("naive", "bwd"), ("flash", "bwd")]:
        assert c.implied_tflops[key] > CHIPS["A100"].fp16_tflops


def test_seed_table_verdicts():
    c = bench.check_seed_table()
    verdicts = {k: claim.verdict for k, claim in c.claims.items()}
    assert verdicts == {
        "score_matrix_mb": "wrong",
        "naive_memory": "impossible",
        "flash_memory": "consistent",
        "memory_ratio_4k": "understated",
        "naive_fwd_time": "impossible",
        "naive_bwd_time": "impossible",
        "flash_fwd_time": "impossible",
        "flash_bwd_time": "impossible",
        "recompute_doubles": "wrong",
        "memory_ratio_8k": "understated",
    }
    assert sorted(c.impossible) == sorted(["naive_memory", "naive_fwd_time",
                                           "naive_bwd_time", "flash_fwd_time",
                                           "flash_bwd_time"])
    assert c.claims["recompute_doubles"].computed == pytest.approx(1.25)
    assert c.claims["memory_ratio_8k"].computed > 16
    assert c.claims["naive_memory"].computed > 4 * 2.1
    # every time claim lies below its floor, and the report says so with numbers
    for key in ("naive_fwd_time", "naive_bwd_time", "flash_fwd_time", "flash_bwd_time"):
        claim = c.claims[key]
        assert claim.claimed < claim.computed and not claim.possible
    report = c.report()
    assert report.count("IMPOSSIBLE") == 5 and "8.59 GB" in report and "524 TFLOP/s" in report


def test_seed_check_on_another_chip_moves_the_floors():
    h100 = bench.check_seed_table("H100")
    assert h100.floor_ms[("flash", "fwd", False)] == pytest.approx(2**41 / 989e12 * 1e3)
    # on an H100 the FlashAttention forward time becomes possible; naive memory does not
    assert h100.claims["flash_fwd_time"].verdict == "consistent"
    assert h100.claims["naive_memory"].verdict == "impossible"


# ------------------------------------------------------------------ naive attention

@pytest.mark.parametrize("n_q,n_k,causal,heads_kv", [(7, 7, False, 4), (7, 7, True, 4),
                                                     (5, 9, True, 2), (9, 5, True, 1),
                                                     (6, 11, False, 2)])
def test_naive_attention_matches_the_float64_reference(n_q, n_k, causal, heads_kv):
    g = torch.Generator().manual_seed(n_q * 31 + n_k)
    q = torch.randn(2, 4, n_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, heads_kv, n_k, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, heads_kv, n_k, 8, generator=g, dtype=torch.float64)
    got = bench.naive_attention(q, k, v, causal=causal)
    group = 4 // heads_kv
    want = reference.attention(q.numpy(), k.repeat_interleave(group, 1).numpy(),
                               v.repeat_interleave(group, 1).numpy(), causal=causal)
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ command line

def test_default_shapes_follow_the_rules():
    args = bench.parse_args([])
    assert len(args.shapes) == 2 * 5 * 2
    for s in args.shapes:
        assert s.batch * s.seq == 32768
        assert s.heads == {64: 32, 128: 16}[s.head_dim]
    assert {s.seq for s in args.shapes} == {1024, 2048, 4096, 8192, 16384}
    assert {s.causal for s in args.shapes} == {False, True}
    quick = bench.parse_args(["--quick"])
    assert 1 <= len(quick.shapes) <= 4 and quick.rep_ms < args.rep_ms
    sweep = bench.parse_args(["--sweep-blocks"])
    assert [(s.seq, s.causal) for s in sweep.shapes] == [(4096, False)] * 2
    custom = bench.parse_args(["--seq", "2k,3000", "--head-dim", "64", "--causal", "yes",
                               "--impl", "naive,sdpa-flash"])
    assert [(s.seq, s.batch, s.causal) for s in custom.shapes] == [(2048, 16, True),
                                                                  (3000, 10, True)]
    assert custom.impl == ("naive", "sdpa-flash")


@pytest.mark.parametrize("argv,message", [
    (["--seq", "abc"], "--seq: expected comma-separated positive sequence lengths"),
    (["--seq", "0"], "--seq: expected comma-separated positive sequence lengths"),
    (["--seq", "64K"], "longer than --tokens 32768"),
    (["--head-dim", "64,x"], "--head-dim: expected comma-separated positive integers"),
    (["--impl", "xformers"], "unknown implementation 'xformers'"),
    (["--causal", "maybe"], "expected one of both, yes, no"),
])
def test_argument_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def _run_cli(*argv):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "flashbook.bench", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_cli_without_a_gpu_says_so_and_exits_cleanly():
    results = REPO / "benchmarks" / "results"
    before = sorted(results.iterdir()) if results.is_dir() else []
    done = _run_cli("--quick")
    assert done.returncode == 0, done.stderr
    assert "No CUDA GPU on this machine" in done.stdout
    assert "Traceback" not in done.stderr
    after = sorted(results.iterdir()) if results.is_dir() else []
    assert after == before  # nothing written


def test_cli_help_names_every_run():
    done = _run_cli("--help")
    assert done.returncode == 0, done.stderr
    assert all(flag in done.stdout for flag in ("--quick", "--sweep-blocks", "--ladder", "--impl"))


def test_cli_bad_seq_exits_2_with_a_message():
    done = _run_cli("--seq", "4K,lots")
    assert done.returncode == 2
    assert "argument --seq" in done.stderr and "'4K,lots'" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ writers

def _some_results():
    return [
        bench.Result(impl="naive", batch=8, heads=16, seq=4096, head_dim=128, causal=False, dtype="bf16",
                     fwd_ms=3.25, bwd_ms=7.5,
                     fwd_tflops=1.2345678901234567, bwd_tflops=2.5, peak_fwd_bytes=17179869184,
                     peak_fwd_bwd_bytes=34359738368, floor_fwd_bwd_bytes=2**34,
                     err_out=0.0031, err_grad=0.0123, check="pass"),
        bench.Result(impl="sdpa-cudnn", batch=2, heads=32, seq=16384, head_dim=64, causal=True, dtype="bf16",
                     status="unsupported",
                     note="first run: RuntimeError: No available kernel, 'quoted', comma"),
        bench.Result(impl="naive", batch=2, heads=32, seq=16384, head_dim=64, causal=True, dtype="bf16",
                     status="oom-skipped",
                     note="needs about 103.1 GB"),
    ]


def test_csv_round_trip(tmp_path):
    rows = _some_results()
    path = bench.write_csv(rows, tmp_path / "deep" / "results.csv", bench.RESULT_FIELDS)
    back = bench.read_csv(path)
    assert [list(r) for r in back] == [bench.RESULT_FIELDS] * len(rows)
    for row, got in zip(rows, back):
        for name in bench.RESULT_FIELDS:
            want = getattr(row, name)
            if want == "":
                want = None
            assert got[name] == want, name
    assert back[0]["fwd_tflops"] == 1.2345678901234567   # floats survive exactly
    assert back[0]["causal"] is False and back[1]["causal"] is True


def test_provenance_has_every_key_and_no_hostname(tmp_path):
    argv = ["--quick", "--impl", "naive,sdpa-flash"]
    args = bench.parse_args(argv)
    prov = bench.collect_provenance(argv, args)
    for key in bench.PROVENANCE_KEYS:
        assert key in prov, key
    assert prov["command"] == "python -m flashbook.bench --quick --impl naive,sdpa-flash"
    assert prov["torch"] == torch.__version__
    assert len(prov["source_sha256"]) == 64 and prov["source_sha256"] == bench.source_digest()
    assert prov["settings"]["impl"] == ["naive", "sdpa-flash"]
    assert len(prov["settings"]["shapes"]) == len(args.shapes)
    path = bench.write_provenance(prov, tmp_path / "provenance.json")
    text = path.read_text()
    assert json.loads(text) == prov
    assert socket.gethostname() not in text
    with pytest.raises(ValueError, match="missing keys"):
        bench.write_provenance({"date_utc": "today"}, tmp_path / "bad.json")


def test_naive_breakdown_records_the_provenance_every_run_writes(tmp_path):
    """benchmarks/naive_breakdown.py on the CPU (small): its JSON's "environment" is
    ``collect_provenance``'s record (every key, this script's command), and chapter 1 reads
    it, and the recorded H200 run, through ``provenance_summary``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("naive_breakdown",
                                                  REPO / "benchmarks" / "naive_breakdown.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--out", str(tmp_path), "--n", "48", "--d", "16", "32"])
    rec = json.loads((tmp_path / "naive_breakdown.json").read_text())
    env = rec["environment"]
    assert set(bench.PROVENANCE_KEYS) <= set(env), set(bench.PROVENANCE_KEYS) - set(env)
    # the folder it wrote to is a path of this machine: recorded as OUT_DIR
    assert env["command"] == "python3 benchmarks/naive_breakdown.py --out OUT_DIR --n 48 --d 16 32"
    assert env["torch"] == torch.__version__ and env["source_sha256"] == bench.source_digest()
    assert env["settings"]["n"] == [48] and list(env["files"]) == ["naive_breakdown.json"]
    assert [(r["n"], r["d"]) for r in rec["rows"]] == [(48, 16), (48, 32)]
    assert all(sum(r["ms"].values()) > 0 for r in rec["rows"])
    summary = bench.provenance_summary(env)
    assert summary["torch"] == torch.__version__ and summary["date (UTC)"] == env["date_utc"]
    recorded = json.loads((REPO / "benchmarks" / "results" / "naive_breakdown_h200"
                           / "naive_breakdown.json").read_text())
    assert bench.provenance_summary(recorded["environment"])["GPU"].startswith("NVIDIA H200")


def test_default_out_dir_never_overwrites(tmp_path):
    first = bench.default_out_dir("NVIDIA H200", "2026-01-02", base=tmp_path)
    assert first == tmp_path / "2026-01-02-nvidia-h200"
    first.mkdir(parents=True)
    assert bench.default_out_dir("NVIDIA H200", "2026-01-02", base=tmp_path) == first
    (first / "results.csv").write_text("impl\n")
    assert bench.default_out_dir("NVIDIA H200", "2026-01-02", base=tmp_path).name == \
        "2026-01-02-nvidia-h200-2"
    assert bench.match_chip("NVIDIA A100-SXM4-80GB") == "A100"
    assert bench.match_chip("NVIDIA GeForce RTX 4090") is None


def test_tables_show_every_row():
    text = bench.format_table(_some_results())
    assert "d=128  N=4096  not causal  batch=8  heads=16" in text
    assert "unsupported: first run" in text and "oom-skipped" in text
    assert "3.250" in text and "34.36" in text
    # an empty cell keeps its width, so later columns stay in place
    lines = text.splitlines()
    measured = next(l for l in lines if l.startswith("naive") and "3.250" in l)
    skipped = next(l for l in lines if "oom-skipped" in l)
    assert skipped.index("oom-skipped") == measured.rindex("ok")  # the status column


# ------------------------------------------------------------------ the measuring loop, on CPU

class _WallTimer:
    """Median wall time: stands in for CUDA events on the CPU."""

    def __call__(self, fn, backward=False):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]


class _NoMemory:
    def start(self):
        pass

    def peak(self):
        return 12345

    def release(self):
        pass


def _cpu_case(fn, name="naive", causal=True, ref=True, skip=None, seed=7):
    shape = bench.Shape(batch=2, heads=2, seq=32, head_dim=16, causal=causal)
    g = torch.Generator().manual_seed(seed)
    inputs = bench.make_inputs(shape, torch.float32, "cpu", g)
    r = bench.reference_slice(*inputs, causal) if ref else None
    return shape, bench.bench_case(name, fn, shape, inputs, dtype_name="fp32",
                                   timer=_WallTimer(), memory=_NoMemory(), ref=r, skip=skip)


def test_bench_case_measures_and_checks_a_correct_implementation():
    _, res = _cpu_case(bench.naive_attention)
    assert res.status == "ok", res.note
    assert res.check == "pass" and res.err_out < 1e-5 and res.err_grad < 1e-5  # fp32
    assert res.fwd_ms > 0 and res.bwd_ms > 0
    # B=2, H=2, N=32, d=16, causal: S and O are 2 * 32 * 32 * 16 = 32768 FLOPs each per
    # head, 4 heads, halved for the mask: 131072 forward, 2.5x = 327680 backward. TFLOP/s
    # times ms is then FLOPs / 1e9, whatever the time measured.
    assert res.fwd_tflops * res.fwd_ms == pytest.approx(131072e-9)
    assert res.bwd_tflops * res.bwd_ms == pytest.approx(327680e-9)
    assert res.peak_fwd_bytes == 12345
    # fp32, beyond the inputs: O is 4 heads x 32 x 16 x 4 B = 8192 B; then P and dP at once,
    # 2 x 4 x 32 x 32 x 4 B = 32768 B, more than dQ, dK, dV (3 x 8192 B): 40960 B in all.
    assert res.floor_fwd_bwd_bytes == 40960


def test_bench_case_catches_a_wrong_implementation():
    def off_by_a_bit(q, k, v, *, causal=False, scale=None):
        return bench.naive_attention(q, k, v, causal=not causal)  # the wrong mask
    _, res = _cpu_case(off_by_a_bit, name="flashbook")
    assert res.status == "ok" and res.check == "FAIL" and res.err_out > 0.05


def _slice_inputs(rng, dtype, causal):
    """Fresh standard-normal q, k, v, dO (batch 2, heads 2, N 24, d 16) in ``dtype``."""
    q, k, v, do = (torch.from_numpy(rng.standard_normal((2, 2, 24, 16))).to(dtype)
                   for _ in range(4))
    return q, k, v, do


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_check_slice_is_the_kernel_tests_rule(rng, dtype, causal):
    """The harness's pass/fail is ``within_twice_yardstick`` on o, dq, dk, dv: the float64
    truth rounded to the inputs' dtype (an error of half a rounding step, below the
    yardstick's) passes; the same with dv[0, 0, 3, 5] off by 0.05 (over ten fp16 rounding
    steps at that size, 1e5 fp32 ones: no correct kernel is that far) fails, naming dv."""
    q, k, v, do = _slice_inputs(rng, dtype, causal)
    ref = bench.reference_slice(q, k, v, do, causal)
    yard = bench.reference_slice(q, k, v, do, causal, dtype=dtype)
    assert yard[0].dtype == dtype and ref[0].dtype == torch.float64
    o, grads = ref[0].to(dtype), [g.to(dtype) for g in ref[1]]
    assert bench.check_slice(o, grads, ref, yard, head_dim=16) == []
    bad = grads[2].clone()
    bad[0, 0, 3, 5] += 0.05
    problems = bench.check_slice(o, [grads[0], grads[1], bad], ref, yard, head_dim=16)
    assert len(problems) == 1 and problems[0].startswith("dv:"), problems


def test_bench_case_fails_a_result_that_a_relative_bound_would_pass(rng):
    """One wrong output row (row 5 of every head scaled by 1.02) moves the relative
    Frobenius error by about 2% / sqrt(32) = 0.4%, under the old 2e-2 bound; the
    yardstick rule (fp32: errors near 1e-7) rejects it and says where."""
    def one_row_off(q, k, v, *, causal=False, scale=None):
        o = bench.naive_attention(q, k, v, causal=causal)
        factor = torch.ones(o.shape[-2], 1, dtype=o.dtype)
        factor[5] = 1.02
        return o * factor
    _, res = _cpu_case(one_row_off, name="flashbook", seed=int(rng.integers(2**31)))
    assert res.status == "ok" and res.err_out < bench.TOLERANCE["out"]
    assert res.check == "FAIL" and res.note.startswith("o: max error"), res.note


def test_bench_case_records_failures_instead_of_raising():
    def refuses(q, k, v, *, causal=False, scale=None):
        raise RuntimeError("No available kernel. Aborting execution.")

    def runs_out(q, k, v, *, causal=False, scale=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    _, res = _cpu_case(refuses, name="sdpa-cudnn", ref=False)
    assert res.status == "unsupported" and "No available kernel" in res.note
    assert res.fwd_ms is None
    _, res = _cpu_case(refuses, name="naive", ref=False)
    assert res.status == "error"
    _, res = _cpu_case(runs_out, name="sdpa-flash", ref=False)
    assert res.status == "oom" and res.note.startswith("first run:")
    _, res = _cpu_case(runs_out, name="naive", ref=False, skip="needs about 99.0 GB")
    assert res.status == "oom-skipped" and res.note == "needs about 99.0 GB"


def test_every_status_written_is_listed():
    """Each status the harness and the sweeps can write is one of ``STATUSES``."""
    import inspect

    written = set()
    for module in (bench.harness, bench.sweeps):
        written |= set(re.findall(r'(?:status|res\.status)\s*=\s*"([a-z-]+)"', inspect.getsource(module)))
        written |= set(re.findall(r'return "([a-z-]+)", first', inspect.getsource(module)))
    assert written and written <= set(bench.STATUSES), written - set(bench.STATUSES)


def test_classify_error():
    class OutOfResources(Exception):  # Triton's name for a config that does not fit the chip
        pass

    status, note = bench.classify_error(OutOfResources("out of resource: shared memory, Required: 278528"),
                                        "flashbook")
    assert status == "out-of-resources" and "278528" in note
    assert bench.classify_error(torch.OutOfMemoryError("x"), "naive")[0] == "oom"
    assert bench.classify_error(RuntimeError("CUDA error: an illegal memory access was "
                                             "encountered"), "flashbook")[0] == "cuda-error"
    assert bench.classify_error(ImportError("no kernels"), "flashbook")[0] == "unavailable"
    assert bench.classify_error(ValueError("head_dim 96"), "sdpa-flash") == \
        ("unsupported", "ValueError: head_dim 96")


def test_skip_reason_uses_the_estimate():
    big = bench.Shape(batch=2, heads=32, seq=16384, head_dim=64, causal=False)
    need = bench.naive_memory_estimate(2, 32, 16384, 16384, 64)
    assert need > 4 * 2 * 32 * 16384**2 * 2
    reason = bench.skip_reason("naive", big, 2, 60e9)
    assert reason and f"{need / 1e9:.1f} GB" in reason and "60 GB limit" in reason
    assert bench.skip_reason("sdpa-flash", big, 2, 60e9) is None
    small = bench.Shape(batch=32, heads=16, seq=1024, head_dim=128, causal=True)
    assert bench.skip_reason("naive", small, 2, 60e9) is None
    # the math backend computes in fp32: twice the naive need
    mid = bench.Shape(batch=4, heads=16, seq=8192, head_dim=128, causal=False)
    assert bench.skip_reason("naive", mid, 2, 60e9) is None       # about 34 GB
    assert bench.skip_reason("naive", mid, 2, 30e9) is not None
    assert bench.skip_reason("sdpa-math", mid, 2, 60e9) is not None  # about 69 GB
    assert bench.skip_reason("sdpa-math", mid, 2, 80e9) is None


def test_run_steps_records_every_step_and_stops_at_a_cuda_error(monkeypatch, rng):
    """The loop behind the block sweep and the ladder, on the CPU: fresh inputs and a
    float64 output per shape, one row per step and shape in order, a failure recorded as a
    status, and nothing more after a CUDA error (the third shape never runs)."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    monkeypatch.setattr(bench.sweeps, "run_tools",
                        lambda args: (torch.float32, _WallTimer(), _NoMemory(), gen))
    monkeypatch.setattr(bench.sweeps, "make_inputs",
                        lambda shape, dtype, device, g: bench.make_inputs(shape, dtype, "cpu", g))
    shapes = [bench.Shape(1, 2, 24, 8, causal) for causal in (False, True, False)]
    seen = []

    def measure(res, shape, inputs, o_ref, timer):
        q, k, v, _do = inputs
        seen.append((shape.causal, res.name, q.data_ptr()))
        if res.name == "raises":
            raise ValueError("head_dim 8")
        if res.name == "lost context" and shape.causal:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        causal = not shape.causal if res.name == "wrong mask" else shape.causal
        with torch.no_grad():
            res.err_out = bench.rel_err(bench.naive_attention(q, k, v, causal=causal)[:1, :1], o_ref)
            res.ms = timer(lambda: bench.naive_attention(q, k, v, causal=causal))

    names = ["right", "wrong mask", "raises", "lost context"]
    steps = [(name, lambda shape, i=i, name=name: bench.LadderResult.of(
        shape, "fp32", rung=i, name=name, pass_="fwd")) for i, name in enumerate(names)]
    rows = bench.run_steps(SimpleNamespace(shapes=shapes), steps, measure, progress=False)
    assert [(r.causal, r.name) for r in rows] == [(c, n) for c in (False, True) for n in names]
    assert [r.status for r in rows] == ["ok", "ok", "error", "ok", "ok", "ok", "error", "cuda-error"]
    assert rows[2].note == "ValueError: head_dim 8" and "illegal memory access" in rows[-1].note
    for r in (rows[0], rows[4]):
        assert r.err_out < 1e-5 and r.ms > 0         # fp32 against float64: rounding only
    for r in (rows[1], rows[5]):
        assert r.err_out > 0.05                       # the other mask: a different output
    # the inputs are made once per shape and shared by its steps
    assert all(len({p for c, _, p in seen if c == causal}) == 1 for causal in (False, True))


def test_run_ladder_runs_every_rung_on_the_cpu(monkeypatch, rng):
    """Chapter 10's ladder through the same loop, the kernels in Triton's interpreter:
    every forward rung and both dQ strategies run, and each output is the float64 one
    to fp32 rounding (1e-5: a few units of 2**-24 over sums of 32 terms)."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    monkeypatch.setattr(bench.sweeps, "run_tools",
                        lambda args: (torch.float32, _WallTimer(), _NoMemory(), gen))
    monkeypatch.setattr(bench.sweeps, "make_inputs",
                        lambda shape, dtype, device, g: bench.make_inputs(shape, dtype, "cpu", g))
    from flashbook.kernels.ladder import RUNGS

    args = SimpleNamespace(shapes=[bench.Shape(1, 2, 32, 16, True)], dtype="fp32")
    rows = bench.run_ladder(args, progress=False)
    assert [(r.rung, r.pass_) for r in rows] == \
        [(i, "fwd") for i in range(len(RUNGS))] + [(len(RUNGS), "bwd"), (len(RUNGS) + 1, "bwd")]
    assert [r.name for r in rows[-2:]] == ["dQ atomic", "dQ separate"]
    for r in rows:
        assert r.status == "ok" and 0 < r.err_out < 1e-5 and r.ms > 0, (r.name, r.note)


# ------------------------------------------------------------------ block sweep helpers

def test_block_configs_cover_the_grid_once():
    configs = bench.block_configs()
    n = math.prod(len(v) for v in bench.BLOCK_GRID.values())
    assert len(configs) == n == len({tuple(sorted(c.items())) for c in configs})
    assert set(configs[0]) == {"block_m", "block_n", "num_warps", "num_stages"}


# ------------------------------------------------------------------ recorded runs (chapter 9)

H200_PROVENANCE = {
    "command": "python -m flashbook.bench", "driver": "580.1", "cuda": "13.0", "cudnn": 91900,
    "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3", "flashbook": "0.1.0",
    "git_commit": None, "source_sha256": "ab" * 32,
    "gpu": {"name": "NVIDIA H200", "capability": "sm_90", "sms": 132,
            "memory_bytes": 150_109_880_320,
            "datasheet": {"chip": "H200", "bf16_tflops": 989.0, "fp16_tflops": 989.0,
                          "hbm_tb_s": 4.8}},
    "settings": {"dtype": "bf16", "tokens": 32768, "seed": 0, "max_naive_gb": 60.0},
    "timing": {"statistic": "median", "rep_ms": 100.0, "min_reps": 5},
    "conventions": {},
}

#: Made-up but plausible TFLOP/s (forward, backward) per implementation, never zero.
_SPEEDS = {"naive": (55.0, 120.0), "sdpa-math": (16.0, 35.0), "sdpa-efficient": (130.0, 110.0),
           "sdpa-cudnn": (450.0, 420.0), "sdpa-flash": (300.0, 260.0),
           "flashbook": (372.0, 255.0), "flashbook-atomic": (365.0, 130.0)}


def _synthetic_results(seqs=(1024, 2048, 4096), head_dims=(64, 128)):
    """Rows as the harness writes them: every implementation on every shape; naive and
    sdpa-math skipped at the longest d=64 shapes, cuDNN unsupported at one shape."""
    rows = []
    for shape in bench.make_shapes(seqs, head_dims, (False, True)):
        b, h, n, d = shape.batch, shape.heads, shape.seq, shape.head_dim
        for impl, (fwd, bwd) in _SPEEDS.items():
            grow = 1 + 0.05 * math.log2(n / 1024)        # fused kernels speed up with N
            fwd, bwd = (fwd * grow, bwd * grow) if impl not in ("naive", "sdpa-math") \
                else (fwd, bwd)
            if shape.causal:
                fwd, bwd = 0.8 * fwd, 0.8 * bwd
            r = bench.Result.of(shape, "bf16", impl=impl)
            naive_like = impl in ("naive", "sdpa-math")
            r.floor_fwd_bwd_bytes = bench.attention_memory_bytes(
                b, h, n, n, d, impl="naive" if naive_like else "flash", pass_="fwd+bwd",
                include_inputs=False)
            if naive_like and n == max(seqs) and d == min(head_dims):
                r.status, r.note = "oom-skipped", "needs about 99.9 GB, over the 60 GB limit"
            elif impl == "sdpa-cudnn" and (n, d, shape.causal) == (min(seqs), 64, True):
                r.status, r.note = "unsupported", "first run: RuntimeError: no kernel"
            else:
                r.fwd_tflops, r.bwd_tflops = fwd, bwd
                r.fwd_ms = shape.flops_fwd / (fwd * 1e12) * 1e3
                r.bwd_ms = shape.flops_bwd / (bwd * 1e12) * 1e3
                elem = 4 if impl == "sdpa-math" else 2
                r.peak_fwd_bwd_bytes = (bench.naive_memory_estimate(b, h, n, n, d, elem_bytes=elem)
                                        if naive_like else int(1.05 * r.floor_fwd_bwd_bytes))
                r.peak_fwd_bytes = r.peak_fwd_bwd_bytes // 2
                r.err_out, r.err_grad, r.check = 0.0031, 0.0042, "pass"
            rows.append(r)
    return rows


def _synthetic_blocks(head_dims=(64, 128), seq=4096):
    from flashbook.kernels import configs

    limit = bench.runtime.chip("H200").smem_per_block_bytes
    rows = []
    for d in head_dims:
        shape = bench.make_shapes((seq,), (d,), (False,))[0]
        for cfg in bench.block_configs():
            r = bench.BlockResult(seq, d, shape.batch, shape.heads, False, "bf16", **cfg)
            need = configs.smem_estimate("forward", configs.Config(**cfg), configs.block_d(d),
                                         2, 90)
            if need > limit:
                r.status = "out-of-resources"
                r.note = (f"OutOfResources: out of resource: shared memory, Required: {need}, "
                          f"Hardware limit: {limit}.")
            else:
                r.n_regs = min(255, cfg["block_m"] * d // (16 * cfg["num_warps"]) + 40)
                r.n_spills = 24 if r.n_regs == 255 and cfg["num_warps"] == 4 else 0
                r.fwd_tflops = (300.0 + cfg["block_m"] + cfg["block_n"] / 2
                                + 10 * cfg["num_stages"] - 60 * (r.n_spills > 0))
                r.fwd_ms = shape.flops_fwd / (r.fwd_tflops * 1e12) * 1e3
                r.shared_bytes, r.err_out = need, 0.0022
            rows.append(r)
    return rows


def _write_run(directory, rows, fields, csv_name, date):
    bench.write_csv(rows, directory / csv_name, fields)
    prov = dict(H200_PROVENANCE, date_utc=date, files={csv_name: "synthetic"})
    (directory / "provenance.json").write_text(json.dumps(prov))
    return directory / csv_name


def _synthetic_root(root):
    """A results root as the harness leaves it: an older run, the newest run, and the
    block sweep in a directory of its own."""
    _write_run(root / "2026-01-02-nvidia-h200", _synthetic_results(seqs=(1024,)),
               bench.RESULT_FIELDS, "results.csv", "2026-01-02T10:00:00+00:00")
    newest = _write_run(root / "2026-03-04-nvidia-h200", _synthetic_results(),
                        bench.RESULT_FIELDS, "results.csv", "2026-03-04T10:00:00+00:00")
    blocks = _write_run(root / "2026-03-04-nvidia-h200-2", _synthetic_blocks(),
                        bench.BLOCK_FIELDS, "blocks.csv", "2026-03-04T11:00:00+00:00")
    return newest, blocks


def test_latest_results_finds_the_newest_run_by_its_provenance(tmp_path):
    newest, blocks = _synthetic_root(tmp_path)
    assert bench.latest_results(tmp_path) == newest
    assert bench.latest_blocks(tmp_path) == blocks
    older = tmp_path / "2026-01-02-nvidia-h200" / "results.csv"
    assert bench.find_runs(tmp_path) == [newest, older]
    # without provenance the date in the directory name decides; nesting is allowed
    later = tmp_path / "extra" / "2026-05-06-h200"
    bench.write_csv(_synthetic_results(seqs=(1024,)), later / "results.csv", bench.RESULT_FIELDS)
    assert bench.run_date(later / "results.csv") == "2026-05-06"
    assert bench.latest_results(tmp_path) == later / "results.csv"
    assert bench.latest_results(tmp_path / "nowhere") is None


def test_provenance_names_the_csv_it_describes(tmp_path):
    # a block sweep written into the directory of a run replaced that run's provenance
    run = tmp_path / "2026-03-04-h200"
    _write_run(run, _synthetic_results(seqs=(1024,)), bench.RESULT_FIELDS, "results.csv",
               "2026-03-04T10:00:00+00:00")
    _write_run(run, _synthetic_blocks(head_dims=(64,)), bench.BLOCK_FIELDS, "blocks.csv",
               "2026-03-04T11:00:00+00:00")
    assert bench.provenance_for(run / "blocks.csv")["date_utc"] == "2026-03-04T11:00:00+00:00"
    assert bench.provenance_for(run / "results.csv") == {}          # not the sweep's machine
    # a second provenance file beside it, naming results.csv, is found
    (run / "results-provenance.json").write_text(json.dumps(
        dict(H200_PROVENANCE, date_utc="2026-03-04T10:00:00+00:00", files={"results.csv": "x"})))
    assert bench.provenance_for(run / "results.csv")["gpu"]["name"] == "NVIDIA H200"
    # one that names no file at all is taken for any CSV beside it
    bare = tmp_path / "bare"
    bench.write_csv(_synthetic_results(seqs=(1024,)), bare / "results.csv", bench.RESULT_FIELDS)
    (bare / "provenance.json").write_text(json.dumps({"date_utc": "2026-07-08", "files": {}}))
    assert bench.provenance_for(bare / "results.csv")["date_utc"] == "2026-07-08"


def test_results_root_honours_the_environment(tmp_path, monkeypatch):
    newest, _ = _synthetic_root(tmp_path / "results")
    monkeypatch.setenv(bench.RESULTS_ENV, str(tmp_path / "results"))
    assert bench.results_root() == tmp_path / "results"
    assert bench.latest_results() == newest
    monkeypatch.setenv(bench.RESULTS_ENV, str(tmp_path / "missing"))
    assert bench.results_root() is None and bench.latest_results() is None
    assert bench.latest_blocks() is None
    monkeypatch.delenv(bench.RESULTS_ENV)
    monkeypatch.chdir(tmp_path)                  # a chapter runs in notebooks/: the parent counts
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks")
    assert bench.results_root() == tmp_path / "benchmarks" / "results"


def test_load_results_gives_typed_columns(tmp_path):
    rows = _some_results()
    path = bench.write_csv(rows, tmp_path / "run" / "results.csv", bench.RESULT_FIELDS)
    df, prov = bench.load_results(tmp_path / "run")          # a directory means its results.csv
    assert prov == {} and list(df.columns) == bench.RESULT_FIELDS
    assert df["causal"].tolist() == [False, True, True]
    assert df["fwd_tflops"].iloc[0] == 1.2345678901234567
    assert df["peak_fwd_bwd_bytes"].iloc[0] == 34359738368
    assert math.isnan(df["fwd_ms"].iloc[1]) and df["check"].iloc[1] == ""
    assert df["note"].iloc[1] == "first run: RuntimeError: No available kernel, 'quoted', comma"
    # a live run (Result objects) reads the same
    live = bench.results_frame(rows)
    for col in ("impl", "status", "check", "note", "causal", "seq"):
        assert live[col].tolist() == df[col].tolist(), col
    assert np.allclose(live["bwd_ms"], df["bwd_ms"], equal_nan=True)
    with pytest.raises(FileNotFoundError, match="results.csv"):
        bench.load_results(tmp_path / "empty")
    # a column a later harness might add survives as what it is
    text = path.read_text().splitlines()
    extra = [text[0] + ",gpu,clock_mhz"] + [line + f",H200,{1980 - i}" for i, line in
                                            enumerate(text[1:])]
    path.write_text("\n".join(extra) + "\n")
    df, _ = bench.load_results(path)
    assert df["gpu"].tolist() == ["H200"] * 3 and df["clock_mhz"].tolist() == [1980, 1979, 1978]
    blocks = bench.results_frame(_synthetic_blocks(head_dims=(64,)))
    assert list(blocks.columns) == bench.BLOCK_FIELDS


def _frame(rows):
    return bench.results_frame(rows)


def test_speedup_table_divides_times_and_memory():
    df = _frame(_synthetic_results())
    table = bench.speedup_table(df, "sdpa-flash")
    assert len(table) == 12 and list(table.columns) == ["fwd", "bwd", "memory"]
    flash_fwd, flash_bwd = _SPEEDS["sdpa-flash"]
    ours_fwd, ours_bwd = _SPEEDS["flashbook"]
    # same FLOPs on both sides, so the time ratio is the TFLOP/s ratio
    assert np.allclose(table["fwd"], ours_fwd / flash_fwd)
    assert np.allclose(table["bwd"], ours_bwd / flash_bwd)
    assert np.allclose(table["memory"], 1.0)
    cudnn = bench.speedup_table(df, "sdpa-cudnn")
    missing = cudnn.xs((1024, 64, True), level=("seq", "head_dim", "causal"))
    assert missing.isna().all(axis=None)                      # cuDNN did not run there
    assert cudnn.notna().all(axis=1).sum() == 11
    ours_vs_naive = bench.speedup_table(df, "naive")
    assert ours_vs_naive["fwd"].isna().sum() == 2             # naive skipped at 4K, d=64
    with pytest.raises(ValueError, match="no rows for impl 'triton'"):
        bench.speedup_table(df, "triton")


def test_targets_are_judged_per_shape_and_counted():
    df = _frame(_synthetic_results())
    table = bench.target_table(df)
    labels = [t.label for t in bench.PERFORMANCE_TARGETS]
    assert list(dict.fromkeys(table["target"])) == labels
    per_target = table.groupby("target", sort=False).size()
    assert per_target[labels[0]] == 12                          # every shape
    goals = table[table["kind"] == "goal"]
    assert set(goals["head_dim"]) == {128} and set(goals["seq"]) == {4096}
    summary = bench.target_summary(table)
    # 372/300 = 1.24 >= 1.15; 255/260 = 0.98 < 1.0; memory equal; 372/450 = 0.83 < 0.9;
    # 255/420 = 0.61 < 0.8
    assert summary.loc[labels[0], "met"] == 12 and summary.loc[labels[0], "missed"] == 0
    assert summary.loc[labels[1], "met"] == 0 and summary.loc[labels[1], "missed"] == 12
    assert summary.loc[labels[1], "worst_ratio"] == pytest.approx(255 / 260)
    assert summary.loc[labels[2], "met"] == 12
    assert summary.loc[labels[3], "missed"] == 2 and summary.loc[labels[4], "missed"] == 2
    # a shape where the baseline did not run is counted as not measured, not as missed
    cudnn_all = bench.target_table(df, targets=(bench.Target("x", "fwd", "sdpa-cudnn", 0.5),))
    s = bench.target_summary(cudnn_all, targets=(bench.Target("x", "fwd", "sdpa-cudnn", 0.5),))
    assert (s.loc["x", "shapes"], s.loc["x", "measured"], s.loc["x", "met"]) == (12, 11, 11)
    t = bench.Target("m", "memory", "sdpa-flash", 1.1)
    assert t.met(1.1) is True and t.met(1.2) is False and t.met(float("nan")) is None


def test_roofline_points_use_the_counting_formulas():
    df = _frame(_synthetic_results())
    points = bench.roofline_points(df, ["naive", "flashbook"])
    ok = df[df["impl"].isin(["naive", "flashbook"]) & (df["status"] == "ok")]
    assert len(points) == 2 * len(ok)
    row = points[(points["impl"] == "naive") & (points["pass"] == "bwd") & (points["seq"] == 2048)
                 & (points["head_dim"] == 128) & ~points["causal"]].iloc[0]
    b, h = int(row["batch"]), int(row["heads"])
    assert row["flops"] == bench.attention_flops(b, h, 2048, 2048, 128, pass_="bwd")
    assert row["hbm_bytes"] == bench.attention_hbm_bytes(b, h, 2048, 2048, 128, impl="naive",
                                                         pass_="bwd")
    assert row["intensity"] == pytest.approx(row["flops"] / row["hbm_bytes"])
    assert row["tflops"] == pytest.approx(_SPEEDS["naive"][1])
    # naive attention sits left of the H200's ridge, the fused kernel far right of it
    ceil = bench.roofline_ceilings(H200_PROVENANCE)
    assert ceil["ridge"] == pytest.approx(989 / 4.8)
    assert (points[points["algorithm"] == "naive"]["intensity"] < ceil["ridge"]).all()
    assert (points[points["algorithm"] == "flash"]["intensity"] > ceil["ridge"]).all()
    # a point under the roof is a time above the floor that roofline_ms gives
    for r in points.itertuples():
        floor = bench.roofline_ms(r.flops, r.hbm_bytes, "H200", "bf16")["floor_ms"]
        attainable = min(ceil["peak_tflops"], r.intensity * ceil["hbm_tb_s"])
        assert (r.tflops <= attainable * (1 + 1e-12)) == \
            (r.flops / (r.tflops * 1e12) * 1e3 >= floor * (1 - 1e-12))
    # sdpa-math computes in fp32: its matrices are 4-byte
    math_pts = bench.roofline_points(df, ["sdpa-math"])
    b, h, n, d = (int(math_pts.iloc[0][k]) for k in ("batch", "heads", "seq", "head_dim"))
    assert math_pts.iloc[0]["hbm_bytes"] == bench.attention_hbm_bytes(b, h, n, n, d, impl="naive",
                                                                      dtype_bytes=4)


def test_roofline_ceilings_say_where_they_come_from():
    data = bench.roofline_ceilings(H200_PROVENANCE)
    assert (data["chip"], data["peak_tflops"], data["hbm_tb_s"]) == ("H200", 989.0, 4.8)
    assert data["peak_source"] == data["hbm_source"] == "datasheet"
    measured = dict(H200_PROVENANCE, measured={"bf16_tflops": 720.5, "hbm_tb_s": 4.1})
    m = bench.roofline_ceilings(measured)
    assert (m["peak_tflops"], m["peak_source"], m["hbm_tb_s"], m["hbm_source"]) == \
        (720.5, "measured", 4.1, "measured")
    assert m["ridge"] == pytest.approx(720.5 / 4.1)
    assert bench.roofline_ceilings({}, chip="A100", dtype="fp16")["peak_tflops"] == 312.0
    assert bench.roofline_ceilings({"gpu": {"name": "NVIDIA A100-SXM4-80GB"}})["chip"] == "A100"
    with pytest.raises(ValueError, match="chip must name one of"):
        bench.roofline_ceilings({"gpu": {"name": "Some GPU"}})
    with pytest.raises(ValueError, match="no bf16 tensor cores"):
        bench.roofline_ceilings({}, chip="T4")


def test_seed_shape_rows_prefers_the_sizes_the_article_states():
    df = _frame(_synthetic_results())
    rows, why = bench.seed_shape_rows(df)
    # the harness has B=8, H=32, N=4096 only at d=64: that beats B=8, H=16 at d=128
    assert set(rows["impl"]) == set(_SPEEDS) and not rows["causal"].any()
    assert {(r.batch, r.heads, r.seq, r.head_dim) for r in rows.itertuples()} == {(8, 32, 4096, 64)}
    assert why == ("B=8, H=32, N=4096, d=64, the closest measured shape: the seed's B, H and N, "
                   "but d=64 instead of 128")
    rows, why = bench.seed_shape_rows(df[df["head_dim"] == 128])
    assert set(rows["heads"]) == {16} and "H=16 instead of 32" in why
    exact = _frame([bench.Result(impl="flashbook", batch=8, heads=32, seq=4096, head_dim=128, causal=False,
                                 dtype="bf16", fwd_ms=1.5)])
    rows, why = bench.seed_shape_rows(exact)
    assert len(rows) == 1 and why.endswith("the seed's own shape")
    rows, why = bench.seed_shape_rows(df[df["seq"] == 1024])
    assert set(rows["seq"]) == {1024} and "N=1024 instead of 4096" in why


def test_block_state_reads_the_sweep_and_checks_every_chip():
    from flashbook.kernels import configs

    blocks = _frame(_synthetic_blocks())
    state = bench.block_state(blocks, 128, 128, 64, 8, 3, measured_arch="sm_90")
    assert state.config == (128, 64, 8, 3) and state.seq == 4096
    ran = blocks[(blocks["head_dim"] == 128) & (blocks["status"] == "ok")]
    assert state.n_ran == len(ran) and state.n_configs == len(bench.block_configs())
    assert state.tflops == pytest.approx(300 + 128 + 32 + 30)
    assert state.ranking[0][1] == ran["fwd_tflops"].max()
    assert [t for _, t in state.ranking] == sorted(ran["fwd_tflops"], reverse=True)
    assert state.ranking[state.rank - 1][0] == state.config
    need = configs.smem_estimate("forward", configs.Config(128, 64, 8, 3), 128, 2, 90)
    assert state.shared_bytes == need
    assert state.fits["H200"] == {"bytes": need, "limit": 227 * 1024, "fits": True,
                                  "how": "measured"}
    assert state.fits["A100"]["how"] == "model"
    assert state.fits["A100"]["fits"] == (need <= 163 * 1024)
    assert state.fits["T4"]["bytes"] == configs.smem_estimate(
        "forward", configs.Config(128, 64, 8, 3), 128, 2, 75)
    assert "number" in state.summary() and "KiB of shared memory" in state.summary()
    # a config that did not fit: the compiler's number from its error message
    big = bench.block_state(blocks, 128, 128, 128, 8, 4, measured_arch="sm_90")
    assert big.rank is None and big.row["status"] == "out-of-resources"
    assert big.shared_bytes == configs.smem_estimate("forward", configs.Config(128, 128, 8, 4),
                                                     128, 2, 90)
    assert not any(f["fits"] for f in big.fits.values())
    assert "out-of-resources" in big.summary()
    with pytest.raises(ValueError, match="head_dim must be one of"):
        bench.block_state(blocks, 96, 64, 64, 4, 2)
    # a sweep where everything ran reads its shared memory as integers
    assert bench.block_shared_bytes({"shared_bytes": np.int64(49152)}) == 49152.0
    assert bench.block_shared_bytes({"shared_bytes": None, "note": "Required: 294912, Hard"}) \
        == 294912.0
    assert math.isnan(bench.block_shared_bytes({"shared_bytes": "", "note": "error: other"}))
    all_ok = blocks[blocks["status"] == "ok"].copy()
    all_ok["shared_bytes"] = all_ok["shared_bytes"].astype("int64")
    assert bench.block_state(all_ok, 64, 64, 32, 4, 2, measured_arch="sm_90").shared_bytes == \
        configs.smem_estimate("forward", configs.Config(64, 32, 4, 2), 64, 2, 90)


def test_best_blocks_picks_the_fastest_warps_and_stages():
    blocks = _frame(_synthetic_blocks())
    best = bench.best_blocks(blocks)
    assert len(best) == 2 * 2 * 3                      # head_dims x B_r x B_c
    for r in best.itertuples():
        same = blocks[(blocks["head_dim"] == r.head_dim) & (blocks["block_m"] == r.block_m)
                      & (blocks["block_n"] == r.block_n) & (blocks["status"] == "ok")]
        assert r.fwd_tflops == same["fwd_tflops"].max()


# ------------------------------------------------------------------ chapter 9 on recorded runs

CHAPTER_9 = REPO / "notebooks" / "09_benchmarks.ipynb"
#: The figures chapter 9 must draw wherever a run and a block sweep are recorded.
CHAPTER_9_FIGURES = {"fig-tflops", "fig-memory", "fig-roofline", "fig-block-default", "fig-block-heatmap"}


def _quoted_in_chapter_9() -> set:
    """Every name the chapter's prose quotes: {glue:text}`name` (or `name:fmt`), {glue:}`name`."""
    return {key.split(":")[0] for cell in cells(CHAPTER_9) if cell["cell_type"] == "markdown"
            for key in re.findall(r"\{glue(?::[\w-]*)?\}`([^`]+)`", source_of(cell))}


def _figure_cells() -> list:
    return [c["id"] for c in cells(CHAPTER_9) if c["cell_type"] == "code" and c["id"].startswith("fig-")]


def _chapter_9(root):
    """chapter9.build(root), checked as the book build would check the page: every name the
    prose quotes has a value, and every figure cell of the chapter shows what build made for it."""
    from flashbook.bench import chapter9

    ch = chapter9.build(root)
    quoted = _quoted_in_chapter_9()
    assert len(quoted) > 100 and quoted <= set(ch.values), \
        f"quoted but never glued: {sorted(quoted - set(ch.values))}"
    assert all(isinstance(v, str) for v in ch.values.values())
    assert set(_figure_cells()) >= CHAPTER_9_FIGURES
    sources = sources_by_id(CHAPTER_9)
    for cid in _figure_cells():       # the cell shows what build made for it, and nothing else
        assert sources[cid].startswith(f'ch.show("{cid}")'), sources[cid]
    assert "ch = chapter9.build()" in sources["imports"]      # and one cell glues every value
    assert sum("for name, text in ch.glued():\n    glue_text(name, text)" in src for src in sources.values()) == 1
    return ch


def _recorded_roots():
    roots = [pytest.param("synthetic", id="synthetic")]
    recorded = REPO / "benchmarks" / "results"
    roots.append(pytest.param("recorded", id="recorded", marks=pytest.mark.skipif(
        bench.latest_results(recorded) is None or bench.latest_blocks(recorded) is None,
        reason="no results.csv and blocks.csv recorded in benchmarks/results/")))
    return roots


@pytest.mark.parametrize("which", _recorded_roots())
def test_chapter_9_draws_every_figure_from_recorded_results(which, tmp_path):
    import io

    from matplotlib.figure import Figure

    if which == "synthetic":
        root = tmp_path / "results"
        _synthetic_root(root)
    else:
        root = REPO / "benchmarks" / "results"
    ch = _chapter_9(root)
    # a synthetic root holds no Nsight profile: the figure drawn from one says so there
    unprofiled = {"fig-causal-cost"} if which == "synthetic" else set()
    for cid in _figure_cells():
        shown = [what for kind, what in ch.outputs.get(cid, []) if kind == "figure"]
        if cid in unprofiled:
            assert not shown and ch.messages[cid].startswith("No recorded results"), cid
            continue
        assert len(shown) == 1, f"{cid} draws {len(shown)} figures: {ch.outputs.get(cid)}"
        fig = ch.figures[shown[0]]()
        assert isinstance(fig, Figure) and fig.axes, cid
        fig.savefig(io.BytesIO(), format="png")           # it renders, not only builds
    said = "".join(what for cid, items in ch.outputs.items() if cid not in unprofiled
                   for kind, what in items if kind == "text")
    assert set(ch.messages) == unprofiled and "No recorded results" not in said and "No block sweep" not in said
    blank = sorted(name for name, value in ch.values.items() if value == "n/a"
                   # a synthetic root holds no Nsight profile, no front-door run and no recorded live cell:
                   # their readings say n/a there
                   and not (which == "synthetic" and name.startswith(("ncu_", "cc_", "fd_", "live_"))))
    assert not blank, f"numbers the prose quotes but the data did not give: {blank}"
    assert ch.explorer is not None and ch.explorer["views"]
    if which == "recorded":     # Nsight's count, as tests/test_profiles.py reads the record
        assert (ch.values["ncu_fb_ops"], ch.values["ncu_cudnn_ops"], ch.values["ncu_regs"]) == ("3.50", "2.50", "255")
    if which == "synthetic":    # the prose quotes what the data say
        assert ch.values["t_fwd_flash"] == "at 12 of the 12 shapes measured"
        assert ch.values["t_bwd_flash"] == "at 0 of the 12 shapes measured"
        assert ch.values["naive_missing"] == "d=64 N=4096 full, d=64 N=4096 causal"
        assert ch.values["roof_source"] == "datasheet"
        assert ch.values["gpu_name"] == "NVIDIA H200" and ch.values["n_shapes"] == "12"


def test_chapter_9_says_so_when_nothing_is_recorded(tmp_path, capsys):
    empty = tmp_path / "results"
    empty.mkdir()
    ch = _chapter_9(empty)
    assert ch.results is None and ch.blocks is None and not ch.figures and ch.explorer is None
    assert "No recorded results were found" in ch.messages["locate"]
    for cid in _figure_cells():
        assert not [k for k, _ in ch.outputs.get(cid, []) if k == "figure"], cid
        assert "No recorded results" in ch.messages[cid] or "No block sweep" in ch.messages[cid], cid
    ch.show("locate")          # what the cell prints
    assert "No recorded results were found" in capsys.readouterr().out
    # the arithmetic that needs no GPU is still there; what the data would give says n/a
    assert ch.values["seed_n_time_impossible"] == "4"
    assert ch.values["n_shapes"] == ch.values["heat_best"] == ch.values["ncu_fb_ops"] == "n/a"


def test_ladder_speedups_divide_times_within_each_pass_and_shape(tmp_path):
    shape = dict(seq=1024, head_dim=64, batch=2, heads=4, dtype="bf16")
    rows = []
    for causal in (False, True):
        for rung, ms in enumerate((4.0, 2.0, 1.0)):
            rows.append(bench.LadderResult(rung=rung, name=f"rung {rung}", pass_="fwd", **shape,
                                           causal=causal, ms=ms * (2 if causal else 1)))
        rows.append(bench.LadderResult(rung=3, name="dQ atomic", pass_="bwd", **shape,
                                       causal=causal, ms=9.0))
        rows.append(bench.LadderResult(rung=4, name="dQ separate", pass_="bwd", **shape,
                                       causal=causal, status="error", note="boom"))
    path = bench.write_csv(rows[::-1], tmp_path / "2026-01-01-h200-ladder" / "ladder.csv",
                           bench.LADDER_FIELDS)
    assert bench.latest_ladder(tmp_path) == path
    assert bench.latest_ladder(tmp_path / "nowhere") is None
    df, _ = bench.load_results(path)
    out = bench.ladder_speedups(df)
    assert len(out) == len(rows)
    fwd = out[out["pass_"] == "fwd"]
    for causal in (False, True):
        part = fwd[fwd["causal"] == causal]
        assert part["rung"].tolist() == [0, 1, 2]                 # sorted by rung within a shape
        assert math.isnan(part["vs_prev"].iloc[0])
        assert part["vs_prev"].iloc[1:].tolist() == [2.0, 2.0]
        assert part["vs_first"].tolist() == [1.0, 2.0, 4.0]
    bwd = out[out["pass_"] == "bwd"]
    assert bwd["vs_first"].iloc[0] == 1.0                         # its own first rung, not fwd's
    failed = bwd[bwd["status"] == "error"]
    assert failed["vs_prev"].isna().all() and failed["vs_first"].isna().all()


def test_provenance_summary_reads_what_was_recorded_and_says_what_was_not():
    prov = {"gpu": {"name": "NVIDIA H200", "capability": "sm_90", "sms": 132},
            "driver": "580.1", "torch": "2.11.0", "triton": "3.6.0", "cudnn": 91900,
            "date_utc": "2026-11-29T08:13:25+00:00", "command": "python -m flashbook.bench --ladder"}
    out = bench.provenance_summary(prov)
    assert out["GPU"] == "NVIDIA H200 (sm_90, 132 SMs)"
    assert out["driver"] == "580.1" and out["triton"] == "3.6.0" and out["cuDNN"] == "91900"
    assert out["command"] == "python -m flashbook.bench --ladder"
    assert out["CUDA"] == "not recorded"
    assert set(bench.provenance_summary({}).values()) == {"not recorded"}
    assert bench.provenance_summary({"gpu": {"name": "T4"}})["GPU"] == "T4"


# ------------------------------------------------------------ the Hopper experiment (chapter 10)

def _hopper_rows():
    rows = []
    for causal in (False, True):
        base = 400.0 if causal else 500.0
        rows += [
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "cudnn", "tflops": base * 1.2},
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "flashbook", "tflops": base},
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "tma BM128-BN64-w8-s3", "tflops": base * 0.9},
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "tma BM128-BN128-w8-s3", "tflops": base * 1.05},
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "tma BM128-BN64-w8-s3 ws", "tflops": base * 0.8},
            {"seq": 4096, "head_dim": 128, "causal": causal, "variant": "tma BM128-BN64-w4-s3 ws",
             "error": "RuntimeError: PassManager::run failed"},
        ]
    return rows


def test_hopper_experiment_table_picks_the_best_variant_per_shape(tmp_path):
    (tmp_path / "hopper.json").write_text(json.dumps({"environment": {"gpu": "test"}, "rows": _hopper_rows()}))
    assert bench.load_hopper_experiment(tmp_path) == (None, {})      # a run is found by its name in the index
    (tmp_path / bench.INDEX).write_text(json.dumps(
        {"runs": {bench.HOPPER_EXPERIMENT: {"path": "hopper.json", "about": "synthetic"}}}))
    rows, env = bench.load_hopper_experiment(tmp_path)
    assert env == {"gpu": "test"}
    table = bench.hopper_experiment_table(rows).set_index("causal")
    for causal, base in ((False, 500.0), (True, 400.0)):
        r = table.loc[causal]
        assert r["flashbook"] == base and r["cudnn"] == pytest.approx(base * 1.2)
        assert r["best_tma"] == "tma BM128-BN128-w8-s3" and r["tma_vs_flashbook"] == pytest.approx(1.05)
        assert r["best_tma_ws"] == "tma BM128-BN64-w8-s3 ws" and r["tma_ws_vs_flashbook"] == pytest.approx(0.8)
        assert (r["failed"], r["tried"]) == (1, 4)
    assert bench.load_hopper_experiment(tmp_path / "nothing") == (None, {})
    with pytest.raises(ValueError, match="flashbook"):
        bench.hopper_experiment_table(rows[rows["variant"] != "flashbook"])


def test_recorded_hopper_experiment_agrees_with_its_raw_rows():
    """The recorded H200 run, read back: every ratio equals the raw timings' quotient."""
    rows, env = bench.load_hopper_experiment()
    assert rows is not None and env["gpu"] == "NVIDIA H200"
    table = bench.hopper_experiment_table(rows)
    assert len(table) == 6 and set(table["seq"]) == {4096, 8192, 16384}
    with open(bench.run_path(bench.HOPPER_EXPERIMENT)) as f:
        raw = json.load(f)["rows"]
    for r in table.itertuples():
        same = [x for x in raw if (x["seq"], x["head_dim"], x["causal"]) == (r.seq, r.head_dim, r.causal)]
        lib = next(x["tflops"] for x in same if x["variant"] == "flashbook")
        best = max(x["tflops"] for x in same if x["variant"].startswith("tma ") and not x["variant"].endswith(" ws")
                   and "tflops" in x)
        assert r.tma_vs_flashbook == pytest.approx(best / lib)
        assert r.failed == sum("error" in x for x in same) and r.tried == 12


def test_variant_tables_are_the_recorded_rows():
    """Chapter 10's lazy-rescaling and static-shape tables, recomputed from the recorded JSON by hand."""
    import json

    table = bench.variant_table(bench.LAZY_EXPERIMENT, "lazy")
    data = json.load(open(bench.run_path(bench.LAZY_EXPERIMENT)))
    assert len(table) == len({(r["dtype"], r["seq"], r["causal"]) for r in data["rows"]}) == 12
    for row in table.itertuples():
        mine = [r for r in data["rows"] if (r["dtype"], r["seq"], r["causal"]) == (row.dtype, row.seq, row.causal)]
        best = max((r for r in mine if r["variant"].startswith("lazy")), key=lambda r: r["tflops"])
        lib = next(r for r in mine if r["variant"] == "flashbook")
        assert row.best == best["variant"]
        assert row.best_vs_flashbook == pytest.approx(lib["ms"] / best["ms"])   # same FLOPs: a ratio of times
    assert (table["best_vs_flashbook"] < 1).all()   # what chapter 10 says: slower at every shape
    static = bench.variant_table(bench.STATIC_SHAPE_EXPERIMENT, "constexpr")
    assert (static["best_vs_flashbook"] > 1).all() and len(static) == 6   # chapter 10: faster at every shape
    with pytest.raises(ValueError, match="prefix must start"):
        bench.variant_table(bench.LAZY_EXPERIMENT, "eager")


def test_short_sweeps_are_the_recorded_rows():
    """Chapter 10's graph-timed d=64 sweeps at short lengths, recomputed from the JSON by hand,
    and the claims the chapter makes of them."""
    import json
    import math

    table = bench.short_sweep_table()
    for run, name in enumerate(bench.GLUON_SHORT_SWEEPS, start=1):
        data = json.load(open(bench.run_path(name)))
        assert data["environment"]["timing"]["replay"].startswith("a CUDA graph")   # the GPU's time alone
        mine = table[table["run"] == run]
        assert len(mine) == len({(r["seq"], r["causal"]) for r in data["rows"]}) == 6
        for row in mine.itertuples():
            same = [r for r in data["rows"] if (r["seq"], r["causal"]) == (row.seq, row.causal)]
            for column, prefix in bench.SHORT_FAMILIES:
                timed = [r["tflops"] for r in same if r["variant"].startswith(prefix)]
                got = mine.loc[row.Index, column]
                assert (math.isnan(got) and not timed) or got == pytest.approx(max(timed))
    # what the defaults follow: 192-row tiles win at 2K full in both runs, 64-key tiles at 1K causal
    at = table.set_index(["run", "seq", "causal"])
    for run in (1, 2):
        assert at.loc[(run, 2048, False), "192 rows"] > at.loc[(run, 2048, False), "old default"]
        assert at.loc[(run, 1024, False), "192 rows"] < at.loc[(run, 1024, False), "old default"]
        assert at.loc[(run, 1024, True), "64 rows config"] == "gluon overlap m64 n64 s3"


def test_schedule_pairs_and_the_persistent_verdict():
    """The persistent schedule beside the same tiles launched one program per tile: the
    recorded ratios, and chapter 10's verdict (never faster beyond 1%)."""
    import json

    pairs = bench.schedule_pairs(bench.GLUON_SHORT_SWEEPS[1], "persistent", "overlap")
    raw = {(r["seq"], r["causal"], r["variant"]): r["tflops"]
           for r in json.load(open(bench.run_path(bench.GLUON_SHORT_SWEEPS[1])))["rows"]}
    assert len(pairs) == 18
    for r in pairs.itertuples():
        shape = (r.seq, r.causal)
        want = raw[(*shape, f"gluon persistent {r.tiles}")] / raw[(*shape, f"gluon overlap {r.tiles}")]
        assert r.first_over_second == pytest.approx(want)
    assert (pairs["first_over_second"] < 1.01).all()
    with pytest.raises(ValueError, match="timed under both"):
        bench.schedule_pairs(bench.GLUON_SHORT_SWEEPS[0], "persistent", "overlap")


def test_default_graph_runs_beat_the_tutorial_by_five_percent():
    """#15's forward criterion on the two --graph runs of today's defaults: every shape at
    least 1.05 times Triton's tutorial, in each run."""
    runs = bench.peer_runs_table(bench.GLUON_DEFAULT_GRAPH_RUNS)
    assert len(runs) == 12 and (runs["min"] >= 1.05).all()


def test_command_line_writes_the_output_folder_as_out_dir():
    assert bench.command_line(["--peer", "x.py", "--out", "/root/out/run", "--graph"]) == (
        "python -m flashbook.bench --peer x.py --out OUT_DIR --graph")
    assert bench.command_line(["--out=/tmp/a b", "--seq", "1K"], program="python3 benchmarks/y.py") == (
        "python3 benchmarks/y.py --out=OUT_DIR --seq 1K")
    assert bench.command_line(["--seq", "1K,2K"]) == "python -m flashbook.bench --seq 1K,2K"


def test_recorded_commands_name_no_machine_paths():
    """Every recorded run's command says OUT_DIR where the run wrote, not the folders of the
    machine that ran it (they mean nothing to a reader and must not reach a page)."""
    import json
    import re

    def commands(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "command" and isinstance(value, str):
                    yield value
                else:
                    yield from commands(value)
        elif isinstance(node, list):
            for value in node:
                yield from commands(value)

    root = bench.results_root()
    seen = 0
    for path in sorted(root.rglob("*.json")):
        for command in commands(json.load(open(path))):
            seen += 1
            assert not re.search(r"(^|\s|=)/(root|tmp|home|work)/", command), f"{path.relative_to(root)}: {command}"
    assert seen > 20   # the records do carry their commands
