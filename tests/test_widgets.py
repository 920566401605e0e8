"""flashbook.explorers: the explorer's pure functions, the configs the live explorers
carry, and the anywidget widget.

The state must agree with the closed-form counts in flashbook.tiled and with the
chip facts in flashbook.runtime; the figure must draw for every chip and for the
edge settings; the widget must rebuild its state when a control changes.
"""
import matplotlib

matplotlib.use("Agg")

import json  # noqa: E402
import re  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import require  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flashbook import explorers, plots, runtime, smem, tiled  # noqa: E402
from flashbook.explorers import Settings, explorer_state, render  # noqa: E402


def draws(state):
    """render() returns a Figure with the four panels, without touching pyplot."""
    before = plt.get_fignums()
    fig = render(state)
    assert isinstance(fig, Figure) and len(fig.axes) >= 4
    assert explorers.figure_png(fig).startswith(b"\x89PNG")
    assert plt.get_fignums() == before
    return fig


@pytest.mark.parametrize("chip", sorted(runtime.CHIPS))
def test_every_chip(chip):
    state = explorer_state(Settings(chip=chip, n=192, d=64, block_q=32, block_k=64))
    limit = runtime.chip(chip).smem_per_block_kib * 1024
    assert state.smem_per_block == limit
    assert state.onchip_total == tiled.onchip_bytes(32, 64, 64, explorers.DTYPE_BYTES,
                                                    acc_bytes=explorers.ACC_BYTES)
    assert state.fits == (state.onchip_total <= limit)
    assert state.ran and state.max_error < 1e-12      # float64 against float64: rounding only
    assert chip in state.summary()
    draws(state)


def test_default_state_matches_closed_forms():
    state = explorer_state()
    s = state.settings
    assert (s.step, s.row) == (None, 128) and state.step == len(state.schedule) // 2
    assert state.stats == tiled.io_flash(s.n, s.n, s.d, s.block_q, s.block_k)
    assert list(state.schedule) == tiled.tile_schedule(s.n, s.n, s.block_q, s.block_k)
    assert state.traffic["naive"] == tiled.io_naive(s.n, s.n, s.d).hbm_bytes(2, 4)
    # the watched row's last (m, l) give its lse: the trace comes from the real run
    assert [t[0] for t in state.trace] == [k for k, (i, _) in enumerate(state.schedule)
                                           if i == s.row // s.block_q]


def test_edge_settings_block_larger_than_n_and_d_256():
    one_tile = explorer_state(Settings(n=40, block_q=64, block_k=128, chip="T4"))
    assert one_tile.kinds.shape == (1, 1) and len(one_tile.schedule) == 1
    assert one_tile.onchip_total == tiled.onchip_bytes(40, 40, 64, 2)   # tiles clipped to N
    draws(one_tile)
    wide = dict(n=128, d=256, block_q=64, block_k=64)
    t4, h200 = explorer_state(Settings(chip="T4", **wide)), explorer_state(Settings(chip="H200", **wide))
    assert not t4.fits and h200.fits      # 176.5 KiB: over a T4's 64 KiB, under an H200's 227 KiB
    assert t4.onchip_total == 176.5 * 1024
    assert "does NOT fit" in t4.summary()
    draws(t4)


def test_the_explorer_counts_what_fits_two_ways_and_says_which():
    """Chapter 4's explorer shows two counts of one program's needs, with their own labels:
    everything on chip (the paper's view) and a kernel's shared memory (flashbook.smem,
    the model of the table above it and of chapter 9's explorer). At d = 128 they differ:
    64 x 64 on a T4 is 96.5 KiB everything on chip (does not fit), 64 KiB for the kernel
    (fits: the table's largest T4 tile); 128 x 64 with 3 stages is 161 KiB against 128 KiB."""
    t4 = explorer_state(Settings(chip="T4", d=128, block_q=64, block_k=64))
    assert t4.onchip_total == 96.5 * 1024 and not t4.fits
    assert t4.kernel_smem == {smem.FP32_OPERANDS: 64 * 1024} and t4.kernel_fits
    assert tiled.largest_tile(runtime.chip("T4"), 128) == 64
    h200 = explorer_state(Settings(chip="H200", d=128, block_q=128, block_k=64, num_stages=3))
    assert h200.onchip_total == 161 * 1024
    assert h200.kernel_smem == {"Q": 2 * 128 * 128, "K": 3 * 2 * 64 * 128, "V": 3 * 2 * 64 * 128}
    assert h200.kernel_smem_total == 128 * 1024 == tiled.smem_bytes(128, 64, 128, num_stages=3, arch="sm_90")
    for chip in runtime.CHIPS:
        for stages in (1, 2, 4):
            for d in (16, 40, 128, 256):
                st = explorer_state(Settings(chip=chip, n=64, d=d, block_q=32, block_k=16, num_stages=stages))
                arch = runtime.chip(chip).arch
                assert st.kernel_smem == smem.smem_buffers(32, 16, smem.tile_d(d), num_stages=stages, arch=arch)
                assert st.kernel_fits == (st.kernel_smem_total <= st.smem_per_block)
    summary = t4.summary()
    assert "everything on chip 96.5 KiB" in summary and "a kernel's shared memory (fp32 tiles) 64.0 KiB: fits" in summary
    assert "a kernel's shared memory (3 stages) 128.0 KiB: fits" in h200.summary()
    with pytest.raises(ValueError, match="num_stages"):
        explorer_state(Settings(num_stages=0))


def test_the_figure_labels_both_counts_and_turns_red_where_a_tile_does_not_fit():
    fig = draws(explorer_state(Settings(chip="T4", n=128, d=128, block_q=64, block_k=64)))
    titles = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    paper = next(ax for t, ax in titles.items() if t.startswith("everything on chip (the paper's count)"))
    kernel = next(ax for t, ax in titles.items() if t.startswith("a kernel's shared memory (fp32 tiles)"))
    assert paper.get_title().endswith("does NOT fit") and paper.title.get_color() == "red"
    assert not kernel.get_title().endswith("fit") and kernel.title.get_color() == "black"
    outline = [p for p in paper.patches if not p.get_fill()]
    assert outline and outline[0].get_edgecolor()[:3] == (1.0, 0.0, 0.0)   # red outline
    stacked = [p for p in paper.patches if p.get_fill()]
    assert [round(p.get_x()) for p in stacked[1:]] == [round(p.get_x() + p.get_width()) for p in stacked[:-1]]
    assert paper.get_legend() is not None           # the buffers' colours are named
    labels = " ".join(ax.get_xlabel() for ax in fig.axes)
    assert "grey: skipped" in labels and "red: now" in labels   # the tile colours' key


def test_causal_fa1_order_and_step_clipping():
    state = explorer_state(Settings(n=100, block_q=16, block_k=32, causal=True, order="fa1",
                                    step=10_000, row=99))
    assert state.n_skipped > 0 and "skipped" in state.kinds
    assert len(state.schedule) == state.n_tiles - state.n_skipped
    assert state.step == len(state.schedule) - 1
    assert state.current_tile == state.schedule[-1]
    assert state.stats_at_step() is not None
    draws(state)


def test_too_many_tiles_falls_back_to_closed_forms():
    state = explorer_state(Settings(n=1000, block_q=8, block_k=8))
    assert not state.ran and state.max_error is None and "too many" in state.note
    assert state.stats == tiled.io_flash(1000, 1000, 64, 8, 8)
    draws(state)


@pytest.mark.parametrize("bad,error,word", [
    ({"chip": "V100"}, ValueError, "chip"), ({"block_q": 0}, ValueError, "block_q"),
    ({"n": 2.5}, TypeError, "n"), ({"order": "fa9"}, ValueError, "order"),
    ({"row": 300}, ValueError, "row"), ({"causal": "no"}, TypeError, "causal"),
])
def test_bad_settings_are_named(bad, error, word):
    with pytest.raises(error, match=word):
        explorer_state(Settings(**bad))


def test_tile_grid_draws_alone():
    fig = Figure()
    ax = plots.tile_grid(fig.add_subplot(), 20, 33, 8, 5, causal=True, step=3, row=7)
    assert ax.get_xlim() == (0, 33) and ax.get_ylim() == (20, 0)
    index = plots.visit_index(20, 33, 8, 5, causal=True)
    assert sorted(index[index >= 0]) == list(range(len(tiled.tile_schedule(20, 33, 8, 5,
                                                                             causal=True))))


# ----------------------------------------------------------------- the live explorers

def _anywidget():
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


def _hash32_reference(x: int) -> int:
    """The explorer's integer hash in plain Python ints (independent of NumPy's uint64)."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_example_inputs_are_the_documented_hash(rng):
    n, d = int(rng.integers(2, 300)), int(rng.integers(1, 200))
    q, k, v = explorers.example_qkv(n, d)
    assert q.shape == k.shape == v.shape == (n, d) and q.dtype == np.float64
    for _ in range(20):
        a, r, c = int(rng.integers(3)), int(rng.integers(n)), int(rng.integers(d))
        key = (explorers.EXAMPLE_SEED + (a * 65536 + r) * 512 + c) & 0xFFFFFFFF
        want = explorers.EXAMPLE_LOW + explorers.EXAMPLE_WIDTH * _hash32_reference(key) / 2**32
        assert (q, k, v)[a][r, c] == want            # exact: the browser recomputes it
    x = np.concatenate([q.ravel(), k.ravel(), v.ravel()])
    assert -2 <= x.min() and x.max() < 2 and abs(x.mean()) < 0.2 and x.std() > 0.9
    with pytest.raises(ValueError, match="n must be"):
        explorers.example_qkv(70000, 4)


def test_blocksize_config_exports_the_library_constants():
    cfg = explorers.blocksize_config(Settings(n=100, block_q=16, causal=True))
    json.dumps(cfg, allow_nan=False)                   # what the page and the widget carry
    assert cfg["chips"] == {n: {"name": c.name, "smem_per_block": c.smem_per_block_kib * 1024,
                                "smem_per_sm": c.smem_per_sm_kib * 1024, "arch": c.arch}
                            for n, c in runtime.CHIPS.items()}
    assert cfg["tile_ds"] == list(smem.TILE_DS) and cfg["fp32_operands"] == smem.FP32_OPERANDS
    assert cfg["limits"]["num_stages"] == list(explorers.LIMITS["num_stages"])
    assert all(cfg["buffer_colors"][b] == plots.BUFFER_COLORS[b] for b in tiled.onchip_elements(16, 16, 16))
    assert (cfg["dtype_bytes"], cfg["acc_bytes"]) == (explorers.DTYPE_BYTES, explorers.ACC_BYTES)
    # the byte rules the browser applies give the library's on-chip bytes
    elements = tiled.onchip_elements(16, 64, 64)
    assert sum(n * (cfg["dtype_bytes"] if b in cfg["input_buffers"] else cfg["acc_bytes"])
               for b, n in elements.items()) == tiled.onchip_bytes(16, 64, 64, 2)
    s = cfg["settings"]
    state = explorer_state(Settings(**{**s, "step": None}))
    assert s["step"] == state.step and s["row"] == 50 and s["causal"] is True


def test_qkv_config_and_state_match_the_reference(rng):
    q, k, v = rng.standard_normal((3, 5, 3))
    cfg = explorers.qkv_config(q, k, v, token=4)
    json.dumps(cfg, allow_nan=False)
    assert cfg["scale"] == 1 / np.sqrt(3) and np.array_equal(cfg["settings"]["K"], k)
    st = explorers.qkv_state(cfg["settings"], cfg["scale"])
    from flashbook import reference
    # float64 against float64: a few ulps of outputs of size <= max|v|
    assert np.allclose(st["O"], reference.attention(q, k, v), rtol=0, atol=1e-13)
    assert np.allclose(st["P"].sum(axis=1), 1, rtol=0, atol=1e-15)
    assert st["trace"].shape == (5, 6 + 2 * 3) and st["error"] < 1e-13
    with pytest.raises(ValueError, match="token"):
        explorers.qkv_config(q, k, v, token=5)


def _arch(chip):
    from flashbook import runtime
    return runtime.chip(chip).arch


def test_sweep_config_holds_the_librarys_lookups():
    from flashbook import bench

    path = bench.latest_blocks()
    require(path is not None, "no recorded block sweep under benchmarks/results/")
    frame, _ = bench.load_results(path)
    # a small piece of the recorded sweep keeps this fast
    d0 = int(frame["head_dim"].max())
    part = frame[(frame["head_dim"] == d0) & (frame["num_stages"] == frame["num_stages"].min())]
    first = part.iloc[0]
    start = {k: int(first[k]) for k in explorers.sweep._SWEEP_KEYS}
    cfg = explorers.sweep_config(part, start=start, measured_arch="sm_90", gpu="H200")
    json.dumps(cfg, allow_nan=False)
    assert cfg["settings"] == start
    for key, view in cfg["views"].items():
        d, bm, bn, w, s = map(int, key.split(","))
        state = bench.block_state(part, d, bm, bn, w, s, measured_arch="sm_90")
        assert view == explorers.sweep_view(state, "H200")
        assert view["rank"] == state.rank
        for chip, f in state.fits.items():   # the library's fits; "measured" only on the H200
            shown = view["fits"][chip]
            assert {k: shown[k] for k in ("bytes", "limit", "fits")} == {k: f[k] for k in ("bytes", "limit", "fits")}
            assert shown["how"] == (f"measured on the H200 (same {_arch(chip)} code)"
                                    if f["how"] == "measured" and chip != "H200" else f["how"])
        if view["status"] == "ok":
            assert view["tflops"] == state.tflops
    with pytest.raises(ValueError, match="start"):
        explorers.sweep_config(part, start={"head_dim": d0})


def test_the_static_page_gets_the_module_as_a_classic_script():
    """A page opened from disk (file://) may load no module script: the static book loads
    ``page_script()``, the same code with no export or import, which mounts the page."""
    js = explorers.page_script()
    assert not re.search(r"^\s*(export|import)\b", js, re.M) and "import(" not in js
    module = explorers.ESM.read_text()
    for name in re.findall(r"^export function (\w+)", module, re.M):
        assert f"function {name}(" in js
    assert "window.flashbookExplorers = {" in js and "mountStatic(document)" in js
    with pytest.raises(ValueError, match="import"):
        explorers.page_script('import { x } from "./y.js";\nexport function f() {}\n')
    with pytest.raises(ValueError, match="export"):
        explorers.page_script("export const x = 1;\n")


def test_placeholder_carries_the_config():
    cfg = explorers.blocksize_config()
    html = explorers.placeholder_html("blocksize", cfg)
    body = html.split('<script type="application/json">')[1].split("</script>")[0]
    assert json.loads(body) == cfg and 'data-kind="blocksize"' in html
    with pytest.raises(ValueError, match="kind"):
        explorers.placeholder_html("nope", cfg)


def test_explorer_widget_is_the_one_front_end():
    require(_anywidget(), "anywidget is not installed (it is in requirements.txt)")
    w = explorers.explorer(n=128, block_q=32, block_k=32)
    assert w._esm == explorers.ESM.read_text()             # the same file the static book serves
    assert w.kind == "blocksize" and w.config == explorers.blocksize_config(
        Settings(n=128, block_q=32, block_k=32))
    assert w.state.settings.block_q == 32 and w.state.n_tiles == 16

    w.settings = {**w.settings, "block_q": 64}         # what the front end's controls do
    assert w.state.settings.block_q == 64 and w.state.n_tiles == 8
    w.settings = {**w.settings, "step": 2, "chip": "T4", "causal": True}
    assert w.state.step == 2 and w.state.current_tile == w.state.schedule[2]
    assert w.state.smem_per_block == runtime.chip("T4").smem_per_block_kib * 1024
    assert w.state.ran and w.state.max_error < 1e-12

    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/html"] == explorers.placeholder_html("blocksize", w.config)

    q = explorers.explorer_widget("qkv", explorers.qkv_config(np.eye(3), np.eye(3), np.eye(3) * 2))
    assert q._esm == w._esm and q.state["O"].shape == (3, 3)
    q.settings = {**q.settings, "token": 2}
    assert q.state["trace"][-1][-1] == pytest.approx(q.state["O"][2, 2], abs=1e-15)


def test_without_anywidget_the_explorer_is_the_placeholder(monkeypatch):
    import sys

    explorers.widget_class.cache_clear()
    monkeypatch.setitem(sys.modules, "anywidget", None)      # as where it is not installed
    try:
        w = explorers.explorer(n=64)
        assert isinstance(w, explorers.StaticExplorer)
        bundle = w._repr_mimebundle_()
        assert bundle["text/html"] == explorers.placeholder_html("blocksize", w.config)
        assert "anywidget" in bundle["text/plain"]
    finally:
        explorers.widget_class.cache_clear()


def test_the_first_names_are_the_same_explorers():
    """Chapters 2, 4 and 9 import flashbook.live and flashbook.widgets: the same objects."""
    from flashbook import live, widgets

    for name in explorers.__all__:
        assert getattr(live, name) is getattr(explorers, name) is getattr(widgets, name), name


# ----------------------------------------------------------------- chapter 12: mask tiles

def _rule_of(mask, n, window, prefix):
    """The explorer's rule, written out here from flash-attn's conventions."""
    from flashbook import masks
    from flashbook.explorers import maskmap

    if mask == "none":
        return {}
    extra = {"causal": {}, "window": {"window": (window - 1, 0)}, "prefix": {"prefix": prefix}}.get(mask)
    if extra is None:   # documents: the seeded lengths the explorer states
        ids = masks.doc_ids_from_cu_seqlens(maskmap.cu_seqlens(n))
        extra = {"doc_ids_q": ids, "doc_ids_k": ids}
    return {"causal": True, **extra}


def _expect_view(n, block_m, block_n, rule, head_dim=128):
    """The library's numbers for one view: masks.tile_counts, masks.tile_kinds,
    masks.allowed and bench.attention_flops."""
    from flashbook import bench, masks

    kinds = masks.tile_kinds(n, n, block_m, block_n, **rule)
    counts = masks.tile_counts(n, n, block_m, block_n, **rule)
    rows = [min(block_m, n - a) for a in range(0, n, block_m)]
    cols = [min(block_n, n - b) for b in range(0, n, block_n)]
    pairs = sum(rows[a] * cols[b] for a, b in zip(*np.nonzero(kinds != "skipped")))
    allowed = int(masks.allowed(n, n, **rule).sum())
    full = bench.attention_flops(1, 1, n, n, head_dim)
    assert full == 4 * n * n * head_dim
    return kinds, counts, pairs, allowed, full


def _check_view(view, n, block_m, block_n, rule, head_dim=128):
    from flashbook.explorers import maskmap

    kinds, counts, pairs, allowed, full = _expect_view(n, block_m, block_n, rule, head_dim)
    assert view["counts"] == counts
    assert np.array_equal(maskmap.decode_grid(view["grid"]), kinds)
    assert view["pairs_visited"] == pairs and view["pairs_allowed"] == allowed
    assert view["allowed_fraction"] == allowed / (n * n)
    per_pair = 4 * head_dim
    assert view["flops"] == {"visited": per_pair * pairs, "full": full, "saved": full - per_pair * pairs,
                             "saved_fraction": (full - per_pair * pairs) / full}


def test_masks_config_holds_the_librarys_tile_counts_for_every_view():
    """A small option grid, ragged tiles included: every view is masks.tile_counts's."""
    from flashbook.explorers import maskmap

    grid = dict(seq_lens=(200, 256), windows=(1, 48, 300), prefixes=(40, 64), tiles=("32x32", "64x16", "48x40"))
    cfg = explorers.masks_config({"n": 200, "window": 48, "prefix": 40, "tile": "48x40"}, head_dim=64, **grid)
    json.dumps(cfg, allow_nan=False)
    assert len(cfg["views"]) == 2 * 3 * (3 + 3 + 2)        # N x tiles x (none, causal, documents; windows; prefixes)
    for key, view in cfg["views"].items():
        mask, n, param, tile = key.split(",")
        n, param, (bm, bn) = int(n), int(param), maskmap.parse_tile(tile)
        _check_view(view, n, bm, bn, _rule_of(mask, n, param, param), head_dim=64)
        assert view["call"].startswith(f"masks.tile_counts({n}, {n}, {bm}, {bn}")
    for n in grid["seq_lens"]:   # the documents: seeded, packed end to end
        cu = cfg["documents"][str(n)]
        assert cu == maskmap.cu_seqlens(n) and cu[0] == 0 and cu[-1] == n and len(cu) > 2
        assert all(b > a for a, b in zip(cu, cu[1:]))
    assert cfg["colors"] == {"full": plots.STAGE_COLORS["main"], "partial": plots.STAGE_COLORS["masked"],
                             "skipped": plots.STAGE_COLORS["skipped"]}


@pytest.mark.parametrize("settings", [
    {"mask": "window", "n": 4096, "window": 1024, "tile": "128x64"},
    {"mask": "window", "n": 8192, "window": 128, "tile": "128x128"},
    {"mask": "documents", "n": 8192, "tile": "128x64"},
    {"mask": "documents", "n": 1024, "tile": "64x64"},
    {"mask": "prefix", "n": 2048, "prefix": 512, "tile": "64x64"},
    {"mask": "prefix", "n": 1024, "prefix": 2048, "tile": "128x64"},   # prefix past N: everything
    {"mask": "causal", "n": 8192, "tile": "128x128"},
    {"mask": "none", "n": 2048, "tile": "128x64"},
])
def test_the_books_mask_explorer_states_are_the_librarys(settings):
    from flashbook.explorers import maskmap

    cfg = explorers.masks_config()
    s = {**maskmap.START, **settings}
    state = explorers.masks_state(cfg, s)
    assert state["settings"] == s and state["key"] == maskmap.view_key(*(s[k] for k in maskmap.SETTINGS))
    bm, bn = maskmap.parse_tile(s["tile"])
    _check_view(state, s["n"], bm, bn, _rule_of(s["mask"], s["n"], s["window"], s["prefix"]))


def test_the_books_mask_explorer_page_stays_small():
    from flashbook.explorers import maskmap

    cfg = explorers.masks_config()
    assert cfg["options"] == {"mask": list(maskmap.MASKS), "n": [1024, 2048, 4096, 8192],
                              "window": [128, 256, 512, 1024, 2048], "prefix": [256, 512, 1024, 2048],
                              "tile": ["64x64", "128x64", "128x128"]}
    assert len(cfg["views"]) == 4 * 3 * (3 + 5 + 4)                     # every combination
    html = explorers.placeholder_html("masks", cfg)
    assert len(html.encode()) < 200_000, len(html.encode())            # the page stays well under 300 KB
    body = html.split('<script type="application/json">')[1].split("</script>")[0]
    assert json.loads(body) == json.loads(json.dumps(cfg))
    # the chapter's table: N = 8192, 128 x 64 tiles, a 1K window
    s = {**maskmap.START, "n": 8192, "window": 1024}
    from flashbook import masks
    assert explorers.masks_state(cfg, s)["counts"] == masks.tile_counts(8192, 8192, 128, 64, causal=True,
                                                                        window=(1023, 0))


def test_grid_runs_round_trip(rng):
    from flashbook.explorers import maskmap

    kinds = rng.choice(["skipped", "full", "partial"], size=(int(rng.integers(1, 9)), int(rng.integers(1, 40))))
    text = maskmap.encode_grid(kinds)
    assert np.array_equal(maskmap.decode_grid(text), kinds)
    assert maskmap.encode_grid(np.array([["full"] * 3 + ["partial"] + ["skipped"] * 12])) == "f3p1s12"
    rows = np.array([["full", "skipped"]] * 3 + [["partial", "partial"]])
    assert maskmap.encode_grid(rows) == "f1s1*3,p2"
    assert np.array_equal(maskmap.decode_grid("f1s1*3,p2"), rows)


def test_human_flops():
    from flashbook.explorers import maskmap

    assert maskmap.human_flops(4 * 8192**2 * 128) == "34.4 GFLOP"
    assert maskmap.human_flops(2_113_929_216) == "2.11 GFLOP"
    assert maskmap.human_flops(537_000_000) == "537 MFLOP"
    assert maskmap.human_flops(12) == "12.0 FLOP"


@pytest.mark.parametrize("bad,error,word", [
    ({"mask": "diagonal"}, ValueError, "mask"), ({"n": 3000}, ValueError, "n must"),
    ({"n": "4096"}, TypeError, "n must"), ({"n": True}, TypeError, "n must"),
    ({"window": 100}, ValueError, "window"), ({"prefix": 2.5}, TypeError, "prefix"),
    ({"tile": "96x64"}, ValueError, "tile"), ({"tile": "big"}, ValueError, "tile"),
    ({"tile": (128, 64.0)}, ValueError, "tile"), ({"block_m": 64}, TypeError, "block_m"),
])
def test_bad_mask_settings_are_named(bad, error, word):
    from flashbook.explorers import maskmap

    with pytest.raises(error, match=word):
        explorers.mask_explorer(**bad)
    if "block_m" not in bad:
        with pytest.raises(error, match=word):
            explorers.masks_state(explorers.masks_config(), {**maskmap.START, **bad})


def test_mask_explorer_widget_follows_its_controls():
    require(_anywidget(), "anywidget is not installed (it is in requirements.txt)")
    from flashbook import masks

    w = explorers.mask_explorer(mask="window", n=4096, window=1024, tile=(128, 64))
    assert w.kind == "masks" and w._esm == explorers.ESM.read_text()
    assert w.settings == {"mask": "window", "n": 4096, "window": 1024, "prefix": 1024, "tile": "128x64"}
    assert w.state["counts"] == masks.tile_counts(4096, 4096, 128, 64, causal=True, window=(1023, 0))
    w.settings = {**w.settings, "mask": "prefix", "prefix": 256, "tile": "64x64"}   # what the controls do
    assert w.state["counts"] == masks.tile_counts(4096, 4096, 64, 64, causal=True, prefix=256)
    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/html"] == explorers.placeholder_html("masks", w.config)


def test_without_anywidget_the_mask_explorer_is_the_placeholder(monkeypatch):
    import sys

    explorers.widget_class.cache_clear()
    monkeypatch.setitem(sys.modules, "anywidget", None)
    try:
        w = explorers.mask_explorer(mask="causal")
        assert isinstance(w, explorers.StaticExplorer) and w.settings["mask"] == "causal"
        assert 'data-kind="masks"' in w._repr_mimebundle_()["text/html"]
    finally:
        explorers.widget_class.cache_clear()
