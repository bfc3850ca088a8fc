"""Admission control and window re-plans of a query group under a memory budget (PIPES §4.1.1, §4.3, §5.4;
docs/groups.md, "Admission control and re-plans"). The oracle of the estimate: a slice class's table holds, per
key, one slice per granularity of the class's widest window plus the watermark delay, when every slice gets rows
(dense streams), counted by hand; shared classes are counted once.
"""
from __future__ import annotations

import math

import pytest

from pyspark_cq.cost import groups as G
from pyspark_cq.group import doc as D
from pyspark_cq.group.batch import apply_changes

S = 1_000_000          # µs per second
DENSE = {"s": G.StreamLoad(100.0, keys=10), "t": G.StreamLoad(50.0, keys=4, watermark_delay=60.0)}


def m(name, cls, window, slide=10, gran=10, qos=None, stream="s"):
    lo, hi = (None, None) if qos is None else (qos[0] * S, qos[1] * S)
    return G.MemberLoad(name, cls, stream, window * S, slide * S, gran * S, lo, hi)


def test_estimate_counts_each_slice_class_once_at_its_widest_window():
    members = [m("a", "a", 60), m("b", "a", 300), m("c", "c", 3600, 60, 60), m("d", "d", 120, stream="t")]
    rows = G.group_state_rows(members, DENSE)
    # by hand: keys × (widest window + δ) / granularity
    assert rows == {"a": 10 * 300 // 10, "c": 10 * 3600 // 60, "d": 4 * (120 + 60) // 10}
    assert G.class_state_rows([m("a", "a", 60)], G.StreamLoad(0.0)) == 0.0          # no rows, no state
    # key counts per grouping key; a key not listed counts as the largest listed (an upper bound)
    per_key = G.StreamLoad(100.0, keys={"page": 10, "region": 4})
    by_region = G.MemberLoad("r", "r", "s", 60 * S, 10 * S, 10 * S, key="region")
    assert G.class_state_rows([by_region], per_key) == 4 * 6
    assert G.class_state_rows([G.MemberLoad("u", "u", "s", 60 * S, 10 * S, 10 * S, key="user")], per_key) == 10 * 6


def test_a_query_joining_a_class_adds_only_what_the_class_does_not_hold():
    members = [m("a", "a", 60), m("b", "a", 300)]
    inside = G.admit(members, m("x", "a", 120), DENSE, budget=10_000, row_bytes=10)
    assert inside.accepted and inside.added_rows == 0 and inside.rows == 300
    assert "shares the slices of 'a' (2 queries)" in inside.reason
    wider = G.admit(members, m("y", "a", 600), DENSE, budget=10_000, row_bytes=10)
    assert wider.accepted and wider.added_rows == 300 and wider.bytes == 6_000   # 600 rows of 10 B
    new = G.admit(members, m("z", "z", 60, qos=(30, 60)), DENSE, budget=10_000, row_bytes=10)
    assert new.added_rows == 60 and "a new slice class" in new.reason


def test_a_refusal_names_the_query_and_the_budget():
    members = [m("a", "a", 300)]
    no = G.admit(members, m("big", "big", 3600, 60, 60), DENSE, budget=5_000, row_bytes=10)
    assert not no.accepted
    assert no.added_rows == 600 and no.bytes == 9_000
    assert "rejected 'big'" in no.reason and "5,000 B" in no.reason and "9,000 B" in no.reason
    # at the budget exactly: admitted
    assert G.admit(members, m("big", "big", 3600, 60, 60), DENSE, budget=9_000, row_bytes=10).accepted


def test_replan_reduces_whole_classes_within_their_qos_ranges_and_leaves_fixed_ones():
    members = [m("a", "a", 300, qos=(60, 300)), m("b", "a", 120, qos=(60, 120)),      # a class that allows it
               m("c", "c", 600, qos=(60, 600)),                                        # alone in its class
               m("d", "d", 600), m("e", "d", 300, qos=(60, 300))]                      # d's window is fixed
    before = sum(G.group_state_rows(members, DENSE).values())
    assert before == 10 * (30 + 60 + 60)
    plan = G.replan(members, DENSE, target_rows=1_000)
    assert plan.feasible and plan.rows_before == before and plan.rows_after <= 1_000
    assert set(plan.fixed) == {"d"} and "'d'" in plan.fixed["d"]
    assert "d" not in plan.windows and "e" not in plan.windows       # class d's table keeps what d needs
    for name, w in plan.windows.items():
        old = next(x for x in members if x.name == name)
        assert w < old.window and w % old.granularity == 0 and w >= old.slide and w >= old.window_min
    # the oracle of the chosen windows: rows by hand at the new widest windows
    widest_a = max(plan.windows.get(n, next(x.window for x in members if x.name == n)) for n in ("a", "b"))
    assert plan.rows_after == 10 * (widest_a // (10 * S) + plan.windows.get("c", 600 * S) // (10 * S) + 60)
    # already within the target: nothing changes; below every QoS minimum: infeasible, all at their minimum
    assert G.replan(members, DENSE, target_rows=before).windows == {}
    low = G.replan(members, DENSE, target_rows=10)
    assert not low.feasible and low.f == 0.0
    assert low.windows == {"a": 60 * S, "b": 60 * S, "c": 60 * S}


def g_(name, cls, window, registered, qos=None, gran=10):
    """A member whose window a re-plan reduced from ``registered`` to ``window`` (seconds)."""
    lo, hi = (None, None) if qos is None else (qos[0] * S, qos[1] * S)
    return G.MemberLoad(name, cls, "s", window * S, 10 * S, gran * S, lo, hi, registered=registered * S)


def test_replan_grows_reduced_windows_back_by_the_same_bisection():
    """PIPES §4.1.1 / §4.3: the state fell well below the budget; reduced windows grow back at one common f of
    their QoS ranges, never above the window each was registered with. The oracle, by hand (dense stream s: 10
    keys, 10 s slices, δ 0, so a class holds 10 × widest/10 s = widest-in-seconds rows):
    fixed class d holds 600 rows; the rest must fit 1,080 − 600 = 480 rows = w_a + w_c (a is class a's widest).
    w_a(f) = max(120, ⌊60 + 240 f⌋₁₀), w_c(f) = max(60, ⌊60 + 540 f⌋₁₀): the sum is 170 + 310 = 480 for
    f in [0.4723, 0.48148) and 490 from 60 + 540 f = 320, f = 0.48148, on; b = ⌊60 + 60 f⌋₁₀ = 80.
    """
    members = [g_("a", "a", 120, 300, qos=(60, 300)), g_("b", "a", 60, 120, qos=(60, 120)),
               g_("c", "c", 60, 600, qos=(60, 600)),
               G.MemberLoad("d", "d", "s", 600 * S, 10 * S, 10 * S),      # fixed: class d is not adjustable
               g_("e", "d", 120, 300, qos=(60, 300))]
    assert sum(G.group_state_rows(members, DENSE).values()) == 120 + 60 + 600
    plan = G.replan(members, DENSE, target_rows=1_080, direction="grow")
    assert plan.direction == "grow" and plan.feasible
    assert plan.windows == {"a": 170 * S, "b": 80 * S, "c": 310 * S}
    assert plan.rows_after == 1_080 and 0.4723 <= plan.f < 0.48148
    assert set(plan.fixed) == {"d"} and "e" not in plan.windows       # e stays: d's table is not adjustable
    # room for everything: all back at their registered windows (f = 1), not above them
    full = G.replan(members, DENSE, target_rows=10_000, direction="grow")
    assert full.f == 1.0 and full.windows == {"a": 300 * S, "b": 120 * S, "c": 600 * S}
    assert full.rows_after == 600 + 300 + 600
    # no room even now: nothing changes (the reductions are the other direction's business)
    none = G.replan(members, DENSE, target_rows=700, direction="grow")
    assert none.windows == {} and not none.feasible and none.rows_after == 780
    # a QoS maximum above the registered window: back to the registered one only
    wide = [g_("x", "x", 60, 120, qos=(60, 600))]
    assert G.replan(wide, DENSE, target_rows=10_000, direction="grow").windows == {"x": 120 * S}
    # a reduction and then a growth with room again come back to the registered windows exactly
    reg = [g_("a", "a", 300, 300, qos=(60, 300)), g_("c", "c", 600, 600, qos=(60, 600))]
    down = G.replan(reg, DENSE, target_rows=300)
    assert down.direction == "reduce" and sum(w for w in down.windows.values()) // S <= 300
    reduced = [G.MemberLoad(x.name, x.slice_class, "s", down.windows[x.name], x.slide, x.granularity,
                            x.window_min, x.window_max, registered=x.registered) for x in reg]
    assert G.replan(reduced, DENSE, target_rows=900, direction="grow").windows == {"a": 300 * S, "c": 600 * S}


def test_window_toward_is_the_one_formula_of_both_directions():
    x = g_("x", "x", 120, 300, qos=(60, 600))
    assert G.window_at(x, 0.5) == 330 * S
    assert G.window_toward(x, 0.5, "reduce") == 120 * S        # a reduction never widens
    assert G.window_toward(x, 0.1, "reduce") == 110 * S        # ⌊60 + 54⌋₁₀
    assert G.window_toward(x, 0.5, "grow") == 300 * S          # capped at the registered window
    assert G.window_toward(x, 0.05, "grow") == 120 * S         # never below the current one
    assert G.window_toward(G.MemberLoad("y", "y", "s", 60 * S, 10 * S, 10 * S, 60 * S, 120 * S), 1.0,
                           "grow") == 60 * S                   # no registered window: it does not grow
    with pytest.raises(ValueError, match="direction must be one of"):
        G.window_toward(x, 0.5, "up")
    with pytest.raises(ValueError, match="MemberLoad registered must be"):
        G.MemberLoad("a", "a", "s", 10, 1, 1, registered=0)


def test_replan_target_reduces_over_the_budget_and_grows_below_half_of_it():
    """100 B a measured row, the estimate twice the measurement: the budget in the estimate's rows is
    budget / 100 × 2; a growth aims at 0.8 of it; between half the budget and the budget nothing re-plans."""
    assert G.replan_target(1_000, 100_000, 2_000, budget=80_000) == ("reduce", 1_600)
    assert G.replan_target(1_000, 100_000, 2_000, budget=300_000) == ("grow", pytest.approx(0.8 * 6_000))
    assert G.replan_target(1_000, 100_000, 2_000, budget=150_000) == (None, 0.0)   # in the band
    assert G.replan_target(1_000, 100_000, 2_000, budget=200_000) == (None, 0.0)   # at half exactly: stays
    assert G.replan_target(1_000, 100_000, 2_000, budget=100_000) == (None, 0.0)   # at the budget: stays
    assert G.replan_target(0, 0, 2_000, budget=1) == (None, 0.0)                   # nothing measured yet
    assert G.GROW_BELOW < G.GROW_TO < 1
    with pytest.raises(ValueError, match="budget must be"):
        G.replan_target(1, 1, 1, budget=0)
    with pytest.raises(ValueError, match="measured_rows must be"):
        G.replan_target(-1, 1, 1, budget=1)


def test_a_growth_is_held_until_the_grown_tables_filled():
    """PIPES §4.2: a window grown from w to w' at event time t is held fully at t + (w' − w) (the table evicts by
    the widest window); by hand: a grows 120 → 170 s and c 60 → 310 s on stream s at t = 1,000 s, e 60 → 90 s on
    stream t at 2,000 s: s is held until 1,000 + 250 s, t until 2,000 + 30 s."""
    members = [g_("a", "a", 120, 300, qos=(60, 300)), g_("c", "c", 60, 600, qos=(60, 600)),
               G.MemberLoad("e", "e", "t", 60 * S, 10 * S, 10 * S, 60 * S, 300 * S, registered=300 * S)]
    hold = G.growth_filled_at({"a": 170 * S, "c": 310 * S, "e": 90 * S}, members, {"s": 1_000 * S, "t": 2_000 * S})
    assert hold == {"s": 1_250 * S, "t": 2_030 * S}
    assert not G.growth_filled(hold, {"s": 1_249 * S, "t": 3_000 * S})
    assert not G.growth_filled(hold, {"s": 1_250 * S})                     # t's time unknown: still held
    assert G.growth_filled(hold, {"s": 1_250 * S, "t": 2_030 * S}) and G.growth_filled({}, {})
    assert G.growth_filled_at({"a": 170 * S}, members, {"s": None}) == {}   # no event time yet: not held
    with pytest.raises(KeyError, match="'z'"):
        G.growth_filled_at({"z": 1}, members, {})


def test_fixed_classes_is_the_rule_of_both_directions():
    members = [g_("a", "a", 60, 120, qos=(60, 120)), G.MemberLoad("b", "a", "s", 60 * S, 10 * S, 10 * S),
               g_("c", "c", 60, 120, qos=(60, 120))]
    assert G.fixed_classes(members) == {"a": "member 'b' has no QoS range of its window"}
    with pytest.raises(TypeError, match="members must be a sequence"):
        G.fixed_classes("a")


def test_window_at_rounds_down_to_whole_slices_and_keeps_the_slide():
    x = m("x", "x", 600, slide=20, gran=20, qos=(30, 600))
    assert G.window_at(x, 0.0) == 40 * S               # 30 s rounded up to whole slices of 20 s
    assert G.window_at(x, 1.0) == 600 * S
    assert G.window_at(x, 0.5) == 300 * S
    assert G.window_at(m("y", "y", 60), 0.3) == 60 * S  # no range: its window


def test_arguments_are_validated_with_their_names():
    with pytest.raises(ValueError, match="MemberLoad window must be"):
        G.MemberLoad("a", "a", "s", 0, 1, 1)
    with pytest.raises(ValueError, match="window_min and window_max must be given together"):
        G.MemberLoad("a", "a", "s", 10, 1, 1, 5)
    with pytest.raises(ValueError, match="StreamLoad rate"):
        G.StreamLoad(-1.0)
    with pytest.raises(ValueError, match="StreamLoad selectivity"):
        G.StreamLoad(1.0, selectivity=0)
    with pytest.raises(ValueError, match="budget must be"):
        G.admit([], m("a", "a", 60), DENSE, budget=0, row_bytes=1)
    with pytest.raises(KeyError, match="no StreamLoad for stream 'q'"):
        G.group_state_rows([m("a", "a", 60, stream="q")], DENSE)
    with pytest.raises(ValueError, match="target_rows must be"):
        G.replan([], DENSE, target_rows=-1)




def j(name, cls, wl, wr, left="s", right="t"):
    """A two-stream inner join member (windows in seconds) of join class ``cls``."""
    return G.JoinLoad(name, cls, left, right, wl * S, wr * S)


def _eq9_side(rate, keep_s, other_rate):
    """One status structure of PIPES's eq. (9) (Cammert et al., §3.6.3), by hand: a source of ``rate`` rows/s
    (d = 1000/rate ms, l = 1 ms) behind a window of ``keep_s`` seconds (Formula 7: l' = keep + 1 ms) holds
    ⌈l'/d⌉ rows plus d_other/(2·d) until the next reorganisation."""
    d, d_other = 1000 / rate, 1000 / other_rate
    return math.ceil((keep_s * 1000 + 1) / d) + d_other / (2 * d)


def test_a_join_class_state_is_eq9_through_its_widest_windows_counted_once():
    """s (100 rows/s, δ 0) joined with t (50 rows/s, δ 60 s): the class's state keeps each side for the class's
    widest window of that side plus the larger delay (the join runs at the minimum watermark of its streams):
    left 30 + 60 s, right 60 + 60 s — about 100 × 90 + 50 × 120 = 15,000 rows — however many members share it,
    whatever their keys and WHERE (every row of both streams enters the state)."""
    one = G.group_state_rows([j("a", "a", 30, 20), j("b", "a", 10, 60)], DENSE)
    oracle = _eq9_side(100, 90, 50) + _eq9_side(50, 120, 100)
    assert one == {"a": oracle} and oracle == 9_001 + 1 + 6_001 + 0.25
    assert abs(oracle - (100 * 90 + 50 * 120)) < 5                 # rows within band + delay, both sides
    # a third member inside the band adds nothing; per-member states would have counted the class three times
    assert G.group_state_rows([j("a", "a", 30, 20), j("b", "a", 10, 60), j("c", "a", 5, 5)], DENSE) == one
    assert sum(G.join_class_state_rows([x], DENSE) for x in (j("a", "a", 30, 20), j("b", "a", 10, 60))) > oracle
    # keys and selectivity do not apply to a join's state
    other = {"s": G.StreamLoad(100.0, keys=999, selectivity=0.1), "t": DENSE["t"]}
    assert G.join_class_state_rows([j("a", "a", 30, 60)], other) == oracle
    # the roles matter: t JOIN s keeps t's rows for its left window
    assert G.join_class_state_rows([j("r", "r", 60, 30, left="t", right="s")], DENSE) == oracle
    # a stream without rows keeps no state; the other side is counted against itself
    quiet = {"s": G.StreamLoad(0.0), "t": DENSE["t"]}
    assert G.join_class_state_rows([j("a", "a", 30, 60)], quiet) == _eq9_side(50, 120, 50)
    assert G.join_class_state_rows([j("a", "a", 30, 60)], {"s": G.StreamLoad(0.0), "t": G.StreamLoad(0.0)}) == 0
    # slice classes and join classes side by side, each once
    mixed = G.group_state_rows([m("x", "x", 300), j("a", "a", 30, 60), m("y", "x", 60)], DENSE)
    assert mixed == {"x": 300, "a": oracle}


def test_admission_admits_and_refuses_joins_on_their_class_state():
    members = [m("x", "x", 300), j("a", "a", 30, 60)]               # 300 + 15,003.25 rows
    base = 300 + _eq9_side(100, 90, 50) + _eq9_side(50, 120, 100)
    inside = G.admit(members, j("b", "a", 10, 20), DENSE, budget=300_000, row_bytes=10)
    assert inside.accepted and inside.added_rows == 0 and inside.rows == base
    assert "shares the join state of 'a' (1 queries)" in inside.reason
    wider = G.admit(members, j("w", "a", 90, 60), DENSE, budget=300_000, row_bytes=10)
    wide = 300 + _eq9_side(100, 150, 50) + _eq9_side(50, 120, 100)      # left kept for 90 + 60 s now
    assert wider.accepted and wider.rows == wide and wider.added_rows == pytest.approx(wide - base)
    new = j("n", "n", 10, 10, left="t", right="s")
    no = G.admit(members, new, DENSE, budget=base * 10 + 1_000, row_bytes=10)
    added = _eq9_side(50, 70, 100) + _eq9_side(100, 70, 50)
    assert not no.accepted and no.added_rows == pytest.approx(added)
    assert "rejected 'n' (a new join class)" in no.reason
    assert G.admit(members, new, DENSE, budget=(base + added) * 10, row_bytes=10).accepted


def test_a_join_class_is_fixed_in_a_replan_and_its_state_counted_as_it_is():
    """The manager never shrinks a join class's state (its band is the widest member's, fixed with the Spark
    plan): the re-plan counts it as fixed rows and reduces the slice classes to make room."""
    members = [m("x", "x", 600, qos=(60, 600)), j("a", "a", 30, 60), j("b", "a", 10, 10)]
    join_rows = _eq9_side(100, 90, 50) + _eq9_side(50, 120, 100)
    assert G.fixed_classes(members) == {"a": G.fixed_classes([j("a", "a", 1, 1)])["a"]}
    assert "join class" in G.fixed_classes(members)["a"]
    plan = G.replan(members, DENSE, target_rows=join_rows + 120)
    assert plan.feasible and plan.windows == {"x": 120 * S} and plan.rows_after == join_rows + 120
    assert set(plan.fixed) == {"a"}
    low = G.replan(members, DENSE, target_rows=join_rows)          # not even x at its minimum fits
    assert not low.feasible and low.windows == {"x": 60 * S} and low.rows_after == join_rows + 60


def test_join_loads_are_validated_with_their_names():
    with pytest.raises(ValueError, match="JoinLoad left_window must be a positive int"):
        G.JoinLoad("a", "a", "s", "t", 0, 1)
    with pytest.raises(TypeError, match="JoinLoad right must be a non-empty str"):
        G.JoinLoad("a", "a", "s", "", 1, 1)
    with pytest.raises(KeyError, match="no StreamLoad for stream 'q'.*join class 'a'"):
        G.group_state_rows([j("a", "a", 1, 1, right="q")], DENSE)
    with pytest.raises(ValueError, match="same two streams in the same roles"):
        G.join_class_state_rows([j("a", "a", 1, 1), j("b", "a", 1, 1, left="t", right="s")], DENSE)
    with pytest.raises(ValueError, match="both a slice class's and a join class's"):
        G.group_state_rows([m("a", "a", 60), j("b", "a", 1, 1)], DENSE)
    with pytest.raises(TypeError, match="new must be a MemberLoad or a JoinLoad"):
        G.admit([], "a", DENSE, budget=1, row_bytes=1)


def test_a_window_change_applies_at_the_next_micro_batch_boundary():
    from dataclasses import dataclass, replace

    @dataclass(frozen=True)
    class Cfg:
        window: int
        slide: int = 10 * S

    a = D.MemberSpec(key="a-k", name="a", text="", kind="shared", sink="/x", arrow_schema=None, config=Cfg(60 * S))
    plan = D.Plan(version=1, members={"a-k": a}, max_time=5 * S)
    nxt = apply_changes(plan, [("window", "a", 30 * S), ("window", "nobody", 1)], 7 * S)
    assert nxt.members["a-k"] == replace(a, config=Cfg(30 * S))      # only the window: same key, start, class
    # a re-plan's record goes into the plan with the window (a restart goes on with both)
    why = {"direction": "grow", "f": 1.0}
    back = apply_changes(nxt, [("window", "a", 60 * S, why)], 8 * S).members["a-k"]
    assert back == replace(a, config=Cfg(60 * S), replan=why)


# ---- on Spark: a refused add disturbs nothing ----------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_a_refused_add_leaves_the_running_groups_sinks_exact(spark, tmp_dir):
    """A group under a memory budget that holds its two queries (one slice class): a query of a new class with a
    one-day window is refused before start and while the group runs; the group's plan, pending changes and the
    two sinks are those without it (the oracle: each query alone)."""
    import os

    from test_query_group import Q, assert_same_rows, clicks_stream, start_alone, write_clicks

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime, QueryRejected

    data = os.path.join(tmp_dir, "in")
    write_clicks(data, files=2, rows=200)
    clicks = clicks_stream(spark, data)
    g = cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
    load = G.StreamLoad(200 / 240, keys=4, watermark_delay=60.0)          # 200 rows per 4 minutes, ≤ 4 pages
    # the budget: the two queries' class (widest window 2 min + 1 min delay at 10 s slices, 4 keys) at 10 B a row
    budget = 4 * (120 + 60) // 10 * 10
    rt = CQRuntime(spark, memory_budget=budget)
    with pytest.raises(ValueError, match=r"loads\['views'\]: not a stream of group"):
        rt.register_group(g, loads={"views": 1.0})
    rt.register_group(g, loads={"clicks": load}, row_bytes=10)
    for name in ("eu_1m", "eu_2m"):
        g.add(name, Q[name], sink=os.path.join(tmp_dir, "out", name))
    day = ("RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 DAY SLIDE 1 MINUTE] WHERE region = 'us' "
           "GROUP BY page)")
    with pytest.raises(QueryRejected, match=rf"'day'.*memory budget {budget:,} B"):
        g.add("day", day, sink=os.path.join(tmp_dir, "out", "day"))
    assert list(g.queries) == ["eu_1m", "eu_2m"]
    query = g.start(trigger={"availableNow": True})
    oracles = {n: start_alone(spark, Q[n], clicks, tmp_dir, n) for n in ("eu_1m", "eu_2m")}
    with pytest.raises(QueryRejected, match="'day2'"):
        g.add("day2", day, sink=os.path.join(tmp_dir, "out", "day2"))
    assert list(g.queries) == ["eu_1m", "eu_2m"]
    assert all(change[0] != "add" for _, change in D.pending_changes(g._dir))
    query.awaitTermination()
    assert query.exception() is None
    assert [m.name for m in D.read_plan(g._dir).members.values()] == ["eu_1m", "eu_2m"]
    for name, (q, out) in oracles.items():
        q.awaitTermination()
        assert assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)), spark.read.parquet(out),
                                name) > 0
    refusals = [r for r in rt.decisions_log() if r.get("rejected")]
    assert [r["query"] for r in refusals] == ["day", "day2"]
    state = rt.group_state(g.name)
    assert list(state["classes"]) == ["eu_1m"] and state["classes"]["eu_1m"]["members"] == ["eu_1m", "eu_2m"]
    assert 0 < state["estimated_rows"] <= budget / 10 and state["measured_rows"] > 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_replanned_window_survives_a_restart(spark, tmp_dir):
    """The runtime reduces a query's window (2 → 1 minute, its QoS minimum) after a first run; a new group object on
    the checkpoint, with the same query, goes on with 1 minute and the re-plan's record. The oracle, each query
    alone stopped and restarted the same way: the sink's windows up to the first run's last one are those of the
    2-minute text alone, the later ones those of the 1-minute text alone (the table kept the 2-minute slices,
    so nothing of the 1-minute windows is missing): 0 lost, 0 duplicated. Then a runtime with room grows the
    window back to the registered 2 minutes."""
    import os

    from pyspark.sql import functions as F
    from test_query_group import assert_same_rows, clicks_stream, start_alone, write_clicks

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    text = ("RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE {} SLIDE 20 SECONDS] WHERE region = 'eu' "
            "GROUP BY page) WITH (WINDOW BETWEEN 1 MINUTE AND 2 MINUTES)")
    two, one = text.format("2 MINUTES"), text.format("1 MINUTE")
    write_clicks(os.path.join(tmp_dir, "all"), files=2, rows=150)
    files = sorted(os.listdir(os.path.join(tmp_dir, "all")))
    load = {"clicks": G.StreamLoad(150 / 240, keys=4, watermark_delay=60.0)}

    def run(file, oracles):
        for where in ("in", "in_alone"):
            os.makedirs(os.path.join(tmp_dir, where), exist_ok=True)
            os.link(os.path.join(tmp_dir, "all", file), os.path.join(tmp_dir, where, file))
        g = cq.QueryGroup(spark, sources={"clicks": clicks_stream(spark, os.path.join(tmp_dir, "in"))},
                          checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
        g.add("q", two, sink=os.path.join(tmp_dir, "out", "q"))
        query = g.start(trigger={"availableNow": True})
        clicks = clicks_stream(spark, os.path.join(tmp_dir, "in_alone"))
        started = {n: start_alone(spark, t, clicks, tmp_dir, n) for n, t in oracles.items()}   # side by side
        query.awaitTermination()
        assert query.exception() is None
        for q, _ in started.values():
            q.awaitTermination()
        return g, {n: spark.read.parquet(out) for n, (_, out) in started.items()}

    g1, first = run(files[0], {"two": two, "one": one})
    sink = os.path.join(tmp_dir, "out", "q")
    assert_same_rows(spark.read.parquet(sink), first["two"], "first run")
    t1 = spark.read.parquet(sink).agg(F.max("cq_at")).first()[0]
    assert t1 is not None
    state = g1.overview()["state_bytes"]
    rt = CQRuntime(spark, memory_budget=state // 2)            # the measured state is twice the budget
    rt.register_group(g1, loads=load, row_bytes=1)
    [record] = rt.replan_groups()
    assert record["direction"] == "reduce" and record["changes"] == [{"query": "q", "window": 60 * S}]
    assert g1.windows()["q"]["window"] == 60 * S               # the group had stopped: into its plan at once

    g2, alone = run(files[1], {"one": one})
    w = g2.windows()["q"]
    assert (w["window"], w["registered"], w["replan"]["direction"]) == (60 * S, 120 * S, "reduce")
    assert D.read_plan(g2._dir).by_name("q").config.window == 60 * S
    got = spark.read.parquet(sink)
    assert_same_rows(got.filter(F.col("cq_at") <= t1), first["two"], "before the re-plan")   # nothing more
    assert assert_same_rows(got.filter(F.col("cq_at") > t1), alone["one"].filter(F.col("cq_at") > t1),
                            "after the restart") > 0
    # room again (the state far below half the budget): back to the registered window, recorded as a growth
    rt2 = CQRuntime(spark, memory_budget=1 << 30)
    rt2.register_group(g2, loads=load, row_bytes=1)
    [grown] = rt2.replan_groups()
    assert grown["direction"] == "grow" and grown["changes"] == [{"query": "q", "window": 120 * S}]
    assert g2.windows()["q"]["window"] == 120 * S and g2.windows()["q"]["replan"]["direction"] == "grow"
    # a policy's window decision for the member goes through the group, rounded down to whole 20 s slices
    from pyspark_cq.policies import Decision, Decisions, Policy

    class Narrow(Policy):
        name = "narrow"

        def decide(self, snapshot):
            assert snapshot.queries["q"].qos and snapshot.queries["q"].slice_class == "q"
            return Decisions([Decision("q_agg", {"window": 90 * S}, "test", query="q")], self.name)

    rt3 = CQRuntime(spark, policies=[Narrow()])
    rt3.register_group(g2)
    [decided] = rt3.run_policies()
    assert decided["applied"] and decided["routed"] == ["q_agg"]
    assert g2.windows()["q"]["window"] == 80 * S and g2.windows()["q"]["replan"]["policy"] == "narrow"
