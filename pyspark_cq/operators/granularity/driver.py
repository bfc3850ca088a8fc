"""Granularity operator Γ (Cammert et al., PIPES, §2.4.3) on Spark DataFrames."""
from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from ..._duration import parse_duration
from ..._native import load
from ...vocabulary import metrics as M
from .._common import metrics as _metrics
from .worker import _STATUS, _RoundBatches

__all__ = ["granularity"]

_DATA = "__cq_col_"  # the input columns in transport, by position


def granularity(df, start: str, end: str, granularity, *, name: str = "cq_granularity"):
    """Round validity intervals to a coarser time granularity (PIPES Γ, §2.4.3).

    The start of each interval ``[start, end)`` is rounded up and the end rounded down to a multiple of
    ``granularity`` (epoch-aligned, as Spark's windows are); intervals that become empty are dropped.
    Works on batch and streaming DataFrames (stateless, vectorised through ``mapInArrow`` and a
    compiled kernel).

    Parameters
    ----------
    df : DataFrame
        Input rows with interval bounds.
    start, end : str
        Names of the bound columns: both timestamp columns, or both integer columns (ticks).
    granularity : str, datetime.timedelta or int
        The time distance ``g`` of the new granularity: a duration for timestamp bounds, a positive
        int (in the columns' ticks) for integer bounds.
    name : str
        Name of the observed metrics this operator reports per batch: ``dropped_empty`` (intervals
        empty after rounding, dropped by definition) and ``malformed_rows`` (null bounds or
        ``end < start``: counted, reported and removed).

    Returns
    -------
    DataFrame
        Same schema as ``df``, bounds rounded, empty and malformed intervals removed.

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> df = spark.createDataFrame([(3, 25), (12, 18), (0, 10)], "start long, end long")
    >>> [(r.start, r.end) for r in cq.granularity(df, "start", "end", 10).orderBy("start").collect()]
    [(0, 10), (10, 20)]
    """
    _validate.dataframe(df, "df")
    start_type = _validate.time_column(df, start, "start", allow_integer=True)
    end_type = _validate.time_column(df, end, "end", allow_integer=True)
    if type(start_type) is not type(end_type):
        raise TypeError(f"start and end must have the same type, got {start_type.simpleString()} "
                        f"and {end_type.simpleString()}")
    if start == end:
        raise ValueError(f"start and end must be different columns, got {start!r} twice")
    integer = isinstance(start_type, (T.LongType, T.IntegerType))
    if integer:
        if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity <= 0:
            raise ValueError(f"granularity must be a positive int (ticks) for integer columns, got {granularity!r}")
        g = granularity
    else:  # a plain number has no unit: parse_duration's one message for it (docs/errors.md)
        g = parse_duration(granularity, "granularity", allow_negative=False, allow_zero=False)
    load("_granularity")  # fail on the driver, readably, if the build is broken

    # The columns travel under internal names: PySpark's mapInArrow refers to its input's columns by
    # unquoted name, which a name with a backtick (or a dot) would break.
    names = df.columns
    transport = [f"{_DATA}{i}" for i in range(len(names))]
    staged = df.select(*[_validate.ref(c).alias(t) for c, t in zip(names, transport)])
    schema = T.StructType([T.StructField(t, f.dataType, f.nullable, f.metadata)
                           for t, f in zip(transport, df.schema.fields)]
                          + [T.StructField(_STATUS, T.ByteType(), False)])
    fn = _RoundBatches(transport[names.index(start)], transport[names.index(end)], g)
    raw = staged.mapInArrow(fn, schema)
    counters = {
        M.DROPPED_EMPTY: F.sum((F.col(_STATUS) == 1).cast("long")),
        M.MALFORMED_ROWS: F.sum((F.col(_STATUS) == 2).cast("long")),
    }
    out = _metrics.attach(raw, name, counters, keep=F.col(_STATUS) == 0, drop=[_STATUS])
    return out.select(*[F.col(t).alias(c) for t, c in zip(transport, names)])


