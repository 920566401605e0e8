"""How far apart two times of the same work are: the noise every verdict in chapters 9 and 10
(and the lab notes' run-by-run table) is judged against, measured as gains are quoted."""
from __future__ import annotations


def slower_over_faster(ratio):
    """How far apart two times are, as a gain is quoted: the slower over the faster, minus one,
    for a ratio of the two (either way round; a number, an array or a pandas Series)."""
    import numpy as np

    return np.maximum(ratio, 1 / ratio) - 1


def twin_gaps(df):
    """Per shape, how far apart the forward times of ``flashbook`` and ``flashbook-atomic`` are
    in one run (``slower_over_faster``): the two run the same forward kernel, so this is the
    spread identical work shows there. None if either is missing."""
    if df is None:
        return None
    ok = df[df["status"] == "ok"]
    fwd_ms = ok.pivot_table(index=["head_dim", "seq", "causal"], columns="impl", values="fwd_ms")
    if not {"flashbook", "flashbook-atomic"} <= set(fwd_ms.columns):
        return None
    return slower_over_faster(fwd_ms["flashbook-atomic"] / fwd_ms["flashbook"]).dropna()


def twin_spread(df):
    """The largest of ``twin_gaps``: chapter 9's measure of noise, measured as the gains
    are quoted (slower over faster, minus one), so that "a gain no larger than the noise"
    compares like with like. Chapter 10 reads the same pairs the same way. None if either
    implementation is missing."""
    gaps = twin_gaps(df)
    return float(gaps.max()) if gaps is not None and len(gaps) else None
