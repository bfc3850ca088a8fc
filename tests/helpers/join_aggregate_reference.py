"""A plain-Python reference of CQL's aggregate over a join (docs/cql.md, "Aggregates over joins").

STREAM §2 (Motwani et al.): a query producing a relation has at instant τ the answer of the relational query
over its inputs' windows at τ; RSTREAM emits that relation at every instant it is evaluated. With ``[RANGE w
SLIDE s]`` the window evaluated at instant ``e`` (a window end, ``e ≡ w (mod s)``) holds the tuples with
timestamp in ``[e − w, e)``. This enumerates the instants one by one, takes both windows, joins them by brute
force and aggregates: no interval arithmetic shared with the compiler.
"""
from __future__ import annotations

import itertools
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


def windowed_join_count_reference(left, right, key, left_window, right_window, window, slide):
    """{(key, window end e): COUNT(*)} of CQL's ``(ISTREAM(SELECT key FROM L [RANGE wl], R [RANGE wr] WHERE
    L.key = R.key)) J [RANGE window SLIDE slide]`` grouped by key: the join's tuples (each pair whose windows
    overlap, at the later of its two timestamps), then Spark's windows ``[e − window, e)``, ``e ≡ window (mod
    slide)``, by enumeration.
    """
    stream = [(lrow[key], max(lrow["t"], rrow["t"])) for lrow in left for rrow in right
              if lrow[key] == rrow[key] and lrow["t"] < rrow["t"] + right_window and rrow["t"] < lrow["t"] + left_window]
    if not stream:
        return {}
    times = [t for _, t in stream]
    e = min(times) - (min(times) - window % slide) % slide
    out = defaultdict(int)
    while e <= max(times) + window + slide:
        for k, t in stream:
            if e - window <= t < e:
                out[(k, e)] += 1
        e += slide
    return dict(out)


def multi_join_aggregate_reference(inputs, key, windows, slide, value, where=None):
    """{(key, instant e): (COUNT(*), AVG(value))} over the tuples of a join of any number of streams in all windows
    at ``e`` (CQL §2, as :func:`join_aggregate_reference` for two).

    ``inputs``: per stream a list of dicts with integer microsecond ``"t"``; ``windows``: per stream its RANGE (µs);
    ``value``: ``(stream index, column)`` averaged; ``where(*rows)`` filters tuples. Instant by instant: every
    window's rows, their product (nested loops) with equal keys, the aggregates.
    """
    if not all(inputs):
        return {}
    times = [r["t"] for rows in inputs for r in rows]
    offset = windows[0] % slide
    e = min(times) - (min(times) - offset) % slide
    out = {}
    while e <= max(times) + max(windows) + slide:
        current = [[r for r in rows if e - w <= r["t"] < e] for rows, w in zip(inputs, windows)]
        groups = defaultdict(list)
        for combo in itertools.product(*current):
            if len({r[key] for r in combo}) == 1 and (where is None or where(*combo)):
                groups[combo[0][key]].append(combo[value[0]][value[1]])
        for k, vs in groups.items():
            out[(k, e)] = (len(vs), sum(vs) / len(vs))
        e += slide
    return out
