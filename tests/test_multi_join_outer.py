"""cq.multi_join with a left input (``how``): against Spark's chain of joins whose last join is a left outer
join (batch, and streaming with late rows and a restart from the checkpoint), and against the plain-Python
chain of ``tests/helpers/outer_join_reference.py``.

Input i has columns ``k<i>``, ``t<i>``, ``v<i>`` (``tests/test_multi_join.py``'s generator: skewed keys,
duplicates, null keys). Streams are parquet directories read one file per trigger.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.outer_join_reference import chain_join
from helpers.streaming import run_memory
from pyspark.sql import functions as F
from test_multi_join import _batch_dfs, _cols, _rows, _schema, _table

import pyspark_cq as cq

DELAY = "20 seconds"
#: (i, j, lower s, upper s); the left input's bound is to input 0, whose time keeps the watermark in Spark's
#: chain (its second join evicts its left state by it)
BOUNDS = {2: [(0, 1, -5, 10)], 3: [(0, 1, -5, 10), (0, 2, 0, 15)]}
#: the left input bound to input 1 (the Python reference only: Spark's chain evicts by t0's watermark)
CHAINED = [(0, 1, -5, 10), (1, 2, 0, 15)]


def _sql_bounds(bounds):
    return [(i, j, f"{lo} seconds", f"{up} seconds") for i, j, lo, up in bounds]


def _last_left(n):
    """``how`` of a chain of ``n`` inputs whose last input is left outer."""
    return ["inner"] * (n - 2) + ["left"]


def _reference(tables, hows, bounds, *, streaming=False):
    """chain_join of these rows: in a stream rows without a time are malformed (dropped)."""
    inputs = []
    for i, t in enumerate(tables):
        rows = []
        for r in t.to_pylist():
            ts = r[f"t{i}"]
            if streaming and ts is None:
                continue
            rows.append({"k": r[f"k{i}"], "t": None if ts is None else round(ts.timestamp() * 1e6),
                         "row": tuple(v.replace(tzinfo=None) if hasattr(v, "tzinfo") else v for v in r.values())})
        inputs.append(rows)
    us = [(i, j, lo * 1_000_000, up * 1_000_000) for i, j, lo, up in bounds]
    return chain_join(inputs, list(hows), us, widths=[3] * len(tables))


def _spark_chain(dfs, hows, bounds):
    """Spark's chain: join j has type ``hows[j-1]`` on ``k0 = k<j>`` and the bounds to earlier inputs (as SQL)."""
    out = dfs[0]
    for j in range(1, len(dfs)):
        conds = [f"k0 = k{j}"] + [f"t{b} BETWEEN t{a} + INTERVAL {lo} SECONDS AND t{a} + INTERVAL {up} SECONDS"
                                  for a, b, lo, up in bounds if max(a, b) == j]
        out = out.join(dfs[j], F.expr(" AND ".join(conds)), hows[j - 1])
        if out.isStreaming:  # one event-time column per stream: t0 keeps its watermark
            out = out.select(*[F.col(c).alias(c, metadata={}) if c.startswith("t") and c != "t0" else F.col(c)
                               for c in out.columns])
    return out


def _ours(dfs, hows, bounds, **kw):
    n = len(dfs)
    return cq.multi_join(dfs, [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)], _sql_bounds(bounds),
                         how=list(hows), **kw)


# --- pure parts ---------------------------------------------------------------------------------------


def test_reference_chain_pads_unmatched_and_drops_bounds_to_nulls():
    a = [{"k": 1, "t": 0, "row": ("a1",)}, {"k": 2, "t": 0, "row": ("a2",)}, {"k": None, "t": 0, "row": ("a3",)}]
    b = [{"k": 1, "t": 5, "row": ("b1",)}, {"k": 1, "t": 50, "row": ("b2",)}]
    c = [{"k": 1, "t": 7, "row": ("c1",)}, {"k": 2, "t": 1, "row": ("c2",)}]
    # a ⋈ b ⟕ c, c bound to b: (a1, b1, c1); a2 has no b; a1-b2 out of band
    assert chain_join([a, b, c], ["inner", "left"], [(0, 1, 0, 10), (1, 2, 0, 5)]) == [("a1", "b1", "c1")]
    # a ⟕ b: a2 and the null key a3 padded
    assert chain_join([a, b], ["left"], [(0, 1, 0, 10)]) == sorted(
        [("a1", "b1"), ("a2", None), ("a3", None)], key=repr)


def test_outer_last_moves_the_left_input_last_and_deadlines_follow_the_interval_join():
    from pyspark_cq.operators.join.worker import LEFT, RIGHT, evict_at_ms
    from pyspark_cq.operators.multi_join.worker import outer_deadlines, outer_last

    assert outer_last([(2, 1), (2, 0), (0, 1)], 2) == ((1, 2), (0, 2), (0, 1))
    assert outer_last([(2, 1), (2, 0), (0, 1)], None) == ((2, 1), (2, 0), (0, 1))
    t = {0: np.array([1_000_000, 5_000_500]), 1: np.array([3_000_000, 2_000_000])}
    # two bounds to the left input 2: (0, 2, 0, 15 s) and (2, 1, -4 s, 4 s); the earliest proof wins
    got = outer_deadlines(t, [(0, LEFT, 0, 15_000_000), (1, RIGHT, -4_000_000, 4_000_000)])
    want = np.minimum(evict_at_ms(t[0], 0, 15_000_000, LEFT), evict_at_ms(t[1], -4_000_000, 4_000_000, RIGHT))
    assert got.tolist() == want.tolist()


@pytest.mark.spark
def test_how_and_output_mode_are_checked(spark):
    a = spark.createDataFrame([(1, jd.BASE_US)], "k long, ta long").selectExpr("k", "timestamp_micros(ta) ta")
    b, c = a.withColumnRenamed("ta", "tb"), a.withColumnRenamed("ta", "tc")
    bounds = [(0, 1, "0 seconds", "1 minute"), (1, 2, "0 seconds", "1 minute")]
    for how, err, words in ((("left",), ValueError, "how must be a list of 2 join types"),
                            ("left", TypeError, "how must be a list of 2"),
                            (["inner", "outer"], ValueError, "how[1] (input 2) must be 'inner' or 'left'")):
        with pytest.raises(err, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], bounds, how=how)
    with pytest.raises(ValueError, match="output_mode must be 'append' or 'update'"):
        cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], bounds, output_mode="complete")
    with pytest.raises(ValueError, match="output_mode='update' with a left input"):
        cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], bounds, how=["inner", "left"], output_mode="update")
    out = cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], bounds, how=["inner", "LEFT_OUTER"])
    assert out.columns == ["k", "ta", "tb", "tc"]


# --- batch --------------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("n", [2, 3])
def test_batch_equals_spark_chain_with_a_left_input(spark, tmp_dir, n):
    rng = np.random.default_rng(40 + n)
    tables = [_table(rng, i, 40, jd.BASE_US) for i in range(n)]
    if n == 2:   # a row without a time: never matches, padded (Spark's batch join)
        tables[0] = pa.concat_tables([tables[0], tables[0].slice(0, 1).set_column(
            1, "t0", pa.nulls(1, pa.timestamp("us", tz="UTC")))])
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _rows(_spark_chain(dfs, _last_left(n), BOUNDS[n]).select(*_cols(n)))
    assert want == _reference(tables, _last_left(n), BOUNDS[n])
    assert any(r[-2] is None for r in want) and any(r[-2] is not None for r in want)
    ours = _ours(dfs, _last_left(n), BOUNDS[n])
    assert ours.columns == _cols(n)
    assert _rows(ours) == want


@pytest.mark.spark
def test_batch_left_input_bound_to_a_later_prefix_input_equals_the_reference(spark, tmp_dir):
    rng = np.random.default_rng(7)
    tables = [_table(rng, i, 40, jd.BASE_US) for i in range(3)]
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _reference(tables, _last_left(3), CHAINED)
    assert _rows(_spark_chain(dfs, _last_left(3), CHAINED).select(*_cols(3))) == want   # batch Spark runs any chain
    assert _rows(_ours(dfs, _last_left(3), CHAINED)) == want


@pytest.mark.spark
def test_batch_string_keys_a_funnel_with_or_without_a_purchase(spark):
    """Hashed (string) keys: matches and unmatched tuples are decided on the key values."""
    from datetime import datetime, timedelta

    b = datetime(2024, 1, 1)
    views = spark.createDataFrame([("a", b), ("a", b + timedelta(minutes=1)), ("b", b), (None, b), ("c.d", b)],
                                  "user string, vts timestamp")
    clicks = spark.createDataFrame([("a", b + timedelta(minutes=3)), ("b", b + timedelta(minutes=2)),
                                    ("c.d", b + timedelta(minutes=2)), (None, b)], "user string, cts timestamp")
    buys = spark.createDataFrame([("a", b + timedelta(minutes=30), 9.5), ("c.d", b + timedelta(hours=2), 1.0)],
                                 "user string, pts timestamp, amount double")
    bounds = [(0, 1, "0 seconds", "10 minutes"), (1, 2, "0 seconds", "1 hour")]
    out = cq.multi_join([views, clicks, buys], "user", ["vts", "cts", "pts"], bounds, how=["inner", "left"])
    v, c, p = views.alias("v"), clicks.alias("c"), buys.alias("p")
    want = (v.join(c, "user").where("cts BETWEEN vts AND vts + INTERVAL 10 MINUTES")
            .join(p, (F.col("v.user") == F.col("p.user")) & F.expr("pts BETWEEN cts AND cts + INTERVAL 1 HOUR"),
                  "left").select("v.user", "vts", "cts", "pts", "amount"))
    assert _rows(out) == _rows(want)
    assert sorted((r.user, r.amount) for r in out.collect()) == [("a", 9.5), ("a", 9.5), ("b", None), ("c.d", None)]


# --- streaming ----------------------------------------------------------------------------------------

BATCHES = 5
FLUSH_S = 3600   # a last batch an hour later: the watermark passes every band of the rows before it


def _write_stream(root, n, seed, *, late=True, flush=True, hot=0.3):
    """Micro-batch files per input; batch 3 of input 0 brings rows far behind the watermark (late), the last
    batch (``flush``) one row per input an hour later under a key no other row has. ``hot``: the share of each
    batch's rows under key 0 (the same random draws whatever it is).
    """
    rng = np.random.default_rng(seed)
    kept = [[] for _ in range(n)]
    for b in range(BATCHES + (1 if flush else 0)):
        for i in range(n):
            if b == BATCHES:
                t = _table(rng, i, 1, jd.BASE_US + FLUSH_S * 1_000_000).slice(0, 1)
                t = t.set_column(0, f"k{i}", pa.array([1000 + i], pa.int64()))
                jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)
                continue
            t = _table(rng, i, 30, jd.BASE_US + b * 10_000_000, hot=hot)
            kept[i].append(t)
            if late and (i, b) == (0, 3):
                t = pa.concat_tables([t, _table(rng, 0, 3, jd.BASE_US - 600_000_000).slice(0, 3)])
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)
    return [pa.concat_tables(ts) for ts in kept]


def _sources(spark, root, n):
    return [spark.readStream.schema(_schema(i)).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, f"in{i}")).withWatermark(f"t{i}", DELAY) for i in range(n)]


def _run(df, name, checkpoint, mode="append"):
    (q,) = run_memory((df, name, checkpoint), mode=mode)
    return q


@pytest.mark.spark
@pytest.mark.slow
# 3 inputs (a left last input after an inner step); 2 inputs run on streams against Spark's left outer join batch by
# batch below (issue 41: 6 s of the suite)
@pytest.mark.parametrize("n", [3])
def test_stream_equals_spark_chain_with_late_rows(spark, tmp_dir, n):
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=50 + n)
    name = f"mjo{n}"
    q, _ = run_memory((_ours(_sources(spark, root, n), _last_left(n), BOUNDS[n], name=name), f"ours_{name}",
                       str(tmp_dir / "ck_o")),
                      (_spark_chain(_sources(spark, root, n), _last_left(n), BOUNDS[n]).select(*_cols(n)),
                       f"spark_{name}", str(tmp_dir / "ck_s")))
    got = _rows(spark.table(f"ours_{name}"))
    assert got == _rows(spark.table(f"spark_{name}"))
    assert got == _reference(tables, _last_left(n), BOUNDS[n], streaming=True)
    padded = [r for r in got if r[-2] is None]
    assert padded and len(padded) < len(got)
    reports = [r for r in (cq.read_metrics(p, name) for p in q.recentProgress) if r]
    assert sum(r["output_rows"] for r in reports) == len(got)
    assert sum(r["padded_rows"] for r in reports) == len(padded)
    assert sum(r["late_rows_0"] for r in reports) == 3
    assert reports[-1]["unmatched_rows"] >= 0 and max(r["unmatched_rows"] for r in reports) > 0


@pytest.mark.spark
@pytest.mark.slow
def test_stream_two_inputs_equal_spark_left_outer_join_batch_by_batch(spark, tmp_dir):
    """Without a flush: the padded rows due by the last watermark are Spark's exactly (one join, same rule)."""
    n = 2
    root = str(tmp_dir / "in")
    _write_stream(root, n, seed=61, flush=False)
    run_memory((_ours(_sources(spark, root, n), _last_left(n), BOUNDS[n], name="mjo2b"), "ours_mjo2b",
                str(tmp_dir / "ck_o")),
               (_spark_chain(_sources(spark, root, n), _last_left(n), BOUNDS[n]).select(*_cols(n)), "spark_mjo2b",
                str(tmp_dir / "ck_s")))
    got = _rows(spark.table("ours_mjo2b"))
    assert got == _rows(spark.table("spark_mjo2b"))
    assert any(r[-2] is None for r in got)


@pytest.mark.spark
@pytest.mark.slow
def test_stream_restart_from_checkpoint_keeps_the_unmatched_tuples(spark, tmp_dir):
    """Three batches, stop, the rest (with the flush) from the checkpoint: the rows of an uninterrupted run,
    on the left input bound to input 1 (the Python reference).
    """
    n = 3
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=71)
    live = str(tmp_dir / "live")
    for i in range(n):
        os.makedirs(os.path.join(live, f"in{i}"))
    names = sorted(os.listdir(os.path.join(root, "in0")))
    ck, reports = str(tmp_dir / "ck"), []
    for step, files in enumerate((names[:3], names[3:])):
        for f in files:
            for i in range(n):
                shutil.copy2(os.path.join(root, f"in{i}", f), os.path.join(live, f"in{i}", f))
        out = _ours(_sources(spark, live, n), _last_left(n), CHAINED, name="mjor")
        q = (out.writeStream.format("parquet").option("path", str(tmp_dir / "out")).trigger(availableNow=True)
             .option("checkpointLocation", ck).start())
        q.awaitTermination()
        reports += [r for r in (cq.read_metrics(p, "mjor") for p in q.recentProgress) if r]
        if step == 0:   # tuples still waiting for a match when the query stops
            assert reports[-1]["unmatched_rows"] > 0
    got = _rows(spark.read.parquet(str(tmp_dir / "out")).select(*_cols(n)))
    assert got == _reference(tables, _last_left(n), CHAINED, streaming=True)
    assert any(r[-2] is None for r in got)
    assert sum(r["padded_rows"] for r in reports) == sum(1 for r in got if r[-2] is None)
