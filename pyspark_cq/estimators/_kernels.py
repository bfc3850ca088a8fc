"""Numba kernels for batch updates of the estimators.

Importing this module imports Numba, so the estimator classes import it only inside ``update_many``
(and the sampler): plain ``update`` calls never load Numba. Kernels are compiled on first call
(no eager signatures) and cached on disk (``cache=True``; set ``NUMBA_CACHE_DIR`` to a writable
directory on Spark workers whose package directory is read-only).

The scalar formulas come from :mod:`._formulas` and are compiled here, not written again.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import _formulas

_ses_step = njit(cache=True)(_formulas.ses_step)
_bin_index = njit(cache=True)(_formulas.bin_index)


@njit(cache=True)
def ses_run(level, initialized, alpha, xs):
    """Apply :func:`._formulas.ses_step` to every value of ``xs``; return the final level.

    When ``initialized`` is false the first value becomes the level.
    """
    start = 0
    if not initialized and xs.shape[0] > 0:
        level = xs[0]
        start = 1
    for i in range(start, xs.shape[0]):
        level = _ses_step(level, xs[i], alpha)
    return level


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def bin_counts(keys, low, width, counts):
    """Add each key to its equi-width bin of ``counts`` (bins start at ``low``); clip to the edge bins."""
    bins = counts.shape[0]
    for i in range(keys.shape[0]):
        counts[_bin_index(keys[i], low, width, bins)] += 1
