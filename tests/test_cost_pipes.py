"""PIPES cost model (Cammert, Krämer, Seeger & Vaupel §3–§4) on hand-worked cases and properties."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq import plan as P
from pyspark_cq.cost import pipes
from pyspark_cq.cost.pipes import CostProfile
from pyspark_cq.cost.pipes import StreamCharacteristics as SC


def close(a: SC, d, l, g):  # noqa: E741
    return a.d == pytest.approx(d) and a.l == pytest.approx(l) and a.g == pytest.approx(g)


# --------------------------------------------------------------------------- Cost Formulas 1-8


def test_characteristics_validation():
    assert SC(2, 10).rate == 0.5 and SC(2, 10).g == 1.0
    assert SC.empty_stream().empty and SC.empty_stream(5).g == 5
    with pytest.raises(ValueError, match="d"):
        SC(0, 1)
    with pytest.raises(ValueError, match="l"):
        SC(1, -1)
    with pytest.raises(ValueError, match="empty"):
        SC(math.inf, 3)
    with pytest.raises(ValueError, match="empty"):
        SC(2, 0)
    with pytest.raises(TypeError, match="g"):
        SC(1, 1, "1")


def test_projection_selection_union():
    s = SC(2, 10)
    assert pipes.projection_output(s) == s                                  # (1)
    assert close(pipes.selection_output(s, 0.25), 8, 10, 1)                 # (2)
    # (3): rates 1/2 + 1/4 = 3/4, l' = (10/2 + 20/4) / (3/4)
    assert close(pipes.union_output(SC(2, 10), SC(4, 20)), 4 / 3, 40 / 3, 1)
    assert pipes.union_output(s, SC.empty_stream()) == s
    assert pipes.union_output(SC.empty_stream(), SC.empty_stream()).empty
    with pytest.raises(ValueError, match="selectivity"):
        pipes.selection_output(s, 0)
    with pytest.raises(ValueError, match="granularit"):
        pipes.union_output(SC(1, 2, 1), SC(1, 2, 2))
    with pytest.raises(ValueError, match="inputs"):
        pipes.union_output()


def average_overlap(l1, l2, steps=200_000):
    """Plain numeric check of Formula 4's l': shift an interval of length l1 across one of length l2
    (every relative position with an overlap equally likely) and average the overlap."""
    offsets = np.linspace(-l1, l2, steps + 1)[:-1] + (l1 + l2) / steps / 2
    overlap = np.minimum(offsets + l1, l2) - np.maximum(offsets, 0)
    return overlap.mean()


@pytest.mark.parametrize("l1, l2", [(10, 30), (5, 5), (1, 100)])
def test_cartesian_product_and_join(l1, l2):
    out = pipes.cartesian_output(SC(2, l1), SC(4, l2))                      # (4)
    assert out.d == pytest.approx(8 / (l1 + l2))
    assert out.l == pytest.approx(l1 * l2 / (l1 + l2))
    assert out.l == pytest.approx(average_overlap(l1, l2), rel=1e-6)
    joined = pipes.join_output(SC(2, l1), SC(4, l2), 0.1)
    assert joined.d == pytest.approx(out.d / 0.1) and joined.l == pytest.approx(out.l)
    assert pipes.cartesian_output(SC(2, l1), SC.empty_stream()).empty


def test_scalar_aggregation():
    # (5): d < l: d' = l' = g / (1 - (1 - 1/d)^(2g)); d = 2, g = 1: 1/(1 - 1/4) = 4/3
    assert close(pipes.aggregation_output(SC(2, 10)), 4 / 3, 4 / 3, 1)
    # g = 3: 3 / (1 - (1/2)^6) = 3 / (63/64)
    assert close(pipes.aggregation_output(SC(2, 12, 3)), 64 / 21, 64 / 21, 3)
    assert pipes.aggregation_output(SC(10, 5)) == SC(10, 5)                 # d >= l: unchanged
    assert close(pipes.aggregation_output(SC(2, 10), regular=True), 2, 2, 1)
    # d <= 1: every granule is hit, d' = g
    assert close(pipes.aggregation_output(SC(0.5, 10, 4)), 4, 4, 4)
    assert pipes.aggregation_output(SC.empty_stream()).empty


@pytest.mark.parametrize("n, d, l, g", [(5, 1, 100, 1), (3, 0.7, 50, 2), (10, 2, 15, 1), (4, 10, 20, 1)])
def test_group_aggregation_is_formula_6(n, d, l, g):  # noqa: E741
    out = pipes.group_aggregation_output(SC(d, l, g), n)
    if n * d < l:
        hit = 1 - (1 - 1 / (n * d)) ** (2 * g)
        assert close(out, g / (n * hit), g / hit, g)
    else:
        assert close(out, d, l, g)
    assert pipes.group_aggregation_output(SC(d, l, g), 1) == pipes.aggregation_output(SC(d, l, g))


def test_window():
    # (7): a source (d, 1, 1) under a window of w = 9: (d, 10, 1)
    assert close(pipes.window_output(SC(2, 1), 9), 2, 10, 1)
    # g = 2, l = 2: d' = g·d/l = 4, l' = ⌊10/2⌋·2 = 10; w = 8 rounds down to 8
    assert close(pipes.window_output(SC(4, 2, 2), 9), 4, 10, 2)
    assert close(pipes.window_output(SC(4, 2, 2), 8), 4, 8, 2)
    # tuple-based window of c elements = time-based window of c·d (§2.4.2)
    assert pipes.window_output(SC(2, 1), 5, kind="tuple") == pipes.window_output(SC(2, 1), 10)
    assert pipes.window_output(SC(2, 4, 4), 1).empty                         # shorter than a granule
    with pytest.raises(ValueError, match="kind"):
        pipes.window_output(SC(2, 1), 5, kind="rows")


def test_granularity():
    s = SC(2, 10)
    assert close(pipes.granularity_output(s, 4), 2, 6, 4)                   # l >= 2ĝ
    assert close(pipes.granularity_output(s, 6), 3, 6, 6)                   # ĝ < l < 2ĝ: d·ĝ/(l-ĝ)
    assert pipes.granularity_output(s, 10).empty and pipes.granularity_output(s, 10).g == 10
    assert pipes.granularity_output(s, 1) == s
    with pytest.raises(ValueError, match="granularity"):
        pipes.granularity_output(SC(2, 10, 4), 2)


# --------------------------------------------------------------------------- memory and processing


def test_stateless_costs():
    p = CostProfile(selection_predicate=3, projection_function=5, append=7, set_timestamp=11, queue=13,
                    round_timestamp=17)
    s = SC(4, 10)
    assert pipes.selection_processing(s, p) == pytest.approx(3 / 4)
    assert pipes.projection_processing(s, p) == pytest.approx(5 / 4)
    assert pipes.union_processing([s, SC(4, 2)], p) == pytest.approx(7 / 2)
    assert pipes.window_processing(s, profile=p) == pytest.approx(11 / 4)
    assert pipes.window_processing(s, kind="tuple", profile=p) == pytest.approx((2 * 13 + 11) / 4)
    assert pipes.window_memory(s, 100) == 0
    assert pipes.window_memory(s, 100, kind="tuple", element_size=8) == 800
    assert pipes.granularity_processing(s, p) == pytest.approx(2 * 17 / 4)


def test_join_memory_eq9():
    s1, s2 = SC(2, 10), SC(4, 30)
    # ⌈10/2⌉ + 4/(2·2) = 6 ; ⌈30/4⌉ + 2/(2·4) = 8.25
    assert pipes.join_state_sizes(s1, s2) == pytest.approx((6, 8.25))
    assert pipes.join_memory(s1, s2, sizes=(10, 20)) == pytest.approx(60 + 165)
    assert pipes.join_state_sizes(s1, SC.empty_stream()) == (math.inf, 0.0)
    with pytest.raises(TypeError, match="sizes"):
        pipes.join_memory(s1, s2, sizes=10)


def test_join_processing_eqs_10_to_14():
    p = CostProfile(hash_function=2, bucket_operation=3, heap_restructure=5, join_predicate=7, build_result=11,
                    expiration_predicate=13, hash_buckets=4)
    s1, s2 = SC(2, 10), SC(4, 30)
    c = pipes.join_processing(s1, s2, 0.1, profile=p)
    arrivals = 1 / 2 + 1 / 4
    assert c.insert == pytest.approx(arrivals * (2 + 3 + 5))                         # (11)
    assert c.probe == pytest.approx((30 / 4 + 10 / 4) / 8 * 7 + arrivals * 2)       # (12)
    assert c.result == pytest.approx(0.1 * 40 / 8 * 11)                              # (13)
    assert c.reorg == pytest.approx(arrivals * (2 * 13 + 3 + 5))                     # (14)
    assert c.total == pytest.approx(c.insert + c.probe + c.result + c.reorg)         # (10)
    nl = pipes.join_processing(s1, s2, 0.1, method="nested_loops", profile=p)       # one bucket, C_H = 0
    assert nl.insert == pytest.approx(arrivals * (3 + 5))
    assert nl.probe == pytest.approx(40 / 8 * 7)
    assert nl.result == c.result and nl.reorg == c.reorg


def test_aggregation_costs_eqs_15_to_19():
    assert pipes.aggregation_memory(SC(2, 10), size=8) == 5 * 8              # ⌈10·(1 - 1/2)⌉
    assert pipes.aggregation_state_size(SC(2, 12, 3)) == 4                  # ⌈4·(1 - 1/8)⌉ = ⌈3.5⌉
    assert pipes.aggregation_state_size(SC(10, 5)) == 1                     # d >= l
    assert pipes.aggregation_state_size(SC.empty_stream()) == 0
    p = CostProfile(overlap_check=2, aggregate_update=3, aggregate_init=5, list_operation=7)
    c = pipes.aggregation_processing(SC(2, 10), p)
    assert c.update == pytest.approx(10 / 2 * 0.5 * (2 + 3))                # (17)
    assert c.new == pytest.approx(7 / 2 + 5 / 4)                            # (18)
    assert c.reorg == pytest.approx(3 / 4 * (2 + 7) + 2 / 2)                # (19), d' = 4/3
    assert c.total == pytest.approx(c.update + c.new + c.reorg)             # (16)
    c = pipes.aggregation_processing(SC(10, 5), p)
    assert (c.update, c.new, c.reorg) == pytest.approx((0, 12 / 10, 9 / 10 + 2 / 10))


def test_group_aggregation_costs():
    s, n = SC(1, 100), 4
    part = SC(4, 100)
    assert pipes.group_aggregation_memory(s, n) == 4 * pipes.aggregation_memory(part)
    assert pipes.group_aggregation_processing(s, n).total == pytest.approx(
        4 * pipes.aggregation_processing(part).total)
    assert pipes.group_aggregation_memory(s, 1) == pipes.aggregation_memory(s)


# --------------------------------------------------------------------------- plans


def test_cost_plan_window_join():
    plan = P.Join(P.Window(P.Source("A"), 9), P.Window(P.Source("B"), 19), selectivity=0.5)
    sources = {"A": SC(2, 1), "B": SC(4, 1)}
    cost = pipes.cost_plan(plan, sources, sizes={"A": 10, "B": 20})
    # windows give (2, 10) and (4, 20); sides ⌈5⌉ + 4/4 = 6 and ⌈5⌉ + 2/8 = 5.25 elements
    assert cost.memory == pytest.approx(6 * 10 + 5.25 * 20)
    # join output (4), (2): d' = 8/30/0.5, l' = 200/30
    assert close(cost.output, 8 / 30 / 0.5, 200 / 30, 1)
    assert cost.nodes[-1].element_size == 30
    # with unit constants: windows C_S/d each, join (11)-(14) with one bucket
    arrivals = 0.5 + 0.25
    join = arrivals * 3 + (20 + 10) / 8 + arrivals + 1 / cost.output.d + arrivals * 4
    assert cost.processing == pytest.approx(0.5 + 0.25 + join)


def test_cost_plan_aggregation_and_union():
    plan = P.Aggregate(P.Granularity(P.Window(P.Source("S"), 99), 10), groups=1)
    cost = pipes.cost_plan(plan, {"S": SC(0.5, 1)}, profile=CostProfile(aggregate_size=16))
    # ω: (0.5, 100, 1); Γ(10): (0.5, 90, 10); α: ⌈9·(1 - (1 - 2)^10 clipped)⌉ = 9 aggregates
    assert cost.nodes[2].output == SC(0.5, 90, 10)
    assert cost.memory == 9 * 16
    assert cost.processing == pytest.approx(2 + 2 * 2 + pipes.aggregation_processing(SC(0.5, 90, 10)).total)
    u = pipes.cost_plan(P.Union((P.Source("A"), P.Source("B"))), {"A": SC(2, 1), "B": SC(2, 1)},
                        sizes={"A": 1, "B": 3})
    assert u.nodes[-1].element_size == 2 and u.output.d == 1 and u.memory == 0


def test_cost_plan_validation():
    plan = P.Source("A")
    with pytest.raises(ValueError, match="'A'"):
        pipes.cost_plan(plan, {})
    with pytest.raises(TypeError, match="sources"):
        pipes.cost_plan(plan, [SC(1, 1)])
    with pytest.raises(TypeError, match="StreamCharacteristics"):
        pipes.cost_plan(plan, {"A": (1, 1, 1)})
    with pytest.raises(TypeError, match="plan"):
        pipes.cost_plan("A", {"A": SC(1, 1)})
    with pytest.raises(TypeError, match="profile"):
        pipes.cost_plan(plan, {"A": SC(1, 1)}, profile={})
    with pytest.raises(ValueError, match="sizes"):
        pipes.cost_plan(plan, {"A": SC(1, 1)}, sizes={"A": 0})


# --------------------------------------------------------------------------- adaptation delays, validation API


def test_adaptation_delays_section_4_2_and_5_1():
    # §5.1: windows 60 s -> 30 s at 80 s: visible at 110 s, complete at 140 s; back to 60 s at 150 s: 180, 210
    assert pipes.window_change_delay(80, 60, 30) == (110, 140)
    assert pipes.window_change_delay(150, 30, 60) == (180, 210)
    assert pipes.granularity_change_delay(100, SC(2, 10)) == (100, 110)
    assert pipes.granularity_change_delay(100, SC(20, 10)) == (100, 100)
    with pytest.raises(ValueError, match="old_size"):
        pipes.window_change_delay(0, -1, 3)


def test_state_rows_for_validation_on_spark():
    src = SC(0.1, 1)   # ten rows per time unit
    left, right = pipes.join_state_rows(src, SC(0.2, 1), left_window=29, right_window=9)
    # windows: (0.1, 30) and (0.2, 10); ⌈300⌉ + 0.2/0.2 and ⌈50⌉ + 0.1/0.4
    assert (left, right) == pytest.approx((301, 50.25))
    assert pipes.join_state_rows(SC(0.1, 30), SC(0.2, 10)) == pytest.approx((301, 50.25))
    # a sliding aggregate of 600 with slide 10 over a dense stream keeps about 600/10 granules
    rows = pipes.aggregation_state_rows(src, window=599, granularity=10)
    assert rows == math.ceil((600 - 10) / 10)
    # five groups: each group's stream has d = 0.5, still dense: 59 granules each
    assert pipes.aggregation_state_rows(src, window=599, granularity=10, groups=5) == 5 * 59


def test_section_5_2_granularity_change():
    # FSP traffic data at granularity 1/60 s (one tick): vehicles every 2 s = 120 ticks, COUNT over 10 minutes.
    # "almost every input element of the aggregation results in two output elements"
    src = SC(120, 1)
    fine = pipes.window_output(src, 36_000 - 1)
    assert pipes.aggregation_output(fine).rate / src.rate == pytest.approx(2, rel=0.01)
    # granularity 10 s = 600 ticks, coarser than the distance between vehicles: far fewer outputs and aggregates
    coarse = pipes.granularity_output(fine, 600)
    assert pipes.aggregation_output(coarse).rate / src.rate == pytest.approx(120 / 600, rel=0.01)
    assert pipes.aggregation_memory(fine) == 300 and pipes.aggregation_memory(coarse) == 59


def test_section_5_3_window_reduction_vs_load_shedding():
    # equi-join of two streams of integers 0..49 at 100 elements/s, 10 s windows (time unit: 1 ms);
    # random load shedding with probability 1/2 is a selection of selectivity 1/2 before the window
    src = SC(10, 1)
    profile = CostProfile(hash_buckets=50)
    base = pipes.window_output(src, 9_999)
    half_window = pipes.window_output(src, 4_999)
    shed = pipes.window_output(pipes.selection_output(src, 0.5), 9_999)
    memory = {k: pipes.join_memory(s, s) for k, s in [("base", base), ("window", half_window), ("shed", shed)]}
    # both save 50% of the memory (Figure 9)
    assert memory["window"] / memory["base"] == pytest.approx(0.5, rel=1e-3)
    assert memory["shed"] / memory["base"] == pytest.approx(0.5, rel=1e-3)
    # results: window reduction keeps half, load shedding a quarter (Figure 11)
    results = {k: pipes.join_output(s, s, 1 / 50).rate for k, s in [("base", base), ("window", half_window),
                                                                      ("shed", shed)]}
    assert results["window"] / results["base"] == pytest.approx(0.5)
    assert results["shed"] / results["base"] == pytest.approx(0.25)
    # probing and result costs: half with half windows, a quarter with shedding (Figure 10)
    def probe_and_result(s):
        c = pipes.join_processing(s, s, 1 / 50, profile=profile.replace(hash_function=0))
        return c.probe + c.result
    assert probe_and_result(half_window) / probe_and_result(base) == pytest.approx(0.5)
    assert probe_and_result(shed) / probe_and_result(base) == pytest.approx(0.25)


# --------------------------------------------------------------------------- calibration


def test_calibrate_recovers_constants():
    truth = {"hash_function": 2e-7, "join_predicate": 5e-8, "bucket_operation": 1e-7}
    rng = np.random.default_rng(7)
    counts = [{k: float(rng.integers(1_000, 100_000)) for k in truth} for _ in range(12)]
    times = [sum(row[k] * truth[k] for k in truth) for row in counts]
    fitted = CostProfile().calibrate(counts, times)
    for k, v in truth.items():
        assert getattr(fitted, k) == pytest.approx(v, rel=1e-6)
    assert fitted.heap_restructure == 1.0                   # not measured: unchanged
    smoothed = CostProfile().calibrate(counts, times, smoothing=0.25)
    assert smoothed.hash_function == pytest.approx(0.75 * 1.0 + 0.25 * 2e-7)


def test_calibrate_is_non_negative_least_squares():
    # unconstrained least squares would give a negative second constant here
    counts = [{"hash_function": 1, "join_predicate": 1}, {"hash_function": 2, "join_predicate": 1},
              {"hash_function": 3, "join_predicate": 1}]
    times = [3.0, 5.0, 7.5]
    a = np.array([[1.0, 1], [2, 1], [3, 1]])
    times_neg = [3.0, 7.0, 11.5]
    assert np.linalg.lstsq(a, np.array(times_neg), rcond=None)[0][1] < 0
    fitted = CostProfile().calibrate(counts, times_neg)
    assert fitted.join_predicate == 0.0
    # KKT: with the second constant at 0, the first is the 1-d least-squares fit
    x = a[:, 0]
    assert fitted.hash_function == pytest.approx(x @ np.array(times_neg) / (x @ x))
    assert CostProfile().calibrate(counts, times).join_predicate > 0


def test_calibrate_validation():
    with pytest.raises(ValueError, match="unknown"):
        CostProfile().calibrate([{"nope": 1}], [1.0])
    with pytest.raises(ValueError, match="same"):
        CostProfile().calibrate([{"hash_function": 1}], [1.0, 2.0])
    with pytest.raises(TypeError, match="counts"):
        CostProfile().calibrate({"hash_function": 1}, [1.0])
    with pytest.raises(ValueError, match="smoothing"):
        CostProfile().calibrate([{"hash_function": 1}], [1.0], smoothing=1.5)
    with pytest.raises(ValueError, match="hash_buckets"):
        CostProfile(hash_buckets=0.5)
    with pytest.raises(ValueError, match="unknown"):
        CostProfile().replace(foo=1)


# --------------------------------------------------------------------------- properties


rates = st.floats(0.05, 20)
windows = st.floats(0, 1000)


@settings(max_examples=60, deadline=None)
@given(d1=rates, d2=rates, w=windows, dw=st.floats(0, 500))
def test_join_memory_grows_with_window(d1, d2, w, dw):
    def memory(size):
        return pipes.join_memory(pipes.window_output(SC(d1, 1), size), pipes.window_output(SC(d2, 1), size))
    assert memory(w + dw) >= memory(w) - 1e-9


@settings(max_examples=60, deadline=None)
@given(d=st.floats(0.05, 50), w=st.integers(50, 5000), g1=st.integers(2, 200), k=st.integers(1, 10))
def test_aggregation_memory_shrinks_with_coarser_granularity(d, w, g1, k):
    def memory(g):
        return pipes.aggregation_memory(pipes.granularity_output(pipes.window_output(SC(d, 1), w), g))
    assert memory(g1 * k) <= memory(g1)
    assert memory(g1) <= memory(1)


@settings(max_examples=60, deadline=None)
@given(d=st.floats(0.05, 50), w=st.integers(1, 5000), dw=st.integers(0, 5000), g=st.integers(1, 100))
def test_aggregation_memory_grows_with_window(d, w, dw, g):
    def memory(size):
        return pipes.aggregation_memory(pipes.granularity_output(pipes.window_output(SC(d, 1), size), g))
    assert memory(w + dw) >= memory(w)


@settings(max_examples=60, deadline=None)
@given(d1=rates, d2=rates, l1=st.floats(1, 100), big=st.floats(1e6, 1e9))
def test_formula_limits(d1, d2, l1, big):
    # a very long partner interval: the overlap tends to the shorter interval
    assert pipes.cartesian_output(SC(d1, l1), SC(d2, big)).l == pytest.approx(l1, rel=1e-4)
    # selectivity 1 is the identity; union with the empty stream is the identity
    assert pipes.selection_output(SC(d1, l1), 1.0) == SC(d1, l1)
    assert close(pipes.union_output(SC(d1, l1), SC.empty_stream()), d1, l1, 1)
    # the aggregation's output distance lies between g and max(d, l) and its rate is at most 2/d
    out = pipes.aggregation_output(SC(d1, l1))
    assert out.d >= 1 - 1e-9
    assert out.rate <= 2 / d1 + 1e-9


@settings(max_examples=60, deadline=None)
@given(d1=rates, d2=rates, w=windows, dw=st.floats(0, 500), sel=st.floats(0.001, 1))
def test_join_processing_grows_with_window(d1, d2, w, dw, sel):
    def cost(size):
        return pipes.join_processing(pipes.window_output(SC(d1, 1), size), pipes.window_output(SC(d2, 1), size),
                                     sel).total
    assert cost(w + dw) >= cost(w) - 1e-9
