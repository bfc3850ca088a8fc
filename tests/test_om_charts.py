"""OM's charts (§4.4, Algorithm 1), scheduler (§4.5, Algorithm 2) and plan costing of our operators."""
import itertools
import math
import pickle

import numpy as np
import pytest

from pyspark_cq.cost import om
from pyspark_cq.estimators import DecayedMean
from pyspark_cq.policies import plan_stats as ps


def test_section_3_2_example_through_a_chart():
    """§3.2: p1 (C_r 5.0, C_m 775) and p2 (C_r 2.5, C_m 575) cost 697.52 / 517.54 with (0.1, 0.9), so p2 is
    chosen, and 5550 / 9150 with (20000, 2), so p1 is; a chart built with each weighting indexes that plan
    everywhere, and Algorithm 2 schedules it every round with fidelity 1."""
    figures = {"p1": (5.0, 775.0), "p2": (2.5, 575.0)}
    for (w_r, w_m), costs, chosen in [((0.1, 0.9), (697.52, 517.54), "p2"), ((20000, 2), (5550.0, 9150.0), "p1")]:
        def cost(p, point, w_r=w_r, w_m=w_m):
            return om.utility(*figures[p], w_r, w_m)
        assert (cost("p1", {}), cost("p2", {})) == pytest.approx(costs)
        chart = om.sel_lambda_chart((0, 1), (0, 100), 3, ["p1", "p2"], cost)
        assert set(chart.table.ravel().tolist()) == {["p1", "p2"].index(chosen)}
        run = om.schedule(chart, [{"sel": 0.5, "rate": 50}] * 4, cost)
        assert run.plans == (chosen,) * 3 and run.fidelity == 1.0 and run.switches == 0


def test_section_1_2_plans_rates():
    """Figure 2's plans as select_chain orders: C_r 5.0 and 2.5 (§3.2) at λ = 100, W = 2."""
    sels, costs = {"o1": 0.5, "o2": 0.1}, {"o1": 1 / 500, "o2": 1 / 50}
    assert om.cost_plan(om.chain_plan(["o1", "o2"], sels, costs), {"S": 100}, 2.0).output_rate == 5.0
    assert om.cost_plan(om.chain_plan(["o2", "o1"], sels, costs), {"S": 100}, 2.0).output_rate == 2.5


def chain_memory(order, sel_a, lam, sel_b=0.5, c=0.01, window=1.0):
    """By hand, §4.1 for two selections that keep up (λ <= tpr = 1/c): c_inp = λ²W·c, c_int = sel·λ·W."""
    s = {"a": sel_a, "b": sel_b}
    first, second = order
    lam2 = s[first] * lam
    return (lam * lam * window * c + lam2 * window) + (lam2 * lam2 * window * c + s[second] * lam2 * window)


def test_hand_checked_sel_lambda_chart():
    """A 2 × 2 sel-λ chart of a chain of a (the sel axis) and b (sel 0.5), both at 0.01 s/row, memory only
    (w_r = 0, w_m = 1), over sel ∈ [0, 1], λ ∈ [0, 40]. By hand, M(a>b) − M(b>a) = 0.01·sel²λ² + sel·λ −
    0.0025·λ² − 0.5·λ: at the centroids (0.25, 10) −2.6875, (0.25, 30) −9.1875, (0.75, 10) +2.8125,
    (0.75, 30) +10.3125: a>b where a is selective, b>a where it is not."""
    def cost(plan, point):
        order = plan.split(">")
        node = om.chain_plan(order, {"a": point["sel"], "b": 0.5}, {"a": 0.01, "b": 0.01})
        return om.cost_plan(node, {"S": point["rate"]}, 1.0).utility(0.0, 1.0)

    for sel, lam, diff in [(0.25, 10, -2.6875), (0.25, 30, -9.1875), (0.75, 10, 2.8125), (0.75, 30, 10.3125)]:
        point = {"sel": sel, "rate": lam}
        assert cost("a>b", point) == pytest.approx(chain_memory("ab", sel, lam))
        assert cost("a>b", point) - cost("b>a", point) == pytest.approx(diff)
    chart = om.sel_lambda_chart((0, 1), (0, 40), 2, ["a>b", "b>a"], cost)
    assert chart.table.tolist() == [[0, 0], [1, 1]]
    assert [chart.centroid(r) for r in [(0, 0), (1, 1)]] == [{"sel": 0.25, "rate": 10.0}, {"sel": 0.75, "rate": 30.0}]
    assert chart.lookup(0.1, 39.9) == "a>b" and chart.lookup(0.5, 0) == "b>a"      # 0.5 starts region 1
    assert chart.lookup(-3, 1e9) == "a>b" and chart.lookup(7, -1) == "b>a"         # outside: edge regions
    assert chart.costs.shape == (2, 2, 2)


def test_lambda_lambda_chart_three_way_join():
    """A λ-λ chart of a 3-way join (k³ regions) of the left-deep plans indexes at every centroid the plan
    that costs least there by the OM formulas."""
    pairs = {frozenset((0, 1)): 1e-3, frozenset((0, 2)): 1e-3, frozenset((1, 2)): 1e-3}
    plans = ps.left_deep_plans(3)

    def cost(plan, point):
        node = om.left_deep_join_plan(ps.left_deep_order(plan, 3), pairs, 1e-4)
        return om.cost_plan(node, {f"s{i}": point[f"rate:{i}"] for i in range(3)}, 1.0).utility(0.4, 0.6)

    chart = om.lambda_lambda_chart({f"rate:{i}": (10, 1000) for i in range(3)}, 3, plans, cost)
    assert chart.table.shape == (3, 3, 3)
    for region in itertools.product(range(3), repeat=3):
        c = chart.centroid(region)
        assert chart.lookup(*c.values()) == min(plans, key=lambda p: cost(p, c))
    assert len(set(chart.table.ravel().tolist())) == 3          # the rates decide: every plan wins somewhere
    # the plan is symmetric in the streams: swapping the rates of inputs 0 and 1 swaps them in the plan
    flip = {0: 1, 1: 0, 2: 2}
    orders = ps.left_deep_orders(3)
    swap = {}
    for p in plans:
        o = tuple(flip[i] for i in ps.left_deep_order(p, 3))
        swap[p] = plans[orders.index(tuple(sorted(o[:2])) + o[2:])]
    for rates in [(990, 15, 600), (15, 600, 990), (500, 40, 900)]:   # distinct centroids: no ties
        assert chart.lookup(rates[1], rates[0], rates[2]) == swap[chart.lookup(*rates)]


def reference_schedule(dims, k, plans, cost, observed, d, decay):
    """Algorithm 2 written out plainly: the estimate by the §4.3 sum, the region by scanning the partitions."""
    regions, chosen = [], []
    for r in range(1, len(observed)):
        est = []
        for dim, _, _ in dims:
            xs = [observed[r - 1 - j][dim] for j in range(min(d, r))]
            g = [math.exp(-decay * j) for j in range(len(xs))]
            est.append(sum(x * w for x, w in zip(xs, g)) / sum(g))
        region = []
        for (_, lo, hi), x in zip(dims, est):
            i = 0
            while i < k - 1 and x >= lo + (i + 1) * (hi - lo) / k:
                i += 1
            region.append(i)
        centroid = {name: lo + (i + 0.5) * (hi - lo) / k for (name, lo, hi), i in zip(dims, region)}
        regions.append(tuple(region))
        chosen.append(min(plans, key=lambda p: cost(p, centroid)))
    hits = []
    for r, p in zip(range(1, len(observed)), chosen):
        costs = {q: cost(q, observed[r]) for q in plans}
        hits.append(costs[p] <= min(costs.values()) + 1e-12 * abs(min(costs.values())))
    return chosen, regions, hits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schedule_matches_plain_reference(seed):
    rng = np.random.default_rng(seed)
    plans = ["x", "y", "z"]
    weights = {"x": (1.0, 0.0), "y": (0.0, 1.0), "z": (0.5, 0.5)}

    def cost(p, c):
        a, b = weights[p]
        return a * c["sel"] * 3 + b * c["rate"] / 100 + (0.2 if p == "z" else 0)

    dims = [("sel", 0.0, 1.0), ("rate", 0.0, 300.0)]
    observed = [{"sel": float(s), "rate": float(r)}
                for s, r in zip(np.clip(0.5 + np.cumsum(rng.normal(0, 0.1, 60)), -0.1, 1.1),
                                np.abs(150 + np.cumsum(rng.normal(0, 30, 60))))]
    chart = om.Chart(dims, 7, plans, cost)
    run = om.schedule(chart, observed, cost, d=4, decay=0.3)
    chosen, regions, hits = reference_schedule(dims, 7, plans, cost, observed, 4, 0.3)
    assert list(run.plans) == chosen and list(run.regions) == regions and list(run.hits) == hits
    assert run.moves == sum(a != b for a, b in zip(regions, regions[1:]))
    assert run.switches == sum(a != b for a, b in zip(chosen, chosen[1:]))
    assert run.fidelity == pytest.approx(sum(hits) / len(hits))
    assert run.fidelity_over(10)[0] == pytest.approx(sum(hits[:10]) / 10)


def test_score_baselines():
    cost = lambda p, c: c["sel"] if p == "x" else 0.5          # noqa: E731
    obs = [{"sel": s} for s in (0.1, 0.9, 0.9, 0.1)]
    run = om.score_plans(["x", "x", "y", "y"], obs, ["x", "y"], cost)
    assert run.hits == (True, False, True, False) and run.switches == 1 and run.moves == 0
    assert run.optimal == ("x", "y", "y", "x")
    with pytest.raises(ValueError, match="not among the candidates"):
        om.score_plans(["w"] * 4, obs, ["x", "y"], cost)
    with pytest.raises(ValueError, match="rounds"):
        om.score_plans(["x"], obs, ["x", "y"], cost)


def test_lookup_is_region_then_table_and_pickles():
    chart = om.Chart([("a", -1, 1), ("b", 0, 5), ("c", 2, 3)], 4, list(range(5)),
                     lambda p, c: abs(c["a"] * 3 + c["b"] - c["c"] - p))
    rng = np.random.default_rng(3)
    copy = pickle.loads(pickle.dumps(chart))
    for _ in range(500):
        x = (rng.uniform(-1.5, 1.5), rng.uniform(-1, 6), rng.uniform(1.5, 3.5))
        assert chart.lookup(*x) == chart.plans[chart.table[chart.region(*x)]] == copy.lookup(*x)


def test_decayed_mean_is_the_estimator():
    """schedule() estimates with DecayedMean (§4.3), the estimator the plugin uses too."""
    est = DecayedMean(3, 0.5)
    for x in (1.0, 5.0, 2.0, 8.0):
        est.update(x)
    g = [math.exp(-0.5 * j) for j in range(3)]
    assert est.value == pytest.approx((8 * g[0] + 2 * g[1] + 5 * g[2]) / sum(g))


def test_bad_input():
    cost = lambda p, c: 1.0                                    # noqa: E731
    with pytest.raises(ValueError, match="k must be"):
        om.Chart([("sel", 0, 1)], 0, ["x"], cost)
    with pytest.raises(ValueError, match=r"range of 'rate' must be a non-empty \[low, high\]"):
        om.Chart([("rate", 5, 5)], 2, ["x"], cost)
    with pytest.raises(ValueError, match=r"range of 'rate' must be a non-empty"):
        om.sel_lambda_chart((0, 1), (10, 1), 2, ["x"], cost)
    with pytest.raises(ValueError, match="sel_range must lie within"):
        om.sel_lambda_chart((0, 2), (0, 1), 2, ["x"], cost)
    with pytest.raises(ValueError, match="plans must be a non-empty"):
        om.Chart([("sel", 0, 1)], 2, [], cost)
    with pytest.raises(ValueError, match="twice"):
        om.Chart([("sel", 0, 1)], 2, ["x", "x"], cost)
    with pytest.raises(ValueError, match="rate_ranges must give"):
        om.lambda_lambda_chart({}, 2, ["x"], cost)
    with pytest.raises(ValueError, match=r"rate_ranges\['s'\] must be rates >= 0"):
        om.lambda_lambda_chart({"s": (-1, 2)}, 2, ["x"], cost)
    with pytest.raises(ValueError, match="w_r must be >= 0|w_r must be"):
        om.utility(1.0, 1.0, -0.1, 0.5)
    with pytest.raises(ValueError, match="selectivities has no value for predicate 'c'"):
        om.chain_plan(["a", "c"], {"a": 0.5}, {})
    with pytest.raises(ValueError, match="rates has no rate for stream 'T'"):
        om.cost_plan(om.chain_plan(["a"], {"a": 0.5}, {}, stream="T"), {"S": 1.0}, 1.0)
    with pytest.raises(ValueError, match="streams must name 3 inputs"):
        om.left_deep_join_plan((0, 1, 2), {frozenset((0, 1)): 0.1}, 1e-3, ["a", "b"])
    with pytest.raises(ValueError, match="no selectivity between input 2"):
        om.left_deep_join_plan((0, 1, 2), {frozenset((0, 1)): 0.1}, 1e-3)
    with pytest.raises(ValueError, match="permutation of 0..2"):
        om.left_deep_join_plan((0, 1, 1), {}, 1e-3)
    chart = om.Chart([("sel", 0, 1)], 2, ["x"], cost)
    with pytest.raises(ValueError, match=r"observed\[1\] must be a mapping with the values \['sel'\]"):
        om.schedule(chart, [{"sel": 0.1}, {"rate": 1}], cost)
    with pytest.raises(ValueError, match="at least 2 rounds"):
        om.schedule(chart, [{"sel": 0.1}], cost)
    with pytest.raises(ValueError, match="point must give 1 values"):
        chart.region(0.1, 0.2)


def _mjoin_reference(orders, lam, pairs, w, cost):
    """A plain re-statement of the MJoin costing: per probe step queue out·W and buffer a²·W·cost·|S_j|."""
    mem = out_total = 0.0
    for i, order in enumerate(orders):
        a, bound = lam[i], [i]
        for j in order:
            tpr = 1.0 / (cost * max(lam[j] * w, 1.0))
            out = min(a, tpr) * lam[j] * w * min(pairs[frozenset((b, j))] for b in bound)
            mem += a * a * w / tpr + out * w
            a, bound = out, bound + [j]
        out_total += a
    return out_total, mem


def test_mjoin_plan_cost_hand_checked_and_ranks_the_probe_steps():
    from pyspark_cq.control.plans import parse_join_plan

    pairs = {frozenset({0, 1}): 0.1, frozenset({0, 2}): 0.01, frozenset({1, 2}): 0.1}
    # order (0, 1, 2) at λ = (10, 100, 10), W = 1, 1e-6 s per state row: input 0 meets 100·0.1 = 10 rows of 1
    # (100 partials), then 10·0.01 of 2 (10 outputs); 1 meets 1 of 0 (100), then 0.1 of 2 (10); 2 meets 0.1
    # of 0 (1), then 10 of 1 (10): queues 231, buffers 0.311
    cost = om.mjoin_plan_cost(((1, 2), (0, 2), (0, 1)), (10, 100, 10), pairs, 1.0, 1e-6)
    assert cost.output_rate == pytest.approx(30.0)
    assert cost.memory == pytest.approx(231.311)
    assert [op.label for op in cost.operators] == ["o1", "0>1", "0>2", "1>0", "1>2", "2>0", "2>1"]
    for lam in [(1500, 15000, 1500), (15000, 1500, 15000), (300, 200, 900)]:
        for plan in ps.left_deep_plans(3):
            orders = parse_join_plan(plan, 3)
            c = om.mjoin_plan_cost(orders, lam, pairs, 2.0, 1e-7)
            ref = _mjoin_reference(orders, lam, pairs, 2.0, 1e-7)
            assert (c.output_rate, c.memory) == pytest.approx(ref)
    # where the tree misranks our operator: fast inputs 0 and 2, slow 1, selective pairs. The tree ranks
    # (0, 2, 1) best; in our kernel that plan has every row of 0 walk 2's large state and every row of 2 walk
    # 0's: the MJoin cost ranks it worst and puts the plan that probes the slow input 1 first, (1, 2, 0), ahead.
    tiny = {p: 1e-5 for p in pairs}
    lam = (15000, 1500, 15000)
    mj = {p: om.mjoin_plan_cost(parse_join_plan(p, 3), lam, tiny, 1.0, 1e-9).utility(0.4, 0.6)
          for p in ps.left_deep_plans(3)}
    tree = {p: om.cost_plan(om.left_deep_join_plan(ps.left_deep_order(p, 3), tiny, 1e-9),
                            {f"s{i}": r for i, r in enumerate(lam)}, 1.0).utility(0.4, 0.6) for p in ps.left_deep_plans(3)}
    assert min(mj, key=mj.get) == "0:1>2;1:2>0;2:1>0"
    assert min(tree, key=tree.get) == "0:2>1;1:0>2;2:0>1" == max(mj, key=mj.get)


def test_mjoin_plan_cost_bad_input():
    pairs = {frozenset({0, 1}): 0.1, frozenset({0, 2}): 0.1, frozenset({1, 2}): 0.1}
    orders = ((1, 2), (0, 2), (0, 1))
    with pytest.raises(TypeError, match="rates"):
        om.mjoin_plan_cost(orders, (1.0,), pairs, 1.0, 1e-6)
    with pytest.raises(ValueError, match=r"rates\[1\]"):
        om.mjoin_plan_cost(orders, (1.0, -2.0, 1.0), pairs, 1.0, 1e-6)
    with pytest.raises(ValueError, match=r"probe_orders\[1\]"):
        om.mjoin_plan_cost(((1, 2), (0, 0), (0, 1)), (1, 1, 1), pairs, 1.0, 1e-6)
    with pytest.raises(TypeError, match="probe_orders"):
        om.mjoin_plan_cost(((1, 2),), (1, 1, 1), pairs, 1.0, 1e-6)
    with pytest.raises(ValueError, match="inputs 1 and 2"):
        om.mjoin_plan_cost(orders, (1, 1, 1), {frozenset({0, 1}): 0.1, frozenset({0, 2}): 0.1}, 1.0, 1e-6)
    with pytest.raises(ValueError, match="pair_selectivity"):
        om.mjoin_plan_cost(orders, (1, 1, 1), {**pairs, frozenset({0, 1}): 1.5}, 1.0, 1e-6)
    with pytest.raises(ValueError, match="window"):
        om.mjoin_plan_cost(orders, (1, 1, 1), pairs, 0.0, 1e-6)
    with pytest.raises(ValueError, match="probe_cost"):
        om.mjoin_plan_cost(orders, (1, 1, 1), pairs, 1.0, 0.0)
    with pytest.raises(TypeError, match="state_rows"):
        om.mjoin_plan_cost(orders, (1, 1, 1), pairs, 1.0, 1e-6, state_rows=(1, 2))
