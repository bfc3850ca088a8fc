"""What a GroupState value costs per micro-batch in ``applyInPandasWithState`` (issue 14's per-batch floor).

Eight groups each rewrite a random state value of 0.01, 1 and 4 MB every micro-batch over a trivial input;
prints Spark's median batch time, ``allUpdatesTimeMs`` and ``commitTimeMs`` per state type (``binary``,
``string``, ``array``: PySpark 4.3 fails on an array state schema). Results in docs/benchmark-log-2026.md.

Usage::

    python -m benchmarks.perf.state_value_cost [binary] [string] [array]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupStateTimeout

from .. import harness


def run(spark, root, mb, kind):
    """One streaming run with a state value of ``mb`` MB per group of type ``kind``: Spark's medians (ms)."""
    n = int(mb * 2**20)
    blob = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).tobytes()
    longs = np.frombuffer(blob[: n // 8 * 8], dtype=np.int64)
    if kind == "binary":
        st_schema = T.StructType([T.StructField("b", T.BinaryType())])
        value = (blob,)
    elif kind == "string":
        st_schema = T.StructType([T.StructField("b", T.StringType())])
        value = (blob.decode("latin-1"),)
    else:
        st_schema = T.StructType([T.StructField("b", T.ArrayType(T.LongType()))])
        value = (longs.tolist(),)

    def fn(key, pdfs, state):
        size = len(state.get[0]) if state.exists else 0
        for _ in pdfs:
            pass
        state.update(value)
        yield pd.DataFrame({"g": [int(key[0])], "size": [size]})
    df = spark.readStream.schema("g long, x long").option("maxFilesPerTrigger", 1).parquet(os.path.join(root, "in"))
    out = df.groupBy("g").applyInPandasWithState(fn, "g long, size long", st_schema, "append", GroupStateTimeout.NoTimeout)
    ck = tempfile.mkdtemp()
    q = out.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    prog = [json.loads(p.json) for p in q.recentProgress][2:]
    med = statistics.median(p["durationMs"]["triggerExecution"] for p in prog)
    upd = statistics.median(p["stateOperators"][0].get("allUpdatesTimeMs", 0) for p in prog)
    com = statistics.median(p["stateOperators"][0].get("commitTimeMs", 0) for p in prog)
    shutil.rmtree(ck, ignore_errors=True)
    return med, upd, com


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("kinds", nargs="*", default=["binary", "string"], choices=["binary", "string", "array"],
                    help="state value types to measure (default: both)")
    args = ap.parse_args(argv)
    before = harness.start()
    spark = harness.cq_session("toy")
    root = tempfile.mkdtemp()
    for i in range(8):
        path = os.path.join(root, "in", f"b{i}.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"g": np.arange(8000) % 8, "x": np.arange(8000)}), path)
        os.utime(path, (1_000_000 + i * 10,) * 2)
    print(f"# load {os.getloadavg()[0]:.2f}")
    run(spark, root, 0.01, "binary")  # warm-up
    result = []
    for kind in args.kinds:
        for mb in (0.01, 1.0, 4.0):
            med, upd, com = run(spark, root, mb, kind)
            result.append({"kind": kind, "state_mb_per_group": mb, "batch_ms": med, "updates_ms": upd,
                           "commit_ms": com})
            print(f"{kind:7s} state {mb:5.2f} MB x 8 groups: batch {med:.0f} ms, updates {upd:.0f} ms, "
                  f"commit {com:.0f} ms", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    spark.stop()
    harness.write_result("state_value_cost", result, args, before)


if __name__ == "__main__":
    main()
