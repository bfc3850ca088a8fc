"""The check suite every policy must pass (the pattern of river's ``check_estimator``).

:func:`check_policy` runs every check of :func:`yield_checks` against a policy instance; the tests run it
over every registered policy (``pyspark_cq.policies.available()``) instantiated with each set of
``_unit_test_params()``. The checks:

- ``check_name``: the policy has a registry name;
- ``check_empty_statistics``: no exception on an empty snapshot nor on queries without statistics;
- ``check_returns_decisions``: ``decide`` returns :class:`Decisions` stamped with the policy's name;
- ``check_picklable``: the policy pickles fresh and after rounds, and the copy decides as the original;
- ``check_deterministic``: two clones fed equal snapshot sequences decide equally;
- ``check_within_bounds``: every decision targets a known operator and stays inside the declared QoS
  bounds (:meth:`Policy.bounds`);
- ``check_admission``: ``admit`` returns an :class:`Admission` whose decisions stay inside the bounds.
"""
from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator

from .. import plan as P
from ..vocabulary import metrics as M
from .base import Policy
from .decisions import Admission, Decisions, QoSRange, bound_violations
from .snapshot import OperatorStats, QueryInfo, Snapshot, SourceStats, label, parse_label

__all__ = ["check_policy", "yield_checks", "example_snapshots", "example_query"]

_SECOND = 1_000_000


def example_query(name: str, kind: str = "join", *, rate: float | None = 100.0, window_s: float = 30.0,
                  batches: int = 5) -> QueryInfo:
    """A synthetic query for the checks: a window join of two streams, a grouped sliding aggregation, or a
    ``select_chain`` of three predicates (no plan; its report carries per-predicate counters).

    Plan sizes are in microseconds; ``rate`` (rows/s per source) ``None`` gives a query without statistics.
    """
    if kind not in ("join", "aggregate", "select_chain"):
        raise ValueError(f"kind must be 'join', 'aggregate' or 'select_chain', got {kind!r}")
    op = f"{name}-op"
    if kind == "select_chain":
        return _example_select_chain(name, op, rate, batches)
    w = int(window_s * _SECOND)
    if kind == "join":
        wl = label(op, "window")
        plan = P.Join(P.Window(P.Source(f"{name}-a"), w, label=wl), P.Window(P.Source(f"{name}-b"), w, label=wl),
                      selectivity=0.02)
        qos = {wl: QoSRange.window("1 second", "60 seconds")}
        control = {op: {"window": w}}
        sources = [f"{name}-a", f"{name}-b"]
    else:
        wl, gl = label(op, "window"), label(op, "granularity")
        plan = P.Aggregate(P.Granularity(P.Window(P.Source(f"{name}-a"), w, label=wl), _SECOND, label=gl),
                           groups=10)
        qos = {wl: QoSRange.window("10 seconds", "120 seconds"), gl: QoSRange.granularity("10 seconds", "1 second")}
        control = {op: {"window": w, "granularity": _SECOND}}
        sources = [f"{name}-a"]
    if rate is None:
        stats = {s: SourceStats(s) for s in sources}
        ops = {op: OperatorStats(op)}
        return QueryInfo(name, plan, qos, stats, ops, control)
    stats = {s: SourceStats(s, rate, 1.0 / rate) for s in sources}
    rows = int(rate * len(sources))
    ops = {op: OperatorStats(op, batches, rows, rows // 10, float(rows), 0.1, rate * window_s * len(sources),
                             rate * window_s * len(sources) * 64.0)}
    return QueryInfo(name, plan, qos, stats, ops, control, batches=batches, input_rate=float(rows),
                     batch_duration=0.5)


def _example_select_chain(name: str, op: str, rate: float | None, batches: int) -> QueryInfo:
    control = {op: {"plan_id": "b>a>c"}}
    if rate is None:
        return QueryInfo(name, None, {}, {f"{name}-a": SourceStats(f"{name}-a")}, {op: OperatorStats(op)}, control)
    rows = int(rate)
    steps = {"b": (rows, rows // 2, 40 * rows), "a": (rows // 2, rows // 10, 2 * rows), "c": (rows // 10, 0, rows)}
    report = {M.INPUT_ROWS: rows, M.OUTPUT_ROWS: 0}
    for p, (n_in, n_out, nanos) in steps.items():
        report.update({M.rows_in(p): n_in, M.rows_passed(p): n_out, M.nanos(p): nanos})
    ops = {op: OperatorStats(op, batches, rows, 0, float(rows), 0.0, report=report)}
    return QueryInfo(name, None, {}, {f"{name}-a": SourceStats(f"{name}-a", rate, 1.0 / rate)}, ops, control,
                     batches=batches, input_rate=float(rows), batch_duration=0.5)


def example_snapshots() -> list[Snapshot]:
    """A deterministic sequence of snapshots: empty, without statistics, loose and tight budgets, a rate
    change, a query leaving.
    """
    q1, q2 = example_query("q1", "join"), example_query("q2", "aggregate")
    fast = example_query("q1", "join", rate=400.0)
    q3, q3_fast = example_query("q3", "select_chain"), example_query("q3", "select_chain", rate=4000.0)
    return [
        Snapshot(0.0),
        Snapshot(1.0, {"q1": example_query("q1", "join", rate=None),
                       "q3": example_query("q3", "select_chain", rate=None)}),
        Snapshot(2.0, {"q1": q1, "q2": q2, "q3": q3}, memory_budget=1e9),
        Snapshot(3.0, {"q1": q1, "q2": q2, "q3": q3}, memory_budget=2e5),
        Snapshot(4.0, {"q1": fast, "q2": q2, "q3": q3_fast}, memory_budget=2e5, cpu_budget=1e3),
        Snapshot(5.0, {"q2": q2}, memory_budget=2e5),
        Snapshot(6.0, {}, memory_budget=2e5),
    ]


def _decide(policy: Policy, snapshot: Snapshot, where: str) -> Decisions:
    try:
        out = policy.decide(snapshot)
    except Exception as exc:
        raise AssertionError(f"{policy!r}.decide raised on {where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, Decisions):
        raise AssertionError(f"{policy!r}.decide must return Decisions on {where}, got {type(out).__name__}")
    return out


def check_name(policy: Policy) -> None:
    """The policy has a non-empty registry name."""
    assert isinstance(policy.name, str) and policy.name, f"{type(policy).__name__}.name must be a non-empty str"


def check_empty_statistics(policy: Policy) -> None:
    """No exception on an empty snapshot nor on queries without statistics; no admission failure either."""
    policy = policy.clone()
    _decide(policy, Snapshot(), "an empty snapshot")
    bare = Snapshot(1.0, {"q1": example_query("q1", rate=None)}, memory_budget=1e6)
    _decide(policy, bare, "a snapshot whose queries have no statistics")
    try:
        policy.clone().admit(example_query("new", rate=None), Snapshot())
    except Exception as exc:
        raise AssertionError(f"{policy!r}.admit raised for a query without statistics: {exc!r}") from exc


def check_returns_decisions(policy: Policy) -> None:
    """``decide`` returns Decisions stamped with the policy's name."""
    policy = policy.clone()
    for i, snap in enumerate(example_snapshots()):
        out = _decide(policy, snap, f"example snapshot {i}")
        assert out.policy == policy.name, (f"decisions of {policy!r} must carry policy={policy.name!r}, "
                                           f"got {out.policy!r}")


def check_picklable(policy: Policy) -> None:
    """The policy pickles fresh and mid-sequence, and the copy decides as the original."""
    snaps = example_snapshots()
    fresh = policy.clone()
    try:
        copy_fresh = pickle.loads(pickle.dumps(fresh))
    except Exception as exc:
        raise AssertionError(f"{policy!r} does not pickle: {exc!r}") from exc
    assert _decide(copy_fresh, snaps[2], "snapshot 2") == _decide(fresh, snaps[2], "snapshot 2"), \
        f"an unpickled copy of fresh {policy!r} decides differently"
    for snap in snaps[3:5]:
        _decide(fresh, snap, "a snapshot")
    restored = pickle.loads(pickle.dumps(fresh))
    assert _decide(restored, snaps[5], "snapshot 5") == _decide(fresh, snaps[5], "snapshot 5"), \
        f"an unpickled copy of {policy!r} taken mid-sequence decides differently from the original"


def check_deterministic(policy: Policy) -> None:
    """Two clones fed equal (deep-copied) snapshot sequences decide equally at every step."""
    a, b = policy.clone(), policy.clone()
    for i, snap in enumerate(example_snapshots()):
        da = _decide(a, snap, f"example snapshot {i}")
        db = _decide(b, copy.deepcopy(snap), f"a copy of example snapshot {i}")
        assert da == db, f"{policy!r} is not deterministic on example snapshot {i}: {da!r} != {db!r}"


def _known_operators(snapshot: Snapshot, extra: QueryInfo | None = None) -> set[str]:
    ops: set[str] = set()
    for q in list(snapshot.queries.values()) + ([extra] if extra else []):
        ops.update(q.control)
        ops.update(q.operators)
        ops.update(parse_label(k)[0] for k in q.qos)
        if q.plan is not None:
            ops.update(parse_label(n.label)[0] for n in P.postorder(q.plan) if n.label and "." in n.label)
    return ops


def _assert_within(policy: Policy, decisions: Decisions, bounds, known: set[str], where: str) -> None:
    for d in decisions:
        assert d.operator in known, f"{policy!r} decided for unknown operator {d.operator!r} on {where}"
    problems = bound_violations(decisions, bounds)
    assert not problems, f"{policy!r} broke its declared QoS bounds on {where}: {'; '.join(problems)}"


def check_within_bounds(policy: Policy) -> None:
    """Every decision targets a known operator and lies inside the declared bounds."""
    policy = policy.clone()
    for i, snap in enumerate(example_snapshots()):
        bounds = policy.bounds(snap)
        out = _decide(policy, snap, f"example snapshot {i}")
        _assert_within(policy, out, bounds, _known_operators(snap), f"example snapshot {i}")


def check_admission(policy: Policy) -> None:
    """``admit`` returns an Admission whose decisions stay within the bounds (incl. the new query's)."""
    policy = policy.clone()
    snaps = example_snapshots()
    for i in (0, 2, 3):
        snap = snaps[i]
        _decide(policy, snap, f"example snapshot {i}")
        new = example_query("q9", "join", rate=50.0)
        try:
            result = policy.admit(new, snap)
        except Exception as exc:
            raise AssertionError(f"{policy!r}.admit raised on example snapshot {i}: {exc!r}") from exc
        assert isinstance(result, Admission), f"{policy!r}.admit must return an Admission, got {result!r}"
        assert result.accepted or result.reason, "a rejection must carry a reason"
        with_new = Snapshot(snap.time, {**snap.queries, "q9": new}, snap.memory_budget, snap.cpu_budget)
        _assert_within(policy, result.decisions, policy.bounds(with_new), _known_operators(snap, new),
                       f"admission on example snapshot {i}")
        if result.accepted:
            policy.remove("q9")


def yield_checks(policy: Policy) -> Iterator[Callable[[Policy], None]]:
    """The checks, in order, each a function of the policy."""
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a Policy instance, got {type(policy).__name__}")
    yield check_name
    yield check_empty_statistics
    yield check_returns_decisions
    yield check_picklable
    yield check_deterministic
    yield check_within_bounds
    yield check_admission


def check_policy(policy: Policy) -> None:
    """Run every check against ``policy``; raise ``AssertionError`` naming the first that fails."""
    for check in yield_checks(policy):
        try:
            check(policy)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__} failed for {policy!r}: {exc}") from exc
