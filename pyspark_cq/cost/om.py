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

from .. import _args as chk
from .. import plan as P
from . import rate as _rate

__all__ = [
    "utility", "selection_output_rate", "projection_output_rate", "aggregate_output_rate", "join_output_rate",
    "input_buffer", "intermediate_queue", "OperatorCost", "PlanCost", "cost_plan", "plan_utility", "best_plan",
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
