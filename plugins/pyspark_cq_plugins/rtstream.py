"""Prediction-based QoS management of periodic queries (RTStream) and its baselines.

Wei, Prasad, Son & Stankovic, "Prediction-Based QoS Management for Real-Time Data Streams". A periodic
query (registered with ``period`` P and relative ``deadline`` D, §2) runs one instance (a Spark
micro-batch) per period; an instance misses when it ends later than D after its release. This policy

- **profiles** every query (§4.1): the cost per row t_j and selectivity s_j of every operator whose report
  times it (``select_chain``'s ``nanos_<p>`` / ``rows_in_<p>`` / ``rows_passed_<p>``), exponentially
  smoothed (:class:`pyspark_cq.estimators.ExponentialSmoothing`, §4.1.3), and the rest of an instance's
  time as a fixed per-batch cost plus a cost per row, learned from the measured instances by exponentially
  weighted least squares (:class:`Profile`);
- **predicts** the next instance's time (§4.3, equation (1), :func:`pyspark_cq.cost.rtstream.chain_time`)
  over the rows it will read: the rows the last instance read (what one period brings) plus the backlog the
  sources' offsets show (:attr:`pyspark_cq.policies.Instance.backlog_rows`);
- **sheds** intra-query (§4.4): when the predicted time T exceeds the time left (``target``·D less the delay the last
  instance's overrun gives the next one's start), it keeps the fraction
  ε = D/T of the input (:func:`pyspark_cq.cost.rtstream.kept_fraction`; the fixed per-batch cost cannot be
  shed, so ε applies to the per-row part), as ``drop_ratio = 1 − ε`` of the query's shedding operator
  (the first of its control-table entries that carries a ``drop_ratio``), dropped before the predicates;
- **sheds a join per input** (§4.4, §5.2.2): for a query with a :class:`JoinQualityTable`, the highest
  level of the table whose predicted time (the join plan's time at the level's per-input fractions,
  :func:`join_time`) fits, written as the join's ``params["drop_left"]`` / ``["drop_right"]``, so the two
  inputs' drops conform to the table; the query's quality is that of its worse branch
  (:meth:`JoinQualityTable.quality`);
- **negotiates** inter-query (§4.3, Figure 7, :func:`negotiate`): when the predicted load of all periodic
  queries exceeds ``capacity``, the common quality is lowered step by step from 100 % and every query keeps
  the input fraction its input/quality table (:class:`QualityTable`) gives for that quality;
- **rejects** at admission a query that cannot meet its deadline even keeping only ``min_kept`` of its input
  (from its plan's costs, in seconds per row, and its sources' known rates).

Its selectivities and costs come from the instances' own reports (the kept rows are a hash sample of the
input already). The sampler-plan variants of §5.2.3 are separate policies that profile from
``select_chain``'s sampler plan instead (§4.2, a ``sample_ratio`` in the shedding stage's ``params``,
:meth:`RTStreamQoS.sampler`): :mod:`pyspark_cq_plugins.rtstream_fixed_sampling` (10 %) and
:mod:`pyspark_cq_plugins.rtstream_dynamic_sampling` (§5.1). The other baselines of §5.2 are in
:mod:`pyspark_cq_plugins.rtstream_baselines`.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyspark_cq import plan as P
from pyspark_cq.control.plans import SAMPLE, sample_ratios
from pyspark_cq.control.schema import SIDE_DROP_PARAMS, side_drop_ratios
from pyspark_cq.cost import rtstream
from pyspark_cq.estimators import ExponentialSmoothing
from pyspark_cq.policies import (
    DROP_TOLERANCE,
    INSTANCES_KEPT,
    Admission,
    Decision,
    Decisions,
    Policy,
    QueryInfo,
    Snapshot,
    drop_decision,
    drop_for,
    shedding_operator,
    written_drop_ratio,
)
from pyspark_cq.vocabulary import metrics as M

__all__ = ["RTStreamQoS", "QualityTable", "JoinQualityTable", "join_sides", "join_time", "Negotiation", "negotiate",
           "Profile", "shedding_operator", "Prediction", "join_drop_decision", "matched_predictions",
           "predicted_for", "MAX_ERROR_SCALE", "KEPT_MATCH"]


# -- input/quality tables and the Figure 7 negotiation ------------------------------------------------


class QualityTable:
    """An input/quality table (Wei et al., §4.3, Figure 6): the quality of a query's result as a function of
    the fraction of its input kept, linear between the given points.

    Parameters
    ----------
    points : sequence of (kept, quality)
        Fractions kept and the qualities, both in [0, 1], kept strictly increasing and quality
        non-decreasing (keeping more input never lowers the quality); the last point must be (1, 1).

    Examples
    --------
    The paper's Q0 (convex: an average tolerates dropping), Q1 (linear) and Q2 (concave: surveillance)
    at a target quality of 70 % drop 75 %, 30 % and 3 % of their input:

    >>> from pyspark_cq_plugins.rtstream import QualityTable
    >>> tables = [QualityTable([(0, 0), (0.25, 0.7), (1, 1)]), QualityTable.linear(),
    ...           QualityTable([(0, 0), (0.97, 0.7), (1, 1)])]
    >>> [round(1 - t.kept_for(0.7), 2) for t in tables]
    [0.75, 0.3, 0.03]
    """

    def __init__(self, points: Sequence):
        if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or len(points) < 2:
            raise TypeError(f"points must be a sequence of at least two (kept, quality) pairs, got {points!r}")
        kept, quality = [], []
        for i, pt in enumerate(points):
            if not isinstance(pt, Sequence) or len(pt) != 2:
                raise TypeError(f"points[{i}] must be a (kept, quality) pair, got {pt!r}")
            for value, what in zip(pt, ("kept", "quality")):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise ValueError(f"points[{i}] {what} must be a number in [0, 1], got {value!r}")
            kept.append(float(pt[0]))
            quality.append(float(pt[1]))
        if any(b <= a for a, b in zip(kept, kept[1:])):
            raise ValueError(f"points must have strictly increasing kept fractions, got {kept}")
        if any(b < a for a, b in zip(quality, quality[1:])):
            raise ValueError(f"points must have non-decreasing quality (the table must be monotone), got {quality}")
        if kept[-1] != 1.0 or quality[-1] != 1.0:
            raise ValueError(f"points must end at (1, 1): all input kept is full quality, got {points[-1]!r}")
        self.points = tuple(zip(kept, quality))
        self._kept, self._quality = np.array(kept), np.array(quality)

    @classmethod
    def linear(cls) -> QualityTable:
        """Quality = fraction kept (the paper's Q1)."""
        return cls([(0.0, 0.0), (1.0, 1.0)])

    def quality(self, kept: float) -> float:
        """The quality when the fraction ``kept`` of the input is used (below the first point: its quality)."""
        if isinstance(kept, bool) or not isinstance(kept, (int, float)) or not 0 <= kept <= 1:
            raise ValueError(f"kept must be a fraction in [0, 1], got {kept!r}")
        return float(np.interp(kept, self._kept, self._quality))

    def kept_for(self, quality: float) -> float:
        """The smallest fraction of input that gives at least ``quality`` (the drop ratio is 1 minus it)."""
        if isinstance(quality, bool) or not isinstance(quality, (int, float)) or not 0 <= quality <= 1:
            raise ValueError(f"quality must be in [0, 1], got {quality!r}")
        q, k = self._quality, self._kept
        i = int(np.searchsorted(q, quality, side="left"))
        if i == 0:
            return float(k[0])
        if q[i] == q[i - 1]:  # pragma: no cover - searchsorted left never lands inside a flat run
            return float(k[i])
        return float(k[i - 1] + (quality - q[i - 1]) / (q[i] - q[i - 1]) * (k[i] - k[i - 1]))

    def __repr__(self) -> str:
        return f"QualityTable({list(self.points)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, QualityTable) and self.points == other.points

    __hash__ = None


class JoinQualityTable:
    """The input/quality table of a two-input join query (Wei et al., §4.3 Figure 6, §4.4): quality levels,
    each with the fraction of each input kept.

    §4.4: "for query plans involving joins ... the dropping ratios between two inputs conform to the ratios
    specified in the input/quality table"; the policy chooses one of these levels (:meth:`best_level`),
    so the two drop ratios always come from one row of the table.

    Parameters
    ----------
    levels : sequence of (quality, kept_left, kept_right)
        Qualities strictly increasing in [0, 1]; the fractions kept of the left and the right input in
        (0, 1], non-decreasing with the quality (more quality never keeps less input); the last level
        must be (1, 1, 1).

    Examples
    --------
    A join whose right input (a reference stream) tolerates dropping less than its left one:

    >>> from pyspark_cq_plugins.rtstream import JoinQualityTable
    >>> table = JoinQualityTable([(0.5, 0.25, 0.75), (0.8, 0.5, 0.9), (1, 1, 1)])
    >>> table.quality(0.5, 0.9), table.quality(0.5, 0.75)
    (0.8, 0.5)
    """

    def __init__(self, levels: Sequence):
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or len(levels) < 2:
            raise TypeError(f"levels must be a sequence of at least two (quality, kept_left, kept_right) "
                            f"triples, got {levels!r}")
        rows = []
        for i, lv in enumerate(levels):
            if isinstance(lv, (str, bytes)) or not isinstance(lv, Sequence) or len(lv) != 3:
                raise TypeError(f"levels[{i}] must be a (quality, kept_left, kept_right) triple, got {lv!r}")
            for value, what in zip(lv, ("quality", "kept_left", "kept_right")):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
                if not ok or (what != "quality" and value == 0):
                    form = "[0, 1]" if what == "quality" else "(0, 1] (a drop ratio stays < 1)"
                    raise ValueError(f"levels[{i}] {what} must be a number in {form}, got {value!r}")
            rows.append(tuple(float(v) for v in lv))
        for i in range(1, len(rows)):
            if rows[i][0] <= rows[i - 1][0]:
                raise ValueError(f"levels must have strictly increasing qualities, got {[r[0] for r in rows]}")
            for j, what in ((1, "kept_left"), (2, "kept_right")):
                if rows[i][j] < rows[i - 1][j]:
                    raise ValueError(f"levels must have {what} non-decreasing with the quality (the table must be "
                                     f"monotone), got {[r[j] for r in rows]}")
        if rows[-1] != (1.0, 1.0, 1.0):
            raise ValueError(f"levels must end at (1, 1, 1): all input kept is full quality, got {levels[-1]!r}")
        self.levels = tuple(rows)

    def branch_quality(self, side: int, kept: float) -> float:
        """The quality one input's kept fraction allows: the highest along the table (linear between its
        levels, below the first level its quality) whose fraction kept of input ``side`` (0 left, 1 right)
        is at most ``kept``.
        """
        if side not in (0, 1):
            raise ValueError(f"side must be 0 (left) or 1 (right), got {side!r}")
        if isinstance(kept, bool) or not isinstance(kept, (int, float)) or not 0 <= kept <= 1:
            raise ValueError(f"kept must be a fraction in [0, 1], got {kept!r}")
        best = self.levels[0][0]
        for (q0, *k0), (q1, *k1) in zip(self.levels, self.levels[1:]):
            a, b = k0[side], k1[side]
            if kept >= b:
                best = q1
            elif kept >= a:   # a <= kept < b: inside this segment
                best = max(best, q0 + (kept - a) / (b - a) * (q1 - q0))
        return float(best)

    def quality(self, kept_left: float, kept_right: float) -> float:
        """The quality delivered with these fractions kept (§5.2.2): that of the branch whose drop is higher
        compared with the table, i.e. the smaller of the two :meth:`branch_quality`.
        """
        return min(self.branch_quality(0, kept_left), self.branch_quality(1, kept_right))

    def best_level(self, time_at, remaining: float) -> tuple[float, float, float]:
        """The highest level ``(quality, kept_left, kept_right)`` whose predicted time
        ``time_at(kept_left, kept_right)`` is at most ``remaining`` (§4.4); the lowest level when none is.
        """
        if not callable(time_at):
            raise TypeError(f"time_at must be callable(kept_left, kept_right) -> predicted time, got {time_at!r}")
        for level in reversed(self.levels):
            if time_at(level[1], level[2]) <= remaining:
                return level
        return self.levels[0]

    def __repr__(self) -> str:
        return f"JoinQualityTable({list(self.levels)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, JoinQualityTable) and self.levels == other.levels

    __hash__ = None


def join_sides(plan: P.Node) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The source names under the left and the right input of the plan's top-most join (§4.3, Figure 5):
    the streams a :class:`JoinQualityTable`'s ``kept_left`` / ``kept_right`` apply to.
    """
    for node in P.breadth_first(plan):
        if isinstance(node, P.Join):
            return P.source_names(node.left), P.source_names(node.right)
    raise ValueError(f"plan must contain a join for a JoinQualityTable, got {P.render(plan)}")


def join_time(plan: P.Node, counts: Mapping[str, float], kept_left: float, kept_right: float) -> float:
    """:func:`pyspark_cq.cost.rtstream.plan_execution_time` with the join's left streams at
    ``kept_left·n`` and its right streams at ``kept_right·n`` input tuples (Figure 5 with ε_L, ε_R).
    """
    left, right = join_sides(plan)
    scale = {**{n: kept_left for n in left}, **{n: kept_right for n in right}}
    return rtstream.plan_execution_time(plan, {n: c * scale.get(n, 1.0) for n, c in counts.items()})


def _written_sides(query: QueryInfo, op: str) -> tuple[float, float]:
    """The (left, right) drop ratios the control table holds for the join ``op`` of ``query`` (0 if none)."""
    return side_drop_ratios(query.control.get(op, {}), (0.0, 0.0))


def join_drop_decision(query: QueryInfo, op: str, kept: tuple[float, float], reason: str,
                       policy: str) -> Decision | None:
    """A decision setting the join ``op``'s per-input drop ratios ``params["drop_left"]`` /
    ``params["drop_right"]`` to ``1 − kept`` (as :func:`~pyspark_cq.policies.drop_decision`: 3 decimals,
    at most 0.999), None if the control table holds both already (within 0.005).
    """
    drops = [drop_for(k) for k in kept]
    if all(abs(d - c) < DROP_TOLERANCE for d, c in zip(drops, _written_sides(query, op))):
        return None
    return Decision(op, {"params": dict(zip(SIDE_DROP_PARAMS, drops))}, reason, query=query.name)


@dataclass(frozen=True)
class Negotiation:
    """The result of :func:`negotiate`: the common quality, every query's kept fraction, its time at that
    fraction and its pseudo-deadline; ``feasible`` False when even the lowest quality does not fit.
    """

    quality: float
    kept: Mapping[str, float]
    times: Mapping[str, float]
    pseudo_deadlines: Mapping[str, float]
    feasible: bool


def negotiate(estimates: Mapping[str, float], tables: Mapping[str, QualityTable], available: float, *,
              fixed: Mapping[str, float] | None = None, step: float = 0.01) -> Negotiation:
    """Inter-query QoS negotiation (Wei et al., §4.3, Figure 7).

    Starting from 100 %, the common quality is lowered by ``step`` until the instances of all queries fit
    into ``available`` time: query i keeps the fraction ``k_i = tables[i].kept_for(quality)`` of its input and
    takes ``fixed_i + k_i·(estimates_i − fixed_i)`` (its per-row work scales with the input, a fixed cost does
    not). Pseudo-deadlines are ``available`` shared in proportion to those times.

    Parameters
    ----------
    estimates : mapping str -> float
        Every query's estimated time with all of its input (equation (1)), >= 0.
    tables : mapping str -> QualityTable
        Every query's input/quality table.
    available : float
        The time available to all of them (> 0); for periodic queries, the utilisation bound with
        estimates divided by the periods.
    fixed : mapping str -> float, optional
        The part of each estimate that dropping input does not reduce (default 0).
    step : float
        Quality step in (0, 1].

    Examples
    --------
    Three queries of 10 s each with Figure 6's tables in 19.2 s settle at 70 % quality, dropping 75 %, 30 %
    and 3 %:

    >>> from pyspark_cq_plugins.rtstream import QualityTable, negotiate
    >>> tables = {"q0": QualityTable([(0, 0), (0.25, 0.7), (1, 1)]), "q1": QualityTable.linear(),
    ...           "q2": QualityTable([(0, 0), (0.97, 0.7), (1, 1)])}
    >>> result = negotiate({"q0": 10.0, "q1": 10.0, "q2": 10.0}, tables, 19.2)
    >>> result.quality, {q: round(1 - k, 2) for q, k in result.kept.items()}
    (0.7, {'q0': 0.75, 'q1': 0.3, 'q2': 0.03})
    """
    if not isinstance(estimates, Mapping) or not estimates:
        raise TypeError(f"estimates must be a non-empty mapping query -> estimated time, got {estimates!r}")
    if not isinstance(tables, Mapping):
        raise TypeError(f"tables must be a mapping query -> QualityTable, got {tables!r}")
    fixed = dict(fixed or {})
    est = {}
    for q, t in estimates.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"estimates[{q!r}] must be a finite time >= 0, got {t!r}")
        if not isinstance(tables.get(q), QualityTable):
            raise ValueError(f"tables has no QualityTable for query {q!r}; given: {sorted(tables)}")
        f = fixed.get(q, 0.0)
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= t:
            raise ValueError(f"fixed[{q!r}] must be in [0, estimates[{q!r}]], got {f!r}")
        est[q] = (float(t), float(f))
    if isinstance(available, bool) or not isinstance(available, (int, float)) or not available > 0:
        raise ValueError(f"available must be a positive time, got {available!r}")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
        raise ValueError(f"step must be in (0, 1], got {step!r}")
    levels = int(math.floor(1 / step + 1e-9))
    for k in range(levels + 1):
        quality = max(round(1.0 - k * step, 12), 0.0)
        kept = {q: tables[q].kept_for(quality) for q in est}
        times = {q: f + kept[q] * (t - f) for q, (t, f) in est.items()}
        total = sum(times.values())
        if total <= available * (1 + 1e-12) or k == levels:
            share = {q: available * times[q] / total if total > 0 else available / len(times) for q in times}
            return Negotiation(quality, kept, times, share, total <= available * (1 + 1e-12))
    raise AssertionError("unreachable")  # pragma: no cover


# -- profiling -------------------------------------------------------------------------------------


class _Regression:
    """Exponentially weighted least squares of y on x: the fixed cost (intercept) and cost per row (slope)."""

    def __init__(self, alpha: float):
        self._m = [ExponentialSmoothing(alpha) for _ in range(4)]   # x, y, x², x·y

    def update(self, x: float, y: float) -> None:
        for est, v in zip(self._m, (x, y, x * x, x * y)):
            est.update(v)

    @property
    def n(self) -> int:
        return self._m[0].n

    def fit(self) -> tuple[float, float]:
        """(intercept, slope) with both >= 0; the slope is 0 while the x seen do not vary (a level)."""
        mx, my, mxx, mxy = (e.value for e in self._m)
        var = mxx - mx * mx
        slope = (mxy - mx * my) / var if var > 1e-9 * max(mxx, 1.0) else 0.0
        # a cost per row is never negative and a fixed cost neither: a fit outside [0, my/mx] (rows that
        # barely vary under noisy times give any slope) is noise; clamped, the line still passes (mx, my)
        slope = min(max(slope, 0.0), my / mx if mx > 0 and my > 0 else 0.0)
        return max(my - slope * mx, 0.0), slope


@dataclass
class Profile:
    """What the policy learned about one periodic query (§4.1): per operator step t_j (s per row) and s_j,
    and the rest of an instance's time as ``fixed + per_row·n`` over the rows n it processed.
    """

    alpha: float
    steps: dict = field(default_factory=dict)        # step -> (t_j smoothing, s_j smoothing)
    order: tuple = ()
    rest: _Regression = None
    last_batch: int = -1
    last_report_batch: int = -1
    warmed: bool = False

    def __post_init__(self):
        self.rest = _Regression(self.alpha)

    def chain(self) -> tuple[list[float], list[float]]:
        """The smoothed (t_j, s_j) of the timed steps, in evaluation order."""
        t = [self.steps[s][0].value for s in self.order if s in self.steps]
        sel = [min(max(self.steps[s][1].value, 0.0), 1.0) for s in self.order if s in self.steps]
        return t, sel

    def observe_steps(self, report: Mapping, prefix: str = "") -> None:
        """Fold one ``select_chain`` report (``rows_in_<p>``, ``rows_passed_<p>``, ``nanos_<p>``; with
        ``prefix="sample_"`` its sampler plan's) into t_j, s_j.
        """
        order = []
        sample = bool(prefix)
        for step in M.predicates(report, sample):
            rows = report[M.rows_in(step, sample)]
            if not rows:
                continue
            nanos, passed = report.get(M.nanos(step, sample)), report.get(M.rows_passed(step, sample))
            if nanos is None or passed is None:
                continue
            t, s = self.steps.setdefault(step, (ExponentialSmoothing(self.alpha), ExponentialSmoothing(self.alpha)))
            t.update(nanos / 1e9 / rows)
            s.update(passed / rows)
            order.append((rows, step))
        if order:  # evaluation order: each step sees no more rows than the one before
            self.order = tuple(step for _, step in sorted(order, key=lambda r: -r[0]))

    def operators_time(self, n: float) -> float:
        """Equation (1) over the timed steps for n rows at the chain's input."""
        t, s = self.chain()
        return rtstream.chain_time(n, t, s) if t else 0.0

    def sampler_time(self, n: float, sample_ratio) -> float:
        """Equation (1) for the sampler plan over n input rows: step j sees its sample ratio r_j of what
        reaches it (``sample_ratio`` as in ``params``; :func:`~pyspark_cq.control.plans.sample_ratios`).
        """
        ratios = sample_ratios({"sample_ratio": sample_ratio}, self.order, where="sampler") if self.order else None
        if ratios is None:
            return 0.0
        t, s = self.chain()
        return rtstream.chain_time(n, [tj * r for tj, r in zip(t, ratios)], s)

    def observe_instance(self, rows: float, duration: float, sampler: float = 0.0) -> None:
        """One measured instance: ``rows`` processed (after shedding) in ``duration`` seconds, of which
        ``sampler`` seconds ran the sampler plan.
        """
        self.rest.update(rows, duration - sampler - self.operators_time(rows))

    def predict(self, n: float, sampler: float = 0.0) -> tuple[float, float]:
        """(predicted time, the part of it shedding cannot reduce) for an instance over n rows, given the
        time of its sampler plan (which runs on all of the input).
        """
        fixed, per_row = self.rest.fit()
        fixed = max(fixed, 0.0) + sampler
        total = fixed + self.operators_time(n) + per_row * n
        return max(total, fixed), fixed


@dataclass(frozen=True)
class Prediction:
    """One prediction: made after ``after_batch``, for an instance over ``rows`` rows, the profile's all-input
    time ``time_full`` (of which ``fixed`` per instance), the kept fraction chosen and the time planned with it
    (``scale``·(fixed + kept·(time_full − fixed)); for a join query with a :class:`JoinQualityTable`, ``kept``
    is the level's share of the per-row time and ``kept_sides`` its fractions kept of each input). ``scale``
    is the error scale the decision used (:meth:`RTStreamQoS.error_scale`); ``time_full`` and ``fixed`` are
    the profile's own, unscaled, so that the error measured against them is the profile's.
    """

    query: str
    after_batch: int
    rows: float
    time_full: float
    fixed: float
    kept: float
    time: float
    kept_sides: tuple[float, float] | None = None   #: a join query's (kept_left, kept_right); kept: its time share
    scale: float = 1.0


#: The largest error scale (:meth:`RTStreamQoS.error_scale`): a profile off by more than twice is better
#: relearned (the profile's own smoothing does that) than answered by keeping half of what it predicts.
MAX_ERROR_SCALE = 2.0

#: An instance's measured kept fraction within this of a prediction's ran with that prediction's ε
#: (:func:`matched_predictions`): the written drop ratio has 3 decimals, is not rewritten within
#: :data:`~pyspark_cq.policies.DROP_TOLERANCE`, and the hash sample keeps its fraction only on average.
KEPT_MATCH = 0.02


def _time_at(time_full: float, fixed: float, share: float) -> float:
    """An instance's time when it keeps ``share`` of the per-row part of ``time_full`` (fixed stays)."""
    return fixed + share * (time_full - fixed)


def predicted_for(pred: Prediction, inst) -> float:
    """The prediction's time rescaled to what instance ``inst`` really ran: its input rows, and its measured
    kept fraction (a join query: the level's time share, as an instance reports its rows kept over both
    inputs only); the profile's time, without the error scale. NaN when the prediction was for no rows.
    """
    if pred.rows <= 0:
        return math.nan
    kept = inst.kept if pred.kept_sides is None else pred.kept
    return _time_at(pred.time_full, pred.fixed, kept * inst.input_rows / pred.rows)


def _applied(pred: Prediction) -> float:
    """The fraction of the input rows the prediction's decision keeps (a join: its inputs taken as equal)."""
    return pred.kept if pred.kept_sides is None else sum(pred.kept_sides) / 2


def matched_predictions(predictions: Sequence[Prediction], query: str, instances: Sequence) -> list:
    """The prediction behind each of the query's ``instances``, as ``(prediction, instance)`` pairs.

    The decision made after instance k reaches instance k + 1 when Spark triggers k + 1 at its release, but
    only k + 2 when k overran its period (k + 1 was triggered at once when k ended, before the decision was
    written). So an instance is matched with the latest prediction made before it, unless its kept fraction
    differs from that prediction's by more than :data:`KEPT_MATCH` and agrees with the one before (then that
    one was in force). When neither agrees (noise in a small instance's hash sample, a join's unequal
    inputs) the latest is taken: :func:`predicted_for` rescales it to the instance anyway. Instances without
    rows or duration and instances before the first prediction are left out.
    """
    mine = [p for p in predictions if p.query == query]
    keys = [p.after_batch for p in mine]     # non-decreasing: a prediction is made after the latest instance
    pairs = []
    for inst in instances:
        i = bisect.bisect_left(keys, inst.batch)
        if inst.input_rows <= 0 or inst.duration <= 0 or i == 0:
            continue
        latest = mine[i - 1]
        j = bisect.bisect_left(keys, latest.after_batch)
        before = mine[j - 1] if j > 0 else None
        if (abs(_applied(latest) - inst.kept) > KEPT_MATCH and before is not None
                and abs(_applied(before) - inst.kept) <= KEPT_MATCH):
            latest = before
        pairs.append((latest, inst))
    return pairs


def _start_delay(last, period: float) -> float:
    """How late the instance after ``last`` starts: Spark triggers it at the first multiple of P after
    ``last``'s start, or at once when ``last`` ends later (its release stays that multiple). For the first
    instance, which Spark starts at once and not at a multiple of P, that multiple is not ``release + P``.
    """
    return max(last.end - (math.floor(last.start / period + 1e-9) + 1) * period, 0.0)


class RTStreamQoS(Policy):
    """Prediction-based QoS management of periodic queries (Wei et al., §4); see the module docstring.

    Parameters
    ----------
    alpha : float
        Smoothing constant of the profiles (§4.1.3), in (0, 1).
    target : float
        Share of the deadline D the prediction aims at, in (0, 1] (headroom for prediction error).
    min_kept : float
        The smallest fraction of input a query may keep (admission rejects a query that would need less).
    capacity : float, optional
        Inter-query negotiation (§4.3): the bound on Σ T_i / P_i over the periodic queries (e.g. the
        number of cores they share); None negotiates nothing.
    quality : mapping query -> QualityTable or JoinQualityTable, optional
        Input/quality tables; a query without one is linear. A :class:`JoinQualityTable` makes the query's
        shedding stage a two-input join shed per input (§4.4; docs/rtstream.md, *Joins*); such a query
        takes no part in the negotiation and ``min_kept`` does not bound its levels.
    step : float
        Quality step of the negotiation.
    raise_step : float or None
        The most ε may rise, in (0, 1], above the ε last written for the query (what its control table holds:
        the last decision, or the admission's a-priori one); ε falls at once. For a join query, no level
        whose time share rises by more than ``raise_step`` above the written one's, except the next level
        above it (a table's levels may lie further apart than the step). None: no limit (the paper's §4.4).
    adaptive : bool
        Scale every prediction by the error scale measured on the query's past instances
        (:meth:`error_scale`); False uses the profile's prediction as it is (the paper's §4.1, §4.4).

    Notes
    -----
    ``raise_step`` and ``adaptive`` are this package's extension, not the paper's: its §4.1.3 smooths the
    profile exponentially and §4.4 sheds to ε = D/T at once, both ways. Measured on Spark
    (docs/rtstream.md, *Headroom*), at 100–150 % load the policy raised ε from ~0.8 to 1 in one step after
    the first instances, its prediction at the larger input ran short, and the instance missed. The step
    limits a rise to what the profile has seen nearly; the error scale turns how far the past predictions ran
    short into headroom: the exponentially smoothed (constant ``alpha``) max(measured / predicted, 1) over
    the instances (:func:`matched_predictions`, :func:`predicted_for`), bounded to [1,
    :data:`MAX_ERROR_SCALE`], multiplies the fixed and the per-row prediction, so that the effective target
    is ``target / scale``.
    """

    name = "rtstream"

    def __init__(self, alpha: float = 0.5, target: float = 0.8, min_kept: float = 0.05,
                 capacity: float | None = None, quality: Mapping | None = None, step: float = 0.01,
                 raise_step: float | None = 0.2, adaptive: bool = True):
        for value, what, lo in ((alpha, "alpha", 0.0), (target, "target", 0.0), (min_kept, "min_kept", 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value <= 1:
                raise ValueError(f"{what} must be in (0, 1], got {value!r}")
        if alpha >= 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, float))
                                     or not capacity > 0):
            raise ValueError(f"capacity must be a positive utilisation bound or None, got {capacity!r}")
        quality = dict(quality or {})
        for q, table in quality.items():
            if not isinstance(table, (QualityTable, JoinQualityTable)):
                raise TypeError(f"quality[{q!r}] must be a QualityTable or (a join query's) JoinQualityTable, "
                                f"got {type(table).__name__}")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
            raise ValueError(f"step must be in (0, 1], got {step!r}")
        if raise_step is not None and (isinstance(raise_step, bool) or not isinstance(raise_step, (int, float))
                                       or not 0 < raise_step <= 1):
            raise ValueError(f"raise_step must be in (0, 1] or None, got {raise_step!r}")
        if not isinstance(adaptive, bool):
            raise TypeError(f"adaptive must be True or False, got {adaptive!r}")
        self.raise_step, self.adaptive = raise_step, adaptive
        self.alpha, self.target, self.min_kept, self.capacity = alpha, target, min_kept, capacity
        self.quality, self.step = quality, step
        self._profiles: dict[str, Profile] = {}
        self._a_priori: dict[str, tuple[float, str]] = {}    # query -> (kept, reason) from admission
        self.predictions: list[Prediction] = []
        self._overrun: dict[str, tuple[ExponentialSmoothing, int]] = {}   # query -> (max(ratio, 1), last batch)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"capacity": 1.0, "alpha": 0.3}, {"raise_step": None, "adaptive": False}]

    def sampler(self, query: QueryInfo, profile: Profile):
        """The ``sample_ratio`` of the query's sampler plan (§4.2): None runs none and profiles from the
        instances' own reports; the sampling policies override it.
        """
        return None

    @staticmethod
    def _sample_ratio(query: QueryInfo):
        return (query.control.get(shedding_operator(query), {}).get("params") or {}).get("sample_ratio")

    def profile(self, query: str) -> Profile | None:
        """The profile learned for ``query`` (None before its first instance)."""
        return self._profiles.get(query)

    def error_scale(self, query: str) -> float:
        """How much longer than predicted the query's instances ran: the smoothed max(measured / predicted,
        1) bounded to [1, :data:`MAX_ERROR_SCALE`]; 1 before any instance was matched with a prediction.
        """
        smoothed = self._measured_overrun(query)
        return 1.0 if smoothed is None else min(max(smoothed.value, 1.0), MAX_ERROR_SCALE)

    def _measured_overrun(self, query: str) -> ExponentialSmoothing | None:
        """The query's smoothed max(measured / predicted, 1), None before any instance was matched."""
        smoothed = self._overrun.get(query, (None, -1))[0]
        return None if smoothed is None or smoothed.n == 0 else smoothed

    def _observe_errors(self, q: QueryInfo) -> float:
        """Fold the query's instances not seen yet into its error scale (each against the prediction behind
        it, rescaled to what it ran) and return the scale (1 when not ``adaptive``).
        """
        if not self.adaptive:
            return 1.0
        smoothed, seen = self._overrun.setdefault(q.name, (ExponentialSmoothing(self.alpha), -1))
        new = [i for i in q.instances if i.batch > seen]
        for pred, inst in matched_predictions(self.predictions, q.name, new):
            predicted = predicted_for(pred, inst)
            if predicted > 0:
                smoothed.update(max(inst.duration / predicted, 1.0))
        if new:
            self._overrun[q.name] = (smoothed, new[-1].batch)
        return self.error_scale(q.name)

    def _rise_limit(self, query: str) -> float | None:
        """How far ε may rise above the written one this round: ``raise_step``, or 0 while ``adaptive`` and no
        instance has measured the error of the query's predictions yet (its first own prediction: the error
        scale is 1 for want of data, not because the profile is right); None without a step cap.
        """
        if self.raise_step is None:
            return None
        return 0.0 if self.adaptive and self._measured_overrun(query) is None else self.raise_step

    def _record(self, pred: Prediction) -> None:
        """Append ``pred`` to :attr:`predictions`, keeping the query's latest
        :data:`~pyspark_cq.policies.INSTANCES_KEPT` (those behind the instances the runtime holds).
        """
        self.predictions.append(pred)
        mine = [i for i, p in enumerate(self.predictions) if p.query == pred.query]
        if len(mine) > INSTANCES_KEPT:
            del self.predictions[mine[0]]

    def _scale_note(self, scale: float) -> str:
        """The error scale as the reasons show it (nothing when not ``adaptive``)."""
        return f", × {scale:.2f} error scale" if self.adaptive else ""

    def _learn(self, q: QueryInfo) -> Profile:
        prof = self._profiles.setdefault(q.name, Profile(self.alpha))
        op = shedding_operator(q)
        stats = q.operators.get(op) if op is not None else None
        last = q.instances[-1].batch if q.instances else -1
        sampling = self._sample_ratio(q) if self.sampler(q, prof) is not None else None
        if stats is not None and stats.report and last > prof.last_report_batch:
            # the latest report: the latest instance's (its sampler plan's, when the policy samples)
            prof.observe_steps(stats.report, SAMPLE if sampling is not None else "")
            prof.last_report_batch = last
        for inst in q.instances:
            if inst.batch > prof.last_batch and inst.input_rows > 0:
                if prof.warmed:
                    prof.observe_instance(inst.input_rows * inst.kept, inst.duration,
                                          prof.sampler_time(inst.input_rows, sampling) if sampling else 0.0)
                # the query's first instance with data also starts its Python workers and loads the
                # kernels, a one-time cost (seconds) that is not the steady state §4.1 profiles
                prof.warmed = True
        if q.instances:
            prof.last_batch = max(prof.last_batch, last)
        return prof

    def _predict(self, q: QueryInfo, prof: Profile) -> tuple[float, float, float] | None:
        """(rows, all-input time, fixed time) of the next instance, or None without a measured instance."""
        if not q.instances or prof.rest.n == 0:
            return None
        last = q.instances[-1]
        rows = float(last.input_rows) + (last.backlog_rows or 0.0)
        sampling = self.sampler(q, prof)
        time_full, fixed = prof.predict(rows, prof.sampler_time(rows, sampling) if sampling is not None else 0.0)
        return rows, time_full, fixed

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Learn from the new instances, predict every periodic query's next one, shed ε = D/T (§4.4),
        capped by the negotiation (§4.3) when ``capacity`` is set.
        """
        self._check(snapshot)
        plans, joins, changes = {}, {}, {}    # changes: query -> (params, reasons) of its shedding stage

        def merge(name: str, d: Decision | None) -> None:   # a drop decision into the stage's changes
            if d is not None:
                params, reasons = changes.setdefault(name, ({}, []))
                params.update(d.changes)
                reasons.insert(0, d.reason)
        for q in snapshot.queries.values():
            if q.period is None or shedding_operator(q) is None:
                continue
            prof = self._learn(q)
            scale = self._observe_errors(q)
            want = self.sampler(q, prof)
            if want is not None and want != self._sample_ratio(q):
                changes[q.name] = ({"params": {"sample_ratio": want}}, [f"sampler plan: sample_ratio {want}"])
            pred = self._predict(q, prof)
            if pred is None:
                if q.name in self._a_priori:   # nothing measured yet: the admission's prediction (§4.4)
                    kept, why = self._a_priori[q.name]
                    merge(q.name, join_drop_decision(q, shedding_operator(q), kept, why, self.name)
                          if isinstance(kept, tuple) else drop_decision(q, shedding_operator(q), kept, why, self.name))
                continue
            rows, time_full, fixed = pred
            # the next instance starts late by what the last one overran its period (its release stays):
            # that part of D is gone before it starts
            last = q.instances[-1]
            budget = self.target * q.deadline - _start_delay(last, q.period)
            if isinstance(self.quality.get(q.name), JoinQualityTable):
                joins[q.name] = (q, rows, time_full, fixed, budget, scale)
                continue
            # §4.4: ε = D/T on the part of T that dropping input reduces (both parts scaled by the error)
            kept = (rtstream.kept_fraction(scale * (time_full - fixed), budget - scale * fixed)
                    if budget > scale * fixed else 0.0)
            plans[q.name] = (q, rows, time_full, fixed, max(kept, self.min_kept), scale)
        negotiated = {}     # join query -> the time share the negotiation leaves it
        if self.capacity is not None and len(plans) + len(joins) > 1:
            est = {n: p[5] * p[2] / p[0].period for n, p in plans.items()}
            fix = {n: p[5] * p[3] / p[0].period for n, p in plans.items()}
            tables = {n: self.quality.get(n, QualityTable.linear()) for n in plans}
            sheds = set()
            for n, (q, rows, time_full, fixed, _, scale) in joins.items():
                # a join takes part through its quality against the time share its levels keep
                table = self._share_table(q, rows)
                est[n], fix[n] = scale * time_full / q.period, scale * (fixed if table else time_full) / q.period
                tables[n] = table or QualityTable.linear()
                if table is not None:
                    sheds.add(n)
            deal = negotiate(est, tables, self.capacity, fixed=fix, step=self.step)
            for n, p in plans.items():
                plans[n] = p[:4] + (max(min(p[4], deal.kept[n]), self.min_kept), p[5])
            negotiated = {n: deal.kept[n] for n in sheds}
        for n, j in joins.items():
            merge(n, self._join_step(*j, negotiated=negotiated.get(n)))
        for n, (q, rows, time_full, fixed, want, scale) in plans.items():
            op = shedding_operator(q)
            kept, capped, rise = want, "", self._rise_limit(n)
            if rise is not None:
                last = 1.0 - written_drop_ratio(q, op)
                if want > last + rise:
                    kept = max(last + rise, self.min_kept)
                    capped = (f" (ε = {want:.3f} before the step cap: at most {rise:g} above {last:.3f}"
                              f"{'' if rise else ', no rise before an instance measured the error'})")
            predicted = scale * _time_at(time_full, fixed, kept)
            self._record(Prediction(n, q.instances[-1].batch, rows, time_full, fixed, kept, predicted, scale=scale))
            late = _start_delay(q.instances[-1], q.period)
            reason = (f"predicted {time_full:.3g} s for {rows:.0f} rows (fixed {fixed:.3g} s){self._scale_note(scale)} "
                      f"against {self.target:g}·D = {self.target * q.deadline:.3g} s less {late:.3g} s start "
                      f"delay: keep ε = {kept:.3f}{capped}")
            merge(n, drop_decision(q, op, kept, reason, self.name))
        # one decision per shedding stage: its drop ratio and its sampler plan
        return Decisions([Decision(shedding_operator(snapshot.queries[n]), params, "; ".join(reasons), query=n)
                          for n, (params, reasons) in changes.items()], self.name)

    def admit(self, query: QueryInfo, snapshot: Snapshot) -> Admission:
        """Reject a periodic query whose plan cannot meet its deadline even keeping ``min_kept`` of its
        input; admit with the a-priori drop ratio (§4.4 before the query starts) otherwise.
        """
        super().admit(query, snapshot)
        if query.period is None or query.plan is None:
            return Admission(True, "not a periodic query with a plan: nothing to predict", Decisions((), self.name))
        rates = {name: s.input_rate for name, s in query.sources.items()}
        names = set(P.source_names(query.plan))
        if not names <= set(rates) or not all(math.isfinite(rates[n]) and rates[n] > 0 for n in names):
            return Admission(True, "source rates unknown: admitted without a prediction", Decisions((), self.name))
        counts = {n: rates[n] * query.period for n in names}
        full = rtstream.plan_execution_time(query.plan, counts)
        if isinstance(self.quality.get(query.name), JoinQualityTable):
            return self._admit_join(query, counts, full)
        kept = rtstream.plan_kept_fraction(query.plan, counts, self.target * query.deadline)
        if kept < self.min_kept:
            at_min = rtstream.plan_execution_time(query.plan, {n: c * self.min_kept for n, c in counts.items()})
            return Admission(False, f"cannot meet its deadline: keeping the smallest allowed fraction "
                                    f"ε = {self.min_kept:g} of its input the predicted time is {at_min:.3g} s > "
                                    f"{self.target:g}·D = {self.target * query.deadline:.3g} s "
                                    f"(all input: {full:.3g} s)", Decisions((), self.name))
        op = shedding_operator(query)
        why = f"a priori: predicted {full:.3g} s per instance from the plan"
        # the shedding stage is usually made by the builder, after admission: the first rounds apply it
        self._a_priori[query.name] = (kept, why)
        d = drop_decision(query, op, kept, why, self.name) if op else None
        return Admission(True, f"predicted {full:.3g} s per instance, keeps ε = {kept:.3f}",
                         Decisions([d] if d else [], self.name))

    # -- joins: per-input drop ratios from a JoinQualityTable (§4.4, §5.2.2)

    def _share_table(self, q: QueryInfo, rows: float) -> QualityTable | None:
        """A join query's :class:`JoinQualityTable` as the Figure 7 negotiation reads tables: its quality as a
        function of the time share (:meth:`_join_share`) its levels keep, linear between them; below the
        lowest level, that level's share. None when every level keeps the whole time share (nothing to shed).
        """
        share = self._join_share(q, rows)
        points: dict[float, float] = {}
        for quality, kl, kr in self.quality[q.name].levels:
            at = min(round(share(kl, kr), 9), 1.0)
            points[at] = max(points.get(at, 0.0), quality)
        if len(points) < 2:
            return None
        return QualityTable(sorted(points.items()))

    def _join_share(self, q: QueryInfo, rows: float):
        """``share(kept_left, kept_right)``: the fraction of the per-row time left when the join keeps these
        fractions of its inputs: :func:`join_time` over the plan's :func:`join_time` with all input (counts
        from the sources' rates, else ``rows`` shared evenly); without a plan with a join, time is taken as
        linear in the rows kept, the inputs equally large.
        """
        plan = q.plan
        if plan is None or not any(isinstance(n, P.Join) for n in P.postorder(plan)):
            return lambda kl, kr: (kl + kr) / 2
        names = P.source_names(plan)
        rates = {n: q.sources[n].input_rate if n in q.sources else math.nan for n in names}
        if all(math.isfinite(r) and r > 0 for r in rates.values()):
            counts = {n: rates[n] * q.period for n in names}
        else:
            counts = {n: rows / len(names) for n in names}
        full = join_time(plan, counts, 1.0, 1.0)
        return (lambda kl, kr: join_time(plan, counts, kl, kr) / full) if full > 0 else (lambda kl, kr: 1.0)

    def _join_step(self, q: QueryInfo, rows: float, time_full: float, fixed: float, budget: float,
                   scale: float = 1.0, negotiated: float | None = None):
        """§4.4 for a join query: the highest level of its :class:`JoinQualityTable` whose predicted time
        ``scale·(fixed + share·(T − fixed))`` fits ``budget``, among the levels ``raise_step`` allows and
        whose time share is at most ``negotiated`` (the Figure 7 negotiation's, None: no bound); recorded as a
        :class:`Prediction`, returned as a decision (None when the control table holds it already).
        """
        table = self.quality[q.name]
        share = self._join_share(q, rows)
        op = shedding_operator(q)

        def time_at(kl, kr):   # a level above the negotiated share does not fit
            over = negotiated is not None and share(kl, kr) > negotiated + 1e-9
            return math.inf if over else scale * _time_at(time_full, fixed, share(kl, kr))
        level = table.best_level(time_at, budget)
        capped = "" if negotiated is None else f", time share at most {negotiated:.3f} negotiated"
        rise = self._rise_limit(q.name)
        if rise is not None:
            last = share(*(1.0 - d for d in _written_sides(q, op)))
            # a level at most raise_step above the written share, or the next level above it: a table whose
            # levels lie further apart than the step would otherwise never return to full quality
            above = [share(kl, kr) for _, kl, kr in table.levels if share(kl, kr) > last + 1e-9]
            cap = max(last + rise, above[0] if above else 1.0) if rise else last
            allowed = table.best_level(lambda kl, kr: time_at(kl, kr) if share(kl, kr) <= cap + 1e-9 else math.inf,
                                       budget)
            if allowed != level:
                capped = (f" (level {level[0]:g} before the step cap: time share at most {cap:.3f}, "
                          f"{last:.3f} written)")
            level = allowed
        quality, kl, kr = level
        predicted = time_at(kl, kr)
        self._record(Prediction(q.name, q.instances[-1].batch, rows, time_full, fixed, share(kl, kr), predicted,
                                (kl, kr), scale))
        reason = (f"predicted {time_full:.3g} s for {rows:.0f} rows (fixed {fixed:.3g} s){self._scale_note(scale)} "
                  f"against {budget:.3g} s left: quality level {quality:g}, keep ε_L = {kl:g}, ε_R = {kr:g} "
                  f"({predicted:.3g} s){capped}")
        return join_drop_decision(q, op, (kl, kr), reason, self.name)

    def _admit_join(self, query: QueryInfo, counts: Mapping[str, float], full: float) -> Admission:
        """Admission of a join query with a :class:`JoinQualityTable`: its plan at the table's levels."""
        table = self.quality[query.name]
        budget = self.target * query.deadline
        quality, kl, kr = table.best_level(lambda a, b: join_time(query.plan, counts, a, b), budget)
        at_level = join_time(query.plan, counts, kl, kr)
        if at_level > budget:
            return Admission(False, f"cannot meet its deadline: at the lowest level of its JoinQualityTable "
                                    f"(quality {quality:g}, ε_L = {kl:g}, ε_R = {kr:g}) the predicted time is "
                                    f"{at_level:.3g} s > {self.target:g}·D = {budget:.3g} s (all input: "
                                    f"{full:.3g} s)", Decisions((), self.name))
        why = f"a priori: predicted {full:.3g} s per instance from the plan, quality level {quality:g}"
        self._a_priori[query.name] = ((kl, kr), why)
        op = shedding_operator(query)
        d = join_drop_decision(query, op, (kl, kr), why, self.name) if op else None
        return Admission(True, f"predicted {full:.3g} s per instance, quality level {quality:g} keeps "
                               f"ε_L = {kl:g}, ε_R = {kr:g} ({at_level:.3g} s)", Decisions([d] if d else [], self.name))

    def remove(self, query: str) -> Decisions:
        """Forget the query's profile."""
        super().remove(query)
        self._profiles.pop(query, None)
        self._a_priori.pop(query, None)
        self._overrun.pop(query, None)
        return Decisions((), self.name)
