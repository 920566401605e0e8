"""The arguments the attention kernels take for a mask: ``kernel_mask`` (a window, a soft cap,
a prefix) and ``alibi_args`` (ALiBi's slopes), each checked, and ``window_keys``. Every entry
point (``autograd``, ``varlen``, ``dispatch``, the decode kernels) asks these, so that a mask
means the same everywhere; ``autograd`` re-exports them."""
from __future__ import annotations

import math
import warnings

import torch

from .. import masks
from . import forward as forward_kernel

LOG2E = forward_kernel.LOG2E.value  # log2(e), defined once beside the kernels that use it


def window_keys(window, causal: bool) -> float:
    """How many keys a row's ``window=(left, right)`` spans at most (``math.inf`` with a side
    unlimited; ``causal`` sets right to 0)."""
    left, right = masks.check_window(window)
    right = 0 if causal else right
    return math.inf if left < 0 or right < 0 else left + right + 1


def keys_of(causal_given: bool, window, extra: dict) -> float | None:
    """How many keys a row of one call's window sees at most (``window_keys``), or None where the
    kernels get no window (``extra``: ``kernel_mask``'s)."""
    return window_keys(window, causal_given) if "WINDOW" in extra else None


def tiles_of(causal: bool, causal_given: bool, window, extra: dict, block_d: int | None = None) -> tuple[bool, bool]:
    """``configs.tiles_for`` of one call: the ``(causal, window)`` its tiles are chosen with, from
    the kernel's ``causal`` and ``extra`` (``kernel_mask``'s), the caller's ``causal`` and ``window``
    and the head_dim tile ``block_d``."""
    from . import configs

    return configs.tiles_for(causal, keys_of(causal_given, window, extra), block_d)


def kernel_mask(causal: bool, window, softcap, seq_q: int, seq_k: int, scale: float,
                diagonal: int | None = None, prefix=0) -> tuple[bool, float, dict]:
    """What the kernels are told about a mask and a soft cap: ``(causal, qk_scale, extra)``.

    ``window=(left, right)`` as flash-attn: query i sees key j when
    i + d - left <= j <= i + d + right, d = seq_k - seq_q (bottom-right aligned); -1 is
    no limit on that side, and ``causal=True`` sets right to 0. A window with no limit
    on either side is no window, and (-1, 0) is the causal mask: both take the kernels'
    usual paths, so a call without a window runs exactly the kernels it ran before.
    Otherwise the kernels get ``WINDOW`` with row i seeing keys [i + first, i + last].
    ``softcap=c`` makes the scores c * tanh(s / c): ``qk_scale`` becomes c * log2(e) and
    ``cap_scale`` = scale / c. ``extra`` holds the keyword arguments to add to a launch
    (empty when there is neither). ``diagonal`` overrides seq_k - seq_q (0 for packed
    documents, whose kernels add each document's own). ``prefix=p`` (prefix-LM): with
    ``causal=True`` and no window, the first p keys are seen by every row too (``PREFIX``).
    """
    left, right = masks.check_window(window)
    cap = masks.check_softcap(softcap)
    prefix = masks.check_prefix(prefix)
    if prefix and (not causal or left >= 0 or right >= 0):
        raise ValueError(f"prefix={prefix} needs causal=True and no window (a prefix-LM is causal after "
                         f"its prefix), got causal={causal}, window={window}")
    if causal:
        right = 0
    extra = {}
    if left >= 0 or right > 0:            # a real window: one limit at least, other than causal
        far = seq_q + seq_k               # "no limit": further than any key is from any row
        diagonal = seq_k - seq_q if diagonal is None else diagonal
        extra = dict(first=diagonal - (left if left >= 0 else far), last=diagonal + (right if right >= 0 else far),
                     WINDOW=True)
        causal = False
    elif right == 0:
        causal = True
    qk_scale = (cap if cap else scale) * LOG2E
    if cap:
        extra.update(cap_scale=scale / cap, SOFTCAP=True)
    if prefix:
        extra.update(prefix=prefix, PREFIX=True)
    return causal, qk_scale, extra


def alibi_args(alibi_slopes, q, batch: int | None = None) -> dict:
    """The kernels' ``ALIBI`` keyword arguments for flash-attn's ``alibi_slopes`` ({} for None), checked:
    a float32 tensor on q's device of shape (heads,) or (batch, heads), heads = q's heads, batch =
    q's batch or ``batch`` (the documents of ``flash_attention_varlen``). The slopes get no gradient."""
    if alibi_slopes is None:
        return {}
    heads, batch = q.shape[1], q.shape[0] if batch is None else batch
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        got = alibi_slopes.dtype if isinstance(alibi_slopes, torch.Tensor) else type(alibi_slopes).__name__
        raise TypeError(f"alibi_slopes must be a float32 torch.Tensor (as flash-attn's), got {got}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (heads, or batch x heads, "
                         f"counting q's heads), got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes must be on q's device {q.device}, got {alibi_slopes.device}")
    if alibi_slopes.requires_grad and torch.is_grad_enabled():
        warnings.warn("alibi_slopes requires a gradient, which flashbook does not compute (nor does flash-attn): "
                      "the slopes are used as constants", stacklevel=3)
    slopes = alibi_slopes.detach().contiguous()
    return dict(ALIBI_SLOPES=slopes, alibi_stride=heads if slopes.dim() == 2 else 0, ALIBI=True)


def masked_args(window=None, softcap=None, packed=None, prefix=0, alibi_slopes=None) -> dict:
    """The mask's keyword arguments for ``flash_forward`` and ``flash_backward``: {} for the plain
    kernels (which the Gluon forward, taking none of them, can stand in for)."""
    plain = window is None and softcap is None and packed is None and not prefix and alibi_slopes is None
    return {} if plain else dict(window=window, softcap=softcap, packed=packed, prefix=prefix, alibi_slopes=alibi_slopes)
