"""The STREAM §5.1 allocation policy (plugins/pyspark_cq_plugins/precision.py) on synthetic snapshots: the shared
check suite, decisions against hand-computed allocations, and against the PIPES resource manager's uniform
reduction at the same memory bound."""
from __future__ import annotations

import pytest
from pyspark_cq_plugins.pipes_rm import PipesResourceManager
from pyspark_cq_plugins.precision import PrecisionAllocator

from pyspark_cq import plan as P
from pyspark_cq.control.schema import side_drop_ratios
from pyspark_cq.cost.stream_precision import plan_precision
from pyspark_cq.policies import QoSRange, QueryInfo, Snapshot, SourceStats
from pyspark_cq.policies.checks import check_policy

S = 1_000_000
W = 10 * S


def _query(rate_left=400.0, rate_right=50.0, control=None):
    """σ(L) (selectivity 1/2) ⋈ R in a window join ``j`` of 10 s, windows in [5 s, 10 s], a shedding stage."""
    lab = "j.window"
    plan = P.Join(P.Window(P.Select(P.Source("L"), 0.5), W, label=lab), P.Window(P.Source("R"), W, label=lab),
                  selectivity=0.02)
    return QueryInfo("q", plan=plan, qos={lab: QoSRange.window("5 seconds", "10 seconds")},
                     sources={"L": SourceStats("L", rate_left, 1 / rate_left),
                              "R": SourceStats("R", rate_right, 1 / rate_right)},
                     control=control or {"j": {"window": W, "drop_ratio": 0.0}})


def _applied(decisions, control):
    """The control entry of ``j`` after ``decisions``."""
    entry = {k: (dict(v) if isinstance(v, dict) else v) for k, v in control["j"].items()}
    for d in decisions:
        for k, v in d.changes.items():
            entry[k] = {**entry.get(k, {}), **v} if k == "params" else v
    return entry


@pytest.mark.parametrize("params", PrecisionAllocator._unit_test_params())
def test_passes_the_policy_check_suite(params):
    check_policy(PrecisionAllocator(**params))


def test_allocation_by_hand_and_against_the_pipes_resource_manager():
    # 200 rows/s reach the join from the left, 50 from the right; 64 B per element (both policies' profile).
    # At the QoS minimum (5 s) all of the right side and p of the left fit 40 960 B when
    # (200·p + 50)·5 s·64 B ≈ 40 960 B, i.e. p ≈ 0.39; PIPES sheds both sides alike: ε ≈ 128/250 ≈ 0.51.
    bound = 64 * 128 * 5
    info = _query()
    snap = Snapshot(queries={"q": info})
    ours = PrecisionAllocator(bound, reserve=0.0).decide(snap)
    entry = _applied(ours, info.control)
    kept_left, kept_right = (1 - d for d in side_drop_ratios(entry, (0.0, 0.0)))
    assert entry["window"] == 5 * S
    # (R may keep 0.999: eq. 9's ⌈l/d⌉ makes the last thousandth cost a whole element)
    assert kept_right >= 0.999 and kept_left == pytest.approx(0.39, abs=0.01)

    pipes = PipesResourceManager(bound, reserve=0.0, shed=True).decide(snap)
    pentry = _applied(pipes, info.control)
    assert pentry["window"] == 5 * S and pentry["drop_ratio"] == pytest.approx(1 - 0.51, abs=0.01)

    ours_f1 = plan_precision(info.plan, windows={"j.window": entry["window"]},
                             kept={"L": kept_left, "R": kept_right}).f1
    pipes_kept = 1 - pentry["drop_ratio"]
    pipes_f1 = plan_precision(info.plan, windows={"j.window": pentry["window"]},
                              kept={"L": pipes_kept, "R": pipes_kept}).f1
    assert ours_f1 > pipes_f1 * 1.2
    # the allocation recorded is what was written (3-decimal drop ratios), within the bound
    policy = PrecisionAllocator(bound, reserve=0.0)
    policy.decide(snap)
    a = policy.allocations["q"]
    assert a.kept == {"L": kept_left, "R": kept_right} and a.feasible and a.memory <= a.memory_bound


def test_no_reduction_when_the_query_fits_and_no_decision_twice():
    info = _query()
    policy = PrecisionAllocator("100 MB")
    first = policy.decide(Snapshot(queries={"q": info}))
    assert list(first) == []              # window 10 s and no drops already: nothing to change
    assert policy.allocations["q"].precision.f1 == pytest.approx(1.0, abs=1e-6)


def test_windows_only_without_a_shedding_stage_and_skips_what_it_cannot_model():
    info = _query(control={"j": {"window": W}})
    agg = QueryInfo("a", plan=P.Aggregate(P.Window(P.Source("A"), W, label="g.window")),
                    qos={"g.window": QoSRange.window("5 seconds", "10 seconds")},
                    sources={"A": SourceStats("A", 10.0, 0.1)}, control={"g": {"window": W}})
    policy = PrecisionAllocator(64 * 250 * 7.5, reserve=0.0)
    got = list(policy.decide(Snapshot(queries={"q": info, "a": agg})))
    # the aggregation is not managed, so q has the whole bound, windows only: 64·250·w ≤ bound → w = 7.5 s,
    # rounded down to the QoS range's whole seconds
    assert [(d.operator, d.changes) for d in got] == [("j", {"window": 7 * S})]
    assert "Aggregate" in policy.skipped["a"]


def test_waits_for_distances_and_uses_the_prior():
    info = QueryInfo("q", plan=_query().plan, qos=_query().qos, control=_query().control)
    policy = PrecisionAllocator(64 * 128 * 5, reserve=0.0)
    assert list(policy.decide(Snapshot(queries={"q": info}))) == []
    assert "distance" in policy.skipped["q"]
    prior = PrecisionAllocator(64 * 128 * 5, reserve=0.0, distances={"L": 1 / 400, "R": 1 / 50})
    assert list(prior.decide(Snapshot(queries={"q": info})))


@pytest.mark.parametrize("kw, match", [({"min_kept": 0}, "min_kept"), ({"reserve": 1}, "reserve"),
                                       ({"memory": -1}, "memory"), ({"distances": {"L": 0}}, "distances"),
                                       ({"starts": 0}, "starts"), ({"retention": 1}, "retention"),
                                       ({"distance_threshold": 0}, "distance_threshold")])
def test_arguments_validated(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        PrecisionAllocator(**kw)
