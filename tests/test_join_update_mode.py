"""Joins in update output mode (issue 42 item 4): where Spark 4.3 runs its own stream-stream join in update mode
(inner and left semi joins; outer joins append only, complete never), ``interval_join`` / ``window_join`` /
``multi_join`` run with ``output_mode="update"`` and give Spark's rows in the same mode; a join followed by an
aggregation runs in update mode with the join left in append mode, as Spark's does.

Streams: ``tests/test_multi_join.py``'s generator, two inputs ``k<i>, t<i>, v<i>``, one file per trigger.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import join_data as jd
from helpers.streaming import run_memory, run_side_by_side
from pyspark.sql import functions as F
from test_multi_join import _cols, _rows, _schema, _table

import pyspark_cq as cq

DELAY = "20 seconds"
COND = "k0 = k1 AND t1 BETWEEN t0 + INTERVAL -5 SECONDS AND t0 + INTERVAL 10 SECONDS"


def _write(root, seed, batches=4):
    rng = np.random.default_rng(seed)
    for b in range(batches):
        for i in range(2):
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", _table(rng, i, 30, jd.BASE_US + b * 10_000_000))


def _sources(spark, root):
    return [spark.readStream.schema(_schema(i)).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, f"in{i}")).withWatermark(f"t{i}", DELAY) for i in range(2)]


def _run(df, name, checkpoint, mode):
    (q,) = run_memory((df, name, checkpoint), mode=mode)
    return q


def _interval(a, b, how="inner", **kw):
    return cq.interval_join(a, b, left_on="k0", right_on="k1", left_time="t0", right_time="t1",
                            lower="-5 seconds", upper="10 seconds", how=how, **kw)


@pytest.mark.spark
def test_output_mode_is_checked(spark):
    a = spark.createDataFrame([(1, jd.BASE_US)], "k0 long, t0 long").selectExpr("k0", "timestamp_micros(t0) t0")
    b = a.selectExpr("k0 AS k1", "t0 AS t1")
    with pytest.raises(ValueError, match="output_mode must be 'append' or 'update'"):
        _interval(a, b, output_mode="complete")
    for how in ("left", "right", "full", "left_anti"):
        with pytest.raises(ValueError, match=f"output_mode='update' with how='{how}'"):
            _interval(a, b, how=how, output_mode="update")
    with pytest.raises(ValueError, match="output_mode must be"):
        cq.window_join(a, b, left_on="k0", right_on="k1", left_time="t0", right_time="t1", left_window="1 minute",
                       right_window="1 minute", output_mode=None)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("how", ["inner", "left_semi"])
def test_update_mode_join_equals_spark_join_in_update_mode(spark, tmp_dir, how):
    root = str(tmp_dir / "in")
    _write(root, seed=81)
    a, b = _sources(spark, root)
    spark_join = a.join(b, F.expr(COND), how)
    cols = spark_join.columns
    a2, b2 = _sources(spark, root)
    runs = [(spark_join, f"spark_upd_{how}", str(tmp_dir / "ck_s")),
            (_interval(a2, b2, how, output_mode="update").select(*cols), f"ours_upd_{how}", str(tmp_dir / "ck_o"))]
    if how == "inner":   # multi_join too
        a3, b3 = _sources(spark, root)
        mj = cq.multi_join([a3, b3], ["k0", "k1"], ["t0", "t1"], [(0, 1, "-5 seconds", "10 seconds")],
                           output_mode="update")
        runs.append((mj.select(*_cols(2)), "ours_upd_mj", str(tmp_dir / "ck_m")))
    run_memory(*runs, mode="update")
    want = _rows(spark.table(f"spark_upd_{how}"))
    assert len(want) > 10
    assert _rows(spark.table(f"ours_upd_{how}")) == want
    if how == "inner":
        assert _rows(spark.table("ours_upd_mj")) == _rows(spark.table(f"spark_upd_{how}").select(*_cols(2)))


@pytest.mark.spark
@pytest.mark.slow
def test_join_then_aggregate_in_update_mode_equals_spark(spark, tmp_dir):
    """A join (append, the default) followed by a count per key, written in update mode: every batch's updated
    counts equal those of Spark's join and aggregation in update mode. Spark's global-watermark check refuses
    any stateful operator after an ``applyInPandasWithState`` (it may emit rows behind the watermark); a
    grouping without the event time drops no row as late, so the check is turned off here (docs/join.md).
    """
    check = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"
    root = str(tmp_dir / "in")
    _write(root, seed=82)
    a, b = _sources(spark, root)
    _run(a.join(b, F.expr(COND)).groupBy("k0").agg(F.count("*").alias("n"), F.max("v1").alias("s")),
         "spark_upd_agg", str(tmp_dir / "ck_s"), "update")
    a, b = _sources(spark, root)
    agg = _interval(a, b).groupBy("k0").agg(F.count("*").alias("n"), F.max("v1").alias("s"))
    with pytest.raises(Exception, match="global watermark"):
        _run(agg, "ours_upd_refused", str(tmp_dir / "ck_r"), "update")
    spark.conf.set(check, "false")
    try:
        _run(agg, "ours_upd_agg", str(tmp_dir / "ck_o"), "update")
    finally:
        spark.conf.unset(check)
    want = _rows(spark.table("spark_upd_agg"))
    assert len(want) > len({r[0] for r in want})   # keys updated in more than one batch
    assert _rows(spark.table("ours_upd_agg")) == want


@pytest.mark.spark
@pytest.mark.slow
def test_update_mode_with_late_rows_and_a_restart_equals_spark(spark, tmp_dir):
    """An inner interval_join and a 2-input multi_join in update mode, stopped after two batches and restarted from
    the checkpoint, with late rows in the third: every row of Spark's own join in update mode (uninterrupted), once.
    A ``foreachBatch`` sink (update mode has no file sink; the memory sink does not restore from a checkpoint). The
    two joins run side by side, and Spark's beside their restart (two runs of the micro-batches, not five: issue 41).
    """
    import pyarrow as pa

    root = str(tmp_dir / "in")
    rng = np.random.default_rng(83)
    for b in range(5):
        for i in range(2):
            t = _table(rng, i, 30, jd.BASE_US + b * 10_000_000)
            if b == 2:   # far behind the watermark: dropped by Spark before either join
                t = pa.concat_tables([t, _table(rng, i, 4, jd.BASE_US - 600_000_000).slice(0, 4)])
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)
    live = str(tmp_dir / "live")

    def writer(build, ck, got):
        return (build(*_sources(spark, live)).writeStream.outputMode("update")
                .foreachBatch(lambda df, _: got.extend(tuple(r) for r in df.select(*_cols(2)).collect()))
                .option("checkpointLocation", ck))

    def ours_interval(a, b):
        return _interval(a, b, output_mode="update")

    def ours_multi(a, b):
        return cq.multi_join([a, b], ["k0", "k1"], ["t0", "t1"], [(0, 1, "-5 seconds", "10 seconds")],
                             output_mode="update", name="mj_upd")

    def spark_join(a, b):
        return a.join(b, F.expr(COND), "inner")

    results = {"interval": [], "multi": [], "spark": []}
    for i in range(2):
        os.makedirs(os.path.join(live, f"in{i}"))
    for step, files in enumerate((range(2), range(2, 5))):
        for b in files:
            for i in range(2):
                name = f"b{b:03d}.parquet"
                os.link(os.path.join(root, f"in{i}", name), os.path.join(live, f"in{i}", name))
        # ours side by side; Spark's join beside the restarted ones, uninterrupted (every file is present then)
        builds = [("interval", ours_interval), ("multi", ours_multi)] + [("spark", spark_join)] * step
        queries = run_side_by_side(*(writer(build, str(tmp_dir / f"ck_{key}"), results[key]) for key, build in builds))
        q_multi = queries[1]
    want = sorted(results["spark"], key=repr)
    assert len(want) > 20
    assert sorted(results["interval"], key=repr) == want
    assert sorted(results["multi"], key=repr) == want
    reports = [r for r in (cq.read_metrics(p, "mj_upd") for p in q_multi.recentProgress) if r]
    assert sum(r["late_rows"] for r in reports) == 8
