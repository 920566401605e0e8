"""``python -m flashbook.bench --peer``: a peer's file loaded, checked and divided by, on the CPU.

The peers are written here at test time (no peer code lives in the repository): a float64
softmax attention, the same returning a tuple, one with the wrong scale, one that raises
on causal shapes, one whose gradients are wrong on non-causal shapes (as the Triton
tutorial's backward, which is causal-only), one without autograd.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from flashbook import bench
from flashbook.bench import peer as peer_mod

from conftest import ROOT

PEERS = '''
import torch

def attention(q, k, v, causal, sm_scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * sm_scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v.double()).to(q.dtype)

def as_tuple(q, k, v, causal, sm_scale):
    return attention(q, k, v, causal, sm_scale), "extra"

def wrong_scale(q, k, v, causal, sm_scale):
    return attention(q, k, v, causal, 1.5 * sm_scale)

def refuses_causal(q, k, v, causal, sm_scale):
    if causal:
        raise RuntimeError("this peer does not do causal")
    return attention(q, k, v, causal, sm_scale)

def causal_only_backward(q, k, v, causal, sm_scale):
    o = attention(q, k, v, causal, sm_scale)
    # the same values; gradients 1.5x too large when not causal
    return o if causal else o.detach() + 1.5 * (o - o.detach())

def no_grad(q, k, v, causal, sm_scale):
    with torch.no_grad():
        return attention(q, k, v, causal, sm_scale)

NOT_A_FUNCTION = 3

if __name__ == "__main__":
    raise SystemExit("the __main__ block must not run")
'''


@pytest.fixture
def peer_file(tmp_path):
    path = tmp_path / "peer_attention.py"
    path.write_text(PEERS)
    return path


def _timer(fn, backward=False):
    """One call's wall time in ms: stands in for CUDA events on the CPU."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3 + 1e-3


#: Small shapes: batch 1, 2 heads, N 32, d 16, full and causal.
SHAPES = bench.peer_shapes((32,), (16,), (False, True), heads=2)


def _compare(peer_file, func, rng):
    """The peer ``func`` beside plain PyTorch (standing in for flashbook) in fp32 on the CPU."""
    peer = bench.load_peer(f"{peer_file}:{func}")
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return bench.compare(peer, SHAPES, torch.float32, "fp32", timer=_timer, device="cpu",
                         generator=gen, impls={"flashbook": bench.naive_attention})


def _rows(results):
    return {(r.impl, r.causal): r for r in results}


def test_load_peer_names_the_function_and_hashes_the_file(peer_file):
    spec = bench.load_peer(str(peer_file))
    assert spec.func == "attention" and spec.path == str(peer_file)
    assert spec.sha256 == hashlib.sha256(peer_file.read_bytes()).hexdigest()
    assert spec.module_name.startswith("_flashbook_peer_")   # not __main__: that block did not run
    assert bench.load_peer(f"{peer_file}:as_tuple").func == "as_tuple"
    assert bench.split_peer("a/b.py") == ("a/b.py", "attention")
    assert bench.split_peer("a/b.py:fwd") == ("a/b.py", "fwd")
    assert bench.split_peer("c:/x/b.py") == ("c:/x/b.py", "attention")


@pytest.mark.parametrize("suffix,error,message", [
    ("missing.py", ValueError, "no file at"),
    ("peer.txt", ValueError, "expected a Python file ending in .py"),
    ("peer_attention.py:nothing", ValueError, "has no 'nothing'; callables there: as_tuple"),
    ("peer_attention.py:NOT_A_FUNCTION", TypeError, "is of type int, not callable"),
    ("peer_attention.py:2x", ValueError, "FUNC a Python name"),
    ("broken.py", ValueError, "raised ZeroDivisionError"),
])
def test_bad_peers_are_named(peer_file, suffix, error, message):
    (peer_file.parent / "peer.txt").write_text("x = 1\n")
    (peer_file.parent / "broken.py").write_text("1 / 0\n")
    with pytest.raises(error, match=message):
        bench.load_peer(str(peer_file.parent / suffix))


@pytest.mark.parametrize("suffix,message", [
    ("missing.py", "argument --peer: no file at"),
    ("peer_attention.py:NOT_A_FUNCTION", "argument --peer: "),
])
def test_bad_peer_arguments_exit_2(peer_file, suffix, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--peer", str(peer_file.parent / suffix)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--peer", str(peer_file), "--ladder"])


def test_peer_shapes_are_the_issues_table_and_options_override_them(peer_file):
    args = bench.parse_args(["--peer", str(peer_file)])
    assert args.dtype == "fp16" and bench.parse_args([]).dtype == "bf16"
    assert len(args.shapes) == 2 * 3 * 2
    for s in args.shapes:
        assert s.batch == 1 and s.heads * s.seq == 16 * 16384
    assert {(s.seq, s.heads) for s in args.shapes} == {(1024, 256), (4096, 64), (16384, 16)}
    custom = bench.parse_args(["--peer", f"{peer_file}:as_tuple", "--seq", "2K", "--head-dim",
                               "128", "--causal", "yes", "--dtype", "bf16", "--heads", "4"])
    assert [(s.seq, s.head_dim, s.causal, s.heads) for s in custom.shapes] == [(2048, 128, True, 4)]
    assert custom.dtype == "bf16" and custom.peer.func == "as_tuple"


def test_a_correct_peer_passes_and_is_divided_by(peer_file, rng):
    results = _compare(peer_file, "as_tuple", rng)
    assert [r.impl for r in results] == ["peer", "flashbook"] * 2
    for r in results:
        assert (r.fwd_status, r.bwd_status, r.fwd_check, r.bwd_check) == ("ok", "ok", "pass", "pass"), r.note
        assert r.err_out < 1e-6 and r.err_grad < 1e-6   # fp32 against float64
        assert r.fwd_tflops == pytest.approx(bench.Shape(1, 2, 32, 16, r.causal).flops_fwd
                                             / (r.fwd_ms * 1e-3) / 1e12)
    rows = _rows(results)
    for causal in (False, True):
        peer, fb = rows["peer", causal], rows["flashbook", causal]
        assert peer.fwd_vs_peer == 1.0 and peer.bwd_vs_peer == 1.0
        assert fb.fwd_vs_peer == pytest.approx(peer.fwd_ms / fb.fwd_ms)
        assert fb.bwd_vs_peer == pytest.approx(peer.bwd_ms / fb.bwd_ms)
    table = bench.format_peer_table(results)
    assert "d=16 N=32 causal H=2" in table and f"{rows['flashbook', True].fwd_vs_peer:.2f}" in table


def test_the_first_shape_is_measured_twice_and_recorded_once(peer_file, rng):
    calls = []

    def counting_timer(fn, backward=False):
        calls.append(fn)
        return _timer(fn)

    peer = bench.load_peer(f"{peer_file}:attention")
    kw = dict(timer=counting_timer, device="cpu", impls={"flashbook": bench.naive_attention})
    results = bench.compare(peer, SHAPES, torch.float32, "fp32", **kw)
    with_warmup = len(calls)
    calls.clear()
    again = bench.compare(peer, SHAPES, torch.float32, "fp32", warmup=False, **kw)
    # 2 shapes x 2 implementations x (fwd, bwd) timings, plus the thrown-away first shape
    assert len(calls) == 8 and with_warmup == 12
    assert [(r.impl, r.causal) for r in results] == [(r.impl, r.causal) for r in again]
    assert [(r.impl, r.causal) for r in results] == [("peer", False), ("flashbook", False),
                                                      ("peer", True), ("flashbook", True)]


@pytest.mark.slow(seconds=16)
def test_wrong_raising_and_backward_less_peers_are_recorded_per_row(peer_file, rng):
    wrong = _rows(_compare(peer_file, "wrong_scale", rng))
    for causal in (False, True):
        p = wrong["peer", causal]
        assert p.fwd_check == "FAIL" and p.note.startswith("o: max error") and p.fwd_ms > 0
        assert wrong["flashbook", causal].fwd_check == "pass"
        assert wrong["flashbook", causal].fwd_vs_peer is None   # nothing divides by a wrong row

    raising = _rows(_compare(peer_file, "refuses_causal", rng))
    assert raising["peer", False].fwd_status == "ok" and raising["peer", False].fwd_check == "pass"
    p = raising["peer", True]
    assert (p.fwd_status, p.bwd_status, p.fwd_ms) == ("error", "not-run", None)
    assert "fwd: RuntimeError: this peer does not do causal" in p.note
    assert raising["flashbook", True].fwd_check == "pass"        # the comparison went on

    half = _rows(_compare(peer_file, "causal_only_backward", rng))
    assert (half["peer", True].fwd_check, half["peer", True].bwd_check) == ("pass", "pass")
    p = half["peer", False]
    assert (p.fwd_check, p.bwd_check) == ("pass", "FAIL") and p.note.startswith("dq: max error")
    assert half["flashbook", False].fwd_vs_peer is not None
    assert half["flashbook", False].bwd_vs_peer is None

    nograd = _rows(_compare(peer_file, "no_grad", rng))
    p = nograd["peer", True]
    assert (p.fwd_check, p.bwd_status, p.bwd_ms) == ("pass", "unsupported", None)
    assert "no autograd graph" in p.note
    for r in nograd.values():
        assert r.fwd_status in bench.STATUSES and r.bwd_status in bench.STATUSES


def test_the_real_kernels_run_beside_the_peer_in_fp16(peer_file, rng):
    """flashbook's kernel (Triton interpreter) and SDPA's flash backend on the CPU, fp16:
    both pass the harness's rule, and the wrong peer does not."""
    peer = bench.load_peer(f"{peer_file}:wrong_scale")
    results = bench.compare(peer, SHAPES[1:], torch.float16, "fp16", timer=_timer, device="cpu",
                            generator=torch.Generator().manual_seed(int(rng.integers(2**31))))
    rows = _rows(results)
    assert [r.impl for r in results] == ["peer", "flashbook", "sdpa-flash", "flashbook-gluon"]
    # the Gluon kernel needs a Hopper GPU: on this machine its rows say why it did not run
    assert rows["flashbook-gluon", True].fwd_status == "unavailable"
    assert "Hopper" in rows["flashbook-gluon", True].note
    assert rows["flashbook", True].fwd_check == "pass", rows["flashbook", True].note
    assert rows["flashbook", True].bwd_check == "pass", rows["flashbook", True].note
    assert rows["peer", True].fwd_check == "FAIL"
    assert rows["sdpa-flash", True].fwd_status in ("ok", "unsupported")


def test_csv_and_provenance_name_the_peer_file(peer_file, tmp_path, rng):
    argv = ["--peer", f"{peer_file}:attention", "--seq", "32", "--head-dim", "16", "--heads", "2"]
    args = bench.parse_args(argv)
    results = _compare(peer_file, "attention", rng)
    path = bench.write_csv(results, tmp_path / "out" / "peer.csv", bench.PEER_FIELDS)
    back = bench.read_csv(path)
    assert [r["impl"] for r in back] == [r.impl for r in results]
    assert list(back[0]) == bench.PEER_FIELDS
    fb = next(r for r in back if r["impl"] == "flashbook" and r["causal"])
    assert fb["fwd_status"] == "ok" and fb["fwd_check"] == "pass"
    assert fb["fwd_vs_peer"] == next(r.fwd_vs_peer for r in results
                                     if r.impl == "flashbook" and r.causal)
    prov = bench.peer_provenance(bench.collect_provenance(argv, args), args)
    written = bench.write_provenance(prov, tmp_path / "out" / "provenance.json")
    prov = json.loads(written.read_text())
    assert prov["peer"]["sha256"] == hashlib.sha256(peer_file.read_bytes()).hexdigest()
    assert prov["peer"]["path"] == str(peer_file) and prov["peer"]["function"] == "attention"
    assert prov["command"].startswith("python -m flashbook.bench --peer ")
    assert prov["settings"]["impl"] == ["peer", "flashbook", "flashbook-gluon", "sdpa-flash"]
    assert prov["settings"]["dtype"] == "fp16" and "peer.csv" in prov["files"]


def test_graph_timing_is_an_option_the_provenance_names(peer_file):
    """--graph replays each call from a CUDA graph (the GPU's work alone); the record says
    which way a run was timed, and the default is the call as Python makes it."""
    for extra, graph, replay in (([], False, "each call as Python makes it"),
                                 (["--graph"], True, "a CUDA graph of each forward call")):
        argv = ["--peer", str(peer_file), "--seq", "1K", *extra]
        args = bench.parse_args(argv)
        assert args.graph is graph
        assert bench.collect_provenance(argv, args)["timing"]["replay"].startswith(replay)
    assert bench.parse_args(["--quick", "--graph"]).graph is True
    # the timer is told which calls are backward passes (those are never captured)
    flags = []

    def timer(fn, backward=False):
        flags.append(backward)
        return _timer(fn)

    peer = bench.load_peer(f"{peer_file}:attention")
    results = bench.compare(peer, SHAPES[:1], torch.float32, "fp32", timer=timer, device="cpu",
                            impls={"flashbook": bench.naive_attention}, warmup=False)
    assert all(r.bwd_status == "ok" for r in results)
    assert flags == [False, True] * len(results)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_cli_with_a_peer_and_no_gpu_says_so_and_writes_nothing(peer_file, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "flashbook.bench", "--peer", str(peer_file),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    assert "No CUDA GPU on this machine" in done.stdout and "Traceback" not in done.stderr
    assert not out.exists()


def test_the_peer_module_keeps_under_700_lines():
    import inspect

    assert len(inspect.getsource(peer_mod).splitlines()) < 700


def test_recorded_peer_runs_read_back_with_independent_ratios():
    """Chapter 10's tables: flashbook over the peer is the peer's time over ours, from the
    CSV's own ms columns, and no ratio where either side failed the float64 check."""
    import csv

    for name in bench.PEER_RUNS:
        frame, prov = bench.load_peer_run(name)
        assert frame is not None and prov["peer"]["sha256"], name
        table = bench.peer_ratio_table(frame)
        raw = list(csv.DictReader(open(bench.run_path(bench.PEER_RUNS[name]) / "peer.csv")))
        for _, row in table.iterrows():
            pick = {r["impl"]: r for r in raw if (int(r["seq"]), int(r["head_dim"]), r["causal"] == "True")
                    == (row["seq"], row["head_dim"], row["causal"])}
            for impl, column in (("flashbook", "flashbook_over_peer"), ("flashbook-gluon", "gluon_over_peer")):
                if impl not in pick:
                    assert column not in table or row[column] != row[column], (name, impl)
                    continue
                peer, ours, pass_ = pick["peer"], pick[impl], row["pass"]
                passed = all(r[f"{pass_}_check"] == "pass" for r in (peer, ours))
                if passed:
                    assert row[column] == pytest.approx(float(peer[f"{pass_}_ms"]) / float(ours[f"{pass_}_ms"]))
                else:
                    assert row[column] != row[column]   # NaN
    with pytest.raises(ValueError, match="name must be one of"):
        bench.load_peer_run("tutorials")
