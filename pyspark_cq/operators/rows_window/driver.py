"""Tuple-based windows on streams: CQL's ``[ROWS n]`` and ``[PARTITION BY … ROWS n]`` (STREAM, §2)."""
from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from .._common import metrics as _metrics
from .worker import _FLAG, _T, AT, SIGN, _RowsAggregateWorker, _RowsWorker

__all__ = ["rows_window", "SIGN", "AT"]

DEFAULT_NAME = "cq_rows_window"
_ALL = "__cq_all"   # the group column of a window without PARTITION BY
STATE_SCHEMA = "rows binary"
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
    return _stateful(df, time, partition_by, name, window_schema(df, ttype), _RowsWorker, rows)


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
    for c in (SIGN, AT, _T, _ALL):
        if c in df.columns:
            raise ValueError(f"df already has a column {c!r}, which rows_window adds; rename it first")
    if name is None:
        name = DEFAULT_NAME
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return ttype, partition_by, name


def prepared_worker(df, time, out_schema, worker_cls, rows, *extra):
    """``df`` with the time in µs (the worker's input) and the per-partition step ``worker_cls`` for it: what
    :func:`rows_window` runs per partition, and a query group's ROWS member per partition in its shared stage
    (:mod:`pyspark_cq.group.worker`).
    """
    prepared = df.withColumn(_T, F.unix_micros(_validate.ref(time).cast("timestamp")))
    ties = [c for c in df.columns if c not in (time, _FLAG) and isinstance(df.schema[c].dataType, _SORTABLE)]
    return prepared, worker_cls(rows, time, ties, _metrics.arrow_schema(prepared.schema),
                                _metrics.arrow_schema(out_schema), *extra)


def window_schema(df, ttype) -> T.StructType:
    """:func:`rows_window`'s output schema: ``df``'s columns, then ``cq_sign`` and ``cq_at`` (``ttype``)."""
    return T.StructType(list(df.schema.fields) + [T.StructField(SIGN, T.IntegerType(), False),
                                                  T.StructField(AT, ttype, True)])


def _stateful(df, time, partition_by, name, out_schema, worker_cls, rows, *extra):
    """``df`` through ``worker_cls`` per partition: with Spark's state for a stream, in one call for a batch."""
    prepared, worker = prepared_worker(df, time, out_schema, worker_cls, rows, *extra)
    if partition_by:
        keys = [_validate.ref(c) for c in partition_by]
    else:   # one window: a constant column (Spark 4.3 cannot group applyInPandasWithState by a literal expression:
        # RESOLVED_ATTRIBUTE_MISSING_FROM_INPUT); the worker reads its input schema's columns only
        prepared = prepared.withColumn(_ALL, F.lit(0))
        keys = [F.col(_ALL)]
    if df.isStreaming:
        packed = prepared.groupBy(*keys).applyInPandasWithState(
            worker, _metrics.packed_schema(out_schema), STATE_SCHEMA, "append", "NoTimeout")
    else:
        def batch(pdf):  # a plain one-argument function: PySpark passes the key to two-argument ones
            return worker.batch(pdf)

        packed = prepared.groupBy(*keys).applyInPandas(batch, _metrics.packed_schema(out_schema))
    return _metrics.attach_packed(packed, name, out_schema)


#: The aggregates of :func:`rows_aggregate` (CQL's five).
ROWS_AGGREGATES = ("count", "sum", "avg", "min", "max")
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
    base, out_schema, extra = _aggregate_input(df, ttype, aggs, partition_by, where, emit)
    return _stateful(base, time, partition_by, name, out_schema, _RowsAggregateWorker, rows, *extra)


def aggregate_step(df, time, rows, aggs, partition_by=(), *, where=None, emit="istream"):
    """:func:`rows_aggregate`'s input (``df`` with the time in µs and the ``where`` flag) and its per-partition step
    (``_RowsAggregateWorker``), checked as :func:`rows_aggregate` checks them: what a query group's shared stage
    runs per partition for an aggregate over a ROWS window (:mod:`pyspark_cq.group.rows`).
    """
    ttype, partition_by, _ = _checked(df, time, rows, partition_by, None)
    base, out_schema, extra = _aggregate_input(df, ttype, aggs, partition_by, where, emit)
    return prepared_worker(base, time, out_schema, _RowsAggregateWorker, rows, *extra)


def _aggregate_input(df, ttype, aggs, partition_by, where, emit):
    """:func:`rows_aggregate`'s argument checks: ``df`` with the ``where`` flag, the output schema and the
    step's extra arguments ``(partition_by, specs, emit)``.
    """
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
    return base, out_schema, (partition_by, specs, emit)


