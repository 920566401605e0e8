"""Chapter 12's measured figure: how a masked kernel's time grows with the sequence length
(``window_scaling``), drawn from the rows ``benchmarks/masks_bench.py`` records (plain
dicts: ``mask``, ``seq``, ``head_dim``, ``window`` and each implementation's times).
"""
from __future__ import annotations

IMPL_STYLES = {"flashbook": dict(ls="-", marker="o"), "flex": dict(ls="--", marker="s", mfc="white")}
MASK_COLORS = {"causal": "#555555", "window": "#4C72B0", "window-softcap": "#55A868", "documents": "#DD8452",
               "softcap": "#C44E52"}


def mask_label(row: dict) -> str:
    """A recorded row's mask in words: "window 1024", "causal", "window 1024 + softcap"."""
    name = row["mask"]
    if "window" in name and row["window"][0] >= 0:
        return name.replace("window", f"window {row['window'][0]}").replace("-", " + ")
    return name.replace("-", " + ")


def window_scaling(ax, rows, *, head_dim: int = 128, time_key: str = "fwd_bwd_ms", masks=("window", "causal"),
                   impls=("flashbook", "flex")):
    """Time (``time_key``: "fwd_ms" or "fwd_bwd_ms") against N on log-log axes, one line per
    mask and window and implementation, for the rows at ``head_dim``. A line whose slope is 1
    grows as N (a window), one whose slope is 2 as N^2 (causal); the grey guides show both."""
    series = {}
    for row in rows:
        if row["head_dim"] != head_dim or row["mask"] not in masks:
            continue
        for impl in impls:
            if time_key in row.get(impl, {}):
                series.setdefault((mask_label(row), row["mask"], impl), []).append((row["seq"], row[impl][time_key]))
    if not series:
        raise ValueError(f"no recorded rows at head_dim {head_dim} with masks {masks}")
    shades = {}
    for (label, mask, impl), points in sorted(series.items()):
        points.sort()
        n, t = zip(*points)
        shade = shades.setdefault(label, len([s for s in shades if s.startswith(mask.split("-")[0])]))
        color = MASK_COLORS.get(mask, "#8172B3")
        ax.plot(n, t, color=color, alpha=1.0 - 0.35 * shade, label=f"{label}, {'ours' if impl == 'flashbook' else 'Flex'}",
                **IMPL_STYLES[impl])
    lo_n = min(n for pts in series.values() for n, _ in pts)
    hi_n = max(n for pts in series.values() for n, _ in pts)
    base = min(t for pts in series.values() for n, t in pts if n == lo_n)
    for power, text in ((1, "∝ N"), (2, "∝ N²")):
        ax.plot([lo_n, hi_n], [base, base * (hi_n / lo_n) ** power], color="#BBBBBB", lw=1, ls=":", zorder=0)
        ax.text(hi_n, base * (hi_n / lo_n) ** power, " " + text, color="#888888", fontsize=8, va="center")
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo_n / 1.25, hi_n * 1.6)   # room for the guides' labels
    ax.set_yscale("log")
    ax.set_xticks(sorted({n for pts in series.values() for n, _ in pts}))
    ax.set_xticklabels([f"{n // 1024}K" for n in sorted({n for pts in series.values() for n, _ in pts})])
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(("forward + backward" if time_key == "fwd_bwd_ms" else "forward") + " time (ms)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    return ax
