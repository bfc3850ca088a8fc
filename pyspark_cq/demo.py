"""``pyspark-cq demo``: the main job, a streaming pipeline on local Spark.

A generated stream of sensor readings (Spark's rate source) gets validity intervals ``[ts, ts + d)``
with a reading-dependent duration ``d``; the granularity operator Γ rounds them to a coarser time
granularity (PIPES §2.4.3), which drops readings too short to cover a whole granule; the result lands
in Parquet. Progress is printed per micro-batch, a summary at the end, and the written output is
read back and checked against the operator's own report.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--rate", type=int, default=5000, help="generated rows per second (default 5000)")
    parser.add_argument("--sensors", type=int, default=50, help="number of sensors (default 50)")
    parser.add_argument("--granularity", default="1 second", help="Γ granularity (default '1 second')")
    parser.add_argument("--output", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--master", default=None, help="Spark master (default $SPARK_MASTER or local[*])")


def _check(args) -> None:
    if args.seconds <= 0:
        raise SystemExit(f"--seconds must be positive, got {args.seconds}")
    if args.rate <= 0:
        raise SystemExit(f"--rate must be a positive number of rows per second, got {args.rate}")
    if args.sensors <= 0:
        raise SystemExit(f"--sensors must be positive, got {args.sensors}")


def build_pipeline(spark, rate: int, sensors: int, granularity: str):
    """The streaming DataFrame of the demo (exposed for tests)."""
    from pyspark.sql import functions as F

    import pyspark_cq as cq

    events = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", 2).load())
    # Durations 0.2 s .. 3.2 s by a hash of the sequence number; every 997th reading has a broken clock
    # (end before start), which Γ counts as malformed instead of dropping it silently.
    duration_ms = (F.abs(F.xxhash64("value")) % 3000 + 200).cast("long")
    readings = events.select(
        (F.col("value") % sensors).alias("sensor"),
        (F.sin(F.col("value") / 100.0) * 10 + 20).alias("reading"),
        F.col("timestamp").alias("valid_from"),
        F.when(F.col("value") % 997 == 5, F.col("timestamp") - F.expr("INTERVAL 1 SECOND"))
        .otherwise(F.col("timestamp") + F.make_dt_interval(secs=duration_ms / 1000.0))
        .alias("valid_to"),
    ).withWatermark("valid_from", "10 seconds")
    return cq.granularity(readings, "valid_from", "valid_to", granularity, name="demo_gamma")


def run(args) -> int:
    _check(args)
    import pyspark_cq as cq
    from pyspark_cq.operators._report import read

    out_dir = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="cq-demo-"))
    data_dir, ckpt_dir = out_dir / "data", out_dir / "checkpoint"
    for d in (data_dir, ckpt_dir):
        shutil.rmtree(d, ignore_errors=True)

    print(f"pyspark-cq demo: {args.rate} rows/s from {args.sensors} sensors for {args.seconds:.0f} s, "
          f"Γ to {args.granularity}; output in {out_dir}")
    print("starting Spark ...", flush=True)
    spark = cq.spark(args.master, "pyspark-cq-demo")
    spark.sparkContext.setLogLevel("ERROR")
    query = (build_pipeline(spark, args.rate, args.sensors, args.granularity)
             .writeStream.format("parquet").option("path", str(data_dir))
             .option("checkpointLocation", str(ckpt_dir)).trigger(processingTime="2 seconds").start())

    totals = {"input": 0, "output": 0, "dropped_empty": 0, "malformed_rows": 0}
    durations = []
    seen = -1
    t0 = time.time()
    print(f"{'batch':>5} {'elapsed':>8} {'in rows':>9} {'rows/s':>9} {'out rows':>9} {'dropped':>8} "
          f"{'malformed':>9} {'batch s':>8}")
    try:
        while time.time() - t0 < args.seconds:
            time.sleep(0.5)
            if query.exception():
                raise query.exception()
            seen = _report_new(query, seen, totals, durations, read, t0)
        _stop_between_batches(query)
    finally:
        query.stop()
        seen = _report_new(query, seen, totals, durations, read, t0)
    written = spark.read.parquet(str(data_dir)).count() if any(data_dir.glob("*.parquet")) else 0
    spark.stop()

    elapsed = time.time() - t0
    print("\nsummary")
    print(f"  micro-batches        {len(durations)}")
    print(f"  rows in              {totals['input']:,} ({totals['input'] / elapsed:,.0f} rows/s over {elapsed:.1f} s)")
    print(f"  rows out             {totals['output']:,}")
    print(f"  dropped (empty)      {totals['dropped_empty']:,} (intervals shorter than one granule)")
    print(f"  malformed (counted)  {totals['malformed_rows']:,} (end before start)")
    if durations:
        durations.sort()
        print(f"  batch duration       median {durations[len(durations) // 2]:.2f} s, max {durations[-1]:.2f} s")
    print(f"  rows in parquet      {written:,}")
    accounted = totals["output"] + totals["dropped_empty"] + totals["malformed_rows"]
    if written != totals["output"] or accounted != totals["input"]:
        print("  MISMATCH: rows written or accounted for differ from the operator's report")
        return 1
    print("  every input row is accounted for: out + dropped + malformed = in")
    return 0


def _stop_between_batches(query, timeout: float = 120.0) -> None:
    """Stop ``query`` while no micro-batch runs, so no half-written batch is aborted."""
    deadline = time.time() + timeout
    while time.time() < deadline and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()


def _report_new(query, seen, totals, durations, read, t0) -> int:
    """Print the progress of batches finished since ``seen``; returns the last batch id printed."""
    for p in query.recentProgress:
        if p.batchId <= seen:
            continue
        seen = p.batchId
        if p.numInputRows == 0:
            continue
        m = read(p, "demo_gamma") or {}
        totals["input"] += p.numInputRows
        totals["dropped_empty"] += m.get("dropped_empty", 0)
        totals["malformed_rows"] += m.get("malformed_rows", 0)
        out = p.numInputRows - m.get("dropped_empty", 0) - m.get("malformed_rows", 0)
        totals["output"] += out
        secs = p.batchDuration / 1000.0
        durations.append(secs)
        print(f"{p.batchId:>5} {time.time() - t0:>7.1f}s {p.numInputRows:>9,} "
              f"{p.processedRowsPerSecond or 0:>9,.0f} {out:>9,} {m.get('dropped_empty', 0):>8,} "
              f"{m.get('malformed_rows', 0):>9,} {secs:>8.2f}", flush=True)
    return seen
