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
            "FROM rate [RANGE 60 SECONDS SLIDE 1 SECOND]) WITH (WINDOW BETWEEN 2 SECONDS AND 60 SECONDS, PERIOD 1 SECOND)")
    # PIPES memory estimate of this plan: 64 bytes per slice of the window (60 s: 3,840 bytes); the budget
    # with its 10 % reserve fits about 14 slices.
    rt = CQRuntime(spark, policies=["pipes"], memory_budget=1000, control_path=str(tmp_path / "ct.json"),
                   every_batches=2)
    ctx = rt.register_cql("clicks", text, sources={"rate": rate}, sink=sink, rates={"rate": "Rate"})
    assert ctx.compiled.plan == rt.statistics().queries["clicks"].plan
    assert set(ctx.compiled.qos) == {"clicks_agg.window"}
    with rt:
        _wait(lambda: any(c.who == "pipes" and "window" in c.new for c in rt.control_table().changes("clicks_agg")),
              120, "the resource manager's window change")
        window = rt.control_table().entry("clicks_agg").params["window"]
        change = next(c for c in rt.control_table().changes("clicks_agg") if c.who == "pipes" and "window" in c.new)
        assert 2 * S <= window < 60 * S
        # windows that start after the change's application time have the new size: their rows span less
        # than the new window (a window [k·S, k·S + W) holds rows of W seconds at most)
        _wait(lambda: any(r["cq_at"].timestamp() * S - window > change.at["window"] and r["n"] > 0 for r in rows), 120,
              "windows of the new size")
    new = [r for r in rows if r["cq_at"].timestamp() * S - window > change.at["window"]]
    assert new and all((r["last"] - r["first"]).total_seconds() * S < window for r in new)
    assert change.old["window"] == 60 * S  # the query's own RANGE, registered by the compiler
