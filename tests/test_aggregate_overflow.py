"""Long overflow in sliding_aggregate follows the session's spark.sql.ansi.enabled, as Spark's own
groupBy(window(...)).agg(sum, avg) does (issue 16): with ANSI a window whose long sum leaves the long
range raises ARITHMETIC_OVERFLOW naming the operator, the group and the window; without it the sum wraps
around exactly as Spark's. avg of longs never wraps (Spark sums it in doubles). Batch and streaming,
both modes, against Spark on the same data."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import aggregate_pipeline as P
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

import pyspark_cq as cq
from pyspark_cq.operators.aggregate import spec as S
from pyspark_cq.operators.aggregate.shard import run_shard

B = 2**62
T0 = dt.datetime(2024, 1, 1)
# values of group 1 at seconds 1, 6, 7 (three 5-second slices); group 2 never overflows
CASES = {
    "3*2^62": [B, B, B],                    # every window with two or three rows overflows
    "max+1": [2**63 - 1, 1, 0],             # [0, 10) overflows upwards
    "min-1": [-(2**63), -1, 0],             # [0, 10) overflows downwards
    "fits": [B, -B, B],                     # no window sum leaves the long range
}
OVERFLOWS = {"3*2^62", "max+1", "min-1"}


@contextlib.contextmanager
def ansi(spark, value: bool):
    """Set spark.sql.ansi.enabled for the block and restore the previous value."""
    key = "spark.sql.ansi.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, str(value).lower())
    try:
        yield
    finally:
        spark.conf.set(key, before)


def rows_of(values):
    rows = [(1, T0 + dt.timedelta(seconds=s), v) for s, v in zip((1, 6, 7), values)]
    return rows + [(2, T0 + dt.timedelta(seconds=s), s) for s in (2, 8)]


def spark_windows(df, aggs):
    exprs = [getattr(F, a)("v").alias(f"{a}_v") for a in aggs]
    return (df.groupBy(F.window("ts", "10 seconds", "5 seconds"), "k").agg(*exprs)
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "k",
                    *[f"{a}_v" for a in aggs]))


def collected(df):
    return sorted(tuple(r) for r in df.collect())


def outcome(df):
    """The sorted rows, or the error text."""
    try:
        return collected(df)
    except Exception as exc:  # noqa: BLE001 - Spark wraps worker errors in several exception types
        return exc


@pytest.mark.spark
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("on", [True, False], ids=["ansi", "legacy"])
def test_batch_sum_and_avg_follow_spark(spark, case, on):
    with ansi(spark, on):
        df = spark.createDataFrame(rows_of(CASES[case]), "k long, ts timestamp, v long").coalesce(1)
        ours = outcome(cq.sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k",
                                            aggs={"v": ["sum", "avg"]}, name="overflow_op"))
        theirs = outcome(spark_windows(df, ["sum", "avg"]))
    if on and case in OVERFLOWS:
        assert isinstance(theirs, Exception) and "ARITHMETIC_OVERFLOW" in str(theirs)
        assert isinstance(ours, Exception), ours
        text = str(ours)
        assert "ARITHMETIC_OVERFLOW" in text and "'overflow_op'" in text and "{'k': 1}" in text
        assert "window_start=" in text and "window_end=" in text
    else:
        assert not isinstance(theirs, Exception), theirs
        assert ours == theirs


@pytest.mark.spark
@pytest.mark.parametrize("on", [True, False], ids=["ansi", "legacy"])
def test_batch_avg_alone_never_raises(spark, on):
    """Spark's avg of longs sums in doubles: no overflow, no error, in either mode."""
    with ansi(spark, on):
        df = spark.createDataFrame(rows_of(CASES["3*2^62"]), "k long, ts timestamp, v long")
        ours = collected(cq.sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k", aggs={"v": ["avg"]}))
        theirs = collected(spark_windows(df, ["avg"]))
    assert ours == theirs
    assert max(r[3] for r in ours) == pytest.approx(float(B))


def write_batches(directory, batches):
    """One parquet file per micro-batch of (k, seconds, v) rows."""
    os.makedirs(directory)
    for i, batch in enumerate(batches):
        table = pa.table({"k": pa.array([r[0] for r in batch], pa.int64()),
                          "ts": pa.array([T0 + dt.timedelta(seconds=r[1]) for r in batch],
                                         pa.timestamp("us")).cast(pa.timestamp("us", "UTC")),
                          "v": pa.array([r[2] for r in batch], pa.int64())})
        path = os.path.join(directory, f"b{i:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))


def run_stream(df, checkpoint, mode):
    name = "q_" + uuid.uuid4().hex[:12]
    query = (df.writeStream.format("memory").queryName(name).outputMode(mode)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - StreamingQueryException
        return exc
    return collected(df.sparkSession.table(name))


# Micro-batches (k, second, v): group 1 reaches 2^63 in [0, 10) at the second batch.
STREAM = [[(1, 1, B), (2, 2, 5)], [(1, 6, B)], [(1, 7, -B), (2, 8, 1)], [(2, 40, 0)]]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["append", "update"])
@pytest.mark.parametrize("on", [True, False], ids=["ansi", "legacy"])
def test_streaming_follows_spark(spark, tmp_path, on, mode):
    directory = str(tmp_path / "in")
    write_batches(directory, STREAM)

    def source():
        return (spark.readStream.schema("k long, ts timestamp, v long").option("maxFilesPerTrigger", 1)
                .parquet(directory).withWatermark("ts", "1 second"))

    with ansi(spark, on):
        ours = run_stream(cq.sliding_aggregate(source(), "ts", "10 seconds", "5 seconds", by="k",
                                               aggs={"v": ["sum", "avg"]}, output_mode=mode, name="overflow_op"),
                          tmp_path / "ck1", mode)
        theirs = run_stream(spark_windows(source(), ["sum", "avg"]), tmp_path / "ck2", mode)
    if on and mode == "update":
        # Both see [0, 10) at 2^63 after the second batch.
        assert isinstance(theirs, Exception) and "ARITHMETIC_OVERFLOW" in str(theirs)
        assert isinstance(ours, Exception), ours
        assert "ARITHMETIC_OVERFLOW" in str(ours) and "'overflow_op'" in str(ours) and "{'k': 1}" in str(ours)
    elif on:
        # Spark's state adds the batches' partial sums with addExact, so it raises at the second batch;
        # the operator decides by the exact value of the window, 2^62 once the window closes.
        assert isinstance(theirs, Exception) and "ARITHMETIC_OVERFLOW" in str(theirs)
        assert not isinstance(ours, Exception), ours
        assert (T0, T0 + dt.timedelta(seconds=10), 1, B, B / 3) in ours
    else:
        assert not isinstance(theirs, Exception), theirs
        assert ours == theirs
        assert (T0, T0 + dt.timedelta(seconds=10), 1, -(2**63), 2 * B / 2) in ours or mode == "append"


@pytest.mark.slow
@pytest.mark.spark
def test_streaming_overflow_at_close_raises_like_spark(spark, tmp_path):
    """Append mode with a window whose final sum overflows: both raise under ANSI."""
    directory = str(tmp_path / "in")
    write_batches(directory, [[(1, 1, B)], [(1, 6, B)], [(1, 7, B)], [(1, 40, 0)]])

    def source():
        return (spark.readStream.schema("k long, ts timestamp, v long").option("maxFilesPerTrigger", 1)
                .parquet(directory).withWatermark("ts", "1 second"))

    with ansi(spark, True):
        ours = run_stream(cq.sliding_aggregate(source(), "ts", "10 seconds", "5 seconds", by="k",
                                               aggs={"v": ["sum"]}, name="overflow_op"), tmp_path / "ck1", "append")
        theirs = run_stream(spark_windows(source(), ["sum"]), tmp_path / "ck2", "append")
    assert isinstance(theirs, Exception) and "ARITHMETIC_OVERFLOW" in str(theirs)
    assert isinstance(ours, Exception) and "ARITHMETIC_OVERFLOW" in str(ours) and "'overflow_op'" in str(ours)


# ---- the kernel alone (no Spark): exact sums across slices, merges and subtract-on-evict --------------

big = st.one_of(st.sampled_from([2**63 - 1, -(2**63), B, -B, 2**32, -(2**32) - 1, 1, -1, 0]),
                st.integers(-(2**63), 2**63 - 1))
big_rows = st.lists(st.fixed_dictionaries({"t": st.integers(0, 60), "k": st.integers(0, 2), "v": big,
                                           "x": st.just(0.0)}), min_size=1, max_size=40)


def exact_windows(rows, window, slide):
    """{(from, to, key): (exact sum, count)} of every window with a row."""
    out = {}
    for r in rows:
        k = r["t"] // slide
        while k * slide + window > r["t"]:
            s, n = out.get((k * slide, k * slide + window, r["k"]), (0, 0))
            out[(k * slide, k * slide + window, r["k"])] = (s + r["v"], n + 1)
            k -= 1
    return out


def wrap(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


@settings(max_examples=60, deadline=None)
@given(rows=big_rows, cut=st.integers(1, 39))
def test_kernel_wraps_like_spark_legacy_and_avg_is_exact(rows, cut):
    plan = _plan(12, 4, ansi=False)
    outputs, _ = P.run_stream(plan, [rows[:cut], rows[cut:]], [None, None, None])
    got = {}
    for emitted in outputs:
        got.update(emitted)
    want = {key: (wrap(s), s / n) for key, (s, n) in exact_windows(rows, 12, 4).items()}
    assert set(got) == set(want)
    for key, (s, a) in want.items():
        assert got[key][0] == s and got[key][1] == pytest.approx(a, rel=1e-15), (key, got[key], want[key])


@settings(max_examples=60, deadline=None)
@given(rows=big_rows)
def test_kernel_raises_exactly_when_a_window_sum_leaves_the_long_range(rows):
    plan = _plan(12, 4, ansi=True)
    want = exact_windows(rows, 12, 4)
    overflow = any(not -(2**63) <= s < 2**63 for s, _ in want.values())
    try:
        got = P.rows_of(run_shard(plan, P.slice_rows(plan, rows), None, None).output, plan)
    except OverflowError as exc:
        assert overflow and "ARITHMETIC_OVERFLOW" in str(exc)
        return
    assert not overflow
    assert {key: v[0] for key, v in got.items()} == {key: s for key, (s, _) in want.items()}


def _plan(window, slide, ansi):
    plan = P.make_plan(window, slide, aggs={"v": ["sum", "avg"]}, shards=1, mode="update")
    spec = S.parse_aggs(P._Schema(P.SCHEMA), {"v": ["sum", "avg"]}, ["k"], ansi)
    return dataclasses.replace(plan, spec=spec, ansi=ansi, name="kernel_op",
                               out_names=plan.out_names[:3] + tuple(o.name for o in spec.outputs))
