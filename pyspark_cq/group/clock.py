"""Each stream's watermark in a group whose shared stage serves several streams (pure: no Spark).

Spark keeps **one** watermark per streaming query: with several sources it is the minimum (or, by
``spark.sql.streaming.multipleWatermarkPolicy``, the maximum) of the sources' watermarks, each the largest event
time seen before the micro-batch, in ms, minus the source's delay (Spark's ``WatermarkTracker``). A query alone sees
its own stream's watermark; in a group over several streams the stateful stage therefore computes each stream's
watermark itself, exactly as Spark computes it for the stream alone, from the largest event times the group has
recorded per stream and micro-batch (:func:`record`, :func:`watermarks`).

Spark runs a micro-batch without data only when *its* watermark advanced; so that each stream's windows close
in the micro-batch after its watermark advanced (as alone, also at the end of an ``availableNow`` run), the
group's Spark query runs with the ``max`` policy on one more watermark, the **group clock**
(:func:`clock_ms`): ``CLOCK_BASE_MS`` plus the sum of the streams' largest event times (ms), which exceeds every
stream's watermark and advances exactly when one of the streams' largest event times does.
"""
from __future__ import annotations

__all__ = ["CLOCK_BASE_MS", "KEEP", "to_ms", "filtered", "filtered_delays", "latest", "record", "watermarks",
           "clock_ms", "stream_times"]

#: The group clock's base (3000-01-01 UTC, ms): above the event times of any stream, so the clock is Spark's
#: query watermark under the ``max`` policy.
CLOCK_BASE_MS = 32_503_680_000_000
#: Clock entries kept: a micro-batch Spark runs again needs only the entry before it (the entries are written
#: only when a stream's largest event time grows, and at most the re-run batch's own entry is newer); and the entry
#: before each stream's first (:func:`record`).
KEEP = 4


def to_ms(us: int) -> int:
    """An event time in µs as Spark's event-time statistics count it: ms, truncated towards zero."""
    return us // 1000 if us >= 0 else -((-us) // 1000)


def filtered(stream: str, predicate: str) -> str:
    """The name of the clock of ``stream``'s rows that pass ``predicate`` (its text): the stream's name and a digest.

    Spark pushes a filter that does not name the time column below the stream's ``withWatermark``, so a query
    alone with such a WHERE (or an outer join's pushed predicate) computes its watermark from the rows that pass
    it; a group records their largest event times under this name and runs the query at that watermark.
    """
    import hashlib

    return f"{stream}#{hashlib.sha1(predicate.encode()).hexdigest()[:10]}"


def filtered_delays(delays: dict, members) -> dict:
    """The watermark delay (ms) of each filtered clock of ``members`` (:class:`~.doc.MemberSpec`, :func:`filtered`):
    its stream's in ``delays`` (streams without one left out).
    """
    return {m.clock: delays[m.family] for m in members if m.clock is not None and m.family in delays}


def latest(clocks, batch_id: int | None) -> dict:
    """The largest event time (ms) of each stream seen before micro-batch ``batch_id`` (None: all recorded)."""
    seen: dict = {}
    for b, maxima in clocks:
        if batch_id is None or b < batch_id:
            seen = maxima
    return dict(seen)


def record(clocks, batch_id: int, maxima: dict) -> tuple:
    """``clocks`` (``((batch id, {stream: largest event time ms}), ...)``, cumulative, oldest first) after
    micro-batch ``batch_id`` saw the largest event times ``maxima`` (ms, streams without rows absent).

    A micro-batch Spark runs again replaces its own entry; nothing is added when no stream's time grew. Kept: the
    last :data:`KEEP` entries, and each entry followed by one with a stream more. A query joining several streams
    alone has, until all have had rows, the watermark of those that had, and Spark never lowers it when a slower
    stream arrives (``WatermarkTracker``); that entry is where it reached its highest before the stream arrived
    (:func:`~.joins.join_watermark_ms`), however many micro-batches ago.
    """
    clocks = tuple((b, m) for b, m in clocks if b < batch_id)
    prior = latest(clocks, None)
    now = dict(prior)
    for stream, t in maxima.items():
        if t is not None and (stream not in now or t > now[stream]):
            now[stream] = int(t)
    if now == prior:
        return clocks
    clocks += ((batch_id, now),)
    return tuple(c for i, c in enumerate(clocks)
                 if i >= len(clocks) - KEEP or (i + 1 < len(clocks) and set(clocks[i + 1][1]) > set(c[1])))


def watermarks(clocks, batch_id: int | None, delays: dict) -> dict:
    """Each stream's watermark (µs) in micro-batch ``batch_id``: Spark's for the stream alone, its largest event
    time (ms) before the micro-batch minus its delay ``delays[stream]`` (ms), and 0 before any (Spark's watermark
    starts at 0 and never goes below it).
    """
    seen = latest(clocks, batch_id)
    return {s: max(0, seen[s] - d) * 1000 if s in seen else 0 for s, d in delays.items()}


def clock_ms(clocks, batch_id: int | None, streams, stream: str, task_max_us: int | None,
             others: dict | None = None) -> int:
    """The group clock (ms) a task of ``stream``'s slicer reports in micro-batch ``batch_id``: ``CLOCK_BASE_MS``
    plus, over ``streams``, the largest event time before the micro-batch (for ``stream`` with the task's own
    ``task_max_us``, and for each filtered clock of ``others`` with the task's own largest time there, µs), each at
    least 0. It grows from one micro-batch to the next exactly when one stream's largest event time (ms) does, so
    Spark's query watermark under the ``max`` policy advances whenever a stream's does.
    """
    seen = latest(clocks, batch_id)
    for name, t in [(stream, task_max_us)] + list((others or {}).items()):
        if t is not None:
            own = to_ms(t)
            seen[name] = max(seen.get(name, own), own)
    return CLOCK_BASE_MS + sum(max(0, seen.get(s, 0)) for s in streams)


def stream_times(clocks, delays: dict, max_time_us: int | None = None) -> dict:
    """Each stream's times as the runtime's snapshot counts a query's (:class:`~pyspark_cq.policies.QueryInfo`),
    from the clocks the group recorded: what Spark's progress gives a query over the stream alone.

    Parameters
    ----------
    clocks : tuple
        The plan's clocks (:func:`record`); empty for a group whose shared stage serves one stream.
    delays : dict
        Each stream's watermark delay (ms; None: the stream has no watermark).
    max_time_us : int, optional
        With one stream (no clocks): the largest event time (µs) the group has seen, the plan's ``max_time``.

    Returns
    -------
    dict
        By stream: ``event_time``, its largest event time (µs, ms-truncated as Spark's progress; None before
        any); ``watermark``, its watermark in the next micro-batch (µs, :func:`watermarks`; None without a
        delay); ``watermark_delay``, δ in seconds, the largest event time of the previous micro-batches minus
        the micro-batch's watermark: the delay once the watermark is above 0, else None (the runtime measures it
        for a query alone at its first micro-batch with rows after that); ``advances``, the growth (s) of its
        largest event time at each recorded micro-batch in which it grew, oldest first (the last :data:`KEEP`
        entries), from which the runtime smooths the event time one micro-batch advances (B).
    """
    if not clocks and max_time_us is not None and len(delays) == 1:
        clocks = ((0, {next(iter(delays)): to_ms(max_time_us)}),)
    seen = latest(clocks, None)
    marks = watermarks(clocks, None, {s: d for s, d in delays.items() if d is not None})
    out = {}
    for s, d in delays.items():
        steps, prev = [], None
        for _, maxima in clocks[-KEEP:]:   # consecutive entries (an older one kept by record is not)
            t = maxima.get(s)
            if t is not None and prev is not None and t > prev:
                steps.append((t - prev) / 1e3)
            prev = t if t is not None else prev
        wm = marks.get(s)
        out[s] = {"event_time": seen[s] * 1000 if s in seen else None, "watermark": wm,
                  "watermark_delay": d / 1e3 if wm else None, "advances": tuple(steps)}
    return out
