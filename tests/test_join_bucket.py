"""The time-bucket layout of the streaming inner interval join (``bucket=``, issue 14) against Spark's join.

The same file streams as tests/test_join_stream.py (out-of-order rows within the watermark, late rows,
duplicates, null keys, an empty file on each side, rows at the band's bounds), with bucket widths far
below the band so that most pairs cross bucket borders; a band without 0 (``lower > 0``); and a restart
from the checkpoint. The bucket arithmetic is checked against a brute force without Spark.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import join_data as jd
from pyspark.sql import functions as F

import pyspark_cq
from pyspark_cq.operators._join_bucket import (
    LEFT,
    RIGHT,
    bucket_of,
    resolve_width,
    target_buckets,
    targets_column,
)

DELAY = "15 seconds"
S = 1_000_000


def _brute_targets(t, side, lower, upper, width):
    """Own bucket plus every bucket holding an instant the row probes (scanning instants one by one)."""
    lo, hi = (lower, upper) if side == LEFT else (-upper, -lower)
    return {t // width * width} | {s // width * width for s in range(t + lo, t + hi + 1)}


def test_target_buckets_equal_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(400):
        width = int(rng.integers(1, 12))
        lower = int(rng.integers(-20, 15))
        upper = lower + int(rng.integers(0, 20))
        t, side = int(rng.integers(-50, 50)), int(rng.integers(0, 2))
        got = target_buckets(t, side, lower, upper, width)
        assert got[0] == t // width * width               # own bucket (its start) first, stored there
        assert len(got) == len(set(got))                  # a copy per other bucket, none twice
        assert set(got) == _brute_targets(t, side, lower, upper, width), (t, side, lower, upper, width)


def test_bucket_of_floors_negative_times_and_width_argument():
    assert bucket_of([-1, 0, 9, 10, -10, -11], 10).tolist() == [-10, 0, 0, 10, -10, -20]
    assert resolve_width(None, -5 * S, 10 * S) is None
    assert resolve_width("auto", -5 * S, 10 * S) == 15 * S
    assert resolve_width("auto", 0, 0) == S                # a zero band still gets a positive width
    assert resolve_width("4 seconds", 0, 0) == 4 * S
    with pytest.raises(ValueError, match="bucket"):
        resolve_width("-4 seconds", 0, 0)


@pytest.mark.spark
def test_spark_targets_equal_python(spark):
    rng = np.random.default_rng(4)
    t = [int(x) for x in rng.integers(-40 * S, 40 * S, 200)] + [0, -1, 3 * S, -3 * S]
    df = spark.createDataFrame([(x,) for x in t], "t long")
    for side, lower, upper, width in ((LEFT, -5 * S, 10 * S, 4 * S), (RIGHT, -5 * S, 10 * S, 4 * S),
                                      (LEFT, 3 * S, 8 * S, 2 * S), (RIGHT, 3 * S, 8 * S, 2 * S)):
        rows = df.select("t", targets_column(F.col("t"), side, lower, upper, width).alias("b")).collect()
        for r in rows:
            assert sorted(r.b) == sorted(target_buckets(r.t, side, lower, upper, width)), (r.t, side)
    null = spark.createDataFrame([(None,)], "t long").select(targets_column(F.col("t"), LEFT, 0, S, S).alias("b"))
    assert null.collect()[0].b == [None]


@pytest.mark.spark
@pytest.mark.parametrize("how, control", [("left", None), ("left_semi", None), ("inner", "control")])
def test_bucket_refused_where_flags_would_merge(spark, tmp_path, how, control):
    root = str(tmp_path / "in")
    jd.write_streams(root, 1, null_keys=False, seed=1)
    handle = None
    if control:
        from pyspark_cq.control import ControlTable
        handle = ControlTable(str(tmp_path / "ct")).handle("j")
    with pytest.raises(ValueError, match="^bucket: "):
        pyspark_cq.interval_join(_source(spark, root, "l"), _source(spark, root, "r"), ["k", "s"], "ts", "ts",
                                 "-5 seconds", "10 seconds", how=how, control=handle, bucket="auto")


def _source(spark, root, side):
    return jd.stream_source(spark, root, side, DELAY)


def _reference(left, right, lower_s, upper_s):
    l, r = left.alias("l"), right.alias("r")
    cond = F.expr(f"l.k = r.k AND l.s = r.s AND r.ts >= l.ts + interval {lower_s} seconds "
                  f"AND r.ts <= l.ts + interval {upper_s} seconds")
    return l.join(r, cond).select(
        F.col("l.k").alias("k"), F.col("l.s").alias("s"), F.col("l.ts").alias("ts_l"), F.col("lv"),
        F.col("l.tag").alias("tag_l"), F.col("r.ts").alias("ts_r"), F.col("rv"), F.col("r.tag").alias("tag_r"))


def _ours(spark, root, lower_s, upper_s, bucket, name="cq_bucket", shards=3):
    return pyspark_cq.interval_join(_source(spark, root, "l"), _source(spark, root, "r"), ["k", "s"], "ts", "ts",
                                    f"{lower_s} seconds", f"{upper_s} seconds", suffixes=("_l", "_r"), name=name,
                                    shards=shards, bucket=bucket)


def _run(*runs):
    queries = [df.writeStream.format("memory").queryName(table).outputMode("append").trigger(availableNow=True)
               .option("checkpointLocation", ck).start() for df, table, ck in runs]
    for q in queries:
        q.awaitTermination()
    return queries


def _file_rows(spark, root):
    return sum(spark.read.parquet(os.path.join(root, side)).count() for side in ("l", "r"))


@pytest.mark.spark
@pytest.mark.slow
def test_bucket_layout_equals_spark_join(spark, tmp_path):
    """Buckets of 4 s under a 15 s band: most pairs cross one to four bucket borders."""
    root = str(tmp_path / "in")
    jd.write_streams(root, 5, null_keys=True, seed=11)
    ours = _ours(spark, root, jd.LOWER_S, jd.UPPER_S, "4 seconds", name="cq_bucket4")
    theirs = _reference(_source(spark, root, "l"), _source(spark, root, "r"), jd.LOWER_S, jd.UPPER_S)
    q_ours, _ = _run((ours, "ours_bucket4", str(tmp_path / "ck_ours")),
                     (theirs, "spark_bucket4", str(tmp_path / "ck_spark")))
    out = spark.table("ours_bucket4")
    assert out.count() > 100
    jd.assert_same_rows(out, spark.table("spark_bucket4"))
    # Metrics keep their meaning: copies are no input; every file row is input or late (or malformed).
    reports = [r for r in (pyspark_cq.read_metrics(p, "cq_bucket4") for p in q_ours.recentProgress) if r]
    assert sum(r["output_rows"] for r in reports) == out.count()
    assert sum(r["late_rows"] for r in reports) > 0
    assert sum(r["input_rows"] + r["late_rows"] for r in reports) == _file_rows(spark, root)
    assert sum(r["evicted_rows"] for r in reports) > 0
    assert reports[-1]["state_rows"] > 0 and reports[-1]["state_bytes"] > 0


@pytest.mark.spark
@pytest.mark.slow
def test_band_without_zero_equals_spark_join(spark, tmp_path):
    """lower > 0: a row's own bucket is outside the range it probes (it is stored there, probes elsewhere)."""
    root = str(tmp_path / "in")
    rng = np.random.default_rng(21)
    for i in range(4):
        t0 = jd.BASE_US + i * 6 * S
        for side in ("l", "r"):
            table = jd.side_table(rng, side, 80, t0, nkeys=6, null_keys=True, spread_s=8)
            jd.write(os.path.join(root, side), f"b{i:03d}.parquet", table)
    ours = _ours(spark, root, 3, 8, "2 seconds", name="cq_bucket_pos")
    theirs = _reference(_source(spark, root, "l"), _source(spark, root, "r"), 3, 8)
    _run((ours, "ours_pos", str(tmp_path / "ck_ours")), (theirs, "spark_pos", str(tmp_path / "ck_spark")))
    assert spark.table("ours_pos").count() > 50
    jd.assert_same_rows(spark.table("ours_pos"), spark.table("spark_pos"))


@pytest.mark.spark
@pytest.mark.slow
def test_bucket_restart_from_checkpoint_equals_uninterrupted_run(spark, tmp_path):
    rng = np.random.default_rng(5)
    root = str(tmp_path / "in")

    def write_batch(i):
        for side in ("l", "r"):
            t0 = jd.BASE_US + i * 10 * S
            table = jd.side_table(rng, side, 50, t0, nkeys=8, null_keys=True, spread_s=7)
            jd.write(os.path.join(root, side), f"b{i:03d}.parquet", table)

    sink, ck = str(tmp_path / "sink"), str(tmp_path / "ck")

    def run_ours(bucket="3 seconds"):
        df = _ours(spark, root, jd.LOWER_S, jd.UPPER_S, bucket)
        (df.writeStream.format("parquet").option("path", sink).option("checkpointLocation", ck)
         .trigger(availableNow=True).start().awaitTermination())

    for i in range(3):
        write_batch(i)
    run_ours()
    first = spark.read.parquet(sink).count()
    for i in range(3, 6):
        write_batch(i)
    run_ours()
    assert spark.read.parquet(sink).count() > first
    theirs = _reference(_source(spark, root, "l"), _source(spark, root, "r"), jd.LOWER_S, jd.UPPER_S)
    _run((theirs, "spark_bucket_restart", str(tmp_path / "ck_spark")))
    jd.assert_same_rows(spark.read.parquet(sink), spark.table("spark_bucket_restart"))
    # Another width would store rows in buckets that do not hold their state: refused, naming the width.
    write_batch(6)
    with pytest.raises(Exception, match="bucket_width"):
        run_ours(bucket="5 seconds")

