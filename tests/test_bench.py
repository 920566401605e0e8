"""Tests of flashbook.bench that need no GPU: the counting formulas, the seed-table
check, the command line, the writers, and the measuring loop on the CPU."""
from __future__ import annotations

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flashbook import bench, reference
from flashbook.runtime import CHIPS

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ FLOPs

def test_flops_closed_forms_for_a_small_shape():
    # B=2, H=3, N_q=5, N_k=7, d=4: each product is 2*5*7*4 = 280 FLOPs per head,
    # 6 heads -> 1680 per product.
    assert bench.attention_flops(2, 3, 5, 7, 4) == 2 * 1680                     # S, O
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="bwd") == 5 * 1680        # 2.5x
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="bwd", recompute=False) == 4 * 1680
    assert bench.attention_flops(2, 3, 5, 7, 4, pass_="fwd+bwd") == 7 * 1680
    # The usual convention: 4 * B * H * N^2 * d forward, 2.5x that backward.
    for b, h, n, d in [(1, 1, 16, 8), (8, 32, 4096, 128), (3, 5, 100, 64)]:
        fwd = bench.attention_flops(b, h, n, n, d)
        assert fwd == 4 * b * h * n * n * d
        assert bench.attention_flops(b, h, n, n, d, pass_="bwd") == 2.5 * fwd


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
    with pytest.raises(ValueError, match="n_q must be a positive integer"):
        bench.attention_flops(1, 1, 0, 4, 4)
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


def test_cli_bad_seq_exits_2_with_a_message():
    done = _run_cli("--seq", "4K,lots")
    assert done.returncode == 2
    assert "argument --seq" in done.stderr and "'4K,lots'" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ writers

def _some_results():
    return [
        bench.Result("naive", 8, 16, 4096, 128, False, "bf16", fwd_ms=3.25, bwd_ms=7.5,
                     fwd_tflops=1.2345678901234567, bwd_tflops=2.5, peak_fwd_bytes=17179869184,
                     peak_fwd_bwd_bytes=34359738368, floor_fwd_bwd_bytes=2**34,
                     err_out=0.0031, err_grad=0.0123, check="pass"),
        bench.Result("sdpa-cudnn", 2, 32, 16384, 64, True, "bf16", status="unsupported",
                     note="first run: RuntimeError: No available kernel, 'quoted', comma"),
        bench.Result("naive", 2, 32, 16384, 64, True, "bf16", status="oom-skipped",
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

    def __call__(self, fn):
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


def _cpu_case(fn, name="naive", causal=True, ref=True, skip=None):
    shape = bench.Shape(batch=2, heads=2, seq=32, head_dim=16, causal=causal)
    g = torch.Generator().manual_seed(7)
    inputs = bench.make_inputs(shape, torch.float32, "cpu", g)
    r = bench.reference_slice(*inputs, causal) if ref else None
    return shape, bench.bench_case(name, fn, shape, inputs, dtype_name="fp32",
                                   timer=_WallTimer(), memory=_NoMemory(), ref=r, skip=skip)


def test_bench_case_measures_and_checks_a_correct_implementation():
    shape, res = _cpu_case(bench.naive_attention)
    assert res.status == "ok", res.note
    assert res.check == "pass" and res.err_out < 1e-5 and res.err_grad < 1e-5  # fp32
    assert res.fwd_ms > 0 and res.bwd_ms > 0
    assert res.fwd_tflops == pytest.approx(shape.flops_fwd / (res.fwd_ms * 1e-3) / 1e12)
    assert res.bwd_tflops == pytest.approx(shape.flops_bwd / (res.bwd_ms * 1e-3) / 1e12)
    assert res.peak_fwd_bytes == 12345
    assert res.floor_fwd_bwd_bytes == bench.attention_memory_bytes(
        2, 2, 32, 32, 16, impl="naive", pass_="fwd+bwd", dtype_bytes=4, include_inputs=False)


def test_bench_case_catches_a_wrong_implementation():
    def off_by_a_bit(q, k, v, *, causal=False, scale=None):
        return bench.naive_attention(q, k, v, causal=not causal)  # the wrong mask
    _, res = _cpu_case(off_by_a_bit, name="flashbook")
    assert res.status == "ok" and res.check == "FAIL" and res.err_out > 0.05


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


def test_classify_error():
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


# ------------------------------------------------------------------ block sweep helpers

def test_block_configs_cover_the_grid_once():
    configs = bench.block_configs()
    n = math.prod(len(v) for v in bench.BLOCK_GRID.values())
    assert len(configs) == n == len({tuple(sorted(c.items())) for c in configs})
    assert set(configs[0]) == {"block_m", "block_n", "num_warps", "num_stages"}


def test_kernel_resources_reads_triton_like_objects():
    compiled = SimpleNamespace(n_regs=168, n_spills=0, metadata=SimpleNamespace(shared=98304))
    o = torch.ones(2)
    want = {"n_regs": 168, "n_spills": 0, "shared_bytes": 98304}
    assert bench.kernel_resources(compiled) == want
    assert bench.kernel_resources((o, o, compiled)) == want
    assert bench.kernel_resources((o, {"n_regs": 96, "n_spills": 4, "shared": 512})) == \
        {"n_regs": 96, "n_spills": 4, "shared_bytes": 512}
    assert bench.kernel_resources(o) == {"n_regs": None, "n_spills": None,
                                         "shared_bytes": None}


# A stand-in for a Triton JIT function: a cache of compiled kernels per device.
_FAKE_JIT = SimpleNamespace(device_caches={0: ({}, None, None)})


def _fake_forward(q, k, v, *, causal=False, scale=None, config=None):
    cache = _FAKE_JIT.device_caches[0][0]
    key = (config, q.shape[-1], causal)
    if key not in cache:  # "compile" once per config, as Triton does
        cache[key] = SimpleNamespace(n_regs=config.block_m, n_spills=0,
                                     metadata=SimpleNamespace(shared=1024 * config.block_n))
    return q * 2, q.sum(-1)


def test_block_sweep_hook_prefers_the_kernels_own_hook_and_adapts_forward():
    def own(*args):
        return args

    hook, how = bench.block_sweep_hook(SimpleNamespace(forward_with_config=own))
    assert hook is own and how.endswith("forward_with_config")

    Config = namedtuple("Config", "block_m block_n num_warps num_stages")
    kernels = SimpleNamespace(forward=_fake_forward, configs=SimpleNamespace(Config=Config))
    hook, how = bench.block_sweep_hook(kernels)
    assert "forward(config=...)" in how
    q = torch.randn(1, 2, 8, 16)
    for _ in range(2):  # the second call compiles nothing new: resources are remembered
        launched = hook(q, q, q, True, 0.25, 64, 32, 4, 3)
        assert torch.equal(launched[0], q * 2)
        assert bench.kernel_resources(launched) == {"n_regs": 64, "n_spills": 0,
                                                    "shared_bytes": 32768}

    hook, why = bench.block_sweep_hook(SimpleNamespace())
    assert hook is None and "forward_with_config" in why
