"""The per-batch floor of state keyed by (shard, time bucket) against state keyed by shard (issue 14).

Issue 14's first direction: a join or aggregation whose state lives in one ``GroupState`` value per shard
moves the shard's whole state image JVM -> Python -> JVM every micro-batch, although a batch touches only
the time buckets near its rows. Keyed by (shard, bucket), a batch would read the bucket its rows go to, the
earlier bucket its probes reach, and each bucket once more when it expires behind the watermark.

This script measures the floor of both layouts with trivial functions (no kernel: the functions only read
and write random, incompressible bytes standing for a zstd-compressed state image) on the same session, so
that the difference is what the layout alone can save:

- ``shard``: ``--shards`` groups; each batch every shard reads its image of ``live`` buckets, drops the
  oldest, appends a new bucket of ``--bucket-mb`` MB and writes the image back;
- ``bucket``: one group per (shard, bucket); each batch a shard writes its new bucket, reads the previous
  one (the probe copies' target; not rewritten), and the bucket ``live`` batches old expires through an
  event-time timeout (read once, removed).

Printed per layout and ``--live`` (the state grows with it as it would with the watermark delay): the median
``triggerExecution`` over the batches after the state is full, Spark's state phases (summed over tasks)
and the state size. Results in docs/benchmark-log-2026.md.

Usage::

    python -m benchmarks.perf.bucket_floor [--shards 8] [--bucket-mb 0.5] [--live 4 40] [--batches 10]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

SLOT = 60  # seconds of event time per bucket and per batch
_BLOBS: dict[int, bytes] = {}


def _blob(n: int) -> bytes:
    """Random (incompressible) bytes of size n, made once per worker process."""
    if n not in _BLOBS:
        _BLOBS[n] = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8).tobytes()
    return _BLOBS[n]


def write_input(root: str, shards: int, batches: int, rows: int) -> str:
    """One parquet file per batch: ``rows`` rows per shard; ``kind`` 0 = new rows, 1 = probe copies."""
    src = os.path.join(root, "in")
    os.makedirs(src)
    for b in range(batches):
        n = shards * rows * 2
        shard = np.repeat(np.arange(shards), rows * 2)
        kind = np.tile(np.repeat([0, 1], rows), shards)
        ts = pd.to_datetime((b * SLOT + np.arange(n) % SLOT) * 10**9)
        table = pa.table({"shard": shard.astype(np.int64), "kind": kind.astype(np.int64),
                          "batch": np.full(n, b, np.int64), "ts": pa.array(ts, pa.timestamp("us"))})
        pq.write_table(table, os.path.join(src, f"part-{b:04d}.parquet"))
    return src


def run(spark, src: str, layout: str, live: int, nbytes: int, shards: int) -> dict:
    """One streaming run of ``layout`` with ``live`` buckets of ``nbytes`` per shard: Spark's medians."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.streaming.state import GroupStateTimeout

    st_schema = T.StructType([T.StructField("b", T.BinaryType())])
    df = (spark.readStream.schema("shard long, kind long, batch long, ts timestamp")
          .option("maxFilesPerTrigger", 1).parquet(src).withWatermark("ts", "0 seconds"))

    if layout == "shard":
        def fn(key, pdfs, state):
            image = state.get[0] if state.exists else b""
            seen = 0
            for p in pdfs:
                seen += len(p)
            # drop the oldest bucket once the image holds `live` of them, append the new one
            keep = image[nbytes:] if len(image) >= live * nbytes else image
            state.update((keep + _blob(nbytes),))
            yield pd.DataFrame({"g": [int(key[0])], "read": [len(image)], "rows": [seen]})
        grouped = df.groupBy("shard")
        timeout = GroupStateTimeout.NoTimeout
    else:
        def fn(key, pdfs, state):
            if state.hasTimedOut:  # the bucket fell behind the watermark: read once, removed
                read = len(state.get[0])
                state.remove()
                yield pd.DataFrame({"g": [int(key[0])], "read": [read], "rows": [0]})
                return
            seen = 0
            new = False
            for p in pdfs:
                seen += len(p)
                new = new or bool((p["kind"] == 0).any())
            if new:  # the batch's own bucket: written, expires `live` batches later
                state.update((_blob(nbytes),))
                state.setTimeoutTimestamp((int(key[0]) % 100_000 + live) * SLOT * 1000)
                read = 0
            else:  # probe copies into the previous bucket: read, not rewritten
                read = len(state.get[0]) if state.exists else 0
            yield pd.DataFrame({"g": [int(key[0])], "read": [read], "rows": [seen]})
        # the group key (shard, bucket) packed in one long; kind 1 rows go to the previous bucket
        bucket = F.col("batch") - F.col("kind")
        grouped = df.where(bucket >= 0).withColumn("g", F.col("shard") * 100_000 + bucket).groupBy("g")
        timeout = GroupStateTimeout.EventTimeTimeout

    out = grouped.applyInPandasWithState(fn, "g long, read long, rows long", st_schema, "append", timeout)
    ck = tempfile.mkdtemp(prefix="bucket-floor-")
    q = out.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    prog = [json.loads(p.json) for p in q.recentProgress if p.numInputRows > 0]
    shutil.rmtree(ck, ignore_errors=True)
    steady = prog[live + 1:] or prog[-3:]  # after the state holds `live` buckets (and the first expiry)

    def med(f):
        return statistics.median(f(p) for p in steady)
    so = lambda p: p["stateOperators"][0]  # noqa: E731
    return {"layout": layout, "live": live, "batches": len(steady),
            "batch_ms": med(lambda p: p["durationMs"]["triggerExecution"]),
            "updates_ms": med(lambda p: so(p).get("allUpdatesTimeMs", 0)),
            "removals_ms": med(lambda p: so(p).get("allRemovalsTimeMs", 0)),
            "commit_ms": med(lambda p: so(p).get("commitTimeMs", 0)),
            "state_mb": med(lambda p: so(p).get("memoryUsedBytes", 0)) / 2**20,
            "groups": med(lambda p: so(p).get("numRowsTotal", 0))}


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=0.5, help="state per shard and bucket (MB)")
    ap.add_argument("--live", type=int, nargs="+", default=[4, 40], help="buckets a shard keeps")
    ap.add_argument("--rows", type=int, default=100, help="input rows per shard, batch and kind")
    ap.add_argument("--extra", type=int, default=6, help="batches after the state is full")
    ap.add_argument("--layouts", nargs="+", default=["shard", "bucket"], choices=["shard", "bucket"])
    args = ap.parse_args(argv)
    before = harness.start()
    if args.shards < 1 or args.bucket_mb <= 0 or min(args.live) < 1 or args.rows < 1 or args.extra < 1:
        ap.error("--shards, --live, --rows and --extra must be >= 1 and --bucket-mb > 0")

    spark = harness.cq_session("bucket-floor")
    root = tempfile.mkdtemp(prefix="bucket-floor-in-")
    nbytes = int(args.bucket_mb * 2**20)
    results = []
    try:
        # warm-up: JVM code paths and Python workers for both layouts
        warm = write_input(os.path.join(root, "warm"), args.shards, 4, args.rows)
        for layout in args.layouts:
            run(spark, warm, layout, 2, 1024, args.shards)
        for live in args.live:
            src = write_input(os.path.join(root, f"l{live}"), args.shards, live + 1 + args.extra, args.rows)
            for layout in args.layouts:
                t0 = time.time()
                r = run(spark, src, layout, live, nbytes, args.shards)
                r["wall_s"] = round(time.time() - t0, 1)
                r["load"] = os.getloadavg()[0]
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print(f"\n{'layout':8} {'live':>5} {'state MB':>9} {'batch ms':>9} {'updates':>8} {'removals':>9} "
          f"{'commit':>7} {'groups':>7}")
    for r in results:
        print(f"{r['layout']:8} {r['live']:>5} {r['state_mb']:>9.1f} {r['batch_ms']:>9.0f} {r['updates_ms']:>8.0f} "
              f"{r['removals_ms']:>9.0f} {r['commit_ms']:>7.0f} {r['groups']:>7.0f}")
    harness.write_result("bucket_floor", results, args, before)


if __name__ == "__main__":
    main()
