"""Side by side: an aggregate over a two-stream join alone (``cq.cql``: Spark's stream-stream join, then
``sliding_aggregate``) and the same query as a member of a QueryGroup (its join in a join class of the shared stage,
its aggregation in the group's micro-batch function; docs/groups.md, "Aggregates over a join of two streams").

Clicks and views (``--files`` micro-batches of ``--rows`` rows each, 4 minutes of event time a file, ``x`` uniform in
0..1999 the join key), the query ``RSTREAM(SELECT c.page, COUNT(*), SUM(v.y) … [RANGE 1 MINUTE SLIDE 20 SECONDS] …
ON c.x = v.x GROUP BY c.page)`` into a parquet directory, ``availableNow``; the cases alternate (alone, group,
alone, …) ``--rounds`` times in one session, each timed from ``start()`` to its end. ``--session plain`` (a
``SparkSession`` as a user makes it: Spark's 200 shuffle partitions) or ``cq`` (``pyspark_cq.spark()``'s tuned one).
The output rows of both cases are counted (tests check exactness).

Usage::

    python -m benchmarks.perf.group_join_aggregate [--files 6] [--rows 20000] [--rounds 2] [--session plain]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

T0 = 1_704_067_200_000_000   # 2024-01-01 UTC, µs
QUERY = ("RSTREAM(SELECT c.page, COUNT(*) AS n, SUM(v.y) AS s FROM clicks c [RANGE 1 MINUTE SLIDE 20 SECONDS] JOIN "
         "views v [RANGE 1 MINUTE SLIDE 20 SECONDS] ON c.x = v.x GROUP BY c.page)")
SCHEMA = "ts timestamp, page string, x long, y long"


def write_inputs(root: str, files: int, rows: int) -> None:
    """Clicks and views as parquet files with distinct modification times (Spark takes them in that order)."""
    rng = np.random.default_rng(1)
    for name in ("clicks", "views"):
        os.makedirs(os.path.join(root, name))
        for f in range(files):
            ts = T0 + f * 240_000_000 + rng.integers(0, 240_000_000, rows)
            path = os.path.join(root, name, f"part-{f:02d}.parquet")
            pq.write_table(pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                                     "page": pa.array(rng.choice(["a", "b", "c"], rows)),
                                     "x": pa.array(rng.integers(0, 2000, rows)),
                                     "y": pa.array(rng.integers(0, 30, rows))}), path)
            os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))


def run_case(spark, case: str, root: str) -> tuple[float, int]:
    """One run of ``case`` ("alone" or "group") from a new checkpoint: (seconds, output rows)."""
    import pyspark_cq as cq

    def streams():
        return {n: spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, n)).withWatermark("ts", "30 seconds") for n in ("clicks", "views")}

    out = os.path.join(root, case)
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    if case == "alone":
        q = (cq.cql(spark, QUERY, streams()).writeStream.format("parquet").option("path", os.path.join(out, "rows"))
             .option("checkpointLocation", os.path.join(out, "ck")).trigger(availableNow=True).start())
    else:
        g = cq.QueryGroup(spark, sources=streams(), checkpoint=os.path.join(out, "ck"))
        g.add("ja", QUERY, sink=os.path.join(out, "rows"))
        q = g.start(trigger={"availableNow": True})
    q.awaitTermination()
    seconds = time.perf_counter() - t
    return seconds, spark.read.parquet(os.path.join(out, "rows")).count()


def main(argv=None) -> dict:
    p = harness.parser(__doc__)
    p.add_argument("--files", type=int, default=6)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--session", choices=("plain", "cq"), default="plain")
    args = p.parse_args(argv)
    before = harness.start(args)
    spark = (harness.plain_session("group_join_aggregate", partitions=200) if args.session == "plain"
             else harness.cq_session("group_join_aggregate"))
    root = tempfile.mkdtemp(prefix="cq_group_ja_")
    try:
        write_inputs(root, args.files, args.rows)
        times: dict = {"alone": [], "group": []}
        rows: dict = {}
        for _ in range(args.rounds):
            for case in ("alone", "group"):
                seconds, rows[case] = run_case(spark, case, root)
                times[case].append(round(seconds, 2))
                print(f"{case}: {seconds:.2f} s, {rows[case]} rows", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"seconds": times, "median_s": med, "rows": rows, "alone_over_group": round(med["alone"] / med["group"], 2)}
    print(f"median: alone {med['alone']:.2f} s, group {med['group']:.2f} s, alone / group "
          f"{result['alone_over_group']}", flush=True)
    harness.write_result(f"group_join_aggregate_{args.session}", result, args, before)
    return result


if __name__ == "__main__":
    main()
