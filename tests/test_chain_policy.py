"""The ``chain`` policy: Chain priorities from select_chain reports, written through the control table.

Oracles: :func:`pyspark_cq.cost.chain.priorities` on the measured capacities and selectivities, the control
table's own validation and merge, and (on Spark) the plain filter's rows while the runtime drives a query.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.files import write_in_order
from pyspark import cloudpickle
from pyspark_cq_plugins.chain_scheduler import ChainScheduler

import pyspark_cq as cq
from pyspark_cq import policies
from pyspark_cq.control import ControlTable
from pyspark_cq.cost import chain
from pyspark_cq.policies import OperatorStats, QueryInfo, Snapshot
from pyspark_cq.policies.checks import check_policy, example_snapshots

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _report(**steps):
    out = {"input_rows": 0, "output_rows": 0}
    for name, (rows, passed, nanos) in steps.items():
        out.update({f"rows_in_{name}": rows, f"rows_passed_{name}": passed, f"nanos_{name}": nanos})
    return out


def _snap(report, control=None, t=0.0):
    op = OperatorStats("f1", 1, 0, 0, report=report)
    return Snapshot(t, {"q": QueryInfo("q", operators={"f1": op}, control={"f1": control or {}})})


def test_registered_and_passes_the_check_suite():
    policies.refresh()
    assert policies.load("chain") is ChainScheduler
    check_policy(ChainScheduler())
    # the suite's snapshots hold a select_chain: the policy really decides there
    assert any(len(ChainScheduler().decide(s)) for s in example_snapshots())


def test_priorities_are_the_models_on_measured_costs_in_plan_order():
    report = _report(a=(1000, 500, 2_000_000), b=(500, 50, 100_000), c=(50, 10, 5_000))
    d = ChainScheduler(max_buffered_rows=1000, chunk_rows=100).decide(_snap(report, {"plan_id": "a>b>c"}))
    assert len(d) == 1 and d[0].operator == "f1" and d[0].query == "q" and "STREAM §5.3" in d[0].reason
    params = d[0].changes["params"]
    ops = [(1000 * 1000 / 2_000_000, 0.5), (1000 * 500 / 100_000, 0.1), (1000 * 50 / 5_000, 0.2)]
    want = chain.priorities(ops)
    assert list(params["priorities"]) == ["a", "b", "c"]
    assert list(params["priorities"].values()) == pytest.approx(want, rel=1e-3)
    assert params["selectivities"] == {"a": 0.5, "b": 0.1, "c": 0.2}
    assert params["schedule"] == "chain" and params["chunk_rows"] == 100 and params["max_buffered_rows"] == 1000
    # another plan order: the priorities of that path
    d2 = ChainScheduler().decide(_snap(report, {"plan_id": "c>b>a"}))
    assert list(d2[0].changes["params"]["priorities"]) == ["c", "b", "a"]
    assert list(d2[0].changes["params"]["priorities"].values()) == pytest.approx(
        chain.priorities(ops[::-1]), rel=1e-3)


def test_no_rewrite_when_steady_and_rewrite_when_costs_move():
    policy = ChainScheduler(min_change=0.2)
    report = _report(a=(1000, 500, 2_000_000), b=(500, 50, 100_000))
    first = policy.decide(_snap(report))
    assert len(first) == 1
    control = {"params": first[0].changes["params"]}
    steady = _report(a=(1000, 520, 2_100_000), b=(520, 52, 104_000))
    assert len(policy.decide(_snap(steady, control))) == 0
    moved = _report(a=(1000, 900, 100_000), b=(900, 90, 2_000_000))      # a became cheap, b expensive
    d = policy.decide(_snap(moved, control))
    assert len(d) == 1 and d[0].changes["params"]["selectivities"]["a"] == 0.9


def test_waits_until_every_predicate_was_measured_and_remembers():
    policy = ChainScheduler()
    assert len(policy.decide(_snap(_report(a=(1000, 0, 10_000), b=(0, 0, 0))))) == 0
    assert len(policy.decide(_snap(_report(a=(1000, 10, 10_000), b=(10, 5, 1_000))))) == 1
    # b sees no row in the next batch: its last measurement stands
    d = ChainScheduler.clone(policy)
    assert len(d.decide(_snap(_report(a=(1000, 0, 10_000), b=(0, 0, 0))))) == 0   # a fresh clone has none
    out = policy.decide(_snap(_report(a=(1000, 0, 10_000), b=(0, 0, 0)), {"params": {}}))
    assert out[0].changes["params"]["selectivities"] == {"a": 0.0, "b": 0.5}


def test_other_operators_and_bad_plans_are_left_alone():
    policy = ChainScheduler()
    join = Snapshot(0.0, {"q": QueryInfo("q", operators={"j": OperatorStats("j", report={"input_rows": 5})})})
    assert len(policy.decide(join)) == 0
    assert len(policy.decide(_snap(_report(a=(10, 5, 100)), {"plan_id": "a>zz"}))) == 0
    assert len(ChainScheduler(operators=["other"]).decide(_snap(_report(a=(10, 5, 100))))) == 0


def test_decisions_are_accepted_by_the_control_table(tmp_path):
    table = ControlTable(str(tmp_path / "control.json"))
    table.register("f1", query="q", plan_id="a>b")
    d = ChainScheduler().decide(_snap(_report(a=(1000, 500, 2_000_000), b=(500, 50, 100_000)), {"plan_id": "a>b"}))
    table.apply(d, who="chain")
    params = table.entry("f1").get("params")
    assert params["schedule"] == "chain" and set(params["priorities"]) == {"a", "b"}
    unbounded = ChainScheduler(max_buffered_rows=None, strategy="fifo").decide(
        _snap(_report(a=(1000, 500, 2_000_000), b=(500, 50, 100_000)), {"params": params}))
    table.apply(unbounded, who="chain")
    assert "max_buffered_rows" not in table.entry("f1").get("params")     # None deletes the key


@pytest.mark.parametrize("kwargs, match", [
    ({"max_buffered_rows": 0}, "max_buffered_rows must be an integer >= 1"),
    ({"chunk_rows": 1.5}, "chunk_rows must be an integer >= 1"),
    ({"strategy": "edf"}, "strategy must be one of"),
    ({"min_change": -1}, "min_change must be"),
    ({"operators": "f1"}, "operators must be a sequence"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ChainScheduler(**kwargs)


# ---- on Spark: the runtime drives a streaming select_chain ------------------------------------------------

def _mult3(b):
    return pa.array(np.asarray(b["x"]) % 3 == 0)


def _costly(b):
    y = np.asarray(b["y"], dtype=np.float64)
    for _ in range(4):                         # a costlier predicate
        y = np.sqrt(y + 1.0)
    return pa.array(y > 2.0)


def _odd(b):
    return pc.equal(pc.bit_wise_and(b["x"], 1), 1)


PREDICATES = {"mult3": _mult3, "costly": _costly, "odd": _odd}


def _oracle(x, y):
    yy = y.astype(np.float64)
    for _ in range(4):
        yy = np.sqrt(yy + 1.0)
    return (x % 3 == 0) & (yy > 2.0) & (x % 2 == 1)


def _spark_condition():
    """The same conjunction as a Spark Column (IEEE sqrt is correctly rounded in numpy and the JVM alike)."""
    from pyspark.sql import functions as F

    y = F.col("y").cast("double")
    for _ in range(4):
        y = F.sqrt(y + F.lit(1.0))
    return (F.col("x") % 3 == 0) & (y > 2.0) & (F.col("x") % 2 == 1)


@pytest.mark.spark
@pytest.mark.parametrize("strategy", chain.STRATEGIES)
def test_every_strategy_equals_spark_filter(spark, tmp_dir, strategy):
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 10_000, 3000), rng.integers(0, 10_000, 3000)
    df = spark.createDataFrame(pa.table({"x": x, "y": y}).to_pandas()).repartition(2)
    table = ControlTable(str(tmp_dir / f"control_{strategy}.json"))
    table.register("f1", params={"schedule": strategy, "chunk_rows": 97, "max_buffered_rows": 150,
                                 "priorities": {"mult3": 1.0, "costly": 0.5, "odd": 0.2},
                                 "selectivities": {"mult3": 0.33, "costly": 0.7, "odd": 0.5}})
    ours = cq.select_chain(df, PREDICATES, control=table.handle("f1"))
    got = sorted(tuple(r) for r in ours.collect())
    assert got == sorted(tuple(r) for r in df.filter(_spark_condition()).collect())
    assert got == sorted((int(a), int(b)) for a, b in zip(x[_oracle(x, y)], y[_oracle(x, y)]))


def _write(directory, i, x, y):

    write_in_order(pa.table({"x": pa.array(x, pa.int64()), "y": pa.array(y, pa.int64())}),
                   os.path.join(directory, f"b{i:03d}.parquet"), i)


@pytest.mark.spark
@pytest.mark.slow
def test_runtime_chain_policy_schedules_a_running_query(spark, tmp_path):
    """The runtime with the ``chain`` policy: after the first batch it writes priorities into the running
    select_chain's entry; later batches run chunked under the bound (their reports say so) and the sink holds
    exactly the filtered rows."""
    from pyspark_cq.runtime import CQRuntime

    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(11)
    batches = [(rng.integers(0, 10_000, 4000), rng.integers(0, 10_000, 4000)) for _ in range(3)]
    bound = 300
    rt = CQRuntime(spark, policies=[ChainScheduler(max_buffered_rows=bound, chunk_rows=256)],
                   control_path=str(tmp_path / "control.json"), every_batches=1)

    def build(ctx):
        df = spark.readStream.schema("x long, y long").option("maxFilesPerTrigger", 1).parquet(str(src))
        out = cq.select_chain(df, PREDICATES, control=ctx.control("f1", plan_id="mult3>costly>odd"))
        return (out.writeStream.format("memory").outputMode("append")
                .option("checkpointLocation", str(tmp_path / "ck")))

    rt.register("chainq", build)
    reports = []
    with rt:
        for i, (x, y) in enumerate(batches):
            _write(str(src), i, x, y)
            rt.query("chainq").processAllAvailable()
            rt.await_batches("chainq", i + 1, timeout=300)  # a wait, not a timing check: the machine may be loaded
            rt.run_policies()
            progress = [p for p in rt.query("chainq").recentProgress if p["numInputRows"] > 0]
            reports.append(cq.read_metrics(progress[-1], "f1"))
        params = rt.control_table().entry("f1").get("params")
        log = rt.decisions_log()
    assert params["schedule"] == "chain" and params["max_buffered_rows"] == bound
    assert set(params["priorities"]) == set(PREDICATES)
    assert any(r["policy"] == "chain" and r["applied"] and r["decisions"] for r in log)
    got = sorted(tuple(r) for r in spark.table("chainq").collect())     # the runtime names the query
    want = sorted((int(a), int(b)) for x, y in batches for a, b in zip(x[_oracle(x, y)], y[_oracle(x, y)]))
    assert got == want
    # batch 0 ran unscheduled (whole Arrow batches); the last one under the policy's bound, in chunks
    assert reports[0]["chunk_steps"] <= 3 * 2 * 2
    assert reports[-1]["chunk_steps"] > reports[0]["chunk_steps"]
    assert 0 < reports[-1]["peak_buffered_rows"] <= bound + 256
    assert reports[-1]["peak_worker_rss"] > 10 * 2**20


def _join_report(timed: bool):
    """A 3-way multi_join's report under plan 0:1>2;1:0>2;2:1>0: probed/matched per step (and its time)."""
    from pyspark_cq.operators.multi_join.worker import metric_names

    report = dict.fromkeys(metric_names(3), 0)
    steps = {(0, 1): (1000, 300, 2e6), (0, 2): (300, 30, 1e6), (1, 0): (500, 1500, 1e6), (1, 2): (1500, 15, 3e6),
             (2, 1): (800, 80, 4e6), (2, 0): (80, 400, 1e5)}
    for i in range(3):
        report[f"input_rows_{i}"] = (1000, 500, 800)[i]
    for (i, j), (probed, matched, nanos) in steps.items():
        report[f"probed_{i}_{j}"], report[f"matched_{i}_{j}"] = probed, matched
        report[f"probe_nanos_{i}_{j}"] = nanos if timed else 0
    return report, steps


@pytest.mark.parametrize("plan", [None, "0:1>2;1:0>2;2:1>0"])
def test_multi_join_probe_steps_get_chain_priorities_per_input_path(plan):
    """Each input's probe order is a path (from the plan, else from the counters: step 2 probes what step 1
    matched); untimed steps first get selectivities only, timed ones the model's priorities."""
    control = {"plan_id": plan} if plan else {}
    report, steps = _join_report(timed=False)
    policy = ChainScheduler(max_buffered_rows=500, chunk_rows=50)
    first = policy.decide(_snap(report, control))[0].changes["params"]
    assert "priorities" not in first and first["selectivities"]["1_0"] == 3.0
    assert first["schedule"] == "chain" and first["max_buffered_rows"] == 500 and first["chunk_rows"] == 50
    report, _ = _join_report(timed=True)
    params = policy.decide(_snap(report, {**control, "params": first}))[0].changes["params"]
    for i, order in enumerate(((1, 2), (0, 2), (1, 0))):
        ops = [(1000 * steps[(i, j)][0] / steps[(i, j)][2], steps[(i, j)][1] / steps[(i, j)][0]) for j in order]
        want = chain.priorities(ops)
        assert [params["priorities"][f"{i}_{j}"] for j in order] == pytest.approx(want, rel=1e-3)


def test_multi_join_paths_not_reached_yet_are_left_out():
    report, _ = _join_report(timed=True)
    report["probed_0_2"] = report["matched_0_1"] = 0     # input 0's second step was never reached
    params = ChainScheduler().decide(_snap(report, {"plan_id": "0:1>2;1:0>2;2:1>0"}))[0].changes["params"]
    assert set(params["priorities"]) == set(params["selectivities"]) == {"1_0", "1_2", "2_1", "2_0"}


def test_multi_join_with_an_ambiguous_order_is_left_alone():
    report, _ = _join_report(timed=True)
    report["probed_0_2"] = report["matched_0_1"] = 0     # step (0, 1) matched nothing: which ran first?
    report["probed_0_1"] = 0
    assert len(ChainScheduler().decide(_snap(report))) == 0
