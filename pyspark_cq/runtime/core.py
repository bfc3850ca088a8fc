"""``CQRuntime``: registers continuous queries, starts and watches them, runs the policies.

The runtime is the one place that ties operators, statistics, policies and the control table together
(docs/architecture.md)::

    query progress ──► listener ──► StatisticsStore ──► Snapshot ──► policies ──► Decisions
                                                                                     │
    operators (next micro-batch) ◄── control table (versioned JSON, change log) ◄────┘

A ``StreamingQueryListener`` hands every ``StreamingQueryProgress`` of a registered query to a monitor
thread (the listener itself only enqueues, so Spark's listener bus is never blocked); the thread updates
the statistics and runs a policy round every ``every_batches`` micro-batches and/or ``every_seconds``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import queue as _queue
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import plan as P
from ..control import ControlHandle, ControlTable
from ..policies import registry
from ..policies.base import Policy
from ..policies.decisions import Admission, QoSRange, duration_value, parse_size, validate_operator_id
from ..policies.snapshot import Instance, QueryInfo, Snapshot, parse_label, periodic_spec
from . import pools
from .loop import PolicyLoop
from .stats import StatisticsStore

__all__ = ["CQRuntime", "QueryRejected", "QueryContext"]

_log = logging.getLogger("pyspark_cq.runtime")


def _estimated(members: list, loads) -> list:
    """The group members (:class:`~pyspark_cq.cost.groups.MemberLoad` / ``JoinLoad``) whose streams all have a
    load: the others are admitted unestimated.
    """
    return [m for m in members if all(s in loads for s in m.streams)]


def _failure(name: str, exc) -> str:
    """``query <name> failed: <why>``, with a pyspark-cq worker error's sentence before Spark's report."""
    from .._errors import explain_error

    why = explain_error(exc)
    return f"query {name!r} failed: {why}\n\n{exc}" if why else f"query {name!r} failed: {exc}"


def _spark_side(query) -> str:
    """What Spark says of ``query``: its status and its last batch (for a timeout's message)."""
    if query is None:
        return "not started"
    try:
        last = query.lastProgress
        return (f"Spark: status {dict(query.status)}, last batch "
                f"{None if last is None else last['batchId']}, active {query.isActive}")
    except Exception as exc:
        return f"Spark's status unavailable: {exc!r}"


def _is_active(query) -> bool:
    try:
        return bool(query.isActive)
    except Exception:
        return False


def _jvm_root_log_level(spark) -> str | None:
    """The JVM's root log4j level (e.g. ``"ERROR"``), or None when it cannot be read."""
    try:
        return str(spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel().toString())
    except Exception:
        return None


@contextlib.contextmanager
def _scheduler_pool(spark, pool: str | None):
    """Inside the block, jobs (and streaming queries started) from this thread go to the scheduler ``pool``;
    the thread's previous pool afterwards. Nothing when ``pool`` is None.
    """
    if pool is None:
        yield
        return
    sc = spark.sparkContext
    before = sc.getLocalProperty("spark.scheduler.pool")
    sc.setLocalProperty("spark.scheduler.pool", pool)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.scheduler.pool", before)


@contextlib.contextmanager
def _quiet_jvm_log(spark, *, active: bool = True):
    """Turn the JVM's log off inside the block (when ``active``), then restore its level.

    Spark logs an interrupted micro-batch at ``stop()`` as ERROR stack traces (``FileFormatWriter:
    Aborting job``, ``InterruptedException``) though the shutdown is clean.
    """
    previous = _jvm_root_log_level(spark) if active else None
    if previous is None:  # nothing running, or no log4j to read: leave the log alone
        yield
        return
    try:
        spark.sparkContext.setLogLevel("OFF")
    except Exception as exc:
        _log.debug("silencing the JVM log failed: %r", exc)
        yield
        return
    try:
        yield
    finally:
        try:
            spark.sparkContext.setLogLevel(previous)
        except Exception as exc:
            _log.warning("restoring the JVM log level %s failed: %r", previous, exc)


def _warn_unshared_control_path(spark, path: str) -> None:
    """Warn when the session runs on a cluster but the control table is a path on the driver's machine.

    Operators read the table in the executors' Python workers at every micro-batch (docs/deploy.md): on
    other machines a driver-local path is not there.
    """
    from ..control._stores import is_local

    try:
        master = str(spark.conf.get("spark.master", "local"))
    except Exception:  # a session that cannot tell: no advice
        return
    if is_local(path) and not master.startswith("local"):
        warnings.warn(f"control_path {path!r} is a path on the driver's machine, but the session runs on "
                      f"{master!r}: executors on other machines cannot read it. Use a path every executor "
                      f"reads (HDFS, an object store, a shared volume); see docs/deploy.md", UserWarning,
                      stacklevel=3)


#: The decisions log's policy name of the runtime's own admission control and re-plans of query groups.
GROUP_BUDGET = "group_budget"


class QueryRejected(RuntimeError):
    """A policy's admission control rejected a query (PIPES §4.1.1); ``reason`` says why."""

    def __init__(self, query: str, policy: str, reason: str):
        super().__init__(f"query {query!r} rejected by policy {policy!r}: {reason}")
        self.query, self.policy, self.reason = query, policy, reason


@dataclass
class QueryContext:
    """Passed to a query builder: the session, the query name and its operators' control-table access."""

    spark: object
    name: str
    control_path: str
    _runtime: CQRuntime = field(repr=False)
    #: For a query registered with :meth:`CQRuntime.register_cql`: its ``CompiledQuery`` (plan, QoS,
    #: operators, DataFrame), set when the query is built.
    compiled: object = field(default=None, repr=False)

    def control(self, operator: str, **params) -> ControlHandle:
        """Register ``operator`` of this query in the control table with initial ``params`` (kept if the
        entry exists) and return the handle its worker-side function reads at every micro-batch.

        The operator id is also the name its per-batch report is observed under (``_metrics.attach``).
        """
        return self._runtime._register_operator(self.name, operator, params)


def release_wait(now: float, period: float, slack: float = 0.1) -> float:
    """Seconds to wait before starting a periodic query so that its first instance is released at a
    multiple of the period ``P`` (Wei et al., §2: instance k is released at ``k·P``).

    Spark's ``processingTime`` trigger runs the first micro-batch when the query starts and the later ones
    at multiples of P since the epoch. Started between two multiples, the first instance takes part of the
    second one's period. Within ``slack · P`` after a multiple the query starts at once (the instance is
    released that little late); otherwise it waits for the next multiple.

    Parameters
    ----------
    now : float
        The current time, seconds since the epoch.
    period : float
        P in seconds, > 0.
    slack : float, default 0.1
        The fraction of P after a multiple within which no wait is needed, in [0, 1).

    Returns
    -------
    float
        The wait in seconds, in ``[0, (1 - slack)·P)``.

    Examples
    --------
    >>> release_wait(100.2, 3.0)      # 99 is a multiple of 3; 1.2 s after it: wait for 102
    1.8
    >>> release_wait(99.1, 3.0)       # 0.1 s after 99: start now
    0.0
    """
    if not (isinstance(period, (int, float)) and not isinstance(period, bool) and period > 0):
        raise ValueError(f"period must be a positive number of seconds, got {period!r}")
    if not (isinstance(slack, (int, float)) and 0 <= slack < 1):
        raise ValueError(f"slack must be a fraction in [0, 1), got {slack!r}")
    since = now % period
    return 0.0 if since <= slack * period else round(period - since, 9)


@dataclass
class _Registration:
    name: str
    builder: Callable
    plan: P.Node | None
    qos: dict
    sources: dict
    period: float | None = None
    deadline: float | None = None
    align: bool = True
    operators: list = field(default_factory=list)
    built: object = None
    query: object = None
    pool: str | None = None
    group: object = None        # a QueryGroup (register_group): its members are the policies' queries
    trigger: Mapping | None = None
    loads: dict = field(default_factory=dict)   # a group's streams -> StreamLoad (admission, re-plans)
    row_bytes: float = 64.0     # a group's bytes per state row until measured
    replanned_at: int | None = None   # a group's micro-batches seen at its last re-plan (replan_groups)
    grow_hold: dict = field(default_factory=dict)   # a group's stream -> event time (µs) its last growth fills at


def _policies(specs, options: Mapping) -> tuple[list[Policy], list[str]]:
    out, problems = [], []
    if isinstance(specs, (str, Policy)) or (isinstance(specs, type)):
        specs = [specs]
    for spec in specs:
        name = spec if isinstance(spec, str) else getattr(spec, "name", repr(spec))
        try:
            out.append(registry.create(spec, **(dict(options.get(name, {})) if not isinstance(spec, Policy) else {})))
        except Exception as exc:  # a broken plugin must not stop the runtime
            message = f"policy {name!r} skipped: {type(exc).__name__}: {exc}"
            problems.append(message)
            _log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
    return out, problems


class CQRuntime:
    """The adaptive runtime of pyspark-cq on the Spark driver.

    Parameters
    ----------
    spark : SparkSession
        The session the queries run in.
    policies : sequence of str, Policy subclass or Policy
        Policies by registered name (``pyspark_cq.policies.available()``), class or instance. A policy that
        cannot be loaded or created is reported and skipped.
    memory_budget : float or str, optional
        Memory bound passed to the policies in every snapshot (bytes or e.g. ``"512 MB"``).
    cpu_budget : float, optional
        Processing-cost bound passed to the policies.
    control_path : str, optional
        Where the control table lives (a local path or a URI; default a new temporary directory).
    every_batches : int, optional
        Run the policies every N micro-batches (counted over all registered queries).
    every_seconds : float, optional
        Run the policies every T seconds. With neither, ``every_batches=5``.
    alpha : float
        Smoothing constant of the statistics (exponential smoothing).
    lead : int or str, optional
        How far ahead of a query's latest event time a window / granularity change without an explicit
        ``at`` applies (µs or a duration); default twice the smoothed event-time advance per batch, so the
        change reaches the operators before elements from that instant (PIPES §4.2: new elements only).
    policy_options : mapping str -> dict, optional
        Constructor arguments of policies given by name.
    edf : bool, optional
        Deadline order of the periodic queries (:mod:`pyspark_cq.runtime.pools`): in a session started with
        ``pyspark_cq.spark(..., edf=True)`` every periodic query runs in a pyspark-cq scheduler pool, the ones
        with the smallest deadline D in the pool that gets the cores first. None (default): when the session
        has the pools; True: required (an error without them); False: the periodic queries share one pool.
    """

    def __init__(self, spark, policies: Sequence = (), *, memory_budget=None, cpu_budget=None,
                 control_path: str | None = None, every_batches: int | None = None,
                 every_seconds: float | None = None, alpha: float = 0.3, lead=None,
                 policy_options: Mapping | None = None, edf: bool | None = None):
        if not (hasattr(spark, "readStream") and hasattr(spark, "streams")):
            raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
        if every_batches is not None and (isinstance(every_batches, bool) or not isinstance(every_batches, int)
                                          or every_batches < 1):
            raise ValueError(f"every_batches must be a positive int or None, got {every_batches!r}")
        if every_seconds is not None and (isinstance(every_seconds, bool) or not isinstance(every_seconds, (int, float))
                                          or not every_seconds > 0):
            raise ValueError(f"every_seconds must be a positive number of seconds or None, got {every_seconds!r}")
        if every_batches is None and every_seconds is None:
            every_batches = 5
        if policy_options is not None and not isinstance(policy_options, Mapping):
            raise TypeError(f"policy_options must be a mapping name -> dict of arguments, got {policy_options!r}")
        if edf is not None and not isinstance(edf, bool):
            raise TypeError(f"edf must be True, False or None, got {edf!r}")
        self._pools = pools.has_pools(spark)
        if edf and not self._pools:
            raise ValueError("edf=True needs Spark's FAIR scheduler with pyspark-cq's pools: start the session with "
                             "pyspark_cq.spark(..., edf=True) (a classic session; see pyspark_cq.runtime.pools)")
        self.edf = self._pools if edf is None else edf
        self.spark = spark
        self.memory_budget = None if memory_budget is None else parse_size(memory_budget, "memory_budget")
        if cpu_budget is not None and (isinstance(cpu_budget, bool) or not isinstance(cpu_budget, (int, float))
                                       or not cpu_budget > 0):
            raise ValueError(f"cpu_budget must be a positive number or None, got {cpu_budget!r}")
        self.cpu_budget = None if cpu_budget is None else float(cpu_budget)
        self.every_batches, self.every_seconds = every_batches, every_seconds
        self.lead = None if lead is None else duration_value(lead, "lead", allow_negative=False)
        if control_path is None:
            control_path = os.path.join(tempfile.mkdtemp(prefix="pyspark-cq-control-"), "control.json")
        self._control = ControlTable(control_path, spark=spark, clock=self._clock)
        self.control_path = control_path
        _warn_unshared_control_path(spark, control_path)
        self._store = StatisticsStore(alpha)
        policies, self.problems = _policies(policies, policy_options or {})
        self._loop = PolicyLoop(policies, self._control)
        self._loop.routes = self._member_routes     # a group member's window decisions go through its group
        self._queries: dict[str, _Registration] = {}
        self._lock = threading.RLock()
        self._events: _queue.Queue = _queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener = None
        self._batches_since = 0
        self._last_round = time.monotonic()
        self._round_lock = threading.Lock()

    # -- inspection ------------------------------------------------------------------------------

    @property
    def policies(self) -> list[Policy]:
        """The active policies."""
        return list(self._loop.policies)

    def control_table(self) -> ControlTable:
        """The control table (its ``repr`` shows the entries; ``changes()`` the change log)."""
        return self._control

    def statistics(self) -> Snapshot:
        """A snapshot of the statistics of all registered queries (what the policies see)."""
        entries = self._control.entries()
        with self._lock:
            regs = list(self._queries.values())
        infos = {}
        for reg in regs:
            if reg.group is not None:
                infos.update(self._member_infos(reg))
                continue
            control = {op: dict(entries[op].params) for op in reg.operators if op in entries}
            infos[reg.name] = self._store.query_info(reg.name, plan=reg.plan, qos=reg.qos, control=control)
        return Snapshot(time.time(), infos, self.memory_budget, self.cpu_budget)

    def groups(self) -> dict[str, dict]:
        """The registered query groups (:meth:`register_group`) by name, each as ``QueryGroup.overview()``
        gives it: members with status, mode, the query whose slices each shares, rows delivered and counters,
        and the group's state with each shared slice table counted once.
        """
        with self._lock:
            groups = [r.group for r in self._queries.values() if r.group is not None]
        return {g.name: g.overview() for g in groups}

    def decisions_log(self) -> list[dict]:
        """One record per policy and round (and per admission): time, policy, decisions, applied, error."""
        return self._loop.log()

    def instances(self, name: str) -> list[Instance]:
        """The recorded instances (micro-batches) of the periodic query ``name``, oldest first: release,
        start, duration, lateness, ``missed``, input and shed rows, the fraction kept.
        """
        with self._lock:
            if name not in self._queries:
                raise KeyError(f"no query {name!r}; registered: {sorted(self._queries)}")
        return self._store.instances(name)

    def query(self, name: str):
        """The ``StreamingQuery`` of a registered query (None before it started)."""
        with self._lock:
            if name not in self._queries:
                raise KeyError(f"no query {name!r}; registered: {sorted(self._queries)}")
            return self._queries[name].query

    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._thread is not None and self._thread.is_alive()

    # -- registration ----------------------------------------------------------------------------

    def _register_operator(self, query: str, operator: str, params: Mapping) -> ControlHandle:
        validate_operator_id(operator)
        with self._lock:
            reg = self._queries.get(query)
            if reg is None:
                raise KeyError(f"no query {query!r} is being registered")
            owner = next((r.name for r in self._queries.values() if operator in r.operators and r is not reg), None)
            if owner is not None:
                raise ValueError(f"operator id {operator!r} is already used by query {owner!r}")
            if operator not in reg.operators:
                reg.operators.append(operator)
        self._control.register(operator, query=query, who="runtime", reason=f"registered by query {query!r}",
                               **params)
        self._store.add_operator(query, operator)
        return self._control.handle(operator)

    def register(self, name: str, builder: Callable, *, plan: P.Node | None = None,
                 qos: Mapping[str, QoSRange] | None = None, sources: Mapping | None = None, period=None,
                 deadline=None, align: bool = True) -> QueryContext:
        """Register a continuous query: admission control, then build it (and start it if running).

        Parameters
        ----------
        name : str
            The query name (also its ``queryName``).
        builder : callable
            ``builder(ctx: QueryContext)`` returning a ``DataStreamWriter`` (the runtime names and starts it)
            or a started ``StreamingQuery`` named ``name``. Operators get their control handles from
            ``ctx.control(operator_id, **initial_params)``.
        plan : pyspark_cq.plan.Node, optional
            The query's logical plan for cost-based policies; adjustable ``Window`` / ``Granularity`` nodes
            carry labels ``"<operator>.<param>"`` (sizes in µs).
        qos : mapping label -> QoSRange, optional
            QoS ranges of the adjustable parameters (PIPES §4.3).
        sources : mapping str -> str or float, optional
            Plan source name -> progress-source description substring, or a fixed d (seconds); see
            :meth:`StatisticsStore.register`.
        period, deadline : float or duration, optional
            A periodic query (Wei et al., §2): period P and relative deadline D <= P (seconds, or a duration
            such as ``"2 seconds"``; D defaults to P). The runtime starts it with
            ``trigger(processingTime=P)`` (the builder returns the ``DataStreamWriter``); every instance
            (micro-batch) is recorded with its lateness, misses and delivered quality (:meth:`instances`).
        align : bool, default True
            Start a periodic query at a multiple of its period (waiting up to P, or at once when less than
            a tenth of P has passed since one; see :func:`release_wait`), so that its first instance is
            released where the paper's periodic model and Spark's later triggers put it. Spark otherwise
            runs the first micro-batch at once and the second at the next multiple of P, which can leave
            the second instance only part of a period and start it late.

        Raises
        ------
        QueryRejected
            When a policy's admission control rejects the query (PIPES §4.1.1).
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if not callable(builder):
            raise TypeError(f"builder must be callable(ctx) -> DataStreamWriter or StreamingQuery, got {builder!r}")
        if plan is not None and not isinstance(plan, P.Node):
            raise TypeError(f"plan must be a pyspark_cq.plan.Node or None, got {type(plan).__name__}")
        period, deadline = periodic_spec(period, deadline)
        if not isinstance(align, bool):
            raise TypeError(f"align must be True or False, got {align!r}")
        qos = dict(qos or {})
        for key, rng in qos.items():
            parse_label(key, f"qos key {key!r}")
            if not isinstance(rng, QoSRange):
                raise TypeError(f"qos[{key!r}] must be a QoSRange, got {type(rng).__name__}")
        with self._lock:
            if name in self._queries:
                raise ValueError(f"a query named {name!r} is already registered")
        snapshot = self.statistics()
        self._store.register(name, sources=sources, period=period, deadline=deadline)
        reg = _Registration(name, builder, plan, qos, dict(sources or {}), period, deadline, align)
        info = self._store.query_info(name, plan=plan, qos=qos)
        admissions = self._admit(info, snapshot)
        with self._lock:
            self._queries[name] = reg
        ctx = QueryContext(self.spark, name, self.control_path, self)
        try:
            reg.built = builder(ctx)
            if not (hasattr(reg.built, "start") or hasattr(reg.built, "awaitTermination")):
                raise TypeError(f"builder must return a DataStreamWriter or a StreamingQuery, got "
                                f"{type(reg.built).__name__}")
            if period is not None and not hasattr(reg.built, "trigger"):
                raise TypeError(f"builder of the periodic query {name!r} must return a DataStreamWriter (the "
                                f"runtime sets its trigger to the period), got {type(reg.built).__name__}")
        except BaseException:
            self._forget(name)
            raise
        with_new = self.statistics()
        for policy, admission in admissions:
            self._loop.apply(policy, admission.decisions, with_new, kind="admit")
        if self.running:
            self._start_query(reg)
        return ctx

    def register_cql(self, name: str, text, *, sources: Mapping, sink, checkpoint: str | None = None,
                     trigger: Mapping | None = None, rates: Mapping | None = None) -> QueryContext:
        """Register a CQL query (docs/cql.md): its plan and QoS come from the text, its operators read the
        control table, so the policies see and adjust it like a hand-written one.

        Parameters
        ----------
        name : str
            Query name; the stateful operator's id is ``"<name>_agg"``, ``"<name>_join"``, … (plan labels
            ``"<id>.window"``, ``"<id>.granularity"``: the keys of the QoS ranges from ``WITH (…)``).
        text : str
            The query.
        sources : mapping str -> DataFrame
            The streams by name (as :func:`pyspark_cq.cql`).
        sink : str or callable
            ``"memory"`` (a memory table named ``name``), ``"console"``, a callable ``f(batch_df, batch_id)``
            (``foreachBatch``), or a directory for parquet files.
        checkpoint : str, optional
            Checkpoint directory; default ``<sink>/_checkpoint`` for a directory sink, else a new temporary
            directory.
        trigger : mapping, optional
            ``DataStreamWriter.trigger`` arguments. Default: a query with ``PERIOD`` (and ``DEADLINE``, default
            the period) is registered as a periodic query (``register(period=, deadline=)``: RTStream §2,
            one instance per period, its misses recorded for the QoS policies); else Spark's default trigger.
            A trigger given here replaces the period's and the query is not periodic.
        rates : mapping str -> str or float, optional
            As ``register(sources=)``: a stream name -> a substring of its progress-source description (e.g.
            ``"Rate"``, a path) or a fixed mean distance d in seconds, for the cost-based policies.
        """
        from ..lang import parse
        from ..lang.compiler import analyze, compile_cql

        if not isinstance(sources, Mapping):
            raise TypeError(f"sources must be a mapping {{stream name: DataFrame}}, got {type(sources).__name__}")
        if not (callable(sink) or (isinstance(sink, str) and sink)):
            raise TypeError(f"sink must be 'memory', 'console', a directory or a callable(df, batch_id), got {sink!r}")
        if trigger is not None and not isinstance(trigger, Mapping):
            raise TypeError(f"trigger must be a mapping of DataStreamWriter.trigger arguments, got {trigger!r}")
        statement = parse(text) if isinstance(text, str) else text
        analysis = analyze(statement, name, {k: list(v.columns) for k, v in sources.items()})
        if checkpoint is None:
            if isinstance(sink, str) and sink not in ("memory", "console"):
                checkpoint = os.path.join(sink, "_checkpoint")
            else:
                checkpoint = tempfile.mkdtemp(prefix=f"pyspark-cq-{name}-")
        period = deadline = None
        if trigger is None and "period" in analysis.options:   # µs in the analysis
            period = analysis.options["period"] / 1e6
            deadline = analysis.options.get("deadline", analysis.options["period"]) / 1e6

        def build(ctx: QueryContext):
            ctx.compiled = compile_cql(ctx.spark, statement, sources, name=name, control=ctx.control)
            writer = (ctx.compiled.dataframe.writeStream.outputMode(ctx.compiled.output_mode)
                      .option("checkpointLocation", checkpoint))
            if callable(sink):
                writer = writer.foreachBatch(sink)
            elif sink in ("memory", "console"):
                writer = writer.format(sink)
            else:
                if ctx.compiled.output_mode != "append":   # Spark's file sink writes append mode only
                    raise ValueError(f"sink must be 'memory', 'console' or a callable for a query WITH (OUTPUT_MODE "
                                     f"{ctx.compiled.output_mode.upper()}): the parquet file sink at {sink!r} "
                                     "writes append mode only")
                writer = writer.format("parquet").option("path", sink)
            return writer.trigger(**trigger) if trigger else writer

        return self.register(name, build, plan=analysis.plan, qos=analysis.qos, sources=rates, period=period,
                             deadline=deadline)

    def _admit(self, info: QueryInfo, snapshot: Snapshot) -> list[tuple[Policy, Admission]]:
        accepted = []
        for policy in self._loop.policies:
            try:
                admission = policy.admit(info, snapshot)
                if not isinstance(admission, Admission):
                    raise TypeError(f"admit returned {type(admission).__name__}, not Admission")
            except Exception as exc:
                message = f"admit raised {type(exc).__name__}: {exc}; ignored for query {info.name!r}"
                _log.warning("policy %s: %s", policy.name, message)
                warnings.warn(f"policy {policy.name!r}: {message}", RuntimeWarning, stacklevel=3)
                self._loop.record(policy=policy.name, kind="admit", query=info.name, decisions=[], applied=False,
                                  changes=[], error=message)
                continue
            if not admission.accepted:
                for other, _ in accepted:
                    other.remove(info.name)
                self._store.unregister(info.name)
                self._loop.record(policy=policy.name, kind="admit", query=info.name, decisions=[], applied=False,
                                  changes=[], error=None, rejected=admission.reason)
                raise QueryRejected(info.name, policy.name, admission.reason)
            accepted.append((policy, admission))
        return accepted

    def _forget(self, name: str) -> None:
        with self._lock:
            reg = self._queries.pop(name, None)
        for policy in self._loop.policies:
            try:
                policy.remove(name)
            except Exception as exc:
                _log.warning("policy %s: remove(%r) raised %r", policy.name, name, exc)
        self._store.unregister(name)
        if reg is not None and reg.group is not None:
            reg.group._admission = None      # its adds are no longer this runtime's to admit
        if reg is not None:
            for op in reg.operators:
                if op in self._control:
                    self._control.remove(op, reason=f"query {name!r} deregistered", who="runtime")

    def deregister(self, name: str) -> None:
        """Stop ``name`` (if running), tell the policies (they may release its resources to the others at
        the next round) and remove its control-table entries.
        """
        query = self.query(name)
        if query is not None and query.isActive:
            query.stop()
        self._forget(name)

    # -- running ---------------------------------------------------------------------------------

    def register_group(self, group, *, trigger: Mapping | None = None, loads: Mapping | None = None,
                       row_bytes: float = 64.0) -> None:
        """Register a :class:`~pyspark_cq.QueryGroup`: the policies see each of its queries (docs/groups.md,
        "The runtime").

        Every query of the group is a query of the snapshot (:meth:`statistics`) with the group's query-level
        statistics (one Spark query: rate, batch duration, event time) and its own counters
        (``group.query_metrics``) as operator ``"<name>_agg"``; with several streams (whose Spark watermark is the
        group clock's) its own stream's event time, watermark delay and event time per batch
        (``group.stream_times()``). Shared state is counted once: a slice class's
        table is reported on one of its queries (its ``state_rows`` / ``state_bytes``), the others report 0.
        Each member also carries its plan at the window in effect, its window's QoS range, that window as its
        ``control`` and its ``slice_class`` (``group.member_plans()``). A member has no control-table entry: a
        policy's window decision for it goes through the group (``QueryGroup.set_window``), only within its QoS
        range and for a slice class whose members all have one
        (:func:`pyspark_cq.cost.groups.fixed_classes`), so no member's table shrinks under another; any other
        decision naming a member is refused (recorded in the decisions log). With a ``memory_budget`` and
        ``loads``, the runtime itself admits each query added to the group and re-plans windows within QoS
        ranges: reduces them when the measured state passes the budget, grows them back when it falls well
        below (:meth:`replan_groups`). ``loads`` also gives the policies each stream's distance d = 1/rate.

        Parameters
        ----------
        group : pyspark_cq.QueryGroup
            The group, started or not (the runtime starts it with ``trigger`` when it starts).
        trigger : mapping, optional
            ``QueryGroup.start``'s trigger when the runtime starts the group.
        loads : mapping str -> StreamLoad or float, optional
            What the state estimate assumes of each stream of the group (:class:`pyspark_cq.cost.groups.StreamLoad`,
            or its rate in rows/s): with the runtime's ``memory_budget``, every query added to the group is
            admitted only if the group's estimated state stays within the budget (PIPES §4.1.1; docs/groups.md,
            "Admission control and re-plans"). A query over a stream without a load is admitted unestimated.
        row_bytes : float
            Bytes per state row of the estimate until the group has measured its own (state bytes / rows).

        Raises
        ------
        QueryRejected
            With a memory budget, when the group's queries are estimated over it already.
        """
        from ..cost.groups import StreamLoad, group_state_rows
        from ..group import QueryGroup

        if not isinstance(group, QueryGroup):
            raise TypeError(f"group must be a pyspark_cq.QueryGroup, got {type(group).__name__}")
        if trigger is not None and not isinstance(trigger, Mapping):
            raise TypeError(f"trigger must be None or a mapping of DataStreamWriter.trigger arguments, got {trigger!r}")
        if loads is not None and not isinstance(loads, Mapping):
            raise TypeError(f"loads must be a mapping stream -> StreamLoad or rows/s, got {type(loads).__name__}")
        streams = {}
        for k, v in (loads or {}).items():
            if k not in group.sources:
                raise ValueError(f"loads[{k!r}]: not a stream of group {group.name!r} (streams: "
                                 f"{sorted(group.sources)})")
            if not isinstance(v, StreamLoad):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"loads[{k!r}] must be a StreamLoad or a rate in rows/s, got {v!r}")
                v = StreamLoad(float(v))
            streams[k] = v
        if isinstance(row_bytes, bool) or not isinstance(row_bytes, (int, float)) or not 0 < row_bytes < math.inf:
            raise ValueError(f"row_bytes must be a positive number of bytes per state row, got {row_bytes!r}")
        if self.memory_budget is not None and streams:
            members = _estimated(group._loads(), streams)
            rows = sum(group_state_rows(members, streams).values())
            if rows * row_bytes > self.memory_budget:
                reason = (f"its {len(members)} queries are estimated at {rows * row_bytes:,.0f} B of state, over the "
                          f"memory budget {self.memory_budget:,.0f} B; register it with fewer queries")
                self._loop.record(policy=GROUP_BUDGET, kind="admit", query=group.name, decisions=[], applied=False,
                                  changes=[], error=None, rejected=reason)
                raise QueryRejected(group.name, GROUP_BUDGET, reason)
        with self._lock:
            taken = set(self._queries) | {n for r in self._queries.values() if r.group is not None
                                          for n in r.group.queries}
            clash = sorted(({group.name} | set(group.queries)) & taken)
            if clash:
                raise ValueError(f"group {group.name!r}: names already registered: {clash}")
            reg = _Registration(group.name, None, None, {}, {}, group=group, trigger=trigger, loads=streams,
                                row_bytes=float(row_bytes))
            reg.built = reg.query = group._query
            self._queries[group.name] = reg
        # each stream's distance d = 1 / rate as `loads` gives it (PIPES §3.2.2, "known in advance"): the
        # members' plans read their streams by these names, so the PIPES resource manager can cost them
        self._store.register(group.name, sources={k: 1.0 / v.rate for k, v in streams.items() if v.rate > 0})
        if self.memory_budget is not None:
            group._admission = lambda g, new, members: self._admit_member(reg, new, members)
        if self.running and reg.query is None:
            self._start_query(reg)

    def _group_loads(self, reg: _Registration) -> dict:
        """The group's stream loads for the estimate, each with the group's measured event time per micro-batch
        as its batch span B where it gives none (one stream at Spark's watermark only: on the group clock, the
        group's Spark event time is the sum of its clocks', not a stream's).
        """
        from dataclasses import replace as _replace

        span = self._store.query_info(reg.name).batch_span
        if (len(reg.group.sources) > 1 or reg.group.group_clocked() or span is None or not math.isfinite(span)
                or span <= 0):
            return dict(reg.loads)
        return {k: v if v.batch_span else _replace(v, batch_span=float(span)) for k, v in reg.loads.items()}

    def _row_bytes(self, reg: _Registration) -> float:
        """Bytes per state row: the group's measured (state bytes / state rows), else ``register_group``'s."""
        from ..vocabulary import metrics as M

        o = reg.group.overview() if reg.query is not None else {}
        rows, size = o.get(M.STATE_ROWS) or 0, o.get(M.STATE_BYTES) or 0
        return size / rows if rows > 0 and size > 0 else reg.row_bytes

    def _admit_member(self, reg: _Registration, new, members) -> None:
        """Admission control of a query added to the group ``reg`` under the memory budget (PIPES §4.1.1): the
        group's estimated state with it, each slice class once (:func:`pyspark_cq.cost.groups.admit`); raises
        :class:`QueryRejected` (recorded in the decisions log) when it would pass the budget.
        """
        from ..cost.groups import admit

        loads = self._group_loads(reg)
        if not _estimated([new], loads):
            return                 # no load given for its stream(s): admitted unestimated (register_group's loads)
        members = _estimated(members, loads)
        answer = admit(members, new, loads, self.memory_budget, self._row_bytes(reg))
        if not answer.accepted:
            self._loop.record(policy=GROUP_BUDGET, kind="admit", query=new.name, group=reg.name, decisions=[],
                              applied=False, changes=[], error=None, rejected=answer.reason)
            raise QueryRejected(new.name, GROUP_BUDGET, answer.reason)

    def group_state(self, name: str) -> dict:
        """The state of the registered group ``name`` per slice class and join class, measured against the
        estimate.

        Returns
        -------
        dict
            ``classes``: per class (named by its first query) its ``members``, ``stream`` (a join class's
            ``"left JOIN right"``), ``estimated_rows`` (PIPES eq. 15 through a slice class's widest window, eq. 9
            through a join class's widest windows, :func:`pyspark_cq.cost.groups.group_state_rows`; None for a
            stream without a load), ``measured_rows`` and ``measured_bytes`` (the table's, from the last micro-batch);
            ``estimated_rows`` / ``measured_rows`` / ``measured_bytes`` of the group; ``row_bytes``.
        """
        from ..cost.groups import group_state_rows
        from ..vocabulary import metrics as M

        reg = self._group_reg(name)
        loads = self._group_loads(reg)
        members = reg.group._loads()
        est = group_state_rows(_estimated(members, loads), loads)
        overview = reg.group.overview()
        measured = overview["members"]
        classes: dict = {}
        for m in members:
            c = classes.setdefault(m.state_class, {"members": [], "stream": " JOIN ".join(m.streams),
                                                   "estimated_rows": est.get(m.state_class),
                                                   "measured_rows": 0, "measured_bytes": 0})
            c["members"].append(m.name)
            got = measured.get(m.name, {})
            c["measured_rows"] += got.get(M.STATE_ROWS) or 0
            c["measured_bytes"] += got.get(M.STATE_BYTES) or 0
        return {"classes": classes, "estimated_rows": sum(est.values()),
                "measured_rows": overview[M.STATE_ROWS], "measured_bytes": overview[M.STATE_BYTES],
                "row_bytes": self._row_bytes(reg)}

    def _group_reg(self, name: str) -> _Registration:
        with self._lock:
            reg = self._queries.get(name)
        if reg is None or reg.group is None:
            raise KeyError(f"name must be a registered query group, got {name!r}")
        return reg

    def replan_groups(self) -> list[dict]:
        """Re-plan the windows of the registered groups whose measured state is over the memory budget, or well
        below it after reductions.

        Per group, :func:`pyspark_cq.cost.groups.replan_target` decides from the measured state (its slice
        tables' bytes, each counted once): over the budget, **reduce** to it; below ``GROW_BELOW`` (0.5) of it
        with windows reduced earlier, **grow** them back to ``GROW_TO`` (0.8) of it — toward the windows the
        queries were registered with, never above them, within their QoS ranges (the hysteresis and the reserve
        are justified in docs/groups.md, "Re-plans"). The estimate is calibrated to the measurement (the target
        is the budget in rows times estimated / measured rows) and :func:`pyspark_cq.cost.groups.replan` bisects
        one common fraction of the QoS ranges (PIPES §4.3), only over slice classes whose members all have a QoS
        range (:func:`pyspark_cq.cost.groups.fixed_classes`). The windows go through ``QueryGroup.set_window``
        with the re-plan's record, so they survive a restart from the checkpoint.

        A group re-planned is not re-planned again until two micro-batches have run (its changes apply at the
        end of the next one, the table changes in the one after: PIPES §4.2's adaptation delay); after a growth
        it is not grown again until each stream whose windows grew has advanced by the growth (its table holds
        the wider windows only then, §4.2), so a second growth does not calibrate on a table still filling.
        One record per re-plan in the decisions log (kind ``"replan"``, ``direction`` ``"reduce"`` or
        ``"grow"``, with ``seconds``, the time it took; a growth with nothing to grow is not recorded); returns
        them. Nothing without a memory budget.
        """
        from ..cost.groups import GROW_BELOW, group_state_rows, growth_filled, growth_filled_at, replan, replan_target
        from ..vocabulary import metrics as M

        if self.memory_budget is None:
            return []
        with self._lock:
            regs = [r for r in self._queries.values() if r.group is not None and r.query is not None and r.loads]
        out = []
        for reg in regs:
            t0 = time.perf_counter()
            # PIPES §4.2: a change shows only later. The group applies it when the micro-batch after the round
            # ends and the table shrinks at the next one's eviction; until then the measured state is the old
            # windows', and a re-plan on it would reduce again what is already reduced.
            batches = self._store.query_info(reg.name).batches
            if reg.replanned_at is not None and batches < reg.replanned_at + 2:
                continue
            overview = reg.group.overview()
            rows, size = overview[M.STATE_ROWS] or 0, overview[M.STATE_BYTES] or 0
            loads = self._group_loads(reg)
            members = _estimated(reg.group._loads(), loads)
            estimated = sum(group_state_rows(members, loads).values())
            direction, target = replan_target(rows, size, estimated, self.memory_budget)
            if direction is None:
                continue
            times = ({s: t.get("event_time") for s, t in reg.group.stream_times().items()}
                     if direction == "grow" else {})
            if direction == "grow" and (
                    not any(getattr(m, "registered", None) is not None and m.window < m.registered
                            for m in members)
                    or not growth_filled(reg.grow_hold, times)):
                continue       # nothing reduced to give back, or the last growth's tables still filling
            plan = replan(members, loads, target, direction=direction)
            if direction == "grow" and not plan.windows:
                continue
            record = {"direction": direction, "f": round(plan.f, 6), "time": time.time(),
                      "budget": self.memory_budget}
            applied = []
            for n, w in sorted(plan.windows.items()):
                try:
                    reg.group.set_window(n, w, replan=record)
                    applied.append({"query": n, "window": w})
                except (KeyError, ValueError) as exc:    # removed or changed since: the next round re-plans
                    _log.warning("re-plan of group %s: %s", reg.name, exc)
            reg.replanned_at = batches if applied else reg.replanned_at
            if direction == "grow" and applied:
                # until the grown tables filled, the measured state is not the new windows' (PIPES §4.2)
                reg.grow_hold = growth_filled_at({a["query"]: a["window"] for a in applied}, members, times)
            if direction == "reduce":
                reason = (f"measured state {size:,.0f} B > memory budget {self.memory_budget:,.0f} B: "
                          f"{len(applied)} windows reduced (f = {plan.f:.3f}), estimate {plan.rows_before:,.0f} -> "
                          f"{plan.rows_after:,.0f} rows (target {plan.target_rows:,.0f})"
                          + ("" if plan.feasible else "; infeasible: every adjustable window at its QoS minimum"))
            else:
                reason = (f"measured state {size:,.0f} B < {GROW_BELOW:.0%} of the memory budget "
                          f"{self.memory_budget:,.0f} B: {len(applied)} windows grown back (f = {plan.f:.3f}) "
                          f"toward their registered windows, estimate {plan.rows_before:,.0f} -> "
                          f"{plan.rows_after:,.0f} rows (target {plan.target_rows:,.0f})")
            reason += (f"; {len(plan.fixed)} classes not adjustable (a member without a QoS range)"
                       if plan.fixed else "")
            out.append(self._loop.record(policy=GROUP_BUDGET, kind="replan", query=reg.name, decisions=applied,
                                         applied=bool(applied), changes=applied, error=None, reason=reason,
                                         direction=direction, feasible=plan.feasible, f=plan.f,
                                         fixed=dict(plan.fixed), seconds=time.perf_counter() - t0))
        return out

    def _member_routes(self) -> dict:
        """The operators of the registered groups' members a policy may change, each with the function that
        prepares a decision for it (:attr:`PolicyLoop.routes`): only ``window`` of a shared ``RSTREAM`` query
        with a QoS range, in a slice class whose members all have one (:func:`pyspark_cq.cost.groups.fixed_classes`,
        the rule the runtime's own re-plans follow); the window is rounded down to whole slices (at least the
        slide, :func:`pyspark_cq.cost.groups.window_at`) and set through ``QueryGroup.set_window``.
        """
        from ..cost.groups import fixed_classes, window_at

        with self._lock:
            groups = [r.group for r in self._queries.values() if r.group is not None]
        routes = {}
        for g in groups:
            members = g._loads()
            fixed = fixed_classes(members)
            settable = g.windows()          # the shared RSTREAM queries (an ISTREAM / DSTREAM's window is its own)
            for m in members:
                if getattr(m, "window_min", None) is None or m.name not in settable:   # a join has none
                    continue

                def prepare(decision, g=g, m=m, fixed=fixed):
                    if set(decision.changes) != {"window"}:
                        raise ValueError(f"query {m.name!r} of group {g.name!r} takes only window decisions (through "
                                         f"its group), got {sorted(decision.changes)}")
                    if m.slice_class in fixed:
                        raise ValueError(f"query {m.name!r} of group {g.name!r}: its slice class's windows are not "
                                         f"adjustable ({fixed[m.slice_class]}): reducing its window would not "
                                         f"shrink the table the class keeps")
                    want = int(decision.changes["window"])
                    span = m.window_max - m.window_min
                    w = window_at(m, (want - m.window_min) / span if span else 0.0)
                    if w == m.window:
                        return lambda who: None
                    direction = "reduce" if w < m.window else "grow"
                    return lambda who: g.set_window(m.name, w, replan={"direction": direction, "policy": who,
                                                                       "time": time.time()})

                routes[f"{m.name}_agg"] = prepare
        return routes

    def _member_infos(self, reg: _Registration) -> dict:
        """The snapshot's :class:`QueryInfo` of each query of the group ``reg`` (see :meth:`register_group`)."""
        from dataclasses import replace as _replace

        from ..policies.snapshot import OperatorStats
        from ..vocabulary import metrics as M

        base = self._store.query_info(reg.name)
        out = {}
        started = reg.query is not None   # before its start a group has no metrics to read
        # several streams: the group's Spark watermark and event time are the group clock's, so each member gets
        # its own stream's, as the group recorded them (docs/groups.md, "The runtime")
        times = reg.group.stream_times() if started else {}
        several = started and reg.group.group_clocked()
        # each member's plan and QoS ranges, its window in effect and its slice class (shared state once): the
        # PIPES resource manager costs a class once and changes its windows only when all its members may
        # change (cost.groups.fixed_classes); its window decisions go through the group (_member_routes)
        plans = reg.group.member_plans()
        windows = reg.group.windows()
        for name in reg.group.queries:
            last = (reg.group.query_metrics(name, "last") if started else None) or {}
            total = (reg.group.query_metrics(name, "total") if started else None) or {}
            totals = {k: int(v) for k, v in total.items() if not M.is_state_size(k)}
            op = f"{name}_agg"
            stats = OperatorStats(op, base.batches, int(last.get(M.INPUT_ROWS, 0)), int(last.get(M.OUTPUT_ROWS, 0)),
                                  state_rows=float(last.get(M.STATE_ROWS, math.nan)),
                                  state_bytes=float(last.get(M.STATE_BYTES, math.nan)),
                                  evicted_rows=int(last.get(M.EVICTED_ROWS, 0)),
                                  late_rows=int(last.get(M.LATE_ROWS, 0)),
                                  late_rows_total=int(totals.get(M.LATE_ROWS, 0)), report=dict(last), totals=totals)
            own = {}
            if several:
                try:
                    t = times.get(reg.group.member_clock(name)) or {}
                except KeyError:     # removed meanwhile
                    t = {}
                own = {"event_time": t.get("event_time"), "watermark_delay": t.get("watermark_delay"),
                       "batch_span": self._store.smoothed(t.get("advances", ()))}
            view = plans.get(name) or {}
            control = {op: {"window": windows[name]["window"]}} if name in windows else {}
            out[name] = _replace(base, name=name, operators={op: stats}, control=control,
                                 state_rows=stats.state_rows, state_bytes=stats.state_bytes,
                                 plan=view.get("plan"), qos=view.get("qos") or {},
                                 slice_class=view.get("slice_class"), **own)
        return out

    def _start_query(self, reg: _Registration) -> None:
        if reg.group is not None:
            reg.query = reg.group._query or reg.group.start(trigger=reg.trigger)
            return
        built = reg.built
        if hasattr(built, "awaitTermination"):  # already a StreamingQuery
            if built.name != reg.name:
                raise ValueError(f"builder of {reg.name!r} returned a query named {built.name!r}; name it with "
                                 f".queryName({reg.name!r}) or return the DataStreamWriter")
            reg.query = built
        else:
            pool = None
            if reg.period is not None:  # Spark fires a processingTime trigger at multiples of P
                built = built.trigger(processingTime=f"{max(1, round(reg.period * 1000))} milliseconds")
                pool = self._pool(reg)
                if reg.align:
                    time.sleep(release_wait(time.time(), reg.period))
            with _scheduler_pool(self.spark, pool):   # the query's thread inherits the starting thread's pool
                reg.query = built.queryName(reg.name).start()
            reg.pool = pool

    def _pool(self, reg: _Registration) -> str | None:
        """The scheduler pool of the periodic query ``reg`` (None without pyspark-cq's pools): by its deadline
        among the periodic queries registered so far (a pool is fixed when a query starts).
        """
        if not self._pools:
            return None
        if not self.edf:
            return pools.PERIODIC_POOL
        with self._lock:
            deadlines = {r.name: r.deadline for r in self._queries.values() if r.period is not None}
        return pools.deadline_pools(deadlines)[reg.name]

    def pool(self, name: str) -> str | None:
        """The Spark scheduler pool the query ``name`` was started in (None: Spark's default)."""
        with self._lock:
            if name not in self._queries:
                raise KeyError(f"no query {name!r}; registered: {sorted(self._queries)}")
            return self._queries[name].pool

    def start(self) -> CQRuntime:
        """Start watching (listener and monitor thread) and start every registered query."""
        if self.running:
            return self
        from pyspark.sql.streaming import StreamingQueryListener

        events, runtime = self._events, self

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                events.put(event.progress)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                if event.exception:   # the operator's own sentence first, not a page of stack traces
                    _log.error("%s", _failure(runtime._name_of(event.id), event.exception))

        self._listener = _Listener()
        self.spark.streams.addListener(self._listener)
        self._stop.clear()
        self._thread = threading.Thread(target=self._monitor, name="pyspark-cq-runtime", daemon=True)
        self._thread.start()
        with self._lock:
            regs = [r for r in self._queries.values() if r.query is None]
        for reg in regs:
            self._start_query(reg)
        return self

    def stop(self, *, stop_queries: bool = True) -> None:
        """Stop the monitor thread and the listener, and (by default) the registered queries.

        While the queries stop, the JVM's log is silenced: Spark logs the cancellation of a running
        micro-batch (e.g. ``FileFormatWriter: Aborting job ... InterruptedException`` of a file sink) as
        a page of ERROR stack traces although the stop is clean; the log level is restored afterwards.
        """
        if stop_queries:
            with self._lock:
                queries = [r.query for r in self._queries.values() if r.query is not None]
            with _quiet_jvm_log(self.spark, active=any(_is_active(q) for q in queries)):
                for q in queries:
                    try:
                        if q.isActive:
                            q.stop()
                    except Exception as exc:  # keep stopping the others
                        _log.warning("stopping query %s failed: %r", q.name, exc)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._listener is not None:
            try:
                from ..session.connect import remove_listener

                remove_listener(self.spark, self._listener)   # Spark Connect: without PySpark's deadlock
            except Exception as exc:
                _log.warning("removing the listener failed: %r", exc)
            self._listener = None

    def __enter__(self) -> CQRuntime:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _due(self) -> bool:
        if self.every_batches is not None and self._batches_since >= self.every_batches:
            return True
        return self.every_seconds is not None and time.monotonic() - self._last_round >= self.every_seconds

    def _monitor(self) -> None:
        while not self._stop.is_set():
            try:
                progress = self._events.get(timeout=0.1)
            except _queue.Empty:
                progress = None
            if progress is not None:
                try:
                    if self._store.update(progress) is not None:
                        self._batches_since += 1
                except Exception as exc:  # a malformed progress must not end the monitor
                    _log.warning("statistics update failed: %r", exc)
            with self._lock:
                has_queries = bool(self._queries)
            if has_queries and self._due():
                try:
                    self.run_policies()
                except Exception as exc:
                    _log.warning("policy round failed: %r", exc)

    def _name_of(self, query_id) -> str:
        """The registered name of the query with id ``query_id`` (its id when it is not ours)."""
        with self._lock:
            regs = [(r.name, r.query) for r in self._queries.values() if r.query is not None]
        for name, query in regs:
            try:
                if str(query.id) == str(query_id):
                    return name
            except Exception:
                continue
        return str(query_id)

    def set_control(self, operator: str, *, who: str, reason: str = "", **params) -> list:
        """Change a registered operator's control-table entry as a user (the console's edits come here).

        The change is checked exactly as a policy's decisions are before it is written: it becomes a
        :class:`~pyspark_cq.control.Decision` (values validated by the control vocabulary), then
        :meth:`PolicyLoop.refusal` checks it against the control table and the query's QoS ranges (a window,
        join bound or granularity needs a declared range and must lie inside it; a ``drop_ratio`` must lie in
        its range when one is declared). The running query applies it at its next micro-batch (PIPES §4.2:
        a window change applies to new elements only); the change log records ``who`` and ``reason``.

        Parameters
        ----------
        operator : str
            The operator id, registered by a query of this runtime (``ctx.control``).
        who : str
            Who changes it (logged), e.g. a user name.
        reason : str
            Why (logged).
        **params
            New values (``window="30 seconds"``, ``drop_ratio=0.2``, ``plan_id=...``).

        Returns
        -------
        list of pyspark_cq.control.Change
            The logged changes (empty when the values were already in force).

        Raises
        ------
        KeyError
            ``operator`` belongs to no registered query.
        TypeError, ValueError
            A value the control table does not accept, or a change the runtime refuses (outside the QoS
            range, no declared range); the message says why. Nothing is written.
        """
        from ..control import Decision, Decisions

        validate_operator_id(operator)
        with self._lock:
            reg = next((r for r in self._queries.values() if operator in r.operators), None)
            if reg is None:
                raise KeyError(f"operator {operator!r} belongs to no registered query; operators: "
                               f"{sorted(op for r in self._queries.values() for op in r.operators)}")
            qos = dict(reg.qos)
        if not isinstance(who, str) or not who:
            raise TypeError(f"who must be a non-empty str (a user name), got {who!r}")
        decisions = Decisions([Decision(operator, params, reason, query=reg.name)], who)
        problem = self._loop.refusal(decisions, qos)
        if problem:
            raise ValueError(f"change of {operator!r} refused: {problem}")
        return self._control.apply(decisions, who=who)

    def serve(self, port: int = 8050, *, host: str = "127.0.0.1", token: str | None = None):
        """Start the live web console on ``http://host:port/`` in a background thread (docs/console.md).

        It shows the registered queries, their plans, per-operator live charts, the decisions log and the
        change log, and edits control-table entries through :meth:`set_control` (edits need ``token``,
        generated when None). Needs the ``console`` extra (``pip install "pyspark-cq[console]"``).

        Parameters
        ----------
        port : int
            TCP port (0: a free one; the console's ``url`` says which).
        host : str
            Address to bind; the default serves this machine only.
        token : str, optional
            The token edits must carry; default a new random one (``console.token``).

        Returns
        -------
        pyspark_cq.console.Console
            The running console: ``url``, ``token``, ``stop()``.
        """
        from ..console import Console

        return Console(self, host=host, port=port, token=token).start()

    def run_policies(self) -> list[dict]:
        """Run one policy round now (the monitor thread does it on schedule); returns its records.

        Rounds run one at a time: a policy's state is not shared between two rounds in flight.
        """
        with self._round_lock:
            self._batches_since = 0
            self._last_round = time.monotonic()
            return self._loop.run(self.statistics()) + self.replan_groups()

    def await_batches(self, name: str, count: int, timeout: float = 60.0) -> int:
        """Wait until the statistics of ``name`` have seen ``count`` micro-batches; returns the number seen.

        Raises TimeoutError after ``timeout`` seconds.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        deadline = time.monotonic() + timeout
        while True:
            seen = self._store.query_info(name).batches
            if seen >= count:
                return seen
            query = self.query(name)
            if query is not None and not query.isActive and query.exception() is not None:
                raise RuntimeError(_failure(name, query.exception()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"query {name!r} reached {seen} of {count} micro-batches in {timeout} s "
                                   f"({_spark_side(query)})")
            time.sleep(0.05)

    def _clock(self, operator: str) -> int:
        """Application time (µs) from which a change of ``operator`` without ``at`` applies."""
        wall = time.time_ns() // 1000
        try:
            query = self._control.entry(operator).query
            event, advance = self._store.event_time_lead(query) if query in self._store.queries else (None, math.nan)
        except KeyError:
            return wall
        if event is None:
            return wall
        if self.lead is not None:
            return event + self.lead
        return event + (int(2 * advance * 1_000_000) if math.isfinite(advance) else 0)
