"""What policies trade in besides decisions: QoS ranges (PIPES §4.3), admission answers, bound checks, sizes.

A policy returns :class:`~pyspark_cq.control.Decisions`; the parameters they change and their validation
are the control vocabulary (:mod:`pyspark_cq.control.schema`). Those names are re-exported here, so a
policy imports everything it needs from :mod:`pyspark_cq.policies`. This module is pure (standard library,
numpy and :mod:`pyspark_cq.control`).
"""
from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import _human
from ..control.decision import Decision, Decisions
from ..control.schema import PARAMETERS, TRANSITION_PARAMETERS, duration_value, validate_changes, validate_operator_id

__all__ = [
    "QoSRange", "qos_values", "Admission", "parse_size", "bound_violations",
    # the control vocabulary, re-exported for policies
    "PARAMETERS", "TRANSITION_PARAMETERS", "validate_changes", "validate_operator_id", "duration_value",
    "Decision", "Decisions",
]


# ---------------------------------------------------------------------------------------------
# QoS ranges (PIPES §4.3)


def qos_values(low, high, f, *, step=None, choices: Sequence | None = None) -> np.ndarray:
    """The allowed values closest to ``low + f·(high - low)``, vectorised (PIPES §4.3).

    Cammert et al., §4.3: with ``[min, max]`` the QoS range of a window or granularity, the strategy
    sets each to "the closest allowed value next to min + f·(max − min)". Allowed values are the
    ``choices`` when given, else the multiples of ``step`` between the bounds (the bounds themselves
    are allowed too). Ties go to the lower-QoS side (towards ``low``).

    Parameters
    ----------
    low, high : float or array
        QoS minimum (lowest quality) and maximum (highest quality); ``low > high`` is allowed (a
        granularity's minimum is its coarsest, i.e. largest, value).
    f : float or array
        Fraction(s) in [0, 1].
    step : float or array, optional
        Spacing of the allowed values (default, or an entry <= 0: none, any real value).
    choices : sequence of float, optional
        Explicit allowed values (scalar ``low``/``high`` only).
    """
    low = np.asarray(low, dtype=np.float64)
    high = np.asarray(high, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    target = low + f * (high - low)
    lo, hi = np.minimum(low, high), np.maximum(low, high)
    if choices is not None:
        if low.ndim or high.ndim:
            raise ValueError("choices need scalar low and high")
        # ordered by closeness to low, so that argmin's first-of-ties rule breaks ties towards low
        allowed = np.asarray(sorted((float(c) for c in choices), key=lambda c: abs(c - float(low))))
        return allowed[np.argmin(np.abs(target[..., None] - allowed), axis=-1)]
    if step is None:
        return np.clip(target, lo, hi)
    step = np.asarray(step, dtype=np.float64)
    continuous = step <= 0
    safe = np.where(continuous, 1.0, step)
    down = np.clip(np.where(continuous, target, np.floor(target / safe) * safe), lo, hi)
    up = np.clip(np.where(continuous, target, np.ceil(target / safe) * safe), lo, hi)
    # the nearest multiple on either side, or a bound (bounds are allowed even when not multiples)
    cands = np.stack(np.broadcast_arrays(down, up, low, high))
    order = np.argsort(np.abs(cands - low), axis=0, kind="stable")   # ties go to the candidate nearest low
    cands = np.take_along_axis(cands, order, axis=0)
    best = np.argmin(np.abs(cands - target), axis=0)
    return np.take_along_axis(cands, best[None, ...], axis=0)[0]


@dataclass(frozen=True)
class QoSRange:
    """A QoS range ``[min, max]`` of one operator parameter (Cammert et al., §4.3).

    ``min`` is the lowest acceptable quality and ``max`` the highest: for a window the smallest and
    largest size; for a granularity the *coarsest* and the *finest* (the paper's convention, so
    ``min > max`` numerically); for a join's ``lower`` bound the values are negative. Values are in the
    parameter's unit (µs for durations).

    Use :meth:`window` and :meth:`granularity` to build ranges from durations.

    Parameters
    ----------
    min, max : float
        The bounds.
    step : float, optional
        Allowed values are multiples of ``step`` (the bounds themselves are allowed too). Default here:
        none (any value); :meth:`window` defaults to whole seconds when both bounds are at least 1 s,
        else whole milliseconds when both are at least 1 ms, else 1 µs; :meth:`granularity` to the
        multiples of the finest granularity.
    choices : tuple of float, optional
        Explicit allowed values instead of multiples of ``step``.
    duration : bool, optional
        The values are durations in µs (set by :meth:`window` and :meth:`granularity`): the repr shows
        them as ``30 s``, ``5 min``. Not compared.
    """

    min: float
    max: float
    step: float | None = None
    choices: tuple | None = None
    duration: bool = field(default=False, compare=False)

    def __post_init__(self):
        for name in ("min", "max"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise TypeError(f"QoSRange {name} must be a finite real number, got {value!r}")
        if self.step is not None:
            if isinstance(self.step, bool) or not isinstance(self.step, numbers.Real) or not self.step > 0:
                raise ValueError(f"QoSRange step must be a positive number or None, got {self.step!r}")
        if self.choices is not None:
            if isinstance(self.choices, (str, bytes)) or not isinstance(self.choices, Iterable):
                raise TypeError(f"QoSRange choices must be a sequence of numbers, got {self.choices!r}")
            choices = tuple(float(c) for c in self.choices)
            if not choices:
                raise ValueError("QoSRange choices must not be empty")
            lo, hi = sorted((self.min, self.max))
            outside = [c for c in choices if not lo <= c <= hi]
            if outside:
                raise ValueError(f"QoSRange choices {outside} lie outside [{lo}, {hi}]")
            object.__setattr__(self, "choices", choices)

    @classmethod
    def window(cls, min, max, *, step=None) -> QoSRange:  # noqa: A002 - the paper's names
        """A window-size range: ``min <= max`` durations (µs or strings such as ``"1 minute"``).

        ``step`` (a duration) spaces the allowed sizes; by default it is 1 second when both bounds are
        at least 1 second, else 1 millisecond when both are at least 1 millisecond, else 1 µs, so that a
        policy picks e.g. ``48 s`` rather than ``48.28125 s``. The bounds themselves are always allowed.
        """
        lo = duration_value(min, "min", allow_negative=False, allow_zero=False)
        hi = duration_value(max, "max", allow_negative=False, allow_zero=False)
        if lo > hi:
            raise ValueError(f"a window QoS range needs min <= max, got min={lo} µs, max={hi} µs")
        if step is None:
            step = next(s for s in (1_000_000, 1_000, 1) if lo >= s)
        return cls(lo, hi, duration_value(step, "step", allow_negative=False, allow_zero=False), duration=True)

    @classmethod
    def granularity(cls, coarsest, finest, *, choices=None) -> QoSRange:
        """A granularity range from ``coarsest`` (QoS min) to ``finest`` (QoS max), durations.

        Allowed values are the multiples of ``finest`` (every such granularity is coarser than the
        finest, PIPES §2.1) unless ``choices`` lists them.
        """
        coarse = duration_value(coarsest, "coarsest", allow_negative=False, allow_zero=False)
        fine = duration_value(finest, "finest", allow_negative=False, allow_zero=False)
        if coarse < fine:
            raise ValueError(f"a granularity QoS range needs coarsest >= finest, got coarsest={coarse} µs, "
                             f"finest={fine} µs")
        if choices is not None:
            choices = tuple(duration_value(c, "choices[]", allow_negative=False, allow_zero=False)
                            for c in choices)
        return cls(coarse, fine, None if choices else fine, choices, duration=True)

    def __repr__(self) -> str:
        show = _human.duration if self.duration else _human.plain
        parts = [f"min={show(self.min)}", f"max={show(self.max)}"]
        if self.step is not None:
            parts.append(f"step={show(self.step)}")
        if self.choices:
            parts.append(f"choices=({', '.join(map(show, self.choices))})")
        return f"QoSRange({', '.join(parts)})"

    def contains(self, value) -> bool:
        """Whether ``value`` lies within the range (bounds included)."""
        lo, hi = sorted((self.min, self.max))
        return lo <= value <= hi

    def value_at(self, f: float) -> float:
        """The allowed value closest to ``min + f·(max − min)`` (PIPES §4.3); see :func:`qos_values`."""
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 <= f <= 1:
            raise ValueError(f"f must be a fraction in [0, 1], got {f!r}")
        return float(qos_values(self.min, self.max, f, step=self.step, choices=self.choices))

    def to_dict(self) -> dict:
        """A JSON-able form."""
        return {"min": self.min, "max": self.max, "step": self.step,
                "choices": list(self.choices) if self.choices else None}


# ---------------------------------------------------------------------------------------------
# decisions


@dataclass(frozen=True)
class Admission:
    """A policy's answer to a new query (PIPES §4.1.1 admission control).

    ``accepted`` with the ``decisions`` that make room for it (possibly shrinking other queries within
    their QoS ranges), or rejected with the ``reason``.
    """

    accepted: bool
    reason: str = ""
    decisions: Decisions = field(default_factory=Decisions)

    def __post_init__(self):
        if not isinstance(self.accepted, bool):
            raise TypeError(f"accepted must be a bool, got {self.accepted!r}")
        if not isinstance(self.reason, str):
            raise TypeError(f"reason must be a str, got {self.reason!r}")
        if not isinstance(self.decisions, Decisions):
            raise TypeError(f"decisions must be a Decisions, got {type(self.decisions).__name__}")
        if not self.accepted and not self.reason:
            raise ValueError("a rejection needs a reason")


def bound_violations(decisions: Iterable[Decision], bounds: Mapping[str, QoSRange]) -> list[str]:
    """What in ``decisions`` breaks the declared QoS ``bounds`` (keyed ``"<operator>.<param>"``).

    A window, bound or granularity change needs a declared range and must lie inside it; a ``drop_ratio``
    must lie inside its range when one is declared. Returns one message per violation (empty: none).
    """
    out = []
    for d in decisions:
        for param, value in d.changes.items():
            key = f"{d.operator}.{param}"
            rng = bounds.get(key)
            # the transition parameters are durations (µs), a drop ratio is a fraction
            show = _human.duration if param in TRANSITION_PARAMETERS else _human.plain
            if param in TRANSITION_PARAMETERS and rng is None:
                out.append(f"{key} changed to {show(value)} without a declared QoS range")
            elif param in TRANSITION_PARAMETERS + ("drop_ratio",) and rng is not None and not rng.contains(value):
                out.append(f"{key} = {show(value)} lies outside its QoS range [{show(rng.min)}, {show(rng.max)}]")
    return out


# ---------------------------------------------------------------------------------------------
# sizes

_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
               "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value, name: str) -> float:
    """A memory size in bytes: a number, or a string such as ``"512 MB"``, ``"2 GiB"``, ``"4g"``.

    ``KB``/``MB``/``GB`` are decimal (10³ⁿ), ``KiB``/``MiB``/``GiB`` and Spark's ``k``/``m``/``g``
    binary (2¹⁰ⁿ).
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a size in bytes or a string such as '512 MB', got {value!r}")
    if isinstance(value, numbers.Real):
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite size in bytes, got {value}")
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a size in bytes or a string such as '512 MB', got {value!r}")
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS and unit != "":
        raise ValueError(f"{name} must be a size such as '512 MB', '2 GiB' or '4g', got {value!r}")
    size = float(m.group(1)) * _SIZE_UNITS.get(unit, 1)
    if size <= 0:
        raise ValueError(f"{name} must be a positive size, got {value!r}")
    return size
