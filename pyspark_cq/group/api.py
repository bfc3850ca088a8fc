"""Many continuous queries, one Spark streaming query: :class:`QueryGroup`.

STREAM is a data stream *management* system: many continuous queries run at once, share operators and
synopses (Motwani et al., §3.2) and are active or inactive (§2.3); PIPES's resource manager is built for
thousands of concurrent queries (Cammert et al., §5.4). On Spark each streaming query has its own scan,
planning, Python stages and state at every micro-batch; a group runs its queries as one streaming query:

- every windowed aggregation (``RSTREAM`` of a ``RANGE … SLIDE`` GROUP BY whose select list names grouped
  columns and aggregates) joins the **shared stage**: per stream one projection computes each distinct WHERE,
  grouping key and aggregate input once and one slicer stage slices them, and one stateful stage for all streams
  runs every such query (:mod:`.worker`), each stream's at that stream's own watermark (:mod:`.clock`);
- every two-stream inner or outer join is a member of a **join class** in the same stateful stage, one interval
  join state per class (:mod:`.joins`); members that cannot share a state (other streams or key, an outer join of
  another type or band) run side by side there, each class with its own; a ROWS window runs there too, its
  partitions' last rows in the stage's state (:mod:`.rows`);
- any other stateless query runs **alone** inside the same Spark query (its own operators, as :func:`pyspark_cq.cql`
  builds them);
- one ``foreachBatch`` delivers each query's rows to its own sink, idempotently by batch id (:mod:`.sinks`).

The queries are kept in the group's plan (:mod:`.doc`): queries added, removed, paused or resumed while the
group runs take effect at the next micro-batch boundary without a new Spark query.
"""
from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from functools import reduce

from .._checkpoint import clear_unstarted_checkpoint
from . import doc as D
from .predicates import Unsupported, bind
from .sinks import check_sink, encode_sink, same_sink

__all__ = ["QueryGroup"]

_TRIGGERS = ("processingTime", "once", "continuous", "availableNow")
_POLICY = "spark.sql.streaming.multipleWatermarkPolicy"
#: Spark types of the plain columns a shared stage carries for queries that join it while it runs.
_RAW_TYPES = ("byte", "short", "integer", "long", "float", "double", "string", "boolean")


@dataclass
class _Member:
    """A query as the driver keeps it: its spec for the plan and what building the Spark query needs."""

    spec: D.MemberSpec
    sink: object                       # the normalised sink (a path or the callable itself)
    dataframe: object = None           # "alone": the query's own DataFrame; "rows": its input, time in µs added
    computed: list = field(default_factory=list)    # "shared": (column name, Column) it adds to the stream
    exprs: list = field(default_factory=list)       # "shared": (slicer column, Column)
    mask: object = None                # "shared": its WHERE as one Column, or None
    time: str | None = None            # "shared": its stream's time column
    conjuncts: list = field(default_factory=list)   # "shared": its WHERE as CQL conjuncts (for an Arrow filter)
    clock_pred: object = None          # "shared": its WHERE's conjuncts not naming the time column, one Column
    clock_conjuncts: list = field(default_factory=list)     # "shared": those conjuncts in CQL (for an Arrow filter)
    clock: str | None = None           # "shared" with a clock_pred: the name of its clock (clock.filtered)
    name_of: object = None             # "shared": a column node's name in its stream
    why_alone: str | None = None
    source: str | None = None          # the group's name of the one stream it reads (None: several)
    reads: tuple = ()                  # "alone": the group's names of the streams it reads
    window_qos: tuple | None = None    # "shared": the QoS range (min, max) µs of its window (WITH (WINDOW …))
    key_text: str = ""                 # "shared": its GROUP BY as text (the state estimate's key count)
    signature: tuple | None = None     # "shared": what its slices depend on but its start (_loads; computed once)
    registered: int | None = None      # "shared": the window of its text (µs); a re-plan grows back toward it
    plan: object = None                # its logical plan (pyspark_cq.plan), as the policies see it
    qos: dict = field(default_factory=dict)         # its QoS ranges by plan label (WITH (…))


class QueryGroup:
    """Many continuous queries over the same sources run as one Spark streaming query.

    Parameters
    ----------
    spark : SparkSession
        Classic or Spark Connect.
    sources : mapping of str to DataFrame
        The streams by the names the queries use (streaming DataFrames with a watermark on their time
        column, as :func:`pyspark_cq.cql` needs for stateful queries).
    checkpoint : str
        A directory for the group's Spark checkpoint (``<checkpoint>/spark``) and its plan
        (``<checkpoint>/cq_group``). Start the group again on it and the queries continue where they stopped.
    shards : int, optional
        Hash shards of each shared stage's state (Spark groups of its stateful step); default 8. Keep it for
        the life of the checkpoint.
    name : str
        The Spark query's name (``StreamingQuery.name``); default ``"cq_group"``.

    Examples
    --------
    >>> g = cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint="ck/")          # doctest: +SKIP
    >>> g.add("eu_1m", "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 10 SECONDS] "
    ...                "WHERE region = 'eu' GROUP BY page)", sink="out/eu_1m")         # doctest: +SKIP
    >>> query = g.start(trigger={"availableNow": True})                               # doctest: +SKIP
    >>> query.awaitTermination()                                                       # doctest: +SKIP

    See docs/groups.md.
    """

    def __init__(self, spark, sources, checkpoint, *, shards=None, name="cq_group"):
        if not (hasattr(spark, "readStream") and hasattr(spark, "createDataFrame")):
            raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError(f"sources must be a non-empty mapping {{stream name: streaming DataFrame}}, got "
                            f"{type(sources).__name__}")
        for k, v in sources.items():
            if not isinstance(k, str) or not k or not hasattr(v, "isStreaming"):
                raise TypeError(f"sources must map stream names (str) to DataFrames, got {k!r}: {type(v).__name__}")
            if not v.isStreaming:
                raise ValueError(f"sources[{k!r}] must be a streaming DataFrame (spark.readStream…); a group runs "
                                 f"continuous queries")
        if isinstance(checkpoint, os.PathLike):
            checkpoint = os.fspath(checkpoint)
        if not isinstance(checkpoint, str) or not checkpoint:
            raise TypeError(f"checkpoint must be a directory path (str), got {checkpoint!r}")
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
            raise ValueError(f"shards must be a positive int or None, got {shards!r}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        self.spark, self.sources, self.name = spark, dict(sources), name
        self.checkpoint = os.path.abspath(checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint)
        self.shards = 8 if shards is None else shards
        self._dir = D.group_dir(self.checkpoint)
        self._members: dict[str, _Member] = {}     # by name, in the order added
        self._query = None
        self._lock = threading.Lock()
        self._counter = 0
        #: set by ``CQRuntime.register_group``: ``admission(group, new, members)`` with the
        #: :class:`~pyspark_cq.cost.groups.MemberLoad` / ``JoinLoad`` of a query being added and of the group's
        #: shared queries and joins (:meth:`_loads`);
        #: raises to refuse the query (PIPES §4.1.1), before anything of the group changes
        self._admission = None

    # ---- the queries ---------------------------------------------------------------------------------
    def add(self, name, query, sink):
        """Add a query.

        Parameters
        ----------
        name : str
            The query's name in the group (unique).
        query : str or pyspark_cq.lang.ast.Statement
            CQL text (docs/cql.md) over the group's sources, or a parsed statement (``pyspark_cq.lang.parse``).
        sink : str or callable
            A directory (parquet files, one per micro-batch, written idempotently by batch id) or
            ``f(df, batch_id)`` called with each micro-batch's rows of this query (a batch DataFrame).

        Raises
        ------
        CQLSyntaxError, CQLCompileError
            The query does not parse or compile (line and column, the query's name in front).
        ValueError
            A name or sink used twice, a source that is not the group's, or (group running) a query that
            cannot join the running plan. Nothing already running is disturbed.

        Notes
        -----
        Added while the group runs, a query takes effect at the next micro-batch boundary and starts with the
        next window that begins after the largest event time the group has seen: its first rows are complete
        windows. Only a windowed aggregation whose WHERE, grouping key and aggregate inputs the running
        shared stage already computes can join a running group (see docs/groups.md).
        """
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        with self._lock:
            if name in self._names():
                raise ValueError(f"query {name!r}: the name is already used in this group")
            sink = check_sink(sink, name)
            for other, s in self._sinks():
                if same_sink(s, sink):
                    raise ValueError(f"query {name!r}: its sink is already query {other!r}'s; give each query "
                                     f"its own sink")
            member = self._plan_member(name, query, sink)
            if self._query is not None:
                self._join_running(member)
            if self._admission is not None and member.spec.kind in ("shared", "join") and member.spec.active:
                loads = self._loads(member)
                self._admission(self, loads[-1], loads[:-1])
            self._members[name] = member
            if self._query is None:
                return
            D.ask(self._dir, ("add", member.spec))

    def remove(self, name):
        """Remove query ``name``: it delivers no more rows; a shared query's state is freed at the next
        micro-batch (a query running alone keeps computing until the group restarts without it).
        """
        with self._lock:
            self._known(name)
            if self._query is None:
                del self._members[name]
                return
            del self._members[name]
            D.ask(self._dir, ("remove", name))

    def pause(self, name):
        """Make query ``name`` inactive (STREAM §2.3): from the next micro-batch it delivers no rows; a shared
        query also stops computing and frees its state.
        """
        self._set_active(name, False)

    def resume(self, name):
        """Make a paused query active again: a shared query starts afresh with the next window that begins
        after the largest event time seen (as a query added to a running group); one running alone delivers
        its rows again.
        """
        self._set_active(name, True)

    def set_window(self, name, window, *, replan=None):
        """Set the window of the shared ``RSTREAM`` query ``name`` (µs, or a ``timedelta``): from the next
        micro-batch its sweep emits windows of the new size, and its slice class's table keeps slices for the
        class's widest window at that micro-batch's eviction (a reduction frees state there). The window must be
        a multiple of the query's slice length (so it stays in its slice class) and at least its slide. Used by
        the runtime's re-plans under a memory budget (docs/groups.md, "The runtime").

        The window is kept in the group's plan, under its checkpoint: a group started again on the checkpoint
        with the same query (name and text) runs with it (:meth:`windows`). A group that has stopped takes it
        into its plan at once (no micro-batch is left to apply it at).

        Parameters
        ----------
        name : str
            A shared ``RSTREAM`` query of the group.
        window : int or timedelta
            The new window (µs).
        replan : mapping, optional
            What set it (JSON-able; the runtime's re-plan: ``direction``, ``f``, ``time``), kept with the window.
        """
        if isinstance(window, timedelta):
            window = round(window / timedelta(microseconds=1))
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise TypeError(f"window must be a positive int of µs or a timedelta, got {window!r}")
        if replan is not None and not isinstance(replan, Mapping):
            raise TypeError(f"replan must be None or a mapping describing the re-plan, got {type(replan).__name__}")
        with self._lock:
            self._known(name)
            m = self._members[name]
            if m.spec.kind != "shared" or m.spec.at[1]:
                raise ValueError(f"query {name!r}: only a shared RSTREAM aggregate's window can be set (it is "
                                 f"{'an ISTREAM / DSTREAM aggregate' if m.spec.kind == 'shared' else m.spec.kind})")
            c = m.spec.config
            if window % c.granularity or window < c.slide:
                raise ValueError(f"window must be a multiple of query {name!r}'s slice length {c.granularity} µs "
                                 f"and at least its slide {c.slide} µs, got {window}")
            why = None if replan is None else dict(replan)
            m.spec = replace(m.spec, config=replace(c, window=window), replan=why)
            if self._query is None:
                return
            change = ("window", name, window, why)
            if self._query.isActive:
                D.ask(self._dir, change)
                return
            # stopped (availableNow ended, stop(), a failure): a change queued now would be voided by the next
            # start; the plan is the checkpoint's record, so the window goes into it directly
            from .batch import apply_changes

            plan = D.read_plan(self._dir)
            if plan is not None:
                D.write_plan(self._dir, apply_changes(plan, [change], plan.max_time))

    def windows(self) -> dict:
        """The window of each shared ``RSTREAM`` query: ``window`` in effect (µs; the running plan's once it
        applied a change), ``registered`` (its text's, µs) and ``replan``, the record of the last re-plan that set
        it (``direction``, ``f``, ``time``, ``budget`` or ``policy``; None: never set). A window set by a re-plan
        survives a restart from the checkpoint.

        Returns
        -------
        dict
            By query name: ``{"window": int, "registered": int, "replan": dict or None}``.
        """
        plan = D.read_plan(self._dir) if self._query is not None else None
        out = {}
        for name, m in self._members.items():
            if m.spec.kind != "shared" or m.spec.at[1]:
                continue
            spec = plan.by_name(name) if plan is not None else None
            spec = spec if spec is not None and spec.key == m.spec.key else m.spec
            out[name] = {"window": spec.config.window, "registered": m.registered, "replan": spec.replan}
        return out

    def member_plans(self) -> dict:
        """Each query's logical plan and QoS ranges as the runtime's policies see them (docs/groups.md, "The
        runtime"): by name, ``plan`` (:mod:`pyspark_cq.plan`; a shared query's ``Window`` at the window in effect,
        :meth:`windows`), ``qos`` (label ``"<name>_agg.window"`` -> ``QoSRange`` of a shared ``RSTREAM``
        query whose text gives one; the only parameter of a member a policy may change, through
        :meth:`set_window`; a join's is empty: its windows are its join class's band, fixed at start) and
        ``slice_class`` (the first query of its slice class, whose table it shares; for a join the first query of
        its join class, whose state it shares; None for a query running alone or a paused shared query).
        """
        from .. import plan as P

        windows = self.windows()
        classes = {m.name: m.state_class for m in self._loads()}
        out = {}
        for name, m in self._members.items():
            plan, qos = m.plan, {}
            if name in windows and plan is not None:
                label = next((k for k in m.qos if k.endswith(".window")), None)
                size = windows[name]["window"]
                plan = P.rewrite(plan, lambda n, w=size: {"size": w} if isinstance(n, P.Window) and n.kind == "time"
                                 else {})
                if label is not None:
                    qos = {label: m.qos[label]}
            out[name] = {"plan": plan, "qos": qos, "slice_class": classes.get(name)}
        return out

    def _loads(self, candidate=None) -> list:
        """The :class:`~pyspark_cq.cost.groups.MemberLoad` of each active shared query (in the order added), the
        :class:`~pyspark_cq.cost.groups.JoinLoad` of each join (:meth:`_join_loads`), then the load of
        ``candidate`` (a ``_Member`` being added); slice classes as :func:`~.worker.slice_classes` forms them,
        from the driver's specs (a query joining a running group: at its next window after the event times seen).
        """
        plan = D.read_plan(self._dir) if self._query is not None else None
        joins = self._join_loads(plan, candidate)
        if candidate is not None and candidate.spec.kind == "join":
            return self._shared_loads(plan) + joins
        shared = self._shared_loads(plan, candidate)
        return shared + joins if candidate is None else shared[:-1] + joins + shared[-1:]

    def _join_loads(self, plan, candidate=None) -> list:
        """The :class:`~pyspark_cq.cost.groups.JoinLoad` of each join of the group (in the order added; a paused
        join too: its class's state runs on), then of ``candidate`` if it is a join. A join class is named by its
        first member, as ``queries`` names it; in a running group the class's state keeps the band the group
        started with (its Spark plan's), so the class's first member carries those windows.
        """
        from ..cost.groups import JoinLoad
        from .joins import config_windows

        specs = [m.spec for m in self._members.values()]
        if candidate is not None and candidate.spec.kind == "join":
            specs.append(candidate.spec)
        started = plan.catalogue.get("__joins__", {}) if plan is not None else {}
        out = []
        for cid, ms in _join_classes(specs).items():
            for i, s in enumerate(ms):
                wl, wr = s.join.windows
                if i == 0 and cid in started:
                    was = config_windows(started[cid][0])
                    wl, wr = max(wl, was[0]), max(wr, was[1])
                out.append((s.name, JoinLoad(s.name, ms[0].name, s.join.left, s.join.right, wl, wr)))
        last = [j for n, j in out if candidate is not None and n == candidate.spec.name]
        return [j for n, j in out if candidate is None or n != candidate.spec.name] + last

    def _shared_loads(self, plan, candidate=None) -> list:
        """The :class:`~pyspark_cq.cost.groups.MemberLoad` of the active shared queries, then of ``candidate`` (a
        shared query being added), in the running ``plan`` (None: not running).
        """
        from ..cost.groups import MemberLoad, granularity_classes

        ms = [m for m in self._members.values() if m.spec.kind == "shared" and m.spec.active]
        if candidate is not None:
            ms.append(candidate)
        ratio = self._granularity_ratio(plan if plan is not None else D.read_plan(self._dir))
        reps, unhashed, rows = {}, [], []
        for m in ms:
            spec = plan.by_name(m.spec.name) if plan is not None else None
            if spec is not None and spec.key == m.spec.key:
                start = spec.start_us
            else:   # not in the running plan yet: it starts at its next window (batch.apply_changes)
                start = next_window(m.spec, plan.max_time) if plan is not None else m.spec.start_us
            c = m.spec.config
            if m.signature is None:     # Column texts cost a JVM call each: once per query
                m.signature = (m.spec.family, None if m.mask is None else str(m.mask),
                               tuple(str(e) for _, e in m.exprs[1:]),
                               replace(c, window=0, slide=0, granularity=0, emit="windows", name="", out_names=()))
            sig = m.signature + (m.spec.arrow_filter, start)
            try:
                same = reps.setdefault(sig, [])
            except TypeError:           # an unhashable part: compare with ==, as slice_classes does
                same = next((ns for s, ns in unhashed if s == sig), None)
                if same is None:
                    same = []
                    unhashed.append((sig, same))
            same.append(len(rows))
            rows.append((m, same))
        # the same slices but for the granularity: classes across granularities, as slice_classes forms them
        cls = {}
        for same in [*reps.values(), *(ns for _, ns in unhashed)]:
            firsts = granularity_classes([rows[i][0].spec.config.granularity for i in same], ratio)
            cls.update((i, rows[same[f]][0].spec.name) for i, f in zip(same, firsts))
        out = []
        for i, (m, _) in enumerate(rows):
            c = m.spec.config
            lo, hi = m.window_qos if m.window_qos is not None else (None, None)
            out.append(MemberLoad(m.spec.name, cls[i], m.spec.family, c.window, c.slide, c.granularity, lo, hi,
                                  m.key_text, m.registered))
        return out

    @staticmethod
    def _granularity_ratio(plan) -> int:
        """The bound of the slice classes across granularities: the checkpoint's plan's (1 for a plan written
        before classes spanned granularities, so its shards' tables stay as they are), else
        :data:`~pyspark_cq.cost.groups.MERGE_RATIO`.
        """
        from ..cost.groups import MERGE_RATIO

        return plan.granularity_ratio if plan is not None else MERGE_RATIO

    @property
    def queries(self) -> dict:
        """The group's queries by name: ``status`` (``"active"``, ``"paused"``, or ``"pending"`` until the
        next micro-batch boundary applies a change), ``mode`` (``"shared"`` with its ``stream``, ``"join"``: a
        member of a shared join class, inner or outer, its ``stream`` ``"left JOIN right"`` (an outer join
        ``"left LEFT JOIN right"``, ``RIGHT``, ``FULL``) and its ``join_class`` the class's first member
        (:mod:`.joins`), ``"rows"``: a ROWS window in the shared stage with its ``stream`` (:mod:`.rows`), or
        ``"alone"`` with ``why``), ``sink``, ``start`` (the event time it
        counts rows from, None: the group's start), the ``rows`` delivered so far, and ``slices``: for an
        active shared query of a running group the name of the query whose slices it shares (itself when no
        earlier query slices alike, see :func:`~.worker.slice_classes`), else None; ``slice_length``, its class's
        slice length (µs, the gcd of the class's granularities: a class may span granularities, docs/groups.md
        "Sharing"), else None.
        """
        from .worker import class_granularities, slice_classes

        plan = D.read_plan(self._dir) if self._query is not None else None
        stats = D.read_stats(self._dir) if self._query is not None else {}
        classes, lengths = {}, {}
        if plan is not None:
            shared = [m for m in plan.members.values() if m.kind == "shared" and m.active]
            for fam in {m.family for m in shared}:
                fam_classes = slice_classes([m for m in shared if m.family == fam], plan.granularity_ratio)
                classes.update(fam_classes)
                lengths.update(class_granularities([m for m in shared if m.family == fam], fam_classes))
        # a join member's class: the first member (in the order added) joining the same streams on the same key
        classes_now = _join_classes([m.spec for m in self._members.values()])
        join_of = {s.name: specs[0].name for specs in classes_now.values() for s in specs}
        out = {}
        for name, m in self._members.items():
            spec = plan.by_name(name) if plan is not None else None
            if self._query is None:
                status = "active" if m.spec.active else "paused"
            elif spec is None or spec.key != m.spec.key or spec.active != m.spec.active:
                status = "pending"
            else:
                status = "active" if spec.active else "paused"
            start = (spec or m.spec).start_us
            out[name] = {"status": status, "mode": m.spec.kind, "why": m.why_alone,
                         "stream": m.spec.family if m.spec.join is None else _join_stream(m.spec.join),
                         "join_class": join_of.get(name),
                         "sink": m.sink if isinstance(m.sink, str) else getattr(m.sink, "__name__", repr(m.sink)),
                         "start": None if start is None else datetime(1970, 1, 1, tzinfo=timezone.utc)
                         + timedelta(microseconds=start),
                         "rows": stats.get(name, {}).get("rows", 0), "text": m.spec.text,
                         "slices": plan.members[classes[spec.key]].name if spec is not None and spec.key in classes
                         else None,
                         "slice_length": lengths[classes[spec.key]] if spec is not None and spec.key in classes
                         else None}
        return out

    def query_metrics(self, name: str, batch=None):
        """The counters query ``name`` reported (its shards' summed, ``output_rows`` what reached its sink), as
        :func:`pyspark_cq.read_metrics` reads them for a streaming query (``cq.read_metrics(group, name)``
        calls this).

        Parameters
        ----------
        name : str
            A query of the group.
        batch : None, "last", int, "total" or "all"
            None: the latest micro-batch in which the query had input or output; ``"last"``: the last one;
            an int: that batch id; ``"total"``: summed over the kept batches (state sizes: the last); ``"all"``:
            ``[(batch_id, counters), ...]``. The group keeps the last 100 micro-batches per query.
        """
        from ..operators._common.metrics import total
        from ..vocabulary import metrics as M

        self._known(name)
        history = [(b, c) for b, c in D.read_stats(self._dir).get(name, {}).get("history", [])]
        if batch == "all":
            return history
        if not history:
            return None
        if batch == "total":
            return total(c for _, c in history)
        if batch == "last":
            return history[-1][1]
        if batch is not None:
            if isinstance(batch, bool) or not isinstance(batch, int):
                raise TypeError(f"batch must be None, 'last', 'total', 'all' or a batch id (int), got {batch!r}")
            return next((c for b, c in history if b == batch), None)
        busy = [c for _, c in history if c.get(M.INPUT_ROWS) or c.get(M.OUTPUT_ROWS)]
        return busy[-1] if busy else history[-1][1]

    def stream_times(self) -> dict:
        """Each stream of the running group's shared stage with its times as Spark gives them to a query over the
        stream alone (:func:`~.clock.stream_times`): ``event_time`` (µs), ``watermark`` (µs, the next
        micro-batch's), ``watermark_delay`` (s, None until the watermark is above 0) and ``advances`` (s).

        With several streams the group's Spark watermark is the group clock, not a stream's (docs/groups.md,
        "Several streams"); these are what the runtime's snapshot and the console show for each query. Empty
        before :meth:`start`.
        """
        from . import clock as C

        plan = D.read_plan(self._dir) if self._query is not None else None
        if plan is None:
            return {}
        delays = plan.catalogue.get("__delays__", {})
        # and each filtered clock: the times of the queries whose WHERE holds their watermark back
        return C.stream_times(plan.clocks, {**delays, **C.filtered_delays(delays, plan.members.values())},
                              plan.max_time)

    def group_clocked(self) -> bool:
        """Whether the running group's Spark watermark and event time are the group clock's (several streams, joins,
        ROWS windows or a query whose WHERE holds its watermark back: docs/groups.md), not a stream's; then each
        query's times are those of its clock in :meth:`stream_times` (:meth:`member_clock`).
        """
        plan = D.read_plan(self._dir) if self._query is not None else None
        if plan is None:
            return False
        if "__streams__" in plan.catalogue:
            return plan.catalogue["__streams__"] is not None
        return len(plan.catalogue.get("__delays__", {})) > 1    # a plan written before the flag

    def member_stream(self, name: str) -> str | None:
        """The stream query ``name`` reads (the group's name of it; None: several)."""
        self._known(name)
        return self._members[name].source

    def member_clock(self, name: str) -> str | None:
        """The clock of :meth:`stream_times` whose times are query ``name``'s: its filtered clock when its WHERE
        holds its watermark back (:func:`~.clock.filtered`), else its stream (None: several).
        """
        self._known(name)
        m = self._members[name]
        return getattr(m.spec, "clock", None) or m.source

    def overview(self) -> dict:
        """The group at a glance (JSON-able): its plan, sharing and per-query rows, as the console and the demo
        show it (docs/groups.md, "At a glance").

        Returns
        -------
        dict
            ``name``, ``running``, ``query_id`` (the Spark query's, None before :meth:`start`), ``shards``,
            ``members`` (by name: :attr:`queries`' fields, ``start`` as ISO text, and the query's counters:
            ``input_rows``, ``late_rows``, ``malformed_rows`` summed over the kept micro-batches, ``state_rows``
            and ``state_bytes`` of the last one, ``batches``), ``slice_classes`` (lists of names, the class's
            first query first) and ``state_rows`` / ``state_bytes``: the group's state, each shared slice
            table counted once (it is reported on its class's first query, the others report 0).
        """
        from ..operators._common.metrics import total as _total
        from ..vocabulary import metrics as M

        queries = self.queries
        stats = D.read_stats(self._dir) if self._query is not None else {}   # read once (the console: every second)
        times = self.stream_times()
        members, classes = {}, {}
        for name, q in queries.items():
            history = stats.get(name, {}).get("history", [])
            total = _total(c for _, c in history) if history else {}      # as query_metrics(name, "total")
            members[name] = {**q, "start": None if q["start"] is None else q["start"].isoformat(),
                             "batches": stats.get(name, {}).get("batches", 0),
                             **{k: int(total.get(k, 0)) for k in (M.INPUT_ROWS, M.LATE_ROWS, M.MALFORMED_ROWS)},
                             **{k: int(total[k]) if k in total else None for k in (M.STATE_ROWS, M.STATE_BYTES)},
                             **_times(times.get(self.member_clock(name)))}
            if q["slices"] is not None:
                classes.setdefault(q["slices"], []).append(name)
        query = self._query
        return {"name": self.name, "running": bool(query is not None and query.isActive),
                "query_id": None if query is None else str(query.id), "shards": self.shards, "members": members,
                "slice_classes": [[first] + [n for n in names if n != first] for first, names in classes.items()],
                **{k: sum(m[k] or 0 for m in members.values()) for k in (M.STATE_ROWS, M.STATE_BYTES)}}

    # ---- running -------------------------------------------------------------------------------------
    def start(self, trigger=None):
        """Start the group as one Spark streaming query and return it (``StreamingQuery``).

        Parameters
        ----------
        trigger : dict, optional
            Keyword arguments of ``DataStreamWriter.trigger``, e.g. ``{"availableNow": True}`` or
            ``{"processingTime": "10 seconds"}``; None: Spark's default (micro-batches as fast as possible).
        """
        if trigger is not None:
            if not isinstance(trigger, Mapping) or len(trigger) != 1 or next(iter(trigger)) not in _TRIGGERS:
                raise ValueError(f"trigger must be None or a dict with one of {list(_TRIGGERS)} as its key "
                                 f"(DataStreamWriter.trigger's keywords), got {trigger!r}")
        with self._lock:
            if self._query is not None and self._query.isActive:
                raise RuntimeError(f"query group {self.name!r} is already running ({self._query.id})")
            if not self._members:
                raise ValueError("the group has no query: add() at least one before start()")
            return self._start(trigger)

    def _start(self, trigger):
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_type

        from .. import _validate
        from ..operators.aggregate.config import SHARD, TIME
        from .batch import GroupBatch
        from .worker import OUTPUT_SCHEMA, STATE_SCHEMA, GroupShard, GroupSlicer, PackRows, sliced_schema

        previous = D.read_plan(self._dir)
        families, alone = branches_of([m.spec for m in self._members.values()])
        self._keep_join_classes(previous)
        join_classes = _join_classes([m.spec for m in self._members.values()])
        join_streams = {s for ms in join_classes.values() for s in (ms[0].join.left, ms[0].join.right)}
        rows = [m for m in self._members.values() if m.spec.kind == "rows"]
        join_streams |= {m.spec.family for m in rows}   # a ROWS member's stream: its packer's clock rows
        layout = check_layout(self.name, self.checkpoint, previous, set(families) | join_streams,
                              [s.key for s in alone] + [m.spec.key for m in rows])
        check_join_layout(self.name, self.checkpoint, previous, join_classes)
        families = {fam: [self._members[s.name] for s in specs] for fam, specs in families.items()}
        alone = [self._members[s.name] for s in alone]
        # several streams with shared queries, or joins: one slicer per stream and one packer per join class,
        # united into the one stateful stage
        # an outer class's filtered inputs keep clocks of their own (joins.class_sides): in the group clock too, so
        # that Spark runs a micro-batch when their watermark advances (as it does for the query alone)
        from . import clock as C
        from .joins import class_sides

        filtered = {n for ms in join_classes.values() for n in class_sides(ms[0].join)} - join_streams
        # a shared query whose WHERE holds predicates not naming the time column runs at the clock of the rows that
        # pass them (as alone): its stream's slicer records that clock apart, in the group clock too
        clocked = {m.spec.key: m.clock for fam, ms in families.items()
                   if _delay(self.sources[fam], ms[0]) is not None for m in ms if m.clock is not None}
        # Spark's watermark is the minimum over every withWatermark of its query: a member running alone over
        # another watermarked stream would hold the one-stream shared stage at that stream's watermark; on the group
        # clock (the max policy) each stream's watermark is its own, as alone
        others = {s for m in alone for s in m.reads
                  if s not in families and _validate.watermarked_columns(self.sources[s])}
        held = bool(others) and bool(families) and all(_delay(self.sources[f], ms[0]) is not None
                                                       for f, ms in families.items())
        several = len(families) > 1 or bool(join_classes) or bool(rows)
        if previous is not None and not several and previous.catalogue.get("__streams__") is None:
            # a checkpoint of a one-stream group at Spark's watermark keeps its query's shape
            clocked, held = {}, False
        several = several or held
        streams = (tuple(sorted(set(families) | join_streams | filtered | set(clocked.values())))
                   if several or clocked else None)
        # each stream's watermark delay (ms, None: none) in the plan: the runtime's per-stream times (.clock)
        branches, slicers, delays, catalogue = [], [], {}, {"__layout__": layout}
        specs = {}
        for fam in sorted(families):
            ms = families[fam]
            base = self.sources[fam]
            stage = base.select("*", *[c.alias(n) for m in ms for n, c in m.computed])
            cols: dict[str, object] = {}
            cat: dict[str, str] = {}

            def column(expr, cols=cols, cat=cat):
                text = str(expr)
                if text not in cat:
                    cat[text] = f"__cq_c{len(cat)}"
                    cols[cat[text]] = expr
                return cat[text]

            time_col = ms[0].exprs[0][1]
            # every plain column, for queries that join the running group with a WHERE evaluated in Arrow
            raw, types = {}, {}
            for f in base.schema.fields:
                if f.dataType.typeName() in _RAW_TYPES:
                    raw[f.name] = column(F.col(f"`{f.name.replace('`', '``')}`"))
                    types[f.name] = to_arrow_type(f.dataType)
            for m in ms:
                mapping = tuple((n, column(e)) for n, e in m.exprs[1:])
                mask = None if m.mask is None else column(F.coalesce(m.mask, F.lit(False)))
                clock = clocked.get(m.spec.key)
                clock_mask = None if clock is None else column(F.coalesce(m.clock_pred, F.lit(False)))
                m.spec = replace(m.spec, columns=mapping, mask=mask, clock=clock, clock_mask=clock_mask)
            catalogue[fam] = dict(cat)
            catalogue[f"{fam}/raw"] = (raw, types)
            projected = stage.select(time_col.alias(TIME), *[e.alias(n) for n, e in cols.items()])
            time_type = projected.schema[TIME].dataType
            delay = _delay(base, ms[0])
            delays[fam] = delay
            sliced = projected.mapInArrow(GroupSlicer(self._dir, fam, time_type, delay, streams),
                                          sliced_schema(time_type, delay, streams is not None))
            if streams is None:
                branches.append(sliced.groupBy(SHARD).applyInPandasWithState(
                    GroupShard(self._dir, (fam,), delay is not None), OUTPUT_SCHEMA, STATE_SCHEMA, "append",
                    "EventTimeTimeout" if delay is not None else "NoTimeout"))
                continue
            if delay is None:
                raise ValueError(f"query group {self.name!r}: sources[{fam!r}] needs a watermark on its time column "
                                 f"({ms[0].time!r}): with windowed aggregations over several streams each stream's "
                                 f"windows close at its own watermark; call .withWatermark({ms[0].time!r}, "
                                 f"'<delay>') on it")
            slicers.append(sliced)
        joins, join_delays = {}, {}
        for cid, ms in join_classes.items():
            sliced, config, sides = self._join_branch(ms, streams)
            slicers.append(sliced)
            joins[cid] = (config, sides)
            j = ms[0].join
            for side, (name, fam) in enumerate(zip(sides, (j.left, j.right))):
                if delays.get(fam) is None:
                    delays[fam] = _validate.watermark_delay_ms(self.sources[fam], j.times[side])
                if name != fam:     # a filtered input's clock: the stream's delay
                    join_delays[name] = delays[fam]
        catalogue["__joins__"] = joins
        catalogue["__streams__"] = streams    # None: one stream at Spark's watermark (no filtered clocks)
        join_delays.update(C.filtered_delays(delays, [m.spec for ms in families.values() for m in ms]))
        for m in rows:     # in the shared stage too (Spark allows one applyInPandasWithState per query)
            slicers.append(self._rows_branch(m, streams))
        if streams is not None:
            branches.append(_stateful_stage(reduce(lambda a, b: a.union(b), slicers)).groupBy(SHARD)
                            .applyInPandasWithState(GroupShard(self._dir, streams, True, {**delays, **join_delays}),
                                                    OUTPUT_SCHEMA,
                                                    STATE_SCHEMA, "append", "EventTimeTimeout"))
        catalogue["__delays__"] = dict(delays)
        for m in alone:
            branches.append(m.dataframe.mapInArrow(PackRows(m.spec.key, m.spec.arrow_schema), OUTPUT_SCHEMA))
        max_time = previous.max_time if previous is not None else None
        for m in self._members.values():
            spec = m.spec
            old = previous.members.get(spec.key) if previous is not None else None
            if old is not None:       # continues from the checkpoint
                spec = replace(spec, start_us=old.start_us)
                if spec.kind == "shared" and old.config is not None:
                    # a window a re-plan set (set_window) lives in the plan: the same query (name and text, so
                    # the same key) goes on with it; a query re-added with another text is a new key, and runs
                    # with its text's window
                    spec = replace(spec, config=replace(spec.config, window=old.config.window), replan=old.replan)
            elif previous is not None and spec.kind == "shared":   # new to a group that ran: next window
                if spec.at[1]:
                    raise ValueError(f"query {spec.name!r}: an ISTREAM / DSTREAM aggregate new to a group that "
                                     f"already ran cannot join its checkpoint (its change intervals have no "
                                     f"start to join at); start the group on a new checkpoint")
                spec = replace(spec, start_us=next_window(spec, max_time))
            m.spec = spec
            specs[spec.key] = spec
        version = previous.version + 1 if previous is not None else 1
        D.write_plan(self._dir, D.Plan(version=version, members=specs, catalogue=catalogue, max_time=max_time,
                                       clocks=previous.clocks if previous is not None else (),
                                       granularity_ratio=self._granularity_ratio(previous)))
        for path, _ in D.pending_changes(self._dir):   # asked of a run that has ended: void
            os.remove(path)
        union = reduce(lambda a, b: a.union(b), branches)
        # a first start killed while it wrote its first offset leaves a temporary Spark then refuses forever
        clear_unstarted_checkpoint(os.path.join(self.checkpoint, "spark"))
        writer = (union.writeStream.foreachBatch(GroupBatch(self._dir))
                  .option("checkpointLocation", os.path.join(self.checkpoint, "spark")).queryName(self.name))
        if trigger is not None:
            writer = writer.trigger(**trigger)
        # the stateful steps' Spark partitions: one per shard rather than the session's default (200 on a
        # plain session: 200 tasks and state-store commits per micro-batch); Spark keeps the number in the
        # checkpoint, so this matters at the first start only. The session's own setting is restored.
        # Several streams: Spark's query watermark is the group clock (.clock), under the "max" policy, on a
        # watermark defined after the sources' own; Spark allows that ("redefining" a watermark) only with one
        # watermark for all stateful operators (allowMultiple false; the group has one stateful operator). Spark
        # keeps the partitions and the policy in the checkpoint at the first start; the stream, which clones the
        # session when it is created, keeps them all. The session's own settings are restored.
        settings = {"spark.sql.shuffle.partitions": str(self.shards)}
        if streams is not None:
            settings[_POLICY] = "max"
            settings["spark.sql.streaming.statefulOperator.allowMultiple"] = "false"
        conf = self.spark.conf
        before = {k: conf.get(k, None) for k in settings}
        for k, v in settings.items():
            conf.set(k, v)
        try:
            self._query = writer.start()
        finally:
            for k, v in before.items():
                if v is None:
                    conf.unset(k)
                else:
                    conf.set(k, v)
        return self._query

    # ---- helpers -------------------------------------------------------------------------------------
    def _names(self):
        return set(self._members)

    def _sinks(self):
        return [(n, m.sink) for n, m in self._members.items()]

    def _known(self, name):
        if name not in self._members:
            raise KeyError(f"query {name!r} is not in the group (queries: {sorted(self._members)})")

    def _set_active(self, name, active: bool):
        with self._lock:
            self._known(name)
            m = self._members[name]
            if active and not m.spec.active and self._query is not None and m.spec.kind == "shared" and m.spec.at[1]:
                raise ValueError(f"query {name!r}: a paused ISTREAM / DSTREAM aggregate cannot resume in a running "
                                 f"group (its change intervals have no start to resume at); start the group again")
            if active and not m.spec.active and self._query is not None and m.spec.kind in ("join", "rows"):
                what = ("a paused join cannot resume in a running group (its pairs are emitted when their later row "
                        "arrives; those of the pause are gone)" if m.spec.kind == "join" else "a paused ROWS window "
                        "cannot resume in a running group (its window's rows of the pause are gone)")
                raise ValueError(f"query {name!r}: {what}; start the group again")
            m.spec = replace(m.spec, active=active)
            if self._query is not None:
                D.ask(self._dir, ("resume" if active else "pause", name))

    def _plan_member(self, name: str, query, sink) -> _Member:
        from ..lang import ast as A
        from ..lang.builder import compile_cql
        from ..lang.parser import parse
        from ..lang.printer import to_text

        if isinstance(query, str):
            text = query
            statement = _named(name, parse, query)
        elif isinstance(query, A.Statement):
            statement, text = query, to_text(query)
        else:
            raise TypeError(f"query {name!r}: query must be CQL text (str) or a parsed Statement, got "
                            f"{type(query).__name__}")
        lookup = _lookup(name, statement, self.sources)
        compiled = _named(name, compile_cql, self.spark, statement, lookup, name=name)
        from ..operators._common.metrics import arrow_schema

        df = compiled.dataframe
        schema = arrow_schema(df.schema)
        key = f"{name}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
        spec = D.MemberSpec(key=key, name=name, text=text, kind="alone", sink=encode_sink(sink), arrow_schema=schema)
        if compiled.analysis.shape == "join":
            return _named(name, self._join_member, spec, sink, compiled, lookup)
        if compiled.analysis.shape in ("rows", "rows_aggregate"):
            return _named(name, self._rows_member, spec, sink, compiled, lookup)
        if compiled.analysis.shape == "join_aggregate" and len(compiled.analysis.sources) == 2:
            return _named(name, self._join_aggregate_member, spec, sink, compiled, lookup)
        if compiled.analysis.shape == "multi_join":
            return _named(name, self._multi_join_member, spec, sink, statement, compiled, lookup)
        why = _classify(name, compiled.analysis)
        if why is not None:
            return self._alone_member(spec, sink, df, why, compiled)
        self._counter += 1
        member = _named(name, self._shared_member, spec, sink, compiled, lookup, df)
        member.plan, member.qos = compiled.plan, dict(compiled.qos)
        return member

    def _multi_join_member(self, spec, sink, statement, compiled, lookup) -> _Member:
        """A join of three or more streams: its own branch of the group's Spark query, the query compiled with its
        ``multi_join`` in a stateless stage (``state_persistence="stateless"``, issue 39) whose state lives in files
        under the group's checkpoint (Spark allows one ``applyInPandasWithState`` per query: the shared stage's).
        It runs at the watermark of its own streams, as alone: the group's micro-batch function tells its tasks to
        compute it from the rows they read (:class:`~.batch.GroupBatch`,
        :data:`~pyspark_cq.operators._common.offsets.OWN_WATERMARK_PROPERTY`) rather than read the group's.
        """
        from ..lang.builder import _time_column, compile_cql
        from .predicates import names_column

        a = compiled.analysis
        why = _join_refusal(a)
        if why is None and a.outer:
            why = "a LEFT JOIN of three or more streams"
        if why is None and a.output_mode != "append":
            why = f"a join of three or more streams in output mode {a.output_mode!r}"
        if why is not None:
            raise ValueError(f"query {spec.name!r}: {why} cannot run in a query group yet (its multi_join runs in a "
                             f"stateless stage there, which takes inner joins in append mode without constraints; "
                             f"docs/groups.md, \"What a group runs\"); run it as its own query")
        for s in a.sources:
            time_col = s.time or _time_column(lookup[s.name], s.name, s.node)
            if any(names_column(p, lambda x, t=time_col: x.name.lower() == t.lower()) for p in s.filters):
                # Spark keeps such a predicate above the stream's withWatermark: alone, the query's watermark
                # comes from every row of the stream, but the stage sees only the rows that pass it
                raise ValueError(f"query {spec.name!r}: a join of three or more streams with a predicate on the time "
                                 f"column of {s.ref} cannot run in a query group yet (its query alone takes the "
                                 f"stream's watermark from the rows before it); run it as its own query")
        state_dir = os.path.join(os.path.abspath(self.checkpoint), "members", spec.key)
        again = compile_cql(self.spark, statement, lookup, name=spec.name,
                            state={"state_persistence": "stateless", "state_dir": state_dir})
        return self._alone_member(spec, sink, again.dataframe, "a join of three or more streams: its multi_join in "
                                  "a stateless stage, its state in files", again)

    def _alone_member(self, spec, sink, dataframe, why: str, compiled) -> _Member:
        """A query running alone (``why``): its own branch ``dataframe`` of the group's Spark query."""
        read = {k for k in self.sources for t in compiled.analysis.sources if k.lower() == t.name.lower()}
        return _Member(spec, sink, dataframe=dataframe, why_alone=why, reads=tuple(sorted(read)), plan=compiled.plan,
                       source=next(iter(read)) if len(read) == 1 else None)

    def _shared_member(self, spec, sink, compiled, lookup, df) -> _Member:
        from pyspark.sql.types import StructType

        from ..lang import ast as A
        from ..lang.analysis import AT, _granularity, _unqualified
        from ..lang.builder import _Builder, _time_column, aggregate_output_sql, sample_condition
        from ..operators._common.metrics import arrow_schema
        from ..operators.aggregate.driver import configure, projection_exprs

        a = compiled.analysis
        s = a.sources[0]
        base = lookup[s.name]
        b = _Builder(self.spark, a, lookup, None)
        b.prefix = f"__cq_q{self._counter}_"
        time = s.time or _time_column(base, s.name, s.node)
        preds = b.predicates(base, s)
        view, by, aggs, out_name, grouped, computed = b.aggregate_inputs(base)
        w = s.window
        config, _, _, _ = configure(view, time, timedelta(microseconds=w.size.micros),
                                    timedelta(microseconds=w.slide.micros), by=by, aggs=aggs,
                                    granularity=timedelta(microseconds=_granularity(w)),
                                    emit="windows" if a.stream == "RSTREAM" else "changes",
                                    shards=self.shards, name=f"{self.name}.{spec.name}")
        g = w.slide.micros
        at = {"RSTREAM": (config.out_names[1], 0), "ISTREAM": (config.out_names[0], g),
              "DSTREAM": (config.out_names[1], g)}[a.stream]
        if _simple(a):
            select, finish, stage = [], None, None
            for item, out in zip(a.select.items, df.columns):
                e = item.expr
                if isinstance(e, A.Call) and e.is_aggregate:
                    select.append((out, out_name[e]))
                elif _unqualified(e) in grouped:
                    select.append((out, grouped[_unqualified(e)]))
                else:   # a grouped column
                    select.append((out, b.name(e)))
        else:   # HAVING or computed select items: the micro-batch function finishes the stage's rows
            having, items = aggregate_output_sql(a.select, b.name, out_name, by, grouped)
            finish = (having, tuple((text, oname) for text, oname, _ in items))
            select = [(c, c) for c in config.out_names]
            fields = list(config.output_schema().fields) + [df.schema[AT]]
            stage = arrow_schema(StructType(fields))
        conjuncts = ([w.where] if w.where is not None else []) + list(s.filters)
        if s.node.sample is not None:   # SAMPLE, a hash of the row's values: a mask as a WHERE is
            preds = [sample_condition(base, s.node.sample)] + preds
            conjuncts = [A.Call("SAMPLE", (A.Column(None, time), A.Literal(s.node.sample)))] + conjuncts
        mask = reduce(lambda x, y: x & y, preds) if preds else None
        # Spark pushes the conjuncts that do not name the time column below the stream's withWatermark: alone,
        # the query's watermark comes from the rows that pass them (its clock, clock.filtered)
        from .predicates import names_column

        pushed = [(p, c) for p, c in zip(preds, conjuncts)
                  if not names_column(c, lambda x: x.name.lower() == time.lower())]
        clock_pred = reduce(lambda x, y: x & y, [p for p, _ in pushed]) if pushed else None
        # the group's name of the stream (a query may spell it in another case): one stream, one slicer
        family = s.name if s.name in self.sources else next(k for k in self.sources if k.lower() == s.name.lower())
        from . import clock as C

        clock = None if clock_pred is None else C.filtered(family, str(clock_pred))
        spec = replace(spec, kind="shared", family=family, config=config, select=tuple(select), at=at,
                       finish=finish, stage_schema=stage)
        exprs = projection_exprs(time, config.keys, config.spec)
        qos = next((r for k, r in a.qos.items() if k.endswith(".window")), None)
        from ..lang.printer import expression

        return _Member(spec, sink, computed=computed, exprs=exprs, mask=mask, time=time, conjuncts=conjuncts,
                       clock_pred=clock_pred, clock_conjuncts=[c for _, c in pushed], clock=clock, name_of=b.name,
                       source=family,
                       window_qos=None if qos is None else (int(qos.min), int(qos.max)),
                       key_text=", ".join(expression(e) for e in a.select.group_by), registered=config.window)

    def _join_branch(self, specs: list, streams: tuple):
        """A join class's branch of the group's Spark query: both streams with canonical column names
        (:func:`~.joins.canonical_names`), tagged and routed to the shards by the hash of the key as
        :func:`~pyspark_cq.window_join` routes them, packed per shard (:class:`~.worker.JoinPacker`). Returns the
        branch, the class's :class:`~pyspark_cq.operators.join.worker.JoinConfig` (the window join of the widest
        windows, :func:`~.joins.class_windows`) and its streams ``(left, right)``.
        """
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from ..operators.join.driver import _tagged, window_band
        from ..operators.join.spec import JoinSpec
        from ..operators.join.worker import LEFT, RIGHT, JoinConfig
        from .joins import LEFT_PREFIX, RIGHT_PREFIX, class_sides, class_windows
        from .worker import JoinPacker, join_class_id, sliced_schema

        j = specs[0].join
        windows = class_windows([s.join for s in specs])
        pairs = sorted(j.pairs)
        inputs = []
        for side, stream, prefix in ((0, j.left, LEFT_PREFIX), (1, j.right, RIGHT_PREFIX)):
            keys = {p[side]: f"cq_k{i}" for i, p in enumerate(pairs)}
            df = self.sources[stream]
            if j.pushed[side] is not None:   # the compiler's predicate on this input, before the join
                df = df.filter(F.expr(j.pushed[side]))
            if j.how == "inner":
                inputs.append(df.select(*[F.col(f"`{c}`").alias(keys.get(c, prefix + c)) for c in df.columns]))
            else:   # an outer join outputs each side's own key columns (null where padded): kept beside the key
                inputs.append(df.select(*[F.col(f"`{c}`").alias(k) for c, k in keys.items()],
                                        *[F.col(f"`{c}`").alias(prefix + c) for c in df.columns]))
        on = [f"cq_k{i}" for i in range(len(pairs))]
        # an inner class: the window join of its widest windows; an outer class (one type and band): the interval
        # join with the windows' band, as the compiler's outer join (a window join has no padded rows)
        spec = JoinSpec.build(inputs[0], inputs[1], on, LEFT_PREFIX + j.times[0], RIGHT_PREFIX + j.times[1], j.how,
                              None, self.shards, None, f"{self.name}.join",
                              window=windows if j.how == "inner" else None,
                              function="window_join" if j.how == "inner" else "interval_join")
        spec.lower, spec.upper = window_band(*windows)
        union = _tagged(spec, LEFT, True).union(_tagged(spec, RIGHT, True))
        sides = class_sides(j)
        packed = union.mapInArrow(JoinPacker(self._dir, join_class_id(j.signature()), sides, T.TimestampType(),
                                             streams), sliced_schema(T.TimestampType(), None, True))
        return packed, JoinConfig.of(spec), sides

    def _keep_join_classes(self, previous) -> None:
        """An inner join member whose checkpoint's plan has its class as written before inner classes held their
        members' pushed predicates (one class for any predicates, at the streams' watermarks): it goes on in that
        class, without them (its state is that class's; docs/groups.md).
        """
        from .worker import join_class_id

        if previous is None:
            return
        held = previous.catalogue.get("__joins__", {})
        for m in self._members.values():
            j = m.spec.join
            if m.spec.kind != "join" or j.how != "inner" or j.pushed == (None, None):
                continue
            old = replace(j, pushed=(None, None))
            if join_class_id(j.signature()) not in held and join_class_id(old.signature()) in held:
                m.spec = replace(m.spec, join=old)

    def _join_member(self, spec, sink, compiled, lookup) -> _Member:
        """A two-stream join as a member of a join class of the shared stage (:mod:`.joins`): its
        :class:`~.joins.JoinMember`, its stage schema (the window join's columns and ``cq_at``, as the compiler's
        join gives them; an outer join: the compiler's ``interval_join`` columns and ``cq_at``) and its WHERE and
        select list as the compiler's Spark SQL over them (``finish``). ValueError naming the query for a join a
        group cannot run yet (:func:`_join_refusal`).
        """
        from pyspark.sql.types import StructType

        from ..lang import ast as A
        from ..lang.analysis import AT, _output_names
        from ..lang.builder import _Builder, _sql, _time_column
        from ..operators._common.metrics import arrow_schema
        from ..operators.join.spec import JoinSpec
        from .joins import JoinMember
        from .predicates import names_column

        a = compiled.analysis
        why = _join_refusal(a)
        if why is not None:
            raise ValueError(f"query {spec.name!r}: {why} cannot run in a query group yet (docs/groups.md, "
                             f"\"Not yet\"); run it as its own query")
        b = _Builder(self.spark, a, lookup, None)
        how = a.how[0] if a.outer else "inner"
        left, right = a.sources
        pairs = []
        for (r1, c1), (r2, c2) in a.keys:
            one, two = (b.res.column_name(r1, c1), b.res.column_name(r2, c2))
            pairs.append((one, two) if r1 == left.ref else (two, one))
        windows = tuple(int(s.window.size.micros) for s in (left, right))
        # an outer join's predicates on one input (its WHERE on the preserved stream, its ON on the padded one): the
        # compiler applies them to the input before the join, and Spark below the input's watermark (they do not
        # name its time column), so its query alone has that input's watermark over the rows that pass them
        # An inner join's: those that do not name the input's time column (Spark keeps the others above the
        # watermark); its class applies them before its state and runs at their clocks, so a member's late rows are
        # those of its query alone (a class holds members of the same such predicates)
        pushed = [None, None]
        for i, s in enumerate((left, right)):
            if not s.filters:
                continue
            time_col = s.time or _time_column(lookup[s.name], s.name, s.node)

            def names_time(p, s=s, time_col=time_col):
                return names_column(p, lambda x: b.res.column_name(s.ref, x) == time_col)

            if how != "inner" and any(names_time(p) for p in s.filters):
                raise ValueError(f"query {spec.name!r}: an outer join with a predicate on the time column of "
                                 f"{s.ref} cannot run in a query group yet (Spark keeps it above the stream's "
                                 f"watermark, which the group's outer join classes do not follow); run it as its "
                                 f"own query")
            below = [p for p in s.filters if not names_time(p)]
            if below:
                pushed[i] = " AND ".join(f"({_sql(p, lambda c, r=s.ref: b.res.column_name(r, c))})" for p in below)
        join = JoinMember(left=_group_name(left.name, self.sources), right=_group_name(right.name, self.sources),
                          pairs=tuple(pairs), windows=windows, refs=(left.ref, right.ref),
                          times=tuple(s.time or _time_column(lookup[s.name], s.name, s.node) for s in (left, right)),
                          columns=tuple(tuple(lookup[s.name].columns) for s in (left, right)),
                          at="valid_from" if a.stream == "ISTREAM" else "valid_to", how=how, pushed=tuple(pushed))
        if how == "inner":
            keymap, on, (ldf, lt), (rdf, rt) = b._join_inputs()
            js = JoinSpec.build(ldf, rdf, on, lt, rt, "inner", None, self.shards, None, spec.name, window=windows,
                                function="window_join")
        else:   # the compiler's outer join (builder._outer_join): interval_join, both sides' key columns kept
            keymap = {}
            (ldf, lt), (rdf, rt) = b._prefixed(left, {}), b._prefixed(right, {})
            lon = [f"{left.ref}__{c}" for c, _ in pairs]
            ron = [f"{right.ref}__{c}" for _, c in pairs]
            js = JoinSpec.build(ldf, rdf, None, lt, rt, how, None, self.shards, None, spec.name, window=None,
                                function="interval_join", left_on=lon, right_on=ron)
        stage = arrow_schema(StructType(list(js.output_schema().fields) + [compiled.dataframe.schema[AT]]))
        name = b._join_names(keymap)
        # an inner join: the predicates the compiler pushes to one input, then the residual, on the pairs (the same
        # rows); an outer join: the residual only (its pushed predicates run in its class, before the state)
        preds = [] if a.outer else [_sql(p, name) for s in a.sources for p in s.filters]   # outer: in the class
        preds += [_sql(p, name) for p in a.residual]
        items = []
        for it, oname in zip(a.select.items, _output_names(a.select)):
            if isinstance(it.expr, A.Star):
                for s in a.sources:
                    if it.expr.table is None or it.expr.table in (s.ref, s.name):
                        items += [(f"`{name(A.Column(s.ref, c))}`", c) for c in lookup[s.name].columns]
            else:
                items.append((_sql(it.expr, name), oname))
        having = " AND ".join(f"({p})" for p in preds) if preds else None
        spec = replace(spec, kind="join", join=join, stage_schema=stage, finish=(having, tuple(items)))
        return _Member(spec, sink, source=None, plan=compiled.plan, qos=dict(compiled.qos))

    def _join_aggregate_member(self, spec, sink, compiled, lookup) -> _Member:
        """An aggregate over a two-stream join (:mod:`.post`): its join a member of a join class of the shared stage
        (:meth:`_join_member`: its pairs are its query's), and its aggregation, as the compiler's, over those pairs
        in the micro-batch function: the predicates, the slide instants and the computed columns, then a tumbling
        aggregation of the slide's width (one shard), whose rows its HAVING and select list finish.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StructType

        from ..lang.analysis import AT
        from ..lang.builder import EVAL_TIME, _Builder, aggregate_output_sql, join_instants
        from ..operators._common.metrics import arrow_schema
        from ..operators.aggregate.driver import configure
        from .post import JoinAggregate

        a = compiled.analysis
        member = self._join_member(spec, sink, compiled, lookup)
        where = member.spec.finish[0]     # the join's predicates on its pairs (pushed and residual)
        b = _Builder(self.spark, a, lookup, None)
        keymap, _, (_, lt), (_, rt) = b._join_inputs()
        windows = tuple(int(s.window.size.micros) for s in a.sources)
        slide = a.sources[0].window.slide.micros
        pairs = self.spark.createDataFrame([], from_arrow_schema(member.spec.stage_schema))
        df = join_instants(pairs.filter(F.expr(where)) if where is not None else pairs, (lt, rt), windows, slide)
        name_of = b._join_names(keymap)
        view, by, aggs, out_name, grouped, _ = b.aggregate_inputs(df, name_of)
        step = timedelta(microseconds=slide)
        config, _, _, _ = configure(view, EVAL_TIME, step, step, by=by, aggs=aggs, granularity=step,
                                    emit="windows" if a.stream == "RSTREAM" else "changes", shards=1,
                                    name=f"{self.name}.{spec.name}")
        # configured over a batch DataFrame of the pairs (their schema); it runs on a stream's, with its watermark
        config = replace(config, mode="append", watermark=True)
        at = {"RSTREAM": (config.out_names[1], 0), "ISTREAM": (config.out_names[0], slide),
              "DSTREAM": (config.out_names[1], slide)}[a.stream]
        having, items = aggregate_output_sql(a.select, name_of, out_name, by, grouped)
        stage = arrow_schema(StructType(list(config.output_schema().fields) + [compiled.dataframe.schema[AT]]))
        post = JoinAggregate(config=config, where=where, computed=tuple(b.computed_sql), times=(lt, rt),
                             windows=windows, at=at, stage_schema=stage)
        member.spec = replace(member.spec, post=post, finish=(having, tuple((t, o) for t, o, _ in items)))
        return member

    def _rows_member(self, spec, sink, compiled, lookup) -> _Member:
        """A ROWS window query (``ISTREAM`` / ``DSTREAM`` of ``SELECT … FROM s [PARTITION BY … ROWS n] …``), or an
        aggregate over one, as a member of the shared stage (:mod:`.rows`): its input as the compiler builds it
        (its SAMPLE and the window's own WHERE applied), the rows_window operator's step over it (for an aggregate
        ``rows_aggregate``'s), its stage schema (the step's columns and ``cq_at``) and its WHERE and select list as
        the compiler's Spark SQL over them (``finish``: over a ROWS window they stay after the window; an
        aggregate's WHERE is its step's flag, its HAVING and select list the finish).
        """
        from pyspark.sql.types import StructType

        from ..lang import ast as A
        from ..lang.analysis import AT, _output_names
        from ..lang.builder import _Builder, _sql, aggregate_output_sql
        from ..operators._common.metrics import arrow_schema
        from ..operators.rows_window.driver import aggregate_step, prepared_worker, window_schema
        from ..operators.rows_window.worker import AT as ROWS_AT
        from ..operators.rows_window.worker import _RowsWorker
        from .rows import RowsMember

        a = compiled.analysis
        s = a.sources[0]
        if a.subqueries or a.relations:
            raise ValueError(f"query {spec.name!r}: a ROWS window over a subquery or a relation cannot run in a query "
                             f"group yet (docs/groups.md, \"Not yet\"); run it as its own query")
        b = _Builder(self.spark, a, lookup, None)
        items, plain = [], []     # plain: (output name, stage column) of an item that names a column
        if a.shape == "rows_aggregate":
            df, time, parts, specs, out_name, where = b.rows_aggregate_inputs()
            prepared, worker = aggregate_step(df, time, s.window.size, specs, parts, where=where,
                                              emit=a.stream.lower())
            stage = worker.out_schema
            having, sql_items = aggregate_output_sql(a.select, b.name, out_name, parts, {})
            for text, oname, it in sql_items:
                items.append((text, oname))
                if isinstance(it.expr, A.Call) and it.expr.is_aggregate:
                    plain.append((oname, out_name[it.expr]))
                elif isinstance(it.expr, A.Column):
                    plain.append((oname, b.name(it.expr)))
            sign = None
        else:
            df, time = b.source(s)
            parts = [b.res.column_name(s.ref, c) for c in s.window.partition_by]
            out_schema = window_schema(df, df.schema[time].dataType)
            prepared, worker = prepared_worker(df, time, out_schema, _RowsWorker, s.window.size)
            stage = arrow_schema(StructType([f for f in out_schema.fields if f.name not in ("cq_sign", ROWS_AT)]
                                            + [compiled.dataframe.schema[AT]]))
            preds = [_sql(p, b.name) for p in a.residual]
            for it, oname in zip(a.select.items, _output_names(a.select)):
                if isinstance(it.expr, A.Star):
                    items += [(f"`{c}`", c) for c in lookup[s.name].columns]
                    plain += [(c, c) for c in lookup[s.name].columns]
                else:
                    items.append((_sql(it.expr, b.name), oname))
                    if isinstance(it.expr, A.Column):
                        plain.append((oname, b.name(it.expr)))
            having = " AND ".join(f"({p})" for p in preds) if preds else None
            sign = 1 if a.stream == "ISTREAM" else -1
        stream = _group_name(s.name, self.sources)
        rows = RowsMember(stream=stream, partition_by=tuple(parts), worker=worker, sign=sign)
        if having is None and len(plain) == len(items):   # its stage's columns renamed: no Spark job per batch
            spec = replace(spec, kind="rows", family=stream, config=rows, select=tuple(plain))
        else:
            spec = replace(spec, kind="rows", family=stream, config=rows, stage_schema=stage,
                           finish=(having, tuple(items)))
        return _Member(spec, sink, dataframe=prepared, source=stream, plan=compiled.plan, qos=dict(compiled.qos))

    def _rows_branch(self, m: _Member, streams: tuple):
        """A ROWS member's branch of the group's Spark query: its input routed to the shards by the hash of its
        partition key (all to shard 0 without one, as the operator runs one group), packed per shard
        (:class:`~.worker.RowsPacker`).
        """
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from ..operators._common.payload import SIDE
        from ..operators._common.shards import shard_key_column
        from ..operators.join.worker import MICROS
        from ..operators.join.worker import SHARD as JSHARD
        from ..operators.rows_window.worker import _T
        from .worker import RowsPacker, sliced_schema

        r = m.spec.config
        df = m.dataframe
        shard = (shard_key_column(F.xxhash64(*[F.col(f"`{c}`") for c in r.partition_by]), self.shards)
                 if r.partition_by else F.lit(0).cast("long"))
        tagged = df.select(F.lit(0).cast("byte").alias(SIDE), shard.alias(JSHARD), F.col(_T).alias(MICROS),
                           *[F.col(f"`{c}`") for c in df.columns])
        return tagged.mapInArrow(RowsPacker(self._dir, m.spec.key, (r.stream,), T.TimestampType(), streams),
                                 sliced_schema(T.TimestampType(), None, True))

    def _join_running(self, member: _Member) -> None:
        """ValueError unless ``member`` can join the running plan (its columns are computed already)."""
        from pyspark.sql import functions as F

        name = member.spec.name
        if member.spec.kind == "join":
            raise ValueError(f"query {name!r}: a join cannot join a running group: the join classes and their "
                             f"bands are part of the group's Spark plan, fixed at start(), and a member joining "
                             f"an existing class could not get exactly its query's rows alone after its start (the "
                             f"class's state does not keep the micro-batch each row arrived in, which decides what "
                             f"its query alone drops as late; docs/groups.md, \"Joins\"); add it before start(), "
                             f"or stop the group and start it again with the query (the same checkpoint only "
                             f"if it joins an existing class with a band inside the class's)")
        if member.spec.kind == "rows":
            raise ValueError(f"query {name!r}: a ROWS window cannot join a running group: its branch (its input "
                             f"routed by its partition key) is part of the group's Spark plan, fixed at start(); add "
                             f"it before start(), or start the group again with it (new checkpoint)")
        if member.spec.kind == "shared" and member.spec.at[1]:
            raise ValueError(f"query {name!r}: an ISTREAM / DSTREAM aggregate cannot join a running group (its "
                             f"change intervals have no start to join at); add it before start()")
        if member.spec.kind != "shared":
            raise ValueError(f"query {name!r} runs alone ({member.why_alone}) and cannot join a running group: "
                             f"add it before start(), or start the group again with it (new checkpoint)")
        plan = D.read_plan(self._dir)
        cat = plan.catalogue.get(member.spec.family) if plan is not None else None
        if cat is None:
            raise ValueError(f"query {name!r} cannot join the running group: no shared query over "
                             f"{member.spec.family!r} was there at start(); add it before start()")
        mapping = []
        for n, e in member.exprs[1:]:
            col = cat.get(str(e))
            if col is None:
                raise ValueError(f"query {name!r} cannot join the running group: the running plan does not "
                                 f"compute its input {str(e)!r} (the group computes each query's columns once, "
                                 f"at start()); add it before start()")
            mapping.append((n, col))
        def lookup(pred, conjuncts):
            """The projection column of ``pred`` (a Column), else its conjuncts in Arrow, if exact."""
            col = cat.get(str(F.coalesce(pred, F.lit(False))))
            if col is not None:
                return col, None
            raw, types = plan.catalogue.get(f"{member.spec.family}/raw", ({}, {}))
            try:
                return None, bind(conjuncts, member.name_of, types, raw)
            except Unsupported as exc:
                raise ValueError(f"query {name!r} cannot join the running group: the running plan does not compute "
                                 f"its WHERE, and {exc} cannot be evaluated exactly outside Spark; add it before "
                                 f"start()") from None

        mask = arrow_filter = clock = clock_mask = clock_filter = None
        if member.mask is not None:   # a WHERE the projection lacks: in Arrow
            mask, arrow_filter = lookup(member.mask, member.conjuncts)
        delay = plan.catalogue.get("__delays__", {}).get(member.spec.family)
        if member.clock_pred is not None and delay is not None and plan.catalogue.get("__streams__") is not None:
            # its own clock (clock.filtered), recorded from the next micro-batch; a group started at Spark's
            # watermark (one stream, no such query) runs it at the stream's (docs/groups.md)
            clock = member.clock
            clock_mask, clock_filter = lookup(member.clock_pred, member.clock_conjuncts)
        member.spec = replace(member.spec, columns=tuple(mapping), mask=mask, arrow_filter=arrow_filter, clock=clock,
                              clock_mask=clock_mask, clock_filter=clock_filter)


def branches_of(specs) -> tuple[dict, list]:
    """The branches of a group's Spark query from its members' specs: the shared members by stream (the streams
    of the shared stage, each stream's members in the order given) and the members running alone (by key).
    """
    families: dict[str, list] = {}
    for s in specs:
        if s.kind == "shared":
            families.setdefault(s.family, []).append(s)
    return families, sorted((s for s in specs if s.kind == "alone"), key=lambda s: s.key)


def check_layout(group: str, checkpoint: str, previous: D.Plan | None, streams, alone) -> tuple:
    """The layout the checkpoint keeps for a group whose shared stage serves ``streams`` and whose ``alone``
    (keys) run alone: the streams, then the keys. ValueError, listing both, unless the checkpoint's plan
    ``previous`` was written with the same: they are the Spark plan's branches (and its state's layout), fixed
    for the life of a checkpoint.
    """
    layout = tuple(sorted(streams)) + tuple(sorted(alone))
    old = previous.catalogue.get("__layout__", layout) if previous is not None else layout
    if old != layout:
        old_streams = [x for x in old if x in previous.catalogue]   # a stream has its projection's catalogue
        old_alone = [x for x in old if x not in previous.catalogue]
        raise ValueError(f"query group {group!r}: the checkpoint {checkpoint} was written by a group with other "
                         f"branches: streams with shared queries {old_streams} (now {sorted(streams)}), queries "
                         f"running alone {old_alone} (now {sorted(alone)}); the streams of the shared stage and the "
                         f"queries running alone must stay the same for the life of a checkpoint — start with "
                         f"another checkpoint")
    return layout


def _join_classes(specs) -> dict:
    """The join members' specs by join class id (:func:`~.worker.join_class_id`), in the order given."""
    from .worker import join_class_id

    out: dict = {}
    for s in specs:
        if s.kind == "join":
            out.setdefault(join_class_id(s.join.signature()), []).append(s)
    return out


def check_join_layout(group: str, checkpoint: str, previous: D.Plan | None, classes: dict) -> None:
    """ValueError unless the checkpoint's plan ``previous`` has the same join classes with the same windows as
    ``classes`` (:func:`_join_classes`): a class's state (its band, its shards) is fixed for the life of a
    checkpoint.
    """
    from .joins import class_windows, config_windows

    if previous is None:
        return
    old = {cid: (config_windows(c), c.n_keys) for cid, (c, _) in previous.catalogue.get("__joins__", {}).items()}
    new = {cid: (class_windows([s.join for s in ms]), len(ms[0].join.pairs)) for cid, ms in classes.items()}
    if old != new:
        raise ValueError(f"query group {group!r}: the checkpoint {checkpoint} was written with other join classes "
                         f"(streams, keys and widest windows) {sorted(old.items())} than the group's now "
                         f"{sorted(new.items())}; a join class's state is fixed for the life of a checkpoint — keep "
                         f"its join queries (or ones with the same widest windows), or start with another checkpoint")


def _stateful_stage(union):
    """The united slicers' rows as the stateful stage reads them: the group clock becomes Spark's watermark
    (the ``max`` policy, :mod:`.clock`), and an all-null tag column carries the watermark to
    ``applyInPandasWithState`` (its event-time timeouts) without dropping a row as late (as one stream's tag).
    """
    from pyspark.sql import functions as F

    from .. import _validate
    from ..operators.aggregate.config import TAG
    from .worker import GROUP_CLOCK

    timed = union.withWatermark(GROUP_CLOCK, "0 seconds")
    return timed.select(*[c for c in timed.columns if c != GROUP_CLOCK],
                        F.lit(None).cast("timestamp").alias(TAG, metadata={_validate.WATERMARK_KEY: 0}))


def _times(t: dict | None) -> dict:
    """A stream's times (:func:`~.clock.stream_times`) as ``overview()`` shows them: ISO text and seconds."""
    def iso(us):
        return None if us is None else (datetime(1970, 1, 1, tzinfo=timezone.utc)
                                        + timedelta(microseconds=us)).isoformat()

    t = t or {}
    return {"event_time": iso(t.get("event_time")), "watermark": iso(t.get("watermark")),
            "watermark_delay": t.get("watermark_delay")}


def next_window(spec: D.MemberSpec, max_time: int | None) -> int | None:
    """The start (µs) of the first window of ``spec`` that begins after ``max_time`` (None: None)."""
    if max_time is None:
        return None
    slide = spec.config.slide
    return (math.floor(max_time / slide) + 1) * slide


def _delay(base, m: _Member) -> int | None:
    from .. import _validate

    return _validate.watermark_delay_ms(base, m.time)


def _named(query: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; a ValueError / TypeError it raises gets the query's name in front (its type
    and attributes, e.g. a CQL error's line and column, stay).
    """
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith("query "):
            exc.args = (f"query {query!r}: {exc.args[0]}",) + exc.args[1:]
        raise


def _lookup(name: str, statement, sources: dict) -> dict:
    """``sources`` with the statement's stream names resolved (case-insensitively, as :func:`pyspark_cq.cql`);
    ValueError naming the query for a stream the group does not have.
    """
    from ..lang import ast as A

    lookup = dict(sources)

    def walk(q):
        for s in q.sources:
            if isinstance(s, A.StreamRef):
                yield s
            elif hasattr(s, "query"):
                yield from walk(s.query.query if hasattr(s.query, "query") else s.query)

    for s in walk(statement.query):
        if s.name in lookup:
            continue
        found = [k for k in sources if k.lower() == s.name.lower()]
        if len(found) != 1:
            raise ValueError(f"query {name!r}: its source {s.name!r} is not one of the group's sources "
                             f"{sorted(sources)}")
        lookup[s.name] = sources[found[0]]
    return lookup


def _classify(name: str, a) -> str | None:
    """Why a query runs alone (None: it joins the shared stage); ValueError naming the query for one a group
    cannot run yet.
    """
    if a.shape == "stream" and not a.subqueries:
        return "it keeps no state"
    if a.shape != "aggregate" or a.relations or a.subqueries or a.residual:
        what = {"aggregate": "an aggregate over a relation or a subquery",
                "join_aggregate": "an aggregate over a join of three or more streams"}.get(a.shape,
                                                                                          f"a {a.shape} query")
        raise ValueError(f"query {name!r}: {what} cannot run in a query group yet: Spark allows one "
                         f"applyInPandasWithState per streaming query, and the group's is the shared stage of its "
                         f"windowed aggregations (docs/groups.md, \"What a group runs\"); run it as its own query")
    return None


def _join_refusal(a) -> str | None:
    """What keeps a two-stream join out of a group's join classes (None: it joins one)."""
    if a.relations or a.subqueries:
        return "a join with a relation or a subquery"
    if any(s.node.sample is not None for s in a.sources):
        return "a join with SAMPLE"
    if a.constraints:
        return "a join with CONSTRAINT"
    return None


def _join_stream(j) -> str:
    """A join member's ``stream`` in ``queries``: ``"left JOIN right"``, an outer one ``"left LEFT JOIN right"``."""
    return f"{j.left} {'' if j.how == 'inner' else j.how.upper() + ' '}JOIN {j.right}"


def _group_name(stream: str, sources: dict) -> str:
    """The group's name of ``stream`` (a query may spell it in another case)."""
    return stream if stream in sources else next(k for k in sources if k.lower() == stream.lower())


def _simple(a) -> bool:
    """Whether an aggregate query's rows are its aggregation's columns renamed (no HAVING, no expressions)."""
    from ..lang import ast as A
    from ..lang.analysis import _unqualified

    q = a.select
    if q.having is not None:
        return False
    grouped = {_unqualified(g) for g in q.group_by}
    return all((isinstance(it.expr, A.Call) and it.expr.is_aggregate) or isinstance(it.expr, A.Column)
               or _unqualified(it.expr) in grouped for it in q.items)
