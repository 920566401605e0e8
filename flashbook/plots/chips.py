"""Chapter 6's chips side by side: each memory level's capacity and bandwidth, and the
roofline that places an attention kernel's arithmetic intensity against each chip's ridge.

Both draw ``flashbook.runtime.CHIPS`` entries (anything with the same fields) on axes you
pass in. A level whose bandwidth the sources do not publish is left out, not guessed.
"""
from __future__ import annotations

import re

import numpy as np


def levels(chip):
    """(level, capacity in bytes, bandwidth in bytes/s or None) for one chip, whole chip."""
    return [("registers", chip.sms * chip.regs_per_sm_kib * 1024, None),
            ("shared memory", chip.sms * chip.smem_per_sm_kib * 1024, chip.smem_tb_s * 1e12),
            ("L2", chip.l2_mib * 1024**2, None),
            ("HBM", chip.hbm_bytes, chip.hbm_tb_s * 1e12)]


def hierarchy(ax_cap, ax_bw, chips):
    """Capacity (left) and bandwidth (right) of each level, one bar per chip, log scales."""
    chips = list(chips)
    names = [lvl for lvl, _, _ in levels(chips[0])]
    width = 0.8 / len(chips)
    for i, c in enumerate(chips):
        x = np.arange(len(names)) + (i - (len(chips) - 1) / 2) * width
        ax_cap.bar(x, [cap for _, cap, _ in levels(c)], width, label=c.name)
        ax_bw.bar(x, [np.nan if b is None else b for _, _, b in levels(c)], width, label=c.name)
    for ax, title, unit in [(ax_cap, "capacity (whole chip)", "bytes"),
                            (ax_bw, "bandwidth (whole chip)", "bytes / s")]:
        ax.set(yscale="log", title=title, ylabel=f"{unit} (log scale)")
        ax.set_xticks(np.arange(len(names)), names)
    for position, (_, _, bw) in enumerate(levels(chips[0])):
        if bw is None:
            ax_bw.text(position, 2e11, "not\npublished", ha="center", fontsize=8)
    ax_bw.set(ylim=(1e11, 1e14), xlim=(-0.6, len(names) - 0.4))
    ax_cap.legend()
    return ax_cap, ax_bw


def roofline(ax, chips, intensity, title="", tensor_roofs=False):
    """Attainable TFLOP/s against FLOP/byte per chip (dots: ridge points); one vertical
    line per entry of ``intensity`` ({label: FLOP per byte}), labelled up to its " (".
    ``tensor_roofs``: also a dashed roof at the tensor cores' peak for a chip whose
    ``tl.dot`` does not reach it (the T4, where cuBLAS uses them and Triton does not).
    """
    x = np.logspace(0, 4, 200)
    for c in chips:
        line, = ax.plot(x, np.minimum(c.dot_tflops, x * c.hbm_tb_s), label=c.name)
        ax.plot(c.ridge_flop_per_byte, c.dot_tflops, "o", color=line.get_color())
        if tensor_roofs and c.fp16_tflops > c.dot_tflops:
            ax.plot(x, np.minimum(c.fp16_tflops, x * c.hbm_tb_s), ls="--", lw=1, color=line.get_color(),
                    label=f"{c.name} tensor cores (cuBLAS)")
    for (name, i), style in zip(intensity.items(), [":", "-.", "--"]):
        ax.axvline(i, color="k", ls=style, lw=1)
        label = re.sub(r"(\S+_\S+)", r"$\1$", name.split(" (")[0])    # N/B_r as math: N/B with r below
        ax.text(i * 1.08, 1.3, label, rotation=90, fontsize=8, va="bottom", zorder=5,   # readable over a roof
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1))
    ax.set_xscale("log"); ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s (solid: tl.dot; dashed: cuBLAS)" if tensor_roofs
                  else "attainable TFLOP/s (the rate tl.dot gets)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    return ax
