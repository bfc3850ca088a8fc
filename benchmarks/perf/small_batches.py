"""Side by side at small micro-batches: the per-batch floor of our stateful operators against Spark's own.

Issue 14's first goal: with 5 k rows per micro-batch our sliding aggregation (W/S = 60, 100 keys) and our
interval join (±30 s, 200 k keys) should take ≤ 0.8× Spark's per-batch time; with 50 k rows per batch the
aggregation should be ≥ 3× and the join ≥ 2× faster. Both operators and Spark's ``groupBy(window(...))`` /
stream-stream join run on identical file streams (``maxFilesPerTrigger=1``, ``availableNow``, ``noop``
sink) in one session. Printed per size and round: the median ``triggerExecution`` over the steady
batches (the first two and the last are left out: worker start and the final no-data batch), Spark's
phases (``addBatch``, the state operator's update / removal / commit times summed over tasks), and the
ratio Spark / ours (> 1: ours is faster); then the median ratio over the rounds.

Order matters: the first streaming query of a JVM runs its batches up to 2x slower than the same query
later in the session (the JIT warms up over dozens of batches; measured 2026-11-27: our join 1,098 ms per
batch as the session's first query, 550 ms as its third). So a warm-up pass runs every query of the
run once on 8 files before anything is measured, and the ``--rounds`` alternate which side runs
first (round 1 ours first, round 2 Spark first, ...).

``--floor`` also runs the join's *shape* with no work in the same session: the same tagged union of both
sides, observed and grouped by shard into an ``applyInPandasWithState`` with event-time timeouts whose
function only counts its rows and rewrites a state of random (incompressible) bytes — a few bytes, and
then as many per shard as our join reported as ``state_bytes`` in that batch. What any join of this shape
costs per batch before doing anything (the ratio Spark / floor bounds what a faster kernel could give).

``--row-slices`` also runs our aggregation with one row per slice between its two stages, the transport
before the packed slices (docs/aggregate.md, "How it runs"), right after ours in each round.

Usage::

    python -m benchmarks.perf.small_batches [--sizes 5000,50000] [--files 12] [--rounds 2] [--only join] [--floor]
                                       [--row-slices] [--no-warmup] [--json out.json]
"""
from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile

from .. import common, harness
from ..common import _summary, join_shape

WARMUP_FILES = 8   # micro-batches of each query in the warm-up (4 left the first measured query ~30 % slow)


def _run(spark, df, checkpoint, report=None) -> dict:
    _, progress = common.run_query(spark, df, checkpoint)
    out = _summary(progress)
    if report is not None:   # our operator's state bytes per batch, for the floor that carries them
        import pyspark_cq

        out["state_bytes"] = [(pyspark_cq.read_metrics(p, report) or {}).get("state_bytes", 0) for p in progress]
    return out


def join_floor(spark, left, right, checkpoint, sizes=None) -> dict:
    """The join's shape with no work (see the module docstring): :func:`floor_shapes.join_shape` with a
    state of ``sizes[b]`` / shards random bytes per shard in batch b (a few bytes without ``sizes``).
    """

    return _run(spark, join_shape(left, right, sizes or [0]), checkpoint)


def aggregation(spark, tmp, rows, files, spark_first=False, tag="", row_slices=False):
    """Our sliding aggregation and Spark's ``window()`` (W/S = 60) on the same file stream: (ours, theirs);
    with ``row_slices`` ours also runs with one row per slice from the slicer to the stateful stage (the
    transport before the packed slices), as ``ours["row_slices"]``.
    """
    data = os.path.join(tmp, f"agg{rows}_{files}")
    if not os.path.isdir(data):
        common.write_data(data, rows * files, files)

    def source():
        return (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
                .parquet(data).withWatermark("ts", common.DELAY))

    def ours():
        out = _run(spark, common.ours_agg(source(), "60 seconds"), os.path.join(tmp, f"ck_agg_o{rows}{tag}"))
        if row_slices:
            from pyspark_cq.operators.aggregate import driver as aggregate

            aggregate._PACK_SLICES = False
            try:
                out["row_slices"] = _run(spark, common.ours_agg(source(), "60 seconds"),
                                         os.path.join(tmp, f"ck_agg_or{rows}{tag}"))
            finally:
                aggregate._PACK_SLICES = True
        return out

    def theirs():
        return _run(spark, common.spark_agg(source(), "60 seconds"), os.path.join(tmp, f"ck_agg_s{rows}{tag}"))

    return _both(ours, theirs, spark_first)


def _both(ours, theirs, spark_first: bool):
    """Run both sides, Spark's first when ``spark_first``; returns (ours, theirs)."""
    if spark_first:
        t = theirs()
        return ours(), t
    o = ours()
    return o, theirs()


def interval_join(spark, tmp, rows, files, keys=200_000, delay="4 minutes", floor=False, spark_first=False, tag=""):
    """Our interval join and Spark's stream-stream join (±30 s) on the same file streams: (ours, theirs);
    with ``floor`` ours also carries the join's shape with no work, without and with our state's bytes.
    """
    from pyspark.sql import functions as F

    import pyspark_cq

    root = os.path.join(tmp, f"join{rows}_{files}")
    if not os.path.isdir(root):
        common.write_streams(root, files, rows, keys)

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", delay))

    def ours():
        ours_df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", "-30 seconds", "30 seconds",
                                           suffixes=("_l", "_r"), name="bench")
        out = _run(spark, ours_df, os.path.join(tmp, f"ck_join_o{rows}{tag}"), report="bench")
        if floor:
            out["floor"] = join_floor(spark, source("l"), source("r"), os.path.join(tmp, f"ck_join_f{rows}{tag}"))
            out["floor_state"] = join_floor(spark, source("l"), source("r"),
                                            os.path.join(tmp, f"ck_join_fs{rows}{tag}"), out["state_bytes"])
        return out

    def theirs():
        l, r = source("l").alias("l"), source("r").alias("r")
        cond = F.expr("l.k = r.k AND r.ts >= l.ts + interval -30 seconds AND r.ts <= l.ts + interval 30 seconds")
        theirs_df = l.join(r, cond).select("l.k", F.col("l.ts").alias("ts_l"), "lv", F.col("r.ts").alias("ts_r"), "rv")
        return _run(spark, theirs_df, os.path.join(tmp, f"ck_join_s{rows}{tag}"))

    return _both(ours, theirs, spark_first)


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--sizes", default="5000,50000", help="rows per micro-batch (per side for the join)")
    ap.add_argument("--files", type=int, default=12, help="micro-batches per run")
    ap.add_argument("--only", choices=["aggregation", "join"], default=None)
    ap.add_argument("--floor", action="store_true", help="also the join's shape with no work (module docstring)")
    ap.add_argument("--row-slices", action="store_true",
                    help="also our aggregation with one row per slice (the transport before packed slices)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of both sides per size, alternating which "
                                                             "runs first; the ratio printed last is their median")
    ap.add_argument("--no-warmup", action="store_true", help="measure from a cold JVM (module docstring)")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    sizes = [int(s) for s in args.sizes.split(",")]
    ops = [(op, run) for op, run in (("aggregation", aggregation), ("join", interval_join))
           if not args.only or op == args.only]
    spark = common.session()
    tmp = tempfile.mkdtemp(prefix="cq_small_")
    results = {"machine": platform.platform(), "cpus": os.cpu_count(), "sizes": sizes, "rounds": args.rounds,
               "warmup": not args.no_warmup, "runs": []}
    try:
        if not args.no_warmup:   # every query once, on a few files: the JIT compiles what all of them run
            for _op, run in ops:
                run(spark, tmp, min(sizes), WARMUP_FILES, tag="_warm")
            print(f"warm-up done, load {os.getloadavg()[0]:.1f}", flush=True)
        for rows in sizes:
            for op, run in ops:
                extra = {"floor": True} if args.floor and op == "join" else {}
                if args.row_slices and op == "aggregation":
                    extra = {"row_slices": True}
                ratios = []
                for r in range(args.rounds):
                    ours, theirs = run(spark, tmp, rows, args.files, spark_first=r % 2 == 1, tag=f"_r{r}", **extra)
                    ratio = theirs["median_ms"] / ours["median_ms"]
                    ratios.append(ratio)
                    load = os.getloadavg()[0]
                    results["runs"].append({"operator": op, "rows_per_batch": rows, "round": r,
                                            "spark_first": r % 2 == 1, "ours": ours, "spark": theirs,
                                            "spark_over_ours": ratio, "load": load})
                    print(f"{op:11s} {rows:>7,} rows/batch, round {r} ({'Spark' if r % 2 else 'ours'} first): "
                          f"ours {ours['median_ms']:,.0f} ms {ours['phases_ms']}, Spark {theirs['median_ms']:,.0f} ms "
                          f"{theirs['phases_ms']}, Spark/ours {ratio:.2f}x (ours/Spark {1 / ratio:.2f}), "
                          f"load {load:.1f}", flush=True)
                    for shape in ("floor", "floor_state", "row_slices"):
                        if shape in ours:
                            f = ours[shape]["median_ms"]
                            print(f"  {shape}: {f:,.0f} ms {ours[shape]['phases_ms']}, Spark/{shape} "
                                  f"{theirs['median_ms'] / f:.2f}x", flush=True)
                med = statistics.median(ratios)
                print(f"{op:11s} {rows:>7,} rows/batch: median over {len(ratios)} rounds Spark/ours {med:.2f}x "
                      f"(ours/Spark {1 / med:.2f})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    harness.write_result("small_batches", results, args, before)


if __name__ == "__main__":
    main()
