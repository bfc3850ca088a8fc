"""Test data and Spark references for the interval-join tests (shared by batch and streaming tests)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F

from .files import write_in_order
from .streaming import assert_same_multiset

BASE_US = 1_700_000_000_000_000  # 2023-11-14 22:13:20 UTC
LOWER_S, UPPER_S = -5, 10
SPARK_HOW = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}
OUT_COLS = ["k", "s", "ts_l", "lv", "tag_l", "ts_r", "rv", "tag_r"]


def side_table(rng, side: str, n: int, t0: int, *, nkeys=40, null_keys=True, spread_s=20, late=0):
    """One micro-batch file of a side: skewed keys, out-of-order times, duplicates, odd payloads."""
    keys = np.where(rng.random(n) < 0.3, 0, rng.integers(0, nkeys, n))      # key 0 is hot
    times = t0 + rng.integers(-spread_s * 1_000_000, spread_s * 1_000_000, n)
    if late:
        times[:late] = BASE_US - 3_600_000_000 + rng.integers(0, 1000, late)  # far behind
    times = (times // 1000) * 1000 + np.where(rng.random(n) < 0.5, 0, rng.integers(0, 1000, n))
    kcol = [None if (null_keys and rng.random() < 0.05) else int(k) for k in keys]
    scol = [f"s{int(k) % 3}" for k in keys]
    value = rng.integers(-2**62, 2**62, n)
    vcol = [None if rng.random() < 0.1 else int(v) for v in value]
    tag = rng.normal(size=n)
    tag[rng.random(n) < 0.05] = np.nan
    tcol = [None if rng.random() < 0.05 else float(x) for x in tag]
    table = pa.table({
        "k": pa.array(kcol, pa.int64()), "s": pa.array(scol, pa.string()),
        "ts": pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        f"{side}v": pa.array(vcol, pa.int64()), "tag": pa.array(tcol, pa.float64())})
    if n >= 4:  # exact duplicates within the file
        table = pa.concat_tables([table, table.slice(0, 2)])
    return table


def bound_rows(side: str, t0: int, key: int):
    """Rows exactly at, just inside and just outside the band of a left row at t0."""
    if side == "l":
        times = [t0]
    else:
        lo, hi = t0 + LOWER_S * 1_000_000, t0 + UPPER_S * 1_000_000
        times = [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1]
    n = len(times)
    return pa.table({
        "k": pa.array([key] * n, pa.int64()), "s": pa.array(["s1"] * n),
        "ts": pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        f"{side}v": pa.array(list(range(n)), pa.int64()), "tag": pa.array([0.5] * n)})


def write(directory: str, name: str, table: pa.Table) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    order = len(os.listdir(directory))
    write_in_order(table, path, order)   # one file per micro-batch, in the order written


def write_streams(root: str, batches: int, *, null_keys: bool, seed: int) -> None:
    """``batches`` parquet files per side under ``root/l`` and ``root/r`` (one micro-batch each with
    ``maxFilesPerTrigger=1``): out-of-order rows within the watermark, late rows from the third batch on,
    duplicates, a hot key, an empty file on each side, and rows exactly at the band's bounds.
    """
    rng = np.random.default_rng(seed)
    for i in range(batches):
        t0 = BASE_US + i * 10_000_000
        for side in ("l", "r"):
            if (side, i) in (("l", 2), ("r", 3)):
                table = side_table(rng, side, 4, t0).slice(0, 0)  # an empty micro-batch file
            else:
                table = side_table(rng, side, 60, t0, null_keys=null_keys, late=3 if i >= 2 else 0)
                if i == 1:
                    table = pa.concat_tables([table, bound_rows(side, BASE_US + 12_000_000, key=1)])
            write(os.path.join(root, side), f"b{i:03d}.parquet", table)


def stream_source(spark, root: str, side: str, delay: str):
    """One side of :func:`write_streams` as a stream, one file per micro-batch, watermark ``delay`` on ts."""
    return (spark.readStream.schema(schema(side)).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, side)).withWatermark("ts", delay))


def schema(side: str) -> str:
    return f"k long, s string, ts timestamp, {side}v long, tag double"


def spark_reference(left, right, how: str):
    """Spark's own join with the same condition, projected to the operator's output layout."""
    l, r = left.alias("l"), right.alias("r")
    cond = F.expr(f"l.k = r.k AND l.s = r.s AND r.ts >= l.ts + interval {LOWER_S} seconds "
                  f"AND r.ts <= l.ts + interval {UPPER_S} seconds")
    joined = l.join(r, cond, SPARK_HOW[how])
    return joined.select(
        F.coalesce(F.col("l.k"), F.col("r.k")).alias("k"), F.coalesce(F.col("l.s"), F.col("r.s")).alias("s"),
        F.col("l.ts").alias("ts_l"), F.col("lv"), F.col("l.tag").alias("tag_l"),
        F.col("r.ts").alias("ts_r"), F.col("rv"), F.col("r.tag").alias("tag_r"))


def assert_same_rows(ours, theirs):
    """Equal multisets of the output columns, with a sample of each difference on failure."""
    return assert_same_multiset(ours.select(*OUT_COLS), theirs.select(*OUT_COLS), "ours against Spark's")
