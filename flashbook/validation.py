"""Argument checks shared by the library: one wording for every bad input.

Each returns the value in a plain Python type, or raises ``TypeError`` (wrong
kind of value) or ``ValueError`` (right kind, out of range) naming the argument
and what was expected.
"""
from __future__ import annotations

import numbers

import numpy as np


def check_count(value, name: str, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (sizes, lengths, block sizes); bool is not an integer here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_choice(value, name: str, choices):
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_flag(value, name: str) -> bool:
    """True or False (a NumPy bool too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)
