"""``interval_join(..., state_persistence="changelog")`` against Spark's own stream-stream join (issue 39).

The same file streams as tests/test_join_stream.py (one file per micro-batch: out-of-order, late and null-key
rows, duplicates, a hot key, empty files, rows at the band's bounds). The changelog layout keeps each shard's
state resident in the Python worker and writes deltas with a snapshot every two batches here, so the runs go
through hits, misses, snapshots and replays; the output must equal Spark's multiset. The restart tests stop
the query (or fail a batch in the sink) and start it again on the same checkpoint, in the same session, so the
workers may still hold copies of the state: a copy of the committed version may be used, a copy written by a
batch Spark never committed must be refused (counted as a miss) -- a used stale copy would store the
re-run batch's rows twice and duplicate pairs.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.streaming import run_memory

import pyspark_cq
from pyspark_cq.vocabulary import metrics as M

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DELAY = "15 seconds"


def _source(spark, root, side):
    return jd.stream_source(spark, root, side, DELAY)


def _ours(spark, root, how, name, layout="changelog", **kw):
    if layout == "files":   # the state directory beside the input (one per test)
        kw.setdefault("state_dir", os.path.join(os.path.dirname(root), "state_" + name))
    return pyspark_cq.interval_join(_source(spark, root, "l"), _source(spark, root, "r"), ["k", "s"], "ts", "ts",
                                    f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds", how=how,
                                    suffixes=("_l", "_r"), name=name, state_persistence=layout,
                                    snapshot_every=2, **kw)


def _start_memory(df, table, checkpoint):
    """Start ``df`` into the memory table ``table`` (an oracle run side by side with the test's own runs)."""
    return (df.writeStream.format("memory").queryName(table).outputMode("append").trigger(availableNow=True)
            .option("checkpointLocation", checkpoint).start())


def _cache_counts(query, name):
    reports = [pyspark_cq.read_metrics(p, name) for p in query.recentProgress]
    reports = [r for r in reports if r]
    return sum(r[M.STATE_CACHE_HITS] for r in reports), sum(r[M.STATE_CACHE_MISSES] for r in reports)


@pytest.mark.parametrize("how", ["left", "full"])
def test_changelog_stream_equals_spark_join(spark, tmp_path, how):
    """Both resident layouts and Spark's join, side by side on the same files. Left (null keys) and full: the state's
    matched flags of one side and of both. The inner join runs under both resident layouts against Spark's join in
    test_changelog_batch_retried_after_a_sink_failure below (issue 41: 8 s of the suite)."""
    root = str(tmp_path / "in")
    jd.write_streams(root, 6, null_keys=how != "full", seed=21)
    names = {layout: f"cq_resident_{how}_{layout}" for layout in ("changelog", "files")}
    queries = run_memory(*[(_ours(spark, root, how, name, layout), f"res_ours_{how}_{layout}",
                            str(tmp_path / f"ck_ours_{layout}")) for layout, name in names.items()],
                         (jd.spark_reference(_source(spark, root, "l"), _source(spark, root, "r"), how),
                          f"res_spark_{how}", str(tmp_path / "ck_spark")))
    for q, (layout, name) in zip(queries, names.items()):
        jd.assert_same_rows(spark.table(f"res_ours_{how}_{layout}"), spark.table(f"res_spark_{how}"))
        hits, misses = _cache_counts(q, name)
        assert hits + misses > 0, layout   # every call on an existing state is one or the other


def _write_batch(rng, root, i):
    for side in ("l", "r"):
        t0 = jd.BASE_US + i * 10_000_000
        table = jd.side_table(rng, side, 50, t0, null_keys=False)
        # Times within [t0, t0 + 9 s]: with a 15 s delay no row is late under either schedule.
        offsets = pa.array(rng.integers(0, 9_000_000, table.num_rows), pa.int64())
        ts = pa.compute.add(pa.array([t0] * table.num_rows, pa.int64()), offsets)
        table = table.set_column(2, "ts", ts.cast(pa.timestamp("us", tz="UTC")))
        jd.write(os.path.join(root, side), f"b{i:03d}.parquet", table)


def _start_all(writers) -> list:
    """Start each writer (``availableNow``) side by side and wait for all: [(query, its error or None)] (every
    query runs to its end or its own failure: a failure does not stop the others)."""
    queries = [w.trigger(availableNow=True).start() for w in writers]
    out = []
    for q in queries:
        try:
            q.awaitTermination()
            out.append((q, None))
        except Exception as exc:  # noqa: BLE001 - StreamingQueryException
            out.append((q, exc))
    return out


# "files" with state_dir= alone: "auto" is the files layout here (under the warehouse), and state_dir= is
# restored by "full-files-changelog" and retried by test_changelog_batch_retried_after_a_sink_failure
LAYOUTS = ("auto", "full-files-changelog")


def test_changelog_restart_from_checkpoint_equals_spark(spark, tmp_path):
    """Stop after part of the input, restart the same query definition on the checkpoint, then once more
    with a new definition (another operator id: all misses, as after a worker died); the output equals
    Spark's. ``full-files-changelog``: each run in another layout (a checkpoint of today's full layout
    restored by the files layout, and its files read back by the changelog). ``auto``: the default, files
    under the session's warehouse and the query's id (the same across the restarts of one checkpoint).
    The two side by side over the same files, each with its own checkpoint and sink, beside one Spark reference
    (issue 41: one run of the micro-batches, not two)."""
    rng = np.random.default_rng(9)
    root = str(tmp_path / "in")
    layouts = {layout: layout.split("-") if "-" in layout else [layout] * 3 for layout in LAYOUTS}
    names = {layout: f"cq_resident_restart_{i}" for i, layout in enumerate(LAYOUTS)}

    def frame(layout, step):
        state_dir = str(tmp_path / f"state_{names[layout]}") if layout != "auto" else None
        return _ours(spark, root, "left", names[layout], layouts[layout][step], state_dir=state_dir)

    def writer(layout, df):
        return (df.writeStream.format("parquet").option("path", str(tmp_path / f"sink_{names[layout]}"))
                .option("checkpointLocation", str(tmp_path / f"ck_{names[layout]}")))

    def run(dfs):
        runs = _start_all(writer(layout, df) for layout, df in dfs.items())
        assert not [exc for _, exc in runs if exc is not None], runs
        return dict(zip(dfs, (q for q, _ in runs)))

    for i in range(3):
        _write_batch(rng, root, i)
    dfs = {layout: frame(layout, 0) for layout in LAYOUTS}
    first = run(dfs)
    for i in range(3, 6):
        _write_batch(rng, root, i)
    # the same definition for the first two runs when the layout stays: one operator id
    dfs = {layout: df if layouts[layout][1] == layouts[layout][0] else frame(layout, 1) for layout, df in dfs.items()}
    second = run(dfs)
    for layout, q in second.items():
        hits, misses = _cache_counts(q, names[layout])
        assert hits + misses > 0, layout
    for i in range(6, 8):
        _write_batch(rng, root, i)
    theirs = jd.spark_reference(_source(spark, root, "l"), _source(spark, root, "r"), "left")
    reference = _start_memory(theirs, "res_spark_restart", str(tmp_path / "ck_spark"))
    last = run({layout: frame(layout, 2) for layout in LAYOUTS})   # beside the reference
    reference.awaitTermination()
    for layout in LAYOUTS:
        jd.assert_same_rows(spark.read.parquet(str(tmp_path / f"sink_{names[layout]}")),
                            spark.table("res_spark_restart"))
    name = names["auto"]
    assert first["auto"].id == second["auto"].id == last["auto"].id
    warehouse = spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
    assert os.listdir(os.path.join(warehouse, "pyspark_cq_state", str(first["auto"].id), name))   # g<shard> dirs


def test_changelog_batch_retried_after_a_sink_failure(spark, tmp_path):
    """The sink fails batch 3 once, after the join's tasks wrote (and the workers cached) batch 3's state;
    the restart runs batch 3 again on batch 2's state. The workers' copies of batch 3's state carry another
    token and must be refused: the output equals Spark's, with no pair twice. Both resident layouts side by side
    over the same files, each with its own checkpoint, sink and failure, beside one Spark reference (issue 41)."""
    rng = np.random.default_rng(13)
    root = str(tmp_path / "in")
    for i in range(6):
        _write_batch(rng, root, i)
    layouts = ("changelog", "files")
    names = {layout: f"cq_resident_retry_{layout}" for layout in layouts}
    dfs = {layout: _ours(spark, root, "inner", names[layout], layout) for layout in layouts}

    def write_for(layout):
        flag, sink = tmp_path / f"failed_once_{layout}", str(tmp_path / f"sink_{layout}")

        def write(batch, batch_id):
            if batch_id == 3 and not flag.exists():
                batch.count()   # the join's tasks run (and cache their state) before the failure
                flag.write_text("1")
                raise RuntimeError("injected sink failure")
            batch.write.mode("overwrite").parquet(os.path.join(sink, f"batch={batch_id}"))
        return write

    def run():
        return _start_all(dfs[layout].writeStream.foreachBatch(write_for(layout))
                          .option("checkpointLocation", str(tmp_path / f"ck_{layout}")) for layout in layouts)

    theirs = jd.spark_reference(_source(spark, root, "l"), _source(spark, root, "r"), "inner")
    reference = _start_memory(theirs, "res_spark_retry", str(tmp_path / "ck_spark"))   # side by side
    for layout, (_, exc) in zip(layouts, run()):
        assert exc is not None and "injected sink failure" in str(exc), (layout, exc)
        assert (tmp_path / f"failed_once_{layout}").exists()
    for layout, (q, exc) in zip(layouts, run()):
        assert exc is None, (layout, exc)
        hits, misses = _cache_counts(q, names[layout])
        # batch 3 ran again on batch 2's state: a worker that ran batch 3 holds a copy of another token and must
        # rebuild (a miss); one that ran batch 2 and not batch 3 may still hold batch 2's copy (a hit, and right).
        # Which worker runs which shard is Spark's choice, so only the rows below can tell a stale copy was used.
        assert hits + misses > 0, layout
    reference.awaitTermination()
    for layout in layouts:
        jd.assert_same_rows(spark.read.parquet(str(tmp_path / f"sink_{layout}")).drop("batch"),
                            spark.table("res_spark_retry"))
