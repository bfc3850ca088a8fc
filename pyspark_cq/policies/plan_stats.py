"""What plan policies read about a running plan-switchable operator: its candidate plans and per-round estimates.

Shared by the plan-choosing policies (OM, Kulkarni & Ravishankar §4.4–4.5; rate-based optimization, Viglas &
Naughton §4). Pure: it reads a :class:`~pyspark_cq.policies.OperatorStats` (whose ``report`` is the
operator's latest per-batch report, :mod:`pyspark_cq.operators._common.metrics`) and never Spark.

- **Which operator.** :func:`operator_kind` tells a ``select_chain`` (its report has ``rows_in_<p>``) from a
  ``multi_join`` (``input_rows_<i>`` / ``probed_<i>_<j>``); :func:`chain_predicates` and :func:`join_inputs`
  give its predicates and number of inputs.
- **Candidate plans** as plan ids the control table accepts (:mod:`pyspark_cq.control.plans`):
  every predicate order of a chain (:func:`chain_plans`), and the left-deep orders of a join
  (:func:`left_deep_plans`), k!/2 of them as OM §5.3 counts them (3 for three streams).
  A left-deep order ``(a, b, c, …)`` joins ``a`` with ``b`` first, then the result with ``c`` …;
  :func:`left_deep_probe_orders` runs it in the MJoin as probe orders: a row arriving on an input probes
  the other inputs in the order's sequence (so ``a`` probes ``b`` first and ``b`` probes ``a`` first, and
  a later input probes the first join's inputs first, as it would probe their join's result).
- **Per-round estimates** from one report: per-predicate / per-probe-step rows in and out, selectivity and
  cost per row (:func:`chain_steps`, :func:`join_steps`, :class:`StepEstimate`), per-input rows of the
  round and arrival rates (:func:`input_rows`, :func:`input_rates`), and a join's pairwise selectivities
  (:func:`join_pair_selectivities`). :class:`RoundEstimates` keeps OM's decay-weighted mean of the last d
  observations of each (§4.3) and adds a report only once per micro-batch.

Examples
--------
>>> from pyspark_cq.policies import OperatorStats
>>> chain = OperatorStats("f", batches=1, input_rows=100, output_rows=10, report={
...     "input_rows": 100, "output_rows": 10, "rows_in_a": 100, "rows_passed_a": 50, "nanos_a": 5000,
...     "rows_in_b": 50, "rows_passed_b": 10, "nanos_b": 50000})
>>> operator_kind(chain), chain_predicates(chain), chain_plans(["a", "b"])
('select_chain', ('a', 'b'), ['a>b', 'b>a'])
>>> steps = chain_steps(chain)
>>> steps["a"].selectivity, steps["b"].cost_per_row
(0.5, 1e-06)
>>> left_deep_plans(3)
['0:1>2;1:0>2;2:0>1', '0:2>1;1:0>2;2:0>1', '0:1>2;1:2>0;2:1>0']
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import _args as chk
from .. import plan as P
from ..control.plans import chain_plan_id, check_predicate_name, join_plan_id, parse_chain_plan, parse_join_plan
from ..estimators import DecayedMean
from ..vocabulary import metrics as M
from .snapshot import OperatorStats

__all__ = [
    "SELECT_CHAIN", "MULTI_JOIN", "operator_kind", "chain_predicates", "join_inputs", "chain_plans",
    "left_deep_orders", "left_deep_probe_orders", "left_deep_plans", "left_deep_order", "candidate_plans",
    "current_plan", "StepEstimate", "chain_steps", "join_steps", "input_rows", "input_arrivals", "input_rates",
    "join_pair_selectivities", "join_bands", "key_only_steps", "RoundEstimates",
]

SELECT_CHAIN = "select_chain"
MULTI_JOIN = "multi_join"
NAN = math.nan



def _stats(stats) -> OperatorStats:
    return chk.instance(stats, "stats", OperatorStats, "an OperatorStats (from a Snapshot's QueryInfo.operators)")


def operator_kind(stats: OperatorStats) -> str | None:
    """``"select_chain"``, ``"multi_join"`` or None (another operator, or no report yet), from the report's keys."""
    report = _stats(stats).report
    if M.predicates(report):
        return SELECT_CHAIN
    if any(M.input_counters(report, M.INPUT_ROWS)) or any(M.step_counters(report, M.PROBED)):
        return MULTI_JOIN
    return None


def chain_predicates(stats: OperatorStats, control: Mapping | None = None) -> tuple[str, ...]:
    """The predicate names of a ``select_chain``, in the order of the current ``plan_id`` of ``control``
    (the operator's control-table entry) when it has one, else sorted.

    Raises
    ------
    ValueError
        When ``stats`` is not a ``select_chain``'s report.
    """
    report = _stats(stats).report
    names = sorted(M.predicates(report))
    if not names:
        raise ValueError(f"stats of operator {stats.operator!r} hold no select_chain report "
                         f"(no rows_in_<predicate> counters); report keys: {sorted(report)[:8]}")
    plan_id = _plan_id(control)
    if plan_id is not None:
        return parse_chain_plan(plan_id, names, operator=f"select_chain {stats.operator!r}")
    return tuple(names)


def join_inputs(stats: OperatorStats) -> int:
    """The number of inputs of a ``multi_join`` (from its ``input_rows_<i>`` / ``probed_<i>_<j>`` counters)."""
    report = _stats(stats).report
    idx = [c.i for c, _ in M.input_counters(report, M.INPUT_ROWS)]
    idx += [max(c.i, c.j) for c, _ in M.step_counters(report, M.PROBED)]
    if not idx:
        raise ValueError(f"stats of operator {stats.operator!r} hold no multi_join report (no input_rows_<i> "
                         f"counters); report keys: {sorted(report)[:8]}")
    return max(idx) + 1


def _plan_id(control) -> str | None:
    if control is None:
        return None
    control = chk.instance(control, "control", Mapping, "the operator's control-table entry (a mapping) or None")
    plan_id = control.get("plan_id")
    return plan_id if isinstance(plan_id, str) and plan_id else None


def chain_plans(predicates: Sequence[str]) -> list[str]:
    """Every evaluation order of ``predicates`` as a ``select_chain`` plan id (n! plans, in the order of
    :func:`itertools.permutations`).
    """
    if isinstance(predicates, str) or not isinstance(predicates, Sequence) or not predicates:
        raise TypeError(f"predicates must be a non-empty sequence of predicate names, got {predicates!r}")
    names = [check_predicate_name(n, "predicates") for n in predicates]
    if len(set(names)) != len(names):
        raise ValueError(f"predicates names a predicate twice: {names}")
    return [chain_plan_id(p) for p in itertools.permutations(names)]


def _n_inputs(n_inputs) -> int:
    n = chk.integer(n_inputs, "n_inputs", minimum=2)
    if n > 6:
        raise ValueError(f"n_inputs must be 2 to 6 (multi_join's inputs), got {n}")
    return n


def left_deep_orders(n_inputs: int) -> list[tuple[int, ...]]:
    """The left-deep join orders of inputs ``0 … n_inputs-1``, each once up to swapping the first two:
    n!/2 orders (OM §4.2 step 3, §5.3), from :func:`pyspark_cq.plan.left_deep_orders`.
    """
    n = _n_inputs(n_inputs)
    names = [str(i) for i in range(n)]
    return [tuple(int(s) for s in order) for order in P.left_deep_orders(names)]


def left_deep_probe_orders(order: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The ``multi_join`` probe orders that run the left-deep order ``order``: input ``order[m]`` probes the
    other inputs in the sequence of ``order`` (``order[0]`` and ``order[1]`` probe each other first).
    """
    if isinstance(order, str) or not isinstance(order, Sequence):
        raise TypeError(f"order must be a sequence of input indexes, got {order!r}")
    n = len(order)
    if sorted(order) != list(range(n)) or n < 2:
        raise ValueError(f"order must be a permutation of 0..n-1 (n >= 2), got {list(order)}")
    probes = [()] * n
    for i in order:
        probes[i] = tuple(j for j in order if j != i)
    return tuple(probes)


def left_deep_plans(n_inputs: int) -> list[str]:
    """The plan ids of :func:`left_deep_orders` (via :func:`left_deep_probe_orders`)."""
    return [join_plan_id(left_deep_probe_orders(o)) for o in left_deep_orders(n_inputs)]


def left_deep_order(plan_id: str, n_inputs: int) -> tuple[int, ...] | None:
    """The left-deep order (as in :func:`left_deep_orders`) a ``multi_join`` plan id runs, or None when the
    plan's probe orders are not those of a left-deep order.
    """
    n = _n_inputs(n_inputs)
    probes = parse_join_plan(plan_id, n)
    for order in left_deep_orders(n):
        if left_deep_probe_orders(order) == probes:
            return order
    return None


def candidate_plans(stats: OperatorStats, control: Mapping | None = None) -> list[str]:
    """The candidate plan ids of a running operator: every predicate order of a ``select_chain``, the
    left-deep orders of a ``multi_join``; ``[]`` for an operator without a plan report.
    """
    kind = operator_kind(stats)
    if kind == SELECT_CHAIN:
        return chain_plans(sorted(chain_predicates(stats, control)))
    if kind == MULTI_JOIN:
        return left_deep_plans(join_inputs(stats))
    return []


def current_plan(stats: OperatorStats, control: Mapping | None = None) -> str | None:
    """The canonical plan id the operator runs now: ``control``'s ``plan_id`` normalised (whitespace), or
    None when the entry has none (the operator then runs its default order).
    """
    plan_id = _plan_id(control)
    if plan_id is None:
        return None
    kind = operator_kind(stats)
    if kind == SELECT_CHAIN:
        return chain_plan_id(chain_predicates(stats, control))
    if kind == MULTI_JOIN:
        return join_plan_id(parse_join_plan(plan_id, join_inputs(stats)))
    return plan_id


@dataclass(frozen=True)
class StepEstimate:
    """One predicate's or probe step's counts in one micro-batch.

    ``nanos`` is the time spent in the step (nan when the operator does not report it).
    """

    rows_in: int
    rows_out: int
    nanos: float = NAN

    @property
    def selectivity(self) -> float:
        """``rows_out / rows_in`` (nan without rows); a join step's can exceed 1 (several matches per row)."""
        return self.rows_out / self.rows_in if self.rows_in > 0 else NAN

    @property
    def cost_per_row(self) -> float:
        """Seconds per input row, ``nanos / rows_in / 1e9`` (nan without rows or time); 1/cost is OM's tpr."""
        return self.nanos / self.rows_in / 1e9 if self.rows_in > 0 and math.isfinite(self.nanos) else NAN


def chain_steps(stats: OperatorStats) -> dict[str, StepEstimate]:
    """Per predicate of a ``select_chain``: rows in, rows passed and nanos of the latest batch."""
    report = stats.report
    return {p: StepEstimate(int(report.get(M.rows_in(p), 0)), int(report.get(M.rows_passed(p), 0)),
                            float(report[M.nanos(p)]) if M.nanos(p) in report else NAN)
            for p in chain_predicates(stats)}


def join_steps(stats: OperatorStats) -> dict[tuple[int, int], StepEstimate]:
    """Per probe step ``(i, j)`` of a ``multi_join`` (rows arriving on i probing j): partial matches in
    (``probed_i_j``) and out (``matched_i_j``) in the latest batch, for every ordered pair (a step the
    current plan did not run, or that no partial match reached, has ``rows_in`` 0). ``nanos`` is the step's
    ``probe_nanos_i_j`` when the steps ran in chunks (docs/chain.md), else nan (the depth-first probe does not
    time its steps).
    """
    n = join_inputs(stats)
    report = stats.report
    out = {}
    for (_, i, j), value in M.step_counters(report, M.PROBED):
        if i < n and j < n:
            nanos = report.get(M.probe_nanos(i, j), 0)
            out[(i, j)] = StepEstimate(int(value), int(report.get(M.matched(i, j), 0)),
                                       float(nanos) if nanos else NAN)
    return dict(sorted(out.items()))


def input_rows(stats: OperatorStats) -> tuple[int, ...]:
    """Rows that arrived in the latest batch: per input of a ``multi_join``, ``(input_rows,)`` otherwise."""
    report = _stats(stats).report
    if operator_kind(stats) == MULTI_JOIN:
        return tuple(int(report.get(M.per_input(M.INPUT_ROWS, i), 0)) for i in range(join_inputs(stats)))
    return (int(report.get(M.INPUT_ROWS, stats.input_rows)),)


def input_rates(stats: OperatorStats) -> tuple[float, ...]:
    """Arrival rates λ (rows/s) per input: the operator's smoothed input rate split by the latest batch's
    shares of :func:`input_rows` (nan before a rate is measured, or when the batch had no rows).
    """
    rows = input_rows(stats)
    total = sum(rows)
    rate = stats.input_rate
    if not total or not math.isfinite(rate):
        return tuple(NAN for _ in rows)
    return tuple(rate * r / total for r in rows)


def join_pair_selectivities(stats: OperatorStats, control: Mapping | None = None) -> dict[frozenset, float]:
    """Selectivity of each pair of a ``multi_join``'s inputs as a fraction of their cross product, from the
    first probe steps of the latest batch: a row of i probing j first finds ``matched_i_j / probed_i_j``
    matches among the rows of j stored when it probes, so ``sel_ij = matched_i_j / (probed_i_j · stored_j)``
    (both directions pooled). ``stored_j`` is ``state_rows_j`` at the end of the batch, less the batch's
    own rows of j when j comes after i (a batch's inputs are stored in input order). This is the join
    selectivity of OM's §4.1 join output rate.

    The first steps are those of ``control``'s ``plan_id`` (the operator's control-table entry) when given;
    without one, a step whose ``probed_i_j`` equals input i's well-formed arrivals. Pairs no first step
    measured are absent.
    """
    report = _stats(stats).report
    n = join_inputs(stats)
    plan_id = _plan_id(control)
    probes = parse_join_plan(plan_id, n, operator=f"multi_join {stats.operator!r}") if plan_id else None
    matched: dict[frozenset, float] = {}
    pairs: dict[frozenset, float] = {}
    for (i, j), step in join_steps(stats).items():
        if probes is not None:
            if probes[i][0] != j:
                continue
        elif step.rows_in != input_arrivals(stats, i):
            continue  # not the first step of i's probe order: its rows are partial matches, not arrivals
        stored = report.get(M.per_input(M.STATE_ROWS, j), 0)
        if j > i:   # within a batch the inputs are processed in input order: j's rows were not stored yet
            stored -= input_arrivals(stats, j)
        if step.rows_in > 0 and stored > 0:
            key = frozenset((i, j))
            matched[key] = matched.get(key, 0.0) + step.rows_out
            pairs[key] = pairs.get(key, 0.0) + step.rows_in * float(stored)
    return {k: matched[k] / pairs[k] for k in pairs}


def input_arrivals(stats: OperatorStats, i: int) -> int:
    """The well-formed rows that arrived on input ``i`` of a ``multi_join`` in the latest batch
    (``input_rows_<i>`` less ``malformed_rows_<i>``).
    """
    report = _stats(stats).report
    return report.get(M.per_input(M.INPUT_ROWS, i), 0) - report.get(M.per_input(M.MALFORMED_ROWS, i), 0)


def join_bands(stats: OperatorStats) -> frozenset | None:
    """The bounds graph of a ``multi_join``: the pairs ``frozenset({i, j})`` its ``bounds`` link, from the
    report's ``banded_<i>_<j>`` flags; None when the report has none set (an older report, or a batch no
    shard reported), i.e. unknown.
    """
    report = _stats(stats).report
    bands = frozenset(frozenset((c.i, c.j)) for c, flag in M.step_counters(report, M.BANDED) if flag)
    return bands or None


def key_only_steps(orders: Sequence[Sequence[int]], bands) -> list[tuple[int, int]]:
    """The probe steps ``(i, j)`` of per-input ``orders`` that enter an input j with no bound (``bands``, as
    from :func:`join_bands`) to any input bound before it: the kernel checks no time band there, so such a
    step matches every row of the key in j's state (a product within the key).
    """
    if isinstance(orders, str) or not isinstance(orders, Sequence) or any(
            isinstance(o, str) or not isinstance(o, Sequence) for o in orders):
        raise TypeError(f"orders must be a sequence of per-input probe orders, got {orders!r}")
    if not isinstance(bands, (set, frozenset)) or not all(isinstance(b, frozenset) and len(b) == 2 for b in bands):
        raise TypeError(f"bands must be a set of frozenset({{i, j}}) pairs (plan_stats.join_bands), got {bands!r}")
    out = []
    for i, order in enumerate(orders):
        bound = {i}
        for j in order:
            if not any(frozenset((b, j)) in bands for b in bound):
                out.append((i, j))
            bound.add(j)
    return out


class RoundEstimates:
    """OM's per-round estimates (Kulkarni & Ravishankar, §4.3): the decay-weighted mean of the last ``d``
    observations of each named quantity, ``est(R) = Σ F(R−r)·e^{−a·r} / Σ e^{−a·r}``
    (:class:`pyspark_cq.estimators.DecayedMean`).

    :meth:`observe` adds an operator's report once per micro-batch (it compares ``stats.batches`` with the
    last one seen), recording for a ``select_chain`` ``sel:<p>`` and ``cost:<p>`` (s/row) per predicate and
    ``rows`` (rows per batch); for a ``multi_join`` ``rows:<i>`` per input, ``step:<i>><j>`` per probe step
    and ``pair:<i>,<j>`` per measured pair selectivity; and ``rate`` / ``rate:<i>`` (rows/s) when measured.
    Non-finite values are skipped.

    Parameters
    ----------
    d : int
        Observations kept per quantity (>= 1).
    decay : float
        a >= 0 of the decay function G(r) = e^{−a·r}.
    """

    def __init__(self, d: int = 5, decay: float = 0.5):
        self.d = chk.integer(d, "d", minimum=1)
        self.decay = chk.non_negative(decay, "decay")
        self._est: dict[str, DecayedMean] = {}
        self._last: dict[str, int] = {}

    def add(self, name: str, value: float) -> None:
        """Add one observation of ``name`` (ignored when not finite)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        value = chk.real(value, "value", allow_nan=True, allow_inf=True)
        if math.isfinite(value):
            self._est.setdefault(name, DecayedMean(self.d, self.decay)).update(value)

    def get(self, name: str, default: float = NAN) -> float:
        """The estimate of ``name`` (``default`` before any observation)."""
        est = self._est.get(name)
        return est.value if est is not None and est.n else default

    def count(self, name: str) -> int:
        """How many observations of ``name`` were added."""
        est = self._est.get(name)
        return est.n if est is not None else 0

    def names(self) -> list[str]:
        """The quantities observed so far."""
        return sorted(self._est)

    def observe(self, stats: OperatorStats, control: Mapping | None = None) -> bool:
        """Add ``stats``' latest report if it is a new batch; True when it was added. ``control`` is the
        operator's control-table entry (its ``plan_id`` names the first probe steps of a join).
        """
        stats = _stats(stats)
        batch = stats.batches if stats.report_batch is None else stats.report_batch
        if batch <= self._last.get(stats.operator, 0) or not stats.report:
            return False
        self._last[stats.operator] = batch
        kind = operator_kind(stats)
        if kind == SELECT_CHAIN:
            for p, step in chain_steps(stats).items():
                self.add(f"sel:{p}", step.selectivity)
                self.add(f"cost:{p}", step.cost_per_row)
            self.add("rows", input_rows(stats)[0])
            self.add("rate", stats.input_rate)
        elif kind == MULTI_JOIN:
            for i, (rows, rate) in enumerate(zip(input_rows(stats), input_rates(stats))):
                self.add(f"rows:{i}", rows)
                self.add(f"rate:{i}", rate)
            for (i, j), step in join_steps(stats).items():
                self.add(f"step:{i}>{j}", step.selectivity)
            for pair, sel in join_pair_selectivities(stats, control).items():
                i, j = sorted(pair)
                self.add(f"pair:{i},{j}", sel)
        else:
            return False
        return True
