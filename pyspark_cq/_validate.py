"""Argument checks shared by the Spark-facing operators: every error names the argument."""
from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import types as T

TIME_TYPES = (T.TimestampType, T.TimestampNTZType)
#: Column metadata key Spark sets on the event-time column of ``withWatermark``.
WATERMARK_KEY = "spark.watermarkDelayMs"


def _classic_or_connect(obj, classic: type, connect_module: str, name: str) -> bool:
    """True when ``obj`` is a ``classic`` instance or the Spark Connect class ``connect_module.name``."""
    if isinstance(obj, classic):
        return True
    try:
        connect = getattr(__import__(connect_module, fromlist=[name]), name)
    except Exception:  # Spark Connect extras not installed
        return False
    return isinstance(obj, connect)


def is_dataframe(obj) -> bool:
    """True for classic and Spark Connect DataFrames."""
    from pyspark.sql import DataFrame

    return _classic_or_connect(obj, DataFrame, "pyspark.sql.connect.dataframe", "DataFrame")


def is_column(obj) -> bool:
    """True for classic and Spark Connect Columns."""
    from pyspark.sql import Column

    return _classic_or_connect(obj, Column, "pyspark.sql.connect.column", "Column")


def dataframe(obj, name: str):
    """Check that ``obj`` is a PySpark DataFrame."""
    if not is_dataframe(obj):
        raise TypeError(f"{name} must be a pyspark.sql.DataFrame, got {type(obj).__name__}")
    return obj


def not_a_name(value, name: str, expected: str) -> TypeError:
    """The TypeError for an argument that should name a column; a Column gets a hint (PySpark's own
    error for it would be ``[NOT_ITERABLE] Column is not iterable``, naming no argument).
    """
    if is_column(value):
        match = re.fullmatch(r"Column<'([^'`]+)'>", str(value))
        example = f" (e.g. {name}={match.group(1)!r})" if match and name.isidentifier() else ""
        return TypeError(f"{name} must be {expected}, got {value}: pass column names as strings{example}, "
                         f"not F.col(...) Columns")
    return TypeError(f"{name} must be {expected}, got {value!r}")


def column_list(df, cols, name: str, *, allow_empty: bool = True) -> list[str]:
    """Normalise ``cols`` (a name or an iterable of names) and check each exists in ``df``."""
    expected = "a column name or a list of column names (str)"
    if isinstance(cols, str):
        cols = [cols]
    elif cols is None:
        cols = []
    elif is_column(cols) or not isinstance(cols, Iterable):  # a Column claims to be iterable, then raises
        raise not_a_name(cols, name, expected)
    else:
        cols = list(cols)
    for c in cols:
        if not isinstance(c, str):
            raise not_a_name(c, name, expected)
    if not cols and not allow_empty:
        raise ValueError(f"{name} must name at least one column")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{name} names a column twice: {cols}")
    available = df.columns
    missing = [c for c in cols if c not in available]
    if missing:
        raise ValueError(f"{name}: unknown column(s) {missing}; available columns: {available}")
    return cols


#: A session setting a ``foreachBatch`` function sets to its micro-batch id before it runs the batch: Spark
#: propagates SQL settings to the tasks as local properties, where the stream's own ``streaming.sql.batchId`` is
#: missing when the function runs apart from the stream's thread (Spark Connect).
BATCH_ID_SETTING = "spark.pyspark_cq.batchId"
#: The same for the streaming query's id (Spark's ``sql.streaming.queryId`` local property).
QUERY_ID_SETTING = "spark.pyspark_cq.queryId"


def micro_batch_id(setting: str = BATCH_ID_SETTING) -> str:
    """The streaming micro-batch id of the running task (Spark's local property, else the session setting
    ``setting``'s, :data:`BATCH_ID_SETTING` or a name under it), or ``"?"`` outside one: worker-side errors name
    the batch.
    """
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        value = None
        if ctx is not None:
            value = ctx.getLocalProperty("streaming.sql.batchId") or ctx.getLocalProperty(setting)
    except Exception:   # not in a Spark task (direct calls in tests)
        value = None
    return value if value is not None else "?"


def ref(name: str):
    """A Column that refers to the column called exactly ``name`` (dots, spaces and backticks are part
    of the name: ``F.col("user.id")`` would read a struct field ``id`` of a column ``user``).
    """
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def column(df, col, name: str) -> str:
    """Check a single column name."""
    if not isinstance(col, str):
        raise not_a_name(col, name, "a column name (str)")
    return column_list(df, [col], name)[0]


def time_column(df, col, name: str, *, allow_integer: bool = False) -> T.DataType:
    """Check that ``col`` exists and is a timestamp (or, if allowed, an integer) column; return its type."""
    column(df, col, name)
    dtype = df.schema[col].dataType
    ok = isinstance(dtype, TIME_TYPES) or (allow_integer and isinstance(dtype, (T.LongType, T.IntegerType)))
    if not ok:
        expected = "a timestamp column" + (" or an integer column" if allow_integer else "")
        raise TypeError(f"{name} must be {expected}; column {col!r} has type {dtype.simpleString()}")
    return dtype


def watermarked_columns(df) -> list[str]:
    """The columns of ``df`` that carry a ``withWatermark`` delay."""
    return [f.name for f in df.schema.fields if WATERMARK_KEY in (f.metadata or {})]


def watermark_delay_ms(df, col: str) -> int | None:
    """The watermark delay declared by ``withWatermark`` on ``col``, or None."""
    meta = df.schema[col].metadata or {}
    value = meta.get(WATERMARK_KEY)
    return None if value is None else int(value)


def require_watermark(df, col: str, name: str) -> int:
    """For a streaming ``df``, require a watermark on ``col``; return its delay in ms."""
    delay = watermark_delay_ms(df, col)
    if delay is None:
        raise ValueError(
            f"{name}: the streaming input needs a watermark on its time column {col!r}; "
            f"call .withWatermark({col!r}, '<delay>') on it first")
    return delay
