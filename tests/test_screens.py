"""Every page of the built book on a phone (390 x 844) and a laptop (1300 x 1000).

Each page is photographed at both sizes into _build/screens/ (look at them after a
layout change; the top screenful by default, the whole page with
FLASHBOOK_SCREENS=full, which takes a few seconds more per page), and nothing may stick out past the right edge of the screen unless it
sits inside a box that scrolls or clips sideways (wide equations, tables and code scroll
in their own box: book/_ext/static/flashbook.css). Each page asks for nothing from the
network and raises no JavaScript error; on a chapter page MathJax typesets without an
error, every figure loads, and the chapter has its "What you will learn", summary and
exercises, and glued values read in the weight of their sentence (one visit a page checks it all).
"""
import glob
import os

import pytest

from conftest import ROOT
from test_browser import HTML, browser, open_page, server  # noqa: F401  (fixtures)

SCREENS = os.path.join(ROOT, "_build", "screens")
SIZES = {"phone": (390, 844), "laptop": (1300, 1000)}
FULL_PAGE = os.environ.get("FLASHBOOK_SCREENS", "") == "full"
# Every page's display equations fit a phone without scrolling (split into aligned lines
# where they were too wide).
WIDE_MATH = """() => [...document.querySelectorAll('div.math mjx-container')]
  .filter(e => e.scrollWidth > e.clientWidth + 2)
  .map(e => (e.querySelector('mjx-assistive-mml') || e).textContent.trim().slice(0, 60))"""

# Elements wider than the screen, not inside a box with overflow-x auto/scroll/hidden/clip.
# Hidden things (display: none, visibility: hidden, zero size) and off-canvas panels
# (fixed-position drawers that slide in) are not content.
FIND_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const clips = el => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const offCanvas = el => {
    for (let p = el; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (s.position === 'fixed' || s.visibility === 'hidden' || s.display === 'none') return true;
    }
    return false;
  };
  const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (typeof el.className === 'string' && el.className ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  const found = [], hidden = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || r.right <= width + 1) continue;
    let inside = false;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (clips(p)) { inside = true; break; }
    }
    if (inside) continue;
    if (offCanvas(el)) {   // not drawn, but it may still widen the page (a heading's hidden '#' link)
      if (getComputedStyle(el).position !== 'fixed') hidden.push(name(el) + ' in ' + name(el.parentElement));
      continue;
    }
    let path = [];
    for (let p = el; p && p !== document.body && path.length < 4; p = p.parentElement) path.unshift(name(p));
    found.push(`${path.join(' > ')} (right edge ${Math.round(r.right)} px): ` +
               (el.textContent || '').trim().slice(0, 60));
  }
  return {found, hidden, scrollWidth: document.documentElement.scrollWidth, width};
}"""

#: Resolves once MathJax has typeset the page; at once on a page that does not load it
#: (waiting there for a MathJax that never comes took 10 s per screen size).
TYPESET = """() => new Promise(done => {
  if (!document.querySelector('script[src*="mathjax"]')) { done(false); return; }
  const ready = () => window.MathJax && MathJax.startup && MathJax.startup.promise;
  const wait = (n) => ready() ? MathJax.startup.promise.then(() => done(true))
                             : (n > 0 ? setTimeout(() => wait(n - 1), 100) : done(false));
  wait(100);
})"""


def pages():
    chapters = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    front = sorted(glob.glob(os.path.join(ROOT, "book", "*.md")))
    return ([f"notebooks/{os.path.basename(p)[:-len('.ipynb')]}" for p in chapters]
            + [f"book/{os.path.basename(p)[:-len('.md')]}" for p in front])


@pytest.mark.slow
@pytest.mark.parametrize("rel", pages())
def test_page_fits_the_screen_and_is_photographed(server, browser, rel):  # noqa: F811
    os.makedirs(SCREENS, exist_ok=True)
    page, external, errors = open_page(browser, f"{server}/{rel}.html")
    problems = []
    for size, (w, h) in SIZES.items():
        page.set_viewport_size({"width": w, "height": h})
        page.evaluate(TYPESET)
        page.wait_for_timeout(300)                              # reflow after the resize
        result = page.evaluate(FIND_OVERFLOW)
        problems += [f"{size} {w}px: {line}" for line in result["found"][:10]]
        if size == "phone":
            problems += [f"{size} {w}px: an equation scrolls: {eq}" for eq in page.evaluate(WIDE_MATH)]
        if result["scrollWidth"] > result["width"] + 1:
            problems.append(f"{size} {w}px: the page scrolls sideways "
                            f"({result['scrollWidth']} px wide in a {result['width']} px screen; "
                            f"hidden things past the edge: {result['hidden'][:5]})")
        page.screenshot(path=os.path.join(SCREENS, f"{rel.replace('/', '-')}-{w}.png"), full_page=FULL_PAGE)
    if rel.startswith("notebooks/"):   # a chapter works offline: its math, its figures, its frame
        slug = rel.split("/", 1)[1]
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30000)
        assert page.locator("mjx-container merror").count() == 0, "MathJax reported a TeX error"
        images = page.locator(".cell_output img")
        for i in range(images.count()):
            img = images.nth(i)
            img.scroll_into_view_if_needed()
            assert img.evaluate("el => el.complete && el.naturalWidth > 50"), f"figure {i} did not load"
        heavy = page.evaluate("""() => [...document.querySelectorAll('span.pasted-text')]
          .filter(e => getComputedStyle(e).fontWeight !== getComputedStyle(e.parentElement).fontWeight)
          .map(e => e.textContent.slice(0, 40))""")
        assert heavy == [], f"glued text set in another weight than its sentence: {heavy[:3]}"
        if slug[:1].isdigit():   # a chapter; the appendix pages (A2_) have no exercises
            text = page.inner_text("main")
            for heading in ("What you will learn", "Summary", "Exercises"):
                assert heading in text, heading
    page.close()
    assert not problems, "content wider than the screen:\n" + "\n".join(problems)
    assert external == [] and errors == [], (external, errors)
