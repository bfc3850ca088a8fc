"""Side by side: the fixed cost of a query's first micro-batch, ours against Spark's own (issue 17, item 8).

A newcomer's first streaming join / aggregation on a small input took 35.5 s / 15.4 s against Spark's
12.4 s / 4.5 s. This script measures where that goes. Every measurement runs in a **fresh Python process
with a fresh JVM** (a first batch is only first once), on a tiny file stream (``--files`` files of
``--rows`` rows, ``maxFilesPerTrigger=1``, ``availableNow``, ``noop`` sink):

- ``session``: ``cq`` (``cq.spark("local[2]")``: the Python workers start through ``pyspark_cq._daemon``,
  which imports the installed PySpark, Arrow's per-row size check is off, and a background job starts
  warm Python workers, ``warm_workers``), ``cq-cold`` (the same without the warm workers) or ``plain``
  (``SparkSession.builder.master("local[2]")`` with 2 shuffle partitions, as a newcomer writes it);
- ``query``: ``join`` (interval join ±30 s) or ``agg`` (10 s windows sliding by 1 s, count / sum / max
  per key), ours or Spark's (``join`` / ``groupBy(window(...))``), or for the join ``floor``: its shape with
  no work (``floor_shapes.join_shape``: the tagged union grouped by shard into a trivial
  ``applyInPandasWithState``), what any join of this design pays before doing anything (issue 14).

Printed per case: the session's start, the query's wall time (start to termination), its first
batch's ``triggerExecution``, and the import time of our worker modules on top of pandas / pyarrow /
PySpark (what our code adds to each new Python worker); medians over ``--repeats`` and the ratio ours /
Spark's.

Usage::

    python -m benchmarks.perf.first_batch [--rows 200] [--files 2] [--repeats 2] [--sessions cq cq-cold]
        [--queries join] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from .. import harness
from ..common import join_shape

SESSIONS = ("cq", "cq-cold", "plain")
ENGINES = {"join": ("ours", "spark", "floor"), "agg": ("ours", "spark")}


def _write(root, files, rows):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    for side in ("l", "r"):
        os.makedirs(os.path.join(root, side), exist_ok=True)
        for i in range(files):
            t = 1_700_000_000_000_000 + i * 20_000_000 + rng.integers(0, 20_000_000, rows)
            table = pa.table({"k": pa.array(rng.integers(0, 50, rows), pa.int64()),
                              "ts": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              "v": pa.array(rng.integers(0, 1000, rows), pa.int64())})
            path = os.path.join(root, side, f"b{i:03d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))


def _one(session, query, engine, root):
    """One case in this (fresh) process: returns its timings."""
    t0 = time.perf_counter()
    if session == "cq":
        import pyspark_cq as cq

        spark = cq.spark("local[2]", "first-batch", shuffle_partitions=2)
    elif session == "cq-cold":
        import pyspark_cq as cq

        spark = cq.spark("local[2]", "first-batch", shuffle_partitions=2, warm_workers=False)
    else:
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # workers need this interpreter's pandas
        spark = (SparkSession.builder.master("local[2]").appName("first-batch")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    t_session = time.perf_counter() - t0
    from pyspark.sql import functions as F

    import pyspark_cq as cq

    def src(side):
        return (spark.readStream.schema("k long, ts timestamp, v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", "5 seconds"))

    if query == "join" and engine == "floor":

        df = join_shape(src("l"), src("r"))
    elif query == "join" and engine == "ours":
        df = cq.interval_join(src("l"), src("r"), "k", "ts", "ts", "-30 seconds", "30 seconds")
    elif query == "join":
        left, right = src("l").alias("l"), src("r").alias("r")
        df = left.join(right, F.expr("l.k = r.k AND r.ts >= l.ts - interval 30 seconds "
                                     "AND r.ts <= l.ts + interval 30 seconds"))
    elif engine == "ours":
        df = cq.sliding_aggregate(src("l"), "ts", "10 seconds", "1 second", by="k",
                                  aggs={"v": ["sum", "max"], "*": ["count"]})
    else:
        df = src("l").groupBy(F.window("ts", "10 seconds", "1 second"), "k").agg(
            F.sum("v"), F.max("v"), F.count(F.lit(1)))
    ck = tempfile.mkdtemp(prefix="cq_first_")
    t1 = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    wall = time.perf_counter() - t1
    progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
    spark.stop()
    return {"session_s": t_session, "wall_s": wall, "batches": len(progress),
            "first_batch_s": progress[0]["durationMs"]["triggerExecution"] / 1000 if progress else None}


def _imports():
    """Seconds our worker modules add to a Python worker that already imported pandas / pyarrow / PySpark."""
    code = ("import time, pandas, pyarrow, numpy, pyspark.sql, pyspark.sql.functions; t = time.perf_counter(); "
            "from pyspark_cq.vocabulary.operators import worker_modules; import importlib; "
            "[importlib.import_module(m) for m in worker_modules()]; "
            "print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sessions", nargs="+", default=list(SESSIONS), choices=SESSIONS)
    ap.add_argument("--queries", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--case", help=argparse.SUPPRESS)   # internal: run one case in this process
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        print("RESULT " + json.dumps(_one(*args.case.split(","), args.root)), flush=True)
        return
    before = harness.start()
    root = tempfile.mkdtemp(prefix="cq_first_data_")
    _write(root, args.files, args.rows)
    results = {f"{s},{q},{e}": [] for s in args.sessions for q in args.queries for e in ENGINES[q]}
    for _ in range(args.repeats):
        for case in results:   # alternate the cases, so that load drifts hit all of them
            out = subprocess.run([*harness.rerun(__spec__.name), "--case", case, "--root", root], capture_output=True,
                                 text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
            results[case].append(json.loads(line[-1][len("RESULT "):]))
    med = {c: {k: statistics.median(r[k] for r in runs) for k in ("session_s", "wall_s", "first_batch_s")}
           for c, runs in results.items()}
    load = os.getloadavg()
    print(f"{platform.node()} {os.cpu_count()} cores, load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
          f"{args.files} files x {args.rows} rows; medians of {args.repeats} fresh processes")
    print(f"{'session':9}{'query':6}{'engine':8}{'session s':>11}{'query wall s':>14}{'first batch s':>15}")
    for c, m in med.items():
        s, q, e = c.split(",")
        print(f"{s:9}{q:6}{e:8}{m['session_s']:11.1f}{m['wall_s']:14.1f}{m['first_batch_s']:15.1f}")
    for s in args.sessions:
        for q in args.queries:
            o, sp = med[f"{s},{q},ours"], med[f"{s},{q},spark"]
            print(f"ours / Spark, {s} session, {q}: wall {o['wall_s'] / sp['wall_s']:.2f}x, "
                  f"first batch {o['first_batch_s'] / sp['first_batch_s']:.2f}x "
                  f"({o['first_batch_s'] - sp['first_batch_s']:+.1f} s)")
        if "join" in args.queries:
            fl, sp = med[f"{s},join,floor"], med[f"{s},join,spark"]
            print(f"join's shape with no work - Spark, {s} session: first batch "
                  f"{fl['first_batch_s'] - sp['first_batch_s']:+.1f} s")
    for q in args.queries:   # issue 14's goal: ours in our default session against Spark's best session
        if "cq" in args.sessions:
            best = min(med[f"{s},{q},spark"]["first_batch_s"] for s in args.sessions)
            print(f"ours (cq session) - Spark's best session, {q}: first batch "
                  f"{med[f'cq,{q},ours']['first_batch_s'] - best:+.1f} s")
    imports = _imports()
    print(f"our worker modules' import on top of pandas/pyarrow/PySpark: {imports:.3f} s")
    harness.write_result("first_batch", {"results": results, "medians": med, "imports_s": imports, "load": load},
                         args, before)


if __name__ == "__main__":
    main()
