"""A CQL query under the runtime: the PIPES resource manager changes its window through the control table."""
import time

import pytest

S = 1_000_000


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_register_cql_validates(tmp_path):
    from pyspark_cq.runtime.core import CQRuntime

    rt = CQRuntime.__new__(CQRuntime)  # argument checks come before any use of Spark
    with pytest.raises(TypeError, match="sources must be a mapping"):
        rt.register_cql("q", "ISTREAM(SELECT * FROM s)", sources=[1], sink="memory")
    with pytest.raises(TypeError, match="sink must be"):
        rt.register_cql("q", "ISTREAM(SELECT * FROM s)", sources={}, sink=3)


@pytest.mark.spark
@pytest.mark.slow
def test_pipes_resource_manager_changes_a_cql_querys_window(spark, tmp_path):
    from pyspark_cq.runtime import CQRuntime

    rows = []

    def sink(df, batch_id):
        rows.extend(r.asDict() for r in df.collect())

    rate = (spark.readStream.format("rate").option("rowsPerSecond", 50).option("numPartitions", 1).load()
            .withWatermark("timestamp", "1 second"))
    text = ("RSTREAM(SELECT COUNT(*) AS n, MIN(timestamp) AS first, MAX(timestamp) AS last "
            "FROM rate [RANGE 60 SECONDS SLIDE 1 SECOND]) WITH (WINDOW BETWEEN 2 SECONDS AND 60 SECONDS, PERIOD 1 SECOND, "
            "DEADLINE 900 MILLISECONDS)")
    # PIPES memory estimate of this plan: 64 bytes per slice of the window (60 s: 3,840 bytes); the budget
    # with its 10 % reserve fits about 5 slices (a 5 s window: the test then waits 5 s, not 14, for windows
    # that started after the change; issue 41, the suite's time).
    rt = CQRuntime(spark, policies=["pipes"], memory_budget=400, control_path=str(tmp_path / "ct.json"),
                   every_batches=2)
    ctx = rt.register_cql("clicks", text, sources={"rate": rate}, sink=sink, rates={"rate": "Rate"})
    assert ctx.compiled.plan == rt.statistics().queries["clicks"].plan
    assert set(ctx.compiled.qos) == {"clicks_agg.window"}
    info = rt.statistics().queries["clicks"]
    assert (info.period, info.deadline) == (1.0, 0.9)     # PERIOD / DEADLINE: a periodic query (RTStream §2)
    with rt:
        _wait(lambda: any(c.who == "pipes" and "window" in c.new for c in rt.control_table().changes("clicks_agg")),
              120, "the resource manager's window change")
        window = rt.control_table().entry("clicks_agg").params["window"]
        change = next(c for c in rt.control_table().changes("clicks_agg") if c.who == "pipes" and "window" in c.new)
        assert 2 * S <= window < 60 * S
        at = change.at["window"]
        # a window [k·s, k·s + W) takes the size W in effect at its start: wait for windows that started
        # after the change
        _wait(lambda: any(r["cq_at"].timestamp() * S - window > at and r["n"] > 0 for r in rows), 150,
              "windows that started after the change")
    assert rt.instances("clicks") and all(i.deadline == 0.9 for i in rt.instances("clicks"))
    entry = rt.control_table().entry("clicks_agg")
    sizes = {c.new["window"] for c in rt.control_table().changes("clicks_agg") if "window" in c.new}
    checked = 0
    for r in rows:
        end = int(round(r["cq_at"].timestamp() * S))
        size = [w for w in sizes if entry.value_at("window", end - w) == w]  # the size in force at its start
        assert size, r
        span = (r["last"] - r["first"]).total_seconds() * S
        assert span < max(size)
        if end - min(size) > at:  # started after the resource manager's change: the new, smaller size
            # PIPES §4.2: the new size applies to elements from the change on; older elements keep their
            # 60 s validity, so such a window holds its last min(size) of rows plus elements from before `at`
            first = int(round(r["first"].timestamp() * S))
            assert min(size) < 60 * S and (first >= end - min(size) or first < at), (r, size, at)
            checked += 1
    assert checked > 0
    assert change.old["window"] == 60 * S  # the query's own RANGE, registered by the compiler
