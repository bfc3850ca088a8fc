"""Where one shard call of the interval join's stateful function spends its time, outside Spark (issue 14).

Calls ``JoinWorker.streaming`` -- the function ``interval_join`` registers with ``applyInPandasWithState`` --
the way PySpark 4.3's worker does, for one shard over a sequence of micro-batches: the data of
``small_batches.py --only join`` (``join_vs_spark.write_streams``: ``--rows`` rows per side and batch, 200 k
keys, ±30 s band, watermark delay 4 minutes), the transport columns ``interval_join`` builds, the rows of
one of ``--shards`` shards, converted to pandas by PySpark's own ``ArrowBatchTransformer.to_pandas`` and
concatenated per chunk as its worker does, and a ``GroupState`` constructed as its worker constructs one
(the state tuple the function wrote in the previous call, the watermark Spark would have). PySpark's own
work around the call (input conversion, output conversion of the packed row, pickling the state) is timed
separately: it is the same for any function except for the output row.

Prints the median time per call over the steady calls (all but the first ``--warm``), per part, and with
``--profile`` the cProfile of the steady calls (cumulative, per call). The shard's share of the state
bytes is printed too, to compare with Spark's ``state_bytes`` / shards.

Usage::

    python -m benchmarks.perf.join_worker_profile [--rows 5000] [--batches 12] [--shards 4] [--runs 5] [--profile]
"""
from __future__ import annotations

import cProfile
import io
import os
import pickle
import pstats
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import common, harness

DELAY_MS = 4 * 60_000
TZ = "UTC"


def _worker(shards: int):
    """The ``JoinWorker`` of ``interval_join(l, r, "k", "ts", "ts", "-30 seconds", "30 seconds",
    suffixes=("_l", "_r"))`` on the benchmark's inputs (``k long, ts timestamp, <side>v long``), with
    ``shards`` shards: the config ``JoinConfig.of`` builds, without a SparkSession.
    """
    from pyspark.sql import types as T

    from pyspark_cq.operators._common import metrics as _metrics
    from pyspark_cq.operators._common.codec import codecs_for
    from pyspark_cq.operators.join.worker import JoinConfig, JoinWorker

    schemas = [T.StructType([T.StructField("k", T.LongType()), T.StructField("ts", T.TimestampType()),
                             T.StructField(f"{s}v", T.LongType())]) for s in "lr"]
    out = T.StructType([T.StructField("k", T.LongType()), T.StructField("ts_l", T.TimestampType()),
                        T.StructField("lv", T.LongType()), T.StructField("ts_r", T.TimestampType()),
                        T.StructField("rv", T.LongType())])
    config = JoinConfig(
        key_codecs=tuple(codecs_for(schemas[0], ["k"], "__cq_k")),
        side_codecs=tuple(tuple(codecs_for(schemas[s], ["ts", f"{'lr'[s]}v"], f"__cq_p{s}_")) for s in (0, 1)),
        out_columns=tuple(out.names), n_keys=1, how="inner", lower=-30_000_000, upper=30_000_000, window=None,
        out_arrow=_metrics.arrow_schema(out), shards=shards, out_keys=(0,), key_names=(("k",), ("k",)))
    return JoinWorker(config), _metrics.packed_schema(out, _worker_metrics())


def _worker_metrics():
    from pyspark_cq.operators.join.worker import METRICS

    return METRICS


def _tagged(table: pa.Table, side: int) -> pa.Table:
    """One input's rows in the transport layout of ``join._tagged`` (streaming: both sides' payload columns)."""
    n = table.num_rows
    micros = table.column("ts").cast(pa.int64())
    cols = {"__cq_side": pa.array(np.full(n, side, np.int8)), "__cq_shard": pa.array(np.zeros(n, np.int64)),
            "__cq_t": table.column("ts"), "__cq_tus": micros,
            "__cq_k0": table.column("k"), "__cq_k0__n": pa.array(np.zeros(n, bool))}
    for s in (0, 1):
        mine = s == side
        values = (micros, table.column(2)) if mine else (pa.array(np.zeros(n, np.int64)),) * 2
        for i, v in enumerate(values):
            cols[f"__cq_p{s}_{i}"] = v
            cols[f"__cq_p{s}_{i}__n"] = pa.array(np.full(n, not mine))
    return pa.table(cols)


def batches(rows: int, files: int, shards: int, keys: int = 200_000):
    """Per micro-batch: (shard 0's tagged union as one Arrow batch, the watermark of that batch in ms)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="cq_jwp_") as root:
        common.write_streams(root, files, rows, keys)
        inputs = [[pq.read_table(os.path.join(root, s, f"b{i:04d}.parquet")) for i in range(files)] for s in "lr"]
    wm = 0
    for i in range(files):
        parts = []
        for side in (0, 1):
            t = inputs[side][i]
            parts.append(_tagged(t.filter(t.column("k").to_numpy() % shards == 0), side))
        # Spark's global watermark (min over the inputs) after this batch: the next batch's
        max_ms = min(pa.compute.max(inputs[s][i].column("ts").cast(pa.int64())).as_py() // 1000 for s in (0, 1))
        out.append((pa.concat_tables(parts).combine_chunks().to_batches()[0], wm))
        wm = max(wm, max_ms - DELAY_MS)
    return out


def _state(value, wm_ms: int):
    """A ``GroupState`` as PySpark's worker constructs it (``construct_state`` in pyspark/worker.py)."""
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

    from pyspark_cq.operators.join.driver import _STATE_SCHEMA

    return GroupState(optionalValue=value, batchProcessingTimeMs=0, eventTimeWatermarkMs=wm_ms,
                      timeoutConf=GroupStateTimeout.EventTimeTimeout, hasTimedOut=False, watermarkPresent=True,
                      defined=value is not None, updated=False, removed=False, timeoutTimestamp=-1,
                      keyAsUnsafe=b"", valueSchema=_STATE_SCHEMA)


def _between(gap: float, churn: int) -> None:
    """What happens between two calls of one shard inside Spark: ``gap`` seconds idle (the rest of the
    micro-batch, the trigger) after touching ``churn`` MB of fresh memory (the other work a worker and its
    neighbours do, which evicts our data from the caches).
    """
    if churn:
        np.ones(churn << 17).sum()
    if gap:
        time.sleep(gap)


def run(data, shards: int, profiler: cProfile.Profile | None = None, warm: int = 2, acc: dict | None = None,
        gap: float = 0.0, churn: int = 0):
    """One pass over ``data``; per steady call the seconds of (pyspark input, our function, pyspark output,
    state pickle), the state bytes written, the input rows. ``acc`` (the timers of :func:`_timed_steps`) is
    cleared after the first ``warm`` calls, so that it holds the steady calls only.
    """
    import pandas as pd
    from pyspark.sql import types as T
    from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion

    from pyspark_cq.operators.join.driver import _STATE_SCHEMA

    worker, out_schema = _worker(shards)
    value, times = None, []
    for b, (batch, wm) in enumerate(data):
        _between(gap, churn)
        t0 = time.perf_counter()
        series = ArrowBatchTransformer.to_pandas(batch, timezone=TZ, struct_in_pandas="dict")
        values = iter([pd.concat(series, axis=1)])   # the value columns: all data columns (keys too)
        state = _state(value, wm)
        t1 = time.perf_counter()
        if profiler is not None and b >= warm:
            profiler.enable()
        out = list(worker.streaming((int(series[1].iloc[0]),), values, state))
        if profiler is not None:
            profiler.disable()
        t2 = time.perf_counter()
        # As the worker's construct_record_batch: the output frame is the struct field _1 of its batch.
        PandasToArrowConversion.convert([pd.concat(out, ignore_index=True)], T.StructType([T.StructField("_1", out_schema)]),
                                        timezone=TZ, arrow_cast=True)
        t3 = time.perf_counter()
        # What the worker sends back and the JVM hands in next batch (a tuple of the state's fields).
        value = pickle.loads(pickle.dumps(_STATE_SCHEMA.toInternal(state._value))) if state.exists else None
        t4 = time.perf_counter()
        if acc is not None and b == warm - 1:
            acc.clear()
        times.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, sum(len(v) for v in value) if value else 0,
                      batch.num_rows))
    return times[warm:]


def _timed_steps():
    """Wrap the steps of one call with timers (no profiler: cProfile inflates the many small calls several
    times); returns ``{step: [seconds, ...]}``, nested steps inside their parents.
    """
    from pyspark_cq.operators._common import metrics as _metrics
    from pyspark_cq.operators._common import state_bytes as _state_bytes
    from pyspark_cq.operators.join import worker as J

    steps = [(J.JoinWorker, "_restore"), (J.JoinWorker, "_kernel"), (J.PayloadSide, "from_bytes"),
             (J, "split_sides"), (J.JoinWorker, "_process"), (J.JoinWorker, "_side_input"),
             (J.JoinWorker, "_insert_probe"), (J.JoinWorker, "_evict"), (J.JoinWorker, "_emit"),
             (J.JoinWorker, "_save"), (J.PayloadSide, "canonicalize"), (_state_bytes, "pack"),
             (J.PayloadSide, "to_bytes"), (J.JoinWorker, "_packed"), (_metrics, "packed_row")]
    acc: dict[str, float] = {}
    for owner, name in steps:
        raw = owner.__dict__[name]
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

        def timed(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t

        setattr(owner, name, type(raw)(timed) if isinstance(raw, (staticmethod, classmethod)) else timed)
    return acc


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=5000, help="rows per side and micro-batch (all shards)")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--shards", type=int, default=4, help="default: 2 * shuffle partitions of small_batches (2)")
    ap.add_argument("--runs", type=int, default=5, help="passes over the batches; medians over all steady calls")
    ap.add_argument("--warm", type=int, default=2, help="first calls of a pass left out (state still growing)")
    ap.add_argument("--profile", action="store_true", help="also print cProfile of the steady calls")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds idle between two calls (a micro-batch apart)")
    ap.add_argument("--churn", type=int, default=0, help="MB of memory touched between two calls")
    args = ap.parse_args(argv)
    before = harness.start()
    os.environ.setdefault("NUMBA_CACHE_DIR", "/tmp/numba_cq")
    data = batches(args.rows, args.batches, args.shards)
    run(data, args.shards)  # imports, native module, caches
    calls = []
    for _ in range(args.runs):
        calls += run(data, args.shards, warm=args.warm, gap=args.gap, churn=args.churn)
    acc, per_call = _timed_steps(), {}
    for _ in range(args.runs):
        run(data, args.shards, acc=acc, warm=args.warm, gap=args.gap, churn=args.churn)
        for step, seconds in acc.items():
            per_call.setdefault(step, []).append(seconds / (args.batches - args.warm))
        acc.clear()
    print(f"load: {os.getloadavg()[0]:.2f}; {len(calls)} steady calls of shard 0 of {args.shards}; "
          f"rows in {statistics.median(c[5] for c in calls):.0f}, state {statistics.median(c[4] for c in calls) / 1e3:.0f} kB")
    for i, part in enumerate(("pyspark: arrow -> pandas, GroupState", "JoinWorker.streaming",
                              "pyspark: output row -> arrow", "state pickle round trip")):
        ms = [c[i] * 1e3 for c in calls]
        print(f"  {part:40s} median {statistics.median(ms):7.2f} ms  (min {min(ms):.2f}, max {max(ms):.2f})")
    print("steps of JoinWorker.streaming, ms per steady call (median over the runs; nested in the one above):")
    for step, seconds in per_call.items():
        print(f"  {step:18s} {statistics.median(seconds) * 1e3:6.2f}")
    harness.write_result("join_worker_profile", {
        "calls_s": calls, "steps_s_per_call": {step: statistics.median(s) for step, s in per_call.items()}},
        args, before)
    if args.profile:
        prof = cProfile.Profile()
        run(data, args.shards, profiler=prof, warm=args.warm)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
        print(s.getvalue())
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        print(s.getvalue())


if __name__ == "__main__":
    main()
