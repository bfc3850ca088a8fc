"""The adaptive runtime: statistics store, policy loop, and CQRuntime watching a real streaming query."""
from __future__ import annotations

import json
import math
import os
import threading
import time

import pytest

from pyspark_cq import control
from pyspark_cq.policies import Decision, Decisions, Policy, QoSRange, QueryInfo, Snapshot
from pyspark_cq.runtime import ControlTable, PolicyLoop, StatisticsStore
from pyspark_cq.runtime.stats import parse_event_time

S = 1_000_000


def progress(batch, *, rows=100, rate=50.0, duration=200, ts="2024-01-01T00:00:00.000Z", event_max=None,
             sources=None, state=None, observed=None, name="q"):
    """A StreamingQueryProgress as its JSON dict."""
    return {
        "id": "00000000-0000-0000-0000-000000000000", "runId": "00000000-0000-0000-0000-000000000001",
        "name": name, "timestamp": ts, "batchId": batch, "batchDuration": duration, "numInputRows": rows,
        "inputRowsPerSecond": rate, "processedRowsPerSecond": rate * 2, "durationMs": {},
        "eventTime": {} if event_max is None else {"max": event_max, "watermark": "1970-01-01T00:00:00.000Z"},
        "stateOperators": state or [], "sources": sources or [], "sink": {"description": "memory"},
        "observedMetrics": observed or {},
    }


# ---------------------------------------------------------------------------------------------
# statistics store


def test_store_smooths_rates_and_distances():
    store = StatisticsStore(alpha=0.5)
    store.register("q", operators=["op1"], sources={"clicks": "clicks", "fixed": 0.25})
    src = [{"description": "KafkaV2[Subscribe[clicks]]", "numInputRows": 100, "inputRowsPerSecond": 100.0}]
    store.update(progress(0, rate=100.0, sources=src, ts="2024-01-01T00:00:00.000Z",
                          observed={"op1": {"input_rows": 100, "output_rows": 20, "state_rows": 7,
                                            "state_bytes": 700, "late_rows": 1}}))
    src2 = [{"description": "KafkaV2[Subscribe[clicks]]", "numInputRows": 200, "inputRowsPerSecond": 200.0}]
    store.update(progress(1, rate=200.0, sources=src2, ts="2024-01-01T00:00:02.000Z",
                          state=[{"numRowsTotal": 11, "memoryUsedBytes": 1100, "numRowsDroppedByWatermark": 3}],
                          observed={"op1": {"input_rows": 200, "output_rows": 100, "state_rows": 9,
                                            "state_bytes": 900, "late_rows": 2}}))
    info = store.query_info("q")
    # single exponential smoothing, α = 0.5, first observation as level: 100 → 150
    assert info.batches == 2 and info.input_rate == pytest.approx(150.0)
    assert info.sources["clicks"].input_rate == pytest.approx(150.0)
    assert info.sources["clicks"].distance == pytest.approx(0.5 * 0.01 + 0.5 * 0.005)   # d = 1/λ smoothed
    assert info.sources["fixed"].distance == 0.25 and info.sources["fixed"].input_rate == 4.0
    op = info.operators["op1"]
    assert op.selectivity == pytest.approx(0.5 * 0.2 + 0.5 * 0.5)
    assert op.input_rate == pytest.approx(100.0)          # 200 rows over the 2 s between the two progresses
    assert (op.state_rows, op.state_bytes, op.late_rows, op.late_rows_total) == (9, 900, 2, 3)
    assert (info.state_rows, info.state_bytes, info.late_rows_total) == (11, 1100, 3)
    assert info.batch_duration == pytest.approx(0.2)
    assert op.report == {"input_rows": 200, "output_rows": 100, "state_rows": 9, "state_bytes": 900, "late_rows": 2}


def test_store_keeps_the_report_of_the_last_batch_with_arrivals():
    from pyspark_cq.policies.plan_stats import RoundEstimates

    store = StatisticsStore()
    store.register("q", operators=["f"])
    data = {"input_rows": 100, "output_rows": 10, "rows_in_a": 100, "rows_passed_a": 10, "nanos_a": 5000}
    store.update(progress(0, observed={"f": data}))
    est = RoundEstimates()
    assert est.observe(store.query_info("q").operators["f"]) and est.count("sel:a") == 1
    # Spark's no-data batch (it advances the watermark) reports no steps: the data batch's report stays
    store.update(progress(1, rows=0, observed={"f": {"input_rows": 0, "output_rows": 0, "state_rows": 3}}))
    op = store.query_info("q").operators["f"]
    assert op.report == data and op.report_batch == 1 and op.batches == 2 and op.input_rows == 0
    assert op.state_rows == 3                                  # state figures are the latest batch's
    assert not est.observe(op) and est.count("sel:a") == 1     # the same report is no new round
    store.update(progress(2, observed={"f": dict(data, rows_passed_a=20)}))
    op = store.query_info("q").operators["f"]
    assert op.report_batch == 3 and est.observe(op) and est.count("sel:a") == 2


def test_store_ignores_unknown_queries_and_repeated_batches():
    store = StatisticsStore()
    store.register("q")
    assert store.update(progress(0, name="other")) is None
    assert store.update(progress(3)) == "q"
    assert store.update(progress(3)) is None and store.query_info("q").batches == 1
    assert math.isnan(store.query_info("q").sources.get("x", QueryInfo("q").batch_duration))


def test_store_event_time_advance():
    store = StatisticsStore(alpha=0.5)
    store.register("q")
    store.update(progress(0, event_max="2024-01-01T00:00:10.000Z"))
    store.update(progress(1, event_max="2024-01-01T00:00:12.000Z"))
    event, advance = store.event_time_lead("q")
    assert event == parse_event_time("2024-01-01T00:00:12.000Z") and advance == pytest.approx(2.0)
    assert parse_event_time("1970-01-01T00:00:01.500Z") == 1_500_000


def test_store_watermark_delay_and_batch_span():
    """δ = the previous batches' largest event time − the batch's watermark, B = the event-time advance,
    both smoothed; None until measured (an epoch watermark is no watermark); the QueryInfo pickles."""
    import pickle

    store = StatisticsStore(alpha=0.5)
    store.register("q")
    assert (store.query_info("q").watermark_delay, store.query_info("q").batch_span) == (None, None)
    store.update(progress(0, event_max="2024-01-01T00:00:10.000Z"))            # watermark 1970: none yet
    assert store.query_info("q").watermark_delay is None
    for batch, (event, wm) in enumerate([("00:00:12", "00:00:08"), ("00:00:15", "00:00:09")], start=1):
        p = progress(batch, event_max=f"2024-01-01T{event}.000Z")
        p["eventTime"]["watermark"] = f"2024-01-01T{wm}.000Z"
        store.update(p)
    info = store.query_info("q")
    # δ: 10 − 8 = 2 s, then 12 − 9 = 3 s → 2.5; B: 2 s, then 3 s → 2.5 (α = 0.5)
    assert info.watermark_delay == pytest.approx(2.5) and info.batch_span == pytest.approx(2.5)
    back = pickle.loads(pickle.dumps(Snapshot(0.0, {"q": info}))).queries["q"]
    assert (back.watermark_delay, back.batch_span) == (info.watermark_delay, info.batch_span)


def test_store_validation():
    store = StatisticsStore()
    with pytest.raises(ValueError, match="alpha"):
        StatisticsStore(alpha=1.5)
    with pytest.raises(TypeError, match=r"sources\['s'\]"):
        store.register("q", sources={"s": -1})
    with pytest.raises(KeyError, match="no statistics for query 'zz'"):
        store.query_info("zz")


# ---------------------------------------------------------------------------------------------
# policy loop


class SetDrop(Policy):
    name = "set-drop"

    def __init__(self, ratio=0.5, operator="op1"):
        self.ratio, self.operator = ratio, operator

    def decide(self, snapshot):
        if not snapshot.queries:
            return Decisions((), self.name)
        return Decisions([Decision(self.operator, {"drop_ratio": self.ratio}, "test")], self.name)


class Exploding(Policy):
    name = "exploding"

    def decide(self, snapshot):
        raise RuntimeError("boom")


class TooBig(Policy):
    name = "too-big"

    def decide(self, snapshot):
        return Decisions([Decision("op1", {"window": 3600 * S}, "greedy")], self.name)


@pytest.fixture
def table(tmp_path):
    t = ControlTable(str(tmp_path / "ct.json"))
    t.register("op1", query="q", window=10 * S, drop_ratio=0.0)
    return t


def _snapshot():
    qos = {"op1.window": QoSRange.window(S, 60 * S)}
    return Snapshot(1.0, {"q": QueryInfo("q", qos=qos, control={"op1": {"window": 10 * S}})})


def test_loop_applies_decisions_and_survives_broken_policies(table):
    loop = PolicyLoop([Exploding(), TooBig(), SetDrop(0.3), SetDrop(0.4, operator="ghost")], table)
    with pytest.warns(RuntimeWarning) as caught:
        records = loop.run(_snapshot())
    messages = " ".join(str(w.message) for w in caught)
    assert "boom" in messages and "outside its QoS range" in messages and "'ghost'" in messages
    assert [r["applied"] for r in records] == [False, False, True, False]
    assert "RuntimeError: boom" in records[0]["error"]
    assert table.entry("op1").params["drop_ratio"] == 0.3 and table.entry("op1").params["window"] == 10 * S
    assert table.changes("op1")[-1].who == "set-drop"
    assert len(loop.log()) == 4 and loop.rounds == 1


def test_loop_rejects_non_decisions(table):
    class Sloppy(Policy):
        name = "sloppy"

        def decide(self, snapshot):
            return [Decision("op1", {"drop_ratio": 0.1})]

    loop = PolicyLoop([Sloppy()], table)
    with pytest.warns(RuntimeWarning, match="not Decisions"):
        (rec,) = loop.run(_snapshot())
    assert rec["applied"] is False and table.entry("op1").params["drop_ratio"] == 0.0


# ---------------------------------------------------------------------------------------------
# CQRuntime on Spark


class _Batches:
    """The sink's micro-batches as (batch id, values, control-table versions), oldest first, kept in files: a
    foreachBatch function runs in the driver's process on classic Spark but in a Python process of the server
    on Spark Connect (tests/test_connect.py runs these tests through it)."""

    def __init__(self, path):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)

    def __iter__(self):
        for name in sorted(os.listdir(self.path)):
            if name.endswith(".json"):
                with open(os.path.join(self.path, name)) as f:
                    b = json.load(f)
                yield b["batch"], b["values"], set(b["versions"])


def _filter_builder(values_seen: _Batches):
    """rate source -> mapInArrow drop filter reading the control table at every micro-batch -> foreachBatch."""

    def build(ctx):
        import numpy as np
        import pyarrow as pa
        from pyspark.sql import functions as F

        from pyspark_cq.operators._common import metrics as _metrics

        handle = ctx.control("shed1", drop_ratio=0.0)

        def shed(batches):
            entry = handle.entry()                       # read once per micro-batch and partition
            ratio = entry.get("drop_ratio", 0.0) if entry else 0.0
            version = entry.version if entry else 0
            cut = int(round(ratio * 10))
            for b in batches:
                value = b.column("value").to_numpy()
                keep = (value % 10) >= cut               # drops a share `ratio` of consecutive values
                yield pa.RecordBatch.from_arrays(
                    [b.column("value"), pa.array(keep), pa.array(np.full(len(value), version, dtype=np.int64))],
                    names=["value", "keep", "ctl_version"])

        src = ctx.spark.readStream.format("rate").option("rowsPerSecond", 200).option("numPartitions", 1).load()
        raw = src.select("value").mapInArrow(shed, "value long, keep boolean, ctl_version long")
        out = _metrics.attach(raw, "shed1", {"input_rows": F.count(F.lit(1)),
                                            "output_rows": F.sum(F.col("keep").cast("long"))},
                             keep=F.col("keep"), drop=["keep"])

        path = values_seen.path

        def sink(df, batch_id):
            import json
            import os

            rows = df.collect()
            record = {"batch": batch_id, "values": [r.value for r in rows],
                      "versions": sorted({r.ctl_version for r in rows})}
            tmp = os.path.join(path, f".{batch_id}.tmp")
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, os.path.join(path, f"{batch_id:09d}.json"))

        return out.writeStream.foreachBatch(sink).trigger(processingTime="250 milliseconds")

    return build


class DropWhenBusy(Policy):
    """Sets drop_ratio 0.8 once the query has run a few batches (a stand-in for a load-shedding policy)."""

    name = "drop-when-busy"

    def decide(self, snapshot):
        q = snapshot.queries.get("shedder")
        if q is None or q.batches < 2 or q.control.get("shed1", {}).get("drop_ratio") == 0.8:
            return Decisions((), self.name)
        return Decisions([Decision("shed1", {"drop_ratio": 0.8}, "busy", query="shedder")], self.name)


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


@pytest.mark.spark
@pytest.mark.slow
def test_runtime_change_reaches_running_query_within_two_batches(spark, tmp_path):
    from pyspark_cq.runtime import CQRuntime

    seen = _Batches(tmp_path / "batches")
    lock = threading.Lock()
    rt = CQRuntime(spark, policies=[], control_path=str(tmp_path / "ct.json"), every_batches=1)
    rt.register("shedder", _filter_builder(seen), sources={"rate": "Rate"})
    with rt:
        _wait(lambda: sum(1 for b in seen if b[1]) >= 3, 120, "three batches with data")
        with lock:
            last_done = max(b[0] for b in seen)          # batch last_done + 1 may be in flight
        table = rt.control_table()
        table.set("shed1", drop_ratio=0.5, reason="user test", who="tester")
        new_version = table.entry("shed1").version
        _wait(lambda: sum(1 for b in seen if b[0] >= last_done + 2 and b[1]) >= 2, 120, "two batches after")
        stats = rt.statistics()
    before = [b for b in seen if b[0] <= last_done and b[1]]
    after = [b for b in seen if b[0] >= last_done + 2 and b[1]]
    # the behaviour before: every residue kept; after (at most two batches later): residues 0-4 dropped
    assert any(v % 10 < 5 for b in before for v in b[1])
    assert all(v % 10 >= 5 for b in after for v in b[1])
    assert all(b[2] == {new_version} for b in after)
    # the statistics filled from the listener
    q = stats.queries["shedder"]
    assert q.batches >= 3 and q.input_rate > 0 and 0 < q.sources["rate"].distance < 1
    op = q.operators["shed1"]
    assert op.batches >= 3 and op.input_rows > 0 and 0.4 <= op.selectivity <= 1.0
    assert table.changes("shed1")[-1].who == "tester"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:policy 'exploding'")
def test_runtime_policy_loop_drives_query_and_survives_broken_policy(spark, tmp_path):
    """Policies by instance and by entry-point name (the PIPES resource manager plugin), one of them broken,
    one unknown: the runtime skips the unknown one, logs the broken one's failures, applies the others."""
    from pyspark_cq import plan as P
    from pyspark_cq.runtime import CQRuntime

    seen = _Batches(tmp_path / "batches")
    with pytest.warns(RuntimeWarning):
        rt = CQRuntime(spark, policies=[Exploding(), DropWhenBusy(), "pipes", "no-such-policy"],
                       memory_budget=400_000, control_path=str(tmp_path / "ct.json"), every_batches=1)
    assert [p.name for p in rt.policies] == ["exploding", "drop-when-busy", "pipes"]
    assert any("no-such-policy" in p for p in rt.problems)
    # for the resource manager: a sliding aggregate over the rate source whose window it may size in [1 s, 60 s]
    plan = P.Aggregate(P.Window(P.Source("rate"), 60 * S, label="shed1.window"))
    qos = {"shed1.window": QoSRange.window("1 second", "60 seconds")}
    rt.register("shedder", _filter_builder(seen), plan=plan, qos=qos, sources={"rate": "Rate"})
    with rt:
        _wait(lambda: any(r["policy"] == "drop-when-busy" and r["decisions"] for r in rt.decisions_log()),
              120, "the policy's decision")
        applied = next(r for r in rt.decisions_log() if r["policy"] == "drop-when-busy" and r["decisions"])
        version = rt.control_table().entry("shed1").version      # later versions keep drop_ratio 0.8
        _wait(lambda: sum(1 for b in seen if b[2] and min(b[2]) >= version and b[1]) >= 2, 120,
              "batches with the decision")
        _wait(lambda: any(r["policy"] == "pipes" and r["decisions"] for r in rt.decisions_log()), 120,
              "the resource manager's decision")
    assert applied["applied"] and rt.control_table().entry("shed1").params["drop_ratio"] == 0.8
    assert any(r["policy"] == "exploding" and "boom" in (r["error"] or "") for r in rt.decisions_log())
    late = [b for b in seen if b[2] and min(b[2]) >= version and b[1]]
    assert all(v % 10 >= 8 for b in late for v in b[1])
    assert not rt.running and not rt.query("shedder").isActive
    # the resource manager sized the window so that the estimate fits 90 % of the 400 kB budget (10 % reserve)
    rm = rt.policies[2]
    window = rt.control_table().entry("shed1").params["window"]
    assert 1 * S <= window < 60 * S and rm.allocation.memory <= 0.9 * 400_000
    assert rm.allocation.memory >= 0.85 * 400_000
    assert any(c.who == "pipes" and "window" in c.new for c in rt.control_table().changes("shed1"))


@pytest.mark.spark
def test_control_table_through_hadoop_filesystem(spark, tmp_path):
    """Driver writes through the JVM's Hadoop FileSystem; a worker-style reader reads via pyarrow.fs."""
    uri = f"file://{tmp_path}/hadoop/ct.json"
    t = ControlTable(uri, spark=spark, backend="hadoop")
    t.register("op", window=10 * S)
    t.set("op", window=20 * S, reason="via hadoop")
    t.set("op", window=30 * S, reason="again")
    control.clear_cache()
    e = control.entry(uri, "op")
    assert e.params["window"] == 30 * S and e.version == 3
    assert [c.reason for c in t.changes("op")] == ["registered", "via hadoop", "again"]
    assert not list((tmp_path / "hadoop").glob("*.tmp"))


def test_runtime_rejects_bad_arguments(tmp_path):
    from pyspark_cq.runtime import CQRuntime

    with pytest.raises(TypeError, match="SparkSession"):
        CQRuntime(object())


def test_explain_error_finds_the_workers_sentence():
    """A worker's error inside Spark's report: the last Python traceback through pyspark-cq gives the
    sentence; a failure raised elsewhere gives None; bad input is refused."""
    import pyspark_cq as cq

    ours = ('[STREAM_FAILED] Query [id = 1] terminated with exception: Traceback (most recent call last):\n'
            '  File "/usr/lib/pyspark/worker.py", line 10, in main\n'
            '  File "/site/pyspark_cq/operators/_join_worker.py", line 219, in restore\n'
            '    raise ValueError(msg)\n'
            'ValueError: shards: written with shards=4, the query now has shards=8. SQLSTATE: 39000\n'
            '=== Streaming Query ===\n\tat org.apache.spark.sql.Foo(Foo.scala:1)\n')
    assert cq.explain_error(ours) == "ValueError: shards: written with shards=4, the query now has shards=8."
    assert cq.explain_error(RuntimeError(ours)).startswith("ValueError: shards:")
    theirs = ('Traceback (most recent call last):\n  File "/home/u/udf.py", line 3, in f\n'
              'ZeroDivisionError: division by zero\n')
    assert cq.explain_error(theirs) is None
    assert cq.explain_error("[STREAM_FAILED] java.lang.OutOfMemoryError") is None
    with pytest.raises(TypeError, match="exc"):
        cq.explain_error(None)
