"""cq.multi_join against Spark's own chain of binary joins with the same conditions (batch and streaming).

Input i has columns ``k<i>`` (key: skewed, duplicates, nulls), ``t<i>`` (event time) and ``v<i>``; the
oracle joins input 0 with 1, the result with 2, ... with ``k0 = k<i>`` and the bounds written as SQL.
Streams are parquet directories read one file per trigger, so both queries see the same micro-batches.
"""
from __future__ import annotations

import datetime
import itertools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import join_data as jd
from helpers.streaming import run_memory

import pyspark_cq as cq
from pyspark_cq.control import ControlTable, join_plan_id, parse_join_plan
from pyspark_cq.cost.chain import STRATEGIES
from pyspark_cq.operators.multi_join.worker import closure, default_orders, timeout_at

DELAY = "20 seconds"
#: Bounds per number of inputs: (i, j, lower s, upper s), t_j in [t_i + lower, t_i + upper].
BOUNDS = {
    2: [(0, 1, -5, 10)],
    3: [(0, 1, -5, 10), (1, 2, 0, 15)],
    4: [(0, 1, -5, 10), (1, 2, 0, 15), (0, 3, -10, 0), (2, 3, -30, 5)],
}


def _bounds(n):
    return [(i, j, f"{lo} seconds", f"{up} seconds") for i, j, lo, up in BOUNDS[n]]


def _table(rng, i, n_rows, t0_us, *, nkeys=12, hot=0.3):
    keys = np.where(rng.random(n_rows) < hot, 0, rng.integers(0, nkeys, n_rows))   # key 0 is hot
    kcol = [None if rng.random() < 0.05 else int(k) for k in keys]
    times = t0_us + rng.integers(0, 10_000_000, n_rows)
    times = (times // 1000) * 1000 + np.where(rng.random(n_rows) < 0.5, 0, rng.integers(0, 1000, n_rows))
    vcol = [None if rng.random() < 0.1 else int(v) for v in rng.integers(-2**62, 2**62, n_rows)]
    table = pa.table({f"k{i}": pa.array(kcol, pa.int64()),
                      f"t{i}": pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                      f"v{i}": pa.array(vcol, pa.int64())})
    return pa.concat_tables([table, table.slice(0, 2)])  # exact duplicates


def _schema(i):
    return f"k{i} long, t{i} timestamp, v{i} long"


def _spark_chain(dfs, n):
    """Spark's chain of binary inner joins with the same conditions."""
    from pyspark.sql import functions as F

    out = dfs[0]
    for j in range(1, n):
        conds = [f"k0 = k{j}"]
        for a, b, lo, up in BOUNDS[n]:
            if max(a, b) == j:
                conds.append(f"t{b} BETWEEN t{a} + INTERVAL {lo} SECONDS AND t{a} + INTERVAL {up} SECONDS")
        out = out.join(dfs[j], F.expr(" AND ".join(conds)), "inner")
        if out.isStreaming:  # Spark allows one event-time column per stream: keep t0's watermark only
            out = out.select(*[F.col(c).alias(c, metadata={}) if c.startswith("t") and c != "t0" else F.col(c)
                               for c in out.columns])
    return out


def _python_oracle(tables, n):
    """Every tuple (one row per input) with equal non-null keys and all bounds satisfied: per key, a
    depth-first search over the inputs in index order that checks each bound once both rows are chosen.
    """
    by_key = []
    for i, t in enumerate(tables):
        groups = {}
        for r in t.to_pylist():
            if r[f"k{i}"] is not None:
                us = round(r[f"t{i}"].timestamp() * 1e6)
                # Spark returns TIMESTAMP values as naive datetimes in the session zone (UTC in the tests)
                groups.setdefault(r[f"k{i}"], []).append(
                    (us, tuple(v.replace(tzinfo=None) if hasattr(v, "tzinfo") else v for v in r.values())))
        by_key.append(groups)
    checks = [[(a, b, lo * 1_000_000, up * 1_000_000) for a, b, lo, up in BOUNDS[n] if max(a, b) == j]
              for j in range(n)]
    out = []

    def extend(key, chosen):
        j = len(chosen)
        if j == n:
            out.append(tuple(v for _, values in chosen for v in values))
            return
        for row in by_key[j].get(key, ()):
            times = [c[0] for c in chosen] + [row[0]]
            if all(lo <= times[b] - times[a] <= up for a, b, lo, up in checks[j]):
                extend(key, chosen + [row])

    for key in by_key[0]:
        extend(key, [])
    return sorted(out, key=repr)


def _batch_dfs(spark, tmp_dir, tables):
    """Batch DataFrames of exactly these rows (via parquet: pandas would turn nullable longs into floats)."""
    dfs = []
    for i, t in enumerate(tables):
        path = str(tmp_dir / f"batch{i}.parquet")
        pq.write_table(t, path)
        dfs.append(spark.read.parquet(path))
    return dfs


def _rows(df):
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _cols(n):
    return [c for i in range(n) for c in (f"k{i}", f"t{i}", f"v{i}")]


# --- pure parts ---------------------------------------------------------------------------------------


def test_plan_ids_round_trip_and_refuse_non_permutations():
    orders = [[1, 2], [2, 0], [1, 0]]
    assert join_plan_id(orders) == "0:1>2;1:2>0;2:1>0"
    assert parse_join_plan(" 2:1>0; 0:1>2 ;1:2>0", 3) == ((1, 2), (2, 0), (1, 0))
    for bad, why in [("0:1>2;1:2>0", "no probe order for input"), ("0:1>1;1:0>2;2:0>1", "permutation"),
                     ("0:1>2;0:2>1;2:0>1", "exactly one"), ("x", "not '<input>"), ("", "plan_id must"),
                     ("0:1>2;1:2>0;2:1>0;3:0>1", "exactly one")]:
        with pytest.raises(ValueError, match=why):
            parse_join_plan(bad, 3)
    with pytest.raises(ValueError, match="permutation"):
        join_plan_id([[1], [1]])


def test_closure_reach_and_default_orders():
    b = [(0, 1, -5, 10), (1, 2, 0, 15)]
    d = closure(3, b)
    assert d[0][2] == 25 and d[2][0] == 5 and d[0][1] == 10 and d[1][0] == 5
    # input 2 is narrowest to 1 (band 15) before 0 (band 30); input 0 probes 1 (band 15) first
    assert default_orders(3, b) == ((1, 2), (0, 2), (1, 0))
    # a shard times out when the watermark (ms) reaches its first deadline (µs)
    assert timeout_at(5, [None, 7_001, 9_000]) == 7 and timeout_at(5, [None]) is None


# --- batch --------------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("n", [2, 3, 4])
def test_batch_equals_spark_chain(spark, tmp_dir, n):
    rng = np.random.default_rng(n)
    tables = [_table(rng, i, 40, jd.BASE_US) for i in range(n)]
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _rows(_spark_chain(dfs, n).select(*_cols(n)))
    assert want == _python_oracle(tables, n)
    assert len(want) > 5  # the data joins
    ours = cq.multi_join(dfs, [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)], _bounds(n))
    assert ours.columns == _cols(n)
    assert _rows(ours) == want


@pytest.mark.slow
@pytest.mark.spark
def test_batch_every_probe_order_gives_the_same_rows(spark, tmp_dir):
    n = 3
    rng = np.random.default_rng(5)
    tables = [_table(rng, i, 30, jd.BASE_US) for i in range(n)]
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _python_oracle(tables, n)
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("mj", plan_id="0:1>2;1:0>2;2:0>1")
    for orders in itertools.product(*[list(itertools.permutations([j for j in range(n) if j != i]))
                                      for i in range(n)]):
        table.set("mj", plan_id=join_plan_id(orders), reason="test: every plan")
        out = cq.multi_join(dfs, [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)], _bounds(n),
                            control=table.handle("mj"))
        assert _rows(out) == want, orders


@pytest.mark.spark
def test_batch_shared_key_string_keys_and_hash_collisions_checked(spark):
    from datetime import datetime, timedelta

    b = datetime(2024, 1, 1)
    views = spark.createDataFrame([("a", b), ("a", b + timedelta(minutes=1)), ("b", b), (None, b), ("c.d", b)],
                                  "user string, vts timestamp")
    clicks = spark.createDataFrame([("a", b + timedelta(minutes=3)), ("b", b + timedelta(minutes=20)),
                                    ("c.d", b + timedelta(minutes=2)), (None, b)], "user string, cts timestamp")
    buys = spark.createDataFrame([("a", b + timedelta(minutes=30), 9.5), ("c.d", b + timedelta(minutes=5), 1.0),
                                  ("a", b + timedelta(hours=3), 1.0)], "user string, pts timestamp, amount double")
    bounds = [(0, 1, "0 seconds", "10 minutes"), (1, 2, "0 seconds", "1 hour")]
    out = cq.multi_join([views, clicks, buys], "user", ["vts", "cts", "pts"], bounds)
    assert out.columns == ["user", "vts", "cts", "pts", "amount"]
    want = (views.join(clicks, "user").where("cts BETWEEN vts AND vts + INTERVAL 10 MINUTES")
            .join(buys, "user").where("pts BETWEEN cts AND cts + INTERVAL 1 HOUR"))
    assert _rows(out) == _rows(want.select(*out.columns))
    assert len(_rows(out)) == 3


@pytest.mark.spark
def test_batch_ntz_times_and_double_keys_follow_spark(spark):
    """TIMESTAMP_NTZ times; double keys with -0.0 / 0.0 and NaN (equal in Spark's joins) and nulls."""
    from datetime import datetime, timedelta

    from pyspark.sql import functions as F

    b = datetime(2024, 3, 31, 1, 59)
    rows = [(0.0, b, 1), (-0.0, b + timedelta(seconds=30), 2), (float("nan"), b, 3), (1.5, b, 4), (None, b, 5)]
    a = spark.createDataFrame(rows, "ka double, ta timestamp_ntz, va int")
    c = spark.createDataFrame([(k, t + timedelta(seconds=20), v * 10) for k, t, v in rows],
                              "kc double, tc timestamp_ntz, vc int")
    want = a.join(c, F.expr("ka = kc AND tc BETWEEN ta AND ta + INTERVAL 1 MINUTE"))
    out = cq.multi_join([a, c], ["ka", "kc"], ["ta", "tc"], [(0, 1, "0 seconds", "1 minute")])
    assert list(map(repr, _rows(out))) == list(map(repr, _rows(want)))  # repr: NaN != NaN
    assert len(_rows(want)) == 5  # zeros: 3 pairs within the band; NaN; 1.5


def test_hashed_keys_are_verified_on_their_values():
    """A hash collision (two keys, one kernel key) never joins rows: matches are checked on the values."""
    from pyspark_cq.operators._common.payload import PayloadSide
    from pyspark_cq.operators.multi_join.worker import MultiJoinWorker

    worker = MultiJoinWorker.__new__(MultiJoinWorker)
    worker.config = type("C", (), {"hashed": True, "n": 2, "key_pos": (0, 0)})()
    sides = [PayloadSide(pa.schema([("k", pa.string())]), pa.table({"k": ["x", "y"]})),
             PayloadSide(pa.schema([("k", pa.string())]), pa.table({"k": ["x", "x"]}))]
    matches = np.array([[0, 0], [1, 1], [0, 1]])
    assert worker._verified(sides, matches).tolist() == [[0, 0], [0, 1]]


# --- bad input ----------------------------------------------------------------------------------------


@pytest.mark.spark
def test_bad_arguments_name_the_argument(spark):
    a = spark.createDataFrame([(1, jd.BASE_US)], "k long, ta long").selectExpr("k", "timestamp_micros(ta) ta")
    b = a.withColumnRenamed("ta", "tb")
    c = a.withColumnRenamed("ta", "tc")
    ok = [(0, 1, "0 seconds", "1 minute")]
    cases = [
        (dict(inputs=[a]), ValueError, "inputs must be a list of 2 to 6"),
        (dict(inputs=a), TypeError, "inputs must be a list"),
        (dict(inputs=[a, "x"]), TypeError, r"inputs\[1\] must be a pyspark.sql.DataFrame"),
        (dict(on=["k"]), ValueError, "on must list one key column per input"),
        (dict(on="nope"), ValueError, r"on \(inputs\[0\]\): unknown column"),
        (dict(times=["ta"]), ValueError, "times must list one time column per input"),
        (dict(times=["ta", "k"]), TypeError, r"times\[1\] must be a timestamp column"),
        (dict(times=["ta", "zz"]), ValueError, r"times\[1\]: unknown column"),
        (dict(bounds=[]), TypeError, "bounds must be a non-empty list"),
        (dict(bounds=[(0, 2, "0 seconds", "1 second")]), ValueError, r"bounds\[0\]: j must be an input index"),
        (dict(bounds=[(0, 0, "0 seconds", "1 second")]), ValueError, "two different inputs"),
        (dict(bounds=[(0, 1, "1 minute", "0 seconds")]), ValueError, r"bounds\[0\]: lower must be <= upper"),
        (dict(bounds=[(0, 1, "10", "1 minute")]), (TypeError, ValueError), r"bounds\[0\] lower"),
        (dict(bounds=[(0, 1, "0 seconds")]), TypeError, r"bounds\[0\] must be \(i, j, lower, upper\)"),
        (dict(inputs=[a, b, c], times=["ta", "tb", "tc"]), ValueError, r"bounds must connect all inputs.*\[2\]"),
        (dict(inputs=[a, a], times=["ta", "ta"]), ValueError,
         r"column\(s\) \['ta'\] more than once.*withColumnRenamed"),
    ]
    for change, exc, match in cases:
        args = dict(inputs=[a, b], on="k", times=["ta", "tb"], bounds=ok) | change
        with pytest.raises(exc, match=match):
            cq.multi_join(args["inputs"], args["on"], args["times"], args["bounds"])
    with pytest.raises(TypeError, match="different types"):
        cq.multi_join([a, b.selectExpr("cast(k as string) k", "tb")], "k", ["ta", "tb"], ok)


@pytest.mark.spark
def test_streaming_inputs_need_watermarks_and_no_mixing(spark, tmp_dir):
    os.makedirs(tmp_dir / "s0")
    jd.write(str(tmp_dir / "s0"), "a.parquet", _table(np.random.default_rng(0), 0, 3, jd.BASE_US))
    s0 = spark.readStream.schema(_schema(0)).parquet(str(tmp_dir / "s0"))
    s1 = s0.selectExpr("k0 k1", "t0 t1", "v0 v1")
    b1 = spark.createDataFrame([], _schema(1))
    bounds = _bounds(2)
    with pytest.raises(ValueError, match=r"times\[0\]: the streaming input needs a watermark"):
        cq.multi_join([s0, s1], ["k0", "k1"], ["t0", "t1"], bounds)
    with pytest.raises(ValueError, match=r"all streaming or all batch.*inputs\[1\]"):
        cq.multi_join([s0.withWatermark("t0", DELAY), b1], ["k0", "k1"], ["t0", "t1"], bounds)


@pytest.mark.spark
def test_a_bad_plan_fails_when_defined(spark, tmp_dir):
    a = spark.createDataFrame([], _schema(0))
    b = spark.createDataFrame([], _schema(1))
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("mj", plan_id="0:1;1:1")
    with pytest.raises(ValueError, match=r"multi_join 'mj': plan_id '0:1;1:1'.*permutation"):
        cq.multi_join([a, b], ["k0", "k1"], ["t0", "t1"], _bounds(2), control=table.handle("mj"))


def _chunk_params(strategy, n=3):
    """Tiny chunks and bound, and priorities that rank each input's steps differently (docs/chain.md)."""
    steps = [f"{i}_{j}" for i in range(n) for j in range(n) if i != j]
    return {"schedule": strategy, "chunk_rows": 5, "max_buffered_rows": 12,
            "priorities": {s: float(k % 3) for k, s in enumerate(steps)},
            "selectivities": {s: 0.5 + k for k, s in enumerate(steps)}}


@pytest.mark.slow
@pytest.mark.spark
def test_batch_probe_steps_in_chunks_give_the_same_rows_under_every_strategy(spark, tmp_dir):
    n = 3
    rng = np.random.default_rng(21)
    tables = [_table(rng, i, 40, jd.BASE_US) for i in range(n)]
    dfs = _batch_dfs(spark, tmp_dir, tables)
    want = _python_oracle(tables, n)
    assert len(want) > 20
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("mj", plan_id="0:2>1;1:0>2;2:1>0")
    for strategy in STRATEGIES:
        table.set("mj", params=_chunk_params(strategy), reason="test: chunked probe steps")
        out = cq.multi_join(dfs, [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)], _bounds(n),
                            control=table.handle("mj"))
        assert _rows(out) == want, strategy
    table.set("mj", params={"schedule": "sideways"}, reason="test: a bad schedule")
    with pytest.raises(ValueError, match=r"multi_join 'mj': params\['schedule'\] must be one of"):
        cq.multi_join(dfs, [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)], _bounds(n),
                      control=table.handle("mj"))


# --- streaming ----------------------------------------------------------------------------------------

BATCHES = 5


def _write_stream(root, n, seed, hot=0.3):
    rng = np.random.default_rng(seed)
    tables = [[] for _ in range(n)]
    for b in range(BATCHES):
        for i in range(n):
            t = _table(rng, i, 30, jd.BASE_US + b * 10_000_000, hot=hot)
            if (i, b) == (1, 2):
                t = t.slice(0, 0)  # an empty micro-batch file
            tables[i].append(t)
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)
    return [pa.concat_tables(ts) for ts in tables]


def _sources(spark, root, n):
    return [spark.readStream.schema(_schema(i)).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, f"in{i}")).withWatermark(f"t{i}", DELAY) for i in range(n)]


def _run(df, name, checkpoint):
    (q,) = run_memory((df, name, checkpoint))
    return q


@pytest.mark.spark
@pytest.mark.slow
# 3 inputs: test_multi_join_outer's inner steps, and the chunked probe below. 4 inputs with a hot key of 10 %, not
# 30 %: ~3 rows of it per input and batch still match many ways (the 4-way product of 30 % gave 126,771 output rows,
# each collected twice and checked by the Python oracle: 18.6 s of the suite; issue 41)
# 2 inputs on streams: against Spark's batch join here (test_batch_equals_spark_chain[2]) and as a left outer join on
# streams, batch by batch, in test_multi_join_outer.py (issue 41: 5 s of the suite)
@pytest.mark.parametrize("n, hot", [pytest.param(4, 0.1, id="4")])
def test_stream_equals_spark_chain(spark, tmp_dir, n, hot):
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=10 + n, hot=hot)
    name = f"mj{n}"
    ours = cq.multi_join(_sources(spark, root, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                         _bounds(n), name=name)
    q, _ = run_memory((ours, f"ours_mj{n}", str(tmp_dir / "ck_ours")),
                      (_spark_chain(_sources(spark, root, n), n).select(*_cols(n)), f"spark_mj{n}",
                       str(tmp_dir / "ck_spark")))
    got = _rows(spark.table(f"ours_mj{n}"))
    assert got == _rows(spark.table(f"spark_mj{n}"))
    assert got == _python_oracle(tables, n)
    reports = [r for r in (cq.read_metrics(p, name) for p in q.recentProgress) if r]
    assert sum(r["output_rows"] for r in reports) == len(got)
    assert sum(r["input_rows"] for r in reports) == sum(t.num_rows for t in tables)
    for i in range(n):
        assert sum(r[f"input_rows_{i}"] for r in reports) == tables[i].num_rows
        assert all(r[f"late_rows_{i}"] == 0 for r in reports)
    assert any(r["evicted_rows"] > 0 for r in reports)  # state is bounded
    last = reports[-1]
    assert last["state_rows"] == sum(last[f"state_rows_{i}"] for i in range(n))


@pytest.mark.spark
@pytest.mark.slow
def test_stream_probe_steps_in_chunks_equal_spark_and_report_memory(spark, tmp_dir):
    """Chain under a bound of 12 partial matches, chunks of 5: the rows of the oracle, the per-step counters
    of the depth-first probe (matched of step 1 = probed of step 2), and the scheduler's figures reported."""
    n = 3
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=13)
    control = ControlTable(str(tmp_dir / "control.json"))
    control.register("mjc", plan_id="0:1>2;1:0>2;2:1>0", params=_chunk_params("chain"))
    ours = cq.multi_join(_sources(spark, root, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                         _bounds(n), control=control.handle("mjc"))
    q = _run(ours, "ours_mjc", str(tmp_dir / "ck"))
    got = _rows(spark.table("ours_mjc"))
    assert got == _python_oracle(tables, n)
    reports = [r for r in (cq.read_metrics(p, "mjc") for p in q.recentProgress) if r and r["input_rows"]]
    assert sum(r["output_rows"] for r in reports) == len(got)
    for r in reports:
        for i, order in enumerate(parse_join_plan("0:1>2;1:0>2;2:1>0", n)):
            assert r[f"probed_{i}_{order[1]}"] == r[f"matched_{i}_{order[0]}"], (i, r)
        assert r["chunk_steps"] >= 2 and r["peak_worker_rss"] > 0
    assert max(r["peak_buffered_rows"] for r in reports) > 0
    assert sum(r["probe_nanos_0_1"] for r in reports) > 0


@pytest.mark.spark
@pytest.mark.slow
def test_stream_plan_switch_and_restart_from_checkpoint(spark, tmp_dir):
    """Half the batches under one plan, stop, switch the plan, restart from the checkpoint: the same rows
    as an uninterrupted run, and each step's counters follow the plan in force.
    """
    n = 3
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=3)
    control = ControlTable(str(tmp_dir / "control.json"))
    plans = ["0:1>2;1:0>2;2:1>0", "0:2>1;1:2>0;2:0>1"]
    control.register("mj", plan_id=plans[0])
    keys, times = [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)]
    # the files reach the query's directory in two steps: 3 batches, stop, switch the plan, 2 more
    import shutil

    live = str(tmp_dir / "live")
    for i in range(n):
        os.makedirs(os.path.join(live, f"in{i}"))
    names = sorted(os.listdir(os.path.join(root, "in0")))

    def publish(files):
        for f in files:
            for i in range(n):
                shutil.copy2(os.path.join(root, f"in{i}", f), os.path.join(live, f"in{i}", f))

    ck = str(tmp_dir / "ck")
    reports = []
    for step, files in enumerate((names[:3], names[3:])):
        if step:
            control.set("mj", plan_id=plans[1], reason="test: switch the plan between runs")
        publish(files)
        out = cq.multi_join(_sources(spark, live, n), keys, times, _bounds(n), control=control.handle("mj"))
        # a file sink: the memory sink cannot restart from a checkpoint
        q = (out.writeStream.format("parquet").option("path", str(tmp_dir / "out")).trigger(availableNow=True)
             .option("checkpointLocation", ck).start())
        q.awaitTermination()
        reports += [(step, r) for r in (cq.read_metrics(p, "mj") for p in q.recentProgress) if r]
    got = _rows(spark.read.parquet(str(tmp_dir / "out")).select(*_cols(n)))
    assert got == _python_oracle(tables, n)
    for step, r in reports:
        for i, order in enumerate(parse_join_plan(plans[step], n)):
            first_step = f"probed_{i}_{order[0]}"
            assert r[first_step] <= r[f"input_rows_{i}"]
            assert r[f"probed_{i}_{order[1]}"] == r[f"matched_{i}_{order[0]}"], (step, i, r)
    assert {s for s, _ in reports} == {0, 1}


@pytest.mark.spark
@pytest.mark.slow
def test_stream_counts_late_and_malformed_rows_per_input(spark, tmp_dir):
    """Spark drops rows behind the previous batch's watermark before the operator (rows of batch 2 behind
    the watermark batch 1 ran with); rows without a time are malformed. Both are counted per input.
    """
    n = 2
    root = str(tmp_dir / "in")
    rng = np.random.default_rng(9)
    batches = [[_table(rng, i, 20, jd.BASE_US + (60 + 10 * b) * 1_000_000) for i in range(n)] for b in range(3)]
    late = _table(rng, 0, 3, jd.BASE_US - 600_000_000).slice(0, 3)                 # far behind the watermark
    t1 = _table(rng, 1, 5, jd.BASE_US + 80_000_000).slice(0, 5)
    no_time = t1.set_column(1, "t1", pa.nulls(5, pa.timestamp("us", tz="UTC")))   # malformed: no time
    last = [pa.concat_tables([batches[2][0], late]), pa.concat_tables([batches[2][1], no_time])]
    for b, tables in enumerate(batches[:2] + [last]):
        for i in range(n):
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", tables[i])
    q = _run(cq.multi_join(_sources(spark, root, n), ["k0", "k1"], ["t0", "t1"], _bounds(n), name="mjl"),
             "mj_late", str(tmp_dir / "ck"))
    reports = [r for r in (cq.read_metrics(p, "mjl") for p in q.recentProgress) if r]
    assert sum(r["late_rows_0"] for r in reports) == 3 and sum(r["late_rows_1"] for r in reports) == 0
    assert sum(r["malformed_rows_1"] for r in reports) == 5 and sum(r["malformed_rows_0"] for r in reports) == 0
    assert sum(r["late_rows"] for r in reports) == 3 and sum(r["malformed_rows"] for r in reports) == 5
    kept = [pa.concat_tables([b[i] for b in batches]) for i in range(n)]
    assert _rows(spark.table("mj_late")) == _python_oracle(kept, n)


@pytest.mark.spark
@pytest.mark.slow
def test_stream_bad_plan_set_while_running_names_operator_and_batch(spark, tmp_dir):
    n = 2
    root = str(tmp_dir / "in")
    _write_stream(root, n, seed=4)
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("mjbad", plan_id="0:1;1:0")
    out = cq.multi_join(_sources(spark, root, n), ["k0", "k1"], ["t0", "t1"], _bounds(n),
                        control=table.handle("mjbad"))
    table.set("mjbad", plan_id="0:1;1:1", reason="test: a bad plan after the definition check")
    with pytest.raises(Exception, match=r"multi_join 'mjbad': plan_id '0:1;1:1'.*micro-batch \d+"):
        _run(out, "mj_bad", str(tmp_dir / "ck"))


@pytest.mark.slow
@pytest.mark.spark
def test_stream_sheds_by_drop_ratio_and_counts_per_input(spark, tmp_dir):
    """drop_ratio (RTStream §4.4): about that share of every input is shed and counted per input; what is
    emitted are matches of the full input (a subset of the oracle's), and every row is read."""
    n = 2
    root = str(tmp_dir / "in")
    tables = _write_stream(root, n, seed=31)
    table = ControlTable(str(tmp_dir / "ct.json"))
    table.register("mj_shed", drop_ratio=0.5)
    q = _run(cq.multi_join(_sources(spark, root, n), ["k0", "k1"], ["t0", "t1"], _bounds(n),
                           control=table.handle("mj_shed")), "mj_shed_out", str(tmp_dir / "ck"))
    reports = [r for r in (cq.read_metrics(p, "mj_shed") for p in q.recentProgress) if r]
    for i in range(n):
        rows = tables[i].num_rows
        assert sum(r[f"input_rows_{i}"] for r in reports) == rows
        assert 0.3 * rows < sum(r[f"shed_rows_{i}"] for r in reports) < 0.7 * rows
    assert sum(r["shed_rows"] for r in reports) == sum(r[f"shed_rows_{i}"] for r in reports for i in range(n))
    got = _rows(spark.table("mj_shed_out"))
    full = _python_oracle(tables, n)
    assert set(got) <= set(full) and len(got) < len(full)


@pytest.mark.spark
@pytest.mark.slow
def test_runtime_chain_policy_schedules_a_running_multi_join(spark, tmp_dir):
    """The runtime with the ``chain`` policy on a running 3-way join: after batch 0 (depth-first) it writes the
    schedule and selectivities, after the first chunked batch (whose steps are timed) the Chain priorities
    of every input's path; the sink holds exactly the oracle's rows."""
    import shutil

    from pyspark_cq_plugins.chain_scheduler import ChainScheduler

    from pyspark_cq.runtime import CQRuntime

    n = 3
    root, live = str(tmp_dir / "in"), str(tmp_dir / "live")
    tables = _write_stream(root, n, seed=17)
    for i in range(n):
        os.makedirs(os.path.join(live, f"in{i}"))
    names = sorted(os.listdir(os.path.join(root, "in0")))
    rt = CQRuntime(spark, policies=[ChainScheduler(max_buffered_rows=10, chunk_rows=4)],
                   control_path=str(tmp_dir / "control.json"), every_batches=1)

    def build(ctx):
        out = cq.multi_join(_sources(spark, live, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                            _bounds(n), control=ctx.control("mjp", plan_id="0:1>2;1:0>2;2:1>0"))
        return out.writeStream.format("memory").outputMode("append").option("checkpointLocation",
                                                                            str(tmp_dir / "ck"))

    rt.register("mjq", build)
    reports, params = [], []
    with rt:
        for b, f in enumerate(names):
            for i in range(n):
                shutil.copy2(os.path.join(root, f"in{i}", f), os.path.join(live, f"in{i}", f))
            rt.query("mjq").processAllAvailable()
            rt.await_batches("mjq", b + 1, timeout=300)  # a wait, not a timing check
            rt.run_policies()
            progress = [p for p in rt.query("mjq").recentProgress if p["numInputRows"] > 0]
            reports.append(cq.read_metrics(progress[-1], "mjp"))
            params.append(rt.control_table().entry("mjp").get("params"))
        rt.query("mjq").processAllAvailable()
    got = _rows(spark.table("mjq"))
    assert got == _python_oracle(tables, n)
    assert reports[0]["chunk_steps"] == 0 and "priorities" not in params[0]
    assert params[0]["schedule"] == "chain" and params[0]["max_buffered_rows"] == 10
    assert reports[1]["chunk_steps"] > 0 and reports[1]["probe_nanos_0_1"] > 0
    prio = params[-1]["priorities"]      # per input path, once both its steps were reached and timed
    assert prio and set(prio) <= {"0_1", "0_2", "1_0", "1_2", "2_1", "2_0"}
    assert all({f"{i}_{j}" for j in range(n) if j != i} <= set(prio) for i in {int(s[0]) for s in prio})
    assert reports[-1]["chunk_steps"] > 0 and reports[-1]["peak_buffered_rows"] > 0


@pytest.mark.slow
@pytest.mark.spark
def test_stream_kept_column_is_the_product_of_each_rows_batch_fraction(spark, tmp_dir):
    """RTStream §4.4's kept fraction per result (``params["kept_column"]`` of the entry): a result says the
    product over its rows of 1 − the drop ratio of the micro-batch that brought the row (changed between
    batches). Checked against the plain-Python enumeration: every result is one of its tuples, and every
    tuple whose rows all came in batches that shed nothing is there."""
    n, ratios = 3, [0.0, 0.5, 0.25]
    root = str(tmp_dir / "in")
    rng = np.random.default_rng(41)
    for i in range(n):
        os.makedirs(os.path.join(root, f"in{i}"))
    table = ControlTable(str(tmp_dir / "ct.json"))
    table.register("mj_kept", drop_ratio=ratios[0], params={"kept_column": "kept"})
    ours = cq.multi_join(_sources(spark, root, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                         _bounds(n), control=table.handle("mj_kept"))
    assert ours.columns == _cols(n) + ["kept"] and dict(ours.dtypes)["kept"] == "double"
    tables = [[] for _ in range(n)]
    q = (ours.writeStream.format("memory").queryName("mj_kept_out").outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    try:
        for b, ratio in enumerate(ratios):
            table.set("mj_kept", drop_ratio=ratio, reason="test")
            for i in range(n):
                t = _table(rng, i, 30, jd.BASE_US + b * 10_000_000)
                tables[i].append(t)
                jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)
            q.processAllAvailable()
        got = spark.table("mj_kept_out").collect()
    finally:
        q.stop()
    full = _python_oracle([pa.concat_tables(ts) for ts in tables], n)
    cols = _cols(n)

    def batch_of(ts):   # batch b holds the times [BASE + b·10 s, BASE + (b + 1)·10 s)
        return (round(ts.replace(tzinfo=datetime.timezone.utc).timestamp() * 1e6) - jd.BASE_US) // 10_000_000

    rows = [tuple(r[c] for c in cols) for r in got]
    assert set(rows) <= set(full) and len(got) < len(full)
    for r in got:
        want = np.prod([1 - ratios[batch_of(r[f"t{i}"])] for i in range(n)])
        assert r["kept"] == pytest.approx(want)
    unshed = [f for f in full if all(ratios[batch_of(f[3 * i + 1])] == 0 for i in range(n))]
    assert unshed and set(unshed) <= set(rows)
    assert {r["kept"] for r in got} > {1.0}
    # a kept_column that clashes with an output column is refused when the operator is defined
    table.register("mj_bad", params={"kept_column": "v1"})
    with pytest.raises(ValueError, match=r"multi_join 'mj_bad': params\['kept_column'\] must be a new column"):
        cq.multi_join(_sources(spark, root, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                      _bounds(n), control=table.handle("mj_bad"))
