"""Headless Chromium opens the built book: pages load, math is typeset, figures show.

Every request that leaves localhost is blocked and recorded: the book must work
offline (a classroom with a poor connection, a laptop on a plane).
"""
import functools
import http.server
import os
import shutil
import threading

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


def open_page(browser, url):
    page = browser.new_page()
    external = []

    def route(r):
        if r.request.url.startswith(("http://127.0.0.1", "data:", "blob:")):
            r.continue_()
        else:
            external.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
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


@pytest.mark.parametrize("slug", chapter_pages())
def test_every_chapter_page_works_offline(server, browser, slug):
    page, external, errors = open_page(browser, f"{server}/notebooks/{slug}.html")
    page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30000)
    assert page.locator("mjx-container merror").count() == 0, "MathJax reported a TeX error"
    images = page.locator(".cell_output img")
    for i in range(images.count()):
        img = images.nth(i)
        img.scroll_into_view_if_needed()
        assert img.evaluate("el => el.complete && el.naturalWidth > 50"), f"figure {i} did not load"
    text = page.inner_text("main")
    for heading in ("What you will learn", "Summary", "Exercises"):
        assert heading in text
    assert external == [] and errors == [], (external, errors)
    page.close()
