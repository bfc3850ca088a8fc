"""Side by side: many window queries as one QueryGroup against Spark running each as its own streaming query.

Issue 40's mix: one click stream (``--rows`` rows in ``--files`` micro-batches, ``--pages`` pages, regions eu /
us / ap / other), and queries ``windows × filters`` with windows 1 min / 10 s, 5 min / 10 s, 15 min / 1 min,
1 h / 1 min and filters none / eu / us / ap, each ``SUM(x), COUNT(*) GROUP BY page`` written to a parquet
directory. Cases, each in a fresh process (its own JVM), all started together, timed from the first
``start()`` to the last termination (``availableNow``):

- ``spark`` — Spark's ``groupBy(window(...), page)``, one streaming query per query;
- ``group`` — one :class:`pyspark_cq.QueryGroup` holding the queries;
- ``cq`` — ``pyspark_cq.cql``, one streaming query per query (as before groups; slow).

Each case runs for 1 query and for all (``--counts``); the output rows per query are compared between cases
(a sanity check: tests check exactness). ``--streams N`` reads the clicks as N streams (N sources over the same
files, ``clicks0`` … ``clicks<N-1>``) and puts query i on stream i mod N: the group's shared stage then serves N
streams (one slicer each, one stateful stage). ``--session plain`` (default: a plain ``SparkSession`` as a user
makes it, Spark's 200 shuffle partitions) or ``cq`` (``pyspark_cq.spark()``'s tuned one).

Usage::

    python -m benchmarks.perf.query_group [--rows 400000] [--files 8] [--counts 1,16] [--session plain]
        [--cases spark,group] [--streams 1]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

WINDOWS = (("1 minute", "10 seconds"), ("5 minutes", "10 seconds"), ("15 minutes", "1 minute"), ("1 hour", "1 minute"))
FILTERS = (None, "region = 'eu'", "region = 'us'", "region = 'ap'")
#: the filters of queries 17 to 100 (x is uniform in 0..999)
MORE_FILTERS = tuple(f"x < {t}" for t in range(100, 1000, 100)) + tuple(
    f"region = '{r}' AND x < {t}" for r in ("eu", "us", "ap") for t in (250, 500, 750, 900))
SCHEMA = "ts timestamp, page string, region string, x long"


def queries(count: int) -> list[tuple[str, str, str | None]]:
    """The first ``count`` queries of the mix as ``(window, slide, where)``: issue 40's 16 (filters varying
    fastest), then the 84 with :data:`MORE_FILTERS`.
    """
    mix = [(w, s, f) for w, s in WINDOWS for f in FILTERS] + [(w, s, f) for f in MORE_FILTERS for w, s in WINDOWS]
    if count > len(mix):
        raise ValueError(f"count must be at most {len(mix)}, got {count}")
    return mix[:count]


def stream_names(streams: int) -> list[str]:
    """The sources' names: ``clicks`` for one stream, ``clicks0`` … for several."""
    return ["clicks"] if streams == 1 else [f"clicks{j}" for j in range(streams)]


def cql_text(window: str, slide: str, where: str | None, stream: str = "clicks") -> str:
    where = f" WHERE {where}" if where else ""
    return (f"RSTREAM(SELECT page, SUM(x) AS sx, COUNT(*) AS n FROM {stream} [RANGE {window.upper()} SLIDE "
            f"{slide.upper()}]{where} GROUP BY page)")


def write_clicks(directory: str, rows: int, files: int, pages: int, seed: int = 7) -> None:
    """``files`` parquet files of clicks in event-time order, 10 minutes of event time per file."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = rows // files
    span = 600_000_000
    for f in range(files):
        ts = f * span + np.sort(rng.integers(0, span, per))
        region = rng.choice(np.array(["eu", "us", "ap", "other"]), per)
        table = pa.table({"ts": pa.array(ts + 1_704_067_200_000_000, type=pa.timestamp("us", tz="UTC")),
                          "page": pa.array([f"p{i}" for i in rng.integers(0, pages, per)]),
                          "region": pa.array(region), "x": pa.array(rng.integers(0, 1000, per))})
        path = os.path.join(directory, f"part-{f:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + f * 10, 1_000_000 + f * 10))


def _session(kind: str):
    if kind == "plain":
        from pyspark.sql import SparkSession

        harness.worker_env()
        spark = SparkSession.builder.master("local[2]").appName("query-group").config(
            "spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark
    return harness.cq_session("query-group")


def run_case(case: str, count: int, data: str, out: str, session: str, streams: int = 1) -> dict:
    """One case in this process: the wall time and the output rows per query."""
    from pyspark.sql import functions as F

    import pyspark_cq as cq

    spark = _session(session)
    sources = {s: (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(data)
                   .withWatermark("ts", "1 minute")) for s in stream_names(streams)}
    on = stream_names(streams)
    mix = queries(count)
    names = [f"q{i}" for i in range(len(mix))]
    start = time.perf_counter()
    if case == "group":
        g = cq.QueryGroup(spark, sources=sources, checkpoint=os.path.join(out, "ck"))
        for i, (n, q) in enumerate(zip(names, mix)):
            g.add(n, cql_text(*q, on[i % len(on)]), sink=os.path.join(out, n))
        g.start(trigger={"availableNow": True}).awaitTermination()
    else:
        running = []
        for i, (n, (w, s, where)) in enumerate(zip(names, mix)):
            stream = on[i % len(on)]
            clicks = sources[stream]
            if case == "spark":
                src = clicks.filter(F.expr(where)) if where else clicks
                df = src.groupBy(F.window("ts", w, s), "page").agg(F.sum("x").alias("sx"),
                                                                   F.count(F.lit(1)).alias("n"))
            else:
                df = cq.cql(spark, cql_text(w, s, where, stream), {stream: clicks})
            running.append(df.writeStream.format("parquet").option("path", os.path.join(out, n))
                           .option("checkpointLocation", os.path.join(out, "ck", n))
                           .trigger(availableNow=True).start())
        for q in running:
            q.awaitTermination()
    wall = time.perf_counter() - start
    rows = {n: spark.read.parquet(os.path.join(out, n)).count() for n in names}
    spark.stop()
    return {"case": case, "queries": count, "streams": streams, "session": session, "wall_s": round(wall, 2),
            "rows": rows}


def main(argv=None):
    p = harness.parser(__doc__)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--counts", default="1,16", help="query counts to run, comma-separated (at most 100)")
    p.add_argument("--session", choices=("plain", "cq"), default="plain")
    p.add_argument("--cases", default="spark,group", help="cases to run, comma-separated: spark, group, cq")
    p.add_argument("--streams", type=int, default=1, help="the clicks as this many streams; query i on stream i mod N")
    p.add_argument("--case", help=argparse.SUPPRESS)   # internal: a child runs one case
    p.add_argument("--count", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:   # a child: one case, its result as the last line
        print(json.dumps(run_case(args.case, args.count, args.data, args.out, args.session, args.streams)), flush=True)
        return
    if args.streams < 1:
        raise SystemExit(f"--streams: expected a positive int, got {args.streams}")
    before = harness.start(args)
    root = tempfile.mkdtemp(prefix="cq-group-bench-")
    data = os.path.join(root, "data")
    write_clicks(data, args.rows, args.files, args.pages)
    counts = [int(c) for c in args.counts.split(",")]
    cases = args.cases.split(",")
    if not set(cases) <= {"spark", "group", "cq"}:
        raise SystemExit(f"--cases: expected some of spark, group, cq; got {args.cases!r}")
    results = []
    for count in counts:
        for case in cases:
            out = os.path.join(root, f"{case}-{count}")
            cmd = harness.rerun(__spec__.name) + ["--case", case, "--count", str(count), "--data", data, "--out", out,
                                                   "--session", args.session, "--streams", str(args.streams)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if proc.returncode:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"case {case} ({count} queries) failed")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["load"] = round(os.getloadavg()[0], 2)
            results.append(r)
            print(f"{case:6s} {count:3d} queries: {r['wall_s']:7.2f} s  (load {r['load']})", flush=True)
    by = {(r["case"], r["queries"]): r for r in results}
    summary = {}
    for count in counts:
        if ("spark", count) not in by or ("group", count) not in by:
            continue
        spark_r, group_r = by[("spark", count)], by[("group", count)]
        same = spark_r["rows"] == group_r["rows"]
        summary[count] = {"spark_s": spark_r["wall_s"], "group_s": group_r["wall_s"],
                          "speedup": round(spark_r["wall_s"] / group_r["wall_s"], 2), "same_rows": same}
        print(f"{count} queries: Spark {spark_r['wall_s']} s, group {group_r['wall_s']} s -> "
              f"{summary[count]['speedup']}x; output rows equal: {same}", flush=True)
    if len(counts) > 1 and "group" in cases:
        one, many = by[("group", min(counts))], by[("group", max(counts))]
        print(f"group of {max(counts)} / one query: {many['wall_s'] / one['wall_s']:.2f}x", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    harness.write_result("query_group", {"cases": results, "summary": summary}, args, before)


if __name__ == "__main__":
    main()
