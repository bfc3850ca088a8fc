"""Side by side: ``select_chain`` in its best and worst order, against a plain ``mapInArrow`` filter.

One cheap selective predicate (``x % 10 == 0``: 10 % pass) and one expensive unselective one (a stand-in for
model scoring: ~``COST`` sine evaluations per row, 90 % pass). Prints medians over ``--repeats`` runs of
1. select_chain, order cheap>model (the best plan) and model>cheap (the worst);
2. a plain ``mapInArrow`` that applies the same two predicates in the best order (no reports, no control);
and the ratios worst / best (issue goal ≥ 3) and select_chain / plain in the same order (goal ≤ 1.2).

Usage::

    python -m benchmarks.perf.select_chain_vs_filter [--rows 2000000] [--repeats 3] [--quick]
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

COST = 400   # sine evaluations per row in the expensive predicate


def cheap(batch):
    """Selective and cheap: 10 % of the rows pass."""
    return np.asarray(batch["x"]) % 10 == 0


def model(batch):
    """Unselective and expensive: a score from COST sine terms per row; 90 % pass."""
    x = np.asarray(batch["f"], dtype=np.float64)
    score = np.sin(np.outer(x, np.arange(1, COST + 1, dtype=np.float64))).sum(axis=1)
    return np.isfinite(score) & (np.asarray(batch["u"]) < 0.9)   # the score is always finite: u decides


class Plain:
    """The baseline: the same predicates, best order, in one mapInArrow with no reports."""

    def __call__(self, batches):
        for b in batches:
            b = b.filter(pa.array(cheap(b)))
            if b.num_rows:
                b = b.filter(pa.array(model(b)))
            yield b


def write_input(directory, rows, files=8, seed=0):
    rng = np.random.default_rng(seed)
    per = rows // files
    for i in range(files):
        pq.write_table(pa.table({"x": rng.integers(0, 1_000_000, per), "f": rng.random(per),
                                 "u": rng.random(per)}), os.path.join(directory, f"part{i:03d}.parquet"))


def timed(df) -> tuple[float, int]:
    start = time.perf_counter()
    n = df.count()   # forces the whole pipeline; the count itself is negligible
    return time.perf_counter() - start, n


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    args = parser.parse_args(argv)
    before = harness.start()
    if args.quick:
        args.rows, args.repeats = 100_000, 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import cloudpickle

    import pyspark_cq as cq

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import this script
    spark = cq.spark("local[2]", "select-chain-bench", shuffle_partitions=2)
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="cq-chain-bench-")
    try:
        write_input(tmp, args.rows)
        df = spark.read.parquet(tmp)
        preds = {"cheap": cheap, "model": model}
        table = cq.ControlTable(os.path.join(tmp, "control.json"))
        table.register("best", plan_id="cheap>model")
        table.register("worst", plan_id="model>cheap")
        runs = {
            "chain best (cheap>model)": lambda: cq.select_chain(df, preds, control=table.handle("best")),
            "chain worst (model>cheap)": lambda: cq.select_chain(df, preds, control=table.handle("worst")),
            "plain mapInArrow (cheap, model)": lambda: df.mapInArrow(Plain(), df.schema),
        }
        for make in runs.values():   # warm the workers: each first use imports its modules in every worker
            timed(make())
        results = {}
        for label, make in runs.items():
            samples = [timed(make()) for _ in range(args.repeats)]
            counts = {n for _, n in samples}
            assert len(counts) == 1, counts
            results[label] = statistics.median(t for t, _ in samples)
            print(f"{label:34s} median {results[label]:7.2f} s over {args.repeats} runs, {counts.pop():,} rows out",
                  flush=True)
        best = results["chain best (cheap>model)"]
        print(f"worst / best order: {results['chain worst (model>cheap)'] / best:.2f}x (goal >= 3)")
        print(f"select_chain / plain mapInArrow, same order: {best / results['plain mapInArrow (cheap, model)']:.3f}"
              f" (goal <= 1.2)")
        print(f"{args.rows:,} rows, {platform.node()}, load {os.getloadavg()[0]:.2f}, "
              f"{time.strftime('%Y-%m-%d %H:%M')}")
        harness.write_result("select_chain_vs_filter", {"rows": args.rows, "median_s": results}, args, before)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
