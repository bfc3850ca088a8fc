"""OM cost model (Kulkarni & Ravishankar §3.2, §4.1): utility, output rates, memory, plan choice."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq import plan as P
from pyspark_cq.cost import om


def test_section_3_2_example():
    # plan 1: C_r = 5.0, C_m = 775; plan 2: C_r = 2.5, C_m = 575
    assert om.utility(5.0, 775, 0.1, 0.9) == pytest.approx(697.52)
    assert om.utility(2.5, 575, 0.1, 0.9) == pytest.approx(517.54)
    assert om.utility(5.0, 775, 20000, 2) == pytest.approx(5550)
    assert om.utility(2.5, 575, 20000, 2) == pytest.approx(9150)
    # assignment 1 chooses plan 2, assignment 2 plan 1
    costs = {"p1": (5.0, 775), "p2": (2.5, 575)}
    assert min(costs, key=lambda p: om.utility(*costs[p], 0.1, 0.9)) == "p2"
    assert min(costs, key=lambda p: om.utility(*costs[p], 20000, 2)) == "p1"


def figure_2_plans():
    """o1: selectivity 0.5, 500 tuples/s; o2: selectivity 0.1, 50 tuples/s (§1.2)."""
    s = P.Source("S")
    o1_first = P.Select(P.Select(s, 0.5, cost=1 / 500, label="o1"), 0.1, cost=1 / 50, label="o2")
    o2_first = P.Select(P.Select(s, 0.1, cost=1 / 50, label="o2"), 0.5, cost=1 / 500, label="o1")
    return o1_first, o2_first


@pytest.mark.parametrize("lam", [100, 250, 500])
def test_figure_2_output_rates(lam):
    # the rate-optimal plan runs o1 first (C_r = 5.0); o2 first gives C_r = 2.5 (§3.2), for any λ >= 100
    o1_first, o2_first = figure_2_plans()
    assert om.cost_plan(o1_first, {"S": lam}, 1.0).output_rate == pytest.approx(5.0)
    assert om.cost_plan(o2_first, {"S": lam}, 1.0).output_rate == pytest.approx(2.5)


def test_memory_hand_worked():
    o1_first, _ = figure_2_plans()
    cost = om.cost_plan(o1_first, {"S": 100}, 2.0)
    # breadth first from the root: OM label o1 is the root (the node labelled "o2" here)
    assert [op.label for op in cost.operators] == ["o1", "o2"]
    assert [op.node.label for op in cost.operators] == ["o2", "o1"]
    root, bottom = cost.operators
    # bottom: λ = 100, tpr = 500: c_inp = 100·(100·2/500) = 40, c_r = 50, c_int = 100
    assert (bottom.arrival_rate, bottom.input_buffer, bottom.output_rate, bottom.intermediate_queue) == \
        pytest.approx((100, 40, 50, 100))
    # root: λ = 50, tpr = 50: c_inp = 50·(50·2/50) = 100, c_r = 5, c_int = 10
    assert (root.input_buffer, root.output_rate, root.intermediate_queue) == pytest.approx((100, 5, 10))
    assert cost.memory == pytest.approx(250)
    assert cost.utility(0.1, 0.9) == pytest.approx(0.1 / 5 + 0.9 * 250)


def test_operator_formulas():
    assert om.selection_output_rate(100, 0.3) == pytest.approx(30)
    assert om.selection_output_rate(100, 0.3, tpr=40) == pytest.approx(12)
    assert om.projection_output_rate(100, tpr=1000) == 100
    assert om.aggregate_output_rate(100, 5, 0.001) == pytest.approx(1 / (0.001 * 100 * 5))
    # sel·λ_L·λ_R·W / (C_L·λ_L + C_R·λ_R)
    assert om.join_output_rate(10, 20, 0.01, 5, 0.02, 0.03) == pytest.approx(0.01 * 10 * 20 * 5 / (0.2 + 0.6))
    assert om.input_buffer(100, 2, 500) == pytest.approx(40)
    assert om.intermediate_queue(5, 2) == 10


def test_join_and_aggregate_plan():
    plan = P.Aggregate(P.Join(P.Source("L"), P.Source("R"), selectivity=0.01, left_cost=0.02, right_cost=0.03),
                       cost=0.001)
    cost = om.cost_plan(plan, {"L": 10, "R": 20}, 5)
    agg, join = cost.operators
    join_rate = 0.01 * 10 * 20 * 5 / (0.2 + 0.6)
    assert join.output_rate == pytest.approx(join_rate)
    # both inputs (30 tuples/s) arrive during the 5·(0.2 + 0.6) = 4 s spent on a window
    assert join.input_buffer == pytest.approx(30 * 4)
    assert agg.output_rate == pytest.approx(1 / (0.001 * join_rate * 5))
    assert agg.input_buffer == pytest.approx(join_rate * join_rate * 5 * 0.001)
    assert cost.output_rate == agg.output_rate
    assert cost.memory == pytest.approx(sum(o.input_buffer + o.intermediate_queue for o in cost.operators))


def test_best_plan_matches_brute_force():
    q = P.Query(streams=("TCP", "UDP", "SF"),
                selections={"TCP": [P.Predicate(0.2, cost=1 / 400e3)]},
                projections={"UDP": 1 / 500e3},
                joins={("TCP", "UDP"): P.JoinPredicate(0.01, arrival_cost=1 / 3e3),
                       ("UDP", "SF"): P.JoinPredicate(0.02, arrival_cost=1 / 3e3)})
    plans = [p for p in P.enumerate_plans(q) if all(
        not isinstance(n, P.Join) or n.left_cost > 0 for n in P.postorder(p))]
    rates = {"TCP": 500, "UDP": 300, "SF": 100}
    for weights in [(0.4, 0.6), (1e6, 1e-3), (1e-3, 1.0)]:
        best, value = om.best_plan(plans, rates, 1.0, *weights)
        assert value == min(om.plan_utility(p, rates, 1.0, *weights) for p in plans)
        assert value == om.plan_utility(best, rates, 1.0, *weights)


def test_validation():
    with pytest.raises(ValueError, match="output_rate"):
        om.utility(0, 1, 1, 1)
    with pytest.raises(ValueError, match="w_m"):
        om.utility(1, 1, 1, -1)
    with pytest.raises(ValueError, match="cost"):
        om.cost_plan(P.Aggregate(P.Source("A")), {"A": 1}, 1)
    with pytest.raises(ValueError, match="left_cost"):
        om.cost_plan(P.Join(P.Source("A"), P.Source("B")), {"A": 1, "B": 1}, 1)
    with pytest.raises(ValueError, match="'B'"):
        om.cost_plan(P.Select(P.Source("B"), 0.5), {"A": 1}, 1)
    with pytest.raises(ValueError, match="window"):
        om.cost_plan(P.Select(P.Source("A"), 0.5), {"A": 1}, 0)
    with pytest.raises(ValueError, match="operator"):
        om.cost_plan(P.Window(P.Source("A"), 5), {"A": 1}, 1)
    with pytest.raises(ValueError, match="tpr"):
        om.selection_output_rate(1, 0.5, tpr=0)


@settings(max_examples=50, deadline=None)
@given(c_r=st.floats(1e-3, 1e4), c_m=st.floats(0, 1e6), w_r=st.floats(1e-3, 1e3), w_m=st.floats(1e-3, 1e3),
       k=st.floats(1.01, 10))
def test_utility_monotone(c_r, c_m, w_r, w_m, k):
    base = om.utility(c_r, c_m, w_r, w_m)
    # Strictly better / worse in each term alone; in the sum one term can vanish in the other's rounding
    # (e.g. w_r/c_r = 2e-6 next to w_m·c_m = 1.3e8), so there only the weak order holds.
    assert om.utility(c_r * k, 0.0, w_r, w_m) < om.utility(c_r, 0.0, w_r, w_m)  # a higher output rate is better
    assert om.utility(c_r * k, c_m, w_r, w_m) <= base
    assert om.utility(c_r, c_m * k + 1, 0.0, w_m) > om.utility(c_r, c_m, 0.0, w_m)  # more memory is worse
    assert om.utility(c_r, c_m * k + 1, w_r, w_m) >= base
