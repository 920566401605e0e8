"""The book's explorers: their Python and their JavaScript, side by side in this folder.

How an explorer in the static page gets its numbers
---------------------------------------------------
1. When the book is built, the explorer's cell runs the library: ``blocksize.py``
   (chapter 4), ``qkv.py`` (chapter 2), ``sweep.py`` (chapter 9) or ``maskmap.py``
   (chapter 12) builds the explorer's *config*: the library's constants (chips, bytes
   per element, which buffers are inputs), the start settings and, for the sweep and
   the mask tiles, every value they show: looked up in the recorded run, or computed
   by ``flashbook.masks`` for every combination of the controls.
2. The cell's HTML output (``widget.placeholder_html``) is a ``<div>`` that carries
   that config as JSON, so the page holds it with no kernel behind it.
3. In the browser, ``flashbook_explorers_page.js`` (``widget.page_script``: the same
   module as a classic script, which a page opened from disk may load too; the build
   writes it into ``_static`` and each page with an explorer loads it:
   ``book/_ext/flashbook_sphinx.py``) mounts ``flashbook_explorers.js``'s code on each
   such ``<div>``. That code draws the explorer
   and recomputes what the controls change from the config: the tile schedule, the
   closed-form traffic, the on-chip bytes and the watched row's running m and l
   (chapter 4), S, P, O and the online update (chapter 2); the sweep and the mask
   tiles only look up.
4. The tests hold the two sides equal: ``tests/test_widgets.py`` (the configs carry the
   library's values), ``tests/test_browser.py`` (every number the page displays equals
   the Python value for the same settings).

In Jupyter and Colab the same module is the front end of an ``anywidget`` widget
(``widget.py``), whose ``state`` is the Python side of the same view.
``flashbook.widgets`` and ``flashbook.live`` are older names of this package.
"""
from .blocksize import (
    ACC_BYTES,
    DTYPE_BYTES,
    EXAMPLE_LOW,
    EXAMPLE_SEED,
    EXAMPLE_WIDTH,
    LIMITS,
    MAX_LIVE_TILES,
    ExplorerState,
    Settings,
    blocksize_config,
    blocksize_state,
    example_qkv,
    explorer_state,
    figure_png,
    render,
)
from .maskmap import masks_config, masks_state
from .qkv import qkv_config, qkv_state
from .sweep import sweep_config, sweep_state, sweep_view
from .widget import (ESM, KINDS, PAGE_SCRIPT, STATIC, StaticExplorer, explorer, explorer_widget,
                     mask_explorer, page_script, placeholder_html, widget_class)

__all__ = [
    "ACC_BYTES", "DTYPE_BYTES", "EXAMPLE_LOW", "EXAMPLE_SEED", "EXAMPLE_WIDTH", "LIMITS",
    "MAX_LIVE_TILES", "ExplorerState", "Settings", "blocksize_config", "blocksize_state",
    "example_qkv", "explorer_state", "figure_png", "render",
    "qkv_config", "qkv_state", "sweep_config", "sweep_state", "sweep_view",
    "masks_config", "masks_state",
    "ESM", "KINDS", "PAGE_SCRIPT", "STATIC", "page_script", "StaticExplorer", "explorer", "explorer_widget", "mask_explorer",
    "placeholder_html", "widget_class",
]
