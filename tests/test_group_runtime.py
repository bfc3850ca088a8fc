"""``CQRuntime.register_group``: the policies see each query of a group, its shared state counted once."""
from __future__ import annotations

import os

import pytest
from test_query_group import clicks_stream, write_clicks

import pyspark_cq as cq
from pyspark_cq.runtime import CQRuntime
from pyspark_cq.vocabulary import metrics as M

Q = {"eu_1m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 20 SECONDS] "
              "WHERE region = 'eu' GROUP BY page)",
     "eu_2m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 2 MINUTES SLIDE 20 SECONDS] "
              "WHERE region = 'eu' GROUP BY page)",
     "us_1m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 20 SECONDS] "
              "WHERE region = 'us' GROUP BY page)"}


@pytest.fixture(scope="module")
def ran_group(spark, tmp_path_factory):
    """A group of the three queries registered with a runtime and run to the end of its input (availableNow);
    (group, runtime, its snapshot). One run serves the policies' test and the console's."""
    tmp_dir = str(tmp_path_factory.mktemp("group_runtime"))
    data = os.path.join(tmp_dir, "in")
    write_clicks(data, files=2, rows=200)
    g = cq.QueryGroup(spark, sources={"clicks": clicks_stream(spark, data)}, checkpoint=os.path.join(tmp_dir, "ck"),
                      shards=2)
    for name, text in Q.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
    g._test_input = data      # the console test's oracle reads it
    rt = CQRuntime(spark)
    rt.register_group(g, trigger={"availableNow": True})
    with pytest.raises(ValueError, match="eu_1m"):
        rt.register_group(g)
    with pytest.raises(TypeError, match="group must be"):
        rt.register_group("g")
    rt.start()
    try:
        rt.query(g.name).awaitTermination()
        rt.await_batches(g.name, 1, timeout=60)
        snap = rt.statistics()
    finally:
        rt.stop()
    return g, rt, snap


@pytest.mark.spark
@pytest.mark.slow
def test_policies_see_each_member_and_the_shared_table_once(ran_group):
    g, rt, snap = ran_group
    assert set(snap.queries) == set(Q)                     # the members, not the group
    # the oracle: each query's own counters as cq.read_metrics gives them for the group
    for name in Q:
        want = cq.read_metrics(g, name, "last")
        got = snap.queries[name].operators[f"{name}_agg"]
        assert (got.input_rows, got.output_rows) == (want[M.INPUT_ROWS], want[M.OUTPUT_ROWS]), name
    # eu_1m and eu_2m share one slice table: its rows are counted on eu_1m only
    assert g.queries["eu_2m"]["slices"] == "eu_1m"
    rows = {n: snap.queries[n].state_rows for n in Q}
    assert rows["eu_2m"] == 0 < rows["eu_1m"]
    assert sum(rows.values()) == sum(cq.read_metrics(g, n, "last")[M.STATE_ROWS] for n in Q)
    # a decision naming a member is refused: the group's windows are not the control table's
    with pytest.raises(KeyError):
        rt.set_control("eu_2m_agg", who="test", window="30 seconds")


@pytest.mark.spark
@pytest.mark.slow
def test_console_shows_a_registered_groups_members(ran_group):
    """The console's REST API (the real server) lists the group: each member with its status, mode, the query
    whose slices it shares, the rows it delivered (the oracle: the rows in its sink directory, read by Spark)
    and its counters as ``cq.read_metrics`` gives them, and the group's state with the shared table counted once.
    """
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import json
    import urllib.request

    g, rt, _ = ran_group
    console = rt.serve(0)
    try:
        with urllib.request.urlopen(console.url + "api/groups", timeout=30) as r:
            groups = json.loads(r.read())["groups"]
        with urllib.request.urlopen(console.url + "api/state", timeout=30) as r:
            state = json.loads(r.read())
    finally:
        console.stop()
    assert set(groups) == {g.name} and state["groups"][g.name]["members"].keys() == set(Q)
    info = groups[g.name]
    assert info["shards"] == 2 and not info["running"] and info["query_id"] == str(rt.query(g.name).id)
    members = info["members"]
    for name in Q:
        m = members[name]
        want = cq.read_metrics(g, name, "total")
        assert (m["status"], m["mode"], m["stream"]) == ("active", "shared", "clicks"), name
        assert m["rows"] == g.spark.read.parquet(g.queries[name]["sink"]).count() == want[M.OUTPUT_ROWS], name
        assert (m[M.INPUT_ROWS], m[M.LATE_ROWS]) == (want[M.INPUT_ROWS], want[M.LATE_ROWS]), name
        assert m[M.STATE_ROWS] == cq.read_metrics(g, name, "last")[M.STATE_ROWS], name
        assert m["text"] == Q[name] and state["queries"][name]["group"] == g.name
    # eu_1m and eu_2m share eu_1m's slices (one table, counted once on eu_1m); us_1m slices alone
    assert [members[n]["slices"] for n in Q] == ["eu_1m", "eu_1m", "us_1m"]
    assert sorted(map(sorted, info["slice_classes"])) == [["eu_1m", "eu_2m"], ["us_1m"]]
    assert all(members[n]["slices"] == c[0] for c in info["slice_classes"] for n in c)   # its first query first
    assert members["eu_2m"][M.STATE_ROWS] == 0 < members["eu_1m"][M.STATE_ROWS]
    assert info[M.STATE_ROWS] == sum(cq.read_metrics(g, n, "last")[M.STATE_ROWS] for n in Q)
    # each member's watermark and delay: its query's alone, from the rows its WHERE keeps (Spark pushes it below
    # withWatermark): their largest event time (ms) minus the delay; the oracle reads the input with Spark
    from datetime import datetime

    from pyspark.sql import functions as F

    inputs = g.spark.read.schema("ts timestamp, page string, region string, x long").parquet(g._test_input)
    for name in Q:
        region = name.split("_")[0]
        top = inputs.filter(F.col("region") == region).agg(F.max(F.unix_micros("ts"))).first()[0]
        want = top // 1000 * 1000 - 60_000_000        # ms, as Spark's event-time statistics, minus the delay
        assert round(datetime.fromisoformat(members[name]["watermark"]).timestamp() * 1e6) == want, name
        assert members[name]["watermark_delay"] == 60.0, name
    assert members["eu_1m"]["watermark"] != members["us_1m"]["watermark"]


@pytest.mark.spark
def test_the_pipes_manager_sees_members_and_costs_a_slice_class_once(ran_group):
    """The snapshot holds each member's plan (its window in effect), QoS ranges and slice class; the PIPES
    resource manager costs eu_1m and eu_2m's one table once: on eu_1m, through the class's widest window (eu_2m's
    2 minutes), eu_2m adding no memory. The oracle: the PIPES estimate of eu_2m's plan alone."""
    from pyspark_cq_plugins.pipes_rm import PipesResourceManager, pipes_estimate

    from pyspark_cq import plan as P

    _, _, snap = ran_group
    info = snap.queries
    assert (info["eu_1m"].slice_class, info["eu_2m"].slice_class, info["us_1m"].slice_class) == \
        ("eu_1m", "eu_1m", "us_1m")
    window = next(n for n in P.postorder(info["eu_2m"].plan) if isinstance(n, P.Window))
    assert window.size == 120_000_000 and info["eu_2m"].control == {"eu_2m_agg": {"window": 120_000_000}}
    assert info["eu_2m"].qos == {}                       # no WITH (WINDOW …): its window is fixed
    rm = PipesResourceManager(distances={"clicks": 0.001})     # dense: every key in every slice
    assert not rm.decide(snap)                           # no QoS range: nothing to decide
    est = rm.estimates()

    def alone(q):      # the PIPES estimate of the query's plan alone, in the manager's time unit (1 ms)
        plan = P.rewrite(q.plan, lambda n: {"size": n.size / 1000} if isinstance(n, P.Window) else
                         {"granularity": n.granularity / 1000} if isinstance(n, P.Granularity) else {})
        return pipes_estimate(plan, {"clicks": 1.0})[0]

    assert est["eu_2m"][0] == 0
    assert est["eu_1m"][0] == pytest.approx(alone(info["eu_2m"]))
    assert est["us_1m"][0] == pytest.approx(alone(info["us_1m"]))
    assert 0 < est["us_1m"][0] < est["eu_1m"][0]       # 1 minute against the class's widest, 2 minutes
