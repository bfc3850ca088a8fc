"""Per-batch cost of one interval-join shard call as its state grows: full image vs changelog vs files (issue 39).

Drives ``JoinWorker.streaming`` as PySpark 4.3's worker does (``join_worker_profile``: PySpark's own
arrow -> pandas conversion of the shard's rows, a ``GroupState`` built from the value the previous call
wrote, the value pickled and unpickled in between), one shard holding the whole state, ``--rows`` input
rows per batch (half a side), keys drawn from ``--keys``, event time advancing so that nothing is evicted:
the state grows by ``--rows`` each batch up to ``--batches * --rows`` rows. Per layout
(``state_persistence="full"`` and ``"changelog"`` with ``--every``) it prints, for bins of state size,
the median of the function's time, its restore / save steps, the value's MB (what the JVM copies each
batch: ~20-30 ms per MB for a ``binary`` state in PySpark 4.3, docs/benchmark-log-2026.md) and the
Python-side pickle round trip of the value. Outside Spark: the JVM's share is measured by
``join_state_sweep``.

Usage::

    python -m benchmarks.perf.join_resident_profile [--rows 50000] [--batches 40] [--keys 1000000] [--every 10]
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

from .. import harness
from .join_worker_profile import _state, _tagged, _worker

TZ = "UTC"
BASE_US = 1_700_000_000_000_000


def batches(rows: int, n: int, keys: int, seed: int = 0):
    """``n`` Arrow batches of the shard's tagged union (``rows`` rows, half a side), 1 s of event time each."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n):
        parts = []
        for side in (0, 1):
            m = rows // 2
            ts = BASE_US + b * 1_000_000 + rng.integers(0, 1_000_000, m)
            table = pa.table({"k": pa.array(rng.integers(0, keys, m), pa.int64()),
                              "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              "v": pa.array(rng.integers(0, 1 << 40, m), pa.int64())})
            parts.append(_tagged(table, side))
        out.append(pa.concat_tables(parts).combine_chunks().to_batches()[0])
    return out


def _timed(acc: dict):
    """Wrap the restore and save steps of the join worker with timers (seconds summed into ``acc``)."""
    from pyspark_cq.operators.join import worker as J

    originals = {}
    for name in ("_restore_log", "_save", "_save_log", "_process"):
        fn = J.JoinWorker.__dict__[name]
        originals[name] = fn

        def timed(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t
        setattr(J.JoinWorker, name, timed)
    return originals


def run(data, persistence: str, every: int):
    """One pass (``persistence``: ``full``, ``changelog``, ``files`` (state files in a temporary directory), or
    ``changelog-miss`` / ``files-miss``: the resident copy dropped before every call, so each call restores
    the snapshot and replays the deltas; ``files-alternate``: two Python workers taking turns, each with its own
    resident cache, so each call finds the copy of two calls before and catches up on the delta it missed, or
    restores after a snapshot): per call (state rows before, seconds of the function, of restore, of save, of
    processing, value bytes, pickle round trip seconds, cache hit, catch-up).
    """
    import pandas as pd
    from pyspark.sql.conversion import ArrowBatchTransformer

    from pyspark_cq.operators._common import resident
    from pyspark_cq.operators.join.driver import _STATE_SCHEMA
    from pyspark_cq.vocabulary import metrics as M

    resident.cache().clear()
    miss, alternate = persistence.endswith("-miss"), persistence.endswith("-alternate")
    persistence = persistence.removesuffix("-miss").removesuffix("-alternate")
    own_cache = resident._CACHE
    caches = [resident.ResidentCache(resident.limit_bytes()) for _ in range(2)]
    worker, _ = _worker(1)
    state_dir = tempfile.mkdtemp(prefix="cq_profile_state_") if persistence == "files" else None
    worker.config = dataclasses.replace(worker.config, persistence=persistence, snapshot_every=every,
                                        state_id="profile" if persistence != "full" else "", state_dir=state_dir)
    acc: dict = {}
    originals = _timed(acc)
    value, rows_before, out = None, 0, []
    try:
        for i, batch in enumerate(data):
            series = ArrowBatchTransformer.to_pandas(batch, timezone=TZ, struct_in_pandas="dict")
            state = _state(value, 0)
            if miss:
                resident.cache().clear()
            if alternate:
                resident._CACHE = caches[i % 2]
            acc.clear()
            t0 = time.perf_counter()
            (row,) = list(worker.streaming((0,), iter([pd.concat(series, axis=1)]), state))
            t1 = time.perf_counter()
            value = pickle.loads(pickle.dumps(_STATE_SCHEMA.toInternal(state._value)))
            t2 = time.perf_counter()
            hit = int(row["__cq_" + M.STATE_CACHE_HITS].iloc[0])
            caught_up = int(row["__cq_" + M.STATE_CACHE_CATCH_UPS].iloc[0])
            out.append((rows_before, t1 - t0, acc.get("_restore_log", 0.0),
                        acc.get("_save", 0.0) + acc.get("_save_log", 0.0),
                        acc.get("_process", 0.0),
                        sum(len(v) for v in value), t2 - t1, hit, caught_up))
            rows_before = int(row["__cq_" + M.STATE_ROWS].iloc[0])
    finally:
        resident._CACHE = own_cache
        from pyspark_cq.operators.join import worker as J
        for name, fn in originals.items():
            setattr(J.JoinWorker, name, fn)
        if state_dir is not None:
            shutil.rmtree(state_dir, ignore_errors=True)
    return out


def summarize(calls, bins):
    """Medians per state-size bin ``(lo, hi]`` of rows before the call."""
    rows = []
    for lo, hi in bins:
        sel = [c for c in calls if lo < c[0] <= hi]
        if not sel:
            continue
        med = [statistics.median(c[i] for c in sel) for i in range(1, 7)]
        rows.append({"state_rows": f"{lo / 1e6:.2f}-{hi / 1e6:.2f} M", "calls": len(sel),
                     "function_ms": med[0] * 1e3, "function_mean_ms": statistics.mean(c[1] for c in sel) * 1e3, "restore_ms": med[1] * 1e3, "save_ms": med[2] * 1e3,
                     "process_ms": med[3] * 1e3, "value_mb": med[4] / 2**20, "pickle_ms": med[5] * 1e3,
                     "hits": sum(c[7] for c in sel), "catch_ups": sum(c[8] for c in sel)})
    return rows


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=50_000, help="input rows per batch (half a side)")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=10, help="changelog: snapshot_every")
    ap.add_argument("--layouts", nargs="*", default=["full", "changelog"], choices=["full", "changelog", "files", "changelog-miss", "files-miss", "files-alternate"])
    args = ap.parse_args(argv)
    before = harness.start()
    os.environ.setdefault("NUMBA_CACHE_DIR", "/tmp/numba_cq")
    data = batches(args.rows, args.batches, args.keys)
    run(data[:3], "full", args.every)   # imports, native module
    top = args.rows * args.batches
    edges = [0, top // 8, top // 4, top // 2, top * 3 // 4, top]
    bins = list(zip(edges[:-1], edges[1:]))
    result = {}
    print(f"# load {os.getloadavg()[0]:.2f}; {args.rows} rows per batch, up to {top / 1e6:.1f} M rows of state")
    for layout in args.layouts:
        calls = run(data, layout, args.every)
        result[layout] = {"calls": calls, "bins": summarize(calls, bins)}
        print(f"## {layout}" + (f" (snapshot_every={args.every})" if layout != "full" else ""))
        print("| state rows | calls | function ms | (mean) | restore ms | save ms | process ms | value MB | pickle ms | hits "
              "| catch-ups |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in result[layout]["bins"]:
            print(f"| {r['state_rows']} | {r['calls']} | {r['function_ms']:.0f} | {r['function_mean_ms']:.0f} | "
                  f"{r['restore_ms']:.0f} | "
                  f"{r['save_ms']:.0f} | {r['process_ms']:.0f} | {r['value_mb']:.1f} | {r['pickle_ms']:.1f} | "
                  f"{r['hits']} | {r['catch_ups']} |", flush=True)
    print(f"# load after {os.getloadavg()[0]:.2f}")
    harness.write_result("join_resident_profile", result, args, before)


if __name__ == "__main__":
    main()
