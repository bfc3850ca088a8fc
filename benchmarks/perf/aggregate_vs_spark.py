"""Side by side: pyspark-cq's sliding_aggregate against Spark's groupBy(window(...)) aggregation.

Prints medians and ratios for
1. the kernels alone, on one core: map-side slicing (raw rows/s) and the per-shard sweep
   (slices ingested + windows emitted per second) for W/S in {1, 60, 600};
2. batch DataFrames end to end (``noop`` sink), W/S in {1, 60, 600}, sum/count/max over 100 keys;
3. streaming end to end on identical file streams (``maxFilesPerTrigger=1``, ``availableNow``, append
   mode, ``noop`` sink), with the state both keep (rows and bytes of the state store, Spark's
   ``numRowsTotal`` / ``memoryUsedBytes`` for both operators, and our own report);
4. state grouped by hash shard (a native table per shard) vs by raw key, streaming, W/S = 60;
5. the per-batch floor: queries of our streaming pipeline's shape with no work in them (read into a
   ``noop`` sink; + a ``mapInArrow`` that counts; + a trivial ``applyInPandasWithState`` over 8 groups),
   against ours at W/S = 60 -- what any Python stateful operator pays per micro-batch.

Usage::

    python -m benchmarks.perf.aggregate_vs_spark [--rows 2000000] [--small-rows 200000] [--quick]

Spark's own aggregation copies every row W/S times, so at W/S = 600 it runs on ``--small-rows`` rows
only (all rates are rows per second, so sizes may differ).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from .. import harness
from ..common import _eight_rows, _trivial_state, ours_agg, project, session, spark_agg, stream_run, write_data

RATIOS = (1, 60, 600)
# --- 1: the kernels ---------------------------------------------------------------------------------------

def kernel_rates(n=2_000_000, keys=100, batch=100_000, repeats=3, ratios=RATIOS):
    from pyspark_cq._native import load

    k = load("_aggregate")
    rng = np.random.default_rng(0)
    h = rng.integers(0, keys, n).astype(np.int64) * 0x9E3779B1
    t = np.arange(n, dtype=np.int64) * 1000 + rng.integers(0, 1000, n)  # 1000 rows per second
    v = rng.integers(0, 1000, n).astype(np.int64)
    ops = np.array([k.OP_ROWS, -1, k.OP_COUNT, 0, k.OP_SUM_I, 0, k.OP_MAX_I, 0], dtype=np.int32)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for s in range(0, n, batch):
            k.preaggregate(h[s:s + batch], t[s:s + batch], None, 1_000_000, ops, [v[s:s + batch]], [None])
        rates.append(n / (time.perf_counter() - start))
    out = {"map_rows_per_s": statistics.median(rates)}
    sl = k.preaggregate(h, t, None, 1_000_000, ops, [v], [None])
    kinds = np.array([k.KIND_ADD_I64, k.KIND_ADD_I64, k.KIND_ADD_I64, k.KIND_MAX], dtype=np.uint8)
    outs = np.array([k.OUT_SUM_I, 2, 1, k.OUT_MAX, 3, 1, k.OUT_COUNT, 0, -1], dtype=np.int32)
    m = len(sl["hash"])
    for seconds in (10, 250):  # event time per call: a small micro-batch and one of 250 k rows at 1000 rows/s
        step = seconds * keys
        for ratio in ratios:
            w = ratio * 1_000_000
            rates = []
            for _ in range(repeats):
                st = k.ShardState(kinds, outs, False)
                start = time.perf_counter()
                done = 0
                for b in range(0, m, step):
                    sel = slice(b, b + step)
                    st.ingest(sl["hash"][sel], sl["start"][sel], [p[sel] for p in sl["partials"]], w, 1_000_000, None)
                    wm = int(sl["start"][min(b + step, m) - 1])
                    e = st.emit_windows(w, 1_000_000, st.watermark, wm, False)
                    done += len(e[0])
                    st.evict(w, 1_000_000, wm)
                    st.watermark = wm
                rates.append((m + done) / (time.perf_counter() - start))
            out[f"sweep_updates_per_s_{seconds}s_per_call_ws{ratio}"] = statistics.median(rates)
    out["slices"] = m
    return out


# --- data -------------------------------------------------------------------------------------------------

# --- 2: batch ---------------------------------------------------------------------------------------------

def batch_run(df):
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def batch_bench(spark, big, small, rows, small_rows, repeats, ratios=RATIOS):
    out = {}
    for ratio in ratios:
        window = f"{ratio} seconds"
        src, n = (big, rows) if ratio < 600 else (small, small_rows)
        df = spark.read.parquet(src)
        batch_run(ours_agg(df, window))  # warm the Python workers
        ours = statistics.median(batch_run(ours_agg(df, window)) for _ in range(repeats))
        theirs = statistics.median(batch_run(spark_agg(df, window)) for _ in range(1 if ratio >= 60 else repeats))
        ours_big = None
        if ratio == 600:  # our rate on the full data too, for the flatness check
            ours_big = rows / statistics.median(batch_run(ours_agg(spark.read.parquet(big), window))
                                                for _ in range(repeats))
        out[ratio] = {"rows": n, "ours_s": ours, "spark_s": theirs, "ours_rows_per_s": n / ours,
                      "spark_rows_per_s": n / theirs, "ratio": theirs / ours, "ours_full_rows_per_s": ours_big}
        print(f"batch W/S={ratio}: ours {n / ours:,.0f} rows/s, Spark {n / theirs:,.0f} rows/s, "
              f"ratio {theirs / ours:.1f}x, load {os.getloadavg()[0]:.1f}", flush=True)
    return out


# --- 3, 4: streaming --------------------------------------------------------------------------------------

def stream_bench(spark, big, small, tmp, repeats=2, ratios=RATIOS):
    out = {}
    for ratio in ratios:
        window = f"{ratio} seconds"
        runs = [stream_run(spark, lambda d: ours_agg(d, window), big, os.path.join(tmp, f"ck_o{ratio}_{i}"))
                for i in range(repeats)]
        ours = sorted(runs, key=lambda r: r["rows_per_s"])[len(runs) // 2]  # the median run
        src = big if ratio < 600 else small
        theirs = stream_run(spark, lambda d: spark_agg(d, window), src, os.path.join(tmp, f"ck_s{ratio}"))
        out[ratio] = {"ours": ours, "spark": theirs, "ratio": ours["rows_per_s"] / theirs["rows_per_s"]}
        print(f"stream W/S={ratio}: ours {ours['rows_per_s']:,.0f} rows/s (state {ours['store_rows_max']} rows, "
              f"{ours['store_bytes_max']:,} B), Spark {theirs['rows_per_s']:,.0f} rows/s (state "
              f"{theirs['store_rows_max']} rows, {theirs['store_bytes_max']:,} B), ratio {out[ratio]['ratio']:.1f}x, "
              f"load {os.getloadavg()[0]:.1f}",
              flush=True)
    return out


def layout_bench(spark, tmp, rows, key_counts=(100, 10_000)):
    """Shards (8 native tables) vs one Spark group per raw key, streaming, W/S = 60, 4 files of rows."""
    out = {}
    for keys in key_counts:
        d = os.path.join(tmp, f"keys{keys}")
        write_data(d, rows, 4, keys=keys, seed=keys)
        for layout in (8, "key"):
            r = stream_run(spark, lambda df: ours_agg(df, "60 seconds", shards=layout), d,
                           os.path.join(tmp, f"ck_layout_{keys}_{layout}"))
            out[f"{keys} keys, shards={layout}"] = r
            print(f"layout keys={keys} shards={layout}: {r['rows_per_s']:,.0f} rows/s, batches {r['batch_ms']}",
                  flush=True)
    return out


def _count_rows(batches):
    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def floor_bench(spark, big, tmp):
    """Median steady batch (ms) of queries of our pipeline's shape with no work in them, and ours."""
    shapes = {
        "read (noop sink)": lambda d: d,
        "+ mapInArrow counting rows": lambda d: project(d).mapInArrow(_count_rows, "n long"),
        "+ trivial applyInPandasWithState, 8 groups": lambda d: project(d).mapInArrow(_eight_rows, "s long, n long")
            .groupBy("s").applyInPandasWithState(_trivial_state, "n long", "x long", "append", "NoTimeout"),
        "ours, W/S = 60": lambda d: ours_agg(d, "60 seconds"),
    }
    out = {}
    for name, build in shapes.items():
        r = stream_run(spark, build, big, os.path.join(tmp, f"ck_floor_{len(out)}"))
        steady = r["batch_ms"][1:-1] or r["batch_ms"]
        out[name] = {"median_batch_ms": statistics.median(steady), "batch_ms": r["batch_ms"],
                     "durations": r["durations"]}
        print(f"floor: {name}: median steady batch {statistics.median(steady):,.0f} ms ({r['batch_ms']})",
              flush=True)
    return out


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8,
                    help="input files of the large stream (one per micro-batch, so rows/files rows per batch)")
    ap.add_argument("--small-rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layout-rows", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    ap.add_argument("--ratios", default="1,60,600", help="comma list of W/S values (default 1,60,600)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: kernel,batch,stream,layout,floor")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.rows, args.small_rows, args.repeats, args.layout_rows = 200_000, 20_000, 1, 20_000
    skip = set(filter(None, args.skip.split(",")))
    try:
        ratios = tuple(int(r) for r in args.ratios.split(","))
    except ValueError:
        ap.error(f"--ratios must be a comma list of positive integers, got {args.ratios!r}")
    if not ratios or min(ratios) <= 0:
        ap.error(f"--ratios must be a comma list of positive integers, got {args.ratios!r}")
    result = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
              "input": {"rows": args.rows, "files": args.files, "rows_per_batch": args.rows // args.files},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if "kernel" not in skip:
        result["kernel"] = kernel_rates(ratios=ratios)
        print("kernel:", json.dumps(result["kernel"], indent=1), flush=True)
    tmp = tempfile.mkdtemp(prefix="cq-agg-bench-")
    try:
        big, small = os.path.join(tmp, "big"), os.path.join(tmp, "small")
        write_data(big, args.rows, args.files)
        write_data(small, args.small_rows, 4, seed=1)
        spark = session()
        import pyspark

        result["machine"]["pyspark"] = pyspark.__version__
        def save():   # after each part: a long run keeps what it measured
            harness.write_result("aggregate_vs_spark", result, args, before)

        if "batch" not in skip or "stream" not in skip:
            # Warm the Python workers (imports, first Arrow batches) outside the timed runs.
            stream_run(spark, lambda d: ours_agg(d, "10 seconds"), small, os.path.join(tmp, "ck_warm"))
        if "batch" not in skip:
            result["batch"] = batch_bench(spark, big, small, args.rows, args.small_rows, args.repeats, ratios)
            save()
        if "stream" not in skip:
            result["stream"] = stream_bench(spark, big, small, tmp, max(1, args.repeats - 1), ratios)
            save()
        if "layout" not in skip:
            result["layout"] = layout_bench(spark, tmp, args.layout_rows)
        if "floor" not in skip:
            result["floor"] = floor_bench(spark, big, tmp)
            save()
        result["load_after"] = os.getloadavg()
        save()
        print(json.dumps(result, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
