"""Chapters 6 and 7 after the second review: the corrected statements, pinned to what makes them true.

Naive attention's ridge on a T4 (cuBLAS uses the tensor cores, Triton does not), the
exponentials' time on Hopper, Triton's wgmma waits (this kernel waits for every product; a
plain matmul loop does not), exp2's instruction count, the head grouping of small grids on
sm_90, and a live timing at another batch than the sweeps it is set beside.
"""
import json
import os
import re
import subprocess
import sys

import pandas as pd

from conftest import ROOT, require
from flashbook import bench, runtime
from flashbook.bench import runs
from notebook_text import cell_source, flat, markdown, run_glued

CH6 = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")
CH7 = os.path.join(ROOT, "notebooks", "07_triton_forward.ipynb")


def _glued(notebook, cell_id, **names):
    """Run one of a chapter's cells with ``names`` defined; what it glued, as strings."""
    return run_glued(cell_source(notebook, cell_id), bench=bench, pd=pd, runtime=runtime, **names)[0]


def _recorded7(cell_id):
    text = runs.recorded_output("07_triton_forward", cell_id)
    require(text is not None, "no recorded chapter 7 outputs")
    return text


# --- chapter 6 -------------------------------------------------------------------------------

def test_naive_attention_is_memory_bound_on_every_chip_the_t4_included():
    """The book's naive attention is PyTorch's (reference.torch_attention): cuBLAS runs its fp16
    products on the tensor cores of a T4 too, so its ridge there is the tensor cores', not tl.dot's."""
    n, d = 4096, 64
    naive = 4 * n * n * d / (2 * (4 * n * d + 4 * n * n))
    t4 = runtime.chip("T4")
    assert t4.ridge_flop_per_byte < naive < t4.fp16_tflops / t4.hbm_tb_s      # the old verdict came from here
    assert all(naive < c.fp16_tflops / c.hbm_tb_s for c in runtime.CHIPS.values())
    code = cell_source(CH6, "4e2b8eb3")
    assert 'chip.fp16_tflops if kernel == "naive" else chip.dot_tflops' in code
    assert "assert compute_bound == [], compute_bound" in cell_source(CH6, "28a19756")
    text = markdown(CH6)
    assert "just right of the low ridge" not in text and "naive_cb_chips" not in text
    assert "{glue:text}`naive_t4_ridge:.0f`" in cell_source(CH6, "5f5032c5")
    assert "tensor_roofs=True" in cell_source(CH6, "475c36df")


def test_the_exponentials_time_is_not_small_on_hopper():
    """4d tensor-core FLOPs per score against one exponential at 16 per clock per SM, both at the
    clock behind the datasheet's tensor-core peak: on an H100 as long at d = 64 and half as long at
    d = 128, as FlashAttention-3 counts (3.9 against 989 TFLOP/s)."""
    h100 = runtime.chip("H100")
    clock = h100.fp16_tflops * 1e12 / (h100.sms * 4096)
    assert 1.8e9 < clock < 1.85e9                                   # H100 SXM: 1.83 GHz for tensor math
    assert 3.8e12 < h100.sms * runtime.SFU_PER_CLOCK_PER_SM * clock < 3.95e12   # FA3's 3.9 TFLOP/s
    code = cell_source(CH6, "c064e2b9")
    assert "TC_FLOP_PER_CLK = 4096" in code
    assert "tensor_clock_hz = h100.fp16_tflops * 1e12 / (h100.sms * TC_FLOP_PER_CLK)" in code
    assert "(1 / exp_per_s)" in code and "h100.exp_per_s" not in code
    share = {d: (1 / (h100.sms * runtime.SFU_PER_CLOCK_PER_SM * clock)) / (4 * d / (h100.fp16_tflops * 1e12))
             for d in (64, 128)}
    assert abs(share[64] - 1.0) < 0.01 and abs(share[128] - 0.5) < 0.01
    # the roofline section ends on its point; the exponentials' cost is a "Going further" box after it
    prose = cell_source(CH6, "c06-exp-box")
    assert prose.startswith(":::{dropdown} Going further: the exponentials lower the roof\n")
    assert "exp_share" not in cell_source(CH6, "a45d236a")
    ids = [c["id"] for c in json.load(open(CH6))["cells"]]
    assert ids.index("c064e2b9") < ids.index("5f5032c5") == ids.index("c06-exp-box") - 1
    # the section's verdict is the summary's (said once, there), not repeated at the section's end
    assert "In short: naive attention" not in cell_source(CH6, "5f5032c5")
    assert ("By the roofline, naive attention is memory-bound on every chip and a fused kernel, helped by L2,\n  compute-bound."
            in cell_source(CH6, "653d56e1"))
    assert ("as long as the matrix products at $d$ = 64 ({glue:text}`exp_share_64:.0f`%) and half as long\n"
            "at $d$ = 128 ({glue:text}`exp_share_128:.0f`%") in prose
    assert "assert round(exp_share[64]) == 100 and round(exp_share[128]) == 50" in code
    for name in ("sfu_clock", "exp_share_64:.0f", "exp_share_128:.0f"):
        assert "{glue:text}`" + name + "`" in prose, name
    assert "{cite}`shah2024flashattention3`" in prose and "*and* the special-function units" not in prose
    assert "The section's ridges count the tensor cores\nonly." in prose      # the table's ridges
    # resolved on the page: with no overlap the roof drops by the counted share, the ridge with it
    assert "exp_roof_64 = 100 / (1 + exp_share[64] / 100)" in code
    assert 'glue("exp_ridge_h100_64", h100.ridge_flop_per_byte * exp_roof_64 / 100' in code
    roof = 100 / (1 + share[64])
    assert abs(roof - 50) < 1 and 4 * 4096 * 4096 * 64 / (2 * 4 * 4096 * 64) > h100.ridge_flop_per_byte
    for name in ("exp_roof_64:.0f", "ridge_h100:.0f", "exp_ridge_h100_64:.0f"):
        assert "{glue:text}`" + name + "`" in prose, name
    assert "a\nfused kernel stays compute-bound, under a lower roof" in prose
    # the summary names both costs the box counts (the exponentials, and issuing the loop's
    # instructions: tests/test_review12_ch06.py checks the issue cap), not an unshown limit
    summary = flat(cell_source(CH6, "653d56e1"))
    assert ("Its roof is the tensor cores' rate, lowered by the softmax's instructions where they do not "
            "overlap the products.") in summary
    assert "second limit" not in summary


def test_tl_dot_rate_is_a_ceiling_not_a_claim():
    # the three deciding numbers lead the section, before the chip table
    prose = cell_source(CH6, "0748095b")
    assert "at their\n  peak" not in prose and "a ceiling, not what a kernel reaches" in prose
    assert "roughly binary gigabytes" not in prose + cell_source(CH6, "7296465f")
    assert "far below every ridge" not in markdown(CH6)            # the T4's tl.dot ridge is lower
    assert "far below every chip's\n  tensor-core ridge" in cell_source(CH6, "5f5032c5")
    assert "GiB of HBM" not in markdown(CH6)


def test_exercise_1_spec_matches_its_stub():
    assert "`add(x, y, z)` writes `x + y` into `z`" in cell_source(CH6, "6eafa2b3")
    assert "def add(x, y, z, BLOCK=16):" in cell_source(CH6, "f2f7cc33")


def test_program_and_block_are_told_apart_from_cuda():
    assert "**lanes** (the block's positions)" in cell_source(CH6, "8951c53c")
    assert "A Triton program is what CUDA\ncalls a thread block" in cell_source(CH6, "8951c53c")
    assert "one program (a CUDA thread block)" not in cell_source(CH6, "a588df3d")


# --- chapter 7 -------------------------------------------------------------------------------

def test_a_plain_matmul_loop_keeps_a_wgmma_running_where_the_forward_does_not(tmp_path):
    """Compiled for sm_90 (no GPU needed): a GEMM K-loop waits with one product still running
    (wgmma.wait_group 1); the forward waits for all (tests/test_compile_targets.py pins [0])."""
    code = r'''
import os, re
os.environ.pop("TRITON_INTERPRET", None)
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget

@triton.jit
def gemm(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.arange(0, BLOCK_M); rn = tl.arange(0, BLOCK_N); rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(b_ptr + (k0 + rk)[:, None] * BLOCK_N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BLOCK_N + rn[None, :], acc)

sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32",
       "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
src = triton.compiler.ASTSource(fn=gemm, signature=sig, constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
                                attrs=attrs)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
print(sorted({int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}))
'''
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / "gemm_waits.py"            # @triton.jit needs its source in a file
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    waits = json.loads(r.stdout.strip().splitlines()[-1])
    assert max(waits) >= 1, waits                  # one product left running: Triton can overlap
    prose = cell_source(CH7, "c07-ncu-md") + "\n\n" + cell_source(CH7, "c07-issue-order-md")   # around the figure
    flat_prose = " ".join(prose.split())
    assert "every wait in this kernel is `wgmma.wait_group 0`, no product left running" in flat_prose
    assert "each product is used in the iteration that made it" not in prose   # PV is used in the next
    # the cause is the issue order (products finish in order), not a wait Triton could have skipped
    assert "products finish in the order they were issued" in flat_prose
    assert ("Triton issues $P_{j-1}V_{j-1}$ at the end of one iteration and $Q K_j^\\top$ at the start "
            "of the next, so the wait that hands $Q K_j^\\top$ to the softmax must let $P_{j-1}V_{j-1}$ "
            "finish too") in flat_prose
    assert "though nothing reads it before then" not in flat_prose
    assert "where only the next product touches the accumulator, Triton does leave one running" in flat_prose
    assert "gains the most consistently" not in prose
    # Gluon's change is the order: Q K_j^T issued before P_{j-1} V_{j-1} (hopper.attend_tiles)
    assert "issues $Q K_j^\\top$ *before* $P_{j-1}V_{j-1}$ and waits for the scores only" in flat_prose
    assert "before waiting for $P_{j-1}V_{j-1}$" not in flat_prose
    import inspect
    from flashbook.kernels import hopper
    loop = inspect.getsource(hopper.attend_tiles.fn)
    assert loop.index("s = warpgroup_mma(q_smem") < loop.index("o = warpgroup_mma(p, v_smem.index(prev)")
    assert "s = warpgroup_mma_wait(1, deps=(s,))" in loop


def test_exp2_saves_instructions_not_one_multiply():
    from flashbook.bench.score_ops import NATURAL_EXP

    assert 1 + len(NATURAL_EXP) == 5                # tl.exp on sm_90: FMUL, FSETP, 2 predicated FMULs, ex2
    prose = cell_source(CH7, "36966158")
    assert "one multiply per score fewer" not in prose and "{glue:text}`exp_instrs`" in prose
    assert 'g("exp_instrs", 1 + len(NATURAL_EXP))' in cell_source(CH7, "c07-ladder")
    assert "the fully masked ones, not the masked stage's" not in prose
    # the minimal kernel already skips the tiles above the diagonal: not listed as an addition,
    # and chapter 10's rung is set against its starting kernel, which visits every tile
    assert "skipping the tiles above the diagonal" not in prose and "`skip masked tiles`" not in prose
    box = cell_source(CH7, "c07-ladder-md")
    assert "makes it visit every key tile" in " ".join(box.split()) and "{glue:text}`ladder_skip_causal`" in box


def test_the_example_grid_is_dealt_out_by_head_groups_on_sm90():
    from flashbook.kernels import configs

    cfg = configs.default("forward", cc=90, block_d=configs.block_d(128), elem_bytes=2)
    programs = -(-4096 // cfg.block_m) * 2 * 16
    sms = runtime.chip("H100").sms
    assert runtime.chip("H200").sms == sms
    assert configs.head_group(programs, sms=sms, cc=90) > 1          # the page's own example
    assert programs / sms < configs.SMALL_GRID_PROGRAMS_PER_SM
    # the head grouping is told in its own box ("Rounds, tails and HEAD_GROUP"), not in the grid's
    # lesson and not inside the box about chapter 10
    prose = cell_source(CH7, "c07-ladder-md")
    assert prose.startswith(":::{admonition} Rounds, tails and `HEAD_GROUP`")
    ahead = prose[prose.index(":::{admonition} Looking ahead: chapter 10"):]
    assert "HEAD_GROUP" not in ahead and "tail" not in ahead
    assert "(the box *Rounds, tails and `HEAD_GROUP`* above)" in cell_source(CH7, "dba5f882")
    assert "which was faster on the H200" not in prose and "per SM, a small grid" not in prose
    flat_box = " ".join(prose.split())
    assert "programs per SM: {glue:text}`big_per_sm` here." in flat_box
    assert "For a grid that small ({glue:text}`small_per_sm` or fewer per SM) on `sm_90`" in flat_box   # configs.head_group: <=
    assert 'g("big_per_sm", programs / runtime.chip("H100").sms, ".1f")' in cell_source(CH7, "d13711af")
    assert "{glue:text}`big_group`" in prose and "`HEAD_GROUP`" in prose
    assert "HEAD_GROUP" not in cell_source(CH7, "e8ba3340")
    assert "within each (batch, head) only" not in cell_source(CH7, "111fff05")
    outline = cell_source(CH7, "dba5f882")
    assert "from tl.program_id(1)" not in outline and "launch_position" in outline
    assert "`HEAVY_LAST`" in outline


def test_the_live_timing_is_not_called_a_draw_of_the_sweeps():
    """The live cell times batch 2; the sweeps batch 8. The prose says so, with each kernel's
    own TFLOP/s read from the recording and the sweeps."""
    text = _recorded7("cd762aa3")
    batch = int(re.search(r"batch (\d+)", text).group(1))
    sweeps = [bench.load_results(p)[0] for p in bench.run_paths("sweep")]
    require(sweeps, "no recorded sweeps")
    assert {int(s["batch"].iloc[0]) for s in sweeps} != {batch}
    glued = _glued(CH7, "c07-sdpa-backend", N=4096, D=128, CPU=True, re=re,
                   recorded_output=lambda notebook, cell_id: _recorded7(cell_id))
    last = sweeps[-1][(sweeps[-1]["seq"] == 4096) & (sweeps[-1]["head_dim"] == 128)]
    assert glued["sw_batch"] == str(int(last["batch"].iloc[0])) != str(batch)   # the two batches differ
    # the margins do differ between the live table and the sweeps: the prose must not hide it
    live = dict(re.findall(r"causal=(True|False): flashbook runs at (\d+)% of SDPA cuDNN's speed", text))
    assert any(f"{int(live[c])}%" not in glued[f"sw_cudnn_{'causal' if c == 'True' else 'full'}"].split(" to ")
               for c in ("False", "True"))
    prose = cell_source(CH7, "c07-sdpa-backend-md")
    flat_prose = " ".join(prose.split())
    assert "One timing is one draw" not in prose
    assert "by its own amount" not in prose                        # an inference, not a measurement
    assert ("Their margins differ from the table's because the batch and the run both differ, and no "
            "timing here separates the two.") in flat_prose
    # chapter 9's "sweep" is its block-size sweep: the repeated full runs are not called sweeps
    assert "sweep" not in prose and "full comparison runs" in prose
    intro = " ".join(cell_source(CH7, "9779eaa1").split())
    assert "It is a quick check at a small batch; chapter 9's full comparison runs" in intro
    assert "{glue:text}`t_batch`" in intro and "{glue:text}`sw_batch`" in intro   # the two batches, named


def test_chapter_7_small_wordings():
    assert "`tl.dot` must sum over at least 16" in cell_source(CH7, "6cd03bbd")
    assert "Two masks bridge that gap" in cell_source(CH7, "6e8580cf")
    assert "sectors the kernel requests" in cell_source(CH7, "c07-ncu-md")
    assert ("the L2\nserves {glue:text}`ncu_l2`% of the requests") in cell_source(CH6, "5f5032c5")
    assert "a grid of the same shape" in cell_source(CH7, "111fff05")
