"""Reading what was recorded (chapters 9 and 10): the newest run and its provenance,
our kernel's ratios to the SDPA backends judged against ``PERFORMANCE_TARGETS``,
roofline points and ceilings, the block-size explorer's state, the Hopper experiment.

Chapters draw every figure from the files that ``records`` wrote, never from the
machine that builds the book. These functions need pandas, and no GPU.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .. import runtime
from .costs import attention_flops, attention_hbm_bytes
from .harness import RESULT_FIELDS, shape_label
from .records import match_chip, results_root
from .source_check import SEED_SHAPE
from .sweeps import BLOCK_FIELDS

#
# Chapter 9 draws every figure from the files that Part 7 wrote, never from the
# machine that builds the book. These functions find the newest run, read it back
# with its provenance, and turn its rows into the ratios, targets and roofline
# points the chapter shows. They need pandas, and no GPU.

#: The columns that name one shape: a row is one implementation on one shape.
SHAPE_KEYS = ("batch", "heads", "seq", "head_dim", "causal", "dtype")

_TEXT_COLUMNS = ("impl", "dtype", "status", "check", "note")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def provenance_for(csv_path) -> dict:
    """The provenance of one CSV: a JSON file beside it, with "provenance" in its
    name, whose ``files`` names that CSV (or names no file at all). ``{}`` if none.

    Two runs written into one directory leave one provenance.json, the second's:
    it names only its own CSV, so the other CSV is not given the wrong machine.
    """
    csv_path = Path(csv_path)
    candidates = sorted(csv_path.parent.glob("*provenance*.json"),
                        key=lambda p: (p.name != "provenance.json", p.name))
    fallback = {}
    for path in candidates:
        try:
            prov = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(prov, dict):
            continue
        files = prov.get("files") or {}
        if csv_path.name in files:
            return prov
        if not files and not fallback:
            fallback = prov
    return fallback


def provenance_summary(prov: dict) -> dict:
    """What a chapter shows beside measured numbers, read from one provenance dict:
    GPU, driver, CUDA, cuDNN, torch, triton, date and command, each as text
    ("not recorded" where the provenance lacks it)."""
    prov = prov or {}
    gpu = prov.get("gpu") or {}
    name = gpu.get("name") if isinstance(gpu, dict) else gpu
    if name and isinstance(gpu, dict) and (gpu.get("capability") or gpu.get("sms")):
        extras = [str(gpu["capability"])] if gpu.get("capability") else []
        extras += [f"{gpu['sms']} SMs"] if gpu.get("sms") else []
        name = f"{name} ({', '.join(extras)})"
    values = {"GPU": name, "driver": prov.get("driver"), "CUDA": prov.get("cuda"),
              "cuDNN": prov.get("cudnn"), "torch": prov.get("torch"),
              "triton": prov.get("triton"), "date (UTC)": prov.get("date_utc"),
              "command": prov.get("command")}
    return {k: "not recorded" if v in (None, "") else str(v) for k, v in values.items()}


def run_date(csv_path) -> str:
    """When a CSV was measured, as text that sorts in time order: the provenance's
    ``date_utc``, else a YYYY-MM-DD in the directory names, else the file's mtime."""
    csv_path = Path(csv_path)
    date = provenance_for(csv_path).get("date_utc")
    if date:
        return str(date)
    for part in reversed(csv_path.parent.parts):
        found = _DATE_RE.search(part)
        if found:
            return found.group()
    mtime = _dt.datetime.fromtimestamp(csv_path.stat().st_mtime, _dt.timezone.utc)
    return mtime.isoformat(timespec="seconds")


def find_runs(root=None, csv_name: str = "results.csv") -> list:
    """Every ``csv_name`` under the results root (at any depth), newest first."""
    root = results_root(root)
    if root is None:
        return []
    found = [p for p in root.rglob(csv_name) if p.is_file()]
    return sorted(found, key=lambda p: (run_date(p), str(p)), reverse=True)


def latest_results(root=None, csv_name: str = "results.csv"):
    """The newest recorded ``results.csv`` (a Path), or None when nothing is recorded."""
    runs = find_runs(root, csv_name)
    return runs[0] if runs else None


def latest_blocks(root=None):
    """The newest recorded ``blocks.csv`` (from ``--sweep-blocks``), or None."""
    return latest_results(root, "blocks.csv")


def latest_ladder(root=None):
    """The newest recorded ``ladder.csv`` (from ``--ladder``), or None."""
    return latest_results(root, "ladder.csv")


#: The columns that name one shape of the ladder (a pass is a ladder of its own).
LADDER_KEYS = ("pass_", "batch", "heads", "seq", "head_dim", "causal", "dtype")


def ladder_speedups(ladder):
    """The ladder (``load_results`` of a ``ladder.csv``) sorted by pass, shape and
    rung, with two columns added per row: ``vs_prev``, the previous rung's time
    over this one's, and ``vs_first``, the pass's first rung's time over this
    one's (> 1: this rung is faster; the same as the ratio of TFLOP/s, since every
    rung of a pass does the same FLOPs). NaN where either did not run."""
    keys = [k for k in LADDER_KEYS if k in ladder.columns]
    out = ladder.sort_values(keys + ["rung"]).reset_index(drop=True)
    ms = out["ms"].where(out["status"].eq("ok")).astype(float)
    groups = ms.groupby([out[k] for k in keys], sort=False)
    out["vs_prev"] = groups.shift(1) / ms
    out["vs_first"] = groups.transform(lambda s: s.iloc[0]) / ms
    return out


def typed_frame(df):
    """Text columns as text ("" for empty), ``causal`` as bool, numbers as numbers
    (NaN for empty); a column this module does not know stays text unless every
    value in it is a number."""
    import pandas as pd

    for col in df.columns:
        if col in _TEXT_COLUMNS:
            df[col] = df[col].fillna("").astype(str)
        elif col == "causal":
            df[col] = df[col].astype(str).str.strip().str.lower().eq("true")
        else:
            numbers = pd.to_numeric(df[col], errors="coerce")
            given = df[col].notna() & df[col].map(lambda v: v != "")
            known = col in RESULT_FIELDS or col in BLOCK_FIELDS
            df[col] = numbers if known or numbers[given].notna().all() \
                else df[col].fillna("").astype(str)
    return df


def load_results(path):
    """``(DataFrame, provenance dict)`` of one recorded CSV (``results.csv`` or
    ``blocks.csv``; a directory means the ``results.csv`` in it). Empty cells are
    NaN in number columns and "" in text columns; provenance is ``{}`` if none."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"path must be a recorded CSV or a directory holding "
                                f"results.csv, got {str(path)!r}")
    df = typed_frame(pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]))
    return df, provenance_for(path)


def results_frame(results):
    """A DataFrame of ``Result`` or ``BlockResult`` rows (a live run), typed like
    ``load_results`` gives them."""
    import pandas as pd

    rows = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in results]
    fields = BLOCK_FIELDS if rows and "block_m" in rows[0] else RESULT_FIELDS
    return typed_frame(pd.DataFrame(rows, columns=fields))


def _by_shape(df, impl):
    keys = [k for k in SHAPE_KEYS if k in df.columns]
    rows = df[df["impl"] == impl]
    if rows.empty:
        raise ValueError(f"the results have no rows for impl {impl!r}; they have "
                         f"{sorted(set(df['impl']))}")
    rows = rows.set_index(keys)
    if rows.index.duplicated().any():
        raise ValueError(f"impl {impl!r} has more than one row for a shape")
    return rows


def speedup_table(df, baseline: str = "sdpa-flash", impl: str = "flashbook"):
    """Our kernel against ``baseline``, one row per shape ``impl`` was run on.

    ``fwd`` and ``bwd``: the baseline's time over ours (> 1: ours is faster; the
    same as the ratio of TFLOP/s, since both do the same FLOPs). ``memory``: our
    peak memory beyond the inputs over the baseline's (< 1: ours holds less).
    NaN where either was not measured (a status other than "ok").
    """
    import pandas as pd

    mine, base = _by_shape(df, impl), _by_shape(df, baseline)
    base = base.reindex(mine.index)
    ok_m, ok_b = mine["status"].eq("ok"), base["status"].eq("ok")
    out = pd.DataFrame(index=mine.index)
    out["fwd"] = (base["fwd_ms"].where(ok_b) / mine["fwd_ms"].where(ok_m)).astype(float)
    out["bwd"] = (base["bwd_ms"].where(ok_b) / mine["bwd_ms"].where(ok_m)).astype(float)
    out["memory"] = (mine["peak_fwd_bwd_bytes"].where(ok_m)
                     / base["peak_fwd_bwd_bytes"].where(ok_b)).astype(float)
    order = [k for k in ("head_dim", "seq", "causal", "batch", "heads") if k in out.index.names]
    return out.sort_index(level=order)


@dataclass(frozen=True)
class Target:
    """One performance target for our kernel, against one baseline.

    ``metric`` is a column of ``speedup_table``: "fwd" and "bwd" must reach at
    least ``threshold``, "memory" must stay at most ``threshold``. It applies to
    the shapes with a head_dim in ``head_dims`` (None: any) and ``seq >= min_seq``.
    ``kind`` is "target" (what the kernel must do) or "goal" (what it aims at).
    """

    label: str
    metric: str
    baseline: str
    threshold: float
    kind: str = "target"
    head_dims: tuple | None = None
    min_seq: int = 0

    def applies(self, head_dim, seq) -> bool:
        return ((self.head_dims is None or int(head_dim) in self.head_dims)
                and int(seq) >= self.min_seq)

    def met(self, ratio):
        """True or False; None when the ratio is missing (not measured)."""
        if ratio is None or not math.isfinite(ratio):
            return None
        return bool(ratio <= self.threshold if self.metric == "memory"
                    else ratio >= self.threshold)


#: The kernel's targets (every shape) and goals (d = 128, N >= 4K).
PERFORMANCE_TARGETS = (
    Target("forward >= 1.15x SDPA-flash", "fwd", "sdpa-flash", 1.15),
    Target("backward >= 1.0x SDPA-flash", "bwd", "sdpa-flash", 1.0),
    Target("peak memory <= 1.1x SDPA-flash", "memory", "sdpa-flash", 1.1),
    Target("forward >= 0.9x SDPA-cuDNN", "fwd", "sdpa-cudnn", 0.9, kind="goal",
           head_dims=(128,), min_seq=4096),
    Target("backward >= 0.8x SDPA-cuDNN", "bwd", "sdpa-cudnn", 0.8, kind="goal",
           head_dims=(128,), min_seq=4096),
)


def target_table(df, impl: str = "flashbook", targets=PERFORMANCE_TARGETS):
    """One row per (shape, target) where the target applies: the ratio (from
    ``speedup_table``), the threshold and ``met`` (True, False, or None when
    ``impl`` or the baseline was not measured on that shape)."""
    import pandas as pd

    rows, tables = [], {}
    for t in targets:
        if t.baseline not in tables:
            tables[t.baseline] = speedup_table(df, t.baseline, impl).reset_index()
        for rec in tables[t.baseline].to_dict("records"):
            if not t.applies(rec["head_dim"], rec["seq"]):
                continue
            ratio = float(rec[t.metric])
            shape = {k: rec[k] for k in SHAPE_KEYS if k in rec}
            rows.append({**shape, "target": t.label, "kind": t.kind, "baseline": t.baseline,
                         "metric": t.metric, "threshold": t.threshold, "ratio": ratio,
                         "met": t.met(ratio)})
    columns = [k for k in SHAPE_KEYS if k in df.columns] + [
        "target", "kind", "baseline", "metric", "threshold", "ratio", "met"]
    return pd.DataFrame(rows, columns=columns)


def target_summary(table, targets=PERFORMANCE_TARGETS):
    """Per target: the shapes it applies to, how many were measured, met and
    missed, and the worst ratio with its shape."""
    import pandas as pd

    out = []
    for t in targets:
        rows = table[table["target"] == t.label]
        measured = rows[rows["met"].notna()]
        worst = None
        if not measured.empty:
            ratio = measured["ratio"]
            worst = measured.loc[ratio.idxmax() if t.metric == "memory" else ratio.idxmin()]
        out.append({"target": t.label, "kind": t.kind, "shapes": len(rows),
                    "measured": len(measured),
                    "met": int((measured["met"] == True).sum()),       # noqa: E712
                    "missed": int((measured["met"] == False).sum()),   # noqa: E712
                    "worst_ratio": None if worst is None else float(worst["ratio"]),
                    "worst_shape": None if worst is None else shape_label(
                        worst["head_dim"], worst["seq"], worst["causal"])})
    return pd.DataFrame(out).set_index("target")


#: The algorithm whose fewest bytes bound each implementation (naive: the N x N
#: matrices go through HBM; every fused kernel: they never do).
_ALGORITHM = {"naive": "naive", "sdpa-math": "naive"}
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def roofline_points(df, impls=None):
    """Each measured row as two roofline points (forward, backward).

    ``intensity`` = FLOPs / the fewest HBM bytes of the implementation's algorithm
    (``attention_hbm_bytes``: "naive" for ``naive`` and ``sdpa-math``, which also
    computes in fp32, so 4 bytes an element; "flash" for the fused kernels). The
    FLOPs are the harness's convention (backward 2.5x forward), the same ones its
    TFLOP/s divide by, so a point sits under the roof exactly when its time is
    above the floor ``roofline_ms`` gives.
    """
    import pandas as pd

    rows = df[df["status"] == "ok"]
    if impls is not None:
        rows = rows[rows["impl"].isin(list(impls))]
    out = []
    for rec in rows.to_dict("records"):
        b, h, n, d = (int(rec[k]) for k in ("batch", "heads", "seq", "head_dim"))
        algorithm = _ALGORITHM.get(rec["impl"], "flash")
        elem = 4 if rec["impl"] == "sdpa-math" else _DTYPE_BYTES.get(rec.get("dtype"), 2)
        for pass_ in ("fwd", "bwd"):
            measured = rec.get(f"{pass_}_tflops")
            if measured is None or not math.isfinite(measured):
                continue
            flops = attention_flops(b, h, n, n, d, bool(rec["causal"]), pass_)
            moved = attention_hbm_bytes(b, h, n, n, d, impl=algorithm, pass_=pass_,
                                        dtype_bytes=elem)
            out.append({"impl": rec["impl"], "algorithm": algorithm, "pass": pass_,
                        **{k: rec[k] for k in SHAPE_KEYS if k in rec},
                        "flops": flops, "hbm_bytes": moved, "intensity": flops / moved,
                        "tflops": float(measured)})
    columns = ["impl", "algorithm", "pass", *[k for k in SHAPE_KEYS if k in df.columns],
               "flops", "hbm_bytes", "intensity", "tflops"]
    return pd.DataFrame(out, columns=columns)


def roofline_ceilings(provenance=None, chip: str | None = None, dtype: str = "bf16") -> dict:
    """The roof of one chip: peak tensor TFLOP/s, HBM TB/s and the ridge point.

    Measured ceilings are used where the provenance records them (a ``measured``
    dict, at the top or under ``gpu``, with ``<dtype>_tflops`` or
    ``matmul_tflops``, and ``hbm_tb_s``); otherwise the datasheet's, from
    ``runtime.CHIPS``. ``peak_source`` and ``hbm_source`` say which.
    The chip is ``chip``, else the provenance's GPU.
    """
    prov = provenance or {}
    gpu = prov.get("gpu") or {}
    name = chip or (gpu.get("datasheet") or {}).get("chip") or match_chip(gpu.get("name", ""))
    if name is None:
        raise ValueError(f"chip must name one of {sorted(runtime.CHIPS)} when the provenance "
                         f"names no known GPU (it names {gpu.get('name')!r})")
    c = runtime.chip(name)
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    peak = c.bf16_tflops if dtype == "bf16" else c.fp16_tflops
    out = {"chip": c.name, "dtype": dtype, "peak_tflops": peak, "hbm_tb_s": c.hbm_tb_s,
           "peak_source": "datasheet", "hbm_source": "datasheet"}
    measured = prov.get("measured") or gpu.get("measured") or {}
    for key in (f"{dtype}_tflops", "matmul_tflops"):
        if measured.get(key):
            out["peak_tflops"], out["peak_source"] = float(measured[key]), "measured"
            break
    if measured.get("hbm_tb_s"):
        out["hbm_tb_s"], out["hbm_source"] = float(measured["hbm_tb_s"]), "measured"
    if out["peak_tflops"] is None:
        raise ValueError(f"{c.name} has no {dtype} tensor cores")
    out["ridge"] = out["peak_tflops"] / out["hbm_tb_s"]   # FLOP per byte
    return out


def seed_shape_rows(df, shape=None):
    """The measured rows (every implementation, no mask) of the shape closest to
    the seed table's (``SEED_SHAPE``: B=8, H=32, N=4096, d=128), and one phrase
    saying how close.

    The article states N, B and H; d = 128 is only inferred from its text. So
    the closest shape has the same N if any does, then the same B x H, then the
    same B, and only then the nearest d.
    """
    shape = shape or SEED_SHAPE
    full = df[~df["causal"].astype(bool)]
    if full.empty:
        return full, "no shape without a mask was measured"
    shapes = full[["batch", "heads", "seq", "head_dim"]].drop_duplicates()

    def distance(r):
        return (abs(math.log2(r.seq / shape["n"])),
                abs(r.batch * r.heads - shape["batch"] * shape["heads"]),
                abs(r.batch - shape["batch"]), abs(r.head_dim - shape["d"]))

    best = min(shapes.itertuples(index=False), key=distance)
    rows = full[(full["batch"] == best.batch) & (full["heads"] == best.heads)
                & (full["seq"] == best.seq) & (full["head_dim"] == best.head_dim)]
    want = {"B": shape["batch"], "H": shape["heads"], "N": shape["n"], "d": shape["d"]}
    got = {"B": int(best.batch), "H": int(best.heads), "N": int(best.seq),
           "d": int(best.head_dim)}
    here = ", ".join(f"{k}={v}" for k, v in got.items())
    same = [k for k in want if got[k] == want[k]]
    differ = [k for k in want if got[k] != want[k]]
    if not differ:
        return rows, f"{here}: the seed's own shape"
    kept = (f"the seed's {', '.join(same[:-1])} and {same[-1]}" if len(same) > 1
            else f"the seed's {same[0]}" if same else "none of the seed's sizes")
    return rows, (f"{here}, the closest measured shape: {kept}, but "
                  + ", ".join(f"{k}={got[k]} instead of {want[k]}" for k in differ))


def block_shared_bytes(row) -> float:
    """Shared memory a swept config used, bytes: the compiled kernel's number, or
    for a config that did not fit, the number the compiler's error gives. NaN if
    neither was recorded."""
    try:
        value = float(row.get("shared_bytes"))
    except (TypeError, ValueError):
        value = float("nan")
    if math.isfinite(value):
        return value
    found = re.search(r"Required:\s*(\d+)", str(row.get("note") or ""))
    return float(found.group(1)) if found else float("nan")


def block_fits(block_m: int, block_n: int, num_warps: int, num_stages: int, head_dim: int, *,
               dtype_bytes: int = 2, shared_bytes=None, measured_arch: str | None = None) -> dict:
    """Whether one forward-kernel config fits each chip of ``runtime.CHIPS``.

    Per chip: ``bytes`` of shared memory one program needs, the chip's ``limit``
    per program, ``fits``, and ``how`` the bytes were found: "measured" (the
    compiled kernel's ``shared_bytes``, on a chip of ``measured_arch``) or
    "model" (``kernels.configs.smem_estimate`` for that chip's architecture).
    """
    from ..kernels import configs

    cfg = configs.Config(int(block_m), int(block_n), int(num_warps), int(num_stages))
    tile_d = configs.block_d(int(head_dim))
    have = shared_bytes is not None and math.isfinite(float(shared_bytes))
    out = {}
    for name, c in runtime.CHIPS.items():
        if have and c.arch == measured_arch:
            need, how = int(shared_bytes), "measured"
        else:
            cc = int(c.arch.split("_")[1])
            need, how = configs.smem_estimate("forward", cfg, tile_d, dtype_bytes, cc), "model"
        out[name] = {"bytes": need, "limit": c.smem_per_block_bytes,
                     "fits": need <= c.smem_per_block_bytes, "how": how}
    return out


def best_blocks(blocks):
    """For each shape and (B_r, B_c): the measured config with the most TFLOP/s
    (over warps and stages). Configs that did not run are left out."""
    ok = blocks[(blocks["status"] == "ok") & blocks["fwd_tflops"].notna()]
    keys = ["head_dim", "seq", "causal", "block_m", "block_n"]
    best = ok.loc[ok.groupby(keys)["fwd_tflops"].idxmax()]
    return best.sort_values(keys).reset_index(drop=True)


@dataclass(frozen=True)
class BlockState:
    """What the chapter-9 explorer shows for one config of the recorded sweep."""

    head_dim: int
    seq: int
    config: tuple               # (block_m, block_n, num_warps, num_stages)
    row: dict | None            # the measured row, None if the sweep lacks it
    rank: int | None            # 1 = fastest of the configs that ran
    n_ran: int                  # configs of this shape that ran
    n_configs: int              # configs of this shape in the sweep
    best: dict | None           # the fastest row
    shared_bytes: float         # measured (or from the compiler's error), NaN if unknown
    fits: dict                  # block_fits(...) per chip
    ranking: tuple = ()         # ((config, TFLOP/s), ...) fastest first

    @property
    def tflops(self):
        return None if self.row is None else self.row.get("fwd_tflops")

    def summary(self) -> str:
        bm, bn, w, s = self.config
        head = f"B_r={bm}, B_c={bn}, {w} warps, {s} stages (d={self.head_dim}, N={self.seq})"
        if self.row is None:
            return f"{head}: not in the recorded sweep"
        r = self.row
        if r["status"] != "ok":
            return f"{head}: {r['status']} ({r['note'][:90]})"
        best = self.best

        def count(value):
            return "?" if value is None or not math.isfinite(value) else f"{int(value)}"

        return (f"{head}: {r['fwd_tflops']:.0f} TFLOP/s, number {self.rank} of {self.n_ran} "
                f"(best {best['fwd_tflops']:.0f}: B_r={int(best['block_m'])}, "
                f"B_c={int(best['block_n'])}, {int(best['num_warps'])} warps, "
                f"{int(best['num_stages'])} stages); {count(r.get('n_regs'))} registers per "
                f"thread, {count(r.get('n_spills'))} spilled; "
                f"{count(self.shared_bytes / 1024)} KiB of shared memory")


def block_state(blocks, head_dim: int, block_m: int, block_n: int, num_warps: int,
                num_stages: int, *, seq: int | None = None, measured_arch: str | None = None,
                dtype_bytes: int = 2) -> BlockState:
    """The explorer's state for one config of a recorded block sweep (``blocks.csv``):
    its measured row, its rank, the best config, and whether it fits each chip.
    ``seq`` picks the shape when the sweep has several (default: the longest)."""
    rows = blocks[blocks["head_dim"] == head_dim]
    if rows.empty:
        raise ValueError(f"head_dim must be one of {sorted(set(blocks['head_dim']))}, "
                         f"got {head_dim!r}")
    seq = int(rows["seq"].max()) if seq is None else int(seq)
    rows = rows[rows["seq"] == seq]
    if rows["causal"].nunique() > 1:      # the sweep's default is without a mask
        rows = rows[~rows["causal"]]
    config = (int(block_m), int(block_n), int(num_warps), int(num_stages))
    mine = rows[(rows["block_m"] == block_m) & (rows["block_n"] == block_n)
                & (rows["num_warps"] == num_warps) & (rows["num_stages"] == num_stages)]
    ran = rows[(rows["status"] == "ok") & rows["fwd_tflops"].notna()].sort_values(
        "fwd_tflops", ascending=False)
    keys = ["block_m", "block_n", "num_warps", "num_stages"]
    ranking = tuple((tuple(int(x) for x in r[keys]), float(r["fwd_tflops"]))
                    for _, r in ran.iterrows())
    order = [c for c, _ in ranking]
    row = mine.iloc[0].to_dict() if not mine.empty else None
    shared = block_shared_bytes(row) if row is not None else float("nan")
    fits = block_fits(*config, head_dim, dtype_bytes=dtype_bytes,
                      shared_bytes=shared if math.isfinite(shared) else None,
                      measured_arch=measured_arch)
    return BlockState(head_dim=int(head_dim), seq=seq, config=config, row=row,
                      rank=order.index(config) + 1 if config in order else None,
                      n_ran=len(ran), n_configs=len(rows),
                      best=ran.iloc[0].to_dict() if not ran.empty else None,
                      shared_bytes=shared, fits=fits, ranking=ranking)


#: Where ``benchmarks/hopper_fwd_experiment.py``'s recorded run lives, under the results root.
HOPPER_EXPERIMENT = "hopper_fwd_h200.json"


#: ``benchmarks/gpu_check.py --autotune``'s recorded run, under the results root.
AUTOTUNE_RUN = "autotune_h200.json"


def load_recorded_json(name: str, root=None):
    """One recorded JSON file of the results root (a dict), or None when it is not there."""
    base = results_root(root)
    path = base / name if base is not None else None
    if path is None or not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def load_hopper_experiment(root=None):
    """``(DataFrame, environment dict)`` of the recorded Hopper forward experiment
    (tensor descriptors and automatic warp specialisation; chapter 10), or
    ``(None, {})`` when none is recorded. One row per shape and variant, with
    ``tma`` and ``ws`` flags and ``tflops`` (NaN where the variant failed)."""
    import pandas as pd

    data = load_recorded_json(HOPPER_EXPERIMENT, root)
    if data is None:
        return None, {}
    df = pd.DataFrame(data["rows"])
    if "tflops" not in df:  # no variant ran at all
        df["tflops"] = float("nan")
    df["tma"] = df["variant"].str.startswith("tma ")
    df["ws"] = df["variant"].str.endswith(" ws")
    return df, data.get("environment", {})


def hopper_experiment_table(rows):
    """Per shape: the library kernel's and cuDNN's TFLOP/s, the best descriptor (TMA)
    variant without and with warp specialisation, each over the library kernel, and how
    many variants failed to compile. ``rows`` is ``load_hopper_experiment``'s frame."""
    import pandas as pd

    out = []
    for (seq, d, causal), g in rows.groupby(["seq", "head_dim", "causal"], sort=True):
        lib = g.loc[g["variant"] == "flashbook", "tflops"]
        cudnn = g.loc[g["variant"] == "cudnn", "tflops"]
        if lib.empty or not lib.notna().all():
            raise ValueError(f"rows must hold a timed 'flashbook' variant for every shape; "
                             f"none at seq={seq}, head_dim={d}, causal={causal}")
        lib = float(lib.iloc[0])
        row = {"seq": int(seq), "head_dim": int(d), "causal": bool(causal), "flashbook": lib,
               "cudnn": float(cudnn.iloc[0]) if len(cudnn) else float("nan")}
        for key, pick in (("tma", g["tma"] & ~g["ws"]), ("tma_ws", g["tma"] & g["ws"])):
            ran = g[pick & g["tflops"].notna()]
            if ran.empty:
                row[f"best_{key}"], row[f"best_{key}_tflops"], row[f"{key}_vs_flashbook"] = None, float("nan"), float("nan")
            else:
                best = ran.loc[ran["tflops"].idxmax()]
                row[f"best_{key}"] = best["variant"]
                row[f"best_{key}_tflops"] = float(best["tflops"])
                row[f"{key}_vs_flashbook"] = float(best["tflops"]) / lib
        row["failed"] = int((g["tma"] & g["tflops"].isna()).sum())
        row["tried"] = int(g["tma"].sum())
        out.append(row)
    return pd.DataFrame(out)


#: ``benchmarks/lazy_rescale_experiment.py``'s and ``static_shape_experiment.py``'s recorded
#: runs, under the results root (chapter 10 reads them with ``variant_table``).
LAZY_EXPERIMENT = "lazy_rescale_h200/lazy_rescale.json"
STATIC_SHAPE_EXPERIMENT = "static_shape_h200.json"
#: benchmarks/gluon_experiment.py's runs on the H200, by head_dim (chapter 10's Gluon kernel)
GLUON_EXPERIMENTS = {128: "gluon_h200/gluon_d128.json", 64: "gluon_h200/gluon_d64.json"}
GLUON_SCHEDULES = ("overlap", "producer", "pingpong")
#: benchmarks/gluon_exp2_experiment.py's runs on the H200, by head_dim: part of the exponentials on the FMA units
GLUON_EXP2_EXPERIMENTS = {64: "gluon_exp2_h200/gluon_exp2_d64.json", 128: "gluon_exp2_h200/gluon_exp2_d128.json"}
#: benchmarks/host_overhead.py's run on the H200
HOST_OVERHEAD_RUN = "host_overhead_h200/host_overhead.json"
#: benchmarks/gluon_experiment.py --graph at d=64, fp16: every configuration at 1K-3K, then
#: 1K, 2K and 4K with the persistent schedule beside the others (chapter 10)
GLUON_SHORT_SWEEPS = ("gluon_h200/gluon_d64_short_graph.json", "gluon_h200/gluon_d64_persistent_graph.json")
#: the kinds of configuration ``short_sweep_table`` compares: (column, variant-name prefix)
SHORT_FAMILIES = (("old default", "gluon overlap m64 n128 s2"), ("64 rows", "gluon overlap m64 "),
                  ("192 rows", "gluon producer m192 "), ("persistent", "gluon persistent "))


def variant_table(name: str, prefix: str, root=None):
    """Per dtype, length and mask of a recorded forward experiment (``name``, e.g.
    ``LAZY_EXPERIMENT``): the library kernel's and cuDNN's TFLOP/s, the fastest variant
    whose name starts with ``prefix`` and its speed over the library kernel, and its
    largest error against float64 beside the library's. None when nothing is recorded."""
    data = load_recorded_json(name, root)
    return None if data is None else best_variants(data["rows"], prefix, name)


def best_variants(rows, prefix: str, name: str = "the run"):
    """``variant_table`` for rows already read (a recorded experiment's ``"rows"``)."""
    import pandas as pd

    rows = pd.DataFrame(rows)
    out = []
    for (dtype, seq, causal), g in rows.groupby(["dtype", "seq", "causal"], sort=True):
        by = g.set_index("variant")
        mine = g[g["variant"].str.startswith(prefix)]
        if mine.empty:
            raise ValueError(f"prefix must start a variant's name in {name}, got {prefix!r}")
        best = mine.sort_values("tflops", ascending=False).iloc[0]
        out.append({"dtype": dtype, "seq": int(seq), "causal": bool(causal),
                    "flashbook": float(by.loc["flashbook", "tflops"]), "cudnn": float(by.loc["cudnn", "tflops"]),
                    "best": best["variant"], "best_tflops": float(best["tflops"]),
                    "best_vs_flashbook": float(best["tflops"]) / float(by.loc["flashbook", "tflops"]),
                    "best_err": float(best["max_abs_err_head0_vs_float64"]),
                    "flashbook_err": float(by.loc["flashbook", "max_abs_err_head0_vs_float64"])})
    return pd.DataFrame(out)


def short_sweep_table(root=None):
    """The two ``GLUON_SHORT_SWEEPS``, one row per run (1, 2), length and mask: cuDNN's and
    the chapter-7 kernel's TFLOP/s and, per ``SHORT_FAMILIES`` column, the fastest such
    configuration's TFLOP/s and its name (``<column> config``); NaN where a run did not
    time that kind. None when either run is not recorded."""
    import pandas as pd

    out = []
    for run, name in enumerate(GLUON_SHORT_SWEEPS, start=1):
        data = load_recorded_json(name, root)
        if data is None:
            return None
        keys = ["dtype", "seq", "causal"]
        table = None
        for column, prefix in SHORT_FAMILIES:
            if not any(r["variant"].startswith(prefix) for r in data["rows"]):
                continue
            best = best_variants(data["rows"], prefix, name)
            best = best[keys + ["flashbook", "cudnn", "best", "best_tflops"]].rename(
                columns={"best": f"{column} config", "best_tflops": column})
            table = best if table is None else table.merge(best.drop(columns=["flashbook", "cudnn"]), on=keys)
        out.append(table.assign(run=run))
    table = pd.concat(out, ignore_index=True)
    for column, _ in SHORT_FAMILIES:   # a kind one run did not time
        if column not in table:
            table[column] = float("nan")
    return table


def schedule_pairs(name: str, first: str, second: str, root=None):
    """Configurations a recorded experiment (``name``) timed under two schedules: per length,
    mask and tiles (``m64 n128 s2``), the TFLOP/s under ``first`` and ``second`` and their
    ratio (``first_over_second``). None when the run is not recorded."""
    import pandas as pd

    data = load_recorded_json(name, root)
    if data is None:
        return None
    rows = pd.DataFrame(data["rows"])
    keys = ["dtype", "seq", "causal", "tiles"]
    picked = []
    for schedule in (first, second):
        part = rows[rows["variant"].str.startswith(f"gluon {schedule} ")]
        picked.append(part.assign(tiles=part["variant"].str.split(f"gluon {schedule} ").str[1])[keys + ["tflops"]]
                      .rename(columns={"tflops": schedule}))
    both = picked[0].merge(picked[1], on=keys)
    if both.empty:
        raise ValueError(f"{name} has no configuration timed under both {first!r} and {second!r}")
    return both.assign(first_over_second=both[first] / both[second]).reset_index(drop=True)


def fma_share_table(head_dim: int, root=None):
    """Chapter 10's exponentials on the FMA units at one head_dim: per dtype, length and
    mask, the kernel's TFLOP/s with none there (``share0``, its first timing), the same
    kernel timed again at the end of the shape's variants (``again``, over ``share0``: the
    run's noise), and each ``fma{share} deg{degree}`` variant's TFLOP/s over ``share0``.
    Errors against float64 are ``*_err`` columns. None when the run is not recorded."""
    import pandas as pd

    data = load_recorded_json(GLUON_EXP2_EXPERIMENTS[head_dim], root)
    if data is None:
        return None
    rows = pd.DataFrame(data["rows"])
    rows = rows[rows["variant"].str.startswith("gluon ")]
    out = []
    for (dtype, seq, causal), g in rows.groupby(["dtype", "seq", "causal"], sort=True):
        tail = g["variant"].str.split(" fma").str[1]
        by = dict(zip(tail, g["tflops"]))
        err = dict(zip(tail, g["max_abs_err_head0_vs_float64"]))
        row = {"dtype": dtype, "seq": int(seq), "causal": bool(causal), "share0": float(by["0"]),
               "again": float(by["0 again"]) / float(by["0"]), "share0_err": float(err["0"])}
        for name in tail:
            if not name.startswith("0"):
                row[f"fma{name}"] = float(by[name]) / float(by["0"])
                row[f"fma{name}_err"] = float(err[name])
        out.append(row)
    return pd.DataFrame(out)


def host_overhead_tables(root=None):
    """``benchmarks/host_overhead.py``'s recorded run: (``host``: CPU microseconds per call
    of each implementation and of the Gluon wrapper's parts, ``shapes``: per implementation
    and shape, the benchmark's timer on the call and on its CUDA graph, in ms and TFLOP/s,
    and ``inflation``, timer over graph), or None when it is not recorded."""
    import pandas as pd

    data = load_recorded_json(HOST_OVERHEAD_RUN, root)
    if data is None:
        return None
    shapes = pd.DataFrame(data["shapes"])
    return pd.DataFrame(data["host"]), shapes.assign(inflation=shapes["timer_ms"] / shapes["graph_ms"])


def gluon_schedule_table(head_dim: int, root=None):
    """Chapter 10's Gluon kernel at one head_dim: per dtype, length and mask, the library
    kernel's and cuDNN's TFLOP/s and, for each schedule, its fastest configuration's
    TFLOP/s (columns ``overlap``, ``producer``, ``pingpong``), that configuration's name
    (``*_config``) and its largest error against float64 (``*_err``). None when the run
    is not recorded."""
    data = load_recorded_json(GLUON_EXPERIMENTS[head_dim], root)
    if data is None:
        return None
    tables = [best_variants(data["rows"], f"gluon {schedule} ", GLUON_EXPERIMENTS[head_dim])
              for schedule in GLUON_SCHEDULES]
    keys = ["dtype", "seq", "causal"]
    out = tables[0][keys + ["flashbook", "cudnn", "flashbook_err"]].copy()
    for schedule, t in zip(GLUON_SCHEDULES, tables):
        out = out.merge(t[keys + ["best", "best_tflops", "best_err"]].rename(columns={
            "best": f"{schedule}_config", "best_tflops": schedule, "best_err": f"{schedule}_err"}), on=keys)
    return out
