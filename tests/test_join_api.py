"""Argument checks of interval_join / window_join: every error names the argument (no Spark job runs)."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

import pyspark_cq

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def frames(spark):
    left = spark.createDataFrame([(1, 0, "a")], "k long, t long, x string").withColumn("ts", F.timestamp_seconds("t"))
    right = spark.createDataFrame([(1, 0, "b")], "k long, t long, y string").withColumn("ts", F.timestamp_seconds("t"))
    return left, right


@pytest.fixture(scope="module")
def streams(spark):
    rate = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
    left = rate.select(F.col("value").alias("k"), F.col("timestamp").alias("ts"), F.lit("a").alias("x"))
    right = rate.select(F.col("value").alias("k"), F.col("timestamp").alias("ts"), F.lit("b").alias("y"))
    return left, right


def _join(left, right, **kw):
    args = dict(on="k", left_time="ts", right_time="ts", lower="-1 second", upper="1 second",
                suffixes=("_l", "_r"))
    args.update(kw)
    return pyspark_cq.interval_join(left, right, **args)


def test_missing_watermark_is_named(streams):
    left, right = streams
    with pytest.raises(ValueError, match="left_time.*needs a watermark"):
        _join(left, right.withWatermark("ts", "1 minute"))
    with pytest.raises(ValueError, match="right_time.*needs a watermark"):
        _join(left.withWatermark("ts", "1 minute"), right)


def test_stream_with_batch_is_rejected(streams, frames):
    with pytest.raises(ValueError, match="both be streaming or both be batch"):
        _join(streams[0].withWatermark("ts", "1 minute"), frames[1])


def test_time_columns_must_be_timestamps(frames):
    left, right = frames
    with pytest.raises(TypeError, match="left_time must be a timestamp column"):
        _join(left, right, left_time="t")
    with pytest.raises(TypeError, match="right_time must be a TIMESTAMP column"):
        _join(left, right.withColumn("ts", F.col("ts").cast("timestamp_ntz")))


def test_bounds_are_checked(frames):
    left, right = frames
    with pytest.raises(ValueError, match="lower must be <= upper"):
        _join(left, right, lower="2 seconds", upper="1 second")
    with pytest.raises(ValueError, match="upper must be"):
        _join(left, right, upper="soon")
    with pytest.raises(TypeError, match="lower must be"):
        _join(left, right, lower=5)
    with pytest.raises(ValueError, match="left_window must be a positive duration"):
        pyspark_cq.window_join(left, right, "k", "ts", "ts", "0 seconds", "1 second", suffixes=("_l", "_r"))


def test_unknown_columns_are_named(frames):
    left, right = frames
    with pytest.raises(ValueError, match=r"on: unknown column\(s\) \['nope'\]"):
        _join(left, right, on=["k", "nope"])
    with pytest.raises(ValueError, match="left_time: unknown column"):
        _join(left, right, left_time="when")
    with pytest.raises(ValueError, match="on must name at least one column"):
        _join(left, right, on=[])


def test_name_clash_gets_suffixes(frames):
    left, right = frames
    # Without suffixes= the clashing columns get the default ("_left", "_right"), issue 17.
    assert _join(left, right, suffixes=None).columns == ["k", "t_left", "x", "ts_left", "t_right", "y", "ts_right"]
    out = _join(left, right)
    assert out.columns == ["k", "t_l", "x", "ts_l", "t_r", "y", "ts_r"]
    with pytest.raises(ValueError, match="suffixes must be a pair"):
        _join(left, right, suffixes=("_x", "_x"))


def test_other_arguments(frames, spark):
    left, right = frames
    with pytest.raises(ValueError, match="how must be one of"):
        _join(left, right, how="cross")
    with pytest.raises(ValueError, match="grouping must be"):
        _join(left, right, grouping="rows")
    with pytest.raises(ValueError, match="shards must be a positive int"):
        _join(left, right, shards=0)
    with pytest.raises(TypeError, match="left must be a pyspark.sql.DataFrame"):
        _join(left.toPandas(), right)
    with pytest.raises(TypeError, match="on: key column 'k' has type string on the left"):
        _join(left.withColumn("k", F.col("k").cast("string")), right)
    # Integral keys of different widths are compared as long.
    assert _join(left.withColumn("k", F.col("k").cast("int")), right).schema["k"].dataType.simpleString() == "bigint"
