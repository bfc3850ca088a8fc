"""sliding_aggregate on batch DataFrames: differential against Spark's window() aggregation, PIPES
change intervals against Algorithm 1, granularity, types, and argument checks."""
from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest
from helpers import aggregate_reference as R
from pyspark.sql import functions as F
from pyspark.sql import types as T

import pyspark_cq
from pyspark_cq import sliding_aggregate

EPOCH = dt.datetime(1970, 1, 1)


def spark_exprs(aggs):
    exprs = []
    for column, names in aggs.items():
        for name in names:
            if column == "*":
                exprs.append(F.count(F.lit(1)).alias("count"))
            else:
                exprs.append(getattr(F, name)(column).alias(f"{name}_{column}"))
    return exprs


def spark_reference(df, time, window, slide, by, aggs):
    return (df.groupBy(F.window(time, window, slide), *by).agg(*spark_exprs(aggs))
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), *by,
                    *[e for e in [c for c in _agg_names(aggs)]]))


def _agg_names(aggs):
    return ["count" if c == "*" else f"{a}_{c}" for c, names in aggs.items() for a in names]


def random_frame(spark, n=3000, seed=0, span_s=400, keys=40):
    rng = np.random.default_rng(seed)
    ts = pd.to_datetime(rng.integers(0, span_s * 1_000_000, n), unit="us")
    pdf = pd.DataFrame({
        "ts": ts,
        "k": rng.integers(0, keys, n),
        "name": rng.choice(["a", "b", "c", None], n),
        "v": pd.array(rng.integers(-1000, 1000, n), dtype="Int64"),
        "x": rng.normal(size=n) * 100,
        "small": pd.array(rng.integers(-100, 100, n), dtype="Int16"),
    })
    pdf.loc[rng.random(n) < 0.1, "v"] = pd.NA
    pdf.loc[rng.random(n) < 0.05, "x"] = np.nan
    pdf.loc[rng.random(n) < 0.02, "ts"] = pd.NaT
    schema = T.StructType([
        T.StructField("ts", T.TimestampType()), T.StructField("k", T.LongType()),
        T.StructField("name", T.StringType()), T.StructField("v", T.LongType()),
        T.StructField("x", T.DoubleType()), T.StructField("small", T.ShortType())])
    df = spark.createDataFrame(pdf.astype(object).where(pdf.notna(), None), schema)
    # Real NaNs in x (createDataFrame turned them into nulls above): make every 37th value NaN.
    return df.withColumn("x", F.when(F.col("k") % 37 == 0, F.lit(float("nan"))).otherwise(F.col("x")))


AGGS = {"v": ["sum", "min", "max", "avg", "count"], "x": ["sum", "max", "min", "avg"],
        "small": ["sum", "max"], "*": ["count"]}


@pytest.fixture(scope="module")
def frame(spark):
    return random_frame(spark).cache()


@pytest.mark.spark
@pytest.mark.parametrize("window,slide", [("1 second", "1 second"), ("3 seconds", "1 second"),
                                          pytest.param("60 seconds", "1 second", marks=pytest.mark.slow), ("10 seconds", "4 seconds"),
                                          ("45 seconds", None)])
def test_batch_equals_spark_window(frame, window, slide):
    ours = sliding_aggregate(frame, "ts", window, slide, by=["k", "name"], aggs=AGGS)
    theirs = spark_reference(frame, "ts", window, slide, ["k", "name"], AGGS)
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    R.assert_same_rows(ours, theirs, ["window_start", "k", "name"])


@pytest.mark.spark
def test_without_keys_and_default_aggregate(frame):
    ours = sliding_aggregate(frame, "ts", "20 seconds", "5 seconds")
    theirs = spark_reference(frame, "ts", "20 seconds", "5 seconds", [], {"*": ["count"]})
    assert ours.columns == ["window_start", "window_end", "count"]
    R.assert_same_rows(ours, theirs, ["window_start"])


@pytest.mark.spark
def test_types_nulls_and_float_keys(spark):
    rows = [
        (dt.datetime(2024, 1, 1, 0, 0, 1), -0.0, True, dt.date(2024, 1, 3), 1.5, 7),
        (dt.datetime(2024, 1, 1, 0, 0, 2), 0.0, False, dt.date(2024, 1, 1), float("nan"), None),
        (dt.datetime(2024, 1, 1, 0, 0, 2), float("nan"), None, None, 2.5, 3),
        (dt.datetime(2024, 1, 1, 0, 0, 3), None, True, dt.date(2024, 1, 2), None, None),
        (dt.datetime(2024, 1, 1, 0, 0, 4), float("nan"), False, dt.date(2023, 1, 2), float("-inf"), 2),
        (None, 1.0, True, None, 9.0, 9),
    ]
    schema = "ts timestamp, fk double, b boolean, d date, f float, i int"
    df = spark.createDataFrame(rows, schema)
    aggs = {"b": ["min", "max", "count"], "d": ["min", "max"], "ts": ["min", "max"], "f": ["sum", "avg", "min", "max"],
            "i": ["sum", "avg", "min", "max"], "*": ["count"]}
    ours = sliding_aggregate(df, "ts", "2 seconds", "1 second", by=["fk"], aggs=aggs)
    theirs = spark_reference(df, "ts", "2 seconds", "1 second", ["fk"], aggs)
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    R.assert_same_rows(ours, theirs, ["window_start", "fk"])
    keys = {R._norm(r["fk"]) for r in ours.collect()}
    assert keys == {(1, 0.0), (2, 0), (0, 0)}  # -0.0 groups with 0.0, NaNs together, null is a group


@pytest.mark.spark
def test_timestamp_ntz_time_column(spark):
    rows = [(dt.datetime(2024, 5, 1, 12, 0, s), s % 3, s) for s in range(0, 50, 3)]
    df = spark.createDataFrame(rows, "ts timestamp_ntz, k int, v long")
    ours = sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k", aggs={"v": ["sum"]})
    theirs = spark_reference(df, "ts", "10 seconds", "5 seconds", ["k"], {"v": ["sum"]})
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    R.assert_same_rows(ours, theirs, ["window_start", "k"])


def _rows_for_reference(df, time, cols):
    out = []
    for r in df.collect():
        d = r.asDict()
        d[time] = None if d[time] is None else round((d[time] - EPOCH).total_seconds() * 1_000_000)
        out.append({c: d[c] for c in [time] + cols})
    return out


@pytest.mark.spark
@pytest.mark.parametrize("window,granularity", [("6 seconds", "2 seconds"), ("5 seconds", "1 second")])
def test_changes_equal_pipes_algorithm1(spark, window, granularity):
    df = random_frame(spark, n=400, seed=3, span_s=60, keys=5)
    aggs = {"v": ["sum", "max"], "x": ["avg"], "*": ["count"]}
    ours = sliding_aggregate(df, "ts", window, by="k", aggs=aggs, granularity=granularity, emit="changes")
    assert ours.columns[:3] == ["valid_from", "valid_to", "k"]
    w = pyspark_cq.parse_duration(window, "w")
    g = pyspark_cq.parse_duration(granularity, "g")
    want = R.pipes_changes(_rows_for_reference(df, "ts", ["k", "v", "x"]), "ts", "k", w, g,
                           [(c, a) for c, names in aggs.items() for a in names])
    got = {}
    for r in ours.collect():
        key = (r["k"], round((r["valid_from"] - EPOCH).total_seconds() * 1e6),
               round((r["valid_to"] - EPOCH).total_seconds() * 1e6))
        got[key] = (r["sum_v"], r["max_v"], r["avg_x"], r["count"])
    assert set(got) == set(want)
    for key, value in want.items():
        assert_values(got[key], value)


def assert_values(got, want):
    for g, w in zip(got, want):
        if isinstance(w, float) and math.isnan(w):
            assert isinstance(g, float) and math.isnan(g), (got, want)
        elif isinstance(w, float):
            assert g == pytest.approx(w, rel=1e-9, abs=1e-12), (got, want)
        else:
            assert g == w, (got, want)


@pytest.mark.spark
def test_coarser_granularity_equals_rounded_reference(spark):
    df = random_frame(spark, n=500, seed=5, span_s=120, keys=4)
    aggs = {"v": ["sum"], "*": ["count"]}
    ours = sliding_aggregate(df, "ts", "30 seconds", "2 seconds", by="k", aggs=aggs, granularity="10 seconds")
    want = R.spark_windows(_rows_for_reference(df, "ts", ["k", "v"]), "ts", "k", 30_000_000, 2_000_000,
                           [("v", "sum"), ("*", "count")], granularity=10_000_000)
    got = {(round((r["window_start"] - EPOCH).total_seconds() * 1e6), round((r["window_end"] - EPOCH).total_seconds() * 1e6),
            r["k"]): (r["sum_v"], r["count"]) for r in ours.collect()}
    assert got == want


@pytest.mark.spark
def test_granularity_dividing_the_slide_changes_nothing(frame):
    ours = sliding_aggregate(frame, "ts", "12 seconds", "4 seconds", by="k", aggs={"v": ["sum"]}, granularity="2 seconds")
    theirs = spark_reference(frame, "ts", "12 seconds", "4 seconds", ["k"], {"v": ["sum"]})
    R.assert_same_rows(ours, theirs, ["window_start", "k"])


@pytest.mark.spark
def test_transform_and_accessor_style(frame):
    out = frame.transform(sliding_aggregate, time="ts", window="5 seconds", by=["k"], aggs={"v": ["max"]})
    assert out.columns == ["window_start", "window_end", "k", "max_v"]


# ---- argument checks (no job runs) ---------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.parametrize("kwargs,error,match", [
    ({"aggs": {"v": ["median"]}}, ValueError, r"aggs\['v'\]: unknown aggregate 'median'"),
    ({"aggs": {"name": ["sum"]}}, TypeError, r"aggs\['name'\]: sum needs a numeric column"),
    ({"aggs": {"name": ["max"]}}, TypeError, r"aggs\['name'\]: max is supported for numeric"),
    ({"aggs": {"nope": ["sum"]}}, ValueError, r"aggs: unknown column 'nope'"),
    ({"aggs": {"*": ["sum"]}}, ValueError, r"aggs\['\*'\] only supports 'count'"),
    ({"aggs": ["v"]}, TypeError, r"aggs must be a mapping"),
    ({"aggs": {"v": []}}, TypeError, r"aggs\['v'\] must be a non-empty list"),
    ({"window": "0 seconds"}, ValueError, r"window must be a positive duration"),
    ({"window": "-5 seconds"}, ValueError, r"window must be a positive duration"),
    ({"slide": "0 seconds"}, ValueError, r"slide must be a positive duration"),
    ({"slide": "-1 second"}, ValueError, r"slide must be a positive duration"),
    ({"slide": "20 seconds"}, ValueError, r"slide must not exceed window"),
    ({"window": 10}, TypeError, r"window must be a duration"),
    ({"granularity": "3 seconds"}, ValueError, r"granularity must divide the window"),
    ({"granularity": "0 seconds"}, ValueError, r"granularity must be a positive duration"),
    ({"emit": "rows"}, ValueError, r"emit must be one of"),
    ({"output_mode": "overwrite"}, ValueError, r"output_mode must be one of"),
    ({"by": ["ts"]}, ValueError, r"by must not contain the time column"),
    ({"by": ["missing"]}, ValueError, r"by: unknown column"),
    ({"time": "k"}, TypeError, r"time must be a timestamp column"),
    ({"shards": 0}, ValueError, r"shards must be a positive int"),
])
def test_bad_arguments(frame, kwargs, error, match):
    args = {"time": "ts", "window": "10 seconds", "slide": "5 seconds", "by": ["k"], "aggs": {"v": ["sum"]}}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        sliding_aggregate(frame, **args)


@pytest.mark.spark
def test_decimal_sum_is_rejected_with_advice(spark):
    df = spark.createDataFrame([(dt.datetime(2024, 1, 1), 1)], "ts timestamp, d int").withColumn(
        "d", F.col("d").cast("decimal(10,2)"))
    with pytest.raises(TypeError, match=r"aggs\['d'\]: sum of decimal columns is not supported.*cast"):
        sliding_aggregate(df, "ts", "1 minute", aggs={"d": ["sum"]})


def test_not_a_dataframe():
    with pytest.raises(TypeError, match="df must be a pyspark.sql.DataFrame"):
        sliding_aggregate([1, 2], "ts", "1 minute")
