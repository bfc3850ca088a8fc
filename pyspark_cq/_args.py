"""Argument checks for the pure (Spark-free) modules: estimators, cost models and the plan model.

Every check names the argument and the expected form in its message, and returns the checked value
(converted to ``float`` / ``int`` where that is the expected form). This module depends on the standard
library and numpy only, so the leaf modules of :mod:`pyspark_cq.estimators` can use it, and so can
:mod:`pyspark_cq.cost`, :mod:`pyspark_cq.plan` and :mod:`pyspark_cq.control` without loading the estimators
(the Spark-facing checks live in ``pyspark_cq._validate``).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable

import numpy as np

__all__ = [
    "real", "positive", "non_negative", "probability", "fraction", "integer", "one_of",
    "instance", "real_array", "callable_",
]


def real(value, name: str, *, allow_inf: bool = False, allow_nan: bool = False) -> float:
    """Check that ``value`` is a real number (not a bool); return it as ``float``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value) and not allow_nan:
        raise ValueError(f"{name} must be a real number, got nan")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{name} must be a finite real number, got {value}")
    return value


def positive(value, name: str, *, allow_inf: bool = False) -> float:
    """Check ``value > 0``."""
    value = real(value, name, allow_inf=allow_inf)
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def non_negative(value, name: str, *, allow_inf: bool = False) -> float:
    """Check ``value >= 0``."""
    value = real(value, name, allow_inf=allow_inf)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def probability(value, name: str, *, allow_zero: bool = True) -> float:
    """Check ``0 <= value <= 1`` (``0 < value <= 1`` when ``allow_zero`` is false)."""
    value = real(value, name)
    low_ok = value > 0 or (allow_zero and value == 0)
    if not (low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return value


def fraction(value, name: str) -> float:
    """Check ``0 < value < 1`` (an open interval, e.g. a smoothing constant)."""
    value = real(value, name)
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in the open interval (0, 1), got {value}")
    return value


def integer(value, name: str, *, minimum: int | None = None) -> int:
    """Check that ``value`` is an integer (not a bool), optionally ``>= minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def one_of(value, name: str, choices: Iterable):
    """Check that ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def instance(value, name: str, types, expected: str):
    """Check ``isinstance(value, types)``; ``expected`` describes the form in the message."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    return value


def callable_(value, name: str) -> Callable:
    """Check that ``value`` is callable."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r} ({type(value).__name__})")
    return value


def real_array(values, name: str, *, allow_nan: bool = False, allow_inf: bool = False) -> np.ndarray:
    """Convert ``values`` to a 1-d float64 array; reject non-numeric, nan and inf entries."""
    arr = np.asarray(values)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a 1-d array of real numbers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array of real numbers, got shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if not allow_nan and np.isnan(arr).any():
        raise ValueError(f"{name} must not contain nan")
    if not allow_inf and np.isinf(arr).any():
        raise ValueError(f"{name} must not contain inf")
    return arr
