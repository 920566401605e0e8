"""Headless Chromium opens the built book: pages load, math is typeset, figures show.

Every request that leaves localhost is blocked and recorded: the book must work
offline (a classroom with a poor connection, a laptop on a plane).
"""
import functools
import http.server
import json
import os
import re
import shutil
import threading

import numpy as np
import pytest

from conftest import ROOT, require

HTML = os.path.join(ROOT, "_build", "html")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def server():
    require(os.path.exists(os.path.join(HTML, "index.html")), "the book is not built: run `make book`")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=HTML)
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    require(os.path.exists(CHROMIUM), "Debian's chromium is not installed (make test installs it as root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def guarded_page(browser, allowed=("http://127.0.0.1", "data:", "blob:")):
    """A new page that may fetch only URLs starting with ``allowed`` (the rest are refused
    and listed), and the list of its script errors: (page, refused, errors)."""
    page = browser.new_page()
    refused, errors = [], []

    def route(r):
        if r.request.url.startswith(allowed):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, refused, errors


def open_page(browser, url):
    page, external, errors = guarded_page(browser)
    response = page.goto(url, wait_until="load")
    assert response.ok, f"{url}: HTTP {response.status}"
    return page, external, errors


def test_chapter_1_renders_math_and_figures(server, browser):
    page, external, errors = open_page(browser, f"{server}/notebooks/01_attention_numpy.html")
    assert "Attention in NumPy" in page.title()
    # MathJax typesets the formulas into <mjx-container> elements
    page.wait_for_function("document.querySelectorAll('mjx-container').length > 10", timeout=30000)
    assert page.locator("mjx-container merror").count() == 0, "MathJax reported a TeX error"
    # every figure the notebook produced is present and decoded
    images = page.locator(".cell_output img")
    assert images.count() >= 3
    for i in range(images.count()):
        img = images.nth(i)
        img.scroll_into_view_if_needed()
        assert img.evaluate("el => el.complete && el.naturalWidth > 100"), f"figure {i} did not load"
    # computed numbers were glued into the prose
    assert "it is 32 MiB" in page.inner_text("main").replace("\n", " ")
    assert external == [], f"the page tried to reach the network: {external}"
    assert errors == [], f"JavaScript errors: {errors}"
    page.close()


def test_front_pages_load(server, browser):
    page, *_ = open_page(browser, f"{server}/index.html")
    page.wait_for_url("**/book/intro.html", timeout=10000)  # index redirects to the intro
    page.close()
    for rel in ["book/intro.html", "book/notation.html", "book/how_to_run.html"]:
        page, external, errors = open_page(browser, f"{server}/{rel}")
        assert page.locator("main").count() == 1
        assert external == [] and errors == [], (rel, external, errors)
        page.close()
    page, *_ = open_page(browser, f"{server}/book/notation.html")
    page.wait_for_function("document.querySelectorAll('mjx-container').length > 20", timeout=30000)
    page.close()


def chapter_pages():
    import glob
    return sorted(os.path.basename(p)[:-len(".ipynb")]
                  for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


# Every chapter page working offline (its math, figures, frame, no request out, no error) is
# checked where each page is opened anyway: test_screens.test_page_fits_the_screen_and_is_photographed.


# ----------------------------------------------------------------- the live explorers

def open_explorer(browser, server, slug, kind, viewport=None):
    page, external, errors = open_page(browser, f"{server}/notebooks/{slug}.html")
    root = page.locator(f"[data-fb-explorer={kind}]")
    root.wait_for(timeout=30000)
    return page, root, external, errors


def set_control(root, name, value):
    """Set one control as a reader would, and fire its input event."""
    root.locator(f'[data-fb-control="{name}"]').evaluate(
        """(c, v) => { if (c.type === "checkbox") c.checked = v; else c.value = String(v);
                       c.dispatchEvent(new Event("input", {bubbles: true})); }""", value)


def shown(root, what="value"):
    """Every displayed number: data-fb name -> its data-value (or its text), and the
    settings the explorer shows them for."""
    values = root.evaluate("""(r, what) => Object.fromEntries([...r.querySelectorAll("[data-fb]")]
                                .map(e => [e.dataset.fb, what === "text" ? e.textContent : e.dataset.value]))""",
                           what)
    return values, json.loads(root.get_attribute("data-fb-settings"))


def close(x, y):
    """Equal up to the rounding of a differently ordered float64 sum (a few ulps)."""
    return abs(float(x) - y) <= 1e-12 * max(1.0, abs(y))


BLOCKSIZE_GRID = [  # (setting, value) applied in turn: each changes what is shown
    ("block_q", 32), ("block_k", 32), ("num_stages", 3), ("causal", True), ("order", "fa1"),
    ("step", 5), ("row", 200), ("chip", "T4"), ("d", 128), ("n", 128), ("step", 1000),
    ("order", "fa2"), ("block_q", 128), ("chip", "H200"), ("num_stages", 1), ("causal", False),
    ("n", 96), ("block_k", 16), ("d", 256), ("row", 3), ("step", 0), ("block_q", 256),
    ("num_stages", 4),
]


def footprint(root):
    """The explorer's stacked on-chip bars: per bar, its verdict, segments and red marks."""
    return root.evaluate("""r => Object.fromEntries([...r.querySelectorAll("[data-fb-bar]")].map(b => [b.dataset.fbBar, {
        fits: b.dataset.fits, total: Number(b.dataset.total),
        segments: [...b.querySelectorAll("[data-fb-segment]")].map(e => [e.dataset.fbSegment, Number(e.dataset.bytes),
                                                                          e.x.baseVal.value, e.width.baseVal.value]),
        overflow: b.querySelectorAll("[data-fb-overflow]").length,
        outline: b.querySelector("[data-fb-outline]").getAttribute("stroke")}]))""")


def legend(root, which):
    return root.evaluate("""(r, w) => [...r.querySelectorAll(`[data-fb-legend-for="${w}"] [data-fb-legend]`)]
                              .map(e => e.dataset.fbLegend)""", which)


def check_footprint(root, state):
    """Two bars, each stacked by buffer as the library counts them, red where they do not fit."""
    bars = footprint(root)
    want = {"paper": (state.onchip, state.fits), "kernel": (state.kernel_smem, state.kernel_fits)}
    assert set(bars) == set(want)
    for key, (buffers, fits) in want.items():
        bar = bars[key]
        assert {name: nbytes for name, nbytes, *_ in bar["segments"]} == buffers, key
        assert bar["total"] == sum(buffers.values()) and bar["fits"] == str(fits).lower(), key
        for (*_, x0, w0), (*_, x1, _) in zip(bar["segments"], bar["segments"][1:]):
            assert abs(x0 + w0 - x1) < 1e-3, (key, bar["segments"])          # stacked end to end (float32)
        assert bar["overflow"] == (0 if fits else 1), key                     # hatched red past the limit
        assert (bar["outline"] == "#b00020") == (not fits), key               # outlined in red
    assert set(legend(root, "buffers")) >= {name for b in bars.values() for name, *_ in b["segments"]}


def test_chapter_4_explorer_is_live_and_equals_the_library(server, browser):
    from flashbook import explorers, plots

    page, root, external, errors = open_explorer(browser, server, "04_tiled_forward", "blocksize")
    before, _ = shown(root)
    for name, value in BLOCKSIZE_GRID:
        set_control(root, name, value)
        now, s = shown(root)
        assert now != before, f"nothing changed after {name} = {value}"
        before = now
        assert s[name] == value or name == "step", (name, value, s)   # step: clipped
        state = explorers.explorer_state(explorers.Settings(**s))
        traffic = {o: state.traffic[plots.ORDER_NAMES[o]] for o in ("fa2", "fa1")}
        expect = {"tiles": state.n_tiles, "skipped": state.n_skipped, "kernel-smem": state.kernel_smem_total,
                  "partial": int((state.kinds == "partial").sum()),
                  "visited": len(state.schedule), "onchip": state.onchip_total,
                  "smem": state.smem_per_block, "hbm-naive": state.traffic["naive"],
                  "hbm-fa2": traffic["fa2"], "hbm-fa1": traffic["fa1"], "hbm": traffic[s["order"]]}
        for key, value_ in expect.items():
            assert int(now[key]) == value_, (key, s, now[key], value_)
        assert now["fits"] == str(state.fits).lower()
        assert now["kernel-fits"] == str(state.kernel_fits).lower()
        check_footprint(root, state)
        assert close(now["hbm-ratio"], traffic[s["order"]] / state.traffic["naive"])
        assert s["step"] == state.step and now["current"] == ",".join(map(str, state.current_tile))
        assert state.ran, "keep the grid small enough for the library's live run"
        m_l = state.stats_at_step()
        if m_l is None:
            assert now["m"] == "" and now["l"] == ""
        else:
            assert close(now["m"], m_l[0]) and close(now["l"], m_l[1]), (s, now["m"], now["l"], m_l)
            text = shown(root, "text")[0]
            assert (text["m"], text["l"]) == (f"{m_l[0]:.4f}", f"{m_l[1]:.4f}")
    # the tile grid's colours have a legend
    assert legend(root, "tiles") == ["full", "partial", "skipped", "later", "current", "row"]
    # the sliders answer the keyboard
    n_slider = root.locator('[data-fb-control="n"]')
    n_slider.focus()
    page.keyboard.press("ArrowRight")
    assert shown(root)[1]["n"] == 96 + 8
    assert external == [] and errors == [], (external, errors)
    page.close()


def test_chapter_2_editor_updates_every_table(server, browser):
    from flashbook import explorers

    page, root, external, errors = open_explorer(browser, server, "02_four_tokens", "qkv")
    note = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]]           # the chapter's X
    _, s = shown(root)
    assert s["Q"] == s["K"] == s["V"] == note
    edits = [("K", 3, 0, 2.5), ("Q", 1, 1, -1.25), ("V", 2, 0, 0.75), ("token", None, None, 3),
             ("K", 0, 1, -2), ("Q", 0, 0, 1.5), ("V", 3, 1, -0.5), ("token", None, None, 0),
             ("K", 2, 1, 3), ("Q", 3, 0, -3), ("V", 1, 0, 2.2), ("token", None, None, 2)]
    before, _ = shown(root)
    scale = 2 ** -0.5
    for m, i, c, value in edits:
        set_control(root, "token" if m == "token" else f"{m}-{i}-{c}", value)
        now, s = shown(root)
        assert now != before, (m, i, c, value)
        before = now
        if m != "token":
            assert s[m][i][c] == value
        want = explorers.qkv_state(s, scale)
        text = shown(root, "text")[0]
        for table in ("S", "P", "O", "trace"):
            for (r, col), x in np.ndenumerate(want[table]):
                key = f"{table}-{r}-{col}"
                assert close(now[key], x), (table, r, col, now[key], x)
                assert text[key] == f"{x + 0.0:.4f}", (key, text[key], x)
        assert float(now["error"]) < 1e-12
    assert external == [] and errors == [], (external, errors)
    page.close()


def test_chapter_9_explorer_shows_the_recorded_sweep(server, browser):
    from flashbook import bench

    path = bench.latest_blocks()
    require(path is not None, "no recorded block sweep under benchmarks/results/")
    frame, prov = bench.load_results(path)
    arch = (prov.get("gpu") or {}).get("capability") or "sm_90"
    page, root, external, errors = open_explorer(browser, server, "09_benchmarks", "sweep")
    options = {k: sorted(int(x) for x in frame[k].unique())
               for k in ("head_dim", "block_m", "block_n", "num_warps", "num_stages")}
    moves = [(k, v) for k in options for v in options[k][::-1]][:16]
    before, _ = shown(root)
    changed = 0
    for name, value in moves:
        set_control(root, name, value)
        now, s = shown(root)
        assert s[name] == value
        changed += now != before
        before = now
        state = bench.block_state(frame, s["head_dim"], s["block_m"], s["block_n"],
                                  s["num_warps"], s["num_stages"], measured_arch=arch)
        if state.row is None:
            assert now["status"] == "missing"
            continue
        assert now["status"] == state.row["status"]
        if state.row["status"] == "ok":
            assert close(now["tflops"], state.tflops)
            assert shown(root, "text")[0]["tflops"] == f"{state.tflops:.0f}"
            assert int(now["rank"]) == state.rank and int(now["n-ran"]) == state.n_ran
        for chip, f in state.fits.items():
            assert int(now[f"need-{chip}"]) == f["bytes"] and int(now[f"limit-{chip}"]) == f["limit"]
            assert now[f"fits-{chip}"] == str(f["fits"]).lower()
    assert changed >= len(moves) // 2, "most moves must change what is shown"
    assert external == [] and errors == [], (external, errors)
    page.close()


@pytest.mark.parametrize("slug", chapter_pages())
def test_pages_carry_no_widget_state(slug):
    require(os.path.exists(os.path.join(HTML, "index.html")), "the book is not built: run `make book`")
    with open(os.path.join(HTML, "notebooks", f"{slug}.html"), encoding="utf-8") as f:
        html = f.read()
    assert "application/vnd.jupyter.widget-state+json" not in html
    assert "application/vnd.jupyter.widget-view+json" not in html


MASK_MOVES = [  # (setting, value) applied in turn: each changes what is shown
    ("tile", "64x64"), ("window", 128), ("n", 8192), ("mask", "documents"), ("n", 1024),
    ("tile", "128x128"), ("mask", "prefix"), ("prefix", 256), ("n", 2048), ("mask", "none"),
    ("mask", "causal"), ("n", 8192), ("tile", "128x64"), ("mask", "window"), ("window", 2048),
    ("n", 1024), ("mask", "prefix"), ("prefix", 2048),
]


def test_chapter_12_explorer_shows_the_librarys_tile_counts(server, browser):
    from flashbook import bench, masks
    from flashbook.explorers import maskmap

    require(os.path.exists(os.path.join(HTML, "notebooks", "12_masks.html")), "chapter 12 is not built")
    page, root, external, errors = open_explorer(browser, server, "12_masks", "masks")
    _, s = shown(root)
    assert s == {"mask": "window", "n": 4096, "window": 1024, "prefix": 1024, "tile": "128x64"}   # the cell's
    before = None
    for name, value in [(None, None), *MASK_MOVES]:
        if name is not None:
            set_control(root, name, value)
        now, s = shown(root)
        assert now != before, f"nothing changed after {name} = {value}"
        before = now
        if name is not None:
            assert s[name] == value, (name, value, s)
        n, (bm, bn) = s["n"], maskmap.parse_tile(s["tile"])
        rule = {"none": {}, "causal": {"causal": True},
                "window": {"causal": True, "window": (s["window"] - 1, 0)},
                "prefix": {"causal": True, "prefix": s["prefix"]}}.get(s["mask"])
        if rule is None:     # the explorer's seeded documents, which it lists
            cu = maskmap.cu_seqlens(n)
            assert now["doc-lengths"] == ",".join(str(b - a) for a, b in zip(cu, cu[1:]))
            ids = masks.doc_ids_from_cu_seqlens(cu)
            rule = {"causal": True, "doc_ids_q": ids, "doc_ids_k": ids}
        counts = masks.tile_counts(n, n, bm, bn, **rule)
        for key in ("skipped", "full", "partial", "visited", "total"):
            assert int(now[key]) == counts[key], (key, s, now[key], counts[key])
        assert float(now["work-fraction"]) == counts["work_fraction"]
        full = bench.attention_flops(1, 1, n, n, 128)
        visited = full // (n * n) * counts["visited"] * bm * bn      # N is a multiple of the tiles
        assert (int(now["flops-full"]), int(now["flops-visited"])) == (full, visited)
        assert int(now["flops-saved"]) == full - visited
        assert float(now["flops-saved-fraction"]) == (full - visited) / full
        allowed = masks.allowed(n, n, **rule)
        assert float(now["allowed-fraction"]) == allowed.sum() / allowed.size
        assert now["call"] == maskmap.call_text(s["mask"], n, s["window"], s["prefix"], bm, bn)
        text = shown(root, "text")[0]
        assert text["work-fraction"] == f"{counts['work_fraction']:.3f}"
        assert text["flops-visited"] == maskmap.human_flops(visited)
        assert text["flops-saved"] == maskmap.human_flops(full - visited)
        assert text["flops-saved-fraction"] == f"{100 * (full - visited) / full:.1f} %"
        assert text["allowed-fraction"] == f"{allowed.sum() / allowed.size:.3f}"
        # the grid draws each kind's tiles at their true size: its area is their count
        areas = root.evaluate("""(r, tile) => { const a = {}; for (const e of r.querySelectorAll("rect[data-kind]"))
            a[e.dataset.kind] = (a[e.dataset.kind] || 0) + e.width.baseVal.value * e.height.baseVal.value / tile;
            return a; }""", (300 / n) ** 2 * bm * bn)
        for kind in ("skipped", "full", "partial"):
            assert abs(areas.get(kind, 0) - counts[kind]) < 1e-6 * counts["total"], (kind, s, areas)
        assert root.locator('[data-fb-control="window"]').is_disabled() == (s["mask"] != "window")
        assert root.locator('[data-fb-control="prefix"]').is_disabled() == (s["mask"] != "prefix")
    # the page carries the library's views; each one's text, written by the page's module, is Python's
    with open(os.path.join(HTML, "notebooks", "12_masks.html"), encoding="utf-8") as f:
        body = f.read().split('data-kind="masks"><script type="application/json">')[1].split("</script>")[0]
    cfg = json.loads(body)
    assert cfg == json.loads(json.dumps(maskmap.masks_config({"mask": "window", "n": 4096, "window": 1024})))
    texts = page.evaluate("""async (views) => {
        const m = await import("../_static/flashbook_explorers.js");
        return Object.fromEntries(Object.entries(views).map(([k, v]) => [k, [m.pyFixed(v.counts.work_fraction, 3),
            m.pyFixed(v.allowed_fraction, 3), m.humanFlops(v.flops.visited), m.humanFlops(v.flops.full),
            m.humanFlops(v.flops.saved), m.pyFixed(100 * v.flops.saved_fraction, 1)]])); }""", cfg["views"])
    assert len(texts) == len(cfg["views"]) == 144
    for key, v in cfg["views"].items():
        f = v["flops"]
        assert texts[key] == [f"{v['counts']['work_fraction']:.3f}", f"{v['allowed_fraction']:.3f}",
                              *map(maskmap.human_flops, (f["visited"], f["full"], f["saved"])),
                              f"{100 * f['saved_fraction']:.1f}"], key
    # a phone: the explorer fits the screen, and so does the page
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(300)
    wide = page.evaluate("""() => ({page: document.documentElement.scrollWidth,
        explorer: document.querySelector("[data-fb-explorer=masks]").getBoundingClientRect().right})""")
    assert wide["page"] <= 391 and wide["explorer"] <= 391, wide
    assert external == [] and errors == [], (external, errors)
    page.close()


# ----------------------------------------------------------------- opened from disk

EXPLORER_PAGES = [("02_four_tokens", "qkv", "token"), ("04_tiled_forward", "blocksize", "block_q"),
                  ("09_benchmarks", "sweep", "num_stages"), ("12_masks", "masks", "n")]


@pytest.mark.parametrize("slug,kind,control", EXPLORER_PAGES, ids=[k for _, k, _ in EXPLORER_PAGES])
def test_explorers_work_from_disk(browser, slug, kind, control):
    """The book opened as files (file://, no web server): every explorer mounts, with no
    "needs JavaScript" fallback, and a control changes what it shows. A module script
    would be refused there; the page loads a classic one."""
    import pathlib

    path = pathlib.Path(HTML, "notebooks", f"{slug}.html")
    require(path.exists(), "the book is not built: run `make book`")
    page, outside, errors = guarded_page(browser, ("file://", "data:", "blob:"))
    console = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.goto(path.as_uri(), wait_until="load")
    root = page.locator(f"[data-fb-explorer={kind}]")
    root.wait_for(timeout=30000)
    assert page.locator(".flashbook-explorer-fallback").count() == 0
    assert page.locator("div.flashbook-explorer:not([data-mounted])").count() == 0
    before, _ = shown(root)
    assert before, "the explorer shows no numbers"
    root.locator(f'[data-fb-control="{control}"]').evaluate(
        """c => { if (c.tagName === "SELECT") c.value = [...c.options].map(o => o.value).find(v => v !== c.value);
                  else c.value = String(Number(c.min) + (Number(c.value) === Number(c.min) ? Number(c.step || 1) : 0));
                  c.dispatchEvent(new Event("input", {bubbles: true})); }""")
    after, _ = shown(root)
    assert after != before, f"{kind}: nothing changed after moving {control}"
    assert errors == [], errors
    assert [m for m in console if "flashbook" in m or "CORS" in m] == [], console
    assert outside == [], outside
    page.close()


# ----------------------------------------------------------------- search

def test_search_results_show_no_latex(server, browser):
    """Sphinx cuts each result's snippet from the page's text, where math is TeX source
    until MathJax typesets it: the book's search page reads its plain text instead."""
    page, external, errors = open_page(browser, f"{server}/search.html?q=quadratic")
    page.wait_for_function("document.querySelectorAll('ul.search li p.context').length >= 3", timeout=30000)
    page.wait_for_timeout(1500)                                    # the other snippets' fetches
    snippets = page.eval_on_selector_all("ul.search li p.context", "ps => ps.map(p => p.textContent)")
    titles = page.eval_on_selector_all("ul.search li > a", "as => as.map(a => a.textContent)")
    tex = re.compile(r"\\[A-Za-z()\[\]]|\$")
    assert [s for s in snippets + titles if tex.search(s)] == []
    assert any(re.search("[×²⁻≤≈Θ√ᵀ∞]", s) for s in snippets), snippets   # the math is there, as text
    assert external == [] and errors == [], (external, errors)
    page.close()
