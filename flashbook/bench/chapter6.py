"""Chapter 6's helpers: ``check_close``, the check its kernels (and exercises) pass, and the
recorded softmax timing read back for the prose (``bandwidth_table``, ``recorded_gpu_name``).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import torch

from .runs import gpu_record


def check_close(name, actual, expected, *, atol, rtol=0.0):
    """Assert |actual - expected| <= atol + rtol * |expected| (atol: a number or a tensor).

    Prints the largest error, where it is and the two values there; on failure, how many
    elements are outside the tolerance and the worst of them."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    err = torch.nan_to_num((actual - expected).abs(), nan=math.inf)   # NaN counts as wrong
    bound = torch.as_tensor(atol, dtype=torch.float64).cpu() + rtol * expected.abs()
    bad = err > bound

    def at(flat_index):
        return tuple(int(i) for i in np.unravel_index(int(flat_index), tuple(err.shape)))

    i = at(torch.argmax(err))
    print(f"{name}: max |error| {float(err[i]):.2e} at {i} "
          f"(got {float(actual[i]):.6g}, expected {float(expected[i]):.6g}, "
          f"allowed {float(bound.expand_as(err)[i]):.2e})", end="")
    if not bad.any():
        print(": ok")
        return
    j = at(torch.argmax(err - bound))
    message = (f"{int(bad.sum())} of {err.numel()} elements outside tolerance; worst at {j}: "
               f"got {float(actual[j]):.6g}, expected {float(expected[j]):.6g}, "
               f"error {float(err[j]):.2e} > allowed {float(bound.expand_as(err)[j]):.2e}")
    print(": FAILED\n  " + message)
    raise AssertionError(f"{name}: {message}")


def bandwidth_table(text):
    """The softmax timing cell's printed table, read back: GB/s per column count."""
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", text or "", re.M)
    return pd.DataFrame([(int(c), float(a), float(b)) for c, a, b in rows],
                        columns=["cols", "fused Triton (GB/s)", "torch.softmax (GB/s)"]).set_index("cols")


def recorded_gpu_name(notebook="06_gpu_and_triton"):
    """The GPU the notebook's gpu cells were recorded on ("" when nothing is recorded)."""
    record = gpu_record(notebook)
    return record["provenance"]["gpu"] if record else ""
