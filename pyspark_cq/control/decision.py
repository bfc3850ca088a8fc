"""Decisions: validated changes of control-table entries, the unit a policy returns and the control table
applies (:meth:`pyspark_cq.control.ControlTable.apply`).

They live beside the control table, not in :mod:`pyspark_cq.policies`, because the table consumes them and
must not import the policy layer; policies re-export them (``from pyspark_cq.policies import Decision``).

Examples
--------
>>> d = Decision("join1", {"upper": "20 seconds"}, reason="memory over budget")
>>> d.changes
{'upper': 20000000}
>>> Decisions([d], policy="pipes").operators()
['join1']
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .schema import duration_value, validate_changes, validate_operator_id

__all__ = ["Decision", "Decisions"]


@dataclass(frozen=True)
class Decision:
    """One change of one operator's control-table entry.

    Parameters
    ----------
    operator : str
        The operator id (its control-table key).
    changes : mapping str -> value
        Parameter changes, validated by :func:`validate_changes`.
    reason : str
        Why (logged with the change).
    query : str, optional
        The query the operator belongs to.
    at : int, optional
        Application time (µs) from which a window / bound / granularity change applies to new
        elements (PIPES §4.2); default: the control table's clock when the change is applied.
    """

    operator: str
    changes: Mapping = field(default_factory=dict)
    reason: str = ""
    query: str | None = None
    at: int | None = None

    def __post_init__(self):
        validate_operator_id(self.operator)
        where = f"decision for {self.operator!r}: "
        object.__setattr__(self, "changes", validate_changes(self.changes, where=where))
        if not isinstance(self.reason, str):
            raise TypeError(f"{where}reason must be a str, got {self.reason!r}")
        if self.query is not None and not isinstance(self.query, str):
            raise TypeError(f"{where}query must be a str or None, got {self.query!r}")
        if self.at is not None:
            object.__setattr__(self, "at", duration_value(self.at, f"{where}at"))

    def to_dict(self) -> dict:
        """A JSON-able form."""
        return {"operator": self.operator, "changes": dict(self.changes), "reason": self.reason,
                "query": self.query, "at": self.at}


class Decisions(Sequence):
    """An immutable, ordered collection of :class:`Decision` made by one policy in one round.

    Equal when the decisions and the policy name are equal (the check suite compares them for
    determinism). Two decisions for the same operator are allowed; they are applied in order.
    """

    __slots__ = ("_items", "policy")

    def __init__(self, items: Iterable[Decision] = (), policy: str | None = None):
        items = tuple(items)
        for i, d in enumerate(items):
            if not isinstance(d, Decision):
                raise TypeError(f"items[{i}] must be a Decision, got {type(d).__name__}")
        if policy is not None and not isinstance(policy, str):
            raise TypeError(f"policy must be a str or None, got {policy!r}")
        self._items = items
        self.policy = policy

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self._items)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Decisions):
            return NotImplemented
        return self._items == other._items and self.policy == other.policy

    __hash__ = None  # decisions hold dicts of changes: compared, never hashed

    def __repr__(self) -> str:
        return f"Decisions({list(self._items)!r}, policy={self.policy!r})"

    def __reduce__(self):
        return (Decisions, (self._items, self.policy))

    def operators(self) -> list[str]:
        """Operator ids touched, in order of first appearance."""
        return list(dict.fromkeys(d.operator for d in self._items))

    def to_list(self) -> list[dict]:
        """A JSON-able form."""
        return [d.to_dict() for d in self._items]
