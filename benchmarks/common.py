"""Code several benchmarks share: the aggregation's and the join's data, queries and streaming runners, the
floor shapes' state-carrying query, the progress summary, a parquet writer, the rate-based paper's §5.3 plans.

Functions here that Spark runs in its Python workers are shipped by reference (``benchmarks.common.<name>``):
the sessions of :mod:`benchmarks.harness` put the repository root on the workers' ``PYTHONPATH``.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_cq import plan as P

from . import harness

# --- sliding aggregation: data, session, the two aggregations, the streaming runner ----------------------------------

SLIDE = "1 second"
AGGS = {"v": ["sum", "max"], "*": ["count"]}
DELAY = "10 seconds"


def write_data(directory, rows, files, keys=100, rate=1000, seed=0):
    """``files`` parquet files of rows in event-time order (``rate`` rows per second, 1 s of jitter)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = rows // files
    for f in range(files):
        i = np.arange(f * per, (f + 1) * per)
        ts = i * 1_000_000 // rate + rng.integers(0, 1_000_000, per)
        table = pa.table({"ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
                          "k": pa.array(rng.integers(0, keys, per)), "v": pa.array(rng.integers(0, 1000, per))})
        path = os.path.join(directory, f"part-{f:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + f * 10, 1_000_000 + f * 10))


def session():
    """The aggregation benchmarks' local session. Its Python workers can import the benchmarks: the floor
    shapes (here, in floor_shapes.py, tws_aggregate.py) pass their functions to Spark by reference."""
    return harness.cq_session("aggregate-vs-spark", conf={
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
        "spark.driver.memory": "4g",
        "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
    })


def spark_agg(df, window):
    from pyspark.sql import functions as F

    return df.groupBy(F.window("ts", window, SLIDE), "k").agg(F.sum("v").alias("sum_v"), F.max("v").alias("max_v"),
                                                             F.count(F.lit(1)).alias("count"))


def ours_agg(df, window, **kw):
    import pyspark_cq

    return pyspark_cq.sliding_aggregate(df, "ts", window, SLIDE, by="k", aggs=AGGS, name="agg", **kw)


def stream_run(spark, build, directory, checkpoint):
    import pyspark_cq

    df = (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
          .parquet(directory).withWatermark("ts", DELAY))
    start = time.perf_counter()
    q = (build(df).writeStream.format("noop").outputMode("append").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.perf_counter() - start
    progress = q.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    ops = [p["stateOperators"][0] for p in progress if p["stateOperators"]]
    reports = [pyspark_cq.read_metrics(p, "agg") for p in progress]
    reports = [r for r in reports if r]
    return {
        "wall_s": wall, "rows": rows, "rows_per_s": rows / wall, "batches": len(progress),
        "batch_ms": [p["durationMs"].get("triggerExecution") for p in progress],
        # where each batch went: Spark's phases (addBatch, commits, planning) and the state operator's times
        "durations": [dict(p["durationMs"], **{k: v for k, v in (p["stateOperators"][0] if p["stateOperators"] else {}).items()
                                               if k.endswith("TimeMs")}) for p in progress],
        "store_rows_max": max((o["numRowsTotal"] for o in ops), default=0),
        "store_bytes_max": max((o["memoryUsedBytes"] for o in ops), default=0),
        "report_state_rows_max": max((r["state_rows"] for r in reports), default=None),
        "report_state_bytes_max": max((r["state_bytes"] for r in reports), default=None),
    }


def _eight_rows(batches):
    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"s": list(range(8)), "n": [n] * 8})


def _trivial_state(key, pdfs, state):
    import pandas as pd

    n = sum(len(p) for p in pdfs)
    state.update((n,))
    yield pd.DataFrame({"n": [n]})


def project(d):
    """The input of our aggregation's map side in its floor shapes: time (µs), key hash, key, value."""
    from pyspark.sql import functions as F

    return d.select(F.unix_micros("ts").alias("t"), F.xxhash64("k").alias("h"), "k", "v")

# --- interval join: data and the streaming runner --------------------------------------------------------------------

BASE_US = 1_700_000_000_000_000


def write_streams(root, files, rows, keys, seed=3):
    """files per side; file i holds event times in [i, i+1) * 60 s, shuffled (out of order within it)."""
    rng = np.random.default_rng(seed)
    for side in ("l", "r"):
        os.makedirs(os.path.join(root, side), exist_ok=True)
        for i in range(files):
            t = BASE_US + i * 60_000_000 + rng.integers(0, 60_000_000, rows)
            table = pa.table({
                "k": pa.array(rng.integers(0, keys, rows), pa.int64()),
                "ts": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                f"{side}v": pa.array(rng.integers(0, 1 << 40, rows), pa.int64()),
            })
            path = os.path.join(root, side, f"b{i:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))  # file order = batch order


def run_query(spark, df, checkpoint):
    sink = checkpoint + "_sink"
    query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    start = time.perf_counter()
    query.awaitTermination()
    wall = time.perf_counter() - start
    shutil.rmtree(sink, ignore_errors=True)
    return wall, [json.loads(p.json) for p in query.recentProgress]

# --- the floor of a stateful Python operator -------------------------------------------------------------------------

def carrying_state(grouped, per_shard):
    """``grouped.applyInPandasWithState`` with a function that does no work: it counts its rows and rewrites
    a state of ``per_shard[b]`` random (incompressible) bytes in batch b (the last entry after that), with
    event-time timeouts as our operators use. The floor of an operator of that grouping carrying that state.
    """
    import pandas as pd
    from pyspark.sql import types as T
    from pyspark.sql.streaming.state import GroupStateTimeout

    blob = np.random.default_rng(0).integers(0, 255, max(per_shard) + 1, dtype=np.uint8).tobytes()

    def fn(key, pdfs, state):
        seen = state.get[1] if state.exists else 0
        rows = sum(len(p) for p in pdfs)
        old = len(state.get[0]) if state.exists else 0
        state.update((blob[:per_shard[min(seen, len(per_shard) - 1)]], seen + 1))
        state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1) + 3_600_000)
        yield pd.DataFrame({"rows": [rows], "read": [old]})

    st = T.StructType([T.StructField("b", T.BinaryType()), T.StructField("n", T.LongType())])
    return grouped.applyInPandasWithState(fn, "rows long, read long", st, "append", GroupStateTimeout.EventTimeTimeout)


def join_shape(left, right, per_shard=(0,)):
    """``pyspark_cq.interval_join``'s shape with no work (±30 s on ``k``, ``ts``): its tagged union grouped
    by shard into :func:`carrying_state` with ``per_shard[b]`` bytes of state per shard in batch b.
    """
    from pyspark_cq.operators import join as J
    from pyspark_cq.operators._common import metrics as _metrics
    from pyspark_cq.operators.join.spec import JoinSpec

    spec = JoinSpec.build(left, right, "k", "ts", "ts", "inner", ("_l", "_r"), None, None, "floor", None)
    union = _metrics.observe_input(J._tagged(spec, J.LEFT, True).union(J._tagged(spec, J.RIGHT, True)), "floor")
    return carrying_state(union.groupBy(*J._group_cols(spec)), [int(b) // spec.shards for b in per_shard])

# --- per-batch progress ----------------------------------------------------------------------------------------------

PHASES = ("addBatch", "allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")


def _summary(progress: list[dict]) -> dict:
    steady = progress[2:-1] or progress
    phases = []
    for p in steady:
        ops = p.get("stateOperators") or [{}]
        phases.append({"addBatch": p["durationMs"].get("addBatch", 0),
                       **{k: sum(o.get(k, 0) for o in ops) for k in PHASES[1:]}})
    return {"median_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in steady),
            "phases_ms": {k: statistics.median(x[k] for x in phases) for k in PHASES},
            "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress]}

# --- input files -----------------------------------------------------------------------------------------------------

def _write(directory: str, step: int, table) -> None:
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".b{step:04d}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(directory, f"b{step:04d}.parquet"))

# --- the rate-based paper's §5.1-§5.3 streams and plans (Table 4, Table 5, Figure 11) --------------------------------

# §5.1–§5.2: rates (elements/s) from the inter-arrival delays; Table 5
RATES = {"A": 50.0, "B": 500.0, "C": 100.0, "D": 250.0, "E": 1000.0}
SIZES = {"A": 5_000, "B": 10_000, "C": 20_000, "D": 50_000, "E": 100_000}     # Table 4
#: "5 ms" handling cost of the predicate A⋈C, paid by every input of the join that evaluates it
AC_COST = 5e-3


def _s(name):
    return P.Source(name)


def plans_5_3(ac_cost=AC_COST, f_scale=1.0, method="hash"):
    """Figure 11's shapes over A…E with Table 5's predicates (E the fastest stream, D the second); every
    selectivity times ``f_scale`` (the Spark runs scale them to the data that runs here), every join by
    ``method`` (Table 3: ``"hash"`` or ``"nested_loops"``)."""
    f_ab, f_ac, f_bd, f_de = (f * f_scale for f in (F_AB, F_AC, F_BD, F_DE))
    ac = lambda: P.Join(_s("A"), _s("C"), selectivity=f_ac, method=method, left_cost=ac_cost, right_cost=ac_cost)  # noqa: E731
    # (a) Left Deep: the fastest stream at the top
    left_deep = P.Join(P.Join(P.Join(ac(), _s("B"), selectivity=f_ab, method=method), _s("D"), selectivity=f_bd, method=method), _s("E"),
                       selectivity=f_de, method=method, label="Left Deep")
    # (b) Fast Leaves: the fast streams at the lowest level
    fast_leaves = P.Join(P.Join(ac(), _s("B"), selectivity=f_ab, method=method), P.Join(_s("D"), _s("E"), selectivity=f_de, method=method),
                         selectivity=f_bd, method=method, label="Fast Leaves")
    # (c) Evenly Spread: the fastest in the middle, the second fastest at the lowest level
    evenly = P.Join(P.Join(P.Join(_s("B"), _s("D"), selectivity=f_bd, method=method), _s("E"), selectivity=f_de, method=method), ac(),
                    selectivity=f_ab, method=method, label="Evenly Spread")
    return [left_deep, fast_leaves, evenly]

F_AB, F_AC, F_BD, F_DE = 2e-3, 5e-3, 1e-4, 1e-5
