"""A plain-Python reference of CQL's aggregate over a join (docs/cql.md, "Aggregates over joins").

STREAM §2 (Motwani et al.): a query producing a relation has at instant τ the answer of the relational query
over its inputs' windows at τ; RSTREAM emits that relation at every instant it is evaluated. With ``[RANGE w
SLIDE s]`` the window evaluated at instant ``e`` (a window end, ``e ≡ w (mod s)``) holds the tuples with
timestamp in ``[e − w, e)``. This enumerates the instants one by one, takes both windows, joins them by brute
force and aggregates: no interval arithmetic shared with the compiler.
"""
from __future__ import annotations

from collections import defaultdict


def join_aggregate_reference(left, right, key, left_window, right_window, slide, where=None):
    """{(key, instant e): (COUNT(*), AVG(right["w"]))} over the pairs in both windows at ``e``.

    ``left`` / ``right`` are lists of dicts with integer microsecond ``"t"``; ``where(l, r)`` filters pairs.
    """
    if not left or not right:
        return {}
    times = [r["t"] for r in left + right]
    offset = left_window % slide
    e = min(times) - (min(times) - offset) % slide
    out = {}
    while e <= max(times) + max(left_window, right_window) + slide:
        wl = [r for r in left if e - left_window <= r["t"] < e]
        wr = [r for r in right if e - right_window <= r["t"] < e]
        groups = defaultdict(list)
        for lrow in wl:
            for rrow in wr:
                if lrow[key] == rrow[key] and (where is None or where(lrow, rrow)):
                    groups[lrow[key]].append(rrow["w"])
        for k, ws in groups.items():
            out[(k, e)] = (len(ws), sum(ws) / len(ws))
        e += slide
    return out
