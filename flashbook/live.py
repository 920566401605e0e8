"""The book's explorers, live everywhere: in Jupyter, in Colab and in the static book.

One JavaScript module, ``flashbook/static/flashbook_explorers.js``, draws every
explorer (SVG) and computes what it shows in the browser. It serves twice:

- in Jupyter and Colab, as the front end of an ``anywidget`` widget
  (``ExplorerWidget``): its ``render({model, el})`` reads and writes the widget's
  ``settings`` traitlet;
- in the static book (no kernel, no network), mounted by the page itself: the
  explorer cell's ``text/html`` output is a placeholder ``<div>`` holding the same
  config as JSON, and ``flashbook_mount.js`` (served from ``_static`` by
  ``book/_ext/flashbook_sphinx.py``) mounts the module on it.

The Python library stays the source of the formulas. The configs below export its
constants (chips, bytes per element, which buffers are inputs) and, where the
browser only looks things up (chapter 9), the values themselves. The JavaScript
mirrors the rest (tiles, schedule, closed-form traffic, the online update), and the
tests check that every displayed number equals the Python value for the same inputs
(``tests/test_widgets.py``, ``tests/test_browser.py``).
"""
from __future__ import annotations

import functools
import html
import json
import math
import pathlib
from dataclasses import asdict

import numpy as np

from . import io_counter, reference, runtime, softmax, tiled
from .validation import check_count

STATIC = pathlib.Path(__file__).parent / "static"
#: The one front end: anywidget's ``_esm`` and the static book's module.
ESM = STATIC / "flashbook_explorers.js"
KINDS = ("blocksize", "qkv", "sweep")


# ----------------------------------------------------------------- configs (JSON for the JS)

def blocksize_config(settings=None) -> dict:
    """Chapter 4's explorer: the constants the browser needs, and the start settings.

    The example inputs are ``widgets.example_qkv`` (an integer hash both sides
    evaluate exactly), so the browser recomputes the watched row's running m and l.
    """
    from . import widgets

    settings = widgets.Settings() if settings is None else settings
    s = settings.checked()
    start = dict(asdict(s))
    if start["step"] is None:                       # halfway, as explorer_state does
        start["step"] = len(tiled.tile_schedule(s.n, s.n, s.block_q, s.block_k,
                                                causal=s.causal, order=s.order)) // 2
    return {
        "chips": {name: {"name": c.name, "smem_per_block": c.smem_per_block_kib * 1024,
                         "smem_per_sm": c.smem_per_sm_kib * 1024}
                  for name, c in runtime.CHIPS.items()},
        "dtype_bytes": widgets.DTYPE_BYTES, "acc_bytes": widgets.ACC_BYTES,
        "input_buffers": sorted(io_counter.INPUT_BUFFERS), "stat_arrays": sorted(io_counter.STAT_ARRAYS),
        "orders": {o: name for o, name in widgets.plots.ORDER_NAMES.items()},
        "limits": {k: list(v) for k, v in widgets.LIMITS.items()},
        "example": {"seed": widgets.EXAMPLE_SEED, "low": widgets.EXAMPLE_LOW,
                    "width": widgets.EXAMPLE_WIDTH},
        "settings": start,
    }


def qkv_config(q, k, v, *, scale=None, token: int = 1, tokens=None, keys=None, dims=None) -> dict:
    """Chapter 2's Q/K/V editor: the matrices (every entry editable) and the labels."""
    q, k, v, scale = reference.check_qkv(q, k, v, scale)
    if q.ndim != 2:
        raise ValueError(f"q must be 2-D (tokens x dims), got shape {q.shape}")
    n, d = q.shape
    token = check_count(token, "token", 0)
    if token >= n:
        raise ValueError(f"token must be < {n}, got {token}")
    return {"scale": float(scale),
            "tokens": list(tokens or [f"token {i}" for i in range(n)]),
            "keys": list(keys or [f"key {j}" for j in range(k.shape[0])]),
            "dims": list(dims or [f"dim {c}" for c in range(d)]),
            "vdims": [f"o[{c}]" for c in range(v.shape[1])],
            "settings": {"Q": q.tolist(), "K": k.tolist(), "V": v.tolist(), "token": token}}


_SWEEP_KEYS = ("head_dim", "block_m", "block_n", "num_warps", "num_stages")


def _finite(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def sweep_view(state) -> dict:
    """What chapter 9's explorer shows for one ``bench.BlockState`` (JSON-ready)."""
    row = state.row or {}
    return {"found": state.row is not None, "status": row.get("status"),
            "note": str(row.get("note") or "")[:120] if state.row is not None else "",
            "tflops": _finite(row.get("fwd_tflops")), "rank": state.rank, "n_ran": state.n_ran,
            "regs": _finite(row.get("n_regs")), "spills": _finite(row.get("n_spills")),
            "shared_bytes": _finite(state.shared_bytes), "seq": state.seq,
            "fits": {name: dict(f) for name, f in state.fits.items()}}


def sweep_config(blocks, *, start: dict, measured_arch: str | None = None,
                 gpu: str = "") -> dict:
    """Chapter 9's explorer over a recorded block sweep (``bench.load_results``'s frame).

    Every combination of the controls' options is looked up with ``bench.block_state``
    here, so the browser shows the library's own numbers and computes none."""
    from . import bench

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


# ----------------------------------------------------------------- Python's side of each view

def blocksize_state(settings: dict):
    from . import widgets

    return widgets.explorer_state(widgets.Settings(**settings))


def qkv_state(settings: dict, scale: float) -> dict:
    """The tables of chapter 2's editor, computed by the library (the JS mirrors them)."""
    q, k, v = (np.asarray(settings[m], dtype=np.float64) for m in "QKV")
    s = scale * q @ k.T
    p = softmax.softmax(s)
    o = p @ v
    trace = softmax.online_attention_trace(q[settings["token"]], k, v, scale=scale)
    rows = [[t.dot[0], t.score[0], t.row_max, t.rescale, t.weight[0], t.row_sum,
             *t.acc, *t.output] for t in trace]
    online = np.stack([softmax.online_attention_trace(x, k, v, scale=scale)[-1].output
                       for x in q])
    return {"S": s, "P": p, "O": o, "trace": np.array(rows),
            "error": float(np.abs(online - o).max())}


def sweep_state(config: dict, settings: dict) -> dict:
    return config["views"][",".join(str(int(settings[k])) for k in _SWEEP_KEYS)]


# ----------------------------------------------------------------- the display object

def placeholder_html(kind: str, config: dict) -> str:
    """The static book's output: a div the page's script mounts the explorer on."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    payload = json.dumps(config, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (f'<div class="flashbook-explorer" data-kind="{html.escape(kind)}">'
            f'<script type="application/json">{payload}</script>'
            f'<p class="flashbook-explorer-fallback">This explorer needs JavaScript.</p></div>')


@functools.lru_cache(maxsize=1)
def widget_class():
    """The anywidget class (built on first use: anywidget is imported only then)."""
    import anywidget
    import traitlets

    class ExplorerWidget(anywidget.AnyWidget):
        """One of the book's explorers; ``settings`` is what the controls set."""

        _esm = ESM
        kind = traitlets.Unicode("blocksize").tag(sync=True)
        config = traitlets.Dict().tag(sync=True)
        settings = traitlets.Dict().tag(sync=True)

        @property
        def state(self):
            """What the explorer shows for the current ``settings``, by the library."""
            if self.kind == "blocksize":
                return blocksize_state(self.settings)
            if self.kind == "qkv":
                return qkv_state(self.settings, self.config["scale"])
            return sweep_state(self.config, self.settings)

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            # the static book mounts the same module on this placeholder
            data["text/html"] = placeholder_html(self.kind, self.config)
            return bundle

    return ExplorerWidget


class StaticExplorer:
    """Where anywidget is missing: only the placeholder (live in the built book)."""

    def __init__(self, kind, config):
        self.kind, self.config, self.settings = kind, config, dict(config["settings"])

    def _repr_mimebundle_(self, **kwargs):
        return {"text/plain": f"<{self.kind} explorer: install anywidget to use it here>",
                "text/html": placeholder_html(self.kind, self.config)}


def explorer_widget(kind: str, config: dict):
    """The live explorer for ``kind`` ("blocksize", "qkv" or "sweep") and its config."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    try:
        cls = widget_class()
    except ImportError:
        return StaticExplorer(kind, config)
    return cls(kind=kind, config=config, settings=dict(config["settings"]))
