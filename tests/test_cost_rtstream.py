"""RTStream cost model (Wei, Prasad, Son & Stankovic §4): equations (1), (2), Figure 5 and ε = D/T."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq import plan as P
from pyspark_cq.cost import rtstream


def figure_5(s, t):
    """Figure 5: O11 on stream 1, O12 on stream 2, O13 joins them, O14 on stream 3, O15 joins the rest."""
    o11 = P.Select(P.Source("1"), s[11], cost=t[11])
    o12 = P.Select(P.Source("2"), s[12], cost=t[12])
    o13 = P.Join(o11, o12, selectivity=s[13], cost=t[13])
    o14 = P.Select(P.Source("3"), s[14], cost=t[14])
    return P.Join(o13, o14, selectivity=s[15], cost=t[15])


def figure_5_formula(n1, n2, n3, s, t):
    return (n1 * t[11] + n2 * t[12] + n3 * t[14] + (n1 * s[11]) * (n2 * s[12]) * t[13]
            + ((n1 * s[11]) * (n2 * s[12]) * s[13]) * (n3 * s[14]) * t[15])


unit = st.floats(0.01, 1)
cost = st.floats(0, 5)


@settings(max_examples=50, deadline=None)
@given(n=st.tuples(*[st.integers(0, 500)] * 3), s=st.tuples(*[unit] * 5), t=st.tuples(*[cost] * 5))
def test_figure_5(n, s, t):
    s, t = dict(zip(range(11, 16), s)), dict(zip(range(11, 16), t))
    counts = {"1": n[0], "2": n[1], "3": n[2]}
    assert rtstream.plan_execution_time(figure_5(s, t), counts) == pytest.approx(figure_5_formula(*n, s, t))


def test_figure_5_numbers():
    s = {11: 0.5, 12: 0.25, 13: 0.1, 14: 0.2, 15: 0.3}
    t = {11: 1.0, 12: 2.0, 13: 3.0, 14: 4.0, 15: 5.0}
    # 10 + 40 + 120 + (5·5)·3 + (25·0.1)·6·5
    assert rtstream.plan_execution_time(figure_5(s, t), {"1": 10, "2": 20, "3": 30}) == pytest.approx(320)


def test_equations_1_and_2():
    times, sels = [1.0, 2.0, 3.0, 4.0], [0.5, 0.2, 0.8, 1.0]
    # (1): 100·1 + 100·2·0.5 + 100·3·0.1 + 100·4·0.08
    assert rtstream.chain_time(100, times, sels) == pytest.approx(100 + 100 + 30 + 32)
    # (2) from the third operator with 40 tuples waiting: 40·3 + 40·4·0.8
    assert rtstream.chain_time(40, times, sels, start=2) == pytest.approx(120 + 128)
    plan = P.Select(P.Select(P.Select(P.Select(P.Source("S"), 0.5, cost=1), 0.2, cost=2), 0.8, cost=3), 1.0, cost=4)
    assert rtstream.plan_execution_time(plan, {"S": 100}) == pytest.approx(262)
    assert rtstream.chain_time(7, [], []) == 0
    with pytest.raises(ValueError, match="same length"):
        rtstream.chain_time(1, [1.0], [])
    with pytest.raises(ValueError, match="start"):
        rtstream.chain_time(1, [1.0], [0.5], start=1)
    with pytest.raises(ValueError, match=r"selectivities\[0\]"):
        rtstream.chain_time(1, [1.0], [1.5])


def test_operator_cost_sections_4_1_1_and_4_1_2():
    assert rtstream.selection_tuple_cost(0.15, 0.1, 0.2) == pytest.approx(0.17)
    t = rtstream.join_processing_time(100, 200, 0.01, probe_left=5, probe_right=6, hash_left=1, hash_right=2,
                                      insert=0.5)
    assert t == pytest.approx(100 * (6 + 1) + 200 * (5 + 2) + 100 * 200 * 0.01 * 0.5)


def test_kept_fraction_section_4_4():
    assert rtstream.remaining_deadline(5.0, 3.5) == 1.5
    assert rtstream.kept_fraction(10.0, 2.5) == 0.25
    assert rtstream.kept_fraction(2.0, 2.5) == 1.0
    assert rtstream.kept_fraction(2.0, -1.0) == 0.0
    chain = P.Project(P.Select(P.Source("S"), 0.3, cost=2.0), cost=1.0)
    total = rtstream.plan_execution_time(chain, {"S": 50})
    eps = rtstream.plan_kept_fraction(chain, {"S": 50}, total / 4)
    assert eps == pytest.approx(0.25)
    # keeping ε·n tuples meets the deadline exactly
    assert rtstream.plan_execution_time(chain, {"S": eps * 50}) == pytest.approx(total / 4)


def test_kept_fraction_with_joins():
    s = {11: 0.5, 12: 0.25, 13: 0.1, 14: 0.2, 15: 0.3}
    t = {11: 1.0, 12: 2.0, 13: 3.0, 14: 4.0, 15: 5.0}
    plan, counts = figure_5(s, t), {"1": 10, "2": 20, "3": 30}
    total = rtstream.plan_execution_time(plan, counts)
    eps = rtstream.plan_kept_fraction(plan, counts, total / 4)
    assert 0.25 < eps < 1          # join work shrinks with ε², so more than D/T can be kept
    assert rtstream.plan_execution_time(plan, {k: eps * v for k, v in counts.items()}) == pytest.approx(total / 4)
    assert rtstream.plan_kept_fraction(plan, counts, total) == 1.0
    assert rtstream.plan_kept_fraction(plan, counts, 0) == 0.0


def test_aggregate_union_and_validation():
    plan = P.Aggregate(P.Union((P.Source("A"), P.Source("B")), cost=0.5), groups=3, cost=2.0)
    assert rtstream.plan_execution_time(plan, {"A": 4, "B": 6}) == pytest.approx(10 * 0.5 + 10 * 2.0)
    with pytest.raises(ValueError, match="'B'"):
        rtstream.plan_execution_time(P.Source("B"), {"A": 1})
    with pytest.raises(TypeError, match="counts"):
        rtstream.plan_execution_time(P.Source("A"), [1])
    with pytest.raises(ValueError, match="estimated_time"):
        rtstream.kept_fraction(-1, 1)


@settings(max_examples=50, deadline=None)
@given(n=st.floats(0, 1e5), k=st.floats(0, 10), ts=st.lists(st.tuples(cost, unit), min_size=1, max_size=6),
       d=st.floats(0.01, 1e3))
def test_chain_properties(n, k, ts, d):
    times, sels = [a for a, _ in ts], [b for _, b in ts]
    # linear in n, and equal to a plain loop
    assert rtstream.chain_time(k * n, times, sels) == pytest.approx(k * rtstream.chain_time(n, times, sels))
    expected = sum(n * times[j] * math.prod(sels[:j]) for j in range(len(times)))
    assert rtstream.chain_time(n, times, sels) == pytest.approx(expected)
    eps = rtstream.kept_fraction(rtstream.chain_time(n, times, sels), d)
    assert 0 <= eps <= 1
    assert rtstream.chain_time(eps * n, times, sels) <= d * (1 + 1e-9) or eps == 1
