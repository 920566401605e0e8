"""The built book shows GPU results from a GPU, and nothing of the machine that built it.

Built without a GPU, every cell tagged `gpu` shows the output recorded on the H200 under
a box naming the GPU, driver, CUDA, torch, triton, date and commit
(book/_ext/gpu_outputs.py); none of it is an interpreter result. No page shows a path of
a build machine (/work/, /root/, /home/) or a relative path climbing out of the repository.
"""
import glob
import os
import re

import bs4  # comes with the book's toolchain (pydata-sphinx-theme requires it)
import pytest

from test_book import HTML, built  # noqa: F401  (fixture)
from test_gpu_outputs import GPU_CHAPTERS

MACHINE_PATHS = re.compile(r"/work/|/root/|/home/|\.\./\.\.")


def soup(built, rel):  # noqa: F811
    with open(os.path.join(built, rel), encoding="utf-8") as f:
        return bs4.BeautifulSoup(f.read(), "html.parser")


def built_with_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_cells(doc):
    return doc.select("div.cell.tag_gpu")


@pytest.mark.parametrize("nb", GPU_CHAPTERS, ids=os.path.basename)
def test_gpu_cells_show_the_recorded_gpu_output_with_its_provenance(built, nb):  # noqa: F811
    slug = os.path.basename(nb)[:-len(".ipynb")]
    doc = soup(built, f"notebooks/{slug}.html")
    cells = gpu_cells(doc)
    assert cells, f"{slug}: no cell tagged gpu in the page"
    for cell in cells:
        outputs = cell.select_one("div.cell_output")
        assert outputs is not None, f"{slug}: a gpu cell without output"
        boxes = outputs.select("div.gpu-recorded")
        if built_with_gpu():                    # the cells ran live: nothing is replaced
            assert not boxes
            continue
        assert len(boxes) == 1, f"{slug}: a gpu cell without its 'Recorded on' box: {outputs.get_text()[:200]}"
        label = " ".join(boxes[0].get_text().split())
        assert re.search(r"Recorded on NVIDIA H\d00", label), label
        for fact in ("driver ", "CUDA ", "torch ", "triton ", "commit "):
            assert fact in label, (slug, fact, label)
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", label), label
        boxes[0].decompose()
        shown = outputs.get_text()
        # what the box vouches for was measured on the GPU, not in the interpreter
        for cpu_words in ("interpreter", "needs a GPU", "No GPU here", "No CUDA GPU"):
            assert cpu_words not in shown, (slug, cpu_words, shown[:300])


def test_chapter_7_times_the_kernel_on_the_h200(built):  # noqa: F811
    doc = soup(built, "notebooks/07_triton_forward.html")
    section = doc.find(id="how-fast-is-it")
    assert section is not None, "chapter 7 lost its 'How fast is it?' section"
    text = " ".join(section.get_text().split())
    if built_with_gpu():
        return
    assert "Recorded on NVIDIA H200" in text
    assert re.search(r"NVIDIA H200, bfloat16, batch 2, 16 heads, N=4096, d=128, forward only", text), text[:500]
    assert re.search(r"flashbook runs at \d+% of SDPA cuDNN's speed", text)
    assert "interpreter are meaningless" not in text.split("Recorded on")[1]


@pytest.mark.parametrize("rel", sorted(os.path.relpath(p, HTML) for p in
                                       glob.glob(os.path.join(HTML, "**", "*.html"), recursive=True)
                                       if "_static" not in p) or ["(not built)"])
def test_no_page_shows_a_build_machine_path(built, rel):  # noqa: F811
    if rel == "(not built)":
        pytest.fail("the book is not built")
    doc = soup(built, rel)
    for junk in doc(["script", "style", "link", "meta"]):
        junk.decompose()
    main = doc.find("main") or doc
    text = main.get_text(" ")
    found = sorted({text[max(0, m.start() - 50): m.end() + 30].replace("\n", " ")
                    for m in MACHINE_PATHS.finditer(text)})
    assert not found, f"{rel}: paths of the machine that built or ran it: {found[:5]}"
    for out in doc.select("div.cell_output"):
        for link in out.select("[href], [src]"):
            target = link.get("href") or link.get("src")
            assert not MACHINE_PATHS.search(target), (rel, target)

