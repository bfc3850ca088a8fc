"""Interval join with and without stream constraints (STREAM §5.2, issue 43): state rows and batch time.

STREAM's example workload: orders (left, one row per order id) and fulfilments (right, ``--pieces`` rows per order
on average, each within ``--spread`` seconds after its order). The query cannot assume that order, so its band is
symmetric: ``|fulfilment.ts - order.ts| <= --band`` seconds; watermark delay ``--wm-delay`` seconds on both inputs.
One parquet file per side and micro-batch (``maxFilesPerTrigger=1``), ``--orders`` orders per batch, 10 s of event
time per batch.

Runs (one query each, ``interval_join``, noop sink):

- ``none``: no constraints;
- ``m2o d=<D>``: ``many_to_one(child="right", parent="left", delay=D)`` on streams where a fraction
  ``--early`` of the fulfilments arrive up to D seconds (whole batches) *before* their order (the adherence
  parameter: D = 0 is the paper's "orders always come first"). ``--delays`` sweeps D; each D's stream adheres
  to its constraint, and the ``none`` run of the same stream gives the output row count that must be equal.

Prints per run the median state rows and state bytes over the second half of the batches (the steady state), the
median batch time (triggerExecution), output rows and ``constraint_violations``. The machine may be shared: quote
the load printed before and after.

Usage::

    python -m benchmarks.perf.join_constraints [--orders 2000] [--batches 30] [--delays 0 30 60]
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
BATCH_S = 10


def write_input(root: str, orders: int, batches: int, pieces: float, spread: int, early: float, delay: int,
                seed: int = 0) -> None:
    """Order and fulfilment files, one per batch and side. A fulfilment is written to the file of the batch its
    time falls in; with probability ``early`` (when ``delay`` > 0) to one up to ``delay`` s earlier instead, and
    never before its order's batch minus ``delay`` (so the stream adheres to ``many_to_one(..., delay)``).
    """
    rng = np.random.default_rng(seed)
    files = [([], []) for _ in range(batches)]
    oid = 0
    for b in range(batches):
        t = BASE_US + b * BATCH_S * 1_000_000 + rng.integers(0, BATCH_S * 1_000_000, orders)
        ids = np.arange(oid, oid + orders)
        oid += orders
        files[b][0].append((ids, t))
        n = rng.poisson(pieces - 1, orders) + 1
        fid = np.repeat(ids, n)
        ft = np.repeat(t, n) + rng.integers(0, spread * 1_000_000, int(n.sum()))
        at = (ft - BASE_US) // (BATCH_S * 1_000_000)
        if delay > 0:
            ahead = rng.integers(1, max(delay // BATCH_S, 1) + 1, len(at))
            at = np.where(rng.random(len(at)) < early, np.maximum(b - ahead, b - delay // BATCH_S), at)
        at = np.clip(at, 0, batches - 1)
        for a in np.unique(at):
            m = at == a
            files[int(a)][1].append((fid[m], ft[m]))
    for b, sides in enumerate(files):
        for side, parts in zip("lr", sides):
            k = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
            ts = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
            table = pa.table({"k": pa.array(k, pa.int64()), "ts": pa.array(ts, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")), f"{side}v": pa.array(rng.integers(0, 1 << 40, len(k)), pa.int64())})
            os.makedirs(os.path.join(root, side), exist_ok=True)
            path = os.path.join(root, side, f"b{b:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + b * 10,) * 2)   # file order = batch order


def run(spark, root: str, band: int, wm_delay: int, constraint, ck: str) -> dict:
    """One query to the end; medians over the second half of the batches."""
    import pyspark_cq

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", f"{wm_delay} seconds"))

    df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", f"-{band} seconds", f"{band} seconds",
                                  suffixes=("_l", "_r"), name="constraints",
                                  constraints=None if constraint is None else [constraint])
    q = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    start = time.perf_counter()
    q.awaitTermination()
    wall = time.perf_counter() - start
    progress = [json.loads(p.json) for p in q.recentProgress]
    pairs = [(p, pyspark_cq.read_metrics(p, "constraints") or {}) for p in progress]
    pairs = [(p, r) for p, r in pairs if r]
    steady = pairs[len(pairs) // 2:]
    return {"wall_s": wall, "batches": len(pairs),
            "state_rows": statistics.median(r["state_rows"] for _, r in steady),
            "state_bytes": statistics.median(r["state_bytes"] for _, r in steady),
            "batch_ms": statistics.median(p["durationMs"].get("triggerExecution", 0) for p, _ in steady),
            "output_rows": sum(r["output_rows"] for _, r in pairs),
            "violations": sum(r.get("constraint_violations", 0) for _, r in pairs)}


def main(argv=None):
    from pyspark_cq.constraints import many_to_one

    ap = harness.parser(__doc__)
    ap.add_argument("--orders", type=int, default=2000, help="orders per batch")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--pieces", type=float, default=4.0, help="mean fulfilments per order (>= 1, Poisson)")
    ap.add_argument("--spread", type=int, default=50, help="fulfilments come within this many s after the order")
    ap.add_argument("--band", type=int, default=60, help="the join's band: +- this many seconds")
    ap.add_argument("--wm-delay", type=int, default=90, help="watermark delay, seconds")
    ap.add_argument("--early", type=float, default=0.3, help="fraction of fulfilments arriving before the order")
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 30, 60], help="adherence sweep: delay bounds, s")
    args = ap.parse_args(argv)
    before = harness.start()
    spark = harness.cq_session("join-constraints", conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false"})
    root = tempfile.mkdtemp(prefix="cq_constraints_")
    result = []
    print(f"# load {os.getloadavg()[0]:.2f}; {args.orders} orders per batch, {args.pieces} fulfilments per order, "
          f"band +-{args.band} s, watermark delay {args.wm_delay} s, {args.batches} batches, early {args.early}")
    print("| stream (delay D) | constraints | state rows (median) | state MiB | batch ms (median) | output rows | "
          "violations |")
    print("|---|---|---|---|---|---|---|")
    try:
        for d in args.delays:
            data = os.path.join(root, f"in_{d}")
            write_input(data, args.orders, args.batches, args.pieces, args.spread, args.early, d)
            for label, c in (("none", None), (f"many_to_one(delay={d} s)", many_to_one("right", "left", f"{d} seconds"))):
                r = run(spark, data, args.band, args.wm_delay, c, os.path.join(root, f"ck_{d}_{c is None}"))
                r.update(delay_s=d, constraints=label)
                result.append(r)
                print(f"| D = {d} s | {label} | {r['state_rows']:,.0f} | {r['state_bytes'] / 2**20:.1f} | "
                      f"{r['batch_ms']:.0f} | {r['output_rows']:,} | {r['violations']} |", flush=True)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print(f"# load after {os.getloadavg()[0]:.2f}")
    harness.write_result("join_constraints", result, args, before)


if __name__ == "__main__":
    main()
