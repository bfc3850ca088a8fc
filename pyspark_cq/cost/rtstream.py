"""RTStream cost model: execution time of a periodic query instance and the fraction of input to keep.

Wei, Prasad, Son & Stankovic, "Prediction-Based QoS Management for Real-Time Data Streams" (RTStream).
A query instance processes n input tuples (already in the system); operator j costs t_j per input tuple
and passes a fraction s_j (§4.1). Equation (1) gives a plan's execution time, joins being costed by
branch (the Figure 5 example), equation (2) the remaining time when operator j is scheduled, and
§4.4 the fraction ε = D/T of the input to keep so that the instance meets its (pseudo-)deadline.

Plan nodes supply: ``cost`` = t_j, the time per input tuple (for a join: per pair of inputs, as in
Figure 5's ``(n1·s11)(n2·s12)·t13``); ``Select.selectivity`` = s_j; a join's output is
``n_L·n_R·s``; projection, window and granularity pass every tuple (s = 1); an aggregation outputs at
most one tuple per group; union adds counts.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .. import _args as chk
from .. import plan as P

__all__ = [
    "selection_tuple_cost", "join_processing_time", "chain_time", "plan_execution_time",
    "remaining_deadline", "kept_fraction", "plan_kept_fraction",
]


def selection_tuple_cost(predicate_cost: float, insert_cost: float, selectivity: float) -> float:
    """Average cost per tuple of a selection: ``C_p + s × C_i`` (Wei et al., §4.1.1).

    ``(n·C_p + n·s·C_i)/n``: every tuple is evaluated, the selected ones are inserted into the output.

    Examples
    --------
    C_p = 1, C_i = 0.5 and s = 0.2: ``1 + 0.2·0.5 = 1.1`` per tuple.

    >>> from pyspark_cq.cost.rtstream import selection_tuple_cost
    >>> selection_tuple_cost(1.0, 0.5, 0.2)
    1.1
    """
    return (chk.non_negative(predicate_cost, "predicate_cost")
            + chk.probability(selectivity, "selectivity") * chk.non_negative(insert_cost, "insert_cost"))


def join_processing_time(n_left: float, n_right: float, selectivity: float, *, probe_left: float,
                         probe_right: float, hash_left: float, hash_right: float, insert: float) -> float:
    """Total time of a symmetric hash join over n_L and n_R inputs (Wei et al., §4.1.2).

    ``n_L·(C_RProbe + C_LHash) + n_R·(C_LProbe + C_RHash) + n_L·n_R·s·C_i``: each left tuple is hashed
    into the left index and probes the right one (and vice versa); each result is inserted into the
    output buffer. (The paper's total repeats ``C_RProbe + C_LHash`` for the right input, a typo against
    its own line before; see docs/cost-model.md.)

    Examples
    --------
    n_L = 100, n_R = 200, s = 0.01: ``100·(5 + 1) + 200·(4 + 1) + 100·200·0.01·0.5 = 600 + 1000 + 100``.

    >>> from pyspark_cq.cost.rtstream import join_processing_time
    >>> join_processing_time(100, 200, 0.01, probe_left=4, probe_right=5, hash_left=1, hash_right=1,
    ...                      insert=0.5)
    1700.0
    """
    n_l, n_r = chk.non_negative(n_left, "n_left"), chk.non_negative(n_right, "n_right")
    s = chk.probability(selectivity, "selectivity")
    c = {name: chk.non_negative(v, name) for name, v in
         (("probe_left", probe_left), ("probe_right", probe_right), ("hash_left", hash_left),
          ("hash_right", hash_right), ("insert", insert))}
    return (n_l * (c["probe_right"] + c["hash_left"]) + n_r * (c["probe_left"] + c["hash_right"])
            + n_l * n_r * s * c["insert"])


def _sequence(values, name: str, check) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
    return [check(v, f"{name}[{i}]") for i, v in enumerate(values)]


def chain_time(n: float, times: Sequence[float], selectivities: Sequence[float], *, start: int = 0) -> float:
    """Execution time of a chain of operators (no join) over n input tuples.

    Equation (1) of Wei et al. (§4.3), ``T = n·t_1 + Σ_{j>=2} n·t_j·Π_{k<j} s_k``, and with ``start = j``
    (0-based) equation (2) (§4.4), the time left when operator j is scheduled with n tuples at its input:
    ``T = n·t_j + Σ_{p>j} n·t_p·Π_{k=j}^{p-1} s_k``.

    Examples
    --------
    Three operators with t = (1, 2, 4) and s = (0.5, 0.25, 1) over n = 1000 tuples, equation (1):
    ``1000·1 + 1000·2·0.5 + 1000·4·0.5·0.25 = 2500``; equation (2) when the second operator is scheduled
    with 1000 tuples at its input: ``1000·2 + 1000·4·0.25 = 3000``.

    >>> from pyspark_cq.cost.rtstream import chain_time
    >>> chain_time(1000, [1, 2, 4], [0.5, 0.25, 1.0])
    2500.0
    >>> chain_time(1000, [1, 2, 4], [0.5, 0.25, 1.0], start=1)
    3000.0
    """
    n = chk.non_negative(n, "n")
    t = _sequence(times, "times", chk.non_negative)
    s = _sequence(selectivities, "selectivities", lambda v, name: chk.probability(v, name))
    if len(t) != len(s):
        raise ValueError(f"times and selectivities must have the same length; got {len(t)} and {len(s)}")
    start = chk.integer(start, "start", minimum=0)
    if t and start >= len(t):
        raise ValueError(f"start must index an operator (0 … {len(t) - 1}), got {start}")
    total, passing = 0.0, n
    for j in range(start, len(t)):
        total += passing * t[j]
        passing *= s[j]
    return total


def _counts(counts) -> Mapping[str, float]:
    return chk.instance(counts, "counts", Mapping, "a mapping {stream name: number of input tuples}")


def _branch(node: P.Node, counts: Mapping[str, float]) -> tuple[float, float]:
    """(time, output tuples) of the subplan ``node``: a chain of unary operators over a source or a join."""
    chain = []
    while isinstance(node, (P.Select, P.Project, P.Window, P.Granularity, P.Aggregate)):
        chain.append(node)
        node = node.child
    if isinstance(node, P.Source):
        if node.name not in counts:
            raise ValueError(f"counts has no input size for stream {node.name!r}; given: {sorted(counts)}")
        time, n = 0.0, chk.non_negative(counts[node.name], f"counts[{node.name!r}]")
    elif isinstance(node, P.Join):
        (t_l, n_l), (t_r, n_r) = _branch(node.left, counts), _branch(node.right, counts)
        pairs = n_l * n_r
        time, n = t_l + t_r + pairs * node.cost, pairs * node.selectivity
    elif isinstance(node, P.Union):
        parts = [_branch(c, counts) for c in node.inputs]
        n = sum(p[1] for p in parts)
        time = sum(p[0] for p in parts) + n * node.cost
    else:
        raise ValueError(f"the RTStream model covers σ, π, ω, Γ, aggregation, ⋈ and ∪; plan contains "
                         f"{type(node).__name__}")
    chain.reverse()  # bottom up, the order in which the tuples pass
    times, sels, passing = [], [], n
    for op in chain:
        if isinstance(op, P.Select):
            s = op.selectivity
        elif isinstance(op, P.Aggregate):
            s = min(1.0, op.groups / passing) if passing > 0 else 1.0
        else:
            s = 1.0
        times.append(op.cost)
        sels.append(s)
        passing *= s
    return time + chain_time(n, times, sels), passing


def plan_execution_time(plan: P.Node, counts: Mapping[str, float]) -> float:
    """Estimated execution time of a query instance (Wei et al., §4.3, equation (1) and Figure 5).

    Equation (1) costs the operators from each source up to a join; the join costs its pairs of inputs
    times its t; the branches and the join add up, and so on to the root. For Figure 5's plan
    ``T = n1·t11 + n2·t12 + n3·t14 + (n1·s11)(n2·s12)·t13 + ((n1·s11)(n2·s12)·s13)(n3·s14)·t15``.

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The plan (node costs as in the module docstring).
    counts : mapping str -> float
        Number of input tuples n of each source stream in this instance.

    Examples
    --------
    Figure 5's plan with n_1 = n_2 = n_3 = 100; the selections s_11 = s_12 = 0.1 and s_14 = 0.5 cost
    t_11 = t_12 = t_14 = 1, the first join (s_13 = 0.5) t_13 = 2 per pair, the second t_15 = 0.1:
    ``100 + 100 + 100 + (10·10)·2 + ((10·10)·0.5)·50·0.1 = 750``.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.rtstream import plan_execution_time
    >>> def selection(name, s):
    ...     return P.Select(P.Source(name), s, cost=1)
    >>> first = P.Join(selection("S1", 0.1), selection("S2", 0.1), selectivity=0.5, cost=2)
    >>> plan = P.Join(first, selection("S3", 0.5), cost=0.1)
    >>> plan_execution_time(plan, {"S1": 100, "S2": 100, "S3": 100})
    750.0
    """
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    return _branch(plan, _counts(counts))[0]


def remaining_deadline(deadline: float, now: float) -> float:
    """``D_i = d_i - τ``: time left until the (pseudo-)deadline d_i at time τ (Wei et al., §4.4)."""
    return chk.real(deadline, "deadline") - chk.real(now, "now")


def kept_fraction(estimated_time: float, remaining: float) -> float:
    """ε = D/T, the fraction of input tuples to keep (Wei et al., §4.4); 1 when ``T <= D`` (no drop).

    For a plan without joins T is linear in the number of input tuples, so keeping ``ε·n`` tuples takes
    exactly D. ``remaining <= 0`` gives 0.

    Examples
    --------
    An instance estimated at T = 4 with deadline d_i = 10 at τ = 7 (D_i = 3) keeps ε = 3/4 of its input;
    one estimated at T = 2 keeps all of it.

    >>> from pyspark_cq.cost.rtstream import kept_fraction, remaining_deadline
    >>> remaining = remaining_deadline(10, 7)
    >>> remaining
    3.0
    >>> kept_fraction(4, remaining)
    0.75
    >>> kept_fraction(2, remaining)
    1.0
    """
    t = chk.non_negative(estimated_time, "estimated_time")
    d = chk.real(remaining, "remaining")
    if t <= d:
        return 1.0
    return max(0.0, d / t)


def plan_kept_fraction(plan: P.Node, counts: Mapping[str, float], remaining: float, *,
                       tol: float = 1e-12) -> float:
    """The fraction ε of every input to keep so that the plan finishes in ``remaining`` time.

    Without joins this is :func:`kept_fraction` of :func:`plan_execution_time`. With joins T grows
    faster than linearly in ε (join work is per pair), so ε solves ``T(ε·n) = D`` (by bisection):
    an extension of §4.4, dropping the same fraction from every input (the paper then lets its
    input/quality table set per-stream ratios).

    Examples
    --------
    Two selections in a chain, t = 1 then t = 2, the first keeping half of its input, take
    ``1000·1 + 1000·0.5·2 = 2000`` for 1000 tuples; to finish in 1500 they keep ``1500/2000 = 0.75``. A join
    of 10 by 10 tuples costing 1 per pair takes 100; to finish in 25 it keeps ε with ``(10ε)² = 25``,
    ε = 0.5, not 25/100.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.rtstream import plan_kept_fraction
    >>> chain = P.Select(P.Select(P.Source("A"), 0.5, cost=1), 0.25, cost=2)
    >>> plan_kept_fraction(chain, {"A": 1000}, 1500)
    0.75
    >>> join = P.Join(P.Source("A"), P.Source("B"), cost=1)
    >>> plan_kept_fraction(join, {"A": 10, "B": 10}, 25)
    0.5
    """
    counts = _counts(counts)
    total = plan_execution_time(plan, counts)
    d = chk.real(remaining, "remaining")
    tol = chk.positive(tol, "tol")
    if total <= d:
        return 1.0
    if d <= 0:
        return 0.0
    if not any(isinstance(n, (P.Join, P.Aggregate)) for n in P.postorder(plan)):
        return kept_fraction(total, d)

    def time_at(eps: float) -> float:
        return plan_execution_time(plan, {k: eps * v for k, v in counts.items()})

    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if time_at(mid) <= d:
            lo = mid
        else:
            hi = mid
    return lo
