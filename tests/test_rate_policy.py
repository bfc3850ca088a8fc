"""The rate-based policy plugin (Viglas & Naughton §4) on synthetic operator reports, and the join-tree choice
for binary interval joins; its Spark run is tests/test_rate_policy_spark.py."""
import itertools

import pytest
from pyspark_cq_plugins.rate_based import RateBased, choose_join_tree

from pyspark_cq import plan as P
from pyspark_cq import policies
from pyspark_cq.control import join_plan_id, parse_join_plan
from pyspark_cq.cost import rate as R
from pyspark_cq.policies import OperatorStats, QueryInfo, Snapshot
from pyspark_cq.policies import plan_stats as S
from pyspark_cq.policies.checks import check_policy

ROWS = (10, 400, 200)           # rows per batch: input 1 fast, input 0 slow
STATES = (50, 2000, 1000)
SEL = 0.01                       # every pair (one shared key)
SLOW_PLAN = "0:1>2;1:2>0;2:1>0"  # the left-deep order (1, 2, 0): input 1 probes the big state of 2 first
FAST_PLAN = "0:1>2;1:0>2;2:0>1"  # (0, 1, 2): input 1 probes the small state of 0 first


def join_report(plan_id):
    """The counters a multi_join running ``plan_id`` reports when every step keeps SEL of state·partials."""
    report = {"input_rows": sum(ROWS), "output_rows": 0}
    for i, order in enumerate(parse_join_plan(plan_id, 3)):
        report[f"input_rows_{i}"] = ROWS[i]
        report[f"state_rows_{i}"] = STATES[i]
        partial = float(ROWS[i])
        for j in order:
            report[f"probed_{i}_{j}"] = int(round(partial))
            partial *= STATES[j] * SEL
            report[f"matched_{i}_{j}"] = int(round(partial))
        report["output_rows"] += int(round(partial))
    return report


def join_snapshot(batches, plan_id, time=None):
    report = join_report(plan_id)
    stats = OperatorStats("mj", batches=batches, input_rows=report["input_rows"], output_rows=report["output_rows"],
                          input_rate=float(sum(ROWS)), report=report)
    info = QueryInfo("q", operators={"mj": stats}, control={"mj": {"plan_id": plan_id}}, batches=batches,
                     input_rate=float(sum(ROWS)), batch_duration=2.0)
    return Snapshot(float(batches if time is None else time), {"q": info})


def test_registered_and_passes_the_check_suite():
    assert "rate" in policies.available(load=True)
    for params in RateBased._unit_test_params():
        check_policy(policies.create("rate", **params))


@pytest.mark.parametrize("objective", ["rate", "time"])
def test_switches_the_join_to_the_cheaper_probe_orders(objective):
    policy = RateBased(objective=objective, margin=0.1, min_batches=1)
    out = policy.decide(join_snapshot(1, SLOW_PLAN))
    assert [(d.operator, d.changes, d.query) for d in out] == [("mj", {"plan_id": FAST_PLAN}, "q")]
    assert out.policy == "rate" and "Viglas & Naughton" in out[0].reason
    scores = policy.predictions[("q", "mj")]
    best = max(scores, key=scores.get) if objective == "rate" else min(scores, key=scores.get)
    assert best == FAST_PLAN and set(scores) == {"0:1>2;1:0>2;2:0>1", "0:2>1;1:0>2;2:0>1", SLOW_PLAN}
    # after the switch the new plan runs: no decision back (no flapping)
    for b in range(2, 6):
        assert list(policy.decide(join_snapshot(b, FAST_PLAN))) == []


def test_predictions_follow_the_model():
    """The scores are the rate model's: one arrival of input 1 costs 1 + 20 (partials after state 2) probes
    under the slow plan and 1 + 0.5 under the fast one (per-probe costs, ``scan=False``)."""
    policy = RateBased(probe_cost=1e-3, min_batches=1, margin=0.0, scan=False)
    policy.decide(join_snapshot(1, SLOW_PLAN))
    scores = policy.predictions[("q", "mj")]
    probes_1 = {SLOW_PLAN: 1 + STATES[2] * SEL, FAST_PLAN: 1 + STATES[0] * SEL}
    for plan_id, p1 in probes_1.items():
        orders = parse_join_plan(plan_id, 3)
        # every step keeps SEL of state·partials whatever is bound (one shared key): conditional = SEL
        cond = {(j, frozenset(k for k in range(3) if k != j)): SEL for j in range(3)}
        pairs = {frozenset(p): SEL for p in [(0, 1), (0, 2), (1, 2)]}
        model = R.MultiJoinModel(tuple(float(r) for r in ROWS), pairs, cond, states=STATES, growth=(0, 0, 0),
                                 probe_cost=1e-3)
        assert model.arrival_costs(orders, 30.0)[1] == pytest.approx(1e-3 * p1)
        assert scores[plan_id] == pytest.approx(model.local_rate_estimate(orders, 60.0), rel=1e-6)


def test_hysteresis_and_min_batches():
    assert list(RateBased(margin=1e6).decide(join_snapshot(1, SLOW_PLAN))) == []
    policy = RateBased(margin=0.0, min_batches=3)
    assert len(policy.decide(join_snapshot(1, SLOW_PLAN))) == 1
    # the control table did not take the change yet (still the slow plan): not again within 3 batches
    assert list(policy.decide(join_snapshot(2, SLOW_PLAN))) == []
    assert list(policy.decide(join_snapshot(3, SLOW_PLAN))) == []
    assert len(policy.decide(join_snapshot(4, SLOW_PLAN))) == 1
    # a repeated batch adds nothing
    assert list(policy.decide(join_snapshot(4, SLOW_PLAN))) == []


def chain_snapshot(batches, plan_id, rows=1000):
    # Figure 1: two predicates of selectivity 0.1; s1 costs 1/50 s per row, s2 (nearly) nothing; 500 rows/s
    order = plan_id.split(">")
    cost = {"s1": 20_000_000, "s2": 1}        # nanoseconds per row
    report, alive = {"input_rows": rows}, rows
    for p in order:
        report[f"rows_in_{p}"] = alive
        report[f"nanos_{p}"] = alive * cost[p]
        alive //= 10
        report[f"rows_passed_{p}"] = alive
    stats = OperatorStats("ch", batches=batches, input_rows=rows, output_rows=alive, input_rate=500.0, report=report)
    return Snapshot(float(batches), {"q": QueryInfo("q", operators={"ch": stats}, control={"ch": {"plan_id": plan_id}})})


@pytest.mark.parametrize("objective", ["rate", "time"])
def test_figure_1_chain_switch(objective):
    policy = RateBased(objective=objective, n=100.0, min_batches=1)
    out = policy.decide(chain_snapshot(1, "s1>s2"))
    assert [d.changes for d in out] == [{"plan_id": "s2>s1"}]
    scores = policy.predictions[("q", "ch")]
    if objective == "rate":
        assert scores["s1>s2"] == pytest.approx(0.5, rel=1e-3) and scores["s2>s1"] == pytest.approx(5.0, rel=1e-3)
    else:
        assert scores["s1>s2"] == pytest.approx(200.0, rel=1e-3) and scores["s2>s1"] == pytest.approx(20.0, rel=1e-3)
    assert list(policy.decide(chain_snapshot(2, "s2>s1"))) == []


def test_policy_bad_arguments():
    with pytest.raises(ValueError, match="objective"):
        RateBased(objective="fast")
    with pytest.raises(ValueError, match="t_p"):
        RateBased(t_p=0)
    with pytest.raises(ValueError, match="n must"):
        RateBased(n=-1)
    with pytest.raises(ValueError, match="margin"):
        RateBased(margin=-0.1)
    with pytest.raises(ValueError, match="min_batches"):
        RateBased(min_batches=0)
    with pytest.raises(ValueError, match="probe_cost"):
        RateBased(probe_cost=0)
    with pytest.raises(TypeError, match="snapshot"):
        RateBased().decide({})


# --------------------------------------------------------------------------- binary join trees (§5.2)

# Viglas & Naughton §5.2: A ⋈ B and A ⋈ C (Table 5: 2·10⁻³, 5·10⁻³ with a 5 ms handling cost); inter-arrival
# delays 20 ms (A), 2 ms (B), 10 ms (C)
RATES_52 = {"A": 50.0, "B": 500.0, "C": 100.0}
AB, AC = 2e-3, 5e-3
COSTS = R.JoinCosts(move=1e-4, hash=1e-4, probe=1e-4)


def plans_52():
    a, b, c = P.Source("A"), P.Source("B"), P.Source("C")
    ab_c = P.Join(P.Join(a, b, selectivity=AB), c, selectivity=AC, right_cost=5e-3)
    ac_b = P.Join(P.Join(a, c, selectivity=AC, right_cost=5e-3), b, selectivity=AB)
    return ab_c, ac_b


def test_join_tree_choice_follows_local_rate_and_time():
    plans = list(plans_52())
    for t_p in (1.0, 10.0, 100.0):
        best, value = choose_join_tree(plans, RATES_52, t_p=t_p, costs=COSTS)
        scores = [R.local_rate_estimate(p, RATES_52, t_p, costs=COSTS) for p in plans]
        assert value == max(scores) and best == plans[scores.index(max(scores))]
    for n in (100.0, 10_000.0):
        best, value = choose_join_tree(plans, RATES_52, objective="time", n=n, costs=COSTS)
        times = [R.local_time_estimate(p, RATES_52, n, costs=COSTS) for p in plans]
        assert value == min(times) and best == plans[times.index(min(times))]
    sizes = {"A": 5_000, "B": 10_000, "C": 20_000}       # Table 4
    best, value = choose_join_tree(plans, RATES_52, objective="time", fraction=0.25, sizes=sizes, costs=COSTS)
    n = 0.25 * AB * AC * 5_000 * 10_000 * 20_000
    assert value == pytest.approx(min(R.local_time_estimate(p, RATES_52, n, sizes=sizes, costs=COSTS) for p in plans))


def test_join_tree_bad_input():
    plans = list(plans_52())
    with pytest.raises(ValueError, match="t_p"):
        choose_join_tree(plans, RATES_52, t_p=0)
    with pytest.raises(ValueError, match=r"rates\['B'\]"):
        choose_join_tree(plans, {**RATES_52, "B": 0.0}, t_p=1.0)
    with pytest.raises(ValueError, match="no rate for stream 'C'"):
        choose_join_tree(plans, {"A": 1.0, "B": 1.0}, t_p=1.0)
    with pytest.raises(ValueError, match="fraction"):
        choose_join_tree(plans, RATES_52, objective="time", fraction=1.5, sizes={"A": 1, "B": 1, "C": 1})
    with pytest.raises(ValueError, match="n must"):
        choose_join_tree(plans, RATES_52, objective="time", n=-3)
    with pytest.raises(ValueError, match="does not match the query"):
        choose_join_tree(plans + [P.Join(P.Source("A"), P.Source("D"), selectivity=0.1)], RATES_52, t_p=1.0)
    with pytest.raises(ValueError, match="objective"):
        choose_join_tree(plans, RATES_52, objective="cost", t_p=1.0)
    with pytest.raises(ValueError, match="needs t_p"):
        choose_join_tree(plans, RATES_52, n=5.0)


def test_scan_costs_a_probe_per_state_row():
    """With ``scan`` (the default) a probe of state j costs probe_cost per row of |S_j|: one arrival of input 1
    scans state 2 then, per partial, state 0 under the slow plan (and state 0 then state 2 under the fast one)."""
    policy = RateBased(probe_cost=1e-6, min_batches=1, margin=0.0)
    policy.decide(join_snapshot(1, SLOW_PLAN))
    scores = policy.predictions[("q", "mj")]
    cond = {(j, frozenset(k for k in range(3) if k != j)): SEL for j in range(3)}
    pairs = {frozenset(p): SEL for p in [(0, 1), (0, 2), (1, 2)]}
    model = R.MultiJoinModel(tuple(float(r) for r in ROWS), pairs, cond, states=STATES, growth=(0, 0, 0),
                             probe_cost=1e-6, scan=True)
    slow = parse_join_plan(SLOW_PLAN, 3)
    scanned_1 = STATES[2] + STATES[2] * SEL * STATES[0]
    assert model.arrival_costs(slow, 30.0)[1] == pytest.approx(1e-6 * scanned_1)
    for plan_id, score in scores.items():
        assert score == pytest.approx(model.local_rate_estimate(parse_join_plan(plan_id, 3), 60.0), rel=1e-6)
    with pytest.raises(TypeError, match="scan"):
        RateBased(scan="yes")


# §5.3's 5-way chain C–A–B–D–E (inputs A…E = 0…4): bands only between C–A, A–B, B–D, D–E, one key of 100
# values. A step into an input banded to a bound input keeps the band's share of the key's rows; a step into
# one with no band to the bound inputs (the kernel checks no band there) keeps every row of the key.
CHAIN_EDGES = [("A", "C"), ("A", "B"), ("B", "D"), ("D", "E")]
CHAIN_BAND = {frozenset((0, 2)): 0.0625, frozenset((0, 1)): 0.025, frozenset((1, 3)): 0.00125,
              frozenset((3, 4)): 0.000125}
CHAIN_KEY = 0.01
CHAIN_ROWS = (1500, 15000, 3000, 7500, 30000)
CHAIN_STATES = (3000, 30000, 6000, 15000, 60000)


def chain_true_selectivity(j, bound):
    """f(j | B) as the kernel meets it: the key, times the band of every bound input linked to j."""
    f = CHAIN_KEY
    for b in bound:
        f *= CHAIN_BAND.get(frozenset((b, j)), 1.0)
    return f


def chain_true_work(orders):
    """State rows the partial matches of one batch meet under ``orders`` (the oracle: the kernel's scans)."""
    work = 0.0
    for i, order in enumerate(orders):
        partial, bound = float(CHAIN_ROWS[i]), {i}
        for j in order:
            work += partial * CHAIN_STATES[j]
            partial *= CHAIN_STATES[j] * chain_true_selectivity(j, bound)
            bound.add(j)
    return work


def five_way_snapshot(batches, orders, bands=True):
    report = {"input_rows": sum(CHAIN_ROWS), "output_rows": 0}
    if bands:
        report.update({f"banded_{min(p)}_{max(p)}": 1 for p in CHAIN_BAND})
    for i, order in enumerate(orders):
        report[f"input_rows_{i}"] = CHAIN_ROWS[i]
        report[f"state_rows_{i}"] = CHAIN_STATES[i]
        partial, bound = float(CHAIN_ROWS[i]), {i}
        for j in order:
            report[f"probed_{i}_{j}"] = int(round(partial))
            partial *= CHAIN_STATES[j] * chain_true_selectivity(j, bound)
            report[f"matched_{i}_{j}"] = int(round(partial))
            bound.add(j)
    plan_id = join_plan_id(orders)
    stats = OperatorStats("mj", batches=batches, input_rows=report["input_rows"], output_rows=0,
                          input_rate=float(sum(CHAIN_ROWS)), report=report)
    info = QueryInfo("q", operators={"mj": stats}, control={"mj": {"plan_id": plan_id}}, batches=batches,
                     input_rate=float(sum(CHAIN_ROWS)), batch_duration=10.0)
    return Snapshot(float(batches), {"q": info})


def left_deep_chain_orders():
    s = P.Source
    left_deep = P.Join(P.Join(P.Join(P.Join(s("A"), s("C")), s("B")), s("D")), s("E"))
    return R.tree_probe_orders(left_deep, "ABCDE", CHAIN_EDGES)


def test_chain_never_switches_to_a_key_only_step():
    """On the 5-way chain the loosest-pair assumption (an unmeasured pair as selective as A–C) made a plan
    whose steps enter an input with no band to the bound ones look best (measured on Spark: A probing D
    first, 7.7–11× the static plans' time). With the operator's bounds graph the policy offers only plans
    without such steps, and the one it picks does less work than the running plan by the oracle's count."""
    start = left_deep_chain_orders()
    assert not S.key_only_steps(start, frozenset(CHAIN_BAND))
    policy = RateBased(t_p=2.0, margin=0.1, min_batches=1)
    out = policy.decide(five_way_snapshot(1, start))
    scores = policy.predictions[("q", "mj")]
    for plan_id in scores:
        assert S.key_only_steps(parse_join_plan(plan_id, 5), frozenset(CHAIN_BAND)) == [], plan_id
    assert len(out) == 1
    chosen = parse_join_plan(out[0].changes["plan_id"], 5)
    assert chain_true_work(chosen) < chain_true_work(start)
    # the best orders without a key-only step, by brute force over each input's orders against the oracle
    best = []
    for i in range(5):
        ok = [o for o in itertools.permutations([j for j in range(5) if j != i])
              if not S.key_only_steps([()] * i + [o], frozenset(CHAIN_BAND))]
        best.append(min(ok, key=lambda o, i=i: chain_true_work([()] * i + [o])))
    assert chain_true_work(chosen) <= chain_true_work(best) * 1.5


def test_chain_without_the_bounds_graph_trusts_the_loosest_pair():
    """The same report without ``banded_<i>_<j>`` (an unknown graph): the policy keeps its old candidates
    (the left-deep orders) and picks one with key-only steps, the failure measured on Spark."""
    policy = RateBased(t_p=2.0, margin=0.1, min_batches=1)
    out = policy.decide(five_way_snapshot(1, left_deep_chain_orders(), bands=False))
    assert len(out) == 1
    chosen = parse_join_plan(out[0].changes["plan_id"], 5)
    assert S.key_only_steps(chosen, frozenset(CHAIN_BAND))
    assert chain_true_work(chosen) > chain_true_work(left_deep_chain_orders())


def test_reset_factor_forgets_estimates_when_an_input_rate_changes():
    """With ``reset_factor`` a batch whose rows on some input differ from their estimate by more than the
    factor restarts the operator's estimates from that batch; a smaller change, or none given, keeps them."""
    def snap(batches, rows_1):
        s = join_snapshot(batches, FAST_PLAN)
        s.queries["q"].operators["mj"].report["input_rows_1"] = rows_1
        return s

    for factor, rows_1, resets in ((4.0, 4000, [("q", "mj", 4)]), (4.0, 1200, []), (None, 4000, [])):
        policy = RateBased(reset_factor=factor, min_batches=1)
        for b in (1, 2, 3):
            policy.decide(snap(b, ROWS[1]))
        policy.decide(snap(4, rows_1))
        policy.decide(snap(4, rows_1))            # the same batch again: nothing new
        assert policy.resets == resets
        estimate = policy._est[("q", "mj")].get("rows:1")
        assert (estimate == rows_1) == bool(resets)
    with pytest.raises(ValueError, match="reset_factor"):
        RateBased(reset_factor=1.0)
    with pytest.raises(ValueError, match="reset_factor"):
        RateBased(reset_factor=-2)
