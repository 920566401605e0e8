"""Reading what was recorded (chapters 9 and 10): the newest run of a kind and its
provenance, typed frames, the ladder's speedups, our kernel's ratios to the SDPA
backends judged against ``PERFORMANCE_TARGETS``, roofline points and ceilings.

Chapters draw every figure from the files that ``records`` wrote, never from the
machine that builds the book. These functions need pandas, and no GPU. The block
sweep's explorer is in ``blocks``, chapter 10's experiments in ``experiments``, and
``runs`` finds a recorded run by its name in the index.
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
from .runs import csv_runs
from .source_check import SEED_SHAPE
from .sweeps import BLOCK_FIELDS

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
    """Every recorded ``csv_name``, newest first: in the runs the results root's index
    lists for that file (``runs.csv_runs``), or, in a root without an index, anywhere
    under it at any depth."""
    root = results_root(root)
    if root is None:
        return []
    listed = csv_runs(csv_name, root)
    found = root.rglob(csv_name) if listed is None else [run / csv_name for run in listed]
    found = [p for p in found if p.is_file()]
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


def target_verdict(ratio, threshold, met, noise):
    """A ``target_table`` row's verdict: "met", "missed", or "within noise" where the ratio
    lies within ``noise`` (a fraction) of the threshold, since a difference smaller than
    identical kernels show in one run decides nothing. None when not measured."""
    import pandas as pd

    if met is None or pd.isna(met):
        return None
    if noise is not None and abs(ratio / threshold - 1) <= noise:
        return "within noise"
    return "met" if met else "missed"


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
