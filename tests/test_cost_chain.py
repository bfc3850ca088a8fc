"""Chain scheduling model (STREAM §5.3; Babcock, Babu, Datar & Motwani's Chain): the paper's table, the
progress chart and its envelope, conservation and drain properties, bad inputs."""
import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.cost import chain

# STREAM §5.3 in units of b tuples: O1 consumes b per unit with selectivity 0.2; O2 consumes 0.2b per unit
# and produces nothing. 2b tuples at t = 0, none at 1, b at 2 and b at 3.
PAPER_PATH = [(1, 0.2), (0.2, 0.0)]
PAPER_ARRIVALS = {0: 2, 2: 1, 3: 1}
# The table (each entry a multiplier of b), t = 0 … 8.
STRATEGY_1 = [2, 1.2, 2, 2.2, 2, 1.2, 1, 0.2, 0]
STRATEGY_2 = [2, 1.2, 1.4, 1.6, 0.8, 0.6, 0.4, 0.2, 0]


def test_paper_table_strategy_1_is_fifo():
    assert chain.simulate(PAPER_PATH, PAPER_ARRIVALS, "fifo", 8) == STRATEGY_1


def test_paper_table_strategy_2_is_chain():
    assert chain.simulate(PAPER_PATH, PAPER_ARRIVALS, "chain", 8) == STRATEGY_2


def test_paper_table_in_tuples():
    """The paper's b is arbitrary ("their actual values are not relevant"): b = 100 scales the table."""
    b = 100
    path = [(b, 0.2), (0.2 * b, 0.0)]
    arrivals = {t: n * b for t, n in PAPER_ARRIVALS.items()}
    assert chain.simulate(path, arrivals, "fifo", 8) == pytest.approx([v * b for v in STRATEGY_1])
    assert chain.simulate(path, arrivals, "chain", 8) == pytest.approx([v * b for v in STRATEGY_2])


def test_paper_schedules():
    """Strategy 1 alternates O1, O2 per batch; strategy 2 runs O1 while a batch waits, then O2."""
    assert chain.simulate_trace(PAPER_PATH, PAPER_ARRIVALS, "fifo", 8).ran == [0, 1, 0, 1, 0, 1, 0, 1]
    assert chain.simulate_trace(PAPER_PATH, PAPER_ARRIVALS, "chain", 8).ran == [0, 0, 0, 0, 1, 1, 1, 1]


def test_paper_both_finish_at_8_and_chain_never_holds_more():
    """"Both strategies finish at the 8th time step, and Strategy 2 is clearly preferable"."""
    fifo = chain.simulate(PAPER_PATH, PAPER_ARRIVALS, "fifo", 8)
    ch = chain.simulate(PAPER_PATH, PAPER_ARRIVALS, "chain", 8)
    assert fifo[-1] == ch[-1] == 0 and fifo[-2] > 0 and ch[-2] > 0
    assert all(c <= f for c, f in zip(ch, fifo))
    assert max(ch) < max(fifo)


def _all_schedules_minimum(path, arrivals, horizon):
    ops, arr = chain._operators(path), chain._arrivals(arrivals)
    best = [math.inf] * (horizon + 1)
    for seq in itertools.product(range(len(ops)), repeat=horizon):
        totals = chain._run(ops, arr, lambda t, queues, seq=seq: seq[t], horizon).totals
        best = [min(b, v) for b, v in zip(best, totals)]
    return best


def test_paper_chain_is_pointwise_optimal_on_the_example():
    """On the paper's example, no schedule of O1/O2 (all 2^8) has a smaller queue at any t than Chain."""
    assert _all_schedules_minimum(PAPER_PATH, PAPER_ARRIVALS, 8) == STRATEGY_2


def test_chain_is_not_pointwise_below_fifo_in_general():
    """Chain is near-optimal (Babcock et al.), not pointwise optimal: with whole time units, a convex chart
    and bursts can give it a higher peak than FIFO (what docs/cost-model.md says the model does not promise)."""
    path, arrivals = [(2, 0.5), (0.5, 0.5)], {0: 1, 1: 1, 2: 1, 3: 2}
    assert chain.priorities(path) == [1.0, 0.5]
    assert chain.simulate(path, arrivals, "chain", 8) == [1, 1.5, 2, 3.5, 2.5, 2, 1.5, 1, 0.5]
    assert chain.simulate(path, arrivals, "fifo", 8) == [1, 1.5, 2, 3, 2.5, 2, 1, 0.5, 0]


def test_paper_chart_envelope_priorities():
    assert chain.progress_chart(PAPER_PATH) == [(0.0, 1.0), (1.0, 0.2), (2.0, 0.0)]
    assert chain.lower_envelope(PAPER_PATH) == [(0.0, 1.0), (1.0, 0.2), (2.0, 0.0)]
    assert chain.priorities(PAPER_PATH) == pytest.approx([0.8, 0.2])


def test_chart_time_is_per_arriving_tuple():
    """O_i spends y_{i-1}/c_i units on what is left of one arriving tuple; the last point has size 0."""
    path = [(2, 0.5), (1, 0.4), (4, 1.0)]
    assert chain.progress_chart(path) == [(0, 1), (0.5, 0.5), (1.0, 0.2), (1.05, 0.0)]     # exact
    # after a selectivity-0 operator nothing is left and no more time passes
    assert chain.progress_chart([(1, 0.0), (3, 0.5), (2, 1.0)]) == [(0, 1), (1, 0), (1, 0), (1, 0)]
    # the envelope goes straight to the last point (ties take the farthest): one segment, priority 1
    assert chain.lower_envelope([(1, 0.0), (3, 0.5), (2, 1.0)]) == [(0, 1), (1, 0)]
    assert chain.priorities([(1, 0.0), (3, 0.5), (2, 1.0)]) == [1.0, 1.0, 1.0]


def test_envelope_skips_points_above_it():
    # chart (0, 1), (1, 1), (2, 0.1), (4, 0): (1, 1) lies above the segment to (2, 0.1)
    path = [(1, 1.0), (1, 0.1), (0.05, 1.0)]
    assert chain.lower_envelope(path) == [(0, 1), (2, 0.1), (4, 0)]
    assert chain.priorities(path) == pytest.approx([0.45, 0.45, 0.05])


def test_envelope_ties_take_the_farthest_point():
    # (0, 1), (1, 0.5), (2, 0): collinear, one segment
    assert chain.progress_chart([(1, 0.5), (0.5, 1.0)]) == [(0, 1), (1, 0.5), (2, 0)]
    assert chain.lower_envelope([(1, 0.5), (0.5, 1.0)]) == [(0.0, 1.0), (2.0, 0.0)]
    assert chain.priorities([(1, 0.5), (0.5, 1.0)]) == [0.5, 0.5]


def test_selectivity_above_one_is_absorbed_by_the_envelope():
    # (0, 1), (1, 2), (3, 0.2), (3.2, 0): the envelope goes straight to the end, 1/3.2 for all
    assert chain.lower_envelope([(1, 2.0), (1, 0.1), (1, 1.0)]) == [(0, 1), (3.2, 0)]
    assert chain.priorities([(1, 2.0), (1, 0.1), (1, 1.0)]) == pytest.approx([0.3125] * 3)
    # the chart ends at size 0, below every other point: priorities are never negative
    assert chain.priorities([(1, 3.0), (1, 2.0), (1, 1.0)]) == pytest.approx([1 / 10] * 3)


def test_strategies_on_a_three_operator_path():
    """A non-reducing operator feeds a selective one: Chain runs them as a chain (same priority, oldest
    tuples first), greedy keeps running the selective operators and starves the first."""
    path = [(1, 1.0), (1, 0.1), (0.05, 1.0)]
    arrivals = {0: 3}
    trace = {s: chain.simulate_trace(path, arrivals, s, 10) for s in chain.STRATEGIES}
    assert trace["chain"].ran[:6] == [0, 1, 0, 1, 0, 1]
    assert trace["greedy"].ran[:4] == [0, 1, 2, 2]
    assert trace["round_robin"].ran[:4] == [0, 1, 2, 0]
    assert trace["fifo"].ran[:4] == [0, 1, 2, 2]
    assert max(trace["chain"].totals) == 3


def test_round_robin_skips_empty_queues_and_idles():
    trace = chain.simulate_trace([(1, 1.0), (1, 1.0)], {0: 1, 5: 1}, "round_robin", 7)
    assert trace.ran == [0, 1, None, None, None, 0, 1]
    assert trace.totals == [1, 1, 0, 0, 0, 1, 1, 0]


def test_fifo_ties_go_downstream_and_oldest_first():
    # at t = 1 both queues hold tuples of t = 0: the downstream one completes them
    trace = chain.simulate_trace([(1, 1.0), (1, 1.0)], {0: 2, 1: 1}, "fifo", 5)
    assert trace.ran == [0, 1, 0, 1, 0]


def test_chain_full_unit_when_queue_holds_less():
    # O2 has 0.8 queued and consumes 0.2 per unit: 4 units, whatever fraction of capacity is used
    trace = chain.simulate_trace([(1, 0.2), (0.5, 0.0)], {0: 1, 1: 1, 2: 1, 3: 1}, "chain", 6)
    assert trace.ran == [0, 0, 0, 0, 1, 1]
    assert trace.consumed == pytest.approx([1, 1, 1, 1, 0.5, 0.3])
    assert trace.totals == pytest.approx([1, 1.2, 1.4, 1.6, 0.8, 0.3, 0])


def test_arrivals_after_the_horizon_are_ignored_and_horizon_zero():
    assert chain.simulate(PAPER_PATH, {0: 1, 9: 5}, "chain", 3) == [1.0, 0.2, 0.0, 0.0]
    assert chain.simulate(PAPER_PATH, {0: 1}, "fifo", 0) == [1.0]
    assert chain.simulate(PAPER_PATH, {}, "greedy", 2) == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------------------------------------
# properties

capacity = st.sampled_from([0.1, 0.2, 0.25, 0.5, 1, 2, 3])
selectivity = st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.8, 1.0, 1.5])
paths = st.lists(st.tuples(capacity, selectivity), min_size=1, max_size=4)
arrivals_st = st.dictionaries(st.integers(0, 12), st.sampled_from([0, 0.5, 1, 2, 3]), max_size=6)
strategy_st = st.sampled_from(chain.STRATEGIES)


@settings(max_examples=150, deadline=None)
@given(path=paths, arrivals=arrivals_st, strategy=strategy_st, horizon=st.integers(0, 30))
def test_conservation_and_work_conservation(path, arrivals, strategy, horizon):
    """Per queue, what came in = what was consumed + what is still queued; the last operator's output
    is s_m × what it consumed; one operator runs whenever some queue holds tuples, and takes
    min(capacity, queue)."""
    tr = chain.simulate_trace(path, arrivals, strategy, horizon)
    m = len(path)
    assert len(tr.totals) == len(tr.queues) == len(tr.arrived) == horizon + 1
    assert len(tr.ran) == len(tr.consumed) == len(tr.emitted) == horizon
    assert tr.arrived == [float(arrivals.get(t, 0)) for t in range(horizon + 1)]
    consumed = [0.0] * m
    emitted = 0.0
    for t in range(horizon):
        q = tr.queues[t]
        assert all(v >= 0 for v in q)
        assert tr.totals[t] == pytest.approx(sum(q))
        i = tr.ran[t]
        if i is None:
            assert all(v == 0 for v in q)
            continue
        assert q[i] > 0
        assert tr.consumed[t] == pytest.approx(min(path[i][0], q[i]))
        consumed[i] += tr.consumed[t]
        if i == m - 1:
            assert tr.emitted[t] == pytest.approx(tr.consumed[t] * path[i][1])
            emitted += tr.emitted[t]
        else:
            assert tr.emitted[t] == 0
    final = tr.queues[-1]
    inflow = sum(tr.arrived)
    for i in range(m):
        assert inflow == pytest.approx(consumed[i] + final[i], abs=1e-9)
        inflow = consumed[i] * path[i][1]
    assert emitted == pytest.approx(inflow, abs=1e-9)


def _drain_bound(path, arrivals) -> int:
    """Time units after which every work-conserving strategy has emptied the queues: each run of O_i
    either consumes c_i (at most input_i / c_i such runs) or empties its queue (at most once per refill,
    i.e. per run of O_{i-1} or arrival)."""
    times = [t for t, n in arrivals.items() if n > 0]
    if not times:
        return 0
    n_in, runs_before, total = float(sum(arrivals.values())), len(times), 0
    for c, s in path:
        runs = math.floor(n_in / c) + runs_before
        total += runs
        n_in, runs_before = n_in * s, runs
    return max(times) + 1 + total


@settings(max_examples=100, deadline=None)
@given(path=paths, arrivals=arrivals_st, strategy=strategy_st)
def test_every_strategy_drains(path, arrivals, strategy):
    horizon = _drain_bound(path, arrivals)
    assert chain.simulate(path, arrivals, strategy, horizon)[-1] == 0


@settings(max_examples=100, deadline=None)
@given(cap=capacity, s=selectivity, arrivals=arrivals_st, horizon=st.integers(0, 20))
def test_one_operator_every_strategy_is_the_same(cap, s, arrivals, horizon):
    curves = {strategy: chain.simulate([(cap, s)], arrivals, strategy, horizon) for strategy in chain.STRATEGIES}
    assert len({tuple(c) for c in curves.values()}) == 1


@settings(max_examples=100, deadline=None)
@given(path=paths, arrivals=arrivals_st, strategy=strategy_st, k=st.integers(2, 7))
def test_units_do_not_matter(path, arrivals, strategy, k):
    """Scaling every capacity and arrival by k scales the queues by k (§5.3: the values of b and of the
    time unit "are not relevant")."""
    horizon = 15
    base = chain.simulate(path, arrivals, strategy, horizon)
    # scaled on the decimal values the model reads (0.2 * 3 in binary floats is 0.6000000000000001, which
    # breaks an exact priority tie of the unscaled path)
    def times_k(v):
        return float(Fraction(repr(float(v))) * k)

    scaled = chain.simulate([(times_k(c), s) for c, s in path], {t: times_k(n) for t, n in arrivals.items()},
                            strategy, horizon)
    assert scaled == pytest.approx([v * k for v in base])


def _lower_hull(points):
    """Andrew's monotone chain, lower hull (collinear points dropped): an independent reference."""
    hull = []
    for p in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


@settings(max_examples=200, deadline=None)
@given(path=paths)
def test_envelope_is_the_lower_convex_hull(path):
    exact = chain._chart(chain._operators(path))
    hull = _lower_hull(exact)
    env = chain.lower_envelope(path)
    assert env == [(float(x), float(y)) for x, y in hull]
    chart = chain.progress_chart(path)
    assert env[0] == (0.0, 1.0) and env[-1] == chart[-1] and set(env) <= set(chart)
    pr = chain.priorities(path)
    assert len(pr) == len(path)
    assert all(a >= b for a, b in zip(pr, pr[1:]))       # the envelope is convex
    assert all(p >= 0 for p in pr)                         # ... and ends at its lowest point
    # each operator's priority is minus the slope of the hull segment spanning it
    for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
        slope = (y2 - y1) / (x2 - x1) if x2 != x1 else Fraction(0)
        for i, (x, _) in enumerate(exact[1:]):
            if x1 < x <= x2:
                assert pr[i] == pytest.approx(float(-slope))


def test_exact_arithmetic_empties_queues():
    # 0.1 + 0.2 != 0.3 in binary floats; the model uses the decimal values
    # O2's queue gets 0.1 three times, then O2 (capacity 0.3) empties it in one unit
    trace = chain.simulate_trace([(1, 0.1), (0.3, 0.0)], {0: 1, 1: 2}, "chain", 5)
    assert trace.totals == [1.0, 2.1, 1.2, 0.3, 0.0, 0.0]
    assert trace.ran == [0, 0, 0, 1, None]


# ---------------------------------------------------------------------------------------------------------
# bad input: every error names its argument


@pytest.mark.parametrize("call, match", [
    (lambda: chain.simulate([(0, 0.5)], {0: 1}, "chain", 3), r"operators\[0\] capacity"),
    (lambda: chain.simulate([(1, 0.5), (-1, 0.5)], {0: 1}, "chain", 3), r"operators\[1\] capacity"),
    (lambda: chain.simulate([(1, -0.1)], {0: 1}, "chain", 3), r"operators\[0\] selectivity"),
    (lambda: chain.simulate([(1, float("nan"))], {0: 1}, "chain", 3), r"operators\[0\] selectivity"),
    (lambda: chain.simulate([], {0: 1}, "chain", 3), "operators must be a non-empty sequence"),
    (lambda: chain.simulate([(1, 0.5, 3)], {0: 1}, "chain", 3), r"operators\[0\] must be a"),
    (lambda: chain.simulate("ab", {0: 1}, "chain", 3), "operators must be"),
    (lambda: chain.simulate([("1", 0.5)], {0: 1}, "chain", 3), r"operators\[0\] capacity"),
    (lambda: chain.simulate([(1, 0.5)], {0: 1}, "edf", 3), "strategy must be one of"),
    (lambda: chain.simulate([(1, 0.5)], {-1: 1}, "chain", 3), "arrivals time -1 must be an integer >= 0"),
    (lambda: chain.simulate([(1, 0.5)], {1.5: 1}, "chain", 3), "arrivals time 1.5 must be an integer"),
    (lambda: chain.simulate([(1, 0.5)], {0: -2}, "chain", 3), r"arrivals\[0\] must be >= 0"),
    (lambda: chain.simulate([(1, 0.5)], [(0, 1)], "chain", 3), "arrivals must be a mapping"),
    (lambda: chain.simulate([(1, 0.5)], {0: 1}, "chain", -1), "horizon must be an integer >= 0"),
    (lambda: chain.simulate([(1, 0.5)], {0: 1}, "chain", 2.5), "horizon must be an integer"),
    (lambda: chain.progress_chart([(0, 1)]), r"operators\[0\] capacity"),
    (lambda: chain.lower_envelope([(1, -1)]), r"operators\[0\] selectivity"),
    (lambda: chain.priorities(None), "operators must be"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
