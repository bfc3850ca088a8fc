"""sliding_aggregate(..., state="files"): the stateful step in a stateless stage, its state in files per
micro-batch (issue 39). The oracle is Spark's own window() aggregation with no-data micro-batches off (a
stateless query runs none), on the same files and micro-batches; a batch Spark runs again after a lost
commit gives the same rows, and the state continues."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import aggregate_reference as R
from test_aggregate_streaming import AGGS, make_batches, run_to_memory, source, spark_windows, write_files

import pyspark_cq
from pyspark_cq import sliding_aggregate
from pyspark_cq.operators._common.batch_versions import parse_version, spark_watermark, trunc_ms, version_name

NO_DATA = "spark.sql.streaming.noDataMicroBatches.enabled"


def spark_without_no_data_batches(spark, run):
    """``run()`` with Spark's no-data micro-batches off (the session's setting is restored after)."""
    before = spark.conf.get(NO_DATA, None)
    spark.conf.set(NO_DATA, "false")
    try:
        return run()
    finally:
        if before is None:
            spark.conf.unset(NO_DATA)
        else:
            spark.conf.set(NO_DATA, before)


def test_version_names_and_spark_millisecond_division():
    name = version_name(12, b"\x01" * 16)
    assert name == "v000000000012-" + "01" * 16 and parse_version(name) == 12
    assert parse_version(".v000000000012-ab.tmp") is None and parse_version("g3") is None
    # the JVM's long division truncates toward zero (EventTimeWatermarkExec: micros / 1000)
    assert trunc_ms(1_999) == 1 and trunc_ms(-1_999) == -1 and trunc_ms(-2_000) == -2
    # Spark's WatermarkTracker: each input's latest time less its delay (0 before its first row), then the
    # policy's choice over the inputs, never below 0
    assert spark_watermark([None], [5_000]) == 0 and spark_watermark([3_000], [5_000]) == 0
    assert spark_watermark([20_000], [5_000]) == 15_000
    assert spark_watermark([20_000, None], [5_000, 1_000]) == 0
    assert spark_watermark([20_000, 9_000], [5_000, 1_000]) == 8_000
    assert spark_watermark([20_000, 9_000], [5_000, 1_000], "max") == 15_000
    with pytest.raises(ValueError, match="policy must be"):
        spark_watermark([1], [1], "avg")


def _collect_to(out: Path):
    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        pdf.attrs = {}
        pdf.to_parquet(out / f"{batch_id:06d}.parquet")
    return collect


@pytest.mark.spark
@pytest.mark.slow
def test_files_state_equals_spark_window_without_no_data_batches_across_a_lost_commit(spark, tmp_dir):
    """Out-of-order, late and null-keyed rows in six micro-batches (one empty), against Spark's window() on the
    same files with no-data micro-batches off. Our query stops after five batches and loses its last commit, as
    a crash between the state write and the commit leaves it: Spark runs batch 4 again on restart, which reads
    the state version batch 3 wrote (not its own first attempt's) and gives the same rows; the batches after
    it continue from its state. The first run takes a local master's default stage (one task, no shuffle), the
    restart two tasks over a shuffle by shard: the same state, the same rows."""
    batches = make_batches(seed=3, n_batches=6)
    ck = tmp_dir / "ck"

    def run(out: Path, tasks=None):
        out.mkdir()
        df = sliding_aggregate(source(spark, tmp_dir / "in"), "ts", "10 seconds", "4 seconds", by=["k", "name"],
                               aggs=AGGS, name="files_agg", state="files", state_dir=str(tmp_dir / "state"),
                               tasks=tasks)
        stage = df._jdf.queryExecution().analyzed().toString()
        assert ("RepartitionByExpression" in stage) == (tasks == 2)   # a shuffle by shard
        assert ("Repartition 1, false" in stage) == (tasks is None)      # coalesce(1): no shuffle
        q = (df.writeStream.foreachBatch(_collect_to(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return {int(p.stem): pd.read_parquet(p) for p in out.iterdir()}, q.recentProgress

    write_files(tmp_dir / "in", batches[:5])
    first, progress1 = run(tmp_dir / "out1")
    for lost in ("4", ".4.crc"):   # the commit and its checksum, as a crash before the commit leaves them
        (ck / "commits" / lost).unlink(missing_ok=True)
    write_files(tmp_dir / "in", batches[5:], first=5)
    second, progress2 = run(tmp_dir / "out2", tasks=2)
    assert sorted(first) == [0, 1, 2, 3, 4] and sorted(second) == [4, 5]   # batch 4 ran again
    key = ["window_start", "k", "name"]

    def rows(pdf):
        return pdf.sort_values(key).reset_index(drop=True)

    assert len(first[4]) > 0
    pd.testing.assert_frame_equal(rows(first[4]), rows(second[4]))
    ours = pd.concat([first[b] for b in (0, 1, 2, 3)] + [second[b] for b in (4, 5)], ignore_index=True)

    write_files(tmp_dir / "spark_in", batches)
    q, theirs = spark_without_no_data_batches(spark, lambda: run_to_memory(
        spark_windows(source(spark, tmp_dir / "spark_in"), "10 seconds", "4 seconds", ["k", "name"], AGGS),
        tmp_dir / "ck_spark"))
    assert len(q.recentProgress) == 6 and len(ours) > len(first[4])
    R.assert_same_rows(spark.createDataFrame(ours, theirs.schema), theirs, key)
    reports = [pyspark_cq.read_metrics(p, "files_agg") for p in progress1[:4] + progress2]
    assert sum(r["input_rows"] for r in reports) == sum(len(b) for b in batches)
    assert sum(r["output_rows"] for r in reports) == len(ours)
    assert sum(r["late_rows"] for r in reports) > 0 and sum(r["evicted_rows"] for r in reports) > 0
    # one directory per shard, holding the last batch's version and the one it read (older ones deleted)
    shards = sorted((tmp_dir / "state").iterdir())
    assert shards and all(len([f for f in d.iterdir() if not f.name.startswith(".")]) <= 2 for d in shards)


@pytest.mark.spark
def test_files_state_refuses_bad_arguments_and_another_querys_directory(spark, tmp_dir):
    write_files(tmp_dir / "in", make_batches(seed=4, n_batches=1, rows=20, keys=3))
    df = source(spark, tmp_dir / "in")
    with pytest.raises(ValueError, match="state='files' runs output_mode='append'"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="files", output_mode="update",
                          state_dir=str(tmp_dir / "s"))
    with pytest.raises(ValueError, match="state must be one of"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="file")
    for tasks in (0, 1.5, True, "2"):
        with pytest.raises(TypeError, match="tasks must be an int >= 1"):
            sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="files", tasks=tasks,
                              state_dir=str(tmp_dir / "s"))
    with pytest.raises(ValueError, match="tasks: only state='files'"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", tasks=2)
    with pytest.raises(TypeError, match="state_dir must be a directory path"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="files", state_dir=3)
    for ck in ("ck1", "ck2"):   # two checkpoints (two queries) on one state directory
        q = (sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="files",
                               state_dir=str(tmp_dir / "shared"))
             .writeStream.format("noop").option("checkpointLocation", str(tmp_dir / ck))
             .trigger(availableNow=True).start())
        if ck == "ck1":
            q.awaitTermination()
            continue
        with pytest.raises(Exception, match="holds the state of another streaming query"):
            q.awaitTermination()
