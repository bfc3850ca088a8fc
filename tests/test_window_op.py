"""ω (PIPES §2.4.2): time- and tuple-based validity against plain-Python references, alone and followed
by Γ (§2.4.3), on batch and streaming DataFrames."""
from __future__ import annotations

import datetime as dt
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyspark_cq
from pyspark_cq import window

pytestmark = pytest.mark.spark

EPOCH = dt.datetime(1970, 1, 1)


def micros(t: dt.datetime | None):
    return None if t is None else round((t - EPOCH).total_seconds() * 1_000_000)


def time_reference(rows, size):
    """ω time-based: [t, t + size); rows with a null time are removed."""
    return sorted((t, k, t, t + size) for t, k in rows if t is not None)


def tuple_reference(rows, c):
    """ω tuple-based: valid until the time of the c-th later row (ties ordered by the other column)."""
    timed = sorted((t, k) for t, k in rows if t is not None)
    return sorted((t, k, t, timed[i + c][0] if i + c < len(timed) else None) for i, (t, k) in enumerate(timed))


def granularity_reference(intervals, g):
    """Γ: start rounded up, end rounded down, empty intervals dropped."""
    out = []
    for t, k, s, e in intervals:
        s2, e2 = -(-s // g) * g, (e // g) * g
        if s2 < e2:
            out.append((t, k, s2, e2))
    return sorted(out)


rows_st = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 10_000)), st.integers(0, 3)), max_size=25)


def as_ts(rows, spark):
    data = [(None if t is None else EPOCH + dt.timedelta(microseconds=t * 1000), k) for t, k in rows]
    return spark.createDataFrame(data, "t timestamp, k int")


def collect(df, start="valid_from", end="valid_to"):
    return sorted((micros(r["t"]) // 1000, r["k"], micros(r[start]) // 1000,
                   None if r[end] is None else micros(r[end]) // 1000) for r in df.collect())


@settings(max_examples=8, deadline=None)
@given(rows=rows_st, size_ms=st.integers(1, 5000))
def test_time_based_window_matches_reference(spark, rows, size_ms):
    df = as_ts(rows, spark)
    got = collect(window(df, "t", size=f"{size_ms} milliseconds"))
    assert got == time_reference(rows, size_ms)


@settings(max_examples=8, deadline=None)
@given(rows=rows_st, c=st.integers(1, 4))
def test_tuple_based_window_matches_reference(spark, rows, c):
    df = as_ts(rows, spark)
    assert collect(window(df, "t", rows=c)) == tuple_reference(rows, c)


@settings(max_examples=6, deadline=None)
@given(rows=rows_st, size_ms=st.integers(1, 5000), g_ms=st.sampled_from([1, 7, 100, 1000]))
def test_window_then_granularity_matches_reference(spark, rows, size_ms, g_ms):
    df = as_ts(rows, spark)
    out = pyspark_cq.granularity(window(df, "t", size=f"{size_ms} milliseconds"), "valid_from", "valid_to",
                                 f"{g_ms} milliseconds")
    assert collect(out) == granularity_reference(time_reference(rows, size_ms), g_ms)


def test_integer_time_column_and_names(spark):
    df = spark.createDataFrame([(5, "a"), (None, "b"), (9, "c")], "t long, s string")
    out = window(df, "t", size=10, start="s0", end="e0")
    assert out.columns == ["t", "s", "s0", "e0"]
    assert sorted((r.t, r.s0, r.e0) for r in out.collect()) == [(5, 5, 15), (9, 9, 19)]
    assert sorted((r.t, r.valid_to) for r in window(df, "t", rows=1).collect()) == [(5, 9), (9, None)]


def test_streaming_time_based_window_keeps_watermark_and_counts_nulls(spark, tmp_dir):
    d = tmp_dir / "in"
    d.mkdir()
    (d / "a.json").write_text('{"t": "1970-01-01T00:00:01Z", "k": 1}\n{"t": null, "k": 2}\n')
    src = spark.readStream.schema("t timestamp, k int").json(str(d)).withWatermark("t", "1 second")
    out = window(src, "t", size="2 days 3 seconds", name="omega")
    assert out.schema["t"].metadata.get("spark.watermarkDelayMs") == 1000
    name = "w_" + uuid.uuid4().hex[:8]
    q = (out.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_dir / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    rows = spark.table(name).collect()
    assert [(micros(r.valid_from), micros(r.valid_to)) for r in rows] == [
        (1_000_000, 1_000_000 + 2 * 86_400_000_000 + 3_000_000)]
    assert pyspark_cq.read_metrics(q.recentProgress[0], "omega")["malformed_rows"] == 1


def test_ntz_time_column(spark):
    df = spark.createDataFrame([(dt.datetime(2024, 3, 1, 1, 2, 3),)], "t timestamp_ntz")
    r = window(df, "t", size="90 minutes").collect()[0]
    assert r.valid_to - r.valid_from == dt.timedelta(minutes=90)


@pytest.mark.parametrize("kwargs,error,match", [
    ({}, ValueError, "give exactly one of size"),
    ({"size": "1 second", "rows": 2}, ValueError, "give exactly one of size"),
    ({"size": "0 seconds"}, ValueError, "size must be a positive duration"),
    ({"size": "-3 seconds"}, ValueError, "size must be a positive duration"),
    ({"size": 5}, TypeError, "size must be a duration"),
    ({"rows": 0}, ValueError, "rows must be a positive int"),
    ({"rows": 1.5}, ValueError, "rows must be a positive int"),
    ({"size": "1 second", "start": "k"}, ValueError, "start: column 'k' already exists"),
    ({"size": "1 second", "start": "a", "end": "a"}, ValueError, "must be different names"),
])
def test_bad_arguments(spark, kwargs, error, match):
    df = spark.createDataFrame([(EPOCH, 1)], "t timestamp, k int")
    with pytest.raises(error, match=match):
        window(df, "t", **kwargs)


def test_bad_time_column_and_streaming_rows(spark, tmp_dir):
    df = spark.createDataFrame([("x", 1)], "t string, k int")
    with pytest.raises(TypeError, match="time must be a timestamp column or an integer column"):
        window(df, "t", size="1 second")
    d = tmp_dir / "in"
    d.mkdir()
    src = spark.readStream.schema("t timestamp, k int").json(str(d))
    with pytest.raises(ValueError, match="rows= .* streaming"):
        window(src, "t", rows=3)
    with pytest.raises(ValueError, match="size must be a positive int"):
        window(spark.createDataFrame([(1, 1)], "t long, k int"), "t", size=0)
