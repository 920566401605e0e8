"""Chapter 6's helpers: ``check_close``, the check its kernels (and exercises) pass; the recorded
softmax timing read back for the prose (``bandwidth_table``, ``recorded_gpu_name``); and the
profiled forward found in the recorded block sweep (``profiled_forward``, ``sweep_row_of``); the
second recorded configuration sweep (``config_sweep``).
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


def profiled_forward(folder, dim: int = 128) -> dict:
    """The main (longest) kernel of chapter 7's Triton forward without a mask at head dimension
    ``dim``, as Nsight Compute profiled it: a ``profiles.kernel_rows`` row of a recorded run."""
    from .profiles import TIME, kernel_rows

    return max((k for k in kernel_rows(folder) if k["impl"] == "triton" and k["pass_"] == "forward"
                and k["dim"] == dim and not k["causal"]), key=lambda k: k[TIME])


def sweep_row_of(kernel: dict, blocks):
    """The row of a recorded block sweep (``load_results`` of a ``blocks.csv``) that ran the same
    kernel as the profiled ``kernel`` (``profiled_forward``): the same shape, B_r (the length over
    the grid's first extent), warps, registers per thread and shared memory. KeyError unless
    exactly one row matches."""
    from .profiles import launch_extent

    smem = kernel["launch__shared_mem_per_block_dynamic"] + kernel["launch__shared_mem_per_block_static"]
    rows = blocks[~blocks["causal"] & blocks["status"].eq("ok") & (blocks["batch"] == kernel["batch"])
                  & (blocks["heads"] == kernel["heads"]) & (blocks["seq"] == kernel["seq"])
                  & (blocks["head_dim"] == kernel["dim"])
                  & (blocks["block_m"] == kernel["seq"] // launch_extent(kernel, "Grid Size"))
                  & (blocks["num_warps"] * 32 == launch_extent(kernel))
                  & (blocks["n_regs"] == kernel["launch__registers_per_thread"])
                  & (blocks["shared_bytes"] == smem)]
    if len(rows) != 1:
        raise KeyError(f"{len(rows)} rows of the sweep match the profiled kernel, want exactly 1")
    return rows.iloc[0]


def config_sweep(path):
    """The recorded configuration sweep (the index's ``kernels_config_sweep``, a CSV whose first line
    says how it ran): its rows with the config ``BM<m>-BN<n>-w<warps>-s<stages>`` split into
    ``block_m``, ``block_n``, ``num_warps`` and ``num_stages``, and that first line."""
    with open(path, encoding="utf-8") as f:
        header = f.readline().lstrip("#").strip()
    rows = pd.read_csv(path, comment="#")
    parts = rows["config"].str.extract(r"^BM(\d+)-BN(\d+)-w(\d+)-s(\d+)$")
    if parts.isna().any().any():
        raise ValueError(f"a config of {path} is not BM<m>-BN<n>-w<warps>-s<stages>")
    parts = parts.astype(int)
    parts.columns = ["block_m", "block_n", "num_warps", "num_stages"]
    return pd.concat([rows, parts], axis=1), header
