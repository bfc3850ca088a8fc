"""The job of ``pyspark-cq demo``: its arguments, the two queries on the adaptive runtime, watching them, the
summary (the package's docstring tells the story).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

from ..vocabulary import metrics as M
from .model import (
    LOWER,
    SLIDE,
    TRIGGER,
    WATERMARK,
    S,
    cost_profile,
    estimate,
    plans,
    qos,
)

__all__ = ["run", "add_arguments", "DEFAULT_OUT"]

#: The demo's output directory when ``--out`` is not given, relative to the working directory.
DEFAULT_OUT = "cq-demo"

#: The resource manager's memory budget when ``--budget`` is not given.
DEFAULT_BUDGET = "600 KB"

#: The bound on the measured state the demo checks with ``--cap`` (docs/runtime.md, "A hard memory cap").
CAP_CHECK = 1.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``demo`` sub-command's arguments."""
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to run (default 120)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="requests per second outside the burst (default 100; responses follow at the same rate)")
    parser.add_argument("--burst-rate", type=float, default=800.0,
                        help="requests per second during the burst (default 800)")
    parser.add_argument("--burst", default="0.3,0.6",
                        help="start,end of the burst as fractions of --seconds (default 0.3,0.6)")
    parser.add_argument("--hosts", type=int, default=50, help="number of hosts (aggregation groups, default 50)")
    parser.add_argument("--budget", default=None,
                        help=f"memory budget of the resource manager (default '{DEFAULT_BUDGET}')")
    parser.add_argument("--out", "--output", dest="output", default=DEFAULT_OUT,
                        help=f"directory for the queries' output, checkpoints and the report (default ./{DEFAULT_OUT}, "
                             f"in the working directory; its earlier contents of a demo are replaced)")
    parser.add_argument("--report", default=None, help="report directory (default: <out>/report)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines (default 5)")
    parser.add_argument("--master", default=None, help="Spark master (default $SPARK_MASTER or local[*])")
    parser.add_argument("--shed", action="store_true",
                        help="let the resource manager shed the join's input when even the QoS minimum does not "
                             "fit the budget (PIPES §5.3; default: windows and granularities only)")
    parser.add_argument("--cap", action="store_true",
                        help="hold the budget as a hard cap on the measured state: the resource manager sheds the "
                             "join's input while the windows adapt (PipesResourceManager(cap=True); the shed rows "
                             "are counted; default: the budget is a target of the estimates)")
    parser.add_argument("--group", action="store_true",
                        help="run several window queries over the stream as one query group (cq.QueryGroup, "
                             "docs/groups.md) registered with the runtime instead of the adaptive pipeline; prints "
                             "each query's rows per micro-batch (not with --budget, --shed, --cap)")


def _check(args) -> tuple[float, float]:
    """Validate the arguments (errors name them); returns the burst's start and end fractions."""
    from pyspark_cq.policies import parse_size

    group = getattr(args, "group", False)
    if group:
        from .group import check_group_args

        check_group_args(args)
    least = 4 if group else 10     # a group has no resource manager that needs a few rounds
    if not (math.isfinite(args.seconds) and args.seconds >= least):
        raise SystemExit(f"--seconds must be at least {least} (the "
                         f"{'group' if group else 'runtime'} needs a few micro-batches), got {args.seconds}")
    if not (math.isfinite(args.rate) and args.rate > 0):
        raise SystemExit(f"--rate must be a positive number of requests per second, got {args.rate}")
    if not (math.isfinite(args.burst_rate) and args.burst_rate > 0):
        raise SystemExit(f"--burst-rate must be a positive number of requests per second, got {args.burst_rate}")
    if args.rate > 5000 or args.burst_rate > 5000:
        raise SystemExit(f"--rate and --burst-rate must be at most 5000 requests/s on local Spark, got "
                         f"{args.rate} and {args.burst_rate}")
    if args.hosts <= 0:
        raise SystemExit(f"--hosts must be positive, got {args.hosts}")
    if not (math.isfinite(args.every) and args.every > 0):
        raise SystemExit(f"--every must be a positive number of seconds, got {args.every}")
    try:
        start, end = (float(x) for x in str(args.burst).split(","))
    except ValueError:
        raise SystemExit(f"--burst must be two fractions 'start,end', got {args.burst!r}") from None
    if not 0 <= start <= end <= 1:
        raise SystemExit(f"--burst must satisfy 0 <= start <= end <= 1, got {args.burst!r}")
    if group:
        return start, end
    try:
        import matplotlib  # noqa: F401 - the report's plots
    except ImportError:
        raise SystemExit('the demo writes a report with plots and needs matplotlib: pip install "pyspark-cq[report]"'
                         ) from None
    if args.budget is None:
        args.budget = DEFAULT_BUDGET
    try:
        args.budget_bytes = parse_size(args.budget, "--budget")
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"--budget must be a memory size such as '1 MB' or 1000000: {exc}") from None
    return start, end


# ---------------------------------------------------------------------------------------------
# the queries


def _packets(spark, profile, clock):
    from .source import SOURCE_NAME

    return spark.readStream.format(SOURCE_NAME).options(**profile.options(clock)).load()


def _pairs_builder(profile, paths, shed=False):
    def build(ctx):
        from pyspark.sql import functions as F

        import pyspark_cq as cq

        # with shed: the join is the query's shedding stage (its entry carries a drop_ratio)
        handle = ctx.control("join1", upper=30 * S, lower=LOWER, **({"drop_ratio": 0.0} if shed else {}))
        packets = _packets(ctx.spark, profile, paths["clock"])
        req = packets.where(F.col("kind") == "req").select(
            "flow", "host", F.col("bytes").alias("req_bytes"), F.col("ts").alias("req_ts")
        ).withWatermark("req_ts", WATERMARK)
        resp = packets.where(F.col("kind") == "resp").select(
            "flow", F.col("bytes").alias("resp_bytes"), F.col("ts").alias("resp_ts")
        ).withWatermark("resp_ts", WATERMARK)
        # "full": the memory budget is checked against state_bytes, and the files layout's count includes the
        # deltas since its snapshot (up to half of it again), so the demo's budget checks keep the image's size.
        pairs = cq.interval_join(req, resp, on="flow", left_time="req_ts", right_time="resp_ts", lower="-1 second",
                                 upper="30 seconds", name="join1", control=handle, state_persistence="full")
        return (pairs.writeStream.format("parquet").option("path", str(paths["pairs"]))
                .option("checkpointLocation", str(paths["ck_pairs"])).trigger(processingTime=TRIGGER))

    return build


def _traffic_builder(profile, paths):
    def build(ctx):
        import pyspark_cq as cq

        handle = ctx.control("agg1", window=60 * S, granularity=1 * S)
        packets = _packets(ctx.spark, profile, paths["clock"]).withWatermark("ts", WATERMARK)
        traffic = cq.sliding_aggregate(packets, "ts", "60 seconds", slide=SLIDE, by="host",
                                       aggs={"*": ["count"], "bytes": ["sum"]}, granularity="1 second",
                                       shards=2, name="agg1", control=handle)
        return (traffic.writeStream.format("parquet").option("path", str(paths["traffic"]))
                .option("checkpointLocation", str(paths["ck_traffic"])).trigger(processingTime=TRIGGER))

    return build


# ---------------------------------------------------------------------------------------------
# watching


class _Recorder:
    """Collects per-batch progress of both queries and per-second samples of the runtime's view.

    Times are seconds since ``t0`` (set when the burst clock starts; batches before are the warm-up).
    """

    OPS = {"pairs": "join1", "traffic": "agg1"}
    SOURCES = {"pairs": "scans", "traffic": "packets"}

    def __init__(self, rt, profile, hosts):
        self.rt, self.profile, self.hosts = rt, profile, hosts
        self.t0 = time.time()
        self.batches = {q: [] for q in self.OPS}
        self.samples = []
        self.seen = {q: -1 for q in self.OPS}
        self.offsets = {q: [None, None] for q in self.OPS}

    def poll(self):
        """File the micro-batches completed since the last call."""
        from pyspark_cq.operators._common.metrics import read
        from pyspark_cq.runtime.stats import parse_event_time

        for q, op in self.OPS.items():
            query = self.rt.query(q)
            if query is None:
                continue
            for p in query.recentProgress:
                if p.batchId <= self.seen[q]:
                    continue
                self.seen[q] = p.batchId
                src = p.sources[0] if p.sources else None
                if src is not None and p.numInputRows > 0:
                    if self.offsets[q][0] is None:
                        self.offsets[q][0] = _offset_ms(src.startOffset)
                    self.offsets[q][1] = _offset_ms(src.endOffset)
                m = read(p, op) or {}
                stamp = parse_event_time(p.timestamp)
                start = stamp / 1e6 if stamp else time.time()
                self.batches[q].append({
                    "batch": p.batchId, "t": start - self.t0, "t_end": start + p.batchDuration / 1000.0 - self.t0,
                    "rows": p.numInputRows, "rate": p.inputRowsPerSecond or 0.0,
                    "duration": p.batchDuration / 1000.0, **{k: int(v) for k, v in m.items()}})

    def sample(self):
        """One sample of rates, state, control values and estimates; returns it."""
        snap = self.rt.statistics()
        entries = self.rt.control_table().entries()
        now = time.time()
        upper = entries["join1"].params.get("upper") if "join1" in entries else None
        window = entries["agg1"].params.get("window") if "agg1" in entries else None
        gran = entries["agg1"].params.get("granularity") if "agg1" in entries else None
        drop = entries["join1"].params.get("drop_ratio") if "join1" in entries else None
        rec = {"t": now - self.t0, "offered": float(self.profile.rate_at(now)) * 2,
               "upper_s": upper / S if upper else None, "window_s": window / S if window else None,
               "granularity_s": gran / S if gran else None, "drop_ratio": drop}
        d, retention = {}, {}
        for q, op in self.OPS.items():
            info = snap.queries.get(q)
            if info is None:
                continue
            o = info.operators.get(op)
            rec[f"{q}_rate"] = _num(info.input_rate)
            rec[f"{op}_state_bytes"] = _num(o.state_bytes) if o else None
            rec[f"{op}_state_rows"] = _num(o.state_rows) if o else None
            src = info.sources.get(self.SOURCES[q])
            d[q] = _num(src.distance) if src is not None else None
            retention[q] = (info.watermark_delay, info.batch_span)
            rec[f"{q}_delay_s"], rec[f"{q}_span_s"] = info.watermark_delay, info.batch_span
            rec[f"{q}_d_s"] = d[q]
        if upper and window and gran:
            est = estimate(d.get("pairs"), d.get("traffic"), upper, window, gran, self.hosts, retention)
            rec.update({f"est_{k}": v for k, v in est.items()})
        rec["decisions"] = len(self.decisions())
        self.samples.append(rec)
        return rec

    def decisions(self):
        """The resource manager's changes of the control table (who == "pipes"), oldest first."""
        out = []
        for c in self.rt.control_table().changes():
            if c.who != "pipes":
                continue
            at = {k: v / 1e6 - self.t0 for k, v in dict(c.at).items() if isinstance(v, (int, float))}
            out.append({"time": c.time, "t": _iso_seconds(c.time) - self.t0, "operator": c.operator,
                        "query": c.query, "old": dict(c.old), "new": dict(c.new), "at": dict(c.at),
                        "applies_from_s": at, "reason": c.reason})
        return out


def _num(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _offset_ms(text):
    if not text:
        return None
    try:
        return int(json.loads(text)["ms"])
    except (ValueError, KeyError, TypeError):
        return None


def _iso_seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _fmt_bytes(x) -> str:
    if x is None:
        return "?"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def _fmt_s(x) -> str:
    return "?" if x is None else f"{x:g} s"


def _line(rec, budget) -> str:
    measured = [rec.get("join1_state_bytes"), rec.get("agg1_state_bytes")]
    total = sum(v for v in measured if v is not None) if any(v is not None for v in measured) else None
    est = (rec.get("est_join_bytes") or 0) + (rec.get("est_agg_bytes") or 0) if "est_join_bytes" in rec else None
    pairs = (rec.get("pairs_rate") or 0) / 2      # Spark counts the packets once per scan of the join
    return (f"{rec['t']:>6.0f}s  offered {rec['offered']:>6,.0f}/s  in {pairs:>6,.0f}"
            f"|{rec.get('traffic_rate') or 0:>6,.0f}/s  state {_fmt_bytes(total):>9} / {_fmt_bytes(budget)}"
            f" (est {_fmt_bytes(est)})  upper {_fmt_s(rec['upper_s'])}  window {_fmt_s(rec['window_s'])}"
            f"  g {_fmt_s(rec['granularity_s'])}" + (f"  kept {1 - rec['drop_ratio']:.0%} of the join's input"
                                                       if rec.get("drop_ratio") else "")
            + f"  decisions {rec['decisions']}")


def _stop_between_batches(query, timeout: float = 15.0) -> None:
    """Stop ``query``, preferably while no micro-batch runs (an interrupted batch is not committed: the
    Parquet sink's log keeps it out of the output, and its progress is never reported).
    """
    deadline = time.time() + timeout
    while time.time() < deadline and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()


def _failed(rt):
    for q in ("pairs", "traffic"):
        query = rt.query(q)
        if query is not None and query.exception() is not None:
            raise RuntimeError(f"query {q!r} failed: {query.exception()}")


def _warm_state(rec) -> float | None:
    """The state bytes ``join1`` and ``agg1`` reported after their latest micro-batch, together; None until both
    have run one with rows (an empty first batch reports an empty state, not what the backlog will build).
    """
    sizes = []
    for q in rec.OPS:
        done = [b for b in rec.batches[q] if b.get(M.STATE_BYTES) is not None]
        if not any(b["rows"] > 0 for b in done):
            return None
        sizes.append(done[-1][M.STATE_BYTES])
    return float(sum(sizes))


def _warm_up(rt, rec, timeout: float, restart, cap: float | None = None) -> None:
    """Wait until both queries have finished a micro-batch with rows (Spark, its Python workers and the
    native kernels are loaded), printing what it waits for. With ``cap`` (bytes) also until the measured
    state is within it: the first micro-batches read what arrived while Spark started, before the resource
    manager had measured anything, and the hard cap acts from its first round on (what it sheds meanwhile
    is counted with the rest).

    On a loaded machine the Python process that plans the generated source may take longer than the 10 s
    Spark grants it to connect back (fixed in ``PythonWorkerFactory``); such a query is registered again
    (``restart(name)``) until ``timeout``.
    """
    t = time.time()
    next_line = t + 10
    retries = {q: 0 for q in rec.OPS}
    while True:
        for q in rec.OPS:
            query = rt.query(q)
            exc = query.exception() if query is not None else None
            if exc is None:
                continue
            if "failed to connect back" in str(exc) and not rec.batches[q] and time.time() - t < timeout:
                retries[q] += 1
                print(f"  {q}: a Python worker did not start in time (machine busy?); restarting the query "
                      f"(attempt {retries[q] + 1})", flush=True)
                restart(q)
                continue
            raise RuntimeError(f"query {q!r} failed: {exc}")
        rec.poll()
        if all(any(b["rows"] > 0 for b in rec.batches[q]) for q in rec.OPS):
            state = _warm_state(rec) if cap is not None else None
            if cap is None or (state is not None and state <= cap):
                return
        if time.time() - t > timeout:
            raise TimeoutError(f"the queries did not finish a micro-batch with rows within {timeout:.0f} s")
        if time.time() >= next_line:
            done = ", ".join(f"{q} {len(b)} batches" for q, b in rec.batches.items())
            state = _warm_state(rec) if cap is not None else None
            over = f"; state {_fmt_bytes(state)} over the cap, shedding" if state is not None and state > cap else ""
            print(f"  warming up ({time.time() - t:.0f} s: {done}{over}) ...", flush=True)
            next_line = time.time() + 10
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# the job


def demo_session(master):
    """The demo's Spark session (``cq.spark`` with 2 shuffle partitions), quiet below ERROR."""
    import pyspark_cq as cq

    # a loaded machine starts Python workers slowly: give them more than Spark's 15 s to connect back
    # spark.log.level: ERROR from the context's start on, so Spark's warnings do not interleave with the
    # progress lines (setLogLevel below only acts once the session exists)
    spark = cq.spark(master, "pyspark-cq-demo", shuffle_partitions=2,
                     conf={"spark.python.authenticate.socketTimeout": "120s", "spark.log.level": "ERROR"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(args) -> int:
    """Run the demo; returns the exit code (0: ran and every check passed)."""
    burst_start, burst_end = _check(args)
    if getattr(args, "group", False):
        from .group import run_group

        return run_group(args, burst_start, burst_end)
    from pyspark_cq.plan import render
    from pyspark_cq.runtime import CQRuntime

    from . import report as R
    from .source import BurstProfile, PacketSource, injected, write_clock

    out_dir = Path(args.output or DEFAULT_OUT).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_dir = (Path(args.report) if args.report else out_dir / "report").resolve()
    paths = {k: out_dir / k for k in ("pairs", "traffic", "ck_pairs", "ck_traffic", "control")}
    for p in paths.values():
        shutil.rmtree(p, ignore_errors=True)
    paths["control"].mkdir(parents=True)
    paths["clock"] = out_dir / "clock.json"
    paths["clock"].unlink(missing_ok=True)
    budget = args.budget_bytes

    print(f"pyspark-cq demo: packets at {args.rate:g} requests/s (+ responses), a burst of {args.burst_rate:g}/s "
          f"from {burst_start * args.seconds:.0f} s to {burst_end * args.seconds:.0f} s, {args.seconds:.0f} s "
          f"in all; memory budget {_fmt_bytes(budget)}{' (a hard cap)' if args.cap else ''}; output in {out_dir}, "
          f"report to {report_dir / 'report.html'}")
    print("starting Spark ...", flush=True)
    started = time.time()
    spark = demo_session(args.master)
    spark.dataSource.register(PacketSource)

    rt = CQRuntime(spark, policies=["pipes"], memory_budget=budget, every_batches=2, every_seconds=4.0, alpha=0.5,
                   control_path=str(paths["control"] / "control.json"),
                   policy_options={"pipes": {"profile": cost_profile(), "retention": True, "shed": args.shed,
                                             "cap": args.cap}})
    pairs_plan, traffic_plan = plans(30 * S, 60 * S, 1 * S, args.hosts)
    pairs_qos, traffic_qos = qos()
    profile = BurstProfile(quiet=args.rate, burst=args.burst_rate, hosts=args.hosts)
    registrations = {
        "pairs": dict(builder=_pairs_builder(profile, paths, args.shed or args.cap), plan=pairs_plan, qos=pairs_qos,
                      sources={"scans": ""}),
        "traffic": dict(builder=_traffic_builder(profile, paths), plan=traffic_plan, qos=traffic_qos,
                        sources={"packets": ""})}

    def register(name):
        for key in (name, f"ck_{name}"):
            shutil.rmtree(paths[key], ignore_errors=True)
        rt.register(name, **registrations[name])

    def restart(name):
        rt.deregister(name)
        register(name)

    for name in registrations:
        register(name)
    rec = _Recorder(rt, profile, args.hosts)
    failed = None
    print(f"runtime: policies {[p.name for p in rt.policies]}, control table {rt.control_path}")
    print(f"  pairs:   {render(pairs_plan, micros=True)}\n  traffic: {render(traffic_plan, micros=True)}")
    rt.start()
    try:
        _warm_up(rt, rec, max(600.0, args.seconds * 5), restart, budget if args.cap else None)
        old, t0 = rec.t0, time.time()
        rec.t0 = t0
        profile = profile.with_burst(t0 + burst_start * args.seconds, t0 + burst_end * args.seconds)
        rec.profile = profile
        write_clock(paths["clock"], profile.burst_start, profile.burst_end)
        for q in rec.batches:                       # batches so far are the warm-up, at negative times
            for b in rec.batches[q]:
                b["t"], b["t_end"] = b["t"] + old - t0, b["t_end"] + old - t0
        print(f"warm; the clock starts now (burst from {burst_start * args.seconds:.0f} s to "
              f"{burst_end * args.seconds:.0f} s). Every {args.every:g} s: time, offered and measured input "
              f"packet rates (pairs|traffic, smoothed), state memory / budget (cost-model estimate), settings, "
              f"decisions",
              flush=True)
        next_line = t0 + args.every
        while time.time() - t0 < args.seconds:
            time.sleep(1.0)
            _failed(rt)
            rec.poll()
            sample = rec.sample()
            if time.time() >= next_line:
                print(_line(sample, budget), flush=True)
                next_line += args.every
        ended = time.time()
        print("stopping the queries and counting their output ...", flush=True)
        # A micro-batch cut short by stop() is not committed (the Parquet sink's log leaves it out), but
        # Spark logs its cancellation as a page of ERROR stack traces: silence the log while stopping.
        spark.sparkContext.setLogLevel("OFF")
        for q in ("pairs", "traffic"):
            _stop_between_batches(rt.query(q))
    except Exception as exc:  # still write what was recorded
        failed = exc
        ended = time.time()
    finally:
        rt.stop()
        spark.sparkContext.setLogLevel("ERROR")
        rec.poll()
    decisions = rec.decisions()
    stats = rt.statistics()
    written = {}
    for q in ("pairs", "traffic"):
        written[q] = spark.read.parquet(str(paths[q])).count() if any(paths[q].glob("*.parquet")) else 0
    spark.stop()
    # the clock ran from the end of the warm-up to `ended`; before it Spark started and the queries warmed up,
    # after it they were stopped and their output counted
    timing = {"measured": ended - rec.t0, "startup": rec.t0 - started, "drain": time.time() - ended}

    totals = {q: {k: sum(b.get(k, 0) for b in rec.batches[q]) for k in
                  ("rows", M.INPUT_ROWS, M.OUTPUT_ROWS, M.LATE_ROWS, M.MALFORMED_ROWS, M.EVICTED_ROWS,
                   M.SHED_ROWS)}
              for q in rec.batches}
    inj = {}
    for q, (s_ms, e_ms) in rec.offsets.items():
        inj[q] = injected(profile, s_ms, e_ms) if s_ms is not None and e_ms is not None else None
    summary = _summary(args, budget, rec, decisions, totals, inj, written, timing, stats)
    report_dir.mkdir(parents=True, exist_ok=True)
    files = R.write_report(report_dir, samples=rec.samples, batches=rec.batches, decisions=decisions,
                           summary=summary, budget=budget, reserve=rt.policies[0].reserve if rt.policies else 0.0,
                           burst=(profile.burst_start - rec.t0, profile.burst_end - rec.t0)
                           if math.isfinite(profile.burst_start) else None)
    checks = summary["checks"]
    _print_summary(summary, report_dir, files)
    if failed is not None:
        print(f"\nFAILED: {type(failed).__name__}: {failed}")
        return 1
    return 0 if all(c["ok"] for c in checks) else 1


def _summary(args, budget, rec, decisions, totals, inj, written, timing, stats) -> dict:
    """The numbers of the run: peaks, decisions, estimate vs measurement, integrity checks."""
    joint = []
    for s in rec.samples:
        m = [s.get("join1_state_bytes"), s.get("agg1_state_bytes")]
        if all(v is not None for v in m):
            joint.append((s["t"], sum(m), (s.get("est_join_bytes") or 0) + (s.get("est_agg_bytes") or 0)
                          if "est_join_bytes" in s else None))
    peak_measured = max(joint, key=lambda x: x[1]) if joint else None
    with_est = [(t, m, e) for t, m, e in joint if e]
    ratios = sorted(m / e for _, m, e in with_est if e > 0)
    settings = [s for s in rec.samples if s.get("upper_s") is not None]
    checks = []
    for q, op in (("pairs", "join1"), ("traffic", "agg1")):
        t = totals[q]
        checks.append({"name": f"{q}: rows in Parquet = rows the operator {op} reported as output",
                       "ok": written[q] == t[M.OUTPUT_ROWS], "detail": f"{written[q]:,} vs {t[M.OUTPUT_ROWS]:,}"})
        if inj.get(q):
            checks.append({"name": f"{q}: malformed rows injected (null time) = counted by {op}",
                           "ok": inj[q]["malformed"] == t[M.MALFORMED_ROWS],
                           "detail": f"{inj[q]['malformed']:,} vs {t[M.MALFORMED_ROWS]:,}"})
            # the join counts null times among its input rows and late rows apart; the aggregation counts
            # late rows among its input rows and null times apart
            seen = t[M.INPUT_ROWS] + (t[M.LATE_ROWS] if op == "join1" else t[M.MALFORMED_ROWS])
            what = "input + late" if op == "join1" else "input + malformed"
            checks.append({"name": f"{q}: rows generated for the offsets read = {what} rows of {op}",
                           "ok": inj[q]["rows"] == seen, "detail": f"{inj[q]['rows']:,} vs {seen:,}"})
    if args.cap and peak_measured is not None:
        checks.append({"name": f"peak measured state within {CAP_CHECK:g}× the budget (--cap; docs/runtime.md)",
                       "ok": peak_measured[1] <= CAP_CHECK * budget,
                       "detail": f"{_fmt_bytes(peak_measured[1])} = {peak_measured[1] / budget:.2f}× "
                                 f"{_fmt_bytes(budget)}"})
    q_stats = {q: {op: {"batches": o.batches, M.STATE_ROWS: _num(o.state_rows), M.STATE_BYTES: _num(o.state_bytes)}
                   for op, o in info.operators.items()} for q, info in stats.queries.items()}
    return {
        "seconds": timing["measured"], "startup_seconds": timing["startup"], "drain_seconds": timing["drain"],
        "cap": bool(args.cap), "budget_bytes": budget, "rate": args.rate, "burst_rate": args.burst_rate,
        "batches": {q: len(b) for q, b in rec.batches.items()},
        "totals": {q: {("spark_input_rows" if k == "rows" else k): v for k, v in t.items()} for q, t in totals.items()},
        "injected": inj, "written": written,
        "peak_state_bytes": None if peak_measured is None else {"t": peak_measured[0], "bytes": peak_measured[1]},
        "measured_over_estimate": None if not ratios else {
            "median": ratios[len(ratios) // 2], "min": ratios[0], "max": ratios[-1], "samples": len(ratios)},
        "decisions": len(decisions),
        "smallest": None if not settings else {
            "upper_s": min(s["upper_s"] for s in settings), "window_s": min(s["window_s"] for s in settings),
            "granularity_s": max(s["granularity_s"] for s in settings)},
        "final": None if not settings else {k: settings[-1][k] for k in ("upper_s", "window_s", "granularity_s")},
        "runtime_statistics": q_stats,
        "checks": checks,
    }


def _print_summary(summary, report_dir, files) -> None:
    t = summary["totals"]
    print("\nsummary")
    print(f"  ran                  {summary['seconds']:.0f} s on the clock (after {summary['startup_seconds']:.0f} s "
          f"to start Spark and warm the queries up; {summary['drain_seconds']:.0f} s more to stop them and count "
          f"their output), micro-batches pairs {summary['batches']['pairs']}, traffic {summary['batches']['traffic']}")
    for q, op, out in (("pairs", "join1", "matched request-response pairs"), ("traffic", "agg1", "windows")):
        x = t[q]
        shed = f", shed {x[M.SHED_ROWS]:,}" if x.get(M.SHED_ROWS) else ""
        print(f"  {q:<8} ({op})       in {x[M.INPUT_ROWS]:,} rows, out {x[M.OUTPUT_ROWS]:,} {out}, late "
              f"{x[M.LATE_ROWS]:,}, malformed {x[M.MALFORMED_ROWS]:,}{shed}")
    print("                       (in: packets the operator took in; Spark's own count for pairs is twice that, "
          "as it reads the packet stream once per input of the join)")
    inj = summary["injected"].get("pairs")
    if inj:
        share = t["pairs"][M.OUTPUT_ROWS] / inj["requests"] if inj["requests"] else 0.0
        print(f"  requests answered    {share:.1%} matched within the join bound ({inj['requests']:,} requests; "
              f"{inj['skewed']:,} stamped 60 s late)")
    print(f"  memory budget        {_fmt_bytes(summary['budget_bytes'])}"
          + (" (a hard cap: the join's input shed while the windows adapt)" if summary.get("cap") else
             " (a target of the cost model's estimates; --cap holds it on the measured state)"))
    p = summary["peak_state_bytes"]
    if p:
        ratio = p["bytes"] / summary["budget_bytes"]
        print(f"  peak measured state  {_fmt_bytes(p['bytes'])} at {p['t']:.0f} s, {ratio:.2f}× the budget (join + "
              f"aggregation state bytes)")
    r = summary["measured_over_estimate"]
    if r:
        print(f"  measured / estimate  median {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f}; "
              f"{r['samples']} samples)")
    print(f"  decisions            {summary['decisions']} control-table changes by the PIPES resource manager")
    if summary["smallest"]:
        s, f = summary["smallest"], summary["final"]
        print(f"  smallest settings    upper {s['upper_s']:g} s, window {s['window_s']:g} s, coarsest g "
              f"{s['granularity_s']:g} s; at the end {f['upper_s']:g} s, {f['window_s']:g} s, {f['granularity_s']:g} s")
    for c in summary["checks"]:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']} ({c['detail']})")
    print(f"  report               {report_dir / 'report.html'} ({len(files)} files)")
