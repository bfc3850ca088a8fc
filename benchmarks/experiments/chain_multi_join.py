"""multi_join's probe steps under the chunk scheduler, in one process (no Spark): a burst on one input of a
3-way join against a steady state; per strategy the partial matches buffered between the steps, the
process's peak RSS growth and the time, against operator-at-a-time (each step over the whole burst).

STREAM §5.3 (Motwani et al.) and Babcock et al.'s Chain applied to MJoin's probe steps
(``MultiJoinWorker._probe_in_chunks``, the code a Spark task runs per shard). The burst's rows probe input 1
(fan-out: several matches per row), then input 2 (selective). Every strategy must give the same matches
(checked: count and checksum).

Usage::

    python -m benchmarks.experiments.chain_multi_join [--state 200000] [--burst 2000000] [--chunk 65536] [--bound 131072]
"""
from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np
import pyarrow as pa

from pyspark_cq._native import load
from pyspark_cq.cost import chain
from pyspark_cq.operators._common.chunks import Schedule, worker_rss
from pyspark_cq.operators.multi_join.worker import MultiJoinConfig, MultiJoinWorker, metric_names, step_names

from .. import harness

BOUNDS = [(0, 1, 0, 600_000_000), (1, 2, 0, 600_000_000)]   # µs: 10 min, then 10 min
ORDER = [1, 2]


def state(args, rng):
    """A kernel holding ``args.state`` rows of inputs 1 and 2 on ``args.keys`` keys within an hour."""
    st = load("_mjoin").MultiJoinState(3, [list(b) for b in BOUNDS])
    for i in (1, 2):
        n = args.state if i == 1 else args.state // 20     # input 2 (purchases) is rare: step 2 is selective
        keys = rng.integers(0, args.keys, n)
        times = rng.integers(0, 3_600_000_000, n)
        st.store(i, keys, times, np.arange(n, dtype=np.int64) + i * 10**9)
    return st


def run(args, strategy, seed=1):
    rng = np.random.default_rng(seed)
    st = state(args, rng)
    keys = rng.integers(0, args.keys, args.burst)
    times = rng.integers(0, 3_600_000_000, args.burst)
    ids = np.arange(args.burst, dtype=np.int64)
    worker = MultiJoinWorker(MultiJoinConfig(3, (), (), (), pa.schema([]), tuple(BOUNDS), (), False, "bench"))
    counters = dict.fromkeys(metric_names(3), 0)
    if strategy == "operator-at-a-time":
        schedule = Schedule("fifo", args.burst, None)
    else:
        schedule = Schedule(strategy, args.chunk, args.bound, args.priorities, args.selectivities)
    rss0 = worker_rss()
    start = time.perf_counter()
    found, checksum = 0, 0
    for part in worker._probe_in_chunks(st, 0, ORDER, keys, times, ids, schedule, counters):
        found += len(part)
        checksum += int(part[:, 0].sum() % (1 << 61))
    return (time.perf_counter() - start, counters["peak_buffered_rows"], (counters["peak_worker_rss"] - rss0) / 2**20,
            counters["chunk_steps"], (found, checksum % (1 << 61)), counters)


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--state", type=int, default=200_000, help="stored rows of input 1 (input 2: 1/20)")
    parser.add_argument("--burst", type=int, default=1_000_000, help="rows arriving on input 0")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--chunk", type=int, default=65_536)
    parser.add_argument("--bound", type=int, default=131_072)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    before = harness.start()
    names = step_names(3)
    # measure the steps once (operator-at-a-time), then the Chain priorities of input 0's path, as the policy
    _, _, _, _, _, c = run(args, "operator-at-a-time")
    ops = [(c[f"probed_0_{j}"] / max(c[f"probe_nanos_0_{j}"], 1) * 1000, c[f"matched_0_{j}"] / c[f"probed_0_{j}"])
           for j in ORDER]
    prio = chain.priorities(ops)
    args.priorities = tuple(prio[ORDER.index(int(s[2]))] if s.startswith("0_") else 0.0 for s in names)
    args.selectivities = tuple(ops[ORDER.index(int(s[2]))][1] if s.startswith("0_") else 0.0 for s in names)
    print(f"{platform.node()}, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}; burst "
          f"{args.burst:,} rows on input 0, state {args.state:,} + {args.state // 20:,} rows; chunks {args.chunk:,}, "
          f"bound {args.bound:,}")
    print("steps 0>1, 0>2: capacity (partial matches / µs), selectivity:",
          [(round(a, 3), round(b, 3)) for a, b in ops], "Chain priorities:", [round(p, 4) for p in prio])
    strategies = ("operator-at-a-time",) + chain.STRATEGIES
    res = {s: [] for s in strategies}
    for _ in range(args.repeats):
        for s in strategies:
            res[s].append(run(args, s))
    base = None
    print(f"{'strategy':20s} {'time s':>7s} {'peak buffered':>14s} {'RSS growth MB':>14s} {'steps':>6s} "
          f"{'peak/base':>10s} {'time/base':>10s}")
    for s in strategies:
        t = statistics.median(r[0] for r in res[s])
        peak = statistics.median(r[1] for r in res[s])
        rss = statistics.median(r[2] for r in res[s])
        out = {r[4] for r in res[s]}
        assert len(out) == 1
        if base is None:
            base = (t, peak, out)
        assert out == base[2], f"{s} changed the matches"
        print(f"{s:20s} {t:7.2f} {peak:14,.0f} {rss:14.0f} {res[s][0][3]:6d} {peak / base[1]:10.3f} {t / base[0]:10.3f}")
    print(f"matches {base[2].pop()[0]:,} under every strategy; medians of {args.repeats}; load {os.getloadavg()[0]:.2f}")
    harness.write_result("chain_multi_join", {"steps": ops, "priorities": prio, "runs": res}, args, before)


if __name__ == "__main__":
    main()
