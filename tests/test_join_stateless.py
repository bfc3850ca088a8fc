"""interval_join(..., state_persistence="stateless"): the join in a stateless stage, its state in files only
(issue 39), against Spark's stream-stream join on the same files and micro-batches, across a lost commit (the
batch Spark runs again reads the state version before it and gives the same rows), plus bad arguments."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import join_data as jd
from helpers.streaming import lose_commit, run_memory, run_per_batch

import pyspark_cq

DELAY = "15 seconds"


def _join(spark, root, state_dir, persistence="stateless", **kw):
    return pyspark_cq.interval_join(jd.stream_source(spark, root, "l", DELAY), jd.stream_source(spark, root, "r", DELAY),
                                    ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds",
                                    suffixes=("_l", "_r"), name="sj", state_persistence=persistence,
                                    state_dir=state_dir, **kw)


@pytest.mark.spark
@pytest.mark.slow
def test_stateless_join_equals_spark_join_across_a_lost_commit(spark, tmp_path):
    """Five micro-batches per side (out-of-order, late, duplicate and null-keyed rows, an empty file on each
    side, rows at the band's bounds). Our query stops after four batches and loses its last commit, as a crash
    between the state write and the commit leaves it: Spark runs batch 3 again on restart, with the state of
    batch 2, and gives the same rows; batch 4 continues from its state. The union equals Spark's join."""
    full, ours_in = tmp_path / "full", tmp_path / "ours_in"
    jd.write_streams(str(full), 5, null_keys=True, seed=11)
    ck = tmp_path / "ck"

    def run(files: int, out: Path):
        for side in ("l", "r"):
            os.makedirs(ours_in / side, exist_ok=True)
            for i in range(files):
                name = f"b{i:03d}.parquet"
                if not (ours_in / side / name).exists():
                    shutil.copy2(full / side / name, ours_in / side / name)   # keeps the files' order
        return run_per_batch(_join(spark, str(ours_in), str(tmp_path / "state")), ck, out)

    first, progress1 = run(4, tmp_path / "out1")
    lose_commit(ck, 3)
    second, progress2 = run(5, tmp_path / "out2")
    assert sorted(first) == [0, 1, 2, 3] and sorted(second) == [3, 4]   # batch 3 ran again
    assert first[3].count() > 0
    jd.assert_same_rows(first[3], second[3])
    ours = first[0].unionByName(first[1]).unionByName(first[2]).unionByName(second[3]).unionByName(second[4])
    theirs = jd.spark_reference(jd.stream_source(spark, str(full), "l", DELAY),
                                jd.stream_source(spark, str(full), "r", DELAY), "inner")
    run_memory((theirs, "spark_stateless_ref", str(tmp_path / "ck_spark")))
    ref = spark.table("spark_stateless_ref")
    jd.assert_same_rows(ours, ref)
    reports = [pyspark_cq.read_metrics(p, "sj") for p in progress1[:3] + progress2]
    assert sum(r["output_rows"] for r in reports) == ours.count()
    assert sum(r["evicted_rows"] for r in reports) > 0 and sum(r["late_rows"] for r in reports) > 0


@pytest.mark.spark
def test_stateless_join_refuses_what_it_cannot_run(spark, tmp_path):
    jd.write_streams(str(tmp_path / "in"), 1, null_keys=False, seed=3)
    with pytest.raises(ValueError, match="state_persistence='stateless' runs inner joins"):
        _join(spark, str(tmp_path / "in"), str(tmp_path / "s"), how="left")
    no_watermark = spark.readStream.schema(jd.schema("r")).parquet(str(tmp_path / "in" / "r"))
    with pytest.raises(ValueError, match="right_time: the streaming input needs a watermark"):
        pyspark_cq.interval_join(jd.stream_source(spark, str(tmp_path / "in"), "l", DELAY), no_watermark, "k", "ts",
                                 "ts", "-1 second", "1 second", state_persistence="stateless",
                                 state_dir=str(tmp_path / "s"))
    with pytest.raises(ValueError, match="state_persistence must be one of .*'stateless'"):
        _join(spark, str(tmp_path / "in"), str(tmp_path / "s"), persistence="stateles")
