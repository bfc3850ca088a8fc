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


def rows_aggregate_reference(rows, n, key, aggs, emit, where=lambda r: True, time="ts", ties=()):
    """CQL ``X(SELECT key, AGG… FROM S [PARTITION BY key ROWS n] WHERE p GROUP BY key)`` over dict rows.

    At every distinct time of a partition the window holds its last ``n`` rows with time ≤ that time (rows
    in (time, ties) order); ``aggs`` are (name, column or None, "count"|"sum"|"avg"|"min"|"max") over the
    window's rows that satisfy ``where``, nulls skipped. ``emit``: "rstream" every instant, "istream" the
    values when they change, "dstream" the previous values when they change. Returns tuples
    (key values…, aggregate values…, instant).
    """
    out = []
    parts: dict = {}
    for r in sorted(rows, key=lambda r: (r[time],) + tuple(r[c] for c in ties)):
        parts.setdefault(tuple(r[c] for c in key), []).append(r)
    for k, part in parts.items():
        prev = None
        for t in sorted({r[time] for r in part}):
            window = [r for r in part if r[time] <= t][-n:]
            seen = [r for r in window if where(r)]
            cur = []
            for _, col, fn in aggs:
                vals = [1 if col is None else r[col] for r in seen]
                vals = [v for v in vals if v is not None]
                cur.append(len(vals) if fn == "count" else None if not vals else
                           {"sum": sum, "min": min, "max": max}.get(fn, lambda v: sum(v) / len(v))(vals))
            cur = tuple(cur)
            if emit == "rstream" or (emit == "istream" and cur != prev):
                out.append(k + cur + (t,))
            elif emit == "dstream" and prev is not None and cur != prev:
                out.append(k + prev + (t,))
            prev = cur
    return out
