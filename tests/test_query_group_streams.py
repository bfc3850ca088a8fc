"""QueryGroup with windowed aggregations over several streams (issue 40): one slicer per stream, united into the
one stateful stage, each stream's members at that stream's own watermark. The oracle: each query alone
(``cq.cql``), as in tests/test_query_group.py; the planning (streams, slice classes, the checkpoint's layout, the
per-stream clocks) is tested without Spark.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pickle

import numpy as np
import pyarrow as pa
import pytest
from helpers.files import write_in_order
from test_query_group import Q, assert_same_rows, clicks_stream, write_clicks

import pyspark_cq as cq
from pyspark_cq.group import clock as C
from pyspark_cq.group import doc as D
from pyspark_cq.group.api import branches_of, check_layout
from pyspark_cq.group.worker import slice_classes

T0 = 1_704_067_200_000_000  # 2024-01-01 UTC, µs
VIEWS = "ts timestamp, page string, x long"

#: c_1m and v_1m differ only in their stream: the same projection columns and configuration, yet each slices its
#: own stream (c_1m, alone in its class, on a table of its own); v_2m shares v_1m's table; big runs alone.
QS = {
    "c_1m": ("clicks", "RSTREAM(SELECT page, COUNT(*) AS n, SUM(x) AS s FROM clicks [RANGE 1 MINUTE SLIDE 20 SECONDS] "
                       "GROUP BY page)"),
    "big": ("clicks", Q["big"]),
    "v_1m": ("views", "RSTREAM(SELECT page, COUNT(*) AS n, SUM(x) AS s FROM views [RANGE 1 MINUTE SLIDE 20 SECONDS] "
                      "GROUP BY page)"),
    "v_2m": ("views", "RSTREAM(SELECT page, COUNT(*) AS n, SUM(x) AS s FROM views [RANGE 2 MINUTES SLIDE 20 SECONDS] "
                      "GROUP BY page)"),
}


#: a two-stream inner join member (a join class of the shared stage): each view with the eu clicks of the same x
#: up to two hours later (the views are an hour before the clicks), its WHERE on the clicks applied to the pairs
JOIN_Q = ("ISTREAM(SELECT v.x, v.page AS vpage, c.page, c.ts AS cts FROM views v [RANGE 2 HOURS] "
          "JOIN clicks c [RANGE 1 SECOND] ON v.x = c.x WHERE c.region = 'eu')")


def write_views(directory, files=1, rows=400, seed=5):
    """``files`` parquet files an hour before the clicks (3 minutes of event time each, some rows late by up to
    2 minutes): the views' watermark stays below the clicks' and their stream ends first."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for f in range(files):
        ts = T0 - 3_600_000_000 + f * 180_000_000 + rng.integers(0, 180_000_000, rows)
        ts = np.where(rng.random(rows) < 0.08, ts - 120_000_000, ts)
        page = rng.choice(np.array(["a", "b", None], dtype=object), rows, p=[0.5, 0.45, 0.05])
        table = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "page": pa.array(page, pa.string()),
                          "x": pa.array(rng.integers(0, 50, rows))})
        write_in_order(table, os.path.join(directory, f"part-{f:02d}.parquet"), f)


def views_stream(spark, directory):
    return (spark.readStream.schema(VIEWS).option("maxFilesPerTrigger", 1).parquet(directory)
            .withWatermark("ts", "30 seconds"))


@pytest.mark.spark
@pytest.mark.slow
def test_two_streams_each_member_equals_its_query_alone(spark, tmp_dir):
    """Clicks (2 micro-batches, watermark 1 minute) and views (1, an hour earlier, watermark 30 seconds): Spark's
    own watermark for the two would be the views' (the minimum), under which the clicks' windows never close, and
    the last micro-batch has clicks only; each member's rows are its query's alone, also the windows that close
    only in the micro-batch after the last (Spark runs it because the group clock advanced). A join of the two
    streams (a join class of the shared stage, at the join's own watermark) equals its query alone too."""
    write_clicks(os.path.join(tmp_dir, "clicks"), files=2, rows=400)
    write_views(os.path.join(tmp_dir, "views"))
    sources = {"clicks": clicks_stream(spark, os.path.join(tmp_dir, "clicks")),
               "views": views_stream(spark, os.path.join(tmp_dir, "views"))}
    g = cq.QueryGroup(spark, sources=sources, checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
    texts = {**{n: t for n, (_, t) in QS.items()}, "j": JOIN_Q}
    for name, text in texts.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
    assert {n: (v["mode"], v["stream"]) for n, v in g.queries.items()} == {
        "c_1m": ("shared", "clicks"), "big": ("alone", None), "v_1m": ("shared", "views"),
        "v_2m": ("shared", "views"), "j": ("join", "views JOIN clicks")}
    query = g.start(trigger={"availableNow": True})
    oracles = {}
    for name, text in texts.items():      # side by side with the group
        out = os.path.join(tmp_dir, "alone", name)
        reads = sources if name == "j" else {QS[name][0]: sources[QS[name][0]]}
        oracles[name] = (cq.cql(spark, text, reads).writeStream.format("parquet")
                         .option("path", out).option("checkpointLocation", os.path.join(tmp_dir, "alone_ck", name))
                         .trigger(availableNow=True).start(), out)
    query.awaitTermination()
    assert query.exception() is None
    assert {n: v["slices"] for n, v in g.queries.items()} == {
        "c_1m": "c_1m", "big": None, "v_1m": "v_1m", "v_2m": "v_1m", "j": None}
    for name in texts:
        q, out = oracles[name]
        q.awaitTermination()
        n = assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)), spark.read.parquet(out), name)
        assert n > 0, name
        assert g.queries[name]["rows"] == n
    for name in ("c_1m", "v_2m"):   # each stream's late rows: those of its query alone
        q = oracles[name][0]
        op = next(k for p in q.recentProgress for k in p.observedMetrics if k.endswith("_agg"))
        late = cq.read_metrics(q, op, "total")["late_rows"]
        assert cq.read_metrics(g, name, "total")["late_rows"] == late, name
    # the group's Spark watermark is the group clock (above every stream's event times), not a stream's
    assert query.lastProgress["eventTime"]["watermark"] >= "3000"
    # ... so the runtime's snapshot and the console give each member its own stream's event time, watermark delay,
    # event time per batch and watermark: those the runtime's statistics and Spark's progress give its query alone
    from pyspark_cq.runtime import CQRuntime
    from pyspark_cq.runtime.stats import StatisticsStore, parse_event_time

    rt = CQRuntime(spark, control_path=os.path.join(tmp_dir, "control.json"))
    rt.register_group(g)
    snap, members = rt.statistics(), rt.groups()[g.name]["members"]
    for name, alone in (("c_1m", "c_1m"), ("v_2m", "v_2m"), ("big", "c_1m")):   # big reads the clicks
        q = oracles[alone][0]
        store = StatisticsStore()
        store.register(alone)
        for p in q.recentProgress:
            store.update(json.loads(p.json), alone)
        want, got = store.query_info(alone), snap.queries[name]
        assert got.event_time == want.event_time and got.batch_span == pytest.approx(want.batch_span), name
        # δ: the stream's delay once its watermark is above 0; alone, the runtime measures it at the next micro-batch
        # with rows (the views' one file has none after it: not measured)
        assert got.watermark_delay == {"clicks": 60.0, "views": 30.0}[QS[alone][0]], name
        assert want.watermark_delay == (60.0 if alone == "c_1m" else None), name
        at = datetime.datetime.fromisoformat(members[name]["watermark"])
        assert parse_event_time(q.lastProgress["eventTime"]["watermark"]) == round(at.timestamp() * 1e6), name
        assert members[name]["watermark_delay"] == got.watermark_delay, name


@pytest.mark.spark
@pytest.mark.slow
def test_two_streams_stopped_failed_and_restarted_lose_and_duplicate_nothing(spark, tmp_dir):
    """A two-stream group runs to the end of its input and stops; it restarts on the same checkpoint with more
    input of both streams, and a sink raises once in the middle of a micro-batch's deliveries (after c_1m's rows
    are written, before v_1m's), failing the Spark query; it restarts again with more clicks. Each member's sink
    then holds exactly the rows of its query alone over all the input, stopped where the group stopped (a stop
    changes the rows: the end of an ``availableNow`` run closes windows a later micro-batch would have filled, for
    Spark's own operators too) but never failed: 0 lost, 0 duplicated (the re-run micro-batch rewrites its files
    and calls the sink again with the same batch id, each stream's watermark comes from the clocks recorded
    before it)."""
    from pyspark.errors import StreamingQueryException

    write_clicks(os.path.join(tmp_dir, "all", "clicks"), files=3, rows=150)
    write_views(os.path.join(tmp_dir, "all", "views"), files=2, rows=150)
    names = {s: sorted(os.listdir(os.path.join(tmp_dir, "all", s))) for s in ("clicks", "views")}
    queries = {n: QS[n][1] for n in ("c_1m", "v_2m", "v_1m")}   # delivered in this order; v_1m and v_2m share a table
    delivered, failed = {}, []

    def v_2m(df, batch_id):                # idempotent by batch id, as foreachBatch asks; raises once when armed
        rows = [tuple(r) for r in df.collect()]
        if failed == ["armed"]:
            failed.append(batch_id)
            raise RuntimeError("injected failure of a sink")
        delivered[batch_id] = rows

    def link(where, clicks, views):
        for stream, files in (("clicks", clicks), ("views", views)):
            os.makedirs(os.path.join(tmp_dir, where, stream), exist_ok=True)
            for n in files:
                os.link(os.path.join(tmp_dir, "all", stream, n), os.path.join(tmp_dir, where, stream, n))

    def sources(where):
        return {"clicks": clicks_stream(spark, os.path.join(tmp_dir, where, "clicks")),
                "views": views_stream(spark, os.path.join(tmp_dir, where, "views"))}

    def run():
        g = cq.QueryGroup(spark, sources=sources("in"), checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
        for name, text in queries.items():
            g.add(name, text, sink=v_2m if name == "v_2m" else os.path.join(tmp_dir, "out", name))
        return g, g.start(trigger={"availableNow": True})

    def alone():    # each query alone, side by side with the group, on the same checkpoint at every run
        src = sources("in_alone")
        return {name: (cq.cql(spark, text, {QS[name][0]: src[QS[name][0]]}).writeStream.format("parquet")
                       .option("path", os.path.join(tmp_dir, "alone", name))
                       .option("checkpointLocation", os.path.join(tmp_dir, "alone_ck", name))
                       .trigger(availableNow=True).start()) for name, text in queries.items()}

    for where in ("in", "in_alone"):
        link(where, names["clicks"][:1], names["views"][:1])
    g, query = run()
    oracles = alone()
    query.awaitTermination()
    assert query.exception() is None and delivered
    failed.append("armed")
    link("in", names["clicks"][1:2], names["views"][1:])
    g, query = run()
    with pytest.raises(StreamingQueryException, match="injected failure of a sink"):
        query.awaitTermination()
    assert len(failed) == 2 and failed[1] not in delivered
    link("in", names["clicks"][2:], [])
    for q in oracles.values():
        q.awaitTermination()
    link("in_alone", names["clicks"][1:], names["views"][1:])
    g, query = run()
    oracles = alone()
    query.awaitTermination()
    assert query.exception() is None and failed[1] in delivered    # the failed micro-batch ran again
    for name, q in oracles.items():
        q.awaitTermination()
        want = spark.read.parquet(os.path.join(tmp_dir, "alone", name))
        got = (spark.createDataFrame([r for b in sorted(delivered) for r in delivered[b]], want.schema)
               if name == "v_2m" else spark.read.parquet(os.path.join(tmp_dir, "out", name)))
        n = assert_same_rows(got, want, name)
        assert n > 0 and g.queries[name]["rows"] == n, name     # the group's count: each row once


# ---- pure parts ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Cfg:
    """What slice_classes reads of an AggConfig."""

    window: int = 60_000_000
    slide: int = 10_000_000
    granularity: int = 10_000_000
    emit: str = "windows"
    name: str = ""
    out_names: tuple = ()


def _spec(name, family="clicks", kind="shared"):
    return D.MemberSpec(key=f"{name}-0123456789", name=name, text="", kind=kind, sink="/x", arrow_schema=None,
                        family=family if kind == "shared" else None, config=_Cfg() if kind == "shared" else None,
                        columns=(("__cq_v0", "__cq_c2"),))


def test_streams_of_the_shared_stage_and_their_slice_classes():
    specs = [_spec("c1"), _spec("v1", "views"), _spec("z", kind="alone"), _spec("c2"), _spec("v2", "views")]
    families, alone = branches_of(specs)
    assert {f: [s.name for s in ms] for f, ms in families.items()} == {"clicks": ["c1", "c2"], "views": ["v1", "v2"]}
    assert [s.name for s in alone] == ["z"]
    # the same columns and configuration over two streams: two slice classes, one per stream
    shared = [s for s in specs if s.kind == "shared"]
    classes = slice_classes(shared)
    assert classes == {"c1-0123456789": "c1-0123456789", "v1-0123456789": "v1-0123456789",
                       "c2-0123456789": "c1-0123456789", "v2-0123456789": "v1-0123456789"}


def test_the_set_of_streams_is_kept_for_the_life_of_a_checkpoint():
    # one stream: the layout a one-stream group has always written (its checkpoints restore unchanged)
    assert check_layout("g", "ck", None, {"clicks": []}, ["z-0123456789"]) == ("clicks", "z-0123456789")
    two = D.Plan(catalogue={"__layout__": ("clicks", "views", "z-0123456789"), "clicks": {}, "views": {},
                            "clicks/raw": ({}, {}), "views/raw": ({}, {})})
    assert check_layout("g", "ck", two, {"views": [], "clicks": []}, ["z-0123456789"]) == two.catalogue["__layout__"]
    with pytest.raises(ValueError, match=r"query group 'g': the checkpoint ck was written by a group with other "
                                         r"branches: streams with shared queries \['clicks', 'views'\] \(now "
                                         r"\['clicks'\]\), queries running alone \['z-0123456789'\] \(now "
                                         r"\['z-0123456789'\]\)"):
        check_layout("g", "ck", two, {"clicks": []}, ["z-0123456789"])
    one = D.Plan(catalogue={"__layout__": ("clicks",), "clicks": {}, "clicks/raw": ({}, {})})
    with pytest.raises(ValueError, match=r"\['clicks'\] \(now \['clicks', 'views'\]\)"):
        check_layout("g", "ck", one, {"clicks": [], "views": []}, [])


def test_each_stream_has_the_watermark_spark_gives_it_alone():
    delays = {"a": 60_000, "b": 30_000}
    assert C.watermarks((), 0, delays) == {"a": 0, "b": 0}            # Spark's watermark starts at 0
    clocks = C.record((), 0, {"a": 100_000})                            # batch 0: a up to 100 s, b nothing
    assert clocks == ((0, {"a": 100_000}),)
    assert C.watermarks(clocks, 0, delays) == {"a": 0, "b": 0}           # batch 0 does not see its own times
    assert C.watermarks(clocks, 1, delays) == {"a": 40_000_000, "b": 0}
    clocks = C.record(clocks, 1, {"a": 90_000, "b": 20_000})              # a's largest stays; b below its delay
    assert clocks[-1] == (1, {"a": 100_000, "b": 20_000})
    assert C.watermarks(clocks, 2, delays) == {"a": 40_000_000, "b": 0}
    assert C.record(clocks, 2, {"a": 50_000}) == clocks                  # nothing grew: no entry
    again = C.record(C.record(clocks, 2, {"b": 95_000}), 2, {"b": 80_000})   # batch 2 run again: its entry replaced
    assert again[-1] == (2, {"a": 100_000, "b": 80_000})
    assert C.watermarks(again, 2, delays) == C.watermarks(clocks, 2, delays)   # a re-run batch: the same as first
    assert C.watermarks(again, None, delays) == {"a": 40_000_000, "b": 50_000_000}
    for b in range(3, 10):
        again = C.record(again, b, {"a": 100_000 + b})
    assert again[-1] == (9, {"a": 100_009, "b": 80_000})
    # the last KEEP entries, and the one before b's first (a join of a and b keeps the watermark it reached there)
    assert [b for b, _ in again] == [0, 6, 7, 8, 9]
    assert C.to_ms(1_999) == 1 and C.to_ms(-1_999) == -1                   # as Spark's event-time statistics


def test_the_group_clock_advances_when_one_stream_does():
    clocks = C.record((), 4, {"a": 100_000, "b": 5_000})
    streams = ("a", "b")
    before = C.clock_ms(clocks, 5, streams, "b", None)
    assert before == C.CLOCK_BASE_MS + 105_000 > 100_000
    assert C.clock_ms(clocks, 5, streams, "b", 4_000_000) == before      # b's time did not grow
    assert C.clock_ms(clocks, 5, streams, "b", 5_001_000) == before + 1   # one ms more of b
    assert C.clock_ms(clocks, 5, streams, "a", 100_000_999) == before    # under a ms: Spark's watermark stays
    assert C.clock_ms((), 0, streams, "a", -5_000_000) == C.CLOCK_BASE_MS   # times before 1970 count as 0


def test_each_group_hands_its_batch_id_to_its_tasks_under_a_name_of_its_own(tmp_path, monkeypatch):
    # Spark Connect runs a group's foreachBatch apart from the stream's thread: the id goes through a session
    # setting, one name per group so that two groups of one session never read each other's
    from pyspark_cq import _validate
    from pyspark_cq.group.worker import _batch_id, batch_setting

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert batch_setting(a) != batch_setting(b) and batch_setting(a).startswith(_validate.BATCH_ID_SETTING + ".")
    monkeypatch.chdir(tmp_path)
    assert batch_setting("a") == batch_setting(a)    # a relative directory names the same group

    class Task:
        def __init__(self, props):
            self.props = props

        def getLocalProperty(self, key):
            return self.props.get(key)

    import pyspark

    task = Task({batch_setting(a): "7", batch_setting(b): "3"})
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: task))
    assert (_batch_id(a), _batch_id(b)) == (7, 3)
    task.props["streaming.sql.batchId"] = "9"       # Spark's own, where the batch runs on the stream's thread
    assert (_batch_id(a), _batch_id(b)) == (9, 9)
    task.props = {}
    assert _batch_id(a) is None


def test_a_plan_pickled_before_clocks_reads_none():
    plan = D.Plan(version=2, members={}, max_time=7)
    vars(plan).pop("clocks")          # as pickled before the field existed
    back = pickle.loads(pickle.dumps(plan))
    assert back.clocks == () and back.max_time == 7


class _State:
    """What GroupShard reads and writes of applyInPandasWithState's GroupState."""

    exists = False

    def update(self, value):
        self.value = value

    def getCurrentWatermarkMs(self):
        return C.CLOCK_BASE_MS

    def setTimeoutTimestamp(self, ms):
        self.timeout = ms


def test_the_stateful_stage_reports_each_streams_largest_event_time(tmp_path):
    import pandas as pd

    from pyspark_cq.group.worker import MAX_TIME, MEMBER, GroupShard, clock_key, stream_clocks

    d = str(tmp_path / "g")
    D.write_plan(d, D.Plan(version=1))
    rows = pd.DataFrame({"__cq_shard": [0] * 5, MEMBER: [clock_key("clicks"), clock_key("views"), clock_key("clicks"),
                                                         clock_key("views"), clock_key("views")],
                         MAX_TIME: [5_000_999, 7_000_000, 6_000_000, None, 2_000_000]})
    state = _State()
    out = next(GroupShard(d, ("clicks", "views"), True, {"clicks": 60_000, "views": 30_000})(0, [rows], state))
    counters = {}
    for k, c in zip(out["cq_member"], out["cq_counters"]):
        counters.setdefault(k, []).append(c)
    assert stream_clocks(counters) == (7_000_000, {"clicks": 6_000, "views": 7_000})
    assert state.timeout == C.CLOCK_BASE_MS     # fires at the group clock's next advance


def _alone_progress(batch, batch_max_ms, watermark_ms, name="alone"):
    """The progress Spark gives a query over one stream alone: the micro-batch's own largest event time (absent
    without rows) and the watermark it ran at."""
    def iso(ms):
        t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(milliseconds=ms)
        return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    times = {"watermark": iso(watermark_ms)}
    if batch_max_ms is not None:
        times["max"] = iso(batch_max_ms)
    return {"name": name, "batchId": batch, "numInputRows": 0, "eventTime": times,
            "timestamp": iso(1_000_000 + batch * 1000)}


def test_each_streams_times_are_the_runtimes_statistics_of_the_stream_alone():
    """The oracle: the runtime's statistics store fed with the progress Spark gives each stream's query alone (its
    watermark per micro-batch computed as Spark's WatermarkTracker: the largest event time before the batch minus
    the delay, never below 0 nor going back). The group's recorded clocks give each stream the same event time,
    watermark delay δ and event time per batch B (whose smoothing the runtime applies), not the group clock's."""
    from pyspark_cq.runtime.stats import StatisticsStore

    delays = {"a": 60_000, "b": 30_000}
    # per micro-batch, each stream's largest event time (ms) in it, None: no rows of the stream
    batches = [{"a": 10_000, "b": 100_000}, {"a": 200_000, "b": None}, {"a": 150_000, "b": 160_000},
               {"a": None, "b": None}, {"a": 290_000, "b": 155_000}]
    clocks = ()
    store = StatisticsStore()
    for s in delays:
        store.register(s)
    seen = {}
    for b, maxima in enumerate(batches):
        for s, d in delays.items():
            wm = max(0, seen[s] - d) if s in seen else 0
            store.update(_alone_progress(b, maxima[s], wm, s))
        clocks = C.record(clocks, b, {s: t for s, t in maxima.items() if t is not None})
        for s, t in maxima.items():
            if t is not None:
                seen[s] = max(seen.get(s, t), t)
    assert len(clocks) <= C.KEEP      # B is smoothed over the kept entries: here all of them
    times = C.stream_times(clocks, delays)
    for s, d in delays.items():
        info = store.query_info(s)
        got = times[s]
        assert got["event_time"] == info.event_time == seen[s] * 1000, s
        assert got["watermark"] == (seen[s] - d) * 1000, s
        assert got["watermark_delay"] == info.watermark_delay == d / 1000, s
        assert store.smoothed(got["advances"]) == pytest.approx(info.batch_span), s
    # before a stream's watermark rises above 0, δ is not measured; a stream without rows has no event time
    early = C.stream_times(C.record((), 0, {"a": 50_000}), {"a": 60_000, "b": 30_000})
    assert early == {"a": {"event_time": 50_000_000, "watermark": 0, "watermark_delay": None, "advances": ()},
                     "b": {"event_time": None, "watermark": 0, "watermark_delay": None, "advances": ()}}
    # one stream: no clocks, the plan's largest event time (µs); no watermark delay: no watermark
    assert C.stream_times((), {"a": 60_000}, 200_000_999)["a"]["watermark"] == 140_000_000
    assert C.stream_times((), {"a": None}, 5)["a"] == {"event_time": 0, "watermark": None, "watermark_delay": None,
                                                        "advances": ()}
