"""The numbers chapter 12 (one kernel, many masks) reads from the recorded window runs.

``window_order`` returns what the chapter says about a sliding window's launch order and tiles
(runs ``window_order`` and ``window_tiles`` of ``benchmarks/results/index.json``), ``one_loop``
what it says about the short window's backward in one loop (run ``one_loop``), ``fused_bwd``
what it says about the backward's two kernels in one launch (run ``fused_bwd``),
``document_order`` and ``document_profile`` about packed documents taken heaviest first (runs
``document_order`` and ``document_profile``): each value
computed from the files, or None when a run is not recorded there.
"""
from __future__ import annotations

import json
import statistics

from .runs import load_recorded_json, run_path, run_paths


def _tile_medians(sweep: dict) -> dict:
    """{(kernel, (block_m, block_n, warps, stages)): median backward ms} of one swept shape."""
    times = {}
    for row in sweep["rows"]:
        if "bwd_ms" in row:
            times.setdefault((row["kernel"], tuple(row["config"])), []).append(row["bwd_ms"])
    return {key: statistics.median(ms) for key, ms in times.items()}


#: the two tile choices of each kernel the sweep compares: the causal mask's, the short window's
CAUSAL_TILES = {"backward_dkdv": (64, 128, 8, 3), "backward_dq": (128, 64, 8, 4)}
SHORT_TILES = {"backward_dkdv": (64, 64, 4, 2), "backward_dq": (64, 64, 4, 2)}


#: from this length on (tokens), the window rows whose launch order made no difference beyond the spread
LATE_SEQ = 16384


def _spread(times) -> float:
    """How far repeated timings of one thing spread: (slowest - fastest) / median."""
    return (max(times) - min(times)) / statistics.median(times)


def window_order(root=None) -> dict | None:
    """The window's order and tiles, as the chapter quotes them:

    - ``plain_fwd``, ``last_fwd``, ``causal_fwd``: forward ms at batch 1 x 16 heads, N = 4K, of a
      window as long as the sequence in the plain order and last first, and of the causal kernel;
    - ``exact``: every output and gradient bitwise equal between the orders, in every row;
    - ``gain_{kernel}_lo/hi``: per cent less backward time with the causal mask's tiles than with
      the short window's, over the W = 4K shapes (``long``), and ``loss_{kernel}_lo/hi`` the per
      cent more with W = 1K (``short``); kernel is ``dkdv`` or ``dq``;
    - ``windows``: the windows' left sides those tile sweeps timed (no length between them was);
    - ``batch``, ``heads``, ``seq``: the shape of the window as long as the sequence (its grid);
    - ``late_lo``, ``late_hi``: the plain order's forward time over last first's, over the window
      rows from ``LATE_SEQ`` tokens on, and ``late_within``: each of those within its spread (the
      larger of the two orders' (slowest - fastest) / median of the forward's rounds).
    """
    from ..kernels import configs

    order = load_recorded_json("window_order", root)
    paths = run_paths("window_tiles", root)
    if order is None or not paths or not paths[-1].is_file():
        return None
    rows = {r["shape"]: r for r in order["rows"]}
    same, causal = rows["window 4K at 4K"]["times"], rows["causal 4K B1"]["times"]
    out = {"plain_fwd": same["heavy-off"]["fwd_ms"], "last_fwd": same["rule"]["fwd_ms"],
           "causal_fwd": causal["rule"]["fwd_ms"],
           "exact": all(all(r["exact"].values()) for r in order["rows"]), "rows": len(order["rows"])}
    out.update({key: rows["window 4K at 4K"][key] for key in ("batch", "heads", "seq")})
    late = []
    for r in order["rows"]:
        if r["mask"] == "window" and r["seq"] >= LATE_SEQ:
            t = r["times"]
            spread = max(_spread(t[v]["fwd"]) for v in ("heavy-off", "rule"))
            late.append((t["heavy-off"]["fwd_ms"] / t["rule"]["fwd_ms"], spread))
    out["late_lo"], out["late_hi"] = min(x for x, _ in late), max(x for x, _ in late)
    out["late_within"] = all(abs(x - 1) <= spread for x, spread in late)
    with open(paths[-1]) as f:
        sweeps = json.load(f)["sweeps"]
    medians = [(sweep["window"] + 1 >= configs.LONG_WINDOW, _tile_medians(sweep)) for sweep in sweeps]
    for kernel, short in (("backward_dkdv", "dkdv"), ("backward_dq", "dq")):
        gains, losses = [], []
        for long, med in medians:
            ratio = med[kernel, SHORT_TILES[kernel]] / med[kernel, CAUSAL_TILES[kernel]]
            if long:     # the short window's tiles are the slower: per cent more than the causal ones
                gains.append(100 * (ratio - 1))
            else:        # the causal tiles are the slower
                losses.append(100 * (1 / ratio - 1))
        out[f"gain_{short}_lo"], out[f"gain_{short}_hi"] = min(gains), max(gains)
        out[f"loss_{short}_lo"], out[f"loss_{short}_hi"] = min(losses), max(losses)
    out["long"] = sum(long for long, _ in medians)
    out["short"] = len(medians) - out["long"]
    out["windows"] = sorted({sweep["window"] for sweep in sweeps})   # the window lengths timed (left sides)
    return out


def one_loop(root=None) -> dict | None:
    """The short window's backward in one loop (run ``one_loop``), as the chapter quotes it:

    - ``gain_lo``, ``gain_hi``: per cent of the three loops' backward time that one loop saved
      over the rows the library gives one loop (windows shorter than ``configs.LONG_WINDOW``,
      with a soft cap or not), and ``lengths`` their N;
    - ``loss_lo``, ``loss_hi``: per cent more time one loop took over the rows that keep three
      (a long window, the causal mask, packed documents);
    - ``exact``: every gradient bitwise the three loops', in every row and variant;
    - ``flex``: [(N, before, after)], FlexAttention's forward + backward time over flashbook's
      for the plain 1K window, from run ``masks_window_order`` (three loops; None where it has
      no such row) and from the comparison recorded with this run (one loop), or None.
    """
    from ..kernels import configs
    from .cli import parse_seq_list

    def size(text):   # masks_profile's shapes write lengths as the bench CLI reads them: "4K" or "4096"
        return parse_seq_list(text)[0]

    folder = run_path("one_loop", root)
    if folder is None or not (folder / "one_loop.json").is_file():
        return None
    with open(folder / "one_loop.json") as f:
        run = json.load(f)
    gains, losses, lengths = [], [], []
    for row in run["rows"]:
        name, n, _, *window = row["shape"].split(":")
        ms = row["median_ms"]
        change = 100 * (ms["three"] - ms["one"]) / ms["three"]
        if name.startswith("window") and size(window[0]) < configs.LONG_WINDOW:   # one loop by the rule
            gains.append(change)
            lengths.append(n)
        else:
            losses.append(-change)
    out = {"gain_lo": min(gains), "gain_hi": max(gains), "loss_lo": min(losses), "loss_hi": max(losses),
           "lengths": sorted(set(lengths), key=size),
           "exact": all(all(row["bitwise_equal"].values()) for row in run["rows"]), "flex": None}
    # FlexAttention's forward + backward time over flashbook's for the plain 1K window, N by N:
    # the run's own comparison (masks.json beside it) after run masks_window_order's, before it
    before, after = (_flex_ratios(path) for path in (run_path("masks_window_order", root), folder))
    if before and after:
        out["flex"] = [(n, before.get(n), after[n]) for n in sorted(after)]
    return out


def _flex_ratios(folder) -> dict | None:
    """{N: Flex / flashbook forward + backward} of the plain 1,024-key window in a recorded
    ``masks_bench.py`` folder, or None."""
    if folder is None or not (folder / "masks.json").is_file():
        return None
    with open(folder / "masks.json") as f:
        rows = json.load(f)["rows"]
    return {r["seq"]: r["flex_over_flashbook_fwd_bwd"] for r in rows
            if r["mask"] == "window" and r["window"][0] == 1024 and "flex_over_flashbook_fwd_bwd" in r}


def _fused_bwd_rows(root):
    """The rows of run ``fused_bwd`` that were timed, in file order, as (mask name, N, head
    dimension as recorded, the row, the key of its two-launch variant: "separate", or "library"
    in the first runs), or None when the run is not recorded."""
    from .cli import parse_seq_list

    folder = run_path("fused_bwd", root)
    if folder is None or not folder.is_dir():
        return None
    out = []
    for path in sorted(folder.glob("*.json")):
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            if "median_ms" not in row:   # a shape the run refused (its error is recorded)
                continue
            name, n, d, *_ = row["shape"].split(":")
            two = "separate" if "separate" in row["median_ms"] else "library"
            out.append((name, parse_seq_list(n)[0], d, row, two))
    return out


def fused_bwd(root=None) -> dict | None:
    """The backward's dK/dV and dQ programs in one launch (run ``fused_bwd``), as the chapter
    quotes it: {mask name: [(N, per cent of two launches' backward time that one launch in
    FlexAttention's order saved)]} over every recorded row at d = 128 (negative: it took longer),
    and ``exact``: every variant's gradients bitwise the two launches', in every row."""
    timed = _fused_bwd_rows(root)
    if timed is None:
        return None
    gains, exact = {}, True
    for name, n, d, row, two_name in timed:
        ms = row["median_ms"]
        two = ms[two_name]
        if d == "128":
            gains.setdefault(name, []).append((n, 100 * (two - ms["halves"]) / two))
        exact = exact and all(row["bitwise_equal"].values())
    return {"gains": {name: sorted(rows) for name, rows in gains.items()}, "exact": exact} if gains else None


def document_order(root=None) -> dict | None:
    """Packed documents' programs heaviest document first (run ``document_order``), as the
    chapter quotes it: ``gains`` [(N, d, per cent of the backward's time in the order given that
    the heaviest-first order saved)] (negative: it took longer), ``spread`` the largest spread of
    either order's rounds, ``clear`` the (N, d) whose gain exceeds the spread of both orders
    there, and ``exact``: the gradients bitwise equal in every row."""
    from .cli import parse_seq_list

    record = load_recorded_json("document_order", root)
    if record is None:
        return None
    gains, clear, spread, exact = [], [], 0.0, True
    for row in record["rows"]:
        if "median_ms" not in row:
            continue
        _, n, d, *_ = row["shape"].split(":")
        ms, n, d = row["median_ms"], parse_seq_list(n)[0], int(d)
        gains.append((n, d, 100 * (ms["given_order"] - ms["halves"]) / ms["given_order"]))
        noise = max(row["spread"]["halves"], row["spread"]["given_order"])
        spread = max(spread, noise)
        if gains[-1][2] > 100 * noise:
            clear.append((n, d))
        exact = exact and all(row["bitwise_equal"].values())
    order = lambda g: (-g[1], g[0])   # noqa: E731 (d = 128 first, then by length)
    return {"gains": sorted(gains, key=order), "clear": sorted(clear, key=order), "spread": spread,
            "exact": exact} if gains else None


def document_profile(root=None) -> dict | None:
    """Packed documents at 8K, d = 128, profiled with the library as it is (run
    ``document_profile``): {"forward", "backward", "busy": (flashbook, Flex)}, the forward
    kernels' and the backward kernels' GPU microseconds per call and the whole call's GPU
    milliseconds, or None when not recorded."""
    record = load_recorded_json("document_profile", root)
    rows = [] if record is None else [r for r in record["profiles"]
                                      if (r["name"], r["n"], r["d"], r["batch"]) == ("documents", 8192, 128, 1)]
    if not rows:
        return None
    row = rows[0]

    def kernels(impl, backward):
        return sum(k["us_per_step"] for name, k in row[impl]["kernels"].items()
                   if (name.startswith("_bwd") if impl == "flashbook" else "backward" in name) == backward)

    return {"forward": (kernels("flashbook", False), kernels("flex", False)),
            "backward": (kernels("flashbook", True), kernels("flex", True)),
            "busy": (row["flashbook"]["gpu_busy_ms"], row["flex"]["gpu_busy_ms"])}


def forward_tiles(root=None) -> dict | None:
    """A short window's forward on its own tiles (runs ``masks_d64``: before, then after at
    d = 64, then after at d = 128; ``window_fwd_tiles``: the tile sweep), as the chapter quotes
    it: ``flex`` {d: (Flex / flashbook forward before, after) as (low, high) over the lengths both
    ran, 1K window}, and ``sweep``: the d = 128, 16K forward's default and best time (ms), the
    best tiles and how many were timed."""
    paths = run_paths("masks_d64", root)
    if len(paths) != 3 or not all(p.is_file() for p in paths):
        return None
    ratios = []
    for path in paths:
        with open(path) as f:
            ratios.append({(r["head_dim"], r["seq"]): r["flex_over_flashbook_fwd"] for r in json.load(f)["rows"]
                           if r["mask"] == "window" and r["window"][0] == 1024})
    before, after64, after128 = ratios
    out = {"flex": {}}
    for d, after in ((64, after64), (128, after128)):
        both = [key for key in after if key[0] == d and key in before and key[1] >= (4096 if d == 64 else 8192)]
        pick = (lambda table: (min(table[k] for k in both), max(table[k] for k in both)))
        out["flex"][d] = (pick(before), pick(after), sorted(k[1] for k in both))
    sweep = run_path("window_fwd_tiles", root)
    out["sweep"] = None
    if sweep is not None and sweep.is_file():
        with open(sweep) as f:
            shape = next(s for s in json.load(f)["sweeps"] if s["name"] == "window" and s["d"] == 128)
        timed = {tuple(r["config"]): r["fwd_ms"] for r in shape["rows"] if "fwd_ms" in r}
        best = min(timed, key=timed.get)
        out["sweep"] = {"n": shape["n"], "default_ms": timed[tuple(shape["default"]["forward"])],
                        "best_ms": timed[best], "best": best, "timed": len(timed)}
    return out


def long_window_tiles(root=None) -> dict | None:
    """A long window's forward at d = 64 (run ``window_d64_tiles``: a 4K window, N = 16K), as the
    chapter quotes it: ``window_ms``, the forward on the window's own tiles (64 x 64, 4 warps, 3
    stages: ``configs``' window entry), ``causal_ms`` on the causal mask's (128 x 64, 8 warps, 3
    stages), and the window, length and head_dim."""
    path = run_path("window_d64_tiles", root)
    if path is None or not path.is_file():
        return None
    with open(path) as f:
        shape = json.load(f)["sweeps"][0]
    timed = {tuple(r["config"]): r["fwd_ms"] for r in shape["rows"] if r["kernel"] == "forward" and "fwd_ms" in r}
    return {"window_ms": timed[(64, 64, 4, 3)], "causal_ms": timed[(128, 64, 8, 3)], "window": shape["window"],
            "n": shape["n"], "d": shape["d"]}


def flex_verdicts(rows) -> dict:
    """FlexAttention against flashbook in a recorded ``masks_bench.py`` comparison, counted with
    the noise rule chapter 12 states: a row is a *win* for flashbook when Flex's time over ours
    exceeds 1 by more than the larger spread of the two implementations' repeats in that row
    (``spread``: (slowest - fastest) / median), a *loss* when it is below 1 by more than that
    spread, and a *tie* otherwise. For ``fwd`` and ``fwd_bwd``: {"win", "tie", "loss"} counts,
    and ``steady_best``: (ratio, row) of the largest ratio among the rows whose repeats both
    agreed within 3% (None if no row did). ``rows``: the record's ``rows``."""
    out = {}
    for key in ("fwd", "fwd_bwd"):
        counts = {"win": 0, "tie": 0, "loss": 0}
        steady = []
        for r in rows:
            ratio = r[f"flex_over_flashbook_{key}"]
            noise = max(r["flashbook"]["spread"][key], r["flex"]["spread"][key])
            counts["win" if ratio - 1 > noise else "loss" if 1 - ratio > noise else "tie"] += 1
            if noise < 0.03:
                steady.append((ratio, r))
        out[key] = dict(counts, steady_best=max(steady, key=lambda t: t[0]) if steady else None)
    return out


def backward_alone(rows, masks=("window", "documents"), from_seq=8192) -> list[dict]:
    """The backward alone in a recorded ``masks_bench.py`` comparison, for the rows of ``masks``
    from ``from_seq`` tokens on: forward-plus-backward time less forward time (medians), per row
    {"mask", "window", "seq", "ratio": Flex's backward time over ours, "spread": the most the
    repeats let that difference move, as a share of the backward's time: for each implementation
    its two spreads ((slowest - fastest) / median) times their medians, added, over its backward
    time; the larger of the two}. Flex's backward is faster *beyond the spread* when
    ``1 - ratio > spread``."""
    def bwd(i):
        return i["fwd_bwd_ms"] - i["fwd_ms"]

    def spread(i):
        return (i["spread"]["fwd_bwd"] * i["fwd_bwd_ms"] + i["spread"]["fwd"] * i["fwd_ms"]) / bwd(i)

    out = []
    for r in rows:
        if r["seq"] < from_seq or r["mask"] not in masks:
            continue
        f, x = r["flashbook"], r["flex"]
        out.append({"mask": r["mask"], "window": r["window"][0], "seq": r["seq"], "ratio": bwd(x) / bwd(f),
                    "spread": max(spread(f), spread(x))})
    return out


def soft_cap_sfu_share(sass, chip_name="H200", head_dim=128) -> dict:
    """From ``soft_cap_sass``'s compiled counts and the per-clock rates of ``chip_name``'s architecture: the
    special-function unit's operations per score in the forward's key loop, without and with the
    soft cap, and the time the unit needs for them as a share of the tensor cores' time for the
    same score (4 d FLOPs: Q K^T and P V), both at their per-clock rates on one SM. The loop body is
    compiled ``copies`` times (masked and unmasked); the few operations per row (the rescale's exp2,
    1/l) are left out, so the counts per score are whole numbers. {"copies", "plain_ops", "cap_ops",
    "plain_share", "cap_share", "sfu_per_clock", "tensor_flop_per_clock"} (the last two: the rates
    used, per clock of one SM)."""
    from .. import runtime

    per = sass["scores_per_thread"]
    plain, cap = sass["plain"], sass["softcap"]
    copies = (cap["EX2"] - plain["EX2"]) // per
    ops = {}
    for name, counts in (("plain", plain), ("cap", cap)):
        total = counts["EX2"] + counts["RCP"]
        per_row = total % (copies * per)          # outside the per-score work: fewer than one per score
        ops[name] = (total - per_row) // (copies * per)
    arch = runtime.chip(chip_name).arch
    # per clock of one SM, so that no clock enters (the datasheet quotes the tensor peak at a lower
    # clock than the maximum the unit's rate would use)
    tensor_clk = 4 * head_dim / runtime.TENSOR_FLOP_PER_CLOCK_PER_SM[arch]   # clocks per score
    sfu_clk = 1 / runtime.SFU_PER_CLOCK_PER_SM                                 # clocks per operation
    return {"copies": copies, "plain_ops": ops["plain"], "cap_ops": ops["cap"],
            "plain_share": ops["plain"] * sfu_clk / tensor_clk, "cap_share": ops["cap"] * sfu_clk / tensor_clk,
            "sfu_per_clock": runtime.SFU_PER_CLOCK_PER_SM,
            "tensor_flop_per_clock": runtime.TENSOR_FLOP_PER_CLOCK_PER_SM[arch]}


#: the recorded runs whose folders also hold GPU stress tests of the mask classes (junit files)
STRESS_RUNS = ("masks_window_order", "masks_d64", "masks_native", "document_order", "one_loop", "masks")


def _junit_cases(path):
    """[(class name, failed)] of the stress classes in a pytest junit file of
    ``tests/test_stress_gpu.py``."""
    import re
    import xml.etree.ElementTree as ET

    out = []
    for case in ET.parse(path).iter("testcase"):
        found = re.search(r"\[(.*?)\]", case.get("name") or "")
        if found and "-" in found.group(1):   # a class name (other tests' parameters are plain values)
            failed = case.find("failure") is not None or case.find("error") is not None
            out.append((found.group(1), failed))
    return out


def stress_reruns(root=None) -> dict | None:
    """The mask classes' GPU stress tests after the one that failed (run ``stress``, its
    ``*classes_masks*`` junit files): ``failed``, the class names that failed in the last of
    those with a failure; ``files``, ``tests`` and ``failures`` over every
    ``*stress*.junit.xml`` in the folders of ``STRESS_RUNS`` and the later ``*classes_masks*``
    files (each run 60 seeded calls per class against float64); ``rerun_failed``: every failed
    class passed again in at least one of them; ``classes``: how many classes the failed run
    ran, ``not_rerun``: how many of them none of the later files ran, and ``complete``: how
    many of those files ran every one of them (the others ran some); ``packed``,
    ``packed_tests`` and ``packed_failures``: the packed-document classes (``varlen-...``) among
    those later files, their checks and failures; or None when nothing is recorded."""
    stress = run_path("stress", root)
    if stress is None or not stress.is_dir():
        return None
    masks_runs = sorted(stress.glob("*classes_masks*.junit.xml"), key=lambda p: int(p.name.split("_")[0]))
    if not masks_runs:
        return None
    read = [_junit_cases(path) for path in masks_runs]   # each file parsed once
    failing = [i for i, cases in enumerate(read) if any(bad for _, bad in cases)]
    base = failing[-1] if failing else len(masks_runs) - 1
    last = read[base]
    folders = []
    for name in STRESS_RUNS:
        for path in run_paths(name, root):
            folder = path if path.is_dir() else path.parent
            if folder.is_dir() and folder not in folders:
                folders.append(folder)
    files = sorted({f for folder in folders for f in folder.glob("*stress*.junit.xml")} | set(masks_runs[base + 1:]))
    per_file = [_junit_cases(f) for f in files]
    later = [case for cases in per_file for case in cases]
    passed = {name for name, failed in later if not failed}
    failed = sorted({name for name, bad in last if bad})
    packed = [(name, bad) for name, bad in later if name.startswith("varlen")]   # packed documents' classes
    return {"failed": failed, "classes": len({name for name, _ in last}), "files": len(files), "tests": len(later),
            "packed": len({name for name, _ in packed}), "packed_tests": len(packed),
            "packed_failures": sum(bad for _, bad in packed),
            "failures": sum(bad for _, bad in later), "rerun_failed": bool(failed) and set(failed) <= passed,
            "not_rerun": len({name for name, _ in last} - {name for name, _ in later}),
            "complete": sum({name for name, _ in last} <= {name for name, _ in cases} for cases in per_file)}


def fused_bwd_rounds(root=None) -> dict | None:
    """Run ``fused_bwd`` round by round, for chapter 12's noise rule: {(mask name, N): {"gain": per
    cent of two launches' median backward that one launch in FlexAttention's order saved (as
    ``fused_bwd``), "spread": the larger spread of the two variants' rounds, (slowest - fastest) /
    median in per cent, "every": +1 when every round of one launch was faster than every round of
    two launches, -1 when every one was slower, 0 otherwise}} over the rows at d = 128, or None
    when the run is not recorded. (The run's README quotes a "largest spread" over all three of
    its variants, the interleaved order's included; the rule compares the two variants timed.)"""
    timed = _fused_bwd_rows(root)
    if timed is None:
        return None
    out = {}
    for name, n, d, row, two_name in timed:
        if d != "128" or "times_ms" not in row:
            continue
        two, one = row["times_ms"][two_name], row["times_ms"]["halves"]
        med_two, med_one = statistics.median(two), statistics.median(one)
        spread = max(_spread(t) for t in (two, one))
        every = 1 if max(one) < min(two) else -1 if min(one) > max(two) else 0
        out[name, n] = {"gain": 100 * (med_two - med_one) / med_two, "spread": 100 * spread, "every": every}
    return out or None


def soft_cap_sass() -> dict | None:
    """The special-function unit's instructions (SASS ``MUFU.EX2`` and ``MUFU.RCP``) in the forward
    kernel compiled for sm_90 on this machine (no GPU needed), bf16, d = 128, causal, its default
    tiles, without and with the soft cap: {"plain": {"EX2": n, "RCP": n}, "softcap": {...},
    "scores_per_thread": scores of one tile each thread holds}. Counts are of instructions in the
    code, not of instructions executed. None when the compiler or its disassembler is missing."""
    import subprocess

    from ..kernels import configs, targets

    cfg = configs.default("forward", cc=90, block_d=128, elem_bytes=2, causal=True)
    ops = ("MUFU.EX2", "MUFU.RCP")
    jobs = [dict(kernel="forward", cc=90, head_dim=128, dtype="bf16", causal=True, softcap=cap,
                 config=[cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages], sass_ops=ops)
            for cap in (False, True)]
    try:
        results = targets.compile_elsewhere(jobs, timeout=900)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError):   # no compiler or disassembler
        return None
    if any(r["error"] for r in results):
        return None
    out = {name: {op.split(".")[1]: r["sass_ops"][op] for op in ops} for name, r in zip(("plain", "softcap"), results)}
    out["scores_per_thread"] = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    return out
