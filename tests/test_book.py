"""The built HTML book (made by `make book`, which `make test` runs first)."""
import glob
import os
import re

import pytest

from conftest import ROOT, require
from test_notebooks import CHAPTERS, NOTEBOOKS, REPO_URL

HTML = os.path.join(ROOT, "_build", "html")


@pytest.fixture(scope="module")
def built():
    require(os.path.exists(os.path.join(HTML, "index.html")),
            "the book is not built: run `make book` (make test does it first)")
    return HTML


def page(built, rel):
    with open(os.path.join(built, rel), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=os.path.basename)
def test_every_chapter_was_executed_and_rendered(built, nb):
    slug = os.path.basename(nb)[: -len(".ipynb")]
    html = page(built, f"notebooks/{slug}.html")
    assert html.count('class="cell_output') >= 3, f"{slug}: no executed outputs in the page"
    assert "Traceback (most recent call last)" not in html
    assert "Error" not in re.findall(r'<span class="ne">(\w+)</span>', html)
    # the setup cell is hidden; the Colab launch button opens the Colab edition's
    # notebook on the `colab` branch, derived from the one URL
    assert "pip\", \"install" not in html
    repo_path = REPO_URL.removeprefix("https://github.com/")
    assert f"colab.research.google.com/github/{repo_path}/blob/colab/{slug}.ipynb" in html
    # a chapter (not an appendix page) also launches its exercises: the student edition
    student = f"colab.research.google.com/github/{repo_path}/blob/colab/student/{slug}.ipynb"
    assert (student in html) == slug[:1].isdigit(), slug


def test_pages_outside_the_chapters_have_no_launch_button(built):
    """Colab cannot open a MyST Markdown page, and such pages have no Colab edition."""
    for rel in ("book/sources_checked.html", "book/which_kernel.html"):
        html = page(built, rel)
        assert "colab.research.google.com" not in html, rel
        assert "launch-buttons" not in html or "colab" not in html.lower(), rel


def test_pages_load_nothing_from_the_network(built):
    pages = glob.glob(os.path.join(built, "**", "*.html"), recursive=True)
    assert len(pages) >= 5
    for p in pages:
        html = open(p, encoding="utf-8").read()
        # (rel="canonical" names the published page; it loads nothing)
        external = re.findall(r'<(?:script|link(?! rel="canonical")|img)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        external = [u for u in external if not u.startswith("https://colab.research.google.com")]
        assert external == [], f"{os.path.relpath(p, built)} loads {external}"


def test_mathjax_is_served_by_the_site(built):
    html = page(built, "notebooks/01_attention_numpy.html")
    src = re.search(r'<script[^>]+src="([^"]*mathjax[^"]*tex-chtml\.js)[^"]*"', html)
    assert src, "no MathJax script tag"
    assert os.path.exists(os.path.join(built, "notebooks", src.group(1).split("?")[0]))


def test_seed_correction_is_in_chapter_1(built):
    html = page(built, "notebooks/01_attention_numpy.html")
    text = re.sub(r"<[^>]+>", "", html)
    assert re.search(r"it is\s+32\s+MiB", text), "the fp16 size of a 4096x4096 matrix is missing"


def test_the_sources_appendix_was_executed_and_rendered(built):
    text = re.sub(r"<[^>]+>", "", page(built, "book/sources_checked.html"))
    assert "Traceback (most recent call last)" not in text
    assert "S1.1" in text and "S2.15" in text
    # numbers glued by the page's own cells, next to the figures they correct
    assert "6.4803" in text and "4.7683" in text and "显存" in text


@pytest.mark.parametrize("nb", CHAPTERS, ids=os.path.basename)
def test_solution_outputs_sit_inside_their_fold(built, nb):
    """A solution cell's output folds with its code: none shows outside the cell's <details>."""
    from bs4 import BeautifulSoup

    slug = os.path.basename(nb)[: -len(".ipynb")]
    soup = BeautifulSoup(page(built, f"notebooks/{slug}.html"), "html.parser")
    cells = soup.select("div.cell.tag_solution")
    assert cells, f"{slug}: no solution cell in the page"
    for cell in cells:
        fold = cell.find("details")
        assert fold is not None, f"{slug}: a solution cell is not folded"
        outside = [o for o in cell.select("div.cell_output") if fold not in o.find_parents("details")]
        assert not outside, f"{slug}: a solution's output shows outside its fold: {outside[0].get_text()[:80]!r}"


# Visible code is teaching code: the measure is the book's shared tool, which counts
# the code lines a reader sees unfolded and the share of the page's text that is code.
# CI has shared/ beside the clone; a checkout may hold it, or sit one folder deeper.
VISIBLE_CODE_TOOL = next(
    (p for p in (os.path.join(up, "shared", "tools", "visible_code.py")
                 for up in (os.path.dirname(ROOT), ROOT, os.path.dirname(os.path.dirname(ROOT))))
     if os.path.exists(p)),
    os.path.join(os.path.dirname(ROOT), "shared", "tools", "visible_code.py"))
MAX_CODE_SHARE = 0.40                         # in every chapter
MAX_CODE_LINES = {"09_benchmarks": 250, "10_making_it_fast": 250}


@pytest.fixture(scope="module")
def visible_code():
    require(os.path.exists(VISIBLE_CODE_TOOL), f"the visible-code tool is missing: {VISIBLE_CODE_TOOL}")
    import importlib.util
    spec = importlib.util.spec_from_file_location("visible_code", VISIBLE_CODE_TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.measure


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=os.path.basename)
def test_visible_code_is_teaching_code(built, visible_code, nb):
    slug = os.path.basename(nb)[: -len(".ipynb")]
    lines, share = visible_code(os.path.join(built, "notebooks", f"{slug}.html"))
    assert share <= MAX_CODE_SHARE, f"{slug}: {share:.0%} of the visible page is code ({lines} lines)"
    assert lines <= MAX_CODE_LINES.get(slug, lines), f"{slug}: {lines} visible lines of code"
