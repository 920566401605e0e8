"""Chapters 11 and 12, which_kernel and what_real_fa_adds after the fifth review: the statements
found wrong or unclear stay fixed. Each test reads what a corrected sentence rests on (the
library, a benchmark script, a recorded run) and the page's source; where the sentence quotes a
number, the number the page glues is recomputed from the data."""
import inspect
import json
import os
import re

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import ROOT, benchmark_script, require
from flashbook import bench
from notebook_text import book_page, cell_ids, cell_source, flat, markdown, page_glued, run_glued

CH11, CH12 = "11_decoding_and_many_gpus", "12_masks"


_page_glued = page_glued


def _h200():
    from flashbook import runtime

    return runtime.chip("H200")


# --- chapter 11 ---------------------------------------------------------------------------------

def test_ch11_and_which_kernel_list_the_page_sizes_flash_decode_takes():
    """Finding 1 (wrong): "of 16 to 256 tokens" read as a range, yet flash_decode takes five sizes
    and refuses the rest (48, or flash-attn's 512)."""
    from flashbook.kernels import decode, flash_decode

    assert decode.PAGE_SIZES == (16, 32, 64, 128, 256)
    want = "16, 32, 64, 128 or 256"
    glued, _ = run_glued(cell_source(CH11, "c11-19"), decode=decode, H200=_h200(), block_n=64)
    assert glued["page_sizes"] == want
    assert _page_glued("which_kernel.md")["page_sizes"] == want
    q = torch.zeros(1, 2, 1, 16, dtype=torch.float16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    for page in (48, 512):           # between two sizes; a size flash-attn takes (a multiple of 256)
        pages = torch.zeros(2, 2, page, 16, dtype=torch.float16)
        with pytest.raises(ValueError, match=re.escape(f"must be one of {decode.PAGE_SIZES}, got {page}")):
            flash_decode(q, pages, pages, block_table=table, cache_seqlens=torch.tensor([1]))
    text = flat(cell_source(CH11, "5a7c24f0"))
    assert "of 16 to 256 tokens" not in text
    assert "with a page size of {glue:text}`page_sizes` tokens (other sizes are refused)" in text
    page = flat(book_page("which_kernel.md"))
    assert ("(pages, kv_heads, page size, head_dim), with a page size of {glue:text}`page_sizes` tokens "
            "(other sizes are refused)") in page


def test_ch11_and_which_kernel_say_every_paged_timing_used_64_token_pages():
    """Finding 2: every recorded paged timing cut the cache into decode_bench.PAGE_SIZE-token pages,
    each holding a whole key tile (one page index per tile); pages smaller than a tile (vLLM's 16)
    take the row gather, which the sweep timed at up to 13% more than the one-index read."""
    from flashbook.bench import chapter11, decoding
    from flashbook.kernels import decode

    decode_bench = benchmark_script("decode_bench")
    repeats = bench.run_paths("decode_repeats")
    require(len(repeats) == 3, "no recorded decoding repeats")
    pages = decoding.paged_pages(repeats)
    assert pages == {"page_size": decode_bench.PAGE_SIZE, "block_n": 64, "head_dim": 128}
    # the kernel's tile at the runs' shape (32 heads on 8 KV heads, one new token: 4 rows), and the path taken
    assert decode.decode_tiles(128, 2, 4, page_size=pages["page_size"], interpreter=False)[1] == pages["block_n"]
    assert pages["page_size"] >= pages["block_n"] > 16           # whole tiles in a page; vLLM's 16 gathers
    assert "TILE_IN_PAGE and page_size >= block_n" in " ".join(inspect.getsource(decode).split())
    # the sweeps and the profiles cut pages with the same constant
    src = open(os.path.join(ROOT, "benchmarks", "decode_bench.py"), encoding="utf-8").read()
    assert src.count("decode.paginate(k, v, PAGE_SIZE,") == 3   # flash_decode-paged, the sweeps, kvcache-paged-*
    ncu = open(os.path.join(ROOT, "benchmarks", "decode_ncu.py"), encoding="utf-8").read()
    assert "from decode_bench import PAGE_SIZE" in ncu and "decode.paginate(k, v, PAGE_SIZE," in ncu

    glued, _ = run_glued(cell_source(CH11, "c11-m6"), repeats=decoding.repeat_ratios(repeats),
                         REPEATS=repeats, pd=pd)
    assert glued["page_timed"] == "64" and glued["page_tile"] == "64"
    # the gather's cost, from the sweep that timed both reads at the chosen split counts
    sweeps = [pd.read_csv(p / "decode_splits.csv") for p in bench.run_paths("decode_splits")]
    chosen = sweeps[-1][sweeps[-1]["chosen"]].pivot_table(index=["batch", "seq"], columns="cache",
                                                          values="graph_ms")
    cost = 100 * (1 - chosen["paged"] / chosen["paged-rows"])
    glued, _ = run_glued([cell_source(CH11, "c11-m2"), cell_source(CH11, "c11-m3")], quiet=True,
                         bench=bench, chapter11=chapter11, pd=pd, H200=_h200())
    assert (glued["ncu_first_wave"], glued["ncu_last_wave"]) == ("396", "116")   # 512 programs, 3 per SM, 132 SMs
    assert glued["rows_cost"] == f"{cost.min():.0f} to {cost.max():.0f}" and f"{cost.max():.0f}" == "13"
    text = flat(markdown(CH11))
    assert ("The chapter's other paged timings, all but the split-count gain above, used "
            "{glue:text}`page_timed`-token pages, which hold a whole {glue:text}`page_tile`-key tile at "
            "$d$ = 128") in text
    # the split-count gain was timed before the one-index tile (decode_h200-3/1_splits_before)
    assert "Every paged timing here used" not in text
    # next to the dense gain it belongs with, naming the gather it was timed with
    assert ("{glue:text}`split_gain_dense`% less time than one on a dense cache and {glue:text}`split_gain_paged`% "
            "less on a paged cache (timed with the per-row page gather)") in text
    before = bench.run_paths("decode_splits")[0]
    assert before.name == "1_splits_before" and "a page index per key row" in (before.parent / "README.md").read_text()
    assert "such as vLLM's default of 16 tokens, take the per-row gather instead" in text
    assert "the one-index tile took {glue:text}`rows_cost`% less time than the gather" in text
    assert "(pages of {glue:text}`page_timed` tokens; medians of three runs)" in flat(cell_source(CH11, "c11-45"))
    assert _page_glued("which_kernel.md")["dec_page"] == "64" and _page_glued("which_kernel.md")["dec_page_d"] == "128"
    assert ("A paged cache ran at {glue:text}`dec_paged_lo` to {glue:text}`dec_paged_hi` times the dense one's "
            "speed (head_dim {glue:text}`dec_page_d` with {glue:text}`dec_page`-token pages, one page per key tile; "
            "other page and head sizes were not timed)" in book_page("which_kernel.md"))


def _gqa_ring(rank, world):
    """One rank's output and the whole sequence's GQA attention: K/V repeated to q's heads first."""
    from flashbook import distributed

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 32, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 32, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    shards = [distributed.shard(x, rank, world, layout="zigzag") for x in (q, k, v)]
    o = distributed.ring_attention(*shards, causal=True, layout="zigzag")
    return float((o - distributed.shard(want, rank, world, layout="zigzag")).abs().max())


def test_ring_attention_needs_as_many_kv_heads_and_has_only_the_causal_mask():
    """Finding 3: ring_attention refuses K/V with fewer heads than q, and takes no mask but the
    causal one; repeating K/V first, as the pages now say, gives GQA's answer."""
    from flashbook import distributed

    q, kv = torch.zeros(1, 4, 32, 16), torch.zeros(1, 2, 32, 16)
    with pytest.raises(ValueError, match="q, k and v shards must have the same shape"):
        distributed._check_inputs(q, kv, kv, True, None, "zigzag")
    assert list(inspect.signature(distributed.ring_attention).parameters) == [
        "q", "k", "v", "causal", "scale", "layout", "group"]          # no window, softcap, prefix, ALiBi
    errors = distributed.spawn(_gqa_ring, 2, timeout_s=60)
    assert max(errors) < 1e-12, errors
    text = flat(cell_source(CH11, "c11-ring-call"))
    assert "`ring_attention` needs as many K/V heads as query heads" in text
    assert "(`k.repeat_interleave(heads // kv_heads, dim=1)`, and `v` likewise)" in text
    assert "Its only mask is the causal one: no window, soft cap, prefix or ALiBi (the masks of {doc}`chapter 12 <12_masks>`)." in text
    row = next(line for line in book_page("which_kernel.md").splitlines()
               if line.startswith("| one sequence spread over several GPUs"))
    assert "K and V need as many heads as q[^ring]" in row and "causal mask only" in row
    note = next(line for line in book_page("which_kernel.md").splitlines() if line.startswith("[^ring]:"))
    assert "repeat K and V first (`k.repeat_interleave(heads // kv_heads, dim=1)`" in note
    assert "multiplies the bytes each hop of the ring sends by heads / kv_heads" in note   # GQA's cost on the ring


def test_ch11_says_the_two_gpu_speedup_compares_triton_with_triton():
    """Finding 4: the ring's blocks run chapter 7/8's Triton kernels, and ring_bench times the one
    GPU with backend="triton"; the default call would take the Gluon forward at these shapes."""
    from flashbook import distributed
    from flashbook.kernels import autograd, hopper_choices

    ring_bench = open(os.path.join(ROOT, "benchmarks", "ring_bench.py"), encoding="utf-8").read()
    single = ring_bench.split("def _single(")[1].split("\ndef ")[0]
    assert 'flashbook.flash_attention(*leaves, causal=causal, backend="triton")' in single
    assert "flash_forward(" in inspect.getsource(distributed.block_forward)
    assert "flash_backward(" in inspect.getsource(distributed.block_backward)
    assert "_attn_fwd" in inspect.getsource(autograd.flash_forward)           # chapter 7's kernel
    path = bench.latest_results(csv_name="ring.csv")
    require(path is not None, "no recorded ring run")
    ring = pd.read_csv(path)
    assert set(ring["causal"]) == {True} and set(ring["head_dim"]) == {128}
    for n in ring["n"]:         # within the Gluon kernel's head sizes, and not where it measured slower
        assert not hopper_choices.slower_than_triton(128, int(n), int(n), True)
    text = flat(cell_source(CH11, "c11-45"))                         # "How the ring was timed"
    assert ("Both sides run chapter 7's Triton forward and chapter 8's backward (one GPU's is "
            "`flash_attention(..., backend=\"triton\")`), so the speedup compares like with like") in text
    assert ("the default call, which takes chapter 10's Gluon forward at these shapes, is not in this "
            "comparison") in text


def test_ch11_says_spawn_needs_a_function_from_a_module():
    """Finding 5: spawned processes import fn by name, so a function a notebook cell defines
    (in __main__) cannot be sent to them."""
    from flashbook import distributed

    assert "``fn`` must be importable" in distributed.spawn.__doc__
    cell = {"__name__": "__main__"}
    exec("def fn(rank, world):\n    return rank\n", cell)            # as a notebook cell defines it
    with pytest.raises(Exception, match="pickle"):
        distributed.spawn(cell["fn"], 2, timeout_s=20)
    text = flat(cell_source(CH11, "c11-37"))
    assert ("`fn` must live in a module, because the new processes import it by name: a function "
            "defined in a notebook cell cannot be spawned.") in text


def test_ch11_host_paragraph_separates_the_called_times_from_the_host_times():
    """Finding 6: the called times (14-139 us) are not the host's: the host's 37 and 29 us hide
    behind the flush before each call; the host's time per call is the one that sets the pace.
    The host's numbers now all come from one run (the checked path 130 us against the short
    path's 37 us); the earlier tree's 192 us is named as such."""
    import json

    from flashbook.bench import chapter11

    decoded = chapter11.decode_shares()
    require(decoded is not None, "no recorded decoding run")
    code = [cell_source(CH11, c) for c in ("c11-h2", "c11-h3")]
    glued, ns = run_glued(code, quiet=True, chapter11=chapter11, pd=pd, ours=decoded[2])
    require(ns["host_table"] is not None, "no recorded host runs")
    runs = bench.run_paths("decode_host")
    newest = json.loads((runs[-1] / "host.json").read_text())["2048"]
    assert glued["short_checked"] == f"{newest['checked_path']['median_us']:.1f}"   # as the table rounds it
    assert glued["short_after"] == f"{newest['call']['median_us']:.0f}"
    assert glued["short_host_cudnn"] == f"{newest['sdpa_cudnn']['median_us']:.0f}"
    assert "short_before" not in glued        # an earlier tree's call time: not a lesson, no longer shown
    flush_us = 256 * 2**20 / (_h200().hbm_tb_s * 1e12) * 1e6        # c11-25's flush_us
    ours, cudnn = float(glued["short_after"]), float(glued["short_host_cudnn"])
    assert cudnn < ours < flush_us                                  # both hide; ours is still slower
    assert float(glued["gpu_2k_us"]) < ours                        # and the host outlasts the GPU's work
    glued25, _ = run_glued([cell_source(CH11, "c11-24"), cell_source(CH11, "c11-25")], quiet=True,
                           H200=_h200(), torch=torch)
    assert glued25["flush_us"] == f"{flush_us:.0f}"
    # the lesson in the reading flow, the run bookkeeping in the optional box after it
    lesson, box = cell_source(CH11, "1029602f").split(":::{dropdown} The measurements (optional)\n")
    assert box.rstrip().endswith(":::")
    lesson, box = flat(lesson), flat(box)
    assert "{glue:text}`short_gain` times less than the checked path" in lesson
    assert "short_before" not in box + lesson and "An earlier tree" not in box + lesson
    assert "All host times come from one run" in box
    assert ("`flash_decode` ({glue:text}`short_after` µs) is still slower there than cuDNN "
            "({glue:text}`short_host_cudnn` µs)") in lesson
    against = flat(cell_source(CH11, "c11-h10").split("### Against cuDNN")[1])   # above its table
    assert ("The next table's times come from calling each kernel from Python, yet they hide the host's share. "
            "Before each call the timer writes 256 MiB to empty the L2 cache; while the GPU spends at least "
            "{glue:text}`flush_us` µs on that, the host prepares the call, so a host cost under "
            "{glue:text}`flush_us` µs never shows.") in against and "flush_us" not in box + lesson
    assert "slightly slower" not in lesson + box and "short_fd" not in cell_source(CH11, "c11-h3")


def test_ch11_intensity_is_heads_per_kv_head_only_in_two_byte_types():
    """Finding 7 (nit): 4 H n d / (2 H_kv n d bytes) = 2 H / (H_kv bytes): H / H_kv in 2 bytes."""
    heads, kv_heads = 32, 8
    for bytes_per, want in ((2, heads / kv_heads), (1, 2 * heads / kv_heads)):
        assert 4 * heads * 128 / (2 * kv_heads * 128 * bytes_per) == want
    assert ("FLOP per byte, which is `2 * heads / (kv_heads * bytes_per)`: with 2-byte values, simply the "
            "query heads per KV head (32/8 = 4; 8 in a 1-byte type)") in flat(cell_source(CH11, "c11-26"))
    assert "(heads per KV head, in a 2-byte type)" in flat(cell_source(CH11, "c11-45"))


def test_ch11_imports_decode_plainly_and_says_where_normalised_rows_is():
    """Finding 8 (nit): no __import__ idiom; normalised_rows comes after the loop, outside the
    excerpts shown."""
    from flashbook.display import source
    from flashbook.kernels import decode

    code = cell_source(CH11, "c11-14")
    assert "__import__" not in code and code.startswith("from flashbook.kernels import decode\n")
    full = source(decode._decode_fwd, without=decode.LATER)
    shown = full.split("acc, row_max, row_sum = attend(")[1].split("DOT_PRECISION)")[0]
    assert "normalised_rows" not in shown and full.index("normalised_rows") > full.index("_paged_stage(")
    assert ("4. **The result.** After the loop, `normalised_rows` (not shown above; "
            "`flashbook.show_source(decode._decode_fwd, without=decode.LATER)` prints it) turns"
            in flat(cell_source(CH11, "c11-15")))


# --- chapter 12 ---------------------------------------------------------------------------------

def test_ch12_says_the_flex_tables_causal_row_ran_the_triton_kernels():
    """Finding 9: masks_bench times the causal row with backend="triton"; the default call takes
    the Gluon forward there (d = 128, causal, the lengths of the table)."""
    from flashbook.kernels import hopper_choices

    bench_src = open(os.path.join(ROOT, "benchmarks", "masks_bench.py"), encoding="utf-8").read()
    causal = bench_src.split('elif name == "causal":')[1].split("else:")[0]
    assert 'flashbook.flash_attention(q, k, v, causal=True, backend="triton")' in causal
    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rows = json.load(open(path / "masks.json"))["rows"]
    assert {r["backend"] for r in rows} == {"triton"}
    for r in (r for r in rows if r["mask"] == "causal"):
        assert r["head_dim"] == 128 and not hopper_choices.slower_than_triton(128, r["seq"], r["seq"], True)
    text = flat(cell_source(CH12, "448189c1"))
    assert ("The causal row runs the same Triton kernels as the masked rows (`backend=\"triton\"`), so that "
            "every row compares one kernel; the default call takes the Gluon forward there (chapter 10).") in text


def test_ch12_introduces_flexattention_before_measuring_against_it():
    """Finding 10: FlexAttention is said to be torch's torch.compile-generated kernel from a Python
    mask function at its first mention, before any table compares with it."""
    text = flat(markdown(CH12))
    intro = flat(cell_source(CH12, "76fc7ff6"))
    assert ("compares the result on an H200 with PyTorch's FlexAttention (`torch.nn.attention.flex_attention`, "
            "torch 2.5 and later), where `torch.compile` turns a mask written as a Python function into a "
            "Triton kernel. The last section maps each rule of this chapter onto it.") in intro
    assert text.index("`torch.nn.attention.flex_attention`, torch 2.5") < text.index("compiled FlexAttention")
    assert text.index("torch 2.5 and later") < text.index("Flex ÷ ours")
    assert "FlexAttention came with torch 2.5" in cell_source(CH12, "c12-flex-table")
    after = markdown(CH12).split("## Coming from FlexAttention")[1]       # the last section before the end matter
    assert re.findall(r"^## (.+)$", after, re.M) == ["Summary", "Exercises", "Further reading"]


def test_ch12_names_the_call_plan_where_it_describes_it():
    """Finding 11: "call plans" (the table's columns) is defined where the mechanism is, and tied to
    chapter 11's "short path"."""
    from flashbook.kernels import decode, launch

    assert "Signature -> plan" in launch.Plans.__doc__ and "decode._Plan" in launch.__doc__
    assert inspect.isclass(decode._Plan)
    text = flat(cell_source(CH12, "b98bd1a6"))
    assert ("remembers each *call signature* (shapes, strides, dtypes, devices, alignment, flags) and its "
            "launches: the call's *plan*. A call that finds its plan takes chapter 11's short path") in text
    assert "The profile behind the table's first row, before and with call plans" in flat(cell_source(CH12, "a5000337"))
    assert "takes the *short path*" in cell_source(CH11, "1029602f")


def test_ch12_tile_count_sentence_names_one_tile_and_the_others_come_after_the_table():
    """Finding 12: one tile shape before the table; the Gluon forward's and the short window's,
    with the 0.125 it visits, after it: in "What mattered for speed", next to the small tiles
    (round 5: the detour left "Three kinds of tile", which keeps a pointer to it)."""
    from flashbook import masks
    from flashbook.kernels import configs, hopper_choices

    before = flat(cell_source(CH12, "29e6aa0d"))
    assert before.endswith("with $128 \\times 64$ tiles, the H200 Triton forward's for the causal mask "
                           "at $d$ = 128:")
    assert "Gluon" not in before and "frac_w1k_own" not in before
    after = flat(cell_source(CH12, "c12-tile-shapes"))
    assert ("The default call (`backend=\"auto\"`) takes chapter 10's "
            "{term}`Gluon` forward for the plain causal mask on an H100 or H200, and it uses $128 \\times 128$ "
            "tiles. A short window's forward uses {glue:text}`w1k_tile` tiles, and a 1K window then visits "
            "{glue:text}`frac_w1k_own` of them") in after
    assert "Gluon" not in cell_source(CH12, "57939711")
    assert '"Which tiles each kernel runs" in "What mattered for speed"' in flat(cell_source(CH12, "57939711"))
    ids = cell_ids(CH12)
    assert ids.index("29e6aa0d") < ids.index("7791a783") < ids.index("57939711")   # the table between
    assert ids.index("b98bd1a6") < ids.index("c12-tile-shapes") < ids.index("c12-tile-table") \
        < ids.index("a5000337")   # after the list of what mattered for speed
    assert hopper_choices.default_config(128, 8192, True)[:2] == (128, 128)
    glued, _ = run_glued([cell_source(CH12, "7791a783"), cell_source(CH12, "eb979f00")],
                         rng=np.random.default_rng(12), masks=masks, np=np, pd=pd)
    own = configs.default("forward", cc=90, block_d=128, elem_bytes=2, window=True)
    assert glued["w1k_tile"] == f"{own.block_m} × {own.block_n}" == "64 × 64"
    assert glued["frac_w1k_own"] == "0.125" != glued["frac_w1k"]


def test_ch12_says_the_long_window_boundary_was_chosen_not_timed():
    """Finding 13 (nit): LONG_WINDOW = 2048 lies between the two windows the sweeps timed."""
    from flashbook.bench import chapter12
    from flashbook.kernels import configs

    order = chapter12.window_order()
    require(order is not None, "runs window_order and window_tiles are not recorded")
    sweeps = json.load(open(bench.run_path("window_tiles")))["sweeps"]
    assert order["windows"] == sorted({s["window"] for s in sweeps}) == [1024, 4096]
    assert configs.LONG_WINDOW == 2048 and "not between" in inspect.getsource(configs)
    glued, _ = run_glued(cell_source(CH12, "e16e7c60"), quiet=True, np=np, pd=pd)
    assert glued["wo_timed"] == "1K and 4K" and glued["wo_long"] == "2048"
    assert ("a window of {glue:text}`wo_long` keys or more (a boundary between the two lengths timed, "
            "{glue:text}`wo_timed`)") in flat(cell_source(CH12, "b98bd1a6"))


def test_ch12_nits_one_k_window_and_the_learn_list():
    """Findings 14 and 15 (nits): the table's (1024, 0) is one key more than the counts' (1023, 0);
    every bullet but the last ends with ";"."""
    from flashbook import masks

    assert masks.allowed(4096, 4096, causal=True, window=(1024, 0))[-1].sum() == 1025
    assert masks.allowed(4096, 4096, causal=True, window=(1023, 0))[-1].sum() == 1024
    assert '"window 1K, causal": dict(causal=True, window=(1023, 0))' in cell_source(CH12, "7791a783")
    assert ("a window `(1024, 0)` holds 1,025 keys (one more than the tile counts' `(1023, 0)` above)"
            in flat(cell_source(CH12, "448189c1")))
    learn = cell_source(CH12, "76fc7ff6").split("## What you will learn")[1]
    bullets = [flat(b) for b in learn.strip().split("\n- ")]
    assert len(bullets) == 7
    assert all(b.endswith(";") for b in bullets[:-1]) and bullets[-1].endswith(".")


# --- what_real_fa_adds and which_kernel -----------------------------------------------------------

def test_what_real_fa_adds_defines_persistent_programs_and_footnotes_the_layouts():
    """Findings 16 and 17 (nits): "persistent programs" said in place, as A3 defines them; the
    warpsPerCTA detail in a footnote, out of the FA2 paragraph."""
    page = book_page("what_real_fa_adds.md")
    text = flat(page)
    assert ("Persistent programs (only as many as the GPU holds at once, each walking from one query tile "
            "to the next) were never faster") in text
    a3 = flat(markdown("A3_lab_notes"))
    assert "launches only as many programs as the GPU holds at once, and each walks from one query tile" in a3
    fa2 = flat(page.split("## FlashAttention-2")[1].split("[^triton-warps]:")[0])
    assert "warpsPerCTA" not in fa2
    assert ("Triton makes this choice for you: on Hopper each {term}`warpgroup` (four warps) owns 64 rows "
            "when the tile has 128") in fa2
    assert page.count("[^triton-warps]") == 2                       # one reference, one definition
    note = flat(page.split("[^triton-warps]:")[1].split("## ")[0])
    assert "`warpsPerCTA` [8, 1] and [4, 2]" in note and "both warpgroups compute the same score tile" in note


def test_what_real_fa_adds_says_what_warp_specialisation_buys_beyond_num_stages():
    """Chapter 6's num_stages pipeline already overlaps loads with products (the computing warps
    issue the copies); what FlashAttention-3's producer warps add is that the consumers spend no
    instructions or registers on loads (setmaxnreg) and the loads run on their own schedule."""
    text = flat(book_page("what_real_fa_adds.md"))
    assert "so loading the next $K_j$, $V_j$ overlaps the current step" not in text
    assert ("Chapter 6's `num_stages` pipeline already overlaps loads with products, but there the "
            "computing warps issue the loads themselves.") in text
    assert ("Here they spend no instructions or registers on loads (Hopper's `setmaxnreg` instruction "
            "hands the producer's spare registers to them)") in text


def test_which_kernel_leads_with_chapter_12s_flex_headline():
    """Finding 18, and the masks row against the chapter it links: the row leads with chapter 12's
    headline (from 8K on: wins, ties, the forward range), counted with chapter 12's function over
    chapter 12's rows; 3.38, a short host-bound 4K call whose repeats spread widely, is quoted nowhere,
    and the footnote says why the 4K calls are left out of the row."""
    from flashbook.bench import chapter12

    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rows = json.load(open(path / "masks.json"))["rows"]
    long_rows = [r for r in rows if r["seq"] > 4096]             # chapter 12's cell 588254b7
    verdicts = chapter12.flex_verdicts(long_rows)["fwd"]
    ratios = [r["flex_over_flashbook_fwd"] for r in long_rows]
    short = [r for r in rows if r["seq"] <= 4096]
    assert {r["seq"] for r in short} == {4096} and min(r["seq"] for r in long_rows) == 8192
    noisy = 100 * max(max(r["flashbook"]["spread"]["fwd"], r["flex"]["spread"]["fwd"]) for r in short)
    glued = _page_glued("which_kernel.md")
    assert (glued["mk_long_wins"], glued["mk_long_n"], glued["mk_long_ties"]) == (
        str(verdicts["win"]), str(len(long_rows)), str(verdicts["tie"])) == ("20", "21", "1")
    assert (glued["mk_long_lo"], glued["mk_long_hi"]) == (f"{min(ratios):.2f}", f"{max(ratios):.2f}") == ("1.10", "1.62")
    assert glued["mk_fwd_noisy"] == f"{noisy:.0f}" and noisy > 80
    assert glued["mk_short_n"] == "4K" and glued["mk_fwd_hi"] == "3.38"
    page = book_page("which_kernel.md")
    assert ("from 8K tokens on, the forward ran at {glue:text}`mk_long_lo` to {glue:text}`mk_long_hi` times "
            "compiled FlexAttention's speed: faster in {glue:text}`mk_long_wins` of {glue:text}`mk_long_n` shapes, "
            "tied in {glue:text}`mk_long_ties`[^flex]") in page          # chapter 12's headline
    assert "mk_fwd_steady" not in page and "whose repeats agreed within 3%[^flex]" not in page
    assert ("The row leaves out the short calls at {glue:text}`mk_short_n`, as chapter 12's headline does: the "
            "CPU's work sets their time, and their forward repeats spread by up to {glue:text}`mk_fwd_noisy`%. "
            "With them, the forward was faster beyond the run-to-run noise in {glue:text}`mk_fwd_wins` of "
            "{glue:text}`mk_shapes`") in page
    assert "{glue:text}`mk_fwd_hi`" not in page                # a ratio that noisy is quoted nowhere
    assert "forward {glue:text}`mk_fwd_lo` to {glue:text}`mk_fwd_hi` times its speed, faster" not in page
    ch12 = flat(markdown("12_masks"))
    assert ("from 8K tokens on, flashbook's forward was faster than compiled FlexAttention's in "
            "{glue:text}`mb_fwd_wins_long` of {glue:text}`mb_rows_long` shapes and tied in "
            "{glue:text}`mb_fwd_ties_long`") in ch12
    assert "FlexAttention took {glue:text}`mb_fwd_lo_long` to {glue:text}`mb_fwd_hi_long` times flashbook's time" in ch12


def test_num_splits_zero_points_a_flash_attn_user_to_none():
    """Finding 19 (nit): flash-attn's num_splits=0 (its heuristic) is None here; the page says so,
    and decode_choices.check_num_splits's message does."""
    from flashbook.kernels import decode_choices

    with pytest.raises(ValueError, match=r"num_splits must be >= 1, got 0: pass num_splits=None for the "
                                         r"library's choice \(what flash-attn's num_splits=0 asks for\)"):
        decode_choices.check_num_splits(0)
    with pytest.raises(ValueError, match=f"at most {decode_choices.MAX_SPLITS}"):
        decode_choices.check_num_splits(decode_choices.MAX_SPLITS + 1)
    with pytest.raises(TypeError, match="num_splits must be an integer"):
        decode_choices.check_num_splits(2.0)
    assert decode_choices.check_num_splits(4) == 4
    page = flat(book_page("which_kernel.md"))
    assert ("`num_splits=None` chooses the split (flash-attn's `num_splits=0` raises a `ValueError` here: "
            "pass `None`).") in page
