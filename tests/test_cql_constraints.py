"""CQL's ``WITH (CONSTRAINT …)`` clause (STREAM §5.2, issue 43): parsing, printing, errors with line and column,
the constraints it compiles to (no Spark), and on Spark a two-way window join with constraints against the same
query without them and Spark's own join (docs/cql.md, docs/constraints.md).
"""
from __future__ import annotations

import os

import pytest

from pyspark_cq import constraints as C
from pyspark_cq.lang import CQLCompileError, parse, to_text
from pyspark_cq.lang.compiler import analyze, explain
from pyspark_cq.lang.parser import CQLSyntaxError

COLS = {"O": ["ts", "k", "s", "lv"], "F": ["ts", "k", "s", "rv"], "A": ["ts", "k", "v"]}
JOIN = "ISTREAM(SELECT * FROM O [RANGE 10 SECONDS], F [RANGE 10 SECONDS] WHERE O.k = F.k AND O.s = F.s)"


def test_clause_parses_prints_and_compiles_to_constraints():
    text = (JOIN + "\nWITH (CONSTRAINT many_to_one F REFERENCES O DELAY 2 SECONDS, CONSTRAINT CLUSTERED F TOLERANCE 3,"
            " CONSTRAINT UNIQUE O (k, s), CONSTRAINT ORDERED O, PERIOD 1 SECOND)")
    tree = parse(text)
    assert parse(to_text(tree)) == tree
    assert "CONSTRAINT MANY_TO_ONE F REFERENCES O DELAY 2 SECONDS" in to_text(tree)
    a = analyze(text, "shipped", COLS)
    assert a.constraints == [C.many_to_one("right", "left", "2 seconds"), C.clustered("right", 3),
                             C.unique("left", ["cq_k0", "cq_k1"]), C.ordered("left", 0)]
    assert a.options == {"period": 1_000_000}
    assert "constraint clustered('right', k=3)" in explain(text, None).splitlines()
    # the checks the operator makes hold for what the clause compiles to
    assert C.check_constraints(a.constraints, {"left": ["cq_k0", "cq_k1"], "right": ["cq_k0", "cq_k1"]}, "f",
                               arrival=True) == tuple(a.constraints)


@pytest.mark.parametrize("clause, line, column, words", [
    ("WITH (CONSTRAINT FOO F)", 2, 18, "expected a constraint (UNIQUE, MANY_TO_ONE, CLUSTERED, ORDERED)"),
    ("WITH (CONSTRAINT CLUSTERED F TOLERANCE 1.5)", 2, 40, "TOLERANCE must be an integer >= 0"),
    ("WITH (CONSTRAINT CLUSTERED F TOLERANCE -1)", 2, 40, "expected a tolerance"),
    ("WITH (CONSTRAINT MANY_TO_ONE F O)", 2, 32, "expected REFERENCES"),
    ("WITH (CONSTRAINT UNIQUE O k)", 2, 27, "expected '(' and the unique columns of O"),
    ("WITH (CONSTRAINT UNIQUE O (k,))", 2, 30, "a column name"),
    ("WITH (CONSTRAINT ORDERED F, CONSTRAINT ORDERED F TOLERANCE 2)", 2, 29, "CONSTRAINT ORDERED F is given twice"),
    ("WITH (CONSTRAINT MANY_TO_ONE F REFERENCES O DELAY 2 PARSECS)", 2, 53, "expected a time unit"),
])
def test_syntax_errors_name_line_and_column(clause, line, column, words):
    with pytest.raises(CQLSyntaxError) as info:
        parse(JOIN + "\n" + clause)
    assert (info.value.line, info.value.column) == (line, column)
    assert words in str(info.value)


@pytest.mark.parametrize("text, line, column, words", [
    (JOIN + "\nWITH (CONSTRAINT UNIQUE O (lv))", 2, 7, "'lv' is not a join-key column of O"),
    (JOIN + "\nWITH (CONSTRAINT MANY_TO_ONE F REFERENCES F)", 2, 7, "the child and the parent"),
    (JOIN + "\nWITH (CONSTRAINT MANY_TO_ONE F REFERENCES X)", 2, 7, "'X' is not a stream of FROM"),
    (JOIN + "\nWITH (CONSTRAINT CLUSTERED X)", 2, 7, "'X' is not a stream of FROM"),
    ("RSTREAM(SELECT k, COUNT(*) AS n FROM A [RANGE 10 SECONDS SLIDE 5 SECONDS] GROUP BY k)\n"
     "  WITH (CONSTRAINT ORDERED A)", 2, 9, "apply to a two-way join of windowed streams"),
    ("RSTREAM(SELECT O.k, COUNT(*) AS n FROM O [RANGE 10 SECONDS SLIDE 5 SECONDS], F [RANGE 10 SECONDS SLIDE 5 "
     "SECONDS] WHERE O.k = F.k GROUP BY O.k) WITH (CONSTRAINT CLUSTERED F)", 1, 151, "an aggregate over a join"),
])
def test_compile_errors_name_line_and_column(text, line, column, words):
    with pytest.raises(CQLCompileError) as info:
        analyze(text, "q", COLS)
    assert (info.value.line, info.value.column) == (line, column)
    assert words in str(info.value)


# -- on Spark ------------------------------------------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_cql_constraints_on_streams_equal_spark_join(spark, tmp_path):
    """test_join_constraints' clustered orders / fulfilments through ``cq.cql``: the query with ``WITH (CONSTRAINT
    MANY_TO_ONE F REFERENCES O, CONSTRAINT CLUSTERED F TOLERANCE k)`` gives the rows of the same query without it
    and of Spark's join, with less state and no violations."""
    from helpers import join_data as jd
    from helpers.streaming import run_memory
    from pyspark.sql import functions as F
    from test_join_constraints_spark import _reports, write_arrival

    import pyspark_cq as cq

    root = str(tmp_path / "data")
    k = write_arrival(root, "orders", 4)

    def source(side):
        return jd.stream_source(spark, root, side, "15 seconds")

    select = "ISTREAM(SELECT O.k, O.s, lv, rv FROM O [RANGE 10 SECONDS], F [RANGE 10 SECONDS] WHERE O.k = F.k " \
             "AND O.s = F.s)"
    ours = cq.cql(spark, select + f" WITH (CONSTRAINT MANY_TO_ONE F REFERENCES O, CONSTRAINT CLUSTERED F "
                                  f"TOLERANCE {k})", {"O": source("l"), "F": source("r")})
    plain = cq.cql(spark, select, {"O": source("l"), "F": source("r")})
    lo, ro = source("l").alias("o"), source("r").alias("f")
    theirs = lo.join(ro, (F.col("o.k") == F.col("f.k")) & (F.col("o.s") == F.col("f.s"))
                     & (F.col("f.ts") > F.col("o.ts") - F.expr("INTERVAL 10 SECONDS"))
                     & (F.col("f.ts") < F.col("o.ts") + F.expr("INTERVAL 10 SECONDS"))).select("o.k", "o.s", "lv", "rv")
    q_ours, q_plain, _ = run_memory((ours, "cql_c_ours", str(tmp_path / "ck_ours")),
                                    (plain, "cql_c_plain", str(tmp_path / "ck_plain")),
                                    (theirs, "cql_c_spark", str(tmp_path / "ck_spark")))
    cols = ["k", "s", "lv", "rv"]

    def rows(table):
        return sorted(tuple(r) for r in spark.table(table).select(*cols).collect())

    assert rows("cql_c_ours") == rows("cql_c_spark") == rows("cql_c_plain")
    assert len(rows("cql_c_spark")) > 50
    mine, without = _reports(q_ours, "q_join"), _reports(q_plain, "q_join")
    assert mine and sum(r["constraint_violations"] for r in mine) == 0
    assert sum(r["state_rows"] for r in mine) < 0.8 * sum(r["state_rows"] for r in without)
    assert os.path.isdir(root)


# -- joins of three or more streams (multi_join) -------------------------------------------------------------------

COLS3 = {"O": ["k0", "t0", "v0"], "F": ["k1", "t1", "v1"], "P": ["k2", "t2", "v2"]}
JOIN3 = ("ISTREAM(SELECT v0, v1, v2 FROM O [RANGE 30 SECONDS], F [RANGE 30 SECONDS], P [RANGE 30 SECONDS] "
         "WHERE O.k0 = F.k1 AND F.k1 = P.k2)")
WITH3 = " WITH (CONSTRAINT UNIQUE O (k0), CONSTRAINT MANY_TO_ONE F REFERENCES O, CONSTRAINT UNIQUE P (k2))"


def test_clause_on_three_streams_compiles_to_input_indices():
    a = analyze(JOIN3 + WITH3, "q", COLS3)
    assert a.shape == "multi_join"
    assert a.constraints == [C.unique(0, ["k0"]), C.many_to_one(1, 0), C.unique(2, ["k2"])]
    assert "constraint unique(0, ('k0',))" in explain(JOIN3 + WITH3, None).splitlines()
    arrival = analyze(JOIN3 + " WITH (CONSTRAINT CLUSTERED F TOLERANCE 2, CONSTRAINT ORDERED P)", "q", COLS3)
    assert arrival.constraints == [C.clustered(1, 2), C.ordered(2, 0)]


@pytest.mark.parametrize("clause, words", [
    (" WITH (CONSTRAINT CLUSTERED X)", "'X' is not a stream of FROM"),
    (" WITH (CONSTRAINT UNIQUE O (v0))", "'v0' is not a join-key column of O"),
    (" WITH (CONSTRAINT MANY_TO_ONE F REFERENCES X)", "'X' is not a stream of FROM"),
])
def test_compile_errors_on_three_streams(clause, words):
    with pytest.raises(CQLCompileError, match=words):
        analyze(JOIN3 + clause, "q", COLS3)


@pytest.mark.spark
@pytest.mark.slow
def test_cql_constraints_on_three_streams_equal_the_plain_query(spark, tmp_path):
    """tests/test_multi_join_constraints' orders / fulfilments / payments through ``cq.cql``: with the clause the
    rows of the query without it and of the plain-Python enumeration (pairwise bands of the 30 s windows), with
    less state and no violations."""
    from helpers.streaming import run_memory
    from test_multi_join_constraints import orders_stream, reference
    from test_multi_join_constraints_spark import _reports, _sources, _write

    import pyspark_cq as cq

    batches = orders_stream(n_batches=8, per_batch=30, seed=13)
    root = str(tmp_path / "data")
    _write(root, batches)
    s = 1_000_000
    band = (-30 * s + 1, 30 * s - 1)   # windows [t, t + 30 s) intersect
    expected = sorted(t for o in reference(batches, bounds=[(i, j) + band for i, j in ((0, 1), (0, 2), (1, 2))])
                      for t in o)

    def query(text):
        return cq.cql(spark, text, dict(zip("OFP", _sources(spark, root))))

    q_ours, q_plain = run_memory((query(JOIN3 + WITH3), "cql3_ours", str(tmp_path / "ck_ours")),
                                 (query(JOIN3), "cql3_plain", str(tmp_path / "ck_plain")))

    def rows(table):
        return sorted(tuple(r) for r in spark.table(table).select("v0", "v1", "v2").collect())

    assert len(expected) > 50
    assert rows("cql3_ours") == rows("cql3_plain") == expected
    mine, without = _reports(q_ours, "q_mjoin"), _reports(q_plain, "q_mjoin")
    assert mine and sum(r["constraint_violations"] for r in mine) == 0
    assert sum(r["state_rows"] for r in mine) < 0.9 * sum(r["state_rows"] for r in without)
