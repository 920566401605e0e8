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
from notebook_text import cell_ids, cell_source, cells, find_cell, flat, markdown, run_glued, source_of, source_text

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
    assert "| the model | 2 | 4 | 6 |" in prose
    assert "exact on `sm_90` from 2 stages on and on the safe side otherwise" in prose


def test_the_compiled_shared_memory_is_read_in_chapter_9_not_7():
    prose = cell_source(NOTEBOOK, "c06-buffers-model")
    assert "chapter 7 reads" not in markdown(NOTEBOOK) and "[chapter 9](09_benchmarks.ipynb)" in prose
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
    for name in ("sm_lo_gbs", "sm_hi_gbs", "sm_hi_pct"):
        assert "{glue:text}`" + name + "`" in read
    assert "{glue:text}`sm_ahead_cols`" in cell_source(NOTEBOOK, "a93d4f06")   # after the second recording
    # the short rows' cause is not measured: the candidates are named as such, no cause is asserted
    assert "may dominate" not in read and "is not measured here" in read
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
    assert ("✗: the tile fits shared memory, but its fp32 $S$ and $O$\nalone exceed a whole SM's registers "
            "(see after the table), so no practical kernel uses it.") in cell_source(NOTEBOOK, "c06-buffers-model")
    assert "a ✗ adds one register test" not in cell_source(NOTEBOOK, "c06-buffers-model")
    assert "That is all it checks" not in cell_source(NOTEBOOK, "c06-buffers-model")
    prose = cell_source(NOTEBOOK, "3f12ef78")
    assert "{glue:text}`reg_big_values`" in prose and "not real options" not in prose
    assert "No number of warps saves the ✗ tiles" in prose
    assert "at most {glue:text}`max_regs` registers, the\nlimit of all three architectures here {cite}`nvidia_cuda_guide`" in prose   # where 255 comes from
    assert "would *spill*" in prose and "so values\n*spill*" not in prose


def test_the_chip_tables_memory_column_says_datasheet_gb():
    assert '"memory (datasheet GB)": c.hbm_gib' in cell_source(NOTEBOOK, "f5a20a5d")
    assert "memory (GiB)" not in cell_source(NOTEBOOK, "f5a20a5d")
    # the datasheet-GB note sits with the optional driver comparison, next to the GiB it explains
    for name in ("mem_chip", "mem_gib", "mem_e9", "mem_sheet", "mem_closer"):
        assert "{glue:text}`" + name + "`" in cell_source(NOTEBOOK, "9bd58f54"), name
        assert "{glue:text}`" + name + "`" not in cell_source(NOTEBOOK, "7296465f"), name


def test_triton_is_taught_before_the_tile_sizes_use_it():
    ids = cell_ids(NOTEBOOK)
    assert ids.index("8951c53c") < ids.index("49527e1d")          # Triton's model, then the tiles
    # the first loop (the tile matmul) comes before the stages that pipeline it
    assert (ids.index("c06-softmax-md") < ids.index("1284c2c8") < ids.index("100d662a")
            < ids.index("c06-buffers-md") < ids.index("c06-bf16-md") < ids.index("cdcabe1c"))
    # the T4's fp16 box closes the tile section, with its T4 box, after the box that defines PTX;
    # the interpreter section runs from "input_precision is ignored" to its check uninterrupted
    assert ids.index("c06-bf16-md") == ids.index("49527e1d") + 1
    assert ids.index("cdcabe1c") + 1 == ids.index("d6f03cff") == ids.index("d695a9d7") - 1
    model = cell_source(NOTEBOOK, "8951c53c")
    assert "`num_warps` is how many warps" in model and "`num_stages` is the depth" in model
    assert "issued ahead of their use" not in model and "the first such loop is the tile matmul below" in model
    assert "Each iteration of the tile matmul's `for k0` loop copies a tile of $A$ and one of $B$" in flat(
        cell_source(NOTEBOOK, "c06-buffers-md"))
    assert "show_between(flashbook.smem.smem_buffers" not in cell_source(NOTEBOOK, "c1447319")   # a formula instead
    formula = cell_source(NOTEBOOK, "3f12ef78")                  # the T4's box, after the table
    assert r"\text{bytes} &= 4\max(a, b)" in formula and r"a &= (B_r + B_c)\,d" in formula
    assert r"b &= B_r B_c + \max(B_r, B_c)\,d" in formula


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


# --- the T4 and bf16, the pointer model, plumbing, the exponentials worked out, the softmax's lead

def _compile_t4(jobs):
    from flashbook.kernels import targets

    results = targets.compile_elsewhere(jobs, workers=2, cache_dir=compile_cache(), timeout=900)
    for r in results:
        assert r["error"] is None, r["error"]
        assert r["tensor_core_ops"] == 0, "Triton now emits tensor-core code on sm_75: update chapter 6"
    return results


@pytest.mark.slow(seconds=30)
def test_the_t4_rule_is_the_compiled_kernels_shared_memory_at_any_stage_count():
    """On sm_75 tl.dot stages one fp32 copy of one product's operands, no pipeline: the compiled
    forward's shared memory is 4 max((B_r + B_c) d, B_r B_c + B_r d) at 1 and 3 stages alike, both
    sides of its max. The model's max(B_r, B_c) d equals it for B_r >= B_c (the library's T4 forward
    tiles) and is on the safe side for B_c > B_r (64 x 128 at d = 32: 40,960 B compiled)."""
    shapes = [(64, 64, 64), (32, 32, 128), (64, 32, 128), (32, 64, 128), (64, 64, 128), (128, 32, 64),
              (64, 128, 32), (32, 128, 16)]
    jobs = [dict(kernel="forward", cc=75, head_dim=d, dtype="fp16", causal=False, atomic_dq=False,
                 config=[bm, bn, 4, s], assemble=False) for bm, bn, d in shapes for s in (1, 3)]
    sides = set()
    for job, r in zip(jobs, _compile_t4(jobs)):
        (bm, bn, _w, s), d = job["config"], job["head_dim"]
        qk, pv = (bm + bn) * d, bm * bn + bm * d
        model = smem.smem_bytes(bm, bn, d, num_stages=s, arch="sm_75")
        assert r["shared"] == 4 * max(qk, pv) <= model, job
        assert (r["shared"] == model) == (bm >= bn or qk >= bm * bn + bn * d), job
        sides.add("QK" if qk > pv else "PV" if pv > qk else "both")
    assert {"QK", "PV"} <= sides
    from flashbook.kernels import configs
    assert all(c.block_m >= c.block_n for _, c, *_ in configs._PREFERRED["sm_75"]["forward"])
    # the T4's rule comes after the table (not between the sm_80 formula and the table) ...
    assert "The T4 (`sm_75`) follows another rule" not in cell_source(NOTEBOOK, "c06-buffers-md")
    main = flat(cell_source(NOTEBOOK, "3f12ef78"))
    assert ("The T4's row does not change with the stages: there `tl.dot` has no tensor cores and no "
            "pipeline, and holds one fp32 copy of one product's operands") in main
    # the table's T4 row checks from the main text: its own count, not the sm_80 formula above it
    assert ("$4(B_r + B_c)d$ bytes here (box *On the T4*): {glue:text}`t4_bytes` at $B$ = "
            "{glue:text}`t4_b_d128_s2`, exactly its {glue:text}`t4_smem_kib` KiB, where the formula above "
            "allows only {glue:text}`t4_sm80_model_b` rows.") in main
    code = cell_source(NOTEBOOK, "c06dc4a7")
    assert "assert t4_bytes == 4 * 2 * largest_block(t4, FIT_D, FIT_STAGES) * FIT_D == t4.smem_per_block_bytes" in code
    t4 = runtime.chip("T4")
    assert tiled.smem_bytes(64, 64, 128, num_stages=2, arch="sm_75") == 4 * (64 + 64) * 128 == t4.smem_per_block_bytes
    assert tiled.smem_bytes(64, 64, 128, num_stages=2) > t4.smem_per_block_bytes      # the sm_80 formula: 32 rows
    assert "Counted as the `sm_80` model does" not in main     # said once, in the main text
    # ... and the T4's byte formula sits under it, in the section's own "On the T4" box, not in the
    # optional box on Triton's buffers
    assert main.index("The T4's row does not change with the stages") < main.index(":::{dropdown} On the T4 (`sm_75`) (optional)")
    assert main.index(":::{dropdown} On the T4 (`sm_75`) (optional)") < main.index("The larger of the forward's two products")
    assert ("The larger of the forward's two products sets the size: $Q$ and $K$ for $QK^\\top$, or $P$ "
            "($B_r \\times B_c$) and a $B_r \\times d$ buffer for $PV$.") in main
    assert ("this is what Triton 3.9 allocates on `sm_75` at any `num_stages` when $B_r \\ge B_c$ (the "
            "library's T4 forward tiles; compiled, not run on a T4):") in main
    assert ("With $B_c > B_r$ the compiled buffer has $B_r$ rows, not $\\max(B_r, B_c)$: the model is then "
            "on the safe side.") in main
    assert "$V$'s buffer sized for" not in main
    assert "T4 kernels allocate" not in cell_source(NOTEBOOK, "49527e1d")
    text = markdown(NOTEBOOK)
    assert "A fit to" not in text and "the fit counts" not in text


@pytest.mark.slow(seconds=20)
def test_bf16_runs_on_a_t4_too_so_fp16_is_chosen_for_other_reasons():
    """No tensor cores on sm_75 in Triton: a bf16 forward compiles to the same FMA code as fp16, so
    the bf16 MMA's sm_80 requirement decides nothing; the chapter gives the reasons that do."""
    jobs = [dict(kernel="forward", cc=75, head_dim=128, dtype=dtype, causal=False, atomic_dq=False,
                 config=[64, 32, 8, 1], assemble=False) for dtype in ("fp16", "bf16")]
    fp16, bf16 = _compile_t4(jobs)
    assert fp16["shared"] == bf16["shared"]
    text = flat(cell_source(NOTEBOOK, "c06-bf16-md"))
    assert ("Triton itself uses no tensor cores on a T4, so a bf16 kernel would run there too, on the same "
            "fp32 FMAs.") in text
    assert ("get the T4's tensor cores only in fp16, and fp16 rounds finer than bf16") in text
    # an optional box: the conclusion leads it; the bf16 MMA's sm_80 requirement is background after it
    assert text.startswith(":::{dropdown} Why the T4 runs the kernels in fp16 (optional)")
    assert text.index("On a T4 the book's kernels run in fp16.") < text.index("`sm_80` or newer")
    prose = markdown(NOTEBOOK)
    assert "So the book's kernels use fp16 on a T4" not in prose and "no bf16 tensor cores: kernels use fp16" not in prose
    summary = flat(cell_source(NOTEBOOK, "653d56e1"))
    # the summary keeps the fact (no tensor cores for tl.dot on a T4); the box *Why the T4 runs the kernels in fp16* the reason
    assert "On the T4 (`sm_75`) Triton's `tl.dot` uses no tensor cores, whatever the dtype." in summary
    import torch

    glued, _ = run_glued(cell_source(NOTEBOOK, "bf1a48e1"), quiet=True, torch=torch, chips=runtime.CHIPS)
    assert glued["fp16_finer"] == 8 == 2 ** (10 - 7)               # 10 mantissa bits against 7


def test_the_pointer_model_comes_before_the_tile_matmul_uses_it():
    import numpy as np
    import torch

    ids = cell_ids(NOTEBOOK)
    assert ids.index("2c73a56c") < ids.index("c06-offsets") < ids.index("1284c2c8") < ids.index("100d662a")
    text = flat(cell_source(NOTEBOOK, "2c73a56c"))
    launch = flat(cell_source(NOTEBOOK, "1757c44a"))        # said where the first kernel is launched
    assert ids.index("668cefbe") < ids.index("1757c44a") < ids.index("2c73a56c")
    assert "A torch tensor passed to a kernel arrives as a *pointer*, the address of its first element" in launch
    assert "`kernel[grid](args)` launches one program per index of `grid`" in launch
    assert "a `tl.constexpr` argument becomes a compile-time constant" in launch
    assert "The programs run in parallel, in no fixed order, and share nothing but global memory" in launch
    assert "a pointer plus a block of offsets is a block of addresses, and `tl.load` reads them all" in text
    assert "`rows[:, None] * stride + cols[None, :]` is a (rows × cols) block" in text
    _, ns = run_glued(cell_source(NOTEBOOK, "c06-offsets"), quiet=True, torch=torch, np=np)
    x = ns["x"]
    start = x.stride(0) + 4 * x.stride(2)                  # the figure's program: batch 1, head 0, tile 1
    assert ns["offsets"].tolist() == [[start + 4 * r + c for c in range(4)] for r in range(4)]
    assert "`rm[:, None] * stride_am + k[None, :] * stride_ak` addresses a `BLOCK_M x BLOCK_K` tile" in flat(
        cell_source(NOTEBOOK, "1284c2c8"))


def test_visible_cells_define_what_they_use_and_leave_the_glue_hidden():
    setup = find_cell(NOTEBOOK, "3b3b44c2")
    assert "remove-output" in setup["metadata"]["tags"] and "chips = runtime.CHIPS" in source_of(setup)
    assert "except ImportError" not in source_of(setup)          # flashbook.display.glue falls back itself
    assert "chips = runtime.CHIPS" not in cell_source(NOTEBOOK, "cff09ea0")
    for cid in ("668cefbe", "c06-offsets", "c1447319", "7377fcc7", "df86aff0", "100d662a", "4e2b8eb3"):
        cell = find_cell(NOTEBOOK, cid)
        assert not cell["metadata"].get("tags") and "glue(" not in source_of(cell), cid
    assert "hide-input" in find_cell(NOTEBOOK, "22ab5090")["metadata"]["tags"]     # the listing stays
    text = markdown(NOTEBOOK)
    for residue in ("Triton (3.6 to 3.9)", "the online\nbook has no recording", "not recorded for the online book"):
        assert residue not in text, residue


def test_terms_are_defined_where_the_page_first_uses_them():
    page = "\n".join(source_of(c) for c in cells(NOTEBOOK) if "remove-cell" not in c["metadata"].get("tags", []))
    for term, definition in (("PTX", "PTX (the virtual instruction set Triton compiles to)"),
                             ("cuBLAS", "cuBLAS (NVIDIA's matrix-multiply library)"),
                             ("FMA", "fused multiply-adds, FMAs: $a \\cdot b + c$ in one")):
        flat_page = flat(page)
        first = flat_page.index(term)
        assert flat_page.index(definition) <= first <= flat_page.index(definition) + len(definition), term
    # cuBLAS's first use in the main text (the box above is optional) defines it too
    assert "whose products cuBLAS (NVIDIA's matrix-multiply library) runs on the tensor cores" in flat(
        cell_source(NOTEBOOK, "5f5032c5"))
    assert "{term}`local memory`" in cell_source(NOTEBOOK, "3f12ef78")


def test_the_exponentials_cost_is_worked_out_from_the_rates():
    """4d FLOPs per score against 4,096 per clock per SM: 16 scores' products per clock at d = 64,
    as many as the 16 exponentials per clock, so as long; twice as long at d = 128."""
    import math

    import pandas as pd

    glued, _ = run_glued([cell_source(NOTEBOOK, "4e2b8eb3"), cell_source(NOTEBOOK, "c064e2b9")], quiet=True,
                         math=math, pd=pd, FP16_BYTES=2, chips=runtime.CHIPS, h100=runtime.chip("H100"),
                         runtime=runtime)
    assert glued["exp_flops_64"] == 4 * 64 and glued["tc_flop_clk"] == "4,096"
    assert glued["tc_scores_64"] == 4096 // 256 == runtime.SFU_PER_CLOCK_PER_SM == glued["sfu_clock"]
    assert round(glued["exp_share_64"]) == 100 and round(glued["exp_share_128"]) == 50
    prose = flat(cell_source(NOTEBOOK, "c06-exp-box"))
    assert ("A score's two products cost $4d$ FLOPs, {glue:text}`exp_flops_64` at $d$ = 64, and an H100 SM's "
            "tensor cores do {glue:text}`tc_flop_clk` dense fp16 FLOPs per clock {cite}`nvidia_h100_whitepaper` "
            "(× {glue:text}`h100_sms` SMs × {glue:text}`tc_clock_ghz:.2f` GHz = {glue:text}`tc_h100:.0f` TFLOP/s: the "
            "datasheet's clock, below the {glue:text}`h100_clock_ghz:.2f` GHz above): the products of {glue:text}`tc_scores_64` scores per clock, against the exponentials of "
            "{glue:text}`sfu_clock`.") in prose


def test_the_softmax_is_level_at_256_columns_and_ahead_where_both_recordings_agree():
    """Recorded: 547 against 538 GB/s at 256 columns (1.7%), then ahead at every length; the H200
    recording of the same cell has torch.softmax ahead at 512, so "ahead" starts at 1,024, where both
    recordings agree (each point is a single do_bench timing)."""
    import json
    import tarfile

    from flashbook import bench
    from flashbook.bench.chapter6 import bandwidth_table, recorded_gpu_name
    from flashbook.bench.runs import recorded_output

    table = bandwidth_table(recorded_output("06_gpu_and_triton", "118fcf7e"))
    ratio = table["fused Triton (GB/s)"] / table["torch.softmax (GB/s)"]
    glued, ns = run_glued(cell_source(NOTEBOOK, "c06-softmax-glue"), CPU=True, chips=runtime.CHIPS, ratio=4.0)
    cols = list(table.index)
    assert abs(ratio[cols[0]] - 1) < 0.05 and (ratio[cols[1]:] > 1.05).all()
    run = bench.run_path("notebooks_06_11")
    with tarfile.open(run / "executed.tar.gz") as tar:
        other_nb = json.load(tar.extractfile("06_gpu_and_triton.ipynb"))
    other_cell = next(c for c in other_nb["cells"] if c.get("id") == "118fcf7e")
    other = bandwidth_table("".join("".join(o.get("text", "")) for o in other_cell["outputs"]))
    other_ratio = other["fused Triton (GB/s)"] / other["torch.softmax (GB/s)"]
    assert list(other.index) == cols
    assert other_ratio[cols[1]] < 0.95 and (other_ratio[cols[2]:] > 1.05).all()    # torch ahead at 512
    assert glued["sm_level_cols"] == str(cols[0]) and glued["sm_ahead_cols"] == str(cols[2])
    assert glued["sm_disagree_cols"] == str(cols[1]) and glued["sm_other_chip"] == "H200"
    assert glued["sm_ratio_max"] == f"{ratio.max():.1f}"
    # what the second recording agrees on: level at 256 in both, and torch.softmax's lead where it flips
    assert abs(other_ratio[cols[0]] - 1) < 0.05 and glued["sm_agree_level_cols"] == str(cols[0])
    assert glued["sm_flip_pct"] == f"{100 * (1 / other_ratio[cols[1]] - 1):.0f}" == "48"
    read = flat(cell_source(NOTEBOOK, "c06-softmax-read"))
    both = flat(cell_source(NOTEBOOK, "a93d4f06"))     # after the second recording, shown between them
    ids = cell_ids(NOTEBOOK)
    assert ids.index("c06-softmax-read") + 1 == ids.index("5e0b2c71") == ids.index("a93d4f06") - 1
    assert "remove-input" in find_cell(NOTEBOOK, "5e0b2c71")["metadata"]["tags"]
    assert ("In both recordings the two kernels are level at {glue:text}`sm_agree_level_cols` columns "
            "({glue:text}`sm_level_pct`% apart on the {glue:text}`sm_chip`)") in both and "have the two level" not in read + both
    # the point "ahead" passes over is named, with the recorded lead (971 against 862 GB/s: 13%)
    assert glued["sm_disagree_lead_pct"] == f"{100 * (ratio[cols[1]] - 1):.0f}" == "13"
    # the second recording is shown whole (the cell between the two paragraphs prints it as parsed),
    # and the prose reads the row where the two disagree: 577 GB/s there, 570 at 256 columns
    assert ns["other"].equals(other) and "print(other.round(0).to_string())" in cell_source(NOTEBOOK, "5e0b2c71")
    assert (other.loc[cols[1], "fused Triton (GB/s)"], other.loc[cols[0], "fused Triton (GB/s)"]) == (577, 570)
    assert glued["sm_other_flip_rise"] == f"{100 * (577 / 570 - 1):.1f}" == "1.2"
    assert ("and from {glue:text}`sm_ahead_cols` on the Triton kernel leads, on the {glue:text}`sm_chip` by up to "
            "{glue:text}`sm_ratio_max` times; why PyTorch's kernel falls behind is not measured.") in both
    # the rise that breaks is the Triton kernel's (577 against 570 GB/s), named as such
    assert ("At {glue:text}`sm_disagree_cols` columns they disagree: Triton {glue:text}`sm_disagree_lead_pct`% "
            "ahead on the {glue:text}`sm_chip`, `torch.softmax` {glue:text}`sm_flip_pct`% ahead on the {glue:text}`sm_other_chip`, where "
            "the Triton kernel gets only {glue:text}`sm_other_flip_rise`% more GB/s than at "
            "{glue:text}`sm_lo_cols` columns") in both
    assert "whose fused kernel" not in both
    # both columns are fused kernels, said before the table; the five-step version is not timed
    timing = flat(cell_source(NOTEBOOK, "8b363455"))
    assert ("The cell compares the fused kernel with `torch.softmax`, also one fused kernel (PyTorch's own), not "
            "the untimed five-step version.") in timing
    assert "`torch.softmax` is also one fused kernel" not in read
    # each point was timed once and no spread was recorded: the flip is left open, not called noise
    assert "Each point is one `do_bench` call, with no spread recorded." in read
    assert "can be noise" not in read + both and "tens of percent" not in read + both
    assert ("With no measurement repeated, the lead at {glue:text}`sm_disagree_cols` columns is open.") in both
    assert "reports the mean time" in cell_source(NOTEBOOK, "8b363455")      # what one call is
    assert "Each point is one timing." not in cell_source(NOTEBOOK, "c06-softmax-read")
    assert "1,024 columns `torch.softmax` switches" not in cell_source(NOTEBOOK, "c06-softmax-read")
    assert glued["sm_level_pct"] == f"{100 * abs(ratio[cols[0]] - 1):.1f}" == "1.7"
    assert "In the run shown" not in read
    alt = find_cell(NOTEBOOK, "118fcf7e")["metadata"]["mystnb"]["image"]["alt"]
    chip = next(key for key in runtime.CHIPS if key in recorded_gpu_name("06_gpu_and_triton"))
    assert f"on the recorded GPU, an {chip}:" in alt and f"the {chip}'s datasheet bandwidth" in alt
    assert (f"The two are level at {cols[0]} columns; from {cols[1]} on the fused kernel is ahead") in alt
