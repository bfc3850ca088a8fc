"""The policy loop: one round takes a snapshot, asks every policy, checks and applies the decisions.

A policy that raises, returns something other than :class:`~pyspark_cq.policies.Decisions`, targets an
operator the control table does not know, or breaks its declared QoS bounds is reported (a
``RuntimeWarning`` and the ``pyspark_cq.runtime`` logger) and its decisions of that round are not applied;
the other policies and the running queries are unaffected. Every round leaves one record per policy in
the decisions log.
"""
from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable

from ..control import ControlTable
from ..control.reader import bound_kind
from ..control.schema import OPERATOR_PARAMETERS, unread_parameters
from ..policies.base import Policy
from ..policies.decisions import Decisions, bound_violations
from ..policies.snapshot import Snapshot

__all__ = ["PolicyLoop"]

_log = logging.getLogger("pyspark_cq.runtime")


class PolicyLoop:
    """Runs policies against snapshots and writes their decisions into a control table.

    Parameters
    ----------
    policies : iterable of Policy
        The policies, asked in order.
    control : ControlTable
        Where decisions go.
    log_size : int
        Records kept in the decisions log (oldest dropped first).
    """

    def __init__(self, policies: Iterable[Policy], control: ControlTable, *, log_size: int = 10_000):
        self.policies = list(policies)
        for i, p in enumerate(self.policies):
            if not isinstance(p, Policy):
                raise TypeError(f"policies[{i}] must be a Policy instance, got {type(p).__name__}")
        if not isinstance(control, ControlTable):
            raise TypeError(f"control must be a ControlTable, got {type(control).__name__}")
        if isinstance(log_size, bool) or not isinstance(log_size, int) or log_size < 1:
            raise ValueError(f"log_size must be a positive int, got {log_size!r}")
        self.control = control
        #: ``routes() -> {operator: prepare}``: operators not in the control table whose decisions go elsewhere
        #: (a query group's members: through their group). ``prepare(decision)`` raises ValueError to refuse it,
        #: else returns ``apply(who)``; a policy's decisions are applied only when all of them are accepted.
        self.routes = None
        self.rounds = 0
        self._log: deque[dict] = deque(maxlen=log_size)
        self._lock = threading.Lock()

    def log(self) -> list[dict]:
        """The decisions log, oldest first: one record per policy and round."""
        with self._lock:
            return list(self._log)

    def record(self, **fields) -> dict:
        """Append a record (time and round filled in) to the decisions log."""
        rec = {"time": time.time(), "round": self.rounds, **fields}
        with self._lock:
            self._log.append(rec)
        return rec

    def _fail(self, policy: Policy, message: str, decisions=None, kind: str = "decide") -> dict:
        _log.warning("policy %s: %s", policy.name, message)
        warnings.warn(f"policy {policy.name!r}: {message}", RuntimeWarning, stacklevel=3)
        return self.record(policy=policy.name, kind=kind, decisions=[] if decisions is None else decisions.to_list(),
                           applied=False, changes=[], error=message)

    def refusal(self, decisions: Decisions, bounds) -> str | None:
        """Why ``decisions`` may not be applied, or None: operators the control table does not know, or
        changes outside the QoS ``bounds`` (``"<operator>.<param>"`` -> QoSRange, :func:`bound_violations`).

        The one check of every change the runtime writes: a policy's decisions (:meth:`apply`) and a
        user's edits (:meth:`CQRuntime.set_control <pyspark_cq.runtime.CQRuntime.set_control>`, the console).
        """
        unknown = sorted({d.operator for d in decisions} - set(self.control.entries()))
        if unknown:
            return f"decisions for operators not in the control table: {unknown}"
        unread = []
        for d in decisions:   # the operator would fail its query at the next micro-batch
            kind = bound_kind(self.control.uri, d.operator)
            params = unread_parameters(kind, d.changes) if kind is not None else []
            if params:
                unread.append(f"{d.operator!r} is a {kind}, which does not read {', '.join(params)} "
                              f"(it reads {', '.join(OPERATOR_PARAMETERS[kind])})")
        if unread:
            return "decisions for parameters the operator does not read: " + "; ".join(unread)
        problems = bound_violations(decisions, bounds)
        if problems:
            return "decisions outside declared QoS bounds: " + "; ".join(problems)
        return None

    def apply(self, policy: Policy, decisions, snapshot: Snapshot, *, kind: str = "decide") -> dict:
        """Check ``decisions`` of ``policy`` against the control table and its bounds, then apply them."""
        if not isinstance(decisions, Decisions):
            return self._fail(policy, f"{kind} returned {type(decisions).__name__}, not Decisions", kind=kind)
        if not decisions:
            return self.record(policy=policy.name, kind=kind, decisions=[], applied=True, changes=[], error=None)
        try:
            bounds = policy.bounds(snapshot)
        except Exception as exc:
            return self._fail(policy, f"bounds() raised {type(exc).__name__}: {exc}", decisions, kind)
        try:
            routes = self.routes() if self.routes is not None else {}
        except Exception as exc:    # e.g. a group's plan unreadable: its members' decisions are refused as unknown
            _log.warning("policy loop: the routes of group members raised %r", exc)
            routes = {}
        routed = [d for d in decisions if d.operator in routes]
        rest = Decisions([d for d in decisions if d.operator not in routes], decisions.policy)
        problem = self.refusal(rest, bounds) if rest else None
        outside = bound_violations(routed, bounds)
        if outside and not problem:
            problem = "decisions outside declared QoS bounds: " + "; ".join(outside)
        applies = []
        for d in routed if not problem else ():
            try:
                applies.append(routes[d.operator](d))
            except ValueError as exc:
                problem = f"decision for {d.operator!r} refused: {exc}"
                break
        if problem:
            return self._fail(policy, problem, decisions, kind)
        try:
            changes = self.control.apply(rest, who=policy.name) if rest else []
            for apply in applies:
                apply(policy.name)
        except Exception as exc:
            return self._fail(policy, f"the control table refused the decisions: {type(exc).__name__}: {exc}",
                              decisions, kind)
        return self.record(policy=policy.name, kind=kind, decisions=decisions.to_list(), applied=True,
                           changes=[c.version for c in changes], error=None,
                           **({"routed": [d.operator for d in routed]} if routed else {}))

    def run(self, snapshot: Snapshot) -> list[dict]:
        """One round: every policy decides on ``snapshot``; returns this round's records."""
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"snapshot must be a Snapshot, got {type(snapshot).__name__}")
        self.rounds += 1
        out = []
        for policy in self.policies:
            try:
                decisions = policy.decide(snapshot)
            except Exception as exc:
                out.append(self._fail(policy, f"decide raised {type(exc).__name__}: {exc}"))
                continue
            record = self.apply(policy, decisions, snapshot)
            try:
                record["status"] = dict(policy.status())
            except Exception as exc:   # a broken status must not lose the round's decisions
                record["status"] = {"error": f"status() raised {type(exc).__name__}: {exc}"}
            out.append(record)
        return out
