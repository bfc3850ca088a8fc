"""sliding_aggregate with its state in transformWithStateInPandas (``state="tws"``, issue 14): the same rows
as Spark's window() aggregation on the same files and micro-batches (out-of-order, partially late and late
rows, an empty batch), in append and update mode and across a restart; bad input."""
from __future__ import annotations

import pytest
from helpers import aggregate_reference as R
from test_aggregate_streaming import AGGS, make_batches, run_to_memory, source, spark_windows, write_files

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
@pytest.mark.parametrize("window, slide, shards", [("60 seconds", "1 second", None), ("10 seconds", "4 seconds", "key")])
def test_tws_stream_equals_spark_window(rocksdb, tmp_dir, window, slide, shards):
    spark = rocksdb
    batches = make_batches(seed=3)
    write_files(tmp_dir / "in", batches)
    q1, ours = run_to_memory(sliding_aggregate(source(spark, tmp_dir / "in"), "ts", window, slide, by=["k", "name"],
                                               aggs=AGGS, shards=shards, name="tws", state="tws"), tmp_dir / "ck1")
    q2, theirs = run_to_memory(spark_windows(source(spark, tmp_dir / "in"), window, slide, ["k", "name"], AGGS),
                               tmp_dir / "ck2")
    assert ours.count() > 0
    R.assert_same_rows(ours, theirs, ["window_start", "k", "name"])
    assert any(o["operatorName"].startswith("transformWithState")
               for p in q1.recentProgress for o in p.get("stateOperators", []))
    reports = [pyspark_cq.read_metrics(p, "tws") for p in q1.recentProgress]
    assert sum(r["input_rows"] for r in reports if r) == sum(len(b) for b in batches)
    assert sum(r["late_rows"] for r in reports if r) > 0


@pytest.mark.spark
@pytest.mark.slow
def test_tws_update_mode_and_restart_equal_spark(rocksdb, tmp_dir):
    spark = rocksdb
    batches = make_batches(seed=8, n_batches=6, keys=20)
    write_files(tmp_dir / "in", batches[:3])
    aggs = {"v": ["sum"], "*": ["count"]}

    def ours():
        return sliding_aggregate(source(spark, tmp_dir / "in"), "ts", "6 seconds", "2 seconds", by="k", aggs=aggs,
                                 name="tws_up", output_mode="update", state="tws")

    _, first = run_to_memory(ours(), tmp_dir / "ck", mode="update")
    got = first.collect()
    write_files(tmp_dir / "in", batches[3:], first=3)
    _, second = run_to_memory(ours(), tmp_dir / "ck", mode="update")   # restores the RocksDB state
    got += second.collect()
    _, theirs = run_to_memory(spark_windows(source(spark, tmp_dir / "in"), "6 seconds", "2 seconds", ["k"], aggs),
                              tmp_dir / "ck_spark", mode="update")
    # update mode re-emits a window whenever rows join it (its count(*) grows, no row is removed): its
    # final value is the row with the largest count, on both sides
    def final(rows):
        out = {}
        for r in rows:
            key, value = (r["window_start"], r["k"]), (r["count"], r["sum_v"])
            out[key] = max(out.get(key, value), value, key=lambda x: x[0])
        return out

    want = final(theirs.collect())
    assert len(want) > 0 and len(got) > len(want)
    assert final(got) == want
