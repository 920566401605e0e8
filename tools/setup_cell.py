"""The first cell of every chapter: install the companion library where it is missing.

One template, rendered by `tools/colab_edition.py` into the book's notebooks (where
the book build finds flashbook installed and skips it) and into the Colab edition;
tests/test_colab.py checks that every notebook holds exactly this text.

What the cell does, in a runtime without flashbook (Colab, a fresh Jupyter):
- installs ``flashbook[notebooks]`` from the release tag of the package version
  (``git+<repository>@v<version>``);
- pins torch, numpy, ipywidgets and triton to the versions already installed (a pip
  constraints file), so pip never replaces Colab's builds; if flashbook cannot work
  with them, pip refuses instead of reinstalling;
- on failure, says what to do (no network: clone the repository, ``pip install -e``);
- in a chapter that runs Triton kernels, on a machine without triton (macOS,
  Windows), says that this chapter needs Linux or Colab; the NumPy chapters never
  import triton and run anywhere.
"""
from __future__ import annotations

#: What pip must leave as the runtime has it.
KEPT = ("torch", "numpy", "ipywidgets", "triton")

_TEMPLATE = '''\
# Colab or a fresh Jupyter: install the companion library if it is missing, pinned to
# the release this chapter belongs to. torch, numpy, ipywidgets and triton stay as the
# runtime has them. (Generated from tools/setup_cell.py: edit it there.)
import importlib.util
if importlib.util.find_spec("flashbook") is None:
    import subprocess, sys, tempfile
    from importlib.metadata import PackageNotFoundError, version
    pins = []
    for name in {kept!r}:
        try:
            pins.append(f"{{name}}=={{version(name)}}")
        except PackageNotFoundError:
            pass
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as keep:
        keep.write("\\n".join(pins) + "\\n")
    source = "{source}"
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", keep.name,
                       f"flashbook[notebooks] @ {{source}}"]).returncode != 0:
        raise RuntimeError(
            "flashbook could not be installed (pip says why above). Without a network, "
            "clone {repo} on a machine that has one, copy the clone here, "
            "run `pip install -e '.[notebooks]'` in it, restart the kernel and run this cell "
            "again.") from None
    importlib.invalidate_caches()
import flashbook
'''

_TRITON = '''\
if importlib.util.find_spec("triton") is None:
    raise RuntimeError(
        "This chapter runs Triton kernels, and triton exists only for Linux: open it in "
        "Colab or on Linux. The NumPy chapters run here as they are.")
if flashbook.runtime.INTERPRET and flashbook.runtime.interpreter_problem():
    print(flashbook.runtime.interpreter_problem())
'''


def release_source(repo_url: str, version: str) -> str:
    """What pip installs: the repository at the release tag of ``version``."""
    return f"git+{repo_url}@v{version}"


def setup_cell(repo_url: str, version: str, triton: bool, source: str | None = None) -> str:
    """The setup cell's code. ``triton``: the chapter runs Triton kernels.
    ``source`` replaces the release URL (a test installs a freshly built wheel)."""
    text = _TEMPLATE.format(kept=KEPT, source=source or release_source(repo_url, version),
                            repo=repo_url)
    return (text + _TRITON if triton else text).rstrip("\n")
