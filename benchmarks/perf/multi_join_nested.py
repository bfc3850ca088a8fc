"""State and speed of cq.multi_join with nested left inputs (``how=["left", "left"]``, issue 42) on the funnel.

impressions, with or without a click within 10 minutes, with or without a purchase within 70 minutes of the
impression (every bound to input 0: the shape Spark's streaming chain of left outer joins can run). Three queries on
the same parquet file streams (``maxFilesPerTrigger=1``, ``availableNow``), one after the other: multi_join with
``how=["left", "left"]``, multi_join inner (the same bounds) and Spark's chain of two left outer stream-stream joins.
Prints per query the wall time, the median batch time (batches after the first), the output rows (and the
null-padded ones), the state rows and memory, and multi_join's waiting tuples (``unmatched_rows``).

Output rows of the left queries may differ by the null-padded rows still waiting at the end (Spark's second join
evicts by the watermark it propagates from the first, later than multi_join: docs/multi_join.md).

Usage::

    python -m benchmarks.perf.multi_join_nested [--files 12] [--impressions 20000] [--users 100000] [--quick]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from .. import harness
from .multi_join_vs_spark import _sources, run, write_streams

#: every bound to input 0 (a purchase within 70 minutes of the impression)
BOUNDS = [(0, 1, "0 seconds", "10 minutes"), (0, 2, "0 seconds", "70 minutes")]


def ours(spark, root, delay, ck, how):
    import pyspark_cq as cq

    name = f"nested_{'_'.join(how)}"
    df = cq.multi_join(_sources(spark, root, delay), ["imp_user", "clk_user", "buy_user"],
                       ["imp_ts", "clk_ts", "buy_ts"], BOUNDS, how=list(how), name=name)
    wall, progress = run(df, os.path.join(ck, name))
    reports = [cq.read_metrics(p, name) or {} for p in progress]
    return {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "output_rows": sum(r.get("output_rows", 0) for r in reports),
            "padded_rows": sum(r.get("padded_rows", 0) for r in reports),
            "state_rows": [r.get("state_rows", 0) for r in reports],
            "state_bytes": [r.get("state_bytes", 0) for r in reports],
            "unmatched_rows": [r.get("unmatched_rows", 0) for r in reports]}


def spark_left_chain(imp, clk, buy):
    """Spark's chain of left outer joins with the same bounds; one event-time column per stream (the impression's)."""
    from pyspark.sql import functions as F

    first = imp.join(clk, F.expr("imp_user = clk_user AND clk_ts BETWEEN imp_ts AND imp_ts + INTERVAL 10 MINUTES"),
                     "left_outer")
    first = first.select(*[F.col(c).alias(c, metadata={}) if c == "clk_ts" else F.col(c) for c in first.columns])
    return first.join(buy, F.expr("imp_user = buy_user AND buy_ts BETWEEN imp_ts AND imp_ts + INTERVAL 70 MINUTES"),
                      "left_outer")


def theirs(spark, root, delay, ck):
    wall, progress = run(spark_left_chain(*_sources(spark, root, delay)), os.path.join(ck, "spark"))
    return {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "output_rows": sum(p.get("sink", {}).get("numOutputRows", 0) or 0 for p in progress),
            "state_rows": [sum(o.get("numRowsTotal", 0) for o in p["stateOperators"]) for p in progress],
            "state_bytes": [sum(o.get("memoryUsedBytes", 0) for o in p["stateOperators"]) for p in progress]}


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--impressions", type=int, default=20_000, help="impressions per file (5 minutes)")
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--delay", default="5 minutes", help="watermark delay")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.files, args.impressions, args.users = 4, 3_000, 10_000
    conf = {"spark.sql.adaptive.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
            "spark.sql.streaming.metricsEnabled": "false"}
    spark = harness.cq_session("multi-join-nested-bench", conf=conf)
    root = tempfile.mkdtemp(prefix="cqmjnested_")
    try:
        write_streams(os.path.join(root, "warm"), 2, 2_000, 2_000)  # warm the JVM and the Python workers
        ours(spark, os.path.join(root, "warm"), args.delay, os.path.join(root, "ckw"), ("left", "left"))
        theirs(spark, os.path.join(root, "warm"), args.delay, os.path.join(root, "ckw"))
        write_streams(os.path.join(root, "u"), args.files, args.impressions, args.users)
        runs = {"multi_join left,left": ours(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck"),
                                             ("left", "left")),
                "multi_join inner,inner": ours(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck"),
                                               ("inner", "inner")),
                "Spark left outer chain": theirs(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck"))}
        print(f"funnel with or without a click (10 min) and a purchase (70 min of the impression), {args.files} files "
              f"x ({args.impressions:,} impressions + 1/5 clicks + 1/25 purchases), {args.users:,} users, "
              f"watermark delay {args.delay}:")
        for label, r in runs.items():
            extra = ""
            if "unmatched_rows" in r:
                extra = (f", padded rows {r['padded_rows']:,}, waiting tuples max {max(r['unmatched_rows']):,} "
                         f"(last {r['unmatched_rows'][-1]:,})")
            print(f"  {label}: wall {r['wall_s']:.1f} s, median batch {statistics.median(r['batch_ms'][1:]):.0f} ms, "
                  f"output rows {r['output_rows']:,}, state rows max {max(r['state_rows']):,}, state memory max "
                  f"{max(r['state_bytes']) / 2**20:.1f} MiB{extra}")
        left, inner, chain = runs.values()
        print(f"  left vs inner: median batch {statistics.median(left['batch_ms'][1:]) / statistics.median(inner['batch_ms'][1:]):.2f}x, "
              f"state memory {max(left['state_bytes']) / max(max(inner['state_bytes']), 1):.2f}x; Spark's chain / "
              f"left: median batch {statistics.median(chain['batch_ms'][1:]) / statistics.median(left['batch_ms'][1:]):.2f}x, "
              f"state memory {max(chain['state_bytes']) / max(max(left['state_bytes']), 1):.1f}x "
              "(serialized state vs memoryUsedBytes)")
        harness.write_result("multi_join_nested", runs, args, before)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
