"""The statistics store: per-query, per-source and per-operator statistics from query progress.

Fed with one ``StreamingQueryProgress`` (or its JSON dict) per micro-batch, it keeps:

- per query: micro-batches seen, arrival rate λ (``inputRowsPerSecond``), batch duration, Spark state-store
  rows and bytes (``stateOperators``), rows dropped by the watermark, the latest maximum event time, the
  event time a batch advances it (B) and the watermark delay δ (the previous batches' largest event time
  minus the batch's ``eventTime.watermark``);
- per source (a name of the query's plan, matched to a progress source by a substring of its
  description, or given a fixed d): arrival rate λ and distance d = 1/λ (PIPES §3.2.2: "an online average
  over d with exponential smoothing");
- per pyspark-cq operator (its per-batch report in ``observedMetrics``, :func:`pyspark_cq.read_metrics`):
  input and output rows, λ, selectivity (output/input), state rows and bytes, evicted and late rows.

Smoothed values use :class:`pyspark_cq.estimators.ExponentialSmoothing` (single exponential smoothing,
RTStream §4.1.3, PIPES §3.2.2). The store is pure Python and thread-safe; :meth:`query_info` returns the
:class:`~pyspark_cq.policies.QueryInfo` a policy sees.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..control import validate_operator_id
from ..estimators import ExponentialSmoothing
from ..operators._common.metrics import read as read_metrics
from ..policies.snapshot import INSTANCES_KEPT, Instance, OperatorStats, QueryInfo, SourceStats, periodic_spec
from ..vocabulary import metrics as M

__all__ = ["StatisticsStore", "parse_event_time", "backlog_rows"]


def parse_event_time(text) -> int | None:
    """Spark's event-time string (``2024-05-01T12:00:00.000Z``) as µs since the epoch (None if absent)."""
    if not text:
        return None
    if not isinstance(text, str):
        raise TypeError(f"text must be an ISO-8601 timestamp string, got {text!r}")
    ts = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_dt.timezone.utc)
    delta = ts - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _get(progress, key, default=None):
    try:
        value = progress[key]
    except (KeyError, TypeError):
        value = None
    if value is None and isinstance(getattr(type(progress), key, None), property):
        # Spark Connect's progress JSON leaves out numInputRows and the rates (its StreamingQueryProgress
        # reads None for them); PySpark's properties of the same names sum them over the sources.
        try:
            value = getattr(progress, key)
        except Exception:
            value = None
    return default if value is None else value


def _finite(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class _Smoothed:
    alpha: float
    est: ExponentialSmoothing = None

    def __post_init__(self):
        self.est = ExponentialSmoothing(self.alpha)

    def add(self, value) -> None:
        value = _finite(value)
        if value is not None:
            self.est.update(value)

    @property
    def value(self) -> float:
        return self.est.value if self.est.n else math.nan


@dataclass
class _OperatorState:
    name: str
    alpha: float
    batches: int = 0
    last: dict = field(default_factory=dict)
    last_data: dict = field(default_factory=dict)     # the latest report of a batch with arrivals
    data_batch: int = 0                                # ``batches`` when it was read
    rate: _Smoothed = None
    selectivity: _Smoothed = None
    late_total: int = 0
    totals: dict = field(default_factory=dict)

    def __post_init__(self):
        self.rate, self.selectivity = _Smoothed(self.alpha), _Smoothed(self.alpha)


@dataclass
class _SourceState:
    name: str
    matcher: str | None
    fixed: float | None
    alpha: float
    rate: _Smoothed = None
    distance: _Smoothed = None

    def __post_init__(self):
        self.rate, self.distance = _Smoothed(self.alpha), _Smoothed(self.alpha)


@dataclass
class _QueryState:
    name: str
    alpha: float
    operators: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    batches: int = 0
    last_batch: int = -1
    rate: _Smoothed = None
    duration: _Smoothed = None
    advance: _Smoothed = None
    lag: _Smoothed = None
    state_rows: float = math.nan
    state_bytes: float = math.nan
    late_total: int = 0
    event_time: int | None = None
    timestamp: int | None = None
    period: float | None = None
    deadline: float | None = None
    instances: deque = field(default_factory=lambda: deque(maxlen=INSTANCES_KEPT))

    def __post_init__(self):
        self.rate, self.duration, self.advance = _Smoothed(self.alpha), _Smoothed(self.alpha), _Smoothed(self.alpha)
        self.lag = _Smoothed(self.alpha)


def _offset_units(offset) -> float | None:
    """The sum of the numeric leaves of a source offset (a number, or JSON such as Kafka's
    ``{"topic": {"0": 12, "1": 40}}`` or the file source's ``{"logOffset": 3}``); None if it has none.
    """
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if isinstance(offset, bool) or offset is None:
        return None
    if isinstance(offset, (int, float)):
        return float(offset)
    if isinstance(offset, Mapping):
        parts = [_offset_units(v) for v in offset.values()]
        parts = [p for p in parts if p is not None]
        return float(sum(parts)) if parts else None
    return None


def backlog_rows(progress) -> float | None:
    """Rows waiting at the sources after this micro-batch, from their offsets (None if no source shows it).

    A source's ``latestOffset`` (what is available) minus its ``endOffset`` (what the batch read), in offset
    units, converted to rows with the batch's rows per unit (``numInputRows / (endOffset − startOffset)``).
    Sources that do not report ``latestOffset`` (Spark's file and rate sources) are skipped.
    """
    total, seen = 0.0, False
    for src in _get(progress, "sources", []) or []:
        latest, end = _offset_units(_get(src, "latestOffset")), _offset_units(_get(src, "endOffset"))
        if latest is None or end is None:
            continue
        start = _offset_units(_get(src, "startOffset"))
        rows = int(_get(src, "numInputRows", 0) or 0)
        per_unit = rows / (end - start) if start is not None and end > start and rows > 0 else 1.0
        total += max(latest - end, 0.0) * per_unit
        seen = True
    return total if seen else None


class StatisticsStore:
    """Statistics of registered queries, updated from their progress.

    Parameters
    ----------
    alpha : float
        Smoothing constant of the exponential smoothing, in (0, 1).
    """

    def __init__(self, alpha: float = 0.3):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ValueError(f"alpha must be a smoothing constant in (0, 1), got {alpha!r}")
        self.alpha = float(alpha)
        self._queries: dict[str, _QueryState] = {}
        self._lock = threading.RLock()

    def register(self, query: str, *, operators=(), sources: Mapping | None = None, period=None,
                 deadline=None) -> None:
        """Start keeping statistics of ``query``.

        Parameters
        ----------
        query : str
            The query name (``StreamingQueryProgress.name``).
        operators : iterable of str
            Operator ids whose reports (observed metrics under that name) to read.
        sources : mapping str -> str or float, optional
            Plan source name -> a substring of the progress source's description (e.g. ``"RateStream"``,
            a topic name, a path), or a fixed distance d in seconds (an application that knows its rate,
            PIPES §3.2.2). A query with a single progress source may map its one plan source to ``""``.
        period, deadline : float or duration, optional
            A periodic query's period P and relative deadline D (seconds, :func:`periodic_spec`): its
            instances (micro-batches) are recorded with their lateness (:class:`Instance`).
        """
        if not isinstance(query, str) or not query:
            raise TypeError(f"query must be a non-empty str, got {query!r}")
        ops = [validate_operator_id(op, "operators[]") for op in operators]
        state = _QueryState(query, self.alpha)
        state.period, state.deadline = periodic_spec(period, deadline)
        for op in ops:
            state.operators[op] = _OperatorState(op, self.alpha)
        for name, spec in (sources or {}).items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"sources keys must be plan source names (str), got {name!r}")
            if isinstance(spec, str):
                state.sources[name] = _SourceState(name, spec, None, self.alpha)
            elif isinstance(spec, (int, float)) and not isinstance(spec, bool) and math.isfinite(spec) and spec > 0:
                state.sources[name] = _SourceState(name, None, float(spec), self.alpha)
            else:
                raise TypeError(f"sources[{name!r}] must be a description substring (str) or a fixed distance d "
                                f"in seconds (> 0), got {spec!r}")
        with self._lock:
            self._queries[query] = state

    def add_operator(self, query: str, operator: str) -> None:
        """Also read the reports of ``operator`` in ``query``."""
        validate_operator_id(operator)
        with self._lock:
            state = self._state(query)
            state.operators.setdefault(operator, _OperatorState(operator, self.alpha))

    def unregister(self, query: str) -> None:
        """Forget ``query``."""
        with self._lock:
            self._queries.pop(query, None)

    def _state(self, query: str) -> _QueryState:
        if query not in self._queries:
            raise KeyError(f"no statistics for query {query!r}; registered: {sorted(self._queries)}")
        return self._queries[query]

    @property
    def queries(self) -> list[str]:
        """Registered query names."""
        with self._lock:
            return list(self._queries)

    def update(self, progress, query: str | None = None) -> str | None:
        """Add one micro-batch's progress; returns the query name it was filed under (None: not registered,
        or a repeated batch id).

        ``progress`` is a ``StreamingQueryProgress`` or its JSON dict; ``query`` defaults to its ``name``.
        """
        if not hasattr(progress, "__getitem__"):
            raise TypeError(f"progress must be a StreamingQueryProgress or its JSON dict, "
                            f"got {type(progress).__name__}")
        name = query if query is not None else _get(progress, "name")
        with self._lock:
            state = self._queries.get(name)
            if state is None:
                return None
            batch = int(_get(progress, "batchId", -1))
            if batch <= state.last_batch:
                return None
            self._update_query(state, progress, batch)
            return name

    def _update_query(self, state: _QueryState, progress, batch: int) -> None:
        state.last_batch = batch
        state.batches += 1
        rows = int(_get(progress, "numInputRows", 0) or 0)
        rate = _finite(_get(progress, "inputRowsPerSecond"))
        if rate is not None and (rate > 0 or rows == 0):
            state.rate.add(rate)
        duration = _finite(_get(progress, "batchDuration"))
        if duration is not None:
            state.duration.add(duration / 1000.0)
        stamp = parse_event_time(_get(progress, "timestamp"))
        elapsed = None if state.timestamp is None or stamp is None else (stamp - state.timestamp) / 1e6
        state.timestamp = stamp if stamp is not None else state.timestamp
        ops = _get(progress, "stateOperators", []) or []
        if ops:
            state.state_rows = float(sum(int(_get(o, "numRowsTotal", 0)) for o in ops))
            state.state_bytes = float(sum(int(_get(o, "memoryUsedBytes", 0)) for o in ops))
            state.late_total += sum(int(_get(o, "numRowsDroppedByWatermark", 0)) for o in ops)
        event_times = _get(progress, "eventTime", {}) or {}
        event = parse_event_time(event_times.get("max"))
        watermark = parse_event_time(event_times.get("watermark"))
        if event is not None and watermark is not None and watermark > 0 and state.event_time is not None:
            # δ: Spark's watermark is the largest event time of the previous batches minus the delay (the
            # batch's own max is then δ + B ahead of it); 0 = no watermark yet (epoch)
            state.lag.add(max(state.event_time - watermark, 0) / 1e6)
        if event is not None:
            if state.event_time is not None and event > state.event_time:
                state.advance.add((event - state.event_time) / 1e6)
            state.event_time = max(event, state.event_time or event)
        self._update_sources(state, _get(progress, "sources", []) or [])
        shed, kept = 0, 1.0
        for op in state.operators.values():
            report = read_metrics(progress, op.name)
            if report is None:
                continue
            op.batches += 1
            op.last = report
            if report.get(M.INPUT_ROWS, 0) > 0:
                # a no-data batch (Spark's extra batch for the watermark) must not hide the step counters
                # of the batch before it from the plan policies
                op.last_data, op.data_batch = report, op.batches
            op.late_total += report.get(M.LATE_ROWS, 0)
            for key, value in report.items():   # counters add up over batches; state sizes do not
                if not M.is_state_size(key):
                    op.totals[key] = op.totals.get(key, 0) + int(value)
            n_in, n_out = report.get(M.INPUT_ROWS, 0), report.get(M.OUTPUT_ROWS, 0)
            if n_in > 0:
                op.selectivity.add(n_out / n_in)
            if elapsed is not None and elapsed > 0:
                op.rate.add(n_in / elapsed)
            n_shed = int(report.get(M.SHED_ROWS, 0))
            if n_shed and n_in > 0:  # §5.2.2: the fractions the operators keep multiply
                shed, kept = shed + n_shed, kept * (1.0 - min(n_shed / n_in, 1.0))
        if state.period is not None and stamp is not None and duration is not None:
            start = stamp / 1e6
            # Spark fires the first trigger at once, later ones at multiples of P (or at once after an overrun)
            release = math.floor(start / state.period + 1e-9) * state.period if state.instances else start
            state.instances.append(Instance(batch, release, start, duration / 1000.0, state.deadline, rows, shed,
                                            kept, backlog_rows(progress)))

    def _update_sources(self, state: _QueryState, progress_sources) -> None:
        for src in state.sources.values():
            if src.fixed is not None:
                continue
            matches = [p for p in progress_sources if src.matcher in str(_get(p, "description", ""))]
            if len(matches) != 1:
                continue
            rate = _finite(_get(matches[0], "inputRowsPerSecond"))
            rows = int(_get(matches[0], "numInputRows", 0) or 0)
            if rate is None or rate <= 0 or rows == 0:
                continue
            src.rate.add(rate)
            src.distance.add(1.0 / rate)

    def instances(self, query: str) -> list[Instance]:
        """The recorded instances of a periodic query (the latest :data:`INSTANCES_KEPT`), oldest first."""
        with self._lock:
            return list(self._state(query).instances)

    def event_time_lead(self, query: str) -> tuple[int | None, float]:
        """The query's latest maximum event time (µs) and its smoothed advance per batch (seconds)."""
        with self._lock:
            state = self._state(query)
            return state.event_time, state.advance.value

    def smoothed(self, values) -> float | None:
        """``values`` (oldest first) smoothed as the store smooths a query's statistics; None without any."""
        est = _Smoothed(self.alpha)
        for v in values:
            est.add(v)
        return _finite(est.value)

    def query_info(self, query: str, *, plan=None, qos=None, control=None) -> QueryInfo:
        """The :class:`~pyspark_cq.policies.QueryInfo` of ``query`` with the given plan, QoS and control values."""
        with self._lock:
            s = self._state(query)
            sources = {}
            for src in s.sources.values():
                if src.fixed is not None:
                    sources[src.name] = SourceStats(src.name, 1.0 / src.fixed, src.fixed)
                else:
                    sources[src.name] = SourceStats(src.name, src.rate.value, src.distance.value)
            operators = {}
            for op in s.operators.values():
                last = op.last
                operators[op.name] = OperatorStats(
                    op.name, op.batches, last.get(M.INPUT_ROWS, 0), last.get(M.OUTPUT_ROWS, 0), op.rate.value,
                    op.selectivity.value, float(last[M.STATE_ROWS]) if M.STATE_ROWS in last else math.nan,
                    float(last[M.STATE_BYTES]) if M.STATE_BYTES in last else math.nan,
                    last.get(M.EVICTED_ROWS, 0), last.get(M.LATE_ROWS, 0), op.late_total,
                    dict(op.last_data or last), op.data_batch if op.last_data else op.batches, dict(op.totals))
            return QueryInfo(query, plan, dict(qos or {}), sources, operators, dict(control or {}),
                             s.batches, s.rate.value, s.duration.value, s.state_rows, s.state_bytes, s.late_total,
                             s.event_time, _finite(s.lag.value), _finite(s.advance.value), s.period, s.deadline,
                             tuple(s.instances))
