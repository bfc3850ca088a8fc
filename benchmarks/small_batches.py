"""Side by side at small micro-batches: the per-batch floor of our stateful operators against Spark's own.

Issue 14's first goal: with 5 k rows per micro-batch our sliding aggregation (W/S = 60, 100 keys) and our
interval join (±30 s, 200 k keys) should take ≤ 0.8× Spark's per-batch time; with 50 k rows per batch the
aggregation should be ≥ 3× and the join ≥ 2× faster. Both operators and Spark's ``groupBy(window(...))`` /
stream-stream join run on identical file streams (``maxFilesPerTrigger=1``, ``availableNow``, ``noop``
sink) in one session, alternating ours and Spark's per size. Printed per size: the median
``triggerExecution`` over the steady batches (the first two and the last are left out: worker start and
the final no-data batch), Spark's phases (``addBatch``, the state operator's update / removal / commit
times summed over tasks), and the ratio Spark / ours (> 1: ours is faster).

``--floor`` also runs the join's *shape* with no work in the same session: the same tagged union of both
sides, observed and grouped by shard into an ``applyInPandasWithState`` with event-time timeouts whose
function only counts its rows and rewrites a state of random (incompressible) bytes — a few bytes, and
then as many per shard as our join reported as ``state_bytes`` in that batch. What any join of this shape
costs per batch before doing anything (the ratio Spark / floor bounds what a faster kernel could give).

Usage::

    python benchmarks/small_batches.py [--sizes 5000,50000] [--files 12] [--only join] [--floor] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aggregate_vs_spark as agg  # noqa: E402  (the aggregation's data, queries and session)
import join_vs_spark as join  # noqa: E402  (the join's data and queries)

PHASES = ("addBatch", "allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")


def _summary(progress: list[dict]) -> dict:
    steady = progress[2:-1] or progress
    phases = []
    for p in steady:
        ops = p.get("stateOperators") or [{}]
        phases.append({"addBatch": p["durationMs"].get("addBatch", 0),
                       **{k: sum(o.get(k, 0) for o in ops) for k in PHASES[1:]}})
    return {"median_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in steady),
            "phases_ms": {k: statistics.median(x[k] for x in phases) for k in PHASES},
            "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress]}


def _run(spark, df, checkpoint, report=None) -> dict:
    _, progress = join.run_query(spark, df, checkpoint)
    out = _summary(progress)
    if report is not None:   # our operator's state bytes per batch, for the floor that carries them
        import pyspark_cq

        out["state_bytes"] = [(pyspark_cq.read_metrics(p, report) or {}).get("state_bytes", 0) for p in progress]
    return out


def join_floor(spark, left, right, checkpoint, sizes=None) -> dict:
    """The join's shape with no work (see the module docstring): :func:`floor_shapes.join_shape` with a
    state of ``sizes[b]`` / shards random bytes per shard in batch b (a few bytes without ``sizes``).
    """
    from floor_shapes import join_shape

    return _run(spark, join_shape(left, right, sizes or [0]), checkpoint)


def aggregation(spark, tmp, rows, files):
    data = os.path.join(tmp, f"agg{rows}")
    agg.write_data(data, rows * files, files)

    def source():
        return (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
                .parquet(data).withWatermark("ts", agg.DELAY))

    ours = _run(spark, agg.ours_agg(source(), "60 seconds"), os.path.join(tmp, f"ck_agg_o{rows}"))
    theirs = _run(spark, agg.spark_agg(source(), "60 seconds"), os.path.join(tmp, f"ck_agg_s{rows}"))
    return ours, theirs


def interval_join(spark, tmp, rows, files, keys=200_000, delay="4 minutes", floor=False):
    from pyspark.sql import functions as F

    import pyspark_cq

    root = os.path.join(tmp, f"join{rows}")
    join.write_streams(root, files, rows, keys)

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", delay))

    ours_df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", "-30 seconds", "30 seconds",
                                       suffixes=("_l", "_r"), name="bench")
    ours = _run(spark, ours_df, os.path.join(tmp, f"ck_join_o{rows}"), report="bench")
    if floor:
        ours["floor"] = join_floor(spark, source("l"), source("r"), os.path.join(tmp, f"ck_join_f{rows}"))
        ours["floor_state"] = join_floor(spark, source("l"), source("r"), os.path.join(tmp, f"ck_join_fs{rows}"),
                                         ours["state_bytes"])
    l, r = source("l").alias("l"), source("r").alias("r")
    cond = F.expr("l.k = r.k AND r.ts >= l.ts + interval -30 seconds AND r.ts <= l.ts + interval 30 seconds")
    theirs_df = l.join(r, cond).select("l.k", F.col("l.ts").alias("ts_l"), "lv", F.col("r.ts").alias("ts_r"), "rv")
    theirs = _run(spark, theirs_df, os.path.join(tmp, f"ck_join_s{rows}"))
    return ours, theirs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5000,50000", help="rows per micro-batch (per side for the join)")
    ap.add_argument("--files", type=int, default=12, help="micro-batches per run")
    ap.add_argument("--only", choices=["aggregation", "join"], default=None)
    ap.add_argument("--floor", action="store_true", help="also the join's shape with no work (module docstring)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = agg.session()
    tmp = tempfile.mkdtemp(prefix="cq_small_")
    results = {"machine": platform.platform(), "cpus": os.cpu_count(), "sizes": sizes, "runs": []}
    try:
        for rows in sizes:
            for op, run in (("aggregation", aggregation), ("join", interval_join)):
                if args.only and op != args.only:
                    continue
                extra = {"floor": True} if args.floor and op == "join" else {}
                ours, theirs = run(spark, tmp, rows, args.files, **extra)
                ratio = theirs["median_ms"] / ours["median_ms"]
                load = os.getloadavg()[0]
                results["runs"].append({"operator": op, "rows_per_batch": rows, "ours": ours, "spark": theirs,
                                        "spark_over_ours": ratio, "load": load})
                print(f"{op:11s} {rows:>7,} rows/batch: ours {ours['median_ms']:,.0f} ms "
                      f"{ours['phases_ms']}, Spark {theirs['median_ms']:,.0f} ms {theirs['phases_ms']}, "
                      f"Spark/ours {ratio:.2f}x (ours/Spark {1 / ratio:.2f}), load {load:.1f}", flush=True)
                for shape in ("floor", "floor_state"):
                    if shape in ours:
                        f = ours[shape]["median_ms"]
                        print(f"  {shape}: {f:,.0f} ms {ours[shape]['phases_ms']}, Spark/{shape} "
                              f"{theirs['median_ms'] / f:.2f}x", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
