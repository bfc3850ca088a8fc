"""PIPES §5.4 at our scale: thousands of queries under a memory bound, queries arriving in bursts.

Cammert, Krämer, Seeger & Vaupel (PIPES), §5.4: 5000 random queries of Table 3 over 50 streams
(2–600 elements/min), QoS window ranges within 1–30 min and granularity ranges within 1–10000 ms; the
resource manager of §4.3 keeps the memory at its target while "after 1 hour, we started to pose 10 new
random queries every 72 seconds for a duration of 30 minutes. Finally, we created a burst of 500 new
queries after 2 hours" (Figure 12). Cost model only, as the issue asks: no Spark.

Timeline (application time; the run itself takes a few minutes of wall time):

- t = 0: 5000 queries are installed (already running: added without admission) and planned;
- 1 h – 1.5 h: 10 queries every 72 s, each through admission control (§4.1.1);
- 2 h: a burst of 500 queries, admitted one by one;
- 2.5 h: five sources get 50 % faster; the resource manager notices d moved beyond its threshold and
  re-plans (§3.2.2, §4.1.2);
- 3.25 h: an overload burst of 3000 queries: admission control accepts what fits and rejects the rest.

The memory bound is set relative to the workload (our cost model in bytes with 64-byte elements puts
5000 such queries in the hundreds of GB; PIPES's 100 MB came from its own element counts): the initial
allocation sits at f ≈ 0.5. Memory over time is the resource manager's steady-state estimate and, to show
adaptation delays (§4.2), the estimate during transitions: a query whose window changes from w to w′ at t
moves linearly between its old and new estimate from t + min(w, w′) to t + max(w, w′)
(:meth:`pyspark_cq.control.schedule.Transition.progress`); a new query fills its state during its first
window. The reserve (10 %) absorbs these delays.

Usage::

    python -m benchmarks.experiments.pipes_5_4_scalability [--queries 5000] [--seed 1] [--out docs/figures]

Writes ``pipes_5_4_scalability.png`` and ``pipes_5_4_scalability.json`` to ``--out`` and prints the
numbers quoted in docs/runtime.md.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
from pyspark_cq_plugins.pipes_rm import PipesResourceManager

from pyspark_cq.control.schedule import Schedule
from pyspark_cq.experiments import pipes_workload as W

from .. import harness

HOUR = 3600.0
S = 1_000_000


class Timeline:
    """Per-query memory trajectories as a superposition of linear ramps, evaluated on a time grid (s)."""

    def __init__(self, grid: np.ndarray):
        self.grid = grid
        self.memory = np.zeros_like(grid)

    def ramp(self, t: float, delta: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Add ``delta`` reached linearly between ``start`` and ``end`` (arrays over queries)."""
        if delta.size == 0:
            return
        span = np.maximum(end - start, 1e-9)
        progress = np.clip((self.grid[None, :] - start[:, None]) / span[:, None], 0.0, 1.0)
        self.memory += delta @ progress


def window_seconds(settings: dict, name: str) -> float:
    return settings[name][f"{name}-w.window"] / S


def transition_bounds(t: float, old_w: float, new_w: float) -> tuple[float, float]:
    """PIPES §4.2 effect window of a window change, via the control table's transition helper (µs)."""
    (tr,) = Schedule("window", ((None, int(old_w * S)), (int(t * S), int(new_w * S)))).transitions() \
        if int(old_w * S) != int(new_w * S) else (None,)
    if tr is None:
        return t, t
    return tr.effect_start / S, tr.effect_complete / S


def apply_event(timeline, t, before, after, settings_before, settings_after):
    """Ramps for one event: changed queries per §4.2, new queries fill over their window."""
    deltas, starts, ends = [], [], []
    for name, (mem, _) in after.items():
        if name in before:
            delta = mem - before[name][0]
            if delta == 0:
                continue
            start, end = transition_bounds(t, window_seconds(settings_before, name), window_seconds(settings_after, name))
            if settings_before[name] != settings_after[name] and start == end:   # granularity only: §4.2 α
                start, end = t, t + window_seconds(settings_after, name)
        else:
            delta, start, end = mem, t, t + window_seconds(settings_after, name)
        deltas.append(delta)
        starts.append(start)
        ends.append(end)
    timeline.ramp(t, np.asarray(deltas), np.asarray(starts), np.asarray(ends))


def run(queries: int, seed: int, out: str) -> dict:
    rng = np.random.default_rng(seed)
    sources = W.make_sources(rng)
    rm = PipesResourceManager(reserve=0.1, distance_threshold=0.2)
    for s, d in sources.items():
        rm.set_distance(s, d)

    t0 = time.perf_counter()
    for q in W.make_queries(rng, queries, sources):
        rm.add(q)
    rows = rm._planned_rows()
    m_min, m_max = rm._totals(rm.p, 0.0, rows)[0], rm._totals(0, 1.0, rows)[0]
    budget = (m_min + 0.35 * (m_max - m_min)) / 0.9
    rm.set_budget(memory=budget)
    start_alloc = rm.replan()
    cold = time.perf_counter() - t0
    print(f"{queries} queries: M(f=0) = {m_min / 1e9:.1f} GB, M(f=1) = {m_max / 1e9:.1f} GB, bound {budget / 1e9:.1f} GB; "
          f"cold start (cost-model evaluations and first re-plan) {cold:.1f} s, {rm.evaluations} evaluations")

    grid = np.arange(0.0, 4.0 * HOUR, 30.0)
    timeline = Timeline(grid)
    steady = []             # (t, steady-state estimate, f_window, queries)
    est, sett = rm.estimates(), rm.all_settings()
    apply_event(timeline, 0.0, {}, est, {}, sett)
    steady.append((0.0, start_alloc.memory, start_alloc.f_window, start_alloc.queries))
    admit_times, search_times, rejected, accepted = [], [], [], 0
    counter = queries

    def admit_many(t, count, label):
        nonlocal counter, accepted, est, sett
        before, sbefore = est, sett
        for _ in range(count):
            q = W.make_query(rng, f"q{counter}", sources)
            counter += 1
            a0 = time.perf_counter()
            result = rm.admit_query(q)
            admit_times.append(time.perf_counter() - a0)
            if result.accepted:
                accepted += 1
            else:
                rejected.append((t, q.name, result.reason))
        r0 = time.perf_counter()
        alloc = rm.replan()                       # warm: the same allocation again, timed as a pure re-plan
        search_times.append(time.perf_counter() - r0)
        est, sett = rm.estimates(), rm.all_settings()
        apply_event(timeline, t, before, est, sbefore, sett)
        steady.append((t, alloc.memory, alloc.f_window, alloc.queries))
        print(f"t = {t / HOUR:5.2f} h {label}: {alloc.queries} queries, f_window {alloc.f_window:.3f}, "
              f"f_granularity {alloc.f_granularity:.3f}, estimate {alloc.memory / 1e9:.1f} GB")

    scale = queries / 5000                        # the paper's arrivals, scaled for smaller runs
    for k in range(25):                           # 1 h – 1.5 h: 10 queries every 72 s
        admit_many(HOUR + 72.0 * k, max(1, round(10 * scale)), "arrivals")
    admit_many(2 * HOUR, max(1, round(500 * scale)), "burst")
    # 2.5 h: five sources get 50 % faster (§4.1.2)
    t = 2.5 * HOUR
    before, sbefore = est, sett
    changed = sorted(sources)[:5]
    e0 = rm.evaluations
    r0 = time.perf_counter()
    old_alloc = rm.allocation
    moved = [rm.set_distance(s, sources[s] / 1.5) for s in changed]
    alloc = rm.replan()
    rate_replan = time.perf_counter() - r0
    affected = sum(any(s in changed for s in rm._queries[n].sources) for n in rm.queries)
    # the faster streams fill the old windows within one window (from t on) ...
    faster = rm.estimates(old_alloc)
    names = [n for n in faster if faster[n][0] != before[n][0]]
    timeline.ramp(t, np.array([faster[n][0] - before[n][0] for n in names]), np.full(len(names), t),
                  np.array([t + window_seconds(sbefore, n) for n in names]))
    # ... while the re-plan's smaller windows take effect from t + min(w, w') on (§4.2)
    est, sett = rm.estimates(), rm.all_settings()
    apply_event(timeline, t, faster, est, sbefore, sett)
    steady.append((t, alloc.memory, alloc.f_window, alloc.queries))
    print(f"t = 2.50 h rates x1.5 on {changed}: re-estimation triggered {all(moved)}, {affected} queries re-costed "
          f"({rm.evaluations - e0} evaluations, {rate_replan:.2f} s), f_window {alloc.f_window:.3f}")
    admit_many(3.25 * HOUR, max(1, round(3000 * scale)), "overload burst")

    # exact check of the final allocation (no interpolation between knots)
    x0 = time.perf_counter()
    exact = sum(rm.exact_estimate(n)[0] for n in rm.queries)
    exact_time = time.perf_counter() - x0
    final = rm.allocation
    bound = final.memory_bound
    transient_peak = float(timeline.memory.max())
    result = {
        "queries_initial": queries, "queries_final": final.queries, "accepted": accepted, "rejected": len(rejected),
        "first_rejection": rejected[0][2] if rejected else None,
        "budget_bytes": budget, "bound_after_reserve": bound,
        "cold_start_seconds": cold, "evaluations": rm.evaluations,
        "admission_ms_median": 1e3 * statistics.median(admit_times), "admission_ms_max": 1e3 * max(admit_times),
        "replan_ms_median": 1e3 * statistics.median(search_times), "replan_ms_max": 1e3 * max(search_times),
        "rate_change_replan_seconds": rate_replan,
        "steady_max_over_bound": max(m for _, m, _, _ in steady) / bound,
        "transient_peak_over_budget": transient_peak / budget,
        "final_estimate_interpolated": final.memory, "final_estimate_exact": exact,
        "interpolation_error": final.memory / exact - 1, "exact_check_seconds": exact_time,
        "f_window": [(t, f) for t, _, f, _ in steady],
    }
    os.makedirs(out, exist_ok=True)
    plot(grid, timeline.memory, steady, budget, bound, rejected, os.path.join(out, "pipes_5_4_scalability.png"))
    return result


def plot(grid, memory, steady, budget, bound, rejected, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=[3, 1.4])
    hours = grid / HOUR
    ax.plot(hours, memory / 1e9, color="tab:blue", label="estimate incl. adaptation delays (§4.2)")
    ts = [t / HOUR for t, *_ in steady] + [grid[-1] / HOUR]
    ms = [m / 1e9 for _, m, _, _ in steady]
    ax.step(ts, ms + ms[-1:], where="post", color="tab:green", label="steady-state estimate after each re-plan")
    ax.axhline(budget / 1e9, color="tab:red", label="memory bound")
    ax.axhline(bound / 1e9, color="tab:red", ls="--", lw=0.8, label="bound minus 10 % reserve")
    ax.set_ylabel("memory (GB, PIPES cost model)")
    ax.set_title("PIPES §5.4 at our scale: resource manager under a memory bound")
    ax.legend(loc="lower right", fontsize=8)
    ax2.step(ts, [f for *_, f, _ in steady] + [steady[-1][2]], where="post", color="tab:purple")
    ax2.set_ylabel("f (windows)")
    ax3 = ax2.twinx()
    ax3.step(ts, [n for *_, n in steady] + [steady[-1][3]], where="post", color="tab:gray")
    ax3.set_ylabel("queries", color="tab:gray")
    if rejected:
        ax2.axvline(rejected[0][0] / HOUR, color="tab:red", ls=":", lw=1)
        ax2.text(rejected[0][0] / HOUR, 0.05, f" {len(rejected)} rejected", color="tab:red", fontsize=8)
    ax2.set_xlabel("application time (h)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(harness.FIGURES), help="directory of the figure (PNG)")
    args = parser.parse_args(argv)
    before = harness.start()
    if args.queries < 10:
        parser.error("--queries must be at least 10")
    result = run(args.queries, args.seed, os.path.abspath(args.out))
    print(json.dumps({k: v for k, v in result.items() if k != "f_window"}, indent=1))
    harness.write_result("pipes_5_4_scalability", result, args, before)


if __name__ == "__main__":
    main()
