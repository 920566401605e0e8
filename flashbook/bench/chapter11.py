"""The tables chapter 11 (decoding and many GPUs) shows from the recorded runs.

Each function reads one recorded run (``benchmarks/results/index.json`` names them), prints its
provenance (GPU, versions, date) and returns the frames the chapter displays and glues from, or
None where the run is not recorded. Only chapter 11 imports this module.
"""
from __future__ import annotations

import json
import math

import pandas as pd

from .readback import find_runs, provenance_for, provenance_summary
from .runs import run_path, run_paths


def print_provenance(csv_path, full: bool = False, root=None) -> None:
    """Print the provenance recorded beside ``csv_path``, one ``key: value`` a line. Unless ``full``,
    a run on the same GPU with the same driver and versions as the newest ``decode.csv`` (the run
    the chapter prints in full first) gets one line: its date, and that it matches."""
    summary = provenance_summary(provenance_for(csv_path))
    newest = find_runs(root, "decode.csv")
    if not full and newest:
        first = provenance_summary(provenance_for(newest[0]))
        same = [k for k in summary if k not in ("date (UTC)", "command")]
        if all(summary[k] == first[k] and summary[k] != "not recorded" for k in same):
            print(f"recorded {summary['date (UTC)']} (UTC), with the GPU model, driver and versions of "
                  "the first decoding run above")
            return
    for key, value in summary.items():
        print(f"{key:>11}: {value}")


def provenance_text(csv_path) -> str:
    """The provenance recorded beside ``csv_path`` on one line, "key: value; key: value"."""
    return "; ".join(f"{key}: {value}" for key, value in provenance_summary(provenance_for(csv_path)).items())


def decode_shares(root=None, show: bool = True):
    """The newest ``decode.csv``: (path, its ok rows, flash_decode's rows, flash_decode's cache bytes per
    second as % of the measured copy bandwidth by cache length and batch), or None. Prints the run's
    provenance unless ``show`` is False (``provenance_text`` gives it on one line)."""
    runs = find_runs(root, "decode.csv")
    if not runs:
        return None
    path = runs[0]
    df = pd.read_csv(path)
    if show:
        print_provenance(path, full=True, root=root)
    ok = df[df["status"] == "ok"]
    ours = ok[ok["impl"] == "flash_decode"]
    share = ours.pivot_table(index="seq", columns="batch", values="copy_fraction_graph")
    return path, ok, ours, (100 * share).round(0).rename_axis(index="cache length", columns="batch")


def first_host_run(root=None):
    """The first decoding run with Python-call times (run ``decode_paged``, before the short path):
    (all its rows, the batch-1 rows up to 16K of flash_decode and cuDNN, a table of µs), or None."""
    path = run_path("decode_paged", root)
    if path is None:
        return None
    host_df = pd.read_csv(path / "decode.csv")
    print_provenance(path / "decode.csv", root=root)
    small = host_df[(host_df["batch"] == 1) & (host_df["seq"] <= 16384) & (host_df["status"] == "ok")
                    & host_df["impl"].isin(["flash_decode", "sdpa-cudnn"])]
    us = 1000 * small.pivot_table(index="seq", columns="impl", values=["ms", "graph_ms"])
    table = pd.DataFrame({"flash_decode, called (µs)": us["ms"]["flash_decode"],
                          "flash_decode, graph (µs)": us["graph_ms"]["flash_decode"],
                          "cuDNN, called (µs)": us["ms"]["sdpa-cudnn"],
                          "cuDNN, graph (µs)": us["graph_ms"]["sdpa-cudnn"]})
    return host_df, small, table.round(1).rename_axis(index="cache length (batch 1)")


#: the pieces of a call, each timed alone: (key before the short path, key with it)
HOST_PIECES = {"the whole call": ("call", "call"),
               "Triton's launch of the split kernel (checked path)": ("launch_jit:_decode_fwd", "launch_jit:split"),
               "its compiled launcher (short path)": ("launch_compiled:_decode_fwd", "launch_compiled:split"),
               "Triton's launch of the combine (checked path)": ("launch_jit:_decode_combine", "launch_jit:combine"),
               "the argument checks (checked path)": ("checks", "checks"),
               "SDPA on cuDNN, the whole call": ("sdpa_cudnn", "sdpa_cudnn")}


def host_pieces(root=None):
    """The host's time per call at batch 1 and a 2K cache, piece by piece (runs ``decode_host``: the
    first, before the short path, and the newest), and the called times of the later run with the
    short path (``decode_short_path``). Returns (pieces, the later run's batch-1 rows, a table of their
    called µs, that run's decode.csv), or None. A path's column shows only the pieces it pays (NaN for
    the others). Prints nothing: the chapter prints the later run's provenance between the tables."""
    runs, short = run_paths("decode_host", root), run_path("decode_short_path", root)
    if len(runs) < 2 or short is None:
        return None
    before, after = (json.loads((path / "host.json").read_text())["2048"] for path in (runs[0], runs[-1]))
    pays = {"before": lambda name: "short path" not in name, "with": lambda name: "checked path" not in name}
    pieces = pd.DataFrame({
        "before the short path (µs)": [before[a]["median_us"] if pays["before"](k) else float("nan")
                                       for k, (a, _) in HOST_PIECES.items()],
        "with it (µs)": [after[b]["median_us"] if pays["with"](k) else float("nan")
                         for k, (_, b) in HOST_PIECES.items()]},
        index=pd.Index(list(HOST_PIECES), name="on the host, batch 1, 2K cache")).round(1)
    short_df = pd.read_csv(short / "decode.csv")
    b1 = short_df[(short_df["batch"] == 1) & short_df["impl"].isin(["flash_decode", "sdpa-cudnn"])]
    called = ((1000 * b1.pivot_table(index="seq", columns="impl", values="ms")).round(1)
              .rename(columns={"flash_decode": "flash_decode, called (µs)", "sdpa-cudnn": "cuDNN, called (µs)"})
              .rename_axis(index="cache length (batch 1)", columns=None))
    return pieces, b1, called, short / "decode.csv"


#: the ring table's columns; check: output and gradients against one GPU
RING_COLUMNS = ["n", "single_ms", "ring_ms", "speedup", "compute_ms", "comm_ms", "overlapped_ms",
                "overlapped_spread_ms", "hidden_fraction", "check"]


def _newest_ring(root=None):
    """The newest recorded ``ring.csv`` (two GPUs), or None: what the ring functions read."""
    runs = find_runs(root, "ring.csv")
    return runs[0] if runs else None


def ring_runs(root=None, show: bool = True):
    """The newest ``ring.csv`` (two GPUs): (its rows, the table the chapter shows), or None. Prints
    the run's provenance unless ``show`` is False (``ring_provenance`` gives it on one line)."""
    newest = _newest_ring(root)
    if newest is None:
        return None
    ring_df = pd.read_csv(newest)
    if show:
        print_provenance(newest, root=root)
    return ring_df, ring_df[RING_COLUMNS].set_index("n").round(3)


#: the ring table's columns the chapter shows in its reading flow, with their labels
RING_SHOWN = {"single_ms": "one GPU (ms)", "ring_ms": "two GPUs (ms)", "speedup": "speedup",
              "compute_ms": "ring, compute alone (ms)", "comm_ms": "ring, transfers alone (ms)"}


def ring_provenance(root=None) -> str:
    """The newest ``ring.csv``'s provenance on one line (``provenance_text``), or "not recorded"."""
    newest = _newest_ring(root)
    return provenance_text(newest) if newest else "not recorded"


def ring_release(root=None) -> str:
    """The flashbook release the newest ``ring.csv`` was recorded with (its provenance's
    ``flashbook``), or "not recorded"."""
    newest = _newest_ring(root)
    return str(provenance_for(newest).get("flashbook", "not recorded")) if newest else "not recorded"


def ring_settings(root=None) -> dict:
    """The settings the newest ``ring.csv`` was run with (its provenance's ``settings``: the
    lengths, heads, head_dim, repeats ...), or {} where none are recorded."""
    newest = _newest_ring(root)
    return provenance_for(newest).get("settings", {}) if newest else {}


def plot_ring(ax, ring_df):
    """Milliseconds per training step (forward + backward) against N, on one GPU and on the ring."""
    ax.plot(ring_df["n"], ring_df["single_ms"], "o-", label="one GPU")
    ax.plot(ring_df["n"], ring_df["ring_ms"], "s-", label="ring, 2 GPUs")
    ax.plot(ring_df["n"], ring_df["single_ms"] / 2, "k:", label="2 GPUs, ideal (one GPU's / 2)")
    ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="ms per step (fwd + bwd)")
    ax.set_xticks(list(ring_df["n"]), [f"{int(n) // 1024}K" for n in ring_df["n"]])
    ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.legend()
    return ax


def ncu_table(before, after, batch=64, seq=32768):
    """Nsight Compute's reading of one decoding step (``decoding.ncu_steps`` of two runs: one split,
    then four splits), dense cache and cuDNN, at ``batch`` and a ``seq``-token cache."""
    rows = []
    for n, steps in ((1, before), (4, after)):
        splits = f"{n} split" + ("s" if n > 1 else "")
        for s in steps:
            if (s["batch"], s["seq"]) == (batch, seq) and s["impl"] != "paged":
                # cuDNN has no split count: it was profiled alongside, in the same session
                name = (f"flash_decode, {splits}" if s["impl"] == "dense"
                        else f"cuDNN (profiled alongside the {n}-split run)" if s["impl"] == "sdpa-cudnn"
                        else f"{s['impl']} ({splits})")
                rows.append({"kernel": name, "µs": s["kernel_us"] + s["merge_us"],
                             "programs per SM": s["per_sm"], "waves": s["waves"],
                             "SMs busy (%)": 100 * s["sm_busy"], "DRAM (% of peak)": s["dram_pct"]})
    table = pd.DataFrame(rows).set_index("kernel")
    table = table.round({"waves": 2})
    for column in ("µs", "SMs busy (%)", "DRAM (% of peak)"):       # whole numbers, without a ".0"
        table[column] = table[column].round().astype(int)
    return table


def paged_stages(root=None):
    """The paged cache's pipeline stages in the tile sweep of the newest ``decode_splits`` run
    (``decode_tiles.csv`` beside it), as the chapter quotes them: {"dense", "paged": each cache's
    default number of stages in that run, "timed": the stage counts timed on the paged cache,
    "spread": the largest (slowest / fastest - 1) over those stage counts at one shape, with the
    paged cache's default key tile and warps, in per cent}, or None where no sweep is recorded."""
    runs = run_paths("decode_splits", root)
    path = runs[-1] / "decode_tiles.csv" if runs else None
    if path is None or not path.is_file():
        return None
    tiles = pd.read_csv(path)
    tiles = tiles[tiles["error"].isna()]
    default = tiles[tiles["default"]]
    stages = {cache: sorted(set(default[default["cache"] == cache]["num_stages"])) for cache in ("dense", "paged")}
    assert all(len(s) == 1 for s in stages.values()), stages     # one default per cache
    spread, timed = 0.0, set()
    for _, row in default[default["cache"] == "paged"].iterrows():
        same = tiles[(tiles["cache"] == "paged") & (tiles["batch"] == row["batch"]) & (tiles["seq"] == row["seq"])
                     & (tiles["block_n"] == row["block_n"]) & (tiles["num_warps"] == row["num_warps"])]
        spread = max(spread, same["graph_ms"].max() / same["graph_ms"].min() - 1)
        timed |= set(same["num_stages"])
    return {"dense": stages["dense"][0], "paged": stages["paged"][0], "timed": sorted(timed), "spread": 100 * spread}


def decode_bandwidth(ours, hbm_tb_s):
    """flash_decode's cache bytes read per second in a CUDA graph (``kv_tb_s_graph`` of
    ``decode_shares``' rows), by cache length and batch, each cell "TB/s (% of ``hbm_tb_s``)":
    the share of the datasheet's bandwidth, which a kernel that only reads cannot exceed."""
    tb_s = ours.pivot_table(index="seq", columns="batch", values="kv_tb_s_graph")
    table = tb_s.apply(lambda col: [f"{x:.2f} ({100 * x / hbm_tb_s:.0f}%)" for x in col])
    return table.rename_axis(index="cache length", columns="batch")


#: the rows of ``host_paths``: (row, the keys of host.json it sums)
HOST_PATHS = {"flash_decode, checked path (whole call)": ("checked_path",),
              "flash_decode, short path (whole call)": ("call",),
              "SDPA on cuDNN (whole call)": ("sdpa_cudnn",),
              "checked path: Triton's two launches": ("launch_jit:split", "launch_jit:combine"),
              "checked path: the argument checks": ("checks",),
              "short path: the two compiled launchers": ("launch_compiled:split", "launch_compiled:combine")}


def host_paths(root=None, seqs=("2048",)):
    """The host's microseconds per eager call at batch 1, every number from one run (the newest
    ``decode_host``): flash_decode's checked path (the plan forgotten before each call), its
    short path and SDPA on cuDNN, whole calls and their pieces timed alone, at the cache
    lengths ``seqs`` (None: every recorded one). The default is 2K alone: the run times 1,000
    calls back to back with one synchronisation, and at 32K the short path's time per call
    comes close to the GPU's own step at batch 1, so there the loop may wait on the GPU.
    Returns (that table, {cache length: host.json's entries, every recorded length}, the whole
    call of the first ``decode_host`` run at 2K: an earlier tree, timed in another run), or None."""
    runs = run_paths("decode_host", root)
    if not runs:
        return None
    newest = json.loads((runs[-1] / "host.json").read_text())
    first = json.loads((runs[0] / "host.json").read_text())["2048"]["call"]["median_us"]
    table = pd.DataFrame({f"{int(seq) // 1024}K cache": [sum(pieces[k]["median_us"] for k in keys)
                                                          for keys in HOST_PATHS.values()]
                          for seq, pieces in newest.items() if seqs is None or seq in seqs},
                         index=pd.Index(list(HOST_PATHS), name="µs on the host, batch 1"))
    return table.round(1), newest, first


def ring_send_factor(world: int, elem_bytes: int = 2) -> float:
    """The bytes one rank sends in one forward and backward of the ring (``distributed``'s
    ``_ring_forward`` and ``_ring_backward``), in units of its K/V block (``kv_bytes_per_hop``):
    the forward sends K/V on ``world - 1`` times, the backward K/V ``world - 1`` times and the
    dK/dV sums ``world`` times (the last hop brings them home), in the float32 accumulator
    (float64 for float64 inputs): twice the bytes of a 2-byte K/V."""
    acc_bytes = 8 if elem_bytes == 8 else 4
    return 2 * (world - 1) + world * acc_bytes / elem_bytes


def ring_min_shard(flops_per_s: float, bytes_per_s: float, causal: bool = False, backward: bool = False) -> int:
    """Exercise 3's smallest shard c (tokens per rank) whose attention, at ``flops_per_s``, takes
    at least as long as its hop, at ``bytes_per_s``, in one ring step. Unmasked forward:
    4 c^2 d H FLOPs against K/V's 2 c d H values of 2 bytes, so c >= F / B. A causal zigzag step
    computes half a block, which doubles c. A backward step does five c x c x d products where
    the forward does two (2.5 times the FLOPs: the scores again, dV, dP, dQ, dK) and sends K/V
    with float32 dK/dV, three times the bytes (``ring_send_factor``), which multiplies c by 3 / 2.5."""
    ratio = flops_per_s / bytes_per_s
    if causal:
        ratio *= 2
    if backward:
        ratio *= 3 / 2.5
    return math.ceil(ratio)


def ring_link(ring_df, link_bytes_per_s, elem_bytes: int = 2):
    """The ring's communication-only timing set against a link: by length ``n``, the MB each rank
    sent in a forward and backward (``ring_send_factor`` K/V blocks), ``comm_ms``, the rate that
    makes (GB/s each way), its share of ``link_bytes_per_s`` (%), and compute alone over
    communication alone (exercise 3's test: the transfer can hide where this is at least 1)."""
    sent = ring_df["kv_bytes_per_hop"] * ring_send_factor(int(ring_df["world_size"].iloc[0]), elem_bytes)
    rate = sent / (ring_df["comm_ms"] / 1e3)
    return pd.DataFrame({"MB sent per rank": sent / 1e6, "comm_ms": ring_df["comm_ms"],
                         "GB/s each way": rate / 1e9, "% of the link": 100 * rate / link_bytes_per_s,
                         "compute_ms / comm_ms": ring_df["compute_ms"] / ring_df["comm_ms"]}
                        ).set_index(ring_df["n"]).round({"MB sent per rank": 0, "comm_ms": 2, "GB/s each way": 0,
                                                         "% of the link": 0, "compute_ms / comm_ms": 1})
