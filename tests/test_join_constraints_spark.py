"""interval_join(constraints=...) against Spark's built-in stream-stream join (STREAM §5.2, issue 43).

Generated file streams that adhere to the declared constraints -- STREAM's orders (left, one row per order id)
and fulfilments (right, one to three per order, after it): ``many_to_one(child="right", parent="left")``; and
right rows unique on the key: ``unique("right", ...)`` -- must give exactly Spark's join (which knows nothing of
them) while the operator keeps fewer rows; a stream that breaks them has its violations counted. The same
micro-batches for both queries (one parquet file per trigger), as tests/test_join_stream.py.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.streaming import run_memory

import pyspark_cq
from pyspark_cq.constraints import clustered, many_to_one, ordered, unique

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DELAY = "15 seconds"
BATCHES = 6


def _table(side: str, rows) -> pa.Table:
    """Rows ``(key, t_us, value)`` in join_data's layout (``s`` is the same for all rows)."""
    n = len(rows)
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "s": pa.array(["s0"] * n),
                     "ts": pa.array([r[1] for r in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     f"{side}v": pa.array([r[2] for r in rows], pa.int64()), "tag": pa.array([0.5] * n)})


def write_orders(root: str, seed: int, duplicates: int = 0) -> int:
    """Orders (``l``) and fulfilments (``r``) files, one per micro-batch; returns the duplicate orders written
    (``duplicates`` per batch but the first: an order of the batch before comes again, violating the constraint).
    Fulfilments come 0-9 s after their order, in its batch or the next.
    """
    rng = np.random.default_rng(seed)
    rows = [([], []) for _ in range(BATCHES)]
    order, value, dup = 0, 0, 0
    for b in range(BATCHES):
        t0 = jd.BASE_US + b * 10_000_000
        for _ in range(int(rng.integers(40, 60))):
            t = t0 + int(rng.integers(-5_000_000, 5_000_000))
            rows[b][0].append((order, t, value := value + 1))
            for _ in range(int(rng.integers(1, 4))):
                when = min(b + int(rng.integers(0, 2)), BATCHES - 1)
                rows[when][1].append((order, t + int(rng.integers(0, 9_000_000)), value := value + 1))
            order += 1
        if b:
            for k, _, _ in rows[b - 1][0][:duplicates]:
                rows[b][0].append((k, t0 + 6_000_000, value := value + 1))   # never late
                dup += 1
    for b in range(BATCHES):
        for i, side in enumerate("lr"):
            jd.write(os.path.join(root, side), f"b{b:03d}.parquet", _table(side, rows[b][i]))
    return dup


def write_unique_right(root: str, seed: int) -> None:
    """Right keys unique over the stream; left keys drawn from the right keys of the batch and its neighbours."""
    rng = np.random.default_rng(seed)
    per = [list(range(100 * b, 100 * b + int(rng.integers(40, 60)))) for b in range(BATCHES)]
    value = 0
    for b in range(BATCHES):
        t0 = jd.BASE_US + b * 10_000_000
        right = [(k, t0 + int(rng.integers(-5_000_000, 5_000_000)), value := value + 1) for k in per[b]]
        near = sum((per[c] for c in (b - 1, b, b + 1) if 0 <= c < BATCHES), [])
        left = [(int(k), t0 + int(rng.integers(-5_000_000, 5_000_000)), value := value + 1)
                for k in rng.choice(near, int(rng.integers(50, 80)))]
        jd.write(os.path.join(root, "l"), f"b{b:03d}.parquet", _table("l", left))
        jd.write(os.path.join(root, "r"), f"b{b:03d}.parquet", _table("r", right))




def _reports(query, name):
    return [r for r in (pyspark_cq.read_metrics(p, name) for p in query.recentProgress) if r]


# many_to_one on an inner join runs on streams with clustered, on these generated orders, against Spark's join in
# test_cql_constraints.py::test_cql_constraints_on_streams_equal_spark_join, and per constraint and how against the
# plain-Python rule in test_join_constraints.py (issue 41: 8 s)
@pytest.mark.parametrize("data, constraint, how", [
    ("orders", many_to_one(child="right", parent="left", delay="5 seconds"), "right"),
    ("unique", unique("right", ["k", "s"]), "left"),
])
def test_adhering_streams_equal_spark_join(spark, tmp_path, data, constraint, how):
    root = str(tmp_path / "data")
    write_orders(root, seed=7) if data == "orders" else write_unique_right(root, seed=8)

    def source(side):
        return jd.stream_source(spark, root, side, DELAY)

    name, plain = f"cq_constrained_{how}", f"cq_plain_{how}"
    band = (f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds")
    ours = pyspark_cq.interval_join(source("l"), source("r"), ["k", "s"], "ts", "ts", *band, how=how,
                                    suffixes=("_l", "_r"), name=name, constraints=[constraint])
    without = pyspark_cq.interval_join(source("l"), source("r"), ["k", "s"], "ts", "ts", *band, how=how,
                                       suffixes=("_l", "_r"), name=plain)
    theirs = jd.spark_reference(source("l"), source("r"), how)
    q_ours, q_plain, _ = run_memory((ours, f"ours_{how}", str(tmp_path / "ck_ours")),
                                    (without, f"plain_{how}", str(tmp_path / "ck_plain")),
                                    (theirs, f"spark_{how}", str(tmp_path / "ck_spark")))
    assert spark.table(f"spark_{how}").count() > 50
    jd.assert_same_rows(spark.table(f"ours_{how}"), spark.table(f"spark_{how}"))
    reports = _reports(q_ours, name)
    assert sum(r["constraint_violations"] for r in reports) == 0
    kept = sum(r["state_rows"] for r in reports)
    assert kept < 0.8 * sum(r["state_rows"] for r in _reports(q_plain, plain))


def test_violations_are_counted(spark, tmp_path):
    root = str(tmp_path / "data")
    dup = write_orders(root, seed=9, duplicates=3)
    name = "cq_violated"
    ours = pyspark_cq.interval_join(jd.stream_source(spark, root, "l", DELAY), jd.stream_source(spark, root, "r", DELAY),
                                    ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds",
                                    suffixes=("_l", "_r"), name=name,
                                    constraints=[many_to_one(child="right", parent="left")])
    (q,) = run_memory((ours, "violated", str(tmp_path / "ck")))
    assert dup == 3 * (BATCHES - 1)
    assert sum(r["constraint_violations"] for r in _reports(q, name)) == dup


def test_control_entry_turns_the_constraint_off_and_on(spark, tmp_path):
    """``params["constraint_many_to_one_right"]`` in the control entry: off, the join keeps exactly the state of the
    join without constraints, batch by batch; on (the entry's default), less; the output is Spark's either way."""
    from pyspark_cq.control import ControlTable

    root = str(tmp_path / "data")
    write_orders(root, seed=10)
    table = ControlTable(str(tmp_path / "control.json"))
    table.register("c_off", params={"constraint_many_to_one_right": False})
    table.register("c_on", params={"constraint_many_to_one_right": True})

    def query(name, **kw):
        df = pyspark_cq.interval_join(jd.stream_source(spark, root, "l", DELAY),
                                      jd.stream_source(spark, root, "r", DELAY), ["k", "s"], "ts", "ts",
                                      f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds", suffixes=("_l", "_r"),
                                      name=name, **kw)
        return df, name, str(tmp_path / f"ck_{name}")

    declared = [many_to_one(child="right", parent="left")]
    q_off, q_on, q_plain = run_memory(query("c_off", control=table.handle("c_off"), constraints=declared),
                                      query("c_on", control=table.handle("c_on"), constraints=declared),
                                      query("c_plain"))
    states = {n: [r["state_rows"] for r in _reports(q, n)] for q, n in ((q_off, "c_off"), (q_on, "c_on"),
                                                                        (q_plain, "c_plain"))}
    assert states["c_off"] == states["c_plain"]
    assert sum(states["c_on"]) < 0.8 * sum(states["c_plain"])
    for name in ("c_off", "c_on"):
        jd.assert_same_rows(spark.table(name), spark.table("c_plain"))


def write_arrival(root: str, kind: str, jitter: int, violate: int = 0) -> int:
    """test_join_constraints' generated clustered (``"orders"``) or ordered (``"funnel"``) streams, one file per
    side and micro-batch; returns the right input's adherence k."""
    from test_join_constraints import arrival_streams

    batches, k = arrival_streams(kind, jitter, violate=violate)
    # A last batch an hour later (keys above all others, so it breaks no constraint) moves the watermark past
    # everything: an outer join's unmatched rows that the constraint dropped early come out in Spark's run too.
    last = batches[-1][0][1][-1][1] + 3_600_000_000
    batches.append((([(10**9 + 2, last, 0)], [(10**9 + 1, last, 1)]), None))
    for b, (rows, _) in enumerate(batches):
        for i, side in enumerate("lr"):
            jd.write(os.path.join(root, side), f"b{b:03d}.parquet", _table(side, rows[i]))
    return k


# the ordered case on Spark (a left join, k = 0; the suite's time bound). The clustered one (an inner join, many_to_one
# and clustered with k > 0, on the orders of write_arrival("orders", 4)) runs the same rule through CQL against Spark's
# join with less state and no violations: test_cql_constraints.py::test_cql_constraints_on_streams_equal_spark_join
# (issue 41: 12 s); tests/test_join_constraints.py runs every join type and k against the plain-Python reference
@pytest.mark.parametrize("kind, jitter, constraints, how", [
    ("funnel", 1, [ordered("right", 0)], "left"),
])
def test_arrival_constraints_equal_spark_join(spark, tmp_path, kind, jitter, constraints, how):
    """clustered / ordered right inputs (adhering with the declared k) give Spark's rows with less state."""
    root = str(tmp_path / "data")
    k = write_arrival(root, kind, jitter)
    assert k <= max(c.k for c in constraints if c.kind in ("clustered", "ordered"))

    def source(side):
        return jd.stream_source(spark, root, side, DELAY)

    name, plain = f"cq_arrival_{how}", f"cq_arrival_plain_{how}"
    band = (f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds")
    ours = pyspark_cq.interval_join(source("l"), source("r"), ["k", "s"], "ts", "ts", *band, how=how,
                                    suffixes=("_l", "_r"), name=name, constraints=constraints)
    without = pyspark_cq.interval_join(source("l"), source("r"), ["k", "s"], "ts", "ts", *band, how=how,
                                       suffixes=("_l", "_r"), name=plain)
    theirs = jd.spark_reference(source("l"), source("r"), how)
    q_ours, q_plain, _ = run_memory((ours, f"a_ours_{how}", str(tmp_path / "ck_ours")),
                                    (without, f"a_plain_{how}", str(tmp_path / "ck_plain")),
                                    (theirs, f"a_spark_{how}", str(tmp_path / "ck_spark")))
    assert spark.table(f"a_spark_{how}").count() > 50
    jd.assert_same_rows(spark.table(f"a_ours_{how}"), spark.table(f"a_spark_{how}"))
    reports = _reports(q_ours, name)
    assert sum(r["constraint_violations"] for r in reports) == 0
    assert sum(r["state_rows"] for r in reports) < 0.8 * sum(r["state_rows"] for r in _reports(q_plain, plain))


def test_arrival_violations_are_counted(spark, tmp_path):
    root = str(tmp_path / "data")
    write_arrival(root, "orders", 1, violate=3)
    name = "cq_arrival_violated"
    ours = pyspark_cq.interval_join(jd.stream_source(spark, root, "l", DELAY), jd.stream_source(spark, root, "r", DELAY),
                                    ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds",
                                    suffixes=("_l", "_r"), name=name, constraints=[clustered("right", 0)])
    (q,) = run_memory((ours, "arrival_violated", str(tmp_path / "ck")))
    # each repeated key is a violation on its shard (a shard sees fewer rows in between, so no more than that)
    assert 1 <= sum(r["constraint_violations"] for r in _reports(q, name)) <= 3 + 3


@pytest.mark.parametrize("kw, words", [
    ({"constraints": [clustered("right", 1)], "state_persistence": "changelog"}, "does not record yet"),
    ({"constraints": [ordered("left", 1)], "bucket": "10 seconds"}, "bucket layout"),
])
def test_arrival_constraints_refused_where_not_kept(spark, tmp_path, kw, words):
    root = str(tmp_path / "data")
    write_arrival(root, "orders", 1)
    with pytest.raises(ValueError, match=words):
        pyspark_cq.interval_join(jd.stream_source(spark, root, "l", DELAY), jd.stream_source(spark, root, "r", DELAY),
                                 ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds", f"{jd.UPPER_S} seconds",
                                 suffixes=("_l", "_r"), **kw)


def test_ordered_refuses_floating_point_keys(spark, tmp_path):
    root = str(tmp_path / "data")
    write_arrival(root, "orders", 1)
    from pyspark.sql import functions as F

    left = jd.stream_source(spark, root, "l", DELAY).withColumn("f", F.col("tag"))
    right = jd.stream_source(spark, root, "r", DELAY).withColumn("f", F.col("tag"))
    with pytest.raises(ValueError, match="floating point"):
        pyspark_cq.interval_join(left, right, ["f"], "ts", "ts", "-5 seconds", "10 seconds", suffixes=("_l", "_r"),
                                 constraints=[ordered("right", 1)])

