"""RTStream for join queries (Wei et al., §4.4, §5.2.2): per-input drop ratios from a JoinQualityTable,
on hand-computed numbers (the paper gives no numeric join example), and the control vocabulary of
per-input ratios. No Spark.

The example plan: two selections costing 1 per tuple under a join costing 0.01 per pair of inputs,
100 tuples per input: ``T(ε_L, ε_R) = 100·ε_L + 100·ε_R + (100·ε_L)(100·ε_R)·0.01`` (Figure 5), so
all input takes 300, the table's level 0.7 (ε_L = 0.5, ε_R = 0.8) 50 + 80 + 40 = 170 and its level
0.4 (ε_L = 0.25, ε_R = 0.5) 25 + 50 + 12.5 = 87.5.
"""
from __future__ import annotations

import pytest
from pyspark_cq_plugins.rtstream import JoinQualityTable, RTStreamQoS, join_sides, join_time

from pyspark_cq import plan as P
from pyspark_cq.control import ControlTable, Decision
from pyspark_cq.control.schema import side_drop_ratios
from pyspark_cq.policies import Instance, OperatorStats, QueryInfo, Snapshot, SourceStats

TABLE = JoinQualityTable([(0.4, 0.25, 0.5), (0.7, 0.5, 0.8), (1, 1, 1)])
PLAN = P.Join(P.Select(P.Source("L"), 1.0, cost=1), P.Select(P.Source("R"), 1.0, cost=1), selectivity=0.5,
              cost=0.01)


def test_join_time_scales_each_input_by_its_kept_fraction():
    counts = {"L": 100, "R": 100}
    assert join_sides(PLAN) == (("L",), ("R",))
    assert join_time(PLAN, counts, 1, 1) == pytest.approx(300)
    assert join_time(PLAN, counts, 0.5, 0.8) == pytest.approx(170)
    assert join_time(PLAN, counts, 0.25, 0.5) == pytest.approx(87.5)
    with pytest.raises(ValueError, match="plan must contain a join"):
        join_sides(P.Select(P.Source("L"), 0.5, cost=1))


def test_best_level_is_the_highest_whose_time_fits():
    def time_at(kl, kr):
        return join_time(PLAN, {"L": 100, "R": 100}, kl, kr)
    assert TABLE.best_level(time_at, 300) == (1.0, 1.0, 1.0)
    assert TABLE.best_level(time_at, 200) == (0.7, 0.5, 0.8)
    assert TABLE.best_level(time_at, 100) == (0.4, 0.25, 0.5)
    assert TABLE.best_level(time_at, 80) == (0.4, 0.25, 0.5)     # none fits: the lowest


def test_delivered_quality_is_the_worst_branchs():
    """§5.2.2: the branch with the higher drop compared with the table decides."""
    assert TABLE.quality(0.5, 0.8) == pytest.approx(0.7)            # on the table
    assert TABLE.quality(0.5, 0.5) == pytest.approx(0.4)            # the right input dropped more than 0.7 allows
    assert TABLE.quality(0.375, 0.8) == pytest.approx(0.55)         # left: halfway from 0.25 to 0.5 -> 0.4..0.7
    assert TABLE.quality(1.0, 0.9) == pytest.approx(0.85)           # right: halfway from 0.8 to 1 -> 0.7..1
    assert TABLE.quality(1.0, 1.0) == 1.0
    assert TABLE.quality(0.1, 1.0) == pytest.approx(0.4)            # below the first level: its quality


@pytest.mark.parametrize("levels, match", [
    ([(1, 1, 1)], "at least two"),
    ([(0.5, 0.5), (1, 1, 1)], r"levels\[0\] must be a \(quality, kept_left, kept_right\) triple"),
    ([(0.5, 0.0, 0.5), (1, 1, 1)], r"levels\[0\] kept_left must be a number in \(0, 1\]"),
    ([(0.5, 0.5, 1.5), (1, 1, 1)], r"levels\[0\] kept_right must be a number in \(0, 1\]"),
    ([(0.7, 0.5, 0.5), (0.4, 0.6, 0.6), (1, 1, 1)], "strictly increasing qualities"),
    ([(0.4, 0.5, 0.9), (0.7, 0.6, 0.8), (1, 1, 1)], "kept_right non-decreasing"),
    ([(0.4, 0.5, 0.5), (0.9, 0.9, 1.0)], r"must end at \(1, 1, 1\)"),
    ("abc", "sequence of at least two"),
])
def test_bad_join_tables_are_rejected(levels, match):
    with pytest.raises((TypeError, ValueError), match=match):
        JoinQualityTable(levels)


def test_bad_quality_arguments_are_named():
    with pytest.raises(ValueError, match="kept must be a fraction"):
        TABLE.quality(1.5, 1.0)
    with pytest.raises(ValueError, match="side must be 0"):
        TABLE.branch_quality(2, 0.5)
    with pytest.raises(TypeError, match="time_at must be callable"):
        TABLE.best_level(None, 1.0)
    with pytest.raises(TypeError, match=r"quality\['j'\] must be a QualityTable or"):
        RTStreamQoS(quality={"j": [(0, 0), (1, 1)]})


# -- the policy: admission from the plan, decide from the profile ------------------------------------


def _query(period, instances=(), rate=None, plan=PLAN, control=None):
    sources = {} if rate is None else {n: SourceStats(n, rate, 1e-3) for n in ("L", "R")}
    return QueryInfo("j", plan, {}, sources, {"join": OperatorStats("join", len(instances))},
                     {"join": control or {"drop_ratio": 0.0}}, batches=len(instances), period=period,
                     deadline=period, instances=tuple(instances))


@pytest.mark.parametrize("period, level", [(250.0, (0.7, 0.5, 0.8)), (125.0, (0.4, 0.25, 0.5)),
                                           (500.0, (1.0, 1.0, 1.0))])
def test_admission_writes_the_levels_per_input_drop_ratios(period, level):
    """100 tuples per input (rate · P); target 0.8: D = 250 leaves 200 (level 0.7 takes 170), D = 125
    leaves 100 (level 0.4 takes 87.5), D = 500 leaves 400 (all input, 300)."""
    verdict = RTStreamQoS(target=0.8, quality={"j": TABLE}).admit(_query(period, rate=100 / period), Snapshot())
    assert verdict.accepted, verdict.reason
    if level[0] == 1.0:
        assert len(verdict.decisions) == 0
        return
    (d,) = verdict.decisions
    drops = side_drop_ratios(d.changes, (0.0, 0.0))
    assert d.operator == "join" and set(d.changes["params"]) == {"drop_left", "drop_right"}
    # the two inputs' drops are one level of the table
    assert (1 - drops[0], 1 - drops[1]) == pytest.approx(level[1:])


def test_admission_rejects_a_join_query_whose_lowest_level_is_too_slow():
    verdict = RTStreamQoS(target=0.8, quality={"j": TABLE}).admit(_query(100.0, rate=1.0), Snapshot())
    assert not verdict.accepted
    assert "lowest level of its JoinQualityTable" in verdict.reason and "87.5 s > 0.8·D = 80 s" in verdict.reason


def _inst(batch, rows, duration, t0=1_700_000_000.0):
    return Instance(batch, t0 + 2 * batch, t0 + 2 * batch, duration, 1.5, rows, 0, 1.0)


# Instances of 0.2 s + 1 ms per row (the first is warm-up, not profiled), then a 1500-row load step:
# the profile predicts T = 1.7 s, fixed 0.2 s, against 0.8·1.5 = 1.2 s.
HISTORY = [_inst(i, rows, 0.2 + 0.001 * rows) for i, rows in enumerate([100, 300, 200, 400, 300])] + [
    _inst(5, 1500, 1.7)]
# 750 rows per input (no rates: shared evenly); selections 1 per tuple, the join 1/375 per pair:
# share(ε_L, ε_R) = (750·ε_L + 750·ε_R + 750²·ε_L·ε_R/375) / 3000 = (ε_L + ε_R + 2·ε_L·ε_R) / 4
DECIDE_PLAN = P.Join(P.Select(P.Source("L"), 1.0, cost=1), P.Select(P.Source("R"), 1.0, cost=1), cost=1 / 375)


def test_decide_chooses_the_level_whose_predicted_time_fits():
    """The per-row part 1.5 s may shrink to 1.0 s (share <= 2/3): level 0.7 (share (0.5 + 0.8 + 0.8)/4 =
    0.525) fits, all input (1) does not; predicted 0.2 + 0.525·1.5 = 0.9875 s."""
    policy = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": TABLE})
    (d,) = policy.decide(Snapshot(1.0, {"j": _query(2.0, HISTORY, plan=DECIDE_PLAN)}))
    assert d.operator == "join" and d.query == "j"
    assert d.changes == {"params": {"drop_left": 0.5, "drop_right": 0.2}}
    pred = policy.predictions[-1]
    assert pred.kept_sides == (0.5, 0.8) and pred.kept == pytest.approx(0.525)
    assert pred.time == pytest.approx(0.9875) and pred.time_full == pytest.approx(1.7)
    # the control table holds them already: no new decision
    again = _query(2.0, HISTORY, plan=DECIDE_PLAN,
                   control={"drop_ratio": 0.0, "params": {"drop_left": 0.5, "drop_right": 0.2}})
    assert len(policy.decide(Snapshot(2.0, {"j": again}))) == 0


def test_decide_without_a_plan_takes_time_linear_in_the_rows_kept():
    """share = (ε_L + ε_R)/2 with equal inputs: level 0.7 gives 0.65 <= 2/3."""
    policy = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": TABLE})
    (d,) = policy.decide(Snapshot(1.0, {"j": _query(2.0, HISTORY, plan=None)}))
    assert d.changes == {"params": {"drop_left": 0.5, "drop_right": 0.2}}
    assert policy.predictions[-1].kept == pytest.approx(0.65)


# -- the control vocabulary: per-input ratios in params ---------------------------------------------


def test_side_drop_ratios_override_drop_ratio_per_input():
    assert side_drop_ratios({}, (0.1, 0.2)) == (0.1, 0.2)                               # the argument
    assert side_drop_ratios({"drop_ratio": 0.3}, (0.1, 0.2)) == (0.3, 0.3)              # an old entry
    assert side_drop_ratios({"drop_ratio": 0.3, "params": {"drop_left": 0.6}}, (0, 0)) == (0.6, 0.3)
    assert side_drop_ratios({"params": {"drop_left": 0.6, "drop_right": 0.1}}, (0, 0)) == (0.6, 0.1)


def test_per_input_ratios_are_validated_where_they_are_written(tmp_path):
    with pytest.raises(ValueError, match=r"params\['drop_left'\] must be in \[0, 1\)"):
        Decision("j", {"params": {"drop_left": 1.0}})
    with pytest.raises(TypeError, match=r"params\['drop_right'\] must be a real number"):
        Decision("j", {"params": {"drop_right": "half"}})
    table = ControlTable(str(tmp_path / "c.json"))
    table.register("j", drop_ratio=0.0)
    e = table.set("j", params={"drop_left": 0.25, "drop_right": 0.5}, reason="test")
    assert side_drop_ratios(e.params, (0.0, 0.0)) == (0.25, 0.5)
    e = table.set("j", params={"drop_left": None}, reason="test")       # None deletes: back to drop_ratio
    assert side_drop_ratios(e.params, (0.0, 0.0)) == (0.0, 0.5)


def test_per_input_ratios_on_an_operator_that_does_not_read_them_are_refused():
    from pyspark_cq.control import check_reads, unread_parameters

    entry = {"drop_ratio": 0.1, "params": {"drop_left": 0.5, "drop_right": 0.0}}
    assert unread_parameters("interval_join", entry) == unread_parameters("window_join", entry) == []
    assert unread_parameters("select_chain", entry) == ["params['drop_left']"]
    with pytest.raises(ValueError, match=r"'chain'.*params\['drop_left'\].*interval_join and window_join only"):
        check_reads("multi_join", "chain", entry)
