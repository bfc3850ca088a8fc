"""Crash recovery by fault injection: SIGKILL a streaming query at random moments, restart it on the same
checkpoint, and compare the file sink with an uninterrupted run (issue 23, docs/reliability.md).

Each operator runs in a child process (its own JVM): a file source with ``maxFilesPerTrigger``, a
watermark, a checkpoint and a parquet file sink, ``trigger(availableNow=True)``. The parent watches the
checkpoint and the sink's ``_spark_metadata`` log and kills the child's whole process group (Python
driver, JVM, Python workers) with SIGKILL at a randomly chosen moment:

* ``batch``   -- a micro-batch is in flight (its offsets are logged, its commit is not);
* ``state``   -- the first state-store file of the in-flight batch's version has appeared (the state
  commit is under way: other partitions may not have committed yet);
* ``sink``    -- the sink's log holds the batch, the checkpoint's commit log does not (Spark's "replay
  window": on restart the file sink skips the batch);
* ``between`` -- right after a batch's commit, before the next batch is planned.

It restarts the child until all input is read; the last child reads the sink back as a batch DataFrame
(which honours the sink's ``_spark_metadata`` log) and dumps its rows. Lost rows are rows of the
uninterrupted run missing from the killed run's sink (as a multiset); duplicated rows are rows that occur
more often there. The interval join's three kinds of state persistence read the same inputs and write the same
rows: in one invocation (``--operator all`` or a list), the first one's reference run is the others' too. Modes:

* ``kill`` (default): the SIGKILLs above.
* ``worker``: the query runs once (master ``local[2,4]``: a task may fail 3 times) and the parent kills
  one of Spark's busy Python workers (a process forked by the Python daemon whose CPU time grows) during
  batches; ``failed_tasks`` counts the task attempts that failed (one per kill that landed).
* ``control``: ``sliding_aggregate`` under a control table whose granularity / window entries the
  parent changes between kills, at event times ahead of the data read so far; the reference run uses
  the final table (the same decisions).

``--together`` (``kill`` mode): the listed operators' queries run at once in one child (one Spark session), each on
its own inputs, checkpoint and sink under ``<workdir>/together-kill/<operator>``. Each kill aims at a phase of one
query still reading (chosen at random) and hits every query in whatever phase it is in (each operator's
``kill_log`` records its own; ``all_read``: all its files' batches committed); one restarted child finishes them
all and, beside them, runs the reference queries uninterrupted from empty checkpoints (they start only in the child
no kill is aimed at); one result per operator, as without it. That is 1 + kills JVM starts for all operators
instead of 2 + kills per operator: the quick test (tests/test_fault_injection.py) runs so.

Usage::

    python -m benchmarks.experiments.fault_injection --operator all --kills 20 --seed 1 --out fi.json
    python -m benchmarks.experiments.fault_injection --operator interval_join --kills 2 --out quick.json
    python -m benchmarks.experiments.fault_injection --operator interval_join,query_group --together --kills 1 \
        --files 6 --seed 5 --out together.json

Every child starts Spark: run it under ``/work/bin/sparkslot`` on a shared machine (one child at a time).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pyspark_cq.experiments.recovery import compare

from .. import harness

FILES = 24             # input files per source; one file per micro-batch
PERIOD_S = 10          # event-time span of one file
DELAY = "10 seconds"   # watermark delay: with PERIOD_S, no row is ever late (see docs/reliability.md)
T0_S = 1_767_225_600   # 2026-01-01T00:00:00Z
SEC = 1_000_000
MASTER = "local[2,4]"  # two cores, a failed task is retried up to 3 times
#: ``--together``'s reference runs: sink, checkpoint and rows under ``<root>/<operator>``
REFERENCE = ("sink_reference", "ck_reference", "rows_reference.json")

# operator -> (input names, rows per file per input, keys)
DATA = {
    "interval_join": (("l", "r"), 200, 40),
    "interval_join_changelog": (("l", "r"), 200, 40),   # state_persistence="changelog" (issue 39)
    "interval_join_files": (("l", "r"), 200, 40),       # state_persistence="files": state files beside the checkpoint
    "interval_join_stateless": (("l", "r"), 200, 40),   # "stateless": no stateful Spark operator, state in files
    "sliding_aggregate_windows": (("in",), 1500, 30),
    "sliding_aggregate_changes": (("in",), 1500, 30),
    "sliding_aggregate_files": (("in",), 1500, 30),   # state="files": a stateless stage, state files (issue 39)
    "window": (("in",), 1500, 30),
    "granularity": (("in",), 1500, 30),
    "multi_join": (("a", "b", "c"), 150, 40),
    "multi_join_files": (("a", "b", "c"), 150, 40),     # state_persistence="files" (issue 39)
    "multi_join_stateless": (("a", "b", "c"), 150, 40),   # "stateless": no stateful Spark operator, state in files
    "select_chain": (("in",), 1500, 30),
    "spark_window": (("in",), 1500, 30),
    "query_group": (("in",), 1500, 30),   # a pyspark_cq.QueryGroup of GROUP_QUERIES, one sink each (issue 40)
    "query_group_streams": (("s", "t"), 800, 30),   # a QueryGroup over two streams (GROUP_STREAMS_QUERIES)
}
OPERATORS = list(DATA)
#: Operators whose uninterrupted run gives exactly another's rows on the same inputs (only where the state is kept
#: differs): in one invocation, the first of them to run makes the reference run for all (one JVM start less each).
SAME_ROWS = {"interval_join_changelog": "interval_join", "interval_join_files": "interval_join",
             "interval_join_stateless": "interval_join",
             "multi_join_files": "multi_join", "multi_join_stateless": "multi_join"}
assert all(DATA[op] == DATA[ref] for op, ref in SAME_ROWS.items())   # the same inputs, so the same reference
JOINS = ("interval_join", "interval_join_changelog", "interval_join_files", "interval_join_stateless", "multi_join",
         "multi_join_files", "multi_join_stateless")   # per-input time columns ts_<input>
STATEFUL = {"interval_join", "interval_join_changelog", "interval_join_files", "interval_join_stateless",
            "sliding_aggregate_windows", "sliding_aggregate_changes", "sliding_aggregate_files",
            "multi_join", "multi_join_files", "multi_join_stateless", "spark_window", "query_group", "query_group_streams"}
#: The query group's queries over the stream ``s`` (the input ``in``): shared aggregations (one with HAVING, one
#: ISTREAM) and one stateless query running alone.
GROUP_QUERIES = {
    "w20": "RSTREAM(SELECT k, SUM(v) AS s, COUNT(*) AS n FROM s [RANGE 20 SECONDS SLIDE 5 SECONDS] GROUP BY k)",
    "w10": "RSTREAM(SELECT k, MAX(v) AS m FROM s [RANGE 10 SECONDS SLIDE 10 SECONDS] WHERE v > 0 GROUP BY k "
           "HAVING COUNT(*) > 1)",
    "changes": "ISTREAM(SELECT k, MIN(v) AS lo FROM s [RANGE 10 SECONDS SLIDE 5 SECONDS] WHERE k < 10 GROUP BY k)",
    "big": "ISTREAM(SELECT k, v FROM s [RANGE 5 SECONDS] WHERE v > 900)",
}
#: The two-stream group's queries: shared aggregations over ``s`` (watermark delay DELAY) and over ``t`` (delay
#: T_DELAY: each stream's windows close at its own watermark, recorded in the group's plan per micro-batch), two of
#: them sharing one slice table, and a query running alone.
GROUP_STREAMS_QUERIES = {
    "s20": "RSTREAM(SELECT k, SUM(v) AS s, COUNT(*) AS n FROM s [RANGE 20 SECONDS SLIDE 5 SECONDS] GROUP BY k)",
    "t10": "RSTREAM(SELECT k, MAX(v) AS m, COUNT(*) AS n FROM t [RANGE 10 SECONDS SLIDE 5 SECONDS] GROUP BY k)",
    "t20": "RSTREAM(SELECT k, MAX(v) AS m, COUNT(*) AS n FROM t [RANGE 20 SECONDS SLIDE 5 SECONDS] GROUP BY k)",
    "big": "ISTREAM(SELECT k, v FROM t [RANGE 5 SECONDS] WHERE v > 900)",
}
GROUPS = {"query_group": GROUP_QUERIES, "query_group_streams": GROUP_STREAMS_QUERIES}
T_DELAY = "4 seconds"
AGGS = {"v": ["sum", "max", "min", "avg"], "*": ["count"]}


# ---- input ------------------------------------------------------------------------------------------

def write_inputs(root: Path, operator: str, seed: int, tight: bool = False, files: int = FILES,
                 scale: int = 1) -> None:
    """``files`` parquet files per input; file i holds times in [i·P, (i+1)·P) (shuffled), so the
    watermark after file i (its max time minus the delay) never passes a row of file i+1. With ``tight``
    (Spark's replay-window trap), file i also holds 5 % rows about 41–48 s old: late in an uninterrupted
    run, not late if the batch runs with the watermark one batch behind. ``scale`` multiplies the rows per
    file (and, for the joins, the keys, so that their output grows in proportion): longer batches, for
    ``--mode worker``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names, rows, keys = DATA[operator]
    rows *= scale
    if operator in JOINS:
        keys *= scale
    rng = np.random.default_rng(seed)
    for name in names:
        d = root / "input" / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            t = (T0_S + i * PERIOD_S) * 1000 + rng.integers(0, PERIOD_S * 1000, rows)
            if tight and i > 4:
                # Latest window (20 s, slide 5 s) containing such a row ends in (i·P - 30 s, i·P - 20 s]:
                # at or before the late-event watermark of its batch (the watermark of batch i - 1, i·P - 20 s)
                # so late in an uninterrupted run, after it if the batch runs with the watermark one batch behind.
                behind = (T0_S + i * PERIOD_S - 41) * 1000 - rng.integers(1, 7000, rows // 20)
                t = np.concatenate([t, behind])
            n = len(t)
            cols = {"ts": pa.array(t * 1000, pa.timestamp("us", tz="UTC")),
                    "k": pa.array(rng.integers(0, keys, n), pa.int64()),
                    "v": pa.array(rng.integers(-1000, 1000, n), pa.int64())}
            if operator in JOINS:
                cols = {f"{c}_{name}" if c != "k" else "k": a for c, a in cols.items()}
            path = d / f"part-{i:03d}.parquet"
            pq.write_table(pa.table(cols), path)
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))   # the file source's order


# ---- the child: one query run on the checkpoint -------------------------------------------------------

def _big(batch):
    """A vectorised predicate (runs in the Python workers): |v| > 100."""
    import pyarrow.compute as pc
    return pc.greater(pc.abs(batch.column("v")), 100)


def build(spark, operator: str, root: Path, control: str | None, checkpoint: str | None = None):
    from pyspark.sql import functions as F

    import pyspark_cq as cq

    names = DATA[operator][0]

    def src(name):
        df = (spark.readStream.option("maxFilesPerTrigger", 1).schema(_schema(operator, name))
              .parquet(str(root / "input" / name)))
        time_col = f"ts_{name}" if operator in JOINS else "ts"
        return df.withWatermark(time_col, DELAY)

    if operator.startswith("interval_join"):
        # interval_join: the default ("auto": files under the warehouse and the query's id)
        persistence = {"interval_join_changelog": "changelog", "interval_join_files": "files",
                       "interval_join_stateless": "stateless"}.get(operator)
        # files, stateless: one state directory per run, kept with (beside) the run's checkpoint
        state_dir = str(checkpoint) + "_state" if persistence in ("files", "stateless") else None
        return cq.interval_join(src("l"), src("r"), "k", "ts_l", "ts_r", "-5 seconds", "5 seconds", shards=4,
                                name="fi", state_persistence=persistence, snapshot_every=3, state_dir=state_dir)
    if operator.startswith("sliding_aggregate"):
        handle = None
        if control:
            from pyspark_cq.control import ControlTable
            handle = ControlTable(control).handle("agg")
        if operator == "sliding_aggregate_files":   # its state directory beside the run's checkpoint
            return cq.sliding_aggregate(src("in"), "ts", "20 seconds", "5 seconds", by="k", aggs=AGGS, shards=4,
                                        name="fi", control=handle, state="files", state_dir=str(checkpoint) + "_state")
        emit = operator.rsplit("_", 1)[1]
        return cq.sliding_aggregate(src("in"), "ts", "20 seconds", "5 seconds", by="k", aggs=AGGS, emit=emit,
                                    shards=4, name="fi", control=handle)
    if operator == "spark_window":
        return (src("in").groupBy(F.window("ts", "20 seconds", "5 seconds"), "k")
                .agg(F.sum("v").alias("sum_v"), F.max("v").alias("max_v"), F.min("v").alias("min_v"),
                     F.avg("v").alias("avg_v"), F.count(F.lit(1)).alias("count"))
                .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                        "k", "sum_v", "max_v", "min_v", "avg_v", "count"))
    if operator == "window":
        return cq.window(src("in"), "ts", size="7 seconds", name="fi")
    if operator == "granularity":
        return cq.granularity(cq.window(src("in"), "ts", size="7 seconds"), "valid_from", "valid_to", "2 seconds",
                              name="fi")
    if operator.startswith("multi_join"):
        # files, stateless: the state directory beside the run's checkpoint; multi_join: the default ("auto")
        persistence = {"multi_join_files": "files", "multi_join_stateless": "stateless"}.get(operator)
        return cq.multi_join([src(n) for n in names], "k", [f"ts_{n}" for n in names],
                             [(0, 1, "-3 seconds", "3 seconds"), (1, 2, "0 seconds", "4 seconds")], name="fi",
                             state_persistence=persistence, snapshot_every=3,
                             state_dir=str(checkpoint) + "_state" if persistence else None)
    if operator == "select_chain":
        return cq.select_chain(src("in"), {"even": F.col("v") % 2 == 0, "big": _big}, name="fi")
    raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")


def _schema(operator, name):
    if operator in JOINS:
        return f"ts_{name} timestamp, k long, v_{name} long"
    return "ts timestamp, k long, v long"


def child(args) -> int:
    root = Path(args.root)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark_cq as cq

    spark = cq.spark(MASTER, "fault-injection", shuffle_partitions=2,
                     conf={"spark.sql.streaming.metricsEnabled": "false", "spark.sql.adaptive.enabled": "false",
                           "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
                           "spark.ui.enabled": "false",
                           # the joins' default state files (state_persistence="auto") kept with the run
                           "spark.sql.warehouse.dir": str(root / "warehouse")})
    spark.sparkContext.setLogLevel("ERROR")
    if args.together:   # every operator its own query, under <root>/<operator>; --sink etc. are names there
        runs = [(op, root / op, str(root / op / args.sink), str(root / op / args.checkpoint),
                 str(root / op / args.dump), None) for op in args.operator.split(",")]
        # --references: the uninterrupted reference queries as well, beside the restarted ones (their own inputs,
        # empty checkpoints and sinks): one JVM start fewer than a child of their own (issue 41)
        sink, ck, dump = REFERENCE
        runs += [(op, root / op, str(root / op / sink), str(root / op / ck), str(root / op / dump), "reference")
                 for op in filter(None, (args.references or "").split(","))]
        for _, _, sink, ck, _, tag in runs:   # uninterrupted: from nothing, even in a child started again
            if tag == "reference":
                for d in (sink, ck, ck + "_state"):
                    shutil.rmtree(d, ignore_errors=True)
    else:
        runs = [(args.operator, root, args.sink, args.checkpoint, args.dump, None)]
    queries = [_start_query(spark, op, d, args.control, ck, sink, tag) for op, d, sink, ck, _, tag in runs]
    (root / f"alive.{os.getpid()}").touch()     # the parent arms its kill only once the queries run
    for q in queries:
        q.awaitTermination()
    for op, _, sink, _, dump, _ in runs:
        _dump(spark, op, sink, dump)
    spark.stop()
    return 0


def _start_query(spark, operator: str, root: Path, control: str | None, checkpoint: str, sink: str,
                 tag: str | None = None):
    """Start ``operator``'s query on the inputs under ``root`` (``trigger(availableNow=True)``); ``tag`` names a
    query group apart from another one of the session (Spark refuses two active queries of one name)."""
    if operator in GROUPS:
        return _start_group(spark, operator, root, checkpoint, sink, tag)
    out = build(spark, operator, root, control, checkpoint)
    # a child killed while it wrote its first offset leaves a temporary Spark 4 then refuses to start on
    from pyspark_cq import clear_unstarted_checkpoint
    clear_unstarted_checkpoint(checkpoint)
    return (out.writeStream.format("parquet").option("path", sink).outputMode("append")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def _start_group(spark, operator: str, root: Path, checkpoint: str, sink: str, tag: str | None = None):
    """The ``query_group`` (``query_group_streams``) query: the group writes each query into ``<sink>/<name>`` (the
    group's Spark checkpoint is ``<checkpoint>/spark``); its name is ``cq_group``, or ``cq_group_<tag>``."""
    import pyspark_cq as cq

    def src(name, delay):
        return (spark.readStream.option("maxFilesPerTrigger", 1).schema(_schema(operator, name))
                .parquet(str(root / "input" / name)).withWatermark("ts", delay))

    sources = ({"s": src("in", DELAY)} if operator == "query_group" else
               {"s": src("s", DELAY), "t": src("t", T_DELAY)})
    g = cq.QueryGroup(spark, sources=sources, checkpoint=checkpoint, shards=4,
                      name=f"cq_group_{tag}" if tag else "cq_group")
    for name, text in GROUPS[operator].items():
        g.add(name, text, sink=os.path.join(sink, name))
    return g.start(trigger={"availableNow": True})


def _dump(spark, operator: str, sink: str, dump: str) -> None:
    """Write the rows of ``operator``'s sink (read back as a batch DataFrame) to ``dump`` as JSON; for
    a query group every query's rows, each led by the query's name."""
    if operator in GROUPS:
        rows, columns = [], {}
        for name in GROUPS[operator]:
            df = spark.read.parquet(os.path.join(sink, name))
            columns[name] = df.columns
            rows += [[name, *[_plain(v) for v in r]] for r in df.collect()]
    else:
        df = spark.read.parquet(sink)
        rows, columns = [[_plain(v) for v in r] for r in df.collect()], df.columns
    tmp = Path(dump + ".tmp")
    tmp.write_text(json.dumps({"columns": columns, "rows": rows}))
    tmp.rename(dump)


def _plain(v):
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, float):
        return repr(v)
    return v


# ---- the parent: kills, restarts, comparison ----------------------------------------------------------

def _ids(d: Path) -> set[int]:
    try:
        return {int(n) for n in os.listdir(d) if n.isdigit()}
    except FileNotFoundError:
        return set()


def _state_versions(ck: Path) -> set[int]:
    """The state versions written under the checkpoint ``ck`` (batch n writes version n + 1), including those of
    ``sliding_aggregate(state="files")`` in ``<ck>_state`` (batch n writes ``v<n>-<token>``)."""
    from pyspark_cq.operators._common.batch_versions import parse_version

    found = set()
    for _, _, files in os.walk(ck / "state"):
        for f in files:
            stem, _, ext = f.partition(".")
            if stem.isdigit() and ext in ("delta", "changelog", "zip", "snapshot"):
                found.add(int(stem))
    for _, _, files in os.walk(f"{ck}_state"):
        found.update(v + 1 for v in map(parse_version, files) if v is not None)
    return found


def _spark_checkpoint(ck: Path) -> Path:
    """Spark's checkpoint: ``ck``, or for a query group its subdirectory ``spark`` (the group has no sink log)."""
    return ck / "spark" if (ck / "spark").is_dir() else ck


def _phase(ck: Path, sink: Path) -> tuple[str, int | None]:
    """What the query is doing now: (phase, in-flight batch)."""
    ck = _spark_checkpoint(ck)
    offsets, commits = _ids(ck / "offsets"), _ids(ck / "commits")
    pending = sorted(offsets - commits)
    if not pending:
        return "between", None
    n = pending[-1]
    if n in _ids(sink / "_spark_metadata"):
        return "sink", n
    if n + 1 in _state_versions(ck):   # batch n writes state version n + 1
        return "state", n
    return "batch", n


def _group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _start(args, root, sink, ck, dump, control=None, together=None, references=()):
    """A child; with ``together`` (operator names), one running all their queries, ``sink``, ``ck`` and ``dump``
    being names under ``root/<operator>``, and the uninterrupted queries of ``references`` (operator names) beside
    them, into ``REFERENCE``'s names."""
    cmd = [*harness.rerun(__spec__.name), "--child", "--operator", ",".join(together) if together else args.operator,
           "--root", str(root), "--sink", str(sink), "--checkpoint", str(ck), "--dump", str(dump)]
    if together:
        cmd.append("--together")
    if references:
        cmd += ["--references", ",".join(references)]
    if control:
        cmd += ["--control", control]
    log = open(root / "child.log", "ab")
    return subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)


def _wait_alive(proc, root) -> bool:
    marker = root / f"alive.{proc.pid}"
    while proc.poll() is None:
        if marker.exists():
            return True
        time.sleep(0.05)
    return False


def run_once(args, root: Path, tag: str, control: str | None = None) -> list:
    """An uninterrupted run; returns the sink's rows."""
    sink, ck, dump = root / f"sink_{tag}", root / f"ck_{tag}", root / f"rows_{tag}.json"
    proc = _start(args, root, sink, ck, dump, control)
    if proc.wait() != 0 or not dump.exists():
        raise RuntimeError(f"{tag} run failed; see {root / 'child.log'}")
    return json.loads(dump.read_text())["rows"]


def _phases(operator: str) -> list[str]:
    """The phases a kill of ``operator``'s query may aim at."""
    phases = ["batch", "state", "sink", "between"] if operator in STATEFUL else ["batch", "sink", "between"]
    if operator in GROUPS:   # its sinks keep no log: no "sink" phase to aim at
        phases.remove("sink")
    return phases


def run_killed(args, root: Path, rng, control_changes=None) -> tuple[list, list]:
    """Kill and restart until a child completes; returns (rows, kills as [phase, batch, seconds])."""
    sink, ck, dump = root / "sink_killed", root / "ck_killed", root / "rows_killed.json"
    kills = []

    def record(seconds):
        kills.append([*_phase(ck, sink), seconds])

    _kill_and_restart(
        args, root, rng,
        lambda: _start(args, root, sink, ck, dump, args.control_path if control_changes is not None else None),
        lambda: (ck, sink, _phases(args.operator)), dump.exists, record,
        (lambda: control_changes(ck)) if control_changes is not None else None)
    return json.loads(dump.read_text())["rows"], kills


def _kill_and_restart(args, root: Path, rng, start, aim, done, record, after_kill=None) -> None:
    """Start children (``start()``) and SIGKILL each at a random moment, ``args.kills`` times, then let one run to
    its end. ``aim()`` gives (checkpoint, sink, phases) of the query whose phase a kill aims at (one of the
    phases, chosen at random); ``done()`` says whether the child left its rows; ``record(seconds)`` notes a kill
    just before it, ``after_kill()`` runs after it."""
    kills = 0
    while True:
        proc = start()
        started = time.monotonic()
        if kills >= args.kills or not _wait_alive(proc, root):
            if proc.wait() == 0 and done():
                return
            if kills >= args.kills:
                raise RuntimeError(f"run after {kills} kills failed; see {root / 'child.log'}")
            continue      # died before the query started (should not happen): start again
        ck, sink, phases = aim()
        want = rng.choice(phases)
        skip = int(rng.integers(0, 2))       # sometimes let a batch commit first
        start_commits = len(_ids(_spark_checkpoint(ck) / "commits"))
        deadline = time.monotonic() + 120
        fired = None
        while proc.poll() is None and time.monotonic() < deadline:
            phase, n = _phase(ck, sink)
            if len(_ids(_spark_checkpoint(ck) / "commits")) - start_commits >= skip:
                if want == "batch" and phase in ("batch", "state"):
                    time.sleep(float(rng.uniform(0, 0.4)))
                    fired = True
                elif want == phase or (want == "between" and phase == "between"
                                       and len(_ids(_spark_checkpoint(ck) / "commits")) > start_commits):
                    fired = True
            if fired:
                break
            time.sleep(0.01)
        if proc.poll() is not None:    # finished (or failed) before the kill
            if proc.returncode == 0 and done():
                return
            raise RuntimeError(f"child failed with {proc.returncode}; see {root / 'child.log'}")
        record(round(time.monotonic() - started, 1))
        _group(proc)
        kills += 1
        if after_kill is not None:
            after_kill()


def run_together(args, base: Path, ops: list[str]) -> list[dict]:
    """``--together``: the queries of ``ops`` in one child (one Spark session), each on its own inputs, checkpoint
    and sink under ``<root>/<operator>``; each kill hits the child while a query chosen at random is in a phase
    chosen at random (the others are in whatever phase they are in: each one's is recorded); one child runs
    the reference queries (one per ``SAME_ROWS`` class): the restarted child no kill is aimed at, beside the
    restarted queries, or a child of their own when a child it meant to kill ended first. Returns one result per
    operator, as ``run_operator``."""
    rng = np.random.default_rng(args.seed)
    root = base / f"together-{args.mode}{'-tight' if args.tight else ''}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    refs = list(dict.fromkeys(SAME_ROWS.get(op, op) for op in ops))
    for op in dict.fromkeys([*ops, *refs]):
        write_inputs(root / op, op, args.seed, args.tight, args.files, args.rows_scale)
    t0 = time.monotonic()
    kills, aimed = {op: [] for op in ops}, []

    def aim():   # a query still reading (after a restart, the ended ones end again at once)
        running = [op for op in ops if len(_ids(_spark_checkpoint(root / op / "ck_killed") / "commits")) < args.files]
        op = (running or ops)[int(rng.integers(0, len(running or ops)))]
        aimed.append(op)
        return root / op / "ck_killed", root / op / "sink_killed", _phases(op)

    def record(seconds):
        for op in ops:
            phase, n = _phase(root / op / "ck_killed", root / op / "sink_killed")
            if phase == "between" and len(_ids(_spark_checkpoint(root / op / "ck_killed") / "commits")) >= args.files:
                phase = "all_read"  # every file's batch committed: at most the closing no-data batch was left
            kills[op].append([phase, n, seconds])

    def referenced():
        return all((root / op / REFERENCE[2]).exists() for op in refs)

    # each kill is aimed once (aim()): after args.kills of them the child runs to its end, with the references
    _kill_and_restart(args, root, rng, lambda: _start(args, root, "sink_killed", "ck_killed", "rows_killed.json",
                                                      together=ops, references=refs if len(aimed) >= args.kills
                                                      else ()),
                      aim, lambda: all((root / op / "rows_killed.json").exists() for op in ops), record)
    if not referenced():   # a child ended before its kill: the references did not run
        proc = _start(args, root, *REFERENCE, together=refs)
        if proc.wait() != 0 or not referenced():
            raise RuntimeError(f"reference run failed; see {root / 'child.log'}")
    seconds = round(time.monotonic() - t0, 1)
    results = []
    for op in ops:
        same = SAME_ROWS.get(op, op)
        expected = json.loads((root / same / REFERENCE[2]).read_text())["rows"]
        got = json.loads((root / op / "rows_killed.json").read_text())["rows"]
        results.append({"operator": op, "mode": args.mode, "tight": args.tight, "seed": args.seed, "reference": same,
                        "together": ops, "kills": len(kills[op]),
                        "kill_phases": dict(Counter(k[0] for k in kills[op])), "kill_log": kills[op],
                        "kills_aimed_at": aimed, "rows_scale": args.rows_scale,
                        "median_s_to_kill": float(np.median([k[2] for k in kills[op]])) if kills[op] else None,
                        **compare(expected, got), "seconds": seconds,
                        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                        "load": os.getloadavg()})
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return results


FAILED_TASK = "Exception in task"   # the executor's ERROR line for a failed task attempt


def run_worker_kills(args, root: Path, rng) -> tuple[list, list]:
    """One run; SIGKILL a busy Spark Python worker (a child of the Python daemon whose CPU time grew in two
    of the parent's looks in a row, i.e. one running a task) while a batch is in flight, until ``--kills``
    task attempts have failed, in as many different batches. An idle worker is not a target: Spark
    discards a dead idle worker when it takes it from its pool, and no task fails. A busy worker may be
    idle too: after each task a reused worker runs ``gc.collect()`` (``pyspark/daemon.py``), likely longer
    than a short task's own Python work. So a kill *lands* when the child's log shows a failed
    task within 1.5 s (the executor's ERROR line); a kill that does not is logged, and the parent tries
    again, at most 3 times per batch (``local[2,4]``: a 4th failure of one task would fail the query)."""
    sink, ck, dump = root / "sink_killed", root / "ck_killed", root / "rows_killed.json"
    log = root / "child.log"
    log_start = log.stat().st_size if log.exists() else 0
    proc = _start(args, root, sink, ck, dump)
    kills, landed, tries, cpu = [], set(), Counter(), {}
    pending, failed, size = None, 0, log_start     # pending: the last kill's time, until it lands or 1.5 s pass
    started = time.monotonic()
    _wait_alive(proc, root)
    while proc.poll() is None:
        if log.stat().st_size != size:
            size, count = log.stat().st_size, _log_text(log, log_start).count(FAILED_TASK)
            if count > failed and pending is not None:
                kills[-1][3] = True
                landed.add(kills[-1][1])
                pending = None
            failed = count
        if pending is not None and time.monotonic() - pending > 1.5:
            pending = None
        phase, n = _phase(ck, sink)
        if (pending is None and failed < args.kills and phase in ("batch", "state") and n not in landed
                and tries[n] < 3):
            now = _python_workers_cpu(proc.pid)
            grew = {p for p, t in now.items() if t > cpu.get(p, (t, 0))[0]}
            cpu = {p: (t, cpu.get(p, (t, 0))[1] + 1 if p in grew else 0) for p, t in now.items()}
            busy = sorted(p for p, (_, looks) in cpu.items() if looks >= 2)   # busy for two looks in a row
            if busy:
                try:
                    os.kill(int(rng.choice(busy)), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                pending = time.monotonic()
                kills.append(["worker", n, round(pending - started, 1), False])
                tries[n] += 1
                cpu = {}
        else:
            cpu = {}
        time.sleep(0.005)
    if proc.returncode != 0 or not dump.exists():
        raise RuntimeError(f"worker-kill run failed with {proc.returncode}; see {log}")
    # each landed kill fails one task attempt (Spark retries it)
    args.failed_tasks = _log_text(log, log_start).count(FAILED_TASK)
    return json.loads(dump.read_text())["rows"], kills


def _log_text(log: Path, offset: int) -> str:
    with open(log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _python_workers_cpu(session: int) -> dict[int, int]:
    """CPU time (clock ticks, user + system) of each Python worker of session ``session``."""
    out = {}
    for p in _python_workers(session):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[p] = int(fields[11]) + int(fields[12])
    return out


def _python_workers(session: int) -> list[int]:
    """Pids of the Python workers forked by the Python daemon (``pyspark.daemon``, or pyspark-cq's
    ``pyspark_cq._daemon`` that cq.spark() configures) of session ``session``."""
    procs = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session and (b"pyspark.daemon" in cmd or b"pyspark_cq._daemon" in cmd):
            procs[int(p)] = int(fields[1])          # pid -> parent pid
    return [p for p, parent in procs.items() if parent in procs]


def run_operator(args, base: Path, references: dict | None = None) -> dict:
    """One operator's kills (or worker kills, or control changes) and its reference run. ``references`` keeps the
    reference rows of this invocation's runs by their inputs, for the operators of ``SAME_ROWS``."""
    rng = np.random.default_rng(args.seed)
    root = base / f"{args.operator}-{args.mode}{'-tight' if args.tight else ''}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    write_inputs(root, args.operator, args.seed, args.tight, args.files, args.rows_scale)
    t0 = time.monotonic()
    changes = None
    if args.mode == "control":
        args.control_path = str(root / "control.json")
        changes = _control_schedule(args.control_path, rng)
    if args.mode == "worker":
        got, kills = run_worker_kills(args, root, rng)
    else:
        got, kills = run_killed(args, root, rng, changes)
    same = SAME_ROWS.get(args.operator, args.operator)
    key = (same, args.seed, args.tight, args.files, args.rows_scale)
    if changes is None and references is not None and key in references:
        expected = references[key]
    else:
        expected = run_once(args, root, "reference", getattr(args, "control_path", None) if changes else None)
        if changes is None and references is not None:
            references[key] = expected
    result = {"operator": args.operator, "mode": args.mode, "tight": args.tight, "seed": args.seed,
              "reference": same,
              "kills": len(kills), "kill_phases": dict(Counter(k[0] for k in kills)),
              "kill_log": kills, "rows_scale": args.rows_scale,
              "median_s_to_kill": float(np.median([k[2] for k in kills])) if kills and len(kills[0]) > 2 else None,
              **compare(expected, got), "seconds": round(time.monotonic() - t0, 1),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "load": os.getloadavg()}
    if args.mode == "worker":
        result["failed_tasks"] = args.failed_tasks
    if changes is not None:
        from pyspark_cq.control import ControlTable
        result["control_changes"] = len(ControlTable(args.control_path).changes("agg"))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


def _control_schedule(path: str, rng):
    """Register entry 'agg' (window 20 s, granularity 1 s) and return the hook that, after each kill,
    sets a new granularity or window at the start of a file two files past the last one planned."""
    from pyspark_cq.control import ControlTable
    table = ControlTable(path)
    table.register("agg", window=20 * SEC, granularity=SEC)

    def change(ck: Path):
        planned = max(_ids(ck / "offsets"), default=-1)
        at = (T0_S + (planned + 3) * PERIOD_S) * SEC     # batch b reads file b: file planned+3 is unread
        if rng.random() < 0.5:
            table.set("agg", granularity=int(rng.choice([1, 2, 5])) * SEC, at=at, reason="fault injection")
        else:
            table.set("agg", window=int(rng.choice([10, 20, 30])) * SEC, at=at, reason="fault injection")
    return change


def main(argv=None) -> int:
    p = harness.parser(__doc__)
    p.add_argument("--operator", default="all", help=f"one of {OPERATORS}, several separated by commas, or 'all'")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per operator (default 20)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--files", type=int, default=FILES, help=f"input files (micro-batches) per input (default {FILES})")
    p.add_argument("--rows-scale", type=int, default=1,
                   help="multiply the rows per input file (longer batches, for --mode worker; default 1)")
    p.add_argument("--mode", choices=["kill", "worker", "control"], default="kill")
    p.add_argument("--tight", action="store_true", help="rows just behind the watermark (replay-window trap)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--workdir", help="keep inputs, checkpoints and sinks here (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep each operator's directory")
    p.add_argument("--together", action="store_true",
                   help="run the operators' queries at once in one child (one Spark session): one killed child "
                        "per kill, one restart, one reference run for all (--mode kill only)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--root", "--sink", "--checkpoint", "--dump", "--control", "--references"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.kills < 0:
        p.error(f"--kills must be >= 0, got {args.kills}")
    if args.rows_scale < 1:
        p.error(f"--rows-scale must be >= 1, got {args.rows_scale}")
    if args.files < 2:
        p.error(f"--files must be >= 2, got {args.files}")
    ops = OPERATORS if args.operator == "all" else args.operator.split(",")
    for op in ops:
        if op not in OPERATORS:
            p.error(f"--operator must be one of {OPERATORS}, several separated by commas, or 'all', got {op!r}")
    if args.mode == "control" and ops != ["sliding_aggregate_windows"]:
        p.error("--mode control runs --operator sliding_aggregate_windows")
    if args.together and args.mode != "kill":
        p.error(f"--together runs --mode kill, got --mode {args.mode}")
    before = harness.start()
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="cq-fault-"))
    results, references = [], {}
    if args.together:
        try:
            results = run_together(args, base, ops)
        except Exception as exc:   # every operator's record says so
            results = [{"operator": op, "mode": args.mode, "together": ops, "error": repr(exc), "lost": None,
                        "duplicated": None, "unexpected": None} for op in ops]
        for r in results:
            print(json.dumps(r), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        ops = []
    for op in ops:
        args.operator = op
        try:
            r = run_operator(args, base, references)
        except Exception as exc:   # keep going: one operator's failure must not hide the others' numbers
            r = {"operator": op, "mode": args.mode, "error": repr(exc), "lost": None, "duplicated": None,
                 "unexpected": None}
        results.append(r)
        print(json.dumps(r), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    harness.write_result("fault_injection", results, args, before)
    return 0 if all(r["lost"] == r["duplicated"] == r["unexpected"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
