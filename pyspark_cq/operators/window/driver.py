"""Window operator ω (Cammert et al., PIPES, §2.4.2) on Spark DataFrames."""
from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from ..._duration import parse_duration
from ...vocabulary import metrics as M
from .._common import metrics as _metrics

__all__ = ["window"]

_ORDERABLE = (T.NumericType, T.StringType, T.BinaryType, T.BooleanType, T.DateType, T.TimestampType,
              T.TimestampNTZType)


def window(df, time, size=None, rows=None, *, start="valid_from", end="valid_to", name="cq_window"):
    """Assign each row a validity interval ``[start, end)`` (PIPES window operator ω, §2.4.2).

    PIPES turns a source element with timestamp ``t`` into the physical-stream element valid over
    ``[t, t + 1)`` and the window operator extends that validity: a *time-based* window of size ``w``
    keeps the element valid for ``w`` time units, a *tuple-based* window of size ``c`` until the start
    of the ``c``-th future element (Cammert, Kraemer, Seeger, Vaupel, "A Cost Model for Adaptive
    Resource Management in Data Stream Systems", §2.4.2; its Cost Formula 7 gives the resulting
    stream's ``l' ≈ w``). Here ``size`` is the length of the validity interval, ``[t, t + size)``: the
    row counts in every instant ``τ`` with ``t <= τ < t + size``, which is also how Spark's ``window()``
    places a row in windows ``[s, s + size)`` with ``s <= t < s + size``.

    Parameters
    ----------
    df : DataFrame
        Input rows. Time-based windows work on batch and streaming DataFrames (stateless);
        tuple-based windows need a batch DataFrame (the whole input ordered by time).
    time : str
        Timestamp (or timestamp_ntz) column, or an integer column of ticks.
    size : str, datetime.timedelta or int, optional
        Time-based window size: a positive duration for timestamp columns, a positive int (ticks) for
        integer columns.
    rows : int, optional
        Tuple-based window size ``c >= 1``: a row stays valid until the time of the ``c``-th row after it
        in time order (rows with equal times are ordered by their other orderable columns, so the
        result is deterministic). The last ``c`` rows have a null ``end``: they are still valid when
        the finite input ends. Rows with equal times can get empty intervals (``end == start``).
    start, end : str
        Names of the new validity columns (``valid_from``, ``valid_to`` by default).
    name : str
        Name of the observed metrics: ``malformed_rows`` counts rows with a null time, which carry no
        validity and are removed.

    Returns
    -------
    DataFrame
        ``df`` with the ``start`` and ``end`` columns added (same type as ``time``).

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> df = spark.createDataFrame([(1, "a"), (4, "b"), (9, "c")], "t long, v string")
    >>> [(r.v, r.valid_from, r.valid_to) for r in cq.window(df, "t", size=5).orderBy("t").collect()]
    [('a', 1, 6), ('b', 4, 9), ('c', 9, 14)]
    >>> [(r.v, r.valid_to) for r in cq.window(df, "t", rows=1).orderBy("t").collect()]
    [('a', 4), ('b', 9), ('c', None)]
    """
    _validate.dataframe(df, "df")
    ttype = _validate.time_column(df, time, "time", allow_integer=True)
    if (size is None) == (rows is None):
        raise ValueError("give exactly one of size (time-based window) and rows (tuple-based window)")
    for arg, value in (("start", start), ("end", end)):
        if not isinstance(value, str) or not value:
            raise TypeError(f"{arg} must be a non-empty column name, got {value!r}")
        if value in df.columns:
            raise ValueError(f"{arg}: column {value!r} already exists; choose another name")
    if start == end:
        raise ValueError(f"start and end must be different names, got {start!r} twice")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    integer = isinstance(ttype, (T.LongType, T.IntegerType))
    t = _validate.ref(time)
    valid = t.isNotNull()
    if size is not None:
        if integer:
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ValueError(f"size must be a positive int (ticks) for the integer column {time!r}, got {size!r}")
            stop = t + F.lit(size).cast(ttype)
        else:  # a plain number has no unit: parse_duration's one message for it (docs/errors.md)
            micros = parse_duration(size, "size", allow_negative=False, allow_zero=False)
            stop = t + _interval(micros)
        out = df.withColumn(start, t).withColumn(end, stop)
    else:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be a positive int (tuple-based window size), got {rows!r}")
        if df.isStreaming:
            raise ValueError("rows= (a tuple-based window) needs the whole input ordered by time, which a "
                             "streaming DataFrame cannot provide; use size= (a time-based window) instead")
        ties = [c for c in df.columns if c != time and isinstance(df.schema[c].dataType, _ORDERABLE)]
        # Ascending order puts null times first, so they never count as a successor of a timed row; they
        # are removed (and counted) below.
        order = Window.orderBy(t.asc_nulls_first(), *[_validate.ref(c).asc_nulls_first() for c in ties])
        out = df.withColumn(start, t).withColumn(end, F.lead(t, rows).over(order))
    return _metrics.attach(out.withColumn(_NULLS, (~valid).cast("long")), name,
                          {M.MALFORMED_ROWS: F.sum(F.col(_NULLS))}, keep=F.col(_NULLS) == 0, drop=[_NULLS])


_NULLS = "__cq_null_time"


def _interval(micros: int):
    """A day-time interval literal of ``micros`` microseconds (valid for timestamp and timestamp_ntz)."""
    days, rest = divmod(micros, 86_400_000_000)
    secs = Decimal(rest) / Decimal(1_000_000)
    return F.make_dt_interval(F.lit(days), F.lit(0), F.lit(0), F.lit(secs).cast("decimal(18,6)"))
