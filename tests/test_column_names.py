"""Every operator accepts any column name Spark accepts: dots, spaces and backticks in keys, time,
payload and value columns (issue 16). Each result is compared with Spark's own operator on the same data
(names backtick-quoted there), and the output columns keep the user's names exactly."""
from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers.streaming import assert_same_multiset
from pyspark.sql import functions as F
from test_aggregate_streaming import run_both_to_memory

import pyspark_cq as cq
from pyspark_cq._validate import ref

pytestmark = pytest.mark.spark

KEY, GROUP, TIME = "user.id", "g x", "ev.ts"   # a dot, a space, a dot
LPAY, RPAY = "a`b", "p q.r"                    # a backtick; a space and a dot
T0 = dt.datetime(2024, 1, 1)


def q(alias: str, name: str):
    """Spark's own spelling of ``alias.name`` for a name taken literally."""
    return F.col(f"{alias}.`{name.replace('`', '``')}`")


def same_rows(ours, theirs):
    assert ours.columns == theirs.columns
    assert_same_multiset(ours, theirs)


def side_rows(side: str, n: int = 40):
    rows = []
    for i in range(n):
        key = None if i % 13 == 5 else i % 4
        group = ["x", "y"][i % 2]
        ts = T0 + dt.timedelta(seconds=(i * 7 + (3 if side == "r" else 0)) % 60)
        rows.append((key, group, ts, i if side == "l" else float(i) / 2))
    return rows


def join_inputs(spark):
    left = spark.createDataFrame(side_rows("l"), f"`{KEY}` long, `{GROUP}` string, `{TIME}` timestamp, `a``b` long")
    right = spark.createDataFrame(side_rows("r"), f"`{KEY}` long, `{GROUP}` string, `{TIME}` timestamp, `{RPAY}` double")
    return left, right


def spark_join(left, right, how, lower_s, upper_s, lower_strict=False, upper_strict=False):
    l, r = left.alias("l"), right.alias("r")
    lo = q("r", TIME) > q("l", TIME) + F.expr(f"interval {lower_s} seconds") if lower_strict else \
        q("r", TIME) >= q("l", TIME) + F.expr(f"interval {lower_s} seconds")
    hi = q("r", TIME) < q("l", TIME) + F.expr(f"interval {upper_s} seconds") if upper_strict else \
        q("r", TIME) <= q("l", TIME) + F.expr(f"interval {upper_s} seconds")
    cond = (q("l", KEY) == q("r", KEY)) & (q("l", GROUP) == q("r", GROUP)) & lo & hi
    return l.join(r, cond, {"full": "full_outer"}.get(how, how)).select(
        F.coalesce(q("l", KEY), q("r", KEY)).alias(KEY), F.coalesce(q("l", GROUP), q("r", GROUP)).alias(GROUP),
        q("l", TIME).alias(TIME + "_l"), q("l", LPAY).alias(LPAY), q("r", TIME).alias(TIME + "_r"),
        q("r", RPAY).alias(RPAY))


@pytest.mark.parametrize("how", ["inner", "full"])
def test_interval_join_batch(spark, how):
    left, right = join_inputs(spark)
    ours = cq.interval_join(left, right, [KEY, GROUP], TIME, TIME, "-5 seconds", "10 seconds", how=how,
                            suffixes=("_l", "_r"), shards=2)
    assert ours.columns == [KEY, GROUP, TIME + "_l", LPAY, TIME + "_r", RPAY]
    theirs = spark_join(left, right, how, -5, 10)
    assert theirs.count() > 0
    same_rows(ours, theirs)


def test_window_join_batch(spark):
    left, right = join_inputs(spark)
    ours = cq.window_join(left, right, [KEY, GROUP], TIME, TIME, "10 seconds", "5 seconds", suffixes=("_l", "_r"))
    assert ours.columns == [KEY, GROUP, TIME + "_l", LPAY, TIME + "_r", RPAY, "valid_from", "valid_to"]
    # Validities [t, t + w) intersect  <=>  r.ts > l.ts - 5 s  and  r.ts < l.ts + 10 s.
    theirs = spark_join(left, right, "inner", -5, 10, lower_strict=True, upper_strict=True)
    assert theirs.count() > 0
    same_rows(ours.drop("valid_from", "valid_to"), theirs)


def _write_side(directory: str, rows, payload: str, ptype) -> None:
    """One parquet file per batch of ``rows`` (plain names; the stream renames them)."""
    os.makedirs(directory, exist_ok=True)
    for i in range(0, len(rows), 20):
        chunk = rows[i:i + 20]
        table = pa.table({"k": pa.array([r[0] for r in chunk], pa.int64()),
                          "g": pa.array([r[1] for r in chunk], pa.string()),
                          "ts": pa.array([r[2] for r in chunk], pa.timestamp("us")).cast(pa.timestamp("us", "UTC")),
                          payload: pa.array([r[3] for r in chunk], ptype)})
        path = os.path.join(directory, f"b{i:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))


def _stream(spark, directory, payload, ptype, name):
    """A file stream whose columns carry the awkward names, with a watermark on the time column."""
    return (spark.readStream.schema(f"k long, g string, ts timestamp, {payload} {ptype}")
            .option("maxFilesPerTrigger", 1).parquet(directory)
            .select(F.col("k").alias(KEY), F.col("g").alias(GROUP), F.col("ts").alias(TIME), F.col(payload).alias(name))
            .withWatermark(f"`{TIME}`", "10 seconds"))


@pytest.mark.slow
def test_interval_join_streaming(spark, tmp_path):
    _write_side(str(tmp_path / "l"), side_rows("l"), "lv", pa.int64())
    _write_side(str(tmp_path / "r"), side_rows("r"), "rv", pa.float64())

    def inputs():
        return (_stream(spark, str(tmp_path / "l"), "lv", "long", LPAY),
                _stream(spark, str(tmp_path / "r"), "rv", "double", RPAY))

    (_, ours), (_, theirs) = run_both_to_memory(
        cq.interval_join(*inputs(), [KEY, GROUP], TIME, TIME, "-5 seconds", "10 seconds", suffixes=("_l", "_r")),
        spark_join(*inputs(), "inner", -5, 10), (tmp_path / "ck1", tmp_path / "ck2"))
    assert ours.columns == [KEY, GROUP, TIME + "_l", LPAY, TIME + "_r", RPAY]
    assert theirs.count() > 0
    same_rows(ours, theirs)


# ---- sliding aggregation ----------------------------------------------------------------------------

VALUE, REAL = "a`b", "x y.z"
AGGS = {VALUE: ["sum", "max", "avg", "count"], REAL: ["min"], "*": ["count"]}
OUT_AGGS = [f"sum_{VALUE}", f"max_{VALUE}", f"avg_{VALUE}", f"count_{VALUE}", f"min_{REAL}", "count"]


def spark_windows(df, window, slide):
    v, x = ref(VALUE), ref(REAL)
    exprs = [F.sum(v), F.max(v), F.avg(v), F.count(v), F.min(x), F.count(F.lit(1))]
    return (df.groupBy(F.window(ref(TIME), window, slide), ref(KEY), ref(GROUP))
            .agg(*[e.alias(n) for e, n in zip(exprs, OUT_AGGS)])
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                    ref(KEY), ref(GROUP), *[ref(n) for n in OUT_AGGS]))


def agg_rows(n=60):
    return [(i % 3, None if i % 10 == 7 else ["x", "y"][i % 2], T0 + dt.timedelta(seconds=i * 1.5),
             None if i % 11 == 4 else i - 20, float(i % 7)) for i in range(n)]


def test_sliding_aggregate_batch(spark):
    df = spark.createDataFrame(agg_rows(), f"`{KEY}` long, `{GROUP}` string, `{TIME}` timestamp, "
                                           f"`a``b` long, `{REAL}` double")
    ours = cq.sliding_aggregate(df, TIME, "10 seconds", "5 seconds", by=[KEY, GROUP], aggs=AGGS, shards=2)
    assert ours.columns == ["window_start", "window_end", KEY, GROUP] + OUT_AGGS
    theirs = spark_windows(df, "10 seconds", "5 seconds")
    assert theirs.count() > 0
    same_rows(ours, theirs)


@pytest.mark.slow
def test_sliding_aggregate_streaming(spark, tmp_path):
    rows = agg_rows()
    directory = str(tmp_path / "in")
    os.makedirs(directory)
    for i in range(0, len(rows), 15):
        chunk = rows[i:i + 15]
        table = pa.table({"k": pa.array([r[0] for r in chunk], pa.int64()),
                          "g": pa.array([r[1] for r in chunk], pa.string()),
                          "ts": pa.array([r[2] for r in chunk], pa.timestamp("us")).cast(pa.timestamp("us", "UTC")),
                          "v": pa.array([r[3] for r in chunk], pa.int64()),
                          "x": pa.array([r[4] for r in chunk], pa.float64())})
        path = os.path.join(directory, f"b{i:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))

    def source():
        return (spark.readStream.schema("k long, g string, ts timestamp, v long, x double")
                .option("maxFilesPerTrigger", 1).parquet(directory)
                .select(F.col("k").alias(KEY), F.col("g").alias(GROUP), F.col("ts").alias(TIME),
                        F.col("v").alias(VALUE), F.col("x").alias(REAL))
                .withWatermark(f"`{TIME}`", "5 seconds"))

    (_, ours), (_, theirs) = run_both_to_memory(
        cq.sliding_aggregate(source(), TIME, "10 seconds", "5 seconds", by=[KEY, GROUP], aggs=AGGS),
        spark_windows(source(), "10 seconds", "5 seconds"), (tmp_path / "ck1", tmp_path / "ck2"))
    assert ours.columns == ["window_start", "window_end", KEY, GROUP] + OUT_AGGS
    assert theirs.count() > 0
    same_rows(ours, theirs)


# ---- stateless operators ----------------------------------------------------------------------------

def test_granularity(spark):
    start, end = "s.t", "e`n d"
    df = spark.createDataFrame([(3, 25, "a"), (12, 18, "b"), (0, 10, "c"), (None, 4, "d")],
                               f"`{start}` long, `e``n d` long, `{KEY}` string")
    ours = cq.granularity(df, start, end, 10)
    assert ours.columns == [start, end, KEY]
    s = F.ceil(ref(start) / 10).cast("long") * 10
    e = F.floor(ref(end) / 10).cast("long") * 10
    theirs = (df.where(ref(start).isNotNull() & ref(end).isNotNull())
              .select(s.alias(start), e.alias(end), ref(KEY)).where(ref(start) < ref(end)))
    same_rows(ours, theirs)


def test_window_time_and_rows(spark):
    df = spark.createDataFrame([(T0 + dt.timedelta(seconds=s), s % 2, str(s)) for s in (1, 4, 4, 9)],
                               f"`{TIME}` timestamp, `{GROUP}` long, `a``b` string")
    ours = cq.window(df, TIME, size="5 seconds", start="valid.from", end="valid to")
    assert ours.columns == [TIME, GROUP, LPAY, "valid.from", "valid to"]
    theirs = df.select("*", ref(TIME).alias("valid.from"),
                       (ref(TIME) + F.expr("interval 5 seconds")).alias("valid to"))
    same_rows(ours, theirs)
    # Tuple-based: ties on the time are broken by the other columns, whatever their names.
    by_rows = cq.window(df, TIME, rows=1).orderBy(ref(TIME), ref(GROUP)).collect()
    assert [(r[GROUP], r["valid_to"]) for r in by_rows] == [
        (1, T0 + dt.timedelta(seconds=4)), (0, T0 + dt.timedelta(seconds=4)), (0, T0 + dt.timedelta(seconds=9)),
        (1, None)]


def test_select_chain(spark):
    df = spark.createDataFrame([(i, str(i) * (i % 4)) for i in range(12)], f"`{KEY}` long, `a``b` string")
    preds = {"even": ref(KEY) % 2 == 0, "short": lambda b: pc.less(pc.utf8_length(b[LPAY]), 3)}
    ours = cq.select_chain(df, preds)
    assert ours.columns == [KEY, LPAY]
    same_rows(ours, df.where((ref(KEY) % 2 == 0) & (F.length(ref(LPAY)) < 3)))
