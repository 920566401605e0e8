"""One front end for every explorer, in Jupyter, in Colab and in the static book.

``flashbook_explorers.js`` (beside this file) draws every explorer and computes what it
shows. It serves twice:

- in Jupyter and Colab, as the front end of an ``anywidget`` widget
  (``ExplorerWidget``): its ``render({model, el})`` reads and writes the widget's
  ``settings`` traitlet;
- in the static book (no kernel, no network), mounted by the page itself: the
  explorer cell's ``text/html`` output is ``placeholder_html``, a ``<div>`` holding the
  same config as JSON, and ``flashbook_mount.js`` mounts the module on it.
"""
from __future__ import annotations

import functools
import html
import json
import pathlib

from . import blocksize, maskmap, qkv, sweep

#: This folder: the JavaScript beside the Python (the book's build copies its ``*.js``).
STATIC = pathlib.Path(__file__).parent
#: The one front end: anywidget's ``_esm`` and the static book's module.
ESM = STATIC / "flashbook_explorers.js"
KINDS = ("blocksize", "qkv", "sweep", "masks")


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
                return blocksize.blocksize_state(self.settings)
            if self.kind == "qkv":
                return qkv.qkv_state(self.settings, self.config["scale"])
            if self.kind == "masks":
                return maskmap.masks_state(self.config, self.settings)
            return sweep.sweep_state(self.config, self.settings)

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
    """The live explorer for ``kind`` ("blocksize", "qkv", "sweep" or "masks") and its config."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    try:
        cls = widget_class()
    except ImportError:
        return StaticExplorer(kind, config)
    return cls(kind=kind, config=config, settings=dict(config["settings"]))


def explorer(**settings):
    """Chapter 4's explorer, e.g. ``explorer(n=512, chip="T4")``: an anywidget in Jupyter
    and Colab, the same JavaScript mounted by the page in the static book. Its
    ``state`` is ``blocksize.explorer_state`` of its settings."""
    return explorer_widget("blocksize", blocksize.blocksize_config(blocksize.Settings(**settings)))


def mask_explorer(**settings):
    """Chapter 12's explorer of mask tiles, e.g. ``mask_explorer(mask="window", n=4096,
    window=1024)``; the settings are ``mask`` (one of ``maskmap.MASKS``), ``n``,
    ``window`` (W keys: ``window=(W - 1, 0)``), ``prefix`` and ``tile`` ("128x64" or
    (128, 64)), each one of the options of ``maskmap.masks_config``; the others start at
    ``maskmap.START``. An anywidget in Jupyter and Colab, the same JavaScript mounted by
    the page in the static book; its ``state`` is ``maskmap.masks_state`` of its settings."""
    return explorer_widget("masks", maskmap.masks_config(settings))
