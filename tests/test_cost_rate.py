"""Rate-based model (Viglas & Naughton): §3 output rates, Table 3, Equations 2 and 3, §4.2 heuristics."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq import plan as P
from pyspark_cq.cost import rate
from pyspark_cq.cost.rate import JoinCosts


def riemann(fn, t_p, steps=5_000):
    """Plain midpoint rule, the independent reference for Equation 3."""
    h = t_p / steps
    return sum(fn((i + 0.5) * h) for i in range(steps)) * h


def eq2(f, r_l, r_r, c_l, c_r, t):
    """Equation 2 written out: f·r_l·r_r·t / max(1, r_l·C_l + r_r·C_r)."""
    return f * r_l * r_r * t / max(1.0, r_l * c_l + r_r * c_r)


# --------------------------------------------------------------------------- §3.1, §3.2: Figure 1


def test_figure_1_selection_orders():
    # two selections of selectivity 0.1 over 500 inputs/s; σ1 handles 50 inputs/s, σ2 is free
    src = P.Source("I")
    slow_first = P.Select(P.Select(src, 0.1, cost=1 / 50), 0.1)
    fast_first = P.Select(P.Select(src, 0.1), 0.1, cost=1 / 50)
    assert rate.plan_output_rate(slow_first, {"I": 500}, 0) == pytest.approx(0.5)   # Fig. 1(a)
    assert rate.plan_output_rate(fast_first, {"I": 500}, 0) == pytest.approx(5.0)   # Fig. 1(b)
    plans = P.enumerate_plans(P.Query(streams=("I",), selections={"I": [P.Predicate(0.1, cost=1 / 50),
                                                                        P.Predicate(0.1)]}),
                              group_selections=False)
    best, value = rate.best_plan_by_rate(plans, {"I": 500}, t_p=10)
    assert best == fast_first and value == pytest.approx(5.0)
    best, time = rate.best_plan_by_time(plans, {"I": 500}, 100)
    assert best == fast_first and time == pytest.approx(100 / 5.0)


def test_unary_regimes():
    assert rate.projection_output_rate(100, 0.005) == 100          # C <= 1/r
    assert rate.projection_output_rate(100, 0.01) == 100           # boundary: C = 1/r
    assert rate.projection_output_rate(100, 0.02) == pytest.approx(50)  # C > 1/r: 1/C
    assert rate.selection_output_rate(100, 0.3, 0.005) == pytest.approx(30)
    assert rate.selection_output_rate(100, 0.3, 0.02) == pytest.approx(15)  # f/C
    assert rate.selection_output_rate(100, 0.3) == pytest.approx(30)
    with pytest.raises(ValueError, match="selectivity"):
        rate.selection_output_rate(100, 1.3)
    with pytest.raises(ValueError, match="input_rate"):
        rate.projection_output_rate(-1)


# --------------------------------------------------------------------------- Equation 2 and Table 3


def test_equation_2():
    # r_l·C_l + r_r·C_r = 0.3 < 1: the denominator is 1
    assert rate.join_output_rate(10, 20, 0.01, 0.01, 0.01, 5) == pytest.approx(0.01 * 200 * 5)
    # = 3: f·r_l·r_r·t/3
    assert rate.join_output_rate(10, 20, 0.01, 0.1, 0.1, 5) == pytest.approx(2 * 5 / 3)
    assert rate.join_output_rate(10, 20, 0.01, 0.1, 0.1, 5, exact=True) == pytest.approx(2 * 4 / 3)
    assert rate.join_output_rate(10, 20, 0.01, 0.01, 0.01, 5, saturate=False) == pytest.approx(10 / 0.3)
    assert rate.join_output_rate(10, 20, 1.0, 0, 0, 0.5, exact=True) == 0      # t - 1 < 0
    with pytest.raises(ValueError, match="left_cost"):
        rate.join_output_rate(10, 20, 0.5, 0, 0, 1, saturate=False)
    with pytest.raises(ValueError, match="t"):
        rate.join_output_rate(10, 20, 0.5, 0, 0, -1)


def test_table_3():
    costs = JoinCosts(move=1, comp=2, hash=3, probe=4)
    assert rate.join_arrival_costs("nested_loops", 10, 20, 3, costs) == (1 + 20 * 3 * 2, 1 + 10 * 3 * 2)
    assert rate.join_arrival_costs("hash", 10, 20, 3, costs) == (8, 8)
    with pytest.raises(ValueError, match="method"):
        rate.join_arrival_costs("grace", 1, 1, 1)
    with pytest.raises(ValueError, match="comp"):
        JoinCosts(comp=-1)


# --------------------------------------------------------------------------- Equation 3


CASES = [
    # method, r_l, r_r, f, costs, extra
    ("hash", 10, 20, 0.01, JoinCosts(move=0.001, hash=0.001, probe=0.001), 0.0),   # never saturated
    ("hash", 10, 20, 0.01, JoinCosts(move=0.05, hash=0.02, probe=0.03), 0.0),      # always saturated
    ("nested_loops", 10, 20, 0.01, JoinCosts(move=0.01, comp=0.0005), 0.0),       # saturates at t = 2.35
    ("nested_loops", 5, 8, 0.2, JoinCosts(move=0.2, comp=0.001), 0.05),           # saturated from the start
    ("nested_loops", 5, 8, 0.2, JoinCosts(), 0.0),                                 # no cost at all
]


@pytest.mark.parametrize("method, r_l, r_r, f, costs, extra", CASES)
def test_equation_3_closed_form(method, r_l, r_r, f, costs, extra):
    def rate_at(t):
        c_l, c_r = rate.join_arrival_costs(method, r_l, r_r, t, costs)
        return eq2(f, r_l, r_r, c_l + extra, c_r + extra, t)

    for t_p in (0.5, 3.0, 40.0):
        closed = rate.join_outputs_by_time(r_l, r_r, f, t_p, method=method, costs=costs, left_cost=extra,
                                           right_cost=extra)
        assert closed == pytest.approx(riemann(rate_at, t_p), rel=2e-5)
        assert rate.outputs_by_time(rate_at, t_p) == pytest.approx(closed, rel=1e-8)
        plan = P.Join(P.Source("L"), P.Source("R"), selectivity=f, method=method, left_cost=extra, right_cost=extra)
        by_plan = rate.plan_outputs_by_time(plan, {"L": r_l, "R": r_r}, t_p, costs=costs)
        assert by_plan == pytest.approx(closed, rel=1e-8)


def test_time_to_n_outputs():
    # symmetric hash join, saturated: outputs = K·t²/(2·D), so t = sqrt(2·N·D/K)
    costs = JoinCosts(move=0.05, hash=0.02, probe=0.03)
    r_l, r_r, f = 10.0, 20.0, 0.01
    busy = r_l * 0.1 + r_r * 0.1
    k = f * r_l * r_r
    plan = P.Join(P.Source("L"), P.Source("R"), selectivity=f)
    for n in (1, 100, 12_345):
        expected = math.sqrt(2 * n * busy / k)
        by_plan = rate.plan_time_to_outputs(plan, {"L": r_l, "R": r_r}, n, costs=costs)
        assert by_plan == pytest.approx(expected, rel=1e-6)
        assert rate.time_to_outputs(
            n, lambda t: rate.join_outputs_by_time(r_l, r_r, f, t, costs=costs)) == pytest.approx(expected, rel=1e-7)
    assert rate.plan_time_to_outputs(plan, {"L": 0.0, "R": r_r}, 5) == math.inf
    assert rate.time_to_outputs(0, lambda t: t) == 0


# --------------------------------------------------------------------------- §4.2 heuristics


def test_local_rate_maximization_is_rate_at_half_horizon():
    plan = P.Join(P.Join(P.Source("A"), P.Source("B"), selectivity=0.01, method="nested_loops"), P.Source("C"),
                  selectivity=0.02, method="nested_loops")
    rates = {"A": 5.0, "B": 50.0, "C": 10.0}
    costs = JoinCosts(move=0.01, comp=0.001)
    for t_p in (2.0, 30.0):
        half = t_p / 2
        ab = eq2(0.01, 5, 50, 0.01 + 50 * half * 0.001, 0.01 + 5 * half * 0.001, half)
        top = eq2(0.02, ab, 10, 0.01 + 10 * half * 0.001, 0.01 + ab * half * 0.001, half)
        assert rate.local_rate_estimate(plan, rates, t_p, costs=costs) == pytest.approx(top)


def test_split_required_outputs_section_4_2_2():
    # 25% of A ⋈ (B ⋈ C): read half of A and half of B ⋈ C
    a, b, c, f_ab, f_bc = 5_000, 10_000, 20_000, 2e-3, 1e-4
    n = 0.25 * f_ab * f_bc * a * b * c
    n_a, n_bc = rate.split_required_outputs(n, f_ab, a, f_bc * b * c)
    assert n_a == pytest.approx(a / 2) and n_bc == pytest.approx(f_bc * b * c / 2)
    plan = P.Join(P.Source("A"), P.Join(P.Source("B"), P.Source("C"), selectivity=f_bc), selectivity=f_ab)
    assert rate.output_size(plan, {"A": a, "B": b, "C": c}) == pytest.approx(n / 0.25)


def test_local_time_minimization():
    # one join of two sources, symmetric hash, unsaturated: r̂(T) = f·r_l·r_r·T/2 so T = sqrt(2n/(f·r_l·r_r));
    # the sources deliver n_l = sqrt(n·r_l/(f·r_r)) at rate r_l, i.e. by sqrt(n/(f·r_l·r_r)) — sooner
    plan = P.Join(P.Source("L"), P.Source("R"), selectivity=0.1)
    rates = {"L": 10.0, "R": 40.0}
    n = 1000.0
    assert rate.local_time_estimate(plan, rates, n) == pytest.approx(math.sqrt(2 * n / (0.1 * 10 * 40)), rel=1e-7)
    # a source alone: n/r; below a selection n/f tuples are needed
    assert rate.local_time_estimate(P.Select(P.Source("L"), 0.5), rates, 10) == pytest.approx(2.0)
    # with finite sizes, the split follows the sizes: a slow large input dominates
    sized = rate.local_time_estimate(plan, rates, n, sizes={"L": 1e6, "R": 10.0})
    n_l, _ = rate.split_required_outputs(n, 0.1, 1e6, 10.0)
    assert sized == pytest.approx(n_l / 10.0, rel=1e-7)


def test_rate_model_rejects_aggregation_and_bad_input():
    with pytest.raises(ValueError, match="Aggregate"):
        rate.plan_output_rate(P.Aggregate(P.Source("A")), {"A": 1.0}, 1.0)
    with pytest.raises(ValueError, match="'B'"):
        rate.plan_output_rate(P.Source("B"), {"A": 1.0}, 1.0)
    with pytest.raises(TypeError, match="rates"):
        rate.plan_output_rate(P.Source("A"), [1.0], 1.0)
    with pytest.raises(TypeError, match="rate"):
        rate.outputs_by_time(3.0, 1.0)
    with pytest.raises(ValueError, match="t_p"):
        rate.outputs_by_time(lambda t: t, -1)
    with pytest.raises(ValueError, match="selectivity"):
        rate.split_required_outputs(1, 0, 1, 1)
    with pytest.raises(TypeError, match="plans"):
        rate.best_plan_by_rate([], {}, 1)
    assert rate.plan_output_rate(P.Union((P.Source("A"), P.Window(P.Source("B"), 3))), {"A": 1, "B": 2}, 0) == 3


# --------------------------------------------------------------------------- properties


@settings(max_examples=50, deadline=None)
@given(r_l=st.floats(0.1, 100), r_r=st.floats(0.1, 100), f=st.floats(1e-4, 1), move=st.floats(0, 0.1),
       comp=st.floats(0, 0.01), t=st.floats(0.01, 100), dt=st.floats(0, 100), method=st.sampled_from(P.JOIN_METHODS))
def test_join_rate_and_outputs_monotone(r_l, r_r, f, move, comp, t, dt, method):
    costs = JoinCosts(move=move, comp=comp)
    plan = P.Join(P.Source("L"), P.Source("R"), selectivity=f, method=method)
    rates = {"L": r_l, "R": r_r}
    later = rate.plan_output_rate(plan, rates, t + dt, costs=costs)
    now = rate.plan_output_rate(plan, rates, t, costs=costs)
    assert later >= now * (1 - 1e-12)
    early = rate.join_outputs_by_time(r_l, r_r, f, t, method=method, costs=costs)
    late = rate.join_outputs_by_time(r_l, r_r, f, t + dt, method=method, costs=costs)
    assert late >= early * (1 - 1e-12)
    # the rate is at most the unsaturated rate f·r_l·r_r·t
    assert rate.plan_output_rate(plan, rates, t, costs=costs) <= f * r_l * r_r * t * (1 + 1e-12)


@settings(max_examples=50, deadline=None)
@given(r=st.floats(0.01, 1e4), f=st.floats(1e-4, 1), c=st.floats(0, 1))
def test_selection_rate_bounds(r, f, c):
    out = rate.selection_output_rate(r, f, c)
    assert out <= f * r * (1 + 1e-12)
    if c > 0:
        assert out <= f / c * (1 + 1e-12)
    assert out == pytest.approx(min(f * r, f / c) if c > 0 else f * r)
