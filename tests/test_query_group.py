"""QueryGroup (issue 40): many CQL queries as one Spark streaming query; each query's sink holds exactly the rows
``cq.cql`` gives for that query alone (the oracle: the query run alone as its own streaming query, whose operators
the other tests compare with Spark's own), also when queries are added, removed, paused and resumed while the
group runs and when the group restarts from its checkpoint.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.files import write_in_order
from helpers.streaming import assert_same_multiset, multiset

import pyspark_cq as cq
from pyspark_cq.group import doc as D
from pyspark_cq.group.batch import apply_changes
from pyspark_cq.group.sinks import _write_directory

SCHEMA = "ts timestamp, page string, region string, x long"
T0 = 1_704_067_200_000_000  # 2024-01-01 UTC, µs

Q = {
    "eu_1m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 10 SECONDS] "
             "WHERE region = 'eu' GROUP BY page)",
    "all_5m": "RSTREAM(SELECT page, SUM(x) AS s, COUNT(*) AS n, MAX(x) FROM clicks [RANGE 5 MINUTES SLIDE 30 SECONDS] "
              "GROUP BY page)",
    "us_3m": "RSTREAM(SELECT page, AVG(x) AS a, MIN(x) AS lo FROM clicks [RANGE 3 MINUTES SLIDE 1 MINUTE] "
             "WHERE region = 'us' AND x > 10 GROUP BY page)",
    "big": "ISTREAM(SELECT page, x FROM clicks [RANGE 1 MINUTE] WHERE x > 95)",
    "having": "RSTREAM(SELECT page, COUNT(*) * 2 AS n2, MAX(x) - MIN(x) AS spread FROM clicks [RANGE 2 MINUTES "
              "SLIDE 1 MINUTE] GROUP BY page HAVING COUNT(*) > 3)",
    "changes": "ISTREAM(SELECT region, SUM(x) AS s FROM clicks [RANGE 2 MINUTES SLIDE 30 SECONDS] GROUP BY region)",
    # eu_1m's rows at its granularity (10 s) under another window and another output: they share its slices
    "eu_2m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 2 MINUTES SLIDE 10 SECONDS] "
             "WHERE region = 'eu' GROUP BY page)",
    "eu_new": "ISTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 10 SECONDS] "
              "WHERE region = 'eu' GROUP BY page)",
}
#: joins a running group whose projection lacks its WHERE (evaluated in Arrow: IN, NOT, IS NULL, BETWEEN, OR)
AP = ("RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 10 SECONDS] WHERE (region IN ('ap', 'us') "
      "AND NOT x BETWEEN 20 AND 30) OR (region IS NULL AND x >= 90) GROUP BY page)")


def write_clicks(directory, files=4, rows=600, seed=11):
    """``files`` parquet files, 4 minutes of event time each, with some rows late by up to 3 minutes and a few
    with a null page or region."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for f in range(files):
        ts = T0 + f * 240_000_000 + rng.integers(0, 240_000_000, rows)
        late = rng.random(rows) < 0.05
        ts = np.where(late, ts - 180_000_000, ts)
        page = rng.choice(np.array(["a", "b", "c", None], dtype=object), rows, p=[0.4, 0.3, 0.28, 0.02])
        region = rng.choice(np.array(["eu", "us", "ap", None], dtype=object), rows)
        table = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "page": pa.array(page, pa.string()),
                          "region": pa.array(region, pa.string()), "x": pa.array(rng.integers(0, 100, rows))})
        write_in_order(table, os.path.join(directory, f"part-{f:02d}.parquet"), f)


def clicks_stream(spark, directory):
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
            .withWatermark("ts", "1 minute"))


def start_alone(spark, text, clicks, root, name):
    """The oracle: the query alone, as its own streaming query into a parquet directory; (query, directory)."""
    out = os.path.join(root, "alone", name)
    q = (cq.cql(spark, text, {"clicks": clicks}).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", os.path.join(root, "alone_ck", name)).trigger(availableNow=True).start())
    return q, out


def assert_same_rows(got, want, what) -> int:
    """``got`` holds exactly ``want``'s rows (same columns and types, a multiset); the number of rows."""
    assert got.columns == want.columns, what
    assert [f.dataType for f in got.schema] == [f.dataType for f in want.schema], what
    return assert_same_multiset(got, want, what)


@pytest.mark.spark
@pytest.mark.slow
def test_each_member_equals_its_query_alone(spark, tmp_dir):
    data = os.path.join(tmp_dir, "in")
    # 3 files (12 minutes of event time, late rows from the second on): windows up to 5 minutes still span
    # micro-batches; 9 queries run each micro-batch (issue 41, the suite's time)
    write_clicks(data, files=3)
    # and a fourth file with no eu row, 8 minutes ahead: alone, Spark pushes a WHERE that does not name the time
    # column below withWatermark, so the eu queries' watermark comes from eu rows and their last windows stay open;
    # in the group too (each slice class at its own clock; before, eu_1m had 30 rows more than alone)
    ts = T0 + 3 * 240_000_000 + np.arange(0, 480_000_000, 4_000_000)
    write_in_order(pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "page": pa.array(["a"] * len(ts)),
                             "region": pa.array(["us"] * len(ts)), "x": pa.array(np.arange(len(ts)) % 100)}),
                   os.path.join(data, "part-03.parquet"), 3)
    clicks = clicks_stream(spark, data)
    # us_3m here samples half of its rows (a hash of the row's values: a mask in the slicer, as its WHERE is)
    texts = {**Q, "us_3m": Q["us_3m"].replace("SLIDE 1 MINUTE]", "SLIDE 1 MINUTE] SAMPLE(50)"),
             # aggregates over ROWS windows: rows_aggregate's step per partition in the shared stage (a sample,
             # a WHERE after the window; its rows renamed, or computed items finished in Spark)
             "rows_n": "ISTREAM(SELECT page, COUNT(*) AS n, SUM(x) AS s, MAX(x) FROM clicks [PARTITION BY page "
                       "ROWS 5] SAMPLE(60) WHERE x > 20 GROUP BY page)",
             "rows_h": "DSTREAM(SELECT region, AVG(x) * 2 AS a2, MIN(x) AS lo FROM clicks [PARTITION BY region "
                       "ROWS 8] GROUP BY region)"}
    assert texts["us_3m"] != Q["us_3m"]
    g = cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=os.path.join(tmp_dir, "ck"))
    for name, text in texts.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
    modes = {n: v["mode"] for n, v in g.queries.items()}
    assert modes == {"eu_1m": "shared", "all_5m": "shared", "us_3m": "shared", "big": "alone", "having": "shared",
                     "changes": "shared", "eu_2m": "shared", "eu_new": "shared", "rows_n": "rows", "rows_h": "rows"}
    query = g.start(trigger={"availableNow": True})
    # the oracles side by side with the group (and each other)
    oracles = {name: start_alone(spark, text, clicks, tmp_dir, name) for name, text in texts.items()}
    query.awaitTermination()
    assert query.exception() is None
    slices = {n: v["slices"] for n, v in g.queries.items()}
    assert slices == {"eu_1m": "eu_1m", "all_5m": "all_5m", "us_3m": "us_3m", "big": None, "having": "having",
                      "changes": "changes", "eu_2m": "eu_1m", "eu_new": "eu_1m", "rows_n": None, "rows_h": None}
    for name in texts:
        q, out = oracles[name]
        q.awaitTermination()
        n = assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)), spark.read.parquet(out), name)
        assert n > 0, name
        assert g.queries[name]["rows"] == n
        totals = cq.read_metrics(g, name, "total")
        assert totals["output_rows"] == n
        if g.queries[name]["mode"] == "shared":   # the aggregation's own counters, summed over the shards
            assert totals["input_rows"] > 0 and "late_rows" in totals and "state_rows" in totals
    # eu_1m and eu_2m share one slice table: its state counted once, each query's late rows those of it alone
    assert cq.read_metrics(g, "eu_2m", "total")["state_rows"] == 0 < cq.read_metrics(g, "eu_1m", "total")["state_rows"]
    for name in ("eu_1m", "eu_2m"):
        q = oracles[name][0]
        op = next(k for p in q.recentProgress for k in p.observedMetrics if k.endswith("_agg"))
        assert cq.read_metrics(g, name, "total")["late_rows"] == cq.read_metrics(q, op, "total")["late_rows"], name
    latest = cq.read_metrics(g, "eu_1m")   # the latest micro-batch with rows in or out
    assert latest["input_rows"] or latest["output_rows"]
    assert [b for b, _ in cq.read_metrics(g, "eu_1m", "all")] == sorted(b for b, _ in cq.read_metrics(g, "eu_1m", "all"))


@pytest.mark.spark
@pytest.mark.slow
def test_queries_join_leave_pause_and_resume_between_micro_batches(spark, tmp_dir):
    data = os.path.join(tmp_dir, "in")
    write_clicks(data, files=5)
    clicks = clicks_stream(spark, data)
    g = cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=os.path.join(tmp_dir, "ck"))
    seen = []

    def driver(df, batch_id):
        """A callable sink that changes the group from inside the micro-batch: deterministic boundaries."""
        seen.append((batch_id, df.count()))
        if batch_id == 1:
            g.add("eu_late", Q["eu_1m"], sink=os.path.join(tmp_dir, "out", "eu_late"))
            g.remove("all_5m")
            g.pause("us_3m")
            with pytest.raises(ValueError, match="'big2' runs alone"):
                g.add("big2", Q["big"], sink=os.path.join(tmp_dir, "out", "big2"))
            # a WHERE the running plan does not compute: evaluated in Arrow (exactly as Spark's)
            g.add("ap", AP, sink=os.path.join(tmp_dir, "out", "ap"))
            with pytest.raises(ValueError, match="'by_region' cannot join the running group: the running plan does "
                                                 "not compute its input"):
                g.add("by_region", Q["changes"].replace("ISTREAM", "RSTREAM"), sink=os.path.join(tmp_dir, "r"))
            with pytest.raises(ValueError, match="'like' cannot join .* cannot be evaluated exactly"):
                g.add("like", Q["eu_1m"].replace("region = 'eu'", "region LIKE 'e%'"), sink=os.path.join(tmp_dir, "l"))
        if batch_id == 2:
            g.resume("us_3m")

    g.add("eu_1m", Q["eu_1m"], sink=driver)
    g.add("all_5m", Q["all_5m"], sink=os.path.join(tmp_dir, "out", "all_5m"))
    g.add("us_3m", Q["us_3m"], sink=os.path.join(tmp_dir, "out", "us_3m"))
    query = g.start(trigger={"availableNow": True})
    # the oracles: each query alone, all four side by side with the group
    oracles = {name: start_alone(spark, text, clicks, tmp_dir, name) for name, text in
               (("eu_late", Q["eu_1m"]), ("ap", AP), ("all_5m", Q["all_5m"]), ("us_3m", Q["us_3m"]))}
    query.awaitTermination()
    assert [b for b, _ in seen] == list(range(len(seen))) and len(seen) >= 5
    info = g.queries
    assert set(info) == {"eu_1m", "eu_late", "us_3m", "ap"}
    assert info["eu_late"]["status"] == "active" and info["eu_late"]["start"] is not None

    def alone(name):
        q, out = oracles[name]
        q.awaitTermination()
        return spark.read.parquet(out)

    def since(df, start):
        from pyspark.sql import functions as F

        return df.filter(F.col("cq_at") - F.expr("INTERVAL 1 MINUTE") >= F.lit(start))

    # the late query: exactly the windows of the query alone that start at or after its start
    start = info["eu_late"]["start"]
    late = spark.read.parquet(os.path.join(tmp_dir, "out", "eu_late"))
    assert assert_same_rows(late, since(alone("eu_late"), start), "eu_late") > 0
    ap = spark.read.parquet(os.path.join(tmp_dir, "out", "ap"))
    assert assert_same_rows(ap, since(alone("ap"), info["ap"]["start"]), "ap (WHERE in Arrow)") > 0
    # the removed query delivered batches 0 and 1 only: a subset of its rows alone
    files = sorted(os.listdir(os.path.join(tmp_dir, "out", "all_5m")))
    assert [f for f in files if f.endswith(".parquet")] == ["part-000000000000.parquet", "part-000000000001.parquet"]
    removed = spark.read.parquet(os.path.join(tmp_dir, "out", "all_5m"))
    assert not multiset(removed) - multiset(alone("all_5m"))
    # paused at 1, resumed at 2: rows from before the pause, then complete windows from its new start on
    us = spark.read.parquet(os.path.join(tmp_dir, "out", "us_3m"))
    us_alone = alone("us_3m")
    assert not multiset(us) - multiset(us_alone)
    resumed = info["us_3m"]["start"]
    from pyspark.sql import functions as F

    after = us.filter(F.col("cq_at") - F.expr("INTERVAL 3 MINUTES") >= F.lit(resumed))
    assert_same_rows(after, us_alone.filter(F.col("cq_at") - F.expr("INTERVAL 3 MINUTES") >= F.lit(resumed)),
                     "us_3m after resume")


@pytest.mark.spark
@pytest.mark.slow
def test_restart_from_checkpoint_loses_and_duplicates_nothing(spark, tmp_dir):
    """The group stops after two files and a new group object goes on from its checkpoint; the oracle is each
    query alone stopped and restarted the same way (a restart changes Spark's watermark, so also the rows)."""
    write_clicks(os.path.join(tmp_dir, "all"), files=4)
    names = sorted(os.listdir(os.path.join(tmp_dir, "all")))
    queries = ("eu_4m", "eu_1m", "all_5m", "big", "eu_2m")   # eu_1m, eu_2m: one shared slice table, saved and restored
    # eu_4m's granularity is 1 min, eu_1m's 10 s (ratio 6): one slice class across granularities, its table at 10 s
    # (eu_4m first: the class's first query is the coarse one, its slicer cuts at the class's gcd, not at its own)
    texts = {**Q, "eu_4m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 4 MINUTES SLIDE 1 MINUTE] "
                           "WHERE region = 'eu' GROUP BY page)"}

    def run(files):
        for where in ("in", "in_alone"):
            os.makedirs(os.path.join(tmp_dir, where), exist_ok=True)
            for n in files:
                os.link(os.path.join(tmp_dir, "all", n), os.path.join(tmp_dir, where, n))
        g = cq.QueryGroup(spark, sources={"clicks": clicks_stream(spark, os.path.join(tmp_dir, "in"))},
                          checkpoint=os.path.join(tmp_dir, "ck"))
        for name in queries:
            g.add(name, texts[name], sink=os.path.join(tmp_dir, "out", name))
        query = g.start(trigger={"availableNow": True})
        clicks = clicks_stream(spark, os.path.join(tmp_dir, "in_alone"))
        started = {name: start_alone(spark, texts[name], clicks, tmp_dir, name) for name in queries}  # side by side
        query.awaitTermination()
        for q, _ in started.values():
            q.awaitTermination()
        info = g.queries
        assert {n: (info[n]["slices"], info[n]["slice_length"]) for n in ("eu_1m", "eu_2m", "eu_4m")} == {
            n: ("eu_4m", 10_000_000) for n in ("eu_1m", "eu_2m", "eu_4m")}
        return {name: spark.read.parquet(out) for name, (_, out) in started.items()}

    run(names[:2])
    alone = run(names[2:])
    for name in queries:
        got = spark.read.parquet(os.path.join(tmp_dir, "out", name))
        assert_same_rows(got, alone[name], name)


# ---- bad input --------------------------------------------------------------------------------------------

@pytest.mark.spark
def test_bad_input_names_the_query_and_disturbs_nothing(spark, tmp_dir):
    from pyspark_cq.lang import CQLCompileError, CQLSyntaxError

    clicks = clicks_stream(spark, str(tmp_dir))
    with pytest.raises(TypeError, match="spark must be a SparkSession"):
        cq.QueryGroup(None, sources={"clicks": clicks}, checkpoint="ck")
    with pytest.raises(TypeError, match="sources must"):
        cq.QueryGroup(spark, sources=[clicks], checkpoint="ck")
    with pytest.raises(ValueError, match=r"sources\['b'\] must be a streaming DataFrame"):
        cq.QueryGroup(spark, sources={"b": spark.range(3)}, checkpoint="ck")
    with pytest.raises(TypeError, match="checkpoint must be"):
        cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=None)
    g = cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=os.path.join(tmp_dir, "ck"))
    g.add("a", Q["eu_1m"], sink=os.path.join(tmp_dir, "a"))
    with pytest.raises(ValueError, match="query 'a': the name is already used"):
        g.add("a", Q["all_5m"], sink=os.path.join(tmp_dir, "a2"))
    with pytest.raises(ValueError, match="query 'b': its sink is already query 'a'"):
        g.add("b", Q["all_5m"], sink=os.path.join(tmp_dir, "a"))
    with pytest.raises(ValueError, match="query 'c': its source 'views' is not one of the group's sources"):
        g.add("c", "ISTREAM(SELECT * FROM views [RANGE 1 MINUTE])", sink=os.path.join(tmp_dir, "c"))
    with pytest.raises(CQLSyntaxError, match=r"query 'd': line 1:\d+") as err:
        g.add("d", "RSTREAM(SELECT page COUNT(*) FROM clicks [RANGE 1 MINUTE] GROUP BY page)",
              sink=os.path.join(tmp_dir, "d"))
    assert err.value.line == 1
    with pytest.raises(CQLCompileError, match="query 'e': line"):
        g.add("e", "RSTREAM(SELECT nope, COUNT(*) FROM clicks [RANGE 1 MINUTE] GROUP BY nope)",
              sink=os.path.join(tmp_dir, "e"))
    # two-stream inner and outer joins run in the shared stage (tests/test_group_joins.py); three streams do not yet
    views = clicks.withColumnRenamed("page", "vpage")
    g2 = cq.QueryGroup(spark, sources={"clicks": clicks, "views": views, "more": views},
                       checkpoint=os.path.join(tmp_dir, "c3"))
    g2.add("j", "ISTREAM(SELECT clicks.page FROM clicks [RANGE 1 MINUTE] LEFT JOIN views [RANGE 1 MINUTE] "
                "ON clicks.page = views.vpage)", sink=os.path.join(tmp_dir, "j"))
    assert (g2.queries["j"]["mode"], g2.queries["j"]["stream"]) == ("join", "clicks LEFT JOIN views")
    # a join of three streams runs alone (its multi_join in a stateless stage: tests/test_group_joins.py); a LEFT
    # JOIN of three cannot (a stateless stage runs only when rows arrive: its null-padded tuples could wait forever)
    g2.add("m", "ISTREAM(SELECT clicks.page FROM clicks [RANGE 1 MINUTE] JOIN views [RANGE 1 MINUTE] "
                "ON clicks.page = views.vpage JOIN more [RANGE 1 MINUTE] ON clicks.page = more.vpage)",
           sink=os.path.join(tmp_dir, "m"))
    assert g2.queries["m"]["mode"] == "alone"
    with pytest.raises(ValueError, match="query 'm2': a LEFT JOIN of three or more streams cannot run in a query "
                                         "group yet"):
        g2.add("m2", "ISTREAM(SELECT clicks.page FROM clicks [RANGE 1 MINUTE] JOIN views [RANGE 1 MINUTE] "
                     "ON clicks.page = views.vpage LEFT JOIN more [RANGE 1 MINUTE] ON clicks.page = more.vpage)",
               sink=os.path.join(tmp_dir, "m2"))
    # an aggregate over a join of two streams: its join in a join class, its aggregation in the micro-batch function
    # (tests/test_group_joins.py); over three, not yet
    over = "[RANGE 1 MINUTE SLIDE 30 SECONDS]"
    g2.add("ja", f"RSTREAM(SELECT clicks.page, COUNT(*) AS n FROM clicks {over} JOIN views {over} ON clicks.page = "
                 f"views.vpage GROUP BY clicks.page)", sink=os.path.join(tmp_dir, "ja"))
    assert g2.queries["ja"]["mode"] == "join"
    with pytest.raises(ValueError, match="query 'ma': an aggregate over a join of three or more streams cannot run "
                                         "in a query group yet"):
        g2.add("ma", f"RSTREAM(SELECT clicks.page, COUNT(*) AS n FROM clicks {over} JOIN views {over} ON clicks.page "
                     f"= views.vpage JOIN more {over} ON clicks.page = more.vpage GROUP BY clicks.page)",
               sink=os.path.join(tmp_dir, "ma"))
    with pytest.raises(TypeError, match="query 'f': sink must be"):
        g.add("f", Q["all_5m"], sink=42)
    with pytest.raises(TypeError, match="query must be CQL text"):
        g.add("g", 42, sink=os.path.join(tmp_dir, "g"))
    with pytest.raises(KeyError, match="'zz' is not in the group"):
        g.pause("zz")
    with pytest.raises(ValueError, match="trigger must be None or a dict"):
        g.start(trigger="5 seconds")
    assert list(g.queries) == ["a"]
    with pytest.raises(ValueError, match="no query"):
        cq.QueryGroup(spark, sources={"clicks": clicks}, checkpoint=os.path.join(tmp_dir, "ck2")).start()


# ---- pure parts ---------------------------------------------------------------------------------------------

class _Cfg:
    slide = 10_000_000


def _spec(name, kind="shared", **kw):
    return D.MemberSpec(key=f"{name}-k", name=name, text="", kind=kind, sink="/x", arrow_schema=None,
                        config=_Cfg() if kind == "shared" else None, **kw)


def test_changes_apply_in_order_and_new_queries_start_at_the_next_window():
    plan = D.Plan(version=3, members={"a-k": _spec("a"), "b-k": _spec("b"), "z-k": _spec("z", "alone")},
                  max_time=None)
    nxt = apply_changes(plan, [("add", _spec("c")), ("remove", "b"), ("pause", "a"), ("pause", "z")], 25_000_000)
    assert nxt.version == 4 and nxt.max_time == 25_000_000
    assert set(nxt.members) == {"a-k", "c-k", "z-k"}
    assert nxt.members["c-k"].start_us == 30_000_000          # first window start after 25 s (slide 10 s)
    assert not nxt.members["a-k"].active and not nxt.members["z-k"].active
    again = apply_changes(nxt, [("resume", "a"), ("resume", "z"), ("remove", "nobody")], 30_000_000)
    assert again.members["a-k"].active and again.members["a-k"].start_us == 40_000_000
    assert again.members["z-k"].active and again.members["z-k"].start_us is None   # alone: delivery only
    assert apply_changes(plan, [], None).members == plan.members


def test_plan_and_pending_changes_round_trip(tmp_path):
    d = str(tmp_path / "g")
    assert D.read_plan(d) is None
    D.write_plan(d, D.Plan(version=1, members={"a-k": _spec("a")}))
    assert D.read_plan(d).by_name("a").key == "a-k"
    D.ask(d, ("remove", "a"))
    D.ask(d, ("pause", "b"))
    assert D.take_pending(d) == [("remove", "a"), ("pause", "b")]
    assert D.take_pending(d) == []


def test_directory_sink_rewrites_a_batch_run_again(tmp_path):
    t = pa.table({"v": pa.array([1, 2], pa.int64())})
    empty = t.schema.empty_table()
    _write_directory(str(tmp_path), empty, 0)           # first batch, no rows: an empty file gives the schema
    _write_directory(str(tmp_path), t, 1)
    _write_directory(str(tmp_path), t.slice(0, 1), 1)   # batch 1 run again: replaces its file
    _write_directory(str(tmp_path), empty, 2)           # nothing to add
    files = sorted(f for f in os.listdir(tmp_path) if not f.startswith("."))
    assert files == ["part-000000000000.parquet", "part-000000000001.parquet"]
    assert pq.read_table(str(tmp_path / "part-000000000001.parquet")).column("v").to_pylist() == [1]

