"""The Colab edition (tools/colab_edition.py), the setup cell, the packaged results.

`make test` builds the book, then the Colab edition (_build/colab), before pytest.
The slow test installs the wheel into a fresh Colab-like venv (a venv of its own on top
of the Colab-like base in ~/.cache/flashbook, `make colab-venv`: tests/colab_like.py) and
runs every chapter there, from a directory outside the repository.
"""
import glob
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT, require

sys.path.insert(0, os.path.join(ROOT, "tools"))
import colab_edition as ce  # noqa: E402
from setup_cell import KEPT  # noqa: E402
import colab_like  # noqa: E402  (COLAB_LIKE, TORCH and the base venv: make colab-venv)

NOTEBOOKS = ce.book_notebooks()
HTML = os.path.join(ROOT, "_build", "html", "notebooks")
COLAB = os.path.join(ROOT, "_build", "colab")


def _load(path):
    return nbformat.read(path, as_version=4)


# --- the setup cell: one template, the same text in every notebook ---------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_setup_cell_and_gpu_metadata_come_from_the_template(path):
    nb = _load(path)
    assert nb.cells[0].source == ce.book_setup_cell(nb), (
        f"{os.path.basename(path)}: run `python tools/colab_edition.py --sync-setup`")
    url = f"git+{ce.repo_url()}@v{ce.version()}"
    assert f'source = "{url}"' in nb.cells[0].source
    triton = ce.uses_triton(nb)
    assert (nb.metadata.get("accelerator") == "GPU") == triton
    assert (nb.metadata.get("colab", {}).get("gpuType") == "T4") == triton
    name = os.path.basename(path)
    if name[0].isdigit() and int(name[:2]) <= 5:  # the NumPy chapters need no GPU, never import triton
        assert not triton


def test_version_has_one_source_and_a_changelog_entry():
    import flashbook

    assert ce.version() == flashbook.__version__
    cff = open(os.path.join(ROOT, "CITATION.cff")).read()
    assert re.search(rf"^version: {re.escape(flashbook.__version__)}$", cff, re.M)
    changelog = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert f"## v{flashbook.__version__}" in changelog
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert 'dynamic = ["version"]' in pyproject and "flashbook.__version__" in pyproject


# --- the edition's Markdown -----------------------------------------------------------

@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    require(os.path.isdir(os.path.join(ROOT, "_build", "jupyter_execute")),
            "the book is not built: run `make book` (make test does it first)")
    out = tmp_path_factory.mktemp("colab")
    glued = ce.write(str(out))
    return out, glued


def test_converter_on_every_myst_construct():
    records = {"x": {"data": {"text/plain": "6.480348982775926"}},
               "s": {"data": {"text/plain": "\"the seed's B\""}}}
    conv = ce.Converter("02_four_tokens", records)
    base = ce.book_url()
    md = conv.markdown(
        "(sec-a)=\n## A\n\nIt is {glue:text}`x:.4f`, {glue:text}`s` {cite}`dao2022flashattention`, "
        "{cite:t}`milakov2018online`; see [ch 3](03_online_softmax.ipynb#m) and "
        "{doc}`notation <../book/notation>`.\n\n"
        ":::{admonition} Note well\n:class: tip\nBody {math}`x^2`.\n:::\n\n"
        ":::{dropdown} Solution\nHidden.\n:::")
    assert "It is 6.4803, the seed’s B " in md  # smart quotes, as Sphinx renders them
    assert f"[(Dao et al., 2022)]({base}book/references.html)" in md
    assert f"[Milakov and Gimelshein (2018)]({base}book/references.html)" in md
    assert f"[ch 3]({base}notebooks/03_online_softmax.html#m)" in md
    assert f"[notation]({base}book/notation.html)" in md
    assert "> **Note well**\n>\n> Body $x^2$." in md
    assert "<details>\n<summary>Solution</summary>\n\nHidden.\n\n</details>" in md
    assert ce.forbidden(md) == [] and conv.glued == ["6.4803", "the seed’s B"]
    assert base.startswith("https://") and base.endswith("/")
    with pytest.raises(SystemExit, match="no Colab rendering"):
        conv.markdown("{numref}`fig-x`")


def test_edition_is_plain_markdown_with_folded_solutions(edition):
    out, glued = edition
    assert sorted(glued) == [os.path.basename(p)[:-6] for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        slug = os.path.basename(path)[:-6]
        src, nb = _load(path), _load(out / f"{slug}.ipynb")
        n_roles = sum(len(re.findall(r"\{glue[\w:-]*\}`", c.source)) for c in src.cells
                      if c.cell_type == "markdown")
        assert len(glued[slug]) == n_roles
        head = nb.cells[0].source
        assert ce.colab_url(slug) in head and "colab-badge.svg" in head
        assert f"{ce.book_url()}notebooks/{slug}.html" in head
        assert nb.cells[1].source == ce.book_setup_cell(src)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                assert ce.forbidden(cell.source) == [], (slug, cell.source[:200])
            else:
                assert cell.outputs == [] and cell.execution_count is None
            if "solution" in cell.metadata.get("tags", []):
                if cell.cell_type == "code":
                    assert cell.metadata["cellView"] == "form"
                    assert cell.metadata["jupyter"]["source_hidden"] is True
                    assert cell.source.startswith("#@title")
                else:
                    assert "<details>" in cell.source
    ch2 = "\n".join(c.source for c in _load(out / "02_four_tokens.ipynb").cells)
    assert "6.4803" in ch2


@pytest.mark.book
def test_every_glued_value_is_the_rendered_books(edition):
    require(os.path.isdir(HTML), "the book is not built: run `make book` (make test does it first)")
    _, glued = edition
    total = 0
    for slug, values in glued.items():
        page = open(os.path.join(HTML, f"{slug}.html"), encoding="utf-8").read()
        shown = [html.unescape(re.sub(r"<[^>]+>", "", m))
                 for m in re.findall(r'<span class="pasted-text">(.*?)</span>', page, re.S)]
        assert values == shown, slug
        total += len(values)
    assert total >= 500


def test_student_edition_drops_the_solutions(edition, tmp_path):
    ce.write(str(tmp_path), student=True)
    for path in NOTEBOOKS:
        nb = _load(tmp_path / os.path.basename(path))
        assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)
        slug = os.path.basename(path)[:-6]
        if ce.is_chapter(slug):   # it says what it is and links the full chapter
            head = nb.cells[0].source
            assert "student edition" in head and ce.colab_url(slug) in head
            assert ce.colab_url(slug, student=True) in _load(edition[0] / f"{slug}.ipynb").cells[0].source


def test_make_colab_wrote_the_edition():
    """`make test` runs `make colab` first: the published edition is what was tested."""
    require(os.path.isdir(COLAB), "no _build/colab: run `make colab` (make test does it first)")
    assert sorted(os.listdir(COLAB)) == sorted([os.path.basename(p) for p in NOTEBOOKS] + ["glued.json"])


# --- recorded results: the checkout, the override, the package --------------------

def test_results_dir_prefers_override_then_checkout_then_package(tmp_path, monkeypatch):
    from flashbook import bench, resources

    monkeypatch.delenv(resources.RESULTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    checkout = Path(ROOT) / "benchmarks" / "results"
    assert resources.results_dir() == checkout  # found from the module's own checkout
    assert bench.results_root() == checkout
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv(resources.RESULTS_ENV, str(mine))
    assert resources.results_dir() == mine
    monkeypatch.setenv(resources.RESULTS_ENV, str(tmp_path / "missing"))
    assert resources.results_dir() is None
    assert resources.results_dir(checkout) == checkout


# --- the Colab-like run ---------------------------------------------------------------

_RUNNER = r'''
import json, sys, tempfile, time, nbclient, nbformat
from jupyter_client.manager import KernelManager
path, cwd = sys.argv[1], sys.argv[2]
nb = nbformat.read(path, as_version=4)
start = time.perf_counter()
# IPC sockets in a directory of its own: two kernels started at once cannot pick the same port
km = KernelManager(kernel_name="python3", transport="ipc", ip=tempfile.mkdtemp(prefix="k") + "/k")
nbclient.NotebookClient(nb, km=km, timeout=600, startup_timeout=120,
                        resources={"metadata": {"path": cwd}}).execute()
nbformat.write(nb, path)
print(json.dumps({"seconds": round(time.perf_counter() - start, 1)}))
'''


#: The venv sees neither this checkout nor an override of the recorded runs.
ENV = colab_like.ENV


def _freeze(py):
    """name -> version (or the URL it came from) of everything installed in py's venv."""
    out = subprocess.run([py, "-m", "pip", "freeze", "--all"], check=True, capture_output=True,
                         text=True, env=ENV).stdout  # --all: pip and setuptools too
    found = (re.split(r"\s*(?:==|@)\s*", line, maxsplit=1) for line in out.splitlines())
    return {parts[0].lower(): parts[1] for parts in found if len(parts) == 2}


@pytest.mark.slow(seconds=110)
def test_colab_edition_runs_in_a_colab_like_runtime(tmp_path):
    """Wheel -> fresh venv with Colab's packages -> the setup cell installs it without
    touching torch/numpy/ipywidgets/triton -> every chapter runs outside the repo."""
    require(os.path.isdir(os.path.join(ROOT, "_build", "jupyter_execute")),
            "the book is not built: run `make book` (make test does it first)")
    timings = {"start": time.perf_counter()}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", ROOT, "-w", str(wheels)],
                   check=True, capture_output=True, text=True)
    wheel = next(wheels.glob("flashbook-*.whl"))
    import zipfile
    shipped = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("flashbook/data/results/")]
    assert any(n.endswith("results.csv") for n in shipped), "the recorded runs are not in the wheel"
    # the runtime: a fresh venv on top of the base one (built by `make colab-venv`, or here
    # when it is missing or holds another list), which nothing below installs into
    base = colab_like.build()
    base_files = colab_like.snapshot(base)
    py = colab_like.layer(tmp_path / "venv", base)
    timings["venv"] = time.perf_counter()
    before = _freeze(py)
    assert "myst-nb" not in before and "jupyter-book" not in before and "flashbook" not in before
    assert "torch" in before, "pip does not see the base venv's packages"
    for spec in colab_like.COLAB_LIKE:
        name, _, pinned = spec.partition("==")
        assert before.get(name, "").startswith(pinned) and name in before, (spec, before.get(name))

    # the editions, with the setup cell installing this wheel instead of the release tag
    out = tmp_path / "outside"  # not inside the repository
    out.mkdir()
    for path in NOTEBOOKS:
        nb, _ = ce.edition(path, source=wheel.as_uri())
        nbformat.write(nb, out / os.path.basename(path))
    # the setup cell, run once by itself: installs flashbook, keeps Colab's packages
    setup = ce.book_setup_cell(_load(NOTEBOOKS[0]), source=wheel.as_uri())
    subprocess.run([py, "-c", setup], check=True, cwd=out, env=ENV, capture_output=True, text=True)
    after = _freeze(py)
    assert "flashbook" in after
    for name in KEPT:
        assert after.get(name) == before.get(name), f"the setup cell changed {name}"
    # it may add what flashbook needs and the runtime lacks (anywidget, say), never change
    # or remove a package the runtime already has
    changed = {k for k in before if before.get(k) != after.get(k)}
    assert not changed, f"the setup cell changed {sorted(changed)}"
    timings["install"] = time.perf_counter()

    # every chapter, two at a time
    runner = tmp_path / "run_one.py"
    runner.write_text(_RUNNER)
    procs = {}
    pending = [str(out / os.path.basename(p)) for p in NOTEBOOKS]
    results = {}
    while pending or procs:
        while pending and len(procs) < 2:
            path = pending.pop(0)
            log = open(path + ".log", "w")  # a file, not a pipe: a long traceback cannot block it
            procs[path] = (subprocess.Popen([py, str(runner), path, str(out)], cwd=out, env=ENV,
                                            stdout=log, stderr=subprocess.STDOUT, text=True), log)
        for path, (proc, log) in list(procs.items()):
            if proc.poll() is not None:
                log.close()
                text = open(path + ".log").read()
                results[os.path.basename(path)] = (proc.returncode, text, text[-3000:])
                del procs[path]
        time.sleep(0.5)
    timings["run"] = time.perf_counter()
    failed = {k: v[2] for k, v in results.items() if v[0] != 0}
    assert not failed, failed
    seconds = {k: json.loads(re.findall(r'^\{"seconds".*$', v[1], re.M)[-1])["seconds"]
               for k, v in sorted(results.items())}
    print(seconds)
    print({k: round(timings[k] - timings["start"], 1) for k in ("venv", "install", "run")})

    # the base holds what it held: flashbook and what it added went into the fresh venv
    changed = sorted(path for path, *_ in colab_like.snapshot(base) ^ base_files)
    assert not changed, f"the base venv changed: {changed[:10]}"

    # chapters 9-10 found the recorded runs inside the package: tables and figures
    for name in ("09_benchmarks.ipynb", "10_making_it_fast.ipynb"):
        nb = _load(out / name)
        text = json.dumps([c.get("outputs", []) for c in nb.cells if c.cell_type == "code"])
        assert "No recorded" not in text, name
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, name
        assert sum("text/html" in o.get("data", {}) or "|" in o.get("text", "")
                   for o in outputs) >= 2, name


def test_numpy_chapters_never_import_triton():
    """On macOS or Windows (no triton) chapters 1-5 run: nothing they import pulls triton."""
    imports = set()
    for path in NOTEBOOKS:
        nb = _load(path)
        if ce.uses_triton(nb):
            continue
        for cell in nb.cells[1:]:
            if cell.cell_type == "code":
                imports |= set(re.findall(r"^(?:from flashbook[\w.]* import [\w, ]+|import flashbook[\w.]*)$",
                                          cell.source, re.M))
    assert imports
    code = "\n".join(sorted(imports)) + "\nimport sys\nassert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_no_chapter_uses_a_footnote_the_colab_edition_cannot_show():
    """Jupyter's Markdown has no footnotes: a MyST ``[^name]`` would show as its raw label in
    Colab, and the site moves it (with any glued value in it) to the end of the page."""
    for path in NOTEBOOKS:
        for cell in _load(path).cells:
            if cell.cell_type == "markdown":
                assert not re.search(r"\[\^[\w-]+\]", cell.source), (os.path.basename(path), cell.id)


def test_a_glue_directive_becomes_markdown_colab_shows():
    """```{glue} name``` pastes a whole output (chapter 10's noise table): its Markdown, else its
    HTML as one block (no style block, no blank or indented line), else its text as code."""
    html = '<div>\n<style scoped>\n  .dataframe th {\n  }\n</style>\n<table>\n  <tr>\n    <td>1.0</td>\n  </tr>\n</table>\n</div>'
    records = {"t": {"data": {"text/html": html, "text/plain": "x 1.0"}},
               "m": {"data": {"text/markdown": "| a |\n| - |", "text/plain": "a"}},
               "p": {"data": {"text/plain": "a  1.0\nb  2.0"}}}
    assert ce.pasted_block(records, "t", "s") == ["<div>", "<table>", "<tr>", "<td>1.0</td>", "</tr>", "</table>", "</div>"]
    assert ce.pasted_block(records, "m", "s") == ["| a |", "| - |"]
    assert ce.pasted_block(records, "p", "s") == ["```", "a  1.0", "b  2.0", "```"]
    with pytest.raises(SystemExit, match="nothing was glued as 'q'"):
        ce.pasted_block(records, "q", "s")
    conv = ce.Converter("s", records)
    text = conv.markdown(":::{dropdown} More\n```{glue} t\n```\n:::")
    assert ce.forbidden(text) == [] and "<details>" in text and "<td>1.0</td>" in text and conv.glued == []
