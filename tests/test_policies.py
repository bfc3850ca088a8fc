"""Policies: decision types, QoS ranges, the plugin registry and the shared check suite."""
from __future__ import annotations

import importlib.metadata as md
import itertools
import random
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_cq import policies
from pyspark_cq.policies import (
    Admission,
    Decision,
    Decisions,
    Policy,
    PolicyLoadError,
    PolicyPluginWarning,
    QoSRange,
    Snapshot,
    parse_size,
)
from pyspark_cq.policies.checks import check_policy, example_snapshots
from pyspark_cq.policies.decisions import bound_violations, qos_values

S = 1_000_000


# ---------------------------------------------------------------------------------------------
# decisions and QoS ranges


def test_decision_normalises_and_validates():
    d = Decision("join1", {"window": "30 seconds", "drop_ratio": 0}, "why", query="q", at="80 seconds")
    assert d.changes == {"window": 30 * S, "drop_ratio": 0.0} and d.at == 80 * S
    with pytest.raises(ValueError, match="unknown parameter 'size'"):
        Decision("join1", {"size": 1})
    with pytest.raises(ValueError, match="at least one"):
        Decision("join1", {})
    with pytest.raises(ValueError, match="operator id"):
        Decision("a.b", {"window": 1})
    with pytest.raises(TypeError, match="Decision"):
        Decisions([{"operator": "x"}])


def test_decisions_equality_and_pickle():
    import pickle

    a = Decisions([Decision("x", {"window": S}, "r")], "p")
    b = pickle.loads(pickle.dumps(a))
    assert a == b and a != Decisions([], "p") and a.operators() == ["x"]


def test_admission_rejection_needs_reason():
    with pytest.raises(ValueError, match="reason"):
        Admission(False)
    assert Admission(True).accepted


def test_qos_range_constructors():
    w = QoSRange.window("1 minute", "30 minutes", step=1)  # the 1 µs step explicitly (default: 1 s)
    assert (w.min, w.max, w.step) == (60 * S, 1800 * S, 1)
    g = QoSRange.granularity("10 seconds", "1 second")
    assert (g.min, g.max, g.step) == (10 * S, S, S)
    with pytest.raises(ValueError, match="min <= max"):
        QoSRange.window("2 minutes", "1 minute")
    with pytest.raises(ValueError, match="coarsest >= finest"):
        QoSRange.granularity("1 second", "10 seconds")
    with pytest.raises(ValueError, match="outside"):
        QoSRange(10, 1, choices=(20,))


def _reference_closest(low, high, f, allowed):
    """Brute force: the allowed value nearest to low + f·(high − low); ties towards low."""
    target = low + f * (high - low)
    return min(allowed, key=lambda v: (abs(v - target), abs(v - low)))


@given(st.integers(1, 50), st.integers(0, 60), st.integers(1, 7), st.integers(0, 16))
def test_qos_values_step_matches_brute_force(lo, span, step, k):
    hi, f = lo + span, k / 16
    allowed = sorted({v for v in range(0, hi + step, step) if lo <= v <= hi} | {lo, hi})
    assert qos_values(lo, hi, f, step=step) == pytest.approx(_reference_closest(lo, hi, f, allowed))


@given(st.lists(st.integers(1, 100), min_size=1, max_size=6, unique=True), st.integers(0, 16))
def test_qos_values_choices_match_brute_force(choices, k):
    lo, hi = max(choices) + 5, min(choices)        # a granularity: min is the coarsest
    f = k / 16
    assert qos_values(lo, hi, f, choices=choices) == _reference_closest(lo, hi, f, choices)


def test_granularity_value_at_hand_computed():
    g = QoSRange.granularity("10 seconds", "1 second")
    # f = 0.125: 10 s + 0.125·(1 s − 10 s) = 8.875 s -> nearest multiple of 1 s is 9 s
    assert g.value_at(0.125) == 9 * S and g.value_at(0.0) == 10 * S and g.value_at(1.0) == S
    with pytest.raises(ValueError, match="fraction"):
        g.value_at(1.5)


def test_bound_violations():
    bounds = {"a.window": QoSRange.window(S, 10 * S)}
    ok = [Decision("a", {"window": 5 * S})]
    assert bound_violations(ok, bounds) == []
    bad = [Decision("a", {"window": 20 * S}), Decision("b", {"granularity": S}), Decision("b", {"drop_ratio": 0.5})]
    problems = bound_violations(bad, bounds)
    assert len(problems) == 2 and "outside" in problems[0] and "without a declared" in problems[1]


@pytest.mark.parametrize("text, expected", [("512 MB", 512e6), ("2 GiB", 2 * 2**30), ("4g", 4 * 2**30),
                                            (1024, 1024.0), ("100", 100.0)])
def test_parse_size(text, expected):
    assert parse_size(text, "memory") == expected


@pytest.mark.parametrize("bad", ["lots", "-1 MB", 0, True, "5 parsecs"])
def test_parse_size_rejects(bad):
    with pytest.raises((TypeError, ValueError), match="memory"):
        parse_size(bad, "memory")


# ---------------------------------------------------------------------------------------------
# registry (entry points simulated)

PLUGIN_SOURCE = textwrap.dedent('''
    from pyspark_cq.policies import Decisions, Policy

    class Quiet(Policy):
        name = "quiet"
        def decide(self, snapshot):
            return Decisions((), self.name)

    class Loud(Policy):
        name = "quiet"
        def decide(self, snapshot):
            return Decisions((), self.name)

    class Misnamed(Policy):
        name = "something-else"
        def decide(self, snapshot):
            return Decisions((), self.name)

    NOT_A_POLICY = object()
''')


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    (tmp_path / "fake_cq_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        md.EntryPoint("quiet", "fake_cq_plugin:Quiet", policies.GROUP),
        md.EntryPoint("quiet", "fake_cq_plugin:Loud", policies.GROUP),          # duplicate name
        md.EntryPoint("broken", "no_such_module_xyz:Policy", policies.GROUP),    # import fails
        md.EntryPoint("notpolicy", "fake_cq_plugin:NOT_A_POLICY", policies.GROUP),
        md.EntryPoint("misnamed", "fake_cq_plugin:Misnamed", policies.GROUP),
    ]
    calls = []

    def entry_points(**kw):
        calls.append(kw)
        assert kw == {"group": policies.GROUP}
        return md.EntryPoints(eps)

    monkeypatch.setattr(md, "entry_points", entry_points)
    policies.refresh()
    yield calls
    policies.refresh()


def test_available_is_lazy_and_reports_duplicates(fake_plugins):
    with pytest.warns(PolicyPluginWarning, match="'quiet' is registered more than once"):
        names = policies.available()
    assert names == ["broken", "misnamed", "notpolicy", "quiet"]
    assert "fake_cq_plugin" not in __import__("sys").modules       # nothing imported yet
    assert policies.load("quiet").__name__ == "Loud"                # first by target: Loud < Quiet
    assert any("more than once" in p for p in policies.problems())


def test_broken_plugins_are_reported_and_skipped(fake_plugins):
    with pytest.warns(PolicyPluginWarning) as record:
        names = policies.available(load=True)
    assert names == ["quiet"]
    text = " ".join(str(w.message) for w in record)
    assert "'broken'" in text and "ModuleNotFoundError" in text
    assert "'notpolicy'" in text and "not a subclass" in text
    assert "'misnamed'" in text and "declares name 'something-else'" in text
    with pytest.raises(PolicyLoadError, match="failed to load"):
        policies.load("broken")
    with pytest.raises(PolicyLoadError, match=r"no policy named 'nope'; available: \['broken'"):
        policies.load("nope")


def test_discovery_reads_metadata_once(fake_plugins):
    with pytest.warns(PolicyPluginWarning):
        policies.available()
    policies.available()
    assert len(fake_plugins) == 1


def test_create_accepts_names_classes_instances(fake_plugins):
    with pytest.warns(PolicyPluginWarning):
        p = policies.create("quiet")
    assert isinstance(p, Policy) and policies.create(p) is p and isinstance(policies.create(type(p)), type(p))
    with pytest.raises(TypeError, match="options"):
        policies.create(p, x=1)
    with pytest.raises(TypeError, match="registered policy name"):
        policies.create(42)


def test_registry_survives_a_failing_metadata_scan(monkeypatch):
    def boom(**kw):
        raise RuntimeError("corrupt site-packages")

    monkeypatch.setattr(md, "entry_points", boom)
    policies.refresh()
    with pytest.warns(PolicyPluginWarning, match="corrupt site-packages"):
        assert policies.available() == []
    policies.refresh()


def test_shipped_plugins_are_registered():
    policies.refresh()
    assert "pipes" in policies.available(load=True)
    assert policies.load("pipes").__module__ == "pyspark_cq_plugins.pipes_rm"


# ---------------------------------------------------------------------------------------------
# the shared check suite, over every registered policy

policies.refresh()
_REGISTERED = [(name, kw) for name in policies.available(load=True)
               for kw in policies.load(name)._unit_test_params()]


@pytest.mark.parametrize("name, params", _REGISTERED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(_REGISTERED)])
def test_every_registered_policy_passes_the_check_suite(name, params):
    check_policy(policies.load(name)(**params))


def test_some_policy_is_registered():
    assert _REGISTERED, "no policy is registered under the entry-point group: the check suite would test nothing"


# policies that each break one rule: the suite must catch them

class _Base(Policy):
    name = "bad"

    def decide(self, snapshot):
        return Decisions((), self.name)


class RaisesOnEmpty(_Base):
    def decide(self, snapshot):
        if snapshot.empty:
            raise ZeroDivisionError("no queries")
        return super().decide(snapshot)


class Random(_Base):
    def decide(self, snapshot):
        ops = sorted(op for q in snapshot.queries.values() for op in q.control)
        if not ops:
            return Decisions((), self.name)
        return Decisions([Decision(ops[0], {"drop_ratio": random.random() * 0.9})], self.name)


class OutOfBounds(_Base):
    def decide(self, snapshot):
        ops = sorted(op for q in snapshot.queries.values() for op in q.control)
        return Decisions([Decision(op, {"window": 3600 * S}) for op in ops], self.name)


class Unpicklable(_Base):
    def __init__(self):
        self.lock = threading.Lock()

    def params(self):
        return {}


class WrongStamp(_Base):
    def decide(self, snapshot):
        return Decisions((), "someone-else")


class Stranger(_Base):
    def decide(self, snapshot):
        return Decisions([Decision("not-an-operator", {"drop_ratio": 0.1})] if snapshot.queries else [], self.name)


@pytest.mark.parametrize("cls, check", [
    (RaisesOnEmpty, "check_empty_statistics"), (Random, "check_picklable|check_deterministic"),
    (OutOfBounds, "check_within_bounds"), (Unpicklable, "check_picklable"),
    (WrongStamp, "check_returns_decisions"), (Stranger, "check_within_bounds"),
])
def test_check_suite_catches_broken_policies(cls, check):
    with pytest.raises(AssertionError, match=check):
        check_policy(cls())


def test_well_behaved_policy_passes():
    check_policy(_Base())


def test_example_snapshots_are_valid_and_varied():
    snaps = example_snapshots()
    assert snaps[0].empty and not snaps[2].empty
    assert len({s.memory_budget for s in snaps}) >= 2
    rates = [q.sources[s].input_rate for snap in snaps for q in snap.queries.values() for s in q.sources]
    assert any(np.isnan(r) for r in rates) and any(r > 0 for r in rates)


def test_policy_clone_and_params():
    from pyspark_cq_plugins.pipes_rm import PipesResourceManager

    rm = PipesResourceManager("1 GB", p=4, knots=8)
    twin = rm.clone()
    assert twin.params() == rm.params() and twin is not rm and "memory=1000000000.0" in repr(rm)
    assert list(itertools.islice(policies.checks.yield_checks(rm), 1))[0].__name__ == "check_name"
    with pytest.raises(TypeError, match="Snapshot"):
        rm.decide({})
    assert rm.decide(Snapshot()) == Decisions((), "pipes")


def test_the_plugins_docstring_lists_every_shipped_policy():
    """``pyspark_cq_plugins``'s table names every entry point of the group, with its class."""
    from importlib.metadata import entry_points

    import pyspark_cq_plugins

    doc = pyspark_cq_plugins.__doc__
    shipped = [ep for ep in entry_points(group="pyspark_cq.policies") if ep.value.startswith("pyspark_cq_plugins.")]
    assert len(shipped) >= 11
    for ep in shipped:
        module, cls = ep.value.removeprefix("pyspark_cq_plugins.").split(":")
        assert f"``{ep.name}``" in doc and f"``{module}.{cls}``" in doc, ep.name
