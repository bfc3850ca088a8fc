"""Static resource allocation for precision (STREAM, Motwani, Widom et al., §5.1) as a policy.

Given a memory bound, the policy allocates it across each managed query's windows and the per-input
shedding of its join so that the F1 of the query's output, predicted by STREAM's (FP, FN) model, is as high
as possible (:func:`pyspark_cq.cost.stream_precision.allocate`: per-operator formulas bottom-up through the
plan, memory from the PIPES formulas, scipy's COBYLA), and writes the allocation to the control table:

- every ``Window`` node of the query's plan labelled ``"<op>.window"``, ``"<op>.upper"`` or ``"<op>.lower"``
  that has a QoS range is a variable within that range (``lower`` stands for the window ``−lower``, as
  for the PIPES resource manager); the plan's own window sizes are the exact query's (precision is measured
  against them), so a QoS maximum above a plan window is capped there;
- the query's shedding stage (:func:`~pyspark_cq.policies.shedding_operator`, the control entry holding a
  ``drop_ratio``), when it is a two-input join whose windows are labelled in the plan, sheds each input by
  its own share: ``params["drop_left"]`` / ``["drop_right"]``, each of its inputs with a kept share in
  [``min_kept``, 1] (a side must hold one source of the plan). Other queries are allocated windows only.

Costing is the PIPES resource manager's (:mod:`pyspark_cq_plugins.pipes_rm`): its :data:`DEFAULT_PROFILE`
(64-byte elements) unless ``profile`` is given, times in ``time_unit``, sources at their measured distance d
(or the ``distances`` prior), windows extended to ``window + δ + B`` with ``retention``, a ``reserve`` share of
the bound kept free. So the two policies can be compared at the same memory bound. Several queries share the
bound equally (STREAM §5.1 allocates within one query). A query is re-allocated when it appears, when the
bound changes, or when a source's d moved by more than ``distance_threshold`` (relative).

It is static allocation in the paper's sense: the allocation follows the statistics, not the measured
precision; ``allocations`` holds the latest one per query (predicted precision and memory).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from pyspark_cq import _human
from pyspark_cq import plan as P
from pyspark_cq.cost import pipes
from pyspark_cq.cost import stream_precision as SP
from pyspark_cq.policies import Decision, Decisions, Policy, QueryInfo, Snapshot, parse_label, parse_size
from pyspark_cq.policies import shedding_operator as _shedding_operator
from pyspark_cq.policies.decisions import duration_value
from pyspark_cq_plugins.pipes_rm import DEFAULT_PROFILE
from pyspark_cq_plugins.rtstream import join_drop_decision

__all__ = ["PrecisionAllocator"]

_SECOND = 1_000_000
_WINDOW_PARAMS = ("window", "upper", "lower")


class PrecisionAllocator(Policy):
    """Allocate a memory bound across windows and per-input shedding to maximise F1 (STREAM §5.1).

    See the module docstring for what is adjusted and how.

    Parameters
    ----------
    memory : float or str, optional
        Memory bound (bytes, or e.g. ``"2 MB"``); default: the snapshot's ``memory_budget``.
    min_kept : float
        The smallest share of an input shedding keeps, in (0, 1].
    reserve : float
        Share of the bound kept free, in [0, 1) (as the PIPES resource manager's).
    time_unit : int or str
        Application time unit of the cost model (µs or a duration; default 1 ms).
    profile : pyspark_cq.cost.pipes.CostProfile, optional
        Element sizes (default the PIPES resource manager's :data:`DEFAULT_PROFILE`).
    distances : mapping str -> float, optional
        Prior distance d (seconds) per source, used until the statistics measure it.
    retention : bool
        Cost every window as ``window + δ + B`` (the query's measured watermark delay and batch span).
    distance_threshold : float
        Relative change of a source's d that triggers a new allocation, > 0.
    starts : int
        Solver starts per allocation (:func:`~pyspark_cq.cost.stream_precision.allocate`).
    """

    name = "precision"

    def __init__(self, memory=None, *, min_kept: float = 0.05, reserve: float = 0.1, time_unit=1000, profile=None,
                 distances: Mapping[str, float] | None = None, retention: bool = False,
                 distance_threshold: float = 0.2, starts: int = 4):
        self.memory = None if memory is None else parse_size(memory, "memory")
        if isinstance(min_kept, bool) or not isinstance(min_kept, (int, float)) or not 0 < min_kept <= 1:
            raise ValueError(f"min_kept must be a fraction in (0, 1], got {min_kept!r}")
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve < 1:
            raise ValueError(f"reserve must be a share in [0, 1), got {reserve!r}")
        self.min_kept, self.reserve = float(min_kept), float(reserve)
        self.time_unit = duration_value(time_unit, "time_unit", allow_negative=False, allow_zero=False)
        if profile is not None and not isinstance(profile, pipes.CostProfile):
            raise TypeError(f"profile must be a pyspark_cq.cost.pipes.CostProfile or None, got {profile!r}")
        self.profile = profile
        if distances is not None and not isinstance(distances, Mapping):
            raise TypeError(f"distances must be a mapping source -> d (seconds), got {distances!r}")
        self.distances = None if distances is None else {
            str(k): _positive(v, f"distances[{k!r}]") for k, v in distances.items()}
        if not isinstance(retention, bool):
            raise TypeError(f"retention must be a bool, got {retention!r}")
        self.retention = retention
        self.distance_threshold = _positive(distance_threshold, "distance_threshold")
        if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
            raise ValueError(f"starts must be an integer >= 1, got {starts!r}")
        self.starts = starts
        self.allocations: dict[str, SP.PrecisionAllocation] = {}
        self.skipped: dict[str, str] = {}
        self._used: dict[str, tuple] = {}        # query -> (bound, distances, δ+B) of its allocation

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"memory": "64 KB", "min_kept": 0.1, "reserve": 0.0}, {"memory": "1 MB", "retention": True}]

    # -- the model of one query --------------------------------------------------------------------

    def _model(self, info: QueryInfo):
        """(window variables, shedding sides) of ``info``; ValueError saying why it cannot be managed."""
        if info.plan is None:
            raise ValueError("it has no plan (QueryInfo.plan)")
        nodes = list(P.postorder(info.plan))
        windows = {}
        for node in nodes:
            if isinstance(node, P.Window) and node.label in info.qos:
                if parse_label(node.label)[1] not in _WINDOW_PARAMS or node.kind != "time":
                    raise ValueError(f"{node.label!r} labels a window this policy cannot set (time-based "
                                     f"window/upper/lower only)")
                windows[node.label] = node
        SP.plan_precision(info.plan)            # raises for plans outside the model (aggregation, union)
        sides = None
        op = _shedding_operator(info)
        if op is not None:
            for node in nodes:
                if isinstance(node, P.Join) and all(isinstance(k, P.Window) and k.label is not None
                                                    and parse_label(k.label)[0] == op for k in node.children):
                    srcs = [P.source_names(k) for k in node.children]
                    if all(len(s) == 1 for s in srcs):
                        sides = (op, srcs[0][0], srcs[1][0])
        return windows, sides

    def _distances(self, info: QueryInfo) -> dict[str, float] | None:
        out = {}
        for src in P.source_names(info.plan):
            st = info.sources.get(src)
            if st is not None and math.isfinite(st.distance) and st.distance > 0:
                out[src] = st.distance
            elif self.distances and src in self.distances:
                out[src] = self.distances[src]
            else:
                return None
        return out

    def _moved(self, name: str, key: tuple) -> bool:
        old = self._used.get(name)
        if old is None or old[0] != key[0] or set(old[1]) != set(key[1]):
            return True
        th = self.distance_threshold
        if any(abs(key[1][s] - old[1][s]) > th * old[1][s] for s in key[1]):
            return True
        return abs(key[2] - old[2]) > th * max(old[2], 1e-9)

    def _allocate(self, info: QueryInfo, windows, sides, bound: float, distances) -> SP.PrecisionAllocation:
        unit = self.time_unit
        delay = span = 0.0
        if self.retention:
            delay = (info.watermark_delay or 0.0) * _SECOND / unit
            span = (info.batch_span or 0.0) * _SECOND / unit
        plan = _scaled(info.plan, unit)
        ranges = {}
        for lab, node in windows.items():
            rng = info.qos[lab]
            lo, hi = sorted((rng.min, rng.max))
            if parse_label(lab)[1] == "lower":
                lo, hi = -hi, -lo
            cap = node.size / unit
            ranges[lab] = (min(max(lo, 0.0) / unit, cap), min(max(hi, 0.0) / unit, cap))
        kept = None if sides is None else {sides[1]: (self.min_kept, 1.0), sides[2]: (self.min_kept, 1.0)}
        d = {s: v * _SECOND / unit for s, v in distances.items()}

        def solve(ranges):
            return SP.allocate(plan, d, bound, windows=ranges, kept=kept, profile=self.profile or DEFAULT_PROFILE,
                               watermark_delay=delay, batch_span=span, starts=self.starts)

        a = solve(ranges)
        # the control table holds allowed values only (QoS steps, whole µs): round each window down to one
        # and allocate the shedding again with the windows fixed there, so the memory stays within the bound
        snapped = {lab: _allowed(info.qos[lab], parse_label(lab)[1], a.windows[lab] * unit) / unit
                   for lab in windows}
        if any(abs(snapped[lab] - a.windows[lab]) > 1e-9 for lab in windows):
            a = solve({lab: (v, v) for lab, v in snapped.items()})
        if sides is None:
            return a
        # drop ratios are written with 3 decimals (drop_for): each kept share rounded down or up to a multiple
        # of 0.001, the best-F1 combination within the bound (all down when none fits); the allocation
        # reports what is written
        srcs = (sides[1], sides[2])

        def at(kept):
            return SP.plan_memory(plan, d, windows=a.windows, kept=kept, profile=self.profile or DEFAULT_PROFILE,
                                  watermark_delay=delay, batch_span=span)

        options = [{s: max(min(math.floor(a.kept[s] * 1000 + 1e-9) / 1000, 1.0), self.min_kept) for s in srcs}]
        for ups in ((True, False), (False, True), (True, True)):
            options.append({s: min(math.ceil(a.kept[s] * 1000 - 1e-9) / 1000, 1.0) if up else options[0][s]
                            for s, up in zip(srcs, ups)})
        fits = [k for k in options if at(k) <= bound]
        written = max(fits, key=lambda k: SP.plan_precision(plan, windows=a.windows, kept=k).f1) if fits \
            else options[0]
        kept_all = {**a.kept, **written}
        memory = at(kept_all)
        return SP.PrecisionAllocation(a.windows, kept_all, SP.plan_precision(plan, windows=a.windows, kept=kept_all),
                                      memory, a.memory_bound, memory <= bound)

    # -- Policy interface ------------------------------------------------------------------------

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Allocate each managed query's share of the bound (when something moved) and return the decisions
        that bring the control table to it.
        """
        self._check(snapshot)
        total = self.memory if self.memory is not None else snapshot.memory_budget
        for name in [n for n in self._used if n not in snapshot.queries]:
            self._used.pop(name)
            self.allocations.pop(name, None)
        models = {}
        for name in sorted(snapshot.queries):
            info = snapshot.queries[name]
            try:
                models[name] = self._model(info)
            except ValueError as exc:
                self.skipped[name] = str(exc)
                continue
            self.skipped.pop(name, None)
        if total is None or not models:
            return Decisions((), self.name)
        bound = total * (1.0 - self.reserve) / len(models)
        out = []
        for name, (windows, sides) in models.items():
            info = snapshot.queries[name]
            distances = self._distances(info)
            if distances is None:
                self.skipped[name] = "no distance d measured (or given) for every source yet"
                continue
            if not windows and sides is None:
                self.skipped[name] = "nothing to allocate: no window with a QoS range and no two-input shedding join"
                continue
            retention = (info.watermark_delay or 0.0) + (info.batch_span or 0.0) if self.retention else 0.0
            key = (bound, distances, retention)
            if self._moved(name, key):
                self.allocations[name] = self._allocate(info, windows, sides, bound, distances)
                self._used[name] = key
            out.extend(self._decisions(info, windows, sides, self.allocations[name]))
        return Decisions(out, self.name)

    def _decisions(self, info: QueryInfo, windows, sides, a: SP.PrecisionAllocation) -> list[Decision]:
        p = a.precision
        reason = (f"STREAM §5.1 allocation: predicted FP={p.fp:.3g}, FN={p.fn:.3g}, F1={p.f1:.3f}; estimated "
                  f"memory {_human.size(a.memory)} {'within' if a.feasible else 'ABOVE (least memory)'} bound "
                  f"{_human.size(a.memory_bound)}")
        per_op: dict[str, dict] = {}
        for lab in windows:
            op, param = parse_label(lab)
            value = _control_value(param, a.windows[lab] * self.time_unit)
            if info.control_value(lab) != value:
                per_op.setdefault(op, {})[param] = value
        out = [Decision(op, changes, reason, query=info.name) for op, changes in sorted(per_op.items())]
        if sides is not None:
            op, left, right = sides
            d = join_drop_decision(info, op, (a.kept[left], a.kept[right]), reason, self.name)
            if d is not None:
                out.append(d)
        return out


def _control_value(param: str, window_micros: float) -> int:
    """The control value (µs) of a window of ``window_micros``: the window itself, or ``−window`` for ``lower``."""
    w = int(round(window_micros))
    return -w if param == "lower" else w


def _allowed(rng, param: str, window_micros: float) -> float:
    """The largest window (µs) at most ``window_micros`` whose control value the QoS range ``rng`` allows
    (a multiple of its step or a bound; whole µs), never below the range's smallest window.
    """
    lo, hi = sorted((rng.min, rng.max))
    if param == "lower":                       # the control value is −window: the window range is [−hi, −lo]
        lo, hi = -hi, -lo
    w = min(max(math.floor(window_micros + 1e-6), lo), hi)
    if rng.choices is not None:
        allowed = sorted(abs(c) for c in rng.choices)
        below = [c for c in allowed if c <= w + 1e-6]
        return float(below[-1] if below else allowed[0])
    if rng.step:
        stepped = math.floor(w / rng.step) * rng.step
        w = stepped if stepped >= lo else lo
    return float(max(w, lo))


def _scaled(plan: P.Node, unit: int) -> P.Node:
    """``plan`` with its time-based window sizes (µs) in the cost model's ``unit``."""
    def change(node):
        if isinstance(node, P.Window) and node.kind == "time":
            return {"size": node.size / unit}
        if isinstance(node, P.Granularity):
            return {"granularity": node.granularity / unit}
        return {}

    return P.rewrite(plan, change)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
