"""Aggregates over tuple-based windows (CQL ``[PARTITION BY … ROWS n]`` with COUNT / SUM / AVG / MIN / MAX)
against a plain-Python reference, in batch, streaming across micro-batches, and through CQL (STREAM §2.1's
third example)."""
from __future__ import annotations

import os
import random
from collections import Counter
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.rows_reference import rows_aggregate_reference

import pyspark_cq as cq
from pyspark_cq.operators.rows_window import rows_aggregate

pytestmark = pytest.mark.spark
BASE = datetime(2024, 1, 1)
AGGS = [("n", None, "count"), ("s", "v", "sum"), ("lo", "v", "min"), ("hi", "v", "max"), ("av", "v", "avg")]


def _data(n=240, seed=3):
    rnd = random.Random(seed)
    rows, t = [], 0
    for _ in range(n):
        t += rnd.choice([0, 1, 1, 2])
        rows.append({"ts": BASE + timedelta(seconds=t), "g": rnd.choice(["a", "b", "c"]),
                     "v": rnd.choice([None, -3, 1, 2, 5, 7]), "c": rnd.choice(["x", "y"])})
    return rows


def _norm(rows):
    return Counter(tuple(round(x, 9) if isinstance(x, float) else x for x in r) for r in rows)


def _collect(df):
    return _norm(tuple(r) for r in df.select("g", "n", "s", "lo", "hi", "av", "cq_at").collect())


def _ref(rows, emit, n=4):
    # the operator breaks ties of equal times by the other orderable columns in column order, nulls last
    ties = lambda r: (r["g"], r["v"] is None, r["v"] or 0, r["c"])  # noqa: E731
    keyed = [dict(r, _tie=ties(r)) for r in rows]
    return _norm(rows_aggregate_reference(keyed, n, ["g"], AGGS, emit, where=lambda r: r["c"] == "x",
                                          ties=["_tie"]))


def test_batch_equals_reference_for_every_emit(spark):
    from pyspark.sql import functions as F

    rows = _data()
    df = spark.createDataFrame(rows, "ts timestamp, g string, v long, c string")
    for emit in ("rstream", "istream", "dstream"):
        out = rows_aggregate(df, "ts", 4, AGGS, "g", where=F.col("c") == "x", emit=emit)
        assert out.schema["s"].dataType.simpleString() == "bigint" and out.schema["lo"].dataType.simpleString() == "bigint"
        got = _collect(out)
        assert got == _ref(rows, emit) and sum(got.values()) > 50, emit


def test_validation(spark):
    df = spark.createDataFrame(_data(10), "ts timestamp, g string, v long, c string")
    with pytest.raises(ValueError, match="emit must be one of"):
        rows_aggregate(df, "ts", 3, AGGS, "g", emit="changes")
    with pytest.raises(TypeError, match=r"aggs\[0\]: sum needs a numeric"):
        rows_aggregate(df, "ts", 3, [("s", "c", "sum")])
    with pytest.raises(ValueError, match=r"aggs\[0\]: only count takes no column"):
        rows_aggregate(df, "ts", 3, [("s", None, "sum")])
    with pytest.raises(ValueError, match="rows must be a positive int"):
        rows_aggregate(df, "ts", 0, AGGS)


def test_stream_across_micro_batches_equals_reference(spark, tmp_path):
    from pyspark.sql import functions as F

    rows = _data(300, seed=5)
    src = tmp_path / "in"
    os.makedirs(src)
    # four files in time order, split between distinct times (an instant is never split over two batches)
    cuts = [0] + [next(i for i in range(q * 75, len(rows)) if rows[i]["ts"] != rows[i - 1]["ts"])
                  for q in (1, 2, 3)] + [len(rows)]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        path = str(src / f"f{i}.parquet")
        pq.write_table(pa.Table.from_pylist(rows[a:b]), path)
        os.utime(path, (1_000_000 + 10 * i, 1_000_000 + 10 * i))
    stream = (spark.readStream.schema("ts timestamp, g string, v long, c string").option("maxFilesPerTrigger", 1)
              .parquet(str(src)))
    out = rows_aggregate(stream, "ts", 4, AGGS, "g", where=F.col("c") == "x", emit="istream", name="ragg")
    q = (out.writeStream.format("memory").queryName("rows_agg_stream").outputMode("append")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.lastProgress is not None and len([p for p in q.recentProgress if p["numInputRows"]]) == 4
    assert _collect(spark.table("rows_agg_stream")) == _ref(rows, "istream")


def test_cql_third_example_of_the_paper(spark):
    """STREAM §2.1: the commerce requests among the last N classified requests (N = 10 000 scaled to 5)."""
    rnd = random.Random(7)
    reqs = [{"ts": BASE + timedelta(seconds=i // 2), "client_id": f"c{rnd.randrange(3)}",
             "domain": rnd.choice(["shop.com", "news.org", "mit.edu", "unknown.net"]), "url": "/"} for i in range(120)]
    classes = {"shop.com": "commerce", "news.org": "news", "mit.edu": "education"}
    req = spark.createDataFrame(reqs, "ts timestamp, client_id string, domain string, url string")
    domains = spark.createDataFrame(list(classes.items()), "domain string, class string")
    text = ("ISTREAM(SELECT COUNT(*) AS n FROM (SELECT R.class FROM Requests S, Domains R "
            "WHERE S.domain = R.domain) T [ROWS 5 PRECEDING] WHERE T.class = 'commerce')")
    out = cq.cql(spark, text, {"Requests": req, "Domains": domains})
    assert out.columns == ["n", "cq_at"]
    classified = [dict(r, cls=classes[r["domain"]]) for r in reqs if r["domain"] in classes]
    # the subquery's stream is (class, cq_time): equal times are ordered by the class
    expected = rows_aggregate_reference(classified, 5, [], [("n", None, "count")], "istream",
                                        where=lambda r: r["cls"] == "commerce", ties=["cls"])
    assert Counter(tuple(r) for r in out.collect()) == Counter(expected) and len(expected) > 10
