"""Rate-based plan choice: run each plan-switchable operator in the plan with the best predicted output rate.

Viglas & Naughton, "Rate-Based Query Optimization for Streaming Information Sources", §3–§4. Every round the
policy re-estimates, per running ``select_chain`` and ``multi_join`` (their per-step reports, through the
shared :mod:`pyspark_cq.policies.plan_stats`):

- the arrival rates (Spark's progress: the operator's smoothed input rate, split per input);
- per predicate of a chain its selectivity and cost per row; per probe step of a join the matches per
  partial match, divided by the probed state's rows: the step's selectivity given the inputs already bound;
- the cost of one probe (``probe_cost``, or measured: the batch duration over the partial matches probed
  in the batch — Spark's per-batch overhead included, so it errs towards "the operator cannot keep up",
  where the plans differ);
- how fast each join state grows (its rows' change per second between rounds; 0 in a windowed steady state).

It predicts each candidate plan (every predicate order of a chain; the left-deep orders of a join, as
control-table plan ids) with the rate model (:func:`pyspark_cq.cost.rate.chain_output_rate`,
:class:`pyspark_cq.cost.rate.MultiJoinModel`) under the chosen objective — ``"rate"``: local rate
maximization for the horizon ``t_p`` (§4.2.1, the rate at ``t_p/2``); ``"time"``: the least time to ``n``
outputs (Equation 3 inverted, §4.1) — and switches the operator's ``plan_id`` when another plan beats the
running one by more than ``margin`` (hysteresis, so that estimation noise does not flap plans), at most
once every ``min_batches`` micro-batches of the operator.

A step's selectivity is kept per arriving input i, probed input j and bound set B (``matched / (probed ·
state_rows_j)``): with time bands the stored rows a probe meets depend on which input arrived last, so a
pair's selectivity differs by direction. The outputs per arrival (which no order changes) are measured from
the running plan's last steps; the candidate orders differ in their probes. A step the running plan did not
measure takes the measurement of the same arriving and probed inputs with the nearest bound set, else the
most selective bound pair (``matched_i_j / (probed_i_j·state_rows_j)`` of first steps): a ``multi_join``
equates one key over all its inputs, so the key predicate is shared by all pairs and the independence
product would count it once per bound input. A pair no first step has measured yet is taken as selective as
the loosest measured pair.

A ``multi_join`` reports its bounds graph (``banded_<i>_<j>``). A probe step that enters an input with no
bound to the inputs already bound is checked on the key alone: it meets and matches every row of the key in
the probed state, which no banded measurement predicts (on §5.3's chain C–A–B–D–E the loosest band passes
1/16 of a key's rows). So with a known graph the candidate plans are those without such a step — the
left-deep orders that have none, and every input's cheapest order among those that have none
(:meth:`pyspark_cq.cost.rate.MultiJoinModel.best_orders` with ``allowed``) — and a step is estimated only
from measurements of steps of the same kind (banded or key-only). The running plan is always scored from
its own measurements, whatever its steps.

Join trees of binary ``interval_join`` s are fixed when a query starts (Spark cannot switch them):
:func:`choose_join_tree` picks one at registration with the same objectives.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from pyspark_cq import plan as P
from pyspark_cq.control import join_plan_id, parse_chain_plan, parse_join_plan
from pyspark_cq.cost import rate as R
from pyspark_cq.policies import Decision, Decisions, OperatorStats, Policy, Snapshot
from pyspark_cq.policies import plan_stats as S
from pyspark_cq.vocabulary import metrics as M

__all__ = ["RateBased", "choose_join_tree", "OBJECTIVES"]

OBJECTIVES = ("rate", "time")
_NO_COSTS = R.JoinCosts()


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _ids(bound) -> str:
    return ",".join(map(str, sorted(bound)))


def choose_join_tree(plans: Sequence[P.Node], rates: Mapping[str, float], *, objective: str = "rate",
                     t_p: float | None = None, n: float | None = None, fraction: float | None = None,
                     sizes: Mapping[str, float] | None = None, costs: R.JoinCosts = _NO_COSTS
                     ) -> tuple[P.Node, float]:
    """Pick the join tree of a query of binary joins before it starts (Viglas & Naughton, §4.2).

    ``objective="rate"``: local rate maximization for the horizon ``t_p`` (:func:`pyspark_cq.cost.rate.
    best_plan_by_rate`); ``"time"``: local time minimization for ``n`` outputs, or for a ``fraction`` in
    (0, 1] of the output over finite inputs of the given ``sizes`` (``n = fraction·`` output size,
    :func:`pyspark_cq.cost.rate.best_plan_by_time`). All plans must join the same sources (e.g.
    :func:`pyspark_cq.plan.enumerate_plans` of one query); ``rates`` must be positive.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if isinstance(plans, (str, P.Node)) or not isinstance(plans, Sequence) or not plans:
        raise TypeError(f"plans must be a non-empty list of plan nodes, got {plans!r}")
    for i, p in enumerate(plans):
        if not isinstance(p, P.Node):
            raise TypeError(f"plans[{i}] must be a plan node, got {p!r}")
    names = sorted(P.source_names(plans[0]))
    for i, p in enumerate(plans):
        if sorted(P.source_names(p)) != names:
            raise ValueError(f"plans[{i}] joins {sorted(P.source_names(p))}, which does not match the query's "
                             f"sources {names} (plans[0])")
    if not isinstance(rates, Mapping):
        raise TypeError(f"rates must be a mapping {{stream: rate}}, got {rates!r}")
    for s in names:
        if s not in rates:
            raise ValueError(f"rates has no rate for stream {s!r}; given: {sorted(rates)}")
        _positive(rates[s], f"rates[{s!r}]")
    if objective == "rate":
        if t_p is None or n is not None or fraction is not None:
            raise ValueError("objective 'rate' needs t_p (and neither n nor fraction)")
        return R.best_plan_by_rate(plans, rates, _positive(t_p, "t_p"), costs=costs)
    if (n is None) == (fraction is None) or t_p is not None:
        raise ValueError("objective 'time' needs exactly one of n (outputs) and fraction (of the output), and no t_p")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        if sizes is None:
            raise ValueError("fraction needs sizes (the number of elements of each finite source)")
        n = fraction * R.output_size(plans[0], sizes)
        if not n > 0:
            raise ValueError(f"the query has no output over sizes {dict(sizes)}: fraction has nothing to count")
    return R.best_plan_by_time(plans, rates, _positive(n, "n"), sizes=sizes, costs=costs)


class RateBased(Policy):
    """Rate-based plan switching for ``select_chain`` and ``multi_join`` (Viglas & Naughton, §4).

    Parameters
    ----------
    objective : {"rate", "time"}
        ``"rate"``: maximum output rate for the horizon ``t_p`` (§4.2.1); ``"time"``: least time to ``n``
        outputs (§4.1).
    t_p : float
        Horizon in seconds (> 0) of the rate objective.
    n : float
        Outputs (> 0) of the time objective.
    margin : float
        Hysteresis: switch only when the best plan's predicted rate exceeds the running plan's by this
        fraction (time objective: its time is shorter by this fraction), >= 0.
    min_batches : int
        Micro-batches of an operator between two switches of it (>= 1); estimates are taken only from
        batches of the running plan.
    probe_cost : float, optional
        Seconds per probe of a join state by one partial match (default: measured each round).
    d, decay : int, float
        OM's decay-weighted mean of the last d observations (Kulkarni & Ravishankar §4.3) for every
        estimate (:class:`pyspark_cq.policies.plan_stats.RoundEstimates`).
    scan : bool
        Cost a join's probe per row of the probed state (our kernel walks the key's rows; a measured
        ``probe_cost`` is then the batch time over the state rows the partial matches met), not per probe
        (:class:`pyspark_cq.cost.rate.MultiJoinModel`'s ``scan``). Default True.
    reset_factor : float, optional
        When an input's rows in a micro-batch differ from their estimate by more than this factor (> 1),
        forget the operator's estimates and start again from that batch: the decay-weighted means would
        otherwise need several rounds to forget the rates before the change. Default None: never.
    """

    name = "rate"

    def __init__(self, objective: str = "rate", t_p: float = 60.0, n: float = 10_000.0, margin: float = 0.1,
                 min_batches: int = 2, probe_cost: float | None = None, d: int = 5, decay: float = 0.5,
                 scan: bool = True, reset_factor: float | None = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.t_p = _positive(t_p, "t_p")
        self.n = _positive(n, "n")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
            raise ValueError(f"margin must be a finite fraction >= 0, got {margin!r}")
        self.margin = float(margin)
        if isinstance(min_batches, bool) or not isinstance(min_batches, int) or min_batches < 1:
            raise ValueError(f"min_batches must be an integer >= 1, got {min_batches!r}")
        self.min_batches = min_batches
        self.probe_cost = None if probe_cost is None else _positive(probe_cost, "probe_cost")
        self.d, self.decay = d, decay
        S.RoundEstimates(d, decay)  # validates d and decay
        if not isinstance(scan, bool):
            raise TypeError(f"scan must be a bool, got {scan!r}")
        self.scan = scan
        if reset_factor is not None and _positive(reset_factor, "reset_factor") <= 1:
            raise ValueError(f"reset_factor must be > 1 (a factor of change in an input's rows), got {reset_factor!r}")
        self.reset_factor = None if reset_factor is None else float(reset_factor)
        self.resets: list[tuple[str, str, int]] = []          # (query, operator, batches) of every reset
        self._reset()

    def _reset(self) -> None:
        self._est: dict[tuple[str, str], S.RoundEstimates] = {}
        self._seen: dict[tuple[str, str], tuple[int, float, tuple]] = {}   # batches, time, state rows
        self._switched: dict[tuple[str, str], int] = {}                     # batches at the last switch
        self.predictions: dict[tuple[str, str], dict[str, float]] = {}      # last scores per plan id

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"objective": "time", "n": 5000.0, "margin": 0.0, "min_batches": 1, "probe_cost": 1e-6},
                {"reset_factor": 4.0}]

    # -- per operator ----------------------------------------------------------------------------

    def _better(self, best: float, current: float) -> bool:
        if self.objective == "rate":
            return best > current * (1.0 + self.margin)
        return best * (1.0 + self.margin) < current

    def _pick(self, scores: dict[str, float]) -> str:
        sign = -1.0 if self.objective == "rate" else 1.0
        return min(sorted(scores), key=lambda k: sign * scores[k])

    def _chain_scores(self, est: S.RoundEstimates, stats: OperatorStats, control) -> dict[str, float] | None:
        names = sorted(S.chain_predicates(stats, control))
        sel = {p: est.get(f"sel:{p}") for p in names}
        cost = {p: est.get(f"cost:{p}", 0.0) for p in names}
        r = est.get("rate")
        if not all(math.isfinite(v) for v in sel.values()) or not math.isfinite(r) or r <= 0:
            return None
        sel = {p: min(max(v, 0.0), 1.0) for p, v in sel.items()}
        scores = {}
        for plan_id in S.candidate_plans(stats, control):
            rate = R.chain_output_rate(r, parse_chain_plan(plan_id, names), sel, cost)
            scores[plan_id] = rate if self.objective == "rate" else (self.n / rate if rate > 0 else math.inf)
        return scores

    def _observe_join(self, key, est: S.RoundEstimates, stats: OperatorStats, control, now: float) -> None:
        """Conditional step selectivities of the running plan, and the states' growth per second."""
        report, n = stats.report, S.join_inputs(stats)
        plan_id = control.get("plan_id") if isinstance(control, Mapping) else None
        probes = parse_join_plan(plan_id, n) if isinstance(plan_id, str) and plan_id else None
        states = tuple(float(report.get(M.per_input(M.STATE_ROWS, j), 0)) for j in range(n))
        for (i, j), step in S.join_steps(stats).items():
            if probes is None or step.rows_in <= 0 or states[j] <= 0:
                continue
            order = probes[i]
            bound = frozenset((i,) + order[:order.index(j)])
            est.add(f"cond:{i}:{j}|{_ids(bound)}", step.rows_out / (step.rows_in * states[j]))
        if probes is not None:
            for i, order in enumerate(probes):
                arrivals = S.input_arrivals(stats, i)
                if arrivals > 0:
                    est.add(f"out:{i}", report.get(M.matched(i, order[-1]), 0) / arrivals)
        seen = self._seen.get(key)
        if seen is not None and now > seen[1]:
            for j in range(n):
                est.add(f"growth:{j}", max(0.0, (states[j] - seen[2][j]) / (now - seen[1])))
        self._seen[key] = (stats.batches, now, states)

    def _join_model(self, est: S.RoundEstimates, stats: OperatorStats, batch_duration: float):
        n = S.join_inputs(stats)
        bands = S.join_bands(stats)
        report = stats.report
        rates = [est.get(f"rate:{i}") for i in range(n)]
        if not all(math.isfinite(r) and r > 0 for r in rates):
            return None
        pairs = {}
        for i in range(n):
            for j in range(i + 1, n):
                v = est.get(f"pair:{i},{j}")
                if math.isfinite(v):
                    pairs[frozenset((i, j))] = min(max(v, 0.0), 1.0)
        if not pairs:
            return None
        # a pair no first step measured yet shares the key with the others and is bounded by the closure
        # of their time bands: the loosest measured pair stands for it (not a Cartesian product)
        loosest = max(pairs.values())
        for i in range(n):
            for j in range(i + 1, n):
                pairs.setdefault(frozenset((i, j)), loosest)
        measured: dict[tuple[int, frozenset], list[tuple[int, frozenset, float]]] = {}
        for name in est.names():
            if name.startswith("cond:"):
                head, _, tail = name[5:].partition("|")
                i, j = map(int, head.split(":"))
                bound = frozenset(map(int, tail.split(",")))
                measured.setdefault((i, j), []).append((len(bound), bound, est.get(name)))
        conditional = {}
        for i in range(n):
            for j in range(n):
                if j == i:
                    continue
                others = [b for b in range(n) if b not in (i, j)]
                for mask in range(1 << len(others)):
                    bound = frozenset([i] + [b for k, b in enumerate(others) if mask >> k & 1])
                    f = self._step_estimate(measured, pairs, i, j, bound, bands)
                    if math.isfinite(f):     # else the model's product of the pairs
                        conditional[(i, j, bound)] = min(max(f, 0.0), 1.0)
        states = tuple(float(report.get(M.per_input(M.STATE_ROWS, j), 0)) for j in range(n))
        growth = tuple(max(est.get(f"growth:{j}", 0.0), 0.0) for j in range(n))
        probe = self.probe_cost
        if probe is None:
            probed = list(M.step_counters(report, M.PROBED))
            if self.scan:     # the state rows the partial matches met
                work = sum(int(v) * states[c.j] for c, v in probed) + sum(S.input_rows(stats))
            else:
                work = sum(int(v) for _, v in probed) + sum(S.input_rows(stats))
            if not (math.isfinite(batch_duration) and batch_duration > 0 and work > 0):
                return None
            probe = batch_duration / work
        outputs = [est.get(f"out:{i}") for i in range(n)]
        outputs = tuple(outputs) if all(math.isfinite(v) for v in outputs) else None
        return R.MultiJoinModel(tuple(rates), pairs, conditional, states, growth, probe_cost=probe, outputs=outputs,
                                scan=self.scan)

    @staticmethod
    def _step_estimate(measured, pairs, i: int, j: int, bound: frozenset, bands=None) -> float:
        """f(j | B) for rows arriving on i: measured for this bound set; else the measurement of the nearest
        bound set of the same arriving input (fewest inputs bound differently; a step with more bound inputs
        filters at least as much); else the most selective bound pair. With the bounds graph ``bands``
        known, only measurements of the same kind count (a step checked on the key alone, or one with a
        band), and the pairs are those with a band (a key-only step without a measurement of its kind has
        no estimate from them: nan, and the policy does not offer plans with such steps).
        """
        near = measured.get((i, j))
        if bands is not None:
            def banded(b):
                return any(frozenset((x, j)) in bands for x in b)
            near = [m for m in near or () if banded(m[1]) == banded(bound)]
            linked = [pairs[frozenset((b, j))] for b in bound if frozenset((b, j)) in bands]
        else:
            linked = [pairs[frozenset((b, j))] for b in bound]
        if near:
            return min(near, key=lambda m: (len(m[1] ^ bound), m[0], sorted(m[1])))[2]
        return min(linked) if linked else math.nan

    def _join_candidates(self, model: R.MultiJoinModel, stats: OperatorStats, control) -> list[str]:
        """The left-deep plans; with the bounds graph known, only those without a key-only step, and every
        input's cheapest order without one (local rate maximization for ``t_p``, or for ``n`` outputs).
        """
        plans = S.candidate_plans(stats, control)
        bands = S.join_bands(stats)
        if bands is None:
            return plans
        n = model.n_inputs
        plans = [p for p in plans if not S.key_only_steps(parse_join_plan(p, n), bands)]
        allowed = [[o for o in itertools.permutations([j for j in range(n) if j != i])
                    if not S.key_only_steps([()] * i + [o], bands)] for i in range(n)]
        goal = {"t_p": self.t_p} if self.objective == "rate" else {"n": self.n}
        orders, _ = model.best_orders(allowed=allowed, **goal)
        best = join_plan_id(orders)
        return plans + ([best] if best not in plans else [])

    def _join_scores(self, model: R.MultiJoinModel, stats: OperatorStats, control) -> dict[str, float]:
        n = model.n_inputs
        plans = self._join_candidates(model, stats, control)
        current = S.current_plan(stats, control)
        if current is not None and current not in plans:     # a running plan that is not a candidate
            plans.append(current)
        scores = {}
        for plan_id in plans:
            orders = parse_join_plan(plan_id, n)
            if self.objective == "rate":
                scores[plan_id] = model.local_rate_estimate(orders, self.t_p)
            else:
                scores[plan_id] = model.time_to_outputs(orders, self.n, rtol=1e-6)
        return scores

    def _rates_changed(self, key, est: S.RoundEstimates, stats: OperatorStats) -> bool:
        """True when ``reset_factor`` is set and some input's rows in this (new) batch differ from their
        estimate by more than that factor.
        """
        seen = self._seen.get(key)
        if self.reset_factor is None or (seen is not None and stats.batches <= seen[0]):
            return False
        for i, rows in enumerate(S.input_rows(stats)):
            before = est.get(f"rows:{i}")
            if math.isfinite(before) and before > 0 and rows > 0 and (
                    rows > before * self.reset_factor or rows * self.reset_factor < before):
                return True
        return False

    # -- Policy interface ------------------------------------------------------------------------

    def decide(self, snapshot: Snapshot) -> Decisions:
        """One round: re-estimate, predict every candidate plan, switch where another is better by ``margin``."""
        self._check(snapshot)
        live = {(q, op) for q, info in snapshot.queries.items() for op in info.operators}
        for key in [k for k in self._est if k not in live]:
            self._est.pop(key)
            self._seen.pop(key, None)
            self._switched.pop(key, None)
            self.predictions.pop(key, None)
        out = []
        for qname in sorted(snapshot.queries):
            info = snapshot.queries[qname]
            for op in sorted(info.operators):
                stats = info.operators[op]
                kind = S.operator_kind(stats)
                if kind is None:
                    continue
                key = (qname, op)
                control = info.control.get(op, {})
                est = self._est.setdefault(key, S.RoundEstimates(self.d, self.decay))
                if kind == S.MULTI_JOIN and self._rates_changed(key, est, stats):
                    est = self._est[key] = S.RoundEstimates(self.d, self.decay)
                    self.resets.append((qname, op, stats.batches))
                if not est.observe(stats, control):
                    continue
                if kind == S.SELECT_CHAIN:
                    scores = self._chain_scores(est, stats, control)
                else:
                    self._observe_join(key, est, stats, control, snapshot.time)
                    model = self._join_model(est, stats, info.batch_duration)
                    scores = None if model is None else self._join_scores(model, stats, control)
                if not scores:
                    continue
                self.predictions[key] = scores
                best = self._pick(scores)
                current = S.current_plan(stats, control)
                if best == current:
                    continue
                if stats.batches - self._switched.get(key, -self.min_batches) < self.min_batches:
                    continue
                if current is not None and not self._better(scores[best], scores[current]):
                    continue
                self._switched[key] = stats.batches
                what = (f"predicted rate {scores[best]:.4g}/s at t_p/2 = {self.t_p / 2:g} s" if self.objective == "rate"
                        else f"predicted time to {self.n:g} outputs {scores[best]:.4g} s")
                was = "" if current is None else f" vs {scores[current]:.4g} for {current!r}"
                out.append(Decision(op, {"plan_id": best}, f"rate-based (Viglas & Naughton §4.2): {what}{was}",
                                    query=qname))
        return Decisions(out, self.name)

