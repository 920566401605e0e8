"""Everything chapter 9 shows, computed once from a results root: ``build(root)``.

The chapter calls ``build()`` once and its hidden cells show what it returns; its tests call
``build(root)`` on a results root of their own. ``Chapter9`` holds

- ``values``:   every number the prose quotes (``{glue:text}`name```), already formatted
  as ``flashbook.display.glue_text`` formats it ("n/a" where the data give none);
- ``tables``:   the tables the chapter displays, by name;
- ``figures``:  name -> a function that draws that figure (``flashbook.plots.benchmarks``);
- ``messages``: cell -> what that cell says because something is not recorded;
- ``outputs``:  cell -> what that cell shows, in order (``Chapter9.show(cell)``).

Missing data are handled here, once: with no results (or no block sweep) every quoted
name still has a value, and every cell that would show a measurement says why it cannot.
The sections follow the chapter; the measured ones (``chapter9_measured``) read the run.
"""
from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field

from . import chapter9_blocks as block_sweep
from . import chapter9_live as live
from . import chapter9_measured as measured
from . import chapter9_ncu, profiles
from . import chapter10_lab
from .chapter9_measured import NO_DATA
from .chapter_data import ChapterData
from .costs import GB, naive_memory_estimate, tflops
from .readback import latest_blocks, latest_results, load_results
from .records import results_root
from .source_check import check_seed_table
from .. import runtime
from ..display import listed, show_figure

#: What the chapter adds where nothing is recorded (``NO_DATA`` says what is missing).
NO_DATA_HINT = ("The arithmetic above stands on its own; the measured figures below say that "
                "they have nothing to show. Run `python -m flashbook.bench` on a GPU to fill them.")


@dataclass
class Chapter9(ChapterData):
    """Chapter 9's numbers, tables and figures for one results root (see the module)."""

    results: object = None           # the newest results.csv as a frame, or None
    provenance: dict = field(default_factory=dict)
    blocks: object = None            # the newest blocks.csv as a frame, or None
    blocks_provenance: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)    # the harness's settings in the provenance
    explorer: dict | None = None     # the block-sweep explorer's config (``sweep_config``)

    @property
    def gpu_name(self) -> str:
        """The GPU that ran the results, as their provenance names it, or "the GPU"."""
        prov = self.provenance
        return ((prov.get("gpu") or {}).get("name") if prov else None) or "the GPU"

    @property
    def dtype(self) -> str:
        """The dtype the results were measured in (bf16 when nothing is recorded)."""
        settings = (self.provenance.get("settings") or {}) if self.provenance else {}
        return settings.get("dtype") or (self.results["dtype"].iloc[0] if self.results is not None
                                         else "bf16")

    # -- what the sections record
    def table(self, cell: str, name: str, frame, *, printed: bool = False) -> None:
        """``cell`` displays the table ``name`` (or prints it as text, ``printed``)."""
        self.tables[name] = frame
        self.outputs.setdefault(cell, []).append(("print" if printed else "table", name))

    # -- what the chapter calls
    def show(self, cell: str) -> None:
        """Show in a notebook what ``cell`` shows: its texts, tables, figure, explorer."""
        from IPython.display import display

        for kind, what in self.outputs.get(cell, []):
            if kind == "text":
                print(what)
            elif kind == "print":
                print(self.tables[what])
            elif kind == "table":
                display(self.tables[what])
            elif kind == "figure":
                show_figure(self.figures[what]())
            elif kind == "explorer":
                from ..explorers import explorer_widget

                display(explorer_widget("sweep", self.explorer))


# ---------------------------------------------------------------- the seed article's table

def _seed(ch: Chapter9):
    """The seed table checked by arithmetic alone: no GPU, no recorded run."""
    import pandas as pd

    check = check_seed_table()
    claims = check.claims
    names = {"naive": "naive attention", "flash": "FlashAttention"}
    a100 = runtime.chip(check.chip)
    ch.put("seed_b", check.batch); ch.put("seed_h", check.heads)
    ch.put("seed_n", check.n); ch.put("seed_d", check.d)
    ch.put("a100_peak", a100.fp16_tflops, "g"); ch.put("a100_bw", a100.hbm_tb_s, "g")

    rows = []
    for impl in ("naive", "flash"):
        for p, pass_name in (("fwd", "forward"), ("bwd", "backward")):
            claim = claims[f"{impl}_{p}_time"]
            # the least work the claimed run had to do
            key = "bwd_no_recompute" if (impl, p) == ("naive", "bwd") else p
            flops = check.flops[key]
            implied = tflops(flops, claim.claimed)
            if not math.isclose(implied, check.implied_tflops[(impl, p)], rel_tol=1e-12):
                raise ValueError(f"{impl} {p}: the implied rate {implied} is not the check's "
                                 f"{check.implied_tflops[(impl, p)]}")
            rows.append({
                "claim": f"{names[impl]}, {pass_name}",
                "claimed (ms)": claim.claimed,
                "TFLOP needed": flops / 1e12,
                "implied TFLOP/s": implied,
                "% of A100 peak": 100 * implied / a100.fp16_tflops,
                "fewest HBM GB": check.hbm_bytes[(impl, p)] / GB,
                "floor (ms)": check.floor_ms[(impl, p, False)],
                "floor if causal (ms)": check.floor_ms[(impl, p, True)],
                "verdict": claim.verdict,
            })
    arithmetic = pd.DataFrame(rows).set_index("claim")
    times = [claims[f"{i}_{p}_time"] for i in names for p in ("fwd", "bwd")]
    n_time_impossible = sum(c.verdict == "impossible" for c in times)
    ch.put("seed_fwd_tflop", check.flops["fwd"] / 1e12, ".2f")
    ch.put("seed_bwd_tflop", check.flops["bwd"] / 1e12, ".2f")
    ch.put("seed_n_times", len(times)); ch.put("seed_n_time_impossible", n_time_impossible)
    ch.put("seed_implied_min", min(check.implied_tflops.values()), ".0f")
    ch.put("seed_implied_max", max(check.implied_tflops.values()), ".0f")
    ch.put("seed_pct_min", 100 * min(check.implied_tflops.values()) / a100.fp16_tflops, ".0f")
    ch.say("seed-arith", f"{n_time_impossible} of {len(times)} times are below the A100's floor")
    ch.table("seed-arith", "seed_arithmetic", arithmetic.round(2))

    claim_table = pd.DataFrame([
        {"claim": c.text, "claimed": f"{c.claimed:g} {c.unit}",
         "arithmetic gives": ({">=": "at least ", "<=": "at most ", "==": ""}[c.relation]
                              + f"{c.computed:.3g} {c.unit}"),
         "verdict": c.verdict}
        for c in claims.values()]).set_index("claim")
    verdicts = claim_table["verdict"].value_counts()
    ch.put("seed_n_claims", len(claim_table))
    # the claims beyond the table's six figures come from the article's text
    in_table = {f"{i}_{x}" for i in names for x in ("memory", "fwd_time", "bwd_time")}
    ch.put("seed_n_text_claims", len(set(claims) - in_table))
    ch.put("seed_n_consistent", int(verdicts.get("consistent", 0)))
    ch.put("seed_n_impossible", int(verdicts.get("impossible", 0)))
    ch.put("seed_s_all_gb", check.memory_bytes["score_matrices_all_heads"] / GB, ".1f")
    ch.put("seed_score_mb", check.memory_bytes["score_matrix_one_head"] / 1e6, ".1f")
    ch.put("seed_recompute", check.flops["bwd"] / check.flops["bwd_no_recompute"], ".2f")
    ch.put("seed_score_claim", claims["score_matrix_mb"].claimed, "g")
    ch.table("seed-claims", "seed_claims", claim_table)
    return check


# ---------------------------------------------------------------- the run and its provenance

def _locate(ch: Chapter9, root) -> None:
    """The newest results.csv and blocks.csv under the results root, read back."""
    ch.root = results_root(root)
    if ch.root is None:           # nothing to read: not even the default root is looked for
        results = blocks = None
    else:
        results, blocks = latest_results(ch.root), latest_blocks(ch.root)

    def where(path):
        # the path as it reads from the repository (or from the results root, if elsewhere)
        base = ch.root.parent.parent if ch.root.parent.name == "benchmarks" else ch.root.parent
        return os.path.relpath(path, base)

    ch.results, ch.provenance = load_results(results) if results else (None, {})
    ch.blocks, ch.blocks_provenance = load_results(blocks) if blocks else (None, {})
    if ch.results is None:
        ch.say("locate", NO_DATA, missing=True)
        ch.say("locate", NO_DATA_HINT, missing=True)
    else:
        ch.say("locate", f"results: {where(results)} ({len(ch.results)} rows)")
    ch.say("locate", f"block sweep: {where(blocks) + f' ({len(ch.blocks)} rows)' if blocks else 'none recorded'}")


def cudnn_version(code):
    """cuDNN's version as torch reports it, an integer, written as a version: 91900 ->
    "9.19.0 (91900)" (major·10000 + minor·100 + patch from cuDNN 9 on, major·1000 +
    minor·100 + patch before); anything else as it was recorded."""
    if not isinstance(code, int) or isinstance(code, bool) or code < 1000:
        return code
    major, rest = divmod(code, 10000) if code >= 90000 else divmod(code, 1000)
    return f"{major}.{rest // 100}.{rest % 100} ({code})"


def _provenance_column(p: dict) -> dict:
    if not p:
        return {"recorded": "no provenance"}
    gpu = p.get("gpu") or {}
    mem = gpu.get("memory_bytes")
    return {
        "GPU": (f"{gpu.get('name')} ({gpu.get('capability')}, {gpu.get('sms')} SMs"
                + (f", {mem / 2**30:.1f} GiB)" if mem else ")")),
        "driver": p.get("driver"), "CUDA": p.get("cuda"), "cuDNN": cudnn_version(p.get("cudnn")),
        "torch": p.get("torch"), "triton": p.get("triton"), "Python": p.get("python"),
        "flashbook": p.get("flashbook"), "date (UTC)": p.get("date_utc"),
        "command": p.get("command"), "git commit": p.get("git_commit"),
        "sources (SHA-256)": (p.get("source_sha256") or "")[:16] or None,
        "dtype": (p.get("settings") or {}).get("dtype"),
        "timing": (p.get("timing") or {}).get("statistic"),
    }


def _provenance(ch: Chapter9) -> None:
    """Where and how the run was measured, read from its provenance, and what it covers."""
    import pandas as pd

    from .readback import SHAPE_KEYS

    df, prov = ch.results, ch.provenance
    if df is None:
        ch.say("provenance", NO_DATA, missing=True)
    else:
        table = {"results.csv": _provenance_column(prov)}
        if ch.blocks is not None:
            table["blocks.csv"] = _provenance_column(ch.blocks_provenance)
        ch.table("provenance", "provenance", pd.DataFrame(table).fillna("not recorded"))

    timing = (prov.get("timing") or {}) if prov else {}
    ch.settings = (prov.get("settings") or {}) if prov else {}
    settings = ch.settings
    ch.put("gpu_name", ch.gpu_name); ch.put("dtype", ch.dtype)
    ch.put("min_reps", timing.get("min_reps")); ch.put("rep_ms", timing.get("rep_ms"), "g")
    ch.put("tokens", settings.get("tokens")); ch.put("max_naive_gb", settings.get("max_naive_gb"), "g")
    ch.put("naive_matrices", inspect.signature(naive_memory_estimate).parameters["matrices"].default)
    if df is None:
        ch.nothing("n_shapes", "n_impls", "seqs", "head_dims", "heads_by_d", "n_checked", "n_failed",
                   "mask_mem_diff")
        ch.say("settings", NO_DATA, missing=True)
        return
    shapes = df.drop_duplicates(list(SHAPE_KEYS))
    ch.put("n_shapes", len(shapes)); ch.put("n_impls", df["impl"].nunique())
    ch.put("seqs", ", ".join(f"{n // 1024}K" for n in sorted(shapes["seq"].unique())))
    ch.put("head_dims", " and ".join(str(d) for d in sorted(shapes["head_dim"].unique())))
    heads = shapes.groupby("head_dim")["heads"].first()
    ch.put("heads_by_d", ", ".join(f"{h} at d = {d}" for d, h in heads.items()))
    n_checked = int((df["check"] == "pass").sum()); n_failed = int((df["check"] == "FAIL").sum())
    ch.put("n_checked", n_checked); ch.put("n_failed", n_failed)
    if n_failed:
        failed = df[df["check"] == "FAIL"][["impl", "seq", "head_dim", "causal", "err_out", "err_grad"]]
        raise ValueError(f"results must pass their check against float64; these failed:\n{failed}")
    mem = df.pivot_table(index=["impl", "head_dim", "seq"], columns="causal",
                         values="peak_fwd_bwd_bytes").dropna()
    ch.put("mask_mem_diff", 100 * float((mem[True] / mem[False] - 1).abs().max())
           if {False, True} <= set(mem.columns) and len(mem) else None, ".1f")
    ch.say("settings", f"{len(shapes)} shapes x {df['impl'].nunique()} implementations; "
                       f"{n_checked} results checked against float64, {n_failed} failed")


def _sweep_against_run(ch: Chapter9, noise) -> None:
    """The heatmap's wide tiles against the narrower ones, and the sweep (an older flashbook)
    against the full run at the library's default forward configuration."""
    top = ch.tables.get("best_blocks")
    if top is None or ch.results is None:
        ch.nothing("heat_wide", "heat_rows", "sweep_version", "sweep_default_run", "tall_won", "tall_pairs",
                   "tall_beyond", "tall_gaps", "w8_rows64", "w8_rows128", "tall_w64", "tall_w128")
        return
    # per head dimension and B_r: the widest B_c against the next narrower one
    rows = [at.sort_values("block_n").tail(2)["fwd_tflops"].tolist()
            for _, at in top.groupby(["head_dim", "block_m"]) if at["block_n"].nunique() > 1]
    ch.put("heat_wide", sum(wide < narrow for narrow, wide in rows)); ch.put("heat_rows", len(rows))
    _taller(ch, top, noise)
    ch.put("sweep_version", ch.blocks_provenance.get("flashbook"))
    ok = ch.results[(ch.results["impl"] == "flashbook") & (ch.results["status"] == "ok")]
    sweep = ch.blocks[(ch.blocks["status"] == "ok") & (ch.blocks["head_dim"] == int(ch.values["default_d"]))]
    at = ok[(ok["head_dim"] == int(ch.values["default_d"])) & (ok["seq"] == int(sweep["seq"].iloc[0]))
            & ~ok["causal"]] if len(sweep) else ok.iloc[:0]
    ch.put("sweep_default_run", at["fwd_tflops"].iloc[0] if len(at) else None, ".0f")


def _taller(ch: Chapter9, top, noise) -> None:
    """"Taller tiles win", counted: the best B_r = 128 tile against the best B_r = 64 one at each
    (d, B_c) pair, judged against ``noise`` (the run's ``twin_spread``); the warps those best tiles
    used (``tall_w64``: every best 64-row tile's; ``tall_w128``: the 128-row tiles' that won by
    more than the noise), so the prose can say which tiles the gap sets side by side; and each
    pair's best on 8 warps, by B_r."""
    names = ("tall_won", "tall_pairs", "tall_beyond", "tall_gaps", "w8_rows64", "w8_rows128", "tall_w64", "tall_w128")
    ran = ch.blocks[ch.blocks["status"] == "ok"]
    best = top.pivot_table(index=["head_dim", "block_n"], columns="block_m", values="fwd_tflops")
    if not {64, 128} <= set(best.columns) or noise is None:
        return ch.nothing(*names)
    gain = (best[128] / best[64]).dropna()
    beyond = gain[gain - 1 > noise]
    ch.put("tall_won", int((gain > 1).sum())); ch.put("tall_pairs", len(gain))
    ch.put("tall_beyond", len(beyond))
    ch.put("tall_gaps", listed([f"{100 * (x - 1):.0f}%" for x in beyond]) if len(beyond) else "none")
    warps = top.pivot_table(index=["head_dim", "block_n"], columns="block_m", values="num_warps")

    def used(w):
        return " or ".join(str(int(x)) for x in sorted(set(w.dropna())))

    ch.put("tall_w64", used(warps.loc[gain.index, 64])); ch.put("tall_w128", used(warps.loc[beyond.index, 128]))
    w8 = ran[ran["num_warps"] == 8].groupby(["block_m", "head_dim", "block_n"])["fwd_tflops"].max()
    for rows in (64, 128):
        at = w8.loc[rows] if rows in w8.index.get_level_values(0) else None
        ch.put(f"w8_rows{rows}", f"{at.min():.0f} to {at.max():.0f}" if at is not None else None)


def _flash_reads(ch: Chapter9) -> None:
    """What SDPA-flash's profiled forward (d = 128, no mask) read from HBM, against the least any
    forward reads there (Q, K and V once, bf16): its 1.9 GB of local-memory stores (``ncu_flash_spill_gb``)
    count traffic to L1, and reads this close to the least show it stayed on chip."""
    table = ch.tables.get("ncu_passes")
    at = table[(table["impl"] == "sdpa-flash") & (table["dim"] == 128) & ~table["causal"].astype(bool)
               & (table["pass_"] == "forward")] if table is not None else None
    if at is None or len(at) != 1:
        return ch.nothing("ncu_flash_dram_mb", "ncu_min_read_mb")
    r = at.iloc[0]
    ch.put("ncu_flash_dram_mb", r["dram_mb"], ".1f")
    ch.put("ncu_min_read_mb", 3 * profiles.tensor_mb(r), ".1f")


def build(root=None) -> Chapter9:
    """Chapter 9's numbers, tables and figures from the results root ``root`` (default:
    ``bench.results_root()``, as the chapter finds it). Raises ValueError where the
    recorded data contradict themselves (a failed check, a time below the floor)."""
    ch = Chapter9()
    check = _seed(ch)
    _locate(ch, root)
    _provenance(ch)
    ceilings = measured.ceilings(ch)
    # identical kernels' spread, the slower over the faster: the run's noise (chapter 10 reads
    # the same pairs with the same measure)
    noise = measured.twin_spread(ch.results)
    measured.speed(ch, ceilings, noise)
    measured.causal_cost(ch)
    chapter9_ncu.ncu(ch)
    _flash_reads(ch)
    measured.memory(ch)
    points = measured.roofline(ch, ceilings)
    measured.roofline_numbers(ch, points, ceilings)
    # chapter 10's hint bound (the largest gap between identical kernels in any recorded run),
    # read by chapter 10's own function, so both chapters judge with one rule
    measured.targets(ch, noise, chapter10_lab.noise_runs(ch.root))
    measured.default_call(ch)   # the default call (Gluon forward on Hopper): the front-door run
    measured.seed_measured(ch, check, ceilings)
    block_sweep.blocks(ch)
    _sweep_against_run(ch, noise)
    live.live_recorded(ch)
    return ch
