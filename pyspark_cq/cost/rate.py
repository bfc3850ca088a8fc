"""Rate-based cost model: output rates of plans over streaming inputs.

Viglas & Naughton, "Rate-Based Query Optimization for Streaming Information Sources" (SIGMOD 2002).
Operators map input rates to output rates (§3): projection and selection in two regimes (the
per-tuple cost below or above the inter-arrival time), the join by Equation 2 (time dependent), with
per-arrival costs of nested loops and symmetric hash join from Table 3 (§3.4). A plan's output rate is
a function of time; the number of outputs by time t_p is its integral, Equation 3 (§4.1). Two
heuristics approximate the integral (§4.2): local rate maximization (evaluate each join at
t = t_p/2) and local time minimization (push the required number of outputs down the plan and take the
slowest part).

Rates are elements per time unit; costs are times per element; t is the time since the query started,
all in one unit. Window and granularity nodes pass rates through (the paper has no windows); union adds
rates (an extension); aggregation is not covered by the paper and is rejected.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .. import _args as chk
from .. import plan as P

__all__ = [
    "JoinCosts", "projection_output_rate", "selection_output_rate", "join_arrival_costs", "join_output_rate",
    "join_outputs_by_time", "outputs_by_time", "time_to_outputs",
    "plan_output_rate", "plan_outputs_by_time", "plan_time_to_outputs",
    "local_rate_estimate", "best_plan_by_rate",
    "output_size", "split_required_outputs", "local_time_estimate", "best_plan_by_time",
    "chain_cost", "chain_output_rate", "best_chain_order", "MultiJoinModel", "plan_work", "tree_probe_orders",
]


@dataclass(frozen=True)
class JoinCosts:
    """The cost variables of Viglas & Naughton's Table 2 (times per operation).

    ``move``: moving an input from the input buffers into memory; ``comp``: an in-memory comparison;
    ``hash``: hashing an object into a hash table; ``probe``: probing a hash table and producing output.
    """

    move: float = 0.0
    comp: float = 0.0
    hash: float = 0.0
    probe: float = 0.0

    def __post_init__(self):
        for name in ("move", "comp", "hash", "probe"):
            object.__setattr__(self, name, chk.non_negative(getattr(self, name), name))


def _unary_output_rate(rate: float, selectivity: float, cost: float) -> float:
    """``f·r`` while ``C <= 1/r``, else ``f/C`` (one output interval per handled input), §3.1–§3.2."""
    return selectivity * rate if cost * rate <= 1.0 else selectivity / cost


def projection_output_rate(input_rate: float, cost: float = 0.0) -> float:
    """Output rate of a projection (Viglas & Naughton, §3.1).

    ``r_o = r_i`` if ``C_π <= 1/r_i``, else ``r_o = 1/C_π`` (the operator cannot keep up).
    """
    return _unary_output_rate(chk.non_negative(input_rate, "input_rate"), 1.0, chk.non_negative(cost, "cost"))


def selection_output_rate(input_rate: float, selectivity: float, cost: float = 0.0) -> float:
    """Output rate of a selection with selectivity f (Viglas & Naughton, §3.2).

    ``r_o = f·r_i`` if ``C_σ <= 1/r_i``, else ``r_o = f/C_σ``.

    Examples
    --------
    100 inputs per time unit and selectivity 0.2: while ``C_σ <= 1/r_i = 0.01`` the output rate is
    ``f·r_i = 20``; with ``C_σ = 0.025`` the selection handles only 40 inputs per time unit and emits
    ``f/C_σ = 8``.

    >>> from pyspark_cq.cost.rate import selection_output_rate
    >>> selection_output_rate(100, 0.2)
    20.0
    >>> selection_output_rate(100, 0.2, cost=0.025)
    8.0
    """
    return _unary_output_rate(chk.non_negative(input_rate, "input_rate"),
                              chk.probability(selectivity, "selectivity"), chk.non_negative(cost, "cost"))


def join_arrival_costs(method: str, left_rate: float, right_rate: float, t: float,
                       costs: JoinCosts = JoinCosts()) -> tuple[float, float]:
    """Cost of handling one left and one right arrival at time t (Viglas & Naughton, §3.4, Table 3).

    - nested loops: ``C_l = move + r_S·t·comp``, ``C_r = move + r_R·t·comp`` (compare with all inputs
      of the other stream read so far)
    - symmetric hash join: ``C_l = C_r = move + hash + probe``

    Examples
    --------
    Table 3 at t = 10 with r_l = 2 and r_r = 4: nested loops compares a left arrival with the
    ``r_r·t = 40`` right inputs read so far, ``C_l = 1 + 40·0.5 = 21``, and a right arrival with the 20 left
    ones, ``C_r = 1 + 20·0.5 = 11``; the symmetric hash join costs ``move + hash + probe`` on both sides.

    >>> from pyspark_cq.cost.rate import JoinCosts, join_arrival_costs
    >>> join_arrival_costs("nested_loops", 2, 4, 10, JoinCosts(move=1, comp=0.5))
    (21.0, 11.0)
    >>> join_arrival_costs("hash", 2, 4, 10, JoinCosts(move=1, hash=2, probe=3))
    (6.0, 6.0)
    """
    chk.one_of(method, "method", P.JOIN_METHODS)
    r_l, r_r = chk.non_negative(left_rate, "left_rate"), chk.non_negative(right_rate, "right_rate")
    t = chk.non_negative(t, "t")
    costs = chk.instance(costs, "costs", JoinCosts, "a JoinCosts")
    return _arrival_costs(method, r_l, r_r, t, costs)


def _arrival_costs(method: str, r_l: float, r_r: float, t: float, costs: JoinCosts) -> tuple[float, float]:
    if method == "nested_loops":
        return costs.move + r_r * t * costs.comp, costs.move + r_l * t * costs.comp
    c = costs.move + costs.hash + costs.probe
    return c, c


def join_output_rate(left_rate: float, right_rate: float, selectivity: float, left_cost: float,
                     right_cost: float, t: float, *, exact: bool = False, saturate: bool = True) -> float:
    """Equation 2: output rate of a join at time t (Viglas & Naughton, §3.3).

    ``r_o = f·r_l·r_r·t / (r_l·C_l + r_r·C_r)``. The outputs of the arrivals up to t number
    ``f·r_l·r_r·t·(t-1)`` and take ``t·(r_l·C_l + r_r·C_r)`` to produce; the paper approximates
    ``t - 1 ≈ t`` (``exact=True`` keeps ``max(t - 1, 0)``). When ``r_l·C_l + r_r·C_r < 1`` the
    denominator "needs to be replaced by 1" (outputs cannot precede their inputs): ``saturate``
    (default) applies that floor. A Cartesian product is the case ``f = 1``.

    Examples
    --------
    f = 0.5, r_l = 2, r_r = 4, C_l = 0.5 and C_r = 0.25 at t = 10:
    ``0.5·2·4·10/(2·0.5 + 4·0.25) = 40/2 = 20`` (with ``exact``, ``0.5·2·4·9/2 = 18``). With
    C_l = C_r = 0.1 the denominator 0.6 is below 1 and is replaced by 1.

    >>> from pyspark_cq.cost.rate import join_output_rate
    >>> join_output_rate(2, 4, 0.5, 0.5, 0.25, 10)
    20.0
    >>> join_output_rate(2, 4, 0.5, 0.5, 0.25, 10, exact=True)
    18.0
    >>> join_output_rate(2, 4, 0.5, 0.1, 0.1, 10)
    40.0
    """
    r_l, r_r = chk.non_negative(left_rate, "left_rate"), chk.non_negative(right_rate, "right_rate")
    f = chk.probability(selectivity, "selectivity")
    c_l, c_r = chk.non_negative(left_cost, "left_cost"), chk.non_negative(right_cost, "right_cost")
    t = chk.non_negative(t, "t")
    return _join_rate(r_l, r_r, f, c_l, c_r, t, exact, saturate)


def _join_rate(r_l: float, r_r: float, f: float, c_l: float, c_r: float, t: float, exact: bool,
               saturate: bool) -> float:
    busy = r_l * c_l + r_r * c_r
    if saturate:
        busy = max(busy, 1.0)
    numerator = f * r_l * r_r * (max(t - 1.0, 0.0) if exact else t)
    if busy == 0:
        if numerator == 0:
            return 0.0
        raise ValueError("left_cost and right_cost give no processing time (r_l·C_l + r_r·C_r = 0) and "
                         "saturate is off: the rate is unbounded")
    return numerator / busy


def _x_minus_log1p_over_x2(x: float) -> float:
    """``(x - log(1+x))/x²``, accurate for small x."""
    if abs(x) < 1e-3:
        return 0.5 - x / 3 + x * x / 4 - x ** 3 / 5
    return (x - math.log1p(x)) / (x * x)


def join_outputs_by_time(left_rate: float, right_rate: float, selectivity: float, t_p: float, *,
                         method: str = "hash", costs: JoinCosts = JoinCosts(), left_cost: float = 0.0,
                         right_cost: float = 0.0) -> float:
    """Equation 3 in closed form for one join of two source streams: ``∫_0^t_p r_o(t) dt``.

    ``r_o`` is Equation 2 (saturated) with arrival costs from Table 3 plus the extra costs
    ``left_cost``/``right_cost``. Both methods give ``r_l·C_l + r_r·C_r = A + B·t`` (B = 0 for the
    symmetric hash join, ``2·r_l·r_r·comp`` for nested loops), so the integral of
    ``K·t / max(1, A + B·t)`` (K = f·r_l·r_r) is elementary: ``K·t²/2`` while ``A + B·t <= 1``, and
    ``∫ K·t/(A + B·t) dt = K·(t/B - A/B²·ln(A + B·t))`` after.

    Examples
    --------
    Without costs the rate is ``K·t`` with ``K = f·r_l·r_r = 0.5·2·4 = 4``, so the first 10 time units
    give ``K·10²/2 = 200`` outputs, as the numerical integral of Equation 2 (:func:`outputs_by_time`) does.
    A symmetric hash join with ``move = 1`` over two streams of rate 1 is busy ``A = 2`` per time unit:
    ``∫_0^10 t/2 dt = 25``.

    >>> from pyspark_cq.cost.rate import JoinCosts, join_output_rate, join_outputs_by_time, outputs_by_time
    >>> join_outputs_by_time(2, 4, 0.5, 10)
    200.0
    >>> round(outputs_by_time(lambda t: join_output_rate(2, 4, 0.5, 0, 0, t), 10), 6)
    200.0
    >>> join_outputs_by_time(1, 1, 1.0, 10, costs=JoinCosts(move=1))
    25.0
    """
    r_l, r_r = chk.non_negative(left_rate, "left_rate"), chk.non_negative(right_rate, "right_rate")
    f = chk.probability(selectivity, "selectivity")
    t_p = chk.non_negative(t_p, "t_p")
    x_l, x_r = chk.non_negative(left_cost, "left_cost"), chk.non_negative(right_cost, "right_cost")
    chk.one_of(method, "method", P.JOIN_METHODS)
    chk.instance(costs, "costs", JoinCosts, "a JoinCosts")

    def busy(t: float) -> float:
        c_l, c_r = _arrival_costs(method, r_l, r_r, t, costs)
        return r_l * (c_l + x_l) + r_r * (c_r + x_r)

    a = busy(0.0)
    b = busy(1.0) - a  # Table 3 costs are linear in t
    k = f * r_l * r_r
    if a >= 1.0:
        t_star = 0.0
    elif b > 0:
        t_star = (1.0 - a) / b
    else:
        t_star = math.inf
    head = min(t_p, t_star)
    total = k * head * head / 2.0
    if t_p > t_star:
        u = a + b * t_star          # = max(a, 1)
        delta = t_p - t_star
        x = b * delta / u
        # ∫_{t*}^{t*+Δ} t/(A + B·t) dt = Δ·t*/u + A·(Δ/u)²·(x - ln(1 + x))/x²
        total += k * (delta * t_star / u + a * (delta / u) ** 2 * _x_minus_log1p_over_x2(x))
    return total


def _adaptive_simpson(fn: Callable[[float], float], a: float, b: float, rtol: float, depth: int = 48) -> float:
    def simpson(fa, fm, fb, lo, hi):
        return (hi - lo) * (fa + 4 * fm + fb) / 6.0

    def recurse(lo, hi, fa, fm, fb, whole, tol, level):
        mid = (lo + hi) / 2
        lm, rm = (lo + mid) / 2, (mid + hi) / 2
        flm, frm = fn(lm), fn(rm)
        left, right = simpson(fa, flm, fm, lo, mid), simpson(fm, frm, fb, mid, hi)
        if level <= 0 or abs(left + right - whole) <= 15 * tol:
            return left + right + (left + right - whole) / 15
        return (recurse(lo, mid, fa, flm, fm, left, tol / 2, level - 1)
                + recurse(mid, hi, fm, frm, fb, right, tol / 2, level - 1))

    fa, fm, fb = fn(a), fn((a + b) / 2), fn(b)
    whole = simpson(fa, fm, fb, a, b)
    scale = max(abs(whole), (b - a) * max(abs(fa), abs(fm), abs(fb)), 1e-300)
    return recurse(a, b, fa, fm, fb, whole, rtol * scale, depth)


def outputs_by_time(rate: Callable[[float], float], t_p: float, *, rtol: float = 1e-9) -> float:
    """Equation 3: the number of outputs by time t_p, ``∫_0^t_p r(t) dt`` (Viglas & Naughton, §4.1).

    ``rate`` is a plan's output rate as a function of time; the integral is computed by adaptive
    Simpson quadrature to relative tolerance ``rtol``.
    """
    chk.callable_(rate, "rate")
    t_p = chk.non_negative(t_p, "t_p")
    rtol = chk.positive(rtol, "rtol")
    if t_p == 0:
        return 0.0
    return _adaptive_simpson(rate, 0.0, t_p, rtol)


def time_to_outputs(n: float, outputs: Callable[[float], float], *, rtol: float = 1e-9,
                    t_max: float = 1e12) -> float:
    """The first time t with ``outputs(t) = n`` ("which plan is the first to reach N results?", §4.1).

    ``outputs`` must be non-decreasing in t (a number of outputs by time t, e.g. Equation 3). Found by
    bracketing and regula falsi (:func:`_solve_increasing`). Returns ``inf`` if n is not reached by ``t_max``.
    """
    n = chk.non_negative(n, "n")
    chk.callable_(outputs, "outputs")
    rtol = chk.positive(rtol, "rtol")
    t_max = chk.positive(t_max, "t_max")
    return _solve_increasing(outputs, n, rtol, t_max)


def _solve_increasing(fn: Callable[[float], float], target: float, rtol: float, t_max: float = 1e12) -> float:
    """Solve ``fn(t) = target`` for a non-decreasing ``fn`` with ``fn(0) <= target``, to relative tolerance
    ``rtol`` in t; returns the upper end of the final bracket (where ``fn(t) >= target``).

    The bracket is found by factors of 16 from t = 1; then regula falsi on ``log fn`` against ``log t``
    (output counts grow like powers of t, which makes that nearly linear), with the Illinois modification
    and bisection in log t as the fallback. ``inf`` if the target is not reached by ``t_max``.
    """
    if target == 0:
        return 0.0
    t = 1.0
    v = fn(t)
    if v >= target:
        hi, f_hi = t, v
        lo, f_lo = t / 16, fn(t / 16)
        while f_lo >= target:
            if lo < 1e-300:
                return 0.0
            hi, f_hi = lo, f_lo
            lo = lo / 16
            f_lo = fn(lo)
    else:
        lo, f_lo = t, v
        hi, f_hi = min(16.0, t_max), fn(min(16.0, t_max))
        while f_hi < target:
            if hi >= t_max:
                return math.inf
            lo, f_lo = hi, f_hi
            hi = min(16 * hi, t_max)
            f_hi = fn(hi)
    # regula falsi on g(x) = log fn(e^x) - log target, keeping g at both ends
    def g(value):
        return math.log(value) - math.log(target) if value > 0 else -math.inf

    g_lo, g_hi = g(f_lo), g(f_hi)
    side = 0
    for _ in range(200):
        if hi - lo <= rtol * hi:
            break
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2
        if math.isfinite(g_lo) and g_hi > g_lo:
            x_lo, x_hi = math.log(lo), math.log(hi)
            x = x_hi - g_hi * (x_hi - x_lo) / (g_hi - g_lo)
            if x_lo < x < x_hi:
                mid = math.exp(x)
        mid = min(max(mid, lo + 0.01 * rtol * hi), hi - 0.01 * rtol * hi)
        v = fn(mid)
        if v == target:
            return mid
        if v < target:
            lo, g_lo = mid, g(v)
            if side == -1:
                g_hi /= 2        # Illinois: the kept end's value is halved when one end moves twice
            side = -1
        else:
            hi, g_hi = mid, g(v)
            if side == 1:
                g_lo /= 2
            side = 1
    return hi


# ---------------------------------------------------------------------------------------------
# plans


def _rates(rates) -> Mapping[str, float]:
    return chk.instance(rates, "rates", Mapping, "a mapping {stream name: arrival rate}")


def _compile(plan: P.Node, rates, costs) -> tuple[list[P.Node], dict[str, float]]:
    """Check a plan and its inputs once: its nodes children first, and the source rates."""
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    rates = _rates(rates)
    chk.instance(costs, "costs", JoinCosts, "a JoinCosts")
    order = list(P.postorder(plan))
    checked = {}
    for node in order:
        if isinstance(node, P.Source):
            if node.name not in rates:
                raise ValueError(f"rates has no rate for stream {node.name!r}; given: {sorted(rates)}")
            checked[node.name] = chk.non_negative(rates[node.name], f"rates[{node.name!r}]")
        elif not isinstance(node, (P.Select, P.Project, P.Window, P.Granularity, P.Union, P.Join)):
            raise ValueError(f"the rate-based model (Viglas & Naughton §3) covers selection, projection and "
                             f"join; plan contains {type(node).__name__}")
    return order, checked


def _run(order: list[P.Node], rates: dict[str, float], t: float, costs: JoinCosts, exact: bool = False) -> float:
    """The output rate at time t of a compiled plan (see :func:`plan_output_rate`)."""
    out: dict[int, float] = {}
    for node in order:
        if isinstance(node, P.Source):
            r = rates[node.name]
        elif isinstance(node, P.Join):
            r_l, r_r = out[id(node.left)], out[id(node.right)]
            c_l, c_r = _arrival_costs(node.method, r_l, r_r, t, costs)
            r = _join_rate(r_l, r_r, node.selectivity, c_l + node.left_cost, c_r + node.right_cost, t, exact, True)
        elif isinstance(node, P.Select):
            r = _unary_output_rate(out[id(node.child)], node.selectivity, node.cost)
        elif isinstance(node, P.Project):
            r = _unary_output_rate(out[id(node.child)], 1.0, node.cost)
        elif isinstance(node, P.Union):
            r = sum(out[id(c)] for c in node.inputs)
        else:  # window, granularity
            r = out[id(node.child)]
        out[id(node)] = r
    return out[id(order[-1])]


def plan_output_rate(plan: P.Node, rates: Mapping[str, float], t: float, *, costs: JoinCosts = JoinCosts(),
                     exact: bool = False) -> float:
    """Output rate of a plan at time t, composed bottom up from §3 (Viglas & Naughton, §4.1).

    Sources give their rates; σ and π use their node ``cost`` as C_σ / C_π (§3.1–§3.2); a join uses
    Equation 2 with C_l, C_r from Table 3 (``costs`` and the node's ``method``) plus the node's
    ``left_cost``/``right_cost``, fed with its inputs' rates at time t (``exact``: Equation 2 with
    ``t - 1``). Window and granularity pass rates through; union adds them.
    """
    order, checked = _compile(plan, rates, costs)
    return _run(order, checked, chk.non_negative(t, "t"), costs, exact)


def plan_outputs_by_time(plan: P.Node, rates: Mapping[str, float], t_p: float, *,
                         costs: JoinCosts = JoinCosts(), rtol: float = 1e-9) -> float:
    """Equation 3 for a plan: ``∫_0^t_p`` of :func:`plan_output_rate` (numerical)."""
    order, checked = _compile(plan, rates, costs)
    return outputs_by_time(lambda t: _run(order, checked, t, costs), t_p, rtol=rtol)


def _invert_integral(rate: Callable[[float], float], n: float, rtol: float, t_max: float = 1e12) -> float:
    """The t with ``∫_0^t rate = n``, for a non-negative rate: a bracket by doubling, then Newton steps
    (the derivative of the integral is the rate) guarded by bisection, integrating only new pieces.
    """
    if n == 0:
        return 0.0
    lo, f_lo, hi = 0.0, 0.0, 1.0
    f_hi = _adaptive_simpson(rate, lo, hi, rtol)
    while f_hi < n:
        if hi >= t_max:
            return math.inf
        lo, f_lo = hi, f_hi
        hi = min(2 * hi, t_max)
        f_hi = f_lo + _adaptive_simpson(rate, lo, hi, rtol)
    t, f_t = hi, f_hi
    for _ in range(200):
        r = rate(t)
        guess = t - (f_t - n) / r if r > 0 else math.nan
        if not lo < guess < hi:
            guess = (lo + hi) / 2
        f_guess = f_lo + _adaptive_simpson(rate, lo, guess, rtol)
        if f_guess < n:
            lo, f_lo = guess, f_guess
        else:
            hi, f_hi = guess, f_guess
        t, f_t = guess, f_guess
        if abs(f_t - n) <= rtol * n or hi - lo <= rtol * hi:
            break
    return t


def plan_time_to_outputs(plan: P.Node, rates: Mapping[str, float], n: float, *,
                         costs: JoinCosts = JoinCosts(), rtol: float = 1e-9) -> float:
    """Time for a plan to produce n outputs: Equation 3 inverted (Viglas & Naughton, §4.1).

    ("Given an output size N … which plan is the first one to reach N results?") ``inf`` if the plan's
    rate stays 0.
    """
    order, checked = _compile(plan, rates, costs)
    n = chk.non_negative(n, "n")
    rtol = chk.positive(rtol, "rtol")
    return _invert_integral(lambda t: _run(order, checked, t, costs), n, rtol)


def local_rate_estimate(plan: P.Node, rates: Mapping[str, float], t_p: float, *,
                        costs: JoinCosts = JoinCosts()) -> float:
    """Local rate maximization's estimate for horizon t_p (Viglas & Naughton, §4.2.1).

    Each join's time variable is fixed at ``t_p/2`` — overestimating the rate at x as much as it
    underestimates it at ``t_p - x`` (Fig. 3) — and the estimates are combined bottom up (Fig. 4):
    the plan's output rate (:func:`plan_output_rate`) at ``t = t_p/2``.

    Examples
    --------
    A hash join of A (rate 2) and B (rate 4) with selectivity 0.5 and arrival costs 0.5 and 0.25
    (``r_l·C_l + r_r·C_r = 2``): for the horizon ``t_p = 20`` Equation 2 is taken at ``t = 10``,
    ``0.5·2·4·10/2 = 20``, the plan's output rate at that time.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.rate import local_rate_estimate, plan_output_rate
    >>> join = P.Join(P.Source("A"), P.Source("B"), selectivity=0.5, left_cost=0.5, right_cost=0.25)
    >>> local_rate_estimate(join, {"A": 2, "B": 4}, 20)
    20.0
    >>> plan_output_rate(join, {"A": 2, "B": 4}, 10)
    20.0
    """
    t_p = chk.non_negative(t_p, "t_p")
    return plan_output_rate(plan, rates, t_p / 2.0, costs=costs)


def best_plan_by_rate(plans: Sequence[P.Node], rates: Mapping[str, float], t_p: float, *,
                      costs: JoinCosts = JoinCosts()) -> tuple[P.Node, float]:
    """The plan with the highest :func:`local_rate_estimate` for horizon t_p, and that estimate (§4.2.1)."""
    return P.best_plan(plans, lambda p: local_rate_estimate(p, rates, t_p, costs=costs), maximize=True)


def output_size(plan: P.Node, sizes: Mapping[str, float]) -> float:
    """Expected number of outputs of a plan over finite inputs of the given sizes.

    ``f·|X|`` for a selection, ``f·|X|·|Y|`` for a join (e.g. ``f_AB·f_BC·|A|·|B|·|C|``, §4.2.2).
    """
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    sizes = chk.instance(sizes, "sizes", Mapping, "a mapping {stream name: number of elements}")
    out: dict[int, float] = {}
    for node in P.postorder(plan):
        ins = [out[id(c)] for c in node.children]
        out[id(node)] = _size(node, ins, sizes)
    return out[id(plan)]


def _size(node: P.Node, ins: list[float], sizes: Mapping[str, float]) -> float:
    if isinstance(node, P.Source):
        if node.name not in sizes:
            raise ValueError(f"sizes has no size for stream {node.name!r}; given: {sorted(sizes)}")
        return chk.non_negative(sizes[node.name], f"sizes[{node.name!r}]")
    if isinstance(node, P.Select):
        return node.selectivity * ins[0]
    if isinstance(node, P.Join):
        return node.selectivity * ins[0] * ins[1]
    if isinstance(node, P.Union):
        return sum(ins)
    if isinstance(node, (P.Project, P.Window, P.Granularity)):
        return ins[0]
    raise ValueError(f"the rate-based model covers selection, projection and join; plan contains "
                     f"{type(node).__name__}")


def split_required_outputs(n: float, selectivity: float, left_size: float, right_size: float) -> tuple[float, float]:
    """How many elements each input of a join must deliver for the join to produce n outputs (§4.2.2).

    Both inputs deliver the same fraction ``sqrt(q)`` of their size, with ``q = n/(f·|L|·|R|)`` the
    fraction of the join's output required: ``n_L = sqrt(q)·|L|``, ``n_R = sqrt(q)·|R|``, so that
    ``f·n_L·n_R = n``. For 25% of ``A ⋈ (B ⋈ C)`` this reads half of A and half of ``B ⋈ C``
    (the paper's example, whose square roots are garbled in the text; see docs/cost-model.md). Passing
    rates as sizes splits by equal reading time instead.

    Examples
    --------
    The paper's example, 25 % of the output of ``A ⋈ (B ⋈ C)``: with ``|A| = 100``, ``|B ⋈ C| = 400`` and
    ``f_AB = 0.01`` the join has ``0.01·100·400 = 400`` outputs, and 100 of them need the fraction
    ``sqrt(0.25) = 0.5`` of each input.

    >>> from pyspark_cq.cost.rate import split_required_outputs
    >>> split_required_outputs(100, 0.01, 100, 400)
    (50.0, 200.0)
    """
    n = chk.non_negative(n, "n")
    f = chk.probability(selectivity, "selectivity", allow_zero=False)
    left, right = chk.positive(left_size, "left_size"), chk.positive(right_size, "right_size")
    root_q = math.sqrt(n / (f * left * right))
    return root_q * left, root_q * right


def local_time_estimate(plan: P.Node, rates: Mapping[str, float], n: float, *,
                        sizes: Mapping[str, float] | None = None, costs: JoinCosts = JoinCosts()) -> float:
    """Local time minimization's estimate: time for ``plan`` to produce n outputs (§4.2.2).

    The required number of outputs is pushed down the plan (:func:`split_required_outputs` at joins,
    ``n/f`` below a selection); each point P (a source, an operator, a join) then needs
    ``t_P = n_P / r_P`` with r_P its rate estimate — for a join the local-rate-maximization estimate of
    §4.2.1 at horizon t_P, so t_P solves ``t = n_P / r_P(t/2)``. The plan's time is the largest t_P (the
    paper's ``max``); compare plans with :func:`best_plan_by_time`. ``sizes`` (cardinalities of finite
    sources) steer the splits; by default the rates do.
    """
    order, checked = _compile(plan, rates, costs)
    n = chk.non_negative(n, "n")
    sizes = rates if sizes is None else chk.instance(sizes, "sizes", Mapping, "a mapping {stream name: size}")
    size_of: dict[int, float] = {}
    for node in order:
        size_of[id(node)] = _size(node, [size_of[id(c)] for c in node.children], sizes)

    worst = 0.0
    stack = [(plan, n)]
    while stack:
        node, need = stack.pop()
        sub = list(P.postorder(node))
        # t_P solves t = n_P / r_P(t/2): the local rate estimate of §4.2.1 for horizon t
        worst = max(worst, _solve_increasing(lambda t, sub=sub: t * _run(sub, checked, t / 2, costs), need, 1e-9))
        if isinstance(node, P.Select):
            stack.append((node.child, need / node.selectivity))
        elif isinstance(node, (P.Project, P.Window, P.Granularity)):
            stack.append((node.child, need))
        elif isinstance(node, P.Join):
            left, right = size_of[id(node.left)], size_of[id(node.right)]
            if left > 0 and right > 0:
                n_l, n_r = split_required_outputs(need, node.selectivity, left, right)
                stack.extend([(node.left, n_l), (node.right, n_r)])
        elif isinstance(node, P.Union):
            total = sum(size_of[id(c)] for c in node.inputs)
            stack.extend((c, need * size_of[id(c)] / total if total else 0.0) for c in node.inputs)
    return worst


def best_plan_by_time(plans: Sequence[P.Node], rates: Mapping[str, float], n: float, *,
                      sizes: Mapping[str, float] | None = None, costs: JoinCosts = JoinCosts()) -> tuple[P.Node, float]:
    """The plan with the smallest :func:`local_time_estimate` for n outputs, and that time (§4.2.2).

    The paper's ``min`` clause keeps the tree whose time is larger (``C_t > C_f ? Tree``), contrary to its
    stated purpose; this picks the smallest, as the text says.
    """
    return P.best_plan(plans, lambda p: local_time_estimate(p, rates, n, sizes=sizes, costs=costs))


# ---------------------------------------------------------------------------------------------
# plan-switchable operators: a chain of selections, a multi-way join (probe orders)


def _order(order, names: Sequence, name: str = "order") -> tuple:
    if isinstance(order, str) or not isinstance(order, Sequence):
        raise TypeError(f"{name} must be a sequence naming each of {sorted(names)} once, got {order!r}")
    if sorted(map(str, order)) != sorted(map(str, names)) or len(set(order)) != len(order):
        raise ValueError(f"{name} {list(order)} does not match the query: it must name each of "
                         f"{sorted(names)} exactly once")
    return tuple(order)


def _chain_inputs(selectivities, costs) -> tuple[dict, dict]:
    sel = chk.instance(selectivities, "selectivities", Mapping, "a mapping {predicate: selectivity in [0, 1]}")
    cost = chk.instance(costs, "costs", Mapping, "a mapping {predicate: time per evaluated row}")
    if not sel or set(sel) != set(cost):
        raise ValueError(f"selectivities and costs must name the same, non-empty set of predicates; got "
                         f"{sorted(sel)} and {sorted(cost)}")
    return ({p: chk.probability(v, f"selectivities[{p!r}]") for p, v in sel.items()},
            {p: chk.non_negative(v, f"costs[{p!r}]") for p, v in cost.items()})


def _chain_cost(order, sel: dict, cost: dict) -> float:
    total, passed = 0.0, 1.0
    for p in order:
        total += passed * cost[p]
        passed *= sel[p]
    return total


def chain_cost(order: Sequence[str], selectivities: Mapping[str, float], costs: Mapping[str, float]) -> float:
    """Cost of one input row of a chain of selections evaluated in ``order`` (one operator, one processor).

    ``C = Σ_k c_k·Π_{m<k} f_m``: predicate k sees only the rows the earlier ones passed. This is C_σ of
    Viglas & Naughton §3.2 for the chain taken as one selection of selectivity ``Π f``.

    Examples
    --------
    Figure 1: two predicates of selectivity 0.1, σ1 costs 1/50 s per row and σ2 nothing. σ1 first: every
    row pays 0.02 s; σ2 first: only a tenth of the rows reach σ1, 0.002 s per row.

    >>> from pyspark_cq.cost.rate import chain_cost
    >>> sel, cost = {"s1": 0.1, "s2": 0.1}, {"s1": 1 / 50, "s2": 0.0}
    >>> chain_cost(["s1", "s2"], sel, cost), round(chain_cost(["s2", "s1"], sel, cost), 6)
    (0.02, 0.002)
    """
    sel, cost = _chain_inputs(selectivities, costs)
    return _chain_cost(_order(order, sel), sel, cost)


def chain_output_rate(rate: float, order: Sequence[str], selectivities: Mapping[str, float],
                      costs: Mapping[str, float]) -> float:
    """Output rate of a chain of selections in ``order`` over an input of ``rate`` (Viglas & Naughton, §3.2).

    The chain is one selection with ``f = Π f_k`` and ``C_σ = `` :func:`chain_cost`: ``r_o = f·r`` while
    ``C_σ <= 1/r``, else ``f/C_σ`` (:func:`selection_output_rate`).

    Examples
    --------
    Figure 1 (500 rows/s): σ1 first transmits 0.5 outputs/s (it handles only 50 rows/s), σ2 first 5.

    >>> from pyspark_cq.cost.rate import chain_output_rate
    >>> sel, cost = {"s1": 0.1, "s2": 0.1}, {"s1": 1 / 50, "s2": 0.0}
    >>> [round(chain_output_rate(500, order, sel, cost), 9) for order in (["s1", "s2"], ["s2", "s1"])]
    [0.5, 5.0]
    """
    r = chk.positive(rate, "rate")
    sel, cost = _chain_inputs(selectivities, costs)
    return _unary_output_rate(r, math.prod(sel.values()), _chain_cost(_order(order, sel), sel, cost))


def best_chain_order(rate: float, selectivities: Mapping[str, float], costs: Mapping[str, float]
                     ) -> tuple[tuple[str, ...], float]:
    """Local rate maximization over the orders of a chain of selections (Viglas & Naughton, §4.2.1).

    The chain's rate does not depend on time, so the order with the highest :func:`chain_output_rate` is
    best for every horizon t_p and reaches N outputs first. Ties (all orders keep up with the input) go to
    the cheapest order, then the first in sorted order. Every order is evaluated (n!, n <= 8).
    """
    r = chk.positive(rate, "rate")
    sel, cost = _chain_inputs(selectivities, costs)
    if len(sel) > 8:
        raise ValueError(f"selectivities names {len(sel)} predicates; at most 8 orders are enumerated")
    f = math.prod(sel.values())
    best = min(itertools.permutations(sorted(sel)),
               key=lambda o: (-_unary_output_rate(r, f, _chain_cost(o, sel, cost)), _chain_cost(o, sel, cost)))
    return best, _unary_output_rate(r, f, _chain_cost(best, sel, cost))


@dataclass(frozen=True)
class MultiJoinModel:
    """The rate-based model of a multi-way join with one state per input and per-input probe orders (MJoin).

    Viglas & Naughton model a join by its inputs' rates, its selectivity and the cost of handling one
    arrival (§3.3, Equation 2); this extends the model from a binary join to n inputs kept in n states. A row
    arriving on input i probes the other inputs in its probe order ``o_i = (j_1, j_2, …)``; the partial
    matches entering step k are ``Π_{m<k} F(j_m | B_m)``, where ``B_m = {i, j_1, …, j_{m-1}}`` is the bound
    set and ``F(j | B) = |S_j(t)|·f(j | B)`` the matches per partial match in j's state. Then at time t:

    - the outputs one arrival of i produces, ``P_i = Π_k F(j_k | B_k)`` (the same for every order);
    - its cost, ``C_i = arrival_cost + probe_cost·Σ_k Π_{m<k} F(j_m | B_m)`` (Table 3's symmetric hash join
      cost per arrival, plus one probe per partial match);
    - the output rate, ``r_o = Σ_i r_i·P_i / max(1, Σ_i r_i·C_i)``: Equation 2's form (outputs over the
      time to produce them, the denominator floored at 1 because outputs cannot precede their inputs).

    The probe orders change only the cost: a plan is faster exactly when the operator cannot keep up.

    Parameters
    ----------
    rates : sequence of float
        Arrival rate r_i (> 0) of each input, elements per time unit.
    selectivities : mapping frozenset({i, j}) -> float
        Selectivity f_ij in [0, 1] of each join predicate between two inputs (pairs without one: 1, a
        Cartesian product). ``f(j | B) = Π_{b ∈ B} f_bj``, the independence the paper uses for output sizes
        (``f_AB·f_BC·|A|·|B|·|C|``, §4.2.2).
    conditional : mapping (i, j, frozenset B) or (j, frozenset B) -> float, optional
        Measured ``f(j | B)`` that replace the product (e.g. from a running operator's probe steps): keyed
        with the arriving input i (in B) — with time bands the rows a probe meets depend on which input
        arrived last — or for every arriving input.
    outputs : sequence of float, optional
        Measured outputs per arrival of each input at t = 0 (``P_i``, which no order changes); at time t
        they scale with the states, ``P_i(t) = outputs_i·Π_{j≠i} |S_j(t)|/|S_j(0)|``. Default: the product
        of the fan-outs of the first order evaluated.
    states : sequence of float, optional
        ``|S_j|`` at t = 0 (default 0: an empty join, as in the paper).
    growth : sequence of float, optional
        How fast each state grows (default: ``rates``, every arrival is kept, the paper's unbounded join;
        0 for a windowed join in its steady state). ``|S_j(t)| = states_j + growth_j·t``.
    probe_cost, arrival_cost : float
        Time of one probe of a state by one partial match, and of storing one arrival (>= 0).
    scan : bool
        A probe walks the probed state's rows of the key (our ``multi_join`` kernel's hash chains), so it
        costs ``probe_cost`` per row of ``|S_j(t)|`` (the key's share folded into ``probe_cost``), not a
        constant: ``C_i = arrival_cost + probe_cost·Σ_k Π_{m<k} F(j_m | B_m)·|S_{j_k}(t)|``. Default False.

    Examples
    --------
    Two inputs with unbounded states: ``r_o = 2·f·r_l·r_r·t`` without costs, whose integral ``f·r_l·r_r·t²``
    is the number of qualifying pairs (Equation 2 gives the average rate over [0, t], half of this).

    >>> from pyspark_cq.cost.rate import MultiJoinModel
    >>> m = MultiJoinModel((2.0, 4.0), {frozenset({0, 1}): 0.5})
    >>> m.output_rate(((1,), (0,)), 10.0)
    80.0
    >>> round(m.outputs_by_time(((1,), (0,)), 10.0), 6)
    400.0
    """

    rates: tuple
    selectivities: Mapping = dataclasses.field(default_factory=dict)
    conditional: Mapping = dataclasses.field(default_factory=dict)
    states: tuple | None = None
    growth: tuple | None = None
    probe_cost: float = 0.0
    arrival_cost: float = 0.0
    outputs: tuple | None = None
    scan: bool = False

    def __post_init__(self):
        rates = self.rates
        if isinstance(rates, (str, Mapping)) or not isinstance(rates, Sequence) or not 2 <= len(rates) <= 6:
            raise TypeError(f"rates must be a sequence of 2 to 6 arrival rates, one per input, got {rates!r}")
        n = len(rates)
        object.__setattr__(self, "rates", tuple(chk.positive(r, f"rates[{i}]") for i, r in enumerate(rates)))
        sel = chk.instance(self.selectivities, "selectivities", Mapping,
                           "a mapping {frozenset({i, j}): selectivity in [0, 1]}")
        checked = {}
        for pair, f in sel.items():
            if not isinstance(pair, frozenset) or len(pair) != 2 or not all(
                    isinstance(i, int) and 0 <= i < n for i in pair):
                raise ValueError(f"selectivities keys must be frozenset({{i, j}}) of two input indexes in "
                                 f"0..{n - 1}, got {pair!r}")
            checked[pair] = chk.probability(f, f"selectivities[{set(pair)}]")
        object.__setattr__(self, "selectivities", checked)
        cond = chk.instance(self.conditional, "conditional", Mapping,
                            "a mapping {(i, j, frozenset(bound inputs)) or (j, frozenset(bound)): selectivity}")
        checked = {}

        def index(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n

        for key, f in cond.items():
            ok = isinstance(key, tuple) and len(key) in (2, 3) and isinstance(key[-1], frozenset) and key[-1]
            if ok:
                j, bound = key[-2], key[-1]
                ok = index(j) and j not in bound and all(index(b) for b in bound)
                ok = ok and (len(key) == 2 or (index(key[0]) and key[0] in bound))
            if not ok:
                raise ValueError(f"conditional keys must be (i, j, frozenset(bound inputs)) or (j, frozenset(bound)) "
                                 f"with inputs in 0..{n - 1}, i bound and j not, got {key!r}")
            checked[key] = chk.probability(f, f"conditional[{key!r}]")
        object.__setattr__(self, "conditional", checked)
        for name, default in (("states", (0.0,) * n), ("growth", self.rates)):
            value = getattr(self, name)
            if value is None:
                value = default
            if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence) or len(value) != n:
                raise TypeError(f"{name} must be a sequence of {n} numbers (one per input) or None, got {value!r}")
            object.__setattr__(self, name, tuple(chk.non_negative(v, f"{name}[{i}]") for i, v in enumerate(value)))
        object.__setattr__(self, "probe_cost", chk.non_negative(self.probe_cost, "probe_cost"))
        object.__setattr__(self, "arrival_cost", chk.non_negative(self.arrival_cost, "arrival_cost"))
        if self.outputs is not None:
            out = self.outputs
            if isinstance(out, (str, Mapping)) or not isinstance(out, Sequence) or len(out) != n:
                raise TypeError(f"outputs must be a sequence of {n} numbers (one per input) or None, got {out!r}")
            object.__setattr__(self, "outputs", tuple(chk.non_negative(v, f"outputs[{i}]") for i, v in enumerate(out)))

    @property
    def n_inputs(self) -> int:
        """The number of inputs."""
        return len(self.rates)

    def check_orders(self, orders) -> tuple[tuple[int, ...], ...]:
        """Validate per-input probe orders (``orders[i]``: the other inputs, each once)."""
        n = self.n_inputs
        if isinstance(orders, str) or not isinstance(orders, Sequence) or len(orders) != n:
            raise ValueError(f"orders must give one probe order per input ({n} inputs), got {orders!r}")
        return tuple(_order(o, [j for j in range(n) if j != i], f"orders[{i}]") for i, o in enumerate(orders))

    def selectivity(self, j: int, bound: frozenset, arriving: int | None = None) -> float:
        """``f(j | B)``: the measured conditional value if given (for the ``arriving`` input, else for any),
        else ``Π_{b ∈ B} f_bj``.
        """
        f = self.conditional.get((arriving, j, bound)) if arriving is not None else None
        if f is None:
            f = self.conditional.get((j, bound))
        if f is not None:
            return f
        return math.prod(self.selectivities.get(frozenset((b, j)), 1.0) for b in bound)

    def _per_arrival(self, i: int, order, t: float) -> tuple[float, float]:
        """(outputs, probes) of one arrival of input i at time t (probes: state rows scanned with ``scan``)."""
        partial, probes, bound = 1.0, 0.0, {i}
        for j in order:
            size = self.states[j] + self.growth[j] * t
            probes += partial * size if self.scan else partial
            partial *= size * self.selectivity(j, frozenset(bound), i)
            bound.add(j)
        if self.outputs is not None:
            partial = self.outputs[i] * math.prod(
                (self.states[j] + self.growth[j] * t) / self.states[j] if self.states[j] > 0 else 1.0
                for j in order)
        return partial, probes

    def arrival_costs(self, orders, t: float) -> tuple[float, ...]:
        """``C_i`` of every input at time t (time to handle one arrival)."""
        orders, t = self.check_orders(orders), chk.non_negative(t, "t")
        return tuple(self.arrival_cost + self.probe_cost * self._per_arrival(i, o, t)[1] for i, o in enumerate(orders))

    def _rate(self, orders, t: float) -> float:
        out = busy = 0.0
        for i, o in enumerate(orders):
            outputs, probes = self._per_arrival(i, o, t)
            out += self.rates[i] * outputs
            busy += self.rates[i] * (self.arrival_cost + self.probe_cost * probes)
        return out / max(1.0, busy)

    def output_rate(self, orders, t: float) -> float:
        """``r_o(t)`` of the plan ``orders`` (see the class docstring)."""
        return self._rate(self.check_orders(orders), chk.non_negative(t, "t"))

    def local_rate_estimate(self, orders, t_p: float) -> float:
        """Local rate maximization's estimate for horizon t_p: the rate at ``t_p/2`` (§4.2.1)."""
        return self._rate(self.check_orders(orders), chk.positive(t_p, "t_p") / 2.0)

    def outputs_by_time(self, orders, t_p: float, *, rtol: float = 1e-9) -> float:
        """Equation 3: ``∫_0^t_p r_o(t) dt`` (:func:`outputs_by_time`)."""
        orders = self.check_orders(orders)
        return outputs_by_time(lambda t: self._rate(orders, t), t_p, rtol=rtol)

    def time_to_outputs(self, orders, n: float, *, rtol: float = 1e-9) -> float:
        """The time the plan needs for n outputs (Equation 3 inverted, §4.1); ``inf`` if never."""
        orders = self.check_orders(orders)
        n = chk.positive(n, "n")
        return _invert_integral(lambda t: self._rate(orders, t), n, chk.positive(rtol, "rtol"))

    def best_orders(self, *, t_p: float | None = None, n: float | None = None, candidates: Sequence | None = None,
                    allowed: Sequence | None = None) -> tuple[tuple[tuple[int, ...], ...], float]:
        """The best probe orders and their score: local rate maximization for horizon ``t_p`` (highest
        :meth:`local_rate_estimate`, §4.2.1) or, with ``n``, the least :meth:`time_to_outputs`.

        Without ``candidates`` every input's order is chosen on its own among its ``(n-1)!`` orders (the
        costs add up per input and the outputs do not depend on the orders): the cheapest at ``t_p/2``, or
        at half the time to n outputs. With ``candidates`` (a list of per-input orders) the best of those is
        returned; ties go to the first. ``allowed`` (without ``candidates``) restricts each input's choice to
        ``allowed[i]``, a non-empty list of its probe orders (e.g. those without a step that no predicate
        links to the bound inputs).
        """
        if (t_p is None) == (n is None):
            raise ValueError("give exactly one objective: t_p (maximum output rate) or n (least time to n outputs)")
        t_p = None if t_p is None else chk.positive(t_p, "t_p")
        n = None if n is None else chk.positive(n, "n")
        if allowed is not None:
            if candidates is not None:
                raise ValueError("give at most one of candidates and allowed")
            n_in = self.n_inputs
            if isinstance(allowed, (str, Mapping)) or not isinstance(allowed, Sequence) or len(allowed) != n_in:
                raise ValueError(f"allowed must give a list of probe orders per input ({self.n_inputs} inputs), "
                                 f"got {allowed!r}")
            allowed = tuple(tuple(_order(o, [j for j in range(self.n_inputs) if j != i], f"allowed[{i}]")
                                  for o in orders) for i, orders in enumerate(allowed))
            for i, orders in enumerate(allowed):
                if not orders:
                    raise ValueError(f"allowed[{i}] must list at least one probe order of input {i}")
        if candidates is None:
            # the costs add up per input and P_i does not depend on the orders: the best orders at one time t
            # are each input's cheapest. For t_p that time is t_p/2; for n it is half the time the plan
            # needs, found by iterating from the orders that are cheapest at t = 0 (a fixed point in a few steps)
            at = t_p / 2.0 if t_p is not None else 0.0
            candidates = [self._cheapest(at, allowed)]
            if n is not None:
                for _ in range(4):
                    at = _invert_integral(lambda t, c=candidates[-1]: self._rate(c, t), n, 1e-9) / 2.0
                    if not math.isfinite(at) or self._cheapest(at, allowed) in candidates:
                        break
                    candidates.append(self._cheapest(at, allowed))
        else:
            if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
                raise ValueError(f"candidates must be a non-empty list of per-input probe orders, got {candidates!r}")
            candidates = [self.check_orders(c) for c in candidates]
        if t_p is not None:
            scored = [(self._rate(c, t_p / 2.0), c) for c in candidates]
            best = max(scored, key=lambda s: s[0])
        else:
            scored = [(_invert_integral(lambda t, c=c: self._rate(c, t), n, 1e-9), c) for c in candidates]
            best = min(scored, key=lambda s: s[0])
        return best[1], best[0]

    def _cheapest(self, t: float, allowed=None) -> tuple[tuple[int, ...], ...]:
        """Every input's order with the fewest probes per arrival at time t (among ``allowed[i]`` if given;
        ties: the first).
        """
        k = self.n_inputs
        return tuple(min(itertools.permutations([j for j in range(k) if j != i]) if allowed is None else allowed[i],
                         key=lambda o, i=i: self._per_arrival(i, o, t)[1]) for i in range(k))


# ---------------------------------------------------------------------------------------------
# join trees on one processor, and a join tree as multi_join probe orders (§5.3 on Spark)


def plan_work(plan: P.Node, rates: Mapping[str, float], t: float, *, costs: JoinCosts = JoinCosts()) -> float:
    """Processing time per unit time of a plan's joins at time t: ``Σ_joins r_l·C_l + r_r·C_r``.

    The denominator of Equation 2 (§3.3) summed over the plan's joins, with C_l, C_r from Table 3
    (``costs`` and the node's ``method``) plus the node's ``left_cost``/``right_cost``, and each join's
    input rates those its children would deliver unhindered (:func:`plan_output_rate` without costs). When
    all joins share one processor — a Spark task runs a tree's joins one after the other — the plan keeps
    up while this is at most 1; a backlog takes ``plan_work`` times its event-time span to replay.

    Examples
    --------
    (A⋈B)⋈C with f_AB = 0.01, f_(AB)C = 0.1, rates A 10, B 20, C 5 and one unit per arrival at t = 1:
    A⋈B handles 10 + 20 arrivals and emits ``0.01·10·20 = 2`` per unit time, the top join 2 + 5.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.rate import JoinCosts, plan_work
    >>> ab_c = P.Join(P.Join(P.Source("A"), P.Source("B"), selectivity=0.01), P.Source("C"), selectivity=0.1)
    >>> plan_work(ab_c, {"A": 10, "B": 20, "C": 5}, 1.0, costs=JoinCosts(move=1))
    37.0
    """
    order, checked = _compile(plan, rates, costs)
    t = chk.non_negative(t, "t")
    free = JoinCosts()
    work = 0.0
    for node in order:
        if isinstance(node, P.Join):
            r_l = _run(list(P.postorder(node.left)), checked, t, free)
            r_r = _run(list(P.postorder(node.right)), checked, t, free)
            c_l, c_r = _arrival_costs(node.method, r_l, r_r, t, costs)
            work += r_l * (c_l + node.left_cost) + r_r * (c_r + node.right_cost)
    return work


def tree_probe_orders(plan: P.Node, inputs: Sequence[str], edges) -> tuple[tuple[int, ...], ...]:
    """The probe orders of a ``multi_join`` that follow a binary join tree (MJoin running a tree's order).

    A row arriving on input i meets, going up from its leaf, the sibling subtree of every ancestor join in
    turn; within a sibling subtree it probes first the input joined to the inputs bound so far by a
    predicate (``edges``), then the next such input, and so on (an input with no predicate to the bound set
    comes last, in the subtree's left-to-right order).

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        A tree of :class:`~pyspark_cq.plan.Join` over :class:`~pyspark_cq.plan.Source` leaves named as
        ``inputs``.
    inputs : sequence of str
        The ``multi_join``'s inputs in index order.
    edges : iterable of (str, str)
        The query's join predicates as pairs of input names.

    Examples
    --------
    Figure 11's Fast Leaves over a chain C–A–B–D–E: E's rows probe D, then the other subtree from B.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.rate import tree_probe_orders
    >>> s = P.Source
    >>> fast = P.Join(P.Join(P.Join(s("A"), s("C")), s("B")), P.Join(s("D"), s("E")))
    >>> tree_probe_orders(fast, "ABCDE", [("A", "C"), ("A", "B"), ("B", "D"), ("D", "E")])
    ((2, 1, 3, 4), (0, 2, 3, 4), (0, 1, 3, 4), (4, 1, 0, 2), (3, 1, 0, 2))
    """
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    if isinstance(inputs, str):
        inputs = list(inputs)
    names = list(inputs)
    leaves = P.source_names(plan)
    if sorted(leaves) != sorted(names) or len(set(names)) != len(names):
        raise ValueError(f"plan does not match the query: its sources {sorted(leaves)} are not the inputs {names}")
    adjacent = set()
    for pair in edges:
        if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2 or not set(pair) <= set(names):
            raise ValueError(f"edges must be pairs of input names from {names}, got {pair!r}")
        adjacent.add(frozenset(pair))
    parent: dict[int, P.Node] = {}
    for node in P.postorder(plan):
        if isinstance(node, P.Join):
            parent[id(node.left)] = parent[id(node.right)] = node
        elif not isinstance(node, P.Source):
            raise ValueError(f"plan must be a tree of joins over sources, got a {type(node).__name__}")
    index = {n: i for i, n in enumerate(names)}
    nodes = {n.name: n for n in P.postorder(plan) if isinstance(n, P.Source)}
    orders = []
    for name in names:
        node, bound, order = nodes[name], {name}, []
        while id(node) in parent:
            up = parent[id(node)]
            rest = list(P.source_names(up.right if up.left is node else up.left))
            while rest:
                nxt = next((x for x in rest if any(frozenset((x, b)) in adjacent for b in bound)), rest[0])
                order.append(index[nxt])
                bound.add(nxt)
                rest.remove(nxt)
            node = up
        orders.append(tuple(order))
    return tuple(orders)
