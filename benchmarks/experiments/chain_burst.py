"""A 10x burst through a 3-predicate ``select_chain``: buffered rows, worker memory and batch time per strategy.

STREAM §5.3 (Motwani et al.) and Babcock et al.'s Chain on Spark. A streaming query reads Parquet files; its
first micro-batch holds ``rows / 10`` rows (the steady load), the second ``rows`` (a 10x burst, e.g. a
catch-up after downtime). Spark hands the Python worker big Arrow batches (``arrow.maxRecordsPerBatch`` is
raised to ``--arrow-batch``, as one does for throughput; Spark's default 10000 already keeps batches small).
The stage's three predicates (``--predicates distinct``, the default: a cheap one passing 1/2, a costly one
passing 4/5, a cheap one passing 1/10; ``tied``: cheap 1/2, costly 1/2, cheap 2/5, whose measured costs put
all three on one envelope segment; each row carries a ~100-byte string) run

- ``operator-at-a-time``: no scheduling parameter, every Arrow batch through each predicate in turn (what
  ``select_chain`` does by default);
- ``chain``, ``fifo``, ``greedy``, ``round_robin``: chunks of ``--chunk`` rows under a bound of ``--bound``
  buffered rows, priorities and selectivities written by the ``chain`` policy from the first batch's report.

Per strategy it prints the medians over ``--repeats`` runs of the burst batch's time (``durationMs.addBatch``),
its largest ``peak_buffered_rows`` and ``peak_worker_rss`` over the tasks, and the ratios to
operator-at-a-time (goal: Chain's peak <= 1/3, time <= 1.10). Python workers are not reused
(``spark.python.worker.reuse=false``), so each task's RSS is its own.

Usage::

    /work/bin/sparkslot --all python -m benchmarks.experiments.chain_burst [--rows 4000000] [--repeats 3] [--quick]
"""
from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

STRATEGIES = ("operator-at-a-time", "chain", "fifo", "greedy", "round_robin")


def half(batch):
    """Cheap, passes 1/2."""
    return np.asarray(batch["x"]) % 2 == 0


def costly(batch):
    """Costly (a few dozen float operations per row), passes 1/2."""
    f = np.asarray(batch["f"], dtype=np.float64)
    score = np.zeros_like(f)
    for k in range(1, 13):
        score += np.sin(f * k)
    return (score > -1e9) & (np.asarray(batch["u"]) < 0.5)


def fifth(batch):
    """Cheap, passes 2/5."""
    return np.asarray(batch["x"]) % 10 < 4


def costly_most(batch):
    """Costly like ``costly``, passes 4/5."""
    f = np.asarray(batch["f"], dtype=np.float64)
    score = np.zeros_like(f)
    for k in range(1, 13):
        score += np.sin(f * k)
    return (score > -1e9) & (np.asarray(batch["u"]) < 0.8)


def rare(batch):
    """Cheap, passes 1/10 (independent of the others)."""
    return np.asarray(batch["f"]) < 0.1


#: ``tied``: the first runs' predicates (measured costs put them on one envelope segment: every strategy
#: schedules alike); ``distinct``: a cheap halving one, a costly one passing 4/5, a cheap rare one — Chain
#: ranks the first highest and the other two together, greedy the last first: the strategies differ.
PREDICATE_SETS = {"tied": {"half": half, "costly": costly, "fifth": fifth},
                  "distinct": {"half": half, "costly": costly_most, "rare": rare}}
PREDICATES = PREDICATE_SETS["tied"]


def write_files(directory, rows, files, seed):
    rng = np.random.default_rng(seed)
    per = rows // files
    pad = "p" * 100
    for i in range(files):
        x = rng.integers(0, 1_000_000, per)
        pq.write_table(pa.table({"x": x, "f": rng.random(per), "u": rng.random(per),
                                 "s": pa.array([pad] * per, pa.string())}),
                       os.path.join(directory, f"s{seed:03d}_{i:03d}.parquet"))


def run_once(spark, cq, src_small, src_burst, workdir, strategy, params, tag, predicates=None):
    """The steady batch, then the burst; the burst batch's (seconds, report)."""
    predicates = predicates or PREDICATES
    plan = ">".join(predicates)
    src = os.path.join(workdir, f"in_{tag}")
    os.makedirs(src)
    for f in os.listdir(src_small):
        os.link(os.path.join(src_small, f), os.path.join(src, f))
    table = cq.ControlTable(os.path.join(workdir, f"control_{tag}.json"))
    table.register("f1", plan_id=plan)
    df = spark.readStream.schema("x long, f double, u double, s string").parquet(src)
    out = cq.select_chain(df, predicates, control=table.handle("f1"))
    q = (out.writeStream.format("noop").option("checkpointLocation", os.path.join(workdir, f"ck_{tag}")).start())
    try:
        q.processAllAvailable()
        first = [p for p in q.recentProgress if p["numInputRows"] > 0][-1]
        if strategy != "operator-at-a-time":
            from pyspark_cq_plugins.chain_scheduler import ChainScheduler

            from pyspark_cq.policies import OperatorStats, QueryInfo, Snapshot

            report = cq.read_metrics(first, "f1")
            info = QueryInfo("q", operators={"f1": OperatorStats("f1", 1, report=report)},
                             control={"f1": {"plan_id": plan}})
            policy = ChainScheduler(strategy=strategy, **params)
            table.apply(policy.decide(Snapshot(time.time(), {"q": info})), who="chain")
        for f in os.listdir(src_burst):
            os.link(os.path.join(src_burst, f), os.path.join(src, f))
        q.processAllAvailable()
        burst = [p for p in q.recentProgress if p["numInputRows"] > 0][-1]
    finally:
        q.stop()
    if strategy == "chain" and tag.endswith("_0"):
        print(f"chain policy wrote: {table.entry('f1').get('params')}", flush=True)
    return burst["durationMs"]["addBatch"] / 1000.0, burst["numInputRows"], cq.read_metrics(burst, "f1")


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows of the burst batch")
    parser.add_argument("--arrow-batch", type=int, default=1_000_000, help="arrow.maxRecordsPerBatch")
    parser.add_argument("--chunk", type=int, default=65_536)
    parser.add_argument("--bound", type=int, default=131_072)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--predicates", choices=sorted(PREDICATE_SETS), default="distinct",
                        help="tied: the first runs' predicates; distinct: priorities that differ")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    args = parser.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.rows, args.arrow_batch, args.chunk, args.bound, args.repeats = 200_000, 50_000, 8192, 16384, 1
    from pyspark import cloudpickle

    import pyspark_cq as cq

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import this script
    spark = harness.cq_session("chain-burst-bench", conf={"spark.python.worker.reuse": "false"})
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(1 << 30))   # a file is one partition
    tmp = tempfile.mkdtemp(prefix="cq-chain-burst-")
    try:
        small, burst = os.path.join(tmp, "small"), os.path.join(tmp, "burst")
        os.makedirs(small)
        os.makedirs(burst)
        write_files(small, args.rows // 10, 2, seed=1)
        write_files(burst, args.rows, 2, seed=2)
        params = {"max_buffered_rows": args.bound, "chunk_rows": args.chunk}
        preds = PREDICATE_SETS[args.predicates]
        print(f"start: load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}; predicates "
              f"{args.predicates} ({'>'.join(preds)})", flush=True)
        run_once(spark, cq, small, burst, tmp, "fifo", params, "warm", preds)   # warm the daemon and the caches
        results = {}
        for r in range(args.repeats):
            for strategy in STRATEGIES:        # interleaved, so a load change hits every strategy alike
                results.setdefault(strategy, []).append(
                    run_once(spark, cq, small, burst, tmp, strategy, params, f"{strategy}_{r}", preds))
        base = None
        print(f"burst batch: {args.rows:,} rows in 2 partitions; Arrow batches of {args.arrow_batch:,} rows; "
              f"chunks of {args.chunk:,}, bound {args.bound:,} buffered rows")
        print(f"{'strategy':20s} {'batch s':>8s} {'peak buffered':>14s} {'peak RSS MB':>12s} {'steps':>7s} "
              f"{'peak/base':>10s} {'time/base':>10s}")
        for strategy in STRATEGIES:
            runs = results[strategy]
            assert len({n for _, n, _ in runs}) == 1
            outs = {rep["output_rows"] for _, _, rep in runs}
            assert len(outs) == 1, (strategy, outs)
            t = statistics.median(s for s, _, _ in runs)
            peak = statistics.median(rep["peak_buffered_rows"] for _, _, rep in runs)
            rss = statistics.median(rep["peak_worker_rss"] for _, _, rep in runs) / 2**20
            steps = statistics.median(rep["chunk_steps"] for _, _, rep in runs)
            if base is None:
                base = (t, peak, rss, outs)
            assert outs == base[3], "a strategy changed the output"
            print(f"{strategy:20s} {t:8.2f} {peak:14,.0f} {rss:12.0f} {steps:7.0f} {peak / base[1]:10.3f} "
                  f"{t / base[0]:10.3f}", flush=True)
        print(f"output rows {base[3].pop():,} under every strategy; medians of {args.repeats} runs; "
              f"{platform.node()}, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}")
        harness.write_result("chain_burst", {"runs": {s: [(t, n, rep) for t, n, rep in runs]
                                                      for s, runs in results.items()}}, args, before)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
