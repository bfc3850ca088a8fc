"""interval_join / window_join on batch DataFrames against Spark's left.join(right, condition)."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.streaming import assert_same_multiset
from pyspark.sql import functions as F

import pyspark_cq

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def inputs(spark):
    rng = np.random.default_rng(7)
    sides = {}
    for side in ("l", "r"):
        parts = [jd.side_table(rng, side, 100, jd.BASE_US + i * 10_000_000) for i in range(3)]
        parts.append(jd.bound_rows(side, jd.BASE_US + 5_000_000, key=3))
        table = pa.concat_tables(parts)
        sides[side] = spark.createDataFrame(table.to_pandas(), jd.schema(side))
    return sides["l"], sides["r"]


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_batch_equals_spark_join(spark, inputs, how):
    left, right = inputs
    ours = pyspark_cq.interval_join(left, right, ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds",
                                    dt.timedelta(seconds=jd.UPPER_S), how=how, suffixes=("_l", "_r"),
                                    shards=3)
    assert ours.columns == jd.OUT_COLS
    jd.assert_same_rows(ours, jd.spark_reference(left, right, how))


def test_batch_window_join_intersections(spark, inputs):
    left, right = inputs
    ours = pyspark_cq.window_join(left, right, ["k", "s"], "ts", "ts", "10 seconds", "5 seconds",
                                  suffixes=("_l", "_r"))
    l, r = left.alias("l"), right.alias("r")
    # Validities [t, t + w) intersect  <=>  l.ts < r.ts + 5 s  and  r.ts < l.ts + 10 s.
    cond = F.expr("l.k = r.k AND l.s = r.s AND l.ts < r.ts + interval 5 seconds "
                  "AND r.ts < l.ts + interval 10 seconds")
    ref = l.join(r, cond).select(
        "l.k", "l.s", F.col("l.ts").alias("ts_l"), "lv", F.col("l.tag").alias("tag_l"),
        F.col("r.ts").alias("ts_r"), "rv", F.col("r.tag").alias("tag_r"),
        F.greatest("l.ts", "r.ts").alias("valid_from"),
        F.least(F.col("l.ts") + F.expr("interval 10 seconds"), F.col("r.ts") + F.expr("interval 5 seconds"))
        .alias("valid_to"))
    assert ours.columns == jd.OUT_COLS + ["valid_from", "valid_to"]
    assert ours.count() > 0
    assert_same_multiset(ours, ref)


def test_null_keys_never_match_and_outer_joins_keep_them(spark):
    left = spark.createDataFrame([(None, 1, "a"), (1, 1, "b")], "k int, t int, x string") \
        .withColumn("ts", F.timestamp_seconds("t"))
    right = spark.createDataFrame([(None, 1, "c"), (1, 1, "d")], "k int, t int, y string") \
        .withColumn("ts", F.timestamp_seconds("t"))
    rows = pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "0 seconds", how="full",
                                    suffixes=("_l", "_r")).select("k", "x", "y").collect()
    assert sorted(map(tuple, rows), key=str) == sorted([(None, "a", None), (None, None, "c"), (1, "b", "d")],
                                                       key=str)
