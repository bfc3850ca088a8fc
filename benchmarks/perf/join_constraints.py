"""Interval join with and without stream constraints (STREAM §5.2, issue 43): state rows and batch time.

STREAM's example workload: orders (left, one row per order id) and fulfilments (right, ``--pieces`` rows per order
on average, each within ``--spread`` seconds after its order). The query cannot assume that order, so its band is
symmetric: ``|fulfilment.ts - order.ts| <= --band`` seconds; watermark delay ``--wm-delay`` seconds on both inputs.
One parquet file per side and micro-batch (``maxFilesPerTrigger=1``), ``--orders`` orders per batch, 10 s of event
time per batch.

Runs (one query each, ``interval_join``, noop sink):

- ``none``: no constraints;
- ``m2o d=<D>``: ``many_to_one(child="right", parent="left", delay=D)`` on streams where a fraction
  ``--early`` of the fulfilments arrive up to D seconds (whole batches) *before* their order (the adherence
  parameter: D = 0 is the paper's "orders always come first"). ``--delays`` sweeps D; each D's stream adheres
  to its constraint, and the ``none`` run of the same stream gives the output row count that must be equal.

``--workload clustered`` (the adherence-k sweep, STREAM: "the closer the streams adhere ... the smaller the
required synopses"): the same orders, each order's ``--pieces`` fulfilments shipped together ``--lag`` s after it,
clustered by order id and displaced by fewer than ``J`` rows (``--jitters``); the fulfilments' adherence k is
measured (:func:`pyspark_cq.experiments.constraint_streams.clustered_k`) and declared:
``many_to_one(child="right", parent="left")`` + ``clustered("right", k)`` (the orders go when their fulfilments'
cluster closes), against ``none`` and ``many_to_one`` alone on the k = 0 stream.

``--workload funnel`` (the click -> purchase funnel): ``--orders`` sessions per batch (ids in start order), 1 +
Poisson(3) clicks (left) in each session's first 30 s, one session in three buys (right) 40 s after its start, the
purchases in session order displaced by fewer than ``J`` rows; the join: a purchase within 0-120 s after a click,
watermark delay 30 s; ``ordered("right", k)`` with the measured k (a session's clicks go once the purchases are
k + 1 rows past it), against ``none`` on the same stream (a larger displacement moves purchases out of the band).

Prints per run the median state rows and state bytes over the second half of the batches (the steady state), the
median batch time (triggerExecution), output rows and ``constraint_violations``; ``--plot`` writes state rows
against k (matplotlib). The machine may be shared: quote the load printed before and after.

Usage::

    python -m benchmarks.perf.join_constraints [--orders 2000] [--batches 30] [--delays 0 30 60]
    python -m benchmarks.perf.join_constraints --workload clustered funnel --jitters 1 100 3000 20000 --plot docs/x.png
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

BASE_US = 1_700_000_000_000_000
BATCH_S = 10


def write_input(root: str, orders: int, batches: int, pieces: float, spread: int, early: float, delay: int,
                seed: int = 0) -> None:
    """Order and fulfilment files, one per batch and side. A fulfilment is written to the file of the batch its
    time falls in; with probability ``early`` (when ``delay`` > 0) to one up to ``delay`` s earlier instead, and
    never before its order's batch minus ``delay`` (so the stream adheres to ``many_to_one(..., delay)``).
    """
    rng = np.random.default_rng(seed)
    files = [([], []) for _ in range(batches)]
    oid = 0
    for b in range(batches):
        t = BASE_US + b * BATCH_S * 1_000_000 + rng.integers(0, BATCH_S * 1_000_000, orders)
        ids = np.arange(oid, oid + orders)
        oid += orders
        files[b][0].append((ids, t))
        n = rng.poisson(pieces - 1, orders) + 1
        fid = np.repeat(ids, n)
        ft = np.repeat(t, n) + rng.integers(0, spread * 1_000_000, int(n.sum()))
        at = (ft - BASE_US) // (BATCH_S * 1_000_000)
        if delay > 0:
            ahead = rng.integers(1, max(delay // BATCH_S, 1) + 1, len(at))
            at = np.where(rng.random(len(at)) < early, np.maximum(b - ahead, b - delay // BATCH_S), at)
        at = np.clip(at, 0, batches - 1)
        for a in np.unique(at):
            m = at == a
            files[int(a)][1].append((fid[m], ft[m]))
    def joined(parts):
        if not parts:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    _write_files(root, [tuple(joined(parts) for parts in sides) for sides in files], rng)


def _write_files(root: str, files, rng=None) -> None:
    """Per batch ``((left keys, left µs), (right keys, right µs))``: one parquet file per side and batch, with a
    random payload column from ``rng`` (default: seeded 1)."""
    rng = np.random.default_rng(1) if rng is None else rng
    for b, sides in enumerate(files):
        for side, (k, ts) in zip("lr", sides):
            table = pa.table({"k": pa.array(k, pa.int64()), "ts": pa.array(ts, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")), f"{side}v": pa.array(rng.integers(0, 1 << 40, len(k)), pa.int64())})
            os.makedirs(os.path.join(root, side), exist_ok=True)
            path = os.path.join(root, side, f"b{b:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + b * 10,) * 2)   # file order = batch order


def _by_batch(keys: np.ndarray, times: np.ndarray, batches: int) -> list:
    """Rows into the batch their time falls in (the last batch takes the rest)."""
    at = np.clip((times - BASE_US) // (BATCH_S * 1_000_000), 0, batches - 1)
    return [(keys[at == b], times[at == b]) for b in range(batches)]


def write_clustered(root: str, orders: int, batches: int, pieces: float, lag: int, jitter: int, seed: int = 0) -> int:
    """Orders one every ``BATCH_S / orders`` s; their fulfilments (1 + Poisson(pieces - 1) each) clustered by
    order id, displaced by < ``jitter`` rows, ``lag`` s after the order, times increasing along the sequence (so
    arrival order = event-time order). Returns the fulfilments' adherence k.
    """
    from pyspark_cq.experiments import constraint_streams as S

    rng = np.random.default_rng(seed)
    n = orders * batches
    step = BATCH_S * 1_000_000 // orders
    ot = BASE_US + np.arange(n, dtype=np.int64) * step
    seq = S.clustered_keys(np.arange(n), rng.poisson(pieces - 1, n) + 1, jitter, rng)
    ft = BASE_US + lag * 1_000_000 + (np.arange(len(seq)) * (step / pieces)).astype(np.int64)
    _write_files(root, list(zip(_by_batch(np.arange(n), ot, batches), _by_batch(seq, ft, batches))))
    return S.clustered_k(seq)


def write_funnel(root: str, sessions: int, batches: int, jitter: int, seed: int = 0) -> int:
    """Sessions one every ``BATCH_S / sessions`` s, 1 + Poisson(3) clicks in their first 30 s; every third session
    buys once, 40 s after its start, the purchases in session order displaced by < ``jitter`` rows (times
    increasing along the sequence). Returns the purchases' adherence k.
    """
    from pyspark_cq.experiments import constraint_streams as S

    rng = np.random.default_rng(seed)
    n = sessions * batches
    step = BATCH_S * 1_000_000 // sessions
    clicks = rng.poisson(3, n) + 1
    ck = np.repeat(np.arange(n), clicks)
    ct = BASE_US + ck * step + rng.integers(0, 30_000_000, len(ck))
    order = np.argsort(ct, kind="stable")
    seq = S.ordered_keys(np.arange(0, n, 3), jitter, rng)
    pt = BASE_US + 40_000_000 + np.arange(len(seq), dtype=np.int64) * 3 * step
    _write_files(root, list(zip(_by_batch(ck[order], ct[order], batches), _by_batch(seq, pt, batches))))
    return S.ordered_k(seq)


def run(spark, root: str, band, wm_delay: int, constraint, ck: str) -> dict:
    """One query to the end; medians over the second half of the batches. ``band``: +- seconds, or (lower,
    upper) seconds; ``constraint``: None, one constraint or a list."""
    import pyspark_cq

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", f"{wm_delay} seconds"))

    lower, upper = (-band, band) if isinstance(band, int) else band
    declared = None if constraint is None else (list(constraint) if isinstance(constraint, list) else [constraint])
    df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", f"{lower} seconds", f"{upper} seconds",
                                  suffixes=("_l", "_r"), name="constraints", constraints=declared)
    return run_to_end(df, ck, "constraints")


def run_to_end(df, ck: str, name: str) -> dict:
    """Run ``df`` (a join named ``name``) to the end into a noop sink: its state (medians over the second half of
    the batches), batch time, output rows and violations (also used by ``multi_join_constraints``)."""
    import pyspark_cq

    q = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    start = time.perf_counter()
    q.awaitTermination()
    wall = time.perf_counter() - start
    progress = [json.loads(p.json) for p in q.recentProgress]
    pairs = [(p, pyspark_cq.read_metrics(p, name) or {}) for p in progress]
    pairs = [(p, r) for p, r in pairs if r]
    steady = pairs[len(pairs) // 2:]
    return {"wall_s": wall, "batches": len(pairs),
            "state_rows": statistics.median(r["state_rows"] for _, r in steady),
            "state_bytes": statistics.median(r["state_bytes"] for _, r in steady),
            "batch_ms": statistics.median(p["durationMs"].get("triggerExecution", 0) for p, _ in steady),
            "output_rows": sum(r["output_rows"] for _, r in pairs),
            "violations": sum(r.get("constraint_violations", 0) for _, r in pairs)}


def _row(r: dict) -> str:
    return (f"| {r['stream']} | {r['constraints']} | {r['state_rows']:,.0f} | {r['state_bytes'] / 2**20:.2f} | "
            f"{r['batch_ms']:.0f} | {r['output_rows']:,} | {r['violations']} |")


def sweep(spark, root: str, args, workload: str) -> list:
    """The adherence sweep of one workload: the stream per jitter, its measured k declared."""
    from pyspark_cq.constraints import clustered, many_to_one, ordered

    out = []
    for j in args.jitters:
        data = os.path.join(root, f"{workload}_{j}")
        if workload == "clustered":
            k = write_clustered(data, args.orders, args.batches, args.pieces, args.lag, j)
            runs = [(f"m2o + clustered(k={k})", [many_to_one("right", "left"), clustered("right", k)])]
            if j == args.jitters[0]:
                runs = [("none", None), ("many_to_one", many_to_one("right", "left"))] + runs
            band, wm = args.band, args.wm_delay
        else:
            k = write_funnel(data, args.orders, args.batches, j)
            # the purchases' displacement changes which pairs fall in the band: each stream its own run without
            runs = [("none", None), (f"ordered(k={k})", [ordered("right", k)])]
            band, wm = (0, 120), 30
        for label, c in runs:
            r = run(spark, data, band, wm, c, os.path.join(root, f"ck_{workload}_{j}_{len(out)}"))
            r.update(workload=workload, jitter=j, k=k, stream=f"{workload} J={j} (k={k})", constraints=label)
            out.append(r)
            print(_row(r), flush=True)
        shutil.rmtree(data, ignore_errors=True)
    return out


def plot(result: list, path: str) -> None:
    """State rows (median) against the measured adherence k, per workload, the run without constraints dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for workload, label in (("clustered", "orders ⋈ fulfilments: many_to_one + clustered(k)"),
                            ("funnel", "clicks ⋈ purchases: ordered(k)")):
        runs = [r for r in result if r.get("workload") == workload]
        swept = sorted((r["k"], r["state_rows"]) for r in runs if r["constraints"] not in ("none", "many_to_one"))
        if not swept:
            continue
        line, = ax.plot([max(k, 1) for k, _ in swept], [s for _, s in swept], "o-", label=label)
        plain = [r["state_rows"] for r in runs if r["constraints"] == "none"]
        if plain:
            ax.axhline(plain[0], color=line.get_color(), ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("adherence k of the constrained input (rows; k = 0 plotted at 1)")
    ax.set_ylabel("join state rows (median, steady state)")
    ax.set_title("STREAM §5.2: state against adherence (dashed: no constraints)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    from pyspark_cq.constraints import many_to_one

    ap = harness.parser(__doc__)
    ap.add_argument("--orders", type=int, default=2000, help="orders per batch")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--pieces", type=float, default=4.0, help="mean fulfilments per order (>= 1, Poisson)")
    ap.add_argument("--spread", type=int, default=50, help="fulfilments come within this many s after the order")
    ap.add_argument("--band", type=int, default=60, help="the join's band: +- this many seconds")
    ap.add_argument("--wm-delay", type=int, default=90, help="watermark delay, seconds")
    ap.add_argument("--early", type=float, default=0.3, help="fraction of fulfilments arriving before the order")
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 30, 60], help="adherence sweep: delay bounds, s")
    ap.add_argument("--workload", nargs="+", choices=["delay", "clustered", "funnel"], default=["delay"])
    ap.add_argument("--jitters", type=int, nargs="+", default=[1, 100, 3000, 20000],
                    help="clustered / funnel: rows are displaced by fewer than this many positions (1: none)")
    ap.add_argument("--lag", type=int, default=20, help="clustered: fulfilments come this many s after the order")
    ap.add_argument("--plot", default=None, help="write state rows against k to this png (matplotlib)")
    args = ap.parse_args(argv)
    before = harness.start()
    spark = harness.cq_session("join-constraints", conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false"})
    root = tempfile.mkdtemp(prefix="cq_constraints_")
    result = []
    print(f"# load {os.getloadavg()[0]:.2f}; {args.orders} orders per batch, {args.pieces} fulfilments per order, "
          f"band +-{args.band} s, watermark delay {args.wm_delay} s, {args.batches} batches, early {args.early}")
    print("| stream (delay D) | constraints | state rows (median) | state MiB | batch ms (median) | output rows | "
          "violations |")
    print("|---|---|---|---|---|---|---|")
    try:
        for workload in [w for w in args.workload if w != "delay"]:
            result += sweep(spark, root, args, workload)
        for d in (args.delays if "delay" in args.workload else []):
            data = os.path.join(root, f"in_{d}")
            write_input(data, args.orders, args.batches, args.pieces, args.spread, args.early, d)
            for label, c in (("none", None), (f"many_to_one(delay={d} s)", many_to_one("right", "left", f"{d} seconds"))):
                r = run(spark, data, args.band, args.wm_delay, c, os.path.join(root, f"ck_{d}_{c is None}"))
                r.update(delay_s=d, constraints=label)
                result.append(r)
                print(f"| D = {d} s | {label} | {r['state_rows']:,.0f} | {r['state_bytes'] / 2**20:.1f} | "
                      f"{r['batch_ms']:.0f} | {r['output_rows']:,} | {r['violations']} |", flush=True)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print(f"# load after {os.getloadavg()[0]:.2f}")
    if args.plot:
        plot(result, args.plot)
    harness.write_result("join_constraints", result, args, before)


if __name__ == "__main__":
    main()
