"""OM cost model: output rate C_r, memory C_m and the utility ``w_r/C_r + w_m·C_m``.

Kulkarni & Ravishankar, "OM: A Tunable Framework for Optimizing Continuous Queries over Data Streams".
A query Q[W] runs in rounds over windows of W time units (§3.1). Each operator has a selectivity, a
tuple processing rate tpr (tuples per time unit) and an input arrival rate λ (§3). §4.1 gives each
operator's output rate and memory (input buffering while it processes a window, plus its intermediate
output queue); a plan's output rate C_r is its root's, its memory C_m the sum over its operators, and its
cost the utility of §3.2. Operators are labelled o_1 … o_k breadth first from the root (§4.1).

Plan nodes supply: ``Select.cost`` and ``Project.cost`` = 1/tpr (0: the operator keeps up with any
rate), ``Aggregate.cost`` = C_Ω (time to aggregate one tuple), ``Join.left_cost`` / ``right_cost`` =
C_L⋈ / C_R⋈ (time to join one tuple with the left / right window). Window and granularity nodes are
not OM operators (the window is the query's W) and are passed through; union adds rates (an extension).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _args as chk
from .. import plan as P
from ..estimators import DecayedMean
from . import rate as _rate

__all__ = [
    "utility", "selection_output_rate", "projection_output_rate", "aggregate_output_rate", "join_output_rate",
    "input_buffer", "intermediate_queue", "OperatorCost", "PlanCost", "cost_plan", "plan_utility", "best_plan",
    "chain_plan", "left_deep_join_plan", "mjoin_plan_cost", "Dimension", "Chart", "sel_lambda_chart",
    "lambda_lambda_chart", "Schedule", "optimal_plans", "schedule", "score_plans",
]


def utility(output_rate: float, memory: float, w_r: float, w_m: float) -> float:
    """The weighted query cost ``Cost(C_r, C_m) = w_r·(1/C_r) + w_m·C_m`` (Kulkarni & Ravishankar, §3.2).

    Lower is better: the optimizer picks the plan of minimum cost. §3.2's example: C_r = 5.0, C_m = 775
    and C_r = 2.5, C_m = 575 cost 697.52 and 517.54 with (w_r, w_m) = (0.1, 0.9), 5550 and 9150 with
    (20000, 2).

    Examples
    --------
    §3.2's example: plan 1 (C_r = 5.0, C_m = 775) and plan 2 (C_r = 2.5, C_m = 575) cost
    ``0.1/5 + 0.9·775 = 697.52`` and ``0.1/2.5 + 0.9·575 = 517.54`` with (w_r, w_m) = (0.1, 0.9), so plan 2
    is chosen, and ``4000 + 1550 = 5550`` and ``8000 + 1150 = 9150`` with (20000, 2), so plan 1 is.

    >>> from pyspark_cq.cost.om import utility
    >>> utility(5.0, 775, 0.1, 0.9), utility(2.5, 575, 0.1, 0.9)
    (697.52, 517.54)
    >>> utility(5.0, 775, 20000, 2), utility(2.5, 575, 20000, 2)
    (5550.0, 9150.0)
    """
    c_r = chk.positive(output_rate, "output_rate", allow_inf=True)
    c_m = chk.non_negative(memory, "memory", allow_inf=True)
    w_r, w_m = chk.non_negative(w_r, "w_r"), chk.non_negative(w_m, "w_m")
    return w_r / c_r + w_m * c_m


def _tpr(value, name: str) -> float:
    return chk.positive(value, name, allow_inf=True)


def selection_output_rate(arrival_rate: float, selectivity: float, tpr: float = math.inf) -> float:
    """Output rate of a selection: ``sel × λ`` (Kulkarni & Ravishankar, §4.1), ``sel × tpr`` when λ > tpr.

    The cap at the processing rate is the rate-based model's second regime (Viglas & Naughton §3.2, with
    C_σ = 1/tpr), which OM follows: it is what gives Figure 2's plans the output rates 5.0 and 2.5 of
    §3.2's example (see docs/cost-model.md).

    Examples
    --------
    The operators of §1.2's example (Figure 2): o_1 with selectivity 0.5 and tpr 500, o_2 with 0.1 and 50.
    At λ = 100 o_1 keeps up, ``0.5·100 = 50``; o_2 handles only 50 of the 100 tuples arriving per time
    unit and emits ``0.1·50 = 5``.

    >>> from pyspark_cq.cost.om import selection_output_rate
    >>> selection_output_rate(100, 0.5, tpr=500)
    50.0
    >>> selection_output_rate(100, 0.1, tpr=50)
    5.0
    """
    tpr = _tpr(tpr, "tpr")
    return _rate.selection_output_rate(arrival_rate, selectivity, 1.0 / tpr)


def projection_output_rate(arrival_rate: float, tpr: float = math.inf) -> float:
    """Output rate of a projection: ``λ`` (Kulkarni & Ravishankar, §4.1), capped at tpr as for σ."""
    return selection_output_rate(arrival_rate, 1.0, tpr)


def aggregate_output_rate(arrival_rate: float, window: float, cost: float) -> float:
    """Output rate of an aggregate: ``1/(C_Ω × λ × W)`` (Kulkarni & Ravishankar, §4.1).

    One result per window of ``λ·W`` tuples, each taking C_Ω to aggregate.

    Examples
    --------
    λ = 10 tuples per time unit, W = 5 and C_Ω = 0.01: ``1/(0.01·10·5) = 2``.

    >>> from pyspark_cq.cost.om import aggregate_output_rate
    >>> aggregate_output_rate(10, 5, 0.01)
    2.0
    """
    lam = chk.positive(arrival_rate, "arrival_rate")
    w = chk.positive(window, "window")
    c = chk.positive(cost, "cost")
    return 1.0 / (c * lam * w)


def join_output_rate(left_rate: float, right_rate: float, selectivity: float, window: float,
                     left_cost: float, right_cost: float) -> float:
    """Output rate of a window join (Kulkarni & Ravishankar, §4.1).

    ``sel × λ_L × λ_R × W / (C_L⋈ × λ_L + C_R⋈ × λ_R)``: Viglas & Naughton's Equation 2 at t = W,
    without its floor of 1 on the denominator.

    Examples
    --------
    sel = 0.5, λ_L = 2, λ_R = 4, W = 10, C_L⋈ = 0.5 and C_R⋈ = 0.25:
    ``0.5·2·4·10/(0.5·2 + 0.25·4) = 40/2 = 20``. Unlike Equation 2 a denominator below 1 is kept:
    ``40/(0.1·2 + 0.1·4) = 66.67``.

    >>> from pyspark_cq.cost.om import join_output_rate
    >>> join_output_rate(2, 4, 0.5, 10, 0.5, 0.25)
    20.0
    >>> round(join_output_rate(2, 4, 0.5, 10, 0.1, 0.1), 2)
    66.67
    """
    w = chk.positive(window, "window")
    return _rate.join_output_rate(left_rate, right_rate, selectivity, left_cost, right_cost, w, saturate=False)


def input_buffer(arrival_rate: float, window: float, tpr: float) -> float:
    """Tuples buffered at an operator's input while it processes a window: ``c_inp = λ × (λ × W / tpr)``.

    Kulkarni & Ravishankar, §4.1: processing the window's ``λ·W`` tuples takes ``λ·W/tpr``, during which
    λ tuples arrive per time unit.

    Examples
    --------
    λ = 100, W = 2 and tpr = 500: the window's 200 tuples take 0.4 time units, during which
    ``100·0.4 = 40`` tuples arrive.

    >>> from pyspark_cq.cost.om import input_buffer
    >>> input_buffer(100, 2, 500)
    40.0
    """
    lam = chk.non_negative(arrival_rate, "arrival_rate")
    w = chk.non_negative(window, "window")
    return lam * (lam * w / _tpr(tpr, "tpr"))


def intermediate_queue(output_rate: float, window: float) -> float:
    """Tuples in an operator's output queue: ``c_int = c_r × W`` (Kulkarni & Ravishankar, §4.1)."""
    return chk.non_negative(output_rate, "output_rate") * chk.non_negative(window, "window")


@dataclass(frozen=True)
class OperatorCost:
    """One operator's estimate: OM label, arrival rate λ, output rate c_r and memory c_m = c_inp + c_int."""

    label: str
    node: P.Node
    arrival_rate: float
    output_rate: float
    input_buffer: float
    intermediate_queue: float

    @property
    def memory(self) -> float:
        """``c_m = c_inp + c_int`` (§4.1)."""
        return self.input_buffer + self.intermediate_queue


@dataclass(frozen=True)
class PlanCost:
    """A plan's C_r (output rate of o_1, the root) and C_m (sum of the operators' memory), §4.1."""

    operators: tuple[OperatorCost, ...]  # o_1 … o_k, breadth first from the root

    @property
    def output_rate(self) -> float:
        """C_r = c_r[o_1]."""
        return self.operators[0].output_rate

    @property
    def memory(self) -> float:
        """C_m = Σ c_m[o_i]."""
        return sum(o.memory for o in self.operators)

    def utility(self, w_r: float, w_m: float) -> float:
        """:func:`utility` of this plan."""
        return utility(self.output_rate, self.memory, w_r, w_m)


def _operator(node: P.Node, ins: list[float], window: float) -> tuple[float, float, float]:
    """(arrival rate, output rate, input buffer) of one operator from its inputs' rates."""
    if isinstance(node, P.Select):
        tpr = 1.0 / node.cost if node.cost else math.inf
        return ins[0], selection_output_rate(ins[0], node.selectivity, tpr), input_buffer(ins[0], window, tpr)
    if isinstance(node, P.Project):
        tpr = 1.0 / node.cost if node.cost else math.inf
        return ins[0], projection_output_rate(ins[0], tpr), input_buffer(ins[0], window, tpr)
    if isinstance(node, P.Aggregate):
        if node.cost <= 0 or ins[0] <= 0:
            raise ValueError(f"OM's aggregate output rate 1/(C_Ω·λ·W) needs cost C_Ω > 0 and an input rate > 0; "
                             f"node {P.render(node)} has cost {node.cost} and input rate {ins[0]}")
        return ins[0], aggregate_output_rate(ins[0], window, node.cost), input_buffer(ins[0], window, 1.0 / node.cost)
    if isinstance(node, P.Join):
        lam_l, lam_r = ins
        busy = lam_l * node.left_cost + lam_r * node.right_cost
        if busy <= 0:
            raise ValueError(f"OM's join output rate needs left_cost/right_cost (C_L⋈, C_R⋈) > 0; node "
                             f"{P.render(node)} has {node.left_cost} and {node.right_cost}")
        out = join_output_rate(lam_l, lam_r, node.selectivity, window, node.left_cost, node.right_cost)
        arrivals = lam_l + lam_r
        # both inputs arrive during the time W·(λ_L·C_L⋈ + λ_R·C_R⋈) the join spends on a window
        return arrivals, out, input_buffer(arrivals, window, arrivals / busy)
    if isinstance(node, P.Union):
        tpr = 1.0 / node.cost if node.cost else math.inf
        return sum(ins), sum(ins), input_buffer(sum(ins), window, tpr)
    raise ValueError(f"the OM model covers σ, π, ⋈, aggregation (and ∪); plan contains {type(node).__name__}")


def cost_plan(plan: P.Node, rates: Mapping[str, float], window: float) -> PlanCost:
    """C_r and C_m of a plan (Kulkarni & Ravishankar, §4.1).

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The plan; node costs as described in the module docstring.
    rates : mapping str -> float
        Arrival rate λ of each source stream (e.g. from :class:`pyspark_cq.estimators.DecayedMean`).
    window : float
        W, the window of the query Q[W].

    Examples
    --------
    Figure 2's plan 1 (o_1 below o_2, §1.2) at λ = 100 and W = 2. OM labels the root o1, so the operator
    the paper calls o_2 comes first. The bottom selection buffers ``100·(100·2/500) = 40`` tuples and
    queues ``50·2 = 100``; the top one buffers ``50·(50·2/50) = 100`` and queues ``5·2 = 10``: C_r = 5.0,
    the paper's value, and C_m = 250. Plan 2 (o_2 below o_1) reaches the paper's C_r = 2.5.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.om import cost_plan
    >>> s = P.Source("S")
    >>> plan_1 = P.Select(P.Select(s, 0.5, cost=1 / 500, label="o1"), 0.1, cost=1 / 50, label="o2")
    >>> cost = cost_plan(plan_1, {"S": 100}, 2.0)
    >>> [(op.label, op.node.label, op.input_buffer, op.intermediate_queue) for op in cost.operators]
    [('o1', 'o2', 100.0, 10.0), ('o2', 'o1', 40.0, 100.0)]
    >>> cost.output_rate, cost.memory
    (5.0, 250.0)
    >>> plan_2 = P.Select(P.Select(s, 0.1, cost=1 / 50, label="o2"), 0.5, cost=1 / 500, label="o1")
    >>> cost_plan(plan_2, {"S": 100}, 2.0).output_rate
    2.5
    """
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    rates = chk.instance(rates, "rates", Mapping, "a mapping {stream name: arrival rate}")
    window = chk.positive(window, "window")
    out: dict[int, float] = {}
    found: dict[int, tuple[float, float, float]] = {}
    for node in P.postorder(plan):
        ins = [out[id(c)] for c in node.children]
        if isinstance(node, P.Source):
            if node.name not in rates:
                raise ValueError(f"rates has no rate for stream {node.name!r}; given: {sorted(rates)}")
            out[id(node)] = chk.non_negative(rates[node.name], f"rates[{node.name!r}]")
        elif isinstance(node, (P.Window, P.Granularity)):
            out[id(node)] = ins[0]
        else:
            found[id(node)] = _operator(node, ins, window)
            out[id(node)] = found[id(node)][1]
    ops = [n for n in P.breadth_first(plan) if id(n) in found]
    if not ops:
        raise ValueError("plan must contain at least one OM operator (σ, π, ⋈, aggregation)")
    return PlanCost(tuple(
        OperatorCost(label=f"o{i}", node=n, arrival_rate=found[id(n)][0], output_rate=found[id(n)][1],
                     input_buffer=found[id(n)][2], intermediate_queue=intermediate_queue(found[id(n)][1], window))
        for i, n in enumerate(ops, start=1)))


def plan_utility(plan: P.Node, rates: Mapping[str, float], window: float, w_r: float, w_m: float) -> float:
    """``Cost_p`` of a plan: :func:`utility` of its C_r and C_m (§3.2, §4.1)."""
    return cost_plan(plan, rates, window).utility(w_r, w_m)


def best_plan(plans: Sequence[P.Node], rates: Mapping[str, float], window: float, w_r: float,
              w_m: float) -> tuple[P.Node, float]:
    """The candidate plan of minimum ``Cost_p`` and that cost (the problem statement of §3.3)."""
    return P.best_plan(plans, lambda p: plan_utility(p, rates, window, w_r, w_m))


# ---------------------------------------------------------------------------------------------
# candidate plans of the plan-switchable operators, costed by §4.1


def chain_plan(order: Sequence[str], selectivities: Mapping[str, float], costs: Mapping[str, float],
               stream: str = "S") -> P.Node:
    """The OM plan of a ``select_chain`` evaluating predicates in ``order``: selections stacked bottom-up.

    ``costs`` are seconds per row (1/tpr, §3: "the operator tuple processing rate"), as measured by the
    operator (``nanos_p / rows_in_p``); a missing or zero cost is a selection that keeps up with any rate.

    Examples
    --------
    >>> from pyspark_cq.cost.om import chain_plan, cost_plan
    >>> plan = chain_plan(["a", "b"], {"a": 0.5, "b": 0.1}, {"a": 1 / 500, "b": 1 / 50})
    >>> cost_plan(plan, {"S": 100}, 2.0).output_rate          # Figure 2's plan 1
    5.0
    """
    if isinstance(order, str) or not isinstance(order, Sequence) or not order:
        raise TypeError(f"order must be a non-empty sequence of predicate names, got {order!r}")
    chk.instance(selectivities, "selectivities", Mapping, "a mapping {predicate: selectivity}")
    chk.instance(costs, "costs", Mapping, "a mapping {predicate: seconds per row}")
    node: P.Node = P.Source(stream)
    for name in order:
        if name not in selectivities:
            raise ValueError(f"selectivities has no value for predicate {name!r}; given: {sorted(selectivities)}")
        sel = chk.probability(selectivities[name], f"selectivities[{name!r}]")
        cost = chk.non_negative(costs.get(name, 0.0), f"costs[{name!r}]")
        node = P.Select(node, sel, cost=cost, label=name)
    return node


def left_deep_join_plan(order: Sequence[int], pair_selectivity: Mapping[frozenset, float], join_cost: float,
                        streams: Sequence[str] | None = None) -> P.Node:
    """The OM left-deep plan ``((s_a ⋈ s_b) ⋈ s_c) …`` of a multi-way join (§4.2 step 3).

    Each 2-way join's selectivity (a fraction of the cross product, §4.1) is that of the pair it adds:
    joining s_c to the result of the earlier streams takes the mean of c's measured pair selectivities with
    them (an equi-join on one key matches a partial result when c matches any of its rows' keys). Both
    sides cost ``join_cost`` seconds per tuple (C_L⋈ = C_R⋈; 1/``join_cost`` is the join's tpr, §5.1).

    Parameters
    ----------
    order : sequence of int
        The left-deep order of the inputs (e.g. from :func:`pyspark_cq.policies.plan_stats.left_deep_orders`).
    pair_selectivity : mapping frozenset({i, j}) -> float
        Join selectivity of each pair of inputs; every input after the first must have one with an
        earlier input.
    join_cost : float
        Seconds per tuple joined, > 0.
    streams : sequence of str, optional
        Source names per input (default ``"s0"``, ``"s1"``, …).
    """
    if isinstance(order, str) or not isinstance(order, Sequence) or len(order) < 2:
        raise TypeError(f"order must be a sequence of at least 2 input indexes, got {order!r}")
    n = len(order)
    if sorted(order) != list(range(n)):
        raise ValueError(f"order must be a permutation of 0..{n - 1}, got {list(order)}")
    chk.instance(pair_selectivity, "pair_selectivity", Mapping, "a mapping {frozenset({i, j}): selectivity}")
    cost = chk.positive(join_cost, "join_cost")
    names = [f"s{i}" for i in range(n)] if streams is None else list(streams)
    if len(names) != n:
        raise ValueError(f"streams must name {n} inputs, got {names}")
    node: P.Node = P.Source(names[order[0]])
    for m in range(1, n):
        c = order[m]
        sels = [pair_selectivity[frozenset((c, e))] for e in order[:m] if frozenset((c, e)) in pair_selectivity]
        if not sels:
            raise ValueError(f"pair_selectivity has no selectivity between input {c} and any of {list(order[:m])} "
                             f"(keys: {sorted(tuple(sorted(k)) for k in pair_selectivity)})")
        sel = chk.probability(sum(sels) / len(sels), f"pair selectivity of input {c}")
        node = P.Join(node, P.Source(names[c]), selectivity=sel, left_cost=cost, right_cost=cost,
                      label=f"J{m}")
    return node


def mjoin_plan_cost(probe_orders: Sequence[Sequence[int]], rates: Sequence[float],
                    pair_selectivity: Mapping[frozenset, float], window: float, probe_cost: float,
                    state_rows: Sequence[float] | None = None) -> PlanCost:
    """C_r and C_m of a ``multi_join`` run in ``probe_orders`` (Kulkarni & Ravishankar §4.1, applied to an MJoin).

    OM costs a plan as a tree of operators; our ``multi_join`` runs a plan as per-input probe orders over one
    state per input, so a left-deep *tree*'s cost (:func:`left_deep_join_plan`) misses work the operator
    does: in the order ``(a, b, c)`` a row of ``c`` probes ``a``'s whole state first, where a tree would
    probe the small ``a ⋈ b`` result. Here every probe step ``i → j`` is one §4.1 operator. The partial
    matches of input i entering it arrive at rate ``a``; the operator scans j's rows of the key for each
    (the kernel walks the key's chain), so its tuple processing rate is ``tpr = 1/(probe_cost·|S_j|)``;
    each partial meets ``F = λ_j·W·f(j | B)`` matches (B: the inputs bound so far), so the step emits
    ``min(a, tpr)·F`` (a selection's two regimes), buffers ``input_buffer(a, W, tpr)`` and queues ``out·W``.
    C_m is the sum over the steps; C_r the sum of every input's last step (the root, o_1, is their union).
    ``f(j | B)`` is the most selective pair between j and a bound input: all inputs of a ``multi_join``
    share one key, so a product of pair selectivities would count the key predicate once per bound input.

    Parameters
    ----------
    probe_orders : sequence of sequences of int
        Per input i, the other inputs in the order i probes them (:func:`pyspark_cq.control.parse_join_plan`).
    rates : sequence of float
        Arrival rate λ_i (>= 0) per input.
    pair_selectivity : mapping frozenset({i, j}) -> float
        Join selectivity in [0, 1] of every pair, a fraction of the pair's cross product.
    window : float
        W (> 0).
    probe_cost : float
        Seconds one partial match takes per row of the probed state (> 0; the key's share of the state
        is folded in: it is the same for every input).
    state_rows : sequence of float, optional
        |S_j| per input (>= 0); default ``λ_j·W``, the window's rows (the steady state of Q[W]).

    Examples
    --------
    Three inputs at 10, 100 and 10 rows/s, pair (0, 2) 10 times as selective as the others: the order
    ``(0, 2, 1)`` (0 and 2 probe each other first) keeps fewer partial matches than ``(0, 1, 2)``.

    >>> from pyspark_cq.cost.om import mjoin_plan_cost
    >>> pairs = {frozenset({0, 1}): 0.1, frozenset({0, 2}): 0.01, frozenset({1, 2}): 0.1}
    >>> a = mjoin_plan_cost(((1, 2), (0, 2), (0, 1)), (10, 100, 10), pairs, 1.0, 1e-6)
    >>> b = mjoin_plan_cost(((2, 1), (0, 2), (0, 1)), (10, 100, 10), pairs, 1.0, 1e-6)
    >>> round(a.memory, 3), round(b.memory, 3), a.output_rate == b.output_rate
    (231.311, 132.202, True)
    """
    n = len(rates) if isinstance(rates, Sequence) and not isinstance(rates, str) else 0
    if not 2 <= n <= 6:
        raise TypeError(f"rates must be a sequence of 2 to 6 arrival rates, one per input, got {rates!r}")
    lam = [chk.non_negative(r, f"rates[{i}]") for i, r in enumerate(rates)]
    if isinstance(probe_orders, str) or not isinstance(probe_orders, Sequence) or len(probe_orders) != n:
        raise TypeError(f"probe_orders must hold one probe order per input ({n}), got {probe_orders!r}")
    for i, order in enumerate(probe_orders):
        others = [j for j in range(n) if j != i]
        if isinstance(order, str) or not isinstance(order, Sequence) or sorted(order) != others:
            raise ValueError(f"probe_orders[{i}] must order the other inputs {others}, got {order!r}")
    chk.instance(pair_selectivity, "pair_selectivity", Mapping, "a mapping {frozenset({i, j}): selectivity}")
    pairs = {}
    for i in range(n):
        for j in range(i + 1, n):
            key = frozenset((i, j))
            if key not in pair_selectivity:
                raise ValueError(f"pair_selectivity has no selectivity for inputs {i} and {j}")
            pairs[key] = chk.probability(pair_selectivity[key], f"pair_selectivity[{{{i}, {j}}}]")
    w = chk.positive(window, "window")
    cost = chk.positive(probe_cost, "probe_cost")
    if state_rows is None:
        states = [x * w for x in lam]
    else:
        if isinstance(state_rows, str) or not isinstance(state_rows, Sequence) or len(state_rows) != n:
            raise TypeError(f"state_rows must hold one state size per input ({n}), got {state_rows!r}")
        states = [chk.non_negative(x, f"state_rows[{j}]") for j, x in enumerate(state_rows)]
    steps, total = [], 0.0
    for i, order in enumerate(probe_orders):
        a, bound = lam[i], [i]
        for j in order:
            tpr = 1.0 / (cost * max(states[j], 1.0))
            out = min(a, tpr) * lam[j] * w * min(pairs[frozenset((b, j))] for b in bound)
            steps.append(OperatorCost(label=f"{i}>{j}", node=P.Source(f"s{i}>s{j}"), arrival_rate=a,
                                      output_rate=out, input_buffer=input_buffer(a, w, tpr),
                                      intermediate_queue=intermediate_queue(out, w)))
            a = out
            bound.append(j)
        total += a
    root = OperatorCost(label="o1", node=P.Source("mjoin"), arrival_rate=sum(lam), output_rate=total,
                        input_buffer=0.0, intermediate_queue=0.0)
    return PlanCost((root, *steps))


# ---------------------------------------------------------------------------------------------
# charts (§4.4) and the scheduler (§4.5)


@dataclass(frozen=True)
class Dimension:
    """One axis of a chart: a statistic (``"sel"``, ``"rate"``, ``"rate:1"`` …) over ``[low, high]``."""

    name: str
    low: float
    high: float

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a chart dimension needs a name (str), got {self.name!r}")
        low = chk.real(self.low, f"range of {self.name!r}: low")
        high = chk.real(self.high, f"range of {self.name!r}: high")
        if not low < high:
            raise ValueError(f"range of {self.name!r} must be a non-empty [low, high] with low < high, "
                             f"got [{low}, {high}]")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)


def _dimensions(dims) -> tuple[Dimension, ...]:
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not dims:
        raise TypeError(f"dims must be a non-empty sequence of (name, low, high), got {dims!r}")
    out = []
    for d in dims:
        if isinstance(d, Dimension):
            out.append(d)
        elif isinstance(d, Sequence) and not isinstance(d, str) and len(d) == 3:
            out.append(Dimension(*d))
        else:
            raise TypeError(f"dims entries must be (name, low, high), got {d!r}")
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise ValueError(f"dims names a dimension twice: {names}")
    return tuple(out)


class Chart:
    """A chart of OM §4.4: each dimension cut into k regular partitions, one optimal plan per region.

    Algorithm 1 (Kulkarni & Ravishankar, §4.4.1): region G(i, j, …) is the box between the (i−1)-th and i-th
    partitions of each dimension; the plan indexed there is the candidate of minimum ``Cost_p`` at the
    region's centroid C(i, j, …). The sel-λ chart (:func:`sel_lambda_chart`) has the dimensions (sel, λ), the
    λ-λ chart of an l-way join (:func:`lambda_lambda_chart`) one λ per stream (§4.4.2): k^l regions.

    :meth:`lookup` finds the plan of a point in O(1): one multiply-and-truncate per dimension and one list
    index. A point outside a range belongs to the edge region.

    Parameters
    ----------
    dims : sequence of (name, low, high) or Dimension
        The axes and their ranges (low < high).
    k : int
        Partitions per dimension, >= 1.
    plans : sequence
        The candidate plans P (any hashable labels, e.g. plan ids), at least one, no repeats.
    cost : callable(plan, point) -> float
        ``Cost_p`` of a plan at a point (a dict {dimension name: value}).

    Examples
    --------
    A hand-checked 2 × 2 chart: Cost("x") = sel·λ and Cost("y") = 10 over sel in [0, 1], λ in [0, 40]. The
    centroids are sel ∈ {0.25, 0.75} and λ ∈ {10, 30}: "x" costs 2.5, 7.5, 7.5 and 22.5 there, so "y" wins
    only in the region of centroid (0.75, 30).

    >>> from pyspark_cq.cost.om import Chart
    >>> chart = Chart([("sel", 0, 1), ("rate", 0, 40)], 2, ["x", "y"],
    ...               lambda p, c: c["sel"] * c["rate"] if p == "x" else 10.0)
    >>> chart.table.tolist()
    [[0, 0], [0, 1]]
    >>> chart.lookup(0.9, 35), chart.lookup(0.9, 5), chart.region(0.9, 35), chart.centroid((1, 1))
    ('y', 'x', (1, 1), {'sel': 0.75, 'rate': 30.0})
    """

    def __init__(self, dims, k: int, plans: Sequence, cost):
        self.dims = _dimensions(dims)
        self.k = chk.integer(k, "k", minimum=1)
        if isinstance(plans, (str, bytes)) or not isinstance(plans, Sequence) or not plans:
            raise ValueError(f"plans must be a non-empty sequence of candidate plans, got {plans!r}")
        if len(set(plans)) != len(plans):
            raise ValueError(f"plans lists a plan twice: {list(plans)}")
        self.plans = tuple(plans)
        chk.callable_(cost, "cost")
        shape = (self.k,) * len(self.dims)
        table = np.zeros(shape, dtype=np.int32)
        self.costs = np.zeros(shape + (len(self.plans),))
        for region in np.ndindex(*shape):                        # Algorithm 1, lines 3–7
            point = self.centroid(region)
            costs = [float(cost(p, point)) for p in self.plans]
            self.costs[region] = costs
            table[region] = int(np.argmin(costs))
        self.table = table
        # lookup state: plain Python numbers, the fastest to index from Python
        self._low = tuple(d.low for d in self.dims)
        self._scale = tuple(self.k / (d.high - d.low) for d in self.dims)
        self._flat = [self.plans[i] for i in table.ravel().tolist()]
        self._top = self.k - 1
        self._compile()

    @property
    def names(self) -> tuple[str, ...]:
        """The dimensions' names."""
        return tuple(d.name for d in self.dims)

    def centroid(self, region: Sequence[int]) -> dict:
        """C(i, j, …): the centre of region ``region`` (0-based indexes), as {dimension: value}."""
        if len(region) != len(self.dims):
            raise ValueError(f"region must have {len(self.dims)} indexes, got {region!r}")
        out = {}
        for d, i in zip(self.dims, region):
            i = chk.integer(int(i), "region index", minimum=0)
            if i >= self.k:
                raise ValueError(f"region index {i} of {d.name!r} must be < k = {self.k}")
            out[d.name] = d.low + (i + 0.5) * (d.high - d.low) / self.k
        return out

    def region(self, *point: float) -> tuple[int, ...]:
        """The 0-based region G bounding ``point`` (Algorithm 2, line 1); outside points go to the edge."""
        if len(point) != len(self.dims):
            raise ValueError(f"point must give {len(self.dims)} values {self.names}, got {point!r}")
        top = self._top
        out = []
        for x, lo, s in zip(point, self._low, self._scale):
            i = int((x - lo) * s) if x > lo else 0
            out.append(i if i < top else top)
        return tuple(out)

    def lookup(self, *point: float):
        """The plan p(i, j, …) indexed at the region bounding ``point`` (Algorithm 2, lines 1–3), in O(1).

        Replaced per instance by a function unrolled over the chart's dimensions (:func:`_compile_lookup`):
        one multiply-and-truncate per dimension and one list index, no loop.
        """
        return self._flat[_flat_index(self.region(*point), self.k)]

    def _compile(self) -> None:
        self.lookup = _compile_lookup(self._low, self._scale, self.k, self._flat)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("lookup", None)       # a generated function: rebuilt on unpickling
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._compile()

    def __repr__(self) -> str:
        dims = ", ".join(f"{d.name}∈[{d.low:g}, {d.high:g}]" for d in self.dims)
        return f"Chart({dims}, k={self.k}, {len(self.plans)} plans)"


def _flat_index(region: Sequence[int], k: int) -> int:
    flat = 0
    for i in region:
        flat = flat * k + i
    return flat


def _compile_lookup(low: tuple, scale: tuple, k: int, flat: list):
    """``lookup(x_1, …, x_l)`` for one chart, unrolled: region index per dimension clamped to [0, k−1],
    then the row-major index into ``flat``. Generated code, because a loop over the dimensions costs more
    than the lookup itself (goal: ≤ 1 µs, asv_benchmarks/benchmarks/bench_om.py).
    """
    args = [f"x{m}" for m in range(len(low))]
    lines = [f"def lookup({', '.join(args)}):"]
    terms = []
    for m, x in enumerate(args):
        lines.append(f"    i{m} = int(({x} - {low[m]!r}) * {scale[m]!r}) if {x} > {low[m]!r} else 0")
        lines.append(f"    if i{m} > {k - 1}: i{m} = {k - 1}")
        terms.append(f"i{m}" + "".join(f" * {k}" for _ in range(len(low) - 1 - m)))
    lines.append(f"    return flat[{' + '.join(terms)}]")
    namespace = {"flat": flat, "int": int}
    exec("\n".join(lines), namespace)  # noqa: S102 - code built from numbers of this chart only
    return namespace["lookup"]


def sel_lambda_chart(sel_range: tuple[float, float], rate_range: tuple[float, float], k: int, plans: Sequence,
                     cost) -> Chart:
    """The sel-λ chart of one stream (Kulkarni & Ravishankar, §4.4.1, Algorithm 1): k × k regions over
    ``sel_range`` × ``rate_range``; ``cost(plan, {"sel": …, "rate": …})``.
    """
    for name, rng in (("sel_range", sel_range), ("rate_range", rate_range)):
        if not isinstance(rng, Sequence) or len(rng) != 2:
            raise TypeError(f"{name} must be a (low, high) pair, got {rng!r}")
    lo, hi = chk.real(sel_range[0], "sel_range low"), chk.real(sel_range[1], "sel_range high")
    if lo < 0 or hi > 1:
        raise ValueError(f"sel_range must lie within [0, 1], got [{lo}, {hi}]")
    if chk.real(rate_range[0], "rate_range low") < 0:
        raise ValueError(f"rate_range must be rates >= 0, got {tuple(rate_range)}")
    return Chart([("sel", lo, hi), ("rate", *rate_range)], k, plans, cost)


def lambda_lambda_chart(rate_ranges: Mapping[str, tuple[float, float]], k: int, plans: Sequence, cost) -> Chart:
    """The λ-λ chart of an l-way join (Kulkarni & Ravishankar, §4.4.2): one dimension per stream's arrival
    rate, k^l regions; selectivities are held constant within the chart. ``cost(plan, {stream: λ, …})``.
    """
    chk.instance(rate_ranges, "rate_ranges", Mapping, "a mapping {stream: (low, high)}")
    if not rate_ranges:
        raise ValueError("rate_ranges must give at least one stream's range")
    dims = []
    for name, rng in rate_ranges.items():
        if not isinstance(rng, Sequence) or len(rng) != 2:
            raise TypeError(f"rate_ranges[{name!r}] must be a (low, high) pair, got {rng!r}")
        if chk.real(rng[0], f"rate_ranges[{name!r}] low") < 0:
            raise ValueError(f"rate_ranges[{name!r}] must be rates >= 0, got {tuple(rng)}")
        dims.append((name, *rng))
    return Chart(dims, k, plans, cost)


@dataclass(frozen=True)
class Schedule:
    """What Algorithm 2 did over a run (Kulkarni & Ravishankar, §4.5, §5.1), one entry per scored round.

    ``plans[r]`` ran in round r, ``optimal[r]`` is the plan of minimum cost at the values observed in that
    round (the offline procedure of §5.1), ``regions[r]`` the chart region of the estimate it was chosen by
    (None for a schedule without a chart).
    """

    plans: tuple
    optimal: tuple
    hits: tuple[bool, ...]
    regions: tuple

    @property
    def rounds(self) -> int:
        """Scored rounds."""
        return len(self.plans)

    @property
    def moves(self) -> int:
        """Rounds whose estimate lies in another region than the previous round's (§5.1)."""
        return sum(1 for a, b in zip(self.regions, self.regions[1:]) if a is not None and a != b)

    @property
    def switches(self) -> int:
        """Rounds that ran another plan than the previous round (§5.1)."""
        return sum(1 for a, b in zip(self.plans, self.plans[1:]) if a != b)

    @property
    def fidelity(self) -> float:
        """The fraction of hits: rounds whose plan is the optimal one (§5.1); nan without rounds."""
        return sum(self.hits) / len(self.hits) if self.hits else math.nan

    def fidelity_over(self, span: int) -> list[float]:
        """Fidelity per consecutive block of ``span`` rounds (Figure 3(a) averages per 100 s)."""
        span = chk.integer(span, "span", minimum=1)
        return [sum(self.hits[i:i + span]) / len(self.hits[i:i + span]) for i in range(0, len(self.hits), span)]


def optimal_plans(plans: Sequence, cost, observed: Sequence[Mapping[str, float]]) -> list[list]:
    """Per observed point, the plans of minimum ``cost(plan, point)`` (all of them on ties, within 1e-12 relative)."""
    out = []
    for point in observed:
        costs = [float(cost(p, point)) for p in plans]
        best = min(costs)
        out.append([p for p, c in zip(plans, costs) if c <= best + 1e-12 * abs(best)])
    return out


def _score(chosen: Sequence, best: Sequence[list], regions: Sequence) -> Schedule:
    return Schedule(tuple(chosen), tuple(b[0] if p not in b else p for p, b in zip(chosen, best)),
                    tuple(p in b for p, b in zip(chosen, best)), tuple(regions))


def _observations(observed, names) -> list[dict]:
    if isinstance(observed, (str, bytes)) or not isinstance(observed, Sequence) or len(observed) < 2:
        raise ValueError(f"observed must be a sequence of at least 2 rounds' observations, got {observed!r}")
    out = []
    for r, point in enumerate(observed):
        if not isinstance(point, Mapping) or any(n not in point for n in names):
            raise ValueError(f"observed[{r}] must be a mapping with the values {list(names)}, got {point!r}")
        out.append({n: chk.real(point[n], f"observed[{r}][{n!r}]") for n in names})
    return out


def schedule(chart: Chart, observed: Sequence[Mapping[str, float]], cost, *, d: int = 5,
             decay: float = 0.5) -> Schedule:
    """Algorithm 2 (Kulkarni & Ravishankar, §4.5) over the observations of a run.

    Round r (from 1) runs the plan the chart indexes at the estimate of round r: the decay-weighted mean of
    the last ``d`` observations (rounds r−d … r−1, §4.3, :class:`pyspark_cq.estimators.DecayedMean`);
    round 0 only observes. The round is a hit when that plan is optimal for round r's own observation.

    Parameters
    ----------
    chart : Chart
        The sel-λ or λ-λ chart.
    observed : sequence of mapping
        Per round, the observed value of each of the chart's dimensions.
    cost : callable(plan, point) -> float
        The cost the chart was built with (for the optimal plan of each round).
    d, decay : int, float
        The estimator's window and decay rate a.

    Examples
    --------
    The 2 × 2 chart of :class:`Chart`: three rounds of low selectivity, then high ones. With d = 1 the
    estimate is the previous observation, so the round after the change misses, then the plan switches.

    >>> from pyspark_cq.cost.om import Chart, schedule
    >>> cost = lambda p, c: c["sel"] * c["rate"] if p == "x" else 10.0
    >>> chart = Chart([("sel", 0, 1), ("rate", 0, 40)], 2, ["x", "y"], cost)
    >>> obs = [{"sel": s, "rate": 35} for s in (0.1, 0.1, 0.1, 0.9, 0.9, 0.9)]
    >>> run = schedule(chart, obs, cost, d=1)
    >>> run.plans, run.hits
    (('x', 'x', 'x', 'y', 'y'), (True, True, False, True, True))
    >>> run.moves, run.switches, run.fidelity
    (1, 1, 0.8)
    """
    chk.instance(chart, "chart", Chart, "a Chart (sel_lambda_chart / lambda_lambda_chart)")
    names = chart.names
    obs = _observations(observed, names)
    ests = {n: DecayedMean(chk.integer(d, "d", minimum=1), chk.non_negative(decay, "decay")) for n in names}
    chosen, regions = [], []
    for r, point in enumerate(obs):
        if r:
            est = tuple(ests[n].value for n in names)              # sel_e^r, λ_e^r
            regions.append(chart.region(*est))
            chosen.append(chart.lookup(*est))                      # lines 1–4
        for n in names:                                            # lines 5–7
            ests[n].update(point[n])
    return _score(chosen, optimal_plans(chart.plans, cost, obs[1:]), regions)


def score_plans(plans_run: Sequence, observed: Sequence[Mapping[str, float]], plans: Sequence, cost) -> Schedule:
    """Score a baseline's plans (one per round, e.g. RAND's or RATE's) against the optimal plan of each
    observed round, as :func:`schedule` scores OM's (no regions: no moves).
    """
    if isinstance(plans_run, (str, bytes)) or not isinstance(plans_run, Sequence):
        raise TypeError(f"plans_run must be a sequence of plans, got {plans_run!r}")
    if len(plans_run) != len(observed):
        raise ValueError(f"plans_run has {len(plans_run)} rounds but observed has {len(observed)}")
    unknown = {p for p in plans_run if p not in plans}
    if unknown:
        raise ValueError(f"plans_run holds plans not among the candidates: {sorted(map(str, unknown))}")
    return _score(list(plans_run), optimal_plans(plans, cost, observed), [None] * len(plans_run))
