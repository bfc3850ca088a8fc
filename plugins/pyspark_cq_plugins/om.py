"""OM: switch the plans of running queries by sel-λ and λ-λ charts (Kulkarni & Ravishankar, §4.4–4.5).

The policy ``om`` chooses the plan of every plan-switchable operator of the registered queries — the
predicate order of a ``select_chain``, the left-deep order of a ``multi_join`` (run as probe orders,
:mod:`pyspark_cq.policies.plan_stats`) — and writes it as ``plan_id`` into the control table when it differs
from the running one (a *switch*).

- **Rounds.** A micro-batch is a round (or every ``every``-th one). Each round's observation comes from the
  operator's per-batch report: for a chain the selectivity of every predicate (``rows_passed_p/rows_in_p``),
  its cost per row (``nanos_p/rows_in_p``) and the arrival rate; for a join every input's arrival rate.
  Arrival rates are rows per round over the round's length W (``window``, seconds: the query's Q[W], §3.1).
- **Estimates (§4.3).** The decay-weighted mean of the last d observations, ``G(r) = e^{−a·r}``
  (:class:`~pyspark_cq.policies.plan_stats.RoundEstimates`).
- **Costs (§3.2, §4.1).** A plan's utility ``w_r/C_r + w_m·C_m`` by :func:`pyspark_cq.cost.om.cost_plan`:
  a chain is a stack of selections with the measured cost per row as 1/tpr
  (:func:`~pyspark_cq.cost.om.chain_plan`); a join, by default (``join_model="mjoin"``), the probe steps our
  ``multi_join`` runs for the plan, each a §4.1 operator with the measured pair selectivities and
  ``join_cost`` seconds per probe (:func:`~pyspark_cq.cost.om.mjoin_plan_cost`), or (``"tree"``) OM's
  left-deep tree of 2-way joins (:func:`~pyspark_cq.cost.om.left_deep_join_plan`). The tree misranks our
  operator's plans: in the order (a, b, c) a row of c probes a's whole state first, not a small a ⋈ b
  result (docs/om.md, "OM on Spark").
- **Charts (§4.4, Algorithm 1).** A chain gets a sel-λ chart: k × k regions over the selectivity of one
  predicate (``chart_predicate``, by default the first by name) and λ; the other predicates' selectivities
  and all costs are held at their estimates when the chart is built. A join of l inputs gets a λ-λ chart of
  k^l regions with the pair selectivities held constant (§4.4.2). A chart is rebuilt when a held value's
  estimate moves by more than ``rebuild`` (relative) from the value it was built with — §4.3 re-estimates
  join selectivity "only when observed and estimated values differ by a certain threshold".
- **Scheduling (§4.5, Algorithm 2).** Each round the estimate's region indexes the plan; a *move* is a round
  whose region differs from the previous one, a *switch* one that runs another plan, a *hit* a round whose
  plan is optimal for the values observed in it (§5.1). :meth:`OMPolicy.status` reports them per operator;
  the runtime logs it with every round (``rt.decisions_log()[-1]["status"]``).

Ranges (``ranges``): per operator ``{dimension: (low, high)}`` with dimensions ``"sel"`` and ``"rate"`` for a
chain, ``"rate:<i>"`` for a join; a missing range is [0, 1] for a selectivity and
``[λ_e/span, λ_e·span]`` around the first estimate for a rate.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark_cq import _args as chk
from pyspark_cq.control.plans import parse_chain_plan, parse_join_plan
from pyspark_cq.cost import om
from pyspark_cq.policies import Decision, Decisions, OperatorStats, Policy, QueryInfo, Snapshot
from pyspark_cq.policies import plan_stats as ps
from pyspark_cq.vocabulary import metrics as M

__all__ = ["OMPolicy", "PlanModel", "PlanPolicy", "JOIN_MODELS"]

NAN = math.nan
#: how a join plan is costed: the probe steps of our multi_join, or OM's left-deep tree of 2-way joins
JOIN_MODELS = ("mjoin", "tree")
_FLOOR = 1e-9      # rates and selectivities of 0 kept just above 0 (§4.1's join denominator, sel > 0)


@dataclass
class PlanModel:
    """One operator's plans, the values held fixed and the cost of a plan at a point (§3.2, §4.1).

    ``dims`` are the varying statistics (the chart's axes); ``held`` the estimates held constant; the
    cost of a plan at a point is its utility with the point's values and the held ones.
    """

    kind: str
    plans: tuple[str, ...]
    dims: tuple[str, ...]
    held: dict
    window: float
    w_r: float
    w_m: float
    names: tuple = ()            # chain: predicate names (sorted); join: input indexes
    chart_predicate: str = ""
    join_model: str = "mjoin"    # a join's cost: "mjoin" (its probe steps) or "tree" (OM's left-deep tree)

    def cost(self, plan: str, point: Mapping[str, float]) -> float:
        """``Cost_p`` of ``plan`` at ``point`` (§3.2)."""
        if self.kind == ps.SELECT_CHAIN:
            # a measured selectivity of 0 is kept just above 0: the plan model's selections need sel > 0
            sels = {p: max(self.held[f"sel:{p}"], _FLOOR) for p in self.names if p != self.chart_predicate}
            sels[self.chart_predicate] = min(max(point["sel"], _FLOOR), 1.0)
            costs = {p: self.held[f"cost:{p}"] for p in self.names}
            order = parse_chain_plan(plan, self.names)
            cost = om.cost_plan(om.chain_plan(order, sels, costs), {"S": max(point["rate"], _FLOOR)}, self.window)
        else:
            n = len(self.names)
            pairs = {frozenset((i, j)): max(self.held[f"pair:{i},{j}"], _FLOOR)
                     for i in range(n) for j in range(i + 1, n)}
            if self.join_model == "mjoin":     # the probe steps our multi_join runs (see om.mjoin_plan_cost)
                cost = om.mjoin_plan_cost(parse_join_plan(plan, n), [max(point[f"rate:{i}"], _FLOOR) for i in range(n)],
                                          pairs, self.window, self.held["join_cost"])
            else:                              # OM's left-deep tree of 2-way joins (§4.2 step 3)
                node = om.left_deep_join_plan(ps.left_deep_order(plan, n), pairs, self.held["join_cost"])
                cost = om.cost_plan(node, {f"s{i}": max(point[f"rate:{i}"], _FLOOR) for i in range(n)}, self.window)
        if cost.output_rate <= 0:      # no output (a selectivity of 0): w_r/C_r is infinite, or 0 when w_r = 0
            return math.inf if self.w_r > 0 else self.w_m * cost.memory
        return cost.utility(self.w_r, self.w_m)

    def best(self, point: Mapping[str, float]) -> str:
        """The plan of minimum cost at ``point`` (the first of equals, in :attr:`plans` order)."""
        return min(self.plans, key=lambda p: self.cost(p, point))


@dataclass
class _OpState:
    est: ps.RoundEstimates
    model: PlanModel | None = None
    chart: om.Chart | None = None
    rounds: int = 0           # rounds scored
    hits: int = 0
    moves: int = 0
    switches: int = 0
    rebuilds: int = 0
    region: tuple | None = None
    plan: str | None = None   # the plan chosen for the next round
    ran: str | None = None    # the plan that ran in the last observed round
    seen: int = 0             # batches observed
    extra: dict = field(default_factory=dict)


class PlanPolicy(Policy):
    """Shared machinery of the plan policies (``om``, ``rand``, ``static``): per operator the estimates,
    the cost model, the per-round hit / move / switch accounting and the decisions. Subclasses implement
    :meth:`choose`.
    """

    name = ""

    def __init__(self, window: float = 1.0, d: int = 5, decay: float = 0.5, w_r: float = 0.4,
                 w_m: float = 0.6, join_cost: float = 1e-6, every: int = 1, join_model: str = "mjoin"):
        self.window = chk.positive(window, "window")
        if join_model not in JOIN_MODELS:
            raise ValueError(f"join_model must be one of {JOIN_MODELS}, got {join_model!r}")
        self.join_model = join_model
        self.d = chk.integer(d, "d", minimum=1)
        self.decay = chk.non_negative(decay, "decay")
        self.w_r = chk.non_negative(w_r, "w_r")
        self.w_m = chk.non_negative(w_m, "w_m")
        if self.w_r == 0 and self.w_m == 0:
            raise ValueError("w_r and w_m must not both be 0 (the utility w_r/C_r + w_m·C_m would rank no plan)")
        self.join_cost = chk.positive(join_cost, "join_cost")
        self.every = chk.integer(every, "every", minimum=1)
        self._ops: dict[tuple[str, str], _OpState] = {}

    # -- what subclasses provide -------------------------------------------------------------------

    def choose(self, key: tuple[str, str], state: _OpState, point: Mapping[str, float]) -> str | None:
        """The plan for the next round given the estimate ``point`` (None: keep the running plan)."""
        raise NotImplementedError

    # -- observation -------------------------------------------------------------------------------

    def _observed(self, state: _OpState, stats: OperatorStats) -> dict:
        """The observation of the model's statistics in the round just reported (its latest report)."""
        if state.model.kind == ps.SELECT_CHAIN:
            steps = ps.chain_steps(stats)
            point = {f"sel:{p}": s.selectivity for p, s in steps.items()}
            point["rate"] = ps.input_rows(stats)[0] / self.window
            point["sel"] = point[f"sel:{state.model.chart_predicate}"]
            return point
        return {f"rate:{i}": r / self.window for i, r in enumerate(ps.input_rows(stats))}

    def _estimate(self, state: _OpState) -> dict | None:
        """The estimate of the model's dimensions (§4.3), None while one is unknown."""
        m = state.model
        out = {}
        for dim in m.dims:
            if dim == "sel":
                value = state.est.get(f"sel:{m.chart_predicate}")
            elif dim == "rate":
                value = state.est.get("rows") / self.window
            else:
                value = state.est.get("rows:" + dim.split(":")[1]) / self.window
            if not math.isfinite(value):
                return None
            out[dim] = value
        return out

    def _held(self, state: _OpState, kind: str, names) -> dict | None:
        """The estimates held constant in the model, None while one is unknown."""
        est = state.est
        held = {}
        if kind == ps.SELECT_CHAIN:
            for p in names:
                held[f"sel:{p}"] = est.get(f"sel:{p}")
                cost = est.get(f"cost:{p}")
                held[f"cost:{p}"] = cost if math.isfinite(cost) else 0.0
        else:
            n = len(names)
            known = {(i, j): est.get(f"pair:{i},{j}") for i in range(n) for j in range(i + 1, n)}
            finite = [v for v in known.values() if math.isfinite(v)]
            if not finite:
                return None
            fill = sum(finite) / len(finite)    # one key: an unmeasured pair matches like the measured ones
            for (i, j), v in known.items():
                held[f"pair:{i},{j}"] = min(v if math.isfinite(v) else fill, 1.0)
            held["join_cost"] = self.join_cost
        if any(not math.isfinite(v) for v in held.values()):
            return None
        return held

    def _model(self, key, state: _OpState, stats: OperatorStats, control: Mapping) -> PlanModel | None:
        kind = ps.operator_kind(stats)
        if kind == ps.SELECT_CHAIN:
            names = tuple(sorted(ps.chain_predicates(stats)))
            dims = ("sel", "rate")
        else:
            names = tuple(range(ps.join_inputs(stats)))
            dims = tuple(f"rate:{i}" for i in names)
        held = self._held(state, kind, names)
        if held is None:
            return None
        plans = tuple(ps.candidate_plans(stats, control))
        return PlanModel(kind, plans, dims, held, self.window, self.w_r, self.w_m, names,
                         self._chart_predicate(key, names) if kind == ps.SELECT_CHAIN else "", self.join_model)

    def _chart_predicate(self, key, names) -> str:
        return names[0]

    def _drifted(self, state: _OpState, stats: OperatorStats, control: Mapping, threshold: float) -> bool:
        """Whether a held estimate moved by more than ``threshold`` (relative) since the model was built."""
        fresh = self._held(state, state.model.kind, state.model.names)
        if fresh is None:
            return False
        axis = f"sel:{state.model.chart_predicate}"      # the chart's own axis is not held
        for k, old in state.model.held.items():
            if k == axis:
                continue
            new = fresh[k]
            scale = max(abs(old), abs(new))
            if scale > 0 and abs(new - old) > threshold * scale:
                return True
        return False

    # -- the round ---------------------------------------------------------------------------------

    def decide(self, snapshot: Snapshot) -> Decisions:
        """One round for every plan-switchable operator with a control-table entry: observe, estimate, choose."""
        self._check(snapshot)
        out = []
        live = set()
        for q in snapshot.queries.values():
            for op, stats in q.operators.items():
                if op not in q.control or ps.operator_kind(stats) is None:
                    continue       # only operators with a control-table entry and a plan report
                key = (q.name, op)
                live.add(key)
                decision = self._round(key, q, stats, q.control[op])
                if decision is not None:
                    out.append(decision)
        for key in set(self._ops) - live:
            if key[0] not in snapshot.queries:
                del self._ops[key]
        return Decisions(out, self.name)

    def remove(self, query: str) -> Decisions:
        """Forget the estimates, charts and measures of a stopped query."""
        super().remove(query)
        for key in [k for k in self._ops if k[0] == query]:
            del self._ops[key]
        return Decisions((), self.name)

    def _round(self, key, q: QueryInfo, stats: OperatorStats, control: Mapping) -> Decision | None:
        state = self._ops.get(key)
        if state is None:
            state = self._ops[key] = _OpState(ps.RoundEstimates(self.d, self.decay))
        running = ps.current_plan(stats, control)
        if not stats.report.get(M.INPUT_ROWS):
            return None      # a batch without arrivals (Spark's no-data batch for the watermark) is no round
        if not state.est.observe(stats, control):
            return None
        state.seen += 1
        if state.model is None:
            state.model = self._model(key, state, stats, control)
            if state.model is None:
                return None
            self._built(key, state)
        elif self._rebuild_needed(state, stats, control):
            state.model = self._model(key, state, stats, control)
            state.rebuilds += 1
            self._built(key, state)
        # score the round just observed: the plan that ran against the optimum at the observed values
        observed = self._observed(state, stats)
        if running is not None and all(math.isfinite(observed.get(d, NAN)) for d in state.model.dims):
            point = {d: observed[d] for d in state.model.dims}
            best = state.model.cost(state.model.best(point), point)
            state.rounds += 1
            if running in state.model.plans:     # a hit: the plan that ran costs the optimum (ties count)
                state.hits += state.model.cost(running, point) <= best + 1e-12 * abs(best)
            if state.ran is not None and running != state.ran:
                state.switches += 1
            state.ran = running
        if state.seen % self.every:
            return None
        point = self._estimate(state)
        if point is None:
            return None
        plan = self.choose(key, state, point)
        if plan is None:
            return None
        state.plan = plan
        if plan == running:
            return None                          # not a switch: nothing to write
        return Decision(key[1], {"plan_id": plan}, reason=self._reason(state, point, plan), query=key[0])

    def _rebuild_needed(self, state: _OpState, stats, control) -> bool:
        return False

    def _built(self, key, state: _OpState) -> None:
        """Hook: a model was (re)built."""

    def _reason(self, state: _OpState, point: Mapping[str, float], plan: str) -> str:
        values = ", ".join(f"{k}={v:.4g}" for k, v in point.items())
        return (f"{self.name}: estimate {values} -> plan {plan} (rounds {state.rounds}, hits {state.hits}, "
                f"moves {state.moves}, switches {state.switches})")

    # -- reporting ---------------------------------------------------------------------------------

    def status(self) -> dict:
        """Per ``"<query>/<operator>"``: rounds scored, hits, fidelity, moves, switches, chart rebuilds and
        the plan chosen last (OM §5.1's measures).
        """
        out = {}
        for (query, op), s in sorted(self._ops.items()):
            out[f"{query}/{op}"] = {
                "rounds": s.rounds, "hits": s.hits, "fidelity": s.hits / s.rounds if s.rounds else NAN,
                "moves": s.moves, "switches": s.switches, "rebuilds": s.rebuilds, "plan": s.plan,
                "region": s.region}
        return out


class OMPolicy(PlanPolicy):
    """OM (Kulkarni & Ravishankar): the plan of each round from the sel-λ / λ-λ chart (see the module).

    Parameters
    ----------
    k : int
        Partitions per chart dimension (k × k regions for a chain, k^l for an l-way join), >= 1.
    window : float
        W: seconds one round (micro-batch) covers; rates are rows per round / W.
    d, decay : int, float
        The estimator's window d (>= 1) and decay rate a (>= 0), §4.3.
    w_r, w_m : float
        Utility weights (>= 0, not both 0), §3.2; the paper's defaults 0.4 and 0.6 (§5.1).
    join_cost : float
        Seconds per tuple joined (1/tpr of a 2-way join), > 0.
    ranges : mapping, optional
        ``{operator: {dimension: (low, high)}}`` (see the module).
    span : float
        A rate range without ``ranges`` is ``[λ_e/span, λ_e·span]`` around the first estimate, span > 1.
    chart_predicate : mapping, optional
        ``{operator: predicate}``: the chain predicate whose selectivity is the sel axis.
    rebuild : float
        Relative change of a held estimate that rebuilds the chart, > 0.
    every : int
        A round every ``every`` micro-batches.
    join_model : {"mjoin", "tree"}
        How a join plan is costed: the probe steps our ``multi_join`` runs (default) or OM's left-deep tree.
    """

    name = "om"

    def __init__(self, k: int = 10, window: float = 1.0, d: int = 5, decay: float = 0.5, w_r: float = 0.4,
                 w_m: float = 0.6, join_cost: float = 1e-6, ranges: Mapping | None = None, span: float = 2.0,
                 chart_predicate: Mapping | None = None, rebuild: float = 0.5, every: int = 1,
                 join_model: str = "mjoin"):
        super().__init__(window, d, decay, w_r, w_m, join_cost, every, join_model)
        self.k = chk.integer(k, "k", minimum=1)
        self.ranges = _ranges(ranges)
        self.span = chk.positive(span, "span")
        if self.span <= 1:
            raise ValueError(f"span must be > 1 (a rate range [λ/span, λ·span]), got {span}")
        if chart_predicate is not None and not isinstance(chart_predicate, Mapping):
            raise TypeError(f"chart_predicate must be a mapping {{operator: predicate}} or None, "
                            f"got {chart_predicate!r}")
        self.chart_predicate = dict(chart_predicate) if chart_predicate else None
        self.rebuild = chk.positive(rebuild, "rebuild")

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"k": 3, "d": 2, "w_r": 1.0, "w_m": 0.0, "ranges": {"q1-op": {"rate": (1.0, 500.0)}}}]

    def _chart_predicate(self, key, names) -> str:
        chosen = (self.chart_predicate or {}).get(key[1])
        if chosen is None:
            return names[0]
        if chosen not in names:
            raise ValueError(f"chart_predicate[{key[1]!r}] = {chosen!r} is not a predicate of the operator; "
                             f"its predicates: {list(names)}")
        return chosen

    def _rebuild_needed(self, state: _OpState, stats, control) -> bool:
        return self._drifted(state, stats, control, self.rebuild)

    def _built(self, key, state: _OpState) -> None:
        point = self._estimate(state)
        given = self.ranges.get(key[1], {})
        dims = []
        for dim in state.model.dims:
            if dim in given:
                lo, hi = given[dim]
            elif dim == "sel":
                lo, hi = 0.0, 1.0
            else:
                if point is None:
                    state.chart = None
                    return
                lo, hi = point[dim] / self.span, max(point[dim] * self.span, point[dim] / self.span + 1e-9)
            dims.append((dim, lo, hi))
        unknown = set(given) - set(state.model.dims)
        if unknown:
            raise ValueError(f"ranges[{key[1]!r}] names unknown dimension(s) {sorted(unknown)}; the operator's "
                             f"chart has {list(state.model.dims)}")
        state.chart = om.Chart(dims, self.k, list(state.model.plans), state.model.cost)   # Algorithm 1

    def choose(self, key, state: _OpState, point: Mapping[str, float]) -> str | None:
        """The plan the chart indexes at the estimate's region (Algorithm 2, lines 1–3); counts moves."""
        if state.chart is None:
            self._built(key, state)
            if state.chart is None:
                return None
        values = [point[d] for d in state.chart.names]
        region = state.chart.region(*values)                       # Algorithm 2, line 1
        if state.region is not None and region != state.region:
            state.moves += 1
        state.region = region
        return state.chart.lookup(*values)                         # lines 2–3


def _ranges(ranges) -> dict:
    if ranges is None:
        return {}
    if not isinstance(ranges, Mapping):
        raise TypeError(f"ranges must be a mapping {{operator: {{dimension: (low, high)}}}} or None, got {ranges!r}")
    out = {}
    for op, dims in ranges.items():
        if not isinstance(dims, Mapping):
            raise TypeError(f"ranges[{op!r}] must be a mapping {{dimension: (low, high)}}, got {dims!r}")
        out[op] = {}
        for dim, rng in dims.items():
            if dim != "sel" and dim != "rate" and not (isinstance(dim, str) and dim.startswith("rate:")):
                raise ValueError(f"ranges[{op!r}] has unknown dimension {dim!r}; use 'sel', 'rate' or 'rate:<i>'")
            om.Dimension(f"ranges[{op!r}][{dim!r}]", *_pair(rng, f"ranges[{op!r}][{dim!r}]"))
            lo, hi = _pair(rng, f"ranges[{op!r}][{dim!r}]")
            if lo < 0 or (dim == "sel" and hi > 1):
                raise ValueError(f"ranges[{op!r}][{dim!r}] = {(lo, hi)} must lie in "
                                 f"{'[0, 1]' if dim == 'sel' else '[0, inf)'}")
            out[op][dim] = (lo, hi)
    return out


def _pair(rng, name: str) -> tuple[float, float]:
    if isinstance(rng, (str, bytes)) or not hasattr(rng, "__len__") or len(rng) != 2:
        raise TypeError(f"{name} must be a (low, high) pair, got {rng!r}")
    return chk.real(rng[0], f"{name} low"), chk.real(rng[1], f"{name} high")
