"""sliding_aggregate with its state in transformWithStateInPandas (``state="tws"``, issue 14): the same rows
as Spark's window() aggregation on the same files and micro-batches (out-of-order, partially late and late
rows, an empty batch), in append and update mode and across a restart; bad input."""
from __future__ import annotations

import pandas as pd
import pytest
from helpers import aggregate_reference as R
from helpers.streaming import run_side_by_side
from test_aggregate_streaming import AGGS, make_batches, run_both_to_memory, source, spark_windows, write_files

import pyspark_cq
from pyspark_cq import sliding_aggregate

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.fixture
def rocksdb(spark):
    """Spark's RocksDB state store (with changelog checkpointing) for the queries started in the test."""
    spark.conf.set(PROVIDER, ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    yield spark
    spark.conf.unset(PROVIDER)
    spark.conf.unset("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled")


@pytest.mark.spark
@pytest.mark.slow
# shards="key" without late rows: that layout is not exact for late rows of a key's first batch (docs/aggregate.md)
@pytest.mark.parametrize("window, slide, shards, late", [("60 seconds", "1 second", None, True),
                                                         ("10 seconds", "4 seconds", "key", False)])
def test_tws_stream_equals_spark_window(rocksdb, tmp_dir, window, slide, shards, late):
    spark = rocksdb
    batches = make_batches(seed=3, late=late)
    write_files(tmp_dir / "in", batches)
    (q1, ours), (_, theirs) = run_both_to_memory(
        sliding_aggregate(source(spark, tmp_dir / "in"), "ts", window, slide, by=["k", "name"], aggs=AGGS,
                          shards=shards, name="tws", state="tws"),
        spark_windows(source(spark, tmp_dir / "in"), window, slide, ["k", "name"], AGGS), (tmp_dir / "ck1", tmp_dir / "ck2"))
    assert ours.count() > 0
    R.assert_same_rows(ours, theirs, ["window_start", "k", "name"])
    assert any(o["operatorName"].startswith("transformWithState")
               for p in q1.recentProgress for o in p.get("stateOperators", []))
    reports = [pyspark_cq.read_metrics(p, "tws") for p in q1.recentProgress]
    assert sum(r["input_rows"] for r in reports if r) == sum(len(b) for b in batches)


@pytest.mark.spark
@pytest.mark.slow
def test_tws_update_mode_and_restart_equal_spark(rocksdb, tmp_dir):
    spark = rocksdb
    batches = make_batches(seed=8, n_batches=6, keys=20)
    write_files(tmp_dir / "in", batches[:3])
    aggs = {"v": ["sum"], "*": ["count"]}

    def writer(df, label):
        # foreachBatch into files: the memory sink cannot restart from a checkpoint
        out = tmp_dir / label
        out.mkdir(exist_ok=True)

        def collect(batch_df, batch_id):
            batch_df.toPandas().to_parquet(out / f"{batch_id:06d}.parquet")
        return (df.writeStream.outputMode("update").foreachBatch(collect)
                .option("checkpointLocation", str(tmp_dir / f"ck_{label}")))

    def ours():
        return sliding_aggregate(source(spark, tmp_dir / "in"), "ts", "6 seconds", "2 seconds", by="k", aggs=aggs,
                                 name="tws_up", output_mode="update", state="tws")

    run_side_by_side(writer(ours(), "ours"))
    write_files(tmp_dir / "in", batches[3:], first=3)
    # restarts from the checkpoint (the shards' images come back from RocksDB), beside Spark's run over all the files
    # (their micro-batch latencies overlap: issue 41)
    run_side_by_side(writer(ours(), "ours"),
                     writer(spark_windows(source(spark, tmp_dir / "in"), "6 seconds", "2 seconds", ["k"], aggs), "theirs"))

    # update mode re-emits a window whenever rows join it (its count(*) grows, no row is removed): its
    # final value is the row with the largest count, on both sides
    def final(label):
        rows = pd.concat([pd.read_parquet(f) for f in sorted((tmp_dir / label).glob("*.parquet"))])
        out = {}
        for r in rows.itertuples(index=False):
            key, value = (r.window_start, r.k), (r.count, None if pd.isna(r.sum_v) else r.sum_v)
            out[key] = max(out.get(key, value), value, key=lambda x: x[0])
        return out, len(rows)

    (got, n_ours), (want, _) = final("ours"), final("theirs")
    assert len(want) > 0 and n_ours > len(want)
    assert got == want


@pytest.mark.spark
def test_tws_needs_rocksdb_and_a_known_state_home(spark, tmp_dir):
    write_files(tmp_dir / "in", make_batches(seed=1, n_batches=1, rows=5))
    df = source(spark, tmp_dir / "in")
    with pytest.raises(ValueError, match="state must be one of"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="rocksdb")
    spark.conf.unset(PROVIDER)
    with pytest.raises(ValueError, match="RocksDB state store: set spark.sql.streaming.stateStore.providerClass"):
        sliding_aggregate(df, "ts", "4 seconds", "2 seconds", by="k", state="tws")
