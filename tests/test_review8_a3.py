"""Review round 8, appendix A3 (lab notes): the compile failures said as the run records them,
what an `acq_rel` add compiles to, and the notes moved here from chapters 7, 9, 10, 11 and 12.
Every number A3 quotes is recomputed here from the recorded files, independently of
``flashbook.bench.experiments.moved_notes`` (which glues them), where that is cheap."""
import csv
import json
import os
import re
import xml.etree.ElementTree as ET

import pytest

from conftest import RESULTS, ROOT, compile_probe, require
from notebook_text import cell_ids, flat, markdown, notebook, sources_by_id

A3 = "A3_lab_notes.ipynb"


@pytest.fixture(scope="module")
def src():
    """A3's cells by id, their text flattened."""
    return {k: flat(v) for k, v in sources_by_id(notebook(A3)).items()}


@pytest.fixture(scope="module")
def ch(recorded_chapter10):
    return recorded_chapter10


def _index() -> dict:
    return json.load(open(os.path.join(RESULTS, "index.json")))["runs"]


def _paths(name) -> list:
    path = _index()[name]["path"]
    return [os.path.join(RESULTS, p) for p in ([path] if isinstance(path, str) else path)]


def _span(values, fmt) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo} to {hi}"


# --- item 9: the compile failures, as hopper_fwd_h200.json records them ----------------------------

def test_the_compile_failures_are_said_as_recorded(ch, src):
    rows = json.load(open(os.path.join(RESULTS, "hopper_fwd_h200.json")))["rows"]
    failed = [r for r in rows if "error" in r]
    assert {r["error"] for r in failed} == {"RuntimeError: PassManager::run failed"}     # no pass is named
    assert all(r["variant"].endswith(" ws") and "-w4-" in r["variant"] for r in failed)  # 4 warps, warp spec.
    four_ws = [r for r in rows if r["variant"].endswith(" ws") and "-w4-" in r["variant"]]
    assert four_ws == failed                                                             # and every one of them
    assert all("error" not in r for r in rows if r["variant"].endswith(" ws") and "-w8-" in r["variant"])
    v = ch.values
    assert v["ws_failed_error"] == "PassManager::run failed" and int(v["ws_failed"]) == len(failed)
    names = sorted({r["variant"].removeprefix("tma ") for r in failed})
    assert sorted(v["ws_failed_variants"].split(" and ")) == names
    text = src["a3-hopper-verdict"]
    assert "the compiler's warp-specialisation pass failed on them" not in text
    assert ("each failed in Triton's pass pipeline ({glue:text}`ws_failed_error`), and all were 4-warp "
            "variants with warp specialisation ({glue:text}`ws_failed_variants`). The run does not record "
            "which pass failed.") in text


# --- item 3: what an acq_rel add compiles to -------------------------------------------------------

def test_the_ordering_entry_quotes_the_compiled_instructions(src):
    """The instructions are compiled and checked by tests/test_review8_ch10.py (the acq_rel probe);
    here the entry quotes them and says how to reproduce them."""
    text = src["a3-atomic-fence-md"]
    for word in ("`atom.global.gpu.acq_rel.add.v4.f32`", "`MEMBAR.ALL.GPU; ERRBAR; CGAERRBAR`",
                 "`ATOMG.E.ADD.F32x4`", "`CCTL.IVALL`", "`REDG.E.ADD.F32x4`", "the release", "the acquire",
                 "invalidates the whole L1 cache", "returns the old values"):
        assert word in text, word
    assert 'flashbook.kernels.targets.compile_kernel("backward_dkdv", cc=90, ..., atomic_dq=True)' in text
    assert "`FENCED` kernel of `benchmarks/atomic_dq_experiment.py`" in text and "`cuobjdump -sass`" in text
    assert "`tests/test_review8_ch10.py` does exactly this" in text
    assert "the earlier ones must be visible before the add, the later ones wait for it" not in text
    probe = open(os.path.join(ROOT, "tests", "test_review8_ch10.py")).read()
    assert "experiment.FENCED" in probe and "targets.compile_kernel(\"backward_dkdv\", cc=90" in probe


# --- chapter 9: the spills ---------------------------------------------------------------------------

def _causal_tiles():
    from flashbook.bench import profiles

    table = profiles.pass_table(_paths("kernel_ncu")[-1])
    tiles = table[(table["impl"] == "triton-dkdv") & (table["mask"] == "causal") & (table["dim"] == 128)]
    return {tuple(c): r for c, (_, r) in zip(tiles["config_dkdv"], tiles.iterrows())}, table


def test_the_spill_entry_holds_the_stages_equal(ch, src):
    by, table = _causal_tiles()
    default, clean, equal = (64, 128, 8, 3), (32, 128, 8, 2), (64, 128, 8, 2)
    assert by[clean]["spill_mb"] == 0 < by[default]["spill_mb"] < by[equal]["spill_mb"]
    assert by[clean]["ops_ratio"] == by[default]["ops_ratio"] == by[equal]["ops_ratio"]     # the same work
    v = ch.values
    assert v["c9_clean_ms"] == f"{by[clean]['us'] / 1000:.2f}" == "4.22"
    assert v["c9_eq_ms"] == f"{by[equal]['us'] / 1000:.2f}" == "4.30"
    assert v["c9_default_ms"] == f"{by[default]['us'] / 1000:.2f}" == "3.62"
    assert (v["c9_eq_spill"], v["c9_default_spill"]) == ("521", "390")
    assert v["c9_eq_gap"] == f"{100 * (by[equal]['us'] / by[clean]['us'] - 1):.0f}"
    assert v["c9_eq_cfg"] == "64 × 128, 8 warps, 2 stages" and v["c9_clean_cfg"] == "32 × 128, 8 warps, 2 stages"
    cudnn = table[(table["impl"] == "sdpa-cudnn") & (table["pass_"] == "backward") & ~table["causal"]
                  & (table["dim"] == 128)].iloc[0]
    assert (v["c9_cudnn_spill"], v["c9_cudnn_regs"], v["c9_cudnn_threads"]) == (
        f"{cudnn['spill_mb']:.0f}", "168", "384")
    assert 168 * 384 <= 65536                                        # a launch figure that fills the file
    assert v["c9_toolchain"] == "3.6.0"
    text = src["a3-from-ch9"]
    assert "**Verdict.** Not settled." in text and "`benchmarks/kernel_ncu.py`" in text
    assert "Whether a tile spills depends on the toolchain." in text and "Triton 3.9.0" in text


SPILL_PROBE = r'''
import json, os, re, subprocess, tempfile
import triton
from flashbook.kernels import targets
from flashbook.kernels.configs import Config

tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
found = {"triton": triton.__version__, "tiles": {}}
for cfg in [(64, 64, 4, 2), (64, 64, 8, 2), (64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (128, 128, 8, 2)]:
    c = targets.compile_kernel("backward_dkdv", cc=90, config=Config(*cfg), head_dim=128, dtype="bf16", causal=True)
    if os.path.isfile(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(c.asm["cubin"])
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        found["tiles"][str(cfg)] = [int(x) for x in re.findall(r"(?:REG|STACK):(\d+)", res)[:2]]
print(json.dumps(found))
'''


@pytest.mark.slow(seconds=120)
def test_under_triton_3_9_every_profiled_dkdv_tile_has_a_stack_frame(tmp_path):
    """A3's toolchain caveat: the tiles that did not spill under the recorded Triton 3.6.0 have a
    stack frame when Triton 3.9.0 compiles them (no GPU needed)."""
    found = json.loads(compile_probe(tmp_path, SPILL_PROBE).strip().splitlines()[-1])
    require(found["triton"].startswith("3.9") and found["tiles"], "the caveat is about Triton 3.9 and its cuobjdump")
    by, _ = _causal_tiles()
    assert {eval(k) for k in found["tiles"]} == set(by)              # the profiled tiles, every one
    for cfg, (regs, stack) in found["tiles"].items():
        assert regs == 255 and stack > 0, cfg


# --- chapter 7: the quick timing beside the full runs -----------------------------------------------

def test_the_quick_timing_is_read_from_its_recordings(ch, src):
    from flashbook.bench.runs import recorded_output

    text = recorded_output("07_triton_forward", "cd762aa3")
    require(text is not None, "chapter 7's GPU output is not recorded")
    causal = text.split("\nTrue")[1]
    fb = float(re.search(r"flashbook\s+[\d.]+\s+([\d.]+)", causal).group(1))
    fa2 = float(re.search(r"SDPA FlashAttention-2\s+[\d.]+\s+([\d.]+)", causal).group(1))
    cudnn = float(re.search(r"SDPA cuDNN\s+[\d.]+\s+([\d.]+)", causal).group(1))
    full = {}
    for path in _paths("sweep"):
        for r in csv.DictReader(open(os.path.join(path, "results.csv"))):
            if r["status"] == "ok" and r["seq"] == "4096" and r["head_dim"] == "128" and r["causal"] == "True":
                full.setdefault(r["impl"], []).append(float(r["fwd_tflops"]))
    v = ch.values
    assert (v["c7_fb"], v["c7_fa2"], v["c7_batch"]) == (f"{fb:.0f}", f"{fa2:.0f}", "2")
    assert v["c9_fb"] == _span(full["flashbook"], ".0f") and v["c9_fa2"] == _span(full["sdpa-flash"], ".0f")
    assert v["c7_fa2_gain"] == _span([100 * (x / fa2 - 1) for x in full["sdpa-flash"]], ".0f")
    # "Both chapters rank cuDNN first, ours second", in the quick timing and in every full run
    assert cudnn > fb > fa2
    assert all(c > f > a for c, f, a in zip(full["sdpa-cudnn"], full["flashbook"], full["sdpa-flash"]))
    assert "Both chapters rank cuDNN first, ours second." in src["a3-quick-timing"]
    ids = cell_ids(notebook(A3))
    assert ids.index("a3-specialise") + 1 == ids.index("a3-quick-timing")        # under the timing notes


# --- chapter 10: heaviest first at 16K, and exercise 5's host cost -----------------------------------

def test_the_rung_notes_quote_chapter_10s_own_tables(ch, src):
    heavy = ch.tables["heavy"]
    rows = heavy[heavy.index.str.contains("N=16384 causal")]
    assert (rows["x previous"] > rows["predicted x"]).all()                # "gained more than ... predicts"
    assert ch.values["heavy_16k"].startswith(f"{rows['x previous'].iloc[0]:.3f} against")
    assert "**The rung itself at 16K.**" in src["c10-heads-after"]
    assert "{glue:text}`rung_host_lo` to {glue:text}`rung_host_hi` µs" in src["a3-specialise"]
    text = src["a3-gluon-bwd-rows-verdict"]
    assert "({glue:text}`gbr_triton64_lo` to {glue:text}`gbr_triton64_hi` at $d$ = 64)" in text
    assert "whether a kernel spills depends on the compiler" in text


# --- chapter 11: decoding -----------------------------------------------------------------------------

def test_the_decoding_history_is_read_from_its_runs(ch, src):
    host = [json.load(open(os.path.join(p, "host.json")))["2048"] for p in _paths("decode_host")]
    v = ch.values
    assert (v["c11_r1_call"], v["c11_r2_short"], v["c11_r2_checked"]) == (
        f"{host[0]['call']['median_us']:.0f}", f"{host[1]['call']['median_us']:.0f}",
        f"{host[1]['checked_path']['median_us']:.0f}")
    assert [v[f"c11_r{i}_cudnn"] for i in (1, 2, 3)] == [f"{h['sdpa_cudnn']['median_us']:.0f}" for h in host]
    assert host[1]["sdpa_cudnn"]["median_us"] > max(host[0]["sdpa_cudnn"]["median_us"],
                                                    host[2]["sdpa_cudnn"]["median_us"])   # "a slower host"
    assert (v["c11_r1_empty"], v["c11_r3_empty"]) == (f"{host[0]['empty']['median_us']:.0f}",
                                                      f"{host[2]['empty']['median_us']:.1f}")
    first = [r for r in csv.DictReader(open(os.path.join(_paths("decode_paged")[0], "decode.csv")))
             if r["batch"] == "1" and int(r["seq"]) <= 16384 and r["status"] == "ok"]
    fd = [r for r in first if r["impl"] == "flash_decode"]
    assert v["c11_first_called"] == _span([1000 * float(r["ms"]) for r in fd], ".0f")
    assert v["c11_first_gpu"] == _span([1000 * float(r["graph_ms"]) for r in fd], ".0f")
    # SDPA cuDNN's called time at batch 1, 2K in every decoding table the index names
    called = {}
    for name in ("decode", "decode_paged", "decode_short_path", "decode_repeats", "decode_table_before"):
        for p in _paths(name):
            f = os.path.join(p if os.path.isdir(p) else os.path.dirname(p), "decode.csv")
            for r in csv.DictReader(open(f)):
                if (r["impl"], r["batch"], r["seq"], r["status"]) == ("sdpa-cudnn", "1", "2048", "ok"):
                    called[f] = 1000 * float(r["ms"])
    assert v["c11_cudnn_called"] == _span(called.values(), ".1f") and v["c11_cudnn_runs"] == str(len(called))
    assert max(called.values()) > 3 * min(called.values())
    # the kernel before the floor of four splits: the newest decode_short_path run
    rows = list(csv.DictReader(open(os.path.join(_paths("decode_short_path")[-1], "decode.csv"))))
    t = {(r["impl"], int(r["batch"]), int(r["seq"])): r for r in rows if r["status"] == "ok"}
    x64 = [float(t["flash_decode", b, s]["ms"]) / float(t["sdpa-cudnn", b, s]["ms"])
           for (i, b, s) in t if i == "flash_decode" and b == 64]
    paged = [float(t["flash_decode-paged", b, s]["graph_ms"]) / float(t["flash_decode", b, s]["graph_ms"])
             for (i, b, s) in t if i == "flash_decode"]
    assert (v["c11_old_cudnn"], v["c11_old_paged"]) == (f"{max(x64):.2f}", f"{max(paged):.2f}") == ("1.13", "1.22")
    text = src["a3-from-ch11"]
    assert "no README" not in text and os.path.isfile(os.path.join(RESULTS, "ring-2xh200", "README.md"))
    assert "**Verdict.**" in text and "`benchmarks/decode_host.py`" in text


# --- chapter 12: tuning the masked kernels -------------------------------------------------------------

def test_the_masks_history_is_read_from_its_runs(ch, src):
    v = ch.values
    first = json.load(open(os.path.join(_paths("masks")[0], "masks.json")))["rows"]
    (x,) = [r["flex_over_flashbook_fwd_bwd"] for r in first if r["mask"] == "window"
            and r["window"][0] == 1024 and r["seq"] == 4096]
    assert v["c12_first_x"] == f"{x:.2f}" == "0.69"
    folder = _paths("masks_profile")[-1]
    after = json.load(open(os.path.join(folder, "profile_2_plans.json")))["profiles"]
    at16 = next(p for p in after if p["name"] == "window" and p["n"] == 16384)
    ours = sum(k["us_per_step"] for n, k in at16["flashbook"]["kernels"].items() if n.startswith("_bwd"))
    flex = sum(k["us_per_step"] for n, k in at16["flex"]["kernels"].items() if "backward" in n)
    assert v["c12_bwd_gap"].startswith(f"{100 * (ours / flex - 1):.0f}% more at 16K")
    before = json.load(open(os.path.join(folder, "profile_1_before_plans.json")))["profiles"]
    b16 = next(p for p in before if p["name"] == "window" and p["n"] == 16384)["flashbook"]
    assert v["c12_stream"].startswith(f"{b16['bwd_ms']:.3f} → {b16['overlap']['bwd_ms']:.3f} ms at 16K")
    assert abs(b16["overlap"]["bwd_ms"] / b16["bwd_ms"] - 1) < 0.02                # "gained nothing"
    # one grid: documents at 4K, and the d = 64 refusal
    rows = [r for f in ("run1_documents.json", "run2_shapes.json")
            for r in json.load(open(os.path.join(_paths("fused_bwd")[-1], f)))["rows"]]
    (doc4k,) = [r for r in rows if r["shape"].startswith("documents:4K:128")]
    ms = doc4k["median_ms"]
    two = ms.get("separate", ms.get("library"))
    assert v["c12_fused_4k"] == f"{100 * (two - ms['halves']) / two:.1f}"
    refused = [r["error"] for r in rows if "error" in r]
    assert refused and all(":64" in r["shape"] for r in rows if "error" in r)
    assert (v["c12_d64_keys"], v["c12_d64_queries"]) == ("64", "128") and "key tile 64, query tile 128" in refused[0]
    # longest document first: every shape, and "beyond both orders' spread only at 8K"
    order = json.load(open(_paths("document_order")[-1]))["rows"]
    gains = {}
    for r in order:
        if "median_ms" in r:
            _, n, d, *_ = r["shape"].split(":")
            m = r["median_ms"]
            gain = (m["given_order"] - m["halves"]) / m["given_order"]
            gains[n, d] = (gain, gain > max(r["spread"].values()))
            assert f"{100 * gain:.1f}% ({n})" in v["c12_order_gains"]
    assert {n for (n, d), (_, beyond) in gains.items() if beyond} == {"8K"}
    # the stress failure: its runs and its error over the bound, from the junit file
    junit = os.path.join(_paths("stress")[-1], "14_classes_masks_a76a87d.junit.xml")
    (message,) = [f.get("message") for f in ET.parse(junit).iter("failure")]
    err, yard, floors = (float(x) for x in re.search(
        r"max error ([\d.e+-]+) .* exceeds 2 x ([\d.e+-]+) \(yardstick\) \+ ([\d.e+-]+)", message).groups())
    assert v["c12_st_x"] == f"{err / (2 * yard + floors):.2f}" == "1.11" and v["c12_st_failed"] == "1 of 60"
    assert "right" in open(os.path.join(_paths("stress")[-1], "15_replay_after_rule.log")).read()
    text = src["a3-from-ch12"]
    for run in ("`masks_h200`", "`masks_h200-2`", "`fused_bwd_h200`", "`masks_h200-7/run1_fused_order.json`",
                "`one_loop_h200`", "`stress_h200`", "`benchmarks/masks_bench.py`"):
        assert run in text, run


def test_the_moved_notes_stand_last_and_the_page_stays_within_its_budget():
    ids = cell_ids(notebook(A3))
    assert ids[-4:] == ["a3-quick-timing", "a3-from-ch9", "a3-from-ch11", "a3-from-ch12"]
    text = markdown(notebook(A3))
    for heading in ("## From chapter 9: what the backward's spills cost", "## From chapter 11: decoding and the ring",
                    "## From chapter 12: tuning the masked kernels"):
        assert heading in text, heading
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import page_words

    assert page_words.notebook_words(os.path.join(ROOT, "notebooks", A3)) < 7_000   # about 10,000 built
