"""The vocabulary shared by policies, the control table and the operators: parameters, QoS ranges, decisions.

A control-table entry (STREAM's control table, Motwani et al., §6.1) holds, per operator, the parameters
below. A policy's :class:`Decision` changes some of them; :class:`~pyspark_cq.runtime.control.ControlTable`
accepts exactly what :func:`validate_changes` accepts, so a decision that constructs is a decision the
control table can apply. This module is pure (standard library and :mod:`pyspark_cq._duration`): the
operators reach it through the control-table reader on Spark's Python workers.

=============  ==============================  ==================================================
parameter      value                           meaning
=============  ==============================  ==================================================
window         duration > 0 (µs)               window size ω (PIPES §2.4.2); a transition
                                               parameter: new elements only (§4.2)
lower, upper   duration (µs, any sign)         bounds of an interval join,
                                               ``right.t ∈ [left.t + lower, left.t + upper]``;
                                               transition parameters like ``window``
granularity    duration > 0 (µs)               time granularity Γ / slide (PIPES §2.4.3);
                                               refined only at instants of the coarser one
drop_ratio     float in [0, 1)                 share of input dropped by load shedding
                                               (STREAM §4, RTStream §4.4)
plan_id        non-empty str                   the physical plan to run (plan choice)
params         dict str -> JSON value          free-form operator parameters; ``None`` deletes
=============  ==============================  ==================================================

Durations are integer microseconds (Spark's timestamp resolution); strings such as ``"30 seconds"``,
``datetime.timedelta`` and ``numpy.timedelta64`` are accepted and converted (:mod:`pyspark_cq._duration`).
"""
from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._duration import parse_duration

__all__ = [
    "PARAMETERS", "TRANSITION_PARAMETERS", "validate_changes", "validate_operator_id", "duration_value",
    "QoSRange", "qos_values", "Decision", "Decisions", "Admission", "parse_size", "bound_violations",
]

#: Parameters with PIPES transition semantics (§4.2): a change applies to elements from an instant on.
TRANSITION_PARAMETERS = ("window", "lower", "upper", "granularity")
#: Every parameter a control-table entry holds.
PARAMETERS = TRANSITION_PARAMETERS + ("drop_ratio", "plan_id", "params")

_OPERATOR_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-:/]*$")


def validate_operator_id(operator, name: str = "operator") -> str:
    """Check an operator id: a non-empty str of letters, digits, ``_ - : /`` (no dots: ``op.param``
    labels a parameter)."""
    if not isinstance(operator, str) or not _OPERATOR_ID.match(operator):
        raise ValueError(f"{name} must be a non-empty operator id of letters, digits and _-:/ (no dots), "
                         f"got {operator!r}")
    return operator


def duration_value(value, name: str, *, allow_negative: bool = True, allow_zero: bool = True) -> int:
    """A duration as integer microseconds: an int is taken as microseconds, anything else goes through
    :func:`pyspark_cq._duration.parse_duration`."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a duration (int microseconds or e.g. '30 seconds'), got {value!r}")
    if isinstance(value, numbers.Integral):
        micros = int(value)
        if micros < 0 and not allow_negative:
            raise ValueError(f"{name} must be a positive duration, got {value!r}")
        if micros == 0 and not allow_zero:
            raise ValueError(f"{name} must be a positive duration, got {value!r}")
        return micros
    if isinstance(value, float) and value.is_integer():
        return duration_value(int(value), name, allow_negative=allow_negative, allow_zero=allow_zero)
    return parse_duration(value, name, allow_negative=allow_negative, allow_zero=allow_zero)


def _json_value(value, name: str):
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be JSON-serialisable (str, number, bool, None, list, dict), "
                        f"got {value!r}: {exc}") from None
    return value


def _one(param: str, value, where: str):
    name = f"{where}{param}"
    if param == "window":
        return duration_value(value, name, allow_negative=False, allow_zero=False)
    if param in ("lower", "upper"):
        return duration_value(value, name)
    if param == "granularity":
        return duration_value(value, name, allow_negative=False, allow_zero=False)
    if param == "drop_ratio":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number in [0, 1), got {value!r}")
        value = float(value)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
        return value
    if param == "plan_id":
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name} must be a non-empty str, got {value!r}")
        return value
    # params
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of str -> JSON value, got {value!r}")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name} keys must be non-empty str, got {key!r}")
        out[key] = _json_value(item, f"{name}[{key!r}]")
    return out


def validate_changes(changes: Mapping, *, where: str = "") -> dict:
    """Validate and normalise parameter changes for one operator.

    Parameters
    ----------
    changes : mapping str -> value
        Parameter name (one of :data:`PARAMETERS`) to new value.
    where : str
        Prefix of error messages (e.g. ``"decision for 'join1': "``).

    Returns
    -------
    dict
        The changes with durations as integer microseconds and ``drop_ratio`` as float.

    Raises
    ------
    TypeError, ValueError
        Naming the bad key or value and the expected form.
    """
    if not isinstance(changes, Mapping):
        raise TypeError(f"{where}changes must be a mapping of parameter -> value, got {changes!r}")
    if not changes:
        raise ValueError(f"{where}changes must change at least one parameter of {PARAMETERS}")
    out = {}
    for param, value in changes.items():
        if param not in PARAMETERS:
            raise ValueError(f"{where}unknown parameter {param!r}; known parameters: {', '.join(PARAMETERS)}")
        if value is None:
            raise ValueError(f"{where}{param} must not be None (set a value; for params, None inside the "
                             f"dict deletes a key)")
        out[param] = _one(param, value, where)
    lower, upper = out.get("lower"), out.get("upper")
    if lower is not None and upper is not None and lower > upper:
        raise ValueError(f"{where}lower must be <= upper, got lower={lower} µs, upper={upper} µs")
    return out


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
        Allowed values are multiples of ``step`` (default: 1 µs for windows and bounds, the finest
        granularity for granularities).
    choices : tuple of float, optional
        Explicit allowed values instead of multiples of ``step``.
    """

    min: float
    max: float
    step: float | None = None
    choices: tuple | None = None

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
    def window(cls, min, max, *, step=1) -> "QoSRange":  # noqa: A002 - the paper's names
        """A window-size range: ``min <= max`` durations (µs or strings such as ``"1 minute"``)."""
        lo = duration_value(min, "min", allow_negative=False, allow_zero=False)
        hi = duration_value(max, "max", allow_negative=False, allow_zero=False)
        if lo > hi:
            raise ValueError(f"a window QoS range needs min <= max, got min={lo} µs, max={hi} µs")
        return cls(lo, hi, duration_value(step, "step", allow_negative=False, allow_zero=False))

    @classmethod
    def granularity(cls, coarsest, finest, *, choices=None) -> "QoSRange":
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
        return cls(coarse, fine, None if choices else fine, choices)

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
class Decision:
    """One change of one operator's control-table entry.

    Parameters
    ----------
    operator : str
        The operator id (its control-table key).
    changes : mapping str -> value
        Parameter changes, validated by :func:`validate_changes`.
    reason : str
        Why (logged with the change).
    query : str, optional
        The query the operator belongs to.
    at : int, optional
        Application time (µs) from which a window / bound / granularity change applies to new
        elements (PIPES §4.2); default: the control table's clock when the change is applied.
    """

    operator: str
    changes: Mapping = field(default_factory=dict)
    reason: str = ""
    query: str | None = None
    at: int | None = None

    def __post_init__(self):
        validate_operator_id(self.operator)
        where = f"decision for {self.operator!r}: "
        object.__setattr__(self, "changes", validate_changes(self.changes, where=where))
        if not isinstance(self.reason, str):
            raise TypeError(f"{where}reason must be a str, got {self.reason!r}")
        if self.query is not None and not isinstance(self.query, str):
            raise TypeError(f"{where}query must be a str or None, got {self.query!r}")
        if self.at is not None:
            object.__setattr__(self, "at", duration_value(self.at, f"{where}at"))

    def to_dict(self) -> dict:
        """A JSON-able form."""
        return {"operator": self.operator, "changes": dict(self.changes), "reason": self.reason,
                "query": self.query, "at": self.at}


class Decisions(Sequence):
    """An immutable, ordered collection of :class:`Decision` made by one policy in one round.

    Equal when the decisions and the policy name are equal (the check suite compares them for
    determinism). Two decisions for the same operator are allowed; they are applied in order.
    """

    __slots__ = ("_items", "policy")

    def __init__(self, items: Iterable[Decision] = (), policy: str | None = None):
        items = tuple(items)
        for i, d in enumerate(items):
            if not isinstance(d, Decision):
                raise TypeError(f"items[{i}] must be a Decision, got {type(d).__name__}")
        if policy is not None and not isinstance(policy, str):
            raise TypeError(f"policy must be a str or None, got {policy!r}")
        self._items = items
        self.policy = policy

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self._items)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Decisions):
            return NotImplemented
        return self._items == other._items and self.policy == other.policy

    __hash__ = None  # decisions hold dicts of changes: compared, never hashed

    def __repr__(self) -> str:
        return f"Decisions({list(self._items)!r}, policy={self.policy!r})"

    def __reduce__(self):
        return (Decisions, (self._items, self.policy))

    def operators(self) -> list[str]:
        """Operator ids touched, in order of first appearance."""
        return list(dict.fromkeys(d.operator for d in self._items))

    def to_list(self) -> list[dict]:
        """A JSON-able form."""
        return [d.to_dict() for d in self._items]


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
            if param in TRANSITION_PARAMETERS and rng is None:
                out.append(f"{key} changed to {value} without a declared QoS range")
            elif param in TRANSITION_PARAMETERS + ("drop_ratio",) and rng is not None and not rng.contains(value):
                out.append(f"{key} = {value} lies outside its QoS range [{rng.min}, {rng.max}]")
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
