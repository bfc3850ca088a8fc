"""Join selectivity from a pair of equi-width histograms of the join key."""
from __future__ import annotations

import numpy as np

from .. import _args as chk
from . import _formulas
from ._base import Mergeable

__all__ = ["JoinSelectivityHistogram"]

SIDES = ("left", "right")


class JoinSelectivityHistogram(Mergeable):
    """Equi-join selectivity estimated from histograms of the two inputs' join keys.

    OM determines join selectivity "using a histogram based approach" (Kulkarni & Ravishankar, §4.3,
    after Poosala 1997). Keys are counted in ``bins`` equal-width bins over ``[low, high)`` per side
    (keys outside are counted in the edge bins); within a bin the keys are taken as uniform over
    ``distinct_per_bin`` values, so the estimate is ``Σ_b n_L,b·n_R,b / V / (N_L·N_R)``. With integer keys
    and one value per bin the estimate is exact. Histograms over the same bins merge by adding counts.

    Parameters
    ----------
    low, high : float
        Key range, ``low < high``.
    bins : int
        Number of bins.
    distinct_per_bin : float, optional
        V, the number of distinct key values in a bin; by default the bin width (integer keys),
        at least 1.

    Examples
    --------
    Integer keys in [0, 4), one value per bin (V = 1), so the estimate is exact: of the 4·4 pairs of the
    left keys 0, 1, 1, 2 and the right keys 1, 2, 2, 3, ``2·1 + 1·2 = 4`` match.

    >>> from pyspark_cq.estimators import JoinSelectivityHistogram
    >>> hist = JoinSelectivityHistogram(low=0, high=4, bins=4)
    >>> for key in [0, 1, 1, 2]:
    ...     _ = hist.update(key, side="left")
    >>> for key in [1, 2, 2, 3]:
    ...     _ = hist.update(key, side="right")
    >>> hist.counts["left"], hist.counts["right"]
    (array([1, 2, 1, 0]), array([0, 1, 2, 1]))
    >>> hist.value
    0.25

    Histograms over the same bins merge by adding their counts; one more left key 2 makes 6 matching
    pairs of 5·4:

    >>> more = JoinSelectivityHistogram(low=0, high=4, bins=4).update(2, side="left")
    >>> (hist + more).value
    0.3
    """

    _params = ("low", "high", "bins", "distinct_per_bin")

    def __init__(self, low: float, high: float, bins: int, distinct_per_bin: float | None = None):
        self.low = chk.real(low, "low")
        self.high = chk.real(high, "high")
        if not self.high > self.low:
            raise ValueError(f"high must be greater than low ({self.low}), got {self.high}")
        self.bins = chk.integer(bins, "bins", minimum=1)
        self.width = (self.high - self.low) / self.bins
        if distinct_per_bin is None:
            distinct_per_bin = max(1.0, self.width)
        self.distinct_per_bin = chk.positive(distinct_per_bin, "distinct_per_bin")
        self.counts = {side: np.zeros(self.bins, dtype=np.int64) for side in SIDES}

    def update(self, key, side: str = "left"):
        """Count the join key ``key`` arriving on ``side``; returns self."""
        chk.one_of(side, "side", SIDES)
        key = chk.real(key, "key")
        self.counts[side][_formulas.bin_index(key, self.low, self.width, self.bins)] += 1
        return self

    def update_many(self, keys, side: str = "left"):
        """Count the join keys ``keys`` arriving on ``side``; returns self."""
        chk.one_of(side, "side", SIDES)
        keys = chk.real_array(keys, "keys")
        if keys.size:
            from . import _kernels

            _kernels.bin_counts(keys, self.low, self.width, self.counts[side])
        return self

    def _merge_into(self, other) -> None:
        for side in SIDES:
            self.counts[side] += other.counts[side]

    @property
    def n(self) -> int:
        """Keys seen on both sides together."""
        return int(self.counts["left"].sum() + self.counts["right"].sum())

    @property
    def value(self) -> float:
        """The estimated join selectivity (``nan`` until both sides have keys)."""
        return _formulas.equijoin_selectivity(self.counts["left"], self.counts["right"], self.distinct_per_bin)
