"""Shared test settings.

Importing flashbook first makes sure TRITON_INTERPRET is decided before any test
imports triton (no GPU: the interpreter).
"""
import os

import numpy as np
import pytest

import flashbook  # noqa: F401  (decides GPU vs interpreter before triton is imported)

#: CI sets CI=true: there, a test that cannot run is a failure, not a skip.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module, as running it sees itself: its folder
    on sys.path (the scripts import each other) and the module in sys.modules."""
    import importlib
    import sys

    folder = os.path.join(ROOT, "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def require(condition: bool, why: str):
    """Skip locally when a prerequisite is missing, but fail in CI."""
    if not condition:
        if IN_CI:
            pytest.fail(f"required in CI: {why}")
        pytest.skip(why)


@pytest.fixture
def rng():
    """Fresh random numbers on every run (the seed is printed when a test fails)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` first (the Colab-like run, the PDF, the compilations for
    three chips, the grader), each file's in its own order: under ``pytest -n`` they start
    at once on the workers, and the many short tests fill in beside them, instead of one
    long test starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
