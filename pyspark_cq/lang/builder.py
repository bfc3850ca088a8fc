"""The Spark stage of the CQL compiler: the DataFrame of an :class:`~pyspark_cq.lang.analysis.Analysis`, built from
pyspark-cq's operators. A windowed GROUP BY becomes :func:`~pyspark_cq.sliding_aggregate`, a join of two windowed
streams :func:`~pyspark_cq.window_join`, of three to six :func:`~pyspark_cq.multi_join`, an aggregate over a join
Spark's interval join followed by :func:`~pyspark_cq.sliding_aggregate` (docs/cql.md, "Aggregates over joins"),
``[ROWS n]`` / ``[PARTITION BY … ROWS n]`` :func:`~pyspark_cq.rows_window`, ``SAMPLE(p)`` the shedding stage.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from .. import _human, _validate
from .. import plan as P
from . import ast as A
from .analysis import (
    _AGG_NAMES,
    AT,
    JOIN_AGGREGATE_JOIN,
    SUB_AT,
    Analysis,
    SourceInfo,
    _aggregates,
    _explain,
    _granularity,
    _output_names,
    _Resolver,
    _rewrite,
    _unqualified,
    analyze,
    join_aggregate_join,
    join_operator,
)
from .errors import CQLCompileError
from .parser import parse
from .printer import expression, to_text

__all__ = ["cql", "compile_cql", "CompiledQuery"]


def aggregate_output_sql(q: A.Select, name_of: Callable, out_name: dict, by: list, grouped: dict):
    """The HAVING condition (or None) and the select list of an aggregate query over its aggregation's output, as
    Spark SQL texts: ``(having, [(text, output name, item), ...])``. Aggregates read their columns
    ``out_name[call]``, grouped expressions ``grouped[expr]``, grouped columns (``by``) themselves; any other
    column is an error.
    """
    def rewrite(e):
        def fn(x):
            if isinstance(x, A.Call) and x.is_aggregate:
                return A.Column(None, out_name[x])
            if not isinstance(x, A.Column) and _unqualified(x) in grouped:
                return A.Column(None, grouped[_unqualified(x)])
            if isinstance(x, A.Column):
                n = name_of(x)
                if n not in by:
                    raise CQLCompileError(f"the column {to_text(x)}", "it is neither grouped (GROUP BY) nor "
                                          "inside an aggregate", x)
                return A.Column(None, n)
            return None
        return _rewrite(e, fn)

    having = None if q.having is None else _sql(rewrite(q.having), lambda c: c.name)
    items = []
    for it, oname in zip(q.items, _output_names(q)):
        if isinstance(it.expr, A.Star):
            raise CQLCompileError("* in an aggregate query", "select the grouped columns and aggregates", it)
        items.append((_sql(rewrite(it.expr), lambda c: c.name), oname, it))
    return having, items


def _aggregate_output(out, q: A.Select, name_of: Callable, out_name: dict, by: list, grouped: dict):
    """An aggregate's output ``out`` filtered by HAVING and projected to the select list, then ``cq_at``
    (:func:`aggregate_output_sql`).
    """
    from pyspark.sql import functions as F

    having, items = aggregate_output_sql(q, name_of, out_name, by, grouped)
    if having is not None:
        out = out.filter(_expr(out, having, "HAVING", q.having))
    cols = [_expr(out, text, to_text(it.expr), it).alias(oname) for text, oname, it in items]
    return out.select(*cols, F.col(AT))


# ---------------------------------------------------------------------------------------------
# building the DataFrame


@dataclass
class CompiledQuery:
    """A compiled CQL query: its analysis (plan, QoS, operators) and the Spark DataFrame."""

    analysis: Analysis
    dataframe: object
    operators: list = field(default_factory=list)  # [(operator id or None, function, arguments)]

    @property
    def plan(self) -> P.Node:
        """The logical plan the policies see."""
        return self.analysis.plan

    @property
    def qos(self) -> dict:
        """QoS ranges by plan label (``"<operator>.<param>"``)."""
        return self.analysis.qos

    @property
    def output_mode(self) -> str:
        """The streaming output mode the sink must use: ``"append"``, or ``"update"`` for a join with
        ``WITH (OUTPUT_MODE UPDATE)`` (its operator is defined in that mode; Spark rejects another at ``start()``).
        """
        return self.analysis.output_mode

    def explain(self) -> str:
        """The text of :func:`explain` for this query."""
        return _explain(self.analysis, self.operators)


def _time_column(df, stream: str, node) -> str:
    from pyspark.sql import types as T

    marked = _validate.watermarked_columns(df)
    if len(marked) == 1:
        return marked[0]
    stamps = [f.name for f in df.schema.fields if isinstance(f.dataType, (T.TimestampType, T.TimestampNTZType))]
    if len(stamps) == 1:
        return stamps[0]
    raise CQLCompileError(f"the stream {stream}", "its timestamp column is ambiguous: set a watermark on it "
                          f"(withWatermark) — timestamp columns: {', '.join(stamps) or 'none'}", node)


def _micros(n: int):
    from pyspark.sql import functions as F

    return F.expr(f"INTERVAL {n} MICROSECONDS")


#: The time column of an aggregate over a join's input: one row per pair and slide instant, 1 µs before the instant
EVAL_TIME = "cq_eval_time"


def join_instants(joined, times, windows, slide: int, delay=None):
    """An aggregate over a join's input (docs/cql.md, "Aggregates over joins"): each joined tuple of ``joined``
    (its inputs' time columns ``times``, their windows ``windows`` in µs) once per slide instant ``e`` at which it
    is in the joined relation (``max(t_i) < e <= min(t_i + w_i)``, on the grid of the windows' ends), with
    :data:`EVAL_TIME` ``e - 1 µs`` (its tumbling window ``[e - s, e)``), carrying the inputs' watermark ``delay``
    (ms) as metadata when given. Also the group's (:mod:`pyspark_cq.group.post`), on a micro-batch's pairs.
    """
    from pyspark.sql import functions as F

    s = slide
    # the slide instants e (on the grid o + s·Z, o = w mod s: the ends of windows [k·s, k·s + w)) at which the
    # tuple is in every window: the first after its latest timestamp to the last at or before its first expiry
    o = windows[0] % s
    start = F.unix_micros(F.greatest(*[F.col(f"`{t}`") for t in times]))
    stop = F.unix_micros(F.least(*[F.col(f"`{t}`") + _micros(w) for t, w in zip(times, windows)]))
    first = start - F.pmod(start - F.lit(o), F.lit(s)) + F.lit(s)
    last = stop - F.pmod(stop - F.lit(o), F.lit(s))
    joined = joined.filter(first <= last).withColumn(
        "cq_instant", F.explode(F.sequence(first, last, F.lit(s).cast("long"))))
    # the instant's row lies in the tumbling window [e - s, e); the column carries the inputs' watermark
    # delay as metadata (Spark forbids a second withWatermark after a join): a pair comes out of the join
    # in the micro-batch its later row arrives, after every instant the aggregate has closed
    eval_time = F.timestamp_micros(F.col("cq_instant") - 1)
    eval_time = (eval_time.alias(EVAL_TIME, metadata={"spark.watermarkDelayMs": delay}) if delay is not None
                 else eval_time.alias(EVAL_TIME))
    # select, not withColumn: Spark Connect's withColumn drops the metadata
    return joined.select("*", eval_time).drop("cq_instant")


def _watermark_delay(ldf, lt: str, rdf, rt: str, node):
    """The watermark delay (ms) the aggregate after a join tags its time column with: None when neither input is
    streaming, else the larger of the inputs' delays (Spark computes the watermark itself; the tag marks the
    column as event time).
    """
    return _watermark_delays([(ldf, lt), (rdf, rt)], node)


def _watermark_delays(inputs, node):
    """:func:`_watermark_delay` of any number of ``(df, time column)`` inputs."""
    delays = []
    for df, t in inputs:
        if df.isStreaming:
            md = df.schema[t].metadata or {}
            if "spark.watermarkDelayMs" not in md:
                raise CQLCompileError(f"the stream {t.split('__')[0]}", "an aggregate over a join of streams "
                                      f"needs a watermark on its time column {t.split('__', 1)[1]} (withWatermark)",
                                      node)
            delays.append(int(md["spark.watermarkDelayMs"]))
    return max(delays) if delays else None


def _sql(e: A.Expr, name: Callable) -> str:
    return expression(e, lambda c: "`" + name(c).replace("`", "``") + "`")


def sample_condition(df, percent: float):
    """Whether a row of ``df`` is in its sample of ``percent`` % (§2.1's SAMPLE): a hash of the row's values
    decides, so a restart from a checkpoint keeps the same rows (as the joins' shedding does). It names every
    column, the time column too: Spark keeps it above the stream's ``withWatermark``.
    """
    from pyspark.sql import functions as F

    h = F.pmod(F.xxhash64(*[F.col(f"`{c}`") for c in df.columns], F.lit("cq_sample")), F.lit(1_000_000))
    return h < F.lit(int(round(percent * 10_000)))


def _sample(df, percent: float):
    """Keep a row with probability ``percent``/100 (:func:`sample_condition`)."""
    return df.filter(sample_condition(df, percent))


def _expr(df, text: str, what: str, node):
    from pyspark.sql import functions as F

    try:
        col = F.expr(text)
        _ = df.select(col).schema  # analyse now: errors name the CQL construct and position
        return col
    except CQLCompileError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CQLCompileError(what, f"Spark rejects it: {first}", node) from None


def compile_cql(spark, text, sources: Mapping, *, name: str = "q", control: Callable | None = None,
                state: Mapping | None = None) -> CompiledQuery:
    """Compile a CQL query over ``sources`` to a :class:`CompiledQuery` (plan, QoS, DataFrame).

    Parameters
    ----------
    spark : SparkSession
    text : str or Statement
    sources : mapping str -> DataFrame
        The streams by the names the query uses (streaming DataFrames; batch ones run as one batch).
    name : str
        Query name; the stateful operator's id is derived from it.
    control : callable, optional
        ``control(operator_id, **initial_params) -> ControlHandle`` (the runtime's ``ctx.control``): the
        stateful operator then reads its control-table entry at every micro-batch.
    state : mapping, optional
        Keyword arguments of a join of three or more streams' :func:`~pyspark_cq.multi_join` for its state
        (``state_persistence``, ``snapshot_every``, ``state_dir``); a query group runs such a query with its state
        in files (docs/groups.md). Other queries ignore it.
    """
    if not (hasattr(spark, "readStream") and hasattr(spark, "createDataFrame")):
        raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
    if not isinstance(sources, Mapping):
        raise TypeError(f"sources must be a mapping {{stream name: DataFrame}}, got {type(sources).__name__}")
    for k, v in sources.items():
        if not isinstance(k, str) or not hasattr(v, "schema") or not hasattr(v, "isStreaming"):
            raise TypeError(f"sources must map stream names (str) to DataFrames, got {k!r}: {type(v).__name__}")
    statement = parse(text) if isinstance(text, str) else text
    lookup = dict(sources)
    for s in statement.query.sources:
        if isinstance(s, A.StreamRef) and s.name not in lookup:
            found = [k for k in sources if k.lower() == s.name.lower()]
            if len(found) == 1:
                lookup[s.name] = sources[found[0]]
    from pyspark.sql import functions as F

    a = analyze(statement, name, {k: v.columns for k, v in lookup.items()},
                streams=[k for k, v in lookup.items() if v.isStreaming])
    for alias, sub in a.subqueries.items():   # each FROM subquery is compiled to a stream first
        if alias in lookup:
            raise CQLCompileError(f"the subquery {alias}", "its alias is also a source's name; rename one",
                                  sub.statement)
        built = _Builder(spark, sub, lookup, None, feeds_state=a.shape != "stream").build().dataframe
        lookup[alias] = built.select(*[F.col(f"`{c}`") for c in built.columns if c != AT], F.col(AT).alias(SUB_AT))
    if state is not None and not isinstance(state, Mapping):
        raise TypeError(f"state must be None or a mapping of multi_join's state arguments, got {type(state).__name__}")
    return _Builder(spark, a, lookup, control, state=state).build()


def cql(spark, text, sources):
    """Compile a CQL query (docs/cql.md) over ``sources`` into a DataFrame built from pyspark-cq's operators.

    Parameters
    ----------
    spark : SparkSession
    text : str
        The query, e.g. ``"ISTREAM(SELECT * FROM clicks [RANGE 1 MINUTE] WHERE page = 'home')"``.
    sources : mapping str -> DataFrame
        The streams by name. A stream's timestamp is its watermarked column, else its only timestamp column;
        stateful queries need a watermark on it (``withWatermark``).

    Returns
    -------
    DataFrame
        The output stream (write it with ``outputMode("append")``): the select list, then ``cq_at``, the CQL
        timestamp of each tuple.

    Raises
    ------
    CQLSyntaxError
        The text does not parse (line:column, offending text, what was expected).
    CQLCompileError
        The query parses but cannot be compiled (the construct, where and why).
    """
    return compile_cql(spark, text, sources).dataframe


class _Builder:
    def __init__(self, spark, a: Analysis, sources: Mapping, control, *, feeds_state: bool = False,
                 state: Mapping | None = None):
        self.spark, self.a, self.sources, self.control = spark, a, sources, control
        self.state = dict(state or {})   # multi_join's state arguments (compile_cql's state=)
        # a FROM subquery whose stream a stateful outer query reads: its join is Spark's (see _spark_window_join)
        self.feeds_state = feeds_state
        self.operators: list = []
        every = a.sources + a.relations
        self.res = _Resolver(every, {s.ref: sources[s.name].columns for s in every})
        self.rel_refs = {r.ref for r in a.relations}
        self.prefix = ""   # of the columns the aggregate computes (a query group makes them unique per query)

    def name(self, c: A.Column) -> str:
        """The column's name in the single-stream pipeline (relation columns: ``<ref>__<col>``)."""
        ref = self.res.owner(c)
        col = self.res.column_name(ref, c)
        return f"{ref}__{col}" if ref in self.rel_refs else col

    def with_relations(self, df, s: SourceInfo):
        """The stream joined with the stored relations on their equality keys (Spark's stream-static join)."""
        from pyspark.sql import functions as F

        for r in self.a.relations:
            rel = self.sources[r.name]
            if rel.isStreaming:
                raise CQLCompileError(f"the relation {r.ref}", "a FROM item without a window is a stored "
                                      "relation and needs a batch DataFrame; give a stream a window", r.node)
            rel = rel.select(*[F.col(f"`{c}`").alias(f"{r.ref}__{c}") for c in rel.columns])
            cond = None
            for (_, sc), (rr, rc) in self.a.relation_keys:
                if rr != r.ref:
                    continue
                other = f"`{r.ref}__{self.res.column_name(rr, rc)}`"
                term = F.col(f"`{self.res.column_name(s.ref, sc)}`") == rel[other]
                cond = term if cond is None else cond & term
            df = df.join(rel, cond, "inner")
            self.operators.append((None, "join with a stored relation (Spark)", {"relation": r.ref}))
        return df

    def handle(self, **params):
        if self.control is None:
            return None
        return self.control(self.a.operator, **params)

    def source(self, s: SourceInfo, pushed: bool = True):
        """The stream with its SAMPLE and (when ``pushed``) its own predicates applied; its time column."""
        df = self.sources[s.name]
        time = s.time or _time_column(df, s.name, s.node)
        if s.node.sample is not None and not (self.a.shape == "join" and self._shared_sample()):
            df = _sample(df, s.node.sample)
            self.operators.append((None, "sample (hash filter)", {"stream": s.ref, "percent": s.node.sample}))
        df = self.with_relations(df, s)
        for cond in self.predicates(df, s, pushed):
            df = df.filter(cond)
        return df, time

    def predicates(self, df, s: SourceInfo, pushed: bool = True) -> list:
        """The Spark conditions of ``s``'s window predicate and (when ``pushed``) its own WHERE conjuncts,
        analysed against ``df``.
        """
        preds = ([s.window.where] if s.window is not None and s.window.where is not None else [])
        preds += s.filters if pushed else []
        name = self.name if self.a.shape not in ("join", "multi_join") else (
            lambda c: self.res.column_name(s.ref, c))
        return [_expr(df, _sql(p, name), "the predicate " + to_text(p), p) for p in preds]

    def _shared_sample(self) -> bool:
        samples = {s.node.sample for s in self.a.sources}
        return len(samples) == 1 and None not in samples

    def build(self) -> CompiledQuery:
        try:
            out = getattr(self, "_" + self.a.shape)()
        except CQLCompileError:
            raise
        except (TypeError, ValueError) as exc:  # an operator's own argument check, e.g. SUM of a string
            raise CQLCompileError(f"the {self.a.shape} of this query", str(exc), self.a.statement) from exc
        return CompiledQuery(self.a, out, self.operators)

    # -- one stream, no state ---------------------------------------------------------------------
    def _stream(self):
        from pyspark.sql import functions as F

        s = self.a.sources[0]
        df, time = self.source(s)
        df = self._filter(df, self.a.residual, self.name)
        at = F.col(f"`{time}`")
        w = s.window
        if self.a.stream == "DSTREAM":  # RANGE d: a tuple leaves the window d after its timestamp
            at = at + F.expr(f"INTERVAL {w.size.micros} MICROSECONDS")
        # select, not withColumn: Spark Connect's withColumn drops the time column's watermark metadata,
        # which a FROM subquery's stream needs
        return self._project(df.select("*", at.alias(AT)), self.name, s.ref)

    # -- ROWS windows -----------------------------------------------------------------------------
    def _rows(self):
        from pyspark.sql import functions as F

        from ..operators.rows_window import AT as ROWS_AT
        from ..operators.rows_window import SIGN, rows_window

        s = self.a.sources[0]
        df, time = self.source(s)
        w = s.window
        parts = [self.res.column_name(s.ref, c) for c in w.partition_by]
        for c, p in zip(w.partition_by, parts):
            if p is None or (c.table and c.table != s.ref and c.table != s.name):
                raise CQLCompileError(f"PARTITION BY {to_text(c)}", f"not a column of {s.name}", c)
        out = rows_window(df, time, w.size, parts, name=self.a.operator)
        self.operators.append((self.a.operator, "rows_window", {"rows": w.size, "partition_by": parts}))
        sign = 1 if self.a.stream == "ISTREAM" else -1
        out = out.filter(F.col(SIGN) == sign).drop(SIGN).withColumnRenamed(ROWS_AT, AT)
        out = self._filter(out, self.a.residual, self.name)
        return self._project(out, self.name, s.ref)

    # -- aggregates over ROWS windows --------------------------------------------------------------
    def _rows_aggregate(self):
        from ..operators.rows_window import rows_aggregate

        a, q = self.a, self.a.select
        df, time, parts, specs, out_name, where = self.rows_aggregate_inputs()
        s = a.sources[0]
        out = rows_aggregate(df, time, s.window.size, specs, parts, where=where, emit=a.stream.lower(),
                             name=a.operator)
        self.operators.append((a.operator, "rows_aggregate", {"rows": s.window.size, "partition_by": parts,
                                                              "aggs": specs, "emit": a.stream.lower()}))
        return _aggregate_output(out, q, self.name, out_name, parts, {})

    def rows_aggregate_inputs(self):
        """An aggregate over a ROWS window's input: ``(df, time, partition_by, aggs, out_name, where)`` for
        :func:`~pyspark_cq.rows_aggregate` (each computed argument a column ``cq_argN``, each aggregate's output
        ``out_name[call]``, the WHERE applied after the window as ``where``).
        """
        a, q = self.a, self.a.select
        s = a.sources[0]
        df, time = self.source(s)
        name_of = self.name
        parts = [self.res.column_name(s.ref, c) for c in s.window.partition_by]
        specs, out_name = [], {}
        calls = [c for it in q.items for c in _aggregates(it.expr)]
        for call in calls:
            if call in out_name:
                continue
            arg, fn = call.args[0], _AGG_NAMES[call.name]
            col = None
            if isinstance(arg, A.Column):
                self.res.owner(arg)
                col = name_of(arg)
            elif not isinstance(arg, A.Star):
                col = f"cq_arg{len(specs) + 1}"
                df = df.withColumn(col, _expr(df, _sql(arg, name_of), f"the argument of {to_text(call)}", arg))
            out_name[call] = f"cq_a{len(specs) + 1}"
            specs.append((out_name[call], col, fn))
        where = None
        if a.residual:   # after the window: which of the window's rows the aggregates see
            where = _expr(df, " AND ".join(f"({_sql(p, name_of)})" for p in a.residual), "WHERE", a.residual[0])
        return df, time, parts, specs, out_name, where

    # -- windowed aggregates ----------------------------------------------------------------------
    def aggregate_inputs(self, df, name_of=None):
        """The windowed GROUP BY's input ``df`` with its computed columns (GROUP BY expressions, aggregate
        arguments), the grouping columns, the ``aggs`` of :func:`~pyspark_cq.sliding_aggregate`, the operator's
        output column of each aggregate call and of each grouped expression, and the computed columns as
        ``(name, Column)`` pairs (names start with :attr:`prefix`). ``name_of``: a column's name in ``df``
        (default :meth:`name`; an aggregate over a join names the joined columns its own way). Shared with
        :class:`pyspark_cq.QueryGroup`, which feeds many such queries from one projection.
        """
        from pyspark.sql import functions as F

        q = self.a.select
        name_of = name_of or self.name
        computed = []   # (name, Column): the columns added to df
        #: the same as Spark SQL texts ``(name, text)``: a query group recomputes them on a micro-batch's rows
        self.computed_sql = []

        # SELECT DISTINCT without aggregates is a GROUP BY of the select list; without aggregates a constant
        # one (MAX(1)) is computed, whose value changes only when a group appears or leaves, so ISTREAM /
        # DSTREAM emit exactly the rows entering / leaving the distinct set
        distinct_only = q.distinct and not q.group_by and not any(_aggregates(i.expr) for i in q.items)
        group_by = tuple(i.expr for i in q.items) if distinct_only else q.group_by
        by, grouped = [], {}
        for i, g in enumerate(group_by):
            if isinstance(g, A.Column):
                self.res.owner(g)
                col = name_of(g)
            else:   # GROUP BY an expression: computed as a column before the aggregation
                col = f"{self.prefix}cq_g{i + 1}"
                computed.append((col, _expr(df, _sql(g, name_of), f"GROUP BY {to_text(g)}", g)))
                self.computed_sql.append((col, _sql(g, name_of)))
                df = df.withColumn(*computed[-1])
            grouped[_unqualified(g)] = col
            if col not in by:
                by.append(col)
        aggs: dict = {}
        out_name: dict = {}
        extra = 0
        calls = [c for it in q.items for c in _aggregates(it.expr)] + (_aggregates(q.having) if q.having else [])
        if not calls:   # DISTINCT, or GROUP BY without aggregates (SQL's other spelling of it)
            computed.append((f"{self.prefix}cq_one", F.lit(1)))
            self.computed_sql.append((computed[-1][0], "1"))
            df = df.withColumn(*computed[-1])
            aggs[computed[-1][0]] = ["max"]
        for call in calls:
            if call in out_name:
                continue
            arg = call.args[0]
            fn = _AGG_NAMES[call.name]
            if isinstance(arg, A.Star):
                aggs.setdefault("*", ["count"])
                out_name[call] = "count"
                continue
            if isinstance(arg, A.Column):
                self.res.owner(arg)
                col = name_of(arg)
            else:
                extra += 1
                col = f"{self.prefix}cq_arg{extra}"
                computed.append((col, _expr(df, _sql(arg, name_of), f"the argument of {to_text(call)}", arg)))
                self.computed_sql.append((col, _sql(arg, name_of)))
                df = df.withColumn(*computed[-1])
            if fn not in aggs.setdefault(col, []):
                aggs[col].append(fn)
            out_name[call] = f"{fn}_{col}"
        return df, by, aggs, out_name, grouped, computed

    def _aggregate(self):
        from pyspark.sql import functions as F

        from ..operators.aggregate import sliding_aggregate

        a, q = self.a, self.a.select
        s = a.sources[0]
        df, time = self.source(s)
        df, by, aggs, out_name, grouped, _ = self.aggregate_inputs(df)
        name_of = self.name
        w = s.window
        window, slide = timedelta(microseconds=w.size.micros), timedelta(microseconds=w.slide.micros)
        # ISTREAM / DSTREAM: the slide divides the range (analysis), so this is the slide; RSTREAM's slide need not
        gran = timedelta(microseconds=_granularity(w))
        emit = "windows" if a.stream == "RSTREAM" else "changes"
        params = {"window": window, "granularity": gran} if emit == "windows" else {"granularity": gran}
        handle = self.handle(**params)
        out = sliding_aggregate(df, time, window, slide, by=by, aggs=aggs,
                                granularity=gran, emit=emit, control=handle, name=a.operator)
        self.operators.append((a.operator, "sliding_aggregate", {"window": _human.duration(w.size.micros),
                                                                  "slide": _human.duration(w.slide.micros),
                                                                  "by": by, "aggs": aggs, "emit": emit}))
        start, end = out.columns[0], out.columns[1]
        g = F.expr(f"INTERVAL {w.slide.micros} MICROSECONDS")
        at = {"RSTREAM": F.col(end), "ISTREAM": F.col(start) + g, "DSTREAM": F.col(end) + g}[a.stream]
        out = out.withColumn(AT, at)
        return _aggregate_output(out, q, name_of, out_name, by, grouped)

    # -- joins ------------------------------------------------------------------------------------
    def _prefixed(self, s: SourceInfo, keymap: dict):
        """The stream with every column renamed ``<ref>__<col>`` (join keys: a shared ``cq_k<j>``)."""
        from pyspark.sql import functions as F

        df, time = self.source(s)
        cols = []
        for c in df.columns:
            new = keymap.get((s.ref, c), f"{s.ref}__{c}")
            cols.append(F.col(f"`{c}`").alias(new))
        return df.select(*cols), f"{s.ref}__{time}"

    def _join_names(self, keymap):
        def name(c):
            ref = self.res.owner(c)
            col = self.res.column_name(ref, c)
            return keymap.get((ref, col), f"{ref}__{col}")
        return name

    def _join_inputs(self):
        """The two-way join's inputs: the key map (``(source, column)`` -> ``cq_k<j>``, one name per equality),
        the key names, and each input prefixed (:meth:`_prefixed`) with its time column.
        """
        a = self.a
        keymap, on = {}, []
        for j, ((r1, c1), (r2, c2)) in enumerate(a.keys):
            k = f"cq_k{j}"
            keymap[(r1, self.res.column_name(r1, c1))] = k
            keymap[(r2, self.res.column_name(r2, c2))] = k
            on.append(k)
        if len(keymap) != 2 * len(on):
            raise CQLCompileError("a join key used twice", "each column may appear in one equality", a.select)
        left, right = a.sources
        return keymap, on, self._prefixed(left, keymap), self._prefixed(right, keymap)

    def _join(self):
        from pyspark.sql import functions as F

        from ..operators.join import window_join

        a = self.a
        left, right = a.sources
        if self.feeds_state and a.outer:
            raise CQLCompileError(f"a {a.how[0].upper()} JOIN in a subquery that a stateful query reads", "that "
                                  "join is Spark's own inner interval join (two pyspark-cq stateful operators cannot "
                                  "share a query); run the outer join as its own query and read its sink",
                                  a.statement)
        if a.outer:
            return self._outer_join()
        if self.feeds_state:
            if a.constraints:
                raise CQLCompileError("CONSTRAINT in a join that a subquery feeds to a stateful query", "that join "
                                      "is Spark's own (two pyspark-cq stateful operators cannot share a query), "
                                      "which takes no constraints", a.statement.qos_item("CONSTRAINT"))
            return self._join_feeding_state()
        keymap, on, (ldf, lt), (rdf, rt) = self._join_inputs()
        wl, wr = (timedelta(microseconds=s.window.size.micros) for s in (left, right))
        drop = 1.0 - left.node.sample / 100.0 if self._shared_sample() else 0.0
        params = {"window": wl} if wl == wr else {}
        if drop:
            params["drop_ratio"] = drop
        handle = self.handle(**params) if params else None
        out = window_join(ldf, rdf, on, lt, rt, wl, wr, control=handle, name=a.operator, drop_ratio=drop,
                          constraints=a.constraints or None, output_mode=a.output_mode)
        self.operators.append((a.operator, "window_join", {"on": [f"{to_text(k[0][1])} = {to_text(k[1][1])}"
                                                                  for k in a.keys],
                                                           "windows": [_human.duration(s.window.size.micros)
                                                                       for s in (left, right)],
                                                           "drop_ratio": drop,
                                                           **({"constraints": [repr(c) for c in a.constraints]}
                                                              if a.constraints else {})}))
        at = "valid_from" if a.stream == "ISTREAM" else "valid_to"
        out = out.withColumn(AT, F.col(at))
        return self._joined(out, keymap)

    def _outer_join(self):
        """``A [RANGE a] LEFT | RIGHT | FULL JOIN B [RANGE b] ON …`` (docs/cql.md, *Joins*): ``interval_join`` with
        the window join's band (validities ``[t, t + w)`` intersect: ``t_B - t_A`` in ``(-b, a)``) and ``how``; both
        key columns kept (the null-padded side's are null). ``cq_at``: ISTREAM the later of the row times present
        (a pair's entry into the join, an unmatched row's own time), DSTREAM the first expiry among them.
        """
        from pyspark.sql import functions as F

        from ..operators.join import interval_join

        a = self.a
        left, right = a.sources
        (ldf, lt), (rdf, rt) = self._prefixed(left, {}), self._prefixed(right, {})
        lon = [f"{r}__{self.res.column_name(r, c)}" for (r, c), _ in a.keys]
        ron = [f"{r}__{self.res.column_name(r, c)}" for _, (r, c) in a.keys]
        wl, wr = left.window.size.micros, right.window.size.micros
        drop = 1.0 - left.node.sample / 100.0 if self._shared_sample() else 0.0
        handle = self.handle(drop_ratio=drop) if drop else None
        lower, upper = timedelta(microseconds=-wr + 1), timedelta(microseconds=wl - 1)
        out = interval_join(ldf, rdf, left_on=lon, right_on=ron, left_time=lt, right_time=rt, lower=lower,
                            upper=upper, how=a.how[0], control=handle, name=a.operator, drop_ratio=drop,
                            output_mode=a.output_mode)
        self.operators.append((a.operator, "interval_join", {
            "how": a.how[0], "left_on": lon, "right_on": ron,
            "band": f"{rt} - {lt} in ({_human.duration(-wr)}, {_human.duration(wl)})", "drop_ratio": drop}))
        if a.stream == "ISTREAM":   # greatest / least skip the null time of a padded side
            at = F.greatest(F.col(f"`{lt}`"), F.col(f"`{rt}`"))
        else:
            at = F.least(F.col(f"`{lt}`") + _micros(wl), F.col(f"`{rt}`") + _micros(wr))
        return self._joined(out.withColumn(AT, at), {})

    def _spark_window_join(self):
        """Spark's stream-stream join of the two windowed inputs (the pairs whose validities intersect, as
        ``window_join``'s): the joined DataFrame, the key map, the two time columns and the watermark delay (ms).
        Used where a pyspark-cq operator follows the join: Spark refuses two ``applyInPandasWithState`` in a query.
        """
        from pyspark.sql import functions as F

        a = self.a
        left, right = a.sources
        keymap, on, (ldf, lt), (rdf, rt) = self._join_inputs()
        delay = _watermark_delay(ldf, lt, rdf, rt, a.statement)
        rdf = rdf.select(*[F.col(c).alias(c + "__r") if c in on else F.col(f"`{c}`") for c in rdf.columns])
        wl, wr = left.window.size.micros, right.window.size.micros
        # validities [tl, tl + wl) and [tr, tr + wr) intersect: Spark's time-interval join condition
        cond = ((F.col(f"`{rt}`") > F.col(f"`{lt}`") - _micros(wr))
                & (F.col(f"`{rt}`") < F.col(f"`{lt}`") + _micros(wl)))
        for k in on:
            cond = cond & (ldf[k] == rdf[k + "__r"])
        joined = ldf.join(rdf, cond, "inner").drop(*[k + "__r" for k in on])
        self.operators.append((join_operator(a) or a.operator, JOIN_AGGREGATE_JOIN, {
            "on": [f"{to_text(k[0][1])} = {to_text(k[1][1])}" for k in a.keys],
            "windows": [_human.duration(wl), _human.duration(wr)]}))
        return joined, keymap, (lt, rt), delay

    def _spark_chain_join(self):
        """Spark's left-deep chain of inner stream-stream joins of three to six windowed inputs, in FROM order: join
        j on the shared key and, for every earlier input i, the band of the two windows (validities ``[t_i, t_i +
        w_i)`` and ``[t_j, t_j + w_j)`` intersect; pairwise is all together, for intervals). The joined DataFrame
        (columns ``<ref>__<col>``), the time columns and the watermark delay (ms). Spark's chain takes one
        event-time column per stream (it evicts each join's left state through it), so the later inputs' time
        columns lose their watermark tag once joined: every join's band includes one to the first input, whose
        time keeps it.
        """
        from pyspark.sql import functions as F

        a = self.a
        key_cols = {}
        for (r1, c1), (r2, c2) in a.keys:
            key_cols[r1] = self.res.column_name(r1, c1)
            key_cols[r2] = self.res.column_name(r2, c2)
        inputs = [self._prefixed(s, {}) for s in a.sources]
        times = [t for _, t in inputs]
        on = [f"{s.ref}__{key_cols[s.ref]}" for s in a.sources]
        delay = _watermark_delays(inputs, a.statement)
        ws = [s.window.size.micros for s in a.sources]
        joined = inputs[0][0]
        for j in range(1, len(inputs)):
            tj = F.col(f"`{times[j]}`")
            cond = F.col(f"`{on[0]}`") == F.col(f"`{on[j]}`")
            for i in range(j):
                ti = F.col(f"`{times[i]}`")
                cond = cond & (tj > ti - _micros(ws[j])) & (tj < ti + _micros(ws[i]))
            joined = joined.join(inputs[j][0], cond, "inner")
            if joined.isStreaming:   # one event-time column per stream: the first input's keeps its watermark
                joined = joined.select(*[F.col(f"`{c}`").alias(c, metadata={}) if c in times[1:] else F.col(f"`{c}`")
                                         for c in joined.columns])
        self.operators.append((join_operator(a), join_aggregate_join(a), {
            "on": on, "windows": [_human.duration(w) for w in ws]}))
        return joined, times, delay

    def _join_aggregate(self):
        """RSTREAM, ISTREAM or DSTREAM of an aggregate over a join of two to six streams (docs/cql.md, "Aggregates
        over joins"): Spark's stream-stream join (its chain of joins for three or more) with the windows' time bands,
        each joined tuple copied to the slide instants ``e`` at which it is in the joined relation (``max(t_i) < e
        <= min(t_i + w_i)``), then a tumbling ``sliding_aggregate`` of width ``s`` whose window ``[e - s, e)`` holds
        exactly the tuples of instant ``e``.
        """
        from pyspark.sql import functions as F

        from ..operators.aggregate import sliding_aggregate

        a, q = self.a, self.a.select
        if len(a.sources) == 2:
            joined, keymap, times, delay = self._spark_window_join()
        else:
            (joined, times, delay), keymap = self._spark_chain_join(), {}
        ws = [src.window.size.micros for src in a.sources]
        s = a.sources[0].window.slide.micros
        joined = self._filter(joined, a.residual, self._join_names(keymap))
        df = join_instants(joined, times, ws, s, delay)
        name_of = self._join_names(keymap)
        df, by, aggs, out_name, grouped, _ = self.aggregate_inputs(df, name_of)
        step = timedelta(microseconds=s)
        # ISTREAM / DSTREAM: the PIPES change stream of the same tumbling windows, one granule per instant: an
        # interval [r0, r1) of equal values holds the instants r0 + s .. r1, so its values enter at r0 + s and leave
        # at r1 + s (an instant without pairs ends the interval, as a group absent from the relation)
        emit = "windows" if a.stream == "RSTREAM" else "changes"
        out = sliding_aggregate(df, EVAL_TIME, step, step, by=by, aggs=aggs, granularity=step, emit=emit,
                                name=a.operator)
        self.operators.append((a.operator, "sliding_aggregate", {"window": _human.duration(s),
                                                                  "slide": _human.duration(s), "by": by,
                                                                  "aggs": aggs, "emit": emit}))
        start, end, g = out.columns[0], out.columns[1], _micros(s)
        out = out.withColumn(AT, {"RSTREAM": F.col(end), "ISTREAM": F.col(start) + g, "DSTREAM": F.col(end) + g}[
            a.stream])
        return _aggregate_output(out, q, name_of, out_name, by, grouped)

    def _join_feeding_state(self):
        """A FROM subquery's window join read by a stateful outer query (docs/cql.md, "Subqueries in FROM"):
        Spark's join, ``cq_at`` as ``window_join`` gives it, tagged with the inputs' watermark delay so the outer
        operator reads it as event time (Spark forbids a second ``withWatermark`` after a join).
        """
        from pyspark.sql import functions as F

        a = self.a
        left, right = a.sources
        joined, keymap, (lt, rt), delay = self._spark_window_join()
        if a.stream == "ISTREAM":   # the pair enters the join at its later timestamp
            at = F.greatest(F.col(f"`{lt}`"), F.col(f"`{rt}`"))
        else:                       # it leaves when its first tuple leaves its window
            at = F.least(F.col(f"`{lt}`") + _micros(left.window.size.micros),
                         F.col(f"`{rt}`") + _micros(right.window.size.micros))
        if delay is not None:
            at = at.alias(AT, metadata={"spark.watermarkDelayMs": delay})
        return self._joined(joined.withColumn(AT, at), keymap)

    def _multi_join(self):
        from pyspark.sql import functions as F

        from ..operators.multi_join import multi_join

        a = self.a
        refs = [s.ref for s in a.sources]
        key_cols = {}
        for (r1, c1), (r2, c2) in a.keys:
            key_cols[r1] = self.res.column_name(r1, c1)
            key_cols[r2] = self.res.column_name(r2, c2)
        inputs, times, on = [], [], []
        for s in a.sources:
            df, t = self._prefixed(s, {})
            inputs.append(df)
            times.append(t)
            on.append(f"{s.ref}__{key_cols[s.ref]}")
        ws = [s.window.size.micros for s in a.sources]
        # windows [t_i, t_i + w_i) intersect pairwise (so all together) iff t_j - t_i in (-w_j, w_i)
        bounds = [(i, j, timedelta(microseconds=-ws[j] + 1), timedelta(microseconds=ws[i] - 1))
                  for i in range(len(refs)) for j in range(i + 1, len(refs))]
        # a UNIQUE constraint names the stream's key column as FROM does: here it is on[i]
        constraints = [dataclasses.replace(c, cols=(on[c.side],)) if c.kind == "unique" else c
                       for c in a.constraints]
        how = list(a.how) if a.outer else None   # per input after the first, as cq.multi_join(how=) takes it
        out = multi_join(inputs, on, times, bounds, how=how, name=a.operator, output_mode=a.output_mode,
                         constraints=constraints or None, **self.state)
        self.operators.append((a.operator, "multi_join", {"on": on, "windows": [_human.duration(w) for w in ws],
                                                          **({"how": how} if how else {}),
                                                          **({"constraints": [repr(c) for c in constraints]}
                                                             if constraints else {})}))
        if a.stream == "ISTREAM":
            at = F.greatest(*[F.col(t) for t in times])
        else:
            at = F.least(*[F.col(t) + F.expr(f"INTERVAL {w} MICROSECONDS") for t, w in zip(times, ws)])
        return self._joined(out.withColumn(AT, at), {})

    def _joined(self, out, keymap):
        name = self._join_names(keymap)
        out = self._filter(out, self.a.residual, name)
        return self._project(out, name, None)

    # -- shared -----------------------------------------------------------------------------------
    def _filter(self, df, preds, name):
        for p in preds:
            df = df.filter(_expr(df, _sql(p, name), "the predicate " + to_text(p), p))
        return df

    def _project(self, df, name, single_ref=None):
        from pyspark.sql import functions as F

        q = self.a.select
        cols, seen = [], set()
        for it, oname in zip(q.items, _output_names(q)):
            e = it.expr
            if isinstance(e, A.Star):
                every = self.a.sources + self.a.relations
                for s in every:
                    if e.table is not None and e.table not in (s.ref, s.name):
                        continue
                    for c in self.sources[s.name].columns:
                        cols.append((F.col(f"`{name(A.Column(s.ref, c))}`").alias(c), c))
                if e.table is not None and not any(e.table in (s.ref, s.name) for s in every):
                    raise CQLCompileError(f"{e.table}.*", f"{e.table!r} is not a stream of FROM", e)
                continue
            cols.append((_expr(df, _sql(e, name), to_text(e), it).alias(oname), oname))
        for _, n in cols:
            if n in seen or n == AT:
                raise CQLCompileError(f"the output column {n}", "two output columns have this name (or it is the "
                                      f"reserved {AT}); give them aliases (AS …)", q)
            seen.add(n)
        return df.select(*[c for c, _ in cols], F.col(AT))


