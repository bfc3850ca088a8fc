"""``pyspark-cq explain`` and ``pyspark-cq run`` on the documented example query files."""
import os
import random
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_cq.cli import main

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "docs", "examples", "cql")


@pytest.mark.parametrize("name", ["stanford_counts", "recent_cs_requests", "truck_speed", "adaptive_join"])
def test_explain_examples(name, capsys):
    assert main(["explain", os.path.join(EXAMPLES, f"{name}.cql")]) == 0
    out = capsys.readouterr().out
    assert "plan" in out and "operator" in out and "cost" in out


def test_explain_rows_aggregate(tmp_path, capsys):
    # issue 41: explain crashed with KeyError: 'rows_aggregate' (the kind was missing from the registry)
    q = tmp_path / "rows.cql"
    q.write_text("RSTREAM(SELECT sensor, SUM(value) AS s, COUNT(*) AS n FROM Readings "
                 "[PARTITION BY sensor ROWS 3] GROUP BY sensor)")
    assert main(["explain", str(q)]) == 0
    out = capsys.readouterr().out
    assert "rows_aggregate" in out and "cost" in out


def test_explain_reports_errors(tmp_path, capsys):
    bad = tmp_path / "bad.cql"
    bad.write_text("SELECT a\nFROM S [RANGE 10 PARSECS]")
    assert main(["explain", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2:18" in err and "PARSECS" in err


def _requests(root, files=3, per=40):
    rnd = random.Random(2)
    t = datetime(2024, 1, 1)
    os.makedirs(root)
    rows_all = []
    for i in range(files):
        rows = []
        for _ in range(per):
            t += timedelta(minutes=rnd.choice([1, 5, 20]))
            rows.append({"ts": t, "client_id": f"c{rnd.randrange(3)}", "domain": rnd.choice(["stanford.edu", "x.org"]),
                         "url": rnd.choice(["http://cs.stanford.edu/a", "http://www.stanford.edu/b"])})
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(root, f"part{i}.parquet"))
        rows_all += rows
    return rows_all


@pytest.mark.spark
@pytest.mark.slow
def test_run_example_from_the_cli(spark, tmp_path, capsys):
    from pyspark.sql import functions as F

    rows = _requests(str(tmp_path / "requests"))
    sink = str(tmp_path / "out")
    code = main(["run", os.path.join(EXAMPLES, "stanford_counts.cql"), "--source", f"Requests={tmp_path / 'requests'}",
                 "--sink", sink, "--watermark", "0 seconds"])
    out = capsys.readouterr().out
    assert code == 0 and "batch 0:" in out and "sliding_aggregate" in out and "done: 120 input rows" in out
    got = {(r.n, r.cq_at) for r in spark.read.parquet(sink).collect()}
    df = spark.createDataFrame(rows, "ts timestamp, client_id string, domain string, url string")
    expected = {(r["count"], r["end"]) for r in df.filter("domain = 'stanford.edu'")
                .groupBy(F.window("ts", "1 day", "1 hour")).count().select("count", "window.end").collect()}
    # append mode: a window is emitted once the watermark (zero delay: the largest time of the earlier
    # micro-batches) passed its end; windows ending within the last file's span need a batch after it
    closed = max(r["ts"] for r in rows[:80])
    assert {(n, end) for n, end in expected if end <= closed} <= got <= expected
    assert len(got) > 10


def _readings(root):
    os.makedirs(root)
    pq.write_table(pa.Table.from_pylist([{"ts": datetime(2024, 1, 1), "sensor": "a", "value": 1}]),
                   os.path.join(root, "part0.parquet"))


@pytest.mark.parametrize("query,message", [
    ("RSTREAM(SELECT sensor, SUM(value) AS s FROM Readingz [RANGE 10 SECONDS SLIDE 2 SECONDS] GROUP BY sensor)",
     "the stream Readingz: no source of that name; sources: Readings"),
    ("ISTREAM(SELECT sensor, SUM(value) AS s FROM Readings [RANGE 10 SECONDS SLIDE 3 SECONDS] GROUP BY sensor)",
     "SLIDE does not divide its RANGE"),
    ("RSTREAM(SELECT sensr, SUM(value) AS s FROM Readings [RANGE 10 SECONDS SLIDE 2 SECONDS] GROUP BY sensr)",
     "sensr"),
])
def test_run_checks_the_query_before_spark_starts(tmp_path, capsys, monkeypatch, query, message):
    # issue 41: these were reported after Spark's start-up (half a minute)
    from pyspark.sql import SparkSession

    import pyspark_cq

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark was asked for a session")

    monkeypatch.setattr(pyspark_cq, "spark", no_spark)
    monkeypatch.setattr(SparkSession, "getActiveSession", no_spark)
    _readings(str(tmp_path / "readings"))
    q = tmp_path / "q.cql"
    q.write_text(query)
    assert main(["run", str(q), "--source", f"Readings={tmp_path / 'readings'}", "--sink", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
