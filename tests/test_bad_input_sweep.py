"""The bad-input sweep (issue 23): every public function against the issue's list of bad inputs.

Each case is either a definition-time error that names the argument and the expected form (the table
``DEFINITION``), or data that is handled: equal to Spark's own operator on the same rows (an
independent oracle) and, on streams, counted (malformed / late) by the operator's metrics. docs/errors.md,
"The bad-input sweep", lists every case and its outcome.
"""
from __future__ import annotations

import datetime as dt
import math
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest
from helpers.files import write_in_order
from pyspark.sql import functions as F

import pyspark_cq as cq

UTC = dt.timezone.utc
T = dt.datetime(2024, 1, 1, 12, 0, 0)


@pytest.fixture(scope="module")
def frames(spark):
    """Small batch DataFrames: events, a right side, a string-keyed side, string times."""
    ev = spark.createDataFrame([(1, T, 5, 1.5, "a"), (2, T + dt.timedelta(seconds=3), 7, 2.5, "b")],
                               "k long, ts timestamp, v long, x double, s string")
    right = spark.createDataFrame([(1, T, 3)], "k long, rt timestamp, w long")
    skey = spark.createDataFrame([("1", T, 3)], "k string, rt timestamp, w long")
    stime = spark.createDataFrame([(1, "2024-01-01 12:00:00", 3)], "k long, ts string, v long")
    iv = spark.createDataFrame([(T, T + dt.timedelta(seconds=5), 1)], "s timestamp, e timestamp, k long")
    return {"ev": ev, "right": right, "skey": skey, "stime": stime, "iv": iv}


def _ij(f, **kw):
    args = dict(left=f["ev"], right=f["right"], on="k", left_time="ts", right_time="rt", lower="-5 seconds",
                upper="5 seconds")
    args.update(kw)
    return cq.interval_join(**args)


def _agg(f, **kw):
    args = dict(df=f["ev"], time="ts", window="10 seconds", slide="5 seconds", by="k", aggs={"v": ["sum"]})
    args.update(kw)
    return cq.sliding_aggregate(**args)


def _mj(f, **kw):
    a = f["ev"].select("k", F.col("ts").alias("t0"))
    b = f["right"].select("k", F.col("rt").alias("t1"))
    args = dict(inputs=[a, b], on="k", times=["t0", "t1"], bounds=[(0, 1, "0 seconds", "5 seconds")])
    args.update(kw)
    return cq.multi_join(**args)


# (id, call, exception type, text the message must contain)
DEFINITION = [
    # wrong column names
    ("join: unknown key", lambda f: _ij(f, on="kk"), ValueError, "on: unknown column(s) ['kk']"),
    ("join: unknown time", lambda f: _ij(f, left_time="t"), ValueError, "left_time: unknown column(s) ['t']"),
    ("agg: unknown by", lambda f: _agg(f, by="kk"), ValueError, "by: unknown column(s) ['kk']"),
    ("agg: unknown aggs column", lambda f: _agg(f, aggs={"vv": ["sum"]}), ValueError, "vv"),
    ("window: unknown time", lambda f: cq.window(f["ev"], "t", size="5 seconds"), ValueError, "time: unknown column"),
    ("granularity: unknown start", lambda f: cq.granularity(f["iv"], "x", "e", "1 second"), ValueError,
     "start: unknown column"),
    ("multi_join: unknown time", lambda f: _mj(f, times=["t0", "tx"]), ValueError, "tx"),
    ("select_chain: unknown column in a predicate", lambda f: cq.select_chain(f["ev"], {"p": F.col("zz") > 1}),
     Exception, "zz"),
    # wrong column types
    ("join: string time column", lambda f: _ij(f, left=f["stime"]), TypeError,
     "left_time must be a timestamp column; column 'ts' has type string"),
    ("join: string key vs long key", lambda f: _ij(f, right=f["skey"]), TypeError, "on"),
    ("agg: string time column", lambda f: _agg(f, df=f["stime"]), TypeError, "time must be a timestamp column"),
    ("window: string time column", lambda f: cq.window(f["stime"], "ts", size="5 seconds"), TypeError,
     "time must be a timestamp column or an integer column"),
    ("granularity: string bound", lambda f: cq.granularity(f["ev"], "ts", "s", "1 second"), TypeError, "end"),
    ("multi_join: string key vs long key",
     lambda f: _mj(f, inputs=[f["ev"].select("k", F.col("ts").alias("t0")), f["skey"].select("k", F.col("rt").alias("t1"))]),
     TypeError, "on"),
    ("select_chain: non-boolean Column", lambda f: cq.select_chain(f["ev"], {"p": F.col("v") + 1}), TypeError,
     "predicates['p'] must be a boolean Column"),
    ("select_chain: not a predicate", lambda f: cq.select_chain(f["ev"], {"p": 3}), TypeError, "predicates"),
    # durations: garbage, negative, zero, slide larger than window, plain numbers
    ("join: garbage lower", lambda f: _ij(f, lower="five seconds"), ValueError, "lower"),
    ("join: plain number lower", lambda f: _ij(f, lower=5), TypeError, "lower must be a duration"),
    ("join: lower above upper", lambda f: _ij(f, lower="6 seconds", upper="5 seconds"), ValueError, "lower"),
    ("join: abbreviation", lambda f: _ij(f, upper="5s"), ValueError, "upper"),
    ("agg: zero window", lambda f: _agg(f, window="0 seconds"), ValueError, "window must be a positive duration"),
    ("agg: negative window", lambda f: _agg(f, window="-10 seconds"), ValueError, "window must be a positive duration"),
    ("agg: garbage slide", lambda f: _agg(f, slide="often"), ValueError, "slide"),
    ("agg: slide larger than window", lambda f: _agg(f, slide="20 seconds"), ValueError, "slide"),
    ("agg: granularity not dividing window", lambda f: _agg(f, granularity="3 seconds"), ValueError, "granularity"),
    ("agg: month window", lambda f: _agg(f, window="1 month"), ValueError, "window"),
    ("window: zero size", lambda f: cq.window(f["ev"], "ts", size="0 seconds"), ValueError, "size"),
    ("window: negative size", lambda f: cq.window(f["ev"], "ts", size="-1 second"), ValueError, "size"),
    ("window: rows zero", lambda f: cq.window(f["ev"], "ts", rows=0), ValueError, "rows"),
    ("granularity: negative", lambda f: cq.granularity(f["iv"], "s", "e", "-1 second"), ValueError, "granularity"),
    ("granularity: garbage", lambda f: cq.granularity(f["iv"], "s", "e", "1 fortnight"), ValueError, "granularity"),
    ("multi_join: garbage bound", lambda f: _mj(f, bounds=[(0, 1, "0 seconds", "soon")]), ValueError, "bounds"),
    ("multi_join: no bounds", lambda f: _mj(f, bounds=[]), TypeError, "bounds must be a non-empty list"),
    ("parse_duration: garbage", lambda f: cq.parse_duration("ten seconds"), ValueError, "duration"),
    ("parse_duration: None", lambda f: cq.parse_duration(None), TypeError, "duration must be a duration"),
    ("parse_duration: NaN", lambda f: cq.parse_duration(float("nan")), TypeError, "duration must be a duration"),
    ("parse_duration: out of range", lambda f: cq.parse_duration("1000000000 days"), ValueError, "out of range"),
    # aggregates
    ("agg: unknown aggregate", lambda f: _agg(f, aggs={"v": ["median"]}), ValueError, "median"),
    ("agg: sum of a string column", lambda f: _agg(f, aggs={"s": ["sum"]}), TypeError, "s"),
    ("agg: avg of a timestamp column", lambda f: _agg(f, aggs={"ts": ["avg"]}), TypeError, "ts"),
    ("agg: percentile outside [0, 1]", lambda f: _agg(f, aggs={"v": ["percentile_approx(1.5)"]}), ValueError,
     "aggs['v']: 'percentile_approx(1.5)': the percentage must be in [0, 1], e.g. 'percentile_approx(0.95)'"),
    ("agg: percentile without percentage", lambda f: _agg(f, aggs={"v": ["approx_percentile"]}), ValueError,
     "aggs['v']: 'approx_percentile' needs its percentage"),
    ("agg: percentile with accuracy", lambda f: _agg(f, aggs={"v": ["percentile_approx(0.5, 100)"]}), ValueError,
     "takes one argument, the percentage"),
    ("agg: percentile of a string column", lambda f: _agg(f, aggs={"s": ["percentile_approx(0.5)"]}), TypeError,
     "aggs['s']: percentile_approx(0.5) needs a numeric column"),
    ("agg: aggs not a mapping", lambda f: _agg(f, aggs=["sum"]), TypeError, "aggs"),
    ("agg: unknown emit", lambda f: _agg(f, emit="rows"), ValueError, "emit"),
    # not DataFrames
    ("join: left not a DataFrame", lambda f: _ij(f, left=[1, 2]), TypeError, "left must be a pyspark.sql.DataFrame"),
    ("multi_join: one input", lambda f: _mj(f, inputs=[f["ev"]]), ValueError, "inputs"),
    # CQL
    ("cql: unknown unit", lambda f: cq.cql(f["ev"].sparkSession, "SELECT k FROM S [RANGE 10 PARSECS]",
                                            {"S": f["ev"]}), Exception, "PARSECS"),
    ("cql: unknown stream", lambda f: cq.cql(f["ev"].sparkSession, "SELECT k FROM Q [RANGE 10 SECONDS]",
                                              {"S": f["ev"]}), Exception, "Q"),
    ("cql: sources not a mapping", lambda f: cq.cql(f["ev"].sparkSession, "SELECT k FROM S", [f["ev"]]),
     TypeError, "sources"),
]


@pytest.mark.spark
@pytest.mark.parametrize("case, call, exc, text", DEFINITION, ids=[c[0] for c in DEFINITION])
def test_definition_time_errors_name_the_argument(frames, case, call, exc, text):
    with pytest.raises(exc) as info:
        call(frames)
    assert text in str(info.value), f"{case}: {info.value}"


# ---- the control table and the runtime (no Spark) ------------------------------------------------------

CONTROL = [
    ("unknown operator", lambda t: t.set("nope", window=5, reason="r"), KeyError, "nope"),
    ("negative window", lambda t: t.set("op", window=-5, reason="r"), ValueError, "window must be a positive duration"),
    ("zero granularity", lambda t: t.set("op", granularity=0, reason="r"), ValueError, "granularity"),
    ("garbage window", lambda t: t.set("op", window="ten", reason="r"), ValueError, "window"),
    ("NaN drop_ratio", lambda t: t.set("op", drop_ratio=float("nan"), reason="r"), ValueError, "drop_ratio"),
    ("unknown parameter", lambda t: t.set("op", windw=5, reason="r"), ValueError, "windw"),
    ("garbage at", lambda t: t.set("op", window=5, at="later", reason="r"), ValueError, "at"),
    ("reason not a str", lambda t: t.set("op", window=5, reason=None), TypeError, "reason must be a str"),
]


@pytest.mark.parametrize("case, call, exc, text", CONTROL, ids=[c[0] for c in CONTROL])
def test_control_table_writes_name_the_parameter(tmp_path, case, call, exc, text):
    from pyspark_cq.control import ControlTable

    table = ControlTable(str(tmp_path / "control.json"))
    table.register("op", window=10)
    with pytest.raises(exc) as info:
        call(table)
    assert text in str(info.value), f"{case}: {info.value}"
    assert table.version == 1          # nothing written


def test_runtime_register_names_the_argument(tmp_path):
    from pyspark_cq.runtime.core import CQRuntime

    with pytest.raises(TypeError, match="SparkSession"):
        CQRuntime(object())


def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    """``pyspark-cq explain`` on a missing file (exit code 1) and on a bad query (exit code 2): a message
    naming the problem, no Python traceback."""
    bad = tmp_path / "bad.cql"
    bad.write_text("SELECT a FROM S [RANGE -10 SECONDS]")
    for path in (str(tmp_path / "missing.cql"), str(bad)):
        out = subprocess.run([sys.executable, "-m", "pyspark_cq.cli", "explain", path], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode in (1, 2), (path, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and out.stderr.strip(), out.stderr


# ---- data: handled equal to Spark's own operator, and counted -------------------------------------------

def _rows(df, cols):
    def norm(v):
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return v
    return sorted((tuple(norm(r[c]) for c in cols) for r in df.collect()), key=repr)


def _spark_windows(df, window, slide):
    return (df.groupBy(F.window("ts", window, slide), "k")
            .agg(F.sum("x").alias("sum_x"), F.min("x").alias("min_x"), F.max("x").alias("max_x"),
                 F.avg("x").alias("avg_x"), F.count(F.lit(1)).alias("count"))
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "k",
                    "sum_x", "min_x", "max_x", "avg_x", "count"))


NASTY = [   # (k, ts, x): NaN, ±inf, null key, null time, before 1970, far future, duplicates
    (1, dt.datetime(2024, 1, 1, 0, 0, 1), float("nan")),
    (1, dt.datetime(2024, 1, 1, 0, 0, 2), 1.0),
    (2, dt.datetime(2024, 1, 1, 0, 0, 3), float("inf")),
    (2, dt.datetime(2024, 1, 1, 0, 0, 4), float("-inf")),
    (3, dt.datetime(2024, 1, 1, 0, 0, 4), float("inf")),
    (None, dt.datetime(2024, 1, 1, 0, 0, 5), 2.0),
    (None, dt.datetime(2024, 1, 1, 0, 0, 5), 2.0),
    (4, None, 3.0),
    (5, dt.datetime(1969, 12, 31, 23, 59, 58), 4.0),
    (5, dt.datetime(1900, 1, 1, 0, 0, 7), 5.0),
    (6, dt.datetime(2200, 1, 1, 0, 0, 0), 6.0),
    (6, dt.datetime(9999, 6, 1, 0, 0, 0), 6.5),
    (7, dt.datetime(2024, 1, 1, 0, 0, 9), 7.0),
    (7, dt.datetime(2024, 1, 1, 0, 0, 9), 7.0),
    (7, dt.datetime(2024, 1, 1, 0, 0, 9), None),
]
NASTY_SCHEMA = "k long, ts timestamp, x double"
AGG_COLS = ["window_start", "window_end", "k", "sum_x", "min_x", "max_x", "avg_x", "count"]
AGGS = {"x": ["sum", "min", "max", "avg"], "*": ["count"]}


@pytest.mark.spark
@pytest.mark.parametrize("window, slide", [("10 seconds", "10 seconds"), ("10 seconds", "5 seconds")])
def test_aggregate_nasty_rows_equal_spark(spark, window, slide):
    """NaN, ±inf, null keys, a null time, times before 1970 and in year 9999, duplicate rows: the same
    rows as Spark's window() aggregation (a null time drops the row, as Spark)."""
    df = spark.createDataFrame(NASTY, NASTY_SCHEMA)
    ours = cq.sliding_aggregate(df, "ts", window, slide, by="k", aggs=AGGS)
    assert _rows(ours, AGG_COLS) == _rows(_spark_windows(df, window, slide), AGG_COLS)


@pytest.mark.spark
def test_join_nasty_rows_equal_spark(spark):
    """Null keys never match, null times never match, times in 1900 and 2200 and duplicate rows join as
    in Spark's join with the same condition."""
    left = spark.createDataFrame([r for r in NASTY if r[1] is None or r[1].year < 9999], NASTY_SCHEMA)
    right = spark.createDataFrame([(k, None if t is None else t + dt.timedelta(seconds=1), x) for k, t, x in NASTY
                                   if t is None or t.year < 9999], "k long, rt timestamp, y double")
    ours = cq.interval_join(left, right, "k", "ts", "rt", "0 seconds", "2 seconds")
    cond = ((left.k == right.k) & (right.rt >= left.ts) & (right.rt <= left.ts + F.expr("INTERVAL 2 SECONDS")))
    theirs = left.join(right, cond).select(left.k, "ts", "x", "rt", "y")
    cols = ["k", "ts", "x", "rt", "y"]
    assert _rows(ours, cols) == _rows(theirs, cols)
    assert len(_rows(ours, cols)) > 0


@pytest.mark.spark
@pytest.mark.parametrize("op", ["interval_join", "multi_join"])
def test_join_times_beyond_pandas_range_are_a_spark_error_naming_the_argument(spark, op):
    """A time after 2262-04-11 cannot travel through applyInPandasWithState's pandas frames: the query
    fails in Spark (before any Python worker) with a message naming the operator and the argument."""
    left = spark.createDataFrame([(1, dt.datetime(9999, 6, 1), 1.0)], NASTY_SCHEMA)
    right = spark.createDataFrame([(1, dt.datetime(2024, 1, 1))], "k long, rt timestamp")
    if op == "interval_join":
        out, argument = cq.interval_join(left, right, "k", "ts", "rt", "0 seconds", "2 seconds"), "left_time"
    else:
        out, argument = cq.multi_join([left, right], "k", ["ts", "rt"], [(0, 1, "0 seconds", "2 seconds")]), "times[0]"
    with pytest.raises(Exception) as info:
        out.collect()
    assert f"{argument} column 'ts' holds a time outside 1677-09-21 .. 2262-04-11" in str(info.value)
    assert "Traceback" not in str(info.value)


@pytest.mark.spark
def test_empty_inputs(spark):
    """Empty batch inputs give empty outputs with the documented columns, no error."""
    ev = spark.createDataFrame([], NASTY_SCHEMA)
    right = spark.createDataFrame([], "k long, rt timestamp, y double")
    assert cq.sliding_aggregate(ev, "ts", "10 seconds", by="k", aggs=AGGS).count() == 0
    assert cq.interval_join(ev, right, "k", "ts", "rt", "0 seconds", "1 second").count() == 0
    assert cq.window(ev, "ts", size="5 seconds").count() == 0
    assert cq.select_chain(ev, {"p": F.col("x") > 0}).count() == 0


def _write(directory, i, table):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{i:03d}.parquet"
    write_in_order(table, path, i)


@pytest.mark.spark
@pytest.mark.slow
def test_stream_counts_null_times_and_late_rows_and_survives_schema_drift(spark, tmp_path):
    """A file stream: a null time is counted as malformed, a row behind the watermark as late, a file
    without the value column (schema drift: the declared schema fills nulls) and one with an extra column
    are read; the sink equals Spark's aggregation of the same files, and every input row is accounted.
    (A row is late when its windows ended by the *previous* batch's watermark, Spark's late-event
    watermark: hence the extra file between the jump and the late row.)"""
    ts = pa.timestamp("us", tz="UTC")
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)
    sec = dt.timedelta(seconds=1)
    d = tmp_path / "in"
    _write(d, 0, pa.table({"ts": pa.array([base, base + 2 * sec, None], ts), "k": [1, 1, 2], "x": [1.0, 2.0, 3.0]}))
    _write(d, 1, pa.table({"ts": pa.array([base + 30 * sec, base + 31 * sec], ts), "k": [1, 2]}))        # no x
    _write(d, 2, pa.table({"ts": pa.array([base + 60 * sec], ts), "k": [2], "x": [4.0], "extra": ["a"]}))
    # Behind the late-event watermark of its batch (the previous batch's watermark, 26 s): late.
    _write(d, 3, pa.table({"ts": pa.array([base + sec], ts), "k": [1], "x": [9.0]}))
    src = spark.readStream.schema(NASTY_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(d)) \
        .withWatermark("ts", "5 seconds")
    name = "q_" + uuid.uuid4().hex[:10]
    ours = cq.sliding_aggregate(src, "ts", "10 seconds", by="k", aggs=AGGS, name="sweep")
    q = (ours.writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    reports = [cq.read_metrics(p, "sweep") for p in q.recentProgress]
    total = {k: sum(r[k] for r in reports) for k in ("input_rows", "malformed_rows", "late_rows")}
    # input_rows: rows with a time (docs/aggregate.md); with the malformed row, all 7 rows are accounted.
    assert total == {"input_rows": 6, "malformed_rows": 1, "late_rows": 1}, [
        (p["batchId"], p["numInputRows"], p["eventTime"].get("watermark"), r) for p, r in zip(q.recentProgress, reports)]
    name2 = "q_" + uuid.uuid4().hex[:10]
    q2 = (_spark_windows(src, "10 seconds", "10 seconds").writeStream.format("memory").queryName(name2)
          .outputMode("append").option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    q2.awaitTermination()
    assert _rows(spark.table(name), AGG_COLS) == _rows(spark.table(name2), AGG_COLS)
    assert len(_rows(spark.table(name), AGG_COLS)) == 3     # windows [0,10) k=1, [30,40) k=1, k=2


@pytest.mark.spark
@pytest.mark.slow
def test_stream_type_change_between_files_is_spark_error_naming_the_column(spark, tmp_path):
    """A file whose column has another type than the declared schema: Spark's reader fails the query
    with an error naming the file, the column and both types (before any operator sees the rows)."""
    ts = pa.timestamp("us", tz="UTC")
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)
    d = tmp_path / "in"
    _write(d, 0, pa.table({"ts": pa.array([base], ts), "k": [1], "x": [1.0]}))
    _write(d, 1, pa.table({"ts": pa.array([base], ts), "k": [1], "x": ["one"]}))
    src = spark.readStream.schema(NASTY_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(d)) \
        .withWatermark("ts", "5 seconds")
    out = cq.sliding_aggregate(src, "ts", "10 seconds", by="k", aggs=AGGS)
    q = (out.writeStream.format("memory").queryName("q_" + uuid.uuid4().hex[:10]).outputMode("append")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        q.awaitTermination()
    msg = str(info.value)
    assert "PARQUET_COLUMN_DATA_TYPE_MISMATCH" in msg and "part-001.parquet" in msg, msg[:4000]
    assert "Parquet column [x]. Expected Spark type double, actual Parquet type BINARY" in msg, msg[:4000]
