"""RTStream headroom (our extension, not the paper's): ε rises in steps of at most ``raise_step`` and falls at
once, and the prediction is scaled by the smoothed overrun of the past predictions (``adaptive``). Hand-worked
numbers on synthetic snapshots, built as in test_rtstream_policy / test_rtstream_join. No Spark.

The linear history: instances of 0.2 s + 1 ms per row (the first is warm-up, not profiled), so the profile
predicts exactly ``0.2 + 0.001·rows``; D = 1.5 s, target 0.8: 1.2 s for the instance.
"""
from __future__ import annotations

import pytest
import test_rtstream_join as J
from pyspark_cq_plugins.rtstream import (
    MAX_ERROR_SCALE,
    JoinQualityTable,
    Prediction,
    RTStreamQoS,
    matched_predictions,
    predicted_for,
)
from pyspark_cq_plugins.rtstream_fixed_sampling import FixedSampling
from test_rtstream_policy import _inst, _query

from pyspark_cq import plan as P
from pyspark_cq.control.schema import side_drop_ratios
from pyspark_cq.policies import Snapshot, SourceStats

LINE = [_inst(i, rows, 0.2 + 0.001 * rows) for i, rows in enumerate([100, 300, 200, 400, 300])]


def _drop(policy, history, drop=0.0, **kw):
    """The drop ratio the policy writes after ``history`` with ``drop`` in the control table (None: none)."""
    decisions = list(policy.decide(Snapshot(1.0, {"q": _query(history, drop=drop, **kw)})))
    return (decisions[0].changes["drop_ratio"], decisions[0].reason) if decisions else (None, "")


# -- raise in steps, lower at once --------------------------------------------------------------------


def test_a_rise_is_capped_at_raise_step_above_the_written_epsilon():
    """300 rows predicted at 0.5 s < 1.2 s: ε = 1 wanted; ε = 0.5 written, so 0.7 (drop 0.3). (Not
    ``adaptive``: an adaptive policy first holds ε, test_the_first_own_prediction_holds_epsilon.)"""
    drop, reason = _drop(RTStreamQoS(alpha=0.5, target=0.8, adaptive=False), LINE, drop=0.5)
    assert drop == pytest.approx(0.3)
    assert "keep ε = 0.700 (ε = 1.000 before the step cap: at most 0.2 above 0.500)" in reason
    # from 0.7 the next round may reach 0.9, then 1
    assert _drop(RTStreamQoS(alpha=0.5, target=0.8, adaptive=False), LINE, drop=0.3)[0] == pytest.approx(0.1)
    assert _drop(RTStreamQoS(alpha=0.5, target=0.8, adaptive=False), LINE, drop=0.1)[0] == 0.0
    # without a limit: all input at once (the paper's §4.4)
    drop, reason = _drop(RTStreamQoS(alpha=0.5, target=0.8, raise_step=None), LINE, drop=0.5)
    assert drop == 0.0 and "step cap" not in reason


def test_the_first_own_prediction_holds_epsilon():
    """An adaptive policy's first prediction has no measured error behind it (its scale is 1 for want of
    data): it may lower ε but not raise it. Once an instance ran with a prediction, ε rises by the step."""
    policy = RTStreamQoS(alpha=0.5, target=0.8)
    drop, reason = _drop(policy, LINE[:4], drop=0.5)
    assert drop is None                        # ε = 0.5 held: the control table holds it already
    assert policy.predictions[-1].kept == pytest.approx(0.5)
    # instance 4 ran with that prediction (kept 0.5 of 300 rows: 0.35 s, as predicted): the scale is measured
    ran = _inst(4, 300, 0.2 + 0.001 * 150, kept=0.5)
    drop, reason = _drop(policy, LINE[:4] + [ran], drop=0.5)
    assert drop == pytest.approx(0.3) and "at most 0.2 above 0.500" in reason
    # a fall is not held: a heavy instance lowers ε at once on the first prediction too
    fresh = RTStreamQoS(alpha=0.5, target=0.8)
    assert _drop(fresh, LINE + [_inst(5, 1500, 1.7)])[0] == pytest.approx(1 / 3, abs=1e-3)
    # a join query holds its level the same way
    assert _join_level(J.HISTORY[:5], 0.4, adaptive=True)[0] == 0.4


def test_a_fall_is_not_capped():
    """The 1500-row step predicts 1.7 s: ε = (1.2 − 0.2)/1.5 = 2/3 at once from 1 (a fall of 1/3 > 0.2)."""
    policy = RTStreamQoS(alpha=0.5, target=0.8, raise_step=0.1)
    drop, reason = _drop(policy, LINE + [_inst(5, 1500, 1.7)])
    assert drop == pytest.approx(1 / 3, abs=1e-3) and "step cap" not in reason


def test_the_admissions_a_priori_epsilon_counts_as_written():
    """Admission keeps ε = 0.8·1.5 / 2 = 0.6 (drop 0.4); the first measured instances (0.9 s for 800 rows)
    want all input, the step allows 0.8."""
    plan = P.Select(P.Source("s"), 0.5, cost=0.001)
    src = {"s": SourceStats("s", 1000.0, 1e-3)}
    policy = RTStreamQoS(target=0.8, adaptive=False)
    (d,) = policy.admit(_query([], plan=plan, sources=src), Snapshot()).decisions
    assert d.changes["drop_ratio"] == pytest.approx(0.4)
    hist = [_inst(0, 800, 0.9), _inst(1, 800, 0.9)]
    drop, reason = _drop(policy, hist, drop=0.4, plan=plan, sources=src)
    assert drop == pytest.approx(0.2) and "above 0.600" in reason


def test_the_step_cap_follows_the_negotiation_cap():
    """Two queries of 1.0 s (0.1 s fixed) per 2 s period, capacity 0.6: 2·(0.05 + k·0.45) <= 0.6 gives the
    linear tables' quality 0.55, ε = 0.55 each. With ε = 0.1 written the step allows 0.3; with 0.5, 0.7 and
    the negotiated 0.55 stands."""
    hist = [_inst(i, rows, 0.1 + 0.0009 * rows) for i, rows in enumerate([500, 1500, 1000])]

    def drops(raise_step, drop):
        policy = RTStreamQoS(capacity=0.6, target=1.0, raise_step=raise_step, adaptive=False)
        snap = Snapshot(1.0, {n: _query(hist, name=n, drop=drop) for n in ("a", "b")})
        return {d.query: d.changes["drop_ratio"] for d in policy.decide(snap)}
    assert drops(None, 0.9) == {"a": pytest.approx(0.45), "b": pytest.approx(0.45)}
    assert drops(0.2, 0.9) == {"a": pytest.approx(0.7), "b": pytest.approx(0.7)}
    assert drops(0.2, 0.5) == {"a": pytest.approx(0.45), "b": pytest.approx(0.45)}


# -- join levels ----------------------------------------------------------------------------------------

# HISTORY without the load step: 300 rows predicted at 0.5 s, all input fits. Time shares of TABLE's levels
# under DECIDE_PLAN (test_rtstream_join) at 150 rows per input: (150·ε_L + 150·ε_R + 150²·ε_L·ε_R/375) / 360,
# so 0.4 -> 120/360 = 0.333, 0.7 -> 219/360 = 0.608, 1 -> 1.
LEVEL = {0.4: {"drop_left": 0.75, "drop_right": 0.5}, 0.7: {"drop_left": 0.5, "drop_right": 0.2},
         1.0: {"drop_left": 0.0, "drop_right": 0.0}}


def _join_level(history, written, raise_step=0.2, adaptive=False):
    policy = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": J.TABLE}, raise_step=raise_step, adaptive=adaptive)
    q = J._query(2.0, history, plan=J.DECIDE_PLAN, control={"drop_ratio": 0.0, "params": LEVEL[written]})
    decisions = list(policy.decide(Snapshot(1.0, {"j": q})))
    if not decisions:
        return written, ""
    (d,) = decisions
    kept = tuple(1 - x for x in side_drop_ratios(d.changes, (0.0, 0.0)))
    return next(lv[0] for lv in J.TABLE.levels if lv[1:] == pytest.approx(kept)), d.reason


def test_join_levels_rise_one_level_at_a_time_beyond_the_step():
    """From 0.4 (share 0.333) the step allows 0.533, but the next level (0.608) is always allowed: 0.7, not 1."""
    light = J.HISTORY[:5]
    level, reason = _join_level(light, 0.4)
    assert level == 0.7 and "level 1 before the step cap: time share at most 0.608, 0.333 written" in reason
    assert _join_level(light, 0.7)[0] == 1.0          # from 0.608 the step allows 0.808, the next level is 1
    assert _join_level(light, 0.4, raise_step=None)[0] == 1.0
    assert _join_level(light, 0.4, raise_step=0.7)[0] == 1.0     # 0.333 + 0.7 >= 1


def test_join_levels_fall_at_once():
    """A 3000-row instance overrunning its period leaves less than the fixed cost: from 1 to the lowest."""
    heavy = J.HISTORY + [J._inst(6, 3000, 3.2)]
    assert _join_level(heavy, 1.0)[0] == 0.4
    assert _join_level(J.HISTORY, 1.0)[0] == 0.7      # the load step (test_rtstream_join): 0.7 at once


# -- the error scale ----------------------------------------------------------------------------------------


def test_predicted_for_rescales_to_the_rows_and_fraction_the_instance_ran():
    pred = Prediction("q", 4, rows=1000, time_full=2.2, fixed=0.2, kept=0.5, time=1.2)
    # 1200 rows of which 40 % kept: 480 of the 1000 rows' per-row part, 0.2 + 0.48·2
    assert predicted_for(pred, _inst(5, 1200, 1.0, kept=0.4)) == pytest.approx(1.16)
    join = Prediction("j", 4, rows=1500, time_full=1.7, fixed=0.2, kept=0.525, time=0.9875, kept_sides=(0.5, 0.8))
    assert predicted_for(join, _inst(5, 1500, 1.0)) == pytest.approx(0.9875)   # the level's share
    assert predicted_for(join, _inst(5, 3000, 1.0)) == pytest.approx(0.2 + 2 * 0.525 * 1.5)


def test_an_instance_is_matched_with_the_prediction_in_force():
    """The decision after 5 (ε 0.8) reaches 6 unless 6 was triggered at once after 5's overrun: then 6 ran
    with the decision after 4 (ε 0.5), which its measured kept fraction shows."""
    def pred(after, kept, query="q"):
        return Prediction(query, after, 1000, 1.0, 0.1, kept, 0.5)
    preds = [pred(4, 0.5), pred(5, 0.3, query="other"), pred(5, 0.8)]
    pairs = lambda kept: matched_predictions(preds, "q", [_inst(6, 1000, 1.0, kept=kept)])   # noqa: E731
    assert pairs(0.8)[0][0] is preds[2]
    assert pairs(0.51)[0][0] is preds[0]
    assert pairs(0.3)[0][0] is preds[2]            # neither agrees: the latest
    # no prediction before the instance, or an empty one: none
    assert matched_predictions(preds, "q", [_inst(4, 1000, 1.0), _inst(6, 0, 0.1)]) == []


def test_overrunning_predictions_raise_the_scale_and_lower_epsilon():
    """Predictions made after instances 2, 3, 4 were exceeded 1.5, 1.25 and 1 times: smoothed (α = 0.5)
    1.5 -> 1.375 -> 1.1875. The load step then predicts T = 1.7 s, fixed 0.2: scaled, ε = (1.2 − 1.1875·0.2)
    / (1.1875·1.5) = 0.5404 instead of 2/3."""
    history = LINE + [_inst(5, 1500, 1.7)]
    policy = RTStreamQoS(alpha=0.5, target=0.8)
    policy.predictions += [Prediction("q", 2, 400, 0.4, 0.1, 1.0, 0.4),       # instance 3: 0.6 s, 1.5×
                           Prediction("q", 3, 300, 0.4, 0.1, 1.0, 0.4),       # instance 4: 0.5 s, 1.25×
                           Prediction("q", 4, 1500, 1.7, 0.2, 1.0, 1.7)]      # instance 5: on time
    drop, reason = _drop(policy, history)
    assert policy.error_scale("q") == pytest.approx(1.1875)
    eps = (1.2 - 1.1875 * 0.2) / (1.1875 * 1.5)
    assert drop == pytest.approx(1 - eps, abs=1e-3) and "× 1.19 error scale" in reason
    pred = policy.predictions[-1]
    assert pred.scale == pytest.approx(1.1875) and pred.time == pytest.approx(1.2)
    assert pred.time_full == pytest.approx(1.7) and pred.fixed == pytest.approx(0.2)   # the profile's own
    # not adaptive: the paper's ε = D/T
    plain = RTStreamQoS(alpha=0.5, target=0.8, adaptive=False)
    plain.predictions += policy.predictions[:3]
    drop, reason = _drop(plain, history)
    assert drop == pytest.approx(1 / 3, abs=1e-3) and "error scale" not in reason
    assert plain.error_scale("q") == 1.0


def test_accurate_predictions_leave_the_scale_at_one():
    """The policy's own predictions on the exact line: every instance ran as predicted."""
    policy = RTStreamQoS(alpha=0.5, target=0.8)
    history, reasons = [], []
    # the load step, then an instance that kept the 2/3 decided after it: 0.2 + 1000 rows·1 ms
    for inst in LINE + [_inst(5, 1500, 1.7), _inst(6, 1500, 1.2, kept=2 / 3)]:
        history.append(inst)
        reasons.append(_drop(policy, history, drop=0.0 if inst.batch < 6 else 1 / 3)[1])
    assert len(policy.predictions) == 6 and policy.error_scale("q") == 1.0
    assert "× 1.00 error scale" in reasons[5]
    assert [(p.after_batch, i.batch) for p, i in matched_predictions(policy.predictions, "q", history)] == [
        (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]


def test_the_scale_follows_a_profile_that_lags_a_slower_machine_and_is_bounded():
    """From instance 5 on every row costs 3 ms instead of 1 ms: the profile (α = 0.5) lags, the instances
    run longer than predicted, the scale rises above 1 (bounded by MAX_ERROR_SCALE) and ε falls below what
    the same profile alone gives."""
    adaptive, plain = RTStreamQoS(alpha=0.5, target=0.8), RTStreamQoS(alpha=0.5, target=0.8, adaptive=False)
    history = list(LINE)
    for b in range(5, 9):
        history.append(_inst(b, 400, 0.2 + 0.003 * 400))
        drops = [_drop(p, history)[0] for p in (adaptive, plain)]
    assert 1.0 < adaptive.error_scale("q") <= MAX_ERROR_SCALE and plain.error_scale("q") == 1.0
    assert drops[0] > drops[1]
    wild = RTStreamQoS(alpha=0.5)
    wild.predictions.append(Prediction("q", 4, 300, 0.05, 0.01, 1.0, 0.05))      # instance 5 ran 34× longer
    wild.decide(Snapshot(1.0, {"q": _query(history[:6])}))
    assert wild.error_scale("q") == MAX_ERROR_SCALE


def test_remove_forgets_the_error_scale():
    policy = RTStreamQoS(alpha=0.5)
    policy.predictions.append(Prediction("q", 4, 300, 0.25, 0.1, 1.0, 0.25))
    policy.decide(Snapshot(1.0, {"q": _query(LINE + [_inst(5, 300, 0.5)])}))
    assert policy.error_scale("q") == pytest.approx(0.5 / 0.25)
    policy.remove("q")
    assert policy.error_scale("q") == 1.0


# -- validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, error, match", [
    ({"raise_step": 0}, ValueError, r"raise_step must be in \(0, 1\] or None, got 0"),
    ({"raise_step": 1.5}, ValueError, "raise_step"), ({"raise_step": True}, ValueError, "raise_step"),
    ({"raise_step": "0.2"}, ValueError, "raise_step"),
    ({"adaptive": 1}, TypeError, "adaptive must be True or False, got 1"),
    ({"adaptive": None}, TypeError, "adaptive"),
])
def test_bad_headroom_arguments_are_named(kw, error, match):
    with pytest.raises(error, match=match):
        RTStreamQoS(**kw)
    with pytest.raises(error, match=match):      # the sampling variants take them too
        FixedSampling(**kw)


def test_headroom_arguments_are_kept():
    policy = RTStreamQoS(raise_step=1, adaptive=False, quality={"j": JoinQualityTable([(0.5, 0.5, 0.5), (1, 1, 1)])})
    assert policy.raise_step == 1 and policy.adaptive is False
    assert RTStreamQoS().raise_step == 0.2 and RTStreamQoS().adaptive is True


def test_predictions_are_kept_per_query_only_as_long_as_the_instances_behind_them():
    from pyspark_cq.policies import INSTANCES_KEPT

    policy = RTStreamQoS()
    for k in range(INSTANCES_KEPT + 5):
        for q in ("a", "b") if k < 3 else ("a",):
            policy._record(Prediction(q, k, 100.0, 1.0, 0.1, 1.0, 1.0))
    mine = [p.after_batch for p in policy.predictions if p.query == "a"]
    assert mine == list(range(5, INSTANCES_KEPT + 5))
    assert [p.after_batch for p in policy.predictions if p.query == "b"] == [0, 1, 2]


# -- joins in the Figure 7 negotiation ------------------------------------------------------------------


def test_a_join_query_takes_part_in_the_negotiation_through_its_time_shares():
    """A selection query "q" (LINE: 300 rows, 0.5 s of which 0.2 fixed, P = 2) and the join "j" (the same
    profile; TABLE's levels keep the time shares 0.333, 0.608, 1: quality 0.4, 0.7, 1, linear between), with
    capacity 0.4: Σ 0.1 + 0.15·k_i <= 0.4 holds at quality 0.71 (0.71 + 0.621 <= 4/3), not at 0.72. The
    selection keeps 0.71; the join, bounded to time share 0.621, the level 0.7 (share 0.608), though alone
    each would keep all its input (0.5 s < 0.8·D)."""
    policy = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": J.TABLE}, capacity=0.4)
    join = J._query(2.0, J.HISTORY[:5], plan=J.DECIDE_PLAN)
    out = {d.query: d for d in policy.decide(Snapshot(1.0, {"q": _query(LINE), "j": join}))}
    assert out["q"].changes["drop_ratio"] == pytest.approx(0.29)
    assert out["j"].changes == {"params": {"drop_left": 0.5, "drop_right": 0.2}}
    assert "time share at most 0.621 negotiated" in out["j"].reason
    # without the capacity bound neither sheds
    alone = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": J.TABLE})
    assert len(alone.decide(Snapshot(1.0, {"q": _query(LINE), "j": join}))) == 0


def test_a_join_table_whose_levels_all_keep_everything_counts_as_load_nothing_sheds():
    """Levels (0.5, 1, 1) and (1, 1, 1) keep the whole time share: the join's 0.25 of the capacity 0.4 is
    fixed, so the selection alone gives way: 0.1 + 0.15·k <= 0.15, k = 1/3 (quality 0.33), the join stays."""
    flat = JoinQualityTable([(0.5, 1, 1), (1, 1, 1)])
    policy = RTStreamQoS(alpha=0.5, target=0.8, quality={"j": flat}, capacity=0.4)
    join = J._query(2.0, J.HISTORY[:5], plan=J.DECIDE_PLAN)
    assert policy._share_table(join, 300.0) is None
    out = {d.query: d for d in policy.decide(Snapshot(1.0, {"q": _query(LINE), "j": join}))}
    assert set(out) == {"q"} and out["q"].changes["drop_ratio"] == pytest.approx(0.67)
