"""STREAM §5.1 on Spark: allocation for precision against the PIPES resource manager's uniform reduction.

Motwani, Widom et al. (STREAM), §5.1: a fixed memory allocated across a query's operators to maximise the
precision of its result, precision being (FP, FN) propagated bottom-up through the plan
(:mod:`pyspark_cq.cost.stream_precision`). The query (:mod:`pyspark_cq.experiments.precision_join`): σ on the
left input (selectivity 1/2), per-input load shedding, a window join of 10 s windows (QoS range [5 s, 10 s]);
L 400 rows/s, R 50 rows/s. At the same memory bound (``--memory-share`` of the query's unreduced memory in the
PIPES model, 64-byte elements, reserve 0), two policies decide once, from the same snapshot:

- ``precision`` (:class:`pyspark_cq_plugins.precision.PrecisionAllocator`): windows and each input's kept
  share chosen for the best predicted F1;
- ``pipes`` (:class:`pyspark_cq_plugins.pipes_rm.PipesResourceManager`, ``shed=True``): windows reduced
  uniformly within their QoS range, then, when even the minimum does not fit, both inputs shed alike.

Their decisions go into a control table from event time 0, the query runs on Spark (local[2], one parquet
file per side and micro-batch, ``availableNow``), and its output is compared with the exact result (the
oracle :func:`~pyspark_cq.experiments.precision_join.exact_pairs`; ``--exact-run`` also runs the unreduced
query on Spark and checks it equals the oracle): measured (FP, FN) and F1 against the predicted ones.

Usage::

    python -m benchmarks.experiments.stream_precision [--quick] [--memory-share 0.25] [--json PATH]
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from pyspark_cq_plugins.pipes_rm import DEFAULT_PROFILE, PipesResourceManager
from pyspark_cq_plugins.precision import PrecisionAllocator

from pyspark_cq.control import ControlTable
from pyspark_cq.control.schema import side_drop_ratios
from pyspark_cq.cost.stream_precision import plan_memory, plan_precision
from pyspark_cq.experiments.pipes_join import OP, write_streams
from pyspark_cq.experiments.precision_join import (
    LABEL,
    QUERY,
    RATE_LEFT,
    RATE_RIGHT,
    WINDOW_S,
    exact_pairs,
    make_workload,
    measured,
    query_plan,
    query_qos,
    run_spark,
)

from .. import harness

S = 1_000_000


def make_spark(partitions: int = 2):
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return harness.cq_session("stream-precision", partitions, conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000", "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC"})


def snapshot():
    """The one snapshot both policies decide from: the query's plan, QoS, source rates and initial control."""
    from pyspark_cq.policies import QueryInfo, Snapshot, SourceStats

    info = QueryInfo(QUERY, plan=query_plan(), qos=query_qos(),
                     sources={"L": SourceStats("L", RATE_LEFT, 1 / RATE_LEFT),
                              "R": SourceStats("R", RATE_RIGHT, 1 / RATE_RIGHT)},
                     control={OP: {"window": int(WINDOW_S * S), "drop_ratio": 0.0}})
    return Snapshot(queries={QUERY: info})


def settings(decisions, control: dict) -> dict:
    """The join's entry after ``decisions`` (window µs, kept shares per input)."""
    entry = dict(control)
    for d in decisions:
        for k, v in d.changes.items():
            entry[k] = {**(entry.get(k) or {}), **v} if k == "params" else v
    drops = side_drop_ratios(entry, (0.0, 0.0))
    return {"entry": entry, "window_s": entry["window"] / S, "kept": {"L": 1 - drops[0], "R": 1 - drops[1]}}


def predicted(setting: dict):
    """Predicted (FP, FN) and memory (bytes: the policies' model, ms time unit, 64-byte elements) of a setting."""
    ms = {"windows": {LABEL: setting["window_s"] * 1000}, "kept": setting["kept"]}
    prec = plan_precision(query_plan(1000), **ms)
    mem = plan_memory(query_plan(1000), {"L": 1000 / RATE_LEFT, "R": 1000 / RATE_RIGHT}, profile=DEFAULT_PROFILE,
                      **ms)
    return prec, mem


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="40 s of event time instead of 120 s")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of event time")
    ap.add_argument("--file-s", type=float, default=2.0, help="seconds of event time per file / micro-batch")
    ap.add_argument("--memory-share", type=float, default=0.25,
                    help="the memory bound as a share of the query's unreduced memory (PIPES model)")
    ap.add_argument("--delay", type=float, default=1.0, help="watermark delay (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--exact-run", action="store_true", help="also run the unreduced query and check it")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration = 40.0
    snap = snapshot()
    control = snap.queries[QUERY].control[OP]
    full_memory = predicted({"window_s": WINDOW_S, "kept": {"L": 1.0, "R": 1.0}})[1]
    bound = args.memory_share * full_memory
    policies = {"precision": PrecisionAllocator(bound, reserve=0.0),
                "pipes_uniform": PipesResourceManager(bound, reserve=0.0, shed=True, min_kept=0.01)}
    plans = {name: settings(p.decide(snap), control) for name, p in policies.items()}
    if args.exact_run:
        plans = {"exact": settings([], control), **plans}

    streams = make_workload(args.duration, file_s=args.file_s, seed=args.seed)
    exact = exact_pairs(streams)
    before = harness.start()
    work = tempfile.mkdtemp(prefix="stream_precision_")
    root = os.path.join(work, "in")
    write_streams(root, streams)
    spark = make_spark()
    result = {"setup": {"duration_s": args.duration, "file_s": args.file_s, "rate_left": RATE_LEFT,
                        "rate_right": RATE_RIGHT, "selectivity_left": 0.5, "window_s": WINDOW_S,
                        "qos_window_s": [5.0, WINDOW_S], "memory_bound_bytes": bound,
                        "unreduced_memory_bytes": full_memory, "memory_share": args.memory_share,
                        "exact_pairs": len(exact)},
              "runs": {}}
    try:
        for name, setting in plans.items():
            table = ControlTable(os.path.join(work, f"ct_{name}.json"))
            entry = setting["entry"]
            table.register(OP, query=QUERY, window=entry["window"], drop_ratio=entry.get("drop_ratio", 0.0),
                           **({"params": entry["params"]} if entry.get("params") else {}))
            r = run_spark(spark, root, os.path.join(work, name), control=table.handle(OP), delay_s=args.delay)
            got, check = measured(r["pairs"], exact)
            pred, mem = predicted(setting)
            b = r["batches"]
            run = {"window_s": setting["window_s"], "kept": setting["kept"], "predicted_memory_bytes": mem,
                   "predicted": {"fp": pred.fp, "fn": pred.fn, "recall": pred.recall, "f1": pred.f1},
                   "measured": {"fp": got.fp, "fn": got.fn, "recall": got.recall, "f1": got.f1},
                   "fn_rel_error": (got.fn - pred.fn) / pred.fn if pred.fn else (0.0 if got.fn == 0 else None),
                   "fp_abs_error": got.fp - pred.fp, "check": check, "wall_s": r["wall_s"],
                   "state_rows_max": int(b.state_rows.max()) if "state_rows" in b else None,
                   "shed_rows": int(b.shed_rows.sum()) if "shed_rows" in b else None,
                   "late_rows": int(b.late_rows.sum()) if "late_rows" in b else None}
            result["runs"][name] = run
            print(f"  {name:14s} window {setting['window_s']:.3g} s, kept L {setting['kept']['L']:.3f} "
                  f"R {setting['kept']['R']:.3f}: F1 measured {got.f1:.4f} (predicted {pred.f1:.4f}); "
                  f"FP {got.fp:.4f} ({pred.fp:.4f}), FN {got.fn:.3f} ({pred.fn:.3f}); "
                  f"pairs {check['measured']:,} of {check['expected']:,}; state rows max {run['state_rows_max']}; "
                  f"{r['wall_s']:.1f} s", flush=True)
        runs = result["runs"]
        result["f1_ratio_precision_to_pipes"] = runs["precision"]["measured"]["f1"] / runs["pipes_uniform"]["measured"]["f1"]
        result["goal"] = {"f1_at_least_pipes": runs["precision"]["measured"]["f1"] >= runs["pipes_uniform"]["measured"]["f1"],
                          "fp_fn_within_20pct": all(abs(r["fn_rel_error"] or 0) <= 0.2 and abs(r["fp_abs_error"]) <= 0.2
                                                    for r in runs.values())}
        print(f"  F1 precision / PIPES uniform = {result['f1_ratio_precision_to_pipes']:.3f}; goal {result['goal']}")
        harness.write_result("stream_precision", result, args, before)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
