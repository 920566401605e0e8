"""flashbook.runtime decides GPU vs interpreter before triton is imported."""
import os
import subprocess
import sys

import pytest

from flashbook import runtime


def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                          text=True, env=full_env, timeout=120)


@pytest.mark.skipif(runtime.HAS_CUDA, reason="this checks the CPU path (no CUDA here)")
def test_interpreter_is_chosen_before_triton_import():
    r = _run("import flashbook, os, triton; print(os.environ['TRITON_INTERPRET'], "
             "flashbook.runtime.INTERPRET, flashbook.runtime.device())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True", "cpu"]


@pytest.mark.skipif(runtime.HAS_CUDA, reason="this checks the CPU path (no CUDA here)")
def test_warns_when_triton_was_imported_first():
    r = _run("import triton, flashbook; print(flashbook.runtime.INTERPRET)")
    assert r.returncode == 0, r.stderr
    assert "Import flashbook first" in r.stderr
    assert r.stdout.strip() == "False"
    assert "cannot run" in _run("import triton, flashbook; print(flashbook.runtime.describe())").stdout


def test_user_choice_is_respected():
    r = _run("import flashbook; print(flashbook.runtime.INTERPRET)", TRITON_INTERPRET="1")
    assert r.stdout.strip() == "True"


def test_numpy_chapters_do_not_import_triton():
    r = _run("import sys, flashbook, flashbook.reference; print('triton' in sys.modules)")
    assert r.stdout.strip() == "False", r.stderr


def test_chip_facts_are_consistent():
    for name, c in runtime.CHIPS.items():
        assert c.name == name
        assert 0 < c.smem_per_block_kib <= c.smem_per_sm_kib
        assert c.arch in ("sm_75", "sm_80", "sm_90")
        assert c.hbm_tb_s > 0 and c.fp16_tflops > 0 and c.source
    assert runtime.chip("T4").bf16_tflops is None          # Turing: no bf16 tensor cores
    assert runtime.chip("H200").smem_per_block_bytes == 227 * 1024
    # H100 and H200 share the processor; only memory size and bandwidth differ
    h100, h200 = runtime.chip("H100"), runtime.chip("H200")
    assert h100.fp16_tflops == h200.fp16_tflops and h200.hbm_tb_s > h100.hbm_tb_s
    assert h200.ridge_flop_per_byte == pytest.approx(989e12 / 4.8e12)
    with pytest.raises(ValueError, match="chip must be one of"):
        runtime.chip("V100")


def test_interpreter_problem_names_the_fix(monkeypatch):
    import importlib.metadata
    import numpy
    real_version = importlib.metadata.version
    assert runtime.interpreter_problem() is None  # this environment works
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "3.6.0" if name == "triton" else real_version(name))
    monkeypatch.setattr(numpy, "__version__", "2.4.1")
    assert "triton>=3.7.1" in runtime.interpreter_problem()
    monkeypatch.setattr(numpy, "__version__", "2.3.5")
    assert runtime.interpreter_problem() is None
    # a triton below the measured floor: named, with the fix, whatever numpy is
    floor = runtime.INTERPRETER_TRITON_FLOOR
    major, minor = (int(x) for x in floor.split(".")[:2])
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: f"{major}.{minor - 1}.0" if name == "triton" else real_version(name))
    problem = runtime.interpreter_problem()
    assert f"triton {major}.{minor - 1}.0 is too old" in problem and f"triton>={floor}" in problem


def test_fp32_and_exp_rates_match_the_datasheets():
    # non-tensor fp32 peaks printed on the datasheets, TFLOP/s (T4 8.1, A100 19.5, H100 SXM 67)
    for name, printed in (("T4", 8.1), ("A100", 19.5), ("H100", 67.0)):
        assert runtime.chip(name).fp32_tflops == pytest.approx(printed, rel=0.01), name
    a100 = runtime.chip("A100")
    # the special-function unit gives 16 exponentials per clock per SM, a quarter of the
    # 64 fp32 FMAs: so an exp costs 4 FMA slots, and 8 of the datasheet's FLOPs
    assert a100.fp32_tflops * 1e12 / a100.exp_per_s == pytest.approx(8.0)


def test_dot_rate_is_fma_on_sm75_and_tensor_cores_after():
    assert runtime.chip("T4").dot_tflops == runtime.chip("T4").fp32_tflops
    for name in ("A100", "H100", "H200"):
        assert runtime.chip(name).dot_tflops == runtime.chip(name).fp16_tflops


def test_hbm_is_in_binary_gigabytes():
    # The H200 run's driver reported this many bytes (benchmarks/results provenance):
    # more than 141e9, so the datasheet's "141 GB" must mean 141 * 2**30 bytes, of which
    # the driver keeps a little for itself.
    reported = 150_109_880_320
    h200 = runtime.chip("H200")
    assert h200.hbm_gib == 141 and 141e9 < reported <= h200.hbm_bytes
    assert reported / h200.hbm_bytes > 0.99
