"""Generated streams that adhere to STREAM's arrival constraints (Motwani, Widom et al., §5.2), and their
adherence parameter measured.

STREAM §5.2: a stream is clustered by a key "within a tolerance parameter k: no more than k tuples with a different
orderID appear between two tuples with same orderID"; ordered arrival is the analogue for key order. The
generators build a perfectly clustered (or ordered) key sequence and displace each row by a random number of
positions below ``jitter``; :func:`clustered_k` and :func:`ordered_k` measure the smallest k the result adheres to
(plain loops: the oracle the operator's per-shard bookkeeping is tested against). Used by the tests and by
benchmarks/perf/join_constraints.py.
"""
from __future__ import annotations

import numpy as np

__all__ = ["displaced", "clustered_keys", "ordered_keys", "clustered_k", "ordered_k"]


def displaced(keys: np.ndarray, jitter: int, rng: np.random.Generator) -> np.ndarray:
    """``keys`` with each row moved back by a random number of positions in ``[0, jitter)`` (a stable sort by
    position + offset); ``jitter`` <= 1 keeps the order.
    """
    keys = np.asarray(keys)
    if jitter <= 1 or len(keys) == 0:
        return keys.copy()
    offset = rng.integers(0, jitter, len(keys))
    return keys[np.argsort(np.arange(len(keys)) + offset, kind="stable")]


def clustered_keys(keys: np.ndarray, counts: np.ndarray, jitter: int, rng: np.random.Generator) -> np.ndarray:
    """Each of ``keys`` repeated ``counts`` times, the repeats adjacent, then :func:`displaced`."""
    return displaced(np.repeat(np.asarray(keys), np.asarray(counts)), jitter, rng)


def ordered_keys(keys: np.ndarray, jitter: int, rng: np.random.Generator) -> np.ndarray:
    """``keys`` sorted, then :func:`displaced`."""
    return displaced(np.sort(np.asarray(keys)), jitter, rng)


def clustered_k(keys) -> int:
    """The smallest k the sequence is clustered with: the most rows between two consecutive rows of one key."""
    last, k = {}, 0
    for i, key in enumerate(keys):
        key = key.item() if hasattr(key, "item") else key
        if key in last:
            k = max(k, i - last[key] - 1)
        last[key] = i
    return k


def ordered_k(keys) -> int:
    """The smallest k the sequence is ordered with: every row more than k rows after another has a key >= its key,
    so k = the largest distance ``m - i`` with ``i < m`` and ``keys[i] > keys[m]``.
    """
    keys = list(keys)
    top, k = [], 0   # top[i]: the largest key of rows 0..i (non-decreasing)
    for m, key in enumerate(keys):
        # the first row whose running maximum exceeds this key: the farthest row before it with a larger key
        lo, hi = 0, len(top)
        while lo < hi:
            mid = (lo + hi) // 2
            if top[mid] > key:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(top):
            k = max(k, m - lo)
        top.append(key if not top else max(top[-1], key))
    return k
