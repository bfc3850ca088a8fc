"""The Spark-worker side of a :class:`~pyspark_cq.QueryGroup`: one slicer and one stateful stage per stream for
all the group's windowed aggregations over it, and the packing of every query's rows into one output schema.

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
"""
from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from .. import _validate
from ..operators.aggregate.config import BAD, SHARD, SHED_COL, SLICES, TAG, TIME
from ..operators.aggregate.shard import run_shard, run_shared
from ..operators.aggregate.slicer import Slicer
from ..operators.aggregate.spec import arrow_type, to_int64
from ..operators.aggregate.transport import unpack_slices
from ..vocabulary import metrics as M
from . import doc as D
from .predicates import evaluate

__all__ = ["MEMBER", "MAX_TIME", "OUTPUT_SCHEMA", "STATE_SCHEMA", "SHARED", "sliced_schema", "slice_classes",
           "GroupSlicer", "GroupShard", "PackRows", "ipc_bytes"]

MEMBER, MAX_TIME = "__cq_member", "__cq_max_time"
#: What every branch of the group's Spark query gives: per query (its state key) its rows as one Arrow IPC
#: stream, and its counters as JSON.
OUTPUT_SCHEMA = "cq_member string, cq_payload binary, cq_counters string"
STATE_SCHEMA = "members binary"
#: The member key of the rows that carry the event times seen (for queries joining a running group).
CLOCK = ""
#: The key, in a shard's saved state, of the slice tables several members share: ``[(member keys, state)]``.
SHARED = "\x00shared"


def sliced_schema(time_type: T.DataType, delay_ms: int | None) -> T.StructType:
    """The shared slicer's output: per shard and member one packed message of slices (as
    :meth:`~pyspark_cq.operators.aggregate.config.AggConfig.packed_schema`), and the largest event time of
    the task's input; with a watermark the all-null tag column that carries it to the stateful stage.
    """
    fields = [T.StructField(SHARD, T.LongType(), False), T.StructField(MEMBER, T.StringType(), False),
              T.StructField(SLICES, T.BinaryType(), False), T.StructField(BAD, T.LongType(), False),
              T.StructField(SHED_COL, T.LongType(), False), T.StructField(MAX_TIME, T.LongType(), True)]
    if delay_ms is not None:
        fields.append(T.StructField(TAG, time_type, True, {_validate.WATERMARK_KEY: delay_ms}))
    return T.StructType(fields)


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _members(directory: str, family: str) -> list:
    plan = D.read_plan(directory)
    if plan is None:
        raise RuntimeError(f"query group: its plan {directory}/plan.pkl is missing (micro-batch "
                           f"{_validate.micro_batch_id()}); was the checkpoint directory removed?")
    return [m for m in plan.members.values() if m.kind == "shared" and m.family == family and m.active]


def slice_classes(members: list) -> dict[str, str]:
    """Each member's *slice class*: the key of the first member (in plan order) whose slicer reads the same rows
    with the same configuration, so that its slices are the same (PIPES's shared slices, Cammert et al., §2.4.1;
    STREAM's shared subplans, Motwani et al., §3.2).

    Members that differ only in window, slide, output (RSTREAM / ISTREAM / DSTREAM) or name slice alike: the
    slicer cuts the rows at the granularity and pre-aggregates per key, and the window is applied only by each
    member's sweep (:func:`~pyspark_cq.operators.aggregate.shard.run_shard`). The slicer stage slices once per
    class and the stateful stage unpacks once per class. Plan order and ``==`` (no hashing, no pickling) make
    the classes the same in every process that reads one plan.
    """
    reps: list = []
    out = {}
    for m in members:
        sig = _slice_signature(m)
        out[m.key] = next((k for s, k in reps if s == sig), m.key)
        if out[m.key] == m.key:
            reps.append((sig, m.key))
    return out


def _slice_signature(m) -> tuple:
    """What a member's slices depend on: its rows (WHERE, start, input columns) and its configuration without
    what only the sweep reads.
    """
    return (m.mask, m.arrow_filter, m.start_us, m.columns,
            replace(m.config, window=0, slide=0, emit="windows", name="", out_names=()))


class GroupSlicer:
    """``mapInArrow`` function of one stream's shared stage: each member's slices of the rows its WHERE keeps
    (and, for a member that joined a running group, whose time is at or after its start).
    """

    def __init__(self, directory: str, family: str, time_type: T.DataType, delay_ms: int | None):
        self.directory, self.family, self.delay_ms = directory, family, delay_ms
        self.time_type = time_type
        self.names = sliced_schema(time_type, delay_ms).names

    def __call__(self, batches):
        """The packed slices of every member for the task's Arrow ``batches``, then the clock row."""
        batches = [b for b in batches if b.num_rows]
        members = _members(self.directory, self.family)
        latest = None
        for b in batches:
            t = to_int64(b.column(TIME))
            if t.null_count < len(t):
                m = int(pc.max(t).as_py())
                latest = m if latest is None else max(latest, m)
        classes = slice_classes(members)
        for m in members:
            if classes[m.key] != m.key:
                continue    # sliced with its class's first member
            slicer = Slicer(m.config, self.delay_ms is not None, markers=True, packed=True)
            for out in slicer(self._view(b, m) for b in batches):
                yield self._tagged(out, m.key)
        n = 1
        cols = [pa.array([0], pa.int64()), pa.array([CLOCK]), pa.array([b""], pa.binary()),
                pa.array([0], pa.int64()), pa.array([0], pa.int64()), pa.array([latest], pa.int64())]
        if self.delay_ms is not None:
            cols.append(pa.nulls(n, type=arrow_type(self.time_type)))
        yield pa.RecordBatch.from_arrays(cols, names=self.names)

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

    def _tagged(self, out: pa.RecordBatch, key: str) -> pa.RecordBatch:
        """A member slicer's packed rows with the member column and an empty event-time column."""
        n = out.num_rows
        cols = [out.column(0), pa.array([key] * n, pa.string())] + [out.column(i) for i in (1, 2, 3)]
        cols.append(pa.nulls(n, type=pa.int64()))
        if self.delay_ms is not None:
            cols.append(out.column(4))
        return pa.RecordBatch.from_arrays(cols, names=self.names)


class GroupShard:
    """``applyInPandasWithState`` function of one stream's shared stage: one shard, one micro-batch, every
    member. The state row holds the slice tables by member key, and under :data:`SHARED` the tables that
    several members of one slice class share (:func:`~pyspark_cq.operators.aggregate.shard.run_shared`);
    a member that left the plan leaves the state with it.

    A member runs on a table of its own when it emits change intervals, when this shard already holds a
    table of its own for it (a checkpoint written before tables were shared, or a member that was alone in
    its class), or when it is alone in its class and no shared table holds it.
    """

    def __init__(self, directory: str, family: str, watermark: bool):
        self.directory, self.family, self.watermark = directory, family, watermark

    def __call__(self, key, pdfs, state):
        """Each member's output rows and counters, one row per member (and the clock row)."""
        frames = [p for p in pdfs if len(p)]
        data = pd.concat(frames, ignore_index=True) if frames else None
        saved = pickle.loads(state.get[0]) if state.exists else {}
        tables = saved.pop(SHARED, [])
        wm_us = int(state.getCurrentWatermarkMs()) * 1000 if self.watermark else None
        kept, out = {}, []
        members = _members(self.directory, self.family)
        classes = slice_classes(members)
        parts = dict(tuple(data.groupby(MEMBER, sort=False))) if data is not None else {}
        by_class: dict = {}
        for m in members:
            by_class.setdefault(classes[m.key], []).append(m)
        shared_out = []
        for cls, ms in by_class.items():
            rows = [parts[cls]] if cls in parts else []
            table, counts = unpack_slices(ms[0].config.slices_arrow_schema(), rows)    # once per class
            alone = [m for m in ms if m.key in saved or m.config.emit != "windows"]
            sharing = [m for m in ms if m not in alone]
            keys = {m.key for m in sharing}
            held = next((t for t in tables if keys & set(t[0])), None)
            if len(sharing) > 1 or held is not None:
                results, table_state = run_shared([m.config for m in sharing], table,
                                                  held[1] if held is not None else None, wm_us, counts)
                if table_state is not None:
                    shared_out.append((tuple(m.key for m in sharing), table_state))
                results = list(zip(sharing, results))
            else:
                alone += sharing
                results = []
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
        if data is not None:
            clock = data.loc[data[MEMBER] == CLOCK, MAX_TIME].dropna()
            if len(clock):
                out.append((CLOCK, None, json.dumps({"max_time": int(clock.max())})))
        state.update((pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL),))
        if self.watermark:
            # fire at the next watermark advance even without data, so windows close (as StatefulShard)
            state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1))
        yield pd.DataFrame(out, columns=["cq_member", "cq_payload", "cq_counters"])


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
