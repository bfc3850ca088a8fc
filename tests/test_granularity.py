"""Γ (PIPES §2.4.3): the compiled kernel against a plain-Python reference, and the Spark operator."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq._native import load

kernel = load("_granularity")
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def reference(start: int, end: int, g: int):
    """Plain-Python Γ with unbounded ints: (start', end', status)."""
    if end < start:
        return start, end, kernel.STATUS_MALFORMED
    s = -((-start) // g) * g  # ceil
    e = (end // g) * g        # floor
    if s >= e:                 # also covers roundings beyond int64, which only empty intervals reach
        return start, end, kernel.STATUS_EMPTY
    assert I64_MIN <= s < e <= I64_MAX
    return s, e, kernel.STATUS_OK


boundary = st.sampled_from([I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX])
timestamps = st.one_of(boundary, st.integers(I64_MIN, I64_MAX), st.integers(-10**7, 10**7))
granularities = st.one_of(st.integers(1, 10), st.integers(1, 10**12), st.integers(1, I64_MAX),
                          st.sampled_from([1, 2, 3, 1000, 1_000_000, 2**62, I64_MAX]))


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(timestamps, timestamps), max_size=40), g=granularities)
def test_kernel_matches_reference(pairs, g):
    start = np.array([p[0] for p in pairs], dtype=np.int64)
    end = np.array([p[1] for p in pairs], dtype=np.int64)
    rs, re, status = kernel.round_intervals(start, end, g, on_invalid="flag")
    for i, (s, e) in enumerate(pairs):
        assert (int(rs[i]), int(re[i]), int(status[i])) == reference(s, e, g), (s, e, g)


@settings(max_examples=200, deadline=None)
@given(s=timestamps, length=st.integers(0, 10**9), g=granularities)
def test_kernel_valid_intervals(s, length, g):
    e = min(s + length, I64_MAX)
    rs, re, status = kernel.round_intervals([s], [e], g)
    assert (int(rs[0]), int(re[0]), int(status[0])) == reference(s, e, g)
    if status[0] == kernel.STATUS_OK:
        assert rs[0] % g == 0 and re[0] % g == 0 and s <= rs[0] < re[0] <= e


def test_kernel_examples():
    rs, re, st_ = kernel.round_intervals([-5, 0, 3, 9, -7], [7, 10, 5, 9, -1], 3)
    assert rs.tolist()[:2] == [-3, 0] and re.tolist()[:2] == [6, 9]
    assert st_.tolist() == [0, 0, 1, 1, 0]
    assert (rs[4], re[4]) == (-6, -3)


@pytest.mark.parametrize("g", [0, -1, -(10**12)])
def test_kernel_rejects_non_positive_granularity(g):
    with pytest.raises(ValueError, match="granularity"):
        kernel.round_intervals([0], [1], g)


@pytest.mark.parametrize("g", [1.5, "1", None, True])
def test_kernel_rejects_non_integer_granularity(g):
    with pytest.raises(TypeError, match="granularity"):
        kernel.round_intervals([0], [1], g)


def test_kernel_end_before_start_names_end():
    with pytest.raises(ValueError, match=r"end must be >= start: row 1"):
        kernel.round_intervals([0, 5], [1, 4], 1)


def test_kernel_null_bounds_and_lengths():
    rs, re, status = kernel.round_intervals([0, 0], [5, 5], 2, valid=[True, False], on_invalid="flag")
    assert status.tolist() == [0, 2]
    with pytest.raises(ValueError, match="null"):
        kernel.round_intervals([0, 0], [5, 5], 2, valid=[True, False])
    with pytest.raises(ValueError, match="same length"):
        kernel.round_intervals([0, 1], [5], 2)
    with pytest.raises(ValueError, match="on_invalid"):
        kernel.round_intervals([0], [5], 2, on_invalid="drop")


# ---- the Spark operator -------------------------------------------------------------------------

EPOCH = dt.datetime(1970, 1, 1)


def _micros(t: dt.datetime) -> int:
    return (t - EPOCH) // dt.timedelta(microseconds=1)


def _rows(n, seed):
    rng = np.random.default_rng(seed)
    base = dt.datetime(2024, 5, 1, 12, 0, 0)
    rows = []
    for i in range(n):
        s = base + dt.timedelta(microseconds=int(rng.integers(-5_000_000, 5_000_000)))
        e = s + dt.timedelta(microseconds=int(rng.integers(0, 4_000_000)))
        rows.append((i, s, e))
    rows.append((n, None, base))                                   # null bound: malformed
    rows.append((n + 1, base, base - dt.timedelta(seconds=1)))     # end < start: malformed
    return rows


def _expected(rows, g):
    out = []
    for i, s, e in rows:
        if s is None or e is None:
            continue
        rs, re, status = reference(_micros(s), _micros(e), g)
        if status == kernel.STATUS_OK:
            out.append((i, EPOCH + dt.timedelta(microseconds=rs), EPOCH + dt.timedelta(microseconds=re)))
    return sorted(out)


@pytest.mark.spark
def test_operator_batch_timestamps(spark):
    import pyspark_cq as cq

    rows = _rows(300, 1)
    df = spark.createDataFrame(rows, "id long, s timestamp, e timestamp")
    got = sorted(tuple(r) for r in cq.granularity(df, "s", "e", "1 second").collect())
    assert got == _expected(rows, 1_000_000)
    got = sorted(tuple(r) for r in cq.granularity(df, "s", "e", dt.timedelta(milliseconds=250)).collect())
    assert got == _expected(rows, 250_000)


@pytest.mark.spark
def test_operator_batch_integers(spark):
    import pyspark_cq as cq

    pairs = [(0, -7, -1), (1, 3, 5), (2, 0, 10), (3, 9, 9), (4, 5, 4), (5, None, 4)]
    df = spark.createDataFrame(pairs, "id int, s long, e long")
    got = sorted(tuple(r) for r in cq.granularity(df, "s", "e", 3).collect())
    assert got == [(0, -6, -3), (2, 0, 9)]


@pytest.mark.spark
@pytest.mark.slow
def test_operator_streaming_counts_dropped_and_malformed(spark, tmp_dir):
    import pyspark_cq as cq

    rows = _rows(400, 2)
    schema = "id long, s timestamp, e timestamp"
    for k in range(3):  # three files -> three micro-batches
        spark.createDataFrame(rows[k::3], schema).coalesce(1).write.parquet(str(tmp_dir / "in" / f"part{k}"))
    stream = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
              .option("recursiveFileLookup", "true").parquet(str(tmp_dir / "in")))
    query = (cq.granularity(stream, "s", "e", "1 second", name="g_test").writeStream.format("memory")
             .queryName("gamma_stream").option("checkpointLocation", str(tmp_dir / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    got = sorted(tuple(r) for r in spark.table("gamma_stream").collect())
    assert got == _expected(rows, 1_000_000)
    reports = [cq.read_metrics(p, "g_test") for p in query.recentProgress if p.numInputRows]
    assert len(reports) == 3
    expected_empty = sum(1 for i, s, e in rows if s is not None and e is not None and e >= s
                         and reference(_micros(s), _micros(e), 1_000_000)[2] == kernel.STATUS_EMPTY)
    assert sum(r["dropped_empty"] for r in reports) == expected_empty
    assert sum(r["malformed_rows"] for r in reports) == 2


@pytest.mark.spark
def test_operator_bad_arguments(spark):
    import pyspark_cq as cq

    df = spark.createDataFrame([(1, dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2), "x")],
                               "id long, s timestamp, e timestamp, txt string")
    with pytest.raises(ValueError, match="start: unknown column"):
        cq.granularity(df, "nope", "e", "1 second")
    with pytest.raises(TypeError, match="end must be a timestamp column"):
        cq.granularity(df, "s", "txt", "1 second")
    with pytest.raises(ValueError, match="granularity must be a positive duration"):
        cq.granularity(df, "s", "e", "0 seconds")
    with pytest.raises(ValueError, match="granularity must be a positive duration"):
        cq.granularity(df, "s", "e", "-1 second")
    with pytest.raises(TypeError, match="granularity must be a duration"):
        cq.granularity(df, "s", "e", 5)
    with pytest.raises(TypeError, match="same type"):
        cq.granularity(df, "s", "id", "1 second")
    with pytest.raises(TypeError, match="df must be a pyspark.sql.DataFrame"):
        cq.granularity([1, 2], "s", "e", "1 second")
