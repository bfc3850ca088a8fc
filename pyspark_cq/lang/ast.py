"""The abstract syntax tree of CQL (Motwani et al., STREAM, §2) with PIPES / RTStream QoS clauses.

Nodes are frozen dataclasses. Every node carries the ``line``/``column`` of its first token for error
messages; positions are left out of equality, so a tree printed and parsed again compares equal to the
original (``tests/test_cql_parser.py`` checks it with hypothesis).

This module is pure: it imports neither Spark nor the rest of the package.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "Node", "Expr", "Column", "Star", "Literal", "Duration", "Unary", "Binary", "IsNull", "Between", "InList",
    "Call", "SelectItem", "WindowSpec", "StreamRef", "SubqueryRef", "JoinOn", "Select", "QoSItem", "ConstraintItem",
    "CONSTRAINT_KINDS", "ModeItem", "OUTPUT_MODES", "JOIN_TYPES", "Statement",
    "AGGREGATES", "TIME_UNITS", "R2S",
]

#: Aggregate functions (SQL's usual five).
AGGREGATES = ("COUNT", "SUM", "AVG", "MIN", "MAX")
#: Time units of durations, singular form -> microseconds.
TIME_UNITS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000, "MINUTE": 60_000_000,
              "HOUR": 3_600_000_000, "DAY": 86_400_000_000, "WEEK": 604_800_000_000}
#: Relation-to-stream operators (§2).
R2S = ("ISTREAM", "DSTREAM", "RSTREAM")


def _pos():
    return field(default=None, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Node:
    """Base of all nodes: the 1-based line and column of the node's first token (not compared)."""

    line: int | None = _pos()
    column: int | None = _pos()

    @property
    def at(self) -> str:
        """``"line:column"`` of the node, or ``"?"`` when it was built by hand."""
        return f"{self.line}:{self.column}" if self.line is not None else "?"


class Expr(Node):
    """Base of expressions."""


@dataclass(frozen=True)
class Column(Expr):
    """A column reference ``name`` or ``table.name`` (``table`` a stream name or alias)."""

    table: str | None
    name: str


@dataclass(frozen=True)
class Star(Expr):
    """``*`` or ``table.*`` in a select list, or the argument of ``COUNT(*)``."""

    table: str | None = None


@dataclass(frozen=True)
class Literal(Expr):
    """A constant: int, float, str, bool or None (``NULL``); numbers are non-negative (``-`` is `Unary`)."""

    value: object


@dataclass(frozen=True)
class Duration(Node):
    """A time span ``value unit`` (``10 SECONDS``); ``unit`` is the singular upper-case name."""

    value: int | float
    unit: str

    @property
    def micros(self) -> int:
        """The span in microseconds (rounded to the nearest µs)."""
        return int(round(self.value * TIME_UNITS[self.unit]))


@dataclass(frozen=True)
class Unary(Expr):
    """``-x`` or ``NOT x``."""

    op: str
    operand: Expr


@dataclass(frozen=True)
class Binary(Expr):
    """``left op right`` with op one of OR AND = <> < <= > >= + - * / % LIKE, NOT LIKE."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class IsNull(Expr):
    """``x IS [NOT] NULL``."""

    operand: Expr
    negated: bool = False


@dataclass(frozen=True)
class Between(Expr):
    """``x [NOT] BETWEEN low AND high``."""

    operand: Expr
    low: Expr
    high: Expr
    negated: bool = False


@dataclass(frozen=True)
class InList(Expr):
    """``x [NOT] IN (a, b, …)``."""

    operand: Expr
    items: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True)
class Call(Expr):
    """A function call ``NAME([DISTINCT] args)``; ``COUNT(*)`` has the single argument `Star`."""

    name: str
    args: tuple[Expr, ...]
    distinct: bool = False

    @property
    def is_aggregate(self) -> bool:
        """Whether the function is one of :data:`AGGREGATES`."""
        return self.name in AGGREGATES


@dataclass(frozen=True)
class SelectItem(Node):
    """One entry of the select list, with its optional alias."""

    expr: Expr
    alias: str | None = None


@dataclass(frozen=True)
class WindowSpec(Node):
    """A stream-to-relation window (§2): ``[RANGE d [SLIDE s]]``, ``[ROWS n]``,
    ``[PARTITION BY a, … ROWS n]``, ``[NOW]`` or ``[RANGE UNBOUNDED]``, with an optional ``WHERE`` applied
    before the window (the paper's second example).

    ``kind`` is ``"range"``, ``"rows"``, ``"now"`` or ``"unbounded"``.
    """

    kind: str
    size: Duration | int | None = None
    slide: Duration | None = None
    partition_by: tuple[Column, ...] = ()
    where: Expr | None = None


@dataclass(frozen=True)
class StreamRef(Node):
    """A stream (or relation) in ``FROM``: name, alias, window and ``SAMPLE(p)`` (p in percent)."""

    name: str
    alias: str | None = None
    window: WindowSpec | None = None
    sample: float | None = None

    @property
    def ref(self) -> str:
        """The name columns are qualified with: the alias, else the stream name."""
        return self.alias or self.name


@dataclass(frozen=True)
class SubqueryRef(Node):
    """A parenthesised query in ``FROM`` with an alias and optional window / sample."""

    query: Select
    alias: str
    window: WindowSpec | None = None
    sample: float | None = None

    @property
    def ref(self) -> str:
        """The alias."""
        return self.alias


#: The join types of ``FROM a JOIN b ON …`` (``LEFT OUTER`` is ``"left"``).
JOIN_TYPES = ("inner", "left", "right", "full")


@dataclass(frozen=True)
class JoinOn(Node):
    """How a FROM item joins the items before it: ``[INNER | LEFT [OUTER] | RIGHT [OUTER] | FULL [OUTER]] JOIN
    … ON expr`` (``how`` one of :data:`JOIN_TYPES`).
    """

    how: str
    on: Expr


@dataclass(frozen=True)
class Select(Node):
    """``SELECT [DISTINCT] items FROM … [WHERE …] [GROUP BY …] [HAVING …]``.

    ``joins`` is empty for a FROM list of commas; otherwise one entry per item after the first: its
    :class:`JoinOn`, or None where a comma separates it from the items before.
    """

    items: tuple[SelectItem, ...]
    sources: tuple[StreamRef | SubqueryRef, ...]
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    having: Expr | None = None
    distinct: bool = False
    joins: tuple[JoinOn | None, ...] = ()


@dataclass(frozen=True)
class QoSItem(Node):
    """One QoS entry of ``WITH (…)``.

    ``WINDOW [ref] BETWEEN a AND b`` and ``GRANULARITY [ref] BETWEEN a AND b`` (PIPES §4.3 QoS ranges;
    for a granularity ``a`` is the coarsest, as PIPES writes min = lowest quality), ``SAMPLE BETWEEN p AND
    q`` (percent), ``PERIOD d`` and ``DEADLINE d`` (RTStream §2), ``WEIGHT w``. ``low`` holds the single
    value of the one-value items; ``high`` is then None.
    """

    name: str
    low: Duration | float
    high: Duration | float | None = None
    target: str | None = None


#: The stream constraints of ``WITH (CONSTRAINT …)`` (STREAM §5.2; pyspark_cq.constraints).
CONSTRAINT_KINDS = ("UNIQUE", "MANY_TO_ONE", "CLUSTERED", "ORDERED")


@dataclass(frozen=True)
class ConstraintItem(Node):
    """One ``CONSTRAINT`` entry of ``WITH (…)`` (STREAM §5.2, docs/constraints.md).

    ``UNIQUE s (c, …)`` (``columns``), ``MANY_TO_ONE s REFERENCES p [DELAY d]`` (``target`` the child,
    ``parent``, ``delay``), ``CLUSTERED s [TOLERANCE k]`` and ``ORDERED s [TOLERANCE k]`` (``tolerance``, default
    0). ``target`` is the constrained stream (its name or alias in FROM).
    """

    kind: str
    target: str
    columns: tuple[str, ...] = ()
    parent: str | None = None
    delay: Duration | None = None
    tolerance: int = 0
    name: str = field(default="CONSTRAINT", init=False)


#: The output modes of ``WITH (OUTPUT_MODE …)`` (Spark's names, upper case).
OUTPUT_MODES = ("APPEND", "UPDATE")


@dataclass(frozen=True)
class ModeItem(Node):
    """``OUTPUT_MODE APPEND | UPDATE`` in ``WITH (…)``: the streaming output mode the sink is written with
    (``CompiledQuery.output_mode``; docs/cql.md, *Joins*).
    """

    mode: str
    name: str = field(default="OUTPUT_MODE", init=False)
    target: str | None = field(default=None, init=False)


@dataclass(frozen=True)
class Statement(Node):
    """A whole query: the select, its relation-to-stream operator (or None) and its QoS clause."""

    query: Select
    stream: str | None = None
    qos: tuple[QoSItem | ConstraintItem | ModeItem, ...] = ()

    def qos_item(self, name: str, target: str | None = None) -> QoSItem | None:
        """The QoS entry ``name`` (for ``target``, falling back to the untargeted one), or None."""
        found = [q for q in self.qos if q.name == name and q.target in (target, None)]
        found.sort(key=lambda q: q.target is None)
        return found[0] if found else None
