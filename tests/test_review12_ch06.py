"""Chapter 6, a twelfth reading: TF32 does not exist on a T4, the T4's roofline claim is a prediction,
the L2 paragraph names its profile and what it measured, the register spill is measured, and the
softmax timing, its second recording and exercise 3's answer are read from the recorded tables.
A thirteenth: the stages' gain where one program fills the SM, the spill's confounded comparison and
its counter-examples, the timed (not profiled) rate, and the issue cap of the compiled loop, each
recomputed here from the recorded files."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from flashbook import runtime, tiled
from notebook_text import cell_source, flat, run_glued

NOTEBOOK = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")

# compiles the chapter's own tile matmul (fp32 inputs) for a T4 and an A100 with both precisions
_COMPILE = textwrap.dedent('''
    import json, re, sys, importlib.util
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = importlib.util.spec_from_file_location("mm", sys.argv[1])
    mm = importlib.util.module_from_spec(spec); spec.loader.exec_module(mm)
    ints = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()
    sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", **{k: "i32" for k in ints},
           **{k: "constexpr" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "INPUT_PRECISION")}}
    out = {}
    for cc in (75, 80):
        for prec in ("tf32", "ieee"):
            src = ASTSource(mm.matmul_kernel, sig, constexprs={"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16,
                                                               "INPUT_PRECISION": prec})
            ptx = triton.compile(src, target=GPUTarget("cuda", cc, 32)).asm["ptx"]
            out[f"{cc} {prec}"] = {"mma": len(re.findall(r"\\bmma\\.sync", ptx)),
                                   "tf32_mma": len(re.findall(r"mma\\.sync[^\\n]*tf32", ptx)),
                                   "fma": len(re.findall(r"fma\\.rn\\.f32", ptx)),
                                   "body": re.sub(r"^//.*$", "", ptx, flags=re.M)}
    print(json.dumps(out))
''')


@pytest.mark.slow(seconds=30)
def test_on_a_t4_tf32_and_ieee_compile_to_the_same_fma_code(tmp_path):
    """sm_75 has no TF32 path: the chapter's tile matmul on fp32 inputs compiles to fp32 FMAs and no
    mma whatever input_precision says (the same PTX), while sm_80's tf32 build uses TF32 mma. So a
    T4 prints a difference of 0 between the two, as the interpreter does; the page says so."""
    code = cell_source(NOTEBOOK, "100d662a").split("\n\n\ndef matmul(")[0]
    kernel = tmp_path / "mm.py"
    kernel.write_text("import triton\nimport triton.language as tl\n\n" + code + "\n")
    script = tmp_path / "compile.py"
    script.write_text(_COMPILE)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(script), str(kernel)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["75 tf32"]["mma"] == got["75 ieee"]["mma"] == 0
    assert got["75 tf32"]["fma"] == got["75 ieee"]["fma"] > 0
    assert got["75 tf32"]["body"] == got["75 ieee"]["body"]
    assert got["80 tf32"]["tf32_mma"] > 0 and got["80 ieee"]["mma"] == 0
    bullet = flat(cell_source(NOTEBOOK, "cdcabe1c"))
    assert ("On an A100 or newer, `tl.dot` on fp32 inputs uses TF32 by default (fp32's range, a much shorter "
            "mantissa); the interpreter multiplies in full fp32, as a T4 does (plain FMAs).") in bullet
    assert "On a GPU, `tl.dot` on fp32 inputs uses TF32" not in bullet
    assert "In the interpreter and on a T4, TF32 and IEEE give the same bits." in flat(cell_source(NOTEBOOK, "d6f03cff"))


def _sweep():
    """The recorded H200 block sweep (blocks.csv), as chapters 6 and 9 read it."""
    from flashbook import bench

    return bench.load_results(bench.latest_blocks())[0]


def _row(blocks, d, bm, bn, warps, stages):
    rows = blocks[(blocks["head_dim"] == d) & (blocks["block_m"] == bm) & (blocks["block_n"] == bn)
                  & (blocks["num_warps"] == warps) & (blocks["num_stages"] == stages) & ~blocks["causal"]]
    assert len(rows) == 1 and rows.iloc[0]["status"] == "ok"
    return rows.iloc[0]


def test_the_l2_paragraph_names_its_profile_and_shows_memory_is_not_the_limit():
    """The H200 profile (bf16, B 8, H 16, N 4096, d 128): Q, K, V read once (402.7 MB), 90% L2 hits,
    DRAM at 5% of peak, tensor pipe busy 54%. Its time (2.16 ms, 508 TFLOP/s) is one replay with clocks
    not locked, so the rate quoted is the same kernel timed in the block sweep (a median): 128 x 64
    tiles, 8 warps, 3 stages, 2.239 ms = 491 TFLOP/s, 50% of 989."""
    import math

    import pandas as pd

    from flashbook import bench

    glued, _ = run_glued([cell_source(NOTEBOOK, "4e2b8eb3"), cell_source(NOTEBOOK, "28a19756")], quiet=True,
                         math=math, pd=pd, FP16_BYTES=2, chips=runtime.CHIPS, t4=runtime.chip("T4"), bench=bench)
    assert glued["ncu_chip"] == "H200" and glued["ncu_shape"] == "batch 8, 16 heads, N = 4096, d = 128, bfloat16"
    assert (glued["ncu_dram"], glued["ncu_l2"], glued["ncu_dram_pct"], glued["ncu_tensor_pct"]) == (
        "402.7", "90", "5", "54")
    assert (glued["timed_tflops"], glued["timed_roof_pct"], glued["ncu_peak"]) == ("491", "50", "989")
    assert "ncu_tflops" not in glued and "ncu_roof_pct" not in glued
    flops = 4 * 8 * 16 * 4096 ** 2 * 128
    assert round(flops / 2163.296e-6 / 1e12) == 508          # the profile's one replay: not quoted
    # the sweep's row is the profiled kernel: same registers, shared memory, warps and B_r
    from flashbook.bench import profiles

    prof = max((k for k in profiles.kernel_rows(bench.run_path("kernel_ncu")) if k["impl"] == "triton"
                and k["pass_"] == "forward" and k["dim"] == 128 and not k["causal"]), key=lambda k: k[profiles.TIME])
    row = _row(_sweep(), 128, 128, 64, 8, 3)
    assert (prof["launch__registers_per_thread"], prof["launch__shared_mem_per_block_dynamic"]) == (
        row["n_regs"], row["shared_bytes"]) == (183, 131072)
    assert profiles.launch_extent(prof) == 8 * 32 and 4096 // profiles.launch_extent(prof, "Grid Size") == 128
    assert round(row["fwd_ms"], 3) == 2.239 and round(flops / (row["fwd_ms"] * 1e-3) / 1e12) == 491
    assert round(100 * row["fwd_tflops"] / 989) == 50
    prose = flat(cell_source(NOTEBOOK, "5f5032c5"))
    assert ("shows it on an {glue:text}`ncu_chip` ({glue:text}`ncu_shape`; no T4 profile is recorded)") in prose
    assert ("HBM runs at {glue:text}`ncu_dram_pct`% of its peak while the tensor cores are busy "
            "{glue:text}`ncu_tensor_pct`% of the time: memory is not the limit. Timed in chapter 9's block sweep "
            "(a median), the kernel reaches {glue:text}`timed_tflops` TFLOP/s, {glue:text}`timed_roof_pct`% of "
            "the {glue:text}`ncu_chip`'s {glue:text}`ncu_peak`") in prose
    assert "and the L2 cache keeps it there" not in prose and "most repeats never reach HBM" not in prose


def _tiles_glued():
    import pandas as pd
    import torch

    from flashbook import bench

    glued, _ = run_glued([cell_source(NOTEBOOK, c) for c in ("c1447319", "dc4a6996", "c06dc4a7")], quiet=True,
                         torch=torch, pd=pd, tiled=tiled, chips=runtime.CHIPS, runtime=runtime,
                         h100=runtime.chip("H100"), bench=bench)
    return glued


def test_the_register_spill_is_the_recorded_block_sweeps():
    """blocks.csv (H200, bf16, N 4096, d 128, 128 x 128, 2 stages): 4 warps spill 134 values per thread
    and reach 228 TFLOP/s; 8 warps spill none and reach 479, 2.1 times as fast. That is not the spill's
    cost alone: one program fits an SM either way (160 KiB of shared memory), so 8 warps also double
    the SM's warps; and elsewhere in the sweep 4 warps that spill keep pace (30 values at 128 x 64:
    411 against 415 TFLOP/s) or lead (42 values at d = 64: 387 against 317). The 8-warp kernel uses
    255 registers a thread, not the 128 that S and O take."""
    glued = _tiles_glued()
    assert (glued["spill_chip"], glued["spill_stages"], glued["spill_values"]) == ("H200", "2", "134")
    assert (glued["spill_tf_few"], glued["spill_ratio"]) == ("228", "2.1")
    assert (glued["reg_B"], glued["reg_d"], glued["warps_few"], glued["warps_many"]) == (128, 128, 4, 8)
    prose = flat(cell_source(NOTEBOOK, "3f12ef78"))
    box = prose[prose.index(":::{dropdown} Measured on an H200: stages and spills (chapters 7 and 9) (optional)"):]
    assert ("block sweep on an {glue:text}`spill_chip` (bf16)") in box
    assert ("At {glue:text}`spill_stages` stages, {glue:text}`warps_few` warps spill {glue:text}`spill_values` values "
            "per thread at 128 × 128 and run at {glue:text}`spill_tf_few` TFLOP/s; {glue:text}`warps_many` spill none and "
            "run {glue:text}`spill_ratio` times as fast, but also double the SM's warps.") in box
    assert ("Elsewhere at {glue:text}`spill_stages` stages, 4 spilling warps match 8 or beat them: "
            "{glue:text}`spill_half_tf_few` against {glue:text}`spill_half_tf_many` TFLOP/s with "
            "{glue:text}`spill_half_values` values spilled (128 × 64), {glue:text}`spill_d64_tf_few` "
            "against {glue:text}`spill_d64_tf_many` with {glue:text}`spill_d64_values` ($d$ = 64).") in box
    # not generalised from the 2-stage rows: the same 128 x 64 kernel at 3 stages
    assert ("At 3 stages the same 128 × 64 kernel, still spilling {glue:text}`spill_half3_values`, runs at "
            "{glue:text}`spill_half3_tf_few` against {glue:text}`spill_half3_tf_many`: its {glue:text}`spill_half3_smem` "
            "bytes of shared memory fit one 4-warp program per SM, against two at 2 stages ({glue:text}`spill_half_smem`), "
            "so half the 8-warp kernel's warps per SM, not as many. The spill count alone does not predict the time.") in box
    # residency changes with the stages (the sweep's shared_bytes; the cell asserts two fit at 2 stages, one at 3)
    assert (glued["spill_half3_smem"], glued["spill_half_smem"]) == ("131,072", "98,304")
    assert "4 warps that spill run about as fast as 8 or faster" not in prose
    assert "So large tiles run with more warps" not in prose       # the sweep does not say so
    assert ("Over {glue:text}`warps_many` warps, {glue:text}`regs_w8` each; compiled (chapter 9's sweep), the forward "
            "uses {glue:text}`spill_regs_many` in all, as $S$ and $O$ are not all it holds, and spills nothing.") in prose
    assert (glued["spill_half_values"], glued["spill_half_tf_few"], glued["spill_half_tf_many"]) == ("30", "411", "415")
    assert (glued["spill_d64_values"], glued["spill_d64_tf_few"], glued["spill_d64_tf_many"]) == ("42", "387", "317")
    assert glued["spill_regs_many"] == "255"
    # recomputed from the file
    blocks = _sweep()
    few, many = _row(blocks, 128, 128, 128, 4, 2), _row(blocks, 128, 128, 128, 8, 2)
    assert (few["n_spills"], many["n_spills"], many["n_regs"]) == (134, 0, 255)
    assert round(many["fwd_tflops"] / few["fwd_tflops"], 2) == 2.10
    h200 = runtime.chip("H200")
    assert all(2 * (r["shared_bytes"] + 1024) > 1024 * h200.smem_per_sm_kib for r in (few, many))   # one program
    for d, bn, spilled in ((128, 64, 30), (64, 128, 42)):
        f4, f8 = _row(blocks, d, 128, bn, 4, 2), _row(blocks, d, 128, bn, 8, 2)
        assert (f4["n_spills"], f8["n_spills"]) == (spilled, 0)
    assert round(_row(blocks, 64, 128, 128, 4, 2)["fwd_tflops"]) == 387 > round(_row(blocks, 64, 128, 128, 8, 2)["fwd_tflops"]) == 317


def test_exercise_3_is_answered_from_the_recorded_table():
    """4096 x 4096 fp16 in and out: 67.1 MB / 3.35 TB/s = 20.0 us; the H100's 2226 GB/s at 4096 columns
    mean 30.1 us, 66% of the datasheet bandwidth."""
    glued, _ = run_glued(cell_source(NOTEBOOK, "c06-softmax-glue"), CPU=True, chips=runtime.CHIPS, ratio=4.0)
    assert (glued["ex3_bound_us"], glued["ex3_gbs"], glued["ex3_us"], glued["ex3_pct"]) == ("20.0", "2226", "30.1", "66")
    assert round(2 * 4096 * 4096 * 2 / 3.35e12 * 1e6, 1) == 20.0 and round(67.108864e6 / 2226e9 * 1e6, 1) == 30.1
    check = flat(cell_source(NOTEBOOK, "dedefdd7"))
    assert ("at 4096 × 4096 fp16, a bound of {glue:text}`ex3_bound_us` µs against {glue:text}`ex3_us` µs measured "
            "({glue:text}`ex3_gbs` GB/s, {glue:text}`ex3_pct`% of the datasheet bandwidth)") in check
    assert "the check cell also times" not in flat(cell_source(NOTEBOOK, "9cb87bad"))


def test_the_stages_gain_where_one_program_fills_the_sm():
    """Chapter 7's d = 128 forward (128 x 64, 8 warps) as profiled: ncu's occupancy limits by registers and
    by shared memory are both 1 program per SM (8 of 64 warps active), so no other program hides a
    2-stage wait. The sweep: 3 stages against 2, 491 against 415 TFLOP/s (2.649 / 2.239 ms: 18%); at
    128 x 128, also one program per SM (255 registers x 256 threads), only 1% (483 against 479)."""
    from flashbook import bench
    from flashbook.bench import profiles

    glued = _tiles_glued()
    assert glued["prof_programs"] == "one"
    assert (glued["st_tf2"], glued["st_tf3"], glued["st_gain"]) == ("415", "491", "18")
    assert (glued["st_big_tf2"], glued["st_big_tf3"], glued["st_big_gain"]) == ("479", "483", "1")
    prof = max((k for k in profiles.kernel_rows(bench.run_path("kernel_ncu")) if k["impl"] == "triton"
                and k["pass_"] == "forward" and k["dim"] == 128 and not k["causal"]), key=lambda k: k[profiles.TIME])
    assert prof["launch__occupancy_limit_registers"] == prof["launch__occupancy_limit_shared_mem"] == 1
    assert round(prof["sm__warps_active.avg.pct_of_peak_sustained_active"]) == round(100 * 8 / 64)
    blocks = _sweep()
    s2, s3 = _row(blocks, 128, 128, 64, 8, 2), _row(blocks, 128, 128, 64, 8, 3)
    assert round(100 * (s2["fwd_ms"] / s3["fwd_ms"] - 1)) == 18 and (round(s2["fwd_tflops"]), round(s3["fwd_tflops"])) == (415, 491)
    b2, b3 = _row(blocks, 128, 128, 128, 8, 2), _row(blocks, 128, 128, 128, 8, 3)
    assert round(100 * (b2["fwd_ms"] / b3["fwd_ms"] - 1)) == 1 and (round(b2["fwd_tflops"]), round(b3["fwd_tflops"])) == (479, 483)
    for r in (s2, s3, b2, b3):                      # two programs' registers exceed an SM's 65,536
        assert 2 * r["n_regs"] * 256 > 65536
    main = flat(cell_source(NOTEBOOK, "c06-buffers-md"))
    assert ("Where no copy is under way, only other programs on the SM can hide the wait; chapter 9 times 3 "
            "stages against 2 (box below).") in main
    assert "st_gain" not in main and "barely at 2" not in main      # measured in the optional box
    measured = flat(cell_source(NOTEBOOK, "3f12ef78"))
    assert ("Chapter 7's forward at $d$ = 128 (128 × 64 tiles, 8 warps) runs alone on its SM: by registers and by "
            "shared memory, its profile allows {glue:text}`prof_programs` program per SM.") in measured
    assert ("3 stages run it {glue:text}`st_gain`% faster than 2 ({glue:text}`st_tf3` against {glue:text}`st_tf2` "
            "TFLOP/s). With 128 × 128 tiles, also alone, 3 stages gain {glue:text}`st_big_gain`% "
            "({glue:text}`st_big_tf3` against {glue:text}`st_big_tf2`), within the {glue:text}`st_noise`% by which "
            "identical kernels differ in chapter 9's H200 run, and {glue:text}`cs_gain`% in a second sweep at batch "
            "{glue:text}`cs_batch` ({glue:text}`cs_tf3` against {glue:text}`cs_tf2`), single medians each. Why the "
            "128 × 128 kernel loses less at 2 stages than the 128 × 64 one is not measured.") in measured
    assert "a few percent at most" not in measured
    box = flat(cell_source(NOTEBOOK, "49527e1d"))
    assert "copies overlap products; the box *Measured on an H200* times the gain." in box


def test_the_issue_cap_of_the_compiled_loop():
    """loop_sass_sm90_t36: chapter 10's shortest loop at d = 64 issues 291 instructions a trip for 32 scores
    a thread, 9.09 per score; an SM issues 4 warp instructions (128 thread instructions) a clock, so at
    most 128 / 9.09 = 14.1 scores a clock, below the tensor cores' 4096 / (4 * 64) = 16. At d = 128,
    364 / 32 = 11.38 per score: 11.2, above the tensor cores' 8."""
    import math

    import pandas as pd

    from flashbook.bench.score_ops import load_loops

    loops, _ = load_loops()
    full = {d: loops.xs((d, False), level=("head_dim", "causal")) for d in (64, 128)}
    shortest = {d: full[d].loc[full[d]["per_score"].idxmin()] for d in (64, 128)}
    assert [int(shortest[d]["instructions"]) for d in (64, 128)] == [291, 364]
    assert all(shortest[d]["scores_per_thread"] == 64 * 64 / 128 for d in (64, 128))
    assert round(128 / (291 / 32), 1) == 14.1 and 128 / (291 / 32) < 4096 / (4 * 64) == 16
    assert round(128 / (364 / 32), 1) == 11.3 and 128 / (364 / 32) > 4096 / (4 * 128) == 8
    glued, _ = run_glued([cell_source(NOTEBOOK, "4e2b8eb3"), cell_source(NOTEBOOK, "c064e2b9")], quiet=True,
                         math=math, pd=pd, FP16_BYTES=2, chips=runtime.CHIPS, h100=runtime.chip("H100"),
                         runtime=runtime)
    assert (glued["loop_ips_64"], glued["loop_cap_64"], glued["tc_scores_64"]) == ("9.1", "14", 16)
    assert (glued["loop_ips_128"], glued["loop_cap_128"], glued["tc_scores_128"]) == ("11.4", "11", 8)
    box = flat(cell_source(NOTEBOOK, "c06-exp-box"))
    assert ("an SM starts at most 4 warp instructions (128 thread instructions) per clock "
            "{cite}`nvidia_h100_whitepaper`. Chapter 10's shortest compiled loop at $d$ = 64 issues "
            "{glue:text}`loop_ips_64` thread instructions per score: at most {glue:text}`loop_cap_64` scores per clock, below the "
            "tensor cores' {glue:text}`tc_scores_64` (at $d$ = 128, {glue:text}`loop_ips_128` per score cap it at "
            "{glue:text}`loop_cap_128`, above their {glue:text}`tc_scores_128`).") in box


def test_the_cross_cells_name_the_next_tile_and_the_interpreter_cell_its_gpu_line():
    """256 x 256 tiles exceed an SM's 65,536 registers with S and O alone; 128 x 128 take 24,576 (d = 64)
    or 32,768 (d = 128). On a GPU the interpreter cell prints the tile matmul's registers and shared memory."""
    assert tiled.onchip_elements(128, 128, 64)["S/P"] + tiled.onchip_elements(128, 128, 64)["O"] == 24576
    assert tiled.onchip_elements(128, 128, 128)["S/P"] + tiled.onchip_elements(128, 128, 128)["O"] == 32768 <= 65536
    glued = _tiles_glued()
    assert (glued["reg_half_d64"], glued["reg_half_d128"]) == ("24,576", "32,768")
    model = flat(cell_source(NOTEBOOK, "c06-buffers-model"))
    assert ("In a ✗ cell, 128 fits shared memory and an SM's registers (its $S$ and $O$: at most "
            "{glue:text}`reg_half_d128` values); at $d$ = 128 it needs 8 warps to fit one thread's limit (below).") in model
    assert "fits both limits" not in model
    assert "compiled.n_regs" in cell_source(NOTEBOOK, "ce3d03a8")
    assert ("On a GPU it prints the tile matmul's registers and shared memory instead."
            in flat(cell_source(NOTEBOOK, "c2c73ece")))


def test_sweep_row_of_finds_the_profiled_kernel_and_nothing_else():
    """chapter6.sweep_row_of matches a profiled forward to the one sweep row with its shape, B_r, warps,
    registers and shared memory; a kernel no row matches (another register count) raises KeyError."""
    from flashbook import bench
    from flashbook.bench import chapter6

    prof = chapter6.profiled_forward(bench.run_path("kernel_ncu"), 128)
    row = chapter6.sweep_row_of(prof, _sweep())
    assert tuple(int(row[k]) for k in ("block_m", "block_n", "num_warps", "num_stages")) == (128, 64, 8, 3)
    with pytest.raises(KeyError):
        chapter6.sweep_row_of(dict(prof, **{"launch__registers_per_thread": 1.0}), _sweep())
    assert chapter6.profiled_forward(bench.run_path("kernel_ncu"), 64)["launch__occupancy_limit_registers"] == 2


def test_the_second_sweep_and_the_3_stage_spill_are_recomputed_from_the_files():
    """kernels_config_sweep_h200.csv (H200, Triton 3.6, bf16, N 4096, batch 4): 128 x 128 tiles, 8 warps, d 128,
    2 stages 1.1971 ms (459 TFLOP/s) against 3 stages 1.1384 ms (483): 5%, as the box says.
    blocks.csv at 3 stages, 128 x 64, d 128: 4 warps still spill 30 values and run at 284 TFLOP/s, 8 warps at
    491: the spill count alone does not predict the time."""
    import re

    import pandas as pd

    from flashbook import bench
    from flashbook.bench import chapter6

    glued = _tiles_glued()
    assert (glued["cs_batch"], glued["cs_tf2"], glued["cs_tf3"], glued["cs_gain"]) == ("4", "459", "483", "5")
    assert (glued["spill_half3_values"], glued["spill_half3_tf_few"], glued["spill_half3_tf_many"]) == ("30", "284", "491")
    path = bench.run_path("kernels_config_sweep")
    raw = pd.read_csv(path, comment="#")
    two = raw[(raw["kernel"] == "forward") & (raw["head_dim"] == 128) & ~raw["causal"]
              & (raw["config"] == "BM128-BN128-w8-s2")].iloc[0]
    three = raw[(raw["kernel"] == "forward") & (raw["head_dim"] == 128) & ~raw["causal"]
                & (raw["config"] == "BM128-BN128-w8-s3")].iloc[0]
    assert (round(two["tflops"]), round(three["tflops"])) == (459, 483)
    assert round(100 * (two["ms"] / three["ms"] - 1)) == 5
    header = open(path, encoding="utf-8").readline()
    assert "H200" in header and "triton 3.6.0" in header and re.search(r"batch=(\d+)", header).group(1) == "4"
    blocks = _sweep()
    f4, f8 = _row(blocks, 128, 128, 64, 4, 3), _row(blocks, 128, 128, 64, 8, 3)
    assert (f4["n_spills"], f8["n_spills"]) == (30, 0) and (round(f4["fwd_tflops"]), round(f8["fwd_tflops"])) == (284, 491)
    assert f4["n_spills"] == _row(blocks, 128, 128, 64, 4, 2)["n_spills"]     # the same spill as at 2 stages


def test_config_sweep_splits_the_config_and_refuses_another_form(tmp_path):
    """chapter6.config_sweep: BM<m>-BN<n>-w<warps>-s<stages> split into four int columns, the first line
    returned without its '#'; a config of another form raises ValueError."""
    from flashbook.bench import chapter6

    good = tmp_path / "s.csv"
    good.write_text("# GPU X, batch=2\nkernel,head_dim,causal,config,ms,tflops\nforward,64,False,BM64-BN32-w4-s3,1.5,10.0\n")
    rows, header = chapter6.config_sweep(good)
    assert header == "GPU X, batch=2"
    assert rows.loc[0, ["block_m", "block_n", "num_warps", "num_stages"]].tolist() == [64, 32, 4, 3]
    bad = tmp_path / "b.csv"
    bad.write_text("# x\nkernel,head_dim,causal,config,ms,tflops\nforward,64,False,auto,1.5,10.0\n")
    with pytest.raises(ValueError):
        chapter6.config_sweep(bad)


def test_the_laptop_sentence_names_the_gluon_exception_and_the_launch_defaults():
    """Chapter 10's Gluon kernel needs a Hopper GPU; Triton 3.6's CUDA options default to 4 warps and 3 stages."""
    assert ("Every Triton kernel in this book runs on a laptop, except chapter 10's Gluon kernel, which needs a "
            "Hopper GPU (its page shows a recorded run).") in flat(cell_source(NOTEBOOK, "cdcabe1c"))
    from triton.backends.nvidia.compiler import CUDAOptions

    assert (CUDAOptions.num_warps, CUDAOptions.num_stages) == (4, 3)
    assert ("Unset, they are 4 warps and 3 stages (Triton's defaults on NVIDIA GPUs), as in the tile matmul."
            in flat(cell_source(NOTEBOOK, "8951c53c")))
    ai = 4 * 4096 ** 2 * 64 / (2 * (4 * 4096 * 64 + 4 * 4096 ** 2))
    assert f"{ai:.1f}" == "31.5" and "{glue:text}`ai_naive:.1f` FLOPs per byte" in flat(cell_source(NOTEBOOK, "5f5032c5"))
    assert "the roofline predicts it memory-bound" in flat(cell_source(NOTEBOOK, "5f5032c5"))


# a fourteenth reading: what the compiled kernels allocate where the model and the compiler disagree
_COMPILE_SMEM = textwrap.dedent('''
    import json, re, sys, importlib.util
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from flashbook.kernels import targets
    from flashbook.kernels.configs import Config
    out = {}
    # chapter 7's forward, 128 x 128 tiles at d = 128, 8 warps, 3 stages, fp16, for an A100
    fwd = targets.compile_kernel("forward", cc=80, config=Config(128, 128, 8, 3), head_dim=128, dtype="fp16",
                                 causal=False)
    out["fwd80"] = int(fwd.metadata.shared)
    # the chapter's tile matmul on fp16 (32 x 32, BLOCK_K 16, the default 4 warps and 3 stages) for an H100
    spec = importlib.util.spec_from_file_location("mm", sys.argv[1])
    mm = importlib.util.module_from_spec(spec); spec.loader.exec_module(mm)
    ints = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", **{k: "i32" for k in ints},
           **{k: "constexpr" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "INPUT_PRECISION")}}
    src = ASTSource(mm.matmul_kernel, sig, constexprs={"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16,
                                                       "INPUT_PRECISION": "ieee"})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    ptx = k.asm["ptx"]
    out["mm90"] = {"shared": int(k.metadata.shared), "wgmma": len(re.findall(r"wgmma\\.mma_async", ptx)),
                   "mma": len(re.findall(r"\\bmma\\.sync", ptx))}
    print(json.dumps(out))
''')


@pytest.mark.slow(seconds=60)
def test_the_a100_cell_and_the_small_dot_are_what_triton_compiles(tmp_path):
    """Triton 3.9 compiles chapter 7's forward at 128 x 128, d = 128, 3 stages for sm_80 into 163,840 B
    (s - 1 = 2 buffers each of K and V: 2 (128 * 128 + 2 * 2 * 128 * 128)), within the A100's 166,912: the
    model (3 buffers each, 196,608 B) says it does not fit, so the page labels its table and exercise 4 as the
    model's and gives the compiled figure. The tile matmul's 32 x 32 tl.dot on sm_90 is mma.sync, not wgmma,
    and allocates as on sm_80: 2 stages x (32 x 16 + 16 x 32) x 2 B = 4,096 B at 3 stages."""
    code = cell_source(NOTEBOOK, "100d662a").split("\n\n\ndef matmul(")[0]
    kernel = tmp_path / "mm.py"
    kernel.write_text("import triton\nimport triton.language as tl\n\n" + code + "\n")
    script = tmp_path / "compile.py"
    script.write_text(_COMPILE_SMEM)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script), str(kernel)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    a100 = runtime.chip("A100")
    glued = _tiles_glued()
    assert got["fwd80"] == 163840 and glued["a100_real_bytes"] == f"{got['fwd80']:,}"
    assert got["fwd80"] <= a100.smem_per_block_bytes == 166912 and glued["a100_block_bytes"] == "166,912"
    assert tiled.smem_bytes(128, 128, 128, num_stages=3, arch="sm_80") > a100.smem_per_block_bytes
    assert got["mm90"]["wgmma"] == 0 and got["mm90"]["mma"] > 0
    assert got["mm90"]["shared"] == 4096 and glued["mm_smem_bytes"] == "4,096"
    prose = flat(cell_source(NOTEBOOK, "3f12ef78"))
    assert ("The table is the model's. On `sm_80` Triton 3.9 allocates one $K$ and one $V$ tile less (box *How "
            "Triton really allocates the buffers*): at $d$ = 128 and 3 stages, 128 × 128 tiles take "
            "{glue:text}`a100_real_bytes` bytes, within an A100's {glue:text}`a100_block_bytes`: 128 fits.") in prose
    assert 'print(f"{c.name} (model): B = {b} fits' in cell_source(NOTEBOOK, "c350576b")
    box = flat(cell_source(NOTEBOOK, "49527e1d"))
    assert ("on `sm_90`, where `tl.dot` becomes Hopper's asynchronous matrix instruction ({term}`wgmma`, for "
            "tiles of 64 rows or more)") in box
    assert ("(the tile matmul's 32 × 32 `tl.dot` uses `mma.sync` and allocates as on `sm_80`: "
            "{glue:text}`mm_smem_bytes` bytes at 3 stages)") in box


def test_the_stage_gain_is_set_beside_chapter_9s_noise():
    """noise.twin_spread of chapter 9's H200 run (2026-11-30-h200): identical kernels 3.6% apart, so the
    128 x 128 tile's 1% (483 against 479) is within it; the second sweep's 5% is a single median too."""
    from flashbook import bench
    from flashbook.bench.noise import twin_spread

    glued = _tiles_glued()
    noise = twin_spread(bench.load_results(bench.latest_results())[0])
    assert glued["st_noise"] == f"{100 * noise:.0f}" == "4"
    blocks = _sweep()
    b2, b3 = _row(blocks, 128, 128, 128, 8, 2), _row(blocks, 128, 128, 128, 8, 3)
    assert b2["fwd_ms"] / b3["fwd_ms"] - 1 < noise and glued["st_big_gain"] == "1"


def test_the_roofline_section_gives_its_numbers_and_its_scope():
    """One head's K and V at the profile's d = 128 (N 4096): 2 * 4096 * 128 * 2 B = 2.0 MiB; the no-cache
    count is the naive one over about 2 B_r / d = 4 (136.3 MB against 34.6 MB); the H100's 989 dense TFLOP/s
    is 132 SMs x 4,096 FLOPs a clock at 1.83 GHz, not the 1.98 GHz boost clock; the softmax paragraph says
    which chip each figure is from."""
    import math

    import pandas as pd
    import torch

    from flashbook import bench

    ids = ["c1447319", "4e2b8eb3", "c064e2b9"]
    h100 = runtime.chip("H100")
    glued, _ = run_glued([cell_source(NOTEBOOK, c) for c in ids], quiet=True, torch=torch, pd=pd, math=math,
                         tiled=tiled, chips=runtime.CHIPS, runtime=runtime, h100=h100, bench=bench)
    assert f"{glued['nc_naive_mb']:.1f}" == "136.3" and f"{glued['nc_fused_mb']:.1f}" == "34.6"
    assert f"{glued['tc_clock_ghz']:.2f}" == "1.83" and h100.boost_clock_mhz / 1000 == 1.98
    assert round(h100.sms * 4096 * glued["tc_clock_ghz"] * 1e9 / 1e12) == 989
    prof = bench.run_path("kernel_ncu")
    from flashbook.bench import profiles

    passes = profiles.pass_table(prof)
    fwd = passes[(passes["impl"] == "triton") & (passes["pass_"] == "forward") & (passes["dim"] == 128)
                 & ~passes["causal"]].iloc[0]
    assert f"{2 * fwd['seq'] * fwd['dim'] * 2 / 2**20:.1f}" == "2.0"
    assert 'glue_text("ncu_kv_mib", 2 * fwd["seq"] * fwd["dim"] * 2 / 2**20, ".1f")' in cell_source(NOTEBOOK, "28a19756")
    roof = flat(cell_source(NOTEBOOK, "5f5032c5"))
    assert ("(one head's take {glue:text}`kv_mib:.1f` MiB at $d$ = 64, {glue:text}`ncu_kv_mib` MiB at the "
            "profile's $d$ = 128;") in roof
    assert ("by a constant (about $2B_r/d$, 4 here: {glue:text}`nc_naive_mb:.1f` MB against "
            "{glue:text}`nc_fused_mb:.1f` MB).") in roof
    both = flat(cell_source(NOTEBOOK, "a93d4f06"))
    assert " here" not in both.replace("there", "")
    assert "leads, on the {glue:text}`sm_chip` by up to" in both
    assert "cached in L1, a small per-SM cache sharing shared memory's storage, and in L2" in flat(
        cell_source(NOTEBOOK, "3f12ef78"))
    assert "*allowed* below is $2^{-10}$ × expected + that step." in flat(cell_source(NOTEBOOK, "1d317fff"))
    table = cell_source(NOTEBOOK, "4e2b8eb3")
    assert "\"naive's ridge (tensor cores)\"" in table and "\"fused ridge (tl.dot)\"" in table
