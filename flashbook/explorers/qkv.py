"""Chapter 2's Q/K/V editor: every entry of Q, K and V editable, the tables recomputed.

``qkv_config`` is what ``flashbook_explorers.js`` is given (the matrices, the scale and
the labels); the JavaScript recomputes S, P, O and the online trace of the watched
token as ``qkv_state`` does with the library.
"""
from __future__ import annotations

import numpy as np

from .. import reference, softmax
from ..validation import check_count


def qkv_config(q, k, v, *, scale=None, token: int = 1, tokens=None, keys=None, dims=None) -> dict:
    """The matrices (every entry editable), the scale and the labels."""
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


def qkv_state(settings: dict, scale: float) -> dict:
    """The editor's tables, computed by the library (the JavaScript mirrors them)."""
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
