"""interval_join(..., state_persistence="stateless"): the join in a stateless stage, its state in files only
(issue 39), against Spark's stream-stream join on the same files and micro-batches, across a lost commit (the
batch Spark runs again reads the state version before it and gives the same rows), plus bad arguments."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
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


def _rows(side: str, rows) -> pa.Table:
    """``(k, seconds after BASE_US, value, tag)`` rows as one side's table (``jd.schema``)."""
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "s": pa.array(["a"] * len(rows)),
                     "ts": pa.array([jd.BASE_US + r[1] * 1_000_000 for r in rows], pa.timestamp("us", "UTC")),
                     f"{side}v": pa.array([r[2] for r in rows], pa.int64()),
                     "tag": pa.array([r[3] for r in rows], pa.float64())})


@pytest.mark.spark
@pytest.mark.slow
def test_stateless_join_takes_sparks_watermark_through_a_filter(spark, tmp_path):
    """A filter on the time column between ``withWatermark`` and the join drops the left input's latest row
    (t = 100 s). Spark's watermark sees it (Spark pushes a filter below ``withWatermark`` only when it does not
    read the time column): batch 1 runs with 95 s, so batch 2's rows at 50 s and 52 s are late and dropped. A
    watermark computed from the rows reaching the join (10 s on the left) would keep them and pair them; the stage
    reads Spark's from the offset log and gives Spark's rows."""
    root = tmp_path / "in"
    jd.write(str(root / "l"), "b0.parquet", _rows("l", [(1, 10, 1, 1.0), (2, 100, 2, 1.0)]))
    jd.write(str(root / "r"), "b0.parquet", _rows("r", [(1, 12, 1, 1.0), (3, 100, 2, 1.0)]))
    jd.write(str(root / "l"), "b1.parquet", _rows("l", [(4, 30, 5, 1.0)]))
    jd.write(str(root / "r"), "b1.parquet", _rows("r", [(5, 30, 6, 1.0)]))
    jd.write(str(root / "l"), "b2.parquet", _rows("l", [(1, 50, 3, 1.0)]))
    jd.write(str(root / "r"), "b2.parquet", _rows("r", [(1, 52, 4, 1.0)]))

    def left():
        return jd.stream_source(spark, str(root), "l", "5 seconds").where(f"unix_micros(ts) < {jd.BASE_US + 90_000_000}")

    ours = pyspark_cq.interval_join(left(), jd.stream_source(spark, str(root), "r", "5 seconds"), ["k", "s"], "ts",
                                    "ts", f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds", suffixes=("_l", "_r"),
                                    name="sjf", state_persistence="stateless", state_dir=str(tmp_path / "state"))
    theirs = jd.spark_reference(left(), jd.stream_source(spark, str(root), "r", "5 seconds"), "inner")
    run_memory((ours, "stateless_filter_ours", str(tmp_path / "ck_ours")),
               (theirs, "stateless_filter_spark", str(tmp_path / "ck_spark")))
    ref = spark.table("stateless_filter_spark")
    assert sorted(r.lv for r in ref.collect()) == [1]   # batch 2's pair is late for Spark
    jd.assert_same_rows(spark.table("stateless_filter_ours"), ref)


def test_offset_log_watermarks(tmp_path):
    """The watermark of a batch and of the batch before, from Spark's offset log (as Spark 4.3 writes it), under a
    ``file:`` URI; a missing entry names the file."""
    from pyspark_cq.operators._common import offsets

    (tmp_path / "offsets").mkdir()
    for batch, wm in ((4, 95_000), (5, 120_500)):
        (tmp_path / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":' + str(wm) + ',"batchTimestampMs":1,"conf":{"a":"b"}}\n{"logOffset":0}\n')
    assert offsets.batch_watermarks(f"file:{tmp_path}", 5) == (120_500, 95_000)
    assert offsets.batch_watermarks(f"file://{tmp_path}", 5) == (120_500, 95_000)
    with pytest.raises(FileNotFoundError, match="offsets/3' of micro-batch 3 is missing"):
        offsets.batch_watermarks(str(tmp_path), 4)
    with pytest.raises(ValueError, match="no batchWatermarkMs"):
        offsets.parse_offset_log('v1\n{"logOffset":0}\n')


def test_a_task_told_to_compute_its_watermark_does_not_read_the_offset_log(tmp_path, monkeypatch):
    """A query group's tasks carry OWN_WATERMARK_PROPERTY: a member's stateless stage then computes the watermark of
    its own inputs (its query's alone), not the group's from the offset log."""
    import pyspark

    from pyspark_cq.operators._common import offsets

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":7,"batchTimestampMs":1}\n')
    props = {offsets.CHECKPOINT_PROPERTY: str(tmp_path)}
    task = type("Task", (), {"getLocalProperty": lambda self, k: props.get(k)})()
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: task))
    assert offsets.task_watermarks(0) == (7, 7)
    props[offsets.OWN_WATERMARK_PROPERTY] = "true"
    assert offsets.checkpoint_root() is None and offsets.task_watermarks(0) is None


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("first, then, checkpoint, message", [
    ("files", "stateless", "ck2", "holds the state of the stateful layout (state_persistence='files'"),
    ("stateless", "files", "ck2", "was written by state_persistence='stateless'"),
])
def test_state_of_the_other_form_is_refused(spark, tmp_path, first, then, checkpoint, message):
    """A state directory written by the other form, under a new checkpoint (on the same checkpoint Spark 4.3
    refuses either change itself: STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA from the stateful form
    to a stateless stage, STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY back). The stateful files layout
    would start every shard empty beside a stateless stage's files, a stateless stage would read none of the
    stateful layout's (its manifests are in Spark's state store): both are refused, naming the layout."""
    root, state = tmp_path / "in", str(tmp_path / "state")
    jd.write_streams(str(root), 2, null_keys=False, seed=5)
    first_rows, _ = run_per_batch(_join(spark, str(root), state, first), tmp_path / "ck", tmp_path / "out1")
    assert sum(df.count() for df in first_rows.values()) > 0
    jd.write_streams(str(tmp_path / "more"), 3, null_keys=False, seed=5)
    for side in ("l", "r"):   # the third batch's files (same seed: the first two are the same)
        shutil.copy2(tmp_path / "more" / side / "b002.parquet", root / side / "b002.parquet")
    with pytest.raises(Exception) as info:
        run_per_batch(_join(spark, str(root), state, then), tmp_path / checkpoint, tmp_path / "out2")
    assert message in str(info.value), str(info.value)[-3000:]
