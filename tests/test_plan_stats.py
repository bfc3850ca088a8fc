"""pyspark_cq.policies.plan_stats: candidate plans and per-round estimates of plan-switchable operators."""
import itertools
import math
import pickle

import pytest

from pyspark_cq.control.plans import parse_chain_plan, parse_join_plan
from pyspark_cq.operators.multi_join.worker import metric_names
from pyspark_cq.policies import OperatorStats
from pyspark_cq.policies import plan_stats as ps


def chain_stats(batches=1, rows=(1000, 400, 100), nanos=(2000, 40_000), names=("cheap", "slow"), rate=500.0):
    report = {"input_rows": rows[0], "output_rows": rows[-1]}
    for k, p in enumerate(names):
        report.update({f"rows_in_{p}": rows[k], f"rows_passed_{p}": rows[k + 1], f"nanos_{p}": nanos[k]})
    return OperatorStats("filter", batches, rows[0], rows[-1], rate, rows[-1] / rows[0], report=report)


def join_stats(batches=1, rate=600.0):
    """A 3-way join run with plan '0:1>2;1:0>2;2:0>1' (the left-deep order (0, 1, 2))."""
    report = dict.fromkeys(metric_names(3), 0)
    report.update({"input_rows": 600, "input_rows_0": 100, "input_rows_1": 200, "input_rows_2": 300,
                   "state_rows_0": 1000, "state_rows_1": 2000, "state_rows_2": 3000,
                   # first steps: 0 probes 1, 1 probes 0, 2 probes 0
                   "probed_0_1": 100, "matched_0_1": 40, "probed_0_2": 40, "matched_0_2": 12,
                   "probed_1_0": 200, "matched_1_0": 40, "probed_1_2": 40, "matched_1_2": 6,
                   "probed_2_0": 300, "matched_2_0": 90, "probed_2_1": 90, "matched_2_1": 9})
    return OperatorStats("funnel", batches, 600, 27, rate, 27 / 600, report=report)


def test_kind_and_names():
    assert ps.operator_kind(chain_stats()) == ps.SELECT_CHAIN
    assert ps.operator_kind(join_stats()) == ps.MULTI_JOIN
    assert ps.operator_kind(OperatorStats("x")) is None
    assert ps.operator_kind(OperatorStats("x", report={"input_rows": 3, "state_rows": 1})) is None
    assert ps.chain_predicates(chain_stats()) == ("cheap", "slow")
    assert ps.chain_predicates(chain_stats(), {"plan_id": "slow>cheap"}) == ("slow", "cheap")
    assert ps.join_inputs(join_stats()) == 3
    with pytest.raises(ValueError, match="no select_chain report"):
        ps.chain_predicates(join_stats())
    with pytest.raises(ValueError, match="no multi_join report"):
        ps.join_inputs(chain_stats())
    with pytest.raises(ValueError, match="not a permutation"):
        ps.chain_predicates(chain_stats(), {"plan_id": "slow>other"})
    with pytest.raises(TypeError, match="stats must be an OperatorStats"):
        ps.operator_kind({"rows_in_a": 1})


def test_chain_plans_are_every_order():
    plans = ps.chain_plans(["a", "b", "c"])
    assert len(plans) == 6 == len(set(plans))
    assert {parse_chain_plan(p, ["a", "b", "c"]) for p in plans} == set(itertools.permutations("abc"))
    with pytest.raises(ValueError, match="twice"):
        ps.chain_plans(["a", "a"])
    with pytest.raises(TypeError, match="predicates"):
        ps.chain_plans("ab")
    assert ps.candidate_plans(chain_stats()) == ["cheap>slow", "slow>cheap"]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_left_deep_plans_count_and_round_trip(n):
    orders = ps.left_deep_orders(n)
    assert len(orders) == math.factorial(n) // 2            # OM §5.3: 3 plans for 3 streams
    assert all(sorted(o) == list(range(n)) and o[0] < o[1] for o in orders)
    plans = ps.left_deep_plans(n)
    assert len(set(plans)) == len(plans)
    for order, plan in zip(orders, plans):
        probes = parse_join_plan(plan, n)                    # the control table accepts it
        assert probes[order[0]][0] == order[1] and probes[order[1]][0] == order[0]
        for m in range(2, n):                                # later inputs probe in the order's sequence
            assert probes[order[m]] == tuple(j for j in order if j != order[m])
        assert ps.left_deep_order(plan, n) == order
    assert ps.left_deep_order(";".join(f"{i}:" + ">".join(str(j) for j in reversed(range(n)) if j != i)
                                       for i in range(n)), n) in (None, *orders)


def test_left_deep_plans_three_inputs():
    assert ps.left_deep_orders(3) == [(0, 1, 2), (0, 2, 1), (1, 2, 0)]
    assert ps.left_deep_plans(3) == ["0:1>2;1:0>2;2:0>1", "0:2>1;1:0>2;2:0>1", "0:1>2;1:2>0;2:1>0"]
    assert ps.left_deep_order("0:2>1;1:2>0;2:0>1", 3) is None    # 0 and 1 both probe 2 first: not left-deep
    assert ps.candidate_plans(join_stats()) == ps.left_deep_plans(3)
    assert ps.candidate_plans(OperatorStats("x")) == []
    with pytest.raises(ValueError, match="n_inputs must be an integer >= 2"):
        ps.left_deep_orders(1)
    with pytest.raises(ValueError, match="2 to 6"):
        ps.left_deep_plans(7)
    with pytest.raises(ValueError, match="permutation"):
        ps.left_deep_probe_orders([0, 0, 1])


def test_current_plan_normalises():
    assert ps.current_plan(join_stats(), {"plan_id": " 0:1>2; 1:0>2 ;2:0>1"}) == "0:1>2;1:0>2;2:0>1"
    assert ps.current_plan(join_stats(), {}) is None
    assert ps.current_plan(chain_stats(), {"plan_id": "slow > cheap"}) == "slow>cheap"


def test_chain_steps():
    steps = ps.chain_steps(chain_stats())
    assert steps["cheap"] == ps.StepEstimate(1000, 400, 2000.0)
    assert steps["cheap"].selectivity == 0.4 and steps["cheap"].cost_per_row == pytest.approx(2e-9)
    assert steps["slow"].selectivity == 0.25 and steps["slow"].cost_per_row == pytest.approx(1e-7)
    empty = ps.StepEstimate(0, 0, 0.0)
    assert math.isnan(empty.selectivity) and math.isnan(empty.cost_per_row)
    assert ps.input_rows(chain_stats()) == (1000,)
    assert ps.input_rates(chain_stats()) == (500.0,)


def test_join_steps_rates_and_pair_selectivities():
    stats = join_stats()
    steps = ps.join_steps(stats)
    assert len(steps) == 6 and steps[(0, 1)] == ps.StepEstimate(100, 40)
    assert steps[(2, 1)].selectivity == 0.1 and math.isnan(steps[(2, 1)].cost_per_row)
    assert ps.input_rows(stats) == (100, 200, 300)
    assert ps.input_rates(stats) == pytest.approx((100.0, 200.0, 300.0))
    assert all(math.isnan(r) for r in ps.input_rates(OperatorStats("f", report=join_stats().report)))
    pairs = ps.join_pair_selectivities(stats)
    # {0,1}: (40 + 40) / (100·(2000 − 200) + 200·1000) — input 1's own 200 rows were stored after input 0
    # probed; {0,2}: 90 / (300·1000); {1,2} only in second steps
    assert pairs == {frozenset((0, 1)): pytest.approx(80 / 380_000), frozenset((0, 2)): pytest.approx(90 / 300_000)}
    assert ps.join_pair_selectivities(stats, {"plan_id": "0:1>2;1:0>2;2:0>1"}) == pairs
    # with a plan whose first steps differ, only those count
    other = ps.join_pair_selectivities(stats, {"plan_id": "0:2>1;1:2>0;2:1>0"})
    assert set(other) == {frozenset((0, 2)), frozenset((1, 2))}


def test_round_estimates_decay_weighted_once_per_batch():
    est = ps.RoundEstimates(d=3, decay=math.log(2))
    assert est.observe(chain_stats(batches=1, rows=(1000, 100, 50)))
    assert not est.observe(chain_stats(batches=1, rows=(1000, 900, 50)))     # same batch: not added twice
    assert est.observe(chain_stats(batches=2, rows=(1000, 400, 50)))
    # newest 0.4 weighs 1, 0.1 weighs 1/2 (OM §4.3 with a = ln 2)
    assert est.get("sel:cheap") == pytest.approx((0.4 + 0.05) / 1.5)
    assert est.count("sel:cheap") == 2 and est.get("rows") == 1000.0
    assert est.get("cost:slow") == pytest.approx(40_000 / 100 / 1e9, rel=0.5)
    assert math.isnan(est.get("missing")) and est.get("missing", 1.0) == 1.0
    assert est.observe(join_stats(), {"plan_id": "0:1>2;1:0>2;2:0>1"})
    assert est.get("rows:2") == 300 and est.get("step:2>1") == 0.1 and est.get("rate:1") == pytest.approx(200)
    assert est.get("pair:0,1") == pytest.approx(80 / 380_000)
    assert not est.observe(OperatorStats("other", batches=3, report={"input_rows": 1}))
    assert pickle.loads(pickle.dumps(est)).get("sel:cheap") == est.get("sel:cheap")
    est.add("x", math.nan)
    assert est.count("x") == 0
    with pytest.raises(ValueError, match="d must be"):
        ps.RoundEstimates(d=0)
    with pytest.raises(TypeError, match="name"):
        est.add("", 1.0)


def test_join_bands_and_key_only_steps():
    """The bounds graph from ``banded_<i>_<j>`` (None when no flag is set), and the steps that enter an input
    with no bound to the inputs bound before it."""
    report = dict.fromkeys(metric_names(3), 0)
    report["input_rows_0"] = 5
    stats = OperatorStats("mj", batches=1, report=report)
    assert ps.join_bands(stats) is None                       # an older report: unknown
    report.update({"banded_0_1": 1, "banded_0_2": 1})
    bands = ps.join_bands(OperatorStats("mj", batches=1, report=report))
    assert bands == {frozenset((0, 1)), frozenset((0, 2))}
    assert ps.key_only_steps(parse_join_plan("0:1>2;1:0>2;2:0>1", 3), bands) == []
    # input 1 probing 2 first, and 2 probing 1 first, match on the key alone (no band between 1 and 2)
    assert ps.key_only_steps(parse_join_plan("0:1>2;1:2>0;2:1>0", 3), bands) == [(1, 2), (2, 1)]
    with pytest.raises(TypeError, match="orders"):
        ps.key_only_steps("0:1>2", bands)
    with pytest.raises(TypeError, match="bands"):
        ps.key_only_steps(((1, 2), (0, 2), (0, 1)), [(0, 1)])
