"""Time-bucket layout of the streaming inner interval join (``interval_join(..., bucket=...)``, issue 14).

Today's layout keeps one ``applyInPandasWithState`` state per key shard, so every micro-batch moves each
shard's whole state JVM -> Python -> JVM although a batch touches only the time range near its rows.
The bucket layout keys the state by ``(shard, bucket)`` with ``bucket = floor(t / width)``: a batch reads
and writes only the buckets its rows fall in or reach, and a bucket's group is read once more when its
first row expires (its event-time timeout).

Routing (driver side, :func:`targets_column`)
    A row is *stored* only in its own bucket's group. A left row at ``t`` matches right rows in
    ``[t + lower, t + upper]``, a right row at ``t'`` left rows in ``[t' - upper, t' - lower]``; the row
    also goes, as a **probe copy**, to every other bucket that range reaches (an explode of the bucket
    range). Copies are never stored and never counted as input; rows behind the watermark are dropped
    by Spark with all their copies (the copies carry the same event-time column).

Order within group ``b`` (worker side, :meth:`JoinWorker._process`)
    (a) copies whose own bucket is *earlier* than ``b`` probe ``b``'s old state (before this batch's
    inserts), ``store=False``; (b) ``b``'s own new rows ``insert_probe`` as today (left, then right, as
    Spark); (c) copies whose own bucket is *later* than ``b`` probe after (b), so they also meet ``b``'s
    new rows. Then eviction by the watermark as today (PIPES, Cammert et al., §2.4.4).

Why every pair comes out exactly once
    Take a matching pair (l, r), l stored in bucket ``bl``, r in ``br``; "new" means arrived in this
    batch, and a copy exists only for a new row. The pair can only be found where one row is stored and
    the other arrives (as itself or as a copy): in ``bl`` or in ``br``.

    * ``bl == br``: no copies are involved; the group runs today's algorithm, which gives the pair once
      (l new probes the old right state, then r new probes the left state that already holds l).
    * ``bl < br``: in ``bl`` the copy of r (own bucket later) probes *after* the inserts; in ``br`` the
      copy of l (own bucket earlier) probes the *old* state.
      l new, r old: found in ``br`` (r is in the old state); r has no copy. l old, r new: found in
      ``bl`` (l is stored); l has no copy. Both new: found in ``bl`` (r's copy runs after l's insert),
      not in ``br`` (l's copy sees the old state, without r).
    * ``bl > br``: symmetric, the roles of (a) and (c) swap: r's copy probes ``bl``'s old state, l's copy
      probes ``br`` after the inserts. l new, r old: in ``br``; l old, r new: in ``bl``; both new: in
      ``br`` only (l's copy runs after r's insert; r's copy sees ``bl`` without l).
    * both old: found in the batch in which the later of the two arrived, by the cases above.

    Eviction is per row and decided by the watermark alone, as in today's layout, and every bucket's group
    is invoked (by data or by its timeout) no later than today's shard group would evict the same row, so
    no pair Spark produces is lost to an early eviction, and none is added by a late one (a row that
    could still be probed after its expiry would be behind the watermark, hence dropped with its copies).

Outer, semi and anti joins, window joins and control tables stay on the shard layout: their unmatched or
first-match flags and per-row bands would have to merge across buckets.
"""
from __future__ import annotations

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from ..._duration import parse_duration

__all__ = ["LEFT", "RIGHT", "BUCKET", "OWN", "MIN_AUTO_WIDTH", "AUTO_BANDS", "resolve_width", "probe_reach",
           "bucket_of", "target_buckets", "own_column", "targets_column"]

LEFT, RIGHT = 0, 1
# Buckets are named by their start instant (µs), ``floor(t / width) * width``: two widths then share the
# keys at their common multiples, where a restart with another width meets (and refuses) the old state.
BUCKET = "__cq_b"       # the group's bucket (the explode target)
OWN = "__cq_own"        # the row's own bucket (where it is stored)
#: The smallest automatic width (µs): a band of zero width would otherwise give one bucket per instant.
MIN_AUTO_WIDTH = 1_000_000
#: ``"auto"``: the width in band widths. A row of a band of width ``B`` gets a probe copy with probability
#: ``B / width``: 1 (every row, the shuffle and the workers' input doubled) at 1, a third at 3, which
#: measured 1.7-2.6 s per batch against 3.4-5.9 s at 1 in one session (docs/benchmark-log-2026.md, issue 14).
AUTO_BANDS = 3


def resolve_width(bucket, lower: int, upper: int) -> int | None:
    """The bucket width in µs of the ``bucket`` argument, or None (the shard layout).

    ``bucket`` is None (off), ``"auto"`` (``max(3 * (upper - lower), 1 s)``: a row reaches at most one
    bucket besides its own, and only a third of the rows do: :data:`AUTO_BANDS`) or a positive duration
    (``"30 seconds"``).
    """
    if bucket is None:
        return None
    if isinstance(bucket, str) and bucket == "auto":
        return max(AUTO_BANDS * (int(upper) - int(lower)), MIN_AUTO_WIDTH)
    return parse_duration(bucket, "bucket", allow_negative=False, allow_zero=False)


def probe_reach(side: int, lower: int, upper: int) -> tuple[int, int]:
    """Offsets ``(lo, hi)`` such that a row of ``side`` at ``t`` probes the other side's times in
    ``[t + lo, t + hi]`` (left: ``[lower, upper]``; right: ``[-upper, -lower]``).
    """
    return (lower, upper) if side == LEFT else (-upper, -lower)


def bucket_of(micros, width: int) -> np.ndarray:
    """The bucket (its start instant, µs) of epoch microseconds: ``floor(t / width) * width``, exact,
    also for negative times.
    """
    width = np.int64(width)
    return np.floor_divide(np.asarray(micros, dtype=np.int64), width) * width


def target_buckets(t: int, side: int, lower: int, upper: int, width: int) -> list[int]:
    """The buckets a row of ``side`` at ``t`` goes to, own bucket first (the reference of
    :func:`targets_column`): its own bucket, then every other bucket its probe range reaches.
    """
    lo, hi = probe_reach(side, lower, upper)
    own = int(bucket_of(t, width))
    first, last = int(bucket_of(t + lo, width)), int(bucket_of(t + hi, width))
    return [own] + [b for b in range(first, last + 1, width) if b != own]


def own_column(micros: Column, width: int) -> Column:
    """Spark expression: a row's own bucket (its start, long), null for a null time."""
    return micros - F.pmod(micros, F.lit(width))


def targets_column(micros: Column, side: int, lower: int, upper: int, width: int) -> Column:
    """Spark expression: the array of buckets a row goes to (:func:`target_buckets`); ``[null]`` for a
    null time (the row reaches its group and is counted as malformed there, as in the shard layout).
    """
    lo, hi = probe_reach(side, lower, upper)
    own = own_column(micros, width)
    reach = F.sequence(own_column(micros + F.lit(lo), width), own_column(micros + F.lit(hi), width),
                       F.lit(width).cast("long"))
    return F.coalesce(F.array_union(F.array(own), reach), F.array(F.lit(None).cast("long")))
