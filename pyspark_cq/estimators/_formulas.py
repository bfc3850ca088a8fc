"""The estimators' formulas and batch loops, written once as plain Python.

The estimator classes call the scalar formulas for single updates. The batch loops at the end of
this module are written in the subset of Python that Numba compiles; :mod:`._kernels` compiles them
(and lets them call the scalar formulas), so each formula exists in one place and the compiled kernels'
on-disk cache is invalidated whenever this file changes. Only the standard library and numpy are used
here (no Numba import): the loops also run, slowly, as plain Python.
"""
from __future__ import annotations

import math

import numpy as np


def ses_step(level: float, x: float, alpha: float) -> float:
    """One step of single exponential smoothing: ``C = C·(1-α) + C_new·α``.

    Wei, Prasad, Son & Stankovic (RTStream), §4.1.3; the temporal weighting of the online average of
    the PIPES parameter d (Cammert et al., §3.2.2).
    """
    return level * (1.0 - alpha) + x * alpha


def decay_weights(count: int, decay: float) -> np.ndarray:
    """OM's decay function ``G(r) = exp(-a·r)`` for r = 0 … count-1 (Kulkarni & Ravishankar, §4.3)."""
    return np.exp(-decay * np.arange(count, dtype=np.float64))


def decay_weighted_mean(newest_first: np.ndarray, decay: float) -> float:
    """``Σ_r F(R-r)·G(r) / Σ_r G(r)`` over the observations, newest first (OM §4.3)."""
    if newest_first.size == 0:
        return math.nan
    w = decay_weights(newest_first.size, decay)
    return float(np.dot(w, newest_first) / w.sum())


def mean_distance(first: float, last: float, count: int) -> float:
    """Average distance between successive timestamps: ``(last - first) / (count - 1)``.

    PIPES's parameter d (Cammert et al., §3.2): the average time distance between successive start
    timestamps; ``1/d`` is the stream rate.
    """
    if count < 2:
        return math.nan
    return (last - first) / (count - 1)


def proportion_stderr(successes: float, size: float, population: float) -> float:
    """Standard error of a proportion from a simple random sample without replacement.

    ``sqrt((1 - m/N) · p̂(1-p̂) / (m - 1))`` with p̂ = k/m (Cochran, *Sampling Techniques*, §3.2:
    the unbiased variance estimate with the finite population correction); ``N = inf`` drops the
    correction. Used for RTStream's sampler plans (Wei et al., §4.2), which give the estimate but not
    its error.
    """
    if size < 2:
        return math.nan
    p = successes / size
    fpc = 0.0 if math.isinf(population) else size / population
    return math.sqrt(max(0.0, 1.0 - fpc) * p * (1.0 - p) / (size - 1))


def bin_index(key: float, low: float, width: float, bins: int) -> int:
    """Index of the equi-width bin of ``key`` (bins of ``width`` from ``low``), clipped to [0, bins-1]."""
    b = int(math.floor((key - low) / width))
    return 0 if b < 0 else (bins - 1 if b >= bins else b)


def equijoin_selectivity(left_counts: np.ndarray, right_counts: np.ndarray, distinct_per_bin: float) -> float:
    """Equi-join selectivity from two histograms over the same bins.

    Within a bin of V distinct key values, keys are taken as uniform, so a bin contributes
    ``n_L·n_R / V`` matching pairs; the selectivity is their sum over ``N_L·N_R`` (the histogram method
    OM uses for join selectivity, Kulkarni & Ravishankar §4.3, after Poosala 1997).
    """
    n_left, n_right = left_counts.sum(), right_counts.sum()
    if n_left == 0 or n_right == 0:
        return math.nan
    pairs = float(np.dot(left_counts.astype(np.float64), right_counts.astype(np.float64)))
    return pairs / distinct_per_bin / (float(n_left) * float(n_right))


# ---------------------------------------------------------------------------------------------
# batch loops, compiled by ._kernels


def ses_run(level, initialized, alpha, xs):
    """Apply :func:`ses_step` to every value of ``xs``; return the final level.

    When ``initialized`` is false the first value becomes the level.
    """
    start = 0
    if not initialized and xs.shape[0] > 0:
        level = xs[0]
        start = 1
    for i in range(start, xs.shape[0]):
        level = ses_step(level, xs[i], alpha)
    return level


def ring_extend(buf, pos, count, xs):
    """Append ``xs`` to the ring buffer ``buf`` (next write index ``pos``, ``count`` values held).

    Only the last ``len(buf)`` values are written. Returns the new ``(pos, count)``.
    """
    size = buf.shape[0]
    n = xs.shape[0]
    start = n - size if n > size else 0
    for i in range(start, n):
        buf[pos] = xs[i]
        pos += 1
        if pos == size:
            pos = 0
    count = min(size, count + n)
    return pos, count


def min_max_count(xs):
    """One pass: ``(min, max, len)`` of ``xs`` (``(inf, -inf, 0)`` when empty)."""
    lo = np.inf
    hi = -np.inf
    for i in range(xs.shape[0]):
        x = xs[i]
        if x < lo:
            lo = x
        if x > hi:
            hi = x
    return lo, hi, xs.shape[0]


def bernoulli_counts(xs):
    """One pass over 0/1 outcomes: ``(ones, n)``; ``(-1, i)`` at the first value that is not 0 or 1."""
    ones = 0
    for i in range(xs.shape[0]):
        x = xs[i]
        if x == 1:
            ones += 1
        elif x != 0:
            return -1, i
    return ones, xs.shape[0]


def selection_sample(population, size, uniforms, mask):
    """Simple random sampling without replacement by sequential selection (Knuth's Algorithm S).

    Element ``i`` is taken with probability ``(size - taken) / (population - i)``, using
    ``uniforms[i]``; exactly ``size`` elements end up in ``mask``, every subset equally likely.
    """
    taken = 0
    for i in range(population):
        if taken == size:
            break
        if (population - i) * uniforms[i] < size - taken:
            mask[i] = True
            taken += 1
    return taken


def bin_counts(keys, low, width, counts):
    """Add each key to its equi-width bin of ``counts`` (:func:`bin_index`)."""
    bins = counts.shape[0]
    for i in range(keys.shape[0]):
        counts[bin_index(keys[i], low, width, bins)] += 1
