"""Side by side: pyspark-cq's interval join against Spark's built-in stream-stream join.

Prints medians and ratios for
1. the native kernel alone (insert + probe + expire), tuples/s on one core;
2. eviction cost vs state size (kernel: time to expire a fixed number of rows at 10x more state);
3. end to end on identical file streams (``maxFilesPerTrigger=1``, ``availableNow``): throughput,
   per-batch time, Spark's per-batch eviction time (``allRemovalsTimeMs``) and the state memory both keep;
4. state grouped by hash shard vs by raw key (``grouping="shard"`` / ``"key"``).

``--bucket WIDTH`` (e.g. ``auto`` or ``"60 seconds"``) adds, in 3, a run of the time-bucket layout
(``interval_join(..., bucket=WIDTH)``, issue 14) next to the shard layout and Spark.

Usage::

    python -m benchmarks.perf.join_vs_spark [--rows-per-file 150000] [--files 8] [--keys 200000] [--quick]
                                       [--bucket auto]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from .. import harness
from ..common import run_query, write_streams

# --- 1, 2: the kernel ----------------------------------------------------------------------------------


def kernel_throughput(n=2_000_000, keys=200_000, batch=100_000, window_s=5, repeats=3):
    """Tuples/s for a sliding symmetric join: batches alternate sides, each inserts + probes, then expires.

    Returns (whole run, steady state): the whole run starts from an empty state (so it includes growing
    the state's arrays); the steady state counts the batches after the state has reached its size."""
    from pyspark_cq._native import load

    join = load("_join")
    rng = np.random.default_rng(0)
    k = rng.integers(0, keys, n).astype(np.int64)
    t = np.arange(n, dtype=np.int64) * 10 + rng.integers(0, 1000, n)  # 100k tuples/s of event time
    offsets = np.arange(batch + 1, dtype=np.int64) * 8
    filled = window_s * 100_000 // batch  # batches until the state holds window_s seconds of tuples
    whole, steady = [], []
    for _ in range(repeats):
        state = join.JoinState(-30_000, 30_000)
        times = []
        for s in range(0, n, batch):
            sl = slice(s, s + batch)
            start = time.perf_counter()
            state.insert_probe((s // batch) % 2, offsets, k[sl].view(np.uint8), None, t[sl],
                               np.arange(s, s + batch, dtype=np.int64))
            horizon = int(t[min(s + batch, n) - 1]) - window_s * 1_000_000
            state.evict(0, horizon)
            state.evict(1, horizon)
            times.append(time.perf_counter() - start)
        whole.append(n / sum(times))
        steady.append(batch * len(times[filled:]) / sum(times[filled:]))
    return statistics.median(whole), statistics.median(steady)


def eviction_scaling(sizes=(100_000, 1_000_000), evict=10_000, keys_ratio=5, repeats=5):
    """Seconds to expire the same `evict` rows from states of growing size (PIPES: ∝ removed rows)."""
    from pyspark_cq._native import load

    join = load("_join")
    out = {}
    for size in sizes:
        rng = np.random.default_rng(1)
        k = rng.integers(0, max(1, size // keys_ratio), size).astype(np.int64)
        t = np.arange(size, dtype=np.int64)
        times = []
        for _ in range(repeats):
            state = join.JoinState(0, 0)
            state.insert_probe(0, np.arange(size + 1, dtype=np.int64) * 8, k.view(np.uint8), None, t,
                               np.arange(size, dtype=np.int64))
            start = time.perf_counter()
            ids, _ = state.evict(0, evict - 1)
            times.append(time.perf_counter() - start)
            assert len(ids) == evict
        out[size] = statistics.median(times)
    return out


# --- 3, 4: end to end ----------------------------------------------------------------------------------


def end_to_end(spark, root, files, rows, delay, grouping="shard", shards=None, bucket=None):
    from pyspark.sql import functions as F

    import pyspark_cq

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", delay))

    results = {}
    ck = tempfile.mkdtemp(prefix="cqjoin_ck_")
    for label, width in (("ours", None),) + ((("ours_bucket", bucket),) if bucket else ()):
        ours = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", "-30 seconds", "30 seconds",
                                        suffixes=("_l", "_r"), grouping=grouping, shards=shards, name="bench",
                                        bucket=width)
        wall, progress = run_query(spark, ours, os.path.join(ck, label))
        reports = [pyspark_cq.read_metrics(p, "bench") for p in progress]
        results[label] = {
            "wall_s": wall, "rows_per_s": 2 * files * rows / wall,
            "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "state_rows": [r["state_rows"] if r else 0 for r in reports],
            "state_bytes": [r["state_bytes"] if r else 0 for r in reports],
            "output_rows": sum(r["output_rows"] for r in reports if r),
        }
    if grouping == "shard":
        l, r = source("l").alias("l"), source("r").alias("r")
        cond = F.expr("l.k = r.k AND r.ts >= l.ts + interval -30 seconds AND r.ts <= l.ts + interval 30 seconds")
        theirs = l.join(r, cond).select("l.k", F.col("l.ts").alias("ts_l"), "lv", F.col("r.ts").alias("ts_r"), "rv")
        wall, progress = run_query(spark, theirs, os.path.join(ck, "spark"))
        ops = [p["stateOperators"][0] if p["stateOperators"] else {} for p in progress]
        results["spark"] = {
            "wall_s": wall, "rows_per_s": 2 * files * rows / wall,
            "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "removal_ms": [o.get("allRemovalsTimeMs", 0) for o in ops],
            "state_rows": [o.get("numRowsTotal", 0) for o in ops],
            "state_bytes": [o.get("memoryUsedBytes", 0) for o in ops],
            "output_rows": sum(p.get("sink", {}).get("numOutputRows", 0) or 0 for p in progress),
        }
    shutil.rmtree(ck, ignore_errors=True)
    return results


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows-per-file", type=int, default=150_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--delay", default="4 minutes", help="watermark delay (sets the state size)")
    ap.add_argument("--key-rows", type=int, default=20_000, help="rows per file for the shard-vs-key runs")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--cold", action="store_true",
                    help="no warm-up run: the measured runs include the session's start-up (ours first)")
    ap.add_argument("--bucket", default=None,
                    help="also run the time-bucket layout with this width ('auto' or a duration), issue 14")
    ap.add_argument("--skip", action="append", default=[], choices=["kernel", "keys"],
                    help="leave out a part: the kernel runs, or the (slow) shard-vs-key comparison")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.rows_per_file, args.files, args.keys, args.key_rows = 20_000, 4, 20_000, 2_000

    if "kernel" not in args.skip:
        rate, steady = kernel_throughput()
        print(f"kernel insert+probe+expire: {rate / 1e6:.2f} M tuples/s from an empty state, "
              f"{steady / 1e6:.2f} M tuples/s in steady state (medians of 3, one core)")
        scaling = eviction_scaling()
        small, big = sorted(scaling)
        print(f"kernel eviction of 10k rows: {scaling[small] * 1e3:.2f} ms at {small:,} rows of state, "
              f"{scaling[big] * 1e3:.2f} ms at {big:,} rows (x{scaling[big] / scaling[small]:.2f} for 10x state)")

    spark = harness.cq_session("join-bench", conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
        "spark.driver.memory": "6g", "spark.sql.streaming.metricsEnabled": "false"})
    root = tempfile.mkdtemp(prefix="cqjoin_in_")
    try:
        if not args.cold:
            # Warm both engines on a small input first: the JVM's classes and JIT serve both, and our
            # Python workers stay alive for reuse (Spark keeps idle workers for a minute), so the measured
            # runs compare the engines rather than who ran first. --cold measures from a fresh session.
            write_streams(os.path.join(root, "warm"), 2, 20_000, 20_000)
            warm = end_to_end(spark, os.path.join(root, "warm"), 2, 20_000, args.delay, bucket=args.bucket)
            print(f"warm-up (2 files x 20,000 rows a side): ours {warm['ours']['wall_s']:.1f} s "
                  f"(first batch {warm['ours']['batch_ms'][0] / 1e3:.1f} s), Spark {warm['spark']['wall_s']:.1f} s "
                  f"(first batch {warm['spark']['batch_ms'][0] / 1e3:.1f} s)")
        write_streams(os.path.join(root, "big"), args.files, args.rows_per_file, args.keys)
        res = end_to_end(spark, os.path.join(root, "big"), args.files, args.rows_per_file, args.delay,
                         bucket=args.bucket)
        o, s = res["ours"], res["spark"]
        print(f"end to end, {args.files} files x {args.rows_per_file:,} rows a side, {args.keys:,} keys, ±30 s, "
              f"watermark delay {args.delay}:")
        print(f"  wall: ours {o['wall_s']:.1f} s, Spark {s['wall_s']:.1f} s -> ratio {s['wall_s'] / o['wall_s']:.2f}x")
        print(f"  throughput: ours {o['rows_per_s']:,.0f} rows/s, Spark {s['rows_per_s']:,.0f} rows/s")
        # The first micro-batch carries each engine's start-up (Python workers, imports, JIT); a streaming
        # join runs for hours, so the batches after it are the steady state.
        so, ss = sum(o["batch_ms"][1:]) / 1e3, sum(s["batch_ms"][1:]) / 1e3
        print(f"  steady state (batches 1..{len(o['batch_ms']) - 1}): ours {so:.1f} s, Spark {ss:.1f} s -> ratio "
              f"{ss / so:.2f}x; first batch ours {o['batch_ms'][0] / 1e3:.1f} s, Spark {s['batch_ms'][0] / 1e3:.1f} s")
        # The condition: throughput with >= 1 M rows of state, i.e. the batches that start with it
        # (both engines hold the same rows after every batch, checked below).
        big = [i for i in range(1, len(o["batch_ms"])) if o["state_rows"][i - 1] >= 1_000_000]
        if big:
            bo, bs = sum(o["batch_ms"][i] for i in big) / 1e3, sum(s["batch_ms"][i] for i in big) / 1e3
            print(f"  with >= 1 M rows of state (batches {big[0]}..{big[-1]}): ours {bo:.1f} s, Spark {bs:.1f} s "
                  f"-> ratio {bs / bo:.2f}x")
        if "ours_bucket" in res:
            b = res["ours_bucket"]
            sb = sum(b["batch_ms"][1:]) / 1e3
            print(f"  bucket layout (bucket={args.bucket!r}): wall {b['wall_s']:.1f} s, steady state {sb:.1f} s "
                  f"-> Spark / bucket {ss / sb:.2f}x, shard / bucket {so / sb:.2f}x")
            if big:
                bb = sum(b["batch_ms"][i] for i in big) / 1e3
                print(f"  with >= 1 M rows of state: bucket {bb:.1f} s -> Spark / bucket {bs / bb:.2f}x")
            print(f"  per batch ms bucket: {b['batch_ms']}")
            print(f"  state rows   bucket: {b['state_rows']}")
            print(f"  state bytes  bucket: {[round(x / 2**20, 1) for x in b['state_bytes']]} MiB (serialized)")
            print(f"  output rows: bucket {b['output_rows']:,} (shard layout {o['output_rows']:,})")
        print(f"  per batch ms   ours: {o['batch_ms']}")
        print(f"  per batch ms  Spark: {s['batch_ms']}")
        print(f"  Spark eviction (allRemovalsTimeMs) per batch: {s['removal_ms']}")
        print(f"  state rows     ours: {o['state_rows']}")
        print(f"  state rows    Spark: {s['state_rows']}")
        print(f"  state bytes    ours: {[round(b / 2**20, 1) for b in o['state_bytes']]} MiB (serialized)")
        print(f"  state bytes   Spark: {[round(b / 2**20, 1) for b in s['state_bytes']]} MiB (memoryUsedBytes)")
        print(f"  output rows: ours {o['output_rows']:,}")
        result = {"end_to_end": res}

        if "keys" in args.skip:
            harness.write_result("join_vs_spark", result, args, before)
            return
        write_streams(os.path.join(root, "small"), 4, args.key_rows, max(1, args.key_rows // 2))
        shard = end_to_end(spark, os.path.join(root, "small"), 4, args.key_rows, args.delay)["ours"]
        key = end_to_end(spark, os.path.join(root, "small"), 4, args.key_rows, args.delay, grouping="key")["ours"]
        print(f"shard vs key grouping, 4 files x {args.key_rows:,} rows a side, {max(1, args.key_rows // 2):,} keys:")
        print(f"  shard: {shard['wall_s']:.1f} s ({shard['rows_per_s']:,.0f} rows/s); "
              f"key: {key['wall_s']:.1f} s ({key['rows_per_s']:,.0f} rows/s) -> shard is "
              f"{key['wall_s'] / shard['wall_s']:.1f}x faster")
        result["grouping"] = {"shard": shard, "key": key}
        harness.write_result("join_vs_spark", result, args, before)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
