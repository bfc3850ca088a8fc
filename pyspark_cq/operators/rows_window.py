"""Tuple-based windows on streams: CQL's ``[ROWS n]`` and ``[PARTITION BY … ROWS n]`` (STREAM, §2)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .. import _validate
from . import _metrics
from ._agg_worker import _to_arrow
from ._state_bytes import table_from_bytes, table_to_bytes

__all__ = ["rows_window", "SIGN", "AT"]

#: Output columns: +1 when a row enters the window, -1 when it leaves; and the instant it does.
SIGN, AT = "cq_sign", "cq_at"
DEFAULT_NAME = "cq_rows_window"
STATE_SCHEMA = "rows binary"
_T = "__cq_t"  # the time as µs since the epoch (long), added before the stateful step
_SORTABLE = (T.NumericType, T.StringType, T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)


def rows_window(df, time, rows, partition_by=(), *, name=None):
    """The last ``rows`` rows of a stream, per partition, as a stream of insertions and deletions.

    CQL's tuple-based sliding window ``S [ROWS n]`` is the relation holding, at every instant τ, the
    ``n`` rows of ``S`` with the latest timestamps ≤ τ; ``S [PARTITION BY a, b ROWS n]`` keeps the last
    ``n`` rows of each partition (equal ``a, b``) and unites them (Motwani et al., "Query Processing,
    Approximation, and Resource Management in a Data Stream Management System", §2 and §2.4: a ROWS
    offset is counted back from the last tuple with timestamp ≤ τ). A relation that changes is written as
    a stream of its changes: every row appears once with ``cq_sign = +1`` and ``cq_at`` its own time (it
    enters the window: CQL's ``ISTREAM``), and once more with ``cq_sign = -1`` when the ``n``-th later row
    of its partition arrives, with ``cq_at`` that row's time (it leaves: ``DSTREAM``). The state is the
    last ``n`` rows of each partition (an Arrow table in Spark's ``GroupState``), so a query restarted
    from its checkpoint continues exactly.

    Order: rows are ordered by ``time``; rows with equal times by their other orderable columns, so the
    result does not depend on how Spark splits a micro-batch. A row older than the newest row already
    kept for its partition (it arrived in a later micro-batch) cannot enter the window any more: it is
    dropped and counted as ``late_rows``. Rows with a null time are dropped and counted as
    ``malformed_rows``.

    Parameters
    ----------
    df : DataFrame
        A streaming DataFrame (a batch DataFrame works as one micro-batch).
    time : str
        The timestamp (or timestamp_ntz) column.
    rows : int
        Window size ``n >= 1``.
    partition_by : str or sequence of str
        Partitioning columns; none: one window over the whole stream (one Spark group: no parallelism).
    name : str, optional
        Name of the per-batch report (``cq.read_metrics``): ``input_rows``, ``output_rows``,
        ``state_rows`` (rows kept in the invoked partitions), ``state_bytes``, ``evicted_rows`` (rows that
        left the window), ``late_rows``, ``malformed_rows``. Default ``"cq_rows_window"``.

    Returns
    -------
    DataFrame
        ``df``'s columns, then ``cq_sign`` (int) and ``cq_at`` (the type of ``time``). A stream is
        append-only: write it with ``outputMode("append")``.

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> from datetime import datetime
    >>> df = spark.createDataFrame([(datetime(2024, 1, 1, 0, 0, s), "u1" if s % 2 else "u2", s) for s in range(5)],
    ...                            "ts timestamp, user string, v long")
    >>> out = cq.rows_window(df, "ts", 1, "user").orderBy("cq_at", "cq_sign")
    >>> [(r.user, r.v, r.cq_sign, r.cq_at.second) for r in out.collect()]  # doctest: +NORMALIZE_WHITESPACE
    [('u2', 0, 1, 0), ('u1', 1, 1, 1), ('u2', 0, -1, 2), ('u2', 2, 1, 2), ('u1', 1, -1, 3), ('u1', 3, 1, 3),
     ('u2', 2, -1, 4), ('u2', 4, 1, 4)]
    """
    _validate.dataframe(df, "df")
    ttype = _validate.time_column(df, time, "time")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int (the window's number of rows), got {rows!r}")
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    if isinstance(partition_by, (bytes, dict)) or not all(isinstance(c, str) for c in partition_by):
        raise TypeError(f"partition_by must be a column name or a sequence of column names, got {partition_by!r}")
    partition_by = list(partition_by)
    for c in partition_by:
        if c not in df.columns:
            raise ValueError(f"partition_by: no column {c!r} in df; columns: {df.columns}")
    for c in (SIGN, AT, _T):
        if c in df.columns:
            raise ValueError(f"df already has a column {c!r}, which rows_window adds; rename it first")
    if name is None:
        name = DEFAULT_NAME
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    t = _validate.ref(time)
    prepared = df.withColumn(_T, F.unix_micros(t.cast("timestamp")))
    out_schema = T.StructType(list(df.schema.fields) + [T.StructField(SIGN, T.IntegerType(), False),
                                                        T.StructField(AT, ttype, True)])
    ties = [c for c in df.columns if c != time and isinstance(df.schema[c].dataType, _SORTABLE)]
    worker = _RowsWorker(rows, time, ties, _metrics.arrow_schema(prepared.schema),
                         _metrics.arrow_schema(out_schema))
    keys = [_validate.ref(c) for c in partition_by] or [F.lit(0).alias("__cq_all")]
    if df.isStreaming:
        packed = prepared.groupBy(*keys).applyInPandasWithState(
            worker, _metrics.packed_schema(out_schema), STATE_SCHEMA, "append", "NoTimeout")
    else:
        def batch(pdf):  # a plain one-argument function: PySpark passes the key to two-argument ones
            return worker.batch(pdf)

        packed = prepared.groupBy(*keys).applyInPandas(batch, _metrics.packed_schema(out_schema))
    return _metrics.attach_packed(packed, name, out_schema)


class _RowsWorker:
    """The stateful step of one partition and micro-batch (picklable for Spark's Python workers)."""

    def __init__(self, rows: int, time: str, ties: list[str], in_schema: pa.Schema, out_schema: pa.Schema):
        self.rows, self.time, self.ties = rows, time, ties
        self.in_schema, self.out_schema = in_schema, out_schema

    def batch(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """``applyInPandas`` form (batch input): one call with no previous state."""
        table = _to_arrow(pdf, self.in_schema)
        out, _, counters = self.step(table, None)
        return _metrics.packed_row(out, self.out_schema, **counters)

    def __call__(self, key, pdfs, state):
        frames = [p for p in pdfs if len(p)]
        table = (pa.concat_tables([_to_arrow(p, self.in_schema) for p in frames]) if frames
                 else self.in_schema.empty_table())
        kept = table_from_bytes(state.get[0]) if state.exists else None
        out, new_state, counters = self.step(table, kept)
        blob = table_to_bytes(new_state)
        state.update((blob,))
        counters["state_bytes"] = len(blob)
        yield _metrics.packed_row(out, self.out_schema, **counters)

    def step(self, table: pa.Table, kept: pa.Table | None):
        """Insertions and deletions caused by ``table`` given the ``kept`` rows; the new kept rows; counters."""
        n_in = table.num_rows
        valid = pc.is_valid(table[_T])
        malformed = n_in - pc.sum(valid).as_py() if n_in else 0
        table = table.filter(valid)
        order = [(_T, "ascending")] + [(c, "ascending") for c in self.ties]
        table = table.sort_by(order) if table.num_rows > 1 else table
        if kept is None:
            kept = self.in_schema.empty_table()
        late = 0
        if kept.num_rows and table.num_rows:
            newest = kept[_T][kept.num_rows - 1].as_py()
            on_time = pc.greater_equal(table[_T], newest)
            late = table.num_rows - pc.sum(on_time).as_py()
            table = table.filter(on_time)
        m, k, n = kept.num_rows, table.num_rows, self.rows
        combined = pa.concat_tables([kept, table]) if m else table
        # Arrival p (0-based over kept + new) pushes out row p - n.
        positions = np.arange(m, m + k)
        pushed = positions - n
        leaving = pushed >= 0
        ins = table.append_column(SIGN, pa.array(np.ones(k, dtype=np.int32))).append_column(AT, table[self.time])
        dels = combined.take(pa.array(pushed[leaving]))
        dels = dels.append_column(SIGN, pa.array(np.full(dels.num_rows, -1, dtype=np.int32))).append_column(
            AT, table[self.time].take(pa.array(np.nonzero(leaving)[0])))
        out = pa.concat_tables([ins, dels]).drop_columns([_T])
        new_kept = combined.slice(max(0, combined.num_rows - n))
        counters = {"input_rows": n_in, "output_rows": out.num_rows, "state_rows": new_kept.num_rows,
                    "evicted_rows": dels.num_rows, "late_rows": late, "malformed_rows": malformed}
        return out, new_kept, counters
