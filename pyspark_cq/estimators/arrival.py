"""Arrival rate and mean time distance d of a stream, from its timestamps."""
from __future__ import annotations

import math

from .. import _args as chk
from . import _formulas
from ._base import Mergeable

__all__ = ["ArrivalRate", "MeanDistance"]


class ArrivalRate(Mergeable):
    """Average arrival rate ``1/d`` from element timestamps (elements per time unit).

    d is the average distance between successive timestamps, ``(last - first)/(n - 1)``: the PIPES
    parameter d of a source stream, "computed by online average" (Cammert et al., §3.2.2); OM and
    RTStream use the rate λ (Kulkarni & Ravishankar §3; Wei et al. §4). Timestamps may come in any
    order (only the first, the last and the count matter), so estimators of disjoint parts of one
    stream — e.g. Spark partitions of a micro-batch — merge exactly. For a rate that follows changes,
    feed per-batch values into :class:`ExponentialSmoothing`.

    Examples
    --------
    Timestamps 0, 2, 4, 6, 8 lie on average ``d = (8 - 0)/4 = 2`` apart: the rate is ``1/d = 0.5``. Two
    estimators of disjoint parts of the stream, fed in any order, merge into the same estimate.

    >>> from pyspark_cq.estimators import ArrivalRate
    >>> first, second = ArrivalRate(), ArrivalRate()
    >>> for t in [0, 2, 4]:
    ...     _ = first.update(t)
    >>> for t in [8, 6]:
    ...     _ = second.update(t)
    >>> both = first + second
    >>> both.n, both.span, both.mean_distance, both.value
    (5, 8.0, 2.0, 0.5)
    """

    def __init__(self):
        self._first = math.inf
        self._last = -math.inf
        self._n = 0

    def update(self, x):
        """Add the observation ``x``; returns self."""
        x = chk.real(x, "x")
        self._first = min(self._first, x)
        self._last = max(self._last, x)
        self._n += 1
        return self

    def update_many(self, xs):
        """Add the observations ``xs`` in order; returns self."""
        xs = chk.real_array(xs, "xs")
        if xs.size:
            from . import _kernels

            lo, hi, n = _kernels.min_max_count(xs)
            self._first = min(self._first, float(lo))
            self._last = max(self._last, float(hi))
            self._n += int(n)
        return self

    def _merge_into(self, other) -> None:
        self._first = min(self._first, other._first)
        self._last = max(self._last, other._last)
        self._n += other._n

    @property
    def n(self) -> int:
        """The number of observations so far."""
        return self._n

    @property
    def span(self) -> float:
        """Time between the first and the last timestamp (``nan`` before two elements)."""
        return self._last - self._first if self._n >= 2 else math.nan

    @property
    def mean_distance(self) -> float:
        """d: the average time distance between successive elements."""
        return _formulas.mean_distance(self._first, self._last, self._n)

    @property
    def value(self) -> float:
        """The arrival rate, 1 / mean distance (nan before two observations)."""
        d = self.mean_distance
        if math.isnan(d):
            return math.nan
        return math.inf if d == 0 else 1.0 / d


class MeanDistance(ArrivalRate):
    """The same statistic as :class:`ArrivalRate`, with ``value`` the mean distance d (PIPES §3.2).

    Examples
    --------
    >>> from pyspark_cq.estimators import MeanDistance
    >>> est = MeanDistance()
    >>> for t in [0, 2, 4, 6, 8]:
    ...     _ = est.update(t)
    >>> est.value
    2.0
    """

    @property
    def value(self) -> float:
        """The mean distance between arrivals (nan before two observations)."""
        return self.mean_distance
