"""Parsing of durations given as strings, ``timedelta`` or ``numpy.timedelta64``.

One place for the rule, so every duration argument of the package (operator bounds, windows, slides,
granularities, control-table values, policy ranges) means the same thing. A string means exactly what
Spark's ``CAST(s AS INTERVAL)`` / an ``INTERVAL '...'`` literal means (``IntervalUtils.stringToInterval``:
``"10 seconds"``, ``"-1 minute -30 seconds"``, ``"interval 1.5 seconds"``), or is rejected with a
ValueError naming the argument: never a different reading. The one addition are the abbreviations CQL takes
too (:data:`ABBREVIATIONS`: ``"30 s"``, ``"-2 secs"``, ``"500 ms"``, ``"5 min"``), which Spark's cast rejects,
so no string Spark reads is read differently. Months and years (no fixed length) and values
beyond a signed 64-bit count of microseconds are rejected too. The accepted forms are listed in
``docs/errors.md`` (section *Durations*). Durations are returned as integer microseconds, Spark's
timestamp resolution.
"""
from __future__ import annotations

import datetime as _dt

import numpy as np

__all__ = ["parse_duration", "format_duration", "EXPECTED", "ABBREVIATIONS", "LONG_MIN", "LONG_MAX"]

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1

_MICROS_PER_MINUTE = 60_000_000
_MICROS_PER_HOUR = 3_600_000_000
_MICROS_PER_DAY = 86_400_000_000

EXPECTED = ("a duration such as '10 seconds', '-2 minutes', '-1 minute -30 seconds', '500 ms', '1.5 s', "
            "'interval 1.5 seconds' (Spark's interval syntax and the abbreviations s, sec, ms, us, min, h; see "
            "docs/errors.md), a datetime.timedelta or a numpy.timedelta64")

# Java's Character.isWhitespace on one byte, which is what Spark's parser tests (non-ASCII spaces are not)
_WHITESPACE = frozenset(" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")
# UTF8String.trimAll, which Spark applies first, also drops ASCII control characters at both ends
_TRIMMED = "".join(map(chr, range(0x21))) + "\x7f"
_DIGITS = frozenset("0123456789")
# Spark's unit words; each may take one trailing "s"
_UNITS = ("year", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond")
#: Abbreviations, with the unit each stands for: the ones CQL takes (``pyspark_cq.lang.parser`` reads its unit
#: words from here), so a duration is written the same way in Python and in CQL. Spark's cast rejects all of
#: them, so accepting them changes the reading of no string Spark accepts.
ABBREVIATIONS = {"us": "microsecond", "ms": "millisecond", "s": "second", "sec": "second", "secs": "second",
                 "min": "minute", "mins": "minute", "h": "hour"}
_UNIT_LIST = ("microsecond, millisecond, second, minute, hour, day, week (each also with a trailing 's'), "
              "or us, ms, s, sec, secs, min, mins, h")

# the states of Spark's parser
(_TRIM_BEFORE_SIGN, _SIGN, _TRIM_BEFORE_VALUE, _VALUE, _FRACTION, _TRIM_BEFORE_UNIT, _UNIT_BEGIN, _UNIT_SUFFIX,
 _UNIT_END) = range(9)
_NANOS_SCALE = 100_000_000    # the weight of the first fractional digit, in nanoseconds


class _Invalid(Exception):
    """A string Spark's cast maps to NULL; the message says why."""


class _Overflow(_Invalid):
    """A string Spark's cast maps to NULL because a number overflows."""


def parse_duration(value, name: str = "duration", *, allow_negative: bool = True, allow_zero: bool = True) -> int:
    """Return ``value`` as integer microseconds.

    Parameters
    ----------
    value : str, datetime.timedelta or numpy.timedelta64
        The duration. A string is read as Spark's ``CAST(value AS INTERVAL)`` reads it, plus CQL's unit
        abbreviations (:data:`ABBREVIATIONS`; see ``docs/errors.md``, *Durations*); any other string Spark
        maps to NULL is rejected.
    name : str, optional
        The argument's name, used in error messages (default ``"duration"``).
    allow_negative, allow_zero : bool
        Whether negative / zero durations are accepted.

    Returns
    -------
    int
        Microseconds, within a signed 64-bit long.

    Raises
    ------
    TypeError, ValueError
        Naming ``name`` and the expected form: an invalid string, a month or year part, a value beyond a
        64-bit count of microseconds, a disallowed sign.

    Examples
    --------
    >>> parse_duration("-1 minute -30 seconds", "lower")
    -90000000
    >>> parse_duration("-1 minute 30 seconds", "lower")
    -30000000
    >>> parse_duration("INTERVAL 1.5 SECONDS", "window")
    1500000
    >>> parse_duration("-2 secs", "lower")
    -2000000
    """
    if isinstance(value, _dt.timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    elif isinstance(value, np.timedelta64):
        micros = _numpy_micros(value, name)
    elif isinstance(value, str):
        micros = _parse_text(value, name)
    else:
        raise TypeError(f"{name} must be {EXPECTED}, got {type(value).__name__} {value!r}")
    if not LONG_MIN <= micros <= LONG_MAX:
        raise ValueError(f"{name} is out of range: {value!r} is {micros} microseconds, beyond a signed 64-bit "
                         f"count of microseconds (about ±292471 years)")
    if micros < 0 and not allow_negative:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    if micros == 0 and not allow_zero:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    return micros


# numpy units: (numerator, denominator) of one unit in microseconds
_NUMPY_UNITS = {"W": (7 * _MICROS_PER_DAY, 1), "D": (_MICROS_PER_DAY, 1), "h": (_MICROS_PER_HOUR, 1),
                "m": (_MICROS_PER_MINUTE, 1), "s": (1_000_000, 1), "ms": (1_000, 1), "us": (1, 1),
                "ns": (1, 1_000), "ps": (1, 10 ** 6), "fs": (1, 10 ** 9), "as": (1, 10 ** 12)}


def _numpy_micros(value: np.timedelta64, name: str) -> int:
    """Exact microseconds of a ``numpy.timedelta64`` (``astype`` would wrap silently on overflow), sub-µs
    parts truncated toward zero as Spark truncates ``'0.0000015 seconds'``.
    """
    if np.isnat(value):
        raise ValueError(f"{name} must be {EXPECTED}, got NaT")
    unit, step = np.datetime_data(value.dtype)
    if unit in ("Y", "M"):
        raise ValueError(f"{name} is a numpy.timedelta64 in {'years' if unit == 'Y' else 'months'} ({value!r}): "
                         f"months and years have no fixed length (Spark's window() rejects them too); "
                         f"use days or weeks")
    if unit not in _NUMPY_UNITS:
        raise ValueError(f"{name} must be {EXPECTED}, got a numpy.timedelta64 without a time unit ({value!r})")
    num, den = _NUMPY_UNITS[unit]
    total = int(value.astype(np.int64)) * step * num
    magnitude = abs(total) // den
    return magnitude if total >= 0 else -magnitude


def _parse_text(text: str, name: str) -> int:
    try:
        months, days, micros = _spark_interval(text)
    except _Overflow as exc:
        raise ValueError(f"{name} is out of range: {exc} in {text!r} (Spark's CAST(... AS INTERVAL) gives NULL "
                         f"for it)") from None
    except _Invalid as exc:
        raise ValueError(f"{name} must be {EXPECTED}, got {text!r}: {exc}") from None
    if months:
        raise ValueError(f"{name} has a month or year part ({text!r}): months and years have no fixed length "
                         f"(Spark's window() rejects them too); use days or weeks")
    return days * _MICROS_PER_DAY + micros


def _exact(value: int, lo: int, hi: int, what: str) -> int:
    """Java's ``Math.*Exact``: the result, or the overflow Spark reports."""
    if not lo <= value <= hi:
        raise _Overflow(f"{what} overflows " + ("a 64-bit long" if hi == LONG_MAX else
                                                "a 32-bit int (Spark counts months and days in ints)"))
    return value


def _long(value: int, what: str) -> int:
    return _exact(value, LONG_MIN, LONG_MAX, what)


def _int(value: int, what: str) -> int:
    return _exact(value, _INT_MIN, _INT_MAX, what)


def _word(s: str, i: int) -> str:
    """The whitespace-delimited word of ``s`` at ``i``, for messages."""
    start, end = i, i
    while start > 0 and s[start - 1] not in _WHITESPACE:
        start -= 1
    while end < len(s) and s[end] not in _WHITESPACE:
        end += 1
    return repr(s[start:end])


def _spark_interval(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of ``text`` as Spark's ``IntervalUtils.stringToInterval`` computes them,
    with the same overflow checks (months and days are ints, microseconds a long); raises :class:`_Invalid`
    exactly where Spark's cast gives NULL, and also for any non-ASCII character (Spark lower-cases those
    with the JVM's default locale; rejecting them keeps the reading locale-independent).
    """
    s = text.strip(_TRIMMED)
    if not s:
        raise _Invalid("the string is empty")
    if not s.isascii():
        bad = next(c for c in s if not c.isascii())
        raise _Invalid(f"{bad!r} is not allowed (only ASCII digits, signs, unit words and whitespace; "
                       f"Spark does not treat non-ASCII spaces as spaces)")
    s = s.lower()
    n, i = len(s), 0
    if s.startswith("interval"):
        if n == len("interval"):
            raise _Invalid("nothing follows 'interval'")
        if s[len("interval")] not in _WHITESPACE:
            raise _Invalid(f"invalid prefix {_word(s, 0)}")
        i = len("interval") + 1
    state = _TRIM_BEFORE_SIGN
    months = days = micros = 0
    value = fraction = 0
    scale = -1                  # weight of the next fractional digit; -1: no decimal point seen
    negative = point_prefixed = False
    term_start = i
    while i < n:
        c = s[i]
        if state in (_TRIM_BEFORE_SIGN, _TRIM_BEFORE_VALUE, _TRIM_BEFORE_UNIT):
            if c in _WHITESPACE:
                i += 1
            else:
                state += 1      # each trim state is followed by the state it trims for
        elif state == _SIGN:
            value = fraction = 0
            scale, point_prefixed, state, term_start = -1, False, _TRIM_BEFORE_VALUE, i
            if c == "-":
                negative, i = True, i + 1
            elif c == "+":
                negative, i = False, i + 1
            elif c in _DIGITS:
                negative = False
            elif c == ".":
                negative, scale, point_prefixed, state, i = False, _NANOS_SCALE, True, _FRACTION, i + 1
            else:
                raise _Invalid(f"expected a number at {_word(s, i)}")
        elif state == _VALUE:
            if c in _DIGITS:
                value = _long(value * 10 + int(c), f"the number {_word(s, i)}")
            elif c in _WHITESPACE:
                state = _TRIM_BEFORE_UNIT
            elif c == ".":
                scale, state = _NANOS_SCALE, _FRACTION
            else:
                raise _Invalid(f"invalid number {_word(s, i)} (a space must separate a number from its unit; "
                               f"one sign per number)")
            i += 1
        elif state == _FRACTION:
            if c in _DIGITS and scale > 0:
                fraction += int(c) * scale
                scale //= 10
            elif c in _WHITESPACE and (not point_prefixed or scale < _NANOS_SCALE):
                fraction //= 1000        # nanoseconds to microseconds, truncated
                state = _TRIM_BEFORE_UNIT
            elif c in _DIGITS:
                raise _Invalid(f"at most 9 fractional digits (nanoseconds) in {_word(s, i)}")
            else:
                raise _Invalid(f"invalid number {_word(s, i)}")
            i += 1
        elif state == _UNIT_BEGIN:
            if c != "s" and scale >= 0:
                raise _Invalid(f"only seconds can have a fractional part, got {_word(s, i)}")
            if negative:
                value, fraction = -value, -fraction
            unit = next((u for u in _UNITS if s.startswith(u, i)), None)
            abbreviated = None
            if unit is None:        # a whole word after whitespace ("10s" never gets here: a gap is required)
                abbreviated = _word(s, i)[1:-1]
                unit = ABBREVIATIONS.get(abbreviated)
            word = repr(s[term_start:i] + _word(s, i)[1:-1])   # the whole term, for overflow messages
            if unit == "year":
                months = _int(months + _long(12 * value, word), word)
            elif unit == "month":
                months = _int(months + _int(value, word), word)
            elif unit == "week":
                days = _int(_long(days + _long(7 * value, word), word), word)
            elif unit == "day":
                days = _int(days + _int(value, word), word)
            elif unit == "hour":
                micros = _long(micros + _long(value * _MICROS_PER_HOUR, word), word)
            elif unit == "minute":
                micros = _long(micros + _long(value * _MICROS_PER_MINUTE, word), word)
            elif unit == "second":
                micros = _long(_long(micros + _long(value * 1_000_000, word), word) + fraction, word)
            elif unit == "millisecond":
                micros = _long(micros + _long(value * 1_000, word), word)
            elif unit == "microsecond":
                micros = _long(micros + value, word)
            else:
                raise _Invalid(f"unknown unit {_word(s, i)}; the units are {_UNIT_LIST}")
            if abbreviated is not None:     # whole word, no plural 's' to look for
                i, state = i + len(abbreviated), _UNIT_END
            else:
                i, state = i + len(unit), _UNIT_SUFFIX
        elif state == _UNIT_SUFFIX:
            if c == "s":
                state = _UNIT_END
            elif c in _WHITESPACE:
                state = _TRIM_BEFORE_SIGN
            else:
                raise _Invalid(f"unknown unit {_word(s, i)}; the units are {_UNIT_LIST}")
            i += 1
        else:  # _UNIT_END
            if c not in _WHITESPACE:
                raise _Invalid(f"unknown unit {_word(s, i)}; the units are {_UNIT_LIST}")
            i, state = i + 1, _TRIM_BEFORE_SIGN
    if state in (_UNIT_SUFFIX, _UNIT_END, _TRIM_BEFORE_SIGN):
        return months, days, micros
    if state == _TRIM_BEFORE_VALUE:
        raise _Invalid("a number is missing after the last sign")
    raise _Invalid("a unit is missing after the last number")


def format_duration(micros: int) -> str:
    """Format microseconds as the shortest exact Spark interval string, e.g. ``'90 seconds'``."""
    if not isinstance(micros, (int, np.integer)):
        raise TypeError(f"micros must be an integer number of microseconds, got {micros!r}")
    micros = int(micros)
    if micros == LONG_MIN:      # Spark's parser reads one number at most LONG_MAX
        return f"{LONG_MIN + 1} microseconds -1 microsecond"
    for unit, size in (("days", 86_400_000_000), ("hours", 3_600_000_000), ("minutes", 60_000_000),
                       ("seconds", 1_000_000), ("milliseconds", 1_000)):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} microseconds"
