"""interval_join options a Spark user expects (issue 17): keys named differently (``left_on`` /
``right_on``), same-named time columns without ``suffixes=``, and left semi / left anti joins.

Oracles: Spark's own batch join and Spark's own stream-stream join with the same condition and
watermarks on the same file streams (one file per micro-batch). Spark has no stream-stream left anti
join; its streaming *left outer* join's unmatched rows (right side null) are the anti join's rows.
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.streaming import assert_same_multiset, run_side_by_side
from pyspark.sql import functions as F

import pyspark_cq

pytestmark = pytest.mark.spark
DELAY = "15 seconds"
BAND = f"r.ts >= l.ts + interval {jd.LOWER_S} seconds AND r.ts <= l.ts + interval {jd.UPPER_S} seconds"
LEFT_COLS = ["k", "s", "ts", "lv", "tag"]
RENAMED = ["rk", "rs", "ts", "rv", "tag"]   # the right input with its keys renamed


def _renamed(right):
    return right.withColumnRenamed("k", "rk").withColumnRenamed("s", "rs")


def _ours(left, right, how, **kw):
    return pyspark_cq.interval_join(left, right, left_time="ts", right_time="ts", lower=f"{jd.LOWER_S} seconds",
                                    upper=dt.timedelta(seconds=jd.UPPER_S), how=how, **kw)


def _spark_left_on(left, right, how):
    """Spark's join of ``left`` with the renamed ``right`` on k = rk, s = rs and the band; both key pairs
    kept, clashing columns with the default suffixes."""
    l, r = left.alias("l"), right.alias("r")
    joined = l.join(r, F.expr(f"l.k = r.rk AND l.s = r.rs AND {BAND}"), jd.SPARK_HOW[how])
    return joined.select("l.k", "l.s", F.col("l.ts").alias("ts_left"), "lv", F.col("l.tag").alias("tag_left"),
                         "r.rk", "r.rs", F.col("r.ts").alias("ts_right"), "rv", F.col("r.tag").alias("tag_right"))


def _spark_left_only(left, right, how):
    """Spark's left semi join, or (anti) the unmatched rows of its left outer join, on ``right`` renamed."""
    l, r = left.alias("l"), right.alias("r")
    cond = F.expr(f"l.k = r.rk AND l.s = r.rs AND {BAND}")
    if how == "left_semi":
        return l.join(r, cond, "left_semi")
    return l.join(r, cond, "left_outer").where(F.col("r.ts").isNull()).select("l.*")


def _same(ours, theirs):
    assert ours.columns == theirs.columns
    assert_same_multiset(ours, theirs, "ours against Spark's")


# --- batch --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(spark):
    rng = np.random.default_rng(17)
    sides = {}
    for side in ("l", "r"):
        parts = [jd.side_table(rng, side, 100, jd.BASE_US + i * 10_000_000) for i in range(3)]
        parts.append(jd.bound_rows(side, jd.BASE_US + 5_000_000, key=3))
        sides[side] = spark.createDataFrame(pa.concat_tables(parts).to_pandas(), jd.schema(side))
    return sides["l"], sides["r"]


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_batch_left_on_right_on_equals_spark(inputs, how):
    left, right = inputs
    ours = _ours(left, _renamed(right), how, left_on=["k", "s"], right_on=["rk", "rs"], shards=3)
    assert ours.columns == ["k", "s", "ts_left", "lv", "tag_left", "rk", "rs", "ts_right", "rv", "tag_right"]
    _same(ours, _spark_left_on(left, _renamed(right), how))


def test_batch_one_key_pair_named_alike_is_output_once(inputs):
    left, right = inputs
    right = right.withColumnRenamed("s", "rs")
    ours = _ours(left, right, "full", left_on=["k", "s"], right_on=["k", "rs"], suffixes=("_l", "_r"))
    assert ours.columns == ["k", "s", "ts_l", "lv", "tag_l", "rs", "ts_r", "rv", "tag_r"]
    l, r = left.alias("l"), right.alias("r")
    theirs = l.join(r, F.expr(f"l.k = r.k AND l.s = r.rs AND {BAND}"), "full_outer").select(
        F.coalesce("l.k", "r.k").alias("k"), "l.s", F.col("l.ts").alias("ts_l"), "lv", F.col("l.tag").alias("tag_l"),
        "r.rs", F.col("r.ts").alias("ts_r"), "rv", F.col("r.tag").alias("tag_r"))
    _same(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["left_semi", "left_anti"])
def test_batch_semi_and_anti_equal_spark(inputs, how):
    left, right = inputs
    ours = _ours(left, _renamed(right), how, left_on=["k", "s"], right_on=["rk", "rs"])
    assert ours.columns == LEFT_COLS
    l, r = left.alias("l"), _renamed(right).alias("r")
    _same(ours, l.join(r, F.expr(f"l.k = r.rk AND l.s = r.rs AND {BAND}"), how))
    # Spark's spellings of the join type, and on= with semi joins (no suffixes needed: left columns only).
    alias = {"left_semi": "semi", "left_anti": "leftanti"}[how]
    _same(_ours(left, right, alias, on=["k", "s"], name=f"cq_{alias}"), ours)


def test_same_named_time_columns_get_default_suffixes(spark):
    left = spark.createDataFrame([(1, dt.datetime(2024, 1, 1, 12, 0, 0), "a")], "k long, ts timestamp, v string")
    right = spark.createDataFrame([(1, dt.datetime(2024, 1, 1, 12, 0, 3), "b")], "k long, ts timestamp, v string")
    out = pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "5 seconds")
    assert out.columns == ["k", "ts_left", "v_left", "ts_right", "v_right"]
    assert [tuple(r) for r in out.collect()] == [(1, dt.datetime(2024, 1, 1, 12, 0, 0), "a",
                                                  dt.datetime(2024, 1, 1, 12, 0, 3), "b")]


def test_key_arguments_are_checked(inputs):
    left, right = inputs
    r2 = _renamed(right)
    with pytest.raises(ValueError, match="either on or left_on / right_on"):
        _ours(left, r2, "inner", on="k", left_on="k", right_on="rk")
    with pytest.raises(TypeError, match="right_on is required with left_on"):
        _ours(left, r2, "inner", left_on="k")
    with pytest.raises(ValueError, match="left_on and right_on must name as many columns"):
        _ours(left, r2, "inner", left_on=["k", "s"], right_on="rk")
    with pytest.raises(ValueError, match=r"right_on: unknown column\(s\) \['k'\]"):
        _ours(left, r2, "inner", left_on="k", right_on="k")
    with pytest.raises(TypeError, match="on is required"):
        _ours(left, right, "inner")
    with pytest.raises(TypeError, match=r"on: key column 'k' / 'rs' has type bigint on the left and string"):
        _ours(left, r2, "inner", left_on="k", right_on="rs")
    with pytest.raises(TypeError, match="lower is required"):
        pyspark_cq.interval_join(left, right, "k", "ts", "ts", upper="1 second", suffixes=("_l", "_r"))
    with pytest.raises(ValueError, match="how must be one of .*'left_semi', 'left_anti'"):
        _ours(left, right, "right_semi", on="k")


# --- streaming: against Spark's stream-stream join ----------------------------------------------------


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("join_features"))
    jd.write_streams(root, 5, null_keys=True, seed=23)
    return root


def _sources(spark, root):
    return jd.stream_source(spark, root, "l", DELAY), _renamed(jd.stream_source(spark, root, "r", DELAY))


def _run_both(spark, ours, theirs, label, tmp_path):
    queries = []
    for df, who in ((ours, "ours"), (theirs, "spark")):
        queries.append(df.writeStream.format("memory").queryName(f"{who}_{label}").outputMode("append")
                       .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / who)).start())
    for q in queries:
        q.awaitTermination()
    return spark.table(f"ours_{label}"), spark.table(f"spark_{label}"), queries[0]


@pytest.mark.slow
def test_stream_semi_and_anti_equal_spark(spark, stream_dir, tmp_path):
    """Both joins and Spark's, four queries side by side over the same files (one run, not one per join: issue
    41)."""
    hows = ("left_semi", "left_anti")
    writers = []
    for how in hows:
        left, right = _sources(spark, stream_dir)
        ours = _ours(left, right, how, left_on=["k", "s"], right_on=["rk", "rs"], name=f"cq_{how}")
        left2, right2 = _sources(spark, stream_dir)
        for df, who in ((ours, "ours"), (_spark_left_only(left2, right2, how), "spark")):
            writers.append(df.writeStream.format("memory").queryName(f"{who}_{how}").outputMode("append")
                           .option("checkpointLocation", str(tmp_path / f"{who}_{how}")))
    queries = run_side_by_side(*writers)
    for how, q in zip(hows, queries[::2]):
        got = spark.table(f"ours_{how}")
        assert got.count() > 0, how
        _same(got, spark.table(f"spark_{how}"))
        reports = [r for r in (pyspark_cq.read_metrics(p, f"cq_{how}") for p in q.recentProgress) if r]
        assert sum(r["output_rows"] for r in reports) == got.count(), how


@pytest.mark.slow
def test_stream_left_on_full_join_equals_spark(spark, tmp_path):
    root = str(tmp_path / "data")
    jd.write_streams(root, 4, null_keys=False, seed=29)
    left, right = _sources(spark, root)
    ours = _ours(left, right, "full", left_on=["k", "s"], right_on=["rk", "rs"])
    left2, right2 = _sources(spark, root)
    got, want, _ = _run_both(spark, ours, _spark_left_on(left2, right2, "full"), "left_on_full", tmp_path)
    assert got.where(F.col("k").isNull()).count() > 0 and got.where(F.col("rk").isNull()).count() > 0
    _same(got, want)
