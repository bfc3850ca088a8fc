"""Joins in a :class:`~pyspark_cq.QueryGroup`'s shared stage: *join classes* (pure: no Spark).

STREAM shares synopses between queries (Motwani et al., §3.2): queries joining the same two streams on the same
key, with the same left / right roles, read one symmetric hash state. Here such members form one **join class**
(:func:`join_classes`) whose state is the window join of the class's **widest** windows (each input's largest
``[RANGE …]``): its band ``(-max w_right, max w_left)`` holds every band of its members
(:func:`~pyspark_cq.operators.join.driver.window_band`), so every pair a member gets alone is among the class's,
and eviction by the watermark at the widest band keeps every row a member may still match. Each member keeps
the class's pairs in its own band and gets its own validity (``valid_from`` / ``valid_to``,
:func:`~pyspark_cq.operators.join.worker.validity`) and ``cq_at`` (:func:`member_rows`); its WHERE (the
predicates the compiler pushes to one input and the residual over both) is applied to its pairs: for an inner
join a selection on one input commutes with the join (σ_p(L) ⋈ R = σ_p(L ⋈ R)).

The class's state lives in the shared stage's state row of each shard (:class:`~.worker.GroupShard`), the
rows routed to a shard by the hash of their join key as :func:`~pyspark_cq.interval_join` routes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..operators.join.driver import window_band
from ..operators.join.worker import validity

__all__ = ["JoinMember", "join_classes", "class_windows", "config_windows", "canonical_names", "member_rows",
           "join_watermark_ms", "LEFT_PREFIX", "RIGHT_PREFIX", "OUTER_HOWS", "class_sides"]

#: Column prefixes of the class's canonical inputs (its members may alias the streams as they like).
LEFT_PREFIX, RIGHT_PREFIX = "l__", "r__"
#: The outer join types a member may have (``LEFT`` / ``RIGHT`` / ``FULL [OUTER] JOIN``, the interval join's ``how``).
OUTER_HOWS = ("left", "right", "full")


@dataclass(frozen=True)
class JoinMember:
    """What a join member of a group needs beyond its :class:`~.doc.MemberSpec`.

    Attributes
    ----------
    left, right : str
        The group's names of its left (first in FROM) and right streams.
    pairs : tuple of (str, str)
        Its equalities as ``(left column, right column)``, in the query's order (its keys ``cq_k<j>``).
    windows : tuple of (int, int)
        Its ``[RANGE …]`` sizes (µs) of the left and right input.
    refs : tuple of (str, str)
        Its names of the two inputs (alias or stream name): its columns are ``<ref>__<column>``.
    times : tuple of (str, str)
        The time columns of the two streams.
    columns : tuple of (tuple of str, tuple of str)
        The two streams' columns.
    at : str
        ``"valid_from"`` (ISTREAM) or ``"valid_to"``: its ``cq_at``, as the compiler sets it (an outer join: the
        later of the row times present, or the first expiry among them).
    how : str
        ``"inner"``, or an outer join's type (:data:`OUTER_HOWS`): its class then emits the rows that found no
        match, null-padded, when the join's watermark evicts them (the interval join's own ``how``).
    pushed : tuple of (str or None, str or None)
        The predicates the compiler applies to each input before the join (an outer join's WHERE on its preserved
        stream and ON conditions on its null-padded stream; an inner join's WHERE conjuncts on one input that do not
        name its time column) as Spark SQL over the stream's columns, None for an input without: its class applies
        them to its inputs before the state (:func:`class_sides`).
    """

    left: str
    right: str
    pairs: tuple
    windows: tuple
    refs: tuple
    times: tuple
    columns: tuple
    at: str
    how: str = "inner"
    pushed: tuple = (None, None)

    def signature(self) -> tuple:
        """What its class's state depends on: the two streams in their roles and the key (the equalities as a set);
        for an outer join also its type and windows. A row's "no match" is decided by the class's state (its
        matched flag, set by any pair of the class's band), so an outer member shares a class only with outer
        members of the same type and band, whose unmatched rows are then its own; never with inner members (their
        wider bands would match rows the outer member alone emits null-padded); with its predicates on each input
        too (they decide which rows may match, and the watermark its query alone has: :func:`class_sides`). An inner
        member's predicates pushed to an input decide its watermark too: with any, they are in its signature.
        """
        if self.how == "inner":   # without predicates pushed to an input: the signature of classes before them
            key = self.left, self.right, tuple(sorted(self.pairs))
            return key if self.pushed == (None, None) else key + (tuple(self.pushed),)
        return self.left, self.right, tuple(sorted(self.pairs)), self.how, tuple(self.windows), tuple(self.pushed)

    def band(self) -> tuple[int, int]:
        """Its own band ``(lower, upper)`` (µs, inclusive) of ``t_right - t_left``."""
        return window_band(*self.windows)


def join_classes(members: list) -> dict[str, str]:
    """Each join member's class: the key of the first member (in plan order) with the same
    :meth:`JoinMember.signature`. ``members`` are :class:`~.doc.MemberSpec` with ``join`` set. Plan order and
    ``==`` make the classes the same in every process reading one plan (as :func:`~.worker.slice_classes`).
    """
    reps: list = []
    out = {}
    for m in members:
        sig = m.join.signature()
        out[m.key] = next((k for s, k in reps if s == sig), m.key)
        if out[m.key] == m.key:
            reps.append((sig, m.key))
    return out


def class_windows(joins: list) -> tuple[int, int]:
    """The windows (µs) of a class's state: each input's widest over the members' :class:`JoinMember` ``joins``
    (its band holds each member's band).
    """
    if not joins:
        raise ValueError("joins must hold at least one JoinMember")
    return max(j.windows[0] for j in joins), max(j.windows[1] for j in joins)


def config_windows(config) -> tuple[int, int]:
    """The windows (µs) of a class's :class:`~pyspark_cq.operators.join.worker.JoinConfig`: its ``window`` (an inner
    class, a window join), else those of its band ``(-w_right + 1, w_left - 1)`` (an outer class, an interval join
    with the windows' band, :func:`~pyspark_cq.operators.join.driver.window_band`).
    """
    if config.window:
        return tuple(config.window)
    return config.upper + 1, 1 - config.lower


def class_sides(j: JoinMember) -> tuple[str, str]:
    """The names under which a join class's inputs keep their clocks (the largest event time per micro-batch, from
    which the join's watermark is computed): each stream's name, or for an input its class filters before the
    join (``pushed``) the stream's name with a digest of the predicate. Spark pushes such a predicate below the
    stream's ``withWatermark`` (it does not name the time column), so the query alone computes its watermark from
    the rows that pass it; the class's packer records their clock apart, and the class runs at that watermark.
    """
    from .clock import filtered

    out = []
    for stream, pred in zip((j.left, j.right), j.pushed):
        out.append(stream if pred is None else filtered(stream, pred))
    return out[0], out[1]


def canonical_names(j: JoinMember) -> dict:
    """The class's canonical column name -> the member's name for each column of its joined rows: keys
    ``cq_k<i>`` in the order of the sorted equalities -> the member's ``cq_k<j>``; the other columns of each
    stream ``l__c`` / ``r__c`` -> ``<ref>__c``. An outer join keeps both sides' key columns (the compiler's
    ``interval_join`` with ``left_on`` / ``right_on``: the padded side's are null), so every column of each stream
    ``l__c`` / ``r__c`` -> ``<ref>__c`` and the class's shared keys are not the member's.
    """
    if j.how != "inner":
        return {prefix + c: f"{ref}__{c}" for prefix, ref, cols in ((LEFT_PREFIX, j.refs[0], j.columns[0]),
                                                                     (RIGHT_PREFIX, j.refs[1], j.columns[1]))
                for c in cols}
    sorted_pairs = sorted(j.pairs)
    out = {f"cq_k{sorted_pairs.index(p)}": f"cq_k{i}" for i, p in enumerate(j.pairs)}
    lkeys = {p[0] for p in j.pairs}
    rkeys = {p[1] for p in j.pairs}
    for prefix, ref, cols, keys in ((LEFT_PREFIX, j.refs[0], j.columns[0], lkeys),
                                    (RIGHT_PREFIX, j.refs[1], j.columns[1], rkeys)):
        for c in cols:
            if c not in keys:
                out[prefix + c] = f"{ref}__{c}"
    return out


def _micros(column) -> np.ndarray:
    return pc.cast(column, pa.timestamp("us", tz=getattr(column.type, "tz", None))).cast(pa.int64()).to_numpy(
        zero_copy_only=False)


def member_rows(pairs: pa.Table, j: JoinMember, schema: pa.Schema) -> pa.Table:
    """A member's rows from its class's joined ``pairs`` (canonical names, :func:`canonical_names`): the pairs in
    its own band, renamed to its names, with its own ``valid_from`` / ``valid_to`` and ``cq_at``, in ``schema``
    (its stage schema: the window join's columns then ``cq_at``). An outer member (:func:`outer_rows`): its
    class's rows are its own (same type and band), pairs and null-padded rows alike.
    """
    if j.how != "inner":
        return outer_rows(pairs, j, schema)
    tl = _micros(pairs.column(LEFT_PREFIX + j.times[0]))
    tr = _micros(pairs.column(RIGHT_PREFIX + j.times[1]))
    lower, upper = j.band()
    d = tr - tl
    keep = (d >= lower) & (d <= upper)
    if not keep.all():
        pairs, tl, tr = pairs.filter(pa.array(keep)), tl[keep], tr[keep]
    names = canonical_names(j)
    cols = {names[n]: pairs.column(n) for n in pairs.column_names if n in names}
    cols["valid_from"], cols["valid_to"] = validity(tl, tr, *j.windows)
    cols[schema.names[-1]] = cols[j.at]
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


def outer_rows(rows: pa.Table, j: JoinMember, schema: pa.Schema) -> pa.Table:
    """An outer member's rows from its class's output ``rows`` (canonical names: the interval join's pairs and the
    rows that found no match, null-padded), in ``schema`` (its stage schema: the compiler's ``interval_join``
    columns ``<ref>__<column>`` of both streams, then ``cq_at``). ``cq_at`` as the compiler's outer join sets it
    (``greatest`` / ``least`` skip the padded side's null): ISTREAM the later of the row times present, DSTREAM
    the first expiry ``t + w`` among them.
    """
    if j.how not in OUTER_HOWS:
        raise ValueError(f"j.how must be one of {OUTER_HOWS} (an outer member), got {j.how!r}")
    names = canonical_names(j)
    cols = {names[n]: rows.column(n) for n in rows.column_names if n in names}
    # µs with nulls where the side is padded (not _micros: numpy has no null)
    times = [pc.cast(rows.column(p + t), pa.timestamp("us", tz=getattr(rows.column(p + t).type, "tz", None)))
             .cast(pa.int64()) for p, t in ((LEFT_PREFIX, j.times[0]), (RIGHT_PREFIX, j.times[1]))]
    if j.at == "valid_from":
        at = pc.max_element_wise(*times, skip_nulls=True)
    else:
        at = pc.min_element_wise(*[pc.add(t, pa.scalar(w, pa.int64())) for t, w in zip(times, j.windows)],
                                 skip_nulls=True)
    cols[schema.names[-1]] = at.cast(pa.timestamp("us", tz="UTC"))
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


def join_watermark_ms(clocks, batch_id: int | None, streams: tuple, delays: dict) -> int:
    """The watermark (ms) Spark gives a query joining ``streams`` alone in micro-batch ``batch_id``: the
    minimum over the streams that have had rows of their largest event time before the micro-batch minus
    their delay (``WatermarkTracker``, ``min`` policy), never going back (Spark keeps the largest it chose),
    at least 0. From the group's recorded clocks (:func:`~.clock.record`): the largest over the entries kept.
    """
    best = 0
    for b, maxima in clocks:
        if batch_id is not None and b >= batch_id:
            continue
        seen = [maxima[s] - delays[s] for s in streams if s in maxima]
        if seen:
            best = max(best, min(seen))
    return best
