"""Text meant for people shows durations and sizes in human units, never µs counts or exponents (issue 41).

Plans, QoS ranges, the refusals of changes outside a QoS range, the PIPES resource manager's reasons, the
CQL explain text and the reprs of the control table and of a schedule; machine-readable values stay µs.
"""
from __future__ import annotations

import pytest
from pyspark_cq_plugins.pipes_rm import PipesResourceManager

from pyspark_cq import _human
from pyspark_cq import plan as P
from pyspark_cq.control import ControlTable, Decision
from pyspark_cq.control.schedule import Schedule
from pyspark_cq.lang.compiler import explain
from pyspark_cq.policies import QoSRange
from pyspark_cq.policies.decisions import bound_violations
from pyspark_cq.policies.snapshot import QueryInfo, SourceStats

S = 1_000_000


@pytest.mark.parametrize("micros, text", [
    (30 * S, "30 s"), (300 * S, "5 min"), (1_500_000, "1.5 s"), (200_000, "200 ms"), (12, "12 µs"),
    (3600 * S, "1 h"), (0, "0 s"), (-90 * S, "-1.5 min"), (5e6, "5 s"), (1_234_567, "1.235 s"),
])
def test_duration_text(micros, text):
    assert _human.duration(micros) == text


@pytest.mark.parametrize("nbytes, text", [(19_200, "19.2 KB"), (5.76e7, "57.6 MB"), (742, "742 B"),
                                          (600_000, "600 KB"), (2.88146e12, "2.881 TB")])
def test_size_text(nbytes, text):
    assert _human.size(nbytes) == text


def test_plain_numbers_have_no_exponent():
    assert [_human.plain(x) for x in (3e7, 1.2e-5, 0.25, 100)] == ["30000000", "0.000012", "0.25", "100"]


def test_plan_in_micros_shows_durations():
    plan = P.Granularity(P.Window(P.Select(P.Source("scans"), 0.25), 3e7), 5e6)
    assert P.render(plan, micros=True) == "Γ[5 s](ω[30 s](σ[0.25](scans)))"
    assert P.render(plan) == "Γ[5000000](ω[30000000](σ[0.25](scans)))"


def test_qos_range_repr():
    assert repr(QoSRange.window("5 s", "20 s")) == "QoSRange(min=5 s, max=20 s, step=1 s)"
    assert repr(QoSRange.granularity("10 seconds", "1 second", choices=["10 s", "5 s", "1 s"])) == \
        "QoSRange(min=10 s, max=1 s, choices=(10 s, 5 s, 1 s))"
    assert repr(QoSRange(0, 0.5)) == "QoSRange(min=0, max=0.5)"
    assert QoSRange.window("5 s", "20 s") == QoSRange(5 * S, 20 * S, S)       # the flag is not compared


def test_refusal_outside_the_qos_range_names_durations():
    bounds = {"sensors_agg.window": QoSRange.window("2 s", "30 s"), "sensors_agg.drop_ratio": QoSRange(0, 0.5)}
    got = bound_violations([Decision("sensors_agg", {"window": 3600 * S, "drop_ratio": 0.75})], bounds)
    assert got == ["sensors_agg.window = 1 h lies outside its QoS range [2 s, 30 s]",
                   "sensors_agg.drop_ratio = 0.75 lies outside its QoS range [0, 0.5]"]


def test_pipes_reason_names_bytes():
    rm = PipesResourceManager(64e6, estimate=lambda plan, d: (19_200.0, 1.0), reserve=0.1)
    label = "q-w.window"
    info = QueryInfo("q", P.Window(P.Source("A"), 10 * S, label=label), {label: QoSRange.window("1 s", "10 s")},
                     {"A": SourceStats("A", 1e4, 1e-4)})
    reason = rm.admit_query(info).reason
    assert "estimated memory 19.2 KB within bound 57.6 MB" in reason, reason


def test_cql_explain_in_human_units_and_labels_once():
    text = explain("ISTREAM(SELECT * FROM A [RANGE 10 SECONDS], B [RANGE 10 SECONDS] WHERE A.k = B.k) "
                   "WITH (WINDOW BETWEEN 5 SECONDS AND 20 SECONDS)", {"A": ["k", "ts"], "B": ["k", "ts"]})
    assert "plan       π((ω[10 s](A) ⋈ ω[10 s](B)))" in text
    assert "labels     q_join.window, q_join\n" in text
    assert "qos        q_join.window: QoSRange(min=5 s, max=20 s, step=1 s)" in text
    assert "d = 1 ms per source" in text and "memory 1.28 MB" in text
    assert "e+" not in text


def test_control_table_and_schedule_reprs(tmp_path):
    table = ControlTable(str(tmp_path / "control.json"))
    table.register("a", query="q", window=30 * S, drop_ratio=0.25)
    table.register("b", query="q", lower=-90 * S, upper=0)
    text = repr(table)
    assert "30 s" in text and "-1.5 min" in text and "0.25" in text and "30000000" not in text
    schedule = Schedule("window", ((None, 30 * S), (1_704_067_205_000_000, 20 * S)))
    assert repr(schedule) == "Schedule(window: 30 s; 20 s from 2024-01-01T00:00:05)"
    assert schedule.points[1] == (1_704_067_205_000_000, 20 * S)             # the values stay µs
