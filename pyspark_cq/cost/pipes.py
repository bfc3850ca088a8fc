"""PIPES cost model: stream characteristics (d, l, g), output characteristics, memory and CPU costs.

Cammert, Krämer, Seeger & Vaupel, "A Cost Model for Adaptive Resource Management in Data Stream
Systems" (PIPES). A physical stream is described by ``(d, l, g)`` (§3.2): the average time distance d
between successive start timestamps, the average length l of validity intervals, and the distance g
of its time granularity. Cost Formulas 1–8 (§3.3.3) give an operator's output characteristics from
its inputs'; formulas (9)–(19) (§3.4–§3.6) its memory M_op (elements in its state, times their size)
and processing cost C_op per unit of application time, from constants held in a :class:`CostProfile`.
A plan is costed bottom up (§3.3.1) by :func:`cost_plan`, summing the operators' costs (§3.4).

All times are in the same unit of application time (the paper's finest granularity is 1).
The *empty* stream is ``d = inf, l = 0`` (§3.3.2).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _args as chk
from .. import plan as P
from ..estimators._formulas import ses_step

__all__ = [
    "StreamCharacteristics", "CostProfile",
    "projection_output", "selection_output", "union_output", "cartesian_output", "join_output",
    "aggregation_output", "group_aggregation_output", "window_output", "granularity_output",
    "selection_processing", "projection_processing", "union_processing",
    "window_memory", "window_processing", "granularity_processing",
    "join_state_sizes", "join_memory", "JoinProcessing", "join_processing", "watermark_retention",
    "aggregation_state_size", "aggregation_memory", "AggregationProcessing", "aggregation_processing",
    "group_aggregation_memory", "group_aggregation_processing",
    "NodeCost", "PlanCost", "cost_plan", "cost_from_distances",
    "window_change_delay", "granularity_change_delay",
    "join_state_rows", "aggregation_state_rows",
]


# ---------------------------------------------------------------------------------------------
# stream characteristics


@dataclass(frozen=True)
class StreamCharacteristics:
    """The characteristics ``(d, l, g)`` of a physical stream (Cammert et al., §3.2).

    Parameters
    ----------
    d : float
        Average time distance between successive start timestamps, > 0; ``inf`` for the empty stream.
        ``1/d`` is the stream rate. Estimate it with :class:`pyspark_cq.estimators.MeanDistance`.
    l : float
        Average length of the validity intervals, >= 0; 0 exactly for the empty stream. A source
        stream has ``l = 1`` (one instant, §3.2.2).
    g : float
        Distance of the time granularity, > 0 (1: the finest granularity).
    """

    d: float
    l: float  # noqa: E741 - the paper's name
    g: float = 1.0

    def __post_init__(self):
        d = chk.positive(self.d, "d", allow_inf=True)
        length = chk.non_negative(self.l, "l")
        g = chk.positive(self.g, "g")
        if math.isinf(d) != (length == 0):
            raise ValueError("the empty stream has d = inf and l = 0 together (PIPES §3.3.2); "
                             f"got d={d}, l={length}")
        object.__setattr__(self, "d", d)
        object.__setattr__(self, "l", length)
        object.__setattr__(self, "g", g)

    @classmethod
    def empty_stream(cls, g: float = 1.0) -> StreamCharacteristics:
        """The empty stream ``(inf, 0, g)``."""
        return cls(math.inf, 0.0, g)

    @property
    def empty(self) -> bool:
        """True for the empty stream."""
        return math.isinf(self.d)

    @property
    def rate(self) -> float:
        """Elements per unit of application time, ``1/d``."""
        return 1.0 / self.d


SC = StreamCharacteristics


def _sc(value, name: str) -> StreamCharacteristics:
    return chk.instance(value, name, StreamCharacteristics, "StreamCharacteristics(d, l, g)")


def _same_granularity(streams: Sequence[StreamCharacteristics], name: str) -> float:
    g = streams[0].g
    if any(not math.isclose(s.g, g) for s in streams):
        raise ValueError(f"{name} must have equal granularities g (PIPES §3.3.2: apply Γ to the finest common "
                         f"granularity first); got {[s.g for s in streams]}")
    return g


# ---------------------------------------------------------------------------------------------
# output characteristics: Cost Formulas 1-8


def projection_output(s: StreamCharacteristics) -> StreamCharacteristics:
    """Cost Formula 1 (projection π): ``d' = d, l' = l, g' = g`` (Cammert et al., §3.3.3, eq. 1)."""
    return _sc(s, "s")


def selection_output(s: StreamCharacteristics, selectivity: float) -> StreamCharacteristics:
    """Cost Formula 2 (selection σ): ``d' = d/sel, l' = l, g' = g`` with 0 < sel <= 1 (§3.3.3, eq. 2)."""
    _sc(s, "s")
    sel = chk.probability(selectivity, "selectivity", allow_zero=False)
    return s if s.empty else SC(s.d / sel, s.l, s.g)


def union_output(*inputs: StreamCharacteristics) -> StreamCharacteristics:
    """Cost Formula 3 (union ∪ of n streams), Cammert et al. §3.3.3, eq. 3.

    ``d' = 1/Σ(1/d_i)``, ``l' = Σ(l_i/d_i) / Σ(1/d_i)``: rates add and l' is the rate-weighted mean.
    """
    if not inputs:
        raise ValueError("inputs must hold at least one StreamCharacteristics")
    for i, s in enumerate(inputs):
        _sc(s, f"inputs[{i}]")
    g = _same_granularity(inputs, "inputs")
    rate = sum(1.0 / s.d for s in inputs)
    if rate == 0:
        return SC.empty_stream(g)
    return SC(1.0 / rate, sum(s.l / s.d for s in inputs) / rate, g)


def cartesian_output(s1: StreamCharacteristics, s2: StreamCharacteristics) -> StreamCharacteristics:
    """Cost Formula 4 (Cartesian product ×), Cammert et al. §3.3.3, eq. 4.

    ``d' = d1·d2/(l1 + l2)``, ``l' = l1·l2/(l1 + l2)`` (average overlap of two intervals).
    """
    _sc(s1, "s1")
    _sc(s2, "s2")
    g = _same_granularity((s1, s2), "s1 and s2")
    if s1.empty or s2.empty:
        return SC.empty_stream(g)
    return SC(s1.d * s2.d / (s1.l + s2.l), s1.l * s2.l / (s1.l + s2.l), g)


def join_output(s1: StreamCharacteristics, s2: StreamCharacteristics, selectivity: float) -> StreamCharacteristics:
    """A join with selectivity σ⋈: a Cartesian product followed by a selection (Cammert et al., §3.3.3,
    end of Cost Formula 4's discussion), i.e. Formula 2 applied to Formula 4.

    Examples
    --------
    Formula 4 gives ``d' = 2·4/(10 + 30) = 0.2`` and ``l' = 10·30/(10 + 30) = 7.5``; a join selectivity of
    0.5 then doubles d' (Formula 2).

    >>> from pyspark_cq.cost.pipes import StreamCharacteristics, cartesian_output, join_output
    >>> left, right = StreamCharacteristics(d=2, l=10), StreamCharacteristics(d=4, l=30)
    >>> cartesian_output(left, right)
    StreamCharacteristics(d=0.2, l=7.5, g=1.0)
    >>> join_output(left, right, 0.5)
    StreamCharacteristics(d=0.4, l=7.5, g=1.0)
    """
    return selection_output(cartesian_output(s1, s2), selectivity)


def _hit_fraction(d: float, g: float, timestamps_per_element: int) -> float:
    """``1 - (1 - 1/d)^(k·g)``: the share of granularity instants hit by a start or end timestamp.

    The Cardenas-style estimate behind Cost Formula 5 (k = 2: start and end timestamps) and
    formulas (15) and (17) (k = 1: end timestamps only). For ``d <= 1`` every instant is hit (the base
    ``1 - 1/d`` is clipped at 0; the paper's substitution X = g·d assumes d >= 1).
    """
    return 1.0 - max(0.0, 1.0 - 1.0 / d) ** (timestamps_per_element * g)


def aggregation_output(s: StreamCharacteristics, *, regular: bool = False) -> StreamCharacteristics:
    """Cost Formula 5 (scalar aggregation α), Cammert et al. §3.3.3, eq. 5.

    ``d' = l' = g / (1 - (1 - 1/d)^(2g))`` if ``d < l``, else ``d' = d, l' = l``. With ``regular``
    (constant distances, constant lengths, l a multiple of d: the paper's extreme case) ``d' = l' = d``.
    """
    _sc(s, "s")
    if s.empty or s.d >= s.l:
        return s
    if regular:
        return SC(s.d, s.d, s.g)
    dp = s.g / _hit_fraction(s.d, s.g, 2)
    return SC(dp, dp, s.g)


def _per_group(s: StreamCharacteristics, groups: int) -> StreamCharacteristics:
    """The stream of one of ``groups`` equally likely groups: ``d_i = n·d, l_i = l`` (Formula 6)."""
    groups = chk.integer(groups, "groups", minimum=1)
    return s if s.empty else SC(groups * s.d, s.l, s.g)


def group_aggregation_output(s: StreamCharacteristics, groups: int) -> StreamCharacteristics:
    """Cost Formula 6 (group-by with aggregation γ, n groups), Cammert et al. §3.3.3, eq. 6.

    Computed as the paper derives it: the union (Formula 3) of n scalar aggregations (Formula 5) of
    the per-group streams ``(n·d, l, g)``.
    """
    _sc(s, "s")
    part = aggregation_output(_per_group(s, groups))
    return union_output(*([part] * groups))


def _window_length(size: float, g: float) -> float:
    return math.floor((size + 1) / g) * g


def window_output(s: StreamCharacteristics, size: float, *, kind: str = "time") -> StreamCharacteristics:
    """Cost Formula 7 (window ω of size w), Cammert et al. §3.3.3, eq. 7.

    ``d' = g·d/l``, ``l' = ⌊(w+1)/g⌋·g``. A tuple-based window of c elements is costed as a time-based
    window of ``w = c/λ = c·d`` (§2.4.2). A window shorter than one granule gives the empty stream.

    Examples
    --------
    A source of 100 elements per second with times in milliseconds (d = 10, l = 1: one instant,
    §3.2.2) behind a 10 s window: ``d' = g·d/l = 10`` and ``l' = ⌊(10000 + 1)/1⌋·1 = 10001``.

    >>> from pyspark_cq.cost.pipes import StreamCharacteristics, window_output
    >>> source = StreamCharacteristics(d=10, l=1)
    >>> window_output(source, 10_000)
    StreamCharacteristics(d=10.0, l=10001.0, g=1.0)

    A tuple-based window of 50 elements is costed as a time-based window of ``w = c·d = 500``:

    >>> window_output(source, 50, kind="tuple")
    StreamCharacteristics(d=10.0, l=501.0, g=1.0)
    """
    _sc(s, "s")
    chk.one_of(kind, "kind", P.WINDOW_KINDS)
    if kind == "tuple":
        size = chk.integer(size, "size", minimum=1) * s.d
    else:
        size = chk.non_negative(size, "size")
    if s.empty:
        return s
    length = _window_length(size, s.g)
    if length == 0:
        return SC.empty_stream(s.g)
    return SC(s.g * s.d / s.l, length, s.g)


def granularity_output(s: StreamCharacteristics, granularity: float) -> StreamCharacteristics:
    """Cost Formula 8 (granularity Γ with new distance ĝ >= g), Cammert et al. §3.3.3, eq. 8.

    ``(d, l - ĝ, ĝ)`` if ``l >= 2ĝ``; ``(d·ĝ/(l - ĝ), ĝ, ĝ)`` if ``ĝ < l < 2ĝ``; the empty stream
    otherwise. ``ĝ = g`` changes nothing (no rounding happens).

    Examples
    --------
    The three cases of Formula 8 with ``ĝ = 1000``: ``l >= 2ĝ`` shortens the intervals by ĝ;
    ``ĝ < l < 2ĝ`` keeps the share ``(l - ĝ)/ĝ = 1/2`` of the elements, which doubles d; a shorter l gives
    the empty stream.

    >>> from pyspark_cq.cost.pipes import StreamCharacteristics, granularity_output
    >>> granularity_output(StreamCharacteristics(d=10, l=10_001), 1000)
    StreamCharacteristics(d=10.0, l=9001.0, g=1000.0)
    >>> granularity_output(StreamCharacteristics(d=10, l=1500), 1000)
    StreamCharacteristics(d=20.0, l=1000.0, g=1000.0)
    >>> granularity_output(StreamCharacteristics(d=10, l=800), 1000)
    StreamCharacteristics(d=inf, l=0.0, g=1000.0)
    """
    _sc(s, "s")
    gh = chk.positive(granularity, "granularity")
    if gh < s.g and not math.isclose(gh, s.g):
        raise ValueError(f"granularity must be at least the input's granularity g = {s.g} (Γ coarsens; "
                         f"PIPES §2.4.3, Formula 8), got {gh}")
    if math.isclose(gh, s.g) or s.empty:
        return s
    if s.l >= 2 * gh:
        return SC(s.d, s.l - gh, gh)
    if s.l > gh:
        return SC(s.d * gh / (s.l - gh), gh, gh)
    return SC.empty_stream(gh)


# ---------------------------------------------------------------------------------------------
# cost constants


@dataclass(frozen=True)
class CostProfile:
    """The cost constants of PIPES's memory and processing formulas (Cammert et al., §3.5–§3.6).

    Each constant is a time per event; with every constant 1 (the default) the processing costs count
    events per unit of application time. Sizes are in bytes per element; with size 1 (the default)
    memory counts elements. The paper uses the symbol C_P (and C_F, C_R) for two different events;
    they get two names here.

    ======================  ======  ======================================================  ========
    field                   symbol  event                                                   section
    ======================  ======  ======================================================  ========
    selection_predicate     C_P     one evaluation of a selection predicate                 §3.5
    projection_function     C_F     one evaluation of a projection function                 §3.5
    append                  C_T     appending one element to the output (union)             §3.5
    set_timestamp           C_S     setting a timestamp (window)                            §3.6.1
    queue                   C_Q     enqueue or dequeue (tuple-based window)                 §3.6.1
    round_timestamp         C_R     rounding a timestamp (granularity)                      §3.6.2
    hash_function           C_H     a call of the hash function                             Table 1
    bucket_operation        C_B     a hash bucket insertion or removal                      Table 1
    join_predicate          C_P     a call of the join predicate incl. temporal overlap     Table 1
    build_result            C_F     building a join result                                  Table 1
    expiration_predicate    C_E     a call of the expiration predicate                      Table 1
    heap_restructure        C_R     restructuring the heap on insertion/removal of its top  Table 1
    aggregate_update        C_U     updating an aggregate                                   Table 2
    aggregate_init          C_I     initialising an aggregate                               Table 2
    overlap_check           C_O     checking two elements for temporal overlap              Table 2
    list_operation          C_L     a list append or remove-first                           Table 2
    element_size            s_i     size of an input element of a join (bytes)              Table 1
    aggregate_size          s       size of an aggregate in the state (bytes)               Table 2
    hash_buckets            #B_i    hash buckets per status structure of a hash join        Table 1
    ======================  ======  ======================================================  ========
    """

    selection_predicate: float = 1.0
    projection_function: float = 1.0
    append: float = 1.0
    set_timestamp: float = 1.0
    queue: float = 1.0
    round_timestamp: float = 1.0
    hash_function: float = 1.0
    bucket_operation: float = 1.0
    join_predicate: float = 1.0
    build_result: float = 1.0
    expiration_predicate: float = 1.0
    heap_restructure: float = 1.0
    aggregate_update: float = 1.0
    aggregate_init: float = 1.0
    overlap_check: float = 1.0
    list_operation: float = 1.0
    element_size: float = 1.0
    aggregate_size: float = 1.0
    hash_buckets: float = 1.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("element_size", "aggregate_size"):
                value = chk.positive(value, f.name)
            elif f.name == "hash_buckets":
                value = chk.positive(value, f.name)
                if value < 1:
                    raise ValueError(f"hash_buckets must be >= 1, got {value}")
            else:
                value = chk.non_negative(value, f.name)
            object.__setattr__(self, f.name, value)

    @classmethod
    def event_names(cls) -> tuple[str, ...]:
        """Names of the per-event time constants (the fields :meth:`calibrate` can fit)."""
        return tuple(f.name for f in dataclasses.fields(cls)
                     if f.name not in ("element_size", "aggregate_size", "hash_buckets"))

    def replace(self, **changes) -> CostProfile:
        """A copy with ``changes`` applied (validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown cost constant(s) {sorted(unknown)}; known: {self.event_names()}")
        return dataclasses.replace(self, **changes)

    def calibrate(self, counts: Sequence[Mapping[str, float]], times: Sequence[float], *,
                  smoothing: float | None = None) -> CostProfile:
        """Fit the per-event constants to measurements.

        PIPES "determined concrete values for the cost variables … and counted the corresponding events at
        runtime" (Cammert et al., §5). Given, for each of m measurement intervals, the number of events of
        each kind (``counts[i]``, e.g. ``{"hash_function": 1e5, "join_predicate": 3e6}``) and the time the
        operator spent (``times[i]``), the constants are the non-negative least-squares solution of
        ``counts · constants = times``. Constants that no measurement counts keep their value.

        With ``smoothing = α`` the fitted values are blended into the current ones by single exponential
        smoothing, ``C = C·(1-α) + C_new·α``, as RTStream maintains its cost constants (Wei et al.,
        §4.1.3).
        """
        if isinstance(counts, Mapping) or not isinstance(counts, Sequence):
            raise TypeError("counts must be a sequence of mappings {constant name: event count}")
        times = chk.real_array(times, "times")
        if len(counts) != times.size or times.size == 0:
            raise ValueError(f"counts and times must have the same non-zero length; got {len(counts)} and {times.size}")
        if (times < 0).any():
            raise ValueError("times must be >= 0")
        known = set(self.event_names())
        names: list[str] = []
        for i, row in enumerate(counts):
            chk.instance(row, f"counts[{i}]", Mapping, "a mapping {constant name: event count}")
            for name, value in row.items():
                if name not in known:
                    raise ValueError(f"counts[{i}] names unknown constant {name!r}; known: {sorted(known)}")
                chk.non_negative(value, f"counts[{i}][{name!r}]")
                if name not in names:
                    names.append(name)
        if smoothing is not None:
            alpha = chk.fraction(smoothing, "smoothing")
        matrix = np.array([[float(row.get(n, 0.0)) for n in names] for row in counts])
        fitted = _nnls(matrix, times)
        changes = {}
        for name, value in zip(names, fitted):
            old = getattr(self, name)
            changes[name] = ses_step(old, float(value), alpha) if smoothing is not None else float(value)
        return self.replace(**changes)


def _nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares ``min ||a·x - b||, x >= 0`` (Lawson & Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    eps = np.finfo(float).eps
    # Tolerance of the gradient w = aᵀ(b − a·x), which is in the units of aᵀ·b.
    tol = 10 * eps * np.linalg.norm(a, 1) * max(m, n) * max(1.0, float(np.abs(b).max(initial=0.0)))
    for _ in range(max_iter or 3 * n + 10):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            # The solution has its own scale (e.g. 1e-8 s per event for counts of 1e6 and times of 1e-2 s):
            # compare it with a tolerance relative to itself, not to the gradient's.
            ztol = 10 * eps * float(np.abs(z).max(initial=0.0))
            if (z[passive] > ztol).all():
                x = z
                break
            mask = passive & (z <= ztol)
            step = np.min(x[mask] / (x[mask] - z[mask]))
            x = x + step * (z - x)
            passive &= x > 10 * eps * float(np.abs(x).max(initial=0.0))
            x[~passive] = 0.0
            if not passive.any():
                break
    return x


def _profile(value) -> CostProfile:
    return chk.instance(value, "profile", CostProfile, "a CostProfile")


# ---------------------------------------------------------------------------------------------
# stateless operators, window and granularity (§3.5, §3.6.1, §3.6.2)


def selection_processing(s: StreamCharacteristics, profile: CostProfile = CostProfile()) -> float:
    """``C_σ = C_P/d`` for input ``s``; ``M_σ = 0`` (Cammert et al., §3.5)."""
    return _sc(s, "s").rate * _profile(profile).selection_predicate


def projection_processing(s: StreamCharacteristics, profile: CostProfile = CostProfile()) -> float:
    """``C_π = C_F/d`` for input ``s``; ``M_π = 0`` (Cammert et al., §3.5)."""
    return _sc(s, "s").rate * _profile(profile).projection_function


def union_processing(inputs: Sequence[StreamCharacteristics], profile: CostProfile = CostProfile()) -> float:
    """``C_∪ = C_T/d'`` with d' the union's output distance (Formula 3); ``M_∪ = 0`` (§3.5)."""
    if isinstance(inputs, StreamCharacteristics) or not isinstance(inputs, Sequence):
        raise TypeError("inputs must be a sequence of StreamCharacteristics")
    return union_output(*inputs).rate * _profile(profile).append


def window_memory(s: StreamCharacteristics, size: float, *, kind: str = "time",
                  element_size: float = 1.0) -> float:
    """``M_ω``: 0 for a time-based window; ``c·s`` for a tuple-based one of c elements (§3.6.1)."""
    _sc(s, "s")
    chk.one_of(kind, "kind", P.WINDOW_KINDS)
    element_size = chk.positive(element_size, "element_size")
    if kind == "time":
        chk.non_negative(size, "size")
        return 0.0
    return chk.integer(size, "size", minimum=1) * element_size


def window_processing(s: StreamCharacteristics, *, kind: str = "time", profile: CostProfile = CostProfile()) -> float:
    """``C_ω``: ``C_S/d`` (time-based) or ``(2·C_Q + C_S)/d`` (tuple-based), Cammert et al. §3.6.1."""
    _sc(s, "s")
    chk.one_of(kind, "kind", P.WINDOW_KINDS)
    p = _profile(profile)
    per_element = p.set_timestamp + (2 * p.queue if kind == "tuple" else 0.0)
    return s.rate * per_element


def granularity_processing(s: StreamCharacteristics, profile: CostProfile = CostProfile()) -> float:
    """``C_Γ = 2·C_R/d`` (two timestamps rounded per element); ``M_Γ = 0`` (Cammert et al., §3.6.2)."""
    return _sc(s, "s").rate * 2 * _profile(profile).round_timestamp


# ---------------------------------------------------------------------------------------------
# join (§3.6.3)


def _join_side(own: StreamCharacteristics, other: StreamCharacteristics) -> float:
    """``⌈l_i/d_i⌉ + d_j/(2·d_i)``: elements in status structure i on average (see eq. 9)."""
    if own.empty:
        return 0.0
    if other.empty:
        return math.inf  # no element of the other input ever triggers a reorganisation
    return math.ceil(own.l / own.d) + other.d / (2 * own.d)


def join_state_sizes(s1: StreamCharacteristics, s2: StreamCharacteristics) -> tuple[float, float]:
    """Average number of elements in the two status structures of a symmetric join.

    ``⌈l1/d1⌉ + d2/(2·d1)`` and ``⌈l2/d2⌉ + d1/(2·d2)`` (Cammert et al., §3.6.3, the terms of eq. 9):
    after a reorganisation structure i holds the elements overlapping the incoming one, and grows by
    ``d_j/d_i`` until the next.
    """
    _sc(s1, "s1")
    _sc(s2, "s2")
    _same_granularity((s1, s2), "s1 and s2")
    return _join_side(s1, s2), _join_side(s2, s1)


def join_memory(s1: StreamCharacteristics, s2: StreamCharacteristics, *,
                sizes: tuple[float, float] = (1.0, 1.0)) -> float:
    """Equation (9): ``M_⋈ ≈ (⌈l1/d1⌉ + d2/(2d1))·s1 + (⌈l2/d2⌉ + d1/(2d2))·s2`` (Cammert et al., §3.6.3).

    Examples
    --------
    Status structure 1 holds ``⌈10/2⌉ + 4/(2·2) = 6`` elements on average, structure 2
    ``⌈30/4⌉ + 2/(2·4) = 8.25``; with elements of 100 and 40 bytes that is ``6·100 + 8.25·40 = 930`` bytes.

    >>> from pyspark_cq.cost.pipes import StreamCharacteristics, join_memory, join_state_sizes
    >>> left, right = StreamCharacteristics(d=2, l=10), StreamCharacteristics(d=4, l=30)
    >>> join_state_sizes(left, right)
    (6.0, 8.25)
    >>> join_memory(left, right, sizes=(100, 40))
    930.0

    The join of PIPES's third experiment (§5.3): two streams of 100 elements per second (d = 10 ms) behind
    10 s windows (Formula 7: l = 10001 ms) hold ``2·(⌈10001/10⌉ + 10/20) = 2003`` elements.

    >>> windowed = StreamCharacteristics(d=10, l=10_001)
    >>> join_memory(windowed, windowed)
    2003.0
    """
    if not isinstance(sizes, Sequence) or len(sizes) != 2:
        raise TypeError(f"sizes must be a pair (s1, s2) of element sizes, got {sizes!r}")
    sz1, sz2 = chk.positive(sizes[0], "sizes[0]"), chk.positive(sizes[1], "sizes[1]")
    n1, n2 = join_state_sizes(s1, s2)
    return n1 * sz1 + n2 * sz2


@dataclass(frozen=True)
class JoinProcessing:
    """Processing cost of a join per unit of application time, by part (eqs. 10–14)."""

    insert: float
    probe: float
    result: float
    reorg: float

    @property
    def total(self) -> float:
        """Equation (10): ``C_⋈ ≈ C_insert + C_probe + C_result + C_reorg``."""
        return self.insert + self.probe + self.result + self.reorg


def join_processing(s1: StreamCharacteristics, s2: StreamCharacteristics, selectivity: float, *,
                    method: str = "hash", profile: CostProfile = CostProfile()) -> JoinProcessing:
    """Processing cost of the symmetric hash join, equations (10)–(14) (Cammert et al., §3.6.3).

    - (11) ``C_insert = (1/d1 + 1/d2)·(C_H + C_B + C_R)``
    - (12) ``C_probe = (l2/#B2 + l1/#B1)/(d1·d2)·C_P + (1/d1 + 1/d2)·C_H``
    - (13) ``C_result = σ⋈·(l1 + l2)/(d1·d2)·C_F``, i.e. the join's output rate (Formulas 2 and 4)
      times C_F
    - (14) ``C_reorg = (1/d1 + 1/d2)·(2·C_E + C_B + C_R)``

    The symmetric nested-loops join is the special case of one bucket and ``C_H = 0``
    (``method="nested_loops"``).
    """
    chk.one_of(method, "method", P.JOIN_METHODS)
    p = _profile(profile)
    _sc(s1, "s1")
    _sc(s2, "s2")
    out = join_output(s1, s2, selectivity)
    buckets, hash_cost = (1.0, 0.0) if method == "nested_loops" else (p.hash_buckets, p.hash_function)
    arrivals = s1.rate + s2.rate
    probe_pairs = 0.0 if (s1.empty or s2.empty) else (s2.l / buckets + s1.l / buckets) / (s1.d * s2.d)
    return JoinProcessing(
        insert=arrivals * (hash_cost + p.bucket_operation + p.heap_restructure),
        probe=probe_pairs * p.join_predicate + arrivals * hash_cost,
        result=out.rate * p.build_result,
        reorg=arrivals * (2 * p.expiration_predicate + p.bucket_operation + p.heap_restructure),
    )


# ---------------------------------------------------------------------------------------------
# aggregation (§3.6.4)


def _end_splits(s: StreamCharacteristics) -> float:
    """``(l/g)·(1 - (1 - 1/d)^g)``: end timestamps falling into an interval of length l (eqs. 15, 17)."""
    return s.l / s.g * _hit_fraction(s.d, s.g, 1)


def aggregation_state_size(s: StreamCharacteristics) -> float:
    """Aggregates in the state of α: ``⌈(l/g)·(1 - (1 - 1/d)^g)⌉`` for ``d < l``, else 1 (eq. 15).

    Cammert et al., §3.6.4; 0 for the empty stream.
    """
    _sc(s, "s")
    if s.empty:
        return 0.0
    if s.d >= s.l:
        return 1.0
    return float(math.ceil(_end_splits(s)))


def aggregation_memory(s: StreamCharacteristics, *, size: float = 1.0) -> float:
    """Equation (15): ``M_α ≈ ⌈(l/g)·(1 - (1 - 1/d)^g)⌉·s`` for ``d < l``, else ``s`` (§3.6.4)."""
    return aggregation_state_size(s) * chk.positive(size, "size")


@dataclass(frozen=True)
class AggregationProcessing:
    """Processing cost of an aggregation per unit of application time, by part (eqs. 16–19)."""

    update: float
    new: float
    reorg: float

    @property
    def total(self) -> float:
        """Equation (16): ``C_α ≈ C_update + C_new + C_reorg``."""
        return self.update + self.new + self.reorg


def aggregation_processing(s: StreamCharacteristics, profile: CostProfile = CostProfile()) -> AggregationProcessing:
    """Processing cost of the scalar aggregation α, equations (16)–(19) (Cammert et al., §3.6.4).

    - (17) ``C_update = (l/(d·g))·(1 - (1 - 1/d)^g)·(C_O + C_U)`` if ``d < l``, else 0
    - (18) ``C_new = C_L/d + C_I/(2d)`` if ``d < l``, else ``(C_L + C_I)/d``
    - (19) ``C_reorg = (C_O + C_L)/d' + C_O/d`` with d' from Cost Formula 5
    """
    _sc(s, "s")
    p = _profile(profile)
    if s.empty:
        return AggregationProcessing(0.0, 0.0, 0.0)
    overlapping = s.d < s.l
    update = _end_splits(s) / s.d * (p.overlap_check + p.aggregate_update) if overlapping else 0.0
    init_share = 0.5 if overlapping else 1.0  # (18): half of the new aggregates are initialised when d < l
    new = (p.list_operation + init_share * p.aggregate_init) / s.d
    reorg = aggregation_output(s).rate * (p.overlap_check + p.list_operation) + p.overlap_check / s.d
    return AggregationProcessing(update, new, reorg)


def group_aggregation_memory(s: StreamCharacteristics, groups: int, *, size: float = 1.0) -> float:
    """Memory of γ with n groups: n times eq. (15) for the per-group stream ``(n·d, l, g)``.

    PIPES gives no separate formula; this follows the derivation of Cost Formula 6 (Cammert et al.,
    §3.3.3): γ is a grouping, n independent scalar aggregations, and a union.
    """
    _sc(s, "s")
    part = _per_group(s, groups)
    return groups * aggregation_memory(part, size=size)


def group_aggregation_processing(s: StreamCharacteristics, groups: int,
                                 profile: CostProfile = CostProfile()) -> AggregationProcessing:
    """Processing cost of γ with n groups: n times eqs. (16)–(19) for the per-group stream (see
    :func:`group_aggregation_memory`).
    """
    _sc(s, "s")
    part = aggregation_processing(_per_group(s, groups), profile)
    return AggregationProcessing(groups * part.update, groups * part.new, groups * part.reorg)


# ---------------------------------------------------------------------------------------------
# plans


@dataclass(frozen=True)
class NodeCost:
    """One operator's estimate: output characteristics, memory M_op and processing cost C_op."""

    node: P.Node
    output: StreamCharacteristics
    memory: float
    processing: float
    element_size: float
    detail: object = None


@dataclass(frozen=True)
class PlanCost:
    """A plan's estimate: per-operator costs (children first) and their sums (§3.4)."""

    nodes: tuple[NodeCost, ...]

    @property
    def output(self) -> StreamCharacteristics:
        """Characteristics of the plan's output stream."""
        return self.nodes[-1].output

    @property
    def memory(self) -> float:
        """Total memory: the sum of the operators' M_op."""
        return sum(n.memory for n in self.nodes)

    @property
    def processing(self) -> float:
        """Total processing cost per unit of application time: the sum of the operators' C_op."""
        return sum(n.processing for n in self.nodes)


def _node_cost(node: P.Node, kids: list[NodeCost], sources, sizes, profile: CostProfile) -> NodeCost:
    ins = [k.output for k in kids]
    if isinstance(node, P.Source):
        if node.name not in sources:
            raise ValueError(f"sources has no characteristics for stream {node.name!r}; "
                             f"given: {sorted(sources)}")
        size = sizes.get(node.name, profile.element_size)
        return NodeCost(node, _sc(sources[node.name], f"sources[{node.name!r}]"), 0.0, 0.0, size)
    size = kids[0].element_size
    if isinstance(node, P.Select):
        return NodeCost(node, selection_output(ins[0], node.selectivity), 0.0,
                        selection_processing(ins[0], profile), size)
    if isinstance(node, P.Project):
        return NodeCost(node, projection_output(ins[0]), 0.0, projection_processing(ins[0], profile), size)
    if isinstance(node, P.Window):
        return NodeCost(node, window_output(ins[0], node.size, kind=node.kind),
                        window_memory(ins[0], node.size, kind=node.kind, element_size=size),
                        window_processing(ins[0], kind=node.kind, profile=profile), size)
    if isinstance(node, P.Granularity):
        return NodeCost(node, granularity_output(ins[0], node.granularity), 0.0,
                        granularity_processing(ins[0], profile), size)
    if isinstance(node, P.Aggregate):
        if node.groups == 1:
            out, detail = aggregation_output(ins[0]), aggregation_processing(ins[0], profile)
            mem = aggregation_memory(ins[0], size=profile.aggregate_size)
        else:
            out = group_aggregation_output(ins[0], node.groups)
            detail = group_aggregation_processing(ins[0], node.groups, profile)
            mem = group_aggregation_memory(ins[0], node.groups, size=profile.aggregate_size)
        return NodeCost(node, out, mem, detail.total, profile.aggregate_size, detail)
    if isinstance(node, P.Join):
        detail = join_processing(ins[0], ins[1], node.selectivity, method=node.method, profile=profile)
        mem = join_memory(ins[0], ins[1], sizes=(kids[0].element_size, kids[1].element_size))
        return NodeCost(node, join_output(ins[0], ins[1], node.selectivity), mem, detail.total,
                        kids[0].element_size + kids[1].element_size, detail)
    if isinstance(node, P.Union):
        out = union_output(*ins)
        rate = out.rate
        size = sum(k.output.rate * k.element_size for k in kids) / rate if rate else size
        return NodeCost(node, out, 0.0, union_processing(ins, profile), size)
    raise TypeError(f"plan contains a node the PIPES model does not cover: {type(node).__name__}")


def cost_plan(plan: P.Node, sources: Mapping[str, StreamCharacteristics], *,
              profile: CostProfile = CostProfile(), sizes: Mapping[str, float] | None = None) -> PlanCost:
    """Cost a plan bottom up (Cammert et al., §3.3.1 and §3.4).

    Starting from the characteristics of the source streams, each operator's output characteristics
    come from its Cost Formula (1–8) and its memory and processing costs from (9)–(19); the plan's cost
    is their sum. The per-tuple ``cost`` fields of plan nodes are not used: PIPES's constants are in
    ``profile``.

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The plan.
    sources : mapping str -> StreamCharacteristics
        ``(d, l, g)`` of each source stream.
    profile : CostProfile
        Cost constants.
    sizes : mapping str -> float, optional
        Element size of each source stream (default ``profile.element_size``); a join's output elements
        are as large as the two inputs' together, aggregates are ``profile.aggregate_size``.

    Examples
    --------
    A join with selectivity 0.5 of two sources of one element every 2 time units, each behind a window of
    9 (Formula 7: ``d = 1·2/1 = 2``, ``l = ⌊10/1⌋·1 = 10``). Formulas 4 and 2 give the output
    ``d = 2·2/(10 + 10)/0.5 = 0.4``, ``l = 10·10/(10 + 10) = 5``; eq. (9) the memory
    ``2·(⌈10/2⌉ + 2/(2·2)) = 11`` elements. With every cost constant 1 (one hash bucket) each window costs
    ``C_S/d = 0.5`` and the join ``3 + 6 + 2.5 + 4 = 15.5`` (eqs. 11–14: ``(1/2 + 1/2)·3``,
    ``(10 + 10)/(2·2) + 1``, ``0.5·(10 + 10)/(2·2)``, ``(1/2 + 1/2)·4``), 16.5 in all.

    >>> from pyspark_cq import plan as P
    >>> from pyspark_cq.cost.pipes import StreamCharacteristics, cost_plan
    >>> plan = P.Join(P.Window(P.Source("A"), 9), P.Window(P.Source("B"), 9), selectivity=0.5)
    >>> cost = cost_plan(plan, {"A": StreamCharacteristics(2, 1), "B": StreamCharacteristics(2, 1)})
    >>> cost.output
    StreamCharacteristics(d=0.4, l=5.0, g=1.0)
    >>> cost.memory, cost.processing
    (11.0, 16.5)
    >>> cost.nodes[-1].detail
    JoinProcessing(insert=3.0, probe=6.0, result=2.5, reorg=4.0)
    """
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    if not isinstance(sources, Mapping):
        raise TypeError("sources must be a mapping {stream name: StreamCharacteristics}")
    profile = _profile(profile)
    sizes = {} if sizes is None else dict(chk.instance(sizes, "sizes", Mapping, "a mapping {stream name: size}"))
    for name, value in sizes.items():
        chk.positive(value, f"sizes[{name!r}]")
    done: dict[int, NodeCost] = {}
    order = []
    for node in P.postorder(plan):
        nc = _node_cost(node, [done[id(c)] for c in node.children], sources, sizes, profile)
        done[id(node)] = nc
        order.append(nc)
    return PlanCost(tuple(order))


def cost_from_distances(plan: P.Node, distances: Mapping[str, float], profile: CostProfile = CostProfile()
                        ) -> tuple[float, float]:
    """Memory and processing cost of ``plan`` given only its sources' mean distances (Cammert et al.,
    §3.3.1, §3.4).

    Source streams get characteristics ``(d, 1, 1)`` (§3.2.2: a source element is valid for one instant
    of the finest granularity); the plan's sizes and the distances are in the same time unit.

    Returns
    -------
    (memory, processing) : tuple of float
        ``PlanCost.memory`` and ``PlanCost.processing`` of :func:`cost_plan`.
    """
    if not isinstance(distances, Mapping):
        raise TypeError("distances must be a mapping {source name: mean distance d}")
    sources = {name: StreamCharacteristics(d, 1.0, 1.0) for name, d in distances.items()}
    cost = cost_plan(plan, sources, profile=profile)
    return cost.memory, cost.processing


# ---------------------------------------------------------------------------------------------
# adaptation delays (§4.2)


def window_change_delay(t: float, old_size: float, new_size: float) -> tuple[float, float]:
    """When a window change at time t shows in a join: ``(t + min(w, w'), t + max(w, w'))``.

    Cammert et al., §4.2: the change "starts to be observable at t + min{l'_1, l_1} and reaches its full
    impact at t + max{l'_1, l_1}" (§5.1: 60 s → 30 s at 80 s shows from 110 s, fully at 140 s).

    Examples
    --------
    PIPES's first experiment (§5.1): the windows shrink from 60 s to 30 s at 80 s, which shows from 110 s
    and is complete at 140 s; back to 60 s at 150 s shows from 180 s and is complete at 210 s.

    >>> from pyspark_cq.cost.pipes import window_change_delay
    >>> window_change_delay(80, 60, 30)
    (110.0, 140.0)
    >>> window_change_delay(150, 30, 60)
    (180.0, 210.0)
    """
    t = chk.real(t, "t")
    old, new = chk.non_negative(old_size, "old_size"), chk.non_negative(new_size, "new_size")
    return t + min(old, new), t + max(old, new)


def granularity_change_delay(t: float, s: StreamCharacteristics) -> tuple[float, float]:
    """When a granularity change at time t shows in an aggregation over ``s``: ``(t, t + l)`` for
    ``d < l``, else ``(t, t)`` (full effect at the next arrival), Cammert et al., §4.2.
    """
    t = chk.real(t, "t")
    _sc(s, "s")
    return t, (t + s.l if s.d < s.l else t)


# ---------------------------------------------------------------------------------------------
# validation helpers: estimated state rows of the Spark operators


def _retention(window: float | None, watermark_delay: float, batch_span: float) -> float | None:
    """How long an operator driven by a watermark keeps a row: ``window + delay + batch span``.

    PIPES expires an element as soon as application time passes the end of its validity (§2.4.4,
    §3.6.3). A Spark operator expires it at the end of a micro-batch, when the batch's watermark
    ``wm = (max event time of the previous batches) − delay`` has passed it; at that moment the state
    also holds the whole event time ``B`` the batch covered. So the state measured after a batch holds
    the rows of the last ``window + delay + B`` of event time (the validation correction of
    docs/cost-model.md, "Validation on Spark"). Zero delay and span give the window itself.
    """
    if watermark_delay == 0 and batch_span == 0:
        return window
    return max((window or 0.0) + watermark_delay + batch_span, 0.0)


def watermark_retention(window: float | None, watermark_delay: float = 0.0, batch_span: float = 0.0
                        ) -> float | None:
    """The event time a watermark-driven Spark operator keeps for a PIPES window: ``window + δ + B``
    (:func:`_retention`, the public entry for other modules such as the resource manager; the delay and
    span must be >= 0). ``None`` stays ``None`` when both are 0; the result is clipped at 0 otherwise.
    """
    return _retention(window, chk.non_negative(watermark_delay, "watermark_delay"),
                      chk.non_negative(batch_span, "batch_span"))


def join_state_rows(left: StreamCharacteristics, right: StreamCharacteristics, *,
                    left_window: float | None = None, right_window: float | None = None,
                    watermark_delay: float = 0.0, batch_span: float = 0.0) -> tuple[float, float]:
    """Estimated state rows (left, right) of a symmetric window join, for comparison with measurements.

    The inputs' characteristics are first passed through their time-based windows (Cost Formula 7) when
    given; the state sizes are the terms of eq. (9) (:func:`join_state_sizes`). For a bound-form interval
    join ``right.t ∈ [left.t + lower, left.t + upper]`` each side's rows must be kept while the other side
    can still match them: ``left_window = max(upper, 0)``, ``right_window = max(-lower, 0)``.

    ``watermark_delay`` and ``batch_span`` (event time per micro-batch) give the state of a
    watermark-driven operator measured at the end of a batch (:func:`_retention`): each window grows to
    ``window + watermark_delay + batch_span`` (``left_window = upper + delay + B``,
    ``right_window = −lower + delay + B``, not clipped at 0 first). With both 0 (default) this is the
    plain PIPES estimate.
    """
    delay = chk.non_negative(watermark_delay, "watermark_delay")
    span = chk.non_negative(batch_span, "batch_span")
    left_window = _retention(left_window, delay, span)
    right_window = _retention(right_window, delay, span)
    if left_window is not None:
        left = window_output(_sc(left, "left"), left_window)
    if right_window is not None:
        right = window_output(_sc(right, "right"), right_window)
    return join_state_sizes(_sc(left, "left"), _sc(right, "right"))


def aggregation_state_rows(s: StreamCharacteristics, *, window: float | None = None,
                           granularity: float | None = None, groups: int = 1,
                           watermark_delay: float = 0.0, batch_span: float = 0.0) -> float:
    """Estimated state rows of a (grouped) sliding-window aggregation, for comparison with measurements.

    ``s`` (the source) goes through ω (Formula 7) when ``window`` is given, then Γ (Formula 8) when
    ``granularity`` is given (the slide of a sliding aggregation), then the aggregation's state is
    eq. (15) — per group, times the number of groups (:func:`group_aggregation_memory`).
    ``watermark_delay`` and ``batch_span`` extend the window to ``window + delay + B`` as for
    :func:`join_state_rows` (state at the end of a micro-batch of a watermark-driven operator).
    """
    _sc(s, "s")
    window = _retention(window, chk.non_negative(watermark_delay, "watermark_delay"),
                        chk.non_negative(batch_span, "batch_span"))
    if window is not None:
        s = window_output(s, window)
    if granularity is not None:
        s = granularity_output(s, granularity)
    return group_aggregation_memory(s, groups, size=1.0)
