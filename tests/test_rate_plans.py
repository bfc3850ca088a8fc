"""Rate-based choice among the plans of plan-switchable operators (Viglas & Naughton §3–§4.2): a chain of
selections (Figure 1), a multi-way join's probe orders, checked against plain-Python references."""
import itertools
import math

import pytest

from pyspark_cq.cost import rate
from pyspark_cq.cost.rate import MultiJoinModel

FIG1_SEL = {"s1": 0.1, "s2": 0.1}
FIG1_COST = {"s1": 1 / 50, "s2": 0.0}      # σ1 handles 50 rows/s, σ2 keeps up with anything


def simulate_chain(order, sel, cost, rows=100_000):
    """Reference: push ``rows`` rows through the predicates, a deterministic fraction passing each one."""
    total, alive = 0.0, float(rows)
    for p in order:
        total += alive * cost[p]
        alive *= sel[p]
    return total / rows, alive / rows


# --------------------------------------------------------------------------- Figure 1, §3.2


def test_figure_1_chain_orders():
    # Fig. 1(a): σ1 first transmits 0.5 outputs/s; (b): σ2 first, 5 outputs/s — the ten-fold improvement
    assert rate.chain_output_rate(500, ["s1", "s2"], FIG1_SEL, FIG1_COST) == pytest.approx(0.5)
    assert rate.chain_output_rate(500, ["s2", "s1"], FIG1_SEL, FIG1_COST) == pytest.approx(5.0)
    order, best = rate.best_chain_order(500, FIG1_SEL, FIG1_COST)
    assert order == ("s2", "s1") and best == pytest.approx(5.0)
    # the same numbers as the plan-level model of two Select nodes (one formula, two entry points)
    from pyspark_cq import plan as P
    fast_first = P.Select(P.Select(P.Source("I"), 0.1), 0.1, cost=1 / 50)
    assert rate.plan_output_rate(fast_first, {"I": 500}, 0) == pytest.approx(best)


def test_chain_cost_against_simulation():
    sel = {"a": 0.5, "b": 0.2, "c": 0.9}
    cost = {"a": 3e-6, "b": 1e-5, "c": 1e-7}
    for order in itertools.permutations(sel):
        per_row, passed = simulate_chain(order, sel, cost)
        assert rate.chain_cost(order, sel, cost) == pytest.approx(per_row)
        r = 1e6
        expected = passed * r if per_row * r <= 1 else passed / per_row
        assert rate.chain_output_rate(r, order, sel, cost) == pytest.approx(expected)
    # the best order by brute force
    best = max(itertools.permutations(sorted(sel)), key=lambda o: rate.chain_output_rate(1e6, o, sel, cost))
    assert rate.best_chain_order(1e6, sel, cost)[0] == best


def test_chain_bad_input():
    with pytest.raises(ValueError, match="rate"):
        rate.chain_output_rate(0, ["s1", "s2"], FIG1_SEL, FIG1_COST)
    with pytest.raises(ValueError, match="rate"):
        rate.best_chain_order(-5, FIG1_SEL, FIG1_COST)
    with pytest.raises(ValueError, match=r"selectivities\['s1'\]"):
        rate.chain_cost(["s1", "s2"], {"s1": 1.5, "s2": 0.1}, FIG1_COST)
    with pytest.raises(ValueError, match="does not match the query"):
        rate.chain_cost(["s1", "s3"], FIG1_SEL, FIG1_COST)
    with pytest.raises(ValueError, match="does not match the query"):
        rate.chain_cost(["s1"], FIG1_SEL, FIG1_COST)
    with pytest.raises(ValueError, match="same, non-empty set"):
        rate.chain_cost(["s1", "s2"], FIG1_SEL, {"s1": 0.0})
    with pytest.raises(ValueError, match=r"costs\['s2'\]"):
        rate.chain_cost(["s1", "s2"], FIG1_SEL, {"s1": 0.0, "s2": -1.0})


# --------------------------------------------------------------------------- multi-way join


def test_two_inputs_reduce_to_equation_2():
    # unbounded states (the paper's join): P_l = f·r_r·t, so Σ r_i·P_i = 2·f·r_l·r_r·t; Equation 2 is the
    # average rate over [0, t], half of it, with the same denominator r_l·C_l + r_r·C_r
    m = MultiJoinModel((2.0, 4.0), {frozenset({0, 1}): 0.5}, arrival_cost=0.4, probe_cost=0.1)
    plan = ((1,), (0,))
    for t in (0.5, 3.0, 10.0):
        c_l, c_r = m.arrival_costs(plan, t)
        assert c_l == c_r == pytest.approx(0.5)         # one arrival: stored, one probe
        assert m.output_rate(plan, t) == pytest.approx(2 * rate.join_output_rate(2, 4, 0.5, c_l, c_r, t))
    # without costs its integral is the number of qualifying pairs by t_p: f·(r_l·t_p)·(r_r·t_p)
    free = MultiJoinModel((2.0, 4.0), {frozenset({0, 1}): 0.5})
    assert free.outputs_by_time(plan, 10.0) == pytest.approx(0.5 * 20 * 40)
    assert free.time_to_outputs(plan, 400.0) == pytest.approx(10.0)


def brute_rate(rates, sel, orders, t, states, growth, probe, arrival):
    """Reference: walk each input's probe order, counting partial matches and probes."""
    out = busy = 0.0
    for i, order in enumerate(orders):
        partial, probes, bound = 1.0, 0.0, [i]
        for j in order:
            probes += partial
            f = 1.0
            for b in bound:
                f *= sel.get(frozenset({b, j}), 1.0)
            partial *= (states[j] + growth[j] * t) * f
            bound.append(j)
        out += rates[i] * partial
        busy += rates[i] * (arrival + probe * probes)
    return out / max(busy, 1.0)


def all_plans(n):
    per = [list(itertools.permutations([j for j in range(n) if j != i])) for i in range(n)]
    return [tuple(c) for c in itertools.product(*per)]


# the §5.2 query shape: A ⋈ B and A ⋈ C, B the fastest stream
SEL_52 = {frozenset({0, 1}): 2e-3, frozenset({0, 2}): 5e-3}
RATES_52 = (50.0, 500.0, 100.0)


def test_multi_join_against_reference_and_brute_force_best():
    m = MultiJoinModel(RATES_52, SEL_52, states=(100.0, 0.0, 20.0), growth=(10.0, 500.0, 0.0),
                       probe_cost=2e-4, arrival_cost=1e-4)
    plans = all_plans(3)
    for t in (1.0, 30.0):
        rates_ = {p: m.output_rate(p, t) for p in plans}
        for p in plans:
            assert rates_[p] == pytest.approx(brute_rate(RATES_52, SEL_52, p, t, m.states, m.growth, 2e-4, 1e-4))
        # the outputs do not depend on the plan: the rates differ only by the denominators
        ideal = [m.output_rate(p, t) * max(1.0, sum(r * c for r, c in zip(RATES_52, m.arrival_costs(p, t))))
                 for p in plans]
        assert max(ideal) == pytest.approx(min(ideal))
    best, value = m.best_orders(t_p=60.0)
    brute = max(plans, key=lambda p: m.local_rate_estimate(p, 60.0))
    assert value == pytest.approx(m.local_rate_estimate(brute, 60.0))
    assert m.local_rate_estimate(best, 60.0) == pytest.approx(m.output_rate(best, 30.0))
    # a row of B (the fast stream) probes A (selective) before C (no predicate with B)
    assert best[1] == (0, 2)


def test_multi_join_time_objective():
    m = MultiJoinModel(RATES_52, SEL_52, probe_cost=1e-3, arrival_cost=1e-4)
    plans = all_plans(3)
    n = 5_000.0
    best, t_best = m.best_orders(n=n)
    times = {p: m.time_to_outputs(p, n) for p in plans}
    assert t_best == pytest.approx(min(times.values()), rel=1e-6)
    assert m.outputs_by_time(best, t_best) == pytest.approx(n, rel=1e-6)
    # candidates restrict the choice
    worst = max(plans, key=times.get)
    assert m.best_orders(n=n, candidates=[worst])[0] == worst


def test_best_orders_within_allowed_orders():
    """``allowed`` restricts each input's choice; the result is the brute-force best of the allowed plans."""
    m = MultiJoinModel(RATES_52, SEL_52, states=(100.0, 0.0, 20.0), growth=(10.0, 500.0, 0.0),
                       probe_cost=2e-4, arrival_cost=1e-4, scan=True)
    assert m.best_orders(t_p=60.0)[0][1] == (0, 2)
    allowed = [[(1, 2), (2, 1)], [(2, 0)], [(0, 1), (1, 0)]]       # input 1 must probe C first
    best, value = m.best_orders(t_p=60.0, allowed=allowed)
    plans = list(itertools.product(*allowed))
    brute = max(plans, key=lambda p: m.local_rate_estimate(p, 60.0))
    assert best[1] == (2, 0) and value == pytest.approx(m.local_rate_estimate(brute, 60.0))
    assert m.best_orders(n=5_000.0, allowed=allowed)[0][1] == (2, 0)
    with pytest.raises(ValueError, match="at most one of candidates and allowed"):
        m.best_orders(t_p=1.0, allowed=allowed, candidates=[best])
    with pytest.raises(ValueError, match=r"allowed\[1\]"):
        m.best_orders(t_p=1.0, allowed=[[(1, 2)], [], [(0, 1)]])
    with pytest.raises(ValueError, match=r"allowed\[0\]"):
        m.best_orders(t_p=1.0, allowed=[[(1, 1)], [(0, 2)], [(0, 1)]])
    with pytest.raises(ValueError, match="per input"):
        m.best_orders(t_p=1.0, allowed=[[(1, 2)]])


def test_conditional_overrides_the_product():
    m = MultiJoinModel((1.0, 1.0, 1.0), {frozenset({0, 1}): 0.5, frozenset({1, 2}): 0.5, frozenset({0, 2}): 0.5},
                       conditional={(2, frozenset({0, 1})): 0.5})
    assert m.selectivity(2, frozenset({0, 1})) == 0.5            # measured, not 0.25
    assert m.selectivity(1, frozenset({0, 2})) == 0.25


def test_multi_join_bad_input():
    with pytest.raises(ValueError, match=r"rates\[1\]"):
        MultiJoinModel((1.0, 0.0))
    with pytest.raises(ValueError, match=r"rates\[0\]"):
        MultiJoinModel((-1.0, 2.0))
    with pytest.raises(TypeError, match="rates"):
        MultiJoinModel((1.0,))
    with pytest.raises(ValueError, match="selectivities"):
        MultiJoinModel((1.0, 1.0), {frozenset({0, 1}): 1.5})
    with pytest.raises(ValueError, match="selectivities keys"):
        MultiJoinModel((1.0, 1.0), {frozenset({0, 5}): 0.5})
    with pytest.raises(ValueError, match="conditional"):
        MultiJoinModel((1.0, 1.0, 1.0), conditional={(0, frozenset({0, 1})): 0.5})
    with pytest.raises(TypeError, match="growth"):
        MultiJoinModel((1.0, 1.0), growth=(1.0,))
    with pytest.raises(ValueError, match="probe_cost"):
        MultiJoinModel((1.0, 1.0), probe_cost=-1)
    m = MultiJoinModel(RATES_52, SEL_52)
    with pytest.raises(ValueError, match="does not match the query"):
        m.output_rate(((1, 2), (0, 2), (1, 1)), 1.0)
    with pytest.raises(ValueError, match="one probe order per input"):
        m.output_rate(((1, 2), (0, 2)), 1.0)
    with pytest.raises(ValueError, match="t_p"):
        m.local_rate_estimate(((1, 2), (0, 2), (0, 1)), 0.0)
    with pytest.raises(ValueError, match="exactly one objective"):
        m.best_orders()
    with pytest.raises(ValueError, match="exactly one objective"):
        m.best_orders(t_p=1.0, n=5.0)
    with pytest.raises(ValueError, match="n must be > 0"):
        m.best_orders(n=0)
    assert math.isinf(MultiJoinModel((1.0, 1.0), {frozenset({0, 1}): 0.0}).time_to_outputs(((1,), (0,)), 5.0))


def test_per_arrival_conditionals_and_measured_outputs():
    # with time bands the rows a probe meets depend on the arriving input: keyed (i, j, B)
    m = MultiJoinModel((1.0, 1.0, 1.0), {frozenset({0, 1}): 0.5},
                       conditional={(1, 0, frozenset({1})): 0.1, (0, frozenset({1})): 0.3},
                       states=(10.0, 10.0, 10.0), growth=(0.0, 0.0, 0.0))
    assert m.selectivity(0, frozenset({1}), 1) == 0.1      # for rows arriving on 1
    assert m.selectivity(0, frozenset({1}), 2) == 0.3      # for any other arriving input
    assert m.selectivity(0, frozenset({1})) == 0.3
    # measured outputs per arrival replace the product, and scale with the states as they grow
    grown = MultiJoinModel((1.0, 2.0), {frozenset({0, 1}): 0.5}, states=(4.0, 8.0), growth=(4.0, 8.0),
                           outputs=(3.0, 1.0))
    plan = ((1,), (0,))
    assert grown.output_rate(plan, 0.0) == pytest.approx(1.0 * 3.0 + 2.0 * 1.0)
    assert grown.output_rate(plan, 1.0) == pytest.approx(2 * (1.0 * 3.0 + 2.0 * 1.0))   # states doubled
    with pytest.raises(ValueError, match="conditional keys"):
        MultiJoinModel((1.0, 1.0, 1.0), conditional={(2, 0, frozenset({1})): 0.5})   # i not bound
    with pytest.raises(TypeError, match="outputs"):
        MultiJoinModel((1.0, 1.0), outputs=(1.0,))
    with pytest.raises(ValueError, match=r"outputs\[1\]"):
        MultiJoinModel((1.0, 1.0), outputs=(1.0, -1.0))


# --------------------------------------------------------------------------- join trees on one processor, §5.3


def _fig11():
    from pyspark_cq import plan as P

    s = P.Source
    ac = P.Join(s("A"), s("C"), selectivity=0.5)
    left_deep = P.Join(P.Join(P.Join(ac, s("B"), selectivity=0.2), s("D"), selectivity=0.1), s("E"), selectivity=0.01)
    evenly = P.Join(P.Join(P.Join(s("B"), s("D"), selectivity=0.1), s("E"), selectivity=0.01), ac, selectivity=0.2)
    return left_deep, evenly


def test_plan_work_sums_each_joins_arrival_costs():
    left_deep, evenly = _fig11()
    r = {"A": 2.0, "B": 10.0, "C": 4.0, "D": 5.0, "E": 20.0}
    unit = rate.JoinCosts(move=1.0)
    # by hand: every join handles its children's unhindered output rates at t = 1, one unit per arrival
    ac = 0.5 * 2 * 4
    acb = 0.2 * ac * 10
    acbd = 0.1 * acb * 5
    assert rate.plan_work(left_deep, r, 1.0, costs=unit) == pytest.approx((2 + 4) + (ac + 10) + (acb + 5) + (acbd + 20))
    bd = 0.1 * 10 * 5
    bde = 0.01 * bd * 20
    assert rate.plan_work(evenly, r, 1.0, costs=unit) == pytest.approx((10 + 5) + (bd + 20) + (2 + 4) + (bde + ac))
    # Table 3's costs of each join's method, and the nodes' own costs, are added per arrival
    costs = rate.JoinCosts(move=1.0, hash=2.0, probe=3.0)
    assert rate.plan_work(evenly, r, 1.0, costs=costs) == pytest.approx(6 * rate.plan_work(evenly, r, 1.0, costs=unit))
    from pyspark_cq import plan as P

    j = P.Join(P.Source("A"), P.Source("B"), selectivity=0.1, left_cost=0.5, method="nested_loops")
    cl, cr = rate.join_arrival_costs("nested_loops", 2, 10, 3.0, rate.JoinCosts(move=1, comp=0.1))
    assert rate.plan_work(j, {"A": 2, "B": 10}, 3.0, costs=rate.JoinCosts(move=1, comp=0.1)) == pytest.approx(
        2 * (cl + 0.5) + 10 * cr)
    assert rate.plan_work(j, {"A": 2, "B": 10}, 0.0) == pytest.approx(2 * 0.5)      # no join cost: only its own
    with pytest.raises(ValueError, match="t"):
        rate.plan_work(j, {"A": 2, "B": 10}, -1.0)
    with pytest.raises(ValueError, match="'B'"):
        rate.plan_work(j, {"A": 2}, 1.0)


def test_tree_probe_orders_follow_the_tree_and_the_predicates():
    left_deep, evenly = _fig11()
    edges = [("A", "C"), ("A", "B"), ("B", "D"), ("D", "E")]
    # Left Deep: E (at the top) probes D, B, A, C going down the chain; A probes C, then B, D, E
    assert rate.tree_probe_orders(left_deep, "ABCDE", edges) == (
        (2, 1, 3, 4), (0, 2, 3, 4), (0, 1, 3, 4), (1, 0, 2, 4), (3, 1, 0, 2))
    # Evenly Spread: B meets D, E, then the A⋈C subtree from A (joined to B), C last
    orders = rate.tree_probe_orders(evenly, ["A", "B", "C", "D", "E"], edges)
    assert orders[1] == (3, 4, 0, 2)
    assert orders[0] == (2, 1, 3, 4)
    for i, o in enumerate(orders):     # every order is a permutation of the other inputs
        assert sorted(o) == [j for j in range(5) if j != i]
    with pytest.raises(ValueError, match="does not match the query"):
        rate.tree_probe_orders(evenly, "ABCDF", edges)
    with pytest.raises(ValueError, match="edges"):
        rate.tree_probe_orders(evenly, "ABCDE", [("A", "Z")])
