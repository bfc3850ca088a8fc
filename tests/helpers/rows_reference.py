"""Plain-Python reference of ``cq.rows_window`` (CQL ``[PARTITION BY … ROWS n]`` as insertions / deletions)."""
from __future__ import annotations


def rows_window_reference(batches, n, key, time="ts", ties=()):
    """Insertions and deletions of the per-partition ``ROWS n`` window over micro-batches of dict rows.

    Within a batch rows are taken in (time, ties) order; a row older than its partition's newest kept row
    is late (skipped); rows with a null time are malformed (skipped). Returns (events, late, malformed):
    events are (row as a sorted tuple of items, sign, at).
    """
    kept: dict = {}
    events, late, malformed = [], 0, 0
    for batch in batches:
        good = [r for r in batch if r[time] is not None]
        malformed += len(batch) - len(good)
        good.sort(key=lambda r: (r[time],) + tuple(r[c] for c in ties))
        for r in good:
            window = kept.setdefault(tuple(r[c] for c in key), [])
            if window and r[time] < window[-1][time]:
                late += 1
                continue
            window.append(r)
            events.append((tuple(sorted(r.items())), 1, r[time]))
            if len(window) > n:
                gone = window.pop(0)
                events.append((tuple(sorted(gone.items())), -1, r[time]))
    return events, late, malformed
