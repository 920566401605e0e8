"""Chapter 9's explorer over a recorded block sweep: the browser looks values up.

``sweep_config`` asks ``bench.block_state`` for every combination of the controls'
options here, in Python, and hands ``flashbook_explorers.js`` the results: the page
shows the library's own numbers and computes none.
"""
from __future__ import annotations

import math

from .. import runtime

_SWEEP_KEYS = ("head_dim", "block_m", "block_n", "num_warps", "num_stages")


def _finite(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def sweep_view(state) -> dict:
    """What the explorer shows for one ``bench.BlockState`` (JSON-ready)."""
    row = state.row or {}
    return {"found": state.row is not None, "status": row.get("status"),
            "note": str(row.get("note") or "")[:120] if state.row is not None else "",
            "tflops": _finite(row.get("fwd_tflops")), "rank": state.rank, "n_ran": state.n_ran,
            "regs": _finite(row.get("n_regs")), "spills": _finite(row.get("n_spills")),
            "shared_bytes": _finite(state.shared_bytes), "seq": state.seq,
            "fits": {name: dict(f) for name, f in state.fits.items()}}


def sweep_config(blocks, *, start: dict, measured_arch: str | None = None,
                 gpu: str = "") -> dict:
    """The explorer over ``blocks`` (``bench.load_results``'s frame): every view, looked up."""
    from .. import bench

    options = {key: sorted(int(x) for x in blocks[key].unique()) for key in _SWEEP_KEYS}
    missing = [k for k in _SWEEP_KEYS if k not in start]
    if missing:
        raise ValueError(f"start must give {', '.join(_SWEEP_KEYS)}; missing {missing}")
    views, ranking = {}, {}
    for d in options["head_dim"]:
        for bm in options["block_m"]:
            for bn in options["block_n"]:
                for w in options["num_warps"]:
                    for s in options["num_stages"]:
                        state = bench.block_state(blocks, d, bm, bn, w, s,
                                                  measured_arch=measured_arch)
                        views[f"{d},{bm},{bn},{w},{s}"] = sweep_view(state)
        ranking[str(d)] = [[",".join(map(str, c)), t] for c, t in state.ranking]
    return {"options": options, "views": views, "ranking": ranking, "gpu": gpu,
            "chips": list(runtime.CHIPS),
            "settings": {k: int(start[k]) for k in _SWEEP_KEYS}}


def sweep_state(config: dict, settings: dict) -> dict:
    """The view the controls' settings select (the browser does the same look-up)."""
    return config["views"][",".join(str(int(settings[k])) for k in _SWEEP_KEYS)]
