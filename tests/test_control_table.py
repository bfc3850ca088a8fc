"""Control table (STREAM §6.1) and PIPES transition semantics (§2.4.2, §2.4.3, §4.2)."""
from __future__ import annotations

import json
import math
import os
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq import control
from pyspark_cq.control import ControlHandle, ControlTable, Schedule, granularity_effective_at
from pyspark_cq.policies import Decision, Decisions

S = 1_000_000


@pytest.fixture
def table(tmp_path):
    control.clear_cache()
    return ControlTable(str(tmp_path / "ct.json"), clock=lambda op: 1_000 * S)


# ---------------------------------------------------------------------------------------------
# the table


def test_register_set_versions_and_log(table):
    table.register("join1", query="q1", window="60 seconds", drop_ratio=0.0, plan_id="p0")
    assert table.version == 1
    e = table.set("join1", window="30 seconds", reason="shrink", who="alice", at=80 * S)
    assert (e.version, e.table_version, e.params["window"]) == (2, 2, 30 * S)
    table.set("join1", drop_ratio=0.25, params={"k": 1}, reason="shed", who="pipes")
    log = table.changes("join1")
    assert [c.action for c in log] == ["register", "set", "set"]
    assert log[1].old == {"window": 60 * S} and log[1].new == {"window": 30 * S}
    assert (log[1].who, log[1].reason, log[1].at) == ("alice", "shrink", {"window": 80 * S})
    assert log[2].new == {"drop_ratio": 0.25, "params": {"k": 1}} and log[2].who == "pipes"
    assert all(c.time.endswith("+00:00") for c in log)
    assert [c.version for c in table.changes()] == [1, 2, 3]


def test_register_existing_keeps_entry(table):
    table.register("agg", window=10 * S)
    table.register("agg", window=99 * S)          # the running entry wins
    assert table.entry("agg").params["window"] == 10 * S
    assert table.version == 1


def test_unchanged_value_is_not_a_change(table):
    table.register("op", drop_ratio=0.1)
    table.set("op", drop_ratio=0.1, reason="same")
    assert table.version == 1 and len(table.changes()) == 1


@pytest.mark.parametrize("params, message", [
    ({"windw": 3}, "unknown parameter 'windw'"),
    ({"window": -3}, "window must be a positive duration"),
    ({"window": "ten seconds"}, "window must be a duration"),
    ({"drop_ratio": 1.0}, "drop_ratio must be in [0, 1)"),
    ({"drop_ratio": "half"}, "drop_ratio must be a real number"),
    ({"plan_id": ""}, "plan_id must be a non-empty str"),
    ({"params": {"x": object()}}, "params['x'] must be JSON-serialisable"),
    ({"lower": 5 * S, "upper": 1 * S}, "lower must be <= upper"),
])
def test_validation_names_key_and_value(table, params, message):
    table.register("op")
    with pytest.raises((TypeError, ValueError)) as info:
        table.set("op", reason="bad", **params)
    assert message in str(info.value) and "'op'" in str(info.value)
    assert table.version == 1


def test_bounds_checked_against_merged_entry(table):
    table.register("j", lower=-10 * S, upper=10 * S)
    with pytest.raises(ValueError, match="lower must be <= upper"):
        table.set("j", lower=20 * S, reason="bad")
    assert table.entry("j").params["lower"] == -10 * S


def test_unknown_operator_and_bad_id(table):
    table.register("a")
    with pytest.raises(KeyError, match=r"no entry 'b'.*\['a'\]"):
        table.set("b", window=S, reason="x")
    with pytest.raises(ValueError, match="operator id"):
        table.register("has.dot")


def test_apply_is_all_or_nothing(table):
    table.register("a", window=10 * S)
    ds = Decisions([Decision("a", {"window": 5 * S}, "r"), Decision("zz", {"window": 5 * S}, "r")], "pol")
    with pytest.raises(KeyError):
        table.apply(ds)
    assert table.version == 1 and table.entry("a").params["window"] == 10 * S
    changes = table.apply(Decisions([Decision("a", {"window": 5 * S}, "because")], "pol"))
    assert [(c.who, c.reason, c.new) for c in changes] == [("pol", "because", {"window": 5 * S})]


def test_params_merge_and_delete(table):
    table.register("a", params={"x": 1, "y": 2})
    table.set("a", params={"y": None, "z": [1, 2]}, reason="edit")
    assert table.entry("a").params["params"] == {"x": 1, "z": [1, 2]}


def test_remove_is_logged(table):
    table.register("a", window=S)
    table.remove("a", reason="gone")
    assert "a" not in table and table.changes()[-1].action == "remove"


def test_document_is_atomic_json_and_no_temp_files_remain(table, tmp_path):
    table.register("a", window=S)
    for i in range(5):
        table.set("a", window=(i + 2) * S, reason="step")
    doc = json.loads((tmp_path / "ct.json").read_text())
    assert doc["format"] == control.FORMAT and doc["version"] == 6
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_concurrent_reader_never_sees_a_partial_document(table):
    table.register("a", window=S, params={"pad": "x" * 20_000})
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                e = control.entry(table.path, "a")
                assert e is not None and e.params["window"] >= S
            except Exception as exc:  # pragma: no cover - the failure being tested for
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(60):
        table.set("a", window=(i + 2) * S, reason="churn")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []


def test_writers_in_two_handles_do_not_lose_changes(tmp_path):
    path = str(tmp_path / "ct.json")
    a, b = ControlTable(path), ControlTable(path)
    a.register("x", params={})

    def work(t, tag):
        for i in range(25):
            t.set("x", params={f"{tag}{i}": i}, reason="race")

    threads = [threading.Thread(target=work, args=(a, "a")), threading.Thread(target=work, args=(b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.version == 51 and len(a.entry("x").params["params"]) == 50


def test_reader_parses_only_when_file_changes(table):
    table.register("a", window=S)
    control.clear_cache()
    assert control.entry(table.path, "a").version == 1
    store = control.reader._STORES[table.path]          # the reader's store (what a worker uses)
    reads = []
    real = store.read
    store.read = lambda: reads.append(1) or real()
    for _ in range(5):
        assert control.entry(table.path, "a").version == 1
    assert reads == []                           # unchanged file: stat only, no read, no parse
    table.set("a", window=2 * S, reason="change")
    assert control.entry(table.path, "a").params["window"] == 2 * S
    assert control.entry(table.path, "a").params["window"] == 2 * S
    assert len(reads) == 1


def test_reader_max_age_skips_the_stat(table):
    table.register("a", window=S)
    control.clear_cache()
    assert control.entry(table.path, "a", max_age=3600).params["window"] == S
    table.set("a", window=2 * S, reason="change")
    assert control.entry(table.path, "a", max_age=3600).params["window"] == S   # cached on purpose
    assert control.entry(table.path, "a").params["window"] == 2 * S


def test_reader_without_table_or_entry(tmp_path):
    control.clear_cache()
    assert control.entry(str(tmp_path / "missing.json"), "a") is None
    t = ControlTable(str(tmp_path / "ct.json"))
    assert control.entry(t.path, "nobody") is None


def test_handle_pickles_and_reads(table):
    table.register("a", drop_ratio=0.5)
    handle = pickle.loads(pickle.dumps(table.handle("a")))
    assert isinstance(handle, ControlHandle) and handle.entry().get("drop_ratio") == 0.5
    with pytest.raises(TypeError, match="path"):
        ControlHandle("", "a")


def test_set_without_at_uses_the_clock(table):
    table.register("a", window=60 * S)
    table.set("a", window=30 * S, reason="clock")
    e = table.entry("a")
    assert e.value_at("window", 1_000 * S - 1) == 60 * S and e.value_at("window", 1_000 * S) == 30 * S
    assert e.transitions("window")[0].effect_start == 1_030 * S


def test_granularity_change_moves_to_next_coarser_instant(table):
    table.register("agg", granularity=10 * S)
    table.set("agg", granularity=S, reason="refine", at=1_234 * S)   # refine: next multiple of 10 s
    e = table.entry("agg")
    assert table.changes("agg")[-1].at == {"granularity": 1_240 * S}
    assert e.value_at("granularity", 1_239 * S) == 10 * S and e.value_at("granularity", 1_240 * S) == S


def test_paper_5_1_effect_windows(table):
    """PIPES §5.1: 60 s → 30 s at 80 s shows 110–140 s; back to 60 s at 150 s shows 180–210 s."""
    table.register("join", window=60 * S)
    table.set("join", window=30 * S, at=80 * S, reason="5.1")
    table.set("join", window=60 * S, at=150 * S, reason="5.1")
    tr = table.entry("join").transitions("window")
    assert [(t.effect_start // S, t.effect_complete // S) for t in tr] == [(110, 140), (180, 210)]


def test_repr_shows_entries(table):
    table.register("a", query="q", window=S)
    text = repr(table)
    assert "a" in text and " 1 s " in text and "1000000" not in text and "version=1" in text


# ---------------------------------------------------------------------------------------------
# transition semantics against plain references

times = st.integers(min_value=-10_000, max_value=10_000)


@st.composite
def schedules(draw, param="window"):
    first = draw(st.integers(1, 500))
    n = draw(st.integers(0, 6))
    ats = sorted(draw(st.lists(times, min_size=n, max_size=n)))
    values = draw(st.lists(st.integers(1, 500), min_size=n, max_size=n))
    return Schedule(param, ((None, first),) + tuple(zip(ats, values)))


def reference_value(points, ts):
    value = points[0][1]
    for at, v in points[1:]:
        if at <= ts:
            value = v
    return value


@given(schedules(), times)
def test_value_at_matches_reference(sched, ts):
    assert sched.value_at(ts) == reference_value(sched.points, ts)


@given(schedules(), st.lists(times, min_size=1, max_size=30))
def test_values_at_matches_value_at(sched, ts):
    arr = np.asarray(ts, dtype=np.int64)
    assert sched.values_at(arr).tolist() == [sched.value_at(t) for t in ts]


@given(st.integers(0, 1000), st.integers(1, 200), st.integers(1, 200))
def test_effect_times_are_t_plus_min_and_max(t, old, new):
    sched = Schedule("window", ((None, old), (t, new)))
    (tr,) = sched.transitions() if old != new else (None,)
    if tr is None:
        return
    assert (tr.effect_start, tr.effect_complete) == (t + min(old, new), t + max(old, new))


@settings(max_examples=60)
@given(st.integers(0, 50), st.integers(1, 40), st.integers(1, 40))
def test_state_size_follows_the_transition_ramp(t, old, new):
    """Brute force: a source emitting one element per instant; an element at s is valid at tau while
    tau - s < w(s). The count of valid elements equals old + progress·(new − old) up to one element."""
    if old == new:
        return
    sched = Schedule("window", ((None, old), (t, new)))
    (tr,) = sched.transitions()
    for tau in range(t - 5, t + max(old, new) + 5):
        s = np.arange(tau - 200, tau + 1)
        valid = int(np.sum(tau - s < sched.values_at(s)))
        model = old + tr.progress(tau) * (new - old)
        assert abs(valid - model) <= 1 + 1e-9, (tau, valid, model)
        if tau < tr.effect_start:
            assert valid == old          # nothing visible before t + min(w, w')
        if tau >= tr.effect_complete:
            assert valid == new          # fully visible from t + max(w, w')


@given(st.integers(-1000, 1000), st.integers(1, 30), st.integers(1, 30))
def test_granularity_effective_at_matches_scan(t, g_old, g_new):
    x = t
    while x % g_old or x % g_new:
        x += 1
    assert granularity_effective_at(t, g_old, g_new) == x


@st.composite
def granularity_requests(draw):
    base = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    changes = draw(st.lists(st.tuples(st.integers(0, 300), st.sampled_from([1, 2, 3, 4, 6, 12])), max_size=5))
    return base, sorted(changes)


def _round_up(ts, g):
    return -(-ts // g) * g


@given(granularity_requests(), st.lists(st.integers(0, 400), min_size=2, max_size=60))
def test_granularity_changes_keep_rounded_starts_ordered(requests, stamps):
    """Γ rounds starts up (PIPES §2.4.3); with the change instants of the rule, an ordered stream stays ordered."""
    base, changes = requests
    sched = Schedule.constant("granularity", base)
    for at, g in changes:
        sched = sched.with_change(at, g)
    ts = sorted(stamps)
    rounded = [_round_up(s, sched.value_at(s)) for s in ts]
    assert rounded == sorted(rounded)


def test_immediate_refinement_would_break_order():
    """The counter-example the rule exists for: refining 10 → 1 at t = 5 immediately."""
    naive = Schedule("granularity", ((None, 10), (5, 1)))
    assert _round_up(4, naive.value_at(4)) > _round_up(6, naive.value_at(6))
    ruled = Schedule.constant("granularity", 10).with_change(5, 1)
    assert ruled.points[-1] == (10, 1)
    assert _round_up(4, ruled.value_at(4)) <= _round_up(6, ruled.value_at(6))


def test_with_change_rules():
    s = Schedule.constant("window", 60).with_change(100, 30)
    assert s.with_change(50, 20).points == ((None, 60), (100, 20))          # not before a pending change
    assert s.with_change(100, 60).points == ((None, 60),)                    # a change back cancels
    assert s.with_change(100, 60).with_change(200, 60).points == ((None, 60),)
    many = Schedule.constant("window", 1)
    for i in range(40):
        many = many.with_change(i * 10, i + 2, keep=8)
    assert len(many.points) == 8 and many.latest == 41


def test_progress_is_vectorised_and_clipped():
    (tr,) = Schedule("window", ((None, 60), (80, 30))).transitions()
    assert tr.progress(110) == 0.0 and tr.progress(140) == 1.0 and math.isclose(tr.progress(125), 0.5)
    assert tr.progress(np.array([0, 125, 500])).tolist() == [0.0, 0.5, 1.0]
    (g,) = Schedule("granularity", ((None, 10), (20, 5))).transitions()
    with pytest.raises(ValueError, match="window-like"):
        g.progress(30)


def test_schedule_validation():
    with pytest.raises(ValueError, match="param"):
        Schedule("speed", ((None, 1),))
    with pytest.raises(ValueError, match="non-decreasing"):
        Schedule("window", ((None, 1), (10, 2), (5, 3)))
    with pytest.raises(TypeError, match="integer"):
        Schedule("window", ((None, 1.5),))
    with pytest.raises(TypeError, match="integer array"):
        Schedule.constant("window", 1).values_at(np.array([1.5]))


def test_reader_module_does_not_import_spark():
    """Operators import the reader on every Python worker: it must stay free of PySpark."""
    import subprocess
    import sys

    code = ("import sys, pyspark_cq.control as c; "
            "assert 'pyspark' not in sys.modules, sorted(m for m in sys.modules if m.startswith('pyspark.'))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_operators_reject_parameters_they_do_not_read(table):
    from pyspark_cq.control import OPERATOR_PARAMETERS, operator_handle, unread_parameters

    assert unread_parameters("multi_join", {"window": S, "drop_ratio": 0.5, "plan_id": "x"}) == ["window"]
    assert unread_parameters("sliding_aggregate", {"window": S, "drop_ratio": 0.5, "plan_id": "x"}) == ["plan_id"]
    assert unread_parameters("sliding_aggregate", {"drop_ratio": 0.0}) == []     # drops nothing
    assert unread_parameters("interval_join", {"lower": -S, "drop_ratio": 0.5, "params": {}}) == []
    assert set(OPERATOR_PARAMETERS) >= {"interval_join", "window_join", "sliding_aggregate", "select_chain"}
    with pytest.raises(ValueError, match="operator_kind must be one of"):
        unread_parameters("sort", {})
    table.register("j1", lower=-S, upper=S)
    handle = operator_handle(table.handle("j1"), "interval_join")
    assert handle.kind == "interval_join" and handle.entry().params["upper"] == S
    table.set("j1", window=5 * S, reason="a window on an interval join")
    with pytest.raises(ValueError, match=r"interval_join 'j1'.*sets window.*at a micro-batch"):
        handle.entry()
    with pytest.raises(ValueError, match=r"when the operator was defined"):
        operator_handle(table.handle("j1"), "interval_join")
    with pytest.raises(TypeError, match="control must be a pyspark_cq.control.ControlHandle"):
        operator_handle(table, "interval_join")
    assert operator_handle(None, "interval_join") is None
