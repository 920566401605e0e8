"""`make pdf`: the whole book as one PDF, printed offline by headless Chromium.

Uses _build/pdf/flashbook.pdf when it is newer than the built HTML, and prints
the book into a temporary folder otherwise.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, require

HTML = os.path.join(ROOT, "_build", "html")
PDF = os.path.join(ROOT, "_build", "pdf", "flashbook.pdf")
TOOLS = os.path.join(ROOT, "tools")

# one group: the tests share the printed book (module fixture), printed once on one worker
pytestmark = [pytest.mark.book, pytest.mark.browser, pytest.mark.slow(seconds=75), pytest.mark.xdist_group("pdf")]


@pytest.fixture(scope="module")
def pdf(tmp_path_factory):
    index = os.path.join(HTML, "index.html")
    require(os.path.exists(index), "the book is not built: run `make book`")
    require(os.path.exists("/usr/bin/chromium"), "Debian's chromium is not installed (make browser)")
    pypdf = pytest.importorskip("pypdf")
    path = PDF
    if not (os.path.exists(PDF) and os.path.getmtime(PDF) > os.path.getmtime(index)):
        path = str(tmp_path_factory.mktemp("pdf") / "flashbook.pdf")
        subprocess.run([sys.executable, os.path.join(TOOLS, "make_pdf.py"), "--out", path],
                       check=True, cwd=ROOT)
    return read(pypdf.PdfReader(path))


def read(reader):
    """The reader, each page's text, and each page's prose: its text without code
    (which is printed in a monospace font)."""
    texts, prose = [], []
    for page in reader.pages:
        parts = []

        def keep(text, cm, tm, font, size):
            if font is None or "Mono" not in str(font.get("/BaseFont", "")):
                parts.append(text)

        texts.append(page.extract_text(visitor_text=keep))
        prose.append("".join(parts))
    return reader, texts, prose


def test_every_page_of_the_book_is_printed_in_order(pdf):
    pdf = pdf[0]
    sys.path.insert(0, TOOLS)
    from make_pdf import toc_pages
    starts = [pdf.get_destination_page_number(item) for item in pdf.outline]
    assert len(starts) == len(toc_pages())
    assert starts == sorted(set(starts)), "a page printed to nothing, or out of order"
    assert len(pdf.pages) >= len(starts)


def test_text_is_extractable_with_titles_and_computed_numbers(pdf):
    text = re.sub(r"\s+", " ", "\n".join(pdf[1]))
    for title in ("1. Attention in NumPy", "2. Four tokens, by hand", "The sources, checked"):
        assert title in text
    assert re.search(r"it is 32 MiB", text)          # glued in chapter 1
    assert "6.4803" in text                           # glued in the appendix
    # the appendix's Chinese quotes print as text, not as empty boxes
    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout
    require(fonts.strip() != "", "no Chinese font (make browser installs fonts-wqy-microhei)")
    assert "显存" in text and "分块" in text


def test_no_raw_tex_in_the_prose(pdf):
    for i, text in enumerate(pdf[2]):
        for pattern in (r"\$[^$\s][^$]{0,80}\$", r"\\frac", r"\\sqrt", r"\\begin\{"):
            found = re.search(pattern, text)
            assert not found, f"page {i + 1}: raw TeX {found.group()!r}"
