"""Logical plans of continuous queries, and enumeration of candidate plans.

A plan is an immutable tree of operator nodes over named source streams:

=============  =======  ==========================================================================
node           symbol   parameters
=============  =======  ==========================================================================
`Source`       S        the stream's name (statistics are given per name to the cost models)
`Select`       σ        selectivity, per-tuple cost
`Project`      π        per-tuple cost
`Join`         ⋈        selectivity, method (``"hash"``: symmetric hash, ``"nested_loops"``),
                        per-arrival costs of each side, per-pair cost
`Aggregate`    α / γ    number of groups (α when 1), per-tuple cost
`Window`       ω        window size (time-based, or tuple-based: a count)
`Granularity`  Γ        time granularity
`Union`        ∪        —
=============  =======  ==========================================================================

An interval / window join is written as windows over the inputs of a join, as PIPES places them
(Cammert et al., §2.5): ``Join(Window(Source("A"), 10), Window(Source("B"), 10))``.

The per-tuple ``cost`` of a node is a time per input tuple; each cost model reads the costs it needs
(Viglas & Naughton's C_σ, C_π, C_l, C_r; OM's 1/tpr, C_L⋈, C_R⋈, C_Ω; RTStream's t_ij) and documents how.
Selectivity and window/granularity parameters are logical and shared by all models.

Candidate plans are enumerated from a :class:`Query` as OM does it (Kulkarni & Ravishankar, §4.2):
(1) selections over the same stream are grouped into one, (2) σ and π are pushed down to their stream,
in either order (π→σ or σ→π), (3) joins in left-deep order, (4) the aggregate last. For the
rate-based model (Viglas & Naughton, §5.3) bushy join orders can be enumerated as well.

This module is pure: it imports neither Spark nor the runtime.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from . import _args as chk
from . import _human

__all__ = [
    "Node", "Source", "Select", "Project", "Join", "Aggregate", "Window", "Granularity", "Union",
    "JOIN_METHODS", "WINDOW_KINDS",
    "postorder", "breadth_first", "source_names", "render", "best_plan",
    "Predicate", "JoinPredicate", "AggregateSpec", "Query",
    "left_deep_orders", "bushy_trees", "join_trees", "unary_orders", "enumerate_plans",
]

JOIN_METHODS = ("hash", "nested_loops")
WINDOW_KINDS = ("time", "tuple")


def _node(value, name: str) -> Node:
    return chk.instance(value, name, Node, "a plan node (pyspark_cq.plan.Node)")


def _label(value) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"label must be a str or None, got {value!r}")


@dataclass(frozen=True)
class Node:
    """Base class of plan nodes. Nodes are immutable and hashable; ``label`` names a node in reports."""

    label: str | None = field(default=None, kw_only=True)
    #: Operator symbol used by :func:`render`.
    symbol = "?"

    @property
    def children(self) -> tuple[Node, ...]:
        """The input nodes, left to right."""
        return ()

    def replace(self, **changes) -> Node:
        """A copy of this node with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return render(self)


@dataclass(frozen=True)
class Source(Node):
    """A named source stream (a leaf)."""

    name: str
    symbol = "S"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str, got {self.name!r}")
        _label(self.label)


@dataclass(frozen=True)
class _Unary(Node):
    child: Node

    @property
    def children(self):
        """The node's inputs."""
        return (self.child,)

    def _check(self):
        _node(self.child, "child")
        _label(self.label)
        chk.non_negative(self.cost, "cost")


@dataclass(frozen=True)
class Select(_Unary):
    """σ: keeps a fraction ``selectivity`` of its input; ``cost`` is the time to evaluate one tuple."""

    selectivity: float
    cost: float = field(default=0.0, kw_only=True)
    predicate: str | None = field(default=None, kw_only=True)
    symbol = "σ"

    def __post_init__(self):
        self._check()
        chk.probability(self.selectivity, "selectivity", allow_zero=False)
        if self.predicate is not None and not isinstance(self.predicate, str):
            raise TypeError(f"predicate must be a str or None, got {self.predicate!r}")


@dataclass(frozen=True)
class Project(_Unary):
    """π: changes tuples, not their number; ``cost`` is the time to project one tuple."""

    cost: float = field(default=0.0, kw_only=True)
    columns: tuple[str, ...] | None = field(default=None, kw_only=True)
    symbol = "π"

    def __post_init__(self):
        self._check()
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(isinstance(c, str) for c in self.columns):
                raise TypeError(f"columns must be a tuple of column names or None, got {self.columns!r}")
            object.__setattr__(self, "columns", tuple(self.columns))


@dataclass(frozen=True)
class Aggregate(_Unary):
    """α (``groups == 1``, scalar) or γ (group-by with ``groups`` groups) aggregation."""

    groups: int = field(default=1, kw_only=True)
    cost: float = field(default=0.0, kw_only=True)

    def __post_init__(self):
        self._check()
        chk.integer(self.groups, "groups", minimum=1)

    @property
    def symbol(self):  # type: ignore[override]
        """α for a scalar aggregation, γ for a grouped one."""
        return "α" if self.groups == 1 else "γ"


@dataclass(frozen=True)
class Window(_Unary):
    """ω: a sliding window of ``size`` time units (``kind="time"``) or ``size`` elements (``"tuple"``)."""

    size: float
    kind: str = field(default="time", kw_only=True)
    cost: float = field(default=0.0, kw_only=True)
    symbol = "ω"

    def __post_init__(self):
        self._check()
        chk.one_of(self.kind, "kind", WINDOW_KINDS)
        if self.kind == "tuple":
            chk.integer(self.size, "size", minimum=1)
        else:
            chk.non_negative(self.size, "size")


@dataclass(frozen=True)
class Granularity(_Unary):
    """Γ: rounds validity intervals to a time granularity of distance ``granularity``."""

    granularity: float
    cost: float = field(default=0.0, kw_only=True)
    symbol = "Γ"

    def __post_init__(self):
        self._check()
        chk.positive(self.granularity, "granularity")


@dataclass(frozen=True)
class Join(Node):
    """⋈: a binary join (a Cartesian product when ``selectivity == 1``).

    Parameters
    ----------
    left, right : Node
        Inputs.
    selectivity : float
        Fraction of the pairs of inputs that qualify, in (0, 1].
    method : {"hash", "nested_loops"}
        Symmetric hash join or symmetric (non-blocking) nested-loops join.
    left_cost, right_cost : float
        Time to handle one arrival from the left / right input beyond what the join method costs
        (Viglas & Naughton's C_l, C_r on top of their Table 3; OM's C_L⋈, C_R⋈).
    cost : float
        Time per pair of inputs (RTStream's per-tuple join time t_ij, Fig. 5).
    """

    left: Node
    right: Node
    selectivity: float = field(default=1.0, kw_only=True)
    method: str = field(default="hash", kw_only=True)
    left_cost: float = field(default=0.0, kw_only=True)
    right_cost: float = field(default=0.0, kw_only=True)
    cost: float = field(default=0.0, kw_only=True)
    symbol = "⋈"

    def __post_init__(self):
        _node(self.left, "left")
        _node(self.right, "right")
        _label(self.label)
        chk.probability(self.selectivity, "selectivity", allow_zero=False)
        chk.one_of(self.method, "method", JOIN_METHODS)
        chk.non_negative(self.left_cost, "left_cost")
        chk.non_negative(self.right_cost, "right_cost")
        chk.non_negative(self.cost, "cost")

    @property
    def children(self):
        """The node's inputs."""
        return (self.left, self.right)


@dataclass(frozen=True)
class Union(Node):
    """∪: the union of two or more inputs."""

    inputs: tuple[Node, ...]
    cost: float = field(default=0.0, kw_only=True)
    symbol = "∪"

    def __post_init__(self):
        if isinstance(self.inputs, Node) or not isinstance(self.inputs, Sequence):
            raise TypeError(f"inputs must be a sequence of plan nodes, got {self.inputs!r}")
        inputs = tuple(self.inputs)
        if len(inputs) < 2:
            raise ValueError(f"inputs must hold at least two plan nodes, got {len(inputs)}")
        for i, node in enumerate(inputs):
            _node(node, f"inputs[{i}]")
        object.__setattr__(self, "inputs", inputs)
        _label(self.label)
        chk.non_negative(self.cost, "cost")

    @property
    def children(self):
        """The node's inputs."""
        return self.inputs


# ---------------------------------------------------------------------------------------------
# traversal


def postorder(plan: Node) -> Iterator[Node]:
    """Yield the nodes of ``plan`` children first (the order of bottom-up costing)."""
    _node(plan, "plan")
    stack: list[tuple[Node, bool]] = [(plan, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))


def rewrite(plan: Node, change, nodes: Sequence[Node] | None = None) -> Node:
    """``plan`` rebuilt bottom-up with ``change(node)`` (a dict of attributes to replace, or empty) applied to
    every node; a node whose children and attributes are unchanged is kept as it is.

    Parameters
    ----------
    plan : Node
        The plan's root.
    change : callable
        ``change(node) -> dict`` for :meth:`Node.replace`; it sees the node before its children are replaced.
    nodes : sequence of Node, optional
        ``plan``'s nodes in postorder, when the caller holds them already (default: :func:`postorder`).
    """
    memo: dict[int, Node] = {}
    for node in (postorder(plan) if nodes is None else nodes):
        changes = dict(change(node))
        for attr in ("child", "left", "right"):
            kid = getattr(node, attr, None)
            if kid is not None and memo[id(kid)] is not kid:
                changes[attr] = memo[id(kid)]
        if isinstance(node, Union) and any(memo[id(k)] is not k for k in node.inputs):
            changes["inputs"] = tuple(memo[id(k)] for k in node.inputs)
        memo[id(node)] = node.replace(**changes) if changes else node
    return memo[id(plan)]


def breadth_first(plan: Node, *, include_sources: bool = False) -> list[Node]:
    """The operators of ``plan`` root first, level by level, left to right.

    This is OM's labelling o_1 … o_k (Kulkarni & Ravishankar, §4.1): o_1 is the root.
    Sources are left out unless ``include_sources``.
    """
    _node(plan, "plan")
    out, queue = [], deque([plan])
    while queue:
        node = queue.popleft()
        if include_sources or not isinstance(node, Source):
            out.append(node)
        queue.extend(node.children)
    return out


def source_names(plan: Node) -> tuple[str, ...]:
    """Names of the source streams of ``plan``, left to right (repeated if a source is read twice)."""
    return tuple(n.name for n in postorder(plan) if isinstance(n, Source))


def render(plan: Node, *, micros: bool = False) -> str:
    """A one-line algebraic rendering, e.g. ``γ[10](σ[0.5](A) ⋈ ω[60](B))``.

    Numbers have no exponent. With ``micros`` the plan's time values are microseconds (as in the plans
    CQL compiles and the runtime's queries) and are shown as durations: ``ω[30 s](σ[0.25](scans))``.
    """
    _node(plan, "plan")
    _fmt = _human.plain
    _time = _human.duration if micros else _human.plain
    parts: dict[int, str] = {}
    for node in postorder(plan):
        kids = [parts[id(c)] for c in node.children]
        if isinstance(node, Source):
            text = node.name
        elif isinstance(node, Select):
            text = f"σ[{_fmt(node.selectivity)}]({kids[0]})"
        elif isinstance(node, Project):
            text = f"π({kids[0]})"
        elif isinstance(node, Aggregate):
            text = f"α({kids[0]})" if node.groups == 1 else f"γ[{_fmt(node.groups)}]({kids[0]})"
        elif isinstance(node, Window):
            unit = "rows" if node.kind == "tuple" else ""
            text = f"ω[{_fmt(node.size) + unit if unit else _time(node.size)}]({kids[0]})"
        elif isinstance(node, Granularity):
            text = f"Γ[{_time(node.granularity)}]({kids[0]})"
        elif isinstance(node, Join):
            text = f"({kids[0]} ⋈ {kids[1]})"
        elif isinstance(node, Union):
            text = "∪(" + ", ".join(kids) + ")"
        else:  # pragma: no cover - a Node subclass from elsewhere
            text = f"{type(node).__name__}(" + ", ".join(kids) + ")"
        parts[id(node)] = text
    return parts[id(plan)]


def best_plan(plans: Sequence[Node], score, *, maximize: bool = False) -> tuple[Node, float]:
    """The plan of ``plans`` with the lowest (or, with ``maximize``, highest) ``score(plan)``, and its score.

    Ties keep the first plan. The cost modules use it to choose among enumerated candidates.
    """
    if isinstance(plans, Node) or not isinstance(plans, Sequence) or not plans:
        raise TypeError("plans must be a non-empty sequence of plan nodes")
    chk.callable_(score, "score")
    best, best_score = None, 0.0
    for i, plan in enumerate(plans):
        _node(plan, f"plans[{i}]")
        s = score(plan)
        if best is None or (s > best_score if maximize else s < best_score):
            best, best_score = plan, s
    return best, best_score


# ---------------------------------------------------------------------------------------------
# queries and plan enumeration


@dataclass(frozen=True)
class Predicate:
    """A selection predicate over one stream: its selectivity and per-tuple evaluation cost."""

    selectivity: float
    cost: float = 0.0
    name: str | None = None

    def __post_init__(self):
        chk.probability(self.selectivity, "selectivity", allow_zero=False)
        chk.non_negative(self.cost, "cost")


@dataclass(frozen=True)
class JoinPredicate:
    """A join predicate between two streams.

    ``arrival_cost`` is an extra per-arrival handling cost (Viglas & Naughton, §5.1, Table 5 give the
    predicate A⋈C an extra 5 ms); ``pair_cost`` is a time per pair of inputs (RTStream's t_ij).
    """

    selectivity: float
    arrival_cost: float = 0.0
    pair_cost: float = 0.0
    name: str | None = None

    def __post_init__(self):
        chk.probability(self.selectivity, "selectivity", allow_zero=False)
        chk.non_negative(self.arrival_cost, "arrival_cost")
        chk.non_negative(self.pair_cost, "pair_cost")


@dataclass(frozen=True)
class AggregateSpec:
    """The aggregate applied last: ``groups`` groups (1: scalar), per-tuple cost, optional Γ below it."""

    groups: int = 1
    cost: float = 0.0
    granularity: float | None = None

    def __post_init__(self):
        chk.integer(self.groups, "groups", minimum=1)
        chk.non_negative(self.cost, "cost")
        if self.granularity is not None:
            chk.positive(self.granularity, "granularity")


def _mapping(value, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping from stream name to its value, got {value!r}")
    return dict(value)


@dataclass(frozen=True)
class Query:
    """A select-project-join(-aggregate) continuous query over named streams.

    Parameters
    ----------
    streams : sequence of str
        The source streams.
    selections : mapping str -> sequence of Predicate, optional
        Selection predicates per stream.
    projections : mapping str -> float, optional
        Streams that are projected, with the per-tuple projection cost.
    windows : mapping str -> float, optional
        Time-based window size per stream (ω placed directly above the source, PIPES §2.5).
    joins : mapping (str, str) -> JoinPredicate, optional
        Join predicates between pairs of streams. Two sides with no predicate between them are joined
        by a Cartesian product (selectivity 1, nested loops).
    join_method : {"hash", "nested_loops"}
        Method of joins that have a predicate.
    aggregate : AggregateSpec, optional
        Aggregation applied last.

    Examples
    --------
    A single predicate becomes a one-element tuple and a join key a frozenset of the two streams:

    >>> from pyspark_cq.plan import JoinPredicate, Predicate, Query
    >>> q = Query(streams=["A", "B"], selections={"A": Predicate(0.5)}, joins={("A", "B"): JoinPredicate(0.1)})
    >>> q.streams
    ('A', 'B')
    >>> q.selections["A"]
    (Predicate(selectivity=0.5, cost=0.0, name=None),)
    >>> q.joins[frozenset({"A", "B"})]
    JoinPredicate(selectivity=0.1, arrival_cost=0.0, pair_cost=0.0, name=None)
    """

    streams: tuple[str, ...]
    selections: Mapping[str, tuple[Predicate, ...]] = field(default_factory=dict)
    projections: Mapping[str, float] = field(default_factory=dict)
    windows: Mapping[str, float] = field(default_factory=dict)
    joins: Mapping[frozenset, JoinPredicate] = field(default_factory=dict)
    join_method: str = "hash"
    aggregate: AggregateSpec | None = None

    def __post_init__(self):
        if isinstance(self.streams, str) or not isinstance(self.streams, Sequence):
            raise TypeError(f"streams must be a sequence of stream names, got {self.streams!r}")
        streams = tuple(self.streams)
        if not streams:
            raise ValueError("streams must name at least one stream")
        for s in streams:
            if not isinstance(s, str) or not s:
                raise TypeError(f"streams must contain non-empty str names, got {s!r}")
        if len(set(streams)) != len(streams):
            raise ValueError(f"streams names a stream twice: {streams}")
        known = set(streams)

        def check_keys(mapping: dict, name: str):
            unknown = set(mapping) - known
            if unknown:
                raise ValueError(f"{name} refers to unknown stream(s) {sorted(unknown)}; streams: {streams}")

        selections = _mapping(self.selections, "selections")
        check_keys(selections, "selections")
        for s, preds in selections.items():
            if isinstance(preds, Predicate):
                preds = (preds,)
            preds = tuple(preds)
            for p in preds:
                chk.instance(p, f"selections[{s!r}]", Predicate, "a sequence of Predicate")
            selections[s] = preds
        projections = _mapping(self.projections, "projections")
        check_keys(projections, "projections")
        for s, c in projections.items():
            chk.non_negative(c, f"projections[{s!r}]")
        windows = _mapping(self.windows, "windows")
        check_keys(windows, "windows")
        for s, w in windows.items():
            chk.non_negative(w, f"windows[{s!r}]")
        joins = {}
        for key, pred in _mapping(self.joins, "joins").items():
            pair = frozenset(key) if not isinstance(key, str) else None
            if pair is None or len(pair) != 2:
                raise ValueError(f"joins keys must be pairs of two different stream names, got {key!r}")
            check_keys(dict.fromkeys(pair), "joins")
            chk.instance(pred, f"joins[{key!r}]", JoinPredicate, "a JoinPredicate")
            if pair in joins:
                raise ValueError(f"joins has two predicates for the pair {sorted(pair)}")
            joins[pair] = pred
        chk.one_of(self.join_method, "join_method", JOIN_METHODS)
        if self.aggregate is not None:
            chk.instance(self.aggregate, "aggregate", AggregateSpec, "an AggregateSpec or None")
        object.__setattr__(self, "streams", streams)
        object.__setattr__(self, "selections", selections)
        object.__setattr__(self, "projections", projections)
        object.__setattr__(self, "windows", windows)
        object.__setattr__(self, "joins", joins)

    def predicates_between(self, left: frozenset, right: frozenset) -> list[JoinPredicate]:
        """The join predicates with one stream in ``left`` and the other in ``right``."""
        return [p for pair, p in self.joins.items() if len(pair & left) == 1 and len(pair & right) == 1]


def left_deep_orders(streams: Sequence[str]) -> list[tuple[str, ...]]:
    """All left-deep join orders of ``streams``, each order once up to swapping the first two.

    k streams give k!/2 orders (1 for k = 1): OM's 3-way join has 3 candidate plans
    (Kulkarni & Ravishankar, §5.3).
    """
    streams = _names(streams)
    if len(streams) == 1:
        return [streams]
    index = {s: i for i, s in enumerate(streams)}
    return [p for p in itertools.permutations(streams) if index[p[0]] < index[p[1]]]


def bushy_trees(streams: Sequence[str]) -> list:
    """All binary join trees over ``streams`` up to commutativity, as nested pairs of names.

    k streams give (2k-3)!! trees: 3 for k = 3, 15 for k = 4, 105 for k = 5.
    """
    streams = _names(streams)
    return _bushy(streams)


def _bushy(items: tuple) -> list:
    if len(items) == 1:
        return [items[0]]
    first, rest = items[0], items[1:]
    trees = []
    # the side holding ``first`` is the left one: each split appears once
    for r in range(0, len(rest)):
        for chosen in itertools.combinations(rest, r):
            left = (first,) + chosen
            right = tuple(x for x in rest if x not in chosen)
            for lt in _bushy(left):
                for rt in _bushy(right):
                    trees.append((lt, rt))
    return trees


def join_trees(streams: Sequence[str], shape: str = "left_deep") -> list:
    """Join trees over ``streams`` as nested pairs: left-deep (OM §4.2 step 3) or bushy."""
    chk.one_of(shape, "shape", ("left_deep", "bushy"))
    if shape == "bushy":
        return bushy_trees(streams)
    trees = []
    for order in left_deep_orders(streams):
        tree = order[0]
        for s in order[1:]:
            tree = (tree, s)
        trees.append(tree)
    return trees


def _names(streams) -> tuple[str, ...]:
    if isinstance(streams, str) or not isinstance(streams, Sequence):
        raise TypeError(f"streams must be a sequence of stream names, got {streams!r}")
    streams = tuple(streams)
    if not streams:
        raise ValueError("streams must name at least one stream")
    if len(set(streams)) != len(streams):
        raise ValueError(f"streams names a stream twice: {streams}")
    return streams


def unary_orders(query: Query, stream: str, *, group_selections: bool = True) -> list[Node]:
    """The candidate sub-plans of one stream: ω over the source, then its σ and π in every order.

    With ``group_selections`` (OM §4.2 step 1) the stream's predicates form one selection whose
    selectivity is the product of theirs (independent predicates) and whose per-tuple cost is the sum
    (every predicate is evaluated on every tuple); then OM step 2 compares π→σ and σ→π.
    Without grouping, every order of the individual selections and the projection is a candidate
    (e.g. the two selection orders of Viglas & Naughton's Figure 1).
    """
    chk.instance(query, "query", Query, "a Query")
    if stream not in query.streams:
        raise ValueError(f"stream must be one of the query's streams {query.streams}, got {stream!r}")
    base: Node = Source(stream)
    if stream in query.windows:
        base = Window(base, query.windows[stream])
    preds = list(query.selections.get(stream, ()))
    ops: list[tuple[str, object]] = []
    if preds and group_selections:
        names = [p.name for p in preds if p.name]
        grouped = Predicate(selectivity=math.prod(p.selectivity for p in preds),
                            cost=sum(p.cost for p in preds),
                            name=" AND ".join(names) if names else None)
        ops.append(("σ", grouped))
    else:
        ops.extend(("σ", p) for p in preds)
    if stream in query.projections:
        ops.append(("π", query.projections[stream]))
    plans, seen = [], set()
    for order in itertools.permutations(range(len(ops))):
        node = base
        for i in order:
            kind, spec = ops[i]
            if kind == "σ":
                node = Select(node, spec.selectivity, cost=spec.cost, predicate=spec.name)
            else:
                node = Project(node, cost=spec)
        if node not in seen:
            seen.add(node)
            plans.append(node)
    return plans


def _flatten(tree) -> frozenset:
    return frozenset([tree]) if isinstance(tree, str) else _flatten(tree[0]) | _flatten(tree[1])


def _connected(query: Query, tree) -> bool:
    if isinstance(tree, str):
        return True
    left, right = _flatten(tree[0]), _flatten(tree[1])
    return bool(query.predicates_between(left, right)) and _connected(query, tree[0]) and \
        _connected(query, tree[1])


def _build(query: Query, tree, leaves: Mapping[str, Node]) -> Node:
    if isinstance(tree, str):
        return leaves[tree]
    left, right = _build(query, tree[0], leaves), _build(query, tree[1], leaves)
    preds = query.predicates_between(_flatten(tree[0]), _flatten(tree[1]))
    if not preds:  # Cartesian product
        return Join(left, right, selectivity=1.0, method="nested_loops")
    arrival = sum(p.arrival_cost for p in preds)
    return Join(left, right, selectivity=math.prod(p.selectivity for p in preds), method=query.join_method,
                left_cost=arrival, right_cost=arrival, cost=sum(p.pair_cost for p in preds))


def enumerate_plans(query: Query, *, shape: str = "left_deep", group_selections: bool = True,
                    allow_cartesian: bool = True) -> list[Node]:
    """Candidate plans of ``query``, following OM's heuristics (Kulkarni & Ravishankar, §4.2).

    Every combination of a per-stream sub-plan (:func:`unary_orders`) and a join tree
    (:func:`join_trees` with ``shape`` ``"left_deep"`` as OM, or ``"bushy"`` for the rate-based
    model) is a candidate; the aggregate, if any, is applied last (step 4), above Γ when the query
    gives a granularity. Join trees that need a Cartesian product are skipped unless
    ``allow_cartesian``.

    Examples
    --------
    Three streams joined in a chain A–B–C, with a selection on A pushed down to it: 3!/2 = 3 left-deep
    join orders, as OM's 3-way join (§5.3); the one starting with A ⋈ C needs a Cartesian product.

    >>> from pyspark_cq.plan import AggregateSpec, JoinPredicate, Predicate, Query, enumerate_plans
    >>> q = Query(streams=("A", "B", "C"), selections={"A": [Predicate(0.5)]},
    ...           joins={("A", "B"): JoinPredicate(0.1), ("B", "C"): JoinPredicate(0.2)})
    >>> for plan in enumerate_plans(q):
    ...     print(plan)
    ((σ[0.5](A) ⋈ B) ⋈ C)
    ((σ[0.5](A) ⋈ C) ⋈ B)
    ((B ⋈ C) ⋈ σ[0.5](A))
    >>> len(enumerate_plans(q, allow_cartesian=False))
    2

    The selections over one stream are grouped into one of selectivity ``0.5·0.2 = 0.1`` (step 1), σ and π
    are tried in both orders (step 2) and the aggregate comes last (step 4):

    >>> q = Query(streams=("A",), selections={"A": [Predicate(0.5), Predicate(0.2)]}, projections={"A": 0.5},
    ...           windows={"A": 60}, aggregate=AggregateSpec(groups=10))
    >>> for plan in enumerate_plans(q):
    ...     print(plan)
    γ[10](π(σ[0.1](ω[60](A))))
    γ[10](σ[0.1](π(ω[60](A))))
    """
    chk.instance(query, "query", Query, "a Query")
    chk.one_of(shape, "shape", ("left_deep", "bushy"))
    trees = [t for t in join_trees(query.streams, shape) if allow_cartesian or _connected(query, t)]
    per_stream = [unary_orders(query, s, group_selections=group_selections) for s in query.streams]
    plans = []
    for combo in itertools.product(*per_stream):
        leaves = dict(zip(query.streams, combo))
        for tree in trees:
            plan = _build(query, tree, leaves)
            agg = query.aggregate
            if agg is not None:
                if agg.granularity is not None:
                    plan = Granularity(plan, agg.granularity)
                plan = Aggregate(plan, groups=agg.groups, cost=agg.cost)
            plans.append(plan)
    return plans
