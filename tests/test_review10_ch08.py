"""Chapter 8 after the tenth reading: the equal-stages spill comparison says what it shows (the
two tiles differ in height too) and the third stage's gain as time; only loaded tiles are
transposed, but for atomic dQ's dS (checked in the compiled kernel); the gradient check says why
ratios fall below 1 and what the floor's first part is for; the minimal check names its hidden
yardstick; the query_bounds figure's values are in the prose; the Three kernels cell shows the
tiles it computes."""
import json
import os

import pandas as pd
import torch

from conftest import ROOT, compile_probe, require
from flashbook import runtime
from flashbook.bench import runs
from flashbook.kernels import checks, configs
from notebook_text import cell_source, flat, markdown, run_glued

CH8 = os.path.join(ROOT, "notebooks", "08_triton_backward.ipynb")


def test_the_equal_stages_pair_differs_in_height_so_the_gap_is_not_the_spills_alone():
    """The spill-free 32 x 128 tile and the default's 64 x 128 at 2 stages differ in B_r (twice
    the loop trips, half the rows per product), not only in spilling: the prose says so, and
    gives the third stage's gain as the two-stage time's excess (t_two / t_three - 1 = 31%
    longer), not as "faster" (a reader computes 24% less time)."""
    from flashbook.bench import chapter9, chapter9_ncu, profiles
    from flashbook.bench.records import results_root

    require(runs.run_path("kernel_ncu") is not None, "no Nsight Compute run recorded")
    glued, _ = run_glued([cell_source(CH8, "4e765c85"), cell_source(CH8, "c08-dkdv-registers")],
                         configs=configs, runtime=runtime)      # the cell asserts the pair's shapes too
    ch9 = chapter9.Chapter9(root=results_root())
    chapter9_ncu.ncu(ch9)
    table = profiles.pass_table(runs.run_path("kernel_ncu"))
    tiles = {row["config_dkdv"] for _, row in table[(table["impl"] == "triton-dkdv") & (table["dim"] == 128)].iterrows()}
    assert {(32, 128, 8, 2), (64, 128, 8, 2)} <= tiles
    assert (glued["ncu_nospill_cfg"], glued["ncu_two_cfg"]) == ("32 × 128, 8 warps, 2 stages", "64 × 128, 8 warps, 2 stages")
    assert glued["ncu_stage_gain"] == "31" and glued["ncu_clean_faster"] == "3"
    t_two, t_three = float(glued["ncu_dkdv_two_ms"]), float(glued["ncu_dkdv_three_ms"])
    assert abs(100 * (t_two / t_three - 1) - 31) < 1 and abs(100 * (1 - t_three / t_two) - 24) < 1
    main = flat(cell_source(CH8, "c08-dkdv-registers-md")).split(":::{dropdown}")[0]
    assert ("The spill-free tile took {glue:text}`ncu_clean_faster`% less time (repeats varied by at most "
            "{glue:text}`ncu_repeat_spread`%), but it is also half as tall: the gap is not the spill's cost alone.") in main
    assert "at two stages it took {glue:text}`ncu_stage_gain`% longer" in main
    assert "`ncu_stage_gain`% faster" not in main and "spill cost about" not in main
    # the profile is introduced where its numbers are first used
    assert "an Nsight Compute profile on an H200 (box below) shows it going over" in main
    assert main.index("(box below) shows it going over") < main.index("In that profile, at equal num_stages,")


PROBE = r'''
import json
from triton import knobs
from flashbook.kernels import configs, targets

knobs.runtime.add_stages_inspection_hook = targets._no_assembly     # TTGIR is enough: no ptxas
cfg = configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=False)
found = {}
for atomic in (False, True):
    ttgir = targets.compile_kernel("backward_dkdv", cc=90, config=cfg, head_dim=128, dtype="bf16",
                                   causal=False, atomic_dq=atomic).asm["ttgir"].splitlines()
    trans = [line.split("=")[0].strip() for line in ttgir if " tt.trans " in line]
    found[str(atomic)] = {
        "register_trans": len(trans),                                     # a transpose of registers
        "shared_views": sum(" ttg.memdesc_trans " in line for line in ttgir),   # a transposed view of shared memory
        "trans_to_shared": sum(" ttg.local_alloc " in line and "%dq" in line.split("=")[0] for line in ttgir),
    }
print(json.dumps(found))
'''


def test_only_loaded_tiles_are_transposed_but_atomic_dqs_ds_goes_through_shared_memory(tmp_path):
    """Compiled for sm_90 (Triton's TTGIR): the separate mode's dK/dV kernel transposes Q and dO
    as views of shared memory and no register tile; the atomic mode adds tl.trans(dsT), a
    register tile that is stored to shared memory for the dQ product (one per stage copy of
    the loop: main and masked)."""
    found = {k: v for k, v in json.loads(compile_probe(tmp_path, PROBE).strip().splitlines()[-1]).items()}
    separate, atomic = found["False"], found["True"]
    assert separate["register_trans"] == 0 and separate["shared_views"] >= 2
    assert atomic["register_trans"] >= 1 and atomic["trans_to_shared"] == atomic["register_trans"]
    assert atomic["shared_views"] == separate["shared_views"]
    from flashbook.kernels import backward as bwd

    with open(bwd.__file__, encoding="utf-8") as f:
        assert "tl.trans(dsT)" in f.read()
    text = flat(cell_source(CH8, "44dc7c7c"))
    assert ("Only the loaded $Q$ and $dO$ are transposed, for $S^\\top = K Q^\\top$ and $dP^\\top = V dO^\\top$, "
            "and they can be read from shared memory either way round. A computed tile sits in registers and "
            "takes a trip through shared memory to be transposed (the atomic mode's `tl.trans(dsT)`, below).") in text
    md = flat(markdown(CH8))
    assert "no computed tile" not in md and "transposes no $P$ or $dS$" not in md
    assert "so it transposes only loaded tiles (and, for atomic $dQ$, $dS$)." in flat(cell_source(CH8, "28d0e613"))


def test_ratios_below_one_are_explained_by_what_the_yardstick_rounds():
    """Plain PyTorch in a 16-bit dtype rounds the scores (and P, dP, dS) to that dtype; the kernels
    keep them in fp32. Checked on the yardstick itself: its S is a bfloat16 tensor."""
    from flashbook.reference import torch_attention

    q, k, v = (torch.randn(1, 1, 8, 16).bfloat16() for _ in range(3))
    seen = {}
    real = torch.matmul

    def spy(a, b):
        out = real(a, b)
        seen.setdefault("first", out.dtype)
        return out

    torch.matmul = spy
    try:
        torch_attention(q, k, v)
    finally:
        torch.matmul = real
    assert seen["first"] == torch.bfloat16                  # S = scale Q K^T, rounded to bf16
    text = flat(cell_source(CH8, "aacbec1b"))
    assert ("Ratios below 1 are expected: plain PyTorch rounds $S$, $P$, $dP$ and $dS$ to the input dtype; "
            "the kernels keep them in fp32, rounding only $P$ and $dS$ for the next products.") in text
    assert "about as accurate as plain PyTorch" not in text


def test_the_minimal_check_names_its_hidden_yardstick_and_quotes_its_error():
    """The yardstick check of the minimal kernels is a remove-cell cell: the prose says "a hidden
    cell" and quotes plain PyTorch's own float16 error beside the kernels'."""
    import numpy as np
    from flashbook.kernels import flash_forward, minimal

    nb = json.load(open(CH8, encoding="utf-8"))
    hidden = next(c for c in nb["cells"] if c["id"] == "c08-minimal-glue")
    assert "remove-cell" in hidden["metadata"]["tags"]
    text = flat(cell_source(CH8, "c08-minimal-after-md"))
    assert ("A hidden cell checks every error against the rule of *Checking the gradients* below: at most "
            "twice plain PyTorch's error in the same dtype ({glue:text}`minbwd_yard_16` at most in float16), "
            "plus a small floor.") in text
    assert "without its last term" not in text       # a_X is defined only in that section
    assert "The cell also checks" not in text
    glued, _ = run_glued([cell_source(CH8, "c08-minimal-check"), cell_source(CH8, "c08-minimal-glue")],
                         quiet=True, torch=torch, pd=pd, np=np, checks=checks, minimal=minimal,
                         flash_forward=flash_forward, CPU=runtime.device() == "cpu", DEVICE=runtime.device(),
                         GPU_DTYPE=torch.float16)
    # (the cell asserts the rule itself); plain PyTorch's float16 error is of the kernels' order, ~1e-3
    assert float(glued["minbwd_worst_16"]) > 0 and 1e-4 < float(glued["minbwd_yard_16"]) < 1e-2


def test_the_query_bounds_prose_quotes_the_figures_values():
    """lo, band_end, full_end (= main_end) and hi of the outlined key tile, glued from the probe
    kernel's output that the figure draws (tests/test_lesson_ch8.py recomputes them)."""
    fig = cell_source(CH8, "c08-bounds-fig")
    assert 'for name, row in bounds.items():\n    g(f"qb_{name}", row)' in fig
    assert 'g("qb_keys", f"{x0} to {x0 + QB_BN - 1}")' in fig
    text = flat(cell_source(CH8, "c08-bounds-fig-md"))
    for name in ("qb_keys", "qb_lo", "qb_band_end", "qb_full_end", "qb_hi"):
        assert f"{{glue:text}}`{name}`" in text, name
    assert "`full_end` = {glue:text}`qb_full_end`, which is also `main_end`" in text


def test_the_three_kernels_cell_shows_the_tiles_it_computes():
    """The prose asks the cell for the tiles, and the cell ends by showing them."""
    source = cell_source(CH8, "4e765c85")
    assert source.rstrip().endswith("\ntiles")
    glued, ns = run_glued([source], configs=configs)
    assert ns["tiles"][("dkdv", False)] == "64 × 64" and ns["tiles"][("dkdv", True)] == "64 × 128"
    text = flat(cell_source(CH8, "72756c7a"))
    assert "The cell below computes them" not in text and "The cell below asks it" in text


def test_the_relaxed_atomic_cost_that_remains_is_said_to_be_unexplained():
    text = flat(cell_source(CH8, "4571a510"))
    assert "That remaining cost was not broken down." in text
