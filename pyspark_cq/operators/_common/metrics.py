"""Per-batch operator metrics, one mechanism for every pyspark-cq operator.

Operators run in Spark's Python workers, so they report their counters through the data itself: next to
its data rows a stateful operator emits one *metrics row* per group invocation (``METRICS_ROW`` column
true, the data columns null, the counters in ``__cq_<metric>`` columns). :func:`attach` sums the counters
with ``DataFrame.observe`` under the operator's name and removes metrics rows and columns, so the user's
output is unchanged and the driver reads the per-batch numbers from
``StreamingQueryProgress.observedMetrics`` with :func:`read` (``cq.read_metrics``), never directly: for
operators whose late rows Spark drops first (the joins), ``late_rows`` is computed by :func:`read` from a
second observation (:func:`observe_input`), and Spark Connect delivers each entry in another shape.
Stateless operators (Γ) report the same way from a per-row status column.

Streaming stateful operators return their rows *packed* instead (:func:`packed_row`,
:func:`attach_packed`): one row per group invocation holding the counters and the data rows, after the
counters are observed unpacked by Spark itself (``explode(arrays_zip(...))`` over one array cell per output
column) or, for output types without an array form, from an Arrow IPC stream by a ``mapInArrow``. PySpark's
``applyInPandasWithState`` pads its state frame with four ``None`` cells per returned data row and
converts every data row from pandas (together ~6-7 µs per row, more than our operators spend per input
row); one packed row per group costs neither, and array cells spare the extra Python stage (a worker
round trip per task and micro-batch) that IPC unpacking needs.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ...vocabulary import metrics as M

METRICS_ROW = "__cq_report"
#: Counters every stateful operator reports per micro-batch (sums over the invoked groups).
METRICS = M.STATEFUL
PREFIX = "__cq_"
_EPOCH_NTZ = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"


def _col(metric: str) -> str:
    return PREFIX + metric


def metrics_schema(schema: T.StructType) -> T.StructType:
    """``schema`` plus the metrics columns, for the operator's ``outputStructType``."""
    fields = list(schema.fields) + [T.StructField(METRICS_ROW, T.BooleanType(), False)]
    fields += [T.StructField(_col(m), T.LongType(), True) for m in METRICS]
    return T.StructType(fields)


# Arrow -> pandas for data rows: nullable extension dtypes, so that numeric nulls survive (a plain
# int64 column with nulls would become float64, a null double an indistinguishable NaN).
_PANDAS_TYPES = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
                 pa.int64(): pd.Int64Dtype(), pa.float32(): pd.Float32Dtype(), pa.float64(): pd.Float64Dtype(),
                 pa.bool_(): pd.BooleanDtype()}


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow -> pandas without losing nulls in numeric columns (dates stay ``datetime.date`` objects)."""
    return table.to_pandas(types_mapper=_PANDAS_TYPES.get, date_as_object=True)


def data_rows(pdf: pd.DataFrame) -> pd.DataFrame:
    """Mark a pandas frame of data rows (columns of the operator's output schema, in order)."""
    out = pdf.copy(deep=False)
    out[METRICS_ROW] = False
    n = len(out)
    for m in METRICS:
        # Typed all-null columns: Spark converts them to Arrow ~30x faster than object columns of None.
        out[_col(m)] = pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    return out


def metrics_row(columns, **metrics: int) -> pd.DataFrame:
    """One metrics row: the data ``columns`` null, the given counters set (others 0)."""
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"metrics: unknown counter(s) {sorted(unknown)}; known: {METRICS}")
    row = {c: [None] for c in columns}
    row[METRICS_ROW] = [True]
    for m in METRICS:
        row[_col(m)] = [int(metrics.get(m, 0))]
    return pd.DataFrame(row)


PACKED = "__cq_rows"  #: binary: the data rows of one group invocation as an Arrow IPC stream
_ARRAY = "__cq_a"     #: array<...> per output column: its values in one group invocation
_NAN = "__cq_nan"     #: array<boolean> per floating output column: which values are NaN (empty: none)


def _array_kind(t: pa.DataType) -> str | None:
    """How a column of Arrow type ``t`` travels as an array cell: ``"same"`` (its own type), ``"micros"``
    (a timestamp as int64 microseconds), ``"days"`` (a date as int32 days), or None (not supported: the
    rows travel as an IPC stream).
    """
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t):
        return "same"
    if pa.types.is_timestamp(t) and t.unit == "us":
        return "micros"
    if pa.types.is_date32(t):
        return "days"
    return None


def array_layout(schema: pa.Schema) -> bool:
    """Whether rows of the Arrow ``schema`` are returned as array cells (every column's type has an
    array form) rather than as one Arrow IPC stream unpacked by a ``mapInArrow``.
    """
    return all(_array_kind(f.type) is not None for f in schema)


def packed_schema(schema: T.StructType, metrics=METRICS) -> T.StructType:
    """Output schema of a stateful function that returns :func:`packed_row` frames, for an operator whose
    output schema is ``schema``: an array column per output column (and a NaN-flags column per floating one)
    when :func:`array_layout` allows, else one binary column; then the counters.
    """
    arrow = arrow_schema(schema)
    if array_layout(arrow):
        fields = []
        for i, (f, a) in enumerate(zip(schema.fields, arrow)):
            element = {"same": f.dataType, "micros": T.LongType(), "days": T.IntegerType()}[_array_kind(a.type)]
            fields.append(T.StructField(f"{_ARRAY}{i}", T.ArrayType(element, True), True))
            if pa.types.is_floating(a.type):
                fields.append(T.StructField(f"{_NAN}{i}", T.ArrayType(T.BooleanType(), True), True))
    else:
        fields = [T.StructField(PACKED, T.BinaryType(), True)]
    return T.StructType(fields + [T.StructField(_col(m), T.LongType(), True) for m in metrics])


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema Spark expects from ``mapInArrow`` for a Spark ``schema`` (UTC timestamps)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _array_cells(column: pa.Array, kind: str) -> tuple[object, list]:
    """One output column as the array cell PySpark converts (``list(cell)`` per cell, then Arrow), and the
    positions of NaN values (floating columns; empty when none). NaN travels as a flag because PySpark's
    conversion turns a NaN inside an array into null.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if kind == "micros":
        column = column.cast(pa.int64())
    elif kind == "days":
        column = column.cast(pa.int32())
    nan: list = []
    if pa.types.is_floating(column.type):
        flags = pc.fill_null(pc.is_nan(column), False)
        if pc.any(flags).as_py():
            nan = flags.to_numpy(zero_copy_only=False)
            column = pc.if_else(flags, pa.scalar(0, column.type), column)
    # numpy cells convert fastest; a column with nulls goes as a list holding None
    return (column.to_pylist() if column.null_count else column.to_numpy(zero_copy_only=False)), nan


def packed_row(table: pa.Table | None, schema: pa.Schema, metrics=METRICS, **counters: int) -> pd.DataFrame:
    """One packed output row: ``table`` (cast to ``schema``, the operator's Arrow output schema) as array
    cells or an IPC stream (see :func:`packed_schema`), or null when there are no rows, and the
    ``counters`` (others 0).
    """
    unknown = set(counters) - set(metrics)
    if unknown:
        raise ValueError(f"counters: unknown counter(s) {sorted(unknown)}; known: {metrics}")
    rows = table is not None and table.num_rows > 0
    if rows and table.schema != schema:
        table = table.rename_columns(schema.names).cast(schema)
    row = {}
    if array_layout(schema):
        for i, field in enumerate(schema):
            cell, nan = _array_cells(table.column(i), _array_kind(field.type)) if rows else (None, [])
            row[f"{_ARRAY}{i}"] = _cell(cell)
            if pa.types.is_floating(field.type):
                row[f"{_NAN}{i}"] = _cell(nan)   # empty, not null: arrays_zip would make the row null
    else:
        blob = None
        if rows:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema) as writer:
                writer.write_table(table)
            blob = sink.getvalue().to_pybytes()
        row[PACKED] = _cell(blob)
    for m in metrics:   # a mask per column: the frame's columns must not share (and co-modify) one
        row[_col(m)] = pd.arrays.IntegerArray(np.array([int(counters.get(m, 0))], dtype=np.int64),
                                              np.zeros(1, dtype=bool))
    # Arrays and an explicit index, not Series or pd.array(..., dtype="Int64"): the same frame (object cells,
    # Int64 counters) in a third of the time (~1 ms less per group and micro-batch, issue 14).
    return pd.DataFrame(row, index=_ONE_ROW, copy=False)


_ONE_ROW = pd.RangeIndex(1)


def _cell(value) -> np.ndarray:
    """A one-row object column holding ``value`` as is (pandas would unwrap a one-element array)."""
    cell = np.empty(1, dtype=object)
    cell[0] = value
    return cell


class _Unpack:
    """``mapInArrow`` function: the record batches of every packed row, in order."""

    def __call__(self, batches):
        for batch in batches:
            for blob in batch.column(0):
                if blob.is_valid:
                    yield from pa.ipc.open_stream(blob.as_buffer())


def attach_packed(df, name: str, schema: T.StructType, metrics=METRICS, peaks=()):
    """:func:`attach` for packed output: observe the counters under ``name`` (summed over the groups; those in
    ``peaks``: their maximum) and unpack the data rows, whose Spark ``schema`` is the operator's output
    schema. Array cells are unpacked by Spark itself (``explode(arrays_zip(...))``), so the rows leave the
    operator without another Python stage.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    observed = df.observe(name, *[F.coalesce((F.max if m in peaks else F.sum)(_col(m)), F.lit(0)).alias(m)
                                  for m in metrics])
    arrow = arrow_schema(schema)
    if not array_layout(arrow):
        return observed.select(PACKED).mapInArrow(_Unpack(), schema)
    names = [c for c in observed.columns if c.startswith((_ARRAY, _NAN))]
    rows = observed.select(F.explode(F.arrays_zip(*[F.col(c) for c in names])).alias("z"))
    out = []
    for i, (f, a) in enumerate(zip(schema.fields, arrow)):
        v = F.col("z")[f"{_ARRAY}{i}"]
        kind = _array_kind(a.type)
        if kind == "micros":
            v = (F.timestamp_micros(v) if isinstance(f.dataType, T.TimestampType)
                 else F.timestamp_add("MICROSECOND", v, F.expr(_EPOCH_NTZ)))
        elif kind == "days":
            v = F.date_from_unix_date(v)
        elif pa.types.is_floating(a.type):
            v = F.when(F.col("z")[f"{_NAN}{i}"], F.lit(float("nan")).cast(f.dataType)).otherwise(v)
        out.append(v.alias(f.name))
    return rows.select(*out)


def attach(df, name: str, counters: Mapping[str, object] | None = None, keep=None, drop=()):
    """Turn an operator's raw output into the user's output and register its observed metrics.

    Parameters
    ----------
    df : DataFrame
        The operator's output. Without ``counters`` it must carry the metrics columns of
        :func:`metrics_schema`.
    name : str
        The observed-metrics name (unique within a query).
    counters : mapping of str to Column, optional
        For stateless operators: metric name -> aggregate Column (e.g. ``F.sum(...)``).
    keep : Column, optional
        With ``counters``: which rows are data rows.
    drop : sequence of str
        With ``counters``: helper columns to remove after observing.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if counters is None:
        exprs = [F.coalesce(F.sum(_col(m)), F.lit(0)).alias(m) for m in METRICS]
        keep = ~F.col(METRICS_ROW)
        drop = [METRICS_ROW] + [_col(m) for m in METRICS]
    else:
        exprs = [F.coalesce(c, F.lit(0)).alias(m) for m, c in counters.items()]
    observed = df.observe(name, *exprs)
    if keep is not None:
        observed = observed.filter(keep)
    return observed.drop(*drop) if drop else observed


def read(progress, name: str, batch=None) -> dict[str, int] | None:
    """The counters an operator named ``name`` reported in one batch.

    Parameters
    ----------
    progress : StreamingQuery, StreamingQueryProgress, dict or QueryGroup
        A query (one of its retained progresses is read, see ``batch``), one progress (classic or Spark
        Connect, e.g. ``event.progress`` in a ``StreamingQueryListener``) or its JSON dict; or a
        :class:`~pyspark_cq.QueryGroup` (:meth:`~pyspark_cq.QueryGroup.query_metrics`).
    name : str
        The operator's ``name`` (of a group: the query's name).
    batch : None, "last", int, "total" or "all"
        Which batch of a query: None (default) the latest batch in which something happened (input rows
        for the query, or rows in, out or evicted for the operator), so that the no-data batch that
        typically ends an ``availableNow`` run does not hide the counters of the batch before it;
        ``"last"`` the last progress as it is (``query.lastProgress``); an int the batch with that
        ``batchId`` among ``query.recentProgress`` (None if Spark no longer retains it); ``"total"`` the
        counters over every batch Spark retains (:func:`total`: counts summed, state sizes as of the last
        batch, peaks their maximum); ``"all"`` a list of ``(batch_id, counters)``, oldest first. Spark
        retains the last ``spark.sql.streaming.numRecentProgressUpdates`` progresses (default 100) of the
        query's current run: ``"total"`` warns when older batches of the run are no longer retained. Only
        with a query.

    Returns
    -------
    dict of str to int, list or None
        The counters, None when the batch has no metrics under that name. ``late_rows`` includes the
        rows Spark dropped before the operator's function (counted under ``<name>__input``), which the
        raw ``progress.observedMetrics[name]`` does not.
    """
    if hasattr(progress, "query_metrics"):   # a QueryGroup: the counters of its query ``name``
        return progress.query_metrics(name, batch)
    if hasattr(progress, "lastProgress"):
        return _read_query(progress, name, batch)
    if batch is not None:
        raise TypeError(f"batch applies to a StreamingQuery, got a {type(progress).__name__} (one batch already)")
    return _read_progress(progress, name)


def _field(progress, key: str):
    return progress.get(key) if isinstance(progress, dict) else getattr(progress, key, None)


def total(reports) -> dict[str, int]:
    """One operator's counters over several batches (``reports``: their counters, oldest first).

    Counts (rows in, out, late, ...) add up; a state size (``state_rows``, ``state_bytes``, per input too) is
    the last batch's, the state left at the end; a per-batch maximum (``peak_*``, ``banded_*``) is the
    largest.
    """
    out: dict[str, int] = {}
    for values in reports:
        for key, v in values.items():
            if M.is_state_size(key):
                out[key] = v
            elif M.is_peak(key):
                out[key] = max(out.get(key, v), v)
            else:
                out[key] = out.get(key, 0) + v
    return out


def _history(query, name: str) -> list[tuple[int, dict[str, int]]]:
    """``(batch_id, counters)`` of the retained progresses that carry ``name``'s metrics, oldest first, one
    per batch (a batch retried after a failure reports again: its last report counts).
    """
    by_batch: dict[int, dict[str, int]] = {}
    for progress in getattr(query, "recentProgress", None) or []:
        values = _read_progress(progress, name)
        if values is not None:
            by_batch[int(_field(progress, "batchId"))] = values
    return sorted(by_batch.items())


def _retained_limit(query) -> int:
    try:
        return int(query.sparkSession.conf.get("spark.sql.streaming.numRecentProgressUpdates", "100"))
    except Exception:   # a stand-in query without a session, or a stopped session: Spark's default
        return 100


def _read_query(query, name: str, batch):
    """:func:`read` for a StreamingQuery: the progress ``batch`` selects (see there)."""
    if batch == "last":
        return _read_progress(query.lastProgress, name)
    if batch in ("total", "all"):
        history = _history(query, name)
        if batch == "all":
            return history
        if not history:
            return None
        recent = getattr(query, "recentProgress", None) or []
        if len(recent) >= _retained_limit(query):
            warnings.warn(f"read_metrics: the totals of {name!r} cover batches {history[0][0]}-{history[-1][0]} "
                          f"only: Spark retains the last {len(recent)} progresses of a query "
                          f"(spark.sql.streaming.numRecentProgressUpdates); a StreamingQueryListener, or "
                          f"CQRuntime, sees every batch", UserWarning, stacklevel=3)
        return total(values for _, values in history)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)):
        raise TypeError(f"batch must be None, 'last' or a batch id (int), 'total' or 'all', got {batch!r}")
    recent = list(getattr(query, "recentProgress", None) or [])
    if batch is not None:
        match = [p for p in recent if _field(p, "batchId") == batch]
        return _read_progress(match[-1], name) if match else None
    latest = None
    for progress in reversed(recent):
        values = _read_progress(progress, name)
        if values is None:
            continue
        if latest is None:
            latest = values
        busy = values.get(M.INPUT_ROWS, 0) or values.get(M.OUTPUT_ROWS, 0) or values.get(M.EVICTED_ROWS, 0)
        if busy or (_field(progress, "numInputRows") or 0) > 0:
            return values
    return latest if latest is not None else _read_progress(query.lastProgress, name)


def _read_progress(progress, name: str) -> dict[str, int] | None:
    """:func:`read` for one progress."""
    if progress is None:
        return None
    observed = progress.get("observedMetrics") if isinstance(progress, dict) else progress.observedMetrics
    if not observed or name not in observed:
        return None
    values = _as_ints(observed[name])
    arrived = observed.get(name + INPUT_SUFFIX) if hasattr(observed, "get") else None
    if arrived is not None:
        # Rows that reached the stateful operator but not its function were dropped by Spark as late
        # (in all: ``rows``; per input of a multi-input operator: ``rows_<i>``).
        for key, count in _as_ints(arrived).items():
            suffix = key[len(M.ARRIVED_ROWS):]
            if M.INPUT_ROWS + suffix in values:
                late = M.LATE_ROWS + suffix
                values[late] = values.get(late, 0) + max(0, count - values[M.INPUT_ROWS + suffix])
    return values


def _as_ints(row) -> dict[str, int]:
    """The counters of one observed-metrics entry, in any of the shapes PySpark delivers it.

    Classic PySpark gives a ``Row`` of the named counters (or, in a progress JSON dict, a dict of them).
    Spark Connect's ``StreamingQueryProgress.fromJson`` reads the server's JSON, in which a row is
    ``{"values": [...], "schema": {"type": "struct", "fields": [...]}}``, and gives
    ``Row(values=[...], schema={...})``; the dict itself may come from a progress JSON too.
    """
    values = row.asDict() if hasattr(row, "asDict") else dict(row)
    if set(values) == {"values", "schema"} and isinstance(values["values"], (list, tuple)):
        schema = values["schema"]
        if isinstance(schema, str):
            schema = json.loads(schema)
        names = schema.names if isinstance(schema, T.StructType) else [f["name"] for f in schema["fields"]]
        values = dict(zip(names, values["values"]))
    return {k: (int(v) if v is not None else 0) for k, v in values.items()}


#: Suffix of the observation :func:`observe_input` registers next to an operator's own metrics.
INPUT_SUFFIX = "__input"


def observe_input(df, name: str, per: tuple[str, int] | None = None):
    """Count the rows that reach a stateful operator, for operators whose late rows Spark drops.

    Spark's ``applyInPandasWithState`` with event-time timeouts drops rows behind the watermark before
    the operator's function sees them (as its stream-stream join does). Observing the operator's input
    under ``<name>__input`` lets :func:`read` report those rows as ``late_rows``: rows that arrived minus
    the ``input_rows`` the function reported. ``per=(column, n)`` (a multi-input operator whose ``column``
    holds the input index 0..n-1) also counts ``rows_<i>`` per input, read as ``late_rows_<i>``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    counts = [F.count(F.lit(1)).alias(M.ARRIVED_ROWS)]
    if per is not None:
        column, n = per
        counts += [F.sum(F.when(F.col(column) == i, 1).otherwise(0)).alias(M.per_input(M.ARRIVED_ROWS, i))
                   for i in range(n)]
    return df.observe(name + INPUT_SUFFIX, *counts)
