"""The statistics snapshot a policy sees: plain, immutable, picklable values (no Spark, no runtime).

The runtime (:mod:`pyspark_cq.runtime`) builds a :class:`Snapshot` from its statistics store and the
control table before every policy round; the check suite (:mod:`pyspark_cq.policies.checks`) builds
synthetic ones. Missing statistics are ``nan`` (before a query's first batch, for example): every
policy must cope with them.

Units: rates are rows per second; distances d (PIPES §3.2) are seconds; durations, windows and
granularities are microseconds; sizes bytes.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import plan as P
from ..control.decision import Decision
from ..control.schema import PARAMETERS, validate_operator_id
from .decisions import QoSRange, duration_value

__all__ = ["OperatorStats", "SourceStats", "Instance", "QueryInfo", "Snapshot", "parse_label", "label",
           "periodic_spec", "shedding_operator", "drop_decision", "drop_for", "DROP_TOLERANCE", "INSTANCES_KEPT"]

NAN = math.nan

#: The most instances a periodic query's :class:`QueryInfo` carries (the runtime keeps the latest ones).
INSTANCES_KEPT = 256


def label(operator: str, param: str) -> str:
    """The label ``"<operator>.<param>"`` naming one operator parameter in plans and QoS maps."""
    validate_operator_id(operator)
    if param not in PARAMETERS:
        raise ValueError(f"param must be one of {PARAMETERS}, got {param!r}")
    return f"{operator}.{param}"


def parse_label(text: str, name: str = "label") -> tuple[str, str]:
    """Split ``"<operator>.<param>"`` into ``(operator, param)``, validating both."""
    if not isinstance(text, str) or "." not in text:
        raise ValueError(f"{name} must be '<operator>.<param>' (e.g. 'join1.window'), got {text!r}")
    operator, param = text.rsplit(".", 1)
    validate_operator_id(operator, f"{name} operator part")
    if param not in PARAMETERS:
        raise ValueError(f"{name} names an unknown parameter {param!r}; known: {PARAMETERS}")
    return operator, param


@dataclass(frozen=True)
class OperatorStats:
    """Statistics of one pyspark-cq operator (from its per-batch report, :mod:`pyspark_cq.operators._common.metrics`).

    Smoothed values (``input_rate``, ``selectivity``) use single exponential smoothing (PIPES §3.2.2);
    ``state_rows`` / ``state_bytes`` are the latest report; ``late_rows_total`` counts since start.
    ``report`` is the latest report of a batch with arrivals in full (a no-data batch, which Spark runs to
    advance the watermark, would show no steps): every counter the operator emits, e.g. a ``multi_join``'s
    per-step ``probed_<i>_<j>`` / ``matched_<i>_<j>`` or a ``select_chain``'s ``rows_in_<p>`` /
    ``nanos_<p>``, from which plan policies estimate selectivities and costs. ``report_batch`` is the value
    ``batches`` had when that report was read (None: ``batches``), so a policy sees each report once.
    ``totals`` sums every counter of the reports since start (all but the state sizes ``state_*``), e.g.
    ``shed_rows`` and ``malformed_rows``.
    """

    operator: str
    batches: int = 0
    input_rows: int = 0
    output_rows: int = 0
    input_rate: float = NAN
    selectivity: float = NAN
    state_rows: float = NAN
    state_bytes: float = NAN
    evicted_rows: int = 0
    late_rows: int = 0
    late_rows_total: int = 0
    report: Mapping[str, int] = field(default_factory=dict)
    report_batch: int | None = None
    totals: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceStats:
    """Statistics of one source stream: arrival rate λ (rows/s) and distance d = 1/λ (s), PIPES §3.2.2."""

    name: str
    input_rate: float = NAN
    distance: float = NAN


def periodic_spec(period, deadline) -> tuple[float | None, float | None]:
    """Validate a periodic query's period P and relative deadline D (Wei et al., §2); both in seconds.

    Both None: not periodic. ``deadline`` None: D = P. Durations are seconds (a number) or a duration
    string / ``timedelta`` (``"2 seconds"``). Raises ValueError naming the argument when P or D is not
    positive or D > P.
    """
    if period is None:
        if deadline is not None:
            raise ValueError(f"deadline needs a period: a relative deadline D applies to a periodic query, "
                             f"got deadline={deadline!r} without period")
        return None, None
    p = _seconds(period, "period")
    d = p if deadline is None else _seconds(deadline, "deadline")
    if d > p:
        raise ValueError(f"deadline must be <= period (D <= P, Wei et al. §2), got deadline={d} s > period={p} s")
    return p, d


def _seconds(value, name: str) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a positive number of seconds or a duration such as '2 seconds', "
                        f"got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        return float(value)
    return duration_value(value, name, allow_negative=False, allow_zero=False) / 1e6


@dataclass(frozen=True)
class Instance:
    """One instance (micro-batch) of a periodic query (Wei et al., §2: released every period P, due D later).

    ``release`` is the instant the instance was due to start: Spark fires a ``processingTime`` trigger at
    once when the query starts and then at multiples of P since the epoch, so the release is the first
    instance's start, and for later ones the start rounded down to a multiple of P (an instance that starts
    late because its predecessor overran keeps its release). It misses when
    it ends later than ``release + D``; ``lateness`` is ``end − (release + D)`` in seconds (negative: early).
    ``kept`` is the fraction of the input the shedding operators kept (product over the operators, §5.2.2);
    ``backlog_rows`` the rows the sources' offsets showed waiting after the batch (None: not shown).
    """

    batch: int
    release: float
    start: float
    duration: float
    deadline: float
    input_rows: int = 0
    shed_rows: int = 0
    kept: float = 1.0
    backlog_rows: float | None = None

    @property
    def end(self) -> float:
        """When the instance finished (seconds since the epoch)."""
        return self.start + self.duration

    @property
    def lateness(self) -> float:
        """``end − (release + D)`` in seconds; > 0 is a deadline miss."""
        return self.end - (self.release + self.deadline)

    @property
    def missed(self) -> bool:
        """Whether the instance ended after its deadline."""
        return self.lateness > 0


def shedding_operator(query: QueryInfo) -> str | None:
    """The query's shedding stage: the first of its control-table entries that carries a ``drop_ratio``
    (registered with ``ctx.control(op, drop_ratio=0.0)``); None when it has none.
    """
    for op, params in query.control.items():
        if "drop_ratio" in params:
            return op
    return None


def drop_decision(query: QueryInfo, op: str, kept: float, reason: str, policy: str) -> Decision | None:
    """A decision setting ``op``'s drop ratio to ``1 − kept`` (3 decimals, at most 0.999), None if the
    control table holds it already (within 0.005).
    """
    drop = drop_for(kept)
    if abs(drop - written_drop_ratio(query, op)) < DROP_TOLERANCE:
        return None
    return Decision(op, {"drop_ratio": drop}, reason, query=query.name)


def written_drop_ratio(query: QueryInfo, op: str) -> float:
    """The drop ratio the control table holds for ``op`` of ``query`` (0 when it holds none)."""
    return float(query.control.get(op, {}).get("drop_ratio", 0.0))


#: A drop ratio within this of the control table's is not written again (no decision for noise).
DROP_TOLERANCE = 0.005


def drop_for(kept: float) -> float:
    """The drop ratio a policy writes to keep the fraction ``kept``: ``1 − kept`` in [0, 0.999], 3 decimals."""
    return round(min(max(1.0 - kept, 0.0), 0.999), 3)


@dataclass(frozen=True)
class QueryInfo:
    """What a policy knows about one continuous query.

    Parameters
    ----------
    name : str
        The query name.
    plan : pyspark_cq.plan.Node, optional
        Its logical plan for the cost models. ``Window`` and ``Granularity`` nodes whose size a policy
        may change carry the label ``"<operator>.<param>"`` of the control-table parameter they stand for
        (see :func:`label`); ``Source`` names match ``sources``.
    qos : mapping label -> QoSRange
        QoS range of each adjustable parameter (PIPES §4.3).
    sources : mapping str -> SourceStats
        Per-source statistics, keyed by the plan's source names.
    operators : mapping str -> OperatorStats
        Per-operator statistics, keyed by operator id.
    control : mapping str -> mapping
        Current control-table parameters of the query's operators.
    batches, input_rate, batch_duration, state_rows, state_bytes, late_rows_total, event_time
        Query-level statistics: micro-batches seen, smoothed input rows/s, smoothed batch duration (s),
        Spark state-store rows and bytes (latest), rows dropped by the watermark since start, latest
        maximum event time (µs since the epoch, or None).
    watermark_delay : float, optional
        Smoothed watermark delay δ (seconds): the largest event time of the previous micro-batches minus
        the batch's ``eventTime.watermark``; None until measured.
    period, deadline : float, optional
        Period P and relative deadline D in seconds of a periodic query (Wei et al., §2), else None.
    instances : tuple of Instance
        The latest instances of a periodic query (at most :data:`INSTANCES_KEPT`), oldest first.
    batch_span : float, optional
        Smoothed event time B (seconds) one micro-batch advances the largest event time; None until
        measured. A watermark-driven Spark operator keeps ``window + δ + B`` of event time
        (:func:`pyspark_cq.cost.pipes.watermark_retention`, docs/cost-model.md "Validation on Spark").
    slice_class : str, optional
        For a query of a query group (docs/groups.md, "The runtime"): the query whose slice table it shares,
        the first of its slice class (itself when first). Queries with the same ``slice_class`` hold **one**
        state, through the class's widest window, reported on that first query (the others report 0); a
        policy costs it once. None: a query of its own.
    """

    name: str
    plan: P.Node | None = None
    qos: Mapping[str, QoSRange] = field(default_factory=dict)
    sources: Mapping[str, SourceStats] = field(default_factory=dict)
    operators: Mapping[str, OperatorStats] = field(default_factory=dict)
    control: Mapping[str, Mapping] = field(default_factory=dict)
    batches: int = 0
    input_rate: float = NAN
    batch_duration: float = NAN
    state_rows: float = NAN
    state_bytes: float = NAN
    late_rows_total: int = 0
    event_time: int | None = None
    watermark_delay: float | None = None
    batch_span: float | None = None
    period: float | None = None
    deadline: float | None = None
    instances: tuple = ()
    slice_class: str | None = None

    def __post_init__(self):
        periodic_spec(self.period, self.deadline)
        if self.slice_class is not None and (not isinstance(self.slice_class, str) or not self.slice_class):
            raise TypeError(f"slice_class must be None or a query name (non-empty str), got {self.slice_class!r}")
        if not all(isinstance(i, Instance) for i in self.instances):
            raise TypeError("instances must be a tuple of Instance")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str, got {self.name!r}")
        for fname in ("watermark_delay", "batch_span"):
            value = getattr(self, fname)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"{fname} must be a finite number of seconds >= 0 or None, got {value!r}")
        if self.plan is not None and not isinstance(self.plan, P.Node):
            raise TypeError(f"plan must be a pyspark_cq.plan.Node or None, got {type(self.plan).__name__}")
        for fname in ("qos", "sources", "operators", "control"):
            if not isinstance(getattr(self, fname), Mapping):
                raise TypeError(f"{fname} must be a mapping, got {type(getattr(self, fname)).__name__}")
        for key, rng in self.qos.items():
            parse_label(key, f"qos key {key!r}")
            if not isinstance(rng, QoSRange):
                raise TypeError(f"qos[{key!r}] must be a QoSRange, got {type(rng).__name__}")

    def control_value(self, text: str, default=None):
        """The current control-table value of the parameter labelled ``"<operator>.<param>"``."""
        operator, param = parse_label(text)
        return self.control.get(operator, {}).get(param, default)


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy sees in one round.

    Parameters
    ----------
    time : float
        Wall-clock seconds since the epoch when the snapshot was taken.
    queries : mapping str -> QueryInfo
        The registered queries.
    memory_budget : float, optional
        Memory bound M in bytes (PIPES §4.3), if the runtime has one.
    cpu_budget : float, optional
        Processing-cost bound C in the cost model's unit, if any.
    """

    time: float = 0.0
    queries: Mapping[str, QueryInfo] = field(default_factory=dict)
    memory_budget: float | None = None
    cpu_budget: float | None = None

    def __post_init__(self):
        if isinstance(self.time, bool) or not isinstance(self.time, (int, float)) or not math.isfinite(self.time):
            raise TypeError(f"time must be a finite number of seconds, got {self.time!r}")
        if not isinstance(self.queries, Mapping):
            raise TypeError(f"queries must be a mapping of name -> QueryInfo, got {type(self.queries).__name__}")
        for key, q in self.queries.items():
            if not isinstance(q, QueryInfo):
                raise TypeError(f"queries[{key!r}] must be a QueryInfo, got {type(q).__name__}")
            if q.name != key:
                raise ValueError(f"queries[{key!r}] holds the query named {q.name!r}")
        for fname in ("memory_budget", "cpu_budget"):
            value = getattr(self, fname)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{fname} must be a positive number or None, got {value!r}")

    @property
    def empty(self) -> bool:
        """True when no query is registered."""
        return not self.queries
