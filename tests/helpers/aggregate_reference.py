"""Plain-Python references for sliding_aggregate, and checks of the references themselves.

- :func:`pipes_algorithm1`: PIPES Algorithm 1 (Cammert et al., §2.4.1) written out line by line, over
  elements with validity intervals, for the ``emit="changes"`` output;
- :func:`spark_windows` / :func:`spark_stream_windows`: Spark's ``groupBy(window(t, W, S), key)``
  semantics in batch and in append-mode streaming (late (row, window) pairs dropped against the
  previous batch's watermark, windows emitted once the current watermark reaches their end).

The tests import it as ``helpers.aggregate_reference``; its own checks are in tests/test_aggregate_reference.py.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


def finalize(values, aggs):
    """Aggregates of a multiset of rows (dicts) as Spark computes them; ``aggs`` is [(column, agg)]."""
    out = []
    for column, agg in aggs:
        if column == "*":
            out.append(len(values))
            continue
        xs = [r[column] for r in values if r[column] is not None]
        if agg == "count":
            out.append(len(xs))
        elif not xs:
            out.append(None)
        elif agg == "sum":
            out.append(sum(xs))
        elif agg == "avg":
            out.append(sum(xs) / len(xs))
        elif agg in ("min", "max"):
            nans = [x for x in xs if isinstance(x, float) and math.isnan(x)]
            rest = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
            if agg == "max":
                out.append(nans[0] if nans else max(rest))      # Spark orders NaN above everything
            else:
                out.append(min(rest) if rest else nans[0])
        else:
            raise ValueError(agg)
    return tuple(out)


def floor_to(t: int, g: int) -> int:
    return (t // g) * g


def windows_of(t, window, slide):
    """The (start, end) of every sliding window (Spark's ``window()``) that holds time ``t``."""
    return [(k * slide, k * slide + window) for k in range((t - window) // slide + 1, t // slide + 1)]


def spark_windows(rows, time, key, window, slide, aggs, granularity=None):
    """{(start, end, key): aggregates} of Spark's windowed aggregation over ``rows`` (dicts).

    With a ``granularity`` the time of each row is first rounded down to it (sliding_aggregate's
    semantics for a coarser granularity).
    """
    buckets: dict = {}
    for r in rows:
        t = r[time]
        if t is None:
            continue
        if granularity:
            t = floor_to(t, granularity)
        for start, end in windows_of(t, window, slide):
            buckets.setdefault((start, end, r[key] if key else None), []).append(r)
    return {w: finalize(v, aggs) for w, v in buckets.items()}


def watermarks(batches, time, delay):
    """Spark's per-batch watermark: max event time of earlier batches minus the delay, never decreasing."""
    wms, wm, top = [], 0, None
    for batch in batches:
        wms.append(wm)
        times = [r[time] for r in batch if r[time] is not None]
        if times:
            top = max(times) if top is None else max(top, max(times))
            wm = max(wm, top - delay)
    wms.append(wm)  # the no-data batch Spark runs after the last one
    return wms


def spark_stream_windows(batches, time, key, window, slide, aggs, delay, granularity=None):
    """Rows Spark's append-mode windowed aggregation emits over micro-batches ``batches``.

    Per batch b: a (row, window) pair is dropped when window end <= wm[b-1] (the late-event
    watermark); windows with end <= wm[b] are then emitted and removed. Returns (emitted dict,
    number of rows whose every window was late).
    """
    wms = watermarks(batches, time, delay)
    open_: dict = {}
    out: dict = {}
    late_rows = 0
    for b, batch in enumerate(batches + [[]]):
        late_wm = wms[b - 1] if b > 0 else 0
        for r in batch:
            t = r[time]
            if t is None:
                continue
            if granularity:
                t = floor_to(t, granularity)
            live = [w for w in windows_of(t, window, slide) if w[1] > late_wm]
            if not live:
                late_rows += 1
            for w in live:
                open_.setdefault((w[0], w[1], r[key] if key else None), []).append(r)
        for w in [w for w in open_ if w[1] <= wms[b]]:
            out[w] = finalize(open_.pop(w), aggs)
    return out, late_rows


def pipes_algorithm1(elements, agg):
    """PIPES Algorithm 1 (scalar aggregation for distributive aggregates), verbatim.

    ``elements`` are ``(e, t_s, t_e)`` ordered by ``t_s``; ``agg(a, e)`` with ``a = None`` for ⊥.
    Returns the output stream ``[(a, t_s, t_e)]`` including the final flush of a finite input.
    """
    state: list = []
    output: list = []
    for e, ts, te in elements:
        for t in (ts, te):                                                 # line 2
            split = []
            for a, s, x in state:                                          # line 3
                if s < t < x:
                    split += [(a, s, t), (a, t, x)]                        # line 4
                else:
                    split.append((a, s, x))
            state = split
        state = [(agg(a, e), s, x) if ts <= s and x <= te else (a, s, x)  # lines 5-6
                 for a, s, x in state]
        hat = max((x for _, _, x in state), default=None)                  # line 7
        if hat is None or ts >= hat:                                       # line 8
            state.append((agg(None, e), ts, te))                           # line 9
        elif te > hat:                                                     # line 10
            state.append((agg(None, e), hat, te))                          # line 11
        state.sort(key=lambda item: item[1])
        output += [item for item in state if item[2] <= ts]                # lines 12-13
        state = [item for item in state if item[2] > ts]
    return output + state


def same_value(a, b) -> bool:
    """Aggregate tuples equal, with NaN equal to NaN (a constant run of NaN is still constant)."""
    for x, y in zip(a, b):
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


def pipes_changes(rows, time, key, window, granularity, aggs):
    """sliding_aggregate(emit="changes") by PIPES Algorithm 1 per group, coalesced.

    Each row becomes the element valid over ``[r, r + window)`` with ``r`` its time rounded down to the
    granularity; Algorithm 1 runs per group (PIPES Cost Formula 6: grouping, then scalar aggregation
    per group); adjacent output intervals with equal aggregates merge into maximal ones.
    Returns {(key, from, to): aggregates}.
    """
    groups: dict = {}
    for r in rows:
        if r[time] is None:
            continue
        groups.setdefault(r[key] if key else None, []).append(r)
    out = {}
    for k, members in groups.items():
        elements = sorted(((r, floor_to(r[time], granularity), floor_to(r[time], granularity) + window)
                           for r in members), key=lambda e: e[1])
        stream = pipes_algorithm1(elements, lambda a, e: (a or ()) + (e,))
        stream.sort(key=lambda item: item[1])
        runs: list = []
        for a, s, x in stream:
            value = finalize(a, aggs)
            if runs and runs[-1][2] == s and same_value(runs[-1][0], value):
                runs[-1] = (runs[-1][0], runs[-1][1], x)
            else:
                runs.append((value, s, x))
        for value, s, x in runs:
            out[(k, s, x)] = value
    return out


# ---- comparing Spark results ------------------------------------------------------------------------

def _norm(x):
    """A sort key for grouping values: None first, NaN last (as Spark orders them)."""
    if x is None:
        return (0, 0)
    if isinstance(x, float) and math.isnan(x):
        return (2, 0)
    return (1, x)


def _frame(df, keys):
    from pyspark.sql import functions as F

    # toPandas turns a null double into NaN: carry null flags to keep null and NaN keys apart.
    flags = [f"__null_{k}" for k in keys]
    pdf = df.select("*", *[F.isnull(k).alias(f) for k, f in zip(keys, flags)]).toPandas()
    by = []
    for k, f in zip(keys, flags):
        col = pdf[k]
        if pd.api.types.is_float_dtype(col.dtype):
            pdf[f + "_nan"] = col.isna() & ~pdf[f]
            pdf[f + "_v"] = col.fillna(0.0)
            by += [f, f + "_nan", f + "_v"]
        else:
            pdf[f + "_v"] = col.where(~pdf[f], col.dropna().iloc[0] if col.notna().any() else 0)
            by += [f, f + "_v"]
    pdf = pdf.sort_values(by, kind="mergesort")
    return pdf[list(df.columns)].reset_index(drop=True)


def _py(x):
    return None if x is None or x is pd.NaT or (not isinstance(x, float) and pd.isna(x)) else x


def assert_same_rows(ours, theirs, keys):
    """Same rows (floats to 1e-9 relative, NaN equal to NaN, null equal to null)."""
    a, b = _frame(ours, keys), _frame(theirs, keys)
    assert list(a.columns) == list(b.columns) and len(a) == len(b), (len(a), len(b))
    for col in b.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(y.dtype) and pd.api.types.is_float_dtype(x.dtype):
            xv, yv = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
            ok = np.isclose(xv, yv, rtol=1e-9, atol=1e-12, equal_nan=True)
            assert ok.all(), (col, a[~ok].head(), b[~ok].head())
        else:
            xs = [_py(v) for v in x.tolist()]
            ys = [_py(v) for v in y.tolist()]
            bad = [i for i, (u, v) in enumerate(zip(xs, ys)) if u != v and not (
                isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))]
            assert not bad, (col, [(xs[i], ys[i]) for i in bad[:5]])
