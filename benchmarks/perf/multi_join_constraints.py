"""multi_join with and without stream constraints (STREAM §5.2, issue 43): state rows, state bytes and batch time.

The three-input form of benchmarks/perf/join_constraints.py's workloads, 10 s of event time per micro-batch, one
parquet file per input and batch (``maxFilesPerTrigger=1``), noop sink, ``local[2]``:

- ``orders``: orders (input 0, ``--orders`` per batch, one every 10 s / orders), fulfilments (1: 1 + Poisson(
  ``--pieces`` - 1) per order, ``--lag`` s after it, clustered by order id and displaced by fewer than J rows,
  ``--jitters``), payments (2: 4 orders in 5 pay once, 0-``--pay`` s after the order); the join: fulfilment and
  payment within 0-60 s after the order, watermark delay ``--wm-delay`` s. Runs: ``none``; ``unique(0) +
  many_to_one(1 -> 0) + unique(2)``; the same + ``clustered(1, k)`` with the fulfilments' measured k.
- ``funnel``: sessions (``--orders`` per batch, ids in start order), 1 + Poisson(3) clicks (0) in their first 30 s,
  every second session puts an item in the cart (1) 30-35 s after its start, every third buys once (2) 40 s after
  its start, the purchases in session order displaced by fewer than J rows; the join: cart within 0-60 s and
  purchase within 0-120 s after a click, watermark delay 30 s. Runs: ``none``; ``ordered(2, k)`` (the clicks and
  carts of a session the purchases have passed without buying go).

Prints per run the median state rows and state bytes over the second half of the batches (the steady state), the
median batch time (triggerExecution), output rows (equal with and without constraints on one stream) and
``constraint_violations``. The machine may be shared: quote the load printed before and after.

Usage::

    python -m benchmarks.perf.multi_join_constraints [--orders 1000] [--batches 20] [--jitters 1 300]
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness
from .join_constraints import BASE_US, BATCH_S, _by_batch, _row, run_to_end

N = 3


def _write(root: str, parts) -> None:
    """Per input ``(keys, µs)`` over the whole run: one parquet file per input and batch (by event time), with a
    random payload column."""
    rng = np.random.default_rng(1)
    for i, per_batch in enumerate(parts):
        for b, (k, ts) in enumerate(per_batch):
            table = pa.table({"k": pa.array(k, pa.int64()), "ts": pa.array(ts, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")), f"v{i}": pa.array(rng.integers(0, 1 << 40, len(k)), pa.int64())})
            os.makedirs(os.path.join(root, f"in{i}"), exist_ok=True)
            path = os.path.join(root, f"in{i}", f"b{b:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + b * 10,) * 2)   # file order = batch order


def write_orders(root: str, orders: int, batches: int, pieces: float, lag: int, pay: int, jitter: int,
                 seed: int = 0) -> int:
    """The ``orders`` workload's files; returns the fulfilments' adherence k (measured by plain loops)."""
    from pyspark_cq.experiments import constraint_streams as S

    rng = np.random.default_rng(seed)
    n = orders * batches
    step = BATCH_S * 1_000_000 // orders
    ot = BASE_US + np.arange(n, dtype=np.int64) * step
    seq = S.clustered_keys(np.arange(n), rng.poisson(pieces - 1, n) + 1, jitter, rng)
    ft = BASE_US + lag * 1_000_000 + (np.arange(len(seq)) * (step / pieces)).astype(np.int64)
    payers = np.flatnonzero(rng.random(n) < 0.8)
    pt = ot[payers] + rng.integers(0, pay * 1_000_000, len(payers))
    _write(root, [_by_batch(np.arange(n), ot, batches), _by_batch(seq, ft, batches), _by_batch(payers, pt, batches)])
    return S.clustered_k(seq)


def write_funnel(root: str, sessions: int, batches: int, jitter: int, seed: int = 0) -> int:
    """The ``funnel`` workload's files; returns the purchases' adherence k."""
    from pyspark_cq.experiments import constraint_streams as S

    rng = np.random.default_rng(seed)
    n = sessions * batches
    step = BATCH_S * 1_000_000 // sessions
    ck = np.repeat(np.arange(n), rng.poisson(3, n) + 1)
    ct = BASE_US + ck * step + rng.integers(0, 30_000_000, len(ck))
    carts = np.arange(0, n, 2)
    kt = BASE_US + carts * step + 30_000_000 + rng.integers(0, 5_000_000, len(carts))
    seq = S.ordered_keys(np.arange(0, n, 3), jitter, rng)
    pt = BASE_US + 40_000_000 + np.arange(len(seq), dtype=np.int64) * 3 * step
    _write(root, [_by_batch(ck, ct, batches), _by_batch(carts, kt, batches), _by_batch(seq, pt, batches)])
    return S.ordered_k(seq)


def run(spark, root: str, bounds, wm_delay: int, constraints, ck: str) -> dict:
    """One query to the end; medians over the second half of the batches."""
    import pyspark_cq

    sources = [spark.readStream.schema(f"k long, ts timestamp, v{i} long").option("maxFilesPerTrigger", 1)
               .parquet(os.path.join(root, f"in{i}")).withWatermark("ts", f"{wm_delay} seconds") for i in range(N)]
    sources = [df.withColumnRenamed("k", f"k{i}").withColumnRenamed("ts", f"t{i}") for i, df in enumerate(sources)]
    df = pyspark_cq.multi_join(sources, [f"k{i}" for i in range(N)], [f"t{i}" for i in range(N)],
                               [(i, j, f"{lo} seconds", f"{up} seconds") for i, j, lo, up in bounds],
                               name="mjc", constraints=constraints)
    return run_to_end(df, ck, "mjc")


def main(argv=None):
    from pyspark_cq.constraints import clustered, many_to_one, ordered, unique

    ap = harness.parser(__doc__)
    ap.add_argument("--orders", type=int, default=1000, help="orders (sessions) per batch")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--pieces", type=float, default=3.0, help="mean fulfilments per order (>= 1, Poisson)")
    ap.add_argument("--lag", type=int, default=20, help="fulfilments come this many s after the order")
    ap.add_argument("--pay", type=int, default=40, help="payments come within this many s after the order")
    ap.add_argument("--wm-delay", type=int, default=30, help="watermark delay, seconds (orders workload)")
    ap.add_argument("--workload", nargs="+", choices=["orders", "funnel"], default=["orders", "funnel"])
    ap.add_argument("--jitters", type=int, nargs="+", default=[1, 300],
                    help="rows displaced by fewer than this many positions (1: none)")
    args = ap.parse_args(argv)
    before = harness.start()
    spark = harness.cq_session("multi-join-constraints", conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false"})
    root = tempfile.mkdtemp(prefix="cq_mj_constraints_")
    result = []
    print(f"# load {os.getloadavg()[0]:.2f}; {args.orders} orders (sessions) per batch, {args.batches} batches")
    print("| stream | constraints | state rows (median) | state MiB | batch ms (median) | output rows | violations |")
    print("|---|---|---|---|---|---|---|")
    base = [unique(0, "k0"), many_to_one(child=1, parent=0), unique(2, "k2")]
    try:
        for workload in args.workload:
            for j in args.jitters:
                data = os.path.join(root, f"{workload}_{j}")
                if workload == "orders":
                    k = write_orders(data, args.orders, args.batches, args.pieces, args.lag, args.pay, j)
                    bounds, wm = ((0, 1, 0, 60), (0, 2, 0, 60)), args.wm_delay
                    runs = [("unique + many_to_one + clustered(1, k)", base + [clustered(1, k)])]
                    if j == args.jitters[0]:
                        runs = [("none", None), ("unique(0) + many_to_one(1->0) + unique(2)", base)] + runs
                else:
                    k = write_funnel(data, args.orders, args.batches, j)
                    bounds, wm = ((0, 1, 0, 60), (0, 2, 0, 120)), 30
                    runs = [("none", None), ("ordered(2, k)", [ordered(2, k)])]
                for label, c in runs:
                    r = run(spark, data, bounds, wm, c, os.path.join(root, f"ck_{workload}_{j}_{len(result)}"))
                    r.update(workload=workload, jitter=j, k=k, stream=f"{workload} J={j} (k={k})", constraints=label)
                    result.append(r)
                    print(_row(r), flush=True)
                shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print(f"# load after {os.getloadavg()[0]:.2f}")
    harness.write_result("multi_join_constraints", result, args, before)


if __name__ == "__main__":
    main()
