"""Numbers, durations and memory sizes as text for people: the one formatter of every message, repr and report.

Durations are microseconds (the package's unit) shown in the largest unit that keeps them at least 1:
``30 s``, ``5 min``, ``1.5 s``, ``200 ms``, ``12 µs``; sizes are bytes in decimal units (``19.2 KB``,
``57.6 MB``, as :func:`pyspark_cq.policies.parse_size` reads ``KB``/``MB``); numbers have at most four
significant digits and never an exponent. Machine-readable values (JSON, the control table) stay raw
numbers; this module is for text only. Spark's interval string of a duration is
:func:`pyspark_cq._duration.format_duration`.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["plain", "duration", "size"]

_DURATION_UNITS = (("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000), ("ms", 1_000))
_SIZE_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def plain(x, digits: int = 4) -> str:
    """``x`` with at most ``digits`` significant digits and no exponent: ``0.25``, ``30000000``, ``1.235``.

    Examples
    --------
    >>> plain(3e7), plain(0.25), plain(1 / 3), plain(1.2e-05), plain(100)
    ('30000000', '0.25', '0.3333', '0.000012', '100')
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return str(x)
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    return np.format_float_positional(x, precision=digits, unique=False, fractional=False, trim="-")


def duration(micros) -> str:
    """A duration in µs as text: ``30 s``, ``5 min``, ``1.5 s``, ``200 ms``, ``-1.5 min``, ``12 µs``.

    Anything but a real number is returned as ``str``.

    Examples
    --------
    >>> duration(30_000_000), duration(300_000_000), duration(1_500_000), duration(200_000), duration(-90e6)
    ('30 s', '5 min', '1.5 s', '200 ms', '-1.5 min')
    """
    if isinstance(micros, bool) or not isinstance(micros, numbers.Real):
        return str(micros)
    if micros == 0:
        return "0 s"
    for unit, scale in _DURATION_UNITS:
        if abs(micros) >= scale:
            return f"{plain(micros / scale)} {unit}"
    return f"{plain(micros)} µs"


def size(nbytes) -> str:
    """A memory size in bytes as text: ``19.2 KB``, ``57.6 MB``, ``742 B``.

    Examples
    --------
    >>> size(19_200), size(5.76e7), size(742), size(600_000)
    ('19.2 KB', '57.6 MB', '742 B', '600 KB')
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        return str(nbytes)
    for unit, scale in _SIZE_UNITS:
        if abs(nbytes) >= scale:
            return f"{plain(nbytes / scale)} {unit}"
    return f"{plain(nbytes)} B"
