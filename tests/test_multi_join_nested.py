"""cq.multi_join with a left input before the last (``how=["left", "left"]``, ``["left", "inner"]``, …): against
Spark's chain of joins with these types (batch; streaming where Spark's chain can evict: every bound to input 0)
and the plain-Python chain of ``tests/helpers/outer_join_reference.py`` (every shape), with late rows and a restart
from the checkpoint. The helpers are ``tests/test_multi_join_outer.py``'s (input i: ``k<i>``, ``t<i>``, ``v<i>``).
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from helpers import join_data as jd
from helpers.streaming import run_memory
from pyspark.sql import functions as F
from test_multi_join import _batch_dfs, _cols, _rows, _table
from test_multi_join_outer import _ours, _reference, _run, _sources, _spark_chain, _write_stream

import pyspark_cq as cq
from pyspark_cq.operators.multi_join.nested import nested_orders, retention

#: every later input bound to input 0 (the shape Spark's streaming chain runs: its joins evict by t0)
TO_FIRST = {3: [(0, 1, -5, 10), (0, 2, 0, 15)], 4: [(0, 1, -5, 10), (0, 2, 0, 15), (0, 3, -3, 8)]}
#: each input bound to the one before: impressions ⟕ clicks ⟕ purchases, a purchase within 15 s of the click
CHAINED = {3: [(0, 1, -5, 10), (1, 2, 0, 15)], 4: [(0, 1, -5, 10), (1, 2, 0, 15), (1, 3, -3, 8)]}


def test_nested_orders_bind_every_left_inputs_prefix_before_it():
    hows = ("first", "left", "inner", "left")
    got = nested_orders([(3, 2, 1), (3, 2, 0), (3, 1, 0), (2, 1, 0)], hows)
    # segments {0}, {1, 2}, {3}; the left input first in its segment, the others in the plan's order
    assert got == ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2))
    for i, order in enumerate(got):
        for k, j in enumerate(order):
            if hows[j] == "left" and j > i:
                assert set(order[:k]) | {i} == set(range(j))


def test_retention_covers_the_reach_of_tuples_with_nulls():
    s = 1_000_000
    # a ⟕ b ⟕ c, c bound to b: (a, null, c) cannot exist, so the reach is the full closure's (a: 15 s to c, b: 5 s,
    # c: 0); the widest bound (10 s) and 2 ms are added for the entries' deadlines
    r = retention(3, [(0, 1, 0, 10 * s), (1, 2, 0, 5 * s)], ("first", "left", "left"))
    assert r == (25 * s + 2000, 15 * s + 2000, 10 * s + 2000)
    # c bound to a as well, loosely: (a, null, c) meets only that bound, whose reach (a: 60 s) is the larger
    r = retention(3, [(0, 1, 0, 10 * s), (1, 2, 0, 5 * s), (0, 2, -60 * s, 60 * s)], ("first", "left", "left"))
    assert r[0] == 60 * s + 60 * s + 2000


@pytest.mark.spark
def test_nested_how_needs_a_bound_to_an_earlier_input_per_input(spark):
    a = spark.createDataFrame([(1, jd.BASE_US)], "k long, ta long").selectExpr("k", "timestamp_micros(ta) ta")
    b, c = a.withColumnRenamed("ta", "tb"), a.withColumnRenamed("ta", "tc")
    loose = [(0, 2, "0 seconds", "1 minute"), (1, 2, "0 seconds", "1 minute")]   # input 1 only bound to 2
    with pytest.raises(ValueError, match=r"inputs \[1\] have none"):
        cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], loose, how=["left", "left"])
    cq.multi_join([a, b, c], "k", ["ta", "tb", "tc"], loose, how=["inner", "left"])   # the last alone: as before


# --- batch --------------------------------------------------------------------------------------------

SHAPES = [(("left", "left"), TO_FIRST[3]), (("left", "left"), CHAINED[3]), (("left", "inner"), TO_FIRST[3]),
          (("left", "inner"), CHAINED[3]), (("left", "inner", "left"), TO_FIRST[4]),
          (("left", "left", "left"), CHAINED[4]), (("inner", "left", "inner"), CHAINED[4])]


@pytest.mark.spark
@pytest.mark.parametrize("hows,bounds", SHAPES, ids=lambda v: "-".join(v) if isinstance(v[0], str) else None)
def test_batch_nested_left_inputs_equal_spark_chain_and_the_reference(spark, tmp_dir, hows, bounds):
    n = len(hows) + 1
    rng = np.random.default_rng(90 + n + len(bounds) + hows.count("left"))
    tables = [_table(rng, i, 30, jd.BASE_US) for i in range(n)]
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _reference(tables, hows, bounds)
    assert _rows(_spark_chain(dfs, hows, bounds).select(*_cols(n))) == want   # batch Spark runs any chain
    padded = any(r[3 * hows.index("left") + 3 + 1] is None for r in want)   # tuples padded at a left input
    # a ⟕ b ⋈ c, c bound to b: c never matches (a, null) (a comparison with NULL), so the inner join drops it
    assert padded == ((hows, bounds) != (("left", "inner"), CHAINED[3]))
    got = _ours(dfs, hows, bounds)
    assert got.columns == _cols(n)
    assert _rows(got) == want


# --- streaming ----------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_stream_left_left_equals_spark_chain_with_late_rows(spark, tmp_dir):
    """impressions ⟕ clicks ⟕ purchases bound to the impression: Spark's chain runs it in a stream."""
    hows, bounds, n = ("left", "left"), TO_FIRST[3], 3
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=81)
    q, _ = run_memory((_ours(_sources(spark, root, n), hows, bounds, name="mjn"), "ours_mjn", str(tmp_dir / "ck_o")),
                      (_spark_chain(_sources(spark, root, n), hows, bounds).select(*_cols(n)), "spark_mjn",
                       str(tmp_dir / "ck_s")))
    got = _rows(spark.table("ours_mjn"))
    assert got == _reference(tables, hows, bounds, streaming=True)
    assert got == _rows(spark.table("spark_mjn"))
    padded = [r for r in got if None in (r[4], r[7])]
    assert any(r[4] is None and r[7] is not None for r in got)    # (impression, null, purchase)
    reports = [r for r in (cq.read_metrics(p, "mjn") for p in q.recentProgress) if r]
    assert sum(r["output_rows"] for r in reports) == len(got)
    assert sum(r["padded_rows"] for r in reports) == len(padded)
    assert sum(r["late_rows_0"] for r in reports) == 3
    assert max(r["unmatched_rows"] for r in reports) > 0


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("hows,bounds", [(("left", "inner"), TO_FIRST[3]), (("left", "left", "left"), CHAINED[4])],
                         ids=["left-inner", "left-left-left-chained"])
def test_stream_nested_left_inputs_equal_the_reference_with_late_rows(spark, tmp_dir, hows, bounds):
    n = len(hows) + 1
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=83 + n)
    _run(_ours(_sources(spark, root, n), hows, bounds, name="mjn2"), "ours_mjn2", str(tmp_dir / "ck"))
    got = _rows(spark.table("ours_mjn2"))
    assert got == _reference(tables, hows, bounds, streaming=True)
    assert any(r[4] is None for r in got)


@pytest.mark.spark
@pytest.mark.slow
def test_stream_nested_restart_from_checkpoint_keeps_the_entries(spark, tmp_dir):
    """impressions ⟕ clicks ⟕ purchases, a purchase bound to its click: three batches, stop, the rest from the
    checkpoint; the rows of the Python chain.
    """
    hows, bounds, n = ("left", "left"), CHAINED[3], 3
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=87)
    live = str(tmp_dir / "live")
    for i in range(n):
        os.makedirs(os.path.join(live, f"in{i}"))
    names = sorted(os.listdir(os.path.join(root, "in0")))
    ck, reports = str(tmp_dir / "ck"), []
    for step, files in enumerate((names[:3], names[3:])):
        for f in files:
            for i in range(n):
                shutil.copy2(os.path.join(root, f"in{i}", f), os.path.join(live, f"in{i}", f))
        q = (_ours(_sources(spark, live, n), hows, bounds, name="mjnr").writeStream.format("parquet")
             .option("path", str(tmp_dir / "out")).trigger(availableNow=True).option("checkpointLocation", ck).start())
        q.awaitTermination()
        reports += [r for r in (cq.read_metrics(p, "mjnr") for p in q.recentProgress) if r]
        if step == 0:   # entries waiting across the stop (the last report may be a shard-less no-data batch)
            assert max(r["unmatched_rows"] for r in reports) > 0
    got = _rows(spark.read.parquet(str(tmp_dir / "out")).select(*_cols(n)))
    assert got == _reference(tables, hows, bounds, streaming=True)
    assert any(r[4] is None for r in got) and any(r[4] is not None and r[7] is None for r in got)
    assert sum(r["padded_rows"] for r in reports) == sum(1 for r in got if None in (r[4], r[7]))


@pytest.mark.spark
def test_batch_nested_string_keys_equal_spark_chain(spark, tmp_dir):
    """Hashed (string) keys: prefixes, entries and their extensions are decided on the key values."""
    n, hows = 3, ("left", "left")
    rng = np.random.default_rng(95)
    tables = [_table(rng, i, 30, jd.BASE_US) for i in range(n)]
    dfs = [df.withColumn(f"k{i}", F.concat(F.lit("u."), F.col(f"k{i}").cast("string")))
           for i, df in enumerate(_batch_dfs(spark, tmp_dir, tables))]
    for bounds in (TO_FIRST[3], CHAINED[3]):
        want = _rows(_spark_chain(dfs, hows, bounds).select(*_cols(n)))
        assert any(r[4] is None for r in want)
        assert _rows(_ours(dfs, hows, bounds)) == want
