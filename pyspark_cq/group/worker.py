"""The Spark-worker side of a :class:`~pyspark_cq.QueryGroup`: one slicer per stream and one stateful stage for
all the group's windowed aggregations, and the packing of every query's rows into one output schema.

Split-based aggregation (Cammert et al., PIPES, §2.4.1, Algorithm 1) makes each query's state a table of
slices; STREAM shares operators and synopses between queries (Motwani et al., §3.2). Here one ``mapInArrow``
(:class:`GroupSlicer`) reads the stream's projection once and slices once per slice class (members whose
slices are the same, :func:`slice_classes`), and one ``applyInPandasWithState`` (:class:`GroupShard`) holds,
per hash shard, the slice tables in one state row: one per class, from which each member emits its own windows
(:func:`~pyspark_cq.operators.aggregate.shard.run_shared`), or one per member running the step
:func:`~pyspark_cq.sliding_aggregate` runs (:func:`~pyspark_cq.operators.aggregate.shard.run_shard`); either
way each member's rows are exactly its own query's. The
members are read from the group's plan (:mod:`.doc`) at every micro-batch, so queries join and leave without
a new Spark query.

Spark allows one ``applyInPandasWithState`` per streaming query, so with windowed aggregations over several
streams each stream has its own projection and slicer, and the slicers' rows (one schema, the member key in each
row) are united into the one stateful stage, which runs each stream's members at that stream's own watermark
(:mod:`.clock`).
"""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import replace

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from .. import _validate
from ..cost.groups import class_granularity, granularity_classes
from ..operators.aggregate.config import BAD, SHARD, SHED_COL, SLICES, TAG, TIME
from ..operators.aggregate.shard import run_shard, run_shared
from ..operators.aggregate.slicer import Slicer
from ..operators.aggregate.spec import arrow_type, to_int64
from ..operators.aggregate.transport import unpack_slices
from ..vocabulary import metrics as M
from . import clock as C
from . import doc as D
from .predicates import evaluate
from .rows import ROWS

__all__ = ["MEMBER", "MAX_TIME", "GROUP_CLOCK", "OUTPUT_SCHEMA", "STATE_SCHEMA", "SHARED", "sliced_schema",
           "slice_classes", "class_granularities", "clock_key", "clock_streams", "batch_setting", "GroupSlicer",
           "GroupShard", "PackRows", "ipc_bytes", "JOIN", "join_class_id", "JoinPacker", "RowsPacker"]

MEMBER, MAX_TIME = "__cq_member", "__cq_max_time"
#: Several streams: the group clock's column (:func:`~.clock.clock_ms`), the event time of Spark's watermark.
GROUP_CLOCK = "__cq_group_clock"
#: What every branch of the group's Spark query gives: per query (its state key) its rows as one Arrow IPC
#: stream, and its counters as JSON.
OUTPUT_SCHEMA = "cq_member string, cq_payload binary, cq_counters string"
STATE_SCHEMA = "members binary"
#: The member key of the rows that carry the event times seen (for queries joining a running group); with
#: several streams one key per stream (:func:`clock_key`).
CLOCK = ""
_STREAM_CLOCK = "\x01clock:"   # not NUL: pandas groups strings that start with NUL as one
#: The key, in a shard's saved state, of the slice tables several members share: ``[(member keys, state)]``.
SHARED = "\x00shared"
#: The member key of a join class's rows (then the class id, :func:`join_class_id`), and its state's key in a
#: shard's saved state.
JOIN = "\x02join:"


def sliced_schema(time_type: T.DataType, delay_ms: int | None, group_clock: bool = False) -> T.StructType:
    """The shared slicer's output: per shard and member one packed message of slices (as
    :meth:`~pyspark_cq.operators.aggregate.config.AggConfig.packed_schema`), and the largest event time of
    the task's input; with a watermark the all-null tag column that carries it to the stateful stage.
    ``group_clock`` (several streams): no tag column but the group clock (:data:`GROUP_CLOCK`), the same schema
    for every stream.
    """
    fields = [T.StructField(SHARD, T.LongType(), False), T.StructField(MEMBER, T.StringType(), False),
              T.StructField(SLICES, T.BinaryType(), False), T.StructField(BAD, T.LongType(), False),
              T.StructField(SHED_COL, T.LongType(), False), T.StructField(MAX_TIME, T.LongType(), True)]
    if group_clock:
        fields.append(T.StructField(GROUP_CLOCK, T.TimestampType(), False))
    elif delay_ms is not None:
        fields.append(T.StructField(TAG, time_type, True, {_validate.WATERMARK_KEY: delay_ms}))
    return T.StructType(fields)


def clock_key(stream: str | None) -> str:
    """The member key of the clock rows: :data:`CLOCK` with one stream (None), one key per stream with several."""
    return CLOCK if stream is None else _STREAM_CLOCK + stream


def clock_streams(plan: D.Plan, streams: tuple, batch_id: int | None) -> tuple:
    """The clocks the group clock sums in micro-batch ``batch_id`` (:func:`~.clock.clock_ms`): the shared stage's
    ``streams``, every clock recorded so far and every member's filtered clock. The same for every task of a
    micro-batch (all read one plan), and it only grows: a clock once recorded stays.
    """
    names = set(streams) | set(C.latest(plan.clocks, batch_id))
    names |= {m.clock for m in plan.members.values() if m.clock is not None}
    return tuple(sorted(names))


def _is_clock(key: str) -> bool:
    return key == CLOCK or key.startswith(_STREAM_CLOCK)


def _stream_of_clock(key: str) -> str | None:
    return key[len(_STREAM_CLOCK):] if key.startswith(_STREAM_CLOCK) else None


def batch_setting(directory: str) -> str:
    """The session setting through which the group under ``directory`` hands its micro-batch id to its tasks where
    Spark does not (:class:`~.batch.GroupBatch`): one name per group, so that two groups of one Spark Connect
    session never read each other's.
    """
    import hashlib

    return f"{_validate.BATCH_ID_SETTING}.{hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:12]}"


def _batch_id(directory: str) -> int | None:
    """The running micro-batch's id of the group under ``directory``, or None outside a streaming task (then every
    recorded clock counts).
    """
    value = _validate.micro_batch_id(batch_setting(directory))
    return int(value) if value.lstrip("-").isdigit() else None


_CLOCK_TYPE = arrow_type(T.TimestampType())


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _plan(directory: str) -> D.Plan:
    plan = D.read_plan(directory)
    if plan is None:
        raise RuntimeError(f"query group: its plan {directory}/plan.pkl is missing (micro-batch "
                           f"{_validate.micro_batch_id()}); was the checkpoint directory removed?")
    return plan


def _members(plan: D.Plan, families) -> list:
    """The active shared members over ``families`` (a tuple of stream names), in plan order."""
    return [m for m in plan.members.values() if m.kind == "shared" and m.family in families and m.active]


def slice_classes(members: list, max_ratio: int = 1) -> dict[str, str]:
    """Each member's *slice class*: the key of the first member (in plan order) of the members that share one
    slice table (PIPES's shared slices, Cammert et al., §2.4.1; STREAM's shared subplans, Motwani et al., §3.2).

    Members over the same stream that read the same rows (WHERE, start, input columns) with the same key and
    aggregates, and differ only in window, slide, output (RSTREAM / ISTREAM / DSTREAM) or name, slice alike: the
    slicer cuts the rows at the granularity and pre-aggregates per key, and the window is applied only by each
    member's sweep (:func:`~pyspark_cq.operators.aggregate.shard.run_shared`). Those that differ in granularity
    too share one class, sliced at the gcd of their granularities (:func:`class_granularities`), while the class's
    coarsest granularity is at most ``max_ratio`` times that gcd (:func:`pyspark_cq.cost.groups.granularity_classes`,
    the rule and its cost; the plan's ``granularity_ratio``, 1: equal granularities only). Every window and slide
    of a class is a multiple of its slice length, so a window is a run of whole slices and stays exact.

    The slicer stage slices once per class and the stateful stage unpacks once per class. Plan order and ``==``
    (no hashing, no pickling) make the classes the same in every process that reads one plan.
    """
    if isinstance(max_ratio, bool) or not isinstance(max_ratio, int) or max_ratio < 1:
        raise ValueError(f"max_ratio must be an int >= 1 (the plan's granularity_ratio), got {max_ratio!r}")
    same: list = []     # (signature, members) in plan order
    for m in members:
        sig = _slice_signature(m)
        group = next((ms for s, ms in same if s == sig), None)
        if group is None:
            same.append((sig, [m]))
        else:
            group.append(m)
    first = {}
    for _, ms in same:
        for m, i in zip(ms, granularity_classes([m.config.granularity for m in ms], max_ratio)):
            first[m.key] = ms[i].key
    return {m.key: first[m.key] for m in members}


def class_granularities(members: list, classes: dict[str, str]) -> dict[str, int]:
    """The slice length (µs) of each class of ``classes`` (:func:`slice_classes` of ``members``) by its first
    member's key: the gcd of its members' granularities (:func:`pyspark_cq.cost.groups.class_granularity`).
    """
    grans: dict[str, list[int]] = {}
    for m in members:
        grans.setdefault(classes[m.key], []).append(m.config.granularity)
    return {k: class_granularity(gs) for k, gs in grans.items()}


def _slice_signature(m) -> tuple:
    """What a member's slices depend on but the granularity: its rows (WHERE, start, input columns) and its
    configuration without what only the sweep reads.
    """
    return (m.family, m.mask, m.arrow_filter, m.start_us, m.columns,
            replace(m.config, window=0, slide=0, granularity=0, emit="windows", name="", out_names=()))


class GroupSlicer:
    """``mapInArrow`` function of one stream's shared stage: each member's slices of the rows its WHERE keeps
    (and, for a member that joined a running group, whose time is at or after its start).

    ``streams``: the streams of the group's shared stage when there are several (their slicers' rows are
    united): the clock row is this stream's (:func:`clock_key`) and every row carries the group clock
    (:func:`~.clock.clock_ms`) instead of the tag column.
    """

    def __init__(self, directory: str, family: str, time_type: T.DataType, delay_ms: int | None,
                 streams: tuple | None = None):
        self.directory, self.family, self.delay_ms = directory, family, delay_ms
        self.time_type, self.streams = time_type, streams
        self.names = sliced_schema(time_type, delay_ms, streams is not None).names

    def __call__(self, batches):
        """The packed slices of every member for the task's Arrow ``batches``, then the clock row."""
        batches = [b for b in batches if b.num_rows]
        plan = _plan(self.directory)
        members = _members(plan, (self.family,))
        latest = None
        for b in batches:
            t = to_int64(b.column(TIME))
            if t.null_count < len(t):
                m = int(pc.max(t).as_py())
                latest = m if latest is None else max(latest, m)
        # each filtered clock of its members (clock.filtered): the largest time of the rows that pass it
        filtered = {}
        for m in members:
            if m.clock is None or m.clock in filtered:
                continue
            top = None
            for b in batches:
                keep = pc.fill_null(b.column(m.clock_mask) if m.clock_mask is not None
                                    else evaluate(m.clock_filter, b), False)
                t = pc.max(to_int64(b.column(TIME)).filter(keep)).as_py()
                top = t if top is None or (t is not None and t > top) else top
            filtered[m.clock] = top
        group_clock = None
        if self.streams is not None:   # the same for every row of the task
            bid = _batch_id(self.directory)
            group_clock = C.clock_ms(plan.clocks, bid, clock_streams(plan, self.streams, bid), self.family, latest,
                                     filtered) * 1000
        classes = slice_classes(members, plan.granularity_ratio)
        lengths = class_granularities(members, classes)
        for m in members:
            if classes[m.key] != m.key:
                continue    # sliced with its class's first member
            # at the class's slice length: the finest common boundary of its members' windows and slides
            config = replace(m.config, granularity=lengths[m.key])
            slicer = Slicer(config, self.delay_ms is not None, markers=True, packed=True)
            for out in slicer(self._view(b, m) for b in batches):
                yield self._tagged(out, m.key, group_clock)
        yield self._clock_row(clock_key(None if self.streams is None else self.family), latest, group_clock)
        for name, t in filtered.items():
            if t is not None:
                yield self._clock_row(clock_key(name), t, group_clock)

    def _clock_row(self, key: str, t: int | None, group_clock: int | None) -> pa.RecordBatch:
        """The row carrying the largest event time ``t`` (µs) the task saw for the clock ``key``."""
        cols = [pa.array([0], pa.int64()), pa.array([key]), pa.array([b""], pa.binary()),
                pa.array([0], pa.int64()), pa.array([0], pa.int64()), pa.array([t], pa.int64())]
        if group_clock is not None:
            cols.append(pa.array([group_clock], _CLOCK_TYPE))
        elif self.delay_ms is not None:
            cols.append(pa.nulls(1, type=arrow_type(self.time_type)))
        return pa.RecordBatch.from_arrays(cols, names=self.names)

    @staticmethod
    def _view(batch: pa.RecordBatch, m) -> pa.RecordBatch:
        """The rows of ``batch`` member ``m`` reads, with the column names its slicer reads."""
        keep = None
        if m.mask is not None:
            keep = pc.fill_null(batch.column(m.mask), False)
        elif m.arrow_filter is not None:
            keep = pc.fill_null(evaluate(m.arrow_filter, batch), False)
        if m.start_us is not None:
            late = pc.greater_equal(to_int64(batch.column(TIME)), pa.scalar(m.start_us, pa.int64()))
            late = pc.fill_null(late, True)   # a null time is malformed: counted by the slicer
            keep = late if keep is None else pc.and_(keep, late)
        if keep is not None:
            batch = batch.filter(keep)
        names = [TIME] + [n for n, _ in m.columns]
        return pa.RecordBatch.from_arrays([batch.column(TIME)] + [batch.column(c) for _, c in m.columns],
                                          names=names)

    def _tagged(self, out: pa.RecordBatch, key: str, group_clock: int | None) -> pa.RecordBatch:
        """A member slicer's packed rows with the member column and an empty event-time column (several
        streams: the group clock instead of the tag column).
        """
        n = out.num_rows
        cols = [out.column(0), pa.array([key] * n, pa.string())] + [out.column(i) for i in (1, 2, 3)]
        cols.append(pa.nulls(n, type=pa.int64()))
        if group_clock is not None:
            cols.append(pa.array([group_clock] * n, _CLOCK_TYPE))
        elif self.delay_ms is not None:
            cols.append(out.column(4))
        return pa.RecordBatch.from_arrays(cols, names=self.names)


def join_class_id(signature: tuple) -> str:
    """The id of a join class (:meth:`~.joins.JoinMember.signature`): the same in every process, kept while members
    come and go (a class's state does not change hands when its first member leaves).
    """
    return repr(signature)


class JoinPacker:
    """``mapInArrow`` function of a join class's input (the interval join's tagged union of both streams,
    :func:`~pyspark_cq.operators.join.driver._tagged`): per shard one row carrying its rows as one Arrow IPC
    stream, to the shared stateful stage; then a clock row per stream with rows, and the group clock on every row.
    ``sides`` are the names of the clocks of its two inputs (:func:`~.joins.class_sides`).
    """

    #: The member key prefix of its rows in the shared stage (then the class id).
    PREFIX = JOIN

    def __init__(self, directory: str, class_id: str, sides: tuple, time_type: T.DataType, streams: tuple):
        self.directory, self.class_id, self.sides, self.streams = directory, class_id, sides, streams
        self.names = sliced_schema(time_type, None, True).names

    def __call__(self, batches):
        """The packed rows of the task's Arrow ``batches``."""
        from ..operators._common.payload import SIDE
        from ..operators.join.worker import MICROS
        from ..operators.join.worker import SHARD as JSHARD

        batches = [b for b in batches if b.num_rows]
        plan = _plan(self.directory)
        table = pa.Table.from_batches(batches) if batches else None
        latest = {}
        if table is not None:
            for side, stream in enumerate(self.sides):
                t = pc.max(table.filter(pc.equal(table.column(SIDE), side)).column(MICROS)).as_py()
                if t is not None:
                    latest[stream] = max(latest.get(stream, t), t)
        bid = _batch_id(self.directory)
        names = clock_streams(plan, self.streams, bid)
        clock = max([C.clock_ms(plan.clocks, bid, names, s, t) for s, t in latest.items()]
                    or [C.clock_ms(plan.clocks, bid, names, self.sides[0], None)]) * 1000
        rows = []
        if table is not None:
            shards = table.column(JSHARD)
            for shard in pc.unique(shards).to_pylist():
                part = table.filter(pc.equal(shards, shard))
                rows.append((shard, self.PREFIX + self.class_id, ipc_bytes(part), None))
        rows += [(0, clock_key(stream), b"", t) for stream, t in latest.items()]
        if not rows:
            return
        cols = [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows]),
                pa.array([r[2] for r in rows], pa.binary()), pa.array([0] * len(rows), pa.int64()),
                pa.array([0] * len(rows), pa.int64()), pa.array([r[3] for r in rows], pa.int64()),
                pa.array([clock] * len(rows), _CLOCK_TYPE)]
        yield pa.RecordBatch.from_arrays(cols, names=self.names)


class RowsPacker(JoinPacker):
    """``mapInArrow`` function of a ROWS member's input (:mod:`.rows`): the join class's packer over one stream, its
    rows tagged as side 0 with their time in µs and routed to a shard by the hash of the partition key; ``class_id``
    is the member's key.
    """

    PREFIX = ROWS


def _run_rows(plan: D.Plan, parts: dict, saved: dict, kept: dict, out: list) -> None:
    """Each active ROWS member of the plan for one shard and micro-batch (:func:`~.rows.run_rows`): its rows
    (``parts``) through the rows_window operator's step per partition, its kept rows from and to ``saved`` / ``kept``,
    its rows and counters into ``out``.
    """
    from ..operators._common.payload import SIDE
    from ..operators.join.worker import MICROS
    from ..operators.join.worker import SHARD as JSHARD
    from .rows import run_rows

    for m in plan.members.values():
        if m.kind != "rows" or not m.active:
            continue
        frames = parts.get(ROWS + m.key)
        table = None
        if frames is not None:
            tables = [pa.ipc.open_stream(b).read_all() for b in frames[SLICES]]
            table = pa.concat_tables(tables).drop_columns([SIDE, JSHARD, MICROS])
        got, held, counters = run_rows(m.config, table, saved.get(ROWS + m.key))
        if held:
            kept[ROWS + m.key] = held
        schema = m.stage_schema or m.arrow_schema
        if m.finish is None:    # its select list names columns: they and cq_at are its rows
            got = got.select([src for _, src in m.select] + [got.column_names[-1]])
        got = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(got.columns, schema)], schema=schema)
        out.append((m.key, ipc_bytes(got) if got.num_rows else None, json.dumps(counters)))


class _Held:
    """A join class's saved state as the interval join's worker reads a GroupState (``exists``, ``get``)."""

    def __init__(self, value):
        self.exists, self.get = value is not None, value


def _run_joins(directory: str, plan: D.Plan, parts: dict, saved: dict, kept: dict, out: list,
               delays: dict | None) -> None:
    """Each join class of the plan (``catalogue["__joins__"]``) for one shard and micro-batch: its rows (``parts``)
    through the interval join's worker (:class:`~pyspark_cq.operators.join.worker.JoinWorker`) at the
    join's watermark (:func:`~.joins.join_watermark_ms`; the rows at or behind the previous micro-batch's
    dropped as Spark drops them for the join alone), its state from and to ``saved`` / ``kept``, and each
    active member's rows (:func:`~.joins.member_rows`) and counters into ``out``. The class's state counters
    are reported on its first active member.
    """
    from ..operators._common.payload import split_sides
    from ..operators.join.worker import LEFT, MICROS, RIGHT, JoinWorker
    from .joins import join_watermark_ms, member_rows

    classes = plan.catalogue.get("__joins__", {})
    if not classes:
        return
    members = [m for m in plan.members.values() if m.kind == "join" and m.active]
    batch = _batch_id(directory)
    for cid, (config, sides_of) in classes.items():
        ms = [m for m in members if join_class_id(m.join.signature()) == cid]
        worker = JoinWorker(config)
        held = saved.get(JOIN + cid)
        kernel, sides = worker._restore(_Held(held))
        rows = parts.get(JOIN + cid)
        frames = []
        if rows is not None:
            frames = [pa.ipc.open_stream(b).read_all().to_pandas() for b in rows[SLICES]]
        inputs = split_sides(frames, 2)
        streams = tuple(dict.fromkeys(sides_of))
        wm_ms = join_watermark_ms(plan.clocks, batch, streams, delays or {})
        # Spark drops a stateful operator's late input by the watermark of the micro-batch before (its
        # "watermark for late events"), and evicts by the micro-batch's own: as for the join alone
        late_ms = join_watermark_ms(plan.clocks, None if batch is None else batch - 1, streams, delays or {})
        n_in = late = 0
        for i in (LEFT, RIGHT):
            pdf = inputs[i]
            if pdf is None:
                continue
            n_in += len(pdf)
            ok = ~(pdf[MICROS].to_numpy(dtype="float64", na_value=float("nan")) <= late_ms * 1000)
            late += int((~ok).sum())
            inputs[i] = pdf[ok].reset_index(drop=True)
        parts_out, evicted, malformed, _, _ = worker._process(kernel, sides, inputs, wm_ms)
        n_state = kernel.rows(LEFT) + kernel.rows(RIGHT)
        if n_state:
            blobs = worker._snapshot(kernel, sides)
            kept[JOIN + cid] = blobs
            n_bytes = sum(len(b) for b in blobs)
        else:
            n_bytes = 0
        table = worker._packed(parts_out)
        for i, m in enumerate(ms):
            got = member_rows(table, m.join, m.stage_schema) if table is not None else m.stage_schema.empty_table()
            counters = {M.INPUT_ROWS: n_in, M.LATE_ROWS: late, M.MALFORMED_ROWS: malformed,
                        M.OUTPUT_ROWS: got.num_rows, M.STATE_ROWS: n_state if i == 0 else 0,
                        M.STATE_BYTES: n_bytes if i == 0 else 0, M.EVICTED_ROWS: evicted if i == 0 else 0}
            out.append((m.key, ipc_bytes(got) if got.num_rows else None, json.dumps(counters)))


class GroupShard:
    """``applyInPandasWithState`` function of one stream's shared stage: one shard, one micro-batch, every
    member. The state row holds the slice tables by member key, and under :data:`SHARED` the tables that
    several members of one slice class share (:func:`~pyspark_cq.operators.aggregate.shard.run_shared`);
    a member that left the plan leaves the state with it.

    A member runs on a table of its own when it emits change intervals, when this shard already holds a
    table of its own for it (a checkpoint written before tables were shared, or a member that was alone in
    its class), or when it is alone in its class and no shared table holds it.

    ``families``: the streams of the stage. With one, the members run at Spark's watermark; with several
    (``delays``: each stream's watermark delay, ms), each stream's members run at the stream's own watermark,
    the one Spark gives the stream alone (:func:`~.clock.watermarks`).
    """

    def __init__(self, directory: str, families: tuple, watermark: bool, delays: dict | None = None):
        if isinstance(families, str):
            families = (families,)
        self.directory, self.families, self.watermark, self.delays = directory, tuple(families), watermark, delays

    def __call__(self, key, pdfs, state):
        """Each member's output rows and counters, one row per member (and the clock rows)."""
        frames = [p for p in pdfs if len(p)]
        data = pd.concat(frames, ignore_index=True) if frames else None
        saved = pickle.loads(state.get[0]) if state.exists else {}
        tables = saved.pop(SHARED, [])
        plan = _plan(self.directory)
        if self.delays is not None:    # several streams: each its own watermark, as alone
            # and each filtered clock at its stream's delay (one may join while the group runs)
            delays = {**C.filtered_delays(self.delays, plan.members.values()), **self.delays}
            wms = C.watermarks(plan.clocks, _batch_id(self.directory), delays)
        else:
            wm = int(state.getCurrentWatermarkMs()) * 1000 if self.watermark else None
            wms = {f: wm for f in self.families}
        kept, out = {}, []
        members = _members(plan, self.families)
        classes = slice_classes(members, plan.granularity_ratio)
        parts = dict(tuple(data.groupby(MEMBER, sort=False))) if data is not None else {}
        by_class: dict = {}
        for m in members:
            by_class.setdefault(classes[m.key], []).append(m)
        shared_out = []
        for cls, ms in by_class.items():
            rows = [parts[cls]] if cls in parts else []
            table, counts = unpack_slices(ms[0].config.slices_arrow_schema(), rows)    # once per class
            wm_us = wms[ms[0].clock or ms[0].family]    # a class reads one WHERE: one clock
            alone = [m for m in ms if m.key in saved or m.config.emit != "windows"]
            sharing = [m for m in ms if m not in alone]
            results = []
            for held, part in _by_table(sharing, tables):
                if len(part) == 1 and held is None:
                    alone += part
                    continue
                part_results, table_state = run_shared([m.config for m in part], table,
                                                       held[1] if held is not None else None, wm_us, counts)
                if table_state is not None:
                    shared_out.append((tuple(m.key for m in part), table_state))
                results += zip(part, part_results)
            for m in alone:
                result = run_shard(m.config, table, saved.get(m.key), wm_us, None, counts)
                if result.state is not None:
                    kept[m.key] = result.state
                results.append((m, result))
            for m, result in results:
                rows_out = _project(result.output, m)
                out.append((m.key, ipc_bytes(rows_out) if rows_out.num_rows else None,
                            json.dumps({**result.metrics, M.OUTPUT_ROWS: rows_out.num_rows})))
        if shared_out:
            kept[SHARED] = shared_out
        _run_joins(self.directory, plan, parts, saved, kept, out, self.delays)
        _run_rows(plan, parts, saved, kept, out)
        if data is not None:
            clocks = data.loc[data[MEMBER].map(_is_clock), [MEMBER, MAX_TIME]].dropna()
            for k, times in clocks.groupby(MEMBER, sort=True)[MAX_TIME]:
                out.append((k, None, json.dumps({"max_time": int(times.max())})))
        state.update((pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL),))
        if self.watermark:
            # fire at the next watermark advance even without data, so windows close (as StatefulShard)
            state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1))
        yield pd.DataFrame(out, columns=["cq_member", "cq_payload", "cq_counters"])


def _by_table(sharing: list, tables: list) -> list:
    """The members of one class that share a table, as ``[(saved table or None, members)]``: one part per saved
    table that holds any of them (the first that holds a member), the members no table holds with the first part.

    A class's members usually hold one table. After a member leaves, the remaining ones may form other classes
    (:func:`slice_classes` forms them anew from the plan at every micro-batch): members of two former classes then
    form one class and each goes on with its own table, fed the class's slices (at the gcd of the class's
    granularities, so finer than or equal to any of them: each window is still a run of whole slices); tables are
    never merged, no slice is lost. A former class split in two restores one saved table in each part.
    """
    parts: list = []
    for m in sharing:
        held = next((t for t in tables if m.key in t[0]), None)
        part = next((p for t, p in parts if t is held), None)
        if part is None:
            parts.append((held, [m]))
        else:
            part.append(m)
    loose = [p for t, p in parts if t is None]
    held_parts = [(t, p) for t, p in parts if t is not None]
    if loose and held_parts:    # new to the class (no table of its own yet): with the first table
        held_parts[0][1].extend(loose[0])
        return held_parts
    return parts


def _project(output: pa.Table, m) -> pa.Table:
    """A member's aggregation rows as its query's rows (or, with a finish, the rows the finish reads): the
    select list, ``cq_at``, and for a member that joined a running group only the windows that start at or
    after its start.
    """
    if m.start_us is not None and output.num_rows:
        starts = to_int64(output.column(0))
        output = output.filter(pc.greater_equal(starts, pa.scalar(m.start_us, pa.int64())))
    schema = m.stage_schema or m.arrow_schema
    cols = [output.column(src) for _, src in m.select]
    src, offset = m.at
    at = output.column(src)
    if offset:
        at = pc.add(to_int64(at), pa.scalar(offset, pa.int64())).cast(pa.timestamp("us", tz=at.type.tz))
    cols.append(at)
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(cols, schema)], schema=schema)


class PackRows:
    """``mapInArrow`` function of a member that runs alone: its rows as the group's output rows."""

    def __init__(self, key: str, arrow_schema: pa.Schema):
        self.key, self.arrow_schema = key, arrow_schema

    def __call__(self, batches):
        """One output row per non-empty Arrow batch."""
        for b in batches:
            if not b.num_rows:
                continue
            table = pa.Table.from_batches([b]).cast(self.arrow_schema)
            yield pa.RecordBatch.from_arrays(
                [pa.array([self.key]), pa.array([ipc_bytes(table)], pa.binary()),
                 pa.array([json.dumps({M.OUTPUT_ROWS: b.num_rows})])],
                names=["cq_member", "cq_payload", "cq_counters"])


def clock_of(counters: list[str]) -> int | None:
    """The largest event time in the clock rows' counters, or None."""
    times = [json.loads(c).get("max_time") for c in counters]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def stream_clocks(counters: dict[str, list[str]]) -> tuple[int | None, dict]:
    """From a micro-batch's counters by member key: the largest event time (µs) of all clock rows, and per
    stream (several streams in the shared stage) its largest event time in ms (:func:`~.clock.to_ms`).
    """
    overall = clock_of([c for k, cs in counters.items() if _is_clock(k) for c in cs])
    per = {}
    for k, cs in counters.items():
        stream = _stream_of_clock(k)
        t = clock_of(cs) if stream is not None else None
        if t is not None:
            per[stream] = C.to_ms(t)
    return overall, per
