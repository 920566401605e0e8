"""Chapter 10's measured figures: the forward ladder as a staircase with its reference lines
(``ladder_figure``), the backward's two rungs (``backward_figure``) and the Gluon kernel's
schedules (``schedules_figure``).

They draw frames that ``flashbook.bench`` reads back (``ladder_speedups``' rows, the
reference implementations' TFLOP/s per shape, ``gluon_schedule_table``), given as
arguments. Each function makes and returns a ``matplotlib.figure.Figure`` of its own,
never a pyplot figure, and imports no feature module.
"""
from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

#: The references drawn beside our kernel: (colour, line style).
BASELINES = {"sdpa-flash": ("#4C72B0", "--"), "sdpa-cudnn": ("#C44E52", ":")}
#: The Gluon figure's bars, in order: column -> colour.
SCHEDULE_COLOURS = {"flashbook": "#999999", "overlap": "#8FB3D9", "producer": "#2E6DB4", "pingpong": "#5AA469",
                    "cudnn": "#C44E52"}
SCHEDULE_LABELS = {"flashbook": "chapter 7 (Triton)", "cudnn": "cuDNN"}


def _reference(refs, impl, head_dim, seq, causal):
    """The TFLOP/s of ``impl`` at one shape in ``refs`` (columns impl, head_dim, seq, causal,
    tflops), or None."""
    hit = refs[(refs["impl"] == impl) & (refs["head_dim"] == head_dim) & (refs["seq"] == seq)
               & (refs["causal"] == causal)]
    return float(hit["tflops"].iloc[0]) if len(hit) else None


def ladder_figure(rungs, refs, *, rung_names, gpu_name="the GPU", ceiling=None):
    """One panel per head dimension, length and mask: each rung's forward TFLOP/s (``rungs``:
    columns rung, head_dim, seq, causal, tflops), with ``refs``' forward passes at the same
    shape as horizontal lines. ``ceiling``: the most TFLOP/s the axes must hold (default: the
    rungs' best); ``rung_names``: every rung's name, in order, for the title."""
    keys = sorted({(d, n) for d, n in zip(rungs["head_dim"], rungs["seq"])}, key=lambda k: (-k[0], k[1]))
    colours = colormaps["viridis"](np.linspace(0.15, 0.85, len(rung_names)))
    fig = Figure(figsize=(11, 2.9 * len(keys)))
    axes = fig.subplots(len(keys), 2, sharey=True, squeeze=False)
    top = (rungs["tflops"].max() if ceiling is None else ceiling) * 1.12
    for row, (d, n) in enumerate(keys):
        for col, causal in enumerate((False, True)):
            ax = axes[row, col]
            part = rungs[(rungs["head_dim"] == d) & (rungs["seq"] == n) & (rungs["causal"] == causal)]
            part = part.sort_values("rung")
            x = np.arange(len(part))
            ax.bar(x, part["tflops"], color=colours[:len(part)], width=0.75)
            for xi, t in zip(x, part["tflops"]):
                ax.text(xi, t + top * 0.01, f"{t:.0f}", ha="center", va="bottom", fontsize=7.5)
            for impl, (colour, ls) in BASELINES.items():
                value = _reference(refs, impl, d, n, causal)
                if value is not None:
                    ax.axhline(value, color=colour, ls=ls, lw=1.4, label=f"{impl} forward, same shape")
                    ax.text(len(part) - 0.4, value, f"{value:.0f}", color=colour, fontsize=7.5,
                            va="bottom", ha="left")
            ax.set_xticks(x, [str(i) for i in part["rung"]])
            ax.set_xlim(-0.6, len(part) + 0.2)
            ax.set_ylim(0, top)
            ax.set_title(f"d={d}, N={n}, {'causal' if causal else 'no mask'}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
            if col == 0:
                ax.set_ylabel("forward TFLOP/s")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=9,
               frameon=False)
    names = ", ".join(f"{i} {name}" for i, name in enumerate(rung_names))
    fig.suptitle(f"The forward ladder on {gpu_name} (rungs: {names})", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def backward_figure(rungs, refs, *, gpu_name="the GPU"):
    """The backward's two rungs ("dQ atomic", "dQ separate") per shape, as bars, with
    ``refs``' backward passes as marks. ``rungs``: columns name, head_dim, seq, causal,
    tflops and ``label`` (the shape's tick label)."""
    keys = ["head_dim", "seq", "causal"]
    shapes = rungs.drop_duplicates(keys).sort_values(keys, ascending=[False, True, True])
    fig = Figure(figsize=(10, 3.8))
    ax = fig.subplots()
    x = np.arange(len(shapes))
    for k, (mode, colour) in enumerate((("dQ atomic", "#bbbbbb"), ("dQ separate", "#55A868"))):
        vals = [float(rungs[(rungs["name"] == mode) & (rungs["head_dim"] == r["head_dim"])
                            & (rungs["seq"] == r["seq"]) & (rungs["causal"] == r["causal"])]["tflops"].iloc[0])
                for _, r in shapes.iterrows()]
        ax.bar(x + (k - 0.5) * 0.38, vals, width=0.38, color=colour, label=mode)
    for impl, (colour, _) in BASELINES.items():
        vals = [_reference(refs, impl, r["head_dim"], r["seq"], r["causal"]) for _, r in shapes.iterrows()]
        ax.scatter(x, [np.nan if v is None else v for v in vals], marker="_", s=500, lw=2.5,
                   color=colour, label=f"{impl} backward", zorder=3)
    ax.set_xticks(x, [label.replace(" ", "\n", 1) for label in shapes["label"]], fontsize=8)
    ax.set_ylabel("backward TFLOP/s")
    ax.set_title(f"The backward's two rungs on {gpu_name}", fontsize=10)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def schedules_figure(table):
    """Each Gluon schedule's fastest forward beside the chapter-7 kernel and cuDNN, one panel
    per mask. ``table``: one dtype's rows of ``gluon_schedule_table`` (columns seq, causal and
    those of ``SCHEDULE_COLOURS``)."""
    fig = Figure(figsize=(10, 3.2))
    axes = fig.subplots(1, 2, sharey=True)
    dtype = table["dtype"].iloc[0] if "dtype" in table and len(table) else "fp16"
    for ax, causal in zip(axes, (False, True)):
        part = table[table["causal"] == causal]
        x = np.arange(len(part))
        for i, col in enumerate(SCHEDULE_COLOURS):
            ax.bar(x + (i - 2) * 0.16, part[col], 0.16, color=SCHEDULE_COLOURS[col],
                   label=SCHEDULE_LABELS.get(col, f"Gluon, {col}"))
        ax.set_xticks(x, [f"N = {n // 1024}K" for n in part["seq"]])
        ax.set_title(f"{dtype}, d = 128, {'causal' if causal else 'full'}")
    axes[0].set_ylabel("forward TFLOP/s")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
