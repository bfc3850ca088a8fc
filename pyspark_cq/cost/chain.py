"""Chain scheduling: queue sizes of an operator path under four scheduling strategies (STREAM §5.3).

Motwani, Widom, Arasu, Babcock, Babu, Datar, Manku, Olston, Rosenstein & Varma, "Query Processing,
Approximation, and Resource Management in a Data Stream Management System" (STREAM), §5.3, and the Chain
algorithm it summarises (Babcock, Babu, Datar & Motwani, "Chain: Operator Scheduling for Memory
Minimization in Data Stream Systems", SIGMOD 2003).

The model (no Spark). A path of unary operators ``O_1 … O_m``, each with an input queue; operator ``i``
consumes up to ``c_i`` tuples of its queue per time unit and puts ``s_i`` tuples on the next queue for each
one it consumes (the last operator's output leaves the system). Tuples arrive in bursts on the first queue.
Time is discrete: at time ``t`` the arrivals of ``t`` join the first queue, the queues are counted, and
then *one* operator runs during the time unit ``[t, t+1)``: it consumes ``min(c_i, queue)`` tuples from the
head of its queue (the whole unit is spent even when the queue held less, §5.3's "time unit" granularity,
no parallelism). Queues are FIFO and every tuple remembers the arrival time of the tuple it descends from.

Strategies (:data:`STRATEGIES`), each choosing among the operators whose input queue is not empty:

``"chain"``
    Babcock et al.'s Chain: the operator with the highest :func:`priorities` value, i.e. on the steepest
    segment of the lower envelope of the path's progress chart (§5.3: "greedily schedule the operator that
    'consumes' the largest number of tuples per time unit and is the most selective", with chains of
    operators considered together). STREAM's strategy 2.
``"fifo"``
    Every tuple is processed to completion in arrival order (STREAM's strategy 1): the operator holding
    the earliest-arrived tuples runs.
``"greedy"``
    The most selective operator (smallest ``s_i``) runs, whatever the operators before it.
``"round_robin"``
    STREAM's initial scheduler: the operators take turns in path order (an operator with an empty queue
    is skipped).

Ties (and every strategy's ties) go to the operator holding the earliest-arrived tuples, then to the
operator further downstream. The arithmetic is exact (:class:`fractions.Fraction` on the decimal values
of the inputs), so a queue that should empty does empty; results are returned as floats.

Progress chart (Babcock et al.): point ``i`` is ``(x_i, y_i)`` with ``(x_0, y_0) = (0, 1)``,
``y_i = y_{i-1}·s_i`` (the size, in tuples, of what is left of one arriving tuple after ``O_1 … O_i``) and
``x_i = x_{i-1} + y_{i-1}/c_i`` (the processing time spent on it so far: ``O_i`` consumes ``c_i`` of *its
own* input tuples per unit, and one arriving tuple has become ``y_{i-1}`` of them). With capacities
measured in arriving tuples the increments would be ``1/c_i``; with capacities on each operator's own
input, as :func:`simulate` takes them, ``y_{i-1}/c_i`` is the time per arriving tuple (STREAM's O2
"takes one time unit to operate on 0.2b tuples", the output of one batch of b: its point is (2, 0)).
The last point has size 0 whatever ``s_m``: the objective is queue memory, and what the last operator
outputs leaves the system (:func:`simulate` counts input queues only), so running the last operator
frees its whole input. The chart's *lower envelope* (:func:`lower_envelope`) gives each operator its
Chain priority (:func:`priorities`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _args as chk

__all__ = [
    "STRATEGIES", "Trace", "chooser", "progress_chart", "lower_envelope", "priorities", "simulate", "simulate_trace",
]

#: The scheduling strategies :func:`simulate` knows.
STRATEGIES = ("chain", "fifo", "greedy", "round_robin")

_Ops = list[tuple[Fraction, Fraction]]


def _exact(value: float) -> Fraction:
    """The decimal value of a checked float (``0.2`` is 1/5, not its binary approximation)."""
    return Fraction(repr(float(value)))


def _operators(operators) -> _Ops:
    """Check ``operators``: a non-empty sequence of ``(capacity > 0, selectivity >= 0)`` pairs."""
    form = "a non-empty sequence of (tuples consumed per time unit, selectivity) pairs"
    if isinstance(operators, (str, bytes)) or not isinstance(operators, Sequence):
        raise TypeError(f"operators must be {form}, got {operators!r}")
    if not operators:
        raise ValueError(f"operators must be {form}, got an empty sequence")
    out = []
    for i, op in enumerate(operators):
        if isinstance(op, (str, bytes)) or not isinstance(op, Sequence) or len(op) != 2:
            raise TypeError(f"operators[{i}] must be a (tuples consumed per time unit, selectivity) pair, "
                            f"got {op!r}")
        capacity = chk.positive(op[0], f"operators[{i}] capacity (tuples consumed per time unit)")
        selectivity = chk.non_negative(op[1], f"operators[{i}] selectivity")
        out.append((_exact(capacity), _exact(selectivity)))
    return out


def _arrivals(arrivals) -> dict[int, Fraction]:
    chk.instance(arrivals, "arrivals", Mapping, "a mapping {time unit (integer >= 0): tuples arriving}")
    out: dict[int, Fraction] = {}
    for t, n in arrivals.items():
        t = chk.integer(t, f"arrivals time {t!r}", minimum=0)
        out[t] = out.get(t, Fraction(0)) + _exact(chk.non_negative(n, f"arrivals[{t}]"))
    return out


def _chart(ops: _Ops) -> list[tuple[Fraction, Fraction]]:
    points = [(Fraction(0), Fraction(1))]
    for capacity, selectivity in ops:
        x, y = points[-1]
        points.append((x + y / capacity, y * selectivity))
    points[-1] = (points[-1][0], Fraction(0))     # the last operator's output leaves the system
    return points


def _slope(p, q) -> Fraction:
    """Slope from chart point ``p`` to a later point ``q``.

    0 when no time passes: that only happens after a selectivity-0 operator, where ``p`` and ``q`` both
    have size 0 (a guard: the envelope never starts a segment there, ties going to the farthest point).
    """
    dx, dy = q[0] - p[0], q[1] - p[1]
    return dy / dx if dx else Fraction(0)


def _envelope(points) -> list[int]:
    """Indices of the lower envelope's vertices: from the current vertex, the later point with the
    steepest descent (smallest slope), the farthest one on ties (Babcock et al.).
    """
    vertices = [0]
    while vertices[-1] < len(points) - 1:
        cur = vertices[-1]
        best = min(range(cur + 1, len(points)), key=lambda j: (_slope(points[cur], points[j]), -j))
        vertices.append(best)
    return vertices


def _priorities(ops: _Ops) -> list[Fraction]:
    points = _chart(ops)
    vertices = _envelope(points)
    out = []
    for a, b in zip(vertices, vertices[1:]):
        out.extend([-_slope(points[a], points[b])] * (b - a))
    return out


def progress_chart(operators) -> list[tuple[float, float]]:
    """The progress chart of an operator path (Babcock et al.; STREAM §5.3).

    Parameters
    ----------
    operators : sequence of (float, float)
        ``(tuples consumed per time unit c_i > 0, selectivity s_i >= 0)`` along the path, first to last.

    Returns
    -------
    list of (float, float)
        ``m + 1`` points ``(x_i, y_i)``: ``(0, 1)``, then after operator ``i`` the processing time spent on
        one arriving tuple, ``x_i = x_{i-1} + y_{i-1}/c_i``, and what is left of it in the queues,
        ``y_i = s_1·…·s_i`` for ``i < m`` and ``y_m = 0`` (the output leaves the system; module
        docstring).

    Raises
    ------
    ValueError, TypeError
        When ``operators`` is empty or not a sequence of pairs, a capacity is not > 0 or a selectivity
        is negative; the message names the operator.

    Examples
    --------
    STREAM §5.3 in units of b tuples: O1 consumes b tuples per unit with selectivity 0.2, O2 consumes
    0.2b per unit and produces nothing. One arriving tuple takes 1 unit in O1, its 0.2 descendants
    1 more unit in O2.

    >>> from pyspark_cq.cost.chain import progress_chart
    >>> progress_chart([(1, 0.2), (0.2, 0.0)])
    [(0.0, 1.0), (1.0, 0.2), (2.0, 0.0)]
    """
    return [(float(x), float(y)) for x, y in _chart(_operators(operators))]


def lower_envelope(operators) -> list[tuple[float, float]]:
    """The lower envelope of the progress chart: its vertices, from ``(0, 1)`` to the last chart point.

    Babcock et al.'s construction: from the current vertex (first ``(0, 1)``), the next vertex is the later
    chart point reached with the steepest descent (the smallest slope; on ties the farthest point),
    until the last point. The result is the lower convex hull of the chart seen from ``(0, 1)``; each
    operator lies on the envelope segment that spans it (:func:`priorities`).

    Parameters
    ----------
    operators : sequence of (float, float)
        ``(tuples consumed per time unit > 0, selectivity >= 0)`` along the path, first to last.

    Returns
    -------
    list of (float, float)
        The envelope's vertices, a subsequence of :func:`progress_chart` that starts with ``(0, 1)`` and
        ends with the chart's last point; consecutive vertices bound one segment.

    Raises
    ------
    ValueError, TypeError
        On bad ``operators`` (see :func:`progress_chart`).

    Examples
    --------
    A non-reducing operator (s = 1), a selective one (s = 0.1) and a slow last one (0.05 tuples per
    unit): the chart is (0, 1), (1, 1), (2, 0.1), (4, 0); the envelope skips (1, 1), so the first two
    operators share one segment.

    >>> from pyspark_cq.cost.chain import lower_envelope
    >>> lower_envelope([(1, 1.0), (1, 0.1), (0.05, 1.0)])
    [(0.0, 1.0), (2.0, 0.1), (4.0, 0.0)]
    """
    points = _chart(_operators(operators))
    return [(float(points[i][0]), float(points[i][1])) for i in _envelope(points)]


def priorities(operators) -> list[float]:
    """Chain priorities: minus the slope of the lower-envelope segment each operator lies on.

    Babcock et al.'s Chain (summarised in STREAM §5.3): an operator's priority is the rate at which the
    envelope segment containing it reduces the size of a tuple per unit of processing time; operators
    before a steep drop inherit that drop's priority ("we also consider chains of operators", §5.3).
    Higher means scheduled first. Priorities are never negative: the chart ends at size 0, its lowest
    point, so the envelope only descends (a selectivity above 1 lowers the priority of the operators
    sharing its segment instead). Operators after a selectivity-0 operator share its segment (they never
    receive tuples).

    Parameters
    ----------
    operators : sequence of (float, float)
        ``(tuples consumed per time unit > 0, selectivity >= 0)`` along the path, first to last.

    Returns
    -------
    list of float
        One priority per operator, in path order (non-increasing along the path, as the envelope is
        convex).

    Raises
    ------
    ValueError, TypeError
        On bad ``operators`` (see :func:`progress_chart`).

    Examples
    --------
    STREAM §5.3: the chart (0, 1), (1, 0.2), (2, 0) is its own envelope; O1 drops 0.8 per unit, O2 0.2.

    >>> from pyspark_cq.cost.chain import priorities
    >>> priorities([(1, 0.2), (0.2, 0.0)])
    [0.8, 0.2]

    A non-reducing operator feeding a selective one shares its segment, (1 − 0.1)/2 = 0.45 each; the
    slow last operator frees 0.1 in 2 units, 0.05.

    >>> priorities([(1, 1.0), (1, 0.1), (0.05, 1.0)])
    [0.45, 0.45, 0.05]
    """
    return [float(p) for p in _priorities(_operators(operators))]


@dataclass(frozen=True)
class Trace:
    """A simulated run of :func:`simulate_trace`: what was queued, what ran, what left.

    Attributes
    ----------
    queues : list of tuple of float
        ``horizon + 1`` entries: at t = 0 … horizon, after the arrivals of t, each operator's input
        queue size (tuples), first operator first.
    totals : list of float
        The sum of each ``queues`` entry (what :func:`simulate` returns).
    arrived : list of float
        Tuples that arrived at t = 0 … horizon.
    ran : list of int or None
        ``horizon`` entries: the 0-based operator that ran during ``[t, t+1)``, None when every queue
        was empty.
    consumed : list of float
        Tuples the running operator took from its queue during ``[t, t+1)``.
    emitted : list of float
        Tuples the last operator put out (leaving the system) during ``[t, t+1)``.
    """

    queues: list[tuple[float, ...]]
    totals: list[float]
    arrived: list[float]
    ran: list[int | None]
    consumed: list[float]
    emitted: list[float]


class _Queue:
    """A FIFO queue of ``[arrival time, tuples]`` chunks."""

    __slots__ = ("chunks", "size")

    def __init__(self):
        self.chunks: deque[list] = deque()
        self.size = Fraction(0)

    def push(self, arrival: int, n: Fraction) -> None:
        if n <= 0:
            return
        if self.chunks and self.chunks[-1][0] == arrival:
            self.chunks[-1][1] += n
        else:
            self.chunks.append([arrival, n])
        self.size += n

    def take(self, n: Fraction) -> list[tuple[int, Fraction]]:
        """Remove up to ``n`` tuples from the head; the removed chunks."""
        out = []
        while n > 0 and self.chunks:
            head = self.chunks[0]
            k = min(n, head[1])
            out.append((head[0], k))
            head[1] -= k
            n -= k
            self.size -= k
            if head[1] == 0:
                self.chunks.popleft()
        return out

    def oldest(self) -> int:
        return self.chunks[0][0]


_Chooser = Callable[[int, list[_Queue]], "int | None"]


def chooser(strategy: str, priorities: Sequence[float] | None = None,
            selectivities: Sequence[float] | None = None) -> Callable[[Sequence], int | None]:
    """The scheduling rule of ``strategy`` as ``choose(queues) -> operator index or None``.

    The one place the four strategies' choice is written: :func:`simulate` uses it on the model's queues,
    the workers' chunk scheduler (:mod:`pyspark_cq.operators._common.chunks`) on their queues of Arrow batches.
    ``queues`` is a sequence, in path order, of objects with ``size`` (tuples waiting, > 0 means the
    operator may run) and ``oldest()`` (the arrival time of the oldest tuple waiting). Among the operators
    that may run, ``"chain"`` takes the highest priority, ``"greedy"`` the smallest selectivity, ``"fifo"``
    none of these; every strategy then takes the earliest-arrived tuples, then the operator further
    downstream. ``"round_robin"`` takes the next operator in path order after the last one that ran.

    Parameters
    ----------
    strategy : {"chain", "fifo", "greedy", "round_robin"}
        The strategy (:data:`STRATEGIES`).
    priorities : sequence of float, optional
        One per operator (:func:`priorities`); ``"chain"`` without them ranks every operator equally
        (then it chooses as ``"fifo"``).
    selectivities : sequence of float, optional
        One per operator; ``"greedy"`` without them chooses as ``"fifo"``.

    Returns
    -------
    callable
        ``choose(queues)``; None when no queue has tuples. The round-robin rule keeps its turn between calls.

    Raises
    ------
    ValueError, TypeError
        An unknown ``strategy``; ``priorities`` or ``selectivities`` not a sequence of real numbers.
    """
    strategy = chk.one_of(strategy, "strategy", STRATEGIES)
    if strategy == "round_robin":
        state = {"next": 0}

        def turn(queues):
            m = len(queues)
            for k in range(m):
                i = (state["next"] + k) % m
                if queues[i].size > 0:
                    state["next"] = (i + 1) % m
                    return i
            return None
        return turn

    rank = None
    if strategy == "chain" and priorities is not None:
        rank = _ranks(priorities, "priorities")
    elif strategy == "greedy" and selectivities is not None:
        rank = [-s for s in _ranks(selectivities, "selectivities")]

    def choose(queues):
        ready = [i for i, q in enumerate(queues) if q.size > 0]
        if not ready:
            return None
        if rank is None:
            return max(ready, key=lambda i: (-queues[i].oldest(), i))
        return max(ready, key=lambda i: (rank[i], -queues[i].oldest(), i))
    return choose


def _ranks(values, name: str) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of real numbers, one per operator, got {values!r}")
    return [v if isinstance(v, Fraction) else chk.real(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _chooser(strategy: str, ops: _Ops) -> _Chooser:
    """The strategy on the model's path as ``choose(t, queues) -> operator index or None``."""
    rule = chooser(strategy, priorities=_priorities(ops) if strategy == "chain" else None,
                   selectivities=[s for _, s in ops])
    return lambda t, queues: rule(queues)


def _run(ops: _Ops, arrivals: dict[int, Fraction], choose: _Chooser, horizon: int) -> Trace:
    queues = [_Queue() for _ in ops]
    out_queues, arrived, ran, consumed, emitted = [], [], [], [], []
    for t in range(horizon + 1):
        n = arrivals.get(t, Fraction(0))
        queues[0].push(t, n)
        arrived.append(float(n))
        out_queues.append(tuple(float(q.size) for q in queues))
        if t == horizon:
            break
        i = choose(t, queues)
        ran.append(i)
        if i is None:
            consumed.append(0.0)
            emitted.append(0.0)
            continue
        capacity, selectivity = ops[i]
        taken = queues[i].take(capacity)
        consumed.append(float(sum(k for _, k in taken)))
        out = Fraction(0)
        for arrival, k in taken:
            if i + 1 < len(ops):
                queues[i + 1].push(arrival, k * selectivity)
            else:
                out += k * selectivity
        emitted.append(float(out))
    totals = [float(sum(_exact(v) for v in q)) for q in out_queues]
    return Trace(out_queues, totals, arrived, ran, consumed, emitted)


def simulate_trace(operators, arrivals, strategy, horizon) -> Trace:
    """Simulate a scheduling strategy on an operator path and keep the details (:class:`Trace`).

    Same arguments and model as :func:`simulate`, which returns ``simulate_trace(...).totals``.

    Parameters
    ----------
    operators : sequence of (float, float)
        ``(tuples consumed per time unit > 0, selectivity >= 0)`` along the path, first to last.
    arrivals : mapping of int to float
        ``{time unit >= 0: tuples}`` arriving at the first operator's input queue.
    strategy : str
        One of :data:`STRATEGIES`.
    horizon : int
        Last time unit counted (``>= 0``).

    Returns
    -------
    Trace
        Queue sizes at t = 0 … horizon and, per time unit, the operator run, what it consumed and what
        left the system.

    Raises
    ------
    ValueError, TypeError
        On bad arguments (see :func:`simulate`).

    Examples
    --------
    STREAM §5.3, strategy 1: O1 and O2 alternate on each batch of b tuples.

    >>> from pyspark_cq.cost.chain import simulate_trace
    >>> simulate_trace([(1, 0.2), (0.2, 0.0)], {0: 2, 2: 1, 3: 1}, "fifo", 8).ran
    [0, 1, 0, 1, 0, 1, 0, 1]
    """
    ops = _operators(operators)
    arr = _arrivals(arrivals)
    strategy = chk.one_of(strategy, "strategy", STRATEGIES)
    horizon = chk.integer(horizon, "horizon", minimum=0)
    return _run(ops, arr, _chooser(strategy, ops), horizon)


def simulate(operators, arrivals, strategy, horizon) -> list[float]:
    """Total queued tuples over time when an operator path is scheduled by ``strategy`` (STREAM §5.3).

    Motwani et al. §5.3 and Babcock et al.'s Chain. One operator runs per time unit and consumes up to
    its capacity from its input queue (using the full unit even when the queue holds less); its output
    joins the next operator's queue, the last operator's output leaves the system. ``"chain"`` runs the
    operator on the steepest lower-envelope segment (:func:`priorities`), ``"fifo"`` processes every
    tuple to completion in arrival order, ``"greedy"`` the most selective operator with input,
    ``"round_robin"`` the operators in turn; ties go to the earliest-arrived tuples, then to the operator
    further downstream. See the module docstring for the full model.

    Parameters
    ----------
    operators : sequence of (float, float)
        ``(tuples consumed per time unit > 0, selectivity >= 0)`` along one path, first to last.
    arrivals : mapping of int to float
        ``{time unit >= 0: tuples >= 0}`` arriving at the first operator's input queue (arrivals after
        ``horizon`` are ignored).
    strategy : {"chain", "fifo", "greedy", "round_robin"}
        The scheduling strategy (:data:`STRATEGIES`).
    horizon : int
        Last time unit counted, ``>= 0``.

    Returns
    -------
    list of float
        ``horizon + 1`` values: the tuples queued in all input queues at t = 0 … horizon, counted after
        the arrivals of time t (and before the operator of ``[t, t+1)`` runs).

    Raises
    ------
    ValueError, TypeError
        An empty or malformed ``operators``, a capacity ``<= 0`` or a selectivity ``< 0`` (naming
        ``operators[i]``), ``arrivals`` not a mapping or with a negative or non-integer time or a negative
        count, an unknown ``strategy``, a ``horizon`` that is not an integer ``>= 0``.

    Examples
    --------
    STREAM §5.3, in units of b tuples: O1 consumes b tuples per unit (selectivity 0.2), O2 consumes 0.2b
    per unit and produces nothing; 2b tuples arrive at t = 0, b at t = 2 and b at t = 3. The paper's
    table, strategy 1 (``"fifo"``) and strategy 2 (``"chain"``):

    >>> from pyspark_cq.cost.chain import simulate
    >>> path, arrivals = [(1, 0.2), (0.2, 0.0)], {0: 2, 2: 1, 3: 1}
    >>> simulate(path, arrivals, "fifo", 8)
    [2.0, 1.2, 2.0, 2.2, 2.0, 1.2, 1.0, 0.2, 0.0]
    >>> simulate(path, arrivals, "chain", 8)
    [2.0, 1.2, 1.4, 1.6, 0.8, 0.6, 0.4, 0.2, 0.0]
    """
    return simulate_trace(operators, arrivals, strategy, horizon).totals
