"""The PIPES resource manager: keep the estimated memory and CPU of all queries within bounds.

Cammert, Krämer, Seeger & Vaupel, "A Cost Model for Adaptive Resource Management in Data Stream Systems"
(PIPES), §4. The resource manager adjusts window sizes and time granularities within the users' QoS
ranges so that the resources estimated by the PIPES cost model (§3, :mod:`pyspark_cq.cost.pipes`) stay
within the memory bound M and the processing bound C:

- **Strategy (§4.3).** All windows and granularities are set to the same fraction f of their QoS range:
  the allowed value closest to ``min + f·(max − min)`` (for a granularity, min is the coarsest and max the
  finest). *Step 1*: for j = 0, 1, …, p the estimates C_j and M_j are computed with f = (p − j)/p until
  ``C_j <= C`` and ``M_j <= M``; the granularities are fixed at that step's values. *Step 2*: the fraction
  of the window sizes is fine-tuned by bisection. The paper notes the strategy relies on resource usage
  growing with f, which holds for plans of selection, projection, union, join and aggregation.
- **Admission control (§4.1.1).** A new query is accepted if some f (possibly lower than now: the other
  queries shrink within their QoS ranges) fits all queries within the bounds, else rejected with the reason.
  A removed query releases its resources to the others (larger windows, finer granularities).
- **Changing stream characteristics (§3.2.2, §4.1.2).** The distance d of each source is compared with the
  value the last estimate used; when it moved by more than ``distance_threshold`` (relative), the estimates
  of the queries over that source are recomputed and the plan redone.
- **Reserve (§4.1.2, §5.4).** A share ``reserve`` of both bounds is kept free for bursts and adaptation
  delays (a window reduction takes effect only after the old window, §4.2).
- **Load shedding as the last resort (``shed=True``; §5.3, random load shedding after Tatbul et al.).**
  When even every query at the minimum of its QoS range is estimated over a bound (an infeasible
  allocation, e.g. in a burst), the queries that have a shedding stage (a control-table entry carrying a
  ``drop_ratio``) keep a common fraction ε of their input: the largest ε in [``min_kept``, 1] (bisection
  over the cost model) at which the estimates at the QoS minimum fit, with every source of a shedding query
  costed at distance d/ε (a stage that drops 1 − ε of the input thins every stream behind it by ε:
  memory of a window join falls by ε per side, its CPU by ε², §5.3). Windows are reduced first — they keep
  the results exact for the chosen QoS, shedding does not (§5.3) — and shedding stops (``drop_ratio`` 0)
  as soon as the allocation is feasible again.

- **Hard memory cap (``cap=True``; an extension, not in the paper).** Windows adapt only after a delay
  (a reduction takes effect after the old window, §4.2; the rates are smoothed), and meanwhile the
  *measured* state may pass the budget (the demo peaked at 1.24× it). With ``cap`` the resource manager
  holds M' = (1 − ``reserve``)·M as a cap on the measured state ``S`` (the operators' latest ``state_bytes``) by
  shedding the input of the queries' shedding stages, as the last resort while the windows adapt. Each round
  it predicts the
  state at the time the *next* round's decision can take effect, ``I + L`` later (I: the time since the
  previous round, L: one micro-batch, the larger of a query's ``batch_span`` and ``batch_duration``), and
  keeps the largest fraction ε (down to 0.001) with

  ``S + G·(I + 2L) + A·(ε_now·L + ε·(I + L)) <= M'``

  where A (bytes/s) is what the shedding queries' full input adds to their state (each stateful
  operator's smoothed input rate × its bytes per stored row; every kept row is assumed stored, none
  evicted: an upper bound) and G (bytes/s) the growth of the other queries' state since the previous round
  (0 when it shrank). Shedding stops (``drop_ratio`` 0) as soon as the inequality holds at ε = 1. The
  **bound**: the measured state stays within M' as long as, until the next round, the input rates stay
  within their smoothed values, the next round comes within I and the bytes per stored row hold; beyond
  that it exceeds M' by at most what the unforeseen input adds in ``I + 2L`` (``Δλ · ε · b · (I + 2L)``, Δλ
  the rise in rows/s, ε the fraction kept, b the bytes per stored row), and M itself only when that excess
  passes the reserve. What is shed is counted (``shed_rows`` of the shedding
  operator) and the decision's reason gives S, the prediction and ε.

Costing. Every query's memory and CPU are evaluated with the PIPES cost model (through ``estimate``, by
default :func:`pipes_estimate`, i.e. :func:`pyspark_cq.cost.pipes.cost_plan`) at ``knots + 1`` fractions
f = k/knots of its windows (per granularity level where the query has a granularity); evaluations are cached
per query and recomputed only when one of its sources' d moved beyond the threshold (§3.1: "formulas that
are re-computed solely when current stream characteristics significantly differ"). Between knots the
bisection interpolates linearly: a window join's memory is linear in its window sizes (eq. 9), a join over a
join's output bilinear (convex along f), so the chord over-estimates there and the error is bounded by the
knot spacing. A re-plan is then a handful of vectorised sums over all queries.

Retention (``retention=True``). A Spark operator driven by a watermark keeps ``window + δ + B`` of event
time, not the window PIPES assumes (docs/cost-model.md, "Validation on Spark"): δ is the watermark delay,
B the event time of one micro-batch. With ``retention`` every time-based ``Window`` of a query's plan
(labelled or not) is costed at :func:`pyspark_cq.cost.pipes.watermark_retention` of its size with the
query's measured ``QueryInfo.watermark_delay`` and ``batch_span`` (0 while unknown); a relative move of
δ + B beyond ``distance_threshold`` invalidates that query's cached estimates, like d.

Query groups (docs/groups.md, "The runtime"). The members of a query group are queries of the snapshot with
their plans, QoS ranges and ``slice_class``: the members of one slice class share one slice table, kept for the
class's widest window. The manager costs that state **once**, on the class's first query, through the widest of
the members' windows at each f; the other members add no memory. It changes a class's windows only when every
member has a QoS range of its window (:func:`pyspark_cq.cost.groups.fixed_classes`, the rule of the runtime's own
re-plans): reducing one member's window while another keeps a fixed wider one would not shrink the table, so a
class with a fixed member is costed at its members' windows as they are and none of its windows is decided.
An adjustable class's members all move at the common f (each within its own QoS range), and the runtime sets
them through the group (``QueryGroup.set_window``, rounded to whole slices).

Plans and QoS come from :class:`~pyspark_cq.policies.QueryInfo`: ``Window`` and ``Granularity`` nodes that
carry a label ``"<operator>.<param>"`` present in ``qos`` are adjusted (plan sizes in µs). A label's param
``window`` or ``upper`` gives the window size directly; ``lower`` gives ``-lower`` (a bound-form interval
join keeps the right input for ``-lower``, see :func:`pyspark_cq.cost.pipes.join_state_rows`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from pyspark_cq import _human
from pyspark_cq import plan as P
from pyspark_cq.cost import pipes
from pyspark_cq.policies import (
    Admission,
    Decision,
    Decisions,
    Policy,
    QoSRange,
    QueryInfo,
    Snapshot,
    drop_decision,
    parse_label,
    parse_size,
    shedding_operator,
    written_drop_ratio,
)
from pyspark_cq.policies.decisions import duration_value, qos_values

__all__ = ["PipesResourceManager", "Allocation", "pipes_estimate", "DEFAULT_PROFILE"]

#: Bytes per element and per aggregate assumed when no cost profile is given (a row of a few columns in
#: a native state kernel); pass a calibrated :class:`pyspark_cq.cost.pipes.CostProfile` for real budgets.
DEFAULT_PROFILE = pipes.CostProfile(element_size=64.0, aggregate_size=64.0)
_SECOND = 1_000_000


def pipes_estimate(plan: P.Node, distances: Mapping[str, float], profile: pipes.CostProfile = DEFAULT_PROFILE
                   ) -> tuple[float, float]:
    """The resource manager's default estimate: :func:`pyspark_cq.cost.pipes.cost_from_distances` with the
    manager's :data:`DEFAULT_PROFILE` (64-byte elements and aggregates).
    """
    return pipes.cost_from_distances(plan, distances, profile)


@dataclass
class _Query:
    name: str
    info: QueryInfo
    sources: tuple[str, ...]
    window_labels: tuple[str, ...]      # adjusted window-like labels
    gran_labels: tuple[str, ...]        # adjusted granularity labels
    window_qos: tuple[QoSRange, ...]
    gran_values: np.ndarray             # (n_gran, p+1) µs, level j -> f = (p-j)/p
    window_knots: np.ndarray            # (n_windows, knots+1) µs at f = k/knots
    nodes: tuple                        # the plan in postorder (children first)
    row: int = -1
    delay: float = 0.0                  # δ (time units) of the cached estimates (retention)
    span: float = 0.0                   # B (time units) of the cached estimates (retention)
    role: tuple = ()                    # a group member: ("first", class's QoS ranges) or ("rider",); see _roles

    @property
    def gran_dependent(self) -> bool:
        return bool(self.gran_labels)

    @property
    def fixed(self) -> bool:
        return not self.window_labels and not self.gran_labels


@dataclass(frozen=True)
class Allocation:
    """The outcome of one re-plan (Cammert et al., §4.3).

    Attributes
    ----------
    feasible : bool
        Whether the estimates fit the bounds (minus the reserve); if not, every query is at its QoS minimum.
    level : int
        j of step 1: granularities at f = (p − j)/p.
    f_granularity, f_window : float
        The fractions of the granularity and window QoS ranges.
    memory, cpu : float
        Estimated totals (cost-model units: bytes with the default profile; events per time unit).
    memory_bound, cpu_bound : float or None
        The bounds applied (after the reserve).
    queries : int
        Queries planned.
    """

    feasible: bool
    level: int
    f_granularity: float
    f_window: float
    memory: float
    cpu: float
    memory_bound: float | None
    cpu_bound: float | None
    queries: int


class _CostTable:
    """Cached cost-model evaluations: (levels, knots + 1, rows) arrays of memory and CPU, nan = not yet."""

    def __init__(self, levels: int, knots: int, capacity: int = 64):
        self.levels, self.knots = levels, knots
        self.mem = np.full((levels, knots + 1, capacity), np.nan)
        self.cpu = np.full((levels, knots + 1, capacity), np.nan)
        self.active = np.zeros(capacity, dtype=bool)
        self.free: list[int] = []
        self.size = 0

    def add(self) -> int:
        if self.free:
            row = self.free.pop()
        else:
            if self.size == self.active.size:
                grow = self.active.size
                self.mem = np.concatenate([self.mem, np.full(self.mem.shape[:2] + (grow,), np.nan)], axis=2)
                self.cpu = np.concatenate([self.cpu, np.full(self.cpu.shape[:2] + (grow,), np.nan)], axis=2)
                self.active = np.concatenate([self.active, np.zeros(grow, dtype=bool)])
            row = self.size
            self.size += 1
        self.invalidate(row)
        self.active[row] = True
        return row

    def drop(self, row: int) -> None:
        self.active[row] = False
        self.invalidate(row)
        self.free.append(row)

    def invalidate(self, row: int) -> None:
        self.mem[:, :, row] = np.nan
        self.cpu[:, :, row] = np.nan


class PipesResourceManager(Policy):
    """PIPES resource manager: window and granularity adjustment within QoS ranges, admission control.

    Cammert et al., §4.1 (runtime adaptivity), §4.3 (strategy); the estimates come from the PIPES cost
    model (§3). See the module docstring for the algorithm.

    Parameters
    ----------
    memory : float or str, optional
        Memory bound M (bytes, or e.g. ``"512 MB"``); default: the snapshot's ``memory_budget``.
    cpu : float, optional
        Processing bound C in the cost model's unit (with a calibrated profile: seconds of work per time
        unit); default: the snapshot's ``cpu_budget``.
    p : int
        Approximation parameter of step 1 (granularity levels f = (p − j)/p).
    knots : int
        Exact cost-model evaluations per query at f = k/knots (a multiple of ``p``).
    tolerance : float
        Bisection stops when the bracket of f is narrower.
    reserve : float
        Share of the bounds kept free for bursts, in [0, 1).
    distance_threshold : float
        Relative change of a source's d that triggers re-estimation (§3.2.2), > 0.
    time_unit : int or str
        Application time unit of the cost model (µs or a duration; default 1 ms, the paper's finest
        granularity in §5.4); no QoS granularity may be finer.
    profile : pyspark_cq.cost.pipes.CostProfile, optional
        Cost constants and element sizes (default :data:`DEFAULT_PROFILE`).
    estimate : callable, optional
        ``estimate(plan, distances) -> (memory, cpu)`` with sizes and distances in ``time_unit``;
        default :func:`pipes_estimate` with ``profile``. Must be picklable (a module-level function).
    distances : mapping str -> float, optional
        Prior distance d (seconds) per source, used until the statistics measure it.
    prefetch : bool
        After each feasible re-plan, evaluate every query at all knots of the chosen granularity level (and
        at the step-1 points), so that later re-plans and admissions find the estimates cached; without it
        estimates are computed when first needed.
    retention : bool
        Cost every time-based window of a query as ``window + δ + B``, the event time a watermark-driven
        Spark operator really keeps (δ, B: the query's ``watermark_delay`` and ``batch_span`` statistics,
        0 until measured); False (default): the plain PIPES windows.
    shed : bool
        Load shedding as the last resort (see the module docstring): when the allocation is infeasible,
        set the ``drop_ratio`` of every managed query's shedding stage so that the estimates fit; back to
        0 once it is feasible. False (default): windows and granularities only, as in the paper's §4.3.
    min_kept : float
        The smallest fraction of the input shedding keeps, in (0, 1] (``shed``; the cap goes down to 0.001).
    cap : bool
        Hold the memory bound M as a hard cap on the measured state by shedding (see "Hard memory cap" in
        the module docstring); independent of ``shed`` (when both ask, the smaller kept fraction wins).
        False (default): the bound is a target of the estimates only.
    """

    name = "pipes"

    def __init__(self, memory=None, cpu=None, *, p: int = 8, knots: int = 16, tolerance: float = 1e-3,
                 reserve: float = 0.1, distance_threshold: float = 0.2, time_unit=1000, profile=None,
                 estimate: Callable | None = None, distances: Mapping[str, float] | None = None,
                 prefetch: bool = True, retention: bool = False, shed: bool = False, min_kept: float = 0.05,
                 cap: bool = False):
        self.memory = None if memory is None else parse_size(memory, "memory")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not cpu > 0):
            raise ValueError(f"cpu must be a positive processing-cost bound or None, got {cpu!r}")
        self.cpu = None if cpu is None else float(cpu)
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"p must be an integer >= 1 (PIPES §4.3 step 1), got {p!r}")
        if isinstance(knots, bool) or not isinstance(knots, int) or knots < 1 or knots % p:
            raise ValueError(f"knots must be a positive multiple of p = {p}, got {knots!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve < 1:
            raise ValueError(f"reserve must be a share in [0, 1), got {reserve!r}")
        if (isinstance(distance_threshold, bool) or not isinstance(distance_threshold, (int, float))
                or not distance_threshold > 0):
            raise ValueError(f"distance_threshold must be a relative change > 0, got {distance_threshold!r}")
        self.p, self.knots, self.tolerance = p, knots, float(tolerance)
        self.reserve, self.distance_threshold = float(reserve), float(distance_threshold)
        self.time_unit = duration_value(time_unit, "time_unit", allow_negative=False, allow_zero=False)
        if profile is not None and not isinstance(profile, pipes.CostProfile):
            raise TypeError(f"profile must be a pyspark_cq.cost.pipes.CostProfile or None, got {profile!r}")
        self.profile = profile
        if estimate is not None and not callable(estimate):
            raise TypeError(f"estimate must be callable(plan, distances) -> (memory, cpu), got {estimate!r}")
        self.estimate = estimate
        if distances is not None and not isinstance(distances, Mapping):
            raise TypeError(f"distances must be a mapping source -> d (seconds), got {distances!r}")
        self.distances = None if distances is None else {
            str(k): _positive(v, f"distances[{k!r}]") for k, v in distances.items()}
        if not isinstance(prefetch, bool):
            raise TypeError(f"prefetch must be a bool, got {prefetch!r}")
        self.prefetch = prefetch
        if not isinstance(retention, bool):
            raise TypeError(f"retention must be a bool (cost windows as window + watermark delay + batch span), "
                            f"got {retention!r}")
        self.retention = retention
        if not isinstance(shed, bool):
            raise TypeError(f"shed must be a bool (load shedding when the QoS minimum does not fit), got {shed!r}")
        if isinstance(min_kept, bool) or not isinstance(min_kept, (int, float)) or not 0 < min_kept <= 1:
            raise ValueError(f"min_kept must be a fraction in (0, 1], got {min_kept!r}")
        self.shed, self.min_kept = shed, float(min_kept)
        if not isinstance(cap, bool):
            raise TypeError(f"cap must be a bool (hold the memory bound as a hard cap on the measured state), "
                            f"got {cap!r}")
        self.cap = cap
        self._reset()

    def _reset(self) -> None:
        self._queries: dict[str, _Query] = {}
        self._rows: dict[int, _Query] = {}
        self._table = _CostTable(self.p + 1, self.knots)
        self._d_used: dict[str, float] = {}        # source -> d (time units) of the cached estimates
        self._budget: tuple = (self.memory, self.cpu)
        self._allocation: Allocation | None = None
        self._dirty = True
        self.skipped: dict[str, str] = {}          # query -> why it is not managed
        self.evaluations = 0                        # cost-model evaluations so far
        self._emitted: dict[str, dict] = {}         # query -> label -> value last decided
        self._structure = 0                         # bumped when the set of queries changes
        self._layout = None
        self.kept = 1.0                             # the fraction of input shedding keeps (shed / cap)
        self.cap_status: dict = {}                  # the last round of the hard cap (cap=True), for reports
        self._cap_last: tuple | None = None         # (time, {query: measured state bytes}) of the last round

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"memory": "2 MB", "p": 4, "knots": 8, "reserve": 0.2}, {"retention": True},
                {"memory": "2 MB", "p": 4, "knots": 8, "retention": True},
                {"memory": "64 KB", "p": 2, "knots": 4, "shed": True}, {"memory": "64 KB", "cap": True}]

    # -- configuration helpers -------------------------------------------------------------------

    def _bounds(self) -> tuple[float | None, float | None]:
        mem, cpu = self._budget
        keep = 1.0 - self.reserve
        return (None if mem is None else mem * keep, None if cpu is None else cpu * keep)

    def _estimator(self):
        if self.estimate is not None:
            return self.estimate
        profile = self.profile or DEFAULT_PROFILE
        return lambda plan, distances: pipes_estimate(plan, distances, profile)

    def _units(self, micros: float) -> float:
        return micros / self.time_unit

    # -- queries ---------------------------------------------------------------------------------

    def _model(self, info: QueryInfo) -> _Query:
        """Validate a query for the resource manager; raise ValueError saying why it cannot be managed."""
        if info.plan is None:
            raise ValueError("it has no plan (QueryInfo.plan) to cost")
        windows, grans = [], []
        for node in P.postorder(info.plan):
            if node.label is None or node.label not in info.qos:
                continue
            _, param = parse_label(node.label)
            if isinstance(node, P.Window) and param in ("window", "lower", "upper"):
                if node.kind != "time":
                    raise ValueError(f"window {node.label!r} is tuple-based; QoS adjusts time-based windows")
                windows.append(node.label)
            elif isinstance(node, P.Granularity) and param == "granularity":
                grans.append(node.label)
            else:
                raise ValueError(f"label {node.label!r} on a {type(node).__name__} node does not match its "
                                 f"parameter (windows: window/lower/upper; granularities: granularity)")
        windows, grans = tuple(dict.fromkeys(windows)), tuple(dict.fromkeys(grans))
        unused = set(info.qos) - set(windows) - set(grans)
        if unused:
            raise ValueError(f"qos names {sorted(unused)}, which label no Window/Granularity node of its plan")
        f_levels = (self.p - np.arange(self.p + 1)) / self.p
        gran_values = np.zeros((len(grans), self.p + 1))
        for i, lab in enumerate(grans):
            rng = info.qos[lab]
            if min(rng.min, rng.max) < self.time_unit:
                raise ValueError(f"granularity {lab!r} may be as fine as {min(rng.min, rng.max):g} µs, finer than "
                                 f"the resource manager's time_unit {self.time_unit} µs")
            gran_values[i] = qos_values(rng.min, rng.max, f_levels, step=rng.step, choices=rng.choices)
        window_qos = tuple(info.qos[lab] for lab in windows)
        f_knots = np.arange(self.knots + 1) / self.knots
        window_knots = np.zeros((len(windows), self.knots + 1))
        for i, rng in enumerate(window_qos):
            window_knots[i] = qos_values(rng.min, rng.max, f_knots, step=rng.step, choices=rng.choices)
        return _Query(info.name, info, P.source_names(info.plan), windows, grans, window_qos, gran_values,
                      window_knots, tuple(P.postorder(info.plan)))

    def add(self, info: QueryInfo) -> None:
        """Manage ``info`` without admission control (a query that is already running).

        Raises ValueError (naming the reason) when the query cannot be managed.
        """
        if not isinstance(info, QueryInfo):
            raise TypeError(f"info must be a QueryInfo, got {type(info).__name__}")
        query = self._model(info)
        if info.name in self._queries:
            old = self._queries[info.name]
            query.delay, query.span = old.delay, old.span
            self._drop(info.name)
        query.row = self._table.add()
        self._queries[info.name] = query
        self._rows[query.row] = query
        self.skipped.pop(info.name, None)
        self._dirty = True
        self._structure += 1

    def _drop(self, name: str) -> None:
        self._emitted.pop(name, None)
        query = self._queries.pop(name)
        self._rows.pop(query.row, None)
        self._table.drop(query.row)
        self._dirty = True
        self._structure += 1

    def remove(self, query: str) -> Decisions:
        """Forget ``query`` (PIPES §4.1.1: released resources go to the others at the next re-plan)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a query name (str), got {query!r}")
        if query in self._queries:
            self._drop(query)
        self.skipped.pop(query, None)
        return Decisions((), self.name)

    @property
    def queries(self) -> list[str]:
        """Names of the managed queries."""
        return list(self._queries)

    def set_budget(self, memory=None, cpu=None) -> None:
        """Change the bounds (None: keep the constructor's / unbounded)."""
        budget = (None if memory is None else parse_size(memory, "memory"),
                  None if cpu is None else _positive(cpu, "cpu"))
        if budget != self._budget:
            self._budget = budget
            self._dirty = True

    def set_distance(self, source: str, seconds: float) -> bool:
        """Report the measured distance d (seconds) of ``source`` (PIPES §3.2.2, §4.1.2).

        Returns True when d moved beyond ``distance_threshold`` from the value of the cached estimates (or
        was unknown): the estimates of the queries over ``source`` are then recomputed at the next re-plan.
        """
        if not isinstance(source, str) or not source:
            raise TypeError(f"source must be a source name (str), got {source!r}")
        d = self._units(_positive(seconds, "seconds") * _SECOND)
        used = self._d_used.get(source)
        if used is not None and abs(d - used) <= self.distance_threshold * used:
            return False
        self._d_used[source] = d
        for q in self._queries.values():
            if source in q.sources:
                self._table.invalidate(q.row)
        self._dirty = True
        return True

    def set_retention(self, query: str, watermark_delay, batch_span) -> bool:
        """Report the measured watermark delay δ and batch span B (seconds; None = unknown = 0) of ``query``.

        Only with ``retention``. Returns True when δ + B moved beyond ``distance_threshold`` (relative) from
        the value of the cached estimates: the query's estimates are then recomputed at the next re-plan.
        """
        if query not in self._queries:
            raise KeyError(f"query {query!r} is not managed; managed: {sorted(self._queries)}")
        if not self.retention:
            return False
        q = self._queries[query]
        delay, span = (self._units(_seconds_or_zero(v, n) * _SECOND)
                       for v, n in ((watermark_delay, "watermark_delay"), (batch_span, "batch_span")))
        used = q.delay + q.span
        if abs(delay + span - used) <= self.distance_threshold * used:
            return False
        q.delay, q.span = delay, span
        self._table.invalidate(q.row)
        self._dirty = True
        return True

    # -- costing ---------------------------------------------------------------------------------

    def _window_values(self, q: _Query, f: float) -> np.ndarray:
        out = np.empty(len(q.window_qos))
        for i, rng in enumerate(q.window_qos):
            out[i] = qos_values(rng.min, rng.max, f, step=rng.step, choices=rng.choices)
        return out

    def _cost_windows(self, q: _Query, knot: int) -> np.ndarray:
        """The windows ``q`` is costed at, at knot ``knot``: its own, or for the first query of a group's
        adjustable slice class the widest of its class's windows there (the one table keeps that much).
        """
        if q.role[:1] != ("first",) or not q.role[1]:
            return q.window_knots[:, knot]
        f = knot / self.knots
        widest = max(qos_values(r.min, r.max, f, step=r.step, choices=r.choices) for r in q.role[1])
        return np.maximum(q.window_knots[:, knot], widest)

    def _plan_at(self, q: _Query, windows: np.ndarray, level: int) -> P.Node:
        # The event time a window keeps: its size + δ + B with retention (q.delay, q.span stay 0 without it,
        # and then watermark_retention returns the size itself).
        sizes = {}
        for lab, value in zip(q.window_labels, windows):
            # The PIPES window a control parameter stands for: window/upper as is, lower negated; extended
            # before clipping at 0, as join_state_rows does.
            raw = self._units(-value if parse_label(lab)[1] == "lower" else value)
            sizes[lab] = max(pipes.watermark_retention(raw, q.delay, q.span), 0.0)
        for lab, value in zip(q.gran_labels, q.gran_values[:, level]):
            sizes[lab] = self._units(value)

        def change(node):
            if node.label in sizes:
                return {"size" if isinstance(node, P.Window) else "granularity": sizes[node.label]}
            if isinstance(node, P.Window):
                return {"size": (pipes.watermark_retention(self._units(node.size), q.delay, q.span)
                                 if node.kind == "time" else node.size)}
            if isinstance(node, P.Granularity):
                return {"granularity": self._units(node.granularity)}
            return {}

        return P.rewrite(q.nodes[-1], change, q.nodes)

    def _ready(self, q: _Query) -> bool:
        return all(s in self._d_used for s in q.sources)

    def _ensure(self, level: int, knot: int, rows: np.ndarray) -> None:
        """Fill missing cost-model evaluations at (level, knot) for ``rows``."""
        t = self._table
        missing = rows[np.isnan(t.mem[level, knot, rows])]
        if missing.size == 0:
            return
        estimate = self._estimator()
        for row in missing.tolist():
            q = self._rows[row]
            distances = {s: self._d_used[s] for s in q.sources}
            mem, cpu = estimate(self._plan_at(q, self._cost_windows(q, knot), level), distances)
            mem = 0.0 if q.role[:1] == ("rider",) else mem      # its slice class's state is its first query's
            self.evaluations += 1
            if q.fixed:
                t.mem[:, :, row], t.cpu[:, :, row] = mem, cpu
            elif q.gran_dependent:
                t.mem[level, knot, row], t.cpu[level, knot, row] = mem, cpu
            else:
                t.mem[:, knot, row], t.cpu[:, knot, row] = mem, cpu

    def _row_costs(self, level: int, f: float, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Estimated memory and CPU of ``rows`` with granularities at ``level`` and windows at fraction ``f``:
        exact cost-model values at the knots, linear in between.
        """
        x = f * self.knots
        k = int(math.floor(x + 1e-12))
        w = x - k
        t = self._table
        if k >= self.knots or w < 1e-12:
            k = min(k, self.knots)
            self._ensure(level, k, rows)
            return t.mem[level, k, rows], t.cpu[level, k, rows]
        self._ensure(level, k, rows)
        self._ensure(level, k + 1, rows)
        mem = (1 - w) * t.mem[level, k, rows] + w * t.mem[level, k + 1, rows]
        cpu = (1 - w) * t.cpu[level, k, rows] + w * t.cpu[level, k + 1, rows]
        return mem, cpu

    def _totals(self, level: int, f: float, rows: np.ndarray) -> tuple[float, float]:
        """Total estimated memory and CPU with granularities at ``level`` and windows at fraction ``f``."""
        mem, cpu = self._row_costs(level, f, rows)
        return float(mem.sum()), float(cpu.sum())

    def _planned_rows(self) -> np.ndarray:
        rows = [q.row for q in self._queries.values() if self._ready(q)]
        return np.asarray(sorted(rows), dtype=np.int64)

    # -- the strategy (§4.3) ---------------------------------------------------------------------

    def replan(self) -> Allocation:
        """Run the strategy of Cammert et al., §4.3 over the managed queries whose sources' d is known.

        Step 1 scans j = 0 … p with windows and granularities at f = (p − j)/p until both bounds hold and
        fixes the granularities; step 2 bisects the window fraction in [(p − j)/p, 1].
        """
        rows = self._planned_rows()
        mem_bound, cpu_bound = self._bounds()

        def fits(m: float, c: float) -> bool:
            return (mem_bound is None or m <= mem_bound) and (cpu_bound is None or c <= cpu_bound)

        level, feasible = self.p, False
        for j in range(self.p + 1):
            if fits(*self._totals(j, (self.p - j) / self.p, rows)):
                level, feasible = j, True
                break
        lo = (self.p - level) / self.p
        if feasible and level > 0:
            hi = 1.0
            if fits(*self._totals(level, hi, rows)):
                lo = hi
            while hi - lo > self.tolerance:
                mid = (lo + hi) / 2
                if fits(*self._totals(level, mid, rows)):
                    lo = mid
                else:
                    hi = mid
        mem, cpu = self._totals(level, lo, rows)
        if self.prefetch and feasible:
            for k in range(self.knots + 1):
                self._ensure(level, k, rows)
            for j in range(self.p + 1):
                self._ensure(j, self.knots * (self.p - j) // self.p, rows)
        self._allocation = Allocation(feasible, level, (self.p - level) / self.p, lo, mem, cpu, mem_bound,
                                      cpu_bound, int(rows.size))
        self._dirty = False
        return self._allocation

    @property
    def allocation(self) -> Allocation | None:
        """The last re-plan's result."""
        return self._allocation

    def _window_layout(self):
        """All adjusted windows of all queries as flat arrays (rebuilt when the set of queries changes)."""
        if self._layout is not None and self._layout[0] == self._structure:
            return self._layout[1]
        names, offsets, lows, highs, steps, choices = [], [0], [], [], [], {}
        for name in sorted(self._queries):
            q = self._queries[name]
            for rng in q.window_qos:
                if rng.choices is not None:
                    choices[len(lows)] = rng
                lows.append(rng.min)
                highs.append(rng.max)
                steps.append(rng.step or 0.0)
            names.append(name)
            offsets.append(len(lows))
        layout = (names, offsets, np.asarray(lows, dtype=np.float64), np.asarray(highs, dtype=np.float64),
                  np.asarray(steps, dtype=np.float64), choices)
        self._layout = (self._structure, layout)
        return layout

    def all_settings(self) -> dict[str, dict[str, int]]:
        """:meth:`settings` of every managed query at once (vectorised over all windows)."""
        if self._allocation is None:
            raise RuntimeError("no allocation yet: call replan() first")
        a = self._allocation
        names, offsets, lows, highs, steps, choices = self._window_layout()
        values = qos_values(lows, highs, a.f_window, step=steps) if lows.size else lows
        for i, rng in choices.items():
            values[i] = qos_values(rng.min, rng.max, a.f_window, choices=rng.choices)
        out = {}
        for k, name in enumerate(names):
            q = self._queries[name]
            vals = values[offsets[k]:offsets[k + 1]]
            entry = {lab: int(round(v)) for lab, v in zip(q.window_labels, vals.tolist())}
            entry.update({lab: int(round(v)) for lab, v in zip(q.gran_labels, q.gran_values[:, a.level].tolist())})
            out[name] = entry
        return out

    def settings(self, query: str) -> dict[str, int]:
        """The allocated value (µs) of every adjusted parameter of ``query``, by label."""
        if query not in self._queries:
            raise KeyError(f"query {query!r} is not managed; managed: {sorted(self._queries)}")
        if self._allocation is None:
            raise RuntimeError("no allocation yet: call replan() first")
        q, a = self._queries[query], self._allocation
        out = {lab: int(round(v)) for lab, v in zip(q.window_labels, self._window_values(q, a.f_window))}
        out.update({lab: int(round(v)) for lab, v in zip(q.gran_labels, q.gran_values[:, a.level])})
        return out

    def estimates(self, allocation: Allocation | None = None) -> dict[str, tuple[float, float]]:
        """Estimated (memory, cpu) of every planned query at ``allocation`` (default: the current one), with
        the current distances d — e.g. an old allocation after a rate change, before the windows adapt.
        """
        allocation = allocation or self._allocation
        if allocation is None:
            raise RuntimeError("no allocation yet: call replan() first")
        if not isinstance(allocation, Allocation):
            raise TypeError(f"allocation must be an Allocation, got {type(allocation).__name__}")
        rows = self._planned_rows()
        mem, cpu = self._row_costs(allocation.level, allocation.f_window, rows)
        return {self._rows[r].name: (float(m), float(c)) for r, m, c in zip(rows.tolist(), mem.tolist(), cpu.tolist())}

    def exact_estimate(self, query: str) -> tuple[float, float]:
        """Memory and CPU of ``query`` at the current allocation, evaluated by the cost model directly (no
        interpolation between knots).
        """
        if query not in self._queries:
            raise KeyError(f"query {query!r} is not managed; managed: {sorted(self._queries)}")
        if self._allocation is None:
            raise RuntimeError("no allocation yet: call replan() first")
        q = self._queries[query]
        if not self._ready(q):
            raise ValueError(f"query {query!r} has sources without a known distance d: "
                             f"{[s for s in q.sources if s not in self._d_used]}")
        a = self._allocation
        distances = {s: self._d_used[s] for s in q.sources}
        return self._estimator()(self._plan_at(q, self._window_values(q, a.f_window), a.level), distances)

    def _reason(self) -> str:
        a = self._allocation
        bound = "unbounded" if a.memory_bound is None else _human.size(a.memory_bound)
        state = "within" if a.feasible else "INFEASIBLE even at the QoS minimum for"
        return (f"PIPES resource manager (Cammert et al. §4.3): f_granularity={a.f_granularity:.4g}, "
                f"f_window={a.f_window:.4g}; estimated memory {_human.size(a.memory)} {state} bound {bound} "
                f"(reserve {self.reserve:.0%}), {a.queries} queries")

    def _decisions(self, current: Mapping[str, QueryInfo], names=None) -> Decisions:
        """Decisions moving the control values of ``names`` (default: all managed) to the allocation."""
        if self._allocation is None:
            return Decisions((), self.name)
        reason = self._reason()
        settings = self.all_settings()
        out = []
        for name in sorted(self._queries if names is None else names):
            q = self._queries[name]
            if not self._ready(q):
                continue
            if name in current:                   # the control table's values, as the snapshot shows them
                control = current[name].control
                known = {lab: control.get(lab.rsplit(".", 1)[0], {}).get(lab.rsplit(".", 1)[1])
                         for lab in settings[name]}
            else:                                 # no snapshot (admission): what was decided before
                known = self._emitted.get(name) or {lab: q.info.control_value(lab) for lab in settings[name]}
            per_op: dict[str, dict] = {}
            for lab, value in settings[name].items():
                if known.get(lab) != value:
                    op, param = lab.rsplit(".", 1)
                    per_op.setdefault(op, {})[param] = value
            self._emitted[name] = settings[name]
            out.extend(Decision(op, changes, reason, query=name) for op, changes in sorted(per_op.items()))
        return Decisions(out, self.name)

    # -- load shedding (shed=True) ---------------------------------------------------------------

    def shed_fraction(self, shedding) -> float:
        """The largest fraction ε in [``min_kept``, 1] of their input the queries named in ``shedding`` may
        keep so that all estimates at the QoS minimum fit the bounds (bisection to 0.005; ``min_kept`` when
        even that does not fit, 1.0 when the current allocation is feasible).

        The queries that do not shed keep their cached estimates at the minimum (level p, f = 0); the
        shedding ones are evaluated by the cost model with their sources at distance d / ε.
        """
        if self._allocation is None:
            raise RuntimeError("no allocation yet: call replan() first")
        shedding = set(shedding)
        if self._allocation.feasible or not shedding:
            return 1.0
        rows = self._planned_rows()
        sheds = np.asarray([self._rows[r].name in shedding for r in rows.tolist()], dtype=bool)
        shed_rows = rows[sheds].tolist()
        fixed_mem, fixed_cpu = self._totals(self.p, 0.0, rows[~sheds])
        mem_bound, cpu_bound = self._bounds()
        estimate = self._estimator()

        def fits(kept: float) -> bool:
            mem, cpu = fixed_mem, fixed_cpu
            for row in shed_rows:
                q = self._rows[row]
                m, c = estimate(self._plan_at(q, self._cost_windows(q, 0), self.p),
                                {src: self._d_used[src] / kept for src in q.sources})
                m = 0.0 if q.role[:1] == ("rider",) else m
                self.evaluations += 1
                mem, cpu = mem + m, cpu + c
            return (mem_bound is None or mem <= mem_bound) and (cpu_bound is None or cpu <= cpu_bound)

        lo, hi = self.min_kept, 1.0
        if not fits(lo):
            return lo
        while hi - lo > 0.005:
            mid = (lo + hi) / 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def cap_fraction(self, snapshot: Snapshot, stages: Mapping[str, str]) -> float:
        """The largest fraction ε in [0.001, 1] of their input the queries with a shedding stage (``stages``:
        query -> operator) may keep so that the measured state stays within the memory bound until the
        next round's decision takes effect (the inequality of "Hard memory cap" in the module docstring);
        1.0 without a memory bound or when the inflow A is not measured yet. Sets :attr:`cap_status`.
        """
        bound = self._bounds()[0]            # the budget less the reserve: room for what no rate foretold
        queries = {n: snapshot.queries[n] for n in self._queries if n in snapshot.queries}
        measured = {n: _measured_state(q) for n, q in queries.items()}
        last, self._cap_last = self._cap_last, (snapshot.time, measured)
        interval = snapshot.time - last[0] if last is not None and snapshot.time > last[0] else None
        batch = max([_batch_time(queries[n]) for n in stages] or [0.0])
        if interval is None:                 # the first round: assume the next one a micro-batch or two away
            interval = 2.0 * batch
        growth = 0.0                         # G: the other queries' growth since the last round, bytes/s
        if last is not None and interval > 0:
            for n, b in measured.items():
                if n not in stages and n in last[1]:
                    growth += max(b - last[1][n], 0.0) / interval
        inflow = sum(_inflow(queries[n], op) for n, op in stages.items())   # A, bytes/s at full input
        kept_now = min([1.0 - written_drop_ratio(queries[n], op) for n, op in stages.items()] or [1.0])
        state = sum(measured.values())
        self.cap_status = {"bound": bound, "measured": state, "inflow": inflow, "growth": growth,
                           "interval": interval, "batch": batch, "kept": 1.0}
        if bound is None or not stages or not math.isfinite(inflow) or inflow <= 0:
            return 1.0
        free = bound - state - growth * (interval + 2 * batch) - inflow * kept_now * batch
        if interval + batch > 0:
            kept = min(max(free / (inflow * (interval + batch)), _CAP_MIN_KEPT), 1.0)
        else:                                # nothing known about the time to the next round: the state alone
            kept = 1.0 if free >= 0 else _CAP_MIN_KEPT
        self.cap_status.update(kept=kept, predicted=state + growth * (interval + 2 * batch)
                               + inflow * (kept_now * batch + kept * (interval + batch)))
        return kept

    def _cap_reason(self, stages) -> str:
        c = self.cap_status
        return (f"PIPES resource manager, hard memory cap: measured state {_human.size(c['measured'])}, predicted "
                f"{_human.size(c['predicted'])} by the next round's decision "
                f"({_human.plain(round(c['interval'] + c['batch'], 1))} s away; full input adds "
                f"{_human.size(c['inflow'])}/s) against the cap {_human.size(c['bound'])} (the memory bound less "
                f"the {self.reserve:.0%} reserve); keep "
                f"{c['kept']:.3f} of the input of {sorted(stages)}")

    def _shed_decisions(self, snapshot: Snapshot) -> list[Decision]:
        """``drop_ratio`` decisions for the shedding stages of the managed queries in ``snapshot`` (``shed``:
        the cost model's fraction; ``cap``: the hard cap's; the smaller wins).
        """
        current = snapshot.queries
        stages = {name: shedding_operator(current[name]) for name in self._queries if name in current}
        stages = {name: op for name, op in stages.items() if op is not None}
        model = self.shed_fraction(stages) if self.shed else 1.0
        capped = self.cap_fraction(snapshot, stages) if self.cap else 1.0
        self.kept = min(model, capped)
        a = self._allocation
        if self.kept < 1.0 and capped < model:
            reason = self._cap_reason(stages)
        elif self.kept < 1.0:
            reason = (f"PIPES resource manager, load shedding (Cammert et al. §5.3): every query at its QoS "
                      f"minimum is estimated at {_human.size(a.memory)} "
                      f"(memory bound {_human.size(a.memory_bound)}); keep "
                      f"{self.kept:.3f} of the input of {sorted(stages)}")
        elif self.cap and self.cap_status.get("bound") is not None:
            reason = (f"PIPES resource manager: the measured state {_human.size(self.cap_status['measured'])} "
                      f"fits the cap {_human.size(self.cap_status['bound'])} without load shedding")
        else:
            reason = "PIPES resource manager: the allocation fits without load shedding"
        out = []
        for name, op in sorted(stages.items()):
            d = drop_decision(current[name], op, self.kept, reason, self.name)
            if d is not None:
                out.append(d)
        return out

    # -- Policy interface ------------------------------------------------------------------------

    def _sync(self, snapshot: Snapshot) -> None:
        self._check(snapshot)
        self.set_budget(self.memory if self.memory is not None else snapshot.memory_budget,
                        self.cpu if self.cpu is not None else snapshot.cpu_budget)
        for name in [n for n in self._queries if n not in snapshot.queries]:
            self._drop(name)
        roles = _roles(snapshot.queries)
        for name in sorted(snapshot.queries):
            info, role = roles.get(name, (snapshot.queries[name], ()))
            known = self._queries.get(name)
            if known is not None and (known.info.plan is info.plan or known.info.plan == info.plan) \
                    and known.info.qos == info.qos and known.role == role:
                known.info = info
                continue
            try:
                self.add(info)
                self._queries[name].role = role
            except ValueError as exc:
                if name in self._queries:
                    self._drop(name)
                self.skipped[name] = str(exc)
        measured: dict[str, list[float]] = {}
        for name in sorted(snapshot.queries):
            for src, st in snapshot.queries[name].sources.items():
                if math.isfinite(st.distance) and st.distance > 0:
                    measured.setdefault(src, []).append(st.distance)
        for src in sorted({s for q in self._queries.values() for s in q.sources}):
            if src in measured:
                self.set_distance(src, float(np.median(measured[src])))
            elif src not in self._d_used and self.distances and src in self.distances:
                self.set_distance(src, self.distances[src])
        if self.retention:
            for name in sorted(self._queries):
                info = snapshot.queries[name]
                self.set_retention(name, info.watermark_delay, info.batch_span)

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Sync queries, bounds and source distances with ``snapshot``, re-plan if anything moved, and
        return the changes that bring the control table to the allocation.
        """
        self._sync(snapshot)
        if self._dirty or self._allocation is None:
            self.replan()
        decisions = self._decisions(snapshot.queries)
        if not (self.shed or self.cap):
            return decisions
        return Decisions(list(decisions) + self._shed_decisions(snapshot), self.name)

    def admit_query(self, info: QueryInfo) -> Admission:
        """Admission control for ``info`` against the managed queries (Cammert et al., §4.1.1).

        Accepted when the strategy finds an f at which all queries, ``info`` included, fit the bounds
        (the decisions then move every query, possibly shrinking the others within their QoS ranges);
        otherwise rejected with the estimates at the QoS minimum. A query the resource manager cannot
        cost (no plan, unknown source rates) is accepted unmanaged, with the reason.
        """
        if not isinstance(info, QueryInfo):
            raise TypeError(f"info must be a QueryInfo, got {type(info).__name__}")
        try:
            query = self._model(info)
        except ValueError as exc:
            self.skipped[info.name] = str(exc)
            return Admission(True, f"accepted without resource management: {exc}", Decisions((), self.name))
        for src in query.sources:
            st = info.sources.get(src)
            if st is not None and math.isfinite(st.distance) and st.distance > 0 and src not in self._d_used:
                self.set_distance(src, st.distance)
            elif src not in self._d_used and self.distances and src in self.distances:
                self.set_distance(src, self.distances[src])
        if not self._ready(query):
            self.add(info)
            self.set_retention(info.name, info.watermark_delay, info.batch_span)
            unknown = [s for s in query.sources if s not in self._d_used]
            return Admission(True, f"accepted; no rate measured yet for {unknown}: planned once known",
                             Decisions((), self.name))
        previous = self._allocation
        self.add(info)
        self.set_retention(info.name, info.watermark_delay, info.batch_span)
        allocation = self.replan()
        if not allocation.feasible:
            self._drop(info.name)
            if previous is not None:
                self.replan()
            else:
                self._allocation = None
            mem_bound, cpu_bound = self._bounds()
            parts = []
            if mem_bound is not None and allocation.memory > mem_bound:
                parts.append(f"estimated memory {_human.size(allocation.memory)} > bound {_human.size(mem_bound)}")
            if cpu_bound is not None and allocation.cpu > cpu_bound:
                parts.append(f"estimated processing cost {_human.plain(allocation.cpu)} > bound "
                             f"{_human.plain(cpu_bound)}")
            return Admission(False, f"rejected {info.name!r}: even with every query at the minimum of its QoS "
                                    f"range (f = 0) " + " and ".join(parts) +
                                    f" (bounds after a {self.reserve:.0%} reserve)", Decisions((), self.name))
        return Admission(True, f"accepted {info.name!r}: " + self._reason(), self._decisions({}))

    def admit(self, query: QueryInfo, snapshot: Snapshot) -> Admission:
        """:meth:`admit_query` after syncing with the running queries in ``snapshot``."""
        if not isinstance(query, QueryInfo):
            raise TypeError(f"query must be a QueryInfo, got {type(query).__name__}")
        self._sync(snapshot)
        if self._dirty and self._queries:
            self.replan()
        return self.admit_query(query)


def _roles(queries: Mapping[str, QueryInfo]) -> dict:
    """The members of query groups' slice classes as the manager costs them: name -> (info, role).

    A join class (its members' plans joins, ``slice_class`` their class's first member) is costed once, through its
    widest windows, and never decided (:func:`_join_class_roles`). Per slice class
    (``QueryInfo.slice_class``), :func:`pyspark_cq.cost.groups.fixed_classes` — the rule of the
    runtime's own re-plans — says whether its windows may change. The class's first query carries the class's
    state (role ``("first", QoS ranges of the class's windows)``: costed through the widest window at each f;
    for a class that may not change, its plan's window is the widest of the members' windows as they are and
    no QoS range is left to decide); the others add no memory (role ``("rider",)``), and in a class that may
    not change they keep their windows (no QoS range).
    """
    from pyspark_cq.cost.groups import MemberLoad, fixed_classes

    classes: dict[str, list[QueryInfo]] = {}
    for info in queries.values():
        if info.slice_class is not None and info.plan is not None:
            classes.setdefault(info.slice_class, []).append(info)
    out = {}
    for cls, infos in classes.items():
        if _join_class_roles(cls, infos, out):
            continue
        loads, ranges = [], []
        for info in infos:
            window = next((n for n in P.postorder(info.plan) if isinstance(n, P.Window) and n.kind == "time"), None)
            gran = next((n for n in P.postorder(info.plan) if isinstance(n, P.Granularity)), None)
            if window is None or gran is None:
                break
            rng = next((r for k, r in info.qos.items() if k.endswith(".window")), None)
            ranges.append(rng)
            g = max(1, int(gran.granularity))
            loads.append(MemberLoad(info.name, cls, "stream", max(g, int(window.size)), g, g,
                                    None if rng is None else int(rng.min), None if rng is None else int(rng.max)))
        else:
            fixed = cls in fixed_classes(loads)
            first = next((i for i in infos if i.name == cls), infos[0])
            widest = max(m.window for m in loads)
            for info in infos:
                view = info if not fixed else replace(info, qos={})
                if info is not first:
                    out[info.name] = (view, ("rider",))
                elif fixed:
                    plan = P.rewrite(info.plan, lambda n, w=widest: {"size": w}
                                     if isinstance(n, P.Window) and n.kind == "time" else {})
                    out[info.name] = (replace(view, plan=plan), ("first", ()))
                else:
                    out[info.name] = (view, ("first", tuple(r for r in ranges if r is not None)))
    return out


def _join_class_roles(cls: str, infos: list, out: dict) -> bool:
    """The roles of a query group's join class (docs/groups.md, "Joins"), into ``out``; False when ``infos`` are not
    joins. The class keeps one symmetric hash state for each input's widest window over its members, fixed with the
    group's Spark plan: its first query is costed through a plan with those windows (role ``("first", ())``: no
    QoS range to decide), the others add no memory (``("rider",)``), none with a QoS range (a join's windows are
    not adjustable in a group, :func:`pyspark_cq.cost.groups.fixed_classes`).
    """
    sides = []
    for info in infos:
        join = next((n for n in P.postorder(info.plan) if isinstance(n, P.Join)), None)
        if join is None:
            return False
        sides.append([[n for n in P.postorder(kid) if isinstance(n, P.Window) and n.kind == "time"]
                      for kid in (join.left, join.right)])
    widest = [max((w.size for s in sides for w in s[k]), default=None) for k in (0, 1)]
    first = next((i for i, info in enumerate(infos) if info.name == cls), 0)
    size = {id(w): widest[k] for k in (0, 1) for w in sides[first][k]}
    for i, info in enumerate(infos):
        if i != first:
            out[info.name] = (replace(info, qos={}), ("rider",))
            continue
        plan = P.rewrite(info.plan, lambda n: {"size": size[id(n)]} if id(n) in size else {})
        out[info.name] = (replace(info, plan=plan, qos={}), ("first", ()))
    return True


#: The smallest fraction of the input the hard cap keeps (``drop_for`` writes at most 0.999).
_CAP_MIN_KEPT = 0.001


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _measured_state(info: QueryInfo) -> float:
    """The measured state of a query in bytes: its operators' latest ``state_bytes`` (Spark's state store's
    when no operator reports one; 0 before the first report).
    """
    sizes = [o.state_bytes for o in info.operators.values() if _finite(o.state_bytes)]
    if sizes:
        return float(sum(sizes))
    return float(info.state_bytes) if _finite(info.state_bytes) else 0.0


def _batch_time(info: QueryInfo) -> float:
    """One micro-batch of a query in seconds: the larger of its event-time span and its duration."""
    return max([v for v in (info.batch_span, info.batch_duration) if _finite(v)] or [0.0])


def _inflow(info: QueryInfo, stage: str) -> float:
    """Bytes/s the query's full input adds to its state (every row stored, none evicted): over its stateful
    operators, the smoothed input rate × bytes per stored row; an operator behind the shedding stage sees the
    input thinned to the kept fraction, so its rate is scaled back up. nan when no operator has measured it.
    """
    kept = 1.0 - written_drop_ratio(info, stage)
    total, known = 0.0, False
    for op, o in info.operators.items():
        if not (_finite(o.input_rate) and _finite(o.state_bytes) and _finite(o.state_rows)) or o.state_rows <= 0:
            continue
        rate = o.input_rate if op == stage else o.input_rate / max(kept, _CAP_MIN_KEPT)
        total, known = total + rate * o.state_bytes / o.state_rows, True
    return total if known else math.nan


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _seconds_or_zero(value, name: str) -> float:
    """A measured duration in seconds; None or nan (not measured yet) is 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if math.isnan(value):
        return 0.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0 or None, got {value!r}")
    return float(value)
