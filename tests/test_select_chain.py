"""select_chain: the result never depends on the order; the order comes from the control table per batch.

Oracles: numpy masks (the conjunction of the predicates) and Spark's own ``filter`` with the same conditions.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.files import write_in_order
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import functions as F

import pyspark_cq as cq
from pyspark_cq.control import ControlTable, chain_plan_id, parse_chain_plan
from pyspark_cq.operators._common.shed import row_uniform
from pyspark_cq.operators.select_chain import sample_ratios
from pyspark_cq.operators.select_chain.worker import _Chain, _shed

# The predicates below run in Spark's Python workers, which cannot import this test module: ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _even(b):
    return pc.equal(pc.bit_wise_and(b["x"], 1), 0)


def _small(b):
    return pc.less(b["x"], 50)


def _odd_y(b):
    return np.asarray(b["y"]) % 3 != 0     # numpy result, also accepted


PREDICATES = {"even": _even, "small": _small, "y3": _odd_y}


def _oracle(x, y):
    return (x % 2 == 0) & (x < 50) & (y % 3 != 0)


def _chain(order=None):
    names = tuple(PREDICATES)
    schema = pa.schema([("x", pa.int64()), ("y", pa.int64())])
    return _Chain("select_chain 't'", names, dict(PREDICATES), ("x", "y"), None, schema, ()), order or names


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-100, 100), st.integers(-100, 100)), max_size=60),
       st.permutations(list(PREDICATES)))
def test_result_and_counts_do_not_depend_on_the_order(rows, order):
    x = np.array([r[0] for r in rows], dtype=np.int64)
    y = np.array([r[1] for r in rows], dtype=np.int64)
    batch = pa.RecordBatch.from_arrays([pa.array(x), pa.array(y)], names=["x", "y"])
    chain, _ = _chain()
    totals = {f"{k}_{n}": 0 for n in PREDICATES for k in ("rows_in", "rows_passed", "nanos")}
    totals.update(input_rows=0, output_rows=0, shed_rows=0)
    out = chain.run(_shed(batch, 0.0, totals), tuple(order), totals)
    keep = _oracle(x, y)
    assert out.column(0).to_pylist() == x[keep].tolist() and out.column(1).to_pylist() == y[keep].tolist()
    assert totals["input_rows"] == len(x) and totals["output_rows"] == int(keep.sum())
    # each predicate sees exactly the rows the earlier ones passed
    alive = np.ones(len(x), dtype=bool)
    masks = {"even": x % 2 == 0, "small": x < 50, "y3": y % 3 != 0}
    for name in order:
        if not alive.any():
            assert totals[f"rows_in_{name}"] == 0
            continue
        assert totals[f"rows_in_{name}"] == int(alive.sum())
        alive &= masks[name]
        assert totals[f"rows_passed_{name}"] == int(alive.sum())


def test_null_results_reject_the_row():
    chain = _Chain("select_chain 't'", ("p",), {"p": lambda b: pa.array([True, None, False])}, ("x",), None,
                   pa.schema([("x", pa.int64())]), ())
    totals = {"rows_in_p": 0, "rows_passed_p": 0, "nanos_p": 0, "input_rows": 0, "output_rows": 0, "shed_rows": 0}
    out = chain.run(pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["x"]), ("p",), totals)
    assert out.column(0).to_pylist() == [1]


@pytest.mark.parametrize("result, what", [(lambda b: pa.array([True]), "1 values"),
                                          (lambda b: pa.array([1, 2, 3]), "type int64"),
                                          (lambda b: "yes", "boolean array")])
def test_a_bad_predicate_result_names_the_operator_predicate_and_batch(result, what):
    chain = _Chain("select_chain 'f1'", ("p",), {"p": result}, ("x",), None, pa.schema([("x", pa.int64())]), ())
    totals = {"rows_in_p": 0, "rows_passed_p": 0, "nanos_p": 0, "input_rows": 0, "output_rows": 0, "shed_rows": 0}
    with pytest.raises(TypeError, match=r"select_chain 'f1': predicate 'p' must return a boolean array") as info:
        chain.run(pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["x"]), ("p",), totals)
    assert what in str(info.value) and "micro-batch" in str(info.value)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-1000, 1000), max_size=300), st.sampled_from([0.0, 0.3, 0.7]))
def test_shedding_stage_drops_by_hash_and_counts(xs, ratio):
    """The shedding stage keeps the rows a hash keeps (the same ones on a replay) and counts the others."""
    batch = pa.RecordBatch.from_arrays([pa.array(xs, pa.int64())], names=["x"])
    totals = {"input_rows": 0, "shed_rows": 0}
    kept = _shed(batch, ratio, totals)
    assert totals == {"input_rows": len(xs), "shed_rows": len(xs) - kept.num_rows}
    again = _shed(batch, ratio, {"input_rows": 0, "shed_rows": 0})
    assert again.column(0).to_pylist() == kept.column(0).to_pylist()     # deterministic
    assert set(kept.column(0).to_pylist()) <= set(xs)
    if ratio == 0.0:
        assert kept.num_rows == len(xs)


def test_shedding_keeps_about_one_minus_the_ratio():
    batch = pa.RecordBatch.from_arrays([pa.array(np.arange(20_000), pa.int64())], names=["x"])
    totals = {"input_rows": 0, "shed_rows": 0}
    _shed(batch, 0.25, totals)
    assert abs(totals["shed_rows"] / 20_000 - 0.25) < 0.02     # ~5 standard deviations of a binomial


def test_plan_ids():
    assert chain_plan_id(["b", "a"]) == "b>a"
    assert parse_chain_plan(" b > a ", ["a", "b"]) == ("b", "a")
    for bad, why in [("a", "missing"), ("a>b>c", "unknown"), ("a>a", "missing"), ("", "plan_id must be")]:
        with pytest.raises(ValueError, match=why):
            parse_chain_plan(bad, ["a", "b"], operator="select_chain 'f'")
    with pytest.raises(ValueError, match="twice"):
        chain_plan_id(["a", "a"])
    with pytest.raises(ValueError, match="predicate name"):
        chain_plan_id(["a b"])


# ---- on Spark ----------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_batch_equals_spark_filter_with_column_and_callable_predicates(spark):
    rng = np.random.default_rng(3)
    rows = [(int(a), int(b), f"s{int(a) % 7}") for a, b in rng.integers(-100, 100, size=(400, 2))]
    df = spark.createDataFrame(rows + [(None, 1, None)], "x long, y long, s string")
    preds = {"y3": _odd_y, "col": (F.col("s") != "s3") & F.col("x").isNotNull(), "even": _even}
    ours = cq.select_chain(df, preds)
    theirs = df.filter((F.col("y") % 3 != 0) & (F.col("s") != "s3") & (F.col("x") % 2 == 0))
    assert ours.columns == df.columns
    assert sorted(ours.collect()) == sorted(theirs.collect())


@pytest.mark.spark
def test_definition_time_errors_name_the_argument(spark, tmp_dir):
    df = spark.createDataFrame([(1, "a")], "x long, s string")
    with pytest.raises(TypeError, match="predicates must be a non-empty mapping"):
        cq.select_chain(df, {})
    with pytest.raises(TypeError, match=r"predicates\['p'\] must be a boolean Column, got a bigint"):
        cq.select_chain(df, {"p": F.col("x") + 1})
    with pytest.raises(TypeError, match=r"predicates\['p'\] must be a callable"):
        cq.select_chain(df, {"p": 3})
    with pytest.raises(ValueError, match="predicate name"):
        cq.select_chain(df, {"p q": _even})
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("f1", plan_id="a>c")
    with pytest.raises(ValueError, match=r"select_chain 'f1': plan_id 'a>c' is not a permutation"):
        cq.select_chain(df, {"a": _even, "b": _small}, control=table.handle("f1"))
    table.register("f2", window="10 seconds")
    with pytest.raises(ValueError, match=r"select_chain 'f2'.*window"):
        cq.select_chain(df, {"a": _even}, control=table.handle("f2"))


def _write(directory, i, x, y):
    write_in_order(pa.table({"x": pa.array(x, pa.int64()), "y": pa.array(y, pa.int64())}),
                   os.path.join(directory, f"b{i:03d}.parquet"), i)   # file order = batch order


@pytest.mark.spark
@pytest.mark.slow
def test_stream_switches_plans_between_batches_and_reports_each_step(spark, tmp_dir):
    src = tmp_dir / "in"
    src.mkdir()
    rng = np.random.default_rng(7)
    batches = [(rng.integers(0, 100, 300), rng.integers(0, 100, 300)) for _ in range(3)]
    table = ControlTable(str(tmp_dir / "control.json"))
    orders = ["even>small>y3", "y3>small>even", "small>y3>even"]
    table.register("chain1", plan_id=orders[0])
    df = spark.readStream.schema("x long, y long").option("maxFilesPerTrigger", 1).parquet(str(src))
    out = cq.select_chain(df, PREDICATES, control=table.handle("chain1"))
    q = (out.writeStream.format("memory").queryName("chain_out").outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    reports = []
    try:
        for i, (x, y) in enumerate(batches):
            if i:
                table.set("chain1", plan_id=orders[i], reason="test: switch the plan between batches")
            _write(str(src), i, x, y)
            q.processAllAvailable()
            with_data = [p for p in q.recentProgress if p.numInputRows > 0]
            reports.append(cq.read_metrics(with_data[-1], "chain1"))
    finally:
        q.stop()
    got = sorted(tuple(r) for r in spark.table("chain_out").collect())
    want = sorted((int(a), int(b)) for x, y in batches for a, b in zip(x, y) if _oracle(a, b))
    assert got == want
    for i, (report, order) in enumerate(zip(reports, orders)):
        x, y = batches[i]
        names = order.split(">")
        assert report["input_rows"] == len(x) and report[f"rows_in_{names[0]}"] == len(x), (i, report)
        for before, after in zip(names, names[1:]):
            assert report[f"rows_in_{after}"] == report[f"rows_passed_{before}"], (i, order, report)
        assert report["output_rows"] == int(_oracle(x, y).sum())


# ---- the sampler plan (RTStream §4.2) and the kept fraction per row ------------------------------------------


def test_sampler_plan_runs_the_chain_on_nested_hash_samples():
    rng = np.random.default_rng(11)
    x, y = rng.integers(0, 100, 20_000), rng.integers(0, 100, 20_000)
    batch = pa.RecordBatch.from_arrays([pa.array(x), pa.array(y)], names=["x", "y"])
    chain, order = _chain()
    ratios = sample_ratios({"sample_ratio": {"even": 0.05, "small": 0.3, "y3": 0.1}}, order, where="t")
    assert ratios == [0.3, 0.3, 0.1]
    totals = {f"sample_{k}_{n}": 0 for n in order for k in ("rows_in", "rows_passed", "nanos")}
    assert chain._sample(batch, order, ratios, totals) is batch       # the input goes on whole
    # oracle: the same hash numbers and numpy masks
    u, even, small = row_uniform(batch, 1), x % 2 == 0, x < 50
    assert totals["sample_rows_in_even"] == (u < 0.3).sum()
    assert totals["sample_rows_passed_even"] == totals["sample_rows_in_small"] == ((u < 0.3) & even).sum()
    assert totals["sample_rows_passed_small"] == ((u < 0.3) & even & small).sum()
    assert totals["sample_rows_in_y3"] == ((u < 0.1) & even & small).sum()
    assert totals["sample_rows_passed_y3"] == ((u < 0.1) & _oracle(x, y)).sum()
    assert abs(totals["sample_rows_in_even"] / 20_000 - 0.3) < 0.02          # ~6 standard deviations
    assert abs(totals["sample_rows_passed_even"] / totals["sample_rows_in_even"] - even.mean()) < 0.03


@pytest.mark.spark
def test_stream_reports_the_sampler_plan_and_each_rows_kept_fraction(spark, tmp_dir):
    src = tmp_dir / "in"
    src.mkdir()
    rng = np.random.default_rng(5)
    batches = [(rng.integers(0, 100, 4000), rng.integers(0, 100, 4000)) for _ in range(2)]
    table = ControlTable(str(tmp_dir / "control.json"))
    # a ratio per step, as dynamic sampling writes it (RTStream §5.1; its Spark run is this path: issue 41), through
    # the control table to the workers: even and small on 10 % of the rows, y3 on a nested 2 %
    table.register("chain2", drop_ratio=0.4, params={"sample_ratio": {"even": 0.1, "small": 0.1, "y3": 0.02}})
    df = spark.readStream.schema("x long, y long").option("maxFilesPerTrigger", 1).parquet(str(src))
    with pytest.raises(ValueError, match="kept_column must be a new column name"):
        cq.select_chain(df, PREDICATES, control=table.handle("chain2"), kept_column="x")
    out = cq.select_chain(df, PREDICATES, control=table.handle("chain2"), kept_column="kept")
    assert out.columns == ["x", "y", "kept"]
    q = (out.writeStream.format("memory").queryName("chain_kept").outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    reports, kept = [], []
    try:
        for i, (x, y) in enumerate(batches):
            if i:
                table.set("chain2", drop_ratio=0.0, params={"sample_ratio": None}, reason="test: stop shedding")
            _write(str(src), i, x, y)
            q.processAllAvailable()
            with_data = [p for p in q.recentProgress if p.numInputRows > 0]
            reports.append(cq.read_metrics(with_data[-1], "chain2"))
            kept.append(sorted({r.kept for r in spark.table("chain_kept").collect()}))
    finally:
        q.stop()
    first, second = reports
    x, y = batches[0]
    # shedding kept ~60 %: every row says so; the sampler ran over ~10 % of all input, before shedding
    assert kept[0] == [pytest.approx(0.6)] and kept[1] == [pytest.approx(0.6), 1.0]
    assert abs(first["shed_rows"] / 4000 - 0.4) < 0.05 and first["input_rows"] == 4000
    assert abs(first["sample_rows_in_even"] / 4000 - 0.1) < 0.03
    assert abs(first["sample_rows_passed_even"] / first["sample_rows_in_even"] - (x % 2 == 0).mean()) < 0.1
    assert first["sample_rows_in_small"] == first["sample_rows_passed_even"]
    assert 0 < first["sample_rows_in_y3"] < first["sample_rows_passed_small"]    # the nested 2 % sample
    assert first["rows_in_even"] == 4000 - first["shed_rows"]
    # without shedding and sampler: all rows of the oracle, and no sample
    rows = {(r.x, r.y) for r in spark.table("chain_kept").collect() if r.kept == 1.0}
    x2, y2 = batches[1]
    assert sorted(rows) == sorted({(int(a), int(b)) for a, b in zip(x2, y2) if _oracle(a, b)})
    assert second["shed_rows"] == 0 and second["sample_rows_in_even"] == 0
