"""Two periodic queries of one period with a tight and a loose deadline, in a session with pyspark-cq's
scheduler pools (``pyspark_cq.spark(..., edf=True)``); run as a script in its own process, because the
scheduler mode of a SparkContext is fixed when it starts.

Every instance of each query reads ``--files`` files (one task each) through a ``select_chain`` predicate
that sleeps ``--ms-per-row`` per row, so an instance's work is cores held, not CPU: alone, a query's tasks
run two at a time on local[2]; two queries released together share the cores unless one goes first. Spark
does not preempt a running task, so a priority acts as tasks end: an instance needs several short tasks. Prints one JSON
line: per mode (``edf``: the tight query in the urgent pool; ``shared``: both in one fair pool) and
query, its pool and instances (batch, duration, lateness, missed).

Usage: ``python tests/helpers/edf_run.py --root DIR [--instances 6] [--files 16] [--rows 250] [--ms-per-row 1.5]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/, for helpers
from helpers.files import write_in_order  # noqa: E402


def _sleepy(ms_per_row: float):
    def slow(batch):
        time.sleep(batch.num_rows * ms_per_row / 1000.0)
        return np.ones(batch.num_rows, dtype=bool)
    return slow


def run_mode(spark, root: str, mode: str, args) -> dict:
    """Run both queries under ``mode`` (``edf`` or ``shared``); {query: {pool, deadline, instances}}."""
    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    rt = CQRuntime(spark, policies=["rtstream_best_effort"], every_batches=1, edf=(mode == "edf"),
                   control_path=os.path.join(root, f"ct_{mode}.json"))
    queries = {"tight": args.tight, "loose": args.loose}
    for q, deadline in queries.items():
        src = os.path.join(root, f"in_{mode}_{q}")
        os.makedirs(src)
        for i in range(args.files * args.instances):
            write_in_order(pa.table({"x": np.arange(args.rows, dtype=np.int64)}),
                           os.path.join(src, f"f{i:03d}.parquet"), i)

        def build(ctx, src=src, q=q):
            handle = ctx.control(f"chain_{mode}_{q}", drop_ratio=0.0)
            df = spark.readStream.schema("x long").option("maxFilesPerTrigger", args.files).parquet(src)
            out = cq.select_chain(df, {"slow": _sleepy(args.ms_per_row)}, control=handle)
            return out.writeStream.format("noop").option("checkpointLocation", os.path.join(root, f"ck_{mode}_{q}"))

        rt.register(f"{mode}_{q}", build, period=args.period, deadline=deadline)
    out = {}
    with rt:
        for q in queries:
            rt.await_batches(f"{mode}_{q}", args.instances, timeout=120 + 4 * args.period * args.instances)
        for q, deadline in queries.items():
            name = f"{mode}_{q}"
            out[q] = {"pool": rt.pool(name), "deadline": deadline,
                      "instances": [{"batch": i.batch, "duration": round(i.duration, 3),
                                     "lateness": round(i.lateness, 3), "missed": bool(i.missed)}
                                    for i in rt.instances(name) if i.input_rows > 0]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--instances", type=int, default=6)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--rows", type=int, default=250)
    ap.add_argument("--ms-per-row", type=float, default=1.5)
    ap.add_argument("--period", type=float, default=8.5)
    ap.add_argument("--tight", type=float, default=5.3)
    ap.add_argument("--loose", type=float, default=8.4)
    ap.add_argument("--modes", nargs="+", default=["edf", "shared"], choices=["edf", "shared"])
    args = ap.parse_args(argv)
    import pyspark_cq

    spark = pyspark_cq.spark("local[2]", "pyspark-cq-edf", shuffle_partitions=2, edf=True,
                             conf={"spark.sql.adaptive.enabled": "false",
                                   # one task per file: Spark packs small files into few tasks otherwise
                                   "spark.sql.files.openCostInBytes": str(256 << 20),
                                   "spark.sql.streaming.metricsEnabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = {mode: run_mode(spark, args.root, mode, args) for mode in args.modes}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
