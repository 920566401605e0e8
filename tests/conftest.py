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
