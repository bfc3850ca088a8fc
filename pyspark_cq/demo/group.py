"""``pyspark-cq demo --group``: several window queries over the demo's packet stream as one query group.

STREAM runs many continuous queries at once and shares their subplans and synopses (Motwani et al., §3.2). Here
the demo's generated packet stream (:mod:`.source`, with its burst) feeds one :class:`~pyspark_cq.QueryGroup`
registered with the runtime (:meth:`~pyspark_cq.runtime.CQRuntime.register_group`, docs/groups.md): four
windowed aggregations in CQL share one scan, one projection, one slicer and one stateful stage (two of them one
slice table), and one stateless query runs alone inside the same Spark query. Every micro-batch prints the rows
each query delivered; at the end the summary shows the group (members, mode, slice classes, rows, state counted
once) and checks each query's numbers against the generated stream.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..vocabulary import metrics as M
from .job import demo_session
from .model import TRIGGER, WATERMARK

__all__ = ["QUERIES", "run_group"]

#: The group's queries by name: (CQL text, which generated rows it reads: "all", "req" or "big").
#: ``hosts_30s`` and ``hosts_60s`` differ only in the window: they share one slice table (``slices``).
QUERIES = {
    "hosts_30s": ("RSTREAM(SELECT host, COUNT(*) AS n, SUM(bytes) AS b FROM packets "
                  "[RANGE 30 SECONDS SLIDE 10 SECONDS] GROUP BY host)", "all"),
    "hosts_60s": ("RSTREAM(SELECT host, COUNT(*) AS n, SUM(bytes) AS b FROM packets "
                  "[RANGE 60 SECONDS SLIDE 10 SECONDS] GROUP BY host)", "all"),
    "requests_20s": ("RSTREAM(SELECT host, COUNT(*) AS n FROM packets [RANGE 20 SECONDS SLIDE 5 SECONDS] "
                     "WHERE kind = 'req' GROUP BY host)", "req"),
    "responses_1m": ("RSTREAM(SELECT host, COUNT(*) AS n, MAX(bytes) AS biggest FROM packets "
                     "[RANGE 1 MINUTE SLIDE 20 SECONDS] WHERE kind = 'resp' GROUP BY host)", "resp"),
    "big": ("ISTREAM(SELECT flow, host, bytes FROM packets [NOW] WHERE bytes > 60000)", "big"),
}
#: Bytes above which ``big`` keeps a packet (only responses reach it: 200–60,199 B).
BIG = 60000
#: Options of ``pyspark-cq demo`` that set the resource manager, which a group's members do not have.
NOT_FOR_GROUP = {"budget": "--budget", "shed": "--shed", "cap": "--cap"}


def check_group_args(args) -> None:
    """Refuse options that cannot apply to ``--group`` (errors name the option)."""
    for attr, option in NOT_FOR_GROUP.items():
        if getattr(args, attr, None) not in (None, False):
            raise SystemExit(f"{option} does not apply to --group: a group's queries are not adapted by the resource "
                             f"manager (their windows are the group's plan, docs/groups.md \"The runtime\"); "
                             f"run the demo without --group for {option}")


def _rows_of(kind: str, g: dict) -> int:
    """How many generated rows (:func:`.source.generate` columns ``g``) query kind ``kind`` reads."""
    if kind == "all":
        return int(g["kind"].size)
    if kind == "req":
        return int((g["kind"] == 0).sum())
    if kind == "resp":
        return int((g["kind"] == 1).sum())
    return int((g["bytes"] > BIG).sum())


def run_group(args, burst_start: float, burst_end: float) -> int:
    """Run the demo's query group; returns the exit code (0: ran and every check passed)."""
    from pyspark.sql import SparkSession

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime
    from pyspark_cq.runtime.stats import parse_event_time

    from . import report as R
    from .job import DEFAULT_OUT, _fmt_bytes, _offset_ms
    from .source import SOURCE_NAME, BurstProfile, PacketSource, generate, write_clock

    out_dir = Path(args.output or DEFAULT_OUT).resolve()
    report_dir = (Path(args.report) if args.report else out_dir / "report").resolve()
    for sub in ("group", "ck_group", "report"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = out_dir / "clock.json"
    clock.unlink(missing_ok=True)
    print(f"pyspark-cq demo --group: {len(QUERIES)} continuous queries over one packet stream as one query group "
          f"({args.rate:g} requests/s, a burst of {args.burst_rate:g}/s from {burst_start * args.seconds:.0f} s to "
          f"{burst_end * args.seconds:.0f} s, {args.seconds:g} s in all); output in {out_dir}, report to "
          f"{report_dir / 'report.html'}")
    print("starting Spark ...", flush=True)
    started = time.time()
    active = SparkSession.getActiveSession()   # in-process (tests, notebooks): keep their session as it is
    spark = active or demo_session(args.master)
    spark.dataSource.register(PacketSource)
    profile = BurstProfile(quiet=args.rate, burst=args.burst_rate, hosts=args.hosts)
    packets = (spark.readStream.format(SOURCE_NAME).options(**profile.options(clock)).load()
               .withWatermark("ts", WATERMARK))
    group = cq.QueryGroup(spark, sources={"packets": packets}, checkpoint=str(out_dir / "ck_group"), shards=2,
                          name="demo_group")
    for name, (text, _) in QUERIES.items():
        group.add(name, text, sink=str(out_dir / "group" / name))
    rt = CQRuntime(spark, control_path=str(out_dir / "ck_group" / "control.json"))
    # no no-data micro-batches (Spark runs one when the watermark alone moves): the stream never pauses while the
    # clock runs, and when it ends the group stops after its last data instead of sweeping windows once more.
    # Spark reads the setting when the query starts; the session keeps its own.
    conf, key = spark.conf, "spark.sql.streaming.noDataMicroBatches.enabled"
    before = conf.get(key, "true")
    conf.set(key, "false")
    try:
        group.start(trigger={"processingTime": TRIGGER})
    finally:
        conf.set(key, before)
    rt.register_group(group)
    for name, m in group.queries.items():
        print(f"  {name:<13} {m['mode']:<6} {m['text']}")
    rt.start()
    batches: dict[int, dict] = {}       # batch id -> the group's progress and each query's counters
    offsets = [None, None]
    failed, t0 = None, None

    def poll(quiet=False):
        query = rt.query(group.name)
        last = query.lastProgress
        if last is None or last.batchId in batches:   # nothing new: spare the driver (2 cores) the reads below
            return
        per_query = {n: dict(group.query_metrics(n, "all") or []) for n in QUERIES}
        for p in query.recentProgress:
            if p.batchId in batches or not all(p.batchId in h for h in per_query.values()):
                continue                 # not yet delivered (the counters are written by the batch function)
            src = p.sources[0] if p.sources else None
            if src is not None and p.numInputRows > 0:
                offsets[0] = offsets[0] if offsets[0] is not None else _offset_ms(src.startOffset)
                offsets[1] = _offset_ms(src.endOffset)
            stamp = parse_event_time(p.timestamp)       # the batch's start (µs), on the clock
            rec = {"batch": p.batchId, "t": (stamp / 1e6 if stamp else time.time()) - (t0 or started),
                   "spark_input_rows": p.numInputRows,
                   "duration": p.batchDuration / 1000.0, "queries": {n: per_query[n][p.batchId] for n in QUERIES}}
            batches[p.batchId] = rec
            if not quiet:
                state = sum(c.get(M.STATE_BYTES, 0) for c in rec["queries"].values())
                rows = "  ".join(f"{n} {c.get(M.OUTPUT_ROWS, 0):>4}" for n, c in rec["queries"].items())
                print(f"  batch {p.batchId:>3} {rec['t']:>6.0f}s  read {p.numInputRows:>6,} in "
                      f"{rec['duration']:4.1f} s  rows delivered: {rows}  state {_fmt_bytes(state)}", flush=True)

    try:
        deadline = time.time() + max(600.0, args.seconds * 5)
        while not any(rec["spark_input_rows"] > 0 for rec in batches.values()):   # warm-up: one batch with rows
            exc = rt.query(group.name).exception()
            if exc is not None:
                raise RuntimeError(f"query group {group.name!r} failed: {exc}")
            if time.time() > deadline:
                raise TimeoutError("the group did not finish a micro-batch with rows in time")
            time.sleep(0.5)
            poll(quiet=True)
        t0 = time.time()
        profile = profile.with_burst(t0 + burst_start * args.seconds, t0 + burst_end * args.seconds)
        write_clock(clock, profile.burst_start, profile.burst_end)
        print(f"warm after {t0 - started:.0f} s; the clock starts now. Per micro-batch: id, time, rows Spark read (the "
              f"stream once per branch: shared stage and 'big'), duration, rows each query delivered, the group's "
              f"state", flush=True)
        while time.time() - t0 < args.seconds:
            time.sleep(0.5)
            exc = rt.query(group.name).exception()
            if exc is not None:
                raise RuntimeError(f"query group {group.name!r} failed: {exc}")
            poll()
        ended = time.time()
        # the stream ends now: the group reads up to here and goes idle, and is stopped between micro-batches
        # (an interrupted one is neither delivered nor reported; Spark's log would show its cancellation)
        write_clock(clock, profile.burst_start, profile.burst_end, end=ended)
        print("the stream ends; the group reads what arrived, then stops; counting its output ...", flush=True)
        query, end_ms = rt.query(group.name), int(ended * 1000)
        while time.time() - ended < 60:
            last = query.lastProgress
            done = bool(last and last.sources) and (_offset_ms(last.sources[0].endOffset) or 0) >= end_ms
            if done and not query.status.get("isTriggerActive"):
                break
            exc = query.exception()
            if exc is not None:
                raise RuntimeError(f"query group {group.name!r} failed: {exc}")
            time.sleep(0.05)
            poll()
        query.stop()
        poll()
    except Exception as exc:  # still summarise what was recorded
        failed, ended = exc, time.time()
    finally:
        rt.stop()
    overview = group.overview()
    written = {}
    for name in QUERIES:
        path = out_dir / "group" / name
        written[name] = spark.read.parquet(str(path)).count() if any(path.glob("*.parquet")) else 0
    if active is None:
        spark.stop()
    generated = generate(profile, *offsets) if None not in offsets else None
    summary = _group_summary(overview, batches, written, generated,
                             {"measured": ended - (t0 or ended), "startup": (t0 or ended) - started,
                              "drain": time.time() - ended})
    files = R.write_group_report(report_dir, summary=summary, batches=[batches[b] for b in sorted(batches)])
    _print_group_summary(summary, report_dir, files)
    if failed is not None:
        print(f"\nFAILED: {type(failed).__name__}: {failed}")
        return 1
    return 0 if all(c["ok"] for c in summary["checks"]) else 1


def _group_summary(overview: dict, batches: dict, written: dict, generated, timing: dict) -> dict:
    """The run's numbers and checks: each query's rows in its sink = rows delivered = its reported output, and
    the rows generated for the offsets the group read that each query's WHERE keeps = the rows it took in
    (windowed aggregations: input + malformed; ``big``: its output).
    """
    totals = {n: {k: sum(int(b["queries"][n].get(k, 0)) for b in batches.values())
                  for k in (M.INPUT_ROWS, M.OUTPUT_ROWS, M.LATE_ROWS, M.MALFORMED_ROWS)} for n in QUERIES}
    checks = []
    for name, (_, kind) in QUERIES.items():
        m, t = overview["members"][name], totals[name]
        checks.append({"name": f"{name}: rows in its sink = rows delivered = output rows reported",
                       "ok": written[name] == m["rows"] == t[M.OUTPUT_ROWS],
                       "detail": f"{written[name]:,} / {m['rows']:,} / {t[M.OUTPUT_ROWS]:,}"})
        if generated is None:
            continue
        want = _rows_of(kind, generated)
        if kind == "big":       # a stateless filter: every row it keeps is delivered
            got, what = t[M.OUTPUT_ROWS], "rows delivered"
        else:                   # the aggregation counts late rows among its input rows and null times apart
            got, what = t[M.INPUT_ROWS] + t[M.MALFORMED_ROWS], "input + malformed rows"
        checks.append({"name": f"{name}: generated rows its WHERE keeps = its {what}", "ok": want == got,
                       "detail": f"{want:,} vs {got:,}"})
    return {"seconds": timing["measured"], "startup_seconds": timing["startup"], "drain_seconds": timing["drain"],
            "batches": len(batches), "group": overview, "totals": totals, "written": written,
            "generated_rows": None if generated is None else int(generated["kind"].size), "checks": checks}


def _print_group_summary(summary: dict, report_dir: Path, files) -> None:
    from .job import _fmt_bytes

    g = summary["group"]
    print("\nsummary")
    print(f"  ran                  {summary['seconds']:.0f} s on the clock (after {summary['startup_seconds']:.0f} s "
          f"to start Spark and warm the group up; {summary['drain_seconds']:.0f} s more to stop it and count its "
          f"output), {summary['batches']} micro-batches of one Spark query ({g['name']})")
    print(f"  {'query':<14}{'mode':<8}{'slices of':<14}{'rows':>8}{'input':>10}{'late':>7}{'malformed':>11}"
          f"{'state':>12}")
    for name, m in g["members"].items():
        t = summary["totals"][name]
        shared = m["slices"] is not None and m["slices"] != name and not m[M.STATE_ROWS]
        size = "–" if m[M.STATE_BYTES] is None else _fmt_bytes(m[M.STATE_BYTES])
        state = f" in {m['slices']}'s" if shared else size
        print(f"  {name:<14}{m['mode']:<8}{m['slices'] or '–':<14}{m['rows']:>8,}{t[M.INPUT_ROWS]:>10,}"
              f"{t[M.LATE_ROWS]:>7,}{t[M.MALFORMED_ROWS]:>11,}{state:>12}")
    classes = [" + ".join(c) for c in g["slice_classes"]]
    print(f"  slice classes        {'; '.join(classes) or '–'} (one slicer pass and one table per class)")
    print(f"  group state          {g[M.STATE_ROWS]:,} rows, {_fmt_bytes(g[M.STATE_BYTES])} (each shared slice "
          f"table counted once)")
    for c in summary["checks"]:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']} ({c['detail']})")
    print(f"  report               {report_dir / 'report.html'} ({len(files)} files)")
