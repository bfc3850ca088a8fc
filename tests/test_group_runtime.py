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


@pytest.mark.spark
@pytest.mark.slow
def test_policies_see_each_member_and_the_shared_table_once(spark, tmp_dir):
    data = os.path.join(tmp_dir, "in")
    write_clicks(data, files=2, rows=200)
    g = cq.QueryGroup(spark, sources={"clicks": clicks_stream(spark, data)}, checkpoint=os.path.join(tmp_dir, "ck"),
                      shards=2)
    for name, text in Q.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
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
