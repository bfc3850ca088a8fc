"""Selectivity from a simple random sample without replacement (RTStream's sampler plans)."""
from __future__ import annotations

import math

import numpy as np

from .. import _args as chk
from . import _formulas
from ._base import Mergeable

__all__ = ["SampledSelectivity", "sample_mask"]


def _generator(rng) -> np.random.Generator:
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise TypeError(f"rng must be None, an int seed or a numpy.random.Generator, got {rng!r}")


def sample_mask(population: int, *, ratio: float | None = None, size: int | None = None,
                rng=None) -> np.ndarray:
    """A boolean mask selecting a simple random sample without replacement.

    RTStream draws its sampler plan's input "according to preset sample ratio S_r" as "a simple random
    sample without replacement" (Wei, Prasad, Son & Stankovic, §4.2). Give the ratio S_r (the sample
    size is ``round(S_r·population)``) or the sample ``size``. Sequential selection (Knuth's
    Algorithm S) picks exactly that many elements in one pass, every subset being equally likely.

    Parameters
    ----------
    population : int
        N, the number of input elements (>= 0).
    ratio : float, optional
        S_r in [0, 1].
    size : int, optional
        m in [0, N].
    rng : None, int or numpy.random.Generator
        Source of randomness.

    Examples
    --------
    The sample ratio S_r = 0.3 of 10 elements selects exactly 3 of them; which ones depends on ``rng``,
    and the same seed draws the same sample.

    >>> from pyspark_cq.estimators import sample_mask
    >>> mask = sample_mask(10, ratio=0.3, rng=0)
    >>> mask.dtype, len(mask), int(mask.sum())
    (dtype('bool'), 10, 3)
    >>> bool((sample_mask(10, ratio=0.3, rng=0) == mask).all())
    True
    >>> int(sample_mask(10, size=4, rng=1).sum())
    4
    """
    population = chk.integer(population, "population", minimum=0)
    if (ratio is None) == (size is None):
        raise ValueError("give exactly one of ratio (S_r in [0, 1]) and size (an integer sample size)")
    if ratio is not None:
        size = int(round(chk.probability(ratio, "ratio") * population))
    size = chk.integer(size, "size", minimum=0)
    if size > population:
        raise ValueError(f"size must be at most population ({population}), got {size}")
    gen = _generator(rng)
    mask = np.zeros(population, dtype=np.bool_)
    if population:
        from . import _kernels

        _kernels.selection_sample(population, size, gen.random(population), mask)
    return mask


class SampledSelectivity(Mergeable):
    """Selectivity of an operator estimated on a simple random sample without replacement.

    Feed the outcome of each sampled input (1 or True: it produced output; 0 or False: it did not).
    ``value`` is p̂ = k/m (RTStream's sampler plans, Wei et al. §4.2) and ``stderr`` its standard error
    with the finite population correction when the ``population`` size N is known (Cochran §3.2; the
    paper reports errors measured against the truth, Fig. 8, not a formula).

    Two estimators merge when their samples come from disjoint populations at the same sampling fraction
    m/N (then the pooled estimate is the stratified one), or when neither knows its population (i.i.d.
    sampling).

    Parameters
    ----------
    population : int, optional
        N, the size of the population the sample is drawn from.

    Examples
    --------
    3 of 10 inputs sampled from N = 100 produced output: p̂ = 0.3, with the standard error
    ``sqrt((1 - 10/100)·0.3·0.7/9) = sqrt(0.021) ≈ 0.1449`` and the interval ``0.3 ± 1.96·0.1449``.

    >>> from pyspark_cq.estimators import SampledSelectivity
    >>> est = SampledSelectivity(population=100)
    >>> for x in [1, 0, 0, 1, 0, 0, 1, 0, 0, 0]:
    ...     _ = est.update(x)
    >>> est.value, est.n
    (0.3, 10)
    >>> round(est.stderr, 4)
    0.1449
    >>> [round(bound, 3) for bound in est.interval()]
    [0.016, 0.584]

    A sample of 10 from another 100 inputs (the same fraction) merges into the estimate 5/20:

    >>> other = SampledSelectivity(population=100)
    >>> for x in [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]:
    ...     _ = other.update(x)
    >>> merged = est + other
    >>> merged.value, merged.n, merged.population
    (0.25, 20, 200)
    """

    _params = ("population",)

    def __init__(self, population: int | None = None):
        self.population = None if population is None else chk.integer(population, "population", minimum=1)
        self._k = 0
        self._m = 0

    def _check_compatible(self, other) -> None:
        # populations may differ (disjoint parts); the sampling fractions are checked in _merge_into
        if type(other) is not type(self):
            raise TypeError(f"other must be a {type(self).__name__}, got {type(other).__name__}")

    def _add(self, ones: int, n: int) -> None:
        if self.population is not None and self._m + n > self.population:
            raise ValueError(f"the sample exceeds the population of {self.population} elements")
        self._k += ones
        self._m += n

    def update(self, x):
        """Add the observation ``x``; returns self."""
        if isinstance(x, (bool, np.bool_)):
            x = int(x)
        if chk.real(x, "x") not in (0.0, 1.0):
            raise ValueError(f"x must be an outcome 0/1 or False/True, got {x!r}")
        self._add(int(x), 1)
        return self

    def update_many(self, xs):
        """Add the observations ``xs`` in order; returns self."""
        arr = np.asarray(xs)
        if arr.dtype == np.bool_ and arr.ndim == 1:
            arr = np.ascontiguousarray(arr).view(np.uint8)  # counted as is, without a float copy
        else:
            arr = chk.real_array(arr, "xs")
        if arr.size:
            from . import _kernels

            ones, n = _kernels.bernoulli_counts(arr)
            if ones < 0:
                raise ValueError(f"xs must hold outcomes 0/1 or False/True; xs[{n}] = {arr[n]!r}")
            self._add(int(ones), int(n))
        return self

    def _fraction(self) -> float | None:
        return None if self.population is None else self._m / self.population

    def _merge_into(self, other) -> None:
        if (self.population is None) != (other.population is None):
            raise ValueError("other must also know its population size, or neither may")
        if self.population is not None:
            if not math.isclose(self._fraction(), other._fraction(), rel_tol=1e-9, abs_tol=1e-12):
                raise ValueError("merging needs equal sampling fractions m/N; got "
                                 f"{self._fraction():.6g} and {other._fraction():.6g}")
            self.population += other.population
        self._k += other._k
        self._m += other._m

    @property
    def n(self) -> int:
        """m, the sample size."""
        return self._m

    @property
    def value(self) -> float:
        """The estimated selectivity k / m of the sampled rows (nan before any)."""
        return self._k / self._m if self._m else math.nan

    @property
    def stderr(self) -> float:
        """Standard error of ``value`` (``nan`` for a sample of fewer than two)."""
        population = math.inf if self.population is None else self.population
        return _formulas.proportion_stderr(self._k, self._m, population)

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """A normal-approximation confidence interval ``value ± z·stderr``, clipped to [0, 1]."""
        z = chk.positive(z, "z")
        half = z * self.stderr
        return max(0.0, self.value - half), min(1.0, self.value + half)
