"""The control vocabulary: the parameters a control-table entry holds, how they are validated, and which
parameters each pyspark-cq operator reads.

A control-table entry (STREAM's control table, Motwani et al., §6.1) holds, per operator, the parameters
below. Policies change them through decisions (:class:`pyspark_cq.control.Decision`), users through
:class:`pyspark_cq.control.ControlTable`; both accept exactly what :func:`validate_changes` accepts. This
module is pure (standard library, numpy and :mod:`pyspark_cq._duration`): operators, policies and the
runtime import it, and it imports none of them.

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

Two ``params`` keys have a fixed meaning: ``drop_left`` and ``drop_right`` (floats in [0, 1)) are a
two-input join's per-input drop ratios (RTStream §4.4: the ratio between the inputs' drops follows the
query's input/quality table). Each overrides ``drop_ratio`` for its input; :func:`side_drop_ratios` reads
them. An entry without them sheds both inputs by ``drop_ratio``, as before they existed.

Durations are integer microseconds (Spark's timestamp resolution); strings such as ``"30 seconds"``,
``datetime.timedelta`` and ``numpy.timedelta64`` are accepted and converted (:mod:`pyspark_cq._duration`).

An entry is generic (a user's own ``mapInPandas`` may read any parameter of it), but each pyspark-cq
operator reads only some: :data:`OPERATOR_PARAMETERS` lists them, and :func:`unread_parameters` tells
which parameters of an entry an operator would ignore — the operators reject such an entry with an error
naming the operator rather than ignore a setting silently.

Examples
--------
>>> validate_changes({"window": "30 seconds", "drop_ratio": 0})
{'window': 30000000, 'drop_ratio': 0.0}
>>> unread_parameters("sliding_aggregate", {"window": 10, "plan_id": "a>b"})
['plan_id']
"""
from __future__ import annotations

import json
import numbers
import re
from collections.abc import Mapping

import numpy as np

from .._duration import LONG_MAX, LONG_MIN, parse_duration
from ..vocabulary.operators import OPERATORS

__all__ = ["PARAMETERS", "TRANSITION_PARAMETERS", "OPERATOR_PARAMETERS", "SIDE_DROP_PARAMS", "validate_changes",
           "validate_operator_id", "duration_value", "unread_parameters", "check_reads", "drop_ratio_value",
           "side_drop_ratios"]

#: Parameters with PIPES transition semantics (§4.2): a change applies to elements from an instant on.
TRANSITION_PARAMETERS = ("window", "lower", "upper", "granularity")
#: Every parameter a control-table entry holds.
PARAMETERS = TRANSITION_PARAMETERS + ("drop_ratio", "plan_id", "params")

#: The ``params`` keys of a two-input join's per-input drop ratios (left, right).
SIDE_DROP_PARAMS = ("drop_left", "drop_right")

_OPERATOR_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-:/]*$")


def validate_operator_id(operator, name: str = "operator") -> str:
    """Check an operator id: a non-empty str of letters, digits, ``_ - : /`` (no dots: ``op.param``
    labels a parameter).
    """
    if not isinstance(operator, str) or not _OPERATOR_ID.match(operator):
        raise ValueError(f"{name} must be a non-empty operator id of letters, digits and _-:/ (no dots), "
                         f"got {operator!r}")
    return operator


def duration_value(value, name: str, *, allow_negative: bool = True, allow_zero: bool = True) -> int:
    """A duration as integer microseconds: an int is taken as microseconds, anything else goes through
    :func:`pyspark_cq._duration.parse_duration`.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a duration (int microseconds or e.g. '30 seconds'), got {value!r}")
    if isinstance(value, numbers.Integral):
        micros = int(value)
        if not LONG_MIN <= micros <= LONG_MAX:   # Spark's timestamps and intervals are longs of µs
            raise ValueError(f"{name} must fit in a 64-bit long of microseconds, got {value!r}")
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
        return drop_ratio_value(value, name)
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
        if key in SIDE_DROP_PARAMS and item is not None:
            out[key] = drop_ratio_value(item, f"{name}[{key!r}]")
    return out


def drop_ratio_value(value, name: str) -> float:
    """A drop ratio checked: a real number in [0, 1) (``name`` names it in errors), as float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1), got {value!r}")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def side_drop_ratios(params: Mapping, default: tuple[float, float]) -> tuple[float, float]:
    """A two-input join's (left, right) drop ratios from an entry's parameters.

    ``params["drop_left"]`` / ``params["drop_right"]`` (in the entry's ``params``) override ``drop_ratio``
    for their input; ``drop_ratio`` overrides ``default`` (the operator's argument) for both.

    Examples
    --------
    >>> side_drop_ratios({"drop_ratio": 0.2, "params": {"drop_right": 0.5}}, (0.0, 0.0))
    (0.2, 0.5)
    >>> side_drop_ratios({"window": 10}, (0.1, 0.3))
    (0.1, 0.3)
    """
    both = params.get("drop_ratio")
    ratios = list(default) if both is None else [drop_ratio_value(both, "drop_ratio")] * 2
    extra = params.get("params") or {}
    for i, key in enumerate(SIDE_DROP_PARAMS):
        if extra.get(key) is not None:
            ratios[i] = drop_ratio_value(extra[key], f"params[{key!r}]")
    return ratios[0], ratios[1]


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




#: The parameters each pyspark-cq operator with a control entry reads from it (``params`` is free-form: always
#: allowed), from the operators' descriptors (:mod:`pyspark_cq.vocabulary.operators`). ``plan_id`` is read by
#: the plan-switchable operators (:mod:`pyspark_cq.control.plans`).
OPERATOR_PARAMETERS = {d.kind: d.parameters for d in OPERATORS.values() if d.parameters}

#: Values of a parameter that mean "do nothing": drop no input.
_NEUTRAL = {"drop_ratio": 0.0}

_WHY_UNREAD = {
    "plan_id": "it has a single physical plan",
    "params['drop_left']": "per-input drop ratios are read by interval_join and window_join only",
    "params['drop_right']": "per-input drop ratios are read by interval_join and window_join only",
}

#: The operators that read :data:`SIDE_DROP_PARAMS`.
_TWO_INPUT_JOINS = ("interval_join", "window_join")


def unread_parameters(operator_kind: str, params: Mapping) -> list[str]:
    """The parameters set in ``params`` that an operator of ``operator_kind`` does not read, in
    :data:`PARAMETERS` order (``drop_ratio = 0`` drops nothing, so it counts as unset), then
    ``params['drop_left']`` / ``params['drop_right']`` (nonzero) on an operator other than a two-input join.

    Parameters
    ----------
    operator_kind : str
        A key of :data:`OPERATOR_PARAMETERS`, e.g. ``"sliding_aggregate"``.
    params : mapping
        An entry's parameters (``Entry.params``).
    """
    if operator_kind not in OPERATOR_PARAMETERS:
        raise ValueError(f"operator_kind must be one of {sorted(OPERATOR_PARAMETERS)}, got {operator_kind!r}")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of parameter -> value, got {params!r}")
    reads = OPERATOR_PARAMETERS[operator_kind]
    # a parameter at its neutral value changes nothing, so an operator that does not read it may ignore it
    unread = [p for p in PARAMETERS
              if p in params and p not in reads and not (p in _NEUTRAL and params[p] == _NEUTRAL[p])]
    if operator_kind not in _TWO_INPUT_JOINS:   # per-input drop ratios: only a two-input join sheds per input
        extra = params.get("params") or {}
        unread += [f"params[{k!r}]" for k in SIDE_DROP_PARAMS if extra.get(k) not in (None, 0, 0.0)]
    return unread


def check_reads(operator_kind: str, operator: str, params: Mapping, *, when: str = "") -> None:
    """Raise ValueError naming the operator when its entry sets a parameter it does not read.

    A setting the operator would ignore is an error, not a silent no-op: a policy or user that sets
    ``drop_ratio`` on an aggregation expects load to be shed.

    Parameters
    ----------
    operator_kind : str
        The operator's function name (a key of :data:`OPERATOR_PARAMETERS`).
    operator : str
        The operator id (its control-table key).
    params : mapping
        The entry's parameters.
    when : str
        Where the check runs, for the message (e.g. ``"at a micro-batch"``).
    """
    unread = unread_parameters(operator_kind, params)
    if unread:
        why = "; ".join(f"{p}: {_WHY_UNREAD.get(p, 'not a parameter of this operator')}" for p in unread)
        where = f" {when}" if when else ""
        raise ValueError(
            f"{operator_kind} {operator!r}: its control-table entry sets {', '.join(unread)}, which this operator "
            f"does not read ({why}){where}. It reads only {', '.join(OPERATOR_PARAMETERS[operator_kind])}"
            f"{' (drop_ratio 0 is accepted: it drops nothing)' if 'drop_ratio' in unread else ''}; "
            f"change the entry (ControlTable.set, or remove and register it again)")
