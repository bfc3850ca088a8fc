"""PIPES §5.4 on Spark: many registered queries over generated streams as query groups, with admission control and
window re-plans under a memory budget (Cammert et al., §4.1.1, §4.3, §5.4; docs/groups.md, "Admission control
and re-plans").

``--streams`` generated streams (rate-like parquet files, ``--files`` files of 5 minutes of event time each,
stream j with ``rows·(0.5 + j/streams)`` rows per file over ``20 + 10j`` pages and 4 regions) and ``--queries``
generated window queries (query i on stream i mod streams; windows 1 min … 30 min with slides 10 s / 1 min, filters
none / region / x, GROUP BY page or region, COUNT or SUM and COUNT; 90 % with a QoS range of their window,
``WITH (WINDOW BETWEEN … AND …)``) are added to one :class:`pyspark_cq.QueryGroup` registered with a
:class:`pyspark_cq.runtime.CQRuntime` whose memory budget is ``--budget-share`` of the estimated state of all of
them, so that admission control admits only part. The group then runs to the end of its input (``availableNow``,
one file per stream per micro-batch), the runtime's rounds after every micro-batch; after ``--drop-after``
micro-batches the budget drops to ``--drop`` of the measured state (the memory available to the system shrinks),
so the runtime re-plans windows within the QoS ranges; with ``--raise-after`` the budget rises again to
``--raise`` times the measured state after that many micro-batches, so the runtime grows the reduced windows back.

Printed and recorded: admitted / refused queries and the time of one ``add`` (compile + admission) and of one
admission alone, the slice classes, the re-plans (time, windows reduced), the state measured against the estimate
per slice class and in total at the end, and the wall time of each micro-batch.

Usage::

    python -m benchmarks.perf.pipes_groups [--streams 10] [--queries 1000] [--files 8] [--rows 3000]
        [--budget-share 0.4] [--drop-after 4] [--drop 0.8] [--raise-after 0] [--raise 4.0] [--shards 2]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

SCHEMA = "ts timestamp, page string, region string, x long"
WINDOWS = (("1 minute", "10 seconds", 60), ("2 minutes", "10 seconds", 120), ("5 minutes", "10 seconds", 300),
           ("5 minutes", "1 minute", 300), ("10 minutes", "1 minute", 600), ("15 minutes", "1 minute", 900),
           ("30 minutes", "1 minute", 1800))
FILTERS = (None, "region = 'eu'", "region = 'us'", "x < 500")
KEYS = ("page", "region")
AGGS = ("COUNT(*) AS n", "SUM(x) AS sx, COUNT(*) AS n")
SPAN_S = 300            # event time per file


def stream_rows(j: int, streams: int, rows: int) -> int:
    return int(rows * (0.5 + j / streams))


def write_streams(root: str, streams: int, files: int, rows: int, seed: int = 11) -> dict:
    """Each stream's files (5 minutes of event time each, in order); {stream: (directory, rows/s, pages)}."""
    rng = np.random.default_rng(seed)
    out = {}
    for j in range(streams):
        d = os.path.join(root, f"s{j}")
        os.makedirs(d)
        per, pages = stream_rows(j, streams, rows), 20 + 10 * j
        for f in range(files):
            ts = 1_704_067_200_000_000 + f * SPAN_S * 1_000_000 + np.sort(rng.integers(0, SPAN_S * 1_000_000, per))
            table = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                              "page": pa.array([f"p{i}" for i in rng.integers(0, pages, per)]),
                              "region": pa.array(rng.choice(np.array(["eu", "us", "ap", "other"]), per)),
                              "x": pa.array(rng.integers(0, 1000, per))})
            path = os.path.join(d, f"part-{f:03d}.parquet")
            pq.write_table(table, path)
            os.utime(path, (1_000_000 + f * 10, 1_000_000 + f * 10))
        out[f"s{j}"] = (d, per / SPAN_S, pages)
    return out


def generate(count: int, streams: int, seed: int = 5) -> list[dict]:
    """The queries: name, stream, CQL text, and what the estimate needs (window, slide, class tuple, QoS)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        stream = f"s{i % streams}"
        w, s, w_s = WINDOWS[rng.integers(len(WINDOWS))]
        where, key, aggs = FILTERS[rng.integers(len(FILTERS))], KEYS[rng.integers(len(KEYS))], AGGS[rng.integers(2)]
        slide_s = 10 if s == "10 seconds" else 60
        qos = rng.random() < 0.9 and w_s > slide_s
        low = max(slide_s, (w_s // 4) // slide_s * slide_s)
        text = (f"RSTREAM(SELECT {key}, {aggs} FROM {stream} [RANGE {w.upper()} SLIDE {s.upper()}]"
                + (f" WHERE {where}" if where else "") + f" GROUP BY {key})"
                + (f" WITH (WINDOW BETWEEN {low} SECONDS AND {w_s} SECONDS)" if qos else ""))
        out.append({"name": f"q{i}", "stream": stream, "text": text, "window": w_s, "slide": slide_s, "key": key,
                    "cls": (stream, where, key, aggs, slide_s), "qos": (low, w_s) if qos else None})
    return out


def oracle_loads(mix: list[dict]):
    """The queries as :class:`~pyspark_cq.cost.groups.MemberLoad` from the generator: classes by construction
    (equal stream, WHERE, key and aggregates), split across granularities as a group splits them
    (:func:`~pyspark_cq.cost.groups.granularity_classes`, :data:`~pyspark_cq.cost.groups.MERGE_RATIO`, in order).
    """
    from pyspark_cq.cost.groups import MERGE_RATIO, MemberLoad, granularity_classes

    S = 1_000_000
    same: dict = {}
    for i, q in enumerate(mix):
        same.setdefault(q["cls"][:-1], []).append(i)      # the class tuple without the slide
    first = {}
    for idx in same.values():
        firsts = granularity_classes([mix[i]["slide"] * S for i in idx], MERGE_RATIO)
        first.update((i, mix[idx[f]]["name"]) for i, f in zip(idx, firsts))
    out = []
    for i, q in enumerate(mix):
        lo, hi = (q["qos"][0] * S, q["qos"][1] * S) if q["qos"] else (None, None)
        out.append(MemberLoad(q["name"], first[i], q["stream"], q["window"] * S, q["slide"] * S, q["slide"] * S, lo,
                              hi, q["key"]))
    return out


def _q(xs, p):
    return round(float(np.percentile(xs, p)), 4) if xs else None


def main(argv=None):
    p = harness.parser(__doc__)
    p.add_argument("--streams", type=int, default=10)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--rows", type=int, default=3000, help="rows per file of the middle stream")
    p.add_argument("--budget-share", type=float, default=0.4)
    p.add_argument("--drop-after", type=int, default=4)
    p.add_argument("--drop", type=float, default=0.8)
    p.add_argument("--raise-after", type=int, default=0,
                   help="after this many micro-batches the budget rises to --raise of the measured state (0: never)")
    p.add_argument("--raise", dest="raise_to", type=float, default=4.0)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--row-bytes", type=float, default=64.0)
    args = p.parse_args(argv)
    if args.streams < 1 or args.queries < 1 or args.files < 2:
        raise SystemExit("--streams and --queries must be >= 1, --files >= 2")

    from pyspark_cq.cost.groups import StreamLoad, group_state_rows

    before = harness.start(args)
    root = tempfile.mkdtemp(prefix="cq-pipes-groups-")
    data = write_streams(os.path.join(root, "data"), args.streams, args.files, args.rows)
    mix = generate(args.queries, args.streams)
    keys = {s: {"page": pages, "region": 4} for s, (_, _, pages) in data.items()}
    loads = {s: StreamLoad(rate, keys=keys[s], watermark_delay=60.0, batch_span=float(SPAN_S))
             for s, (_, rate, _) in data.items()}
    all_rows = sum(group_state_rows(oracle_loads(mix), loads).values())
    budget = args.budget_share * all_rows * args.row_bytes
    print(f"{args.queries} queries over {args.streams} streams: {len({m.slice_class for m in oracle_loads(mix)})} "
          f"slice classes, "
          f"estimated state of all {all_rows:,.0f} rows = {all_rows * args.row_bytes:,.0f} B; memory budget "
          f"{budget:,.0f} B ({args.budget_share:.0%})", flush=True)

    # the cross-check of the group's slice classes: admission over the generator's classes, in the same order
    from pyspark_cq.cost.groups import admit

    # (a class across granularities forms among the queries present: the admitted ones and the candidate)
    expected, kept = 0, []
    for q in mix:
        now = oracle_loads(kept + [q])
        if admit(now[:-1], now[-1], loads, budget, args.row_bytes).accepted:
            kept.append(q)
            expected += 1

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime, QueryRejected

    spark = harness.cq_session("pipes-groups", partitions=args.shards)
    sources = {s: (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(d)
                   .withWatermark("ts", "1 minute")) for s, (d, _, _) in data.items()}
    g = cq.QueryGroup(spark, sources=sources, checkpoint=os.path.join(root, "ck"), shards=args.shards)
    rt = CQRuntime(spark, memory_budget=budget, every_batches=1)
    rt.register_group(g, trigger={"availableNow": True}, loads=loads, row_bytes=args.row_bytes)
    admission_s = []
    hook = g._admission

    def timed(*a):       # the time of the admission alone (the rest of add is compiling the query)
        t = time.perf_counter()
        try:
            return hook(*a)
        finally:
            admission_s.append(time.perf_counter() - t)

    g._admission = timed
    admitted, refused, add_s, reasons = [], [], [], []
    t_adds = time.perf_counter()
    for q in mix:
        t = time.perf_counter()
        try:
            g.add(q["name"], q["text"], sink=os.path.join(root, "out", q["name"]))
            admitted.append(q["name"])
        except QueryRejected as exc:
            refused.append(q["name"])
            if len(reasons) < 3:
                reasons.append(str(exc))
        add_s.append(time.perf_counter() - t)
    t_adds = time.perf_counter() - t_adds
    classes = {m.slice_class for m in g._loads()}
    print(f"admitted {len(admitted)}, refused {len(refused)} in {t_adds:.1f} s (add: median "
          f"{statistics.median(add_s) * 1000:.1f} ms, max {max(add_s) * 1000:.1f} ms; admission alone: median "
          f"{statistics.median(admission_s) * 1000:.2f} ms, max {max(admission_s) * 1000:.2f} ms); "
          f"{len(classes)} slice classes admitted; by the generator's classes: {expected} admitted", flush=True)
    for r in reasons[:1]:
        print(f"  e.g. {r}", flush=True)

    t0 = time.perf_counter()
    rt.start()
    dropped = raised = None
    try:
        query = rt.query(g.name)
        if args.drop_after and args.drop_after < args.files:
            rt.await_batches(g.name, args.drop_after, timeout=900)
            state = rt.group_state(g.name)
            dropped = {"after_batches": args.drop_after, "measured_bytes": state["measured_bytes"],
                       "budget_before": budget, "budget_after": args.drop * state["measured_bytes"]}
            rt.memory_budget = dropped["budget_after"]
            print(f"after {args.drop_after} micro-batches: measured {state['measured_bytes']:,} B; budget -> "
                  f"{rt.memory_budget:,.0f} B", flush=True)
        if args.raise_after and args.drop_after < args.raise_after < args.files:
            # memory is given back (PIPES §4.1.1): the state is now far below the budget, so the runtime grows
            # the reduced windows back toward their registered ones (docs/groups.md, "Re-plans")
            rt.await_batches(g.name, args.raise_after, timeout=900)
            state = rt.group_state(g.name)
            raised = {"after_batches": args.raise_after, "measured_bytes": state["measured_bytes"],
                      "budget_after": args.raise_to * state["measured_bytes"]}
            rt.memory_budget = raised["budget_after"]
            print(f"after {args.raise_after} micro-batches: measured {state['measured_bytes']:,} B; budget -> "
                  f"{rt.memory_budget:,.0f} B", flush=True)
        query.awaitTermination()
        rt.await_batches(g.name, args.files, timeout=30)
        wall = time.perf_counter() - t0
        final = rt.group_state(g.name)
        progress = [{"batch": pr["batchId"], "ms": pr["durationMs"].get("triggerExecution"),
                     "rows": pr["numInputRows"]} for pr in query.recentProgress]
    finally:
        rt.stop()
    replans = [r for r in rt.decisions_log() if r.get("kind") == "replan"]
    replan_s = [r["seconds"] for r in replans]
    batch_s = [b["ms"] / 1000 for b in progress if b["ms"] is not None and b["rows"]]
    ratios = [c["measured_rows"] / c["estimated_rows"] for c in final["classes"].values()
              if c["estimated_rows"]]
    print(f"re-plans: {len(replans)}" + (f", median {statistics.median(replan_s) * 1000:.1f} ms, max "
                                         f"{max(replan_s) * 1000:.1f} ms; windows reduced: "
                                         f"{sum(len(r['changes']) for r in replans if r.get('direction') != 'grow')}"
                                         f", grown back: "
                                         f"{sum(len(r['changes']) for r in replans if r.get('direction') == 'grow')}"
                                         if replans else ""), flush=True)
    for r in replans:
        print(f"  {r['reason']}", flush=True)
    print(f"state at the end: measured {final['measured_rows']:,} rows / {final['measured_bytes']:,} B, estimated "
          f"{final['estimated_rows']:,.0f} rows (measured / estimated {final['measured_rows'] / max(final['estimated_rows'], 1):.3f}); per class "
          f"measured / estimated: median {_q(ratios, 50)}, min {_q(ratios, 0)}, max {_q(ratios, 100)}", flush=True)
    print(f"{len(progress)} micro-batches in {wall:.1f} s; with input: median {statistics.median(batch_s):.2f} s, "
          f"max {max(batch_s):.2f} s", flush=True)
    result = {"streams": args.streams, "queries": args.queries, "classes_generated": len({q["cls"] for q in mix}),
              "estimated_rows_all": all_rows, "budget_bytes": budget, "admitted": len(admitted),
              "refused": len(refused), "admitted_by_generator_classes": expected, "refusal_examples": reasons, "classes_admitted": len(classes),
              "adds_s": round(t_adds, 2), "add_ms": {"median": _q(add_s, 50) * 1000, "max": _q(add_s, 100) * 1000},
              "admission_ms": {"median": _q(admission_s, 50) * 1000, "max": _q(admission_s, 100) * 1000},
              "budget_drop": dropped, "budget_raise": raised,
              "replans": [{k: r.get(k) for k in ("seconds", "reason", "f", "feasible", "direction")}
                          | {"changed": len(r["changes"])} for r in replans],
              "replan_ms": {"median": _q(replan_s, 50) * 1000 if replans else None,
                            "max": _q(replan_s, 100) * 1000 if replans else None},
              "state": {"measured_rows": final["measured_rows"], "measured_bytes": final["measured_bytes"],
                        "estimated_rows": final["estimated_rows"], "row_bytes": final["row_bytes"],
                        "per_class_ratio": {"median": _q(ratios, 50), "min": _q(ratios, 0), "max": _q(ratios, 100)},
                        "classes": final["classes"]},
              "batches": progress, "wall_s": round(wall, 2),
              "batch_s": {"median": _q(batch_s, 50), "max": _q(batch_s, 100)}, "load_end": os.getloadavg()[0]}
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    harness.write_result("pipes_groups", result, args, before)


if __name__ == "__main__":
    main()
