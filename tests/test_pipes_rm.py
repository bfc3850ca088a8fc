"""PIPES resource manager (Cammert et al., §4.1, §4.3) against hand-computed cases and brute force."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark_cq_plugins.pipes_rm import DEFAULT_PROFILE, PipesResourceManager, pipes_estimate

from pyspark_cq import plan as P
from pyspark_cq.cost import pipes
from pyspark_cq.experiments import pipes_workload as W
from pyspark_cq.policies import OperatorStats, QoSRange, QueryInfo, Snapshot, SourceStats

S, MS = 1_000_000, 1_000


def toy_estimate(plan, distances):
    """An independent, linear cost: elements of each window (size/d) plus 1000/g per granularity node."""
    mem = cpu = 0.0
    for node in P.postorder(plan):
        if isinstance(node, P.Window):
            d = distances[node.child.name]
            mem += node.size / d
            cpu += 1.0 / d
        elif isinstance(node, P.Granularity):
            mem += 1000.0 / node.granularity
    return mem, cpu


def window_query(name, source="A", w=(1 * S, 10 * S), d_s=1e-4, gran=None):
    """One window (QoS ``w``) over ``source``, optionally under Γ with QoS ``gran`` = (coarsest, finest)."""
    wl = f"{name}-w.window"
    node = P.Window(P.Source(source), w[1], label=wl)
    qos = {wl: QoSRange.window(*w, step=1)}  # 1 µs explicitly: the brute-force checks model windows as continuous
    if gran is not None:
        gl = f"{name}-g.granularity"
        node = P.Aggregate(P.Granularity(node, gran[1], label=gl))
        qos[gl] = QoSRange.granularity(*gran)
    return QueryInfo(name, node, qos, {source: SourceStats(source, 1 / d_s, d_s)})


def rm_with(queries, **kw):
    kw.setdefault("estimate", toy_estimate)
    kw.setdefault("reserve", 0.0)
    rm = PipesResourceManager(**kw)
    for q in queries:
        rm.add(q)
        for s, st_ in q.sources.items():
            rm.set_distance(s, st_.distance)
    return rm


# ---------------------------------------------------------------------------------------------
# the cost-model wiring, hand-computed


def test_pipes_estimate_window_join_equation_9():
    # d = 100 ms, w = 10 s (time unit 1 ms): ω gives l = ⌊(10000 + 1)/1⌋ = 10001, d' = d (Formula 7);
    # eq. (9): per side ⌈10001/100⌉ + 100/(2·100) = 101.5 elements, two sides, 64 bytes each.
    plan = P.Join(P.Window(P.Source("a"), 10_000.0), P.Window(P.Source("b"), 10_000.0), selectivity=0.01)
    mem, _ = pipes_estimate(plan, {"a": 100.0, "b": 100.0})
    assert mem == pytest.approx(2 * 101.5 * 64)


def test_pipes_estimate_aggregation_equation_15():
    # ω(10 s) over d = 100 ms: (100, 10001, 1); Γ(1000 ms), l >= 2ĝ: (100, 9001, 1000) (Formula 8);
    # eq. (15): ⌈(9001/1000)·(1 − (1 − 1/100)^1000)⌉ = ⌈9.0006⌉ = 10 aggregates of 64 bytes.
    plan = P.Aggregate(P.Granularity(P.Window(P.Source("a"), 10_000.0), 1000.0))
    mem, _ = pipes_estimate(plan, {"a": 100.0})
    assert 9.001 * (1 - 0.99 ** 1000) == pytest.approx(9.0006, abs=1e-4)
    assert mem == pytest.approx(10 * 64)


def test_resource_manager_costs_in_its_time_unit():
    """A join query with a fixed 10 s window (QoS [10 s, 10 s]) over two streams at 10 rows/s costs the
    hand-computed eq. (9) value: the RM converts µs plan sizes and second distances to milliseconds."""
    wl = "j.window"
    plan = P.Join(P.Window(P.Source("a"), 10 * S, label=wl), P.Window(P.Source("b"), 10 * S, label=wl),
                  selectivity=0.01)
    info = QueryInfo("q", plan, {wl: QoSRange.window(10 * S, 10 * S)},
                     {"a": SourceStats("a", 10.0, 0.1), "b": SourceStats("b", 10.0, 0.1)})
    rm = PipesResourceManager()
    rm.add(info)
    rm.set_distance("a", 0.1)
    rm.set_distance("b", 0.1)
    a = rm.replan()
    assert a.memory == pytest.approx(2 * 101.5 * 64)
    assert rm.exact_estimate("q")[0] == pytest.approx(2 * 101.5 * 64)
    assert rm.settings("q") == {wl: 10 * S}


# ---------------------------------------------------------------------------------------------
# the strategy against brute force (toy linear cost)


def brute_force(specs, budget, p, grid=4_001):
    """§4.3 by exhaustive search with plain arithmetic: step 1 over j = 0..p with f = (p-j)/p for both;
    step 2 the largest window fraction on a fine grid with the granularities of step 1.
    ``specs``: (w_range µs, gran_range µs (coarsest, finest) or None, d in ms)."""

    def gran_ms(gran, f):
        coarse, fine = gran
        target = coarse + f * (fine - coarse)
        k = math.floor(target / fine)
        down, up = k * fine, (k + 1) * fine
        pick = up if abs(up - target) <= abs(target - down) else down   # ties towards the coarser side
        return min(max(pick, fine), coarse) / MS

    def total(fs, j):
        m = np.zeros_like(fs)
        for (wlo, whi), gran, d in specs:
            m += np.round(wlo + fs * (whi - wlo)) / MS / d
            if gran is not None:
                m += 1000.0 / gran_ms(gran, (p - j) / p)
        return m

    for j in range(p + 1):
        if total(np.array([(p - j) / p]), j)[0] <= budget:
            break
    else:
        return p, 0.0, False
    fs = np.linspace((p - j) / p, 1.0, grid)
    return j, float(fs[total(fs, j) <= budget].max()), True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40), st.booleans(), st.integers(1, 9)),
                min_size=1, max_size=5),
       st.floats(0.05, 1.2), st.sampled_from([1, 2, 4, 8]))
def test_strategy_matches_brute_force(raw, load, p):
    specs, queries = [], []
    for i, (lo_s, span_s, agg, d_tenths) in enumerate(raw):
        w = (lo_s * S, (lo_s + span_s) * S)
        gran = (10 * S, 1 * S) if agg else None
        d_s = d_tenths / 10_000          # 0.1 .. 0.9 ms
        specs.append((w, gran, d_s * 1000))
        queries.append(window_query(f"q{i}", f"s{i}", w, d_s, gran))
    rm = rm_with(queries, p=p, knots=8 * p, tolerance=1e-4)
    full = rm._totals(0, 1.0, rm._planned_rows())[0]
    budget = load * full
    rm.set_budget(memory=budget)
    a = rm.replan()
    j, f, feasible = brute_force(specs, budget, p)
    assert a.feasible == feasible and a.level == j
    if feasible:
        assert a.memory <= budget * (1 + 1e-12)
        assert abs(a.f_window - f) <= 1e-4 + 1.0 / 4_000


def test_granularity_step_hand_computed():
    """One aggregation: window QoS [1 s, 1 s], granularity QoS [10 s, 1 s], d = 1 ms, p = 4.

    Memory = 1000 (window: 1000 ms / 1 ms) + 1000/g_ms. f = 1 → g = 1 s → 1001; f = 3/4 → 10 s − 6.75 s
    = 3.25 s → 3 s → 1000.333; f = 1/2 → 5.5 s → 6 s (a tie goes to the coarser side) → 1000.1667.
    With the budget 1000.3 step 1 stops at j = 2 (f = 1/2): granularity 6 s.
    """
    q = window_query("agg", "A", (1 * S, 1 * S), 1e-3, gran=(10 * S, 1 * S))
    rm = rm_with([q], p=4, knots=8, memory=1000.3)
    a = rm.replan()
    assert (a.level, a.f_granularity) == (2, 0.5)
    assert rm.settings("agg")["agg-g.granularity"] == 6 * S
    assert a.memory == pytest.approx(1000 + 1 / 6)


def test_reserve_is_kept():
    q = window_query("q", "A", (1 * S, 10 * S), 1e-3)     # memory = w_ms: 1000 .. 10000
    rm = rm_with([q], memory=8000, reserve=0.25, tolerance=1e-5)
    a = rm.replan()
    # bound 6000 → w = 6 s → f = 5/9
    assert a.memory_bound == 6000 and a.memory == pytest.approx(6000, rel=1e-3)
    assert a.f_window == pytest.approx(5 / 9, abs=1e-3)


def test_cpu_bound():
    q = window_query("q", "A", (1 * S, 10 * S), 1e-3)     # toy cpu = 1/d = 1 per query, memory w_ms
    rm = rm_with([q, window_query("r", "B", (1 * S, 10 * S), 1e-3)], cpu=1.5)
    a = rm.replan()
    assert not a.feasible and a.f_window == 0.0 and a.cpu == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------
# admission control (§4.1.1)


def test_admission_accepts_shrinks_others_then_rejects():
    """d = 0.1 ms: a query holds 10·w_ms elements, 10000 at f = 0 and 100000 at f = 1; bound 25000.

    q1 alone: 10000 + 90000 f <= 25000 → f = 1/6. q2: 2(10000 + 90000 f) <= 25000 → f = 1/36, and q1 shrinks
    from 2.5 s to 1.25 s. q3: 30000 > 25000 at f = 0 → rejected.
    """
    rm = PipesResourceManager(25_000, estimate=toy_estimate, reserve=0.0, tolerance=1e-5)
    a1 = rm.admit_query(window_query("q1", "A", d_s=1e-4))
    assert a1.accepted and rm.allocation.f_window == pytest.approx(1 / 6, abs=1e-4)
    assert [(d.operator, d.changes["window"]) for d in a1.decisions] == [("q1-w", pytest.approx(2.5 * S, rel=1e-3))]
    a2 = rm.admit_query(window_query("q2", "B", d_s=1e-4))
    assert a2.accepted and rm.allocation.f_window == pytest.approx(1 / 36, abs=1e-4)
    shrunk = {d.operator: d.changes["window"] for d in a2.decisions}
    assert shrunk["q1-w"] == pytest.approx(1.25 * S, rel=1e-3) and set(shrunk) == {"q1-w", "q2-w"}
    a3 = rm.admit_query(window_query("q3", "C", d_s=1e-4))
    assert not a3.accepted
    assert "estimated memory 30 KB > bound 25 KB" in a3.reason and "'q3'" in a3.reason
    assert rm.queries == ["q1", "q2"] and rm.allocation.f_window == pytest.approx(1 / 36, abs=1e-4)


def test_admission_without_statistics_or_plan():
    rm = PipesResourceManager(1e6, estimate=toy_estimate)
    bare = QueryInfo("bare")
    a = rm.admit_query(bare)
    assert a.accepted and "without resource management" in a.reason and "no plan" in rm.skipped["bare"]
    unknown = QueryInfo("u", window_query("u").plan, window_query("u").qos, {"A": SourceStats("A")})
    b = rm.admit_query(unknown)
    assert b.accepted and "no rate measured yet" in b.reason
    rm.set_distance("A", 1e-4)
    assert rm.replan().queries == 1


def test_removal_releases_resources():
    rm = rm_with([window_query("q1", "A", d_s=1e-4), window_query("q2", "B", d_s=1e-4)], memory=25_000,
                 tolerance=1e-5)
    assert rm.replan().f_window == pytest.approx(1 / 36, abs=1e-4)
    rm.remove("q2")
    assert rm.replan().f_window == pytest.approx(1 / 6, abs=1e-4)


def test_unmanageable_query_is_skipped_not_raised():
    q = window_query("fine", "A", gran=(10 * S, 500))     # 500 µs finer than the 1 ms time unit
    rm = PipesResourceManager(1e6, estimate=toy_estimate)
    snap = Snapshot(0.0, {"fine": q})
    assert len(rm.decide(snap)) == 0 and "finer than the resource manager's time_unit" in rm.skipped["fine"]


# ---------------------------------------------------------------------------------------------
# re-planning on changes of d (§3.2.2, §4.1.2) and the Policy interface


def _snapshot(queries, budget, control=None):
    infos = {}
    for q in queries:
        infos[q.name] = QueryInfo(q.name, q.plan, q.qos, q.sources, control=(control or {}).get(q.name, {}))
    return Snapshot(0.0, infos, memory_budget=budget)


def _with_distance(q, d_s):
    return QueryInfo(q.name, q.plan, q.qos, {s: SourceStats(s, 1 / d_s, d_s) for s in q.sources})


def test_replans_only_when_d_moves_beyond_threshold():
    q1, q2 = window_query("q1", "A", d_s=1e-4), window_query("q2", "B", d_s=1e-4)
    rm = PipesResourceManager(25_000, estimate=toy_estimate, reserve=0.0, distance_threshold=0.2)
    first = rm.decide(_snapshot([q1, q2], 25_000))
    assert {d.operator for d in first} == {"q1-w", "q2-w"}
    settled = {q: {f"{q}-w": {"window": d.changes["window"]}} for q, d in zip(["q1", "q2"], first)}
    assert len(rm.decide(_snapshot([q1, q2], 25_000, settled))) == 0          # idempotent
    evaluations = rm.evaluations
    small = _with_distance(q1, 1.1e-4)                                          # +10 %: below threshold
    assert rm.set_distance("A", 1.1e-4) is False
    assert len(rm.decide(_snapshot([small, q2], 25_000, settled))) == 0 and rm.evaluations == evaluations
    big = _with_distance(q1, 0.5e-4)                                            # d halves: λ doubles
    out = rm.decide(_snapshot([big, q2], 25_000, settled))
    # q1 now holds 20·w_ms: 20000 + 10000 at f = 0 fits exactly, so f = 0: both at 1 s
    assert {d.operator: d.changes["window"] for d in out} == {"q1-w": S, "q2-w": S}
    assert rm.allocation.f_window == pytest.approx(0.0, abs=1e-3)
    assert 0 < rm.evaluations - evaluations <= 2 * (rm.knots + 1)               # q2's cached estimates kept


def test_bounds_from_snapshot_when_not_given():
    rm = PipesResourceManager(estimate=toy_estimate, reserve=0.0)
    q = window_query("q", "A", d_s=1e-3)
    rm.decide(_snapshot([q], 5_500))
    assert rm.allocation.memory_bound == 5_500 and rm.settings("q")["q-w.window"] == pytest.approx(5.5 * S, rel=1e-3)


# ---------------------------------------------------------------------------------------------
# synthetic workloads with the real cost model


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("load", [0.15, 0.4, 0.8])
def test_estimated_memory_stays_within_budget(seed, load):
    rng = np.random.default_rng(seed)
    sources = W.make_sources(rng)
    queries = W.make_queries(rng, 25, sources)
    rm = PipesResourceManager(reserve=0.1)
    for q in queries:
        rm.add(q)
    for s, d in sources.items():
        rm.set_distance(s, d)
    rows = rm._planned_rows()
    lo, hi = rm._totals(rm.p, 0.0, rows)[0], rm._totals(0, 1.0, rows)[0]
    budget = (lo + load * (hi - lo)) / 0.9
    rm.set_budget(memory=budget)
    a = rm.replan()
    assert a.feasible
    exact = sum(rm.exact_estimate(q.name)[0] for q in queries)
    assert exact <= 0.9 * budget                              # the cost model itself, not the interpolation
    assert exact >= 0.97 * 0.9 * budget                       # and the budget is used, not wasted
    # every decision inside the QoS ranges
    for q in queries:
        for lab, value in rm.settings(q.name).items():
            assert q.qos[lab].contains(value)


def test_workload_generator_follows_table_3():
    rng = np.random.default_rng(7)
    sources = W.make_sources(rng)
    d = np.array(list(sources.values()))
    assert len(sources) == 50 and d.min() >= 0.1 and d.max() <= 30.0       # 2..600 per minute
    kinds = [W.make_query(rng, f"q{i}", sources) for i in range(2000)]
    aggs = sum(any(isinstance(n, P.Aggregate) for n in P.postorder(q.plan)) for q in kinds)
    assert 0.25 < aggs / 2000 < 0.35                                            # 30 % of Table 3
    joins = [n for q in kinds for n in P.postorder(q.plan) if isinstance(n, P.Join)]
    nl = sum(j.method == "nested_loops" for j in joins) / len(joins)
    assert 0.28 < nl < 0.38 and all(0.005 <= j.selectivity <= 0.02 for j in joins)
    for q in kinds[:50]:
        for rng_ in q.qos.values():
            lo, hi = sorted((rng_.min, rng_.max))
            assert (60 * S <= lo <= hi <= 1800 * S) or (MS <= lo <= hi <= 10_000 * MS)
    assert DEFAULT_PROFILE.element_size == 64.0 and math.isclose(pipes.CostProfile().element_size, 1.0)


# ---------------------------------------------------------------------------------------------
# retention: windows costed as window + watermark delay δ + batch span B (docs/cost-model.md)


def retention_queries(delay=None, span=None, lower=-1 * S):
    """A bound-form interval join (labelled upper and lower, an unlabelled window below a selection) and a
    sliding aggregation (labelled window and granularity, and an unlabelled outer window), with δ and B."""
    join = P.Join(P.Window(P.Select(P.Window(P.Source("a"), 20 * S), 0.5), 30 * S, label="j.upper"),
                  P.Window(P.Source("b"), 1 * S, label="j.lower"), selectivity=0.01)
    jq = {"j.upper": QoSRange.window(2 * S, 30 * S), "j.lower": QoSRange(lower, lower, step=1)}
    agg = P.Aggregate(P.Granularity(P.Window(P.Source("c"), 60 * S, label="g.window"), 1 * S,
                                    label="g.granularity"), groups=5)
    gq = {"g.window": QoSRange.window(10 * S, 60 * S, step=10 * S), "g.granularity": QoSRange.granularity(S, S)}
    stats = {s: SourceStats(s, 1 / d, d) for s, d in (("a", 0.01), ("b", 0.02), ("c", 0.005))}
    return (QueryInfo("join", join, jq, {k: stats[k] for k in "ab"}, watermark_delay=delay, batch_span=span),
            QueryInfo("agg", agg, gq, {"c": stats["c"]}, watermark_delay=delay, batch_span=span))


def extended_by_hand(upper_ms, lower_ms, window_ms, ext_ms):
    """The two plans in ms with every time-based window extended by δ + B (written out, no RM code)."""
    join = P.Join(P.Window(P.Select(P.Window(P.Source("a"), 20_000 + ext_ms), 0.5), upper_ms + ext_ms),
                  P.Window(P.Source("b"), max(-lower_ms + ext_ms, 0.0)), selectivity=0.01)
    agg = P.Aggregate(P.Granularity(P.Window(P.Source("c"), window_ms + ext_ms), 1000.0), groups=5)
    return join, agg


def oracle(upper_ms, lower_ms, window_ms, ext_ms):
    join, agg = extended_by_hand(upper_ms, lower_ms, window_ms, ext_ms)
    sc = {s: pipes.StreamCharacteristics(d, 1.0, 1.0) for s, d in (("a", 10.0), ("b", 20.0), ("c", 5.0))}
    return (pipes.cost_plan(join, sc, profile=DEFAULT_PROFILE).memory,
            pipes.cost_plan(agg, sc, profile=DEFAULT_PROFILE).memory)


def test_retention_off_is_the_plain_model():
    """retention=False ignores δ and B (same numbers as before the option existed and as the plain model);
    retention=True without statistics yet costs with 0 and gives the same numbers."""
    snap = Snapshot(0.0, {q.name: q for q in retention_queries(2.0, 3.0)})
    plain = Snapshot(0.0, {q.name: q for q in retention_queries()})
    rms = [PipesResourceManager(reserve=0.0), PipesResourceManager(reserve=0.0, retention=False)]
    for rm in rms:
        rm.decide(snap)
    on = PipesResourceManager(reserve=0.0, retention=True)
    on.decide(plain)
    want = oracle(30_000, -1000, 60_000, 0.0)
    for rm in rms + [on]:
        est = rm.estimates()
        assert est["join"][0] == pytest.approx(want[0]) and est["agg"][0] == pytest.approx(want[1])
        assert rm.allocation.f_window == 1.0


@pytest.mark.parametrize("lower", [-1 * S, 2 * S])
def test_retention_extends_every_window_by_delay_plus_span(lower):
    """With δ = 2 s, B = 3 s every time-based window (labelled upper/lower/window and unlabelled) is costed
    5 s longer: the RM's estimates equal cost_plan on the plans extended by hand. A positive lower bound
    gives −lower + δ + B without clipping −lower at 0 first."""
    join, agg = retention_queries(2.0, 3.0, lower=lower)
    rm = PipesResourceManager(reserve=0.0, retention=True)
    rm.decide(Snapshot(0.0, {"join": join, "agg": agg}))
    want = oracle(30_000, lower / MS, 60_000, 5_000.0)
    est = rm.estimates()
    assert est["join"][0] == pytest.approx(want[0]) and est["agg"][0] == pytest.approx(want[1])
    assert rm.exact_estimate("join")[0] == pytest.approx(want[0])
    plain = oracle(30_000, lower / MS, 60_000, 0.0)
    assert want[0] > plain[0] and want[1] > plain[1]
    # the settings are what the control table holds (not extended)
    assert rm.settings("join")["j.upper"] == 30 * S and rm.settings("agg")["g.window"] == 60 * S


def test_retention_under_a_budget_shrinks_windows_more():
    """Under the same budget the extended estimate needs smaller windows; the exact cost model at the
    allocation (extended) is within the bound."""
    join, agg = retention_queries(2.0, 3.0)
    plain_rm = PipesResourceManager(reserve=0.0)
    rt_rm = PipesResourceManager(reserve=0.0, retention=True)
    full = oracle(30_000, -1000, 60_000, 0.0)
    budget = 0.6 * sum(full)
    for rm in (plain_rm, rt_rm):
        rm.decide(Snapshot(0.0, {"join": join, "agg": agg}, memory_budget=budget))
        assert rm.allocation.feasible
    assert rt_rm.allocation.f_window < plain_rm.allocation.f_window
    s = rt_rm.settings("join")["j.upper"] / MS, rt_rm.settings("agg")["g.window"] / MS
    exact = oracle(s[0], -1000, s[1], 5_000.0)
    assert sum(exact) == pytest.approx(sum(rt_rm.exact_estimate(q)[0] for q in ("join", "agg")))
    assert sum(exact) <= budget * (1 + 1e-9)


def test_retention_cache_invalidated_only_beyond_threshold():
    rm = PipesResourceManager(reserve=0.0, retention=True, distance_threshold=0.2, prefetch=False)

    def snap(jd, js, ad, as_):
        join, _ = retention_queries(jd, js)
        _, agg = retention_queries(ad, as_)
        return Snapshot(0.0, {"join": join, "agg": agg})

    rm.decide(snap(2.0, 3.0, 2.0, 3.0))
    n = rm.evaluations
    assert rm.set_retention("join", 2.0, 3.4) is False                   # δ + B = 5.4 s: +8 %
    rm.decide(snap(2.0, 3.5, 2.0, 3.0))                                    # 5.5 s: +10 %, below threshold
    assert rm.evaluations == n
    assert rm.estimates()["join"][0] == pytest.approx(oracle(30_000, -1000, 60_000, 5_000.0)[0])
    rm.decide(snap(2.0, 5.0, 2.0, 3.0))                                    # 7 s: +40 %, join re-costed only
    assert rm.evaluations == n + 1
    want = oracle(30_000, -1000, 60_000, 7_000.0)
    assert rm.estimates()["join"][0] == pytest.approx(want[0])
    assert rm.estimates()["agg"][0] == pytest.approx(oracle(30_000, -1000, 60_000, 5_000.0)[1])
    rm.decide(snap(None, None, 2.0, 3.0))                                  # statistics lost: back to 0
    assert rm.estimates()["join"][0] == pytest.approx(oracle(30_000, -1000, 60_000, 0.0)[0])
    off = PipesResourceManager(reserve=0.0)
    off.decide(snap(2.0, 3.0, 2.0, 3.0))
    assert off.set_retention("join", 10.0, 10.0) is False                  # off: never invalidates


def test_retention_argument_validated():
    with pytest.raises(TypeError, match="retention"):
        PipesResourceManager(retention="yes")
    with pytest.raises(TypeError, match="retention"):
        PipesResourceManager(retention=1)
    rm = PipesResourceManager(retention=True)
    rm.add(retention_queries()[0])
    with pytest.raises(ValueError, match="watermark_delay"):
        rm.set_retention("join", -1.0, 0.0)
    with pytest.raises(TypeError, match="batch_span"):
        rm.set_retention("join", 0.0, "3 s")
    with pytest.raises(KeyError, match="nope"):
        rm.set_retention("nope", 0.0, 0.0)
    with pytest.raises(ValueError, match="watermark_delay"):
        QueryInfo("q", watermark_delay=-1.0)
    with pytest.raises(ValueError, match="batch_span"):
        QueryInfo("q", batch_span=math.inf)


def test_watermark_retention_is_the_validation_correction():
    assert pipes.watermark_retention(10.0, 2.0, 3.0) == 15.0
    assert pipes.watermark_retention(None, 0.0, 0.0) is None and pipes.watermark_retention(-1.0, 0.5, 0.0) == 0.0
    left, right = pipes.join_state_rows(pipes.SC(1.0, 1.0, 1.0), pipes.SC(1.0, 1.0, 1.0), left_window=10.0,
                                        right_window=4.0, watermark_delay=2.0, batch_span=3.0)
    l2, r2 = pipes.join_state_rows(pipes.SC(1.0, 1.0, 1.0), pipes.SC(1.0, 1.0, 1.0),
                                   left_window=pipes.watermark_retention(10.0, 2.0, 3.0),
                                   right_window=pipes.watermark_retention(4.0, 2.0, 3.0))
    assert (left, right) == (l2, r2)
    with pytest.raises(ValueError, match="batch_span"):
        pipes.watermark_retention(1.0, 0.0, -1.0)


# ---------------------------------------------------------------------------------------------
# load shedding as the last resort (shed=True; PIPES §5.3)


def _stages(drops):
    """Control of queries with a shedding stage ``<query>-shed`` at the given drop ratios (None: no stage)."""
    return {q: ({f"{q}-shed": {"drop_ratio": r}} if r is not None else {}) for q, r in drops.items()}


def test_shedding_keeps_the_fraction_that_fits_at_the_qos_minimum():
    q1, q2 = window_query("q1", "A", d_s=1e-4), window_query("q2", "B", d_s=1e-4)   # 10,000 each at 1 s
    rm = PipesResourceManager(12_000, estimate=toy_estimate, reserve=0.0, shed=True)
    out = rm.decide(_snapshot([q1, q2], 12_000, _stages({"q1": 0.0, "q2": 0.0})))
    assert not rm.allocation.feasible
    drops = {d.operator: d.changes["drop_ratio"] for d in out if "drop_ratio" in d.changes}
    # memory is linear in the rate: 20,000·ε <= 12,000 gives ε = 0.6
    assert drops == {"q1-shed": pytest.approx(0.4, abs=0.006), "q2-shed": pytest.approx(0.4, abs=0.006)}
    assert rm.kept == pytest.approx(0.6, abs=0.005) and rm.kept <= 0.6
    assert {d.changes.get("window") for d in out if d.operator.endswith("-w")} == {S}   # windows at minimum first

    only_q1 = PipesResourceManager(12_000, estimate=toy_estimate, reserve=0.0, shed=True)
    out = only_q1.decide(_snapshot([q1, q2], 12_000, _stages({"q1": 0.0, "q2": None})))
    # q2 cannot shed: 10,000·ε + 10,000 <= 12,000 gives ε = 0.2
    assert {d.operator: d.changes["drop_ratio"] for d in out if "drop_ratio" in d.changes} == {
        "q1-shed": pytest.approx(0.8, abs=0.006)}

    floor = PipesResourceManager(12_000, estimate=toy_estimate, reserve=0.0, shed=True, min_kept=0.5)
    out = floor.decide(_snapshot([q1, q2], 12_000, _stages({"q1": 0.0, "q2": None})))
    assert [d.changes["drop_ratio"] for d in out if "drop_ratio" in d.changes] == [0.5]   # never below min_kept


def test_shedding_stops_when_the_allocation_fits_again_and_is_off_by_default():
    q1, q2 = window_query("q1", "A", d_s=1e-4), window_query("q2", "B", d_s=1e-4)
    rm = PipesResourceManager(estimate=toy_estimate, reserve=0.0, shed=True)
    rm.decide(_snapshot([q1, q2], 12_000, _stages({"q1": 0.0, "q2": 0.0})))
    out = rm.decide(_snapshot([q1, q2], 50_000, _stages({"q1": 0.4, "q2": 0.4})))   # the budget grew
    assert rm.allocation.feasible and rm.kept == 1.0
    assert {d.operator: d.changes["drop_ratio"] for d in out if "drop_ratio" in d.changes} == {
        "q1-shed": 0.0, "q2-shed": 0.0}
    assert not [d for d in rm.decide(_snapshot([q1, q2], 50_000, _stages({"q1": 0.0, "q2": 0.0})))
                if "drop_ratio" in d.changes]                                           # nothing to undo
    plain = PipesResourceManager(estimate=toy_estimate, reserve=0.0)
    assert not [d for d in plain.decide(_snapshot([q1, q2], 12_000, _stages({"q1": 0.0, "q2": 0.0})))
                if "drop_ratio" in d.changes]


@pytest.mark.parametrize("kw, match", [({"shed": 1}, "shed must be a bool"), ({"min_kept": 0}, "min_kept"),
                                       ({"min_kept": 1.5}, "min_kept"), ({"min_kept": True}, "min_kept")])
def test_shedding_arguments_validated(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        PipesResourceManager(**kw)


# ---------------------------------------------------------------------------------------------
# the hard memory cap (cap=True; issue 41 item 7)


def free_estimate(plan, distances):
    """A cost model under which every allocation fits: the windows stay put, only the cap acts."""
    return 0.0, 0.0


def _capped(state_bytes, state_rows, rate, drop=0.0, t=0.0, budget=120_000, other=None):
    """A snapshot of query q1 whose operator ``q1-w`` is its shedding stage, plus an optional query q2 that
    cannot shed, with its measured state ``other`` (bytes)."""
    q1 = window_query("q1", "A")
    ops = {"q1-w": OperatorStats("q1-w", batches=3, input_rate=rate, state_rows=state_rows, state_bytes=state_bytes)}
    infos = {"q1": QueryInfo("q1", q1.plan, q1.qos, q1.sources, operators=ops,
                             control={"q1-w": {"window": 10 * S, "drop_ratio": drop}}, batch_span=1.0,
                             batch_duration=0.5)}
    if other is not None:
        q2 = window_query("q2", "B")
        infos["q2"] = QueryInfo("q2", q2.plan, q2.qos, q2.sources, control={"q2-w": {"window": 10 * S}},
                                operators={"q2-w": OperatorStats("q2-w", state_bytes=other, state_rows=1.0)})
    return Snapshot(t, infos, memory_budget=budget)


def _drops(decisions):
    return {d.operator: d.changes["drop_ratio"] for d in decisions if "drop_ratio" in d.changes}


def test_cap_keeps_the_fraction_the_inequality_allows_hand_computed():
    # 1,000 rows/s at 10 B per stored row: the full input adds A = 10,000 B/s; a micro-batch L = 1 s
    rm = PipesResourceManager(estimate=free_estimate, reserve=0.0, cap=True)
    out = rm.decide(_capped(100_000, 10_000, 1000.0, t=100.0))
    # first round: I = 2L = 2 s; 120,000 - 100,000 - A·1·L = 10,000 left for A·ε·(I + L) = 30,000·ε
    assert _drops(out) == {"q1-w": pytest.approx(1 - 1 / 3, abs=0.001)}
    assert rm.kept == pytest.approx(1 / 3) and rm.cap_status["predicted"] == pytest.approx(120_000)
    reason = next(d.reason for d in out if "drop_ratio" in d.changes)
    assert "hard memory cap" in reason and "100 KB" in reason and "120 KB" in reason and "0.333" in reason
    # 2 s later, the ratio written: 120,000 - 100,000 - A·(1/3)·1 = 16,667 for 30,000·ε
    out = rm.decide(_capped(100_000, 10_000, 1000.0, drop=0.667, t=102.0))
    assert rm.kept == pytest.approx((20_000 - 10_000 * 0.333) / 30_000, abs=1e-3)
    # far below the cap at full input: shedding stops
    out = rm.decide(_capped(10_000, 1_000, 1000.0, drop=0.444, t=104.0))
    assert _drops(out) == {"q1-w": 0.0} and rm.kept == 1.0 and "without load shedding" in out[0].reason
    # the cap is the memory bound less the reserve (room for a rise no smoothed rate foretold)
    reserved = PipesResourceManager(estimate=free_estimate, reserve=0.5, cap=True)
    reserved.decide(_capped(50_000, 5_000, 1000.0, t=1.0))
    assert reserved.cap_status["bound"] == 60_000 and reserved.kept == pytest.approx(1e-3)
    # over the cap already: keep the least (drop 0.999), never nothing
    over = PipesResourceManager(estimate=free_estimate, reserve=0.0, cap=True)
    assert _drops(over.decide(_capped(130_000, 13_000, 1000.0, t=1.0))) == {"q1-w": 0.999}


def test_cap_counts_the_growth_of_queries_that_cannot_shed():
    rm = PipesResourceManager(estimate=free_estimate, reserve=0.0, cap=True)
    rm.decide(_capped(50_000, 5_000, 1000.0, t=0.0, budget=200_000, other=20_000))
    rm.decide(_capped(50_000, 5_000, 1000.0, t=2.0, budget=200_000, other=40_000))  # q2 grows 10,000 B/s
    c = rm.cap_status
    assert c["growth"] == pytest.approx(10_000) and c["interval"] == pytest.approx(2.0)
    # 200,000 - 90,000 - G·(I + 2L) 40,000 - A·ε_now·L 10,000 = 60,000 for A·ε·(I + L) = 30,000·ε: fits
    assert rm.kept == 1.0
    rm.decide(_capped(50_000, 5_000, 1000.0, t=4.0, budget=200_000, other=100_000))  # 30,000 B/s
    # 200,000 - 150,000 - 120,000 - 10,000 < 0: the least
    assert rm.kept == pytest.approx(0.001)


def test_cap_is_off_by_default_and_validated():
    plain = PipesResourceManager(estimate=free_estimate, reserve=0.0)
    assert not _drops(plain.decide(_capped(130_000, 13_000, 1000.0)))
    with pytest.raises(TypeError, match="cap must be a bool"):
        PipesResourceManager(cap=1)
    no_bound = PipesResourceManager(estimate=free_estimate, reserve=0.0, cap=True)
    snap = _capped(130_000, 13_000, 1000.0)
    assert not _drops(no_bound.decide(Snapshot(0.0, snap.queries)))   # no memory bound: nothing to cap


def _simulate(cap, rates, window=30, bytes_per_row=10, budget=150_000, every=2):
    """A window join's state under a per-second rate profile, in plain Python: each second one micro-batch
    keeps round(n·ε) of its n rows (ε = 1 - the drop ratio in force) and evicts what is older than
    ``window`` s; every ``every`` batches a round of the resource manager sees the last batch and its
    decision holds from the next batch on. Returns (peak state bytes, rows shed, rows kept)."""
    rm = PipesResourceManager(estimate=free_estimate, reserve=0.0, cap=cap)
    kept_rows, drop, shed, peak = [], 0.0, 0, 0
    for t, n in enumerate(rates):
        keep = round(n * (1 - drop))
        shed += n - keep
        kept_rows = [(u, k) for u, k in kept_rows if u > t - window] + [(t, keep)]
        rows = sum(k for _, k in kept_rows)
        peak = max(peak, rows * bytes_per_row)
        if t % every == every - 1:
            out = rm.decide(_capped(rows * bytes_per_row, max(rows, 1), float(n), drop=drop, t=float(t),
                                    budget=budget))
            drop = _drops(out).get("q1-w", drop)
    return peak, shed, sum(rates) - shed


@pytest.mark.parametrize("burst", [800, 1600, 4000])
def test_cap_holds_the_bound_on_a_simulated_burst(burst):
    """100 rows/s, then ``burst`` rows/s from 40 s to 100 s, then 100 again: uncapped, the state of a 30-s
    window reaches 30·burst rows; capped it stays within the budget but for the documented excess, the rise
    of the rate within one horizon (the burst starts between two rounds): Δλ·b·(I + 2L)."""
    rates = [100] * 40 + [burst] * 60 + [100] * 60
    free_peak, free_shed, _ = _simulate(False, rates)
    peak, shed, kept = _simulate(True, rates)
    assert free_shed == 0 and free_peak == 30 * burst * 10 > 150_000
    assert peak <= 150_000 + (burst - 100) * 10 * (2 + 2 * 1)
    assert peak <= 1.1 * 150_000 or burst == 4000          # a 40x rise within one round is the documented excess
    assert shed > 0 and shed + kept == sum(rates)           # every row is kept or counted as shed
    # after the burst the cap lets the full input through again
    assert _simulate(True, [100] * 40 + [burst] * 60 + [100] * 200)[2] > kept


# ---------------------------------------------------------------------------------------------
# query groups: members of one slice class share one state (docs/groups.md, "The runtime")


def member(name, cls, window_s, qos_s=None, gran_s=10):
    """A group member as the runtime's snapshot shows it: γ(Γ(ω(A))) with its window label and QoS range."""
    label = f"{name}_agg.window"
    plan = P.Aggregate(P.Granularity(P.Window(P.Source("A"), window_s * S, label=label), gran_s * S,
                                     label=f"{name}_agg.granularity"), groups=10, label=f"{name}_agg")
    qos = {} if qos_s is None else {label: QoSRange.window(qos_s[0] * S, qos_s[1] * S)}
    control = {f"{name}_agg": {"window": window_s * S}}
    return QueryInfo(name, plan, qos, {"A": SourceStats("A", 1000.0, 1e-3)}, control=control, slice_class=cls)


def test_group_members_slice_class_state_is_costed_once_and_fixed_classes_are_kept():
    """Toy costs (linear, independent of the PIPES formulas): a window of w ms over d = 1 ms holds w elements, a
    granularity of g ms adds 1000 / g. Class a (a: 60–300 s, b: 60–120 s) may change; class c has c, whose window
    is fixed at 600 s, so d's window is not decided (reducing it would not shrink c's table). By hand, at f:
    class a holds its widest window 60 + 240 f s (a's; b adds nothing), class c 600 s, x 1 + 9 f s: the total
    661,000.2 + 249,000 f ms of elements fits 785,500.2 at f = 1/2: a 180 s, b 90 s, x 5.5 s."""
    queries = [member("a", "a", 300, (60, 300)), member("b", "a", 120, (60, 120)),
               member("c", "c", 600), member("d", "c", 300, (60, 300)),
               window_query("x", w=(1 * S, 10 * S), d_s=1e-3)]
    rm = PipesResourceManager(memory=785_500.2, estimate=toy_estimate, reserve=0.0, tolerance=1e-6)
    snap = Snapshot(1.0, {q.name: q for q in queries})
    decisions = rm.decide(snap)
    assert rm.allocation.feasible and rm.allocation.f_window == pytest.approx(0.5, abs=1e-5)
    got = {d.operator: d.changes for d in decisions}
    assert set(got) == {"a_agg", "b_agg", "x-w"}                  # nothing for class c: c's window is fixed
    assert got["a_agg"] == {"window": 180 * S} and got["b_agg"] == {"window": 90 * S}
    assert got["x-w"]["window"] == pytest.approx(5.5 * S, abs=10)
    est = rm.estimates()
    assert est["b"][0] == 0 and est["d"][0] == 0                  # riders: their class's state is the first's
    assert est["c"][0] == pytest.approx(600_000 + 0.1)            # the fixed class at its widest window, c's
    assert est["a"][0] == pytest.approx(180_000 + 0.1, rel=1e-4)
    assert sum(m for m, _ in est.values()) == pytest.approx(785_500.2, rel=1e-5)
    # the same queries without their slice classes: each costed alone, d decided (the classes are what keeps it)
    alone = PipesResourceManager(memory=785_500.2, estimate=toy_estimate, reserve=0.0)
    plain = alone.decide(Snapshot(1.0, {q.name: replace(q, slice_class=None) for q in queries}))
    assert "d_agg" in {d.operator for d in plain}


def join_member(name, cls, left_s, right_s, qos_s=None):
    """A group's join member as the runtime's snapshot shows it: ω(A) ⋈ ω(B), its join class as ``slice_class``."""
    label = f"{name}_agg.window"
    plan = P.Join(P.Window(P.Source("A"), left_s * S, label=label), P.Window(P.Source("B"), right_s * S,
                                                                              label=f"{name}_r.window"))
    qos = {} if qos_s is None else {label: QoSRange.window(qos_s[0] * S, qos_s[1] * S)}
    return QueryInfo(name, plan, qos, {"A": SourceStats("A", 1000.0, 1e-3), "B": SourceStats("B", 500.0, 2e-3)},
                     slice_class=cls)


def test_a_join_class_state_is_costed_once_through_its_widest_windows_and_never_decided():
    """Toy costs: a window of w ms over d ms holds w/d elements. Join class j (j1: 30 s ⋈ 60 s, j2: 60 s ⋈ 20 s)
    holds one state for A's widest 60 s and B's widest 60 s: 60,000/1 + 60,000/2 = 90,000, on j1; j2 adds none.
    Neither is decided (a join's band is fixed in a group), even with a QoS range in its snapshot; the window
    query x makes room: 100,000 − 90,000 leaves x 10 s of its 1–20 s."""
    queries = [join_member("j1", "j1", 30, 60), join_member("j2", "j1", 60, 20, qos_s=(10, 60)),
               window_query("x", w=(1 * S, 20 * S), d_s=1e-3)]
    rm = PipesResourceManager(memory=100_000, estimate=toy_estimate, reserve=0.0, tolerance=1e-6)
    decisions = rm.decide(Snapshot(1.0, {q.name: q for q in queries}))
    est = rm.estimates()
    assert est["j1"][0] == pytest.approx(60_000 + 30_000) and est["j2"][0] == 0
    assert {d.operator for d in decisions} == {"x-w"}
    assert est["x"][0] == pytest.approx(10_000, rel=1e-4)
    # the same joins costed each as a plain query: the shared state twice (j1 90,000 + j2 70,000), j2 decided
    alone = PipesResourceManager(memory=100_000, estimate=toy_estimate, reserve=0.0)
    plain = alone.decide(Snapshot(1.0, {q.name: replace(q, slice_class=None) for q in queries}))
    assert "j2_agg" in {d.operator for d in plain}


def test_a_member_window_decision_goes_through_its_group(tmp_path):
    """The policy loop sends a decision naming a group member to the group (``routes``), checked against the
    member's QoS range; a refusal by the route refuses the policy's decisions of that round."""
    from pyspark_cq.control import ControlTable
    from pyspark_cq.policies import Decision, Decisions, Policy
    from pyspark_cq.runtime.loop import PolicyLoop

    class Shrink(Policy):
        name = "shrink"

        def __init__(self, window=90 * S):
            self.window = window

        def decide(self, snapshot):
            return Decisions([Decision("a_agg", {"window": self.window}, "test", query="a")], self.name)

    done = []

    def prepare(decision):
        if decision.changes["window"] < 70 * S:
            raise ValueError("its slice class's windows are not adjustable")
        return lambda who: done.append((who, decision.changes["window"]))

    loop = PolicyLoop([Shrink()], ControlTable(str(tmp_path / "control.json")))
    loop.routes = lambda: {"a_agg": prepare}
    snap = Snapshot(1.0, {"a": member("a", "a", 120, (60, 120))})
    [record] = loop.run(snap)
    assert record["applied"] and record["routed"] == ["a_agg"] and done == [("shrink", 90 * S)]
    loop.policies = [Shrink(65 * S)]
    with pytest.warns(RuntimeWarning, match="not adjustable"):
        [refused] = loop.run(snap)
    assert not refused["applied"] and len(done) == 1
    loop.policies = [Shrink(30 * S)]                               # outside the member's QoS range
    with pytest.warns(RuntimeWarning, match="outside declared QoS bounds"):
        assert not loop.run(snap)[0]["applied"]
