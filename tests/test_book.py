"""The built HTML book (made by `make book`, which `make test` runs first)."""
import functools
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


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=os.path.basename)
def test_every_chapter_is_a_lesson_not_a_lab_log(built, nb):
    """At most ``page_words.LIMIT`` words of page text per chapter (prose, code, outputs)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import page_words

    slug = os.path.basename(nb)[: -len(".ipynb")]
    words = page_words.html_words(os.path.join(built, "notebooks", f"{slug}.html"))
    assert 1_000 < words <= page_words.LIMIT, f"{slug}: {words} words of page text"


# ----------------------------------------------------------------- the explorers from disk

def _html_pages(built):
    return sorted(glob.glob(os.path.join(built, "**", "*.html"), recursive=True))


def test_explorers_load_a_classic_script_that_works_from_disk(built):
    """A page opened from disk (file://) may load no module script: the pages with an
    explorer load the explorers' classic script, and no page loads a module."""
    with_explorer = []
    for path in _html_pages(built):
        html = open(path, encoding="utf-8").read()
        has = 'class="flashbook-explorer"' in html
        loads = re.search(r'<script src="(?:\.\./)*_static/flashbook_explorers_page\.js', html) is not None
        assert loads == has, os.path.relpath(path, built)
        assert not re.search(r'<script[^>]*type="module"', html), os.path.relpath(path, built)
        with_explorer += [os.path.relpath(path, built)] if has else []
    assert {"notebooks/02_four_tokens.html", "notebooks/04_tiled_forward.html",
            "notebooks/09_benchmarks.html", "notebooks/12_masks.html"} <= set(with_explorer)
    js = page(built, "_static/flashbook_explorers_page.js")
    assert not re.search(r"^\s*(export|import)\b", js, re.M) and "import(" not in js


# ----------------------------------------------------------------- search shows no LaTeX

def _search_index(built):
    import json

    text = page(built, "searchindex.js")
    return json.loads(text[text.index("(") + 1:text.rindex(")")])


def test_search_titles_are_plain_text(built):
    """The search page lists section titles from searchindex.js: their math is plain text."""
    index = _search_index(built)
    titles = list(index["titles"]) + list(index["alltitles"])
    assert [t for t in titles if re.search(r"\\[A-Za-z()\[\]]|[\^_]\{|\$", t)] == []
    for title in ("The paper’s bound: Θ(N²d²/M)", "Why the N × N matrix is the problem",
                  "Start the maximum at -∞"):
        assert title in index["alltitles"], title


def test_math_carries_the_plain_text_that_search_snippets_show(built):
    """Search snippets are cut from a page's text; each math element carries its plain
    text (data-plain), which the search page's script puts in place of the TeX."""
    for rel in ("notebooks/01_attention_numpy.html", "notebooks/04_tiled_forward.html",
                "book/notation.html"):
        html = page(built, rel)
        tags = re.findall(r'<(?:span|div) class="math notranslate nohighlight"[^>]*>', html)
        assert len(tags) > 10 and all(" data-plain=" in t for t in tags), rel
        plains = re.findall(r' data-plain="([^"]*)"', html)
        assert [p for p in plains if "\\" in p or "{" in p] == [], rel
    assert re.search(r'<script src="_static/flashbook_search\.js', page(built, "search.html"))


# ----------------------------------------------------------------- terms at first use

#: term: (how it is written, the glossary entries a link to it may name)
GLOSSARY_TERMS = {
    "SM": (r"\bSMs?\b", {"term-SM"}),
    "sm_XX": (r"\bsm_\d\d\b", {"term-compute-capability", "term-sm_75-sm_80-sm_90"}),
    "tensor core": (r"\b[Tt]ensor[- ]cores?\b", {"term-tensor-core"}),
    "L2": (r"\bL2\b", {"term-L2-cache"}),
    "eps": (r"\beps\b", {"term-eps"}),
    "ulp": (r"\bulps?\b", {"term-ulp"}),
    "warp": (r"\bwarps?\b", {"term-warp"}),
}
#: where a newcomer met a term unexplained: its first use on each of these pages links it
FIRST_MET = {"notebooks/01_attention_numpy": ("SM", "sm_XX", "tensor core", "L2"),
             "notebooks/02_four_tokens": ("eps", "ulp"),
             "notebooks/04_tiled_forward": ("SM", "sm_XX", "tensor core", "L2", "warp")}


def _prose_blocks(built, rel):
    """The page's prose, block by block (code and cell outputs left out)."""
    from bs4 import BeautifulSoup

    main = BeautifulSoup(page(built, rel + ".html"), "html.parser").find("main")
    for node in main.select("div.cell_input, div.cell_output, pre, script, style, nav, div.highlight"):
        node.decompose()
    for block in main.find_all(["p", "li", "dd", "dt", "td", "th", "figcaption", "h1", "h2", "h3", "h4"]):
        if not block.find(["p", "li"]):
            yield block


@functools.lru_cache(maxsize=None)
def _prose_links(built, rel):
    """(text, glossary anchors it links) of each prose block of ``rel``: the page parsed once."""
    return [(block.get_text(" "), {a.get("href", "").split("glossary.html#")[-1] for a in block.find_all("a")
                                   if "glossary.html#" in a.get("href", "")})
            for block in _prose_blocks(built, rel)]


def _first_use(built, rel, term):
    """The first prose block of ``rel`` that uses ``term``, and whether it links it."""
    pattern, anchors = GLOSSARY_TERMS[term]
    for text, links in _prose_links(built, rel):
        if re.search(pattern, text):
            return text[:160], bool(links & anchors)
    return None, None


def test_terms_are_linked_to_the_glossary_where_first_used(built):
    """SM, sm_90, tensor cores, L2, eps, ulps and warps: where the book first uses each (in
    the order of its table of contents), and where each of chapters 1, 2 and 4 first does,
    the sentence links the glossary's entry."""
    from test_notebooks import toc_files

    glossary = page(built, "book/glossary.html")
    for _, anchors in GLOSSARY_TERMS.values():
        assert any(f'id="{a}"' in glossary for a in anchors), anchors
    order = [f for f in toc_files() if f != "book/glossary"]
    for term in GLOSSARY_TERMS:
        first = next(((rel, *_first_use(built, rel, term)) for rel in order
                      if _first_use(built, rel, term)[0] is not None), None)
        assert first is not None and first[2], (term, first)
    for rel, terms in FIRST_MET.items():
        for term in terms:
            text, linked = _first_use(built, rel, term)
            assert text is None or linked, (rel, term, text)


# ----------------------------------------------------------------- figures a screen reader can read

def test_every_figure_says_what_it_shows(built):
    """A figure's alt text describes it (set in its cell's ``mystnb.image.alt``), where the
    default would read out an image file name."""
    from bs4 import BeautifulSoup

    bare, seen = [], 0
    for path in _html_pages(built):
        for img in BeautifulSoup(open(path, encoding="utf-8").read(), "html.parser").find_all("img"):
            if "_images/" not in img.get("src", ""):
                continue
            seen += 1
            alt = img.get("alt", "")
            if "_images/" in alt or alt.endswith(".png") or len(alt.split()) < 12:
                bare.append(f"{os.path.relpath(path, built)}: {img['src']}")
    assert seen >= 40, seen
    assert not bare, "figures without a description:\n" + "\n".join(bare)


def test_figure_descriptions_fit_a_screen_reader():
    """Plain text of a sensible length: no Markdown or LaTeX a screen reader would spell out."""
    import json

    alts = []
    for nb in NOTEBOOKS:
        for cell in json.load(open(nb, encoding="utf-8"))["cells"]:
            alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
            if alt is not None:
                alts.append((os.path.basename(nb), cell["id"], alt))
    assert len(alts) >= 43
    for name, cid, alt in alts:
        assert 80 <= len(alt) <= 450, (name, cid, len(alt))
        assert not any(ch in alt for ch in "$`*\\\n\""), (name, cid, alt)
        assert not alt.lower().startswith(("image of", "figure showing", "a figure")), (name, cid)


def test_command_lines_in_glued_provenance_keep_their_double_hyphens(built):
    """Sphinx's smart quotes would turn a recorded command's "--out" into an en dash ("–out"),
    which a reader cannot paste; _config.yml keeps quotes and ellipses, not dashes."""
    from bs4 import BeautifulSoup

    page = BeautifulSoup(open(os.path.join(built, "notebooks", "11_decoding_and_many_gpus.html"),
                              encoding="utf-8").read(), "html.parser")
    text = " ".join(page.get_text().split())
    assert "benchmarks/ring_bench.py --out" in text and "benchmarks/decode_bench.py --out" in text
    for path in _html_pages(built):
        body = BeautifulSoup(open(path, encoding="utf-8").read(), "html.parser").get_text()
        assert not re.search(r"\s–(out|seqs|batches|impl|rep-ms|budget-s)\b", body), path
