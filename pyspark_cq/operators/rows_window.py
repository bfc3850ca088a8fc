"""Tuple-based windows on streams: CQL's ``[ROWS n]`` and ``[PARTITION BY … ROWS n]`` (STREAM, §2)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .. import _validate
from ..vocabulary import metrics as M
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
    ttype, partition_by, name = _checked(df, time, rows, partition_by, name)
    out_schema = T.StructType(list(df.schema.fields) + [T.StructField(SIGN, T.IntegerType(), False),
                                                        T.StructField(AT, ttype, True)])
    return _stateful(df, time, partition_by, name, out_schema, _RowsWorker, rows)


def _checked(df, time, rows, partition_by, name):
    """The window's argument checks; (the time column's type, partition_by as a list, the report name)."""
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
    return ttype, partition_by, name


def _stateful(df, time, partition_by, name, out_schema, worker_cls, rows, *extra):
    """``df`` through ``worker_cls`` per partition: with Spark's state for a stream, in one call for a batch."""
    prepared = df.withColumn(_T, F.unix_micros(_validate.ref(time).cast("timestamp")))
    ties = [c for c in df.columns if c not in (time, _FLAG) and isinstance(df.schema[c].dataType, _SORTABLE)]
    worker = worker_cls(rows, time, ties, _metrics.arrow_schema(prepared.schema),
                        _metrics.arrow_schema(out_schema), *extra)
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
        counters[M.STATE_BYTES] = len(blob)
        yield _metrics.packed_row(out, self.out_schema, **counters)

    def step(self, table: pa.Table, kept: pa.Table | None):
        """Insertions and deletions caused by ``table`` given the ``kept`` rows; the new kept rows; counters."""
        table, combined, m, counters = self._advance(table, kept)
        k, n = table.num_rows, self.rows
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
        counters.update({M.OUTPUT_ROWS: out.num_rows, M.STATE_ROWS: new_kept.num_rows, M.EVICTED_ROWS: dels.num_rows})
        return out, new_kept, counters

    def _advance(self, table: pa.Table, kept: pa.Table | None):
        """The on-time new rows in window order, kept + them, the number kept before, and the input counters."""
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
        m = kept.num_rows
        combined = pa.concat_tables([kept, table]) if m else table
        return table, combined, m, {M.INPUT_ROWS: n_in, M.LATE_ROWS: late, M.MALFORMED_ROWS: malformed}


#: The aggregates of :func:`rows_aggregate` (CQL's five).
ROWS_AGGREGATES = ("count", "sum", "avg", "min", "max")
_FLAG = "__cq_flag"
_EMITS = ("istream", "dstream", "rstream")


def rows_aggregate(df, time, rows, aggs, partition_by=(), *, where=None, emit="istream", name=None):
    """Aggregates over a tuple-based window, as CQL's ``X(SELECT a, AGG(…) FROM S [PARTITION BY a ROWS n]
    WHERE p GROUP BY a)`` (STREAM, Motwani et al., §2 and §2.4).

    At every instant τ (every distinct time at which rows arrive) each partition's window holds its last
    ``rows`` rows with time ≤ τ (as :func:`rows_window`); the aggregates are computed over those of them
    that satisfy ``where`` (a predicate applied after the window, so it does not change which rows the
    window holds). ``emit`` is the relation-to-stream operator: ``"rstream"`` gives the aggregates at every
    instant, ``"istream"`` when they differ from the previous instant's (the new values), ``"dstream"`` the
    previous values when they change; ``cq_at`` is the instant.

    Parameters
    ----------
    df : DataFrame
        A streaming DataFrame (a batch DataFrame works as one micro-batch).
    time : str
        The timestamp (or timestamp_ntz) column.
    rows : int
        Window size ``n >= 1``.
    aggs : sequence of (str, str or None, str)
        ``(output column, column or None for COUNT(*), aggregate)`` with the aggregate one of
        :data:`ROWS_AGGREGATES`; ``sum`` / ``avg`` / ``min`` / ``max`` take numeric columns. SUM of integers
        is a long (null over no row), AVG a double, MIN / MAX the column's type; nulls are skipped.
    partition_by : str or sequence of str
        The windows' partitioning columns (also the groups of the aggregates).
    where : Column, optional
        A boolean predicate over ``df``'s columns, applied after the window (null: false).
    emit : {"istream", "dstream", "rstream"}
    name : str, optional
        Name of the per-batch report, as :func:`rows_window` (``output_rows`` counts the emitted rows).

    Notes
    -----
    The values at an instant are computed from the rows of one micro-batch; a row with the same time as
    the newest kept row that arrives in a later micro-batch is still on time and gives that instant a
    second value. Sums are exact for integers (cumulative sums in int64); MIN / MAX go through float64
    (exact for |values| < 2**53).
    """
    ttype, partition_by, name = _checked(df, time, rows, partition_by, name)
    if isinstance(emit, bool) or emit not in _EMITS:
        raise ValueError(f"emit must be one of {_EMITS}, got {emit!r}")
    if isinstance(aggs, (str, bytes)) or not isinstance(aggs, (list, tuple)) or not aggs:
        raise TypeError(f"aggs must be a non-empty list of (output column, column or None, aggregate), got {aggs!r}")
    fields, specs = [], []
    for i, spec in enumerate(aggs):
        if not isinstance(spec, (list, tuple)) or len(spec) != 3:
            raise TypeError(f"aggs[{i}] must be (output column, column or None, aggregate), got {spec!r}")
        out, col, fn = spec
        if fn not in ROWS_AGGREGATES:
            raise ValueError(f"aggs[{i}]: aggregate must be one of {ROWS_AGGREGATES}, got {fn!r}")
        if not isinstance(out, str) or not out:
            raise TypeError(f"aggs[{i}]: the output column must be a non-empty str, got {out!r}")
        if col is None:
            if fn != "count":
                raise ValueError(f"aggs[{i}]: only count takes no column (COUNT(*)), {fn} needs one")
            dtype = T.LongType()
        else:
            if col not in df.columns:
                raise ValueError(f"aggs[{i}]: no column {col!r} in df; columns: {df.columns}")
            ctype = df.schema[col].dataType
            if fn != "count" and not isinstance(ctype, T.NumericType) or isinstance(ctype, T.DecimalType):
                raise TypeError(f"aggs[{i}]: {fn} needs a numeric (not decimal) column, {col!r} is "
                                f"{ctype.simpleString()}")
            integral = isinstance(ctype, T.IntegralType)
            dtype = {"count": T.LongType(), "sum": T.LongType() if integral else T.DoubleType(),
                     "avg": T.DoubleType()}.get(fn, ctype)
        fields.append(T.StructField(out, dtype, True))
        specs.append((out, col, fn))
    base = df.withColumn(_FLAG, F.coalesce(where, F.lit(False)) if where is not None else F.lit(True))
    out_schema = T.StructType([df.schema[c] for c in partition_by] + fields + [T.StructField(AT, ttype, True)])
    return _stateful(base, time, partition_by, name, out_schema, _RowsAggregateWorker, rows, partition_by,
                     specs, emit)


class _RowsAggregateWorker(_RowsWorker):
    """:func:`rows_aggregate`'s step: the window's aggregates at every instant with arrivals."""

    def __init__(self, rows, time, ties, in_schema, out_schema, parts, specs, emit):
        super().__init__(rows, time, ties, in_schema, out_schema)
        self.parts, self.specs, self.emit = parts, specs, emit

    def step(self, table: pa.Table, kept: pa.Table | None):
        """The emitted aggregates caused by ``table`` given the ``kept`` rows; the new kept rows; counters."""
        table, combined, m, counters = self._advance(table, kept)
        n, total = self.rows, combined.num_rows
        t = combined[_T].to_numpy()
        # instants: the last new row of every run of equal times; with the last kept row (the instant
        # before this batch) first, for the change streams
        p = np.arange(m, total)
        inst = p[(p == total - 1) | (t[np.minimum(p + 1, total - 1)] != t[p])]
        at = np.concatenate([[m - 1], inst]) if m else inst
        lo = np.maximum(at - n + 1, 0)
        flag = combined[_FLAG].to_numpy(zero_copy_only=False).astype(bool)
        columns, same = [], np.ones(len(at), dtype=bool)
        agg_fields = list(self.out_schema)[len(self.parts):len(self.parts) + len(self.specs)]
        for (_, col, fn), field in zip(self.specs, agg_fields):
            values, valid = self._column(combined, col, flag)
            cnt = _window_sum(valid.astype(np.int64), at, lo)
            if fn == "count":
                v, null = cnt, np.zeros(len(at), dtype=bool)
            elif fn in ("sum", "avg"):
                integral = np.issubdtype(values.dtype, np.integer)
                x = np.where(valid, values, 0).astype(np.int64 if integral else np.float64)
                v = _window_sum(x, at, lo)
                v, null = (v / np.maximum(cnt, 1) if fn == "avg" else v), cnt == 0
            else:
                s = pd.Series(np.where(valid, values.astype(np.float64), np.nan))
                roll = s.rolling(n, min_periods=1)
                v = (roll.min() if fn == "min" else roll.max()).to_numpy()[at]
                null = np.isnan(v)
            prev_v, prev_null = np.roll(v, 1), np.roll(null, 1)
            same &= (null == prev_null) & ((v == prev_v) | null)
            columns.append(pa.array(v, mask=null).cast(field.type, safe=False))
        keep = np.arange(len(at)) >= (1 if m else 0)   # the instant before the batch is not emitted itself
        if self.emit == "istream":
            keep &= ~same | (np.arange(len(at)) == 0)
        elif self.emit == "dstream":
            # the previous values, when they change; the first instant of a partition has none
            keep &= ~same & (np.arange(len(at)) > 0)
            columns = [c.take(pa.array(np.maximum(np.arange(len(at)) - 1, 0))) for c in columns]
        idx = np.nonzero(keep)[0]
        parts = [pa.array([combined[c][total - 1].as_py()] * len(idx) if total else [], combined.schema.field(c).type)
                 for c in self.parts]
        out = pa.Table.from_arrays(parts + [c.take(pa.array(idx)) for c in columns]
                                   + [combined[self.time].take(pa.array(at[idx]))], schema=self.out_schema)
        new_kept = combined.slice(max(0, total - n))
        counters.update(output_rows=out.num_rows, state_rows=new_kept.num_rows,
                        evicted_rows=max(0, total - n) - max(0, m - n))
        return out, new_kept, counters

    @staticmethod
    def _column(combined: pa.Table, col, flag):
        """The column's values (numpy) and which rows count: in ``where`` and not null."""
        if col is None:
            return np.ones(combined.num_rows, dtype=np.int64), flag
        arr = combined[col]
        valid = flag & arr.is_valid().to_numpy(zero_copy_only=False)
        values = arr.fill_null(0).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy()
        if values.dtype == bool:
            values = values.astype(np.int64)
        return values, valid


def _window_sum(x: np.ndarray, at: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Sums of ``x[lo[i] .. at[i]]`` (inclusive) by cumulative sums: exact for integers."""
    cs = np.concatenate([np.zeros(1, dtype=x.dtype), np.cumsum(x)])
    return cs[at + 1] - cs[lo]
