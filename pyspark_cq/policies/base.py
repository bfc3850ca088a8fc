"""The :class:`Policy` base class: a statistics snapshot in, decisions out.

A policy is a plain Python object: it imports neither Spark nor the runtime, sees a
:class:`~pyspark_cq.policies.snapshot.Snapshot` and returns :class:`~pyspark_cq.policies.decisions.Decisions`
that the runtime writes into the control table (STREAM's control tables, Motwani et al., §6.1). Every
registered policy must pass :func:`pyspark_cq.policies.checks.check_policy`.
"""
from __future__ import annotations

import abc
import copy
import inspect
from collections.abc import Mapping
from typing import ClassVar

from .decisions import Admission, Decisions, QoSRange
from .snapshot import QueryInfo, Snapshot

__all__ = ["Policy"]


class Policy(abc.ABC):
    """Base class of policies.

    Subclasses set :attr:`name` (the entry-point name they are registered under), store their
    constructor arguments as attributes of the same name (so :meth:`params` and :meth:`clone` work, as in
    scikit-learn and river), and implement :meth:`decide`. They may override :meth:`admit` (admission
    control, PIPES §4.1.1) and :meth:`bounds` (the QoS bounds they promise to respect).

    A policy may keep state between rounds (e.g. the statistics its last estimate used), but must be
    deterministic: equal sequences of snapshots give equal decisions; it must pickle; and it must not
    raise on a snapshot without statistics.
    """

    #: Registry name; subclasses set it.
    name: ClassVar[str] = ""

    @staticmethod
    def _check(snapshot: Snapshot) -> None:
        """Raise TypeError unless ``snapshot`` is a :class:`Snapshot` (every entry point starts with it)."""
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"snapshot must be a Snapshot, got {type(snapshot).__name__}")

    @abc.abstractmethod
    def decide(self, snapshot: Snapshot) -> Decisions:
        """Decide parameter changes from ``snapshot``.

        Parameters
        ----------
        snapshot : Snapshot
            Current statistics, QoS ranges and control-table values.

        Returns
        -------
        Decisions
            Possibly empty; ``Decisions.policy`` should be :attr:`name`.
        """

    def admit(self, query: QueryInfo, snapshot: Snapshot) -> Admission:
        """Admission control for a new ``query`` given the running ones in ``snapshot`` (PIPES §4.1.1).

        The default accepts every query without decisions.
        """
        if not isinstance(query, QueryInfo):
            raise TypeError(f"query must be a QueryInfo, got {type(query).__name__}")
        self._check(snapshot)
        return Admission(True, "accepted by default", Decisions((), self.name))

    def remove(self, query: str) -> Decisions:
        """Forget a query that was stopped; may return decisions that release its resources to others.

        The default forgets nothing and decides nothing.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a query name (str), got {query!r}")
        return Decisions((), self.name)

    def bounds(self, snapshot: Snapshot) -> Mapping[str, QoSRange]:
        """The QoS bounds this policy's decisions stay within, keyed by ``"<operator>.<param>"``.

        The default declares the queries' own QoS ranges. The check suite verifies that every decision
        on a declared parameter lies within its bound; a decision on a numeric parameter nobody declared
        (other than ``drop_ratio``, bounded by [0, 1)) fails the check.
        """
        self._check(snapshot)
        out: dict[str, QoSRange] = {}
        for q in snapshot.queries.values():
            out.update(q.qos)
        return out

    def status(self) -> Mapping:
        """What the policy wants shown with every round (e.g. OM's moves, switches and fidelity); the
        runtime logs it in the round's record (``decisions_log()[i]["status"]``). The default is empty.
        """
        return {}

    # -- parameters, cloning, representation -------------------------------------------------

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def params(self) -> dict:
        """The constructor arguments (read back from attributes of the same name)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def clone(self) -> Policy:
        """A fresh policy with the same constructor arguments and no state."""
        return type(self)(**copy.deepcopy(self.params()))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        """Constructor arguments the shared check suite instantiates the policy with (river's convention)."""
        return [{}]
