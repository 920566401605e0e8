"""Where naive attention's time goes, step by step (chapter 1): ``measure_naive_steps``
times the steps, ``time_breakdown`` draws them. ``benchmarks/naive_breakdown.py``
records the same steps on a GPU, timed by ``flashbook.timing.time_ms``.
"""
from __future__ import annotations

import time


def _sync(device: str):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _best_wall_ms(fn, device: str, repeats: int) -> float:
    """The fastest of ``repeats`` wall-clock runs of ``fn`` after a warm-up, the device
    synchronised after each (on a shared machine the fastest run is the one least
    disturbed by others)."""
    fn(); _sync(device)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(); _sync(device)
        runs.append(1e3 * (time.perf_counter() - t0))
    return float(min(runs))


def measure_naive_steps(n: int = 1024, d: int = 64, *, batch_heads: int = 4, device: str = "cpu",
                        dtype=None, repeats: int = 5, timer=None) -> dict:
    """Time each step of naive attention, in milliseconds.

    The steps of ``softmax(Q K^T * scale) V`` as separate operations, each writing its
    result to memory as a naive implementation does: the two matrix products, and the
    softmax split into the bytes it must move (a copy of S into a new N x N array:
    one read, one write, which the softmax also does) and the rest (max, exp, sum,
    divide). Works on "cpu" (torch's CPU kernels) and "cuda".

    ``timer(fn) -> ms`` times one step (``flashbook.timing.time_ms`` on a GPU); by
    default the best of ``repeats`` wall-clock runs, the device synchronised after each.
    """
    import torch

    dtype = dtype or torch.float32
    for name, value in (("n", n), ("d", d), ("batch_heads", batch_heads), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(batch_heads, n, d, generator=gen).to(device=device, dtype=dtype)
               for _ in range(3))
    q = q * d ** -0.5                          # the scale, folded into Q once
    s = torch.empty(batch_heads, n, n, device=device, dtype=dtype)
    p = torch.empty_like(s)
    o = torch.empty_like(q)
    steps = {
        "Q K^T (matmul)": lambda: torch.matmul(q, k.transpose(-1, -2), out=s),
        "softmax: moving S in and P out": lambda: p.copy_(s),
        "softmax: max, exp, sum": lambda: torch.softmax(s, dim=-1),   # a new P, as naive code
        "P V (matmul)": lambda: torch.matmul(p, v, out=o),
    }
    default = timer is None
    if default:
        def timer(fn):
            return _best_wall_ms(fn, device, repeats)
    times = {name: float(timer(fn)) for name, fn in steps.items()}
    # the softmax as a whole moved S and P and did the arithmetic: split it
    whole = times.pop("softmax: max, exp, sum")
    times["softmax: max, exp, sum"] = max(whole - times["softmax: moving S in and P out"], 0.0)
    order = ["Q K^T (matmul)", "softmax: moving S in and P out", "softmax: max, exp, sum",
             "P V (matmul)"]
    return {"ms": {k2: times[k2] for k2 in order}, "softmax_ms": whole, "n": n, "d": d,
            "batch_heads": batch_heads, "device": device, "dtype": str(dtype).split(".")[-1],
            "repeats": repeats if default else None}


_STEP_COLORS = {"Q K^T (matmul)": "#4C72B0", "P V (matmul)": "#55A868",
                "softmax: moving S in and P out": "#C44E52", "softmax: max, exp, sum": "#DD8452"}


def time_breakdown(ax, measured: dict, *, title: str | None = None, labels: dict | None = None):
    """One stacked bar of ``measure_naive_steps``'s times, each step's share written on it.

    ``labels`` renames steps in the legend (the records keep the names they were made with)."""
    ms = measured["ms"]
    total = sum(ms.values())
    left = 0.0
    for name, t in ms.items():
        shown = (labels or {}).get(name, name)
        ax.barh(0, t, left=left, color=_STEP_COLORS.get(name, "#999999"), edgecolor="white",
                label=f"{shown}: {t:.2f} ms ({100 * t / total:.0f}%)")
        left += t
    ax.set_yticks([])
    ax.set_xlabel("milliseconds")
    ax.set_xlim(0, total * 1.02)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)
    ax.set_title(title or (f"Naive attention on {measured['device']}, {measured['dtype']}: "
                           f"N = {measured['n']}, d = {measured['d']}, "
                           f"{measured['batch_heads']} heads, {total:.1f} ms"), fontsize=9)
    return ax

