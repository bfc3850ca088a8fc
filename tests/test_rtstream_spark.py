"""RTStream on Spark: a periodic query under a load step, prediction-based QoS against best effort in one run.

The query reads one parquet file per instance (``maxFilesPerTrigger = 1``); the first files are small, the
rest 30 times larger (the load step). Its one predicate costs a fixed time per row (it sleeps, so the cost
does not depend on the machine's load), so a large instance without shedding takes at least 3 s, longer
than its deadline D = 2.5 s: best effort must miss every one of them. The prediction-based policy learns
the cost from the instances, predicts the next one and sheds ε = D/T through ``select_chain``'s
``drop_ratio``. The sampling baselines (§5.2.3) do the same from ``select_chain``'s sampler plan, and feedback
control sheds after misses. Best effort runs once for the module. Assertions count misses and rows, never
durations.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.files import write_in_order
from pyspark_cq_plugins.rtstream import RTStreamQoS
from pyspark_cq_plugins.rtstream_baselines import FeedbackControl
from pyspark_cq_plugins.rtstream_dynamic_sampling import DynamicSampling
from pyspark_cq_plugins.rtstream_fixed_sampling import FixedSampling

import pyspark_cq as cq

PERIOD, DEADLINE = 3.0, 2.5
SECONDS_PER_ROW = 1e-3
SMALL, LARGE = 100, 3000
SIZES = [SMALL] * 2 + [LARGE] * 6


def _costly(per_row):
    """A predicate keeping every row with x >= 0 (all of them) after ``per_row`` seconds per row (a closure:
    cloudpickle ships it by value to the workers, which cannot import the tests)."""
    def costly(batch):
        time.sleep(batch.num_rows * per_row)
        return pc.greater_equal(batch["x"], 0)
    return costly


def _write_inputs(directory) -> int:
    os.makedirs(directory)
    start = 0
    for i, n in enumerate(SIZES):
        path = os.path.join(directory, f"f{i:03d}.parquet")
        write_in_order(pa.table({"x": pa.array(np.arange(start, start + n), pa.int64())}), path, i)
        start += n
    return start


def _run(spark, tmp_path, tag, policies):
    """Run the periodic query over the inputs in ``tmp_path/in`` (written if missing) under ``policies``."""
    if not (tmp_path / "in").exists():
        _write_inputs(str(tmp_path / "in"))
    from pyspark_cq.runtime import CQRuntime

    src, out = str(tmp_path / "in"), str(tmp_path / f"out_{tag}")
    rt = CQRuntime(spark, policies=policies, control_path=str(tmp_path / f"ct_{tag}.json"), every_batches=1)

    def build(ctx):
        handle = ctx.control(f"chain_{tag}", drop_ratio=0.0)
        df = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).parquet(src)
        kept = cq.select_chain(df, {"model": _costly(SECONDS_PER_ROW)}, control=handle)
        return (kept.writeStream.format("parquet").option("path", out)
                .option("checkpointLocation", str(tmp_path / f"ck_{tag}")))

    name = f"periodic_{tag}"
    rt.register(name, build, period=PERIOD, deadline=DEADLINE)
    with rt:
        rt.await_batches(name, len(SIZES), timeout=240)
    instances = [i for i in rt.instances(name) if i.input_rows > 0]
    rows = spark.read.parquet(out).count()
    return instances, rows, rt


TOTAL = sum(SIZES)


@pytest.fixture(scope="module")
def best_effort(spark, tmp_path_factory):
    """Best effort's instances and the rows it wrote; it misses every large instance (its predicate alone
    sleeps 3 s > D)."""
    tmp = tmp_path_factory.mktemp("rtstream_best")
    best, best_rows, _ = _run(spark, tmp, "best", ["rtstream_best_effort"])
    assert [i.input_rows for i in best] == SIZES
    assert best_rows == TOTAL and all(i.shed_rows == 0 and i.kept == 1.0 for i in best)
    assert sum(i.missed for i in best[2:]) == len(SIZES) - 2
    return best


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: RTStreamQoS(target=0.8), lambda: FixedSampling(target=0.8),
                                  lambda: DynamicSampling(target=0.8)],
                         ids=["rtstream", "fixed_sampling", "dynamic_sampling"])
def test_prediction_keeps_a_periodic_query_within_its_deadline_where_best_effort_misses(spark, tmp_path, make,
                                                                                         best_effort):
    policy = make()
    pred, pred_rows, rt = _run(spark, tmp_path, "rts", [policy])

    assert [i.input_rows for i in pred] == SIZES
    best_misses = sum(i.missed for i in best_effort[2:])
    # prediction-based: after the step is seen (the step instance and the one already triggered behind it
    # may miss) the instances meet their deadline by shedding; rows shed are counted, the rest delivered
    pred_misses = sum(i.missed for i in pred[2:])
    assert pred_misses <= 2 < best_misses, [(i.batch, round(i.lateness, 2), i.kept) for i in pred]
    assert not any(i.missed for i in pred[-2:]), [(i.batch, round(i.lateness, 2), i.kept) for i in pred]
    shed = sum(i.shed_rows for i in pred)
    assert shed > 0 and pred_rows + shed == TOTAL
    assert all(0.05 <= i.kept < 0.9 for i in pred[-2:])
    # the decisions went through the control table, and the predictions are recorded
    changes = rt.control_table().changes("chain_rts")
    assert any(c.who == policy.name and c.new.get("drop_ratio", 0) > 0 for c in changes)
    assert policy.predictions and policy.predictions[-1].kept < 1.0
    # the sampling baselines ran the sampler plan through the control table and profiled from it
    sampler = [c for c in changes if c.who == policy.name and "sample_ratio" in (c.new.get("params") or {})]
    assert bool(sampler) == isinstance(policy, FixedSampling | DynamicSampling)
    if sampler:
        assert 0 < policy.profile("periodic_rts").steps["model"][0].n


@pytest.mark.spark
@pytest.mark.slow
def test_feedback_control_sheds_after_misses_on_spark(spark, tmp_path, best_effort):
    policy = FeedbackControl(gain=0.5)
    got, rows, rt = _run(spark, tmp_path, "fb", [policy])
    assert [i.input_rows for i in got] == SIZES
    shed = sum(i.shed_rows for i in got)
    assert shed > 0 and rows + shed == TOTAL
    # it reacts to misses after they happen: the step instance misses as under best effort, then it sheds
    assert got[2].missed and best_effort[2].missed
    assert sum(i.missed for i in got[2:]) < sum(i.missed for i in best_effort[2:])
    changes = rt.control_table().changes("chain_fb")
    assert any(c.who == "rtstream_feedback" and c.new.get("drop_ratio", 0) > 0 for c in changes)
