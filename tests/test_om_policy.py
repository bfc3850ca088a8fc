"""The policies om, rand and static on synthetic snapshots of a select_chain and a multi_join (no Spark).

The operators' reports are generated as the operator would write them for the plan that runs (the control
value the policy set last), so the policies are tested in the loop they run in on Spark.
"""
import pickle

import pytest
from pyspark_cq_plugins.om import OMPolicy
from pyspark_cq_plugins.plan_baselines import RandPolicy, StaticPolicy

from pyspark_cq.control.plans import parse_chain_plan, parse_join_plan
from pyspark_cq.operators.multi_join.worker import metric_names
from pyspark_cq.policies import OperatorStats, QueryInfo, Snapshot, create
from pyspark_cq.policies import plan_stats as ps

COST_NS = {"a": 200, "b": 200}


def chain_report(plan_id, sels, rows=1000):
    report = {"input_rows": rows}
    n = rows
    for p in parse_chain_plan(plan_id, ["a", "b"]):
        passed = int(round(n * sels[p]))
        report.update({f"rows_in_{p}": n, f"rows_passed_{p}": passed, f"nanos_{p}": n * COST_NS[p]})
        n = passed
    report["output_rows"] = n
    return report


def join_report(plan_id, rows, sel=1e-3, keep=10):
    report = dict.fromkeys(metric_names(3), 0)
    probes = parse_join_plan(plan_id, 3)
    for i in range(3):
        report[f"input_rows_{i}"] = rows[i]
        report[f"state_rows_{i}"] = rows[i] * keep
    for i in range(3):
        first, second = probes[i]
        partial = round(rows[i] * sel * report[f"state_rows_{first}"])
        report[f"probed_{i}_{first}"], report[f"matched_{i}_{first}"] = rows[i], partial
        report[f"probed_{i}_{second}"] = partial
        report[f"matched_{i}_{second}"] = round(partial * sel * report[f"state_rows_{second}"])
    report["input_rows"] = sum(rows)
    return report


def run(policy, op, reports, initial):
    """Feed one snapshot per round; apply the policy's plan_id decisions; the plans that ran per round."""
    control = {op: {"plan_id": initial}}
    ran, decisions = [], []
    for batch, make in enumerate(reports, start=1):
        plan = control[op]["plan_id"]
        ran.append(plan)
        stats = OperatorStats(op, batch, 0, 0, float("nan"), float("nan"), report=make(plan))
        snap = Snapshot(float(batch), {"q": QueryInfo("q", operators={op: stats}, control={op: dict(control[op])})})
        out = policy.decide(snap)
        decisions.append(out)
        for d in out:
            assert d.operator == op and set(d.changes) == {"plan_id"} and d.query == "q"
            control[op] = {"plan_id": d.changes["plan_id"]}
    return ran, decisions


def chain_rounds(n_low=15, n_high=15):
    sels = [{"a": 0.1, "b": 0.5}] * n_low + [{"a": 0.9, "b": 0.5}] * n_high
    return [lambda plan, s=s: chain_report(plan, s) for s in sels]


def test_om_switches_a_chain_when_selectivity_drifts():
    policy = create("om", k=10, d=3, decay=0.5)
    ran, decisions = run(policy, "filter", chain_rounds(), "b>a")
    # a selective cheap predicate first (a>b) while sel(a) = 0.1, then b first once sel(a) = 0.9
    assert ran[2:15] == ["a>b"] * 13 and ran[-8:] == ["b>a"] * 8
    status = policy.status()["q/filter"]
    assert status["switches"] == 2 and status["moves"] >= 1 and status["plan"] == "b>a"
    assert status["rounds"] == 30 and 0.8 <= status["fidelity"] < 1.0     # misses: the rounds after each change
    reasons = [d.reason for out in decisions for d in out]
    assert len(reasons) == 2 and all(r.startswith("om: estimate sel=") for r in reasons)


def test_om_is_deterministic_and_resumes_from_pickle():
    rounds = chain_rounds(8, 8)
    a, b = create("om", d=2), create("om", d=2)
    assert run(a, "filter", rounds, "b>a") == run(b, "filter", rounds, "b>a")
    c = create("om", d=2)
    run(c, "filter", rounds[:5], "b>a")
    copy = pickle.loads(pickle.dumps(c))
    assert copy.status() == c.status()
    assert run(copy, "filter", rounds[5:], "a>b") == run(c, "filter", rounds[5:], "a>b")


def test_static_never_switches_after_warmup_and_rand_is_seeded():
    static = StaticPolicy(warmup=3)
    ran, _ = run(static, "filter", chain_rounds(), "b>a")
    assert ran[:3] == ["b>a"] * 3 and set(ran[4:]) == {"a>b"}           # RATE: chosen once, never switched
    st = static.status()["q/filter"]
    assert st["switches"] == 1 and st["fidelity"] == pytest.approx(12 / 30)
    rand = RandPolicy(seed=3)
    ran_r, _ = run(rand, "filter", chain_rounds(), "b>a")
    assert len(set(ran_r)) == 2 and run(RandPolicy(seed=3), "filter", chain_rounds(), "b>a")[0] == ran_r
    om_fid = run(p := OMPolicy(d=3), "filter", chain_rounds(), "b>a") and p.status()["q/filter"]["fidelity"]
    assert om_fid > rand.status()["q/filter"]["fidelity"] and om_fid > st["fidelity"]


def test_om_picks_left_deep_join_plans_by_rates():
    """A λ-λ chart over the three inputs' rates: the chosen plan is the one the OM cost ranks best at the
    rates observed once they have settled."""
    phases = [(100, 100, 2000)] * 8 + [(2000, 100, 100)] * 8 + [(100, 2000, 100)] * 8
    reports = [lambda plan, r=r: join_report(plan, r) for r in phases]
    policy = OMPolicy(k=6, d=2, join_cost=1e-5, ranges={"funnel": {f"rate:{i}": (0, 2400) for i in range(3)}})
    ran, _ = run(policy, "funnel", reports, ps.left_deep_plans(3)[0])
    state = policy._ops[("q", "funnel")]
    assert set(ran) <= set(ps.left_deep_plans(3))
    for end in (8, 16, 24):
        rates = phases[end - 1]
        best = state.model.best({f"rate:{i}": rates[i] for i in range(3)})
        assert ran[end - 1] == best
    status = policy.status()["q/funnel"]
    assert status["switches"] >= 1 and status["fidelity"] >= 0.7


def test_policies_ignore_other_operators_and_unregistered_ones():
    policy = create("om")
    stats = OperatorStats("agg", 3, report={"input_rows": 10, "output_rows": 1, "state_rows": 5})
    chain = OperatorStats("filter", 3, report=chain_report("a>b", {"a": 0.5, "b": 0.5}))
    snap = Snapshot(1.0, {"q": QueryInfo("q", operators={"agg": stats, "filter": chain}, control={"agg": {}})})
    assert len(policy.decide(snap)) == 0 and policy.status() == {}


@pytest.mark.parametrize("kwargs, message", [
    ({"w_r": -1.0}, "w_r must be >= 0"),
    ({"w_r": 0.0, "w_m": 0.0}, "must not both be 0"),
    ({"k": 0}, "k must be"),
    ({"d": 0}, "d must be"),
    ({"span": 1.0}, "span must be > 1"),
    ({"ranges": {"f": {"sel": (0.5, 0.2)}}}, r"must be a non-empty \[low, high\]"),
    ({"ranges": {"f": {"sel": (0.0, 2.0)}}}, r"must lie in \[0, 1\]"),
    ({"ranges": {"f": {"size": (0.0, 2.0)}}}, "unknown dimension 'size'"),
    ({"ranges": {"f": {"rate": 5}}}, r"must be a \(low, high\) pair"),
    ({"chart_predicate": "a"}, "chart_predicate must be a mapping"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        OMPolicy(**kwargs)


def test_bad_ranges_and_predicates_named_at_the_operator():
    rounds = chain_rounds(3, 0)
    with pytest.raises(ValueError, match=r"chart_predicate\['filter'\] = 'zz' is not a predicate"):
        run(OMPolicy(chart_predicate={"filter": "zz"}), "filter", rounds, "a>b")
    with pytest.raises(ValueError, match=r"ranges\['filter'\] names unknown dimension"):
        run(OMPolicy(ranges={"filter": {"rate:0": (1, 2)}}), "filter", rounds, "a>b")


def test_chart_rebuilt_when_a_held_estimate_drifts():
    """sel(b) is held in a's sel-λ chart: when it moves beyond `rebuild` the chart is rebuilt (and the
    best order follows b); the chart's own axis (sel(a)) moving does not rebuild."""
    sels = [{"a": 0.3, "b": 0.5}] * 4 + [{"a": 0.6, "b": 0.5}] * 4 + [{"a": 0.6, "b": 0.9}] * 6
    policy = OMPolicy(d=1, rebuild=0.3)
    ran, _ = run(policy, "filter", [lambda plan, s=s: chain_report(plan, s) for s in sels], "a>b")
    status = policy.status()["q/filter"]
    assert status["rebuilds"] == 1
    assert ran[5:8] == ["b>a"] * 3 and ran[-4:] == ["a>b"] * 4


def test_remove_forgets_a_query():
    policy = OMPolicy(d=1)
    run(policy, "filter", chain_rounds(2, 0), "a>b")
    assert "q/filter" in policy.status()
    assert len(policy.remove("q")) == 0 and policy.status() == {}
    with pytest.raises(TypeError, match="query must be"):
        policy.remove(3)


def test_a_plan_without_output_costs_infinity():
    """A measured selectivity of 0 (kept just above 0) makes w_r/C_r huge, not an error; memory only, that
    order holds nearly nothing."""
    from pyspark_cq_plugins.om import PlanModel

    held = {"sel:a": 0.0, "sel:b": 0.5, "cost:a": 0.0, "cost:b": 0.0}
    m = PlanModel(ps.SELECT_CHAIN, ("a>b", "b>a"), ("sel", "rate"), held, 1.0, 0.4, 0.6, ("a", "b"), "b")
    costs = [m.cost(p, {"sel": 0.5, "rate": 100.0}) for p in m.plans]       # both orders output ~nothing
    assert all(1e6 < c < float("inf") for c in costs)
    m0 = PlanModel(ps.SELECT_CHAIN, ("a>b", "b>a"), ("sel", "rate"), held, 1.0, 0.0, 1.0, ("a", "b"), "b")
    assert m0.cost("a>b", {"sel": 0.5, "rate": 100.0}) == pytest.approx(0.0, abs=1e-6)
    assert m0.cost("b>a", {"sel": 0.5, "rate": 100.0}) == pytest.approx(50.0)


def test_join_model_is_checked():
    from pyspark_cq_plugins.om import JOIN_MODELS, OMPolicy
    from pyspark_cq_plugins.plan_baselines import StaticPolicy

    assert JOIN_MODELS == ("mjoin", "tree")
    assert OMPolicy().join_model == "mjoin" and OMPolicy(join_model="tree").join_model == "tree"
    for cls in (OMPolicy, StaticPolicy):
        with pytest.raises(ValueError, match="join_model"):
            cls(join_model="bushy")
