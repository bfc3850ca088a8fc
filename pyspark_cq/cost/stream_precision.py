"""STREAM's precision model and static resource allocation for precision (Motwani, Widom et al., §5.1).

Motwani, Widom, Arasu, Babcock, Babu et al., "Query Processing, Resource Management, and Approximation in a
Data Stream Management System" (STREAM), §5.1 "Static Resource Allocation": the precision of a stream is a
pair (FP, FN) of expected rates — FP "the probability that an output stream tuple is incorrect", FN "the
probability, for each correct output stream tuple, that there is another correct tuple that was missed";
an operator's own (FP, FN) is what it produces from exact (0, 0) inputs; base streams are exact; per-operator
formulas give an operator's output precision from its inputs' and its own, applied bottom-up through the
plan; and "a packaged numerical iterative improvement solver" allocates fixed resources across the operators
to maximise the query's precision. The paper does not print its formulas ("fairly complex formulas", details
left out), so the ones here are derived from its definitions, in expected counts, and say what they assume:

- **Counts.** A stream whose exact form has N tuples and whose precision is (FP, FN) carries
  ``C = N/(1 + FN)`` correct tuples (FN = missed/C, so recall ``R = C/N = 1/(1 + FN)``) and ``C/(1 − FP)``
  tuples in all. So FP lies in [0, 1) and FN in [0, ∞); F1 of the stream against the exact one is
  ``2·(1 − FP)·R / ((1 − FP) + R)``.
- **Selection σ, duplicate-preserving projection π** (:func:`selection_precision`): exact operators that
  treat a false tuple as they treat a correct one (false tuples pass σ at its selectivity): (FP, FN) unchanged.
- **Sampling and load shedding** (§4.1.2, §4.2.2; :func:`kept_precision`): keeping a fraction p of the
  tuples independently of their correctness scales correct and false tuples alike: ``FP' = FP``,
  ``R' = p·R``. Bernoulli sampling and random shedding (a row hash, or chunks of a queue) have the same
  expectation; the paper's model has no variance (§5.1: "the next steps ... incorporate variance").
- **Window reduction of a join** (§4.1.1, §4.2.1; :func:`window_band`): a window join pairs l and r when
  ``−w_R < t_l − t_r < w_L``, a band of width ``w_L + w_R``. With windows w instead of the query's W, and
  the pairs' time differences spread uniformly over the band (keys independent of time, steady rates), the
  join produces ``b = (w_L + w_R)/(W_L + W_R)`` of the exact pairs, ``b_c = (min(w_L, W_L) + min(w_R, W_R))
  /(W_L + W_R)`` of them correct: own ``R = b_c``, own ``FP = 1 − b_c/b`` (a window larger than the query's
  yields false positives).
- **Join ⋈** (:func:`join_precision`): a pair is correct when both its tuples are correct and it lies in
  the query's band; matching does not depend on correctness. Then ``R' = b_c·R_L·R_R`` and
  ``1 − FP' = (b_c/b)·(1 − FP_L)·(1 − FP_R)``. Sampling both inputs of a join at p keeps p² of its result
  ([CMN99], cited in §4.1.2), while its memory falls by p: the reason an allocation beats a uniform one.

Not modelled, as the paper leaves them: value-based precision (aggregation, so also Γ and a window that
feeds one), set difference and duplicate elimination (the §4.1.1 "bad cases" where less input means more
output; they raise ValueError), and union (an exact operator whose output precision needs each input's share
of the exact output, which the plan model does not carry).

Memory is the PIPES model's (:mod:`pyspark_cq.cost.pipes`, eq. 9 for a join's state): the plan with its
windows set, and every source thinned by its kept fraction p (distance ``d/p``: a stage that keeps p of a
stream thins every stream behind it by p, as the PIPES resource manager's shedding does), through
:func:`pyspark_cq.cost.pipes.cost_from_distances`. :func:`allocate` maximises F1 under a memory bound with
:func:`scipy.optimize.minimize` (COBYLA, an iterative improvement method without derivatives, from several
starts: the problem is not convex).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _args as chk
from .. import plan as P
from . import pipes

__all__ = ["Precision", "EXACT", "measured_precision", "selection_precision", "kept_precision", "window_band",
           "join_precision", "plan_precision", "plan_memory", "PrecisionAllocation", "allocate"]


@dataclass(frozen=True)
class Precision:
    """The precision (FP, FN) of a stream or an operator (Motwani et al., §5.1).

    Parameters
    ----------
    fp : float
        False-positive rate in [0, 1): the probability that an output tuple is incorrect.
    fn : float
        False-negative rate in [0, ∞): per correct output tuple, the expected number of correct tuples
        missed (``recall = 1/(1 + fn)``).

    Examples
    --------
    Half of the correct tuples missed and one output tuple in five false:

    >>> p = Precision(fp=0.2, fn=1.0)
    >>> p.recall, round(p.f1, 4)
    (0.5, 0.6154)
    """

    fp: float
    fn: float

    def __post_init__(self):
        fp = chk.real(self.fp, "fp")
        if not 0.0 <= fp < 1.0:
            raise ValueError(f"fp must be a false-positive rate in [0, 1), got {self.fp!r}")
        object.__setattr__(self, "fp", fp)
        object.__setattr__(self, "fn", chk.non_negative(self.fn, "fn", allow_inf=True))

    @classmethod
    def from_recall(cls, recall: float, fp: float = 0.0) -> Precision:
        """The precision with recall ``recall`` in [0, 1] (``fn = 1/recall − 1``; ∞ at 0) and rate ``fp``."""
        r = chk.probability(recall, "recall")
        return cls(fp, math.inf if r == 0 else 1.0 / r - 1.0)

    @property
    def recall(self) -> float:
        """Correct output tuples per exact tuple, ``1/(1 + fn)``."""
        return 0.0 if math.isinf(self.fn) else 1.0 / (1.0 + self.fn)

    @property
    def f1(self) -> float:
        """F1 of the stream against the exact one: harmonic mean of ``1 − fp`` and the recall."""
        p, r = 1.0 - self.fp, self.recall
        return 0.0 if p + r == 0 or r == 0 else 2 * p * r / (p + r)


#: The precision of a base stream and of an exact operator (§5.1: "base input streams ... exact").
EXACT = Precision(0.0, 0.0)


def _precision(value, name: str) -> Precision:
    return chk.instance(value, name, Precision, "a Precision(fp, fn)")


def measured_precision(output: int, correct: int, exact: int) -> Precision:
    """(FP, FN) of a measured result: ``output`` tuples produced, ``correct`` of them in the exact result,
    which has ``exact`` tuples. ``FP = (output − correct)/output`` (0 for no output), ``FN = (exact −
    correct)/correct`` (∞ when nothing correct was produced of a non-empty exact result).

    Examples
    --------
    >>> measured_precision(output=50, correct=40, exact=100)
    Precision(fp=0.2, fn=1.5)
    """
    out = chk.integer(output, "output", minimum=0)
    ok = chk.integer(correct, "correct", minimum=0)
    ex = chk.integer(exact, "exact", minimum=0)
    if ok > out:
        raise ValueError(f"correct must be <= output, got correct={ok}, output={out}")
    if ok > ex:
        raise ValueError(f"correct must be <= exact, got correct={ok}, exact={ex}")
    fp = 0.0 if out == 0 else (out - ok) / out
    if ex == 0:
        return Precision(fp, 0.0)
    return Precision(fp, math.inf if ok == 0 else (ex - ok) / ok)


def selection_precision(inp: Precision) -> Precision:
    """σ and duplicate-preserving π: ``(FP, FN)`` unchanged (false tuples pass at the same selectivity)."""
    return _precision(inp, "inp")


def kept_precision(inp: Precision, kept: float) -> Precision:
    """Sampling at rate p or load shedding that keeps a share p (§4.1.2, §4.2.2): ``FP' = FP``,
    ``R' = p·R`` (correct and false tuples are kept alike).

    Examples
    --------
    >>> kept_precision(EXACT, 0.5)
    Precision(fp=0.0, fn=1.0)
    >>> kept_precision(Precision(0.1, 1.0), 0.25).recall
    0.125
    """
    inp = _precision(inp, "inp")
    p = chk.probability(kept, "kept")
    return Precision.from_recall(inp.recall * p, inp.fp)


def window_band(windows: Sequence[float], full: Sequence[float]) -> tuple[float, float]:
    """A join's own share of the exact pairs under window reduction: ``(b, b_c)``, the pairs produced and
    the correct ones per exact pair (module docstring): ``b = Σw/ΣW``, ``b_c = Σmin(w, W)/ΣW``.

    Parameters
    ----------
    windows : sequence of float
        The windows in force (one per windowed input, >= 0).
    full : sequence of float
        The query's windows W, > 0 in sum, in the same order and unit.

    Examples
    --------
    Both windows of a window join halved keep half of the pairs, all correct:

    >>> window_band([5, 5], [10, 10])
    (0.5, 0.5)
    """
    if not isinstance(windows, Sequence) or not isinstance(full, Sequence) or len(windows) != len(full):
        raise TypeError(f"windows and full must be sequences of equal length, got {windows!r} and {full!r}")
    w = [chk.non_negative(x, f"windows[{i}]") for i, x in enumerate(windows)]
    big = [chk.non_negative(x, f"full[{i}]") for i, x in enumerate(full)]
    total = sum(big)
    if not total > 0:
        raise ValueError(f"full must have a positive sum (the query's band), got {full!r}")
    return sum(w) / total, sum(min(a, b) for a, b in zip(w, big)) / total


def join_precision(left: Precision, right: Precision, *, band: tuple[float, float] = (1.0, 1.0)) -> Precision:
    """⋈ of inputs with precisions ``left`` and ``right``; ``band = (b, b_c)`` from :func:`window_band`
    (default: the query's windows, an exact join). ``R' = b_c·R_L·R_R``, ``1 − FP' = (b_c/b)(1 − FP_L)(1 − FP_R)``.

    Examples
    --------
    Sampling both inputs at 1/2 keeps a quarter of the result (FN = 3); halving the windows keeps half:

    >>> half = kept_precision(EXACT, 0.5)
    >>> join_precision(half, half)
    Precision(fp=0.0, fn=3.0)
    >>> join_precision(EXACT, EXACT, band=window_band([5, 5], [10, 10]))
    Precision(fp=0.0, fn=1.0)
    """
    left, right = _precision(left, "left"), _precision(right, "right")
    if not isinstance(band, Sequence) or len(band) != 2:
        raise TypeError(f"band must be a pair (b, b_c) from window_band, got {band!r}")
    b, bc = chk.non_negative(band[0], "band[0]"), chk.non_negative(band[1], "band[1]")
    if bc > b:
        raise ValueError(f"band must have b_c <= b (correct pairs are among the produced ones), got {band!r}")
    recall = bc * left.recall * right.recall
    if b == 0:
        return Precision.from_recall(0.0)
    fp = 1.0 - (bc / b) * (1.0 - left.fp) * (1.0 - right.fp)
    return Precision.from_recall(min(recall, 1.0), min(max(fp, 0.0), math.nextafter(1.0, 0.0)))


# ---------------------------------------------------------------------------------------------
# plans


def _window_size(node: P.Window, windows: Mapping[str, float]) -> float:
    if node.label is not None and node.label in windows:
        return windows[node.label]
    return float(node.size)


def _settings(plan, windows, kept) -> tuple[dict, dict]:
    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    windows = {} if windows is None else chk.instance(windows, "windows", Mapping, "a mapping label -> size")
    kept = {} if kept is None else chk.instance(kept, "kept", Mapping, "a mapping source -> kept fraction")
    labels = {n.label for n in P.postorder(plan) if isinstance(n, P.Window)}
    out_w = {}
    for lab, size in windows.items():
        if lab not in labels:
            raise ValueError(f"windows names {lab!r}, which labels no Window node of plan; "
                             f"labels: {sorted(labels - {None})}")
        out_w[lab] = chk.non_negative(size, f"windows[{lab!r}]")
    names = set(P.source_names(plan))
    out_k = {}
    for src, p in kept.items():
        if src not in names:
            raise ValueError(f"kept names {src!r}, which is no source of plan; sources: {sorted(names)}")
        out_k[src] = chk.probability(p, f"kept[{src!r}]")
    return out_w, out_k


def plan_precision(plan: P.Node, *, windows: Mapping[str, float] | None = None,
                   kept: Mapping[str, float] | None = None) -> Precision:
    """The output precision of ``plan`` (Motwani et al., §5.1: the formulas applied bottom-up).

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The query as written: its ``Window`` sizes are the exact windows W. Nodes: Source, Select, Project,
        Join, and time-based Windows directly below a Join.
    windows : mapping label -> float, optional
        Window sizes in force, by the Window nodes' labels (same unit as the plan); others as in the plan.
    kept : mapping source -> float, optional
        Share p in [0, 1] of each source the sampling / shedding stages keep (default 1).

    Raises
    ------
    ValueError
        For a node the model leaves out (module docstring), or a reduced window that feeds no join.

    Examples
    --------
    A window join with its windows halved, its left input kept at 0.8: recall 0.4, FN = 1.5.

    >>> from pyspark_cq import plan as P
    >>> q = P.Join(P.Window(P.Source("L"), 10, label="j.window"), P.Window(P.Source("R"), 10, label="j.window"))
    >>> plan_precision(q, windows={"j.window": 5}, kept={"L": 0.8})
    Precision(fp=0.0, fn=1.5)
    """
    windows, kept = _settings(plan, windows, kept)
    done: dict[int, Precision] = {}
    for node in P.postorder(plan):
        if isinstance(node, P.Source):
            done[id(node)] = kept_precision(EXACT, kept.get(node.name, 1.0))
        elif isinstance(node, (P.Select, P.Project)):
            done[id(node)] = selection_precision(done[id(node.child)])
        elif isinstance(node, P.Window):
            if node.kind != "time":
                raise ValueError(f"Window {node.label or ''} is tuple-based; the model covers time-based windows")
            done[id(node)] = done[id(node.child)]    # its effect is the join's band (checked there)
        elif isinstance(node, P.Join):
            w, big = [], []
            for kid in node.children:
                if isinstance(kid, P.Window):
                    w.append(_window_size(kid, windows))
                    big.append(float(kid.size))
            band = window_band(w, big) if big and sum(big) > 0 else (1.0, 1.0)
            done[id(node)] = join_precision(done[id(node.left)], done[id(node.right)], band=band)
        else:
            raise ValueError(f"{type(node).__name__} is not in the precision model of STREAM §5.1 as implemented "
                             f"here (value-based precision, union and set difference are left out)")
    for node in P.postorder(plan):      # a reduced window whose effect no join would count
        if isinstance(node, P.Window) and _window_size(node, windows) != node.size:
            parents = [n for n in P.postorder(plan) if isinstance(n, P.Join) and node in n.children]
            if not parents:
                raise ValueError(f"window {node.label!r} is changed but feeds no join: its effect on precision "
                                 f"is value-based (STREAM §5.1 leaves it out)")
    return done[id(plan)]


def plan_memory(plan: P.Node, distances: Mapping[str, float], *, windows: Mapping[str, float] | None = None,
                kept: Mapping[str, float] | None = None, profile: pipes.CostProfile | None = None,
                watermark_delay: float = 0.0, batch_span: float = 0.0) -> float:
    """Memory of ``plan`` with ``windows`` in force and each source thinned to ``kept`` (PIPES, eq. 9 and
    the other state formulas of :mod:`pyspark_cq.cost.pipes`, through
    :func:`~pyspark_cq.cost.pipes.cost_from_distances`): sources at distance ``d/p``; every time-based window
    extended to ``window + watermark_delay + batch_span``
    (:func:`~pyspark_cq.cost.pipes.watermark_retention`, what a watermark-driven Spark operator keeps).

    Parameters
    ----------
    plan, windows, kept
        As for :func:`plan_precision`.
    distances : mapping source -> float
        Mean distance d of every source, in the plan's time unit.
    profile : pyspark_cq.cost.pipes.CostProfile, optional
        Element sizes and costs (default :class:`~pyspark_cq.cost.pipes.CostProfile`: 1 per element).
    watermark_delay, batch_span : float
        δ and B in the plan's time unit (default 0: the plain PIPES windows).

    Examples
    --------
    Two sources of one element per ms behind 10 s windows hold 2·(10001 + 1/2) elements (eq. 9); keeping
    half of the left one frees about a quarter:

    >>> from pyspark_cq import plan as P
    >>> q = P.Join(P.Window(P.Source("L"), 10_000, label="j.window"), P.Window(P.Source("R"), 10_000,
    ...                                                                      label="j.window"))
    >>> plan_memory(q, {"L": 1.0, "R": 1.0})
    20003.0
    >>> plan_memory(q, {"L": 1.0, "R": 1.0}, kept={"L": 0.5})
    15003.25
    """
    windows, kept = _settings(plan, windows, kept)
    chk.instance(distances, "distances", Mapping, "a mapping source -> mean distance d")
    missing = [s for s in P.source_names(plan) if s not in distances]
    if missing:
        raise ValueError(f"distances lacks the sources {missing} of plan")
    delay = chk.non_negative(watermark_delay, "watermark_delay")
    span = chk.non_negative(batch_span, "batch_span")
    profile = pipes.CostProfile() if profile is None else chk.instance(profile, "profile", pipes.CostProfile,
                                                                          "a pyspark_cq.cost.pipes.CostProfile")
    def retain(node):   # the event time a time-based window keeps under the watermark
        if isinstance(node, P.Window) and node.kind == "time":
            return {"size": pipes.watermark_retention(_window_size(node, windows), delay, span)}
        return {}

    retained = P.rewrite(plan, retain)
    thinned = {}
    for src in P.source_names(plan):
        d = chk.positive(distances[src], f"distances[{src!r}]", allow_inf=True)
        p = kept.get(src, 1.0)
        thinned[src] = math.inf if p == 0 else d / p
    if all(math.isinf(d) for d in thinned.values()):
        return 0.0
    return float(pipes.cost_from_distances(retained, thinned, profile)[0])


# ---------------------------------------------------------------------------------------------
# the allocation (§5.1: "a nonlinear optimization problem ... a packaged numerical iterative improvement solver")


@dataclass(frozen=True)
class PrecisionAllocation:
    """The result of :func:`allocate`.

    Attributes
    ----------
    windows : dict label -> float
        Window sizes (plan units).
    kept : dict source -> float
        Kept share of each source (1 where not shed).
    precision : Precision
        Predicted output precision (:func:`plan_precision`).
    memory : float
        Predicted memory (:func:`plan_memory`).
    memory_bound : float
        The bound.
    feasible : bool
        ``memory <= memory_bound``; when no setting fits, the allocation is the one with the least memory
        (every variable at its minimum) and ``feasible`` is False.
    """

    windows: dict
    kept: dict
    precision: Precision
    memory: float
    memory_bound: float
    feasible: bool


def _ranges(value, name: str, allowed, what: str) -> dict[str, tuple[float, float]]:
    if value is None:
        return {}
    chk.instance(value, name, Mapping, f"a mapping {what} -> (min, max)")
    out = {}
    for key, rng in value.items():
        if key not in allowed:
            raise ValueError(f"{name} names {key!r}, which is no {what} of plan; known: {sorted(allowed)}")
        if not isinstance(rng, Sequence) or len(rng) != 2:
            raise TypeError(f"{name}[{key!r}] must be a pair (min, max), got {rng!r}")
        lo, hi = chk.non_negative(rng[0], f"{name}[{key!r}][0]"), chk.non_negative(rng[1], f"{name}[{key!r}][1]")
        if lo > hi:
            raise ValueError(f"{name}[{key!r}] must have min <= max, got {rng!r}")
        out[key] = (lo, hi)
    return out


def allocate(plan: P.Node, distances: Mapping[str, float], memory: float, *,
             windows: Mapping[str, tuple[float, float]] | None = None,
             kept: Mapping[str, tuple[float, float]] | None = None, profile: pipes.CostProfile | None = None,
             watermark_delay: float = 0.0, batch_span: float = 0.0, starts: int = 8, seed: int = 0
             ) -> PrecisionAllocation:
    """Allocate ``memory`` across the windows and sampling / shedding shares of ``plan`` to maximise the
    F1 of its output (Motwani et al., §5.1), with :func:`scipy.optimize.minimize` (COBYLA).

    COBYLA is derivative-free: the PIPES memory is a staircase in the kept shares and windows (the
    ``⌈l/d⌉`` of eq. 9), whose finite-difference gradients mislead a gradient solver such as SLSQP.

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The query as written (its windows are the exact ones).
    distances : mapping source -> float
        Mean distance d of every source (plan time unit).
    memory : float
        The memory bound, > 0, in the unit of ``profile``'s element sizes.
    windows : mapping label -> (min, max), optional
        The adjustable windows and their allowed ranges (e.g. QoS ranges, PIPES §4.3).
    kept : mapping source -> (min, max), optional
        The sources that may be sampled / shed and their allowed kept shares in [0, 1].
    profile, watermark_delay, batch_span
        As for :func:`plan_memory`.
    starts : int
        Solver starts, >= 1: the point with every variable at its maximum, at its minimum, in the middle,
        then random points (``seed``); the best feasible result wins.
    seed : int
        Seed of the random starts.

    Returns
    -------
    PrecisionAllocation

    Examples
    --------
    A window join of a fast left stream (1 per ms) and a slow right one (1 per 4 ms), windows 10 s, at
    40 % of its exact memory, windows in [5 s, 10 s]: the solver halves the windows and keeps all of the
    slow input and 0.75 of the fast one, recall 0.37 (shedding both inputs alike at the halved windows
    keeps 0.8 of each, recall 0.8²/2 = 0.32):

    >>> from pyspark_cq import plan as P
    >>> q = P.Join(P.Window(P.Source("L"), 10_000, label="j.window"), P.Window(P.Source("R"), 10_000,
    ...                                                                      label="j.window"))
    >>> d = {"L": 1.0, "R": 4.0}
    >>> a = allocate(q, d, 0.4 * plan_memory(q, d), windows={"j.window": (5_000, 10_000)},
    ...              kept={"L": (0.05, 1), "R": (0.05, 1)})
    >>> round(a.windows["j.window"], -1), round(a.kept["L"], 2), round(a.kept["R"], 2), round(a.precision.recall, 2)
    (5000.0, 0.75, 1.0, 0.37)
    """
    from scipy.optimize import minimize

    chk.instance(plan, "plan", P.Node, "a plan node (pyspark_cq.plan.Node)")
    bound = chk.positive(memory, "memory")
    labels = {n.label for n in P.postorder(plan) if isinstance(n, P.Window) and n.label is not None}
    w_rng = _ranges(windows, "windows", labels, "Window label")
    k_rng = _ranges(kept, "kept", set(P.source_names(plan)), "source")
    for src, (lo, hi) in k_rng.items():
        if hi > 1:
            raise ValueError(f"kept[{src!r}] must lie in [0, 1], got ({lo}, {hi})")
    starts = chk.integer(starts, "starts", minimum=1)
    seed = chk.integer(seed, "seed", minimum=0)
    w_keys, k_keys = sorted(w_rng), sorted(k_rng)
    lo = np.array([w_rng[k][0] for k in w_keys] + [k_rng[k][0] for k in k_keys], dtype=float)
    hi = np.array([w_rng[k][1] for k in w_keys] + [k_rng[k][1] for k in k_keys], dtype=float)

    def unpack(z):
        x = lo + np.clip(z, 0.0, 1.0) * (hi - lo)
        return ({k: float(v) for k, v in zip(w_keys, x[:len(w_keys)])},
                {k: float(v) for k, v in zip(k_keys, x[len(w_keys):])})

    def mem(z):
        w, k = unpack(z)
        return plan_memory(plan, distances, windows=w, kept=k, profile=profile, watermark_delay=watermark_delay,
                           batch_span=batch_span)

    def f1(z):
        w, k = unpack(z)
        return plan_precision(plan, windows=w, kept=k).f1

    n = lo.size
    if n == 0:
        m = mem(np.zeros(0))
        return PrecisionAllocation({}, {}, plan_precision(plan), m, bound, m <= bound)
    scale = max(mem(np.ones(n)), 1e-300)      # constraint in units of the unreduced memory: well conditioned
    rng = np.random.default_rng(seed)
    points = [np.ones(n), np.zeros(n), np.full(n, 0.5)] + [rng.random(n) for _ in range(max(starts - 3, 0))]
    best = None
    for z0 in points[:starts]:
        res = minimize(lambda z: -f1(z), z0, method="COBYLA", bounds=[(0.0, 1.0)] * n,
                       constraints=[{"type": "ineq", "fun": lambda z: (bound - mem(z)) / scale}],
                       options={"maxiter": 2000, "rhobeg": 0.2, "tol": 1e-7})
        z = np.clip(res.x, 0.0, 1.0)
        if mem(z) > bound * (1 + 1e-9):
            continue
        value = f1(z)
        if best is None or value > best[0] + 1e-12:
            best = (value, z)
    if best is None:                          # nothing fits: the least memory, reported infeasible
        z = np.zeros(n)
        if mem(z) <= bound:
            best = (f1(z), z)
    feasible = best is not None
    z = best[1] if feasible else np.zeros(n)
    w, k = unpack(z)
    m = mem(z)
    return PrecisionAllocation(w, {**{s: 1.0 for s in P.source_names(plan)}, **k},
                               plan_precision(plan, windows=w, kept=k), m, bound, feasible)
