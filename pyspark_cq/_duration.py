"""Parsing of durations given as strings, ``timedelta`` or ``numpy.timedelta64``.

One place for the rule, so every operator accepts the same forms: ``"10 seconds"``, ``"-10 seconds"``,
``"1 minute 30 seconds"``, ``"500 ms"``, ``"interval 2 minutes"`` (Spark's literal), ``timedelta(...)``.
Durations are returned as integer microseconds, Spark's timestamp resolution.
"""
from __future__ import annotations

import datetime as _dt
import re

import numpy as np

_UNITS = {
    "us": 1, "usec": 1, "usecs": 1, "microsecond": 1, "microseconds": 1,
    "ms": 1_000, "msec": 1_000, "msecs": 1_000, "millisecond": 1_000, "milliseconds": 1_000,
    "s": 1_000_000, "sec": 1_000_000, "secs": 1_000_000, "second": 1_000_000, "seconds": 1_000_000,
    "m": 60_000_000, "min": 60_000_000, "mins": 60_000_000, "minute": 60_000_000, "minutes": 60_000_000,
    "h": 3_600_000_000, "hour": 3_600_000_000, "hours": 3_600_000_000,
    "d": 86_400_000_000, "day": 86_400_000_000, "days": 86_400_000_000,
    "week": 604_800_000_000, "weeks": 604_800_000_000,
}
_TERM = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")

EXPECTED = ("a duration such as '10 seconds', '-2 minutes', '1 minute 30 seconds', '500 ms', "
            "a datetime.timedelta or a numpy.timedelta64")


def parse_duration(value, name: str, *, allow_negative: bool = True, allow_zero: bool = True) -> int:
    """Return ``value`` as integer microseconds.

    Parameters
    ----------
    value : str, datetime.timedelta or numpy.timedelta64
        The duration.
    name : str
        The argument's name, used in error messages.
    allow_negative, allow_zero : bool
        Whether negative / zero durations are accepted.

    Raises
    ------
    TypeError, ValueError
        Naming ``name`` and the expected form.
    """
    if isinstance(value, _dt.timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    elif isinstance(value, np.timedelta64):
        if np.isnat(value):
            raise ValueError(f"{name} must be {EXPECTED}, got NaT")
        micros = int(value.astype("timedelta64[us]").astype(np.int64))
    elif isinstance(value, str):
        micros = _parse_text(value, name)
    else:
        raise TypeError(f"{name} must be {EXPECTED}, got {type(value).__name__} {value!r}")
    if micros < 0 and not allow_negative:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    if micros == 0 and not allow_zero:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    return micros


def _parse_text(text: str, name: str) -> int:
    body = text.strip()
    if body.lower().startswith("interval"):
        body = body[len("interval"):]
    pos, total, terms = 0, 0, 0
    sign = 1
    stripped = body.strip()
    if stripped.startswith("-") and not _TERM.fullmatch(stripped):
        # "-1 minute 30 seconds": a leading sign applies to the whole compound duration
        sign, body = -1, stripped[1:]
    while pos < len(body):
        m = _TERM.match(body, pos)
        if not m or m.end() == pos:
            raise ValueError(f"{name} must be {EXPECTED}, got {text!r}")
        unit = _UNITS.get(m.group(2).lower())
        if unit is None:
            raise ValueError(f"{name} has an unknown time unit {m.group(2)!r} in {text!r}; "
                             f"use one of: microseconds, milliseconds, seconds, minutes, hours, days, weeks")
        number = m.group(1)
        if "." in number:
            whole, frac = number.lstrip("+-").split(".")
            magnitude = int(whole) * unit + round(int(frac) * unit / 10 ** len(frac))
            total += -magnitude if number.startswith("-") else magnitude
        else:
            total += int(number) * unit
        terms += 1
        pos = m.end()
    if terms == 0:
        raise ValueError(f"{name} must be {EXPECTED}, got {text!r}")
    return sign * total


def format_duration(micros: int) -> str:
    """Format microseconds as the shortest exact Spark interval string, e.g. ``'90 seconds'``."""
    if not isinstance(micros, (int, np.integer)):
        raise TypeError(f"micros must be an integer number of microseconds, got {micros!r}")
    for unit, size in (("days", 86_400_000_000), ("hours", 3_600_000_000), ("minutes", 60_000_000),
                       ("seconds", 1_000_000), ("milliseconds", 1_000)):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} microseconds"
