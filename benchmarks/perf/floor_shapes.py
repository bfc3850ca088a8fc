"""What each part of a Python stateful pipeline costs per micro-batch (issue 14's floor, measured by shape).

Queries with trivial functions (no kernels, a few bytes of state) over the same file stream, each run in
the same session: reading into a ``noop`` sink; our aggregation's shape (``mapInArrow`` emitting 8 rows →
``groupBy(shard).applyInPandasWithState``); the same with the shard computed by Spark instead of a Python
stage; with event-time timeouts; with the output returned as one Arrow IPC blob per group unpacked by a
``mapInArrow`` versus array cells unpacked by Spark (``explode(arrays_zip)``); a stateless Python stage over
``repartition(8)`` (a design with its state outside Spark's store, whose task count does not follow
``spark.sql.shuffle.partitions``); and, for reference, our
``sliding_aggregate`` and Spark's ``groupBy(window())`` at W/S = 60. Printed: the median ``triggerExecution``
over the steady batches and Spark's phases (ms, state-operator times summed over tasks).

Usage::

    python -m benchmarks.perf.floor_shapes [--rows 5000] [--files 16] [--rounds 2] [--no-warmup]
                                           [--session cq|plain] [--partitions N] [shape-substring ...]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

import numpy as np
import pyarrow as pa

from pyspark_cq._duration import parse_duration  # noqa: E402
from pyspark_cq._validate import WATERMARK_KEY  # noqa: E402  (the field metadata that carries a watermark)

from .. import common, harness

SPARK_WINDOW = "Spark window(), W/S = 60"   # the shape every other is compared with


def _state(key, pdfs, state, timeout=False):
    n = sum(len(p) for p in pdfs)
    state.update((n,))
    if timeout:
        state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1))
    return n


def _trivial_timeout(key, pdfs, state):
    import pandas as pd

    yield pd.DataFrame({"n": [_state(key, pdfs, state, timeout=True)]})


def _blob(key, pdfs, state):
    import pandas as pd

    _state(key, pdfs, state)
    table = pa.table({"a": np.arange(50), "b": np.arange(50)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    yield pd.DataFrame({"p": [sink.getvalue().to_pybytes()]})


def _arrays(key, pdfs, state):
    import pandas as pd

    _state(key, pdfs, state)
    cells = np.empty(2, dtype=object)
    cells[0], cells[1] = np.arange(50), np.arange(50)
    yield pd.DataFrame({"a": pd.Series(cells[:1]), "b": pd.Series(cells[1:])})


def _unpack(batches):
    for b in batches:
        for blob in b.column(0).to_pylist():
            if blob:
                yield from pa.ipc.open_stream(blob).read_all().to_batches()


def _count(batches):
    """A stateless partition function: one row with the partition's row count."""
    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def _eight_tagged(batches):
    """``aggregate_vs_spark._eight_rows`` plus an all-null event-time column (as our slicer's, which carries
    the watermark to the stateful stage)."""
    for b in common._eight_rows(batches):
        yield b.append_column("w", pa.nulls(b.num_rows, pa.timestamp("us", tz="UTC")))


def shapes():
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def native_shard(d):
        return d.select("ts", F.pmod(F.xxhash64("k"), F.lit(8)).alias("s"), "k", "v")

    def python_shard(d):
        return common.project(d).mapInArrow(common._eight_rows, "s long, n long")

    def python_tagged(d):
        delay_ms = parse_duration(common.DELAY) // 1000   # the sources' watermark delay (parse_duration: µs)
        tagged = T.StructType([T.StructField("s", T.LongType()), T.StructField("n", T.LongType()),
                               T.StructField("w", T.TimestampType(), True, {WATERMARK_KEY: delay_ms})])
        return common.project(d).mapInArrow(_eight_tagged, tagged)

    def stateful(d, fn, out="n long", timeout="NoTimeout"):
        return d.groupBy("s").applyInPandasWithState(fn, out, "x long", "append", timeout)

    return {
        "read -> noop": lambda d: d,
        SPARK_WINDOW: lambda d: common.spark_agg(d, "60 seconds"),
        "ours sliding_aggregate, W/S = 60": lambda d: common.ours_agg(d, "60 seconds"),
        # state="files": the same operator in a stateless stage, its state in files (issue 39)
        # tasks=1 (a local master's default): no shuffle, one Python task; tasks=2: repartition by shard
        "ours sliding_aggregate, W/S = 60, state='files', one task": lambda d: common.ours_agg(
            d, "60 seconds", state="files", tasks=1),
        "ours sliding_aggregate, W/S = 60, state='files', a task per core": lambda d: common.ours_agg(
            d, "60 seconds", state="files", tasks=2),
        "mapInArrow(8 rows) -> applyInPandasWithState": lambda d: stateful(python_shard(d), common._trivial_state),
        "  + event-time timeouts (our aggregation's shape)": lambda d: stateful(
            python_tagged(d), _trivial_timeout, timeout="EventTimeTimeout"),
        "Spark's shard -> applyInPandasWithState": lambda d: stateful(native_shard(d), common._trivial_state),
        "  + event-time timeouts": lambda d: stateful(native_shard(d), _trivial_timeout,
                                                     timeout="EventTimeTimeout"),
        "  + IPC blob out, mapInArrow unpack": lambda d: stateful(native_shard(d), _blob, "p binary")
            .mapInArrow(_unpack, "a long, b long"),
        # a design without Spark's state store: the partitions a query asks for by repartition(n) are n whatever
        # spark.sql.shuffle.partitions is, so a plain session runs 8 Python tasks, not 200 (state in our own files)
        "stateless: Spark's shard -> repartition(8) -> mapInArrow": lambda d: native_shard(d)
            .repartition(8, "s").mapInArrow(_count, "n long"),
        # no shuffle at all: the source's partitions merged into one Python task (a narrow coalesce), one stage
        "stateless, no shuffle: coalesce(1) -> mapInArrow": lambda d: native_shard(d)
            .coalesce(1).mapInArrow(_count, "n long"),
        "  + array cells out, explode(arrays_zip)": lambda d: stateful(
            native_shard(d), _arrays, "a array<long>, b array<long>")
            .select(F.explode(F.arrays_zip("a", "b")).alias("z")).select("z.a", "z.b"),
    }


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=5000, help="rows per micro-batch")
    ap.add_argument("--files", type=int, default=16, help="micro-batches")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the shapes, alternating their order; "
                                                           "the summary is the median over the passes")
    ap.add_argument("--no-warmup", action="store_true",
                    help="measure from a cold JVM (by default every shape first runs once on 8 files)")
    ap.add_argument("--session", choices=("cq", "plain"), default="cq",
                    help="cq.spark()'s session (2 shuffle partitions), or a plain SparkSession as a user makes it "
                         "(Spark's 200 shuffle partitions unless --partitions)")
    ap.add_argument("--partitions", type=int, default=None, help="shuffle partitions of the plain session")
    ap.add_argument("only", nargs="*", help="run only shapes whose name contains one of these")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.session == "plain":
        spark = harness.plain_session("floor-shapes", partitions=args.partitions or 200,
                                      conf={"spark.driver.memory": "4g"})
    else:
        spark = common.session()
    spark_partitions = spark.conf.get("spark.sql.shuffle.partitions")
    print(f"{args.session} session, {spark_partitions} shuffle partitions", flush=True)
    tmp = tempfile.mkdtemp(prefix="cq_floor_")
    chosen = [(name, build) for name, build in shapes().items()
              if not args.only or any(o in name for o in args.only)]
    runs: dict[str, list[float]] = {}
    try:
        data = os.path.join(tmp, "data")
        common.write_data(data, args.rows * args.files, args.files)
        if not args.no_warmup:   # the JIT warms up over dozens of batches: the first query of a JVM runs slow
            warm = os.path.join(tmp, "warm")
            common.write_data(warm, args.rows * 8, 8)
            for i, (_, build) in enumerate(chosen):
                common.stream_run(spark, build, warm, os.path.join(tmp, f"ck_warm{i}"))
        for r in range(args.rounds):
            for i, (name, build) in (list(enumerate(chosen)) if r % 2 == 0 else list(enumerate(chosen))[::-1]):
                res = common.stream_run(spark, build, data, os.path.join(tmp, f"ck{i}_{r}"))
                steady = res["durations"][2:-1] or res["durations"]

                def med(key, steady=steady):
                    return statistics.median(x.get(key, 0) for x in steady)

                runs.setdefault(name, []).append(med("triggerExecution"))
                print(f"round {r} {name:46s} median {med('triggerExecution'):6.0f} ms | addBatch {med('addBatch'):5.0f} "
                      f"updates {med('allUpdatesTimeMs'):5.0f} removals {med('allRemovalsTimeMs'):5.0f} "
                      f"commit {med('commitTimeMs'):5.0f} | load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    spark_ms = statistics.median(runs.get(SPARK_WINDOW, [float("nan")]))
    print(f"\nmedian over {args.rounds} rounds ({args.rows:,} rows per batch); ratio = shape / Spark's window()")
    for name, ms in runs.items():
        m = statistics.median(ms)
        print(f"{name:46s} {m:6.0f} ms  {m / spark_ms:5.2f}  ({', '.join(f'{x:.0f}' for x in ms)})")
    harness.write_result("floor_shapes", {"rows_per_batch": args.rows, "session": args.session,
                                          "shuffle_partitions": int(spark_partitions), "median_batch_ms": runs},
                         args, before)


if __name__ == "__main__":
    main()
