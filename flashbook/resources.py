"""Where the recorded GPU runs live (chapters 9 and 10 read them).

Three places, the first that exists wins:

1. ``$FLASHBOOK_RESULTS`` when it is set (any directory of recorded runs);
2. ``benchmarks/results/`` of a checkout: the current directory, its parent (a
   chapter runs in ``notebooks/``), or the checkout this package was imported from;
3. the copy shipped inside the package (``flashbook/data/results``), which the wheel
   build takes from ``benchmarks/results/`` (see setup.py), so that ``pip install``
   outside a checkout (Colab) still shows the recorded tables and figures.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

#: A directory of recorded runs to read instead of ``benchmarks/results/``.
RESULTS_ENV = "FLASHBOOK_RESULTS"

#: Where the recorded runs sit inside the installed package.
PACKAGE_RESULTS = ("data", "results")


def packaged_results() -> Path | None:
    """The recorded runs shipped inside the installed package, or None (a checkout
    installed editable has none: its ``benchmarks/results/`` is read instead)."""
    found = resources.files("flashbook").joinpath(*PACKAGE_RESULTS)
    # A plain install unpacks the package into a directory, so this is a real path.
    return Path(str(found)) if found.is_dir() else None


def results_dir(root=None) -> Path | None:
    """The directory that holds recorded runs, or None when there is none.

    ``root`` if given (None if it is not a directory), else ``$FLASHBOOK_RESULTS``
    if set; otherwise the first ``benchmarks/results`` found in the current
    directory, in its parent or in the checkout this module belongs to; otherwise
    the copy inside the package.
    """
    if root is None:
        root = os.environ.get(RESULTS_ENV) or None
    if root is not None:
        root = Path(root)
        return root if root.is_dir() else None
    for base in (Path.cwd(), Path.cwd().parent, Path(__file__).resolve().parents[1]):
        candidate = base / "benchmarks" / "results"
        if candidate.is_dir():
            return candidate
    return packaged_results()
