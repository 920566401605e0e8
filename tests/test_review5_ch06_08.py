"""Chapters 6, 7 and 8 after the fifth review: the corrected statements, pinned to what makes them true.

Chapter 6: the hierarchy figure's alt text (shared memory's lead over HBM differs by chip), the
rule behind the table of K/V buffers (where `tl.dot` reads its operands), the chip table's terms
announced before it. Chapter 7: where `exp2`'s saving comes from (the flush-to-zero `ex2`, not
only the folded multiply), the fused multiply-add as Triton's default, why small grids are dealt
out by heads, how `stages` is called, the `wgmma` paragraph split, the 16-bit `tl.dot` minimum.
Chapter 8: the register count of the dK/dV kernel, why so few elements of the atomic dQ differ,
what `tl.atomic_add` compiles to, the recording note in plain words.
"""
import json
import math
import os
import re
import sys

import pytest
import torch

from conftest import ROOT, compile_probe, require
from flashbook import runtime
from flashbook.bench import runs
from flashbook.kernels import configs
from flashbook.kernels.forward import launch_position, query_tile_index
from notebook_text import cell_ids, cell_source, find_cell, flat, markdown, run_glued

import triton  # noqa: E402  (after flashbook: it decides GPU or interpreter first)
import triton.language as tl  # noqa: E402

CH6 = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")
CH7 = os.path.join(ROOT, "notebooks", "07_triton_forward.ipynb")
CH8 = os.path.join(ROOT, "notebooks", "08_triton_backward.ipynb")


def _compile_here(tmp_path, code: str) -> dict:
    """The one JSON line ``code`` prints, run by ``conftest.compile_probe``."""
    return json.loads(compile_probe(tmp_path, code).strip().splitlines()[-1])


# --- chapter 6 -------------------------------------------------------------------------------

def test_the_hierarchy_alt_text_does_not_claim_ten_times_on_every_chip():
    """Shared memory over HBM: 25x on the T4 but 7x on the H200 (whose HBM is the fastest), so
    "about ten or more times faster on every chip" was wrong."""
    ratio = {name: c.smem_tb_s / c.hbm_tb_s for name, c in runtime.CHIPS.items()}
    assert all(r > 1 for r in ratio.values())
    assert min(ratio, key=ratio.get) == "H200" and ratio["H200"] < 10
    assert max(ratio, key=ratio.get) == "T4"
    assert max(runtime.CHIPS, key=lambda n: runtime.CHIPS[n].hbm_tb_s) == "H200"
    alt = find_cell(CH6, "05cb731f")["metadata"]["mystnb"]["image"]["alt"]
    assert "ten or more times" not in alt
    assert ("shared memory is faster than HBM on every chip, by the least on the H200 (whose HBM is "
            "the fastest) and by the most on the T4") in alt


def _staging_table(prose: str) -> dict:
    """The prose's table of B_c x d tiles: {row name: [tiles at 1, 2, 3 stages]}."""
    rows = {}
    for name, cells in re.findall(r"^\| (`sm_\d+`|the model) \|(.*)\|$", prose, re.M):
        rows[name.strip("`")] = [int(x) for x in cells.split("|")]
    return rows


def test_the_staging_table_follows_where_tl_dot_reads_its_operands():
    """Per operand, s - 1 buffers on sm_80 (mma.sync reads the tile into registers) and s on
    sm_90 (wgmma reads shared memory while it runs), one buffer in all at one stage: the table
    (which tests/test_review_ch06.py compiles) is that rule, K and V together."""
    prose = cell_source(CH6, "49527e1d")
    table = _staging_table(prose)
    assert table["sm_80"] == [1] + [2 * (s - 1) for s in (2, 3)]
    assert table["sm_90"] == [1] + [2 * s for s in (2, 3)]
    # the stages in the flow with the figure shown right after them, the compiled detail in a box
    # (tests/test_plots_pipeline.py checks the figure)
    main = flat(cell_source(CH6, "c06-buffers-md"))
    text = flat(prose)
    ids = cell_ids(CH6)
    assert (ids.index("c06-buffers-md") + 1 == ids.index("c06-pipeline-fig")
            == ids.index("c06-buffers-model") - 1 < ids.index("49527e1d"))
    assert prose.startswith(":::{dropdown} How Triton really allocates the buffers (optional)\n")
    assert "hide-output" not in find_cell(CH6, "c06-pipeline-fig")["metadata"]["tags"]   # shown in the flow
    # stages defined as the compiled loop runs them (the refill after tile j's products, so s - 2
    # copies under way), so that "2 stages" is never read as "overlap"; chapter 4's "in flight" counts
    # buffers. Other programs hide the wait only where they fit, and chapter 7's d = 128 forward has
    # none (tests/test_review12_ch06.py checks its numbers)
    assert ("With `num_stages` = $s \\ge 2$, Triton issues the copy of key tile $j + s - 1$ right after tile $j$'s "
            "products. So while tile $j + 1$ is multiplied, the copies of tiles $j + 2, \\dots, j + s - 1$ are under "
            "way: none at $s$ = 2 (on `sm_90`, at attention's tile sizes, the copy, issued after $PV$, overlaps it), one at $s$ = 3, two at $s$ = 4. "
            "At $s$ = 1 a tile is copied in, then used. Where no copy is under way, only other programs on the SM "
            "can hide the wait") in main
    assert "one from $s$ = 3" not in main
    assert "the SM hides the wait by running other programs" not in main
    assert ("The book's model counts one $K$ and one $V$ tile of shared memory per stage "
            "([chapter 4](04_tiled_forward.ipynb)'s \"two or three $K$, $V$ tiles in flight\" counts these "
            "buffers, not overlapping copies).") in main
    # the flow introduces the figure (shown right after) and names the box that reads it; the model
    # over-counts at worst (said in the figure's terms: panels per number of stages, sm_80 left, sm_90 right)
    assert ("The figure draws four key tiles, one panel per number of stages, `sm_80` left and `sm_90` "
            "right (read in the optional box *How Triton really allocates the buffers*).") in main
    # the model the panel titles count comes before the figure, not after it
    assert r"\text{bytes} &= 2\,\bigl(B_r d + 2\,\texttt{num}\_\texttt{stages}\,B_c d\bigr)" in main
    assert "so at worst the model over-counts" in main
    after = flat(cell_source(CH6, "c06-buffers-model"))
    # the 2-stage panels are read in the optional box, not in the flow
    assert ("So in the figure the `sm_80` 2-stage panel fills buffer 1 exactly as the 1-stage panel does: "
            "the program waits for every copy. On `sm_90` at 2 stages the copy, issued right after "
            "$P_j V_j$ is, overlaps that product (the dark bar), not the softmax or the next $QK^\\top$. From 3 stages (the bottom panels) copies overlap "
            "products; the box *Measured on an H200* times the gain.") in text
    assert "2-stage panel" not in main + after and "dark bar" not in main + after and "P_j V_j" not in main + after
    assert "wgmma" not in main + after                          # the box names the instruction
    assert "the figure draws the timeline of one stage" not in main
    # the flow no longer promises an overlap that the box takes back at two stages
    assert "the copies for later iterations start while this one computes" not in main
    assert "Each stage of `num_stages` = $s$" not in main
    assert "let the copy of a later $K$, $V$ tile start before the current one is used" not in main
    assert "Fewer copies than that are under way" not in main
    assert "extra copies" not in main + text and "the pipeliner adds room" not in main + text
    # the order of the compiled loop (the refill after both products) and where the refill goes
    assert "issues the copies of the first $s - 1$ key tiles before the loop, then runs as the main text says" in text
    assert "right after tile $j$'s products. So while tile $j + 1$ is multiplied, the copies of tiles" in main
    # at two stages: no overlap on sm_80; on sm_90 the refill overlaps the end of P_j V_j, as drawn
    # (said above, in the figure's terms)
    assert "a program overlaps none of its copies with its own products" not in main + text
    assert "the refill reuses its buffer: $s - 1$ buffers each of $K$ and $V$" in text
    assert "the product $P_j V_j$ is still running when the refill is issued: it needs another buffer, $s$ each" in text
    assert "at one stage Triton does not pipeline: a tile is copied in, then used." in text
    assert "the copies of the next $s - 1$ key tiles are under way while" not in main + text
    assert "(at one stage they take\nturns in one buffer)" in prose          # the table's 1s
    alt = find_cell(CH6, "c06-pipeline-fig")["metadata"]["mystnb"]["image"]["alt"]
    assert "at one and two stages no copy overlaps" not in alt
    assert "at two only the tail of a P V product on sm_90" in alt


def test_the_chip_tables_terms_are_announced_before_the_table():
    """arch and ridge appear in the table's columns before the prose defines them: the sentence
    above the table says what they are, and the definitions do follow it."""
    text = flat(cell_source(CH6, "0748095b"))
    assert ("In the table, *arch* is the compute capability and the *ridge* is where arithmetic, not "
            "memory, becomes the limit; both are explained below it.") in text
    # sm_80 is named with its chip where the bullets first use it, and the SXM sentence names its table
    assert ("From the A100 on (`sm_80`, its {term}`compute capability`, explained below the table), "
            "Triton runs `tl.dot` on the tensor cores") in text
    assert "The A100 and H100 in the table below are the SXM boards" in text and "Its A100" not in text
    # no sources table: the citations above the table name the documents
    assert "{cite}`nvidia_t4_datasheet,nvidia_a100_datasheet,nvidia_h100_datasheet,nvidia_h200_datasheet`" in text
    assert '"arch": c.arch' in cell_source(CH6, "f5a20a5d") and '"ridge for tl.dot' in cell_source(CH6, "f5a20a5d")
    defined = flat(cell_source(CH6, "7296465f"))
    assert "{term}`compute capability`" in defined and "**ridge point**" in defined
    ids = cell_ids(CH6)
    assert ids.index("0748095b") < ids.index("f5a20a5d") < ids.index("7296465f")


# --- chapter 7 -------------------------------------------------------------------------------

EXP_PROBE = r'''
import json, re
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.tools.disasm import get_sass


@triton.jit
def natural(X, Y):
    i = tl.arange(0, 128)
    tl.store(Y + i, tl.exp(tl.load(X + i)))


@triton.jit
def base2(X, Y):
    i = tl.arange(0, 128)
    tl.store(Y + i, tl.exp2(tl.load(X + i)))


@triton.jit
def folded(X, Y, s, m):                     # the kernel's exponent: qk * qk_scale - new_max
    i = tl.arange(0, 128)
    tl.store(Y + i, tl.exp2(tl.load(X + i) * s - m))


two = {"X": "*fp32", "Y": "*fp32"}
four = {"X": "*fp32", "Y": "*fp32", "s": "fp32", "m": "fp32"}
out = {}
for name, fn, sig, options in (("natural", natural, two, {}), ("base2", base2, two, {}),
                               ("folded", folded, four, {}), ("unfused", folded, four, {"enable_fp_fusion": False})):
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig), target=GPUTarget("cuda", 90, 32),
                       options=options)
    ptx = k.asm["ptx"]
    sass = get_sass(k.asm["cubin"])
    out[name] = {"ex2": re.findall(r"ex2\.approx[.\w]*", ptx), "fma": len(re.findall(r"\bfma\.rn\.f32", ptx)),
                 "sass": re.findall(r"(@!?P\d\s+)?\b(FMUL|FSETP|MUFU\.EX2|FFMA|FADD)\b", sass)}
print(json.dumps(out))
'''


@pytest.mark.slow(seconds=15)
def test_exp2_saves_the_subnormal_guard_more_than_the_folded_multiply(tmp_path):
    """On sm_90 tl.exp is a multiply by log2(e) and the non-ftz ex2.approx.f32, which ptxas
    guards with a range test and a predicated multiply before and after MUFU.EX2 (5 in all);
    tl.exp2 is the flush-to-zero ex2, MUFU.EX2 alone. The folded exponent is one FFMA, and
    it is fused only because Triton fuses by default (off: FMUL + FADD)."""
    from flashbook.bench.score_ops import NATURAL_EXP

    found = _compile_here(tmp_path, EXP_PROBE)
    ops = {name: [op for _, op in r["sass"]] for name, r in found.items()}
    assert found["natural"]["ex2"] == ["ex2.approx.f32"] and found["base2"]["ex2"] == ["ex2.approx.ftz.f32"]
    assert ops["natural"] == ["FMUL", "FSETP", "FMUL", "MUFU.EX2", "FMUL"]
    assert [bool(p) for p, _ in found["natural"]["sass"]] == [False, False, True, False, True]   # predicated
    assert len(ops["natural"]) == 1 + len(NATURAL_EXP)      # what chapter 7 glues as exp_instrs
    assert ops["base2"] == ["MUFU.EX2"]
    assert ops["folded"] == ["FFMA", "MUFU.EX2"] and found["folded"]["fma"] == 1
    assert ops["unfused"] == ["FMUL", "FADD", "MUFU.EX2"] and found["unfused"]["fma"] == 0
    # the guard is most of the saving: folding saves one multiply, the guard three more
    assert len(ops["natural"]) - len(ops["base2"]) - 1 == 3

    item = flat(cell_source(CH7, "36966158"))
    assert ("**`exp2` with the scale folded in**: on `sm_90`, `tl.exp` compiles to "
            "{glue:text}`exp_instrs` machine instructions, `tl.exp2` to one;") in item
    assert "to one (`exp2`)" not in item
    text = flat(cell_source(CH7, "832d2080"))
    # fused by default in the versions run; Triton 3.9 announces the default turns off in 3.10
    assert "each exponent as `qk * qk_scale - new_max`, one fused multiply-add." in text
    assert ("The exponent is one fused multiply-add because the Triton versions this book runs fuse a "
            "multiply and an add by default. Triton 3.9 announces that 3.10 will stop fusing by default "
            "(`TRITON_DEFAULT_FP_FUSION`); the exponent would then take a multiply and an add.") in text
    assert "from Triton 3.10, only if asked" not in text          # 3.10 is announced, not released
    assert "up to version" not in text                # read as "no longer after it"
    # the five instructions, named in the order ops["natural"] has them above
    assert ("Folding saves one multiply per score; most of the saving is elsewhere. `tl.exp` becomes a "
            "multiply by $\\log_2 e$ and `ex2.approx.f32` in PTX (the virtual instruction set Triton emits), "
            "which on `sm_90` is {glue:text}`exp_instrs` machine instructions: the multiply; a test for an "
            "exponent below $-126$; if so, a halving of it; the {term}`special-function unit`'s $2^x$ "
            "instruction; and, if so, a squaring of the result ($2^x = (2^{x/2})^2$), to get results too "
            "small for a normal float32 (subnormals) right. `tl.exp2` becomes `ex2.approx.ftz.f32`, which "
            "flushes those to zero (*ftz*): the $2^x$ instruction alone.") in text
    for undefined in ("MUFU", "predicated", "SASS"):  # machine-code names the page does not define
        assert undefined not in text, undefined
    assert ("Flushing results below $2^{-126}$ changes nothing here: each weight is at most 1, "
            "a row's sum at least 1.") in text
    assert float.fromhex("0x1p-126") == 2.0 ** -126   # fp32's smallest normal number


@triton.jit
def _first_tiles(OUT, CAUSAL: tl.constexpr, HEAD_GROUP: tl.constexpr):
    tile = query_tile_index(CAUSAL, HEAD_GROUP)
    _, bh = launch_position(HEAD_GROUP)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)       # the order the GPU starts them
    tl.store(OUT + 2 * pid, tile)
    tl.store(OUT + 2 * pid + 1, bh)


def _heaviest_start(tiles, heads, group):
    """Launch position of each head's heaviest (last) query tile under a causal mask."""
    out = torch.full((tiles * heads, 2), -1, dtype=torch.int32, device=runtime.device())
    _first_tiles[(tiles, heads)](out, CAUSAL=True, HEAD_GROUP=group)
    order = [tuple(r) for r in out.cpu().tolist()]
    return [order.index((tiles - 1, h)) for h in range(heads)]


def test_small_grids_are_dealt_out_by_heads_so_the_heaviest_tiles_start_early():
    """In plain order the last head's heaviest tile starts after every other head's tiles; dealt
    out 4 heads at a time, the heaviest tiles of 4 heads start first. A3's run: the grouping
    gained at 512 causal programs and nothing beyond the spread from 2,048 on, on either side of
    the library's threshold."""
    tiles, heads = 4, 8
    assert _heaviest_start(tiles, heads, 1) == [h * tiles for h in range(heads)]
    group = configs.SMALL_GRID_HEAD_GROUP
    assert sorted(_heaviest_start(tiles, heads, group)[:group]) == list(range(group))

    with open(os.path.join(ROOT, "benchmarks", "results", "launch_order_h200", "run1_groups.json")) as f:
        rows = [r for r in json.load(f)["rows"] if r["mask"] == "causal"]
    sms = runtime.chip("H200").sms
    for r in rows:
        programs = r["seq"] // 128 * r["batch"] * r["heads"] * (2 if r["head_dim"] == 64 else 1)
        gain = r["speedup_vs_G1"][f"G={group}"]["fwd"]
        if programs / sms <= configs.SMALL_GRID_PROGRAMS_PER_SM:
            assert gain > 1.1, r["shape"]
        else:
            assert gain < 1.03, r["shape"]

    text = flat(cell_source(CH7, "e8ba3340"))
    assert ("under a causal mask the last query tile does the most work, and a heavy tile started last "
            "finishes last while the other SMs sit idle (a *tail*). Hence the reverse order.") in text
    box = flat(cell_source(CH7, "c07-ladder-md"))
    assert ("The tail matters most in a grid of few rounds (a round: one program on every SM). Only one "
            "program with these tiles fits in an SM's shared memory, so the grid runs in about as many rounds "
            "as it has programs per SM") in box
    # only one program of the library's sm_90 forward tiles at d = 128 fits an SM: a second would not
    from flashbook import runtime as rt, smem
    from flashbook.kernels import configs as cfgs
    big = cfgs.default("forward", cc=90, block_d=128, elem_bytes=2)
    need = smem.smem_bytes(big.block_m, big.block_n, 128, num_stages=big.num_stages, arch="sm_90")
    assert need <= rt.chip("H200").smem_per_block_bytes < 2 * need
    assert "so that the heaviest tiles of several heads start early" in box


def test_the_page_shows_how_stages_is_called():
    """Exercise 3 says "use `stages`": the cell that defines it shows its call and its answer."""
    from flashbook.kernels import probes

    source = cell_source(CH7, "55326011")
    assert ('# stages(n_q, n_k, block_m, block_n, causal) -> (T_r, T_c) array of "main", "masked", '
            '"skipped"') in source
    kinds = probes.stage_map(64, 64, 16, 32, True)
    assert kinds.shape == (64 // 16, 64 // 32)
    assert set(kinds.ravel()) <= {"main", "masked", "skipped"} and "skipped" in set(kinds.ravel())
    assert "(use `stages`)" in cell_source(CH7, "8bf94f44")


def test_the_what_limits_it_text_is_three_paragraphs():
    """The busy figures, then why (wgmma, the warpgroup, and, after the issue-order figure,
    Triton's waits), then what Gluon changes."""
    paragraphs = [flat(p) for p in cell_source(CH7, "c07-ncu-md").split("\n\n")]
    after = [flat(p) for p in cell_source(CH7, "c07-issue-order-md").split("\n\n")]
    busy = next(p for p in paragraphs if p.startswith("The difference is in the tensor cores"))
    assert "wgmma" not in busy and "{glue:text}`ncu_tc_cudnn` in cuDNN's." in busy
    why = next(p for p in paragraphs if p.startswith("Why?"))
    assert "Overlap needs a product still running while the softmax works" in why
    assert "{term}`warpgroup`: 4 warps" in why and "Gluon" not in why      # defined before the figure
    lead = after[0]                                                         # the figure's upper timeline, plainly
    assert lead.startswith("In the upper timeline the softmax and the products take turns")
    assert "waits for *every* product it has issued" in lead and "wait_group" not in lead
    waits = next(p for p in after if p.startswith(":::{dropdown} Why Triton waits for every product (optional)"))
    assert "`wgmma.wait_group 0`" in waits and "Triton does leave one running." in waits and "Gluon" not in waits
    gluon = next(p for p in after if p.startswith("Chapter 10 writes a kernel in {term}`Gluon`"))
    assert "producer" in gluon and "wait_group" not in gluon


def test_the_tl_dot_minimum_of_16_is_for_16_bit_inputs():
    """Triton's sm_80/sm_90 minimum K is 16 for 16-bit inputs, 8 for fp32; the library pads every
    head_dim to a power of two of at least 16 whatever the dtype."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import min_dot_size

    for cc in (80, 90):
        check = min_dot_size(GPUTarget("cuda", cc, 32))
        assert check(tl.float16, tl.float16)[2] == check(tl.bfloat16, tl.bfloat16)[2] == 16
        assert check(tl.float32, tl.float32)[2] == 8
    for d in range(1, 257):
        bd = configs.block_d(d)
        assert bd >= max(d, 16) and bd & (bd - 1) == 0, d
    text = flat(cell_source(CH7, "6cd03bbd"))
    assert ("and a 16-bit `tl.dot` must sum over at least 16 ($QK^\\top$ sums over $d$). The library rounds "
            "`head_dim` up to a power of two no smaller than that, `BLOCK_D` (`configs.block_d`), for every "
            "dtype") in text


# --- chapter 8 -------------------------------------------------------------------------------

def test_the_dkdv_register_count_is_chapter_6s_arithmetic():
    """dK_j + dV_j: 2 x 64 x 128 fp32 over 4 warps = 128 registers per thread; the two 64 x 64
    score tiles 32 each: 192 of 255 before the inputs (the causal 64 x 128 tile over 8 warps
    gives the same)."""
    from flashbook.bench import chapter8   # noqa: F401  (the cell imports it too)

    glued, _ = run_glued([cell_source(CH8, "4e765c85"), cell_source(CH8, "c08-dkdv-registers")],
                         configs=configs, runtime=runtime)
    for causal in (False, True):
        cfg = configs.default("backward_dkdv", cc=90, block_d=configs.block_d(128), elem_bytes=2, causal=causal)
        threads = cfg.num_warps * 32
        assert 2 * cfg.block_n * 128 / threads == 128 and cfg.block_m * cfg.block_n / threads == 32
    assert (glued["dkdv_keys"], glued["dkdv_bd"], glued["dkdv_count_warps"]) == ("64", "128", "4")
    assert glued["dkdv_score_tile"] == "64 × 64"
    assert (glued["dkdv_acc_regs"], glued["dkdv_score_regs"], glued["dkdv_counted"]) == ("128", "32", "192")
    assert glued["max_regs"] == "255" and 192 < 255
    assert "remove-input" in find_cell(CH8, "c08-dkdv-registers")["metadata"]["tags"]
    ids = cell_ids(CH8)
    # the outline and the inner loop first, then the register budget
    assert (ids.index("4e765c85") < ids.index("05720969") < ids.index("36ef4b4a")
            < ids.index("c08-dkdv-registers") < ids.index("c08-dkdv-registers-md"))
    text = flat(cell_source(CH8, "c08-dkdv-registers-md"))
    assert ("$dK_j$ and $dV_j$ alone are 2 × {glue:text}`dkdv_keys` × "
            "{glue:text}`dkdv_bd` fp32 values, {glue:text}`dkdv_acc_regs` registers per thread over "
            "{glue:text}`dkdv_count_warps` warps. The two {glue:text}`dkdv_score_tile` fp32 score tiles "
            "($P^\\top$, and $dP^\\top$, which becomes $dS^\\top$) add {glue:text}`dkdv_score_regs` each: "
            "{glue:text}`dkdv_counted` of a thread's {glue:text}`max_regs` before the rest. The causal "
            "default ({glue:text}`tile_dkdv_causal`, {glue:text}`dkdv_warps_causal` warps) counts the same: "
            "twice the keys over twice the threads.") in text
    # on sm_90 the input tiles stay in shared memory (wgmma reads K, V, Q and dO from there); what
    # the tensor cores read from registers is the 16-bit copies of P^T and dS^T
    assert "before the input tiles" not in text and "With the input tiles and the addresses on top" not in text
    assert ("On an H100 or H200 the tensor cores read $K$, $V$, $Q$ and $dO$ from shared memory, but "
            "$P^\\top$ and $dS^\\top$ from registers, as 16-bit copies,") in text
    assert ("Count as chapter 6 did, for the unmasked default tile ({glue:text}`tile_dkdv_full`, "
            "{glue:text}`dkdv_warps_full` warps):") in text


def test_the_spill_free_tiles_named_are_those_the_profile_ran():
    """Under the causal mask the profile (kernel_ncu, Triton 3.6) ran two dK/dV tiles that do not
    spill: 32 x 128 with 8 warps (4.22 ms) and 64 x 64 with 8 warps (5.88 ms, 27% more tensor
    operations than the default), both slower than the spilling default, 64 x 128 with 8 warps and
    3 stages (3.62 ms). The causal default was never run with more warps, as the page once said."""
    from flashbook.bench import chapter8, profiles   # noqa: F401  (the cell imports them too)

    require(runs.run_path("kernel_ncu") is not None, "no Nsight Compute run recorded")
    glued, _ = run_glued([cell_source(CH8, "4e765c85"), cell_source(CH8, "c08-dkdv-registers")],
                         configs=configs, runtime=runtime)
    table = profiles.pass_table(runs.run_path("kernel_ncu"))
    tiles = table[(table["impl"] == "triton-dkdv") & (table["mask"] == "causal") & (table["dim"] == 128)]
    by_config = {row["config_dkdv"]: row for _, row in tiles.iterrows()}
    default = by_config[(64, 128, 8, 3)]
    fast, slow = by_config[(32, 128, 8, 2)], by_config[(64, 64, 8, 2)]
    assert default["spill_mb"] > 0 and fast["spill_mb"] == slow["spill_mb"] == 0
    assert sorted(tiles[tiles["spill_mb"] == 0]["config_dkdv"]) == [(32, 128, 8, 2), (64, 64, 8, 2)]
    assert glued["spill_default_ms"] == f"{default['us'] / 1000:.2f}" == "3.62"
    # the tiles are named with their stages, as chapter 9 names them (the default has 3, these 2)
    assert (glued["nospill_fast_tile"], glued["nospill_fast_ms"]) == ("32 × 128, 8 warps, 2 stages", "4.22")
    assert (glued["nospill_slow_tile"], glued["nospill_slow_ms"]) == ("64 × 64, 8 warps, 2 stages", "5.88")
    assert glued["nospill_slow_more_ops"] == f"{slow['ops_ratio'] / default['ops_ratio'] - 1:.0%}" == "27%"
    assert glued["ncu_triton"] == "3.6.0"
    text = flat(cell_source(CH8, "c08-dkdv-registers-md"))
    assert "run with more warps, which does not spill" not in text
    for name in ("spill_default_ms", "nospill_fast_tile", "nospill_fast_ms", "nospill_slow_tile", "nospill_slow_ms",
                 "nospill_slow_more_ops", "ncu_triton"):
        assert f"{{glue:text}}`{name}`" in text, name


def test_the_spill_is_weighed_at_equal_stages_with_chapter_9s_numbers():
    """The causal default (3 stages) spills and the spill-free 32 x 128 tile was profiled with 2:
    the main text compares the dK/dV kernel at equal stages (2.80 against 2.89 ms) and gives the
    third stage its own gain (2.21 ms), the values chapter 9 glues, read by the same function."""
    from flashbook.bench import chapter9, chapter9_ncu
    from flashbook.bench.records import results_root

    require(runs.run_path("kernel_ncu") is not None, "no Nsight Compute run recorded")
    glued, _ = run_glued([cell_source(CH8, "4e765c85"), cell_source(CH8, "c08-dkdv-registers")],
                         configs=configs, runtime=runtime)
    ch9 = chapter9.Chapter9(root=results_root())
    chapter9_ncu.ncu(ch9)
    names = ("ncu_nospill_cfg", "ncu_two_cfg", "ncu_spill_cfg", "ncu_dkdv_clean_ms", "ncu_dkdv_two_ms",
             "ncu_dkdv_three_ms", "ncu_clean_faster", "ncu_stage_gain")
    assert {name: glued[name] for name in names} == {name: ch9.values[name] for name in names}
    assert (glued["ncu_dkdv_clean_ms"], glued["ncu_dkdv_two_ms"], glued["ncu_dkdv_three_ms"]) == ("2.80", "2.89", "2.21")
    assert glued["ncu_nospill_cfg"].endswith("2 stages") and glued["ncu_two_cfg"].endswith("2 stages")
    text = flat(cell_source(CH8, "c08-dkdv-registers-md"))
    main = text.split(":::{dropdown}")[0]
    for name in names:
        assert f"{{glue:text}}`{name}`" in main, name
    assert "made the backward slower than the spilling default" not in text and "so the default stays" not in text
    assert "clocks not locked" in text
    # the profile's own repeats (the same kernel and tile profiled again) spread by about 1%, less
    # than the 3% gap at equal stages: the gap is not noise, but the two tiles differ in height too
    # (32 against 64 query rows), so it is not the spill's cost alone (tests/test_review10_ch08.py)
    assert glued["ncu_repeat_spread"] == "1" and float(glued["ncu_repeat_spread"]) < float(glued["ncu_clean_faster"])
    assert "within the noise of one profiled run" not in text and "At equal depth" not in text
    assert "at equal num_stages" in main and "{glue:text}`ncu_repeat_spread`%" in main
    assert "so the spill cost" not in main and "the gap is not the spill's cost alone" in main
    assert "(The profile did not run the spill-free tile with a third stage.)" in main
    # the whole-backward times name the stages of both tiles
    assert ("took {glue:text}`spill_default_ms` ms with the default and "
            "{glue:text}`nospill_fast_ms` ms with {glue:text}`nospill_fast_tile`") in text


def test_the_floor_is_not_called_tiny_and_its_bf16_part_is_stated():
    """In bfloat16 the floor's second part, half a step at the largest value (eps / 2 = 2^-8 of it),
    is about as large as the errors of the recorded rows, so the ratio columns are the real test;
    the unused ``allow`` is not explained."""
    from flashbook.kernels import checks

    assert torch.finfo(torch.bfloat16).eps / 2 == 2.0 ** -8
    want = torch.zeros(8)
    want[0] = 4.0
    _, floor = checks.error_bound(want.bfloat16(), want, want, head_dim=128)
    assert floor == pytest.approx(8 * 128 ** 0.5 * torch.finfo(torch.float32).eps * 5 + 2.0 ** -8 * 4)
    prose = flat(cell_source(CH8, "d562dda1"))
    assert "tiny floor" not in prose and "is 0 in this chapter" not in prose
    assert "$2^{-8}\\max|X_{64}|$ in bfloat16" in prose and "the real test is the table's `/ yardstick` columns" in prose
    # the displayed rule is the whole rule checks.backward_problems applies: O's error carried into dQ, dK
    assert "+ \\text{floor} + a_X.\\end{aligned}$$" in prose and "`checks.output_error_allowance`" in prose
    assert "the ratios below carry the evidence" not in prose
    assert "{glue:text}`worst_yard`" in cell_source(CH8, "aacbec1b")


def test_padding_rows_add_nothing_to_dk_and_dv_because_do_and_delta_load_as_0():
    """The sentence beside load_lse, against the source: masked loads give 0 for rows past
    seq_q (load_tile's other=0.0 for Q and dO, load_lse and delta's loads)."""
    import inspect

    from flashbook import tiled

    from flashbook.kernels import backward as bwd, forward as fwd

    assert "other=0.0" in inspect.getsource(fwd.load_lse.fn)
    assert "Rows past ``seq_q`` read 0" in inspect.getsource(fwd.load_lse.fn)
    assert "x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)" in inspect.getsource(fwd.load_tile.fn)
    inner = inspect.getsource(bwd._bwd_dkdv_inner.fn)
    assert "delta = tl.load(delta_base + rows, mask=rows < seq_q, other=0.0)" in inner
    text = flat(cell_source(CH8, "c08-load-lse-md"))
    assert "They still add nothing to $dK$ and $dV$: their $dO$ and delta load as 0 too" in text


def test_few_atomic_dq_elements_differ_because_bf16_rounding_hides_the_fp32_order():
    """The recorded run (relaxed adds; 606 of 16,777,216 elements of dQ on the H200, 646 on the
    H100 the book shows now) differs by at most 4.9e-04, which is one bfloat16 step (2^-11) for values in [2^-4, 2^-3); bf16 keeps 8
    significant bits."""
    recorded = runs.recorded_output("08_triton_backward", "43428188")
    require(recorded is not None, "no recorded chapter 8 outputs")
    glued, _ = run_glued(cell_source(CH8, "c08-determinism-glue"), math=math, torch=torch, runtime=runtime)
    line = re.search(r"dq_mode='atomic'\s+dQ: bitwise equal: False\s+\((\d+) of (\d+) elements differ, "
                     r"max difference (\S+)\)", recorded)
    differ, total, biggest = int(line[1]), int(line[2]), float(line[3])
    assert (glued["det_differ"], glued["det_total"]) == (f"{differ:,}", f"{total:,}")
    assert total == 16_777_216 and 0 < differ        # the H200 run: 606; the H100 run it shows now: 646
    gpu = runs.gpu_record("08_triton_backward")["provenance"]["gpu"]
    assert glued["det_gpu"] in ("H100", "H200") and glued["det_gpu"] in gpu
    assert glued["bf16_bits"] == "8" and torch.finfo(torch.bfloat16).eps == 2.0 ** -7
    # one bf16 step between 2^-4 and 2^-3 is 2^-11, and that is the difference printed
    for x in (2.0 ** -4, 0.1, 2.0 ** -3 - 2.0 ** -11):
        v = torch.tensor(x, dtype=torch.bfloat16)
        assert float(torch.nextafter(v, torch.tensor(1.0, dtype=torch.bfloat16)) - v) == 2.0 ** -11
    assert f"{2.0 ** -11:.1e}" == f"{biggest:.1e}" == glued["det_max"] == "4.9e-04"
    assert glued["det_binade"] == "2⁻⁴ and 2⁻³"
    assert differ < 1e-4 * total
    ids = cell_ids(CH8)
    assert ids.index("43428188") < ids.index("c08-determinism-glue") < ids.index("c08-determinism-md")
    assert ids.index("c08-determinism-md") == ids.index("1f02617c") - 1
    text = flat(cell_source(CH8, "c08-determinism-md"))
    assert ("In the recorded {glue:text}`det_gpu` run only {glue:text}`det_differ` of the "
            "{glue:text}`det_total` elements of the atomic dQ differ. A new order changes the fp32 sums "
            "in their last bits, and the final rounding to bfloat16, {glue:text}`bf16_bits` significant "
            "bits, hides almost all of that. The elements that differ sat next to a rounding boundary and "
            "moved by one bf16 step ({glue:text}`det_max` is one step for values between "
            "{glue:text}`det_binade`).") in text


ATOMIC_PROBE = r'''
import json, re
from triton import knobs
from flashbook.kernels import configs, targets

knobs.runtime.add_stages_inspection_hook = targets._no_assembly     # PTX is enough: no ptxas
found = {}
for cc in (80, 90):
    cfg = configs.default("backward_dkdv", cc=cc, block_d=128, elem_bytes=2, causal=True)
    ptx = targets.compile_kernel("backward_dkdv", cc=cc, config=cfg, head_dim=128, dtype="bf16",
                                 causal=True, atomic_dq=True).asm["ptx"]
    found[cc] = sorted(set(re.findall(r"\b(?:red|atom)\.global[.\w]*", ptx)))
print(json.dumps(found))
'''


@pytest.mark.slow(seconds=30)
def test_tl_atomic_add_compiles_to_vector_adds_on_sm90(tmp_path):
    """The atomic dK/dV kernel's dQ adds: red.global.gpu.relaxed.add.v4.f32 on sm_90 (four fp32
    values per instruction), the scalar .add.f32 on sm_80; not "element by element"."""
    found = _compile_here(tmp_path, ATOMIC_PROBE)
    assert found["90"] == ["red.global.gpu.relaxed.add.v4.f32"]
    assert found["80"] == ["red.global.gpu.relaxed.add.f32"]
    text = flat(cell_source(CH8, "4571a510"))
    assert "element by element" not in text
    assert "red.global" not in flat(markdown(CH8)) and "{doc}`A3 <A3_lab_notes>`" in text   # the PTX: in A3
    a3 = flat(cell_source(os.path.join(ROOT, "notebooks", "A3_lab_notes.ipynb"), "a3-atomic-fence-verdict"))
    assert ("The adds come from registers: on `sm_90` Triton compiles `tl.atomic_add` to a short vector add "
            "per instruction, `red.global.gpu.relaxed.add.v4.f32` (four fp32 values), on `sm_80` to one value "
            "per instruction, `red.global.gpu.relaxed.add.f32`. A whole-tile reduce-add from shared memory, as "
            "FlashAttention-3's, was not measured here.") in a3


def test_chapter_8_was_recorded_as_it_stands_so_no_note_is_explained():
    """Every recorded chapter-8 cell has its current source, so the page shows no "recorded with an
    earlier version" box and the prose explains none."""
    import hashlib

    sys.path.insert(0, os.path.join(ROOT, "book", "_ext"))
    import gpu_outputs

    record = runs.gpu_record("08_triton_backward")
    require(record is not None, "no recorded chapter 8 outputs")
    for cell in record["cells"]:
        source = cell_source(CH8, cell["id"])
        assert hashlib.sha256(source.encode("utf-8")).hexdigest() == cell["source_sha256"], cell["id"]
    text = flat(cell_source(CH8, "aacbec1b"))
    assert gpu_outputs.CHANGED_NOTE not in text and "The note above the table" not in text
    assert "at the recording it always ran these" not in text


def test_the_dq_map_says_why_it_comes_from_the_probe_and_the_table_names_chapter_5s_loop():
    """The lse poison cannot separate the dQ kernel's stages (it guards lse in both), so the page
    says why that map comes from causal_bounds; the line-by-line table's dQ rows quote chapter 5's
    second_pass loop, whose default is "atomic"; the exercise checks print their lines at once."""
    import inspect

    from flashbook import tiled

    assert inspect.signature(tiled.backward).parameters["dq_strategy"].default == "atomic"
    poison = flat(cell_source(CH8, "d293fbe6"))
    assert "The lse poison cannot tell the dQ kernel's stages apart, as that kernel guards lse in both stages" in poison
    assert "the NaN poison confirms its visits" in poison
    pre = flat(cell_source(CH8, "a00f956c"))
    assert "The dQ rows quote chapter 5's `dq_strategy=\"second_pass\"` loop (its default is `\"atomic\"`;" in pre
    assert "atomic-style" not in pre
    assert "tiled._dq_second_pass" in cell_source(CH8, "3d2cd161")
    for cid in ("23ace976", "786cb54f"):
        test = cell_source(CH8, cid)
        assert test.count("print(") == 1 and 'print("\\n".join(lines))' in test, cid
