"""ROWS windows in a :class:`~pyspark_cq.QueryGroup`'s shared stage (pure: pyarrow only, no Spark).

CQL's ``S [PARTITION BY a ROWS n]`` keeps the last ``n`` rows of each partition (Motwani et al., STREAM, §2, §2.4);
:func:`pyspark_cq.rows_window` runs it with one Spark group per partition (``applyInPandasWithState``, the last ``n``
rows in its state). Spark allows one ``applyInPandasWithState`` per streaming query, so a group runs a ROWS member in
its shared stage instead: the member's rows are routed to the group's shards by the hash of the partition key, and
per shard :func:`run_rows` splits them by partition and runs the operator's own per-partition step
(``_RowsWorker.step``) on each with that partition's kept rows, which live in the shard's state row. Each partition
sees the rows it sees alone in the same micro-batch, so its insertions, deletions and late rows are its query's.
An aggregate over a ROWS window runs :func:`pyspark_cq.rows_aggregate`'s step (``_RowsAggregateWorker.step``) the
same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..operators._common.state_bytes import table_from_bytes, table_to_bytes
from ..operators.rows_window.worker import SIGN
from ..vocabulary import metrics as M

__all__ = ["ROWS", "RowsMember", "partitions", "run_rows"]

#: The member key prefix of a ROWS member's rows in the shared stage, and its state's key in a shard's saved state.
ROWS = "\x03rows:"


@dataclass(frozen=True)
class RowsMember:
    """What a ROWS member of a group runs (its :class:`~.doc.MemberSpec`'s ``config``).

    Attributes
    ----------
    stream : str
        The group's name of its stream.
    partition_by : tuple of str
        Its ``PARTITION BY`` columns (empty: one window over the stream).
    worker : object
        The rows_window operator's per-partition step (``_RowsWorker``, built by
        :func:`~pyspark_cq.operators.rows_window.driver.prepared_worker` over the query's input).
    sign : int or None
        +1 (``ISTREAM``: rows entering the window) or -1 (``DSTREAM``: rows leaving it), as the compiler keeps;
        None for an aggregate over the window (``rows_aggregate``'s step: its rows are what it emits).
    """

    stream: str
    partition_by: tuple
    worker: object
    sign: int


def partitions(table: pa.Table, columns) -> list:
    """``table``'s rows by partition: ``[(key tuple, row indices)]`` in first-seen order; a null is a key value (as
    Spark's ``groupBy``); no ``columns``: one partition ``()`` of every row.
    """
    if not columns:
        return [((), np.arange(table.num_rows))] if table.num_rows else []
    keys = list(zip(*[table.column(c).to_pylist() for c in columns]))
    out: dict = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return [(k, np.asarray(ix, dtype=np.int64)) for k, ix in out.items()]


def run_rows(member: RowsMember, table: pa.Table | None, held: dict | None) -> tuple:
    """One shard's micro-batch of a ROWS member: ``table`` (its input rows in the worker's input schema, or None)
    through the operator's step per partition, with ``held`` (partition key -> ``(rows, bytes)`` of its kept rows)
    the kept rows.

    Returns
    -------
    tuple
        ``(rows, held, counters)``: its rows (the input's columns without the time in µs, then ``cq_at``: the rows
        entering the window for ``sign`` +1, leaving for -1; for ``sign`` None, an aggregate's, the step's rows),
        the kept rows by partition, and its counters (``state_rows`` / ``state_bytes`` over every partition the
        shard keeps).
    """
    worker = member.worker
    held = dict(held or {})
    counters = {M.INPUT_ROWS: 0, M.LATE_ROWS: 0, M.MALFORMED_ROWS: 0, M.EVICTED_ROWS: 0}
    parts = []
    if table is not None and table.num_rows:
        table = table.select(worker.in_schema.names).cast(worker.in_schema)
        for key, ix in partitions(table, member.partition_by):
            kept = table_from_bytes(held[key][1]) if key in held else None
            out, new_kept, c = worker.step(table.take(pa.array(ix)), kept)
            held[key] = (new_kept.num_rows, table_to_bytes(new_kept))
            for k in counters:
                counters[k] += int(c.get(k, 0))
            parts.append(out if member.sign is None else
                         out.filter(pc.equal(out.column(SIGN), member.sign)).drop_columns([SIGN]))
    names = [f.name for f in worker.out_schema if f.name != SIGN]
    rows = pa.concat_tables(parts) if parts else pa.schema([worker.out_schema.field(n) for n in names]).empty_table()
    counters[M.OUTPUT_ROWS] = rows.num_rows
    counters[M.STATE_ROWS] = sum(n for n, _ in held.values())
    counters[M.STATE_BYTES] = sum(len(b) for _, b in held.values())
    return rows, held, counters
