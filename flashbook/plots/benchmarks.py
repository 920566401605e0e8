"""Chapter 9's measured figures, drawn from the frames ``flashbook.bench`` reads back
(``load_results``' rows, ``roofline_points``, ``best_blocks``) and plain numbers: TFLOP/s
and peak memory against N (``tflops_figure``, ``memory_figure``), the roofline
(``roofline_figure``), and the block-size sweep (``block_heatmap``, ``block_state_figure``).

Each function makes and returns a ``matplotlib.figure.Figure`` of its own, never a
pyplot figure: the chapter decides when it is shown. What the harness knows (the order
of the implementations, a chip's ceilings, the memory a skipped run would have needed)
comes in as arguments or columns, so nothing here imports the benchmark package.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

GB = 1e9          # as ``bench.GB``: the figures' memory is in decimal GB
KiB = 1024

#: One colour and marker per implementation, the same in every figure of chapter 9.
STYLE = {"naive": ("#7f7f7f", "o"), "sdpa-math": ("#bcbd22", "v"),
         "sdpa-efficient": ("#17becf", "^"), "sdpa-cudnn": ("#9467bd", "s"),
         "sdpa-flash": ("#1f77b4", "D"), "flashbook": ("#d62728", "*"),
         "flashbook-atomic": ("#ff9896", "P")}
#: The statuses of a run that did not fit (the memory figure marks them with a cross).
MISSING = ("oom", "oom-skipped")


def style(impl: str) -> tuple:
    """(colour, marker) of an implementation; green crosses for one the book does not know."""
    return STYLE.get(impl, ("#2ca02c", "x"))


def impl_order(frame, order=()) -> list:
    """The implementations in ``frame``: those of ``order`` first, in that order, then the rest."""
    present = set(frame["impl"])
    known = [i for i in order if i in present]
    return known + sorted(present - set(known))


def seq_ticks(ax, seqs):
    """A log2 axis of sequence lengths, labelled 1K, 2K, ..."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [f"{n // 1024}K" if n >= 1024 else str(n) for n in seqs])
    ax.minorticks_off()


def _legend_handles(fig) -> dict:
    handles = {}
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    return handles


def tflops_figure(frame, *, order=(), ceilings=None, gpu_name="the GPU", dtype="bf16"):
    """Forward and backward TFLOP/s against N, one panel per head dimension and mask, one
    line per implementation; ``ceilings`` (``bench.roofline_ceilings``) adds the peak."""
    ok = frame[frame["status"] == "ok"]
    panels = [(d, c) for d in sorted(frame["head_dim"].unique()) for c in (False, True)
              if not frame[(frame["head_dim"] == d) & (frame["causal"] == c)].empty]
    seqs = sorted(frame["seq"].unique())
    fig = Figure(figsize=(3.3 * len(panels), 6.6))
    axes = fig.subplots(2, len(panels), sharex=True, sharey="row", squeeze=False)
    for row, (p, pass_name) in enumerate((("fwd", "forward"), ("bwd", "backward"))):
        for col, (d, causal) in enumerate(panels):
            ax = axes[row, col]
            for impl in impl_order(frame, order):
                r = ok[(ok["impl"] == impl) & (ok["head_dim"] == d) & (ok["causal"] == causal)]
                r = r.sort_values("seq")
                if not r.empty:
                    color, marker = style(impl)
                    ax.plot(r["seq"], r[f"{p}_tflops"], marker=marker, color=color, ms=5,
                            lw=1.3, label=impl)
            if ceilings:
                ax.axhline(ceilings["peak_tflops"], color="k", ls=":", lw=1,
                           label=f"{ceilings['chip']} peak ({ceilings['peak_source']})")
            ax.set_title(f"{pass_name}, d={d}, {'causal' if causal else 'no mask'}", fontsize=10)
            seq_ticks(ax, seqs)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel("TFLOP/s")
            if row == 1:
                ax.set_xlabel("sequence length N")
    handles = _legend_handles(fig)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 8),
               fontsize=9, frameon=False)
    fig.suptitle(f"Attention on {gpu_name}, {dtype}: TFLOP/s (higher is better)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def memory_figure(frame, *, order=(), gpu_name="the GPU", gpu_memory_bytes=None):
    """Peak memory beyond the inputs against N, without a mask, one panel per head
    dimension. A run that did not fit (``MISSING``) is a cross at its ``estimate_bytes``;
    ``floor_fwd_bwd_bytes`` of our kernel and of naive attention are the dashed lower bounds."""
    dims = sorted(frame["head_dim"].unique())
    fig = Figure(figsize=(6.2 * len(dims), 4.4))
    axes = fig.subplots(1, len(dims), squeeze=False)
    seqs = sorted(frame["seq"].unique())
    for ax, d in zip(axes[0], dims):
        part = frame[frame["head_dim"] == d]
        if (~part["causal"]).any():
            part = part[~part["causal"]]
        for impl in impl_order(part, order):
            r = part[part["impl"] == impl].sort_values("seq")
            color, marker = style(impl)
            good = r[r["status"] == "ok"]
            ax.plot(good["seq"], good["peak_fwd_bwd_bytes"] / GB, marker=marker, color=color,
                    ms=5, lw=1.3, label=impl)
            for rec in r[r["status"].isin(MISSING)].to_dict("records"):
                need = rec["estimate_bytes"]
                ax.plot(rec["seq"], need / GB, "x", color=color, ms=10, mew=2.5)
                ax.annotate(rec["status"], (rec["seq"], need / GB), textcoords="offset points",
                            xytext=(-6, 7), fontsize=8, color=color, ha="right")
        for alg, impl, label in (("flash", "flashbook", "lower bound, fused"),
                                 ("naive", "naive", "lower bound, naive")):
            r = part[part["impl"] == impl].sort_values("seq")
            if not r.empty and r["floor_fwd_bwd_bytes"].notna().any():
                ax.plot(r["seq"], r["floor_fwd_bwd_bytes"] / GB, ls="--", lw=1,
                        color="k" if alg == "flash" else "#7f7f7f", label=label)
        if gpu_memory_bytes:
            ax.axhline(gpu_memory_bytes / GB, color="k", lw=1, ls=":", label=f"{gpu_name} memory")
        ax.set_yscale("log")
        seq_ticks(ax, seqs)
        ax.set_title(f"d={d}, no mask, B x N = {int(part['batch'].iloc[0] * part['seq'].iloc[0])} "
                     f"tokens, H={int(part['heads'].iloc[0])}", fontsize=10)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("peak memory beyond inputs (GB)")
        ax.grid(alpha=0.3, which="both")
    handles = _legend_handles(fig)
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8, frameon=False)
    fig.suptitle(f"Peak memory, forward + backward, on {gpu_name} (lower is better)")
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    return fig


def roofline_figure(points, ceilings, *, impls=None):
    """``bench.roofline_points``' points (intensity, TFLOP/s; forward filled, backward
    hollow) under the roof of ``ceilings`` (``bench.roofline_ceilings``), for ``impls``."""
    ceil = ceilings
    fig = Figure(figsize=(8.5, 5))
    ax = fig.subplots()
    lo = min(points["intensity"].min() / 2, ceil["ridge"] / 20)
    hi = max(points["intensity"].max() * 2, ceil["ridge"] * 20)
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    ax.plot(x, np.minimum(ceil["peak_tflops"], x * ceil["hbm_tb_s"]), color="k", lw=2,
            label=f"roof: {ceil['peak_tflops']:g} TFLOP/s ({ceil['peak_source']}), "
                  f"{ceil['hbm_tb_s']:g} TB/s ({ceil['hbm_source']})")
    ax.axvline(ceil["ridge"], color="k", ls=":", lw=1)
    ax.annotate(f"ridge {ceil['ridge']:.0f} FLOP/byte", (ceil["ridge"], lo * ceil["hbm_tb_s"]),
                textcoords="offset points", xytext=(4, 4), fontsize=8)
    present = set(points["impl"])
    for impl in [i for i in (impls or sorted(present)) if i in present]:
        color, _ = style(impl)
        for p, marker, fill in (("fwd", "o", color), ("bwd", "s", "none")):
            r = points[(points["impl"] == impl) & (points["pass"] == p)]
            ax.scatter(r["intensity"], r["tflops"], marker=marker, s=28, edgecolors=color,
                       facecolors=fill, label=f"{impl}, {'forward' if p == 'fwd' else 'backward'}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(max(points["tflops"].min() / 3, 1), ceil["peak_tflops"] * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the fewest HBM bytes)")
    ax.set_ylabel("TFLOP/s measured")
    ax.set_title(f"Roofline of the {ceil['chip']}, {ceil['dtype']}: every measured shape")
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    ax.grid(alpha=0.3, which="major")
    fig.tight_layout()
    return fig


def block_heatmap(best, *, gpu_name="the GPU"):
    """For each head dimension, the best forward TFLOP/s of every B_r x B_c of a block
    sweep (``bench.best_blocks``' frame), with the warps and stages that reached it."""
    dims = sorted(best["head_dim"].unique())
    fig = Figure(figsize=(5.2 * len(dims), 4.2), layout="constrained")
    axes = fig.subplots(1, len(dims), squeeze=False)
    vmax = best["fwd_tflops"].max()
    for ax, d in zip(axes[0], dims):
        part = best[best["head_dim"] == d]
        grid = part.pivot(index="block_m", columns="block_n", values="fwd_tflops")
        im = ax.imshow(grid.values, cmap="viridis", vmin=0, vmax=vmax, origin="lower")
        ax.set_xticks(range(len(grid.columns)), grid.columns)
        ax.set_yticks(range(len(grid.index)), grid.index)
        ax.set_xlabel("B_c (block_n)")
        ax.set_ylabel("B_r (block_m)")
        for r in part.itertuples():
            i, j = list(grid.index).index(r.block_m), list(grid.columns).index(r.block_n)
            ax.text(j, i, f"{r.fwd_tflops:.0f}\n{r.num_warps}w {r.num_stages}s", ha="center",
                    va="center", fontsize=8, color="w" if r.fwd_tflops < 0.6 * vmax else "k")
        ax.set_title(f"d={d}, N={int(part['seq'].iloc[0])}: best over warps and stages", fontsize=10)
    fig.colorbar(im, ax=list(axes[0]), label="forward TFLOP/s")
    fig.suptitle(f"Block-size sweep of the forward kernel on {gpu_name}")
    return fig


def block_state_figure(ranking, config, fits, *, title):
    """One configuration of a block sweep: where it ranks among those that ran
    (``ranking``: (config, TFLOP/s) fastest first; ``config`` in red) and its shared
    memory against each chip's limit (``fits``: chip -> bytes, limit, fits, how)."""
    fig = Figure(figsize=(12, 4.2))
    ax_rank, ax_fit = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    tflops = [t for _, t in ranking]
    colors = ["#d62728" if c == config else "#bbbbbb" for c, _ in ranking]
    ax_rank.bar(range(1, len(tflops) + 1), tflops, color=colors)
    ax_rank.set_xlabel("configurations that ran, fastest first")
    ax_rank.set_ylabel("forward TFLOP/s")
    ax_rank.set_title(title, fontsize=10)
    names = list(fits)
    need = [fits[n]["bytes"] / KiB for n in names]
    limit = [fits[n]["limit"] / KiB for n in names]
    ax_fit.bar(names, need, color=["#2ca02c" if fits[n]["fits"] else "#d62728" for n in names])
    ax_fit.scatter(names, limit, marker="_", s=900, color="k", label="limit per program")
    for i, n in enumerate(names):
        ax_fit.annotate(fits[n]["how"], (i, need[i]), ha="center", va="bottom", fontsize=8)
    ax_fit.set_ylabel("shared memory (KiB)")
    ax_fit.set_ylim(0, 1.2 * max(need + limit))
    ax_fit.set_title("fits? (green: yes, red: no)", fontsize=10)
    ax_fit.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


#: The parts of the causal forward's excess (``benchmarks/causal_cost.py``'s shares) and their labels.
CAUSAL_PARTS = (("more_tiles", "the diagonal's extra tiles", "#9ecae1"),
                ("program_costs", "each program's fixed costs", "#3182bd"),
                ("masked_extra", "a masked tile's own extra work", "#fd8d3c"))


def causal_cost_figure(measures, *, title):
    """The causal forward's time beyond half the unmasked forward's, one stacked bar per
    measure: ``measures`` is [(label, shares)], ``shares`` as ``benchmarks/causal_cost.py``
    writes them (fractions of half the unmasked pass: each part of ``CAUSAL_PARTS``, and
    ``unexplained``, what the fit leaves). Bars in percent of half the unmasked pass; the
    number at each bar's end is the measured excess (the parts plus what the fit leaves)."""
    fig = Figure(figsize=(8, 1.9 + 0.45 * len(measures)))
    ax = fig.subplots()
    y = np.arange(len(measures))[::-1]
    left = np.zeros(len(measures))
    for key, label, color in CAUSAL_PARTS:
        width = np.array([100 * shares[key] for _, shares in measures])
        ax.barh(y, width, left=left, color=color, edgecolor="white", height=0.6, label=label)
        left += width
    total = left + np.array([100 * shares.get("unexplained", 0.0) for _, shares in measures])
    for yi, end, value in zip(y, left, total):
        ax.annotate(f"{value:.1f}% measured", (end, yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(y, [label for label, _ in measures])
    ax.set_xlabel("time beyond half the unmasked forward's (% of that half)")
    ax.set_xlim(0, max(left.max(), total.max()) * 1.3)
    ax.set_title(title, fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
