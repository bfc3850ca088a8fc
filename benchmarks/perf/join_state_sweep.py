"""Interval join: per-batch time at a fixed batch size as the state grows (issue 39's sweep).

For each state size in ``--sizes`` (millions of rows, both sides together) the stream first loads that many
rows (fill batches of at most ``--fill-rows`` rows, not measured), then runs ``--measure`` batches of
``--batch-rows`` rows (half a side); a 1 hour watermark delay keeps every row in the state, ±30 s band on
``k`` (``--keys`` keys). Engines (``--engines``): ``full``, ``changelog`` and ``files`` (``interval_join``
with ``state_persistence=``; ``files`` and ``stateless`` keep their state directory beside the query's
checkpoint), ``spark`` (Spark's stream-stream join on the default HDFS-backed store) and
``rocksdb`` (Spark's join on RocksDB with changelog checkpointing). Prints per size and engine the median
batch time of the measured batches, the state store's ``memoryUsedBytes`` after the last batch, ours' state
bytes and the resident cache's hits / misses. One session (``local[2]``); each query its own checkpoint.
``--session cq`` (default) is ``cq.spark()``'s tuned session with 2 shuffle partitions; ``--session plain`` a
plain ``SparkSession`` as a user makes it (Spark's default 200 shuffle partitions unless ``--partitions``).

Usage::

    python -m benchmarks.perf.join_state_sweep [--sizes 0.5 1 2 5 10] [--batch-rows 50000] [--measure 4]
                                               [--engines full changelog files stateless spark rocksdb]
                                               [--session cq|plain] [--partitions N]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

BASE_US = 1_700_000_000_000_000
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
OURS = ("full", "changelog", "files", "stateless")


def write_input(root: str, state_rows: int, batch_rows: int, measure: int, fill_rows: int, keys: int,
                seed: int = 0) -> int:
    """Fill files (``state_rows`` rows, event times in the first 10 minutes) then ``measure`` files of
    ``batch_rows`` rows (one minute each after them); returns the number of fill files.
    """
    rng = np.random.default_rng(seed)
    sizes = [fill_rows] * (state_rows // fill_rows) + ([state_rows % fill_rows] if state_rows % fill_rows else [])
    fills = len(sizes)
    spans = [(i * 600_000_000 // fills, 600_000_000 // fills) for i in range(fills)]
    spans += [(600_000_000 + i * 60_000_000, 60_000_000) for i in range(measure)]
    sizes += [batch_rows] * measure
    for i, (n, (start, width)) in enumerate(zip(sizes, spans)):
        for side in ("l", "r"):
            m = n // 2
            t = BASE_US + start + rng.integers(0, width, m)
            table = pa.table({"k": pa.array(rng.integers(0, keys, m), pa.int64()),
                              "ts": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              f"{side}v": pa.array(rng.integers(0, 1 << 40, m), pa.int64())})
            os.makedirs(os.path.join(root, side), exist_ok=True)
            path = os.path.join(root, side, f"b{i:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + i * 10,) * 2)   # file order = batch order
    return fills


def run(spark, root: str, engine: str, measure: int, ck: str, shards: int | None = None) -> dict:
    """One query to the end: medians of the last ``measure`` batches and the state at the end."""
    from pyspark.sql import functions as F

    import pyspark_cq

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", "1 hour"))

    old = {k: spark.conf.get(k, None) for k in (PROVIDER, CHANGELOG)}
    if engine in OURS:
        df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", "-30 seconds", "30 seconds",
                                      suffixes=("_l", "_r"), name="sweep", state_persistence=engine,
                                      state_dir=ck + "_state", shards=shards)
    else:
        if engine == "rocksdb":
            spark.conf.set(PROVIDER, ROCKSDB)
            spark.conf.set(CHANGELOG, "true")
        l, r = source("l").alias("l"), source("r").alias("r")
        cond = F.expr("l.k = r.k AND r.ts >= l.ts + interval -30 seconds AND r.ts <= l.ts + interval 30 seconds")
        df = l.join(r, cond).select("l.k", F.col("l.ts").alias("ts_l"), "lv", F.col("r.ts").alias("ts_r"), "rv")
    try:
        q = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
        start = time.perf_counter()
        q.awaitTermination()
        wall = time.perf_counter() - start
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    # batches that read input (availableNow may end with a batch without any, e.g. for a last eviction)
    progress = [p for p in (json.loads(p.json) for p in q.recentProgress) if p.get("numInputRows", 0) > 0]
    steady = progress[-measure:]
    ops = [p["stateOperators"][0] if p["stateOperators"] else {} for p in progress]
    out = {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
           "median_ms": statistics.median(p["durationMs"].get("triggerExecution", 0) for p in steady),
           "store_memory_bytes": ops[-1].get("memoryUsedBytes", 0), "state_rows_spark": ops[-1].get("numRowsTotal")}
    if engine in OURS:
        reports = [pyspark_cq.read_metrics(p, "sweep") or {} for p in steady]
        out["state_rows"] = reports[-1].get("state_rows", 0)
        out["state_bytes"] = reports[-1].get("state_bytes", 0)
        out["cache_hits"] = sum(r.get("state_cache_hits", 0) for r in reports)
        out["cache_misses"] = sum(r.get("state_cache_misses", 0) for r in reports)
        out["cache_catch_ups"] = sum(r.get("state_cache_catch_ups", 0) for r in reports)
    return out


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1, 2, 5, 10], help="state rows, millions")
    ap.add_argument("--batch-rows", type=int, default=50_000, help="rows per measured batch (half a side)")
    ap.add_argument("--measure", type=int, default=4, help="measured batches per size")
    ap.add_argument("--fill-rows", type=int, default=500_000, help="rows per fill batch (not measured)")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--engines", nargs="+", default=["full", "changelog", "files", "spark", "rocksdb"],
                    choices=[*OURS, "spark", "rocksdb"])
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--session", choices=("cq", "plain"), default="cq",
                    help="cq.spark()'s session, or a plain SparkSession as a user makes it")
    ap.add_argument("--shards", type=int, default=None, help="our joins' shards (default: the operator's rule)")
    ap.add_argument("--partitions", type=int, default=None,
                    help="shuffle partitions (default: 2 for cq, Spark's 200 for plain)")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.session == "plain":
        spark = harness.plain_session("join-state-sweep", partitions=args.partitions or 200,
                                      conf={"spark.driver.memory": args.driver_memory})
    else:
        spark = harness.cq_session("join-state-sweep", partitions=args.partitions or 2, conf={
            "spark.sql.adaptive.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
            "spark.driver.memory": args.driver_memory, "spark.sql.streaming.metricsEnabled": "false"})
    root = tempfile.mkdtemp(prefix="cq_sweep_")
    result = []
    print(f"# load {os.getloadavg()[0]:.2f}; {args.batch_rows:,} rows per measured batch, median of {args.measure}; "
          f"{args.session} session, {spark.conf.get('spark.sql.shuffle.partitions')} shuffle partitions")
    print("| state rows | engine | batch ms (median) | store memory MiB | ours state MiB | cache hits / misses / catch-ups |")
    print("|---|---|---|---|---|---|")
    try:
        for size in args.sizes:
            rows = int(size * 1e6)
            data = os.path.join(root, f"in_{rows}")
            write_input(data, rows, args.batch_rows, args.measure, args.fill_rows, args.keys)
            for engine in args.engines:
                r = run(spark, data, engine, args.measure, os.path.join(root, f"ck_{rows}_{engine}"), args.shards)
                r.update(size_m=size, engine=engine)
                result.append(r)
                ours = f"{r['state_bytes'] / 2**20:.1f}" if "state_bytes" in r else ""
                cache = f"{r['cache_hits']} / {r['cache_misses']} / {r.get('cache_catch_ups', 0)}" if "cache_hits" in r else ""
                print(f"| {size:g} M | {engine} | {r['median_ms']:.0f} | {r['store_memory_bytes'] / 2**20:.1f} | "
                      f"{ours} | {cache} |", flush=True)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print(f"# load after {os.getloadavg()[0]:.2f}")
    harness.write_result("join_state_sweep", result, args, before)


if __name__ == "__main__":
    main()
