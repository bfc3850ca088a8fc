"""The ``chain`` policy: Chain scheduling of multi-step worker stages under a memory bound.

Motwani et al., "Query Processing, Approximation, and Resource Management in a DSMS" (STREAM), §5.3, and
Babcock, Babu, Datar & Motwani's Chain: when a burst or a catch-up micro-batch arrives, the operator that
gets the next chunk of work is the one on the steepest segment of the lower envelope of the path's progress
chart, which keeps the tuples queued between operators few.

The policy reads every ``select_chain`` operator's latest per-batch report (``OperatorStats.report``:
``rows_in_<p>``, ``rows_passed_<p>``, ``nanos_<p>`` per predicate), takes each predicate's measured
capacity (rows per µs, ``rows_in / nanos``) and selectivity (``rows_passed / rows_in``) in the operator's
current plan order, computes the Chain priorities with :func:`pyspark_cq.cost.chain.priorities` and writes
them, with the strategy, the chunk size and the memory bound, into the operator's control-table ``params``
(:mod:`pyspark_cq.operators._common.chunks` reads them at the next micro-batch). A predicate that has not seen a
row yet keeps its last measured values; an operator is scheduled once every predicate was measured.
The entry is rewritten only when a priority or selectivity moved by more than ``min_change`` (relative)
or the settings differ, so a steady query does not churn the control table.

A ``multi_join``'s probe steps are scheduled the same way: every input's probe order (the entry's
``plan_id``, else the order its counters show: step k+1 probes what step k matched) is a path of steps
``"<i>_<j>"`` with capacity ``probed_i_j / probe_nanos_i_j`` and selectivity ``matched_i_j / probed_i_j``
(a join step's can exceed 1). The join times its steps only once they run in chunks, so the first round
writes the strategy, chunk size, bound and selectivities without priorities (Chain then chooses as fifo);
the priorities follow from the next report, per input once every step of its path was reached.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from pyspark_cq.control.plans import parse_chain_plan, parse_join_plan
from pyspark_cq.cost import chain
from pyspark_cq.policies import Decision, Decisions, Policy, Snapshot
from pyspark_cq.vocabulary import metrics as M

__all__ = ["ChainScheduler"]



def _round(value: float) -> float:
    """4 significant digits: the control table and its log stay readable; the ranking is unaffected."""
    return float(f"{value:.4g}")


def _steps(report: Mapping) -> list[str]:
    """The predicate names a ``select_chain`` report counts, in its order (empty for other operators)."""
    return [n for n in M.predicates(report) if M.rows_passed(n) in report and M.nanos(n) in report]


def _join_inputs(report: Mapping) -> int:
    """The number of inputs of a ``multi_join`` report (0 for other operators)."""
    n = 0
    while M.per_input(M.INPUT_ROWS, n) in report:
        n += 1
    return n if n >= 2 and M.probed(0, 1) in report else 0


def _join_orders(report: Mapping, n: int, plan) -> list[tuple[int, ...]] | None:
    """Every input's probe order: the plan's, else the one its counters show (the only permutation in which
    each step probes what the step before matched), None when a counter leaves it open.
    """
    if plan is not None:
        try:
            return [tuple(o) for o in parse_join_plan(plan, n)]
        except ValueError:
            return None
    orders = []
    for i in range(n):
        fits = [o for o in itertools.permutations([j for j in range(n) if j != i])
                if all(report.get(M.probed(i, b), 0) == report.get(M.matched(i, a), 0) for a, b in
                       zip(o, o[1:])) and report.get(M.probed(i, o[0]), 0) > 0]
        if len(fits) != 1:
            return None
        orders.append(fits[0])
    return orders


class ChainScheduler(Policy):
    """Chain priorities (Babcock et al.; STREAM §5.3) for ``select_chain`` and ``multi_join`` stages, through the
    control table.

    Parameters
    ----------
    max_buffered_rows : int or None
        Memory bound of every managed stage: rows that passed a predicate and wait for the next, per task
        (default 262144). None: unbounded (then write ``strategy`` ``"fifo"`` or expect operator-at-a-time
        memory under Chain, see :mod:`pyspark_cq.operators._common.chunks`).
    chunk_rows : int
        Rows a predicate takes per scheduling step (default 65536).
    strategy : {"chain", "fifo", "greedy", "round_robin"}
        The strategy written (the priorities and selectivities are written for every strategy).
    min_change : float
        Relative change of a priority or selectivity that triggers a rewrite, >= 0.
    operators : sequence of str, optional
        Operator ids to manage; default every operator whose report is a ``select_chain``'s or a
        ``multi_join``'s.
    """

    name = "chain"

    def __init__(self, max_buffered_rows: int | None = 262_144, chunk_rows: int = 65_536, strategy: str = "chain",
                 min_change: float = 0.2, operators=None):
        if max_buffered_rows is not None and (isinstance(max_buffered_rows, bool) or not isinstance(
                max_buffered_rows, int) or max_buffered_rows < 1):
            raise ValueError(f"max_buffered_rows must be an integer >= 1 (rows) or None, got {max_buffered_rows!r}")
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be an integer >= 1 (rows), got {chunk_rows!r}")
        if strategy not in chain.STRATEGIES:
            raise ValueError(f"strategy must be one of {list(chain.STRATEGIES)}, got {strategy!r}")
        if (isinstance(min_change, bool) or not isinstance(min_change, (int, float)) or not math.isfinite(min_change)
                or min_change < 0):
            raise ValueError(f"min_change must be a finite relative change >= 0, got {min_change!r}")
        if operators is not None and (isinstance(operators, str) or not all(isinstance(o, str) for o in operators)):
            raise TypeError(f"operators must be a sequence of operator ids (str) or None, got {operators!r}")
        self.max_buffered_rows, self.chunk_rows, self.strategy = max_buffered_rows, chunk_rows, strategy
        self.min_change = float(min_change)
        self.operators = None if operators is None else list(operators)
        self._measured: dict[str, dict[str, tuple[float, float]]] = {}   # operator -> step -> (capacity, sel)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"max_buffered_rows": None, "strategy": "fifo", "min_change": 0.0},
                {"strategy": "greedy", "chunk_rows": 1000, "operators": ["q3-op"]}]

    def _measure(self, operator: str, report: Mapping, names) -> list[tuple[float, float]] | None:
        known = self._measured.setdefault(operator, {})
        for n in names:
            rows, passed, nanos = (report.get(M.predicate(k, n), 0) for k in M.PREDICATE_KINDS)
            if rows > 0:
                # capacity in rows per µs; a predicate Spark computed before the chain costs ~nothing here:
                # at least 1 ns per row keeps the capacity finite
                known[n] = (1000.0 * rows / max(nanos, rows), passed / rows)
        if any(n not in known for n in names):
            return None
        return [known[n] for n in names]

    def _join_settings(self, operator: str, report: Mapping, control: Mapping, n: int) -> dict | None:
        orders = _join_orders(report, n, control.get("plan_id"))
        if orders is None:
            return None
        known = self._measured.setdefault(operator, {})
        for i, order in enumerate(orders):
            for j in order:
                probed, matched, nanos = (report.get(M.step(k, i, j), 0) for k in M.STEP_KINDS)
                if probed > 0 and nanos > 0:
                    known[f"{i}_{j}"] = (1000.0 * probed / max(nanos, probed), matched / probed)
                elif probed > 0:    # not timed (the steps ran depth-first): the selectivity only
                    known[f"{i}_{j}"] = (math.nan, matched / probed)
        # an input's path is scheduled once each of its steps was measured (until then its steps rank alike:
        # Chain chooses as fifo); a step no partial match has reached yet is not measured
        paths = [[f"{i}_{j}" for j in order] for i, order in enumerate(orders)]
        paths = [path for path in paths if all(s in known for s in path)]
        out = {"schedule": self.strategy, "chunk_rows": self.chunk_rows, "max_buffered_rows": self.max_buffered_rows,
               "selectivities": {s: _round(known[s][1]) for path in paths for s in path}}
        timed = [path for path in paths if all(math.isfinite(known[s][0]) for s in path)]
        if timed:
            out["priorities"] = {s: _round(p) for path in timed
                                 for s, p in zip(path, chain.priorities([known[s] for s in path]))}
        return out

    def settings(self, operator: str, report: Mapping, control: Mapping) -> dict | None:
        """The ``params`` this policy wants for ``operator`` given its latest ``report`` and ``control`` values
        (None: neither a ``select_chain`` nor a ``multi_join``, or not every step measured yet).
        """
        names = _steps(report)
        if not names:
            n = _join_inputs(report)
            return self._join_settings(operator, report, control, n) if n else None
        plan = control.get("plan_id")
        if plan is not None:
            try:
                names = list(parse_chain_plan(plan, names, operator=operator))
            except ValueError:
                return None                      # the operator itself reports a bad plan
        ops = self._measure(operator, report, names)
        if ops is None:
            return None
        prio = chain.priorities(ops)
        return {"schedule": self.strategy, "chunk_rows": self.chunk_rows, "max_buffered_rows": self.max_buffered_rows,
                "priorities": {n: _round(p) for n, p in zip(names, prio)},
                "selectivities": {n: _round(s) for n, (_, s) in zip(names, ops)}}

    def _changed(self, current: Mapping, wanted: Mapping) -> bool:
        for key, value in wanted.items():
            old = current.get(key)
            if not isinstance(value, dict):
                if old != value:
                    return True
                continue
            if not isinstance(old, Mapping) or set(old) != set(value):
                return True
            for n, v in value.items():
                o = old[n]
                if not isinstance(o, (int, float)) or abs(v - o) > self.min_change * max(abs(o), 1e-12):
                    return True
        return False

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Chain priorities for every managed ``select_chain`` whose settings moved."""
        self._check(snapshot)
        out = []
        for qname in sorted(snapshot.queries):
            q = snapshot.queries[qname]
            for op in sorted(q.operators):
                if self.operators is not None and op not in self.operators:
                    continue
                control = q.control.get(op, {})
                wanted = self.settings(op, q.operators[op].report, control)
                if wanted is None or not self._changed(control.get("params") or {}, wanted):
                    continue
                prio = ", ".join(f"{n} {p:.4g}" for n, p in wanted.get("priorities", {}).items()) or "not yet timed"
                reason = (f"Chain (Babcock et al.; STREAM §5.3): priorities {prio} from measured cost per row and "
                          f"selectivity; {self.strategy}, chunks of {self.chunk_rows} rows, bound "
                          f"{self.max_buffered_rows} buffered rows")
                out.append(Decision(op, {"params": wanted}, reason, query=qname))
        return Decisions(out, self.name)
