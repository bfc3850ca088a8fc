"""Where our interval join's micro-batch goes that its floor shape's does not (issue 14): Spark's own metrics.

Runs, in one session with the Spark UI on (its REST API only), on the data of ``small_batches.py --only join``
(``join_vs_spark.write_streams``: ``--rows`` rows per side and batch, ``--keys`` keys, ±30 s, watermark delay
4 minutes): our ``interval_join`` and the floor shape that carries as many state bytes per batch as ours
reported (``small_batches.join_floor``, i.e. ``floor_shapes.join_shape``); ``--shapes`` may add the floor
with a few bytes of state (``floor``), and floor variants that add one part of ours each (:func:`floor_variant`:
``floor_tail``, our output path; ``floor_state3``, a state of three binary fields). For every micro-batch it
reads from the REST API

* the SQL execution of the batch (``/sql/<id>?details=true``): its duration and every plan node's SQL
  metrics (Python time and data sent / returned, groups, timed-out groups, state rows, update / removal /
  commit times, shuffle, rows through explode / observe ...), the totals over tasks;
* the stages of its jobs (``/stages/<id>``): wall time (submission to completion), executor run / CPU /
  deserialize / GC / result-serialization times, shuffle read / write, tasks;
* the query progress: ``durationMs`` phases and the state operator's times.

Printed: per metric the median over the steady batches (the first ``--skip`` and the last, no-data, batch
left out) for each shape, and ours minus the floor's. Nodes are named ``<node name>`` (``#2`` ... when the
name repeats in a plan); stages by their order in the batch (``stage0`` the shuffle's map side, the last
one the stateful operator's side). ``--all`` prints also the metrics equal in both, ``--json`` writes the
per-batch values.

``--trace`` also times each Python task inside Spark's worker (``worker_trace/sitecustomize.py``, put on the
workers' ``PYTHONPATH``): blocked on the JVM's input, producing output, our function and its steps (those
``join_worker_profile.py`` times outside Spark), writing, CPU; ``--calibrate`` adds a fixed loop timed in
each task and in this process, to compare the CPU speed a worker gets with the profile's.

Usage::

    python -m benchmarks.perf.join_gap_metrics [--rows 5000] [--files 12] [--keys 200000] [--shapes ours,floor_state]
                                          [--port 4050] [--all] [--json out.json] [--trace [--calibrate]]
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request

from .. import common, harness
from ..common import join_shape

DELAY = "4 minutes"
_UNITS = {"ns": 1e-6, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3, "min": 60e3,
          "B": 1.0, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# stage fields of the REST API kept per stage (times in ms unless named *Time in ns below)
_STAGE_FIELDS = ("executorRunTime", "executorCpuTime", "executorDeserializeTime", "jvmGcTime",
                 "resultSerializationTime", "shuffleReadBytes", "shuffleReadRecords", "shuffleWriteBytes",
                 "shuffleWriteRecords", "shuffleWriteTime", "shuffleFetchWaitTime", "inputBytes", "inputRecords",
                 "outputRecords", "memoryBytesSpilled", "peakExecutionMemory", "numTasks")
_NS_FIELDS = ("executorCpuTime", "shuffleWriteTime")


def parse_value(text: str) -> float | None:
    """A SQL metric's display string as a number: the total (first value after the header line), times in
    ms, sizes in bytes, counts as counts. None when it is not a number."""
    text = text.split("\n")[-1].strip()
    m = re.match(r"^(-?[\d,]*\.?\d+)\s*([A-Za-z]+)?", text)
    if not m:
        return None
    value = float(m.group(1).replace(",", ""))
    unit = m.group(2)
    return value * _UNITS.get(unit, 1.0) if unit else value


def _get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=60) as r:
        return json.load(r)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session(port: int, partitions: int = 2):
    import pyspark_cq

    spark = pyspark_cq.spark("local[2]", "join-gap-metrics", shuffle_partitions=partitions, ui=True, conf={
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
        "spark.driver.memory": "4g",
        "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
        "spark.ui.port": str(port), "spark.port.maxRetries": "0",
        "spark.sql.ui.retainedExecutions": "10000", "spark.ui.retainedJobs": "10000",
        "spark.ui.retainedStages": "10000", "spark.ui.retainedTasks": "1000000",
    })
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _executions(base: str) -> list[dict]:
    return _get(base, "/sql?details=true&planDescription=false&offset=0&length=100000")


def _settled(base: str, known: set[int], timeout=30.0) -> list[dict]:
    """The executions not in ``known``, once the listener has seen all of them end."""
    deadline = time.time() + timeout
    while True:
        new = [e for e in _executions(base) if e["id"] not in known]
        if all(e["status"] != "RUNNING" for e in new) or time.time() > deadline:
            return sorted(new, key=lambda e: e["id"])
        time.sleep(0.5)


def node_metrics(execution: dict) -> dict[str, float]:
    """``"<node>: <metric>"`` -> total, for every numeric SQL metric of the execution's plan."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for node in sorted(execution.get("nodes", []), key=lambda n: n["nodeId"]):
        name = node["nodeName"]
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        for m in node.get("metrics", []):
            v = parse_value(m["value"])
            if v is not None:
                out[f"{label}: {m['name']}"] = v
    return out


def stage_metrics(base: str, execution: dict) -> dict[str, float]:
    """``"stage<i>: <field>"`` for the stages of the execution's jobs (in stage id order), plus their wall."""
    stage_ids = []
    for job in sorted(execution.get("successJobIds", []) + execution.get("failedJobIds", [])):
        stage_ids += _get(base, f"/jobs/{job}")["stageIds"]
    out: dict[str, float] = {}
    for i, sid in enumerate(sorted(set(stage_ids))):
        attempts = [a for a in _get(base, f"/stages/{sid}") if a.get("status") == "COMPLETE"]
        if not attempts:   # skipped stages
            continue
        a = attempts[0]
        for f in _STAGE_FIELDS:
            if f in a:
                out[f"stage{i}: {f}"] = a[f] * (1e-6 if f in _NS_FIELDS else 1.0)
        if a.get("submissionTime") and a.get("completionTime"):
            out[f"stage{i}: wall"] = (_ts(a["completionTime"]) - _ts(a["submissionTime"]))
        if a.get("firstTaskLaunchedTime") and a.get("submissionTime"):
            out[f"stage{i}: submit->first task"] = _ts(a["firstTaskLaunchedTime"]) - _ts(a["submissionTime"])
        out[f"stage{i}: count"] = 1
    out["stages"] = len([k for k in out if k.endswith(": count")])
    return out


def floor_variant(left, right, per_shard, tail=False, fields=1):
    """``floor_shapes.join_shape`` with one of our operator's parts added, to price it alone: ``tail``, our
    output path (the function returns ``_metrics.packed_row`` frames, an empty table and the join's counters,
    then ``_metrics.attach_packed``: observe + explode(arrays_zip) + the output projection); ``fields=3``, a
    state of three binary fields (as ours: kernel, left, right) carrying the same bytes.
    """
    import numpy as np
    import pandas as pd
    from pyspark.sql import types as T
    from pyspark.sql.streaming.state import GroupStateTimeout

    from pyspark_cq.operators import join as J
    from pyspark_cq.operators._common import metrics as _metrics
    from pyspark_cq.operators.join.spec import JoinSpec
    from pyspark_cq.operators.join.worker import METRICS

    spec = JoinSpec.build(left, right, "k", "ts", "ts", "inner", ("_l", "_r"), None, None, "floor", None)
    union = _metrics.observe_input(J._tagged(spec, J.LEFT, True).union(J._tagged(spec, J.RIGHT, True)), "floor")
    per_shard = [int(b) // spec.shards for b in per_shard]
    blob = np.random.default_rng(0).integers(0, 255, max(per_shard) + 1, dtype=np.uint8).tobytes()
    out_schema = spec.output_schema()
    out_arrow = _metrics.arrow_schema(out_schema)

    def fn(key, pdfs, state):
        seen = state.get[-1] if state.exists else 0
        rows = sum(len(p) for p in pdfs)
        n = per_shard[min(seen, len(per_shard) - 1)]
        cuts = [0, n // 3, 2 * n // 3, n][:: 3 // fields] if fields in (1, 3) else [0, n]
        state.update(tuple(blob[a:b] for a, b in zip(cuts, cuts[1:])) + (seen + 1,))
        state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1) + 3_600_000)
        if tail:
            yield _metrics.packed_row(None, out_arrow, METRICS, input_rows=rows)
        else:
            yield pd.DataFrame({"rows": [rows], "read": [0]})

    st = T.StructType([T.StructField(f"b{i}", T.BinaryType()) for i in range(fields)]
                      + [T.StructField("n", T.LongType())])
    out = _metrics.packed_schema(out_schema, METRICS) if tail else "rows long, read long"
    packed = union.groupBy(*J._group_cols(spec)).applyInPandasWithState(fn, out, st, "append",
                                                                       GroupStateTimeout.EventTimeTimeout)
    return _metrics.attach_packed(packed, "floor_out", out_schema, METRICS) if tail else packed


def _ts(text: str) -> float:
    """A REST API time (``2026-11-26T22:30:19.123GMT``) in ms."""
    from datetime import datetime, timezone

    return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp() * 1e3


def progress_metrics(p: dict) -> dict[str, float]:
    out = {f"progress: {k}": v for k, v in p["durationMs"].items()}
    for i, op in enumerate(p.get("stateOperators") or []):
        for k, v in op.items():
            if isinstance(v, (int, float)):
                out[f"state op{i}: {k}"] = v
        for k, v in (op.get("customMetrics") or {}).items():
            out[f"state op{i}: {k}"] = v
    out["progress: numInputRows"] = p.get("numInputRows", 0)
    out["progress: sink rows"] = (p.get("sink") or {}).get("numOutputRows", -1)
    return out


def run_shape(spark, base: str, df, checkpoint: str) -> list[dict[str, float]]:
    """One streaming run: per batch (in order) all metrics above in one dict, and the progress."""
    known = {e["id"] for e in _executions(base)}
    _, progress = common.run_query(spark, df, checkpoint)
    new = _settled(base, known)
    # The micro-batch executions are the ones that ran jobs; map them to batches in order.
    batches = [e for e in new if e.get("successJobIds")]
    if len(batches) != len(progress):
        print(f"  note: {len(batches)} executions with jobs for {len(progress)} batches "
              f"(of {len(new)} executions); pairing in order", flush=True)
    rows = []
    for p, e in zip(progress, batches):
        m = progress_metrics(p)
        m["sql: execution duration"] = e.get("duration", 0)
        m["_start"] = _ts(e["submissionTime"]) / 1e3
        m["_end"] = m["_start"] + e.get("duration", 0) / 1e3
        m.update(node_metrics(e))
        m.update(stage_metrics(base, e))
        rows.append(m)
    return rows, progress


def add_trace(rows: list[dict], path: str) -> None:
    """Add to each batch the sums over its Python tasks of the worker trace (``worker_trace/sitecustomize.py``):
    seconds in ms. A task belongs to the batch whose SQL execution was running when the task started."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    for t in tasks:
        if "t0" not in t:
            continue
        for r in rows:
            if r["_start"] <= t["t0"] <= r["_end"]:
                break
        else:
            continue
        parts = {"tasks": 1, "processing (dump_stream)": t.get("dump", 0) * 1e3,
                 "blocked reading input + Arrow decode": t["read"] * 1e3,
                 "producing output minus reading": (t["produce"] - t["read"]) * 1e3,
                 "writing output": (t.get("dump", 0) - t["produce"]) * 1e3,
                 "our function (incl. its pandas input)": t["udf"] * 1e3, "our function calls": t.get("calls", 0),
                 "process CPU": t.get("cpu", 0) * 1e3, "main thread CPU": t.get("tcpu", 0) * 1e3,
                 "start -> first input batch": (t["first_in"] - t["t0"]) * 1e3 if "first_in" in t else 0,
                 "input batches": t["batches_in"], "output batches": t["batches_out"]}
        parts.update({k: v * 1e3 for k, v in t.items() if k.startswith("step ")})
        parts.update({k: v * (1e3 if k.endswith("time") else 1) for k, v in t.items() if k.startswith("udf ru_")})
        for when in ("calib", "calib_end"):   # a fixed loop's time in the worker (the CPU speed it got)
            if when in t:   # at the first input batch and after the task's output; per task (2 a batch)
                for i, what in enumerate(("python wall", "python CPU", "numpy sort wall", "numpy sort CPU")):
                    parts[f"{when}: {what} (per task)"] = t[when][i] * 1e3 / 2
        for k, v in parts.items():
            r[f"py worker: {k}"] = r.get(f"py worker: {k}", 0) + v
        if "state types" in t:
            print(f"  state value types in the worker: {t['state types']}", flush=True) if not r.get("_types") else None
            r["_types"] = 1


def medians(rows: list[dict], skip: int) -> dict[str, float]:
    steady = rows[skip:-1] or rows
    keys = {k for r in steady for k in r if not k.startswith("_")}
    return {k: statistics.median(r.get(k, 0) for r in steady) for k in keys}


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, default=5000, help="rows per micro-batch and side")
    ap.add_argument("--files", type=int, default=12, help="micro-batches")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--shapes", default="ours,floor_state", help="comma list of: ours, floor_state, floor, floor_tail (floor_state + our output "
                         "path), floor_state3 (floor_state with a state of 3 binary fields); see floor_variant")
    ap.add_argument("--skip", type=int, default=2, help="leading batches left out of the medians")
    ap.add_argument("--keep-trace", default=None, help="with --trace: copy the per-task trace (JSON lines) here")
    ap.add_argument("--partitions", type=int, default=2,
                    help="shuffle partitions: stateful tasks per batch (the join's shards are twice this)")
    ap.add_argument("--port", type=int, default=0, help="Spark UI port (0: a free one)")
    ap.add_argument("--all", action="store_true", help="print metrics equal in all shapes too")
    ap.add_argument("--trace", action="store_true",
                    help="also time each Python task inside the worker (worker_trace/sitecustomize.py on the "
                         "workers' PYTHONPATH): reading input, producing output, our function, writing, CPU")
    ap.add_argument("--calibrate", action="store_true",
                    help="with --trace: time a fixed loop in each Python task (and here), to compare CPU speed")
    args = ap.parse_args(argv)
    before = harness.start()
    shapes = args.shapes.split(",")
    if shapes[0] != "ours" and any(s.startswith("floor_") for s in shapes):
        raise SystemExit("floor_state needs ours first (it carries ours' state bytes)")
    port = args.port or free_port()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    trace = None
    if args.trace:   # before the JVM starts: its Python workers inherit the environment
        trace = tempfile.mktemp(prefix="cq_gap_trace_", suffix=".jsonl")
        os.environ["CQ_TRACE"] = trace
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_trace")
        harness.worker_env(here)   # the workers import worker_trace/sitecustomize.py at start-up
        if args.calibrate:
            os.environ["CQ_TRACE_CALIBRATE"] = "1"
            from .worker_trace.sitecustomize import calibrate

            c = [calibrate() for _ in range(5)]
            print("calibration loop in this process (ms): python wall / CPU, numpy sort wall / CPU: "
                  + ", ".join(f"{statistics.median(x[i] for x in c) * 1e3:.1f}" for i in range(4)), flush=True)
    spark = session(port, args.partitions)
    import pyspark_cq

    base = f"http://localhost:{port}/api/v1/applications/{spark.sparkContext.applicationId}"
    tmp = tempfile.mkdtemp(prefix="cq_gap_")
    results, loads = {}, {}
    try:
        root = os.path.join(tmp, "data")
        common.write_streams(root, args.files, args.rows, args.keys)

        def source(side):
            return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                    .parquet(os.path.join(root, side)).withWatermark("ts", DELAY))

        state_bytes = None
        for shape in shapes:
            kind = shape.split("#")[0]   # "ours#2": the same shape again (its planning after the JVM warmed up)
            if kind == "ours":
                df = pyspark_cq.interval_join(source("l"), source("r"), "k", "ts", "ts", "-30 seconds", "30 seconds",
                                              suffixes=("_l", "_r"), name="bench")
            elif kind in ("floor_tail", "floor_state3"):
                df = floor_variant(source("l"), source("r"), state_bytes, tail=kind == "floor_tail",
                                   fields=3 if kind == "floor_state3" else 1)
            elif kind in ("floor", "floor_state"):

                df = join_shape(source("l"), source("r"), state_bytes if kind == "floor_state" else [0])
            else:
                raise SystemExit(f"unknown shape {shape!r}")
            loads[shape] = os.getloadavg()[0]
            rows, progress = run_shape(spark, base, df, os.path.join(tmp, f"ck_{shape}"))
            if trace:
                add_trace(rows, trace)
            loads[shape] = max(loads[shape], os.getloadavg()[0])
            if shape == "ours":
                state_bytes = [(pyspark_cq.read_metrics(p, "bench") or {}).get("state_bytes", 0) for p in progress]
                for r, p in zip(rows, progress):
                    for k, v in (pyspark_cq.read_metrics(p, "bench") or {}).items():
                        r[f"ours report: {k}"] = v
            results[shape] = rows
            print(f"{shape}: {len(rows)} batches, triggerExecution "
                  f"{[r.get('progress: triggerExecution') for r in rows]}, load {loads[shape]:.2f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
        if trace and os.path.exists(trace):
            if args.keep_trace:
                shutil.copy(trace, args.keep_trace)
            os.remove(trace)

    med = {s: medians(rows, args.skip) for s, rows in results.items()}
    ref = "floor_state" if "floor_state" in med else shapes[-1]
    keys = sorted({k for m in med.values() for k in m})
    width = max(len(k) for k in keys) if keys else 10
    head = " | ".join(f"{s:>12s}" for s in shapes)
    print(f"\nmedians over batches {args.skip}..n-2 ({args.rows:,} rows/side/batch, {args.files} files); "
          f"load {', '.join(f'{s} {v:.2f}' for s, v in loads.items())}")
    print(f"{'metric':{width}s} | {head} | {'ours - ' + ref:>16s}")
    for k in keys:
        vals = [med[s].get(k) for s in shapes]
        if not args.all and len({v for v in vals}) <= 1:
            continue
        diff = (med["ours"].get(k, 0) - med[ref].get(k, 0)) if "ours" in med and ref != "ours" else 0
        cells = " | ".join("           -" if v is None else f"{v:12,.1f}" for v in vals)
        print(f"{k:{width}s} | {cells} | {diff:16,.1f}")
    harness.write_result("join_gap_metrics", {"args": vars(args), "loads": loads, "batches": results}, args, before)


if __name__ == "__main__":
    main()
