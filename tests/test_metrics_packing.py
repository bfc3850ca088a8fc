"""Packed output of the streaming operators (operators/_common/metrics.py): rows returned as array cells and
unpacked by Spark come out exactly as they went in -- NaN apart from null, timestamps to the microsecond
(with and without time zone), dates before 1970, every integral width -- and types without an array form
fall back to the Arrow IPC stream."""
import datetime as dt
import math
import os
import sys

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import types as T

from pyspark_cq.operators._common import metrics as _metrics

# _emit runs in Spark's Python workers, which cannot import this test module: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = T.StructType([
    T.StructField("ts", T.TimestampType()), T.StructField("tn", T.TimestampNTZType()),
    T.StructField("d", T.DateType()), T.StructField("x", T.DoubleType()), T.StructField("f", T.FloatType()),
    T.StructField("b", T.ByteType()), T.StructField("i", T.IntegerType()), T.StructField("l", T.LongType()),
    T.StructField("s", T.StringType()), T.StructField("ok", T.BooleanType()),
])
UTC = dt.timezone.utc
ROWS = [
    (dt.datetime(2024, 1, 1, 0, 0, 0, 123, tzinfo=UTC), dt.datetime(2024, 1, 1, 0, 0, 1, 7), dt.date(1960, 2, 29),
     float("nan"), 1.5, -128, -(2**31), 2**63 - 1, "ä", True),
    (None, None, None, None, None, None, None, None, None, None),
    (dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(1900, 1, 1), dt.date(2100, 1, 1),
     float("-inf"), float("nan"), 127, 2**31 - 1, -(2**63), "", False),
]


def _table(rows):
    arrow = _metrics.arrow_schema(SCHEMA)
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=arrow)


def test_array_layout_choice():
    assert _metrics.array_layout(_metrics.arrow_schema(SCHEMA))
    dec = T.StructType([T.StructField("k", T.DecimalType(10, 2))])
    assert not _metrics.array_layout(_metrics.arrow_schema(dec))
    assert _metrics.packed_schema(dec).names[0] == _metrics.PACKED
    names = _metrics.packed_schema(SCHEMA).names
    # one cell per column, a NaN-flags cell per floating column, then the counters
    assert len(names) == len(SCHEMA.fields) + 2 + len(_metrics.METRICS)


def test_packed_row_cells_keep_nan_apart_from_null():
    row = _metrics.packed_row(_table(ROWS), _metrics.arrow_schema(SCHEMA), input_rows=3)
    assert len(row) == 1 and int(row[_metrics.PREFIX + "input_rows"].iloc[0]) == 3
    x = list(row[f"{_metrics._ARRAY}3"].iloc[0])
    nan = list(row[f"{_metrics._NAN}3"].iloc[0])
    assert x[1] is None and nan == [True, False, False] and x[2] == -math.inf
    empty = _metrics.packed_row(None, _metrics.arrow_schema(SCHEMA))
    assert empty[f"{_metrics._ARRAY}0"].iloc[0] is None


def test_packed_row_rejects_unknown_counters():
    with pytest.raises(ValueError, match="unknown counter"):
        _metrics.packed_row(None, _metrics.arrow_schema(SCHEMA), nonsense=1)


def _emit(key, pdfs, state):
    for _ in pdfs:
        pass
    state.update((1,))
    yield _metrics.packed_row(_table(ROWS), _metrics.arrow_schema(SCHEMA), output_rows=len(ROWS))


@pytest.mark.spark
@pytest.mark.parametrize("tz", ["UTC", "America/Los_Angeles"])
def test_spark_unpacks_array_cells_exactly(spark, tmp_dir, tz):
    spark.conf.set("spark.sql.session.timeZone", tz)
    try:
        src = os.path.join(tmp_dir, "in")
        spark.range(1).write.parquet(src)
        stream = spark.readStream.schema("id long").parquet(src)
        packed = stream.groupBy("id").applyInPandasWithState(_emit, _metrics.packed_schema(SCHEMA), "x long",
                                                             "append", "NoTimeout")
        out = _metrics.attach_packed(packed, "pack_test", SCHEMA)
        assert out.schema == SCHEMA
        q = (out.writeStream.format("memory").queryName(f"packed_{tz.replace('/', '_')}")
             .option("checkpointLocation", os.path.join(tmp_dir, "ck")).trigger(availableNow=True).start())
        q.awaitTermination()
        got = spark.sql(f"select * from packed_{tz.replace('/', '_')}").toArrow()
        want = _table(ROWS)
        for name in SCHEMA.names:
            a, b = got.column(name).to_pylist(), want.column(name).to_pylist()
            same = [(x is None and y is None) or x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
                    for x, y in zip(a, b)]
            assert len(a) == len(b) and all(same), (name, a, b)
        assert _metrics.read(q.lastProgress, "pack_test")["output_rows"] == len(ROWS)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
