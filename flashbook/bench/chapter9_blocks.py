"""Chapter 9's block-size sweep (``chapter9.build`` calls ``blocks``): the recorded sweep's
counts, the explorer over it, the library's default configuration in it, the heatmap, and
what spilling and one more pipeline stage did there."""
from __future__ import annotations

from .blocks import best_blocks, block_fits, block_shared_bytes, block_state
from ..plots import benchmarks as plots

#: How a cell that shows the block sweep begins when none is recorded.
NO_SWEEP = "No block sweep recorded"


def blocks(ch) -> None:
    """The recorded sweep: its counts, the explorer, the library's default, the heatmap."""
    import pandas as pd

    from ..explorers.sweep import labelled_fits, sweep_config
    from ..kernels import configs

    sweep, prov = ch.blocks, ch.blocks_provenance
    if sweep is None:
        ch.say("sweep-numbers", "No block sweep was recorded (no blocks.csv under benchmarks/results/): "
                                "there is nothing measured to explore here.", missing=True)
        ch.say("explorer", f"{NO_SWEEP}: nothing to explore.", missing=True)
        ch.say("fig-block-default", f"{NO_SWEEP}: no default configuration to show.", missing=True)
        ch.say("fig-block-heatmap", f"{NO_SWEEP}: no heatmap to draw.", missing=True)
        ch.nothing("sweep_n", "sweep_ran", "sweep_oor", "sweep_spill", "model_agrees", "model_checked",
                   "sweep_grid", "default_cfg", "default_d", "default_tflops", "default_rank", "default_n",
                   "best_cfg", "best_tflops", "default_fits", "heat_best", "spill_median",
                   "nospill_median", "fit_counts", "sweep_dims", "sweep_per_d", "default_place",
                   "spill_by_d", "stages_helped", "stages_pairs", "stage_drop")
        return
    arch = ((prov.get("gpu") or {}).get("capability")) or "sm_90"
    ran = sweep[sweep["status"] == "ok"]
    model = sweep.apply(lambda r: configs.smem_estimate(
        "forward", configs.Config(int(r.block_m), int(r.block_n), int(r.num_warps), int(r.num_stages)),
        configs.block_d(int(r.head_dim)), 2, int(arch.split("_")[1])), axis=1)
    measured = sweep.apply(lambda r: block_shared_bytes(r.to_dict()), axis=1)
    known = measured.notna()
    agree = int((model[known] == measured[known]).sum())
    ch.put("sweep_n", len(sweep)); ch.put("sweep_ran", len(ran))
    ch.put("sweep_oor", int(sweep["status"].eq("out-of-resources").sum()))
    ch.put("sweep_spill", int((ran["n_spills"] > 0).sum()))
    ch.put("model_agrees", agree); ch.put("model_checked", int(known.sum()))
    ch.put("sweep_grid", " x ".join(str(sweep[k].nunique()) for k in
                                    ("block_m", "block_n", "num_warps", "num_stages")))
    dims = sorted(int(d) for d in sweep["head_dim"].unique())
    ch.put("sweep_dims", " and ".join(str(d) for d in dims))
    ch.put("sweep_per_d", int(sweep.groupby("head_dim").size().max()))
    ch.say("sweep-numbers", f"{len(sweep)} configs x shapes, {len(ran)} ran; the model matches the "
                            f"compiler's shared memory for {agree} of {int(known.sum())}")

    # the configuration the library itself picks for the forward on this architecture
    d0 = 128 if 128 in set(sweep["head_dim"]) else int(sweep["head_dim"].max())
    cfg = configs.default("forward", cc=int(arch.split("_")[1]), block_d=configs.block_d(d0), elem_bytes=2)
    default = {"head_dim": d0, "block_m": cfg.block_m, "block_n": cfg.block_n,
               "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    at_d = sweep[sweep["head_dim"] == d0]
    if not ((at_d["block_m"] == cfg.block_m) & (at_d["block_n"] == cfg.block_n)
            & (at_d["num_warps"] == cfg.num_warps) & (at_d["num_stages"] == cfg.num_stages)).any():
        # the default is not in the sweep's grid: start from the sweep's fastest instead
        default.update(at_d.sort_values("fwd_tflops", na_position="first").iloc[-1][
            ["block_m", "block_n", "num_warps", "num_stages"]].astype(int).to_dict())
    gpu = (prov.get("gpu") or {}).get("name", "")
    ch.explorer = sweep_config(sweep, start=default, measured_arch=arch, gpu=gpu)
    ch.outputs.setdefault("explorer", []).append(("explorer", None))

    state = block_state(sweep, **default, measured_arch=arch)
    ch.say("fig-block-default", state.summary())
    fits = labelled_fits(state.fits, gpu)   # "measured" only on the GPU that ran
    ch.table("fig-block-default", "block_fits", pd.DataFrame(
        {name: {"needs (KiB)": f["bytes"] / 1024, "limit (KiB)": f["limit"] / 1024,
                "fits": "yes" if f["fits"] else "no", "from": f["how"]}
         for name, f in fits.items()}).T)
    bm, bn, w, s = state.config
    mine = (f"{state.tflops:.0f} TFLOP/s, number {state.rank} of {state.n_ran}"
            if state.rank else (state.row["status"] if state.row else "not in the sweep"))
    title = f"d={state.head_dim}, N={state.seq}: B_r={bm}, B_c={bn}, {w} warps, {s} stages (red): {mine}"
    ch.figure("fig-block-default", "block_default", lambda: plots.block_state_figure(
        state.ranking, state.config, state.fits, title=title))
    best = state.best
    ch.put("default_cfg", f"B_r = {bm}, B_c = {bn}, {w} warps, {s} stages")
    ch.put("default_d", state.head_dim)
    ch.put("default_tflops", state.tflops, ".0f"); ch.put("default_rank", state.rank)
    ch.put("default_n", state.n_ran)
    ch.put("best_cfg", f"B_r = {int(best['block_m'])}, B_c = {int(best['block_n'])}, "
                       f"{int(best['num_warps'])} warps, {int(best['num_stages'])} stages")
    ch.put("best_tflops", best["fwd_tflops"], ".0f")
    same = all(int(best[k]) == v for k, v in zip(("block_m", "block_n", "num_warps", "num_stages"), (bm, bn, w, s)))
    ch.put("default_place", f"the fastest of the {state.n_ran} configurations that ran at this head dimension"
           if same else f"number {state.rank} of the {state.n_ran} that ran; the fastest was "
           f"B_r = {int(best['block_m'])}, B_c = {int(best['block_n'])}, {int(best['num_warps'])} warps, "
           f"{int(best['num_stages'])} stages at {best['fwd_tflops']:.0f} TFLOP/s")
    ch.put("default_fits", ", ".join(n for n, f in state.fits.items() if f["fits"]) or "no chip")

    top = best_blocks(sweep)
    ch.tables["best_blocks"] = top
    ch.figure("fig-block-heatmap", "block_heatmap", lambda: plots.block_heatmap(
        top, gpu_name=(prov.get("gpu") or {}).get("name", "the GPU")))
    tops = top.loc[top.groupby("head_dim")["fwd_tflops"].idxmax()]
    ch.put("heat_best", "; ".join(
        f"at d = {r.head_dim}, {r.block_m} × {r.block_n} ({r.num_warps} warps, "
        f"{r.num_stages} stages) at {r.fwd_tflops:.0f} TFLOP/s" for r in tops.itertuples()))
    spilled = ran["n_spills"] > 0
    ch.put("spill_median", ran.loc[spilled, "fwd_tflops"].median() if spilled.any() else None, ".0f")
    ch.put("nospill_median", ran.loc[~spilled, "fwd_tflops"].median() if (~spilled).any() else None, ".0f")
    # per head dimension, like with like: a spilling configuration against the same tile and
    # stages with more warps that does not spill (the spilling ones are the largest tiles,
    # so a median over all of them would compare tile sizes as much as spills)
    by_d = []
    for d, at in ran.groupby("head_dim"):
        sp = at["n_spills"] > 0
        pairs = [(a.fwd_tflops, b.fwd_tflops) for a in at[sp].itertuples() for b in at[~sp].itertuples()
                 if (a.block_m, a.block_n, a.num_stages) == (b.block_m, b.block_n, b.num_stages)
                 and b.num_warps > a.num_warps]
        if pairs:
            by_d.append(f"at d = {int(d)}, the spilling one was slower at {sum(x < y for x, y in pairs)} "
                        f"of {len(pairs)} such pairs")
        elif not sp.any():
            by_d.append(f"at d = {int(d)} none spilled")
        else:
            by_d.append(f"at d = {int(d)} no spilling configuration has such a twin")
    ch.put("spill_by_d", "; ".join(by_d) or None)
    # one more stage: how often it helped, and the largest loss it caused
    keys = ["head_dim", "block_m", "block_n", "num_warps"]
    steps = []
    for key, at in ran.groupby(keys):
        t = at.set_index("num_stages")["fwd_tflops"].sort_index()
        for a, b in zip(t.index[:-1], t.index[1:]):
            steps.append((*key, int(a), int(b), float(t[a]), float(t[b])))
    if steps:
        worst = min(steps, key=lambda x: x[7] / x[6])
        ch.put("stages_helped", sum(x[7] > x[6] for x in steps)); ch.put("stages_pairs", len(steps))
        ch.put("stage_drop", f"d = {worst[0]}, {worst[1]} × {worst[2]}, {worst[3]} warps: "
                             f"{worst[6]:.0f} TFLOP/s at {worst[4]} stages, {worst[7]:.0f} at {worst[5]}")
    else:
        ch.nothing("stages_helped", "stages_pairs", "stage_drop")
    # the same grid, judged by each chip's shared memory (the model for the chips not measured)
    chips = pd.DataFrame([block_fits(r.block_m, r.block_n, r.num_warps, r.num_stages, r.head_dim,
                                     shared_bytes=block_shared_bytes(r._asdict()), measured_arch=arch)
                          for r in sweep.itertuples(index=False)])
    ch.put("fit_counts", ", ".join(f"{name} {int(chips[name].map(lambda f: f['fits']).sum())}"
                                   for name in chips.columns) + f" of {len(chips)}")
