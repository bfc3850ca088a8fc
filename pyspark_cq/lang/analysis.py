"""The pure stage of the CQL compiler (Motwani et al., STREAM, §2): :func:`analyze` classifies a query, resolves
its columns (given the sources' column names), and builds the logical plan (:mod:`pyspark_cq.plan`), the QoS
ranges and the operator ids the runtime's policies read; :func:`explain` prints them with the PIPES cost
estimates. Never loads PySpark (docs/architecture.md, "Layers"); :mod:`pyspark_cq.lang.builder` turns an
:class:`Analysis` into DataFrames.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from .. import _human
from .. import plan as P
from ..vocabulary.operators import for_shape
from . import ast as A
from .errors import CQLCompileError
from .parser import parse
from .printer import duration, to_text

__all__ = ["analyze", "explain", "Analysis", "SourceInfo", "AT", "SUB_AT", "DEFAULT_SELECTIVITY", "DEFAULT_GROUPS"]

AT = "cq_at"
#: The timestamp column of a FROM subquery's stream (its tuples' ``cq_at``; renamed, as the outer query adds its own)
SUB_AT = "cq_time"
#: Priors the plan carries until the runtime has measured the real values (the cost models read them).
DEFAULT_SELECTIVITY = 0.5
DEFAULT_JOIN_SELECTIVITY = 0.1
DEFAULT_GROUPS = 100
#: What joins the inputs of an aggregate over a join: Spark's stream-stream join with the time band of the two
#: windows (pyspark-cq's window_join is a second applyInPandasWithState, which Spark refuses in one query).
JOIN_AGGREGATE_JOIN = "stream-stream interval join (Spark)"
#: The same for three to six streams: Spark's left-deep chain of inner stream-stream joins, each with the band of
#: the joined window to every earlier one (multi_join is an applyInPandasWithState too).
JOIN_AGGREGATE_CHAIN = "chain of stream-stream interval joins (Spark)"
_AGG_NAMES = {"COUNT": "count", "SUM": "sum", "AVG": "avg", "MIN": "min", "MAX": "max"}


# ---------------------------------------------------------------------------------------------
# analysis (pure)


@dataclass
class SourceInfo:
    """One stream of ``FROM``: where its columns come from and what is applied before the join / aggregate."""

    ref: str
    node: A.StreamRef
    filters: list = field(default_factory=list)  # conjuncts applied to this stream alone
    relation: bool = False                       # a stored relation (a batch DataFrame) joined to the stream
    time: str | None = None                      # its timestamp column when known (a subquery's: cq_time)

    @property
    def name(self) -> str:
        """The stream's name in ``sources``."""
        return self.node.name

    @property
    def window(self) -> A.WindowSpec | None:
        """The stream's window, or None."""
        return self.node.window


@dataclass
class Analysis:
    """What :func:`analyze` found: shape, sources, predicates, aggregates, plan and QoS.

    ``shape`` is ``"stream"`` (one stream, no state: NOW, RANGE or UNBOUNDED windows), ``"rows"``
    (a tuple-based window), ``"aggregate"`` (a windowed GROUP BY), ``"join"`` (two windowed streams),
    ``"multi_join"`` (three to six) or ``"join_aggregate"`` (a GROUP BY over a join of two to six slid windows).
    """

    statement: A.Statement
    name: str
    shape: str
    sources: list[SourceInfo]                       # the streams
    stream: str
    relations: list = field(default_factory=list)   # stored relations joined to the one stream (SourceInfo)
    relation_keys: list = field(default_factory=list)  # [((stream ref, col), (relation ref, col)), ...]
    residual: list = field(default_factory=list)    # conjuncts applied after the window / join
    keys: list = field(default_factory=list)        # [((ref, col), (ref, col)), ...] equi-join pairs
    operator: str | None = None                     # the stateful operator's id (control table, metrics)
    plan: P.Node | None = None
    qos: dict = field(default_factory=dict)          # label -> QoSRange
    options: dict = field(default_factory=dict)      # period / deadline (µs), weight, sample range
    subqueries: dict = field(default_factory=dict)   # alias -> Analysis of a FROM subquery (a stream)
    constraints: list = field(default_factory=list)  # WITH (CONSTRAINT …): pyspark_cq.constraints, key cols cq_k<j>
    written: A.Statement | None = None               # the statement as written (FROM subqueries in place)
    how: list = field(default_factory=list)          # join type per stream after the first (FROM … JOIN … ON)
    output_mode: str = "append"                      # WITH (OUTPUT_MODE …): the sink's output mode

    @property
    def outer(self) -> bool:
        """Whether the join has an outer input (``LEFT`` / ``RIGHT`` / ``FULL JOIN``)."""
        return any(h != "inner" for h in self.how)

    @property
    def null_supplying(self) -> set:
        """The refs of the streams an outer join pads with nulls (their WHERE conjuncts stay after the join)."""
        refs, out = [s.ref for s in self.sources], set()
        for i, h in enumerate(self.how, 1):
            if h in ("left", "full"):
                out.add(refs[i])
            if h in ("right", "full"):
                out.update(refs[:i])
        return out

    @property
    def select(self) -> A.Select:
        """The query's SELECT."""
        return self.statement.query


def _conjuncts(e: A.Expr | None) -> list:
    if e is None:
        return []
    if isinstance(e, A.Binary) and e.op == "AND":
        return _conjuncts(e.left) + _conjuncts(e.right)
    return [e]


def _walk(e):
    yield e
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        for x in (v if isinstance(v, tuple) else (v,)):
            if isinstance(x, A.Expr):
                yield from _walk(x)


def _rewrite(e, fn):
    """``e`` with every sub-expression ``x`` for which ``fn(x)`` is not None replaced by it (top-down)."""
    new = fn(e)
    if new is not None:
        return new
    changes = {}
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if isinstance(v, A.Expr):
            changes[f.name] = _rewrite(v, fn)
        elif isinstance(v, tuple) and any(isinstance(x, A.Expr) for x in v):
            changes[f.name] = tuple(_rewrite(x, fn) if isinstance(x, A.Expr) else x for x in v)
    return dataclasses.replace(e, **changes) if changes else e


def _aggregates(e) -> list[A.Call]:
    return [x for x in _walk(e) if isinstance(x, A.Call) and x.is_aggregate]


class _Resolver:
    """Which stream a column belongs to (by qualifier, else by the streams' column names)."""

    def __init__(self, sources: list[SourceInfo], columns: Mapping[str, list[str]] | None):
        self.refs = {s.ref: s for s in sources}
        self.by_name = {s.name: s for s in sources if s.node.alias and s.name not in self.refs}
        self.columns = columns

    def owner(self, c: A.Column) -> str | None:
        if c.table is not None:
            src = self.refs.get(c.table) or self.by_name.get(c.table)
            if src is None:
                raise CQLCompileError(f"the column {c.table}.{c.name}", f"{c.table!r} is not a stream of FROM "
                                      f"(streams and aliases: {', '.join(self.refs)})", c)
            if self.columns is not None and self.column_name(src.ref, c) is None:
                raise CQLCompileError(f"the column {c.table}.{c.name}", f"stream {src.name!r} has no column "
                                      f"{c.name!r}; its columns: {', '.join(self.columns[src.ref])}", c)
            return src.ref
        if len(self.refs) == 1:
            ref = next(iter(self.refs))
            if self.columns is not None and self.column_name(ref, c) is None:
                raise CQLCompileError(f"the column {c.name}", f"stream {self.refs[ref].name!r} has no column "
                                      f"{c.name!r}; its columns: {', '.join(self.columns[ref])}", c)
            return ref
        if self.columns is None:
            return None
        found = [r for r in self.refs if self.column_name(r, c) is not None]
        if not found:
            raise CQLCompileError(f"the column {c.name}", "no stream of FROM has it", c)
        if len(found) > 1:
            raise CQLCompileError(f"the column {c.name}", f"it is ambiguous (in {', '.join(found)}); qualify it, "
                                  f"e.g. {found[0]}.{c.name}", c)
        return found[0]

    def column_name(self, ref: str, c: A.Column) -> str | None:
        """The source's actual column name for ``c`` (exact, else case-insensitive as Spark's default)."""
        cols = self.columns[ref]
        if c.name in cols:
            return c.name
        matches = [x for x in cols if x.lower() == c.name.lower()]
        return matches[0] if len(matches) == 1 else None

    def refs_of(self, e) -> set:
        return {self.owner(x) for x in _walk(e) if isinstance(x, A.Column)}


def _micros(d: A.Duration) -> int:
    return d.micros


def _granularity(w: A.Window) -> int:
    """The granularity (µs) a windowed aggregate is compiled with: the greatest grid holding every window
    boundary, ``gcd(RANGE, SLIDE)`` (the slide when it divides the range), so its rows are exactly Spark's.
    """
    return math.gcd(w.size.micros, w.slide.micros)


def analyze(statement: A.Statement | str, name: str = "q", columns: Mapping[str, list[str]] | None = None,
            *, streams=None) -> Analysis:
    """Classify ``statement`` and build its logical plan and QoS (no Spark).

    Parameters
    ----------
    statement : Statement or str
        The parsed query, or its text.
    name : str
        Query name: the stateful operator's id is ``"<name>_<kind>"`` (control table, metrics, plan labels).
    columns : mapping stream name -> list of column names, optional
        The sources' columns, to resolve unqualified columns of multi-stream queries (without it they
        stay unresolved and are applied after the join).
    streams : collection of str, optional
        The sources that are streams (streaming DataFrames): in a FROM without any window they are the
        streams and the other items stored relations (default: the first item is the stream).

    Raises
    ------
    CQLSyntaxError, CQLCompileError
    """
    if isinstance(statement, str):
        statement = parse(statement)
    if not isinstance(statement, A.Statement):
        raise TypeError(f"statement must be a CQL text or a parsed Statement, got {type(statement).__name__}")
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"name must be a non-empty query name of letters, digits, '_' and '-', got {name!r}")
    written = statement
    statement, how = _inner_joins(statement)
    statement, inner = _subqueries(statement)
    subqueries = {}
    for alias, sub in inner.items():
        sa = subqueries[alias] = analyze(sub, f"{name}_{alias}", columns, streams=streams)
        if sa.shape not in ("stream", "join"):
            raise CQLCompileError(f"the subquery {alias}", "a subquery in FROM must produce a stream without "
                                  "state or of a two-way window join (CQL §2: a selection / projection of streams, "
                                  "joined with stored relations, or ISTREAM of A [RANGE a] ⋈ B [RANGE b] at "
                                  f"most); this one is {'an' if sa.shape == 'aggregate' else 'a'} "
                                  f"{sa.shape.replace('_', ' ')}: run it as its own query and read its sink", sub.query)
        if columns is not None:
            out = []
            for it, col in zip(sub.query.items, _output_names(sub.query)):
                if isinstance(it.expr, A.Star):   # the columns of the streams it names
                    out += [c for src in sub.query.sources if it.expr.table in (None, src.ref)
                            for c in columns.get(getattr(src, "name", None), [])]
                else:
                    out.append(col)
            columns = dict(columns, **{alias: [c for c in out if c != AT] + [SUB_AT]})
    q = statement.query
    sources = []
    for s in q.sources:
        sources.append(SourceInfo(s.ref, s, time=SUB_AT if s.name in inner else None))
    # In a multi-item FROM, an item without a window is a stored relation (CQL: streams are windowed
    # into relations; a relation is used as it is). Its rows join the stream's before the window, which is
    # the same as after it for a relation that does not change (a batch DataFrame).
    # With no window at all (a stream-producing subquery such as STREAM's third example, `FROM Requests S,
    # Domains R`), the streaming DataFrames are the streams (``streams``), else the first item.
    if len(sources) > 1 and any(s.window is None for s in sources):
        if all(s.window is None for s in sources):
            named = {s.name for s in sources} & set(streams or ())
            for s in sources:
                s.relation = s.name not in named if named else s is not sources[0]
        else:
            for s in sources:
                s.relation = s.window is None
    refs = [s.ref for s in sources]
    dup = {r for r in refs if refs.count(r) > 1}
    if dup:
        raise CQLCompileError(f"FROM … {sorted(dup)[0]}", "a stream is named twice; give each an alias", q)
    cols_by_ref = None
    if columns is not None:
        cols_by_ref = {}
        for s in sources:
            if s.name not in columns:
                raise CQLCompileError(f"the stream {s.name}", f"no source of that name; sources: "
                                      f"{', '.join(columns) or 'none'}", s.node)
            cols_by_ref[s.ref] = list(columns[s.name])
    res = _Resolver(sources, cols_by_ref)
    relations = [s for s in sources if s.relation]
    sources = [s for s in sources if not s.relation]
    if relations and len(sources) != 1:
        raise CQLCompileError("a join of several streams with a stored relation", "not supported yet: one "
                              "windowed stream may be joined with relations", q)
    aggregated = bool(q.group_by) or any(_aggregates(i.expr) for i in q.items) or q.having is not None
    if q.distinct:
        aggregated = _distinct(q, sources, aggregated)
    for it in q.items:
        for call in _aggregates(it.expr):
            if call.distinct:
                raise CQLCompileError(f"{call.name}(DISTINCT …)", "distinct aggregates are not supported", call)
    if len(sources) == 1:
        w = sources[0].window
        if aggregated:
            shape = "rows_aggregate" if w is not None and w.kind == "rows" else "aggregate"
        elif w is not None and w.kind == "rows":
            shape = "rows"
            if relations:
                raise CQLCompileError("a ROWS window joined with a relation", "the window counts the stream's "
                                      "rows before the join; join in a subquery stream first", w)
        else:
            shape = "stream"
    else:
        if aggregated:
            _check_join_aggregate(statement, sources)
        for s in sources if not aggregated else ():
            if s.window is None or s.window.kind != "range" or s.window.slide is not None or s.window.where:
                raise CQLCompileError(f"the join input {s.ref}",
                                      "every stream of a join needs a time-based window [RANGE d] (no SLIDE, no "
                                      "WHERE inside: put the predicate in the query's WHERE); an unbounded join "
                                      "keeps all its input forever", s.window or s.node)
        if len(sources) > 6:
            raise CQLCompileError("a join of more than six streams", "multi_join joins 2 to 6 inputs", q)
        shape = "join_aggregate" if aggregated else "join" if len(sources) == 2 else "multi_join"
    stream = statement.stream
    a = Analysis(statement, name, shape, sources, stream, relations=relations, subqueries=subqueries,
                 written=written, how=how)
    _check_stream_operator(a)
    rel_refs = {r.ref for r in relations}
    if a.outer:
        _outer_join(a, res, aggregated)
    # WHERE: conjuncts on one stream are applied to it alone (a RANGE window commutes with a selection);
    # over a ROWS window they stay after the window (§2.1: before/after the window differ).
    for c in _conjuncts(q.where):
        if any(isinstance(x, A.Call) and x.is_aggregate for x in _walk(c)):
            raise CQLCompileError("an aggregate in WHERE", "use HAVING", c)
        owners = res.refs_of(c)
        if relations and _is_key(c, res) and len(owners & rel_refs) == 1:
            left, right = (c.left, c.right) if res.owner(c.left) not in rel_refs else (c.right, c.left)
            a.relation_keys.append(((res.owner(left), left), (res.owner(right), right)))
        elif relations and owners & rel_refs:
            if None in owners:
                raise CQLCompileError(f"the predicate {to_text(c)}", "qualify its columns (stream or relation?)", c)
            sources[0].filters.append(c)
        elif a.outer:   # keys come from ON; a predicate on a null-padded stream filters the join's output
            if len(owners) == 1 and None not in owners and not owners & a.null_supplying:
                next(s for s in sources if s.ref in owners).filters.append(c)
            else:
                a.residual.append(c)
        elif len(sources) > 1 and _is_key(c, res):
            a.keys.append(((res.owner(c.left), c.left), (res.owner(c.right), c.right)))
        elif len(owners) == 1 and None not in owners and shape not in ("rows", "rows_aggregate"):
            next(s for s in sources if s.ref in owners).filters.append(c)
        else:
            a.residual.append(c)
    if shape in ("join", "multi_join", "join_aggregate"):
        _check_keys(a)
    # every column of the select list, GROUP BY, HAVING and PARTITION BY names a stream's column
    exprs = [i.expr for i in q.items] + list(q.group_by) + ([q.having] if q.having is not None else [])
    exprs += [c for s in sources if s.window is not None for c in s.window.partition_by]
    for e in exprs:
        for x in _walk(e):
            if isinstance(x, A.Column):
                res.owner(x)
    for r in relations:
        if not any(k[1][0] == r.ref for k in a.relation_keys):
            raise CQLCompileError(f"the relation {r.ref}", "it is not joined on an equality with the stream "
                                  f"(WHERE S.a = {r.ref}.b); a Cartesian product is not supported", r.node)
    a.operator = {"aggregate": f"{name}_agg", "join": f"{name}_join", "multi_join": f"{name}_mjoin",
                  "rows": f"{name}_rows", "rows_aggregate": f"{name}_rows", "join_aggregate": f"{name}_agg"}.get(shape)
    a.plan = _plan(a)
    a.qos, a.options = _qos(a)
    return a


def _inner_joins(statement: A.Statement) -> tuple[A.Statement, list]:
    """``statement`` with FROM's ``JOIN … ON`` written as commas and its ON conditions in WHERE when every join is
    inner (the same relation, CQL §2), and the join types per item after the first (empty for a FROM of commas).
    With an outer join the statement is kept: :func:`_outer_join` reads its ON conditions.
    """
    q = statement.query
    if not q.joins:
        return statement, []
    how = [j.how if j is not None else "inner" for j in q.joins]
    if any(h != "inner" for h in how):
        return statement, how
    where = q.where
    for j in q.joins:
        if j is not None:
            where = j.on if where is None else A.Binary("AND", where, j.on, line=j.line, column=j.column)
    query = dataclasses.replace(q, where=where, joins=())
    return dataclasses.replace(statement, query=query), how


def _outer_join(a: Analysis, res: _Resolver, aggregated: bool) -> None:
    """Check a FROM with an outer join (docs/cql.md, *Joins*) and take its keys and pushed filters from ON.

    Two streams compile to ``interval_join(how=…)`` (inner, left, right or full), three to six to ``multi_join``
    with ``how=`` per input after the first (inner or left). An ON conjunct is an equality of a column of the
    joined stream with one of an earlier stream (a key), or a condition on the null-padded stream alone (applied
    to it before the join, as SQL's ON); the time band is the windows' (their validities intersect).
    """
    q = a.select
    joins = q.joins
    for i, j in enumerate(joins, 1):
        if j is None:
            raise CQLCompileError(f"the comma before {q.sources[i].ref}", "a FROM with an outer join joins every "
                                  "stream with JOIN … ON (a comma is an inner join whose condition is in WHERE: "
                                  "write it JOIN … ON)", q.sources[i])
    if a.relations or any(s.window is None for s in a.sources):
        s = (a.relations or [s for s in a.sources if s.window is None])[0]
        raise CQLCompileError(f"the outer join input {s.ref}", "every input of an outer join is a windowed stream "
                              "[RANGE d]; a stored relation is joined inner only (a comma and WHERE)", s.node)
    if aggregated:
        raise CQLCompileError("an aggregate over an outer join", "not supported: an aggregate over a join is "
                              "compiled over Spark's inner interval join; aggregate over an inner JOIN, or run the "
                              "outer join as its own query", q)
    if a.shape not in ("join", "multi_join"):
        raise CQLCompileError("an outer join", f"this query is {_shape_words(a.shape)}", q)
    for j in joins:
        if j.how in ("right", "full") and len(a.sources) > 2:
            raise CQLCompileError(f"{j.how.upper()} JOIN of three or more streams", "multi_join takes inner and "
                                  "left inputs only (Spark's left-deep chain); put the preserved stream first and "
                                  "write LEFT JOIN", j)
    refs = [s.ref for s in a.sources]
    nulls = a.null_supplying
    for i, j in enumerate(joins, 1):
        this, before = refs[i], set(refs[:i])
        for c in _conjuncts(j.on):
            if any(isinstance(x, A.Call) and x.is_aggregate for x in _walk(c)):
                raise CQLCompileError("an aggregate in ON", "not allowed in a join condition", c)
            owners = res.refs_of(c)
            if _is_key(c, res) and this in owners and owners - {this} <= before:
                left, right = (c.left, c.right) if res.owner(c.left) != this else (c.right, c.left)
                a.keys.append(((res.owner(left), left), (this, right)))
            elif j.how == "inner":   # as in WHERE: after the join (same rows for an inner step of the chain)
                if len(owners) == 1 and None not in owners and not owners & nulls:
                    a.sources[refs.index(next(iter(owners)))].filters.append(c)
                else:
                    a.residual.append(c)
            elif None not in owners and len(owners) == 1 and owners <= nulls and (
                    j.how == "left" and owners == {this} or j.how == "right" and owners == before):
                # a condition on the null-padded stream alone: its rows that fail it match nothing (SQL's ON)
                a.sources[refs.index(next(iter(owners)))].filters.append(c)
            else:
                raise CQLCompileError(f"the ON condition {to_text(c)} of the {j.how.upper()} JOIN", "an outer "
                                      f"join's ON takes equalities of a column of {this} with one of an earlier "
                                      "stream (its keys)" + (" and conditions on the null-padded stream alone"
                                                             if j.how != "full" else "")
                                      + "; the time band is the windows' [RANGE …] (validities intersect); put "
                                      "other conditions in WHERE (applied to the join's output)", c)
        if not any(k[1][0] == this for k in a.keys):
            raise CQLCompileError(f"the {j.how.upper()} JOIN of {this}", f"its ON has no key equality of {this} "
                                  f"with an earlier stream (ON {refs[0]}.k = {this}.k)", j)


def _subqueries(statement: A.Statement) -> tuple[A.Statement, dict]:
    """``statement`` with every FROM subquery replaced by a stream named by its alias, and
    {alias: the subquery as an ISTREAM statement} (a stream-producing subquery's tuples, each at its time).
    """
    inner, items = {}, []
    for s in statement.query.sources:
        if isinstance(s, A.SubqueryRef):
            inner[s.alias] = A.Statement(s.query, "ISTREAM", line=s.line, column=s.column)
            s = A.StreamRef(s.alias, None, s.window, s.sample, line=s.line, column=s.column)
        items.append(s)
    if not inner:
        return statement, inner
    query = dataclasses.replace(statement.query, sources=tuple(items))
    return dataclasses.replace(statement, query=query), inner



def _unqualified(e):
    """``e`` with its column references stripped of their stream qualifier (to compare expressions)."""
    return _rewrite(e, lambda x: A.Column(None, x.name) if isinstance(x, A.Column) else None)


def _distinct(q: A.Select, sources: list, aggregated: bool) -> bool:
    """Check a ``SELECT DISTINCT``; True: it is compiled as an aggregate (a GROUP BY of its select list)."""
    if aggregated:
        selected = {_unqualified(i.expr) for i in q.items}
        missing = [g for g in q.group_by if _unqualified(g) not in selected]
        if missing:
            raise CQLCompileError("SELECT DISTINCT", f"over an aggregate it must select every GROUP BY item "
                                  f"(missing {to_text(missing[0])}): each window then has one row per group, "
                                  "so the rows are distinct", q)
        return True
    w = sources[0].window if len(sources) == 1 else None
    if w is None or w.kind != "range" or w.slide is None:
        raise CQLCompileError("SELECT DISTINCT", "duplicate elimination needs one stream with a sliding window "
                              "[RANGE d SLIDE s] (per window, as GROUP BY of the select list); over a stream, "
                              "a ROWS window or a join its state would grow without bound", q)
    for it in q.items:
        if isinstance(it.expr, A.Star):
            raise CQLCompileError("SELECT DISTINCT *", "name the columns to make distinct", it)
    return True


def _is_key(c, res) -> bool:
    return (isinstance(c, A.Binary) and c.op == "=" and isinstance(c.left, A.Column)
            and isinstance(c.right, A.Column) and None not in (res.owner(c.left), res.owner(c.right))
            and res.owner(c.left) != res.owner(c.right))


def _check_keys(a: Analysis) -> None:
    refs = [s.ref for s in a.sources]
    if not a.keys:
        raise CQLCompileError("a join without an equality predicate", "a Cartesian product of streams is not "
                              "supported; join on equal columns (WHERE A.k = B.k)", a.select)
    if a.shape == "join" or a.shape == "join_aggregate" and len(refs) == 2:
        return
    # multi_join: one key shared by all inputs (connected through the equalities); others are residual.
    parent = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for (r1, c1), (r2, c2) in a.keys:
        parent[find((r1, c1.name))] = find((r2, c2.name))
    classes: dict = {}
    for (r, c), _ in [(k[0], 0) for k in a.keys] + [(k[1], 0) for k in a.keys]:
        classes.setdefault(find((r, c.name)), set()).add((r, c.name))
    full = [m for m in classes.values() if {r for r, _ in m} == set(refs) and len(m) == len(refs)]
    if not full:
        what = "an aggregate over a join" if a.shape == "join_aggregate" else "multi_join"
        raise CQLCompileError("a join of three or more streams", f"{what} needs one key equal in every input "
                              "(e.g. A.k = B.k AND B.k = C.k)", a.select)
    keep = full[0]
    extra = [k for k in a.keys if (k[0][0], k[0][1].name) not in keep or (k[1][0], k[1][1].name) not in keep]
    if extra and a.outer:
        raise CQLCompileError(f"the key equality {to_text(extra[0][0][1])} = {to_text(extra[0][1][1])}", "an outer "
                              "multi_join joins on one key shared by every input; a second equality cannot be "
                              "applied after the join without dropping null-padded rows", extra[0][1][1])
    a.keys = [k for k in a.keys if k not in extra]
    a.residual.extend(A.Binary("=", k[0][1], k[1][1]) for k in extra)


def _check_stream_operator(a: Analysis) -> None:
    s, shape = a.stream, a.shape
    w = a.sources[0].window if a.sources else None
    kind = w.kind if w is not None else "unbounded"
    node = a.statement
    if shape == "stream":
        if kind == "unbounded":
            if s == "DSTREAM":
                raise CQLCompileError("DSTREAM of an unbounded window", "nothing ever leaves the relation, the "
                                      "stream would be empty", node)
            if s == "RSTREAM":
                raise CQLCompileError("RSTREAM of an unbounded window", "it re-emits the whole history at every "
                                      "instant; use ISTREAM", node)
        elif kind == "now" and s == "DSTREAM":
            raise CQLCompileError("DSTREAM of a NOW window", "not supported; [NOW] tuples leave one instant after "
                                  "they arrive — use ISTREAM", node)
        elif kind == "range":
            if s is None:
                raise CQLCompileError("a windowed query without ISTREAM, DSTREAM or RSTREAM",
                                      "it produces a relation that also loses tuples (not monotone); wrap it in "
                                      "ISTREAM(…) (tuples entering) or DSTREAM(…) (tuples leaving)", node)
            if s == "RSTREAM":
                raise CQLCompileError("RSTREAM of a RANGE window without aggregation", "it re-emits the window's "
                                      "tuples at every instant; use ISTREAM or DSTREAM", node)
            if w.slide is not None:
                raise CQLCompileError("SLIDE without aggregation", "SLIDE sets when a windowed aggregate is "
                                      "evaluated; a selection's ISTREAM / DSTREAM does not depend on it", w)
    elif shape == "rows":
        if s is None or s == "RSTREAM":
            raise CQLCompileError(f"{s or 'a ROWS window without ISTREAM or DSTREAM'}"
                                  + (" of a ROWS window" if s else ""),
                                  "the window's relation changes at every arrival; use ISTREAM(…) for the tuples "
                                  "entering it or DSTREAM(…) for those leaving it", node)
    elif shape == "rows_aggregate":
        q = a.select
        if s is None:
            raise CQLCompileError("an aggregate without ISTREAM, DSTREAM or RSTREAM", "it produces a relation "
                                  "(not monotone); wrap it in RSTREAM(…) (every instant), ISTREAM(…) (new "
                                  "values) or DSTREAM(…) (replaced values)", node)
        if q.having is not None:
            raise CQLCompileError("HAVING over a ROWS window", "not supported yet: filter the output stream",
                                  q.having)
        parts = {c.name for c in w.partition_by}
        grouped = {g.name if isinstance(g, A.Column) else to_text(g) for g in q.group_by}
        if grouped != parts:
            raise CQLCompileError("GROUP BY over a ROWS window", "an aggregate over a ROWS window is computed per "
                                  "window: GROUP BY exactly its PARTITION BY columns "
                                  f"({', '.join(sorted(parts)) or 'none'}), got {', '.join(sorted(grouped)) or 'none'}",
                                  q.group_by[0] if q.group_by else w)
    elif shape == "aggregate":
        if w is None or w.kind != "range":
            raise CQLCompileError("aggregation over " + ("a stream without a window" if w is None
                                                         else f"a {w.kind.upper()} window"),
                                  "aggregates are compiled for time-based windows [RANGE d SLIDE s]; an unbounded "
                                  "or tuple-based aggregate is not supported yet", w or a.sources[0].node)
        if w.slide is None:
            raise CQLCompileError("a windowed aggregate without SLIDE", "its relation changes at every instant of "
                                  "time; give SLIDE s (e.g. SLIDE 1 SECOND) to evaluate it at multiples of s", w)
        if w.where is not None:
            raise CQLCompileError("WHERE inside a RANGE window", "put the predicate in the query's WHERE (a "
                                  "time-based window commutes with it)", w.where)
        if s is None:
            raise CQLCompileError("an aggregate without ISTREAM, DSTREAM or RSTREAM", "it produces a relation "
                                  "(not monotone); wrap it in RSTREAM(…) (every evaluation), ISTREAM(…) (new "
                                  "values) or DSTREAM(…) (replaced values)", node)
        if s in ("ISTREAM", "DSTREAM") and w.size.micros % w.slide.micros:
            raise CQLCompileError(f"{s} of an aggregate whose SLIDE does not divide its RANGE",
                                  "the change stream is computed on the slide's grid; choose a slide dividing "
                                  "the range, or RSTREAM", w)
    elif shape == "join_aggregate":
        pass   # checked by _check_join_aggregate before the shape is set
    else:  # joins
        if s is None:
            raise CQLCompileError("a join of windowed streams without ISTREAM or DSTREAM", "it produces a relation "
                                  "whose pairs also leave (not monotone); wrap it in ISTREAM(…) or DSTREAM(…)", node)
        if s == "RSTREAM":
            raise CQLCompileError("RSTREAM of a join", "it re-emits every valid pair at every instant; use "
                                  "ISTREAM or DSTREAM", node)


#: The output mode of every compiled query (:attr:`~pyspark_cq.lang.builder.CompiledQuery.output_mode`).
OUTPUT_MODE = "append"


def join_types(a: Analysis) -> str | None:
    """The join's type per input and its output mode, as ``explain`` prints them, or None without a join.

    A comma join is inner; ``FROM … LEFT JOIN … ON`` gives a type per input after the first, as
    ``cq.multi_join(how=)`` / ``cq.interval_join(how=)`` take them, and ``WITH (OUTPUT_MODE …)`` the mode.
    """
    if a.shape not in ("join", "multi_join", "join_aggregate"):
        return None
    refs = [s.ref for s in a.sources]
    op = join_operator(a) or a.operator
    how = ", ".join(a.how or ["inner"] * (len(refs) - 1))
    then = "; then the aggregate, in the same query" if a.shape == "join_aggregate" else ""
    return (f"{op}: how=[{how}] ({refs[0]} first, then {', '.join(refs[1:])}); output_mode={a.output_mode}"
            f"{then}")


def join_aggregate_join(a: Analysis) -> str:
    """What joins the inputs of an aggregate over a join: Spark's interval join (two streams) or its left-deep chain
    of interval joins (three to six; ``explain`` names the number of joins).
    """
    if len(a.sources) == 2:
        return JOIN_AGGREGATE_JOIN
    return f"{JOIN_AGGREGATE_CHAIN}, {len(a.sources) - 1} joins"


def join_operator(a: Analysis) -> str | None:
    """The id of the join feeding the aggregate of a ``join_aggregate`` query (its metrics), else None."""
    return f"{a.name}_join" if a.shape == "join_aggregate" else None


def _check_join_aggregate(statement: A.Statement, sources: list) -> None:
    """Check an aggregate over a join (docs/cql.md, "Aggregates over joins"): two to six streams, each with a window
    ``[RANGE w SLIDE s]`` of one slide ``s``, evaluated on one grid (``w mod s`` equal), and R/I/DSTREAM.
    """
    q = statement.query
    if len(sources) > 6:
        raise CQLCompileError("an aggregate over a join of more than six streams", "an aggregate is compiled over "
                              "a join of 2 to 6 windowed streams; join the others in a subquery stream", q)
    for s in sources:
        w = s.window
        if w is None or w.kind != "range":
            raise CQLCompileError(f"the input {s.ref} of an aggregate over a join", "every input needs a time-based "
                                  "window [RANGE w SLIDE s]; an unbounded or tuple-based join is not supported",
                                  w or s.node)
        if w.slide is None:
            raise CQLCompileError(f"an aggregate over a join without SLIDE on {s.ref}", "the joined relation "
                                  "changes at every instant; give every input the same SLIDE, e.g. "
                                  f"{s.ref} [RANGE {duration(w.size)} SLIDE 1 SECOND], to evaluate the aggregate "
                                  "at multiples of it", w)
        if w.where is not None:
            raise CQLCompileError("WHERE inside a RANGE window", "put the predicate in the query's WHERE (a "
                                  "time-based window commutes with it)", w.where)
    a = sources[0].window
    for b in (s.window for s in sources[1:]):   # each against the first: the error points at the window differing
        if a.slide.micros != b.slide.micros:
            raise CQLCompileError("an aggregate over a join of different SLIDEs", "the joined relation is evaluated "
                                  "at the instants all windows slide to: give every input the same SLIDE", b)
        if a.size.micros % a.slide.micros != b.size.micros % b.slide.micros:
            raise CQLCompileError("an aggregate over a join whose windows end on different grids", "windows "
                                  "[k·s, k·s + w) of every input must end at the same instants: choose RANGEs that "
                                  "differ by a multiple of the SLIDE (e.g. all multiples of it)", b)
    if statement.stream is None:
        raise CQLCompileError("an aggregate over a join without RSTREAM, ISTREAM or DSTREAM", "its relation changes "
                              "at every slide instant (not monotone); wrap it in RSTREAM(…) (the value at every "
                              "instant) or ISTREAM(…) / DSTREAM(…) (the values when they change)", statement)


def _plan(a: Analysis) -> P.Node:
    """The logical plan: per stream Source → σ(sample) → σ(filters) → ω, then ⋈ / Γ → γ, then σ, π."""
    op = a.operator
    leaves = []
    for s in a.sources:
        node: P.Node = P.Source(s.name)
        if s.node.sample is not None:
            node = P.Select(node, s.node.sample / 100.0, predicate=f"SAMPLE({s.node.sample:g})",
                            label=f"{op}.drop_ratio" if a.shape == "join" else None)
        pre = ([s.window.where] if s.window is not None and s.window.where is not None else []) + s.filters
        if pre:
            node = P.Select(node, DEFAULT_SELECTIVITY ** len(pre),
                            predicate=" AND ".join(to_text(p) for p in pre))
        w = s.window
        if w is not None and w.kind == "range":
            adjustable = a.shape == "aggregate" or a.shape == "join" and not a.outer
            node = P.Window(node, w.size.micros, label=f"{op}.window" if adjustable else None)
        elif w is not None and w.kind == "rows":
            node = P.Window(node, w.size, kind="tuple", label=None)
        leaves.append(node)
    for r in a.relations:  # stream ⋈ relation, before the window (see analyze)
        w = leaves[0]
        inner = w.child if isinstance(w, P.Window) else w
        joined = P.Join(inner, P.Source(r.name), selectivity=DEFAULT_JOIN_SELECTIVITY)
        leaves[0] = w.replace(child=joined) if isinstance(w, P.Window) else joined
    if a.shape in ("join", "multi_join"):
        node = leaves[0]
        for i, leaf in enumerate(leaves[1:], 1):
            node = P.Join(node, leaf, selectivity=DEFAULT_JOIN_SELECTIVITY,
                          label=op if i == len(leaves) - 1 else None)
    elif a.shape == "join_aggregate":   # ⋈ → σ(residual) → Γ(slide) → γ: the aggregate at every slide instant
        node = leaves[0]
        for i, leaf in enumerate(leaves[1:], 1):   # a left-deep chain (Spark's joins); the label on the last
            node = P.Join(node, leaf, selectivity=DEFAULT_JOIN_SELECTIVITY,
                          label=join_operator(a) if i == len(leaves) - 1 else None)
        if a.residual:
            node = P.Select(node, DEFAULT_SELECTIVITY ** len(a.residual),
                            predicate=" AND ".join(to_text(p) for p in a.residual))
        node = P.Granularity(node, a.sources[0].window.slide.micros)
        node = P.Aggregate(node, groups=DEFAULT_GROUPS if a.select.group_by or a.select.distinct else 1, label=op)
        if a.select.having is not None:
            node = P.Select(node, DEFAULT_SELECTIVITY, predicate=to_text(a.select.having))
        return P.Project(node, columns=tuple(_output_names(a.select)))
    else:
        node = leaves[0]
    if a.shape == "aggregate":
        w = a.sources[0].window
        node = P.Granularity(node, _granularity(w), label=f"{op}.granularity")
        node = P.Aggregate(node, groups=DEFAULT_GROUPS if a.select.group_by or a.select.distinct else 1,
                           label=op)
        if a.select.having is not None:
            node = P.Select(node, DEFAULT_SELECTIVITY, predicate=to_text(a.select.having))
    if a.shape == "rows_aggregate":   # the WHERE applies to the window's rows, before the aggregate
        if a.residual:
            node = P.Select(node, DEFAULT_SELECTIVITY ** len(a.residual),
                            predicate=" AND ".join(to_text(p) for p in a.residual))
        node = P.Aggregate(node, groups=DEFAULT_GROUPS if a.select.group_by else 1, label=a.operator)
    elif a.residual:
        node = P.Select(node, DEFAULT_SELECTIVITY ** len(a.residual),
                        predicate=" AND ".join(to_text(p) for p in a.residual))
    return P.Project(node, columns=tuple(_output_names(a.select)))


def _output_names(q: A.Select) -> list[str]:
    names = []
    for i, it in enumerate(q.items):
        e = it.expr
        if it.alias:
            names.append(it.alias)
        elif isinstance(e, A.Star):
            names.append((e.table + "." if e.table else "") + "*")
        elif isinstance(e, A.Column):
            names.append(e.name)
        elif isinstance(e, A.Call) and e.is_aggregate:
            arg = e.args[0]
            names.append(_AGG_NAMES[e.name] + (f"_{arg.name}" if isinstance(arg, A.Column) else ""))
        else:
            names.append(f"col{i + 1}")
    return names


def _qos(a: Analysis) -> tuple[dict, dict]:
    from ..policies import QoSRange

    st, qos, options = a.statement, {}, {}
    for item in st.qos:
        if item.target is not None and item.target not in [s.ref for s in a.sources] + [s.name for s in a.sources]:
            raise CQLCompileError(f"the QoS item {item.name} {item.target}", f"{item.target!r} is not a stream of "
                                  "FROM", item)
        if isinstance(item, A.ModeItem):
            a.output_mode = _output_mode(a, item)
        elif isinstance(item, A.ConstraintItem):
            a.constraints.append(_constraint(a, item))
        elif item.name == "WINDOW":
            if a.shape not in ("aggregate", "join"):
                raise CQLCompileError("a WINDOW QoS range", f"this query's window is not adjustable ({a.shape} "
                                      "queries are not yet driven by the control table's window)", item)
            if a.shape == "join" and a.outer:
                raise CQLCompileError("a WINDOW QoS range on an outer join", "its band is fixed when the query is "
                                      "defined (interval_join); the control table adjusts an inner join's window",
                                      item)
            if a.shape == "join" and len({s.window.size.micros for s in a.sources}) > 1:
                raise CQLCompileError("a WINDOW QoS range on a join of different windows", "the join's control "
                                      "sets one window for both inputs; give both streams the same RANGE", item)
            if a.shape == "aggregate" and a.stream != "RSTREAM":
                raise CQLCompileError(f"a WINDOW QoS range with {a.stream}", "the change stream follows "
                                      "granularity changes only; use RSTREAM for an adjustable window", item)
            qos[f"{a.operator}.window"] = QoSRange.window(timedelta(microseconds=item.low.micros),
                                                          timedelta(microseconds=item.high.micros))
        elif item.name == "GRANULARITY":
            if a.shape != "aggregate":
                raise CQLCompileError("a GRANULARITY QoS range", "only windowed aggregates have a granularity", item)
            qos[f"{a.operator}.granularity"] = QoSRange.granularity(timedelta(microseconds=item.low.micros),
                                                                    timedelta(microseconds=item.high.micros))
        elif item.name == "SAMPLE":
            options["sample"] = (item.low, item.high)
        elif item.name in ("PERIOD", "DEADLINE"):
            options[item.name.lower()] = item.low.micros
        else:
            options["weight"] = float(item.low)
    if "deadline" in options and "period" in options and options["deadline"] > options["period"]:
        raise CQLCompileError("DEADLINE longer than PERIOD", "RTStream's periodic queries finish within their "
                              "period (§2: deadline <= period)", st.qos_item("DEADLINE"))
    return qos, options


def _constraint(a: Analysis, item: A.ConstraintItem):
    """The :mod:`pyspark_cq.constraints` constraint of one ``CONSTRAINT`` item of a window join. A two-way join:
    the streams mapped to the join's inputs (FROM order: left, right) and ``UNIQUE`` columns to its key names
    (``cq_k<j>``, as the builder names them). Three or more streams (``multi_join``): the streams mapped to their
    input index, a ``UNIQUE`` column to the stream's key column as FROM names it (the builder renames it).
    """
    from .. import constraints as C

    what = f"CONSTRAINT {item.kind} {item.target}"
    multi = a.shape == "multi_join"
    if a.shape in ("join", "multi_join") and a.outer:
        outer = next(h for h in a.how if h != "inner")
        raise CQLCompileError(what, "stream constraints apply to inner joins (window_join, multi_join); this one "
                              f"has a {outer.upper()} JOIN", item)
    if a.shape != "join" and not multi:
        raise CQLCompileError(what, "stream constraints apply to a two-way join of windowed streams (compiled to "
                              "window_join) or a join of three or more (multi_join; docs/constraints.md); this "
                              f"query is {_shape_words(a.shape)}", item)

    def side(ref: str):
        for i, s in enumerate(a.sources):
            if ref in (s.ref, s.name):
                return i if multi else C.SIDES[i]
        raise CQLCompileError(what, f"{ref!r} is not a stream of FROM", item)

    target = side(item.target)
    source = a.sources[target if multi else C.SIDES.index(target)]
    if item.kind == "UNIQUE":
        cols = []
        for c in item.columns:
            j = [(j, col.name) for j, k in enumerate(a.keys) for ref, col in k
                 if ref == source.ref and col.name.lower() == c.lower()]
            if not j:
                raise CQLCompileError(what, f"{c!r} is not a join-key column of {item.target} (an equality of the "
                                      "WHERE clause): only a unique join key lets the join drop state", item)
            cols.append(j[0][1] if multi else f"cq_k{j[0][0]}")
        return C.unique(target, cols[:1] if multi else cols)   # multi_join: one key column per input
    if item.kind == "MANY_TO_ONE":
        parent = side(item.parent)
        if parent == target:
            raise CQLCompileError(what, "the child and the parent (REFERENCES) must be the two streams", item)
        return C.many_to_one(target, parent, timedelta(microseconds=0 if item.delay is None else item.delay.micros))
    return (C.clustered if item.kind == "CLUSTERED" else C.ordered)(target, item.tolerance)


def _output_mode(a: Analysis, item: A.ModeItem) -> str:
    """The output mode of ``WITH (OUTPUT_MODE …)``: update where Spark 4.3 runs its own stream-stream join in update
    mode (inner joins; tests/test_join_update_mode.py), append everywhere.
    """
    mode = item.mode.lower()
    if mode == "append":
        return mode
    if a.shape not in ("join", "multi_join"):
        raise CQLCompileError("OUTPUT_MODE UPDATE", "update mode applies to joins of windowed streams (window_join, "
                              f"interval_join, multi_join); this query is {_shape_words(a.shape)}: its stream is "
                              "append-only (OUTPUT_MODE APPEND)", item)
    if a.outer:
        raise CQLCompileError("OUTPUT_MODE UPDATE with an outer join", "Spark runs outer stream-stream joins in "
                              f"append mode only (this one has how={a.how}); drop the clause or use inner joins",
                              item)
    return mode


def _shape_words(shape: str) -> str:
    return {"join_aggregate": "an aggregate over a join", "multi_join": "a join of three or more streams"}.get(
        shape, f"a {shape} query")


# ---------------------------------------------------------------------------------------------
# explain


def explain(text, sources: Mapping | None = None, *, name: str = "q", distance: float = 1000.0) -> str:
    """The plan, the chosen operators and the PIPES cost estimates of a query, as text.

    ``sources`` (stream name -> DataFrame, or -> list of column names) resolves unqualified columns; the
    cost estimates assume every source delivers one element every ``distance`` µs (PIPES's d, §3.2.2) and
    use :func:`pyspark_cq.cost.pipes.cost_from_distances` with the PIPES resource manager's default profile.
    """
    columns = None
    if sources is not None:
        columns = {k: (list(v.columns) if hasattr(v, "columns") else list(v)) for k, v in sources.items()}
    a = analyze(text, name, columns)
    return _explain(a, None, distance)


def _function(shape: str) -> str:
    """What a query of ``shape`` runs: the operator implementing it (its descriptor's kind)."""
    if shape == "stream":   # no operator: Spark's own filter and projection
        return "filter/project (stateless)"
    if shape == "join_aggregate":   # two operators in one Spark query (docs/cql.md, "Aggregates over joins")
        return f"{JOIN_AGGREGATE_JOIN} → explode(slide instants) → {for_shape(shape).kind}"
    return for_shape(shape).kind


def _explain(a: Analysis, operators, distance: float = 1000.0) -> str:
    from ..cost import pipes

    lines = [f"query      {to_text(a.written or a.statement)}",
             f"shape      {a.shape}; output {a.stream or 'ISTREAM (implicit: monotone)'} + {AT}",
             f"plan       {P.render(a.plan, micros=True)}"]
    labels = list(dict.fromkeys(n.label for n in P.postorder(a.plan) if n.label))   # a label may name two nodes
    if labels:
        lines.append(f"labels     {', '.join(labels)}")
    if operators:
        for op, fn, args in operators:
            lines.append(f"operator   {op or '-'}: {fn} {args}")
    elif a.shape == "join_aggregate":
        lines.append(f"operator   {join_operator(a)}: {join_aggregate_join(a)}")
        lines.append(f"operator   {a.operator}: {for_shape(a.shape).kind} (tumbling, one window per slide "
                     "instant)")
    elif a.shape == "join" and a.outer:   # an outer two-way join: the interval join with the windows' band
        lines.append(f"operator   {a.operator}: interval_join (how={a.how[0]})")
    else:
        lines.append(f"operator   {a.operator or '-'}: {_function(a.shape)}")
    join = join_types(a)
    if join:
        lines.append(f"join       {join}")
    for alias, sub in a.subqueries.items():   # a FROM subquery's stream: its own shape and operator
        fn = JOIN_AGGREGATE_JOIN if sub.shape == "join" and a.shape != "stream" else _function(sub.shape)
        what = fn if sub.shape == "stream" else f"{sub.operator}: {fn}"
        lines.append(f"subquery   {alias}: {sub.shape}, {what}; plan {P.render(sub.plan, micros=True)}")
        join = join_types(sub)
        if join:
            lines.append(f"join       {alias}: {join}")
    if a.output_mode == OUTPUT_MODE:
        lines.append(f"mode       {OUTPUT_MODE} (the sink's output mode: every CQL query is compiled to an append-only "
                     "stream)")
    else:
        lines.append(f"mode       {a.output_mode} (the sink's output mode: WITH (OUTPUT_MODE UPDATE); the join's rows "
                     "are those of append mode, each written once)")
    for label, rng in a.qos.items():
        lines.append(f"qos        {label}: {rng}")
    for k, v in a.options.items():
        lines.append(f"option     {k}: {v}")
    for c in a.constraints:
        lines.append(f"constraint {c!r}")
    try:
        memory, cpu = pipes.cost_from_distances(a.plan, {s.name: distance for s in a.sources + a.relations},
                                                pipes.CostProfile(element_size=64.0, aggregate_size=64.0))
        lines.append(f"cost       PIPES (§3, d = {_human.duration(distance)} per source, 64-byte elements): memory "
                     f"{_human.size(memory)}, processing {_human.plain(cpu)} per µs")
    except Exception as exc:  # a plan the PIPES model does not cover (e.g. a tuple-based window)
        lines.append(f"cost       PIPES model not applicable: {exc}")
    return "\n".join(lines)
