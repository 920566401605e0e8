"""Chapter 12's explorer of mask tiles: pick a mask, N, a window or prefix and a tile size,
and see which tiles a kernel skips, runs whole, or runs with the mask.

Every view is computed here, in Python, by ``flashbook.masks`` (the float64/NumPy truth
of the masks, in flash-attn's conventions), and ``flashbook_explorers.js`` only looks it
up and draws it, as chapter 9's sweep explorer does:

- ``masks.tile_kinds`` and ``masks.kind_counts`` give each view's tile grid and counts
  (the same numbers as ``masks.tile_counts``), and ``masks.allowed`` the pairs the rule
  keeps, once per (mask, N, window or prefix). ``tests/test_widgets.py`` holds the views equal to ``masks.tile_counts`` and
  ``masks.tile_kinds``: every view of a small option grid (ragged tiles included) and a
  spread of the book's; ``tests/test_browser.py`` the page's numbers to the library's.
- FLOPs follow ``bench.attention_flops``: the forward's two products Q K^T and P V,
  2 FLOPs per multiply-add, so 4 d per (query, key) pair and 4 N^2 d for the full
  N x N, per head, at d = ``HEAD_DIM``. A visited tile costs all its pairs, masked or
  not (the kernel computes them and then masks).
- Packed documents are a fixed set of seeded lengths per N (``document_lengths``).

Each view stores its tile grid compactly (``encode_grid``: per tile row, runs of
kinds; repeated rows once), so the page carries all 144 views of the book's options
in about 110 KB.
"""
from __future__ import annotations

import functools
import numbers
import re

import numpy as np

from .. import masks
from ..plots import STAGE_COLORS
from ..validation import check_choice

#: The masks the explorer offers: setting value -> label. All but "none" are causal.
MASKS = {"none": "none", "causal": "causal", "window": "sliding window + causal",
         "documents": "packed documents + causal", "prefix": "prefix + causal"}
SEQ_LENS = (1024, 2048, 4096, 8192)
#: W keys ending at the row's own key: ``window=(W - 1, 0)`` with causal.
WINDOWS = (128, 256, 512, 1024, 2048)
PREFIXES = (256, 512, 1024, 2048)
#: B_r x B_c ("128x64": the H200 forward's tile).
TILES = ("64x64", "128x64", "128x128")
HEAD_DIM = 128
#: The packed documents' lengths per N come from this seed (``document_lengths``).
DOC_SEED = 12
START = {"mask": "window", "n": 4096, "window": 1024, "prefix": 1024, "tile": "128x64"}
SETTINGS = tuple(START)
#: The kinds of ``masks.tile_kinds`` and their letters in ``encode_grid``.
KIND_LETTERS = {"skipped": "s", "full": "f", "partial": "p"}
#: Colours as chapter 7's stage figures: full tiles run the unmasked "main" stage,
#: partial ones the "masked" stage (``plots.STAGE_COLORS``).
KIND_COLORS = {"skipped": STAGE_COLORS["skipped"], "full": STAGE_COLORS["main"],
               "partial": STAGE_COLORS["masked"]}


# ----------------------------------------------------------------- the rules

def document_lengths(n: int, seed: int = DOC_SEED) -> list[int]:
    """The packed documents at length ``n``: lengths drawn from [n/32, n/4) with
    ``default_rng([seed, n])`` while they fit, the last one taking the rest."""
    rng = np.random.default_rng([seed, n])
    lengths = rng.integers(max(n // 32, 1), max(n // 4, 2), size=64)
    lengths = lengths[np.cumsum(lengths) < n]
    return [*(int(x) for x in lengths), n - int(lengths.sum())]


def cu_seqlens(n: int, seed: int = DOC_SEED) -> list[int]:
    """flash-attn's ``cu_seqlens`` of ``document_lengths(n)``."""
    return [0, *np.cumsum(document_lengths(n, seed)).tolist()]


def rule(mask: str, n: int, window: int, prefix: int, seed: int = DOC_SEED) -> dict:
    """The keyword arguments of ``masks.allowed`` / ``masks.tile_counts`` for a mask."""
    check_choice(mask, "mask", tuple(MASKS))
    if mask == "none":
        return {}
    if mask == "causal":
        return {"causal": True}
    if mask == "window":
        return {"causal": True, "window": (window - 1, 0)}
    if mask == "prefix":
        return {"causal": True, "prefix": prefix}
    ids = masks.doc_ids_from_cu_seqlens(cu_seqlens(n, seed))
    return {"causal": True, "doc_ids_q": ids, "doc_ids_k": ids}


def call_text(mask: str, n: int, window: int, prefix: int, block_m: int, block_n: int) -> str:
    """The same counts in Python, as the explorer prints it."""
    args = {"none": "", "causal": ", causal=True",
            "window": f", causal=True, window=({window - 1}, 0)",
            "prefix": f", causal=True, prefix={prefix}",
            "documents": ", causal=True, doc_ids_q=ids, doc_ids_k=ids"}[mask]
    return f"masks.tile_counts({n}, {n}, {block_m}, {block_n}{args})"


def parse_tile(tile) -> tuple[int, int]:
    """"128x64" or (128, 64) -> (B_r, B_c)."""
    if isinstance(tile, str):
        parts = tile.lower().split("x")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    elif isinstance(tile, (tuple, list)) and len(tile) == 2 and all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in tile):
        return int(tile[0]), int(tile[1])
    raise ValueError(f"tile must be B_r x B_c, as '128x64' or (128, 64), got {tile!r}")


def tile_name(tile) -> str:
    block_m, block_n = parse_tile(tile)
    return f"{block_m}x{block_n}"


# ----------------------------------------------------------------- one view

def encode_grid(kinds: np.ndarray) -> str:
    """Each tile row as runs of kinds ("f3p1s12": 3 full, 1 partial, 12 skipped), rows
    joined by ","; a row that repeats the one above k - 1 times ends in "*k"."""
    rows = []
    for row in kinds:
        runs, start = [], 0
        for j in range(1, len(row) + 1):
            if j == len(row) or row[j] != row[start]:
                runs.append(f"{KIND_LETTERS[row[start]]}{j - start}")
                start = j
        rows.append("".join(runs))
    out, a = [], 0
    for b in range(1, len(rows) + 1):
        if b == len(rows) or rows[b] != rows[a]:
            out.append(rows[a] if b - a == 1 else f"{rows[a]}*{b - a}")
            a = b
    return ",".join(out)


def decode_grid(text: str) -> np.ndarray:
    """``encode_grid``'s inverse (the browser decodes the same way)."""
    names = {v: k for k, v in KIND_LETTERS.items()}
    rows = []
    for token in text.split(","):
        row, _, repeat = token.partition("*")
        kinds = [names[c] for c, count in re.findall(r"([sfp])(\d+)", row) for _ in range(int(count))]
        rows += [kinds] * int(repeat or 1)
    return np.array(rows, dtype="<U7")


def _flops_per_pair(head_dim: int) -> int:
    from ..bench import costs

    return costs.attention_flops(1, 1, 1, 1, head_dim)


def tile_view(ok: np.ndarray, allowed_pairs: int, block_m: int, block_n: int, head_dim: int = HEAD_DIM) -> dict:
    """What the explorer shows for one rule at one tile size, read off the rule's
    ``masks.allowed`` array ``ok`` (built once for every tile size; ``allowed_pairs``, its
    count): ``masks.kinds_of``' grid (``masks.tile_kinds``' tiles) and ``masks.tile_counts``'
    counts, FLOPs and allowed pairs."""
    from ..bench import costs

    n_q, n_k = ok.shape
    kinds = masks.kinds_of(ok, block_m, block_n)
    counts = masks.kind_counts(kinds)
    heights = np.diff(np.r_[np.arange(0, n_q, block_m), n_q])
    widths = np.diff(np.r_[np.arange(0, n_k, block_n), n_k])
    pairs_visited = int((heights[:, None] * widths[None, :])[kinds != "skipped"].sum())
    per_pair = _flops_per_pair(head_dim)
    full = costs.attention_flops(1, 1, n_q, n_k, head_dim)
    assert full == per_pair * n_q * n_k
    return {"counts": counts, "grid": encode_grid(kinds),
            "pairs_visited": pairs_visited, "pairs_allowed": allowed_pairs,
            "allowed_fraction": allowed_pairs / (n_q * n_k),
            "flops": {"visited": per_pair * pairs_visited, "full": full,
                      "saved": full - per_pair * pairs_visited,
                      "saved_fraction": (full - per_pair * pairs_visited) / full}}


def view_key(mask: str, n: int, window: int, prefix: int, tile: str) -> str:
    """The look-up key: the window counts only for "window", the prefix only for
    "prefix" (0 otherwise). The browser builds the same."""
    param = window if mask == "window" else prefix if mask == "prefix" else 0
    return f"{mask},{n},{param},{tile}"


# ----------------------------------------------------------------- every view

@functools.lru_cache(maxsize=4)
def _views(seq_lens: tuple, windows: tuple, prefixes: tuple, tiles: tuple, head_dim: int,
           seed: int) -> dict:
    views = {}
    for mask in MASKS:
        params = windows if mask == "window" else prefixes if mask == "prefix" else (0,)
        for n in seq_lens:
            for p in params:
                mask_rule = rule(mask, n, p, p, seed)
                ok = masks.allowed(n, n, **mask_rule)   # once for every tile size
                allowed_pairs = int(np.count_nonzero(ok))
                for tile in tiles:
                    bm, bn = parse_tile(tile)
                    view = tile_view(ok, allowed_pairs, bm, bn, head_dim)
                    view["call"] = call_text(mask, n, p, p, bm, bn)
                    views[view_key(mask, n, p, p, tile)] = view
    return views


def _option(value, name: str, options: tuple) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, one of {options}, got "
                        f"{type(value).__name__} {value!r}")
    if int(value) not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return int(value)


def check_settings(settings: dict, options: dict) -> dict:
    """The five settings, checked against the config's options (errors name the
    setting); ``tile`` may be given as "128x64" or (128, 64)."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise TypeError(f"unknown setting(s) {sorted(unknown)}: the settings are {SETTINGS}")
    missing = [k for k in SETTINGS if k not in settings]
    if missing:
        raise ValueError(f"settings must give {SETTINGS}; missing {missing}")
    mask = settings["mask"]
    if mask not in options["mask"]:
        raise ValueError(f"mask must be one of {tuple(options['mask'])}, got {mask!r}")
    tile = tile_name(settings["tile"])
    if tile not in options["tile"]:
        raise ValueError(f"tile must be one of {tuple(options['tile'])}, got {settings['tile']!r}")
    return {"mask": mask, "n": _option(settings["n"], "n", tuple(options["n"])),
            "window": _option(settings["window"], "window", tuple(options["window"])),
            "prefix": _option(settings["prefix"], "prefix", tuple(options["prefix"])),
            "tile": tile}


def masks_config(start: dict | None = None, *, seq_lens=SEQ_LENS, windows=WINDOWS,
                 prefixes=PREFIXES, tiles=TILES, head_dim: int = HEAD_DIM,
                 seed: int = DOC_SEED) -> dict:
    """The explorer's config: every combination's view (``tile_view``), the options,
    the documents' ``cu_seqlens`` per N, the colours and the start settings (``START``
    updated by ``start``). The views are built once per option grid (cached)."""
    seq_lens, windows, prefixes = (tuple(int(x) for x in v) for v in (seq_lens, windows, prefixes))
    tiles = tuple(tile_name(t) for t in tiles)
    options = {"mask": list(MASKS), "n": list(seq_lens), "window": list(windows),
               "prefix": list(prefixes), "tile": list(tiles)}
    settings = check_settings({**START, **(start or {})}, options)
    return {"options": options, "labels": dict(MASKS),
            "views": _views(seq_lens, windows, prefixes, tiles, int(head_dim), int(seed)),
            "documents": {str(n): cu_seqlens(n, seed) for n in seq_lens},
            "doc_seed": int(seed), "head_dim": int(head_dim),
            "flops_per_pair": _flops_per_pair(int(head_dim)),
            "colors": dict(KIND_COLORS), "settings": settings}


def masks_state(config: dict, settings: dict) -> dict:
    """The view the controls' settings select (the browser does the same look-up), with
    its key and the settings checked."""
    s = check_settings(settings, config["options"])
    key = view_key(s["mask"], s["n"], s["window"], s["prefix"], s["tile"])
    return {**config["views"][key], "key": key, "settings": s}


# ----------------------------------------------------------------- the page's text

def human_flops(x: float) -> str:
    """34359738368 -> '34.4 GFLOP' (decimal units; the browser writes the same)."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(x) < 1000 or unit == "P":
            digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
            return f"{x:.{digits}f} {unit}FLOP"
        x /= 1000
    raise AssertionError("unreachable")
