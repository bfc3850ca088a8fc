"""transformWithStateInPandas as the sliding aggregation's state home, side by side at small micro-batches.

Issue 14: every micro-batch each shard's whole state image crosses JVM -> Python -> JVM. This script
measures, in one session and on identical file streams (W/S = 60, 100 keys, ``maxFilesPerTrigger=1``,
``availableNow``, ``noop`` sink), per rows-per-batch size:

- Spark's ``groupBy(window())`` on the default (HDFS-backed) state store and on RocksDB with changelog
  checkpointing;
- our ``sliding_aggregate`` with its state in ``applyInPandasWithState`` (the default, ``state="groupstate"``)
  on both stores, and with ``state="tws"`` (``transformWithStateInPandas``: the shard's image in a
  ``ValueState``, an event-time timer; Spark allows TWS on RocksDB only);
- the floor of each shape with trivial functions: ``mapInArrow`` emitting 8 rows into
  ``applyInPandasWithState`` / ``transformWithStateInPandas`` doing nothing but a count (no timeouts,
  no timers).

Printed: the median ``triggerExecution`` over the steady batches (the first two and the last left out),
the state operator's phases summed over tasks, our state image per batch (what crosses JVM <-> Python
each way) and Spark's store metrics; the ratio against Spark's ``window()`` on the default store.

Usage::

    python -m benchmarks.perf.tws_aggregate [--sizes 5000,50000] [--files 12] [--json out.json]
"""
from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile

from .. import common, harness
from ..common import _summary

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STORE_METRICS = ("rocksdbBytesCopied", "rocksdbPutCount", "rocksdbGetCount", "rocksdbCommitFileSyncLatencyMs",
                 "rocksdbChangeLogWriterCommitLatencyMs", "stateOnCurrentVersionSizeBytes")


def _trivial_processor():
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class Trivial(StatefulProcessor):
        def init(self, handle):
            self.handle = handle
            self.count = handle.getValueState("n", "n long")

        def handleInputRows(self, key, rows, timerValues):
            n = sum(len(p) for p in rows)
            self.count.update((n,))
            yield pd.DataFrame({"n": [n]})

    return Trivial()


def variants():
    def python_shard(d):
        return common.project(d).mapInArrow(common._eight_rows, "s long, n long")

    return {  # name: (build, store)
        "Spark window()": (lambda d: common.spark_agg(d, "60 seconds"), "default"),
        "Spark window(), RocksDB": (lambda d: common.spark_agg(d, "60 seconds"), "rocksdb"),
        "ours, applyInPandasWithState": (lambda d: common.ours_agg(d, "60 seconds"), "default"),
        "ours, applyInPandasWithState, RocksDB": (lambda d: common.ours_agg(d, "60 seconds"), "rocksdb"),
        "ours, transformWithStateInPandas": (lambda d: common.ours_agg(d, "60 seconds", state="tws"), "rocksdb"),
        "floor: mapInArrow -> applyInPandasWithState": (
            lambda d: python_shard(d).groupBy("s").applyInPandasWithState(
                common._trivial_state, "n long", "x long", "append", "NoTimeout"), "default"),
        "floor: mapInArrow -> transformWithStateInPandas": (
            lambda d: python_shard(d).groupBy("s").transformWithStateInPandas(
                _trivial_processor(), "n long", "Append", "None"), "rocksdb"),
    }


def _set_store(spark, store):
    if store == "rocksdb":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    else:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        spark.conf.unset("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled")


def _bytes(progress):
    """Per steady batch: our state image (bytes each way) and the store's own metrics, medians."""
    import pyspark_cq

    steady = progress[2:-1] or progress
    out = {}
    images = [r.get("state_bytes") for r in (pyspark_cq.read_metrics(p, "agg") for p in steady) if r]
    if images:
        out["image_bytes"] = statistics.median(images)
    for m in STORE_METRICS:
        vals = [sum(o.get("customMetrics", {}).get(m, 0) for o in p.get("stateOperators", [])) for p in steady]
        if any(vals):
            out[m] = statistics.median(vals)
    out["numRowsUpdated"] = statistics.median(
        sum(o.get("numRowsUpdated", 0) for o in p.get("stateOperators", [])) for p in steady)
    return out


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--sizes", default="5000,50000", help="rows per micro-batch")
    ap.add_argument("--files", type=int, default=12, help="micro-batches per run")
    ap.add_argument("only", nargs="*", help="run only variants whose name contains one of these")
    args = ap.parse_args(argv)
    before = harness.start()
    spark = common.session()
    tmp = tempfile.mkdtemp(prefix="cq_tws_")
    results = {"machine": platform.platform(), "cpus": os.cpu_count(), "runs": []}
    try:
        for rows in (int(s) for s in args.sizes.split(",")):
            data = os.path.join(tmp, f"d{rows}")
            common.write_data(data, rows * args.files, args.files)

            def source(data=data):
                return (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
                        .parquet(data).withWatermark("ts", common.DELAY))

            base = None
            for i, (name, (build, store)) in enumerate(variants().items()):
                if args.only and not any(o in name for o in args.only):
                    continue
                _set_store(spark, store)
                _, progress = common.run_query(spark, build(source()), os.path.join(tmp, f"ck{rows}_{i}"))
                _set_store(spark, "default")
                s = _summary(progress)
                s.update(name=name, rows_per_batch=rows, store=store, load=os.getloadavg()[0], **_bytes(progress))
                base = s["median_ms"] if name == "Spark window()" else base
                ratio = f"ours/Spark {s['median_ms'] / base:.2f}" if base else ""
                results["runs"].append(s)
                extra = {k: v for k, v in s.items() if k in ("image_bytes", "numRowsUpdated") + STORE_METRICS}
                print(f"{rows:>6,} {name:48s} {s['median_ms']:6.0f} ms {ratio} | {s['phases_ms']} | {extra} "
                      f"| load {s['load']:.1f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    harness.write_result("tws_aggregate", results, args, before)


if __name__ == "__main__":
    main()
