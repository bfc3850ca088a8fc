"""A query's WHERE evaluated on Arrow batches (pyspark_cq.group.predicates) against a plain-Python evaluation of
SQL's three-valued logic; predicates whose Arrow result could differ from Spark's are refused."""
from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from pyspark_cq.group.predicates import Unsupported, bind, evaluate
from pyspark_cq.lang.parser import parse

TYPES = {"region": pa.string(), "x": pa.int64(), "v": pa.float64(), "ok": pa.bool_(), "ts": pa.timestamp("us")}
RAW = {"region": "c0", "x": "c1", "v": "c2", "ok": "c3", "ts": "c4"}


def where(text):
    q = parse(f"ISTREAM(SELECT * FROM s [RANGE 1 MINUTE] WHERE {text})").query
    return [q.where]


def name_of(col):
    return col.name


# ---- a plain-Python SQL evaluator (None is NULL) --------------------------------------------------------

def sql(e, row):
    from pyspark_cq.lang import ast as A

    if isinstance(e, A.Column):
        return row[e.name]
    if isinstance(e, A.Literal):
        return e.value
    if isinstance(e, A.Unary) and e.op == "-":
        return -sql(e.operand, row)
    if isinstance(e, A.Unary):
        v = sql(e.operand, row)
        return None if v is None else not v
    if isinstance(e, A.Binary) and e.op == "AND":
        a, b = sql(e.left, row), sql(e.right, row)
        return False if a is False or b is False else (None if a is None or b is None else True)
    if isinstance(e, A.Binary) and e.op == "OR":
        a, b = sql(e.left, row), sql(e.right, row)
        return True if a is True or b is True else (None if a is None or b is None else False)
    if isinstance(e, A.Binary):
        a, b = sql(e.left, row), sql(e.right, row)
        if a is None or b is None:
            return None
        return {"=": a == b, "<>": a != b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[e.op]
    if isinstance(e, A.IsNull):
        return (sql(e.operand, row) is None) != e.negated
    if isinstance(e, A.Between):
        x = sql(e.operand, row)
        r = sql(A.Binary("AND", A.Binary(">=", e.operand, e.low), A.Binary("<=", e.operand, e.high)), row)
        return None if x is None and r is None else (r if not e.negated or r is None else not r)
    if isinstance(e, A.InList):
        x = sql(e.operand, row)
        if x is None:
            return None
        found = x in [i.value for i in e.items]
        return found != e.negated
    raise AssertionError(e)


PREDICATES = [
    "region = 'eu'", "region <> 'eu' AND x > 10", "x BETWEEN 20 AND 30", "x NOT BETWEEN 20 AND 30",
    "region IN ('ap', 'us')", "region NOT IN ('ap', 'us')", "x IN (1, 2, 3)", "region IS NULL OR x >= 90",
    "NOT (v < 0.5) AND ok", "ok = TRUE OR v IS NOT NULL", "x > -5 AND v <= 2.5", "region >= 'b' AND region < 'v'",
    "(region IN ('ap', 'us') AND NOT x BETWEEN 20 AND 30) OR (region IS NULL AND x >= 90)",
]


@pytest.mark.parametrize("text", PREDICATES)
def test_arrow_evaluation_equals_sql_three_valued_logic(text):
    rnd = random.Random(5)
    rows = [{"region": rnd.choice(["eu", "us", "ap", "b", None]), "x": rnd.choice([None, *range(-10, 100)]),
             "v": rnd.choice([None, 0.0, 0.4, 0.5, 2.5, 3.0]), "ok": rnd.choice([True, False, None])}
            for _ in range(400)]
    rows += [dict(zip(("region", "x", "v", "ok"), combo))
             for combo in itertools.product(["eu", None], [25, None], [0.5, None], [True, None])]
    batch = pa.RecordBatch.from_pylist(
        [{RAW[k]: v for k, v in r.items()} for r in rows],
        schema=pa.schema([(RAW[k], TYPES[k]) for k in ("region", "x", "v", "ok")]))
    bound = bind(where(text), name_of, TYPES, RAW)
    got = evaluate(bound, batch).to_pylist()
    conj = where(text)[0]
    want = [sql(conj, r) for r in rows]
    assert got == want


@pytest.mark.parametrize("text,why", [
    ("region LIKE 'e%'", "Binary"), ("x + 1 > 3", "Binary"), ("region = 5", "a comparison of a string with a number"),
    ("x IN (1, 2.5)", "fraction"), ("region IN ('a', NULL)", "literal None"), ("ts > '2024-01-01'", "type timestamp"),
    ("nope = 1", "'nope'"), ("x", "a number where a condition belongs"), ("abs(x) > 3", "the function ABS"),
])
def test_predicates_that_could_differ_from_spark_are_refused(text, why):
    with pytest.raises(Unsupported, match=why):
        bind(where(text), name_of, TYPES, RAW)
