"""Chapter 11 after the tenth reading: the wave model's fixed 2 programs per SM set against the 3
that fit (planned and real waves named apart), the 16K ring's unhidden transfer traced to the
overlapped direct call, the intensity as a formula, whose tile the paged figure shows, the ring's
neighbours mod W and the summary's unit."""
import inspect
import types

from conftest import require
from flashbook import bench, runtime
from flashbook.bench import decoding
from flashbook.kernels import decode
from notebook_text import cell_source, flat, run_glued

CH11 = "11_decoding_and_many_gpus"


def test_planned_waves_and_real_waves_are_named_apart():
    """choose_num_splits plans 2 programs per SM (a fixed guess, said so); Nsight Compute found 3:
    512 programs are nearly two planned waves and 1.29 real ones."""
    per_sm = inspect.signature(decode.choose_num_splits).parameters["programs_per_sm"].default
    assert per_sm == 2 and "fixed guess" in " ".join(decode.choose_num_splits.__doc__.split())
    sms = runtime.chip("H200").sms
    assert 1.5 < 64 * 8 / (per_sm * sms) < 2                      # "nearly two planned waves"
    ncu = bench.run_paths("decode_ncu")
    require(len(ncu) >= 2, "no recorded Nsight Compute profiles")
    before = next(s for s in decoding.ncu_steps(ncu[-2])
                  if (s["impl"], s["batch"], s["seq"]) == ("dense", 64, 32768))
    assert before["per_sm"] == 3 and before["waves"] == round(64 * 8 / (3 * sms), 2)   # the real ones
    text = flat(cell_source(CH11, "c11-20"))
    assert "nearly two planned waves ({glue:text}`ncu_waves_before` real ones)" in text
    assert "nearly two waves" not in text
    plan = flat(cell_source(CH11, "c11-17"))
    assert ("per SM, a fixed guess: {glue:text}`plan_per_sm` fit an SM with a full tile of {glue:text}`max_rows` "
            "query rows, {glue:text}`ncu_per_sm` with the {glue:text}`min_tile`-row tile") in plan
    assert "so real waves are fewer than planned ones" in plan


def test_the_intensity_is_a_formula_of_the_cells_numbers():
    heads, kv_heads, d, n = 32, 8, 128, 32768
    for bytes_per in (1, 2):
        flops, kv_bytes = 4 * heads * n * d, 2 * kv_heads * n * d * bytes_per
        assert flops / kv_bytes == 2 * heads / (kv_heads * bytes_per)
    assert "heads, kv_heads, d, n, bytes_per = 32, 8, 128, 32768, 2" in cell_source(CH11, "c11-24")
    assert ("FLOP per byte, which is `2 * heads / (kv_heads * bytes_per)`: with 2-byte values, simply the query "
            "heads per KV head (32/8 = 4; 8 in a 1-byte type)") in flat(cell_source(CH11, "c11-26"))


def test_the_paged_figures_tile_is_named_with_where_it_runs():
    """16 keys is the interpreter's tile; a GPU's (128 at d = 64 in 16-bit) spans two 64-token pages,
    so each page is then read by one split and each row gathered from its own page: the glued
    sentence follows the tile, and the interpreter's says what a GPU does."""
    assert decode.decode_tiles(64, 2, 2, page_size=64, interpreter=True)[1] == 16
    gpu_tile = decode.decode_tiles(64, 2, 2, page_size=64, interpreter=False)[1]
    assert gpu_tile == 128
    code = cell_source(CH11, "c11-h7")
    import torch
    for block_n, interpret, want, gather in (
            (16, True, "(16 keys in Triton's interpreter), so a page may be read by two splits",
             "On a GPU a tile is 128 keys, 2 of these pages, so each row is gathered from its own page."),
            (gpu_tile, False, "(128 keys on this GPU, 2 pages each), so each page is read by one split",
             "Each row of a tile is gathered from its own page."),
            (64, False, "(64 keys on this GPU, one page each), so each page is read by one split", None)):
        glued, _ = run_glued(code, quiet=True, torch=types.SimpleNamespace(equal=lambda a, b: True), paged=0,
                             dense=0, block_n=block_n, runtime=types.SimpleNamespace(INTERPRET=interpret),
                             decode=decode, q=torch.zeros(1, dtype=torch.bfloat16))
        assert want in glued["paged_splits"], glued["paged_splits"]
        assert (gather in glued["paged_splits"]) if gather else ("gathered" not in glued["paged_splits"])
    # a GPU's 128-key tile over 64-token pages takes the per-row gather, not TILE_IN_PAGE
    assert not 64 >= gpu_tile
    text = flat(cell_source(CH11, "c11-h8"))
    assert "{glue:text}`paged_splits`" in text and "keys here" not in text


def test_ring_neighbours_are_mod_w_and_the_summary_counts_score_blocks():
    ring = flat(cell_source(CH11, "c11-m7"))
    assert "receives the next from rank $r - 1$ (mod $W$)" in ring
    summary = flat(cell_source(CH11, "c11-45"))
    assert "units of waiting" not in summary
    assert ("a ring time of {glue:text}`zigzag_steps` score blocks against {glue:text}`contig_steps` "
            "for contiguous shards") in summary
