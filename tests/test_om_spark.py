"""OM on Spark: the ``om`` policy switches the plans of a running select_chain and multi_join through the
runtime and the control table, and the queries' output stays exactly the filtered / joined rows.

Each step writes one file per input, lets the query process it (one micro-batch), waits for the runtime's
statistics to see that batch, and runs one policy round: a round is a micro-batch (§3.1, §4.5).
"""
import itertools
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pyspark_cq as cq
from pyspark_cq.policies import plan_stats as ps

BASE_US = 1_700_000_000_000_000


def _write(directory, step, table):
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".b{step:03d}.tmp")     # hidden from the file source until renamed
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(directory, f"b{step:03d}.parquet"))
    # one file per step, written after the previous batch: the file order is the batch order


def _step(rt, name, operator):
    """Process the file written, wait until the statistics hold this batch's report, run a policy round."""
    q = rt.query(name)
    q.processAllAvailable()
    last = [p for p in q.recentProgress if p["numInputRows"] > 0][-1]
    want = cq.read_metrics(last, operator)
    deadline = time.monotonic() + 120
    while dict(rt.statistics().queries[name].operators[operator].report) != want:
        assert time.monotonic() < deadline, f"the statistics never held {operator}'s report of batch {last['batchId']}"
        time.sleep(0.05)
    return rt.run_policies()


@pytest.mark.spark
@pytest.mark.slow
def test_om_switches_plans_of_running_select_chain_and_multi_join(spark, tmp_dir):
    from pyspark_cq_plugins.om import OMPolicy

    from pyspark_cq.runtime import CQRuntime

    # a round must see its batch's report: without no-data batches (run by Spark when the watermark
    # advances) the latest report is always the batch with the step's rows
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    rng = np.random.default_rng(18)
    policy = OMPolicy(k=10, d=1, ranges={"funnel": {f"rate:{i}": (10.0, 500.0) for i in range(3)}})
    rt = CQRuntime(spark, policies=[policy], control_path=str(tmp_dir / "ct.json"), every_batches=10**9)

    # --- a select_chain: sel(a) 0.1 for three batches, then 0.9; sel(b) 0.5 throughout -------------------
    src = str(tmp_dir / "chain_in")
    os.makedirs(src)

    def build_chain(ctx):
        handle = ctx.control("filter", plan_id="b>a")
        df = ctx.spark.readStream.schema("x long, y long").option("maxFilesPerTrigger", 1).parquet(src)
        # lambdas: cloudpickle ships them by value to the workers (a test module is not importable there)
        out = cq.select_chain(df, {"a": lambda b: pc.less(b["x"], 10),
                                   "b": lambda b: pc.equal(pc.bit_wise_and(b["y"], 1), 0)}, control=handle)
        return out.writeStream.format("memory").outputMode("append") \
            .option("checkpointLocation", str(tmp_dir / "ck_chain"))

    # --- a 3-way multi_join: input 0 fast first, then input 2 --------------------------------------------
    join_in = [str(tmp_dir / f"join_in{i}") for i in range(3)]
    worst_first = ps.left_deep_plans(3)[2]          # (1, 2, 0): joins the two slow inputs first

    def build_join(ctx):
        handle = ctx.control("funnel", plan_id=worst_first)
        dfs = [ctx.spark.readStream.schema(f"k{i} long, t{i} timestamp, v{i} long")
               .option("maxFilesPerTrigger", 1).parquet(join_in[i]).withWatermark(f"t{i}", "1 hour")
               for i in range(3)]
        out = cq.multi_join(dfs, ["k0", "k1", "k2"], ["t0", "t1", "t2"],
                            [(0, 1, "-1 hour", "1 hour"), (1, 2, "-1 hour", "1 hour")], control=handle)
        return out.writeStream.format("memory").outputMode("append") \
            .option("checkpointLocation", str(tmp_dir / "ck_join"))

    for i in range(3):
        os.makedirs(join_in[i])
    rt.register("q_chain", build_chain)
    rt.register("q_join", build_join)
    chain_rows, join_tables = [], [[] for _ in range(3)]
    phases_chain = [100] * 3 + [11] * 3                                 # x in [0, 100): a passes 10 %, else 90 %
    phases_join = [(400, 50, 50)] * 3 + [(50, 50, 400)] * 3
    ran_chain, ran_join = [], []
    with rt:
        for step in range(6):
            x = rng.integers(0, phases_chain[step], 2000)
            y = rng.integers(0, 1000, 2000)
            chain_rows += list(zip(x.tolist(), y.tolist()))
            _write(src, step, pa.table({"x": pa.array(x, pa.int64()), "y": pa.array(y, pa.int64())}))
            for i, n in enumerate(phases_join[step]):
                t = pa.table({f"k{i}": pa.array(rng.integers(0, 200, n), pa.int64()),
                              f"t{i}": pa.array(BASE_US + step * 1_000_000 + rng.integers(0, 1_000_000, n),
                                                pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              f"v{i}": pa.array(rng.integers(0, 2**40, n), pa.int64())})
                join_tables[i].append(t)
                _write(join_in[i], step, t)
            ran_chain.append(rt.control_table().entry("filter").params["plan_id"])
            ran_join.append(rt.control_table().entry("funnel").params["plan_id"])
            _step(rt, "q_chain", "filter")
            _step(rt, "q_join", "funnel")
        chain_reports = [r for r in (cq.read_metrics(p, "filter") for p in rt.query("q_chain").recentProgress)
                         if r and r["input_rows"]]
        join_reports = [r for r in (cq.read_metrics(p, "funnel") for p in rt.query("q_join").recentProgress)
                        if r and r["input_rows"]]
        log = rt.decisions_log()
    spark.conf.unset("spark.sql.streaming.noDataMicroBatches.enabled")
    # the chain: a first while a is selective, b first once it is not; each batch ran the plan in force
    assert ran_chain == ["b>a", "a>b", "a>b", "a>b", "b>a", "b>a"]
    for report, plan in zip(chain_reports, ran_chain):
        first, second = plan.split(">")
        assert report[f"rows_in_{first}"] == report["input_rows"] == 2000
        assert report[f"rows_in_{second}"] == report[f"rows_passed_{first}"]
    got = sorted(tuple(r) for r in spark.table("q_chain").collect())
    assert got == sorted((x, y) for x, y in chain_rows if x < 10 and y % 2 == 0)
    # the join: OM moved it off the initial plan through the control table; every plan is a left-deep one
    # (which left-deep plan is best depends on the pair selectivities measured from few matches, so the test
    # does not fix it; tests/test_om_policy.py checks the choice against the model)
    assert ran_join[0] == worst_first and len(set(ran_join)) >= 2, ran_join
    assert set(ran_join) <= set(ps.left_deep_plans(3)), ran_join
    assert [c.new["plan_id"] for c in rt.control_table().changes("funnel") if c.who == "om"] == \
        [b for a, b in zip(ran_join, ran_join[1:]) if a != b] + \
        ([] if policy._ops[("q_join", "funnel")].plan in (ran_join[-1], None) else
         [policy._ops[("q_join", "funnel")].plan])
    # (a step's three files may reach the join in more than one batch, so reports are not matched to steps)
    assert sum(r["input_rows"] for r in join_reports) == sum(sum(p) for p in phases_join)
    tables = [pa.concat_tables(ts) for ts in join_tables]
    by_key = [{} for _ in range(3)]
    for i, t in enumerate(tables):
        for k, v in zip(t.column(f"k{i}").to_pylist(), t.column(f"v{i}").to_pylist()):
            by_key[i].setdefault(k, []).append(v)
    want = sorted((k, a, b, c) for k in by_key[0] for a, b, c in
                  itertools.product(by_key[0][k], by_key[1].get(k, []), by_key[2].get(k, [])))
    got = sorted(tuple(r) for r in spark.table("q_join").select("k0", "v0", "v1", "v2").collect())
    assert got == want
    # the runtime logs OM's measures with every round, and its decisions as control-table changes by "om"
    status = [r["status"] for r in log if r["policy"] == "om" and r["kind"] == "decide"][-1]
    assert status["q_chain/filter"]["switches"] == 2 and status["q_chain/filter"]["rounds"] == 6
    assert status["q_join/funnel"]["switches"] >= 1
    changes = [c for c in rt.control_table().changes("filter") if c.who == "om"]
    assert [c.new["plan_id"] for c in changes] == ["a>b", "b>a"]
