"""Chapter 6 after the review: the statements about Triton and the recorded data it corrected.

Each test pins a corrected statement to what makes it true (Triton's own source or compiler,
the recorded GPU run, the library's models), so the wrong version cannot come back unnoticed.
"""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, compile_cache
from flashbook import runtime, smem, tiled
from notebook_text import cell_ids, cell_source, find_cell, markdown, source_text

NOTEBOOK = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")


def test_triton_reads_triton_interpret_when_a_kernel_is_defined_not_at_import():
    """The decorator reads the variable: set after `import triton`, it still picks the interpreter."""
    code = ("import os, triton, triton.language as tl\n"
            "os.environ['TRITON_INTERPRET'] = '1'\n"
            "@triton.jit\n"
            "def k(x):\n"
            "    pass\n"
            "from triton.runtime.interpreter import InterpretedFunction\n"
            "print(isinstance(k, InterpretedFunction))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    text = markdown(NOTEBOOK)
    assert "once, when first imported" not in text
    assert "when a kernel is *defined*" in cell_source(NOTEBOOK, "c06-interpret-md")


def test_a_16_bit_tl_dot_needs_only_k_of_16():
    """Triton's NVIDIA backend: M and N may be 1, K (what the product sums over) at least 16."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import min_dot_size

    for cc in (80, 90):
        check = min_dot_size(GPUTarget("cuda", cc, 32))
        assert check(tl.float16, tl.float16) == (1, 1, 16)
        assert check(tl.bfloat16, tl.bfloat16) == (1, 1, 16)
    prose = cell_source(NOTEBOOK, "1284c2c8")
    assert "Every\ndimension of a `tl.dot`" not in prose and "every dimension" not in prose.lower()
    assert "The other two may be as small as 1" in prose
    assert "needs every dimension" not in cell_source(NOTEBOOK, "c1447319")


@pytest.mark.slow(seconds=20)
def test_num_stages_copies_are_exact_on_sm90_and_one_fewer_on_sm80():
    """The forward kernel's compiled shared memory against the chapter's model."""
    from flashbook.kernels import targets

    stages = (1, 2, 3)
    jobs = [dict(kernel="forward", cc=cc, head_dim=64, dtype="fp16", causal=False, atomic_dq=False,
                 config=[64, 64, 4, s], assemble=False) for cc in (80, 90) for s in stages]
    results = targets.compile_elsewhere(jobs, workers=2, cache_dir=compile_cache(), timeout=900)
    one_stage = 2 * 2 * 64 * 64                       # a K and a V tile, fp16
    for r in results:
        assert r["error"] is None, r["error"]
        s = r["config"][3]
        model = smem.smem_bytes(64, 64, 64, num_stages=s, arch=f"sm_{r['cc']}")
        if s == 1:        # one tile fewer than the model on both chips: the model is on the safe side
            assert r["shared"] == model - one_stage // 2, (r["cc"], s, r["shared"], model)
            continue
        want = model if r["cc"] == 90 else model - one_stage
        assert r["shared"] == want, (r["cc"], s, r["shared"], model)
    prose = cell_source(NOTEBOOK, "49527e1d")
    # the prose's table: B_c x d tiles of K and V together, as compiled (the Q tile aside)
    for cc in (80, 90):
        tiles = [(r["shared"] - 2 * 64 * 64) // (2 * 64 * 64)
                 for r in sorted((r for r in results if r["cc"] == cc), key=lambda r: r["config"][3])]
        assert f"| `sm_{cc}` | " + " | ".join(map(str, tiles)) + " |" in prose, (cc, tiles)
    assert "| the model below | 2 | 4 | 6 |" in prose
    assert "exact on `sm_90` from 2 stages on and on the safe side otherwise" in prose


def test_the_compiled_shared_memory_is_read_in_chapter_9_not_7():
    prose = cell_source(NOTEBOOK, "49527e1d")
    assert "chapter 7 reads" not in prose and "[chapter 9](09_benchmarks.ipynb)" in prose
    ch9 = source_text("09_benchmarks.ipynb")
    assert "From the compiled kernel it also records" in ch9 and "the shared memory" in ch9


def test_the_softmax_timing_table_is_read_not_just_shown():
    """Speed is bounded by memory traffic; the recorded table reaches the bound only for long rows."""
    from flashbook.bench.runs import recorded_output

    text = recorded_output("06_gpu_and_triton", "118fcf7e")
    from flashbook.bench.chapter6 import bandwidth_table

    fused = bandwidth_table(text)["fused Triton (GB/s)"].to_dict()   # the parser the chapter uses
    assert len(fused) > 2
    from flashbook.bench.chapter6 import recorded_gpu_name

    gpu = recorded_gpu_name("06_gpu_and_triton")           # the chip the recording ran on
    sheet = next(c for key, c in runtime.CHIPS.items() if key in gpu).hbm_tb_s * 1e3
    assert fused[min(fused)] / sheet < 0.2 < 0.7 < fused[max(fused)] / sheet
    assert "its speed *is* its memory traffic" not in markdown(NOTEBOOK)
    assert "its speed is *bounded* by its memory" in cell_source(NOTEBOOK, "49dc3d67")
    read = cell_source(NOTEBOOK, "c06-softmax-read")
    for name in ("sm_lo_gbs", "sm_hi_gbs", "sm_hi_pct", "sm_ahead_cols"):
        assert "{glue:text}`" + name + "`" in read
    assert "may dominate" in read                                   # a possible cause, not a measured one
    assert "does not look into" not in read and "nothing in this chapter measures" not in read
    glue_cell = cell_source(NOTEBOOK, "c06-softmax-glue")
    assert 'recorded_output("06_gpu_and_triton", "118fcf7e")' in glue_cell


def test_the_worst_case_intensity_is_above_the_t4s_ridge():
    n, d, br = 4096, 64, 128
    flops = 4 * n * n * d
    worst = flops / (2 * (2 * n * d + 2 * n * d * (n // br)))
    below = [c.name for c in runtime.CHIPS.values() if worst < c.ridge_flop_per_byte]
    assert below == ["A100", "H100", "H200"]
    prose = cell_source(NOTEBOOK, "5f5032c5")
    assert "below the ridges (larger" not in prose
    assert "{glue:text}`rr_mem_chips`" in prose and "{glue:text}`rr_cb_chips`" in prose


def test_the_fit_tables_largest_tiles_are_flagged_as_register_bound():
    fits = [tiled.largest_tile(c, 64, num_stages=1) for c in runtime.CHIPS.values()]
    assert 256 in fits                                      # the table does show 256s
    regs_per_sm = min(c.regs_per_sm_kib * 1024 // 4 for c in runtime.CHIPS.values())
    assert 256 * 256 + 256 * 64 > regs_per_sm               # S and O alone overflow an SM
    # the table marks them (S and O against one SM's registers, from tiled.onchip_elements) ...
    def crossed(c, b, d):
        tiles = tiled.onchip_elements(b, b, d)
        return tiles["S/P"] + tiles["O"] > c.regs_per_sm_kib * 1024 // 4
    marks = {(c.name, d, s) for c in runtime.CHIPS.values() for d in (64, 128) for s in (1, 2, 3)
             if crossed(c, tiled.largest_tile(c, d, num_stages=s), d)}
    assert marks == {(c.name, d, s) for c in runtime.CHIPS.values() for d in (64, 128) for s in (1, 2, 3)
                     if tiled.largest_tile(c, d, num_stages=s) == 256} != set()
    table = cell_source(NOTEBOOK, "c1447319")
    assert 'tiles["S/P"] + tiles["O"] <= chip.regs_per_sm_kib * 1024 // 4' in table and '" ✗"' in table
    assert 'assert {e for col in fits for e in fits[col] if "✗" in e} == {f"{B_big} ✗"}' in cell_source(NOTEBOOK, "dc4a6996")
    # ... the reader is told before the table, and nothing is retracted after it
    assert ("That is all it checks: a ✗ marks a tile whose fp32 $S$ and $O$ would not fit\neven a whole "
            "SM's registers (below).") in cell_source(NOTEBOOK, "49527e1d")
    prose = cell_source(NOTEBOOK, "3f12ef78")
    assert "{glue:text}`reg_big_values`" in prose and "not real options" not in prose
    assert "No number of warps saves the ✗ tiles" in prose
    assert "at most {glue:text}`max_regs` registers, the\nlimit of all three architectures here {cite}`nvidia_cuda_guide`" in prose   # where 255 comes from
    assert "would *spill*" in prose and "so values\n*spill*" not in prose


def test_the_chip_tables_memory_column_says_datasheet_gb():
    assert '"memory (datasheet GB)": c.hbm_gib' in cell_source(NOTEBOOK, "f5a20a5d")
    assert "memory (GiB)" not in cell_source(NOTEBOOK, "f5a20a5d")
    assert "{glue:text}`h200_memory`" in cell_source(NOTEBOOK, "7296465f")       # the note sits under the table


def test_triton_is_taught_before_the_tile_sizes_use_it():
    ids = cell_ids(NOTEBOOK)
    assert ids.index("8951c53c") < ids.index("49527e1d")          # Triton's model, then the tiles
    model = cell_source(NOTEBOOK, "8951c53c")
    assert "`num_warps` is how many warps" in model and "`num_stages` is the depth" in model
    assert "show_between(flashbook.smem.smem_buffers" not in cell_source(NOTEBOOK, "c1447319")   # a formula instead
    assert r"4\,\max\bigl(&(B_r + B_c)\,d" in cell_source(NOTEBOOK, "49527e1d")


def test_no_build_machine_leftovers():
    setup = find_cell(NOTEBOOK, "3b3b44c2")
    assert "remove-output" in setup["metadata"]["tags"]          # runtime.describe(): the builder's machine
    text = markdown(NOTEBOOK)
    assert "### This machine" not in text
    assert "B = {fwd['batch']}" not in cell_source(NOTEBOOK, "28a19756")


def test_the_chapters_helpers_moved_to_the_library_still_check_and_draw():
    """Trim: check_close and the two chip figures live in flashbook, called in one line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from flashbook.bench.chapter6 import check_close
    from flashbook.plots.chips import hierarchy, levels, roofline

    check_close("same", torch.ones(3), torch.ones(3), atol=0.0)
    with pytest.raises(AssertionError, match=r"1 of 3 elements outside tolerance; worst at \(1,\)"):
        check_close("one off", torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0]), atol=0.1)
    chips = list(runtime.CHIPS.values())
    assert [lvl for lvl, _, _ in levels(chips[0])] == ["registers", "shared memory", "L2", "HBM"]
    fig, axes = plt.subplots(1, 2)
    hierarchy(*axes, chips)
    assert len(axes[0].patches) == 4 * len(chips)
    fig2, ax = plt.subplots()
    roofline(ax, chips, {"naive": 30.0, "fused, ideal": 2000.0})
    assert len(ax.get_lines()) == 2 * len(chips) + 2
    plt.close(fig); plt.close(fig2)
    assert "from flashbook.bench.chapter6 import check_close" in cell_source(NOTEBOOK, "dbf51304")
