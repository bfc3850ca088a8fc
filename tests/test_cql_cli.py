"""``pyspark-cq explain`` and ``pyspark-cq run`` on the documented example query files."""
import os
import random
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.files import write_in_order

from pyspark_cq.cli import main

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "docs", "examples", "cql")


@pytest.mark.parametrize("name", ["stanford_counts", "recent_cs_requests", "truck_speed", "adaptive_join"])
def test_explain_examples(name, capsys):
    assert main(["explain", os.path.join(EXAMPLES, f"{name}.cql")]) == 0
    out = capsys.readouterr().out
    assert "plan" in out and "operator" in out and "cost" in out


def test_explain_aggregate_over_a_three_way_join(capsys):
    # issue 42: Spark's chain of two joins, then the aggregate, in one query
    assert main(["explain", os.path.join(EXAMPLES, "join3_aggregate.cql")]) == 0
    out = capsys.readouterr().out
    assert "shape      join_aggregate" in out and "((ω[30 s](A) ⋈ ω[20 s](B)) ⋈ ω[30 s](C))" in out
    assert "operator   q_join: chain of stream-stream interval joins (Spark), 2 joins" in out
    assert "how=[inner, inner] (A first, then B, C)" in out and "then the aggregate, in the same query" in out


def test_explain_rows_aggregate(tmp_path, capsys):
    # issue 41: explain crashed with KeyError: 'rows_aggregate' (the kind was missing from the registry)
    q = tmp_path / "rows.cql"
    q.write_text("RSTREAM(SELECT sensor, SUM(value) AS s, COUNT(*) AS n FROM Readings "
                 "[PARTITION BY sensor ROWS 3] GROUP BY sensor)")
    assert main(["explain", str(q)]) == 0
    out = capsys.readouterr().out
    assert "rows_aggregate" in out and "cost" in out


def _explain(tmp_path, capsys, text) -> list[str]:
    """``pyspark-cq explain`` of ``text`` written to a file: its output lines (it must succeed)."""
    q = tmp_path / "q.cql"
    q.write_text(text)
    assert main(["explain", str(q)]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("text,lines", [
    # issue 42's shapes: a multi-way join, an aggregate over a join, a window join as a FROM subquery, a join
    ("ISTREAM(SELECT A.k, B.w FROM A [RANGE 30 SECONDS], B [RANGE 30 SECONDS], C [RANGE 30 SECONDS] "
     "WHERE A.k = B.k AND B.k = C.k)",
     ["operator   q_mjoin: multi_join", "join       q_mjoin: how=[inner, inner] (A first, then B, C); "
      "output_mode=append"]),
    ("RSTREAM(SELECT A.k, COUNT(*) AS n FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [RANGE 30 SECONDS SLIDE "
     "10 SECONDS] WHERE A.k = B.k GROUP BY A.k)",
     ["join       q_join: how=[inner] (A first, then B); output_mode=append; then the aggregate, in the same query"]),
    ("RSTREAM(SELECT J.k, COUNT(*) AS n FROM (SELECT A.k FROM A [RANGE 30 SECONDS], B [RANGE 20 SECONDS] "
     "WHERE A.k = B.k) J [RANGE 1 MINUTE SLIDE 20 SECONDS] GROUP BY J.k)",
     ["query      RSTREAM(SELECT J.k, COUNT(*) AS n FROM (SELECT A.k FROM A [RANGE 30 SECONDS], B [RANGE 20 SECONDS] "
      "WHERE A.k = B.k) J [RANGE 1 MINUTE SLIDE 20 SECONDS] GROUP BY J.k)",
      "subquery   J: join, q_J_join: stream-stream interval join (Spark); plan π((ω[30 s](A) ⋈ ω[20 s](B)))",
      "join       J: q_J_join: how=[inner] (A first, then B); output_mode=append"]),
    ("ISTREAM(SELECT A.k FROM A [RANGE 1 MINUTE], B [RANGE 1 MINUTE] WHERE A.k = B.k)",
     ["operator   q_join: window_join", "join       q_join: how=[inner] (A first, then B); output_mode=append"]),
    ("RSTREAM(SELECT k, COUNT(*) AS n FROM A [RANGE 1 MINUTE SLIDE 10 SECONDS] GROUP BY k)", []),
])
def test_explain_prints_join_types_and_output_mode(tmp_path, capsys, text, lines):
    out = _explain(tmp_path, capsys, text)
    for line in lines:
        assert line in out
    assert ("join       " in "\n".join(out)) == bool(lines)
    assert "mode       append (the sink's output mode: every CQL query is compiled to an append-only stream)" in out


@pytest.mark.parametrize("text,lines", [
    # issue 42: outer joins and update mode written in CQL (docs/cql.md, "Joins")
    ("ISTREAM(SELECT A.k, B.w FROM A [RANGE 30 SECONDS] LEFT OUTER JOIN B [RANGE 20 SECONDS] ON A.k = B.k)",
     ["query      ISTREAM(SELECT A.k, B.w FROM A [RANGE 30 SECONDS] LEFT JOIN B [RANGE 20 SECONDS] ON A.k = B.k)",
      "operator   q_join: interval_join (how=left)",
      "join       q_join: how=[left] (A first, then B); output_mode=append",
      "mode       append (the sink's output mode: every CQL query is compiled to an append-only stream)"]),
    ("ISTREAM(SELECT A.k FROM A [RANGE 30 SECONDS] LEFT JOIN B [RANGE 30 SECONDS] ON A.k = B.k "
     "LEFT JOIN C [RANGE 30 SECONDS] ON C.k = A.k)",
     ["operator   q_mjoin: multi_join", "join       q_mjoin: how=[left, left] (A first, then B, C); output_mode=append"]),
    ("ISTREAM(SELECT A.k FROM A [RANGE 1 MINUTE] JOIN B [RANGE 1 MINUTE] ON A.k = B.k) WITH (OUTPUT_MODE UPDATE)",
     ["operator   q_join: window_join", "join       q_join: how=[inner] (A first, then B); output_mode=update",
      "mode       update (the sink's output mode: WITH (OUTPUT_MODE UPDATE); the join's rows are those of append "
      "mode, each written once)"]),
    ("ISTREAM(SELECT A.k FROM A [RANGE 30 SECONDS], B [RANGE 30 SECONDS], C [RANGE 30 SECONDS] "
     "WHERE A.k = B.k AND B.k = C.k) WITH (OUTPUT_MODE UPDATE)",
     ["join       q_mjoin: how=[inner, inner] (A first, then B, C); output_mode=update"]),
])
def test_explain_prints_outer_joins_and_update_mode(tmp_path, capsys, text, lines):
    out = _explain(tmp_path, capsys, text)
    for line in lines:
        assert line in out


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
        # in order: files written within one millisecond tie on their times and the file source then takes
        # them in the directory's order (a later file first makes every earlier row late)
        write_in_order(pa.Table.from_pylist(rows), os.path.join(root, f"part{i}.parquet"), i)
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
    assert code == 0 and "batch 0:" in out and "sliding_aggregate" in out
    # issue 41: the rows read (before the WHERE), the rows the sink got, the operator's counters by their names
    written = spark.read.parquet(sink).count()
    assert f"done: 4 batches, read 120 rows, written {written} rows (to {sink})" in out
    batches = [line for line in out.splitlines() if line.startswith("batch ")]
    assert [line.split(": read ")[1].split(" rows")[0] for line in batches] == ["40", "40", "40", "0"]
    assert sum(int(line.split("written ")[1].split(",")[0]) for line in batches) == written
    assert "q_agg: input_rows " in batches[0] and "output_rows " in batches[0]
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
    ("ISTREAM(SELECT A.sensor FROM Readings A [RANGE 10 SECONDS] JOIN Readings B [RANGE 10 SECONDS] "
     "ON A.sensor = B.sensor) WITH (OUTPUT_MODE UPDATE)", "the parquet file sink writes append mode only"),
    ("ISTREAM(SELECT A.sensor FROM Readings A [RANGE 10 SECONDS] LEFT JOIN Readings B [RANGE 10 SECONDS] "
     "ON A.sensor = B.sensor AND A.value < B.value)", "the ON condition A.value < B.value of the LEFT JOIN"),
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


def _subparsers():
    import argparse

    from pyspark_cq.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices


def test_help_pages_are_plain_text_and_describe_each_command():
    # issue 41: --help printed the module docstring's reStructuredText; subcommand pages had no description
    import re

    parser, commands = _subparsers()
    assert set(commands) == {"doctor", "connect-server", "demo", "run", "explain", "console"}
    for page in [parser.format_help()] + [p.format_help() for p in commands.values()]:
        assert not re.search(r"``|:(func|class|mod|meth):`", page), page
    for name, p in commands.items():
        assert p.description and len(p.description) > 40, name


def test_version(capsys):
    import pyspark_cq

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"pyspark-cq {pyspark_cq.__version__}"


def test_every_command_has_the_same_documented_master_default(monkeypatch):
    # issue 41: doctor local[1], run / console local[2], demo and connect-server local[*]
    from pyspark_cq.session import default_master

    _, commands = _subparsers()
    for name, p in commands.items():
        if name == "explain":   # no Spark
            continue
        master = next(a for a in p._actions if a.dest == "master")
        assert master.default is None and "(default $SPARK_MASTER or local[*])" in master.help, name
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert default_master() == "local[*]"
    monkeypatch.setenv("SPARK_MASTER", "spark://h:7077")
    assert default_master() == "spark://h:7077"


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv", "schema"])
def test_explain_reads_the_source_formats_of_run(tmp_path, capsys, fmt):
    # issue 41: explain --source read parquet only (and had no --format / --schema) while run reads all three
    import json

    root = tmp_path / "r"
    root.mkdir()
    if fmt in ("parquet", "schema"):
        pq.write_table(pa.Table.from_pylist([{"ts": datetime(2024, 1, 1), "sensor": "a", "value": 1}]),
                       str(root / "part0.parquet"))
    elif fmt == "json":
        (root / "part0.jsonl").write_text(json.dumps({"ts": "2024-01-01T00:00:00", "sensor": "a", "value": 1}))
    else:
        (root / "part0.csv").write_text("ts,sensor,value\n2024-01-01 00:00:00,a,1\n")
    extra = ["--schema", "Readings=ts timestamp, sensor string, `value` decimal(10, 2)"] if fmt == "schema" else []
    good, bad = tmp_path / "good.cql", tmp_path / "bad.cql"
    good.write_text("RSTREAM(SELECT sensor, SUM(value) AS s FROM Readings [RANGE 10 SECONDS SLIDE 2 SECONDS] "
                    "GROUP BY sensor)")
    bad.write_text("RSTREAM(SELECT sensr, SUM(value) AS s FROM Readings [RANGE 10 SECONDS SLIDE 2 SECONDS] "
                   "GROUP BY sensr)")
    assert main(["explain", str(good), "--source", f"Readings={root}", *extra]) == 0
    assert main(["explain", str(bad), "--source", f"Readings={root}", *extra]) == 2
    assert "sensr" in capsys.readouterr().err


def test_a_file_of_queries_splits_at_semicolons_outside_strings_and_comments(tmp_path):
    from pyspark_cq.cli.cql import named_queries, split_queries

    text = ("-- two queries; one file\nRSTREAM(SELECT COUNT(*) AS n FROM S [RANGE 1 DAY SLIDE 1 HOUR] WHERE x = 'a;b');\n"
            "ISTREAM(SELECT * FROM S [RANGE 1 HOUR]) ; -- trailing; comment\n  ;\n")
    parts = split_queries(text)
    assert len(parts) == 2 and "'a;b'" in parts[0] and parts[1].startswith("ISTREAM")
    (tmp_path / "many.cql").write_text(text)
    (tmp_path / "one.cql").write_text("ISTREAM(SELECT * FROM S [RANGE 1 HOUR])")
    assert [n for n, _, _ in named_queries([str(tmp_path / "many.cql"), str(tmp_path / "one.cql")])] == \
        ["many_1", "many_2", "one"]
    (tmp_path / "empty.cql").write_text("-- nothing\n")
    with pytest.raises(SystemExit, match="holds no query"):
        named_queries([str(tmp_path / "empty.cql")])
    with pytest.raises(SystemExit, match=r"\['one'\] used twice"):
        named_queries([str(tmp_path / "one.cql"), str(tmp_path / "one.cql")])


@pytest.mark.spark
@pytest.mark.slow
def test_run_several_query_files_as_one_group(spark, tmp_path, capsys):
    # issue 40: `run` takes several query files as one query group, each query into <sink>/<name>
    from pyspark.sql import functions as F

    rows = _requests(str(tmp_path / "requests"))
    other = tmp_path / "other_counts.cql"
    other.write_text("RSTREAM(SELECT COUNT(*) AS n FROM Requests S [RANGE 1 DAY SLIDE 1 HOUR] "
                     "WHERE S.domain <> 'stanford.edu')")
    sink = str(tmp_path / "out")
    code = main(["run", os.path.join(EXAMPLES, "stanford_counts.cql"), str(other), "--source",
                 f"Requests={tmp_path / 'requests'}", "--sink", sink, "--watermark", "0 seconds"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stanford_counts: shared" in out and "other_counts: shared" in out and "batch 0:" in out
    df = spark.createDataFrame(rows, "ts timestamp, client_id string, domain string, url string")
    closed = max(r["ts"] for r in rows[:80])
    written = 0
    for name, cond in (("stanford_counts", "domain = 'stanford.edu'"), ("other_counts", "domain <> 'stanford.edu'")):
        got = {(r.n, r.cq_at) for r in spark.read.parquet(os.path.join(sink, name)).collect()}
        expected = {(r["count"], r["end"]) for r in df.filter(cond).groupBy(F.window("ts", "1 day", "1 hour"))
                    .count().select("count", "window.end").collect()}
        assert {(n, end) for n, end in expected if end <= closed} <= got <= expected, name
        written += len(got)
    assert f"written {written} rows" in out
