"""Chapter 6, a newcomer's reading: the T4's crossing roofs, the register file's size, the default
number of warps, the chapter 1 box the L2 profile points to, and exercise 4's question."""
import os

from conftest import ROOT
from flashbook import runtime
from notebook_text import cell_ids, cell_source, flat, run_glued

NOTEBOOK = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")
CH1 = os.path.join(ROOT, "notebooks", "01_attention_numpy.ipynb")


def test_on_the_t4_naive_attentions_roof_is_above_the_fused_kernels():
    """N = 4096, d = 64: naive attention does 31.5 FLOP/byte; on the T4's 0.32 TB/s that is 10.1
    TFLOP/s on cuBLAS's tensor cores, above the 8.1 TFLOP/s of fp32 FMAs that tl.dot gets."""
    t4 = runtime.chip("T4")
    n, d = 4096, 64
    naive = 4 * n * n * d / (2 * (4 * n * d + 4 * n * n))
    roof = min(t4.fp16_tflops, naive * t4.hbm_tb_s)
    assert round(naive) == 32 and round(roof, 1) == 10.1 and round(t4.dot_tflops, 1) == 8.1
    assert roof > t4.dot_tflops
    code = cell_source(NOTEBOOK, "28a19756")
    assert "t4_naive_roof = min(t4.fp16_tflops, naive_ai * t4.hbm_tb_s)" in code
    assert "assert t4_naive_roof > t4.dot_tflops" in code
    prose = flat(cell_source(NOTEBOOK, "5f5032c5"))
    # the two T4 roofs (min(65, 0.32 I) and min(8.1, 0.32 I)) never cross: the kernels sit under different ones
    assert "roofs cross" not in prose
    assert ("On the T4 the two kernels sit under different roofs: at {glue:text}`ai_naive:.1f` FLOP/byte naive "
            "attention's dashed (tensor-core) roof is {glue:text}`t4_naive_roof:.1f` TFLOP/s, above the "
            "{glue:text}`dot_t4:.1f` TFLOP/s flat roof of the fp32 FMAs that `tl.dot` gets. There the roofline predicts that a fused kernel is compute-bound under the "
            "lower roof: it saves bytes, yet its least possible time is {glue:text}`t4_fused_slower:.1f` times "
            "naive attention's ({glue:text}`t4_naive_roof:.1f`/{glue:text}`dot_t4:.1f`; no T4 timing is recorded).") in prose
    assert "it saves bytes, not time" not in prose and "but not time" not in prose   # slower, not the same time
    # the same FLOPs under the two roofs: the fused kernel's least time is 10.1 / 8.1 = 1.2 times naive's
    assert 'glue("t4_fused_slower", float(t4_naive_roof / t4.dot_tflops)' in code
    assert f"{roof / t4.dot_tflops:.1f}" == "1.2"
    # said before the section's verdict (the summary's), and the summary keeps the T4's exception
    ids = cell_ids(NOTEBOOK)
    assert ids.index("5f5032c5") < ids.index("653d56e1")
    summary = flat(cell_source(NOTEBOOK, "653d56e1"))
    # measured: not memory-bound, and not at the tensor-core roof either (54% busy, 50% of peak)
    assert ("By the roofline, naive attention is memory-bound on every chip and a fused kernel, helped by L2, "
            "compute-bound. Measured on an H200, the fused kernel is not memory-bound (HBM at "
            "{glue:text}`ncu_dram_pct`% of its peak), nor at its roof (tensor pipe busy {glue:text}`ncu_tensor_pct`%, "
            "{glue:text}`timed_roof_pct`% of peak; chapter 10 asks why); on the T4, under a lower roof than naive "
            "attention's, not timed.") in summary


def test_the_register_file_is_larger_than_shared_memory_on_an_h100():
    """132 SMs x 256 KiB = 33.0 MiB of registers against 132 x 228 KiB = 29.4 MiB of shared memory:
    the summary's "the register file is larger than shared memory" is said in the body. The largest
    level inside an SM, not on chip: the L2 (50 MiB on the H100) is larger on every chip but the T4."""
    h100 = runtime.chip("H100")
    regs, smem = h100.sms * h100.regs_per_sm_kib / 1024, h100.sms * h100.smem_per_sm_kib / 1024
    assert (f"{regs:.1f}", f"{smem:.1f}") == ("33.0", "29.4") and regs > smem
    assert [c.name for c in runtime.CHIPS.values() if c.l2_mib > c.sms * c.regs_per_sm_kib / 1024] == [
        "A100", "H100", "H200"] and h100.l2_mib == 50
    glued, _ = run_glued(cell_source(NOTEBOOK, "52d6d16f").split("# the memory the driver")[0],
                         chips=runtime.CHIPS)
    assert glued["h100_regs_total_mib"] == regs and glued["h100_smem_total_mib"] == smem
    assert (glued["h100_sms"], glued["h100_regs_sm_kib"]) == (132, 256)
    prose = flat(cell_source(NOTEBOOK, "9d92de19"))
    assert ("Inside each SM the registers are the largest level: an H100's {glue:text}`h100_sms` SMs × "
            "{glue:text}`h100_regs_sm_kib` KiB make {glue:text}`h100_regs_total_mib:.1f` MiB, against "
            "{glue:text}`h100_smem_total_mib:.1f` MiB of shared memory (the L2, shared by all SMs, is larger "
            "still: {glue:text}`l2_h100` MiB).") in prose
    assert "On chip the registers are the largest level" not in prose
    # the shared-memory bandwidth worked out where it is first bounded: 128 B x 132 SMs x 1.98 GHz
    assert round(128 * 132 * 1.98e9 / 1e12, 1) == round(h100.smem_tb_s, 1) == 33.5
    assert h100.boost_clock_mhz == 1980 and 'glue("h100_clock_ghz", h100.boost_clock_mhz / 1000' in cell_source(
        NOTEBOOK, "52d6d16f")
    assert ("{glue:text}`smem_bytes_per_clock` B × {glue:text}`h100_sms` SMs × {glue:text}`h100_clock_ghz:.2f` "
            "GHz (its maximum SM clock) = {glue:text}`h100_smem_tb_s:.1f` TB/s.") in prose


def test_four_warps_is_tritons_default():
    from triton.backends.nvidia.compiler import CUDAOptions

    assert CUDAOptions.__dataclass_fields__["num_warps"].default == 4
    prose = flat(cell_source(NOTEBOOK, "3f12ef78"))
    assert "over {glue:text}`warps_few` warps (Triton's default `num_warps`)" in prose
    assert 'glue("warps_few", 4' in cell_source(NOTEBOOK, "c06dc4a7")


def test_the_l2_profile_points_to_the_chapter_1_box_by_its_title():
    title = "What the GPU record and a profiler show"
    ch1 = "\n".join(cell_source(CH1, cid) for cid in cell_ids(CH1))
    assert f":::{{dropdown}} {title} (optional)" in ch1 and "What a profiler measured" in ch1
    prose = flat(cell_source(NOTEBOOK, "5f5032c5"))
    assert ("A profile of chapter 7's kernel (in brief: [chapter 1](01_attention_numpy.ipynb)'s "
            f"optional box *{title}*) shows") in prose


def test_sparsity_is_explained_and_exercise_4_asks_about_the_stages():
    assert "2:4 sparsity (two zeros in every four values of one operand, skipped)" in flat(
        cell_source(NOTEBOOK, "7296465f"))
    # at d = 128 and 3 stages the T4's answer equals the A100's: what differs is that it ignores the stages
    from flashbook import tiled

    t4, a100 = runtime.chip("T4"), runtime.chip("A100")
    assert tiled.largest_tile(t4, 128, num_stages=3) == tiled.largest_tile(a100, 128, num_stages=3) == 64
    assert len({tiled.largest_tile(t4, 128, num_stages=s) for s in (1, 2, 3)}) == 1
    assert len({tiled.largest_tile(a100, 128, num_stages=s) for s in (1, 2, 3)}) > 1
    text = flat(cell_source(NOTEBOOK, "fea1681b"))
    assert "Why does the T4's answer not change with `num_stages`?" in text and "Why does the T4 differ?" not in text
