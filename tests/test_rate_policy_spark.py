"""The rate-based policy (Viglas & Naughton §4) switching a running multi_join's plan through the runtime and
the control table: the output stays that of the query (a plain-Python oracle), the later batches run the
plan the policy chose."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from helpers import join_data as jd
from pyspark_cq_plugins.rate_based import RateBased

import pyspark_cq as cq
from pyspark_cq.control import parse_join_plan
from pyspark_cq.policies import plan_stats as S

BATCHES = 6
ROWS = (10, 200, 100)            # input 1 fast, input 0 slow
KEYS = 8
BAND = 5                         # t1, t2 in [t0, t0 + 5 s]
SLOW_PLAN = "0:1>2;1:2>0;2:1>0"  # left-deep (1, 2, 0): the fast input probes the big state of input 2 first
FAST_PLAN = "0:1>2;1:0>2;2:0>1"  # (0, 1, 2): it probes the small state of input 0 first


def _inputs(root):
    rng = np.random.default_rng(19)
    frames = [[] for _ in ROWS]
    for b in range(BATCHES):
        for i, n in enumerate(ROWS):
            t = pd.DataFrame({f"k{i}": rng.integers(0, KEYS, n),
                              f"t{i}": jd.BASE_US + b * 10_000_000 + rng.integers(0, 10_000_000, n),
                              f"v{i}": np.arange(n) + 1_000_000 * b})
            frames[i].append(t)
            table = pa.table({f"k{i}": pa.array(t[f"k{i}"], pa.int64()),
                              f"t{i}": pa.array(t[f"t{i}"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              f"v{i}": pa.array(t[f"v{i}"], pa.int64())})
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", table)
    return [pd.concat(f, ignore_index=True) for f in frames]


def _oracle(frames):
    """(v0, v1, v2) of every tuple with equal keys and both bands (pandas merges)."""
    a, b, c = frames
    ab = a.merge(b, left_on="k0", right_on="k1")
    ab = ab[(ab.t1 >= ab.t0) & (ab.t1 <= ab.t0 + BAND * 1_000_000)]
    abc = ab.merge(c, left_on="k0", right_on="k2")
    abc = abc[(abc.t2 >= abc.t0) & (abc.t2 <= abc.t0 + BAND * 1_000_000)]
    return sorted(zip(abc.v0.tolist(), abc.v1.tolist(), abc.v2.tolist()))


class _Recording(RateBased):
    """The policy, keeping its scores of every round."""

    def decide(self, snapshot):
        out = super().decide(snapshot)
        self.history = getattr(self, "history", []) + [dict(self.predictions.get(("rate_mj", "mj"), {}))]
        return out


@pytest.mark.spark
@pytest.mark.slow
def test_rate_policy_switches_a_running_multi_join(spark, tmp_path):
    from pyspark_cq.runtime import CQRuntime

    root = str(tmp_path / "in")
    frames = _inputs(root)
    policy = _Recording(margin=0.1, min_batches=1)
    rt = CQRuntime(spark, policies=[policy], control_path=str(tmp_path / "ct.json"), every_batches=1)

    def build(ctx):
        srcs = [ctx.spark.readStream.schema(f"k{i} long, t{i} timestamp, v{i} long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, f"in{i}")).withWatermark(f"t{i}", "20 seconds") for i in range(3)]
        out = cq.multi_join(srcs, ["k0", "k1", "k2"], ["t0", "t1", "t2"],
                            [(0, 1, "0 seconds", f"{BAND} seconds"), (0, 2, "0 seconds", f"{BAND} seconds")],
                            control=ctx.control("mj", plan_id=SLOW_PLAN), name="mj")
        return (out.select("v0", "v1", "v2").writeStream.format("memory").queryName("rate_mj")
                .trigger(processingTime="1 second").option("checkpointLocation", str(tmp_path / "ck")))

    rt.register("rate_mj", build)
    with rt:
        rt.await_batches("rate_mj", BATCHES, timeout=240)
        query = rt.query("rate_mj")
        query.processAllAvailable()
        progress = list(query.recentProgress)
    got = sorted(tuple(r) for r in spark.table("rate_mj").collect())
    assert got == _oracle(frames)
    # the policy switched the plan through the control table, once, to the plan it predicted best
    switches = [r for r in rt.decisions_log() if r["policy"] == "rate" and r["decisions"]]
    assert len(switches) == 1 and switches[0]["applied"]
    assert rt.control_table().entry("mj").params["plan_id"] == FAST_PLAN
    assert any(c.who == "rate" and c.new.get("plan_id") == FAST_PLAN for c in rt.control_table().changes("mj"))
    first = next(h for h in policy.history if h)      # the round that switched, in SLOW_PLAN
    assert max(first, key=first.get) == FAST_PLAN and first[FAST_PLAN] > 1.1 * first[SLOW_PLAN]
    scores = policy.predictions[("rate_mj", "mj")]
    assert max(scores, key=scores.get) == FAST_PLAN
    # batches before the switch ran the slow plan (input 1 probed 2 first), the last ones the chosen plan
    reports = [r for r in (cq.read_metrics(p, "mj") for p in progress) if r and r["input_rows_1"]]
    firsts = [(r["probed_1_2"] == r["input_rows_1"], r["probed_1_0"] == r["input_rows_1"]) for r in reports]
    assert firsts[0] == (True, False) and firsts[-1] == (False, True)
    assert parse_join_plan(FAST_PLAN, 3)[1][0] == 0
    # the operator reports its bounds graph (0–1, 0–2; no band between 1 and 2), and the policy offered no
    # plan with a step checked on the key alone except the running one (SLOW_PLAN: input 1 probes 2 first)
    assert all((r["banded_0_1"], r["banded_0_2"], r["banded_1_2"]) == (1, 1, 0) for r in reports)
    bands = frozenset({frozenset((0, 1)), frozenset((0, 2))})
    assert [p for p in first if S.key_only_steps(parse_join_plan(p, 3), bands)] == [SLOW_PLAN]
    assert [p for p in scores if S.key_only_steps(parse_join_plan(p, 3), bands)] == []
