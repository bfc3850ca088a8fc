"""RTStream (Wei, Prasad, Son & Stankovic): periodic instances, input/quality tables, the Figure 7
negotiation, the prediction-based policy and the §5.2 baselines, on synthetic snapshots (no Spark)."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from pyspark_cq_plugins.rtstream import Profile, QualityTable, RTStreamQoS, negotiate, shedding_operator
from pyspark_cq_plugins.rtstream_baselines import BestEffort, FeedbackControl
from pyspark_cq_plugins.rtstream_dynamic_sampling import DynamicSampling
from pyspark_cq_plugins.rtstream_fixed_sampling import FixedSampling

from pyspark_cq import plan as P
from pyspark_cq.cost import rtstream
from pyspark_cq.policies import Instance, OperatorStats, QueryInfo, Snapshot, SourceStats, periodic_spec
from pyspark_cq.runtime.stats import StatisticsStore, backlog_rows

# Figure 6's three curves as tables that give the paper's example: at 70 % quality Q0 (convex) drops 75 %,
# Q1 (linear) 30 %, Q2 (concave) 3 % of its input (§4.3).
FIG6 = {"q0": QualityTable([(0, 0), (0.25, 0.7), (1, 1)]), "q1": QualityTable.linear(),
        "q2": QualityTable([(0, 0), (0.97, 0.7), (1, 1)])}


def test_quality_tables_give_the_papers_drop_ratios():
    assert {q: round(1 - t.kept_for(0.7), 6) for q, t in FIG6.items()} == {"q0": 0.75, "q1": 0.3, "q2": 0.03}
    assert FIG6["q0"].quality(0.25) == pytest.approx(0.7) and FIG6["q0"].quality(1.0) == 1.0
    for t in FIG6.values():      # kept_for inverts quality
        for k in (0.1, 0.5, 0.9, 1.0):
            assert t.quality(t.kept_for(t.quality(k))) == pytest.approx(t.quality(k))


@pytest.mark.parametrize("points, match", [
    ([(0, 0.5), (0.5, 0.4), (1, 1)], "non-decreasing"),
    ([(0, 0), (1, 1.2)], r"points\[1\] quality must be a number in \[0, 1\]"),
    ([(0, 0), (0.5, 0.5), (0.9, 0.9)], "must end at"),
    ([(0.5, 0), (0.2, 0.1), (1, 1)], "strictly increasing"),
    ([(0, 0)], "at least two"),
])
def test_bad_quality_tables_are_rejected(points, match):
    with pytest.raises((TypeError, ValueError), match=match):
        QualityTable(points)


def test_figure_7_negotiation_on_the_papers_numbers():
    est = {"q0": 10.0, "q1": 10.0, "q2": 10.0}
    # at 70 %: 10·(0.25 + 0.7 + 0.97) = 19.2 fits; at 71 % 10·(0.275 + 0.71 + 0.971) = 19.56 does not
    deal = negotiate(est, FIG6, 19.2)
    assert deal.feasible and deal.quality == pytest.approx(0.7)
    assert {q: round(1 - k, 6) for q, k in deal.kept.items()} == {"q0": 0.75, "q1": 0.3, "q2": 0.03}
    assert sum(deal.times.values()) == pytest.approx(19.2)
    # pseudo-deadlines proportional to the estimated times
    assert deal.pseudo_deadlines["q2"] / deal.pseudo_deadlines["q0"] == pytest.approx(9.7 / 2.5)
    assert negotiate(est, FIG6, 30.0).quality == 1.0          # no overload: full quality
    low = negotiate(est, FIG6, 2.5, fixed=dict.fromkeys(est, 1.0))   # even quality 0 leaves 3 s of fixed cost
    assert not low.feasible and low.quality == 0.0
    # a fixed cost is not reduced by dropping
    fixed = negotiate({"q1": 10.0}, FIG6, 6.0, fixed={"q1": 2.0})
    assert fixed.quality == pytest.approx(0.5) and fixed.times["q1"] == pytest.approx(6.0)


def test_negotiation_degrades_the_queries_whose_quality_falls_least():
    """Convex queries give up most input for the same quality loss (§4.3)."""
    deal = negotiate({"q0": 10.0, "q2": 10.0}, FIG6, 12.0)
    assert deal.kept["q0"] < 0.3 < 0.9 < deal.kept["q2"]


@pytest.mark.parametrize("kw, match", [
    (dict(estimates={}, tables=FIG6, available=1.0), "estimates must be a non-empty mapping"),
    (dict(estimates={"qx": 1.0}, tables=FIG6, available=1.0), "no QualityTable for query 'qx'"),
    (dict(estimates={"q1": -1.0}, tables=FIG6, available=1.0), r"estimates\['q1'\]"),
    (dict(estimates={"q1": 1.0}, tables=FIG6, available=0.0), "available must be a positive"),
    (dict(estimates={"q1": 1.0}, tables=FIG6, available=1.0, step=0.0), "step must be in"),
    (dict(estimates={"q1": 1.0}, tables=FIG6, available=1.0, fixed={"q1": 2.0}), r"fixed\['q1'\]"),
])
def test_negotiation_validates_its_arguments(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        negotiate(**kw)


@pytest.mark.parametrize("period, deadline, match", [
    (1.0, 2.0, "deadline must be <= period"), (0, None, "period must be a positive"),
    (-1.0, None, "period must be a positive"), (1.0, 0.0, "deadline must be a positive"),
    (None, 1.0, "deadline needs a period"), (True, None, "period must be a positive number"),
])
def test_periodic_spec_errors_name_the_argument(period, deadline, match):
    with pytest.raises((TypeError, ValueError), match=match):
        periodic_spec(period, deadline)


def test_periodic_spec_accepts_durations():
    assert periodic_spec("2 seconds", "1500 milliseconds") == (2.0, 1.5)
    assert periodic_spec(3, None) == (3.0, 3.0)
    assert periodic_spec(None, None) == (None, None)


# -- instances from query progress -----------------------------------------------------------------

def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _progress(batch, start, duration_ms, rows, shed=0, op_in=None, sources=None):
    report = {"input_rows": rows if op_in is None else op_in, "output_rows": rows - shed, "shed_rows": shed}
    return {"name": "q", "batchId": batch, "timestamp": _iso(start), "batchDuration": duration_ms,
            "numInputRows": rows, "inputRowsPerSecond": 10.0, "sources": sources or [],
            "observedMetrics": {"chain": report}}


def test_instances_record_release_lateness_misses_and_quality():
    store = StatisticsStore()
    store.register("q", operators=["chain"], period=2.0, deadline=1.5)
    t0 = 1_700_000_000.0          # a multiple of 2 s
    store.update(_progress(0, t0 + 0.001, 1000, 100))                 # ends at 1.001 < 1.5: met
    store.update(_progress(1, t0 + 2.002, 1700, 100, shed=25))        # ends at 3.702 > 3.5: missed by 0.202
    store.update(_progress(2, t0 + 3.702, 300, 100))                  # started late (overrun), release t0+2
    inst = store.instances("q")
    assert [i.batch for i in inst] == [0, 1, 2]
    assert [i.release - t0 for i in inst] == pytest.approx([0.001, 2.0, 2.0], abs=1e-6)   # the first: at once
    assert [i.missed for i in inst] == [False, True, True]
    assert inst[1].lateness == pytest.approx(0.202, abs=1e-6)
    assert inst[1].shed_rows == 25 and inst[1].kept == pytest.approx(0.75) and inst[0].kept == 1.0
    info = store.query_info("q")
    assert info.period == 2.0 and info.deadline == 1.5 and len(info.instances) == 3
    plain = StatisticsStore()
    plain.register("q")
    plain.update(_progress(0, t0, 1000, 100))
    assert plain.instances("q") == [] and plain.query_info("q").period is None


def test_backlog_from_source_offsets():
    kafka = {"description": "KafkaV2[Subscribe[t]]", "numInputRows": 300,
             "startOffset": json.dumps({"t": {"0": 100, "1": 100}}), "endOffset": {"t": {"0": 200, "1": 300}},
             "latestOffset": json.dumps({"t": {"0": 250, "1": 350}})}
    # 300 rows over 300 offsets: 1 row per offset, 100 offsets waiting
    assert backlog_rows({"sources": [kafka]}) == pytest.approx(100.0)
    files = {"description": "FileStreamSource", "numInputRows": 10, "startOffset": None,
             "endOffset": {"logOffset": 0}, "latestOffset": None}
    assert backlog_rows({"sources": [files]}) is None


# -- the prediction-based policy on synthetic snapshots ----------------------------------------------

def _query(instances, drop=0.0, report=None, period=2.0, deadline=1.5, name="q", plan=None, sources=None,
           params=None):
    ops = {"chain": OperatorStats("chain", len(instances), report=report or {})}
    entry = {"drop_ratio": drop, **({"params": params} if params else {})}
    return QueryInfo(name, plan, {}, sources or {}, ops, {"chain": entry}, batches=len(instances),
                     period=period, deadline=deadline, instances=tuple(instances))


def _inst(batch, rows, duration, kept=1.0, t0=1_700_000_000.0):
    return Instance(batch, t0 + 2 * batch, t0 + 2 * batch, duration, 1.5, rows, round(rows * (1 - kept)), kept)


def test_profile_learns_fixed_and_per_row_cost():
    prof = Profile(0.5)
    for rows in (100, 300, 200, 400, 100, 300):
        prof.observe_instance(rows, 0.2 + 0.001 * rows)
    time, fixed = prof.predict(1000)
    assert fixed == pytest.approx(0.2, rel=1e-6) and time == pytest.approx(1.2, rel=1e-6)


def test_profile_uses_equation_1_over_the_timed_steps():
    prof = Profile(0.5)
    prof.observe_steps({"rows_in_a": 1000, "rows_passed_a": 500, "nanos_a": 1_000_000,
                        "rows_in_b": 500, "rows_passed_b": 100, "nanos_b": 2_000_000})
    # t = (1 µs, 4 µs), s = (0.5, 0.2): equation (1) for 10 000 rows = 10 000·1e-6 + 10 000·4e-6·0.5
    assert prof.order == ("a", "b")
    assert prof.operators_time(10_000) == pytest.approx(rtstream.chain_time(10_000, [1e-6, 4e-6], [0.5, 0.2]))
    assert prof.operators_time(10_000) == pytest.approx(0.03)


def test_policy_sheds_epsilon_d_over_t_after_a_load_step():
    policy = RTStreamQoS(alpha=0.5, target=0.8)
    history = [_inst(i, rows, 0.2 + 0.001 * rows) for i, rows in enumerate([100, 300, 200, 400, 300])]
    assert len(policy.decide(Snapshot(1.0, {"q": _query(history)}))) == 0   # 0.5 s < 0.8·1.5 s
    history.append(_inst(5, 1500, 1.7))                          # load step: misses D, within its period
    decisions = policy.decide(Snapshot(2.0, {"q": _query(history)}))
    (d,) = decisions
    time_full, fixed = policy.profile("q").predict(1500)
    assert time_full == pytest.approx(1.7) and fixed == pytest.approx(0.2)   # the first instance not profiled
    eps = rtstream.kept_fraction(time_full - fixed, 0.8 * 1.5 - fixed)                # ε = D/T (§4.4)
    assert d.operator == "chain" and d.changes["drop_ratio"] == pytest.approx(1 - eps, abs=1e-3)
    assert 0.3 < d.changes["drop_ratio"] < 0.4
    pred = policy.predictions[-1]
    assert pred.after_batch == 5 and pred.rows == 1500 and pred.time == pytest.approx(0.8 * 1.5, rel=1e-3)


def test_policy_takes_the_start_delay_of_an_overrun_from_the_time_left():
    policy = RTStreamQoS(alpha=0.5, target=0.8, min_kept=0.01)
    history = [_inst(i, rows, 0.2 + 0.0001 * rows) for i, rows in enumerate([100, 300, 200, 400, 300])]
    history.append(_inst(5, 3000, 2.3))          # overran its 2 s period by 0.3 s: the next starts 0.3 s late
    (d,) = policy.decide(Snapshot(2.0, {"q": _query(history)}))
    time_full, fixed = policy.profile("q").predict(3000)
    eps = rtstream.kept_fraction(time_full - fixed, 0.8 * 1.5 - 0.3 - fixed)
    assert d.changes["drop_ratio"] == pytest.approx(1 - eps, abs=1e-3)
    assert policy.predictions[-1].time == pytest.approx(0.8 * 1.5 - 0.3, rel=1e-3)
    assert "0.3 s start delay" in d.reason


def test_profile_reads_a_negative_fitted_cost_per_row_as_none():
    prof = Profile(0.5)
    for rows, duration in ((100, 0.9), (1000, 0.5), (100, 0.8), (1000, 0.4)):
        prof.observe_instance(rows, duration)
    time, fixed = prof.predict(5000)
    assert time == fixed and 0.4 < fixed < 0.9


def test_policy_ignores_queries_without_period_or_shedding_stage():
    policy = RTStreamQoS()
    hist = [_inst(0, 3000, 5.0), _inst(1, 3000, 5.0)]
    plain = QueryInfo("p", operators={}, control={"chain": {"drop_ratio": 0.0}})
    no_stage = QueryInfo("n", control={"chain": {"plan_id": "a>b"}}, period=2.0, deadline=1.5,
                         instances=tuple(hist))
    assert shedding_operator(no_stage) is None
    assert len(policy.decide(Snapshot(1.0, {"p": plain, "n": no_stage}))) == 0


def test_inter_query_negotiation_caps_kept_fractions():
    tables = {"a": FIG6["q0"], "b": FIG6["q2"]}
    # 0.1 s + 0.9 ms per row: the next 1000-row instances take 1 s per 2 s period, utilisation 0.5 each
    hist = [_inst(i, rows, 0.1 + 0.0009 * rows) for i, rows in enumerate([500, 1500, 1000])]
    policy = RTStreamQoS(capacity=0.6, quality=tables, target=1.0)
    snap = Snapshot(1.0, {"a": _query(hist, name="a"), "b": _query(hist, name="b")})
    drops = {d.query: d.changes["drop_ratio"] for d in policy.decide(snap)}
    assert drops["a"] > 0.5 > drops.get("b", 0.0)    # the convex query gives up more


def test_admission_rejects_a_query_that_cannot_meet_its_deadline():
    plan = P.Select(P.Source("s"), 0.5, cost=0.01)     # 10 ms per row
    src = {"s": SourceStats("s", 1000.0, 1e-3)}         # 1000 rows/s, 2000 rows per 2 s period: 20 s
    q = _query([], plan=plan, sources=src)
    verdict = RTStreamQoS(min_kept=0.1).admit(q, Snapshot())
    assert not verdict.accepted and "cannot meet its deadline" in verdict.reason and "ε = 0.1" in verdict.reason
    ok = RTStreamQoS(min_kept=0.01).admit(q, Snapshot())      # 0.8·1.5 s / 20 s = 6 % suffices
    assert ok.accepted and ok.decisions[0].changes["drop_ratio"] == pytest.approx(0.94, abs=1e-3)


def test_bad_policy_arguments_are_named():
    with pytest.raises(ValueError, match="target"):
        RTStreamQoS(target=0)
    with pytest.raises(ValueError, match="capacity"):
        RTStreamQoS(capacity=-1)
    with pytest.raises(TypeError, match=r"quality\['q'\]"):
        RTStreamQoS(quality={"q": [(0, 0), (1, 1)]})
    with pytest.raises(ValueError, match="gain"):
        FeedbackControl(gain=0)


def test_feedback_follows_lateness_and_best_effort_resets():
    fb = FeedbackControl(gain=0.5)
    late = _inst(0, 1000, 2.1)                   # lateness 0.6 s on D = 1.5 s: drop += 0.2
    (d,) = fb.decide(Snapshot(1.0, {"q": _query([late])}))
    assert d.changes["drop_ratio"] == pytest.approx(0.2)
    assert len(fb.decide(Snapshot(1.0, {"q": _query([late], drop=0.2)}))) == 0   # same instance: no change
    early = _inst(1, 1000, 0.75)                 # lateness −0.75 s: drop −= 0.25
    (d,) = fb.decide(Snapshot(2.0, {"q": _query([late, early], drop=0.4)}))
    assert d.changes["drop_ratio"] == pytest.approx(0.15)
    (d,) = BestEffort().decide(Snapshot(1.0, {"q": _query([late], drop=0.4)}))
    assert d.changes["drop_ratio"] == 0.0


# -- the sampler-plan baselines (§4.2, §5.1, §5.2.3) ---------------------------------------------------

# a sampler plan's report: 10 % of 1000 input rows through a (1 µs/row, s = 0.5) and b (40 µs/row, s = 0.2)
SAMPLED = {"sample_rows_in_a": 100, "sample_rows_passed_a": 50, "sample_nanos_a": 100_000,
           "sample_rows_in_b": 50, "sample_rows_passed_b": 10, "sample_nanos_b": 2_000_000,
           "rows_in_a": 1000, "rows_passed_a": 900, "nanos_a": 9_000_000}   # the chain's own: not read


def test_fixed_sampling_runs_the_sampler_plan_and_profiles_from_it():
    policy = FixedSampling(sample_ratio=0.1)
    (d,) = policy.decide(Snapshot(1.0, {"q": _query([])}))      # before any instance: start the sampler
    assert d.changes == {"params": {"sample_ratio": 0.1}}
    hist = [_inst(i, 1000, 0.2 + 0.0001 * 1000) for i in range(4)]
    q = _query(hist, report=SAMPLED, params={"sample_ratio": 0.1})
    policy.decide(Snapshot(2.0, {"q": q}))
    prof = policy.profile("q")
    assert prof.order == ("a", "b")                              # from the sample, not from rows_in_a
    t, s = prof.chain()
    assert t == pytest.approx([1e-6, 40e-6]) and s == pytest.approx([0.5, 0.2])
    # the sampler's own time, equation (1) at 10 % of every step's input, is predicted as not sheddable
    sampler = rtstream.chain_time(1000, [0.1e-6, 4e-6], [0.5, 0.2])
    assert prof.sampler_time(1000, 0.1) == pytest.approx(sampler)
    time_full, fixed = prof.predict(1000, sampler)
    assert fixed == pytest.approx(max(prof.rest.fit()[0], 0.0) + sampler)
    assert time_full == pytest.approx(fixed + prof.operators_time(1000) + prof.rest.fit()[1] * 1000)


def test_fixed_sampling_sheds_with_the_sampler_time_left_out_of_epsilon():
    policy = FixedSampling(sample_ratio=0.1, min_kept=0.01)
    hist = [_inst(i, rows, 0.2 + 0.0002 * rows) for i, rows in enumerate([100, 300, 200, 400, 300])]
    hist.append(_inst(5, 6000, 1.7))
    (d,) = policy.decide(Snapshot(2.0, {"q": _query(hist, report=SAMPLED, params={"sample_ratio": 0.1})}))
    pred = policy.predictions[-1]
    eps = rtstream.kept_fraction(pred.time_full - pred.fixed, 0.8 * 1.5 - pred.fixed)
    assert d.changes == {"drop_ratio": pytest.approx(round(1 - eps, 3))}
    assert pred.time == pytest.approx(0.8 * 1.5, rel=1e-2)


def test_dynamic_sampling_samples_cheap_operators_more_than_expensive_ones():
    policy = DynamicSampling(budget=0.05, min_ratio=0.01, max_ratio=0.2)
    (d,) = policy.decide(Snapshot(1.0, {"q": _query([])}))
    assert d.changes == {"params": {"sample_ratio": 0.2}}     # no profile yet: the largest ratio
    hist = [_inst(i, 1000, 0.3) for i in range(3)]
    (d,) = policy.decide(Snapshot(2.0, {"q": _query(hist, report=SAMPLED, params={"sample_ratio": 0.2})}))
    ratios = d.changes["params"]["sample_ratio"]
    # c = (1 µs, 40 µs·0.5 = 20 µs) per input row: r_j = 0.05·21 / (2·c_j) -> a: 0.525 -> 0.2, b: 0.026
    assert ratios == {"a": 0.2, "b": pytest.approx(0.026)}
    assert ratios["a"] > ratios["b"]
    # the worker evaluates a on at least b's sample (nested samples), which the prediction accounts for
    prof = policy.profile("q")
    assert prof.sampler_time(1000, ratios) == pytest.approx(rtstream.chain_time(1000, [0.2e-6, 40e-6 * 0.026],
                                                                                  [0.5, 0.2]))


def test_sampling_policies_name_bad_arguments():
    with pytest.raises(ValueError, match="sample_ratio"):
        FixedSampling(sample_ratio=0)
    with pytest.raises(ValueError, match="budget"):
        DynamicSampling(budget=1.0)
    with pytest.raises(ValueError, match="min_ratio"):
        DynamicSampling(min_ratio=0.5, max_ratio=0.1)


def test_sample_ratios_are_nested_and_validated():
    from pyspark_cq.operators.select_chain import sample_ratios
    assert sample_ratios(None, ["a"], where="x") is None and sample_ratios({"sample_ratio": 0}, ["a"], where="x") is None
    assert sample_ratios({"sample_ratio": 0.1}, ["a", "b"], where="x") == [0.1, 0.1]
    assert sample_ratios({"sample_ratio": {"b": 0.3}}, ["a", "b"], where="x") == [0.3, 0.3]
    with pytest.raises(ValueError, match=r"unknown predicates \['c'\]"):
        sample_ratios({"sample_ratio": {"c": 0.1}}, ["a", "b"], where="x")
    with pytest.raises(ValueError, match=r"params\['sample_ratio'\] must be a fraction"):
        sample_ratios({"sample_ratio": 1.5}, ["a"], where="x")


def test_admission_drop_ratio_reaches_a_shedding_stage_made_after_admission():
    plan = P.Select(P.Source("s"), 0.5, cost=0.001)     # 1 ms per row, 1000 rows/s: 2000 rows per 2 s = 2 s
    src = {"s": SourceStats("s", 1000.0, 1e-3)}
    bare = QueryInfo("q", plan, {}, src, {}, {}, period=2.0, deadline=1.5)   # the builder has not run yet
    policy = RTStreamQoS(target=0.8, adaptive=False)   # adaptive would hold ε on its first own prediction
    verdict = policy.admit(bare, Snapshot())
    assert verdict.accepted and len(verdict.decisions) == 0
    (d,) = policy.decide(Snapshot(1.0, {"q": _query([], plan=plan, sources=src)}))   # the stage exists now
    assert d.changes["drop_ratio"] == pytest.approx(1 - 0.8 * 1.5 / 2.0, abs=1e-3) and "a priori" in d.reason
    # after the first measured instances the prediction takes over (the first one is not profiled)
    hist = [_inst(0, 800, 0.9), _inst(1, 800, 0.9)]
    (d,) = policy.decide(Snapshot(2.0, {"q": _query(hist, drop=0.4, plan=plan, sources=src)}))
    assert "predicted" in d.reason and "a priori" not in d.reason


def test_profile_clamps_a_slope_fitted_on_barely_varying_rows():
    # rows 44 000 and 43 600 (1 % shed) with 0.3 s of noise: the raw fit is ~750 µs per row and a fixed cost
    # of −33 s, which would predict 33 s for 44 000 rows; clamped, the line passes through the means
    prof = Profile(0.5)
    for rows, duration in ((44_000, 1.5), (44_000, 1.4), (43_600, 1.2), (44_000, 1.5)):
        prof.observe_instance(rows, duration)
    fixed, per_row = prof.rest.fit()
    assert fixed >= 0 and 0 <= per_row <= 1.5 / 43_000
    time, _ = prof.predict(44_000)
    assert 1.2 <= time <= 1.5


def test_start_delay_after_the_first_instance_counts_from_the_next_multiple_of_the_period():
    from pyspark_cq_plugins.rtstream import _start_delay
    t0 = 1_700_000_000.0                                   # a multiple of 2 s
    # the first instance starts at once at t0 + 1.5 (not a multiple of P = 2) and ends at t0 + 3.2: Spark
    # triggers the next one at once, 1.2 s after its release t0 + 2 (release + P of the first is t0 + 3.5)
    first = Instance(0, t0 + 1.5, t0 + 1.5, 1.7, 1.5, 100, 0, 1.0)
    assert _start_delay(first, 2.0) == pytest.approx(1.2)
    later = Instance(1, t0 + 4, t0 + 4.1, 1.0, 1.5, 100, 0, 1.0)  # ends t0 + 5.1 before t0 + 6: no delay
    assert _start_delay(later, 2.0) == 0.0


@pytest.mark.parametrize("now, period, expected", [
    (99.0, 3.0, 0.0),        # at a multiple
    (99.3, 3.0, 0.0),        # within a tenth of P after one: start now
    (99.31, 3.0, 2.69),      # past the slack: wait for 102
    (101.999, 3.0, 0.001),
    (1_764_143_000.5, 2.0, 1.5),
])
def test_release_wait_starts_periodic_queries_at_multiples_of_the_period(now, period, expected):
    from pyspark_cq.runtime.core import release_wait

    wait = release_wait(now, period)
    assert wait == pytest.approx(expected, abs=1e-6)
    assert (now + wait) % period == pytest.approx(0.0, abs=1e-6) or wait == 0.0


@pytest.mark.parametrize("period, slack, match", [(0, 0.1, "period"), (-1.0, 0.1, "period"), (True, 0.1, "period"),
                                                  (3.0, 1.0, "slack"), (3.0, -0.1, "slack")])
def test_release_wait_bad_arguments(period, slack, match):
    from pyspark_cq.runtime.core import release_wait

    with pytest.raises(ValueError, match=match):
        release_wait(100.0, period, slack)
