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


def labelled_fits(fits: dict, gpu: str = "") -> dict:
    """``bench.block_fits``'s per-chip fits, with "measured" kept for the GPU that ran the
    sweep (``gpu``, its name as the provenance records it). Other chips of its
    architecture run the same compiled kernel, so they get its bytes, labelled as
    measured on that GPU: nothing was run on them."""
    ran_on = next((name for name in fits if gpu and name in gpu), None)
    out = {}
    for name, f in fits.items():
        f = dict(f)
        if f["how"] == "measured" and ran_on is not None and name != ran_on:
            f["how"] = f"measured on the {ran_on} (same {runtime.chip(name).arch} code)"
        out[name] = f
    return out


def sweep_view(state, gpu: str = "") -> dict:
    """What the explorer shows for one ``bench.BlockState`` (JSON-ready); ``gpu`` is the
    GPU that ran the sweep (see ``labelled_fits``)."""
    row = state.row or {}
    return {"found": state.row is not None, "status": row.get("status"),
            "note": str(row.get("note") or "") if state.row is not None else "",
            "tflops": _finite(row.get("fwd_tflops")), "rank": state.rank, "n_ran": state.n_ran,
            "regs": _finite(row.get("n_regs")), "spills": _finite(row.get("n_spills")),
            "shared_bytes": _finite(state.shared_bytes), "seq": state.seq,
            "fits": labelled_fits(state.fits, gpu)}


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
                        views[f"{d},{bm},{bn},{w},{s}"] = sweep_view(state, gpu)
        ranking[str(d)] = [[",".join(map(str, c)), t] for c, t in state.ranking]
    return {"options": options, "views": views, "ranking": ranking, "gpu": gpu,
            "chips": list(runtime.CHIPS),
            "settings": {k: int(start[k]) for k in _SWEEP_KEYS}}


def sweep_state(config: dict, settings: dict) -> dict:
    """The view the controls' settings select (the browser does the same look-up)."""
    return config["views"][",".join(str(int(settings[k])) for k in _SWEEP_KEYS)]
