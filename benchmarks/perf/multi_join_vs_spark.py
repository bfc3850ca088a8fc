"""Side by side: cq.multi_join against Spark's chain of binary stream-stream joins (a 3-way funnel).

impressions -> clicks within 10 minutes of the impression -> purchases within 1 hour of the click, by user.
Both queries read the same parquet file streams (``maxFilesPerTrigger=1``, ``availableNow``). Prints the
wall time, the per-batch times, the output rows (equal), the state rows and state memory of both, and then
every probe order of multi_join (set through the control table) on a skewed input: the best, the worst and
the default.

Usage::

    python -m benchmarks.perf.multi_join_vs_spark [--files 16] [--impressions 60000] [--users 200000] [--quick]
        [--persistence full changelog files stateless] [--session cq|plain] [--partitions N]

``--session plain``: both queries in a plain ``SparkSession`` as a user makes it (Spark's default 200 shuffle
partitions unless ``--partitions``), where ``state_persistence="stateless"`` runs one task per core and Spark's chain
one per partition.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness
from ..common import carrying_state

BASE_US = 1_700_000_000_000_000
FILE_US = 5 * 60_000_000  # event time covered by one file (one micro-batch)
BOUNDS = [(0, 1, "0 seconds", "10 minutes"), (1, 2, "0 seconds", "1 hour")]
DEFAULT = "0:1>2;1:0>2;2:1>0"  # the static default: the narrowest band first


def write_streams(root, files, impressions, users, *, hot=0.0, seed=5):
    """Per file: impressions, clicks (1 per 5 impressions) and purchases (1 per 5 clicks), users uniform
    except a share ``hot`` of the impressions and clicks that goes to user 0 (the skewed case: a bot).
    """
    rng = np.random.default_rng(seed)
    sizes = {"imp": impressions, "clk": impressions // 5, "buy": impressions // 25}
    for name, n in sizes.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(files):
            users_col = rng.integers(1, users, n)
            if name != "buy":
                users_col[rng.random(n) < hot] = 0
            t = BASE_US + i * FILE_US + rng.integers(0, FILE_US, n)
            cols = {f"{name}_user": pa.array(users_col, pa.int64()),
                    f"{name}_ts": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC"))}
            if name == "imp":
                cols["ad"] = pa.array(rng.integers(0, 1000, n), pa.int32())
            if name == "buy":
                cols["amount"] = pa.array(rng.random(n) * 100)
            path = os.path.join(root, name, f"b{i:04d}.parquet")
            pq.write_table(pa.table(cols), path)
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))  # file order = batch order


def _sources(spark, root, delay):
    schemas = {"imp": "imp_user long, imp_ts timestamp, ad int", "clk": "clk_user long, clk_ts timestamp",
               "buy": "buy_user long, buy_ts timestamp, amount double"}
    return [spark.readStream.schema(schemas[n]).option("maxFilesPerTrigger", 1).parquet(os.path.join(root, n))
            .withWatermark(f"{n}_ts", delay) for n in ("imp", "clk", "buy")]


def spark_chain(imp, clk, buy):
    from pyspark.sql import functions as F

    first = imp.join(clk, F.expr("imp_user = clk_user AND clk_ts BETWEEN imp_ts AND imp_ts + INTERVAL 10 MINUTES"))
    # One event-time column per stream (Spark's rule): keep the click's, which the next condition uses.
    first = first.select(*[F.col(c).alias(c, metadata={}) if c == "imp_ts" else F.col(c) for c in first.columns])
    return first.join(buy, F.expr("imp_user = buy_user AND buy_ts BETWEEN clk_ts AND clk_ts + INTERVAL 1 HOUR"))


def run(df, checkpoint):
    q = (df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    start = time.perf_counter()
    q.awaitTermination()
    return time.perf_counter() - start, [json.loads(p.json) for p in q.recentProgress]


def _phases(progress) -> dict:
    """Medians over the batches after the first of Spark's per-batch phases (ms): triggerExecution, addBatch,
    and the stateful operators' update / removal / commit times (summed over operators and tasks).
    """
    rest = progress[1:] or progress
    out = {}
    for key in ("triggerExecution", "addBatch"):
        out[key] = statistics.median(p["durationMs"].get(key, 0) for p in rest)
    for key in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs"):
        out[key] = statistics.median(sum(o.get(key, 0) for o in p["stateOperators"]) for p in rest)
    return out


def ours(spark, root, delay, ck, plan=None, persistence="full"):
    import pyspark_cq as cq
    from pyspark_cq.control import ControlTable

    control = None
    if plan is not None:
        table = ControlTable(os.path.join(ck, "control.json"))
        table.register("funnel", plan_id=plan)
        control = table.handle("funnel")
    df = cq.multi_join(_sources(spark, root, delay), ["imp_user", "clk_user", "buy_user"],
                       ["imp_ts", "clk_ts", "buy_ts"], BOUNDS, control=control, name="funnel",
                       state_persistence=persistence,
                       state_dir=os.path.join(ck, "ours_state") if persistence in ("files", "stateless") else None)
    wall, progress = run(df, os.path.join(ck, "ours"))
    reports = [cq.read_metrics(p, "funnel") or {} for p in progress]
    return {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "phases": _phases(progress), "state_rows": [r.get("state_rows", 0) for r in reports],
            "state_bytes": [r.get("state_bytes", 0) for r in reports],
            "output_rows": sum(r.get("output_rows", 0) for r in reports),
            "probe_steps": sum(v for r in reports for k, v in r.items() if k.startswith("probed_")),
            "cache_hits": sum(r.get("state_cache_hits", 0) for r in reports),
            "cache_misses": sum(r.get("state_cache_misses", 0) for r in reports),
            "cache_catch_ups": sum(r.get("state_cache_catch_ups", 0) for r in reports)}


def floor(spark, root, delay, ck, sizes=None):
    """The funnel's shape with no work: the same tagged union, observed and grouped by shard into an
    ``applyInPandasWithState`` whose function only reads its rows and rewrites a state of random
    (incompressible) bytes: ``sizes[b]`` / shards bytes per shard in batch b (our run's ``state_bytes``), or
    a few bytes without ``sizes``. What any operator of this shape costs per batch before doing anything.
    """

    from pyspark_cq.operators import multi_join as M
    from pyspark_cq.operators._common import metrics as _metrics

    spec = M.MultiJoinSpec.build(_sources(spark, root, delay), ["imp_user", "clk_user", "buy_user"],
                                 ["imp_ts", "clk_ts", "buy_ts"], BOUNDS, None, "floor")
    config = spec.config()
    union = M._tagged(spec, config, 0).union(M._tagged(spec, config, 1)).union(M._tagged(spec, config, 2))
    out = carrying_state(_metrics.observe_input(union, "floor", per=(M.SIDE, 3)).groupBy(M.SHARD),
                         [int(b) // spec.shards for b in (sizes or [0])])
    wall, progress = run(out, os.path.join(ck, "floor" if sizes is None else "floor_state"))
    return {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "phases": _phases(progress)}


def theirs(spark, root, delay, ck):
    wall, progress = run(spark_chain(*_sources(spark, root, delay)), os.path.join(ck, "spark"))
    return {"wall_s": wall, "batch_ms": [p["durationMs"].get("triggerExecution", 0) for p in progress],
            "phases": _phases(progress), "state_rows": [sum(o.get("numRowsTotal", 0) for o in p["stateOperators"]) for p in progress],
            "state_bytes": [sum(o.get("memoryUsedBytes", 0) for o in p["stateOperators"]) for p in progress],
            "output_rows": sum(p.get("sink", {}).get("numOutputRows", 0) or 0 for p in progress)}


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--impressions", type=int, default=60_000, help="impressions per file (5 minutes)")
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--delay", default="5 minutes", help="watermark delay")
    ap.add_argument("--hot", type=float, default=0.02,
                    help="share of impressions and clicks on one user (skewed case)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rocksdb", action="store_true",
                    help="RocksDB state store with changelog checkpointing (both queries) instead of the default")
    ap.add_argument("--skip-plans", action="store_true", help="leave out the every-plan runs")
    ap.add_argument("--persistence", nargs="+", default=["full"], choices=["full", "changelog", "files", "stateless"],
                    help="multi_join's state_persistence on the funnel, one run each (issue 39; the every-plan runs "
                         "use the first)")
    ap.add_argument("--session", choices=("cq", "plain"), default="cq",
                    help="cq.spark()'s session, or a plain SparkSession as a user makes it")
    ap.add_argument("--partitions", type=int, default=None,
                    help="shuffle partitions (default: 2 for cq, Spark's 200 for plain)")
    ap.add_argument("--floor", action="store_true",
                    help="also run the funnel's shape with no work (with and without our run's state bytes)")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.files, args.impressions, args.users = 4, 5_000, 20_000
    conf = {"spark.sql.adaptive.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
            "spark.driver.memory": "6g", "spark.sql.streaming.metricsEnabled": "false"}
    if args.rocksdb:
        conf["spark.sql.streaming.stateStore.providerClass"] = (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = "true"
    print(f"# state store: {'RocksDB, changelog checkpointing' if args.rocksdb else 'default (HDFS-backed)'}")
    if args.session == "plain":   # as a user makes it: only the driver's memory and the state store chosen
        plain = {k: v for k, v in conf.items() if k.startswith(("spark.driver.", "spark.sql.streaming.stateStore"))}
        spark = harness.plain_session("multi-join-bench", partitions=args.partitions or 200, conf=plain)
    else:
        spark = harness.cq_session("multi-join-bench", partitions=args.partitions or 2, conf=conf)
    print(f"# load {os.getloadavg()[0]:.2f}; {args.session} session, "
          f"{spark.conf.get('spark.sql.shuffle.partitions')} shuffle partitions")
    root = tempfile.mkdtemp(prefix="cqmjoin_")
    try:
        write_streams(os.path.join(root, "warm"), 2, 2_000, 2_000)  # warm both engines (JVM JIT, workers)
        for layout in args.persistence:
            ours(spark, os.path.join(root, "warm"), args.delay, os.path.join(root, "ckw", layout), persistence=layout)
        theirs(spark, os.path.join(root, "warm"), args.delay, os.path.join(root, "ckw"))

        write_streams(os.path.join(root, "u"), args.files, args.impressions, args.users)
        layouts = {}
        for layout in args.persistence:   # each printed at once: a run cut short still reports ours
            r = layouts[layout] = ours(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck1", layout),
                                       persistence=layout)
            print(f"# ours {layout!r}: wall {r['wall_s']:.1f} s, per batch ms {r['batch_ms']}, output rows "
                  f"{r['output_rows']:,}", flush=True)
        o = layouts[args.persistence[0]]
        s = theirs(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck1"))
        n_in = args.files * (args.impressions + args.impressions // 5 + args.impressions // 25)
        print(f"funnel, {args.files} files x ({args.impressions:,} impressions + 1/5 clicks + 1/25 purchases), "
              f"{args.users:,} users, watermark delay {args.delay}:")
        print(f"  wall: multi_join {o['wall_s']:.1f} s, Spark chain {s['wall_s']:.1f} s -> ratio "
              f"{s['wall_s'] / o['wall_s']:.2f}x ({n_in / o['wall_s']:,.0f} vs {n_in / s['wall_s']:,.0f} rows/s)")
        so, ss = sum(o["batch_ms"][1:]), sum(s["batch_ms"][1:])
        print(f"  batches 1..: multi_join {so / 1e3:.1f} s, Spark {ss / 1e3:.1f} s -> ratio {ss / so:.2f}x; "
              f"median batch {statistics.median(o['batch_ms'][1:]):.0f} ms vs {statistics.median(s['batch_ms'][1:]):.0f} ms")
        print(f"  output rows: multi_join {o['output_rows']:,}, Spark {s['output_rows']:,} "
              f"({'equal' if o['output_rows'] == s['output_rows'] else 'DIFFERENT'})")
        print(f"  state rows max: multi_join {max(o['state_rows']):,}, Spark {max(s['state_rows']):,}")
        mo, ms = max(o["state_bytes"]), max(s["state_bytes"])
        print(f"  state memory max: multi_join {mo / 2**20:.1f} MiB (serialized state), Spark {ms / 2**20:.1f} MiB "
              f"(memoryUsedBytes, both joins) -> 1/{ms / max(mo, 1):.1f}")
        print(f"  medians of Spark's phases (ms) multi_join: {o['phases']}")
        print(f"  medians of Spark's phases (ms)      Spark: {s['phases']}")
        print(f"  per batch ms multi_join: {o['batch_ms']}")
        print(f"  per batch ms      Spark: {s['batch_ms']}")
        for layout, r in layouts.items():   # each state_persistence of ours against Spark's chain
            sr = sum(r["batch_ms"][1:])
            print(f"  state_persistence={layout!r}: wall {r['wall_s']:.1f} s ({s['wall_s'] / r['wall_s']:.2f}x Spark), "
                  f"batches 1.. {sr / 1e3:.1f} s ({ss / sr:.2f}x), median batch "
                  f"{statistics.median(r['batch_ms'][1:]):.0f} ms, output rows {r['output_rows']:,}, cache hits / "
                  f"misses / catch-ups {r['cache_hits']} / {r['cache_misses']} / {r.get('cache_catch_ups', 0)}, "
                  f"state value max {max(r['state_bytes']) / 2**20:.1f} MiB")
        if args.floor:
            for label, sizes in (("no state", None), ("our state's bytes", o["state_bytes"])):
                f = floor(spark, os.path.join(root, "u"), args.delay, os.path.join(root, "ck1"), sizes)
                sf = sum(f["batch_ms"][1:])
                print(f"  floor ({label}): wall {f['wall_s']:.1f} s, batches 1.. {sf / 1e3:.1f} s -> at most "
                      f"{ss / sf:.2f}x Spark's (ours {ss / so:.2f}x); median batch "
                      f"{statistics.median(f['batch_ms'][1:]):.0f} ms; phases {f['phases']}")

        result = {"funnel": {"multi_join": o, "spark": s, "layouts": layouts}}
        if args.skip_plans:
            harness.write_result("multi_join_vs_spark", result, args, before)
            return
        write_streams(os.path.join(root, "hot"), args.files // 2, args.impressions, args.users, hot=args.hot)
        import itertools

        from pyspark_cq.control import join_plan_id

        # the first run on new files pays for listing and reading them cold: warm once, then measure
        ours(spark, os.path.join(root, "hot"), args.delay, os.path.join(root, "ck_hot_warm"), DEFAULT)
        runs = {}
        others = [[j for j in range(3) if j != i] for i in range(3)]
        for orders in itertools.product(*[list(itertools.permutations(o)) for o in others]):
            plan = join_plan_id(orders)
            runs[plan] = ours(spark, os.path.join(root, "hot"), args.delay, os.path.join(root, f"ck_{plan}"), plan,
                              persistence=args.persistence[0])
        print(f"skewed ({args.hot:.0%} of impressions and clicks on one user), {args.files // 2} files, every plan:")
        for plan, r in sorted(runs.items(), key=lambda kv: kv[1]["wall_s"]):
            mark = " (default)" if plan == DEFAULT else ""
            print(f"  {plan}{mark}: {r['wall_s']:.1f} s, {r['probe_steps']:,} partial matches probed, "
                  f"{r['output_rows']:,} rows out")
        best = min(runs, key=lambda p: runs[p]["wall_s"])
        worst = max(runs, key=lambda p: runs[p]["wall_s"])
        outs = {r["output_rows"] for r in runs.values()}
        print(f"  best {best} is {runs[worst]['wall_s'] / runs[best]['wall_s']:.2f}x faster than worst {worst}; "
              f"default {runs[DEFAULT]['wall_s'] / runs[best]['wall_s']:.2f}x the best's time; output rows "
              f"{'equal for every plan' if len(outs) == 1 else 'DIFFER: ' + str(sorted(outs))}")
        result["skewed_plans"] = runs
        harness.write_result("multi_join_vs_spark", result, args, before)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
