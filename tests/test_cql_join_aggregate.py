"""CQL aggregates over joins (issue 42 item 2, docs/cql.md "Aggregates over joins"): errors and explain without
Spark; on Spark, batch and streaming (several micro-batches, late rows, a restart from the checkpoint) against
the plain-Python enumeration of CQL's semantics in helpers/join_aggregate_reference.py.
"""
import os
import random
from datetime import datetime, timedelta

import pyarrow as pa
import pytest
from helpers.files import write_in_order
from helpers.join_aggregate_reference import join_aggregate_reference
from helpers.streaming import run_side_by_side

import pyspark_cq as cq
from pyspark_cq.lang import CQLCompileError
from pyspark_cq.lang.compiler import analyze, explain

COLS = {"A": ["ts", "k", "v"], "B": ["ts", "k", "w"], "C": ["ts", "k", "x"]}
ISSUE = ("RSTREAM(SELECT A.k, COUNT(*) AS n, AVG(B.w) AS w FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], "
         "B [RANGE 30 SECONDS SLIDE 10 SECONDS] WHERE A.k = B.k GROUP BY A.k)")
J = "A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [RANGE 30 SECONDS SLIDE 10 SECONDS] WHERE A.k = B.k"


def test_plan_and_explain_show_the_join_and_the_aggregate():
    a = analyze(ISSUE, "q", COLS)
    assert a.shape == "join_aggregate" and a.operator == "q_agg"
    text = explain(ISSUE, COLS)
    assert "shape      join_aggregate; output RSTREAM" in text
    assert "γ[100](Γ[10 s]((ω[30 s](A) ⋈ ω[30 s](B))))" in text
    assert "operator   q_join: stream-stream interval join (Spark)" in text
    assert "operator   q_agg: sliding_aggregate" in text


THREE = ("RSTREAM(SELECT A.k, COUNT(*) AS n, AVG(C.x) AS x FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], "
         "B [RANGE 20 SECONDS SLIDE 10 SECONDS], C [RANGE 30 SECONDS SLIDE 10 SECONDS] "
         "WHERE A.k = B.k AND B.k = C.k AND A.v < C.x + 5 GROUP BY A.k)")


def test_three_way_plan_and_explain_show_the_chain_and_the_aggregate():
    """issue 42: an aggregate over a join of three streams is Spark's chain of joins, then the aggregate."""
    a = analyze(THREE, "q", COLS)
    assert a.shape == "join_aggregate" and a.operator == "q_agg" and len(a.keys) == 2
    text = explain(THREE, COLS)
    assert "plan       π(γ[100](Γ[10 s](σ[0.5](((ω[30 s](A) ⋈ ω[20 s](B)) ⋈ ω[30 s](C))))))" in text
    assert "operator   q_join: chain of stream-stream interval joins (Spark), 2 joins" in text
    assert "operator   q_agg: sliding_aggregate (tumbling, one window per slide instant)" in text
    assert "join       q_join: how=[inner, inner] (A first, then B, C); output_mode=append; then the aggregate" in text
    for stream in ("ISTREAM", "DSTREAM"):   # the change stream of the same aggregate (the same compilation)
        assert analyze(THREE.replace("RSTREAM", stream), "q", COLS).shape == "join_aggregate"


def test_multi_reference_of_two_streams_is_the_two_way_reference():
    """The n-way enumeration (helpers/join_aggregate_reference.py) agrees with the two-way one it generalises."""
    from helpers.join_aggregate_reference import multi_join_aggregate_reference

    rnd = random.Random(2)
    left = [{"t": rnd.randrange(0, 60 * 10**6), "k": rnd.randrange(3), "v": rnd.randrange(10)} for _ in range(25)]
    right = [{"t": rnd.randrange(0, 60 * 10**6), "k": rnd.randrange(3), "w": rnd.randrange(10)} for _ in range(25)]
    want = join_aggregate_reference(left, right, "k", 30 * 10**6, 20 * 10**6, 10 * 10**6)
    got = multi_join_aggregate_reference([left, right], "k", [30 * 10**6, 20 * 10**6], 10 * 10**6, (1, "w"))
    assert got == want and len(got) > 5


ERRORS = [
    ("RSTREAM(SELECT A.k, COUNT(*) AS n, AVG(B.w) AS w FROM A [RANGE 30 SECONDS], B [RANGE 30 SECONDS] "
     "WHERE A.k = B.k GROUP BY A.k)", "line 1:57:", "without SLIDE on A", "A [RANGE 30 SECONDS SLIDE 1 SECOND]"),
    (f"SELECT A.k, COUNT(*) AS n FROM {J} GROUP BY A.k", "line 1:1:", "without RSTREAM", "RSTREAM"),
    ("RSTREAM(SELECT A.k, COUNT(*) AS n FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [RANGE 30 SECONDS SLIDE 5 "
     "SECONDS] WHERE A.k = B.k GROUP BY A.k)", "line 1:81:", "different SLIDEs", "the same SLIDE"),
    ("RSTREAM(SELECT A.k, COUNT(*) AS n FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [RANGE 25 SECONDS SLIDE 10 "
     "SECONDS] WHERE A.k = B.k GROUP BY A.k)", "line 1:81:", "end on different grids", "multiple of the SLIDE"),
    ("RSTREAM(SELECT A.k, COUNT(*) AS n FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [ROWS 3] WHERE A.k = B.k "
     "GROUP BY A.k)", "line 1:81:", "the input B of an aggregate over a join", "[RANGE w SLIDE s]"),
    ("RSTREAM(SELECT COUNT(*) AS n FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], B [RANGE 30 SECONDS SLIDE 10 "
     "SECONDS])", "line 1:9:", "without an equality predicate", "A.k = B.k"),
    (f"RSTREAM(SELECT A.k, COUNT(*) AS n FROM {J} AND B.k = C.k GROUP BY A.k)".replace(
        "B [RANGE 30 SECONDS SLIDE 10 SECONDS]", "B [RANGE 30 SECONDS SLIDE 10 SECONDS], C [RANGE 30 SECONDS SLIDE "
        "5 SECONDS]"), "line 1:120:", "different SLIDEs", "every input the same SLIDE"),
    (f"RSTREAM(SELECT A.k, COUNT(*) AS n FROM {J} AND B.w = C.x GROUP BY A.k)".replace(
        "B [RANGE 30 SECONDS SLIDE 10 SECONDS]", "B [RANGE 30 SECONDS SLIDE 10 SECONDS], C [RANGE 20 SECONDS SLIDE "
        "10 SECONDS]"), "line 1:9:", "three or more streams", "one key equal in every input"),
    (f"RSTREAM(SELECT A.k, COUNT(*) AS n FROM {J} GROUP BY A.k) WITH (WINDOW BETWEEN 1 SECOND AND 30 SECONDS)",
     "line 1:", "WINDOW QoS range", "not adjustable"),
]


@pytest.mark.parametrize("text,where,what,hint", ERRORS)
def test_unsupported_variants_are_compile_errors_with_position_and_hint(text, where, what, hint):
    with pytest.raises(CQLCompileError) as info:
        analyze(text, "q", COLS)
    msg = str(info.value)
    assert msg.startswith(where) and what in msg and hint in msg, msg
    assert info.value.line is not None and info.value.column is not None


# --- Spark ----------------------------------------------------------------------------------------------------

BASE = datetime(2024, 1, 1)
EPOCH = datetime(1970, 1, 1)


def _us(ts):
    return (ts - EPOCH) // timedelta(microseconds=1)


def _side(rnd, extra, lo_s, hi_s, n, keys=range(4)):
    return [{"ts": BASE + timedelta(milliseconds=rnd.randrange(lo_s * 1000, hi_s * 1000)), "k": rnd.choice(keys),
             extra: rnd.randrange(10)} for _ in range(n)]


def _ours(rows, keep=lambda k: True):
    return {(r["k"], _us(r["cq_at"])): (r["n"], round(r["w"], 9)) for r in rows if keep(r["k"])}


def _reference(a_rows, b_rows, wl, wr, slide, where=None):
    left = [dict(r, t=_us(r["ts"])) for r in a_rows]
    right = [dict(r, t=_us(r["ts"])) for r in b_rows]
    ref = join_aggregate_reference(left, right, "k", wl * 10**6, wr * 10**6, slide * 10**6, where)
    return {k: (n, round(w, 9)) for k, (n, w) in ref.items()}


@pytest.mark.spark
def test_batch_equals_reference(spark):
    rnd = random.Random(3)
    a_rows, b_rows = _side(rnd, "v", 0, 90, 60), _side(rnd, "w", 0, 90, 60)
    a = spark.createDataFrame(a_rows, "ts timestamp, k long, v long")
    b = spark.createDataFrame(b_rows, "ts timestamp, k long, w long")
    got = _ours(cq.cql(spark, ISSUE, {"A": a, "B": b}).collect())
    want = _reference(a_rows, b_rows, 30, 30, 10)
    assert got == want and len(got) > 20


def _late_batches(rnd, n):
    """Per input (A with ``v``, B with ``w``): four data micro-batches of 40 s of event time, ``n`` rows each, the
    fourth with 5 more rows at 0–20 s (late: the watermark is past 100 s by then, so the join drops them), then two
    flush batches of key 99 that move the watermark past every data instant."""
    batches = {"A": [], "B": []}
    for side, extra in (("A", "v"), ("B", "w")):
        for i in range(4):
            batches[side].append(_side(rnd, extra, 40 * i, 40 * i + 40, n))
        batches[side][3] += _side(rnd, extra, 0, 20, 5)
        batches[side] += [_side(rnd, extra, 400, 401, 2, keys=[99]), _side(rnd, extra, 800, 801, 2, keys=[99])]
    return batches


def _on_time(batches, side):
    """The data rows of ``side`` that are not late: the first batch's, and the others' at or after 40 s."""
    return [r for b in batches[side][:4] for r in b if r["ts"] >= BASE + timedelta(seconds=40)
            or b is batches[side][0]]


def _run_restarting(spark, tmp_path, text, batches, restart_after):
    """``text`` over ``batches`` (one file per input and micro-batch) into a parquet sink, stopped after batch
    ``restart_after`` and restarted from its checkpoint for the rest: (rows after the first run, all rows, the
    second run's query). ``text`` a dict name -> query: the queries side by side over the same files, each with its
    own sink and checkpoint; a dict name -> that triple."""
    texts = text if isinstance(text, dict) else {"": text}
    root = tmp_path / "in"
    for side in batches:
        os.makedirs(root / side)

    def read(side, extra):
        return (spark.readStream.schema(f"ts timestamp, k long, {extra} long").option("maxFilesPerTrigger", 1)
                .parquet(str(root / side)).withWatermark("ts", "10 seconds"))

    def run():
        # a file sink: it restores from the checkpoint (the memory sink does not)
        return dict(zip(texts, run_side_by_side(*(
            cq.cql(spark, t, {"A": read("A", "v"), "B": read("B", "w")}).writeStream.format("parquet")
            .option("path", str(tmp_path / f"out{name}")).outputMode("append")
            .option("checkpointLocation", str(tmp_path / f"ck{name}")) for name, t in texts.items()))))

    def rows(name):
        return spark.read.parquet(str(tmp_path / f"out{name}")).collect()

    first = {}
    for i in range(len(batches["A"])):
        for side in batches:
            write_in_order(pa.Table.from_pylist(batches[side][i]), root / side / f"b{i}.parquet", i)
        if i == restart_after:
            run()
            first = {name: rows(name) for name in texts}
    queries = run()
    out = {name: (first.get(name), rows(name), q) for name, q in queries.items()}
    return out if isinstance(text, dict) else out[""]


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_with_late_rows_and_restart_equals_reference(spark, tmp_path):
    """Four data micro-batches (40 s of event time each), late rows in the fourth, a restart after the third, two
    flush batches of key 99 that move the watermark past every data instant; windows of 30 s and 20 s."""
    batches = _late_batches(random.Random(7), 25)
    text = ("RSTREAM(SELECT A.k, COUNT(*) AS n, AVG(B.w) AS w FROM A [RANGE 30 SECONDS SLIDE 10 SECONDS], "
            "B [RANGE 20 SECONDS SLIDE 10 SECONDS] WHERE A.k = B.k AND A.v < B.w + 5 GROUP BY A.k)")
    first, rows, q = _run_restarting(spark, tmp_path, text, batches, restart_after=2)
    got = _ours(rows, keep=lambda k: k != 99)
    on_time_a, on_time_b = _on_time(batches, "A"), _on_time(batches, "B")
    want = _reference(on_time_a, on_time_b, 30, 20, 10, where=lambda lrow, rrow: lrow["v"] < rrow["w"] + 5)
    assert got == want and len(got) > 30
    assert len(rows) == len({(r["k"], r["cq_at"]) for r in rows})   # each (group, instant) once across the restart
    assert len(first) > 0 and len(rows) > len(first)
    dropped = sum(op.numRowsDroppedByWatermark for p in q.recentProgress for op in p.stateOperators)
    assert dropped >= 1   # the late rows are counted by Spark's join, not lost silently


# --- ISTREAM / DSTREAM of an aggregate over a join ----------------------------------------------------------


def _changes(relation: dict, slide_us: int, stream: str) -> dict:
    """CQL's ISTREAM / DSTREAM of the relation {(key, instant): values}: at instant e the groups whose values are not
    those of instant e - s (ISTREAM: the new values, cq_at e), or whose values at e - s are gone at e (DSTREAM: the
    old values, cq_at e)."""
    out = {}
    for (k, e), v in relation.items():
        if stream == "ISTREAM" and relation.get((k, e - slide_us)) != v:
            out[(k, e)] = v
        if stream == "DSTREAM" and relation.get((k, e + slide_us)) != v:
            out[(k, e + slide_us)] = v
    return out


@pytest.mark.spark
@pytest.mark.parametrize("stream", ["ISTREAM", "DSTREAM"])
def test_batch_istream_dstream_equal_the_change_stream_of_the_reference(spark, stream):
    rnd = random.Random(5)
    a_rows, b_rows = _side(rnd, "v", 0, 90, 40), _side(rnd, "w", 0, 90, 40)
    a = spark.createDataFrame(a_rows, "ts timestamp, k long, v long")
    b = spark.createDataFrame(b_rows, "ts timestamp, k long, w long")
    rows = cq.cql(spark, ISSUE.replace("RSTREAM", stream), {"A": a, "B": b}).collect()
    got = _ours(rows)
    want = _changes(_reference(a_rows, b_rows, 30, 30, 10), 10 * 10**6, stream)
    assert got == want and len(got) > 10
    assert len(rows) == len(got)
    assert len(want) < len(_reference(a_rows, b_rows, 30, 30, 10))   # some values last several instants


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_istream_and_dstream_with_late_rows_and_restart_equal_reference(spark, tmp_path):
    """ISTREAM and DSTREAM over four data micro-batches with late rows, a restart after the second, two flush
    batches: the two queries side by side over the same files (one run's micro-batches, not two: issue 41)."""
    batches = _late_batches(random.Random(13), 20)
    texts = {stream: (f"{stream}(SELECT A.k, COUNT(*) AS n, AVG(B.w) AS w FROM A [RANGE 30 SECONDS SLIDE 10 "
                      "SECONDS], B [RANGE 20 SECONDS SLIDE 10 SECONDS] WHERE A.k = B.k GROUP BY A.k)")
             for stream in ("ISTREAM", "DSTREAM")}
    runs = _run_restarting(spark, tmp_path, texts, batches, restart_after=1)
    relation = _reference(_on_time(batches, "A"), _on_time(batches, "B"), 30, 20, 10)
    for stream, (_, rows, q) in runs.items():
        got = _ours(rows, keep=lambda k: k != 99)
        want = _changes(relation, 10 * 10**6, stream)
        assert got == want and len(got) > 10, stream
        assert len([r for r in rows if r["k"] != 99]) == len(got), stream   # each change once across the restart
        assert sum(op.numRowsDroppedByWatermark for p in q.recentProgress for op in p.stateOperators) >= 1, stream


# --- issue 42 item 3: a window join as a FROM subquery of a stateful query ----------------------------------

SUBQUERY = ("RSTREAM(SELECT J.k, COUNT(*) AS n FROM (SELECT A.k FROM A [RANGE 30 SECONDS], B [RANGE 20 SECONDS] "
            "WHERE A.k = B.k) J [RANGE 1 MINUTE SLIDE 20 SECONDS] GROUP BY J.k)")


def test_explain_shows_the_subquery_join():
    text = explain(SUBQUERY, COLS)
    assert "operator   q_agg: sliding_aggregate" in text
    assert "subquery   J: join, q_J_join: stream-stream interval join (Spark); plan π((ω[30 s](A) ⋈ ω[20 s](B)))" \
        in text


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_join_subquery_windowed_equals_reference(spark, tmp_path):
    """The inner join's stream (cq_at: the later timestamp) windowed by the outer aggregate, one Spark query:
    four micro-batches, late rows, a restart after the second, two flush batches of key 99."""
    from helpers.join_aggregate_reference import windowed_join_count_reference

    batches = _late_batches(random.Random(11), 20)
    _, rows, q = _run_restarting(spark, tmp_path, SUBQUERY, batches, restart_after=2)
    got = {(r["k"], _us(r["cq_at"])): r["n"] for r in rows if r["k"] != 99}
    left = [dict(r, t=_us(r["ts"])) for r in _on_time(batches, "A")]
    right = [dict(r, t=_us(r["ts"])) for r in _on_time(batches, "B")]
    want = windowed_join_count_reference(left, right, "k", 30 * 10**6, 20 * 10**6, 60 * 10**6, 20 * 10**6)
    assert got == want and len(got) > 10
    assert len(rows) == len({(r["k"], r["cq_at"]) for r in rows})
    assert sum(op.numRowsDroppedByWatermark for p in q.recentProgress for op in p.stateOperators) >= 1


# --- issue 42: an aggregate over a join of three streams, streaming ------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_three_way_join_aggregate_with_late_rows_equals_reference(spark, tmp_path):
    """``THREE`` (Spark's chain of two stream-stream joins, the slide instants, ``sliding_aggregate``, one query) over
    three data micro-batches of 40 s of event time and two flush batches of key 99, against the n-way enumeration.
    The third batch brings late rows (the watermark for late rows is 30 s then): A's and B's at 0–20 s, dropped by
    the first join; C's far behind (−60 to −40 s), dropped by the second join; and C's at 5–20 s, behind the input
    watermark but not behind the one Spark propagates to the second join (30 s less the first join's band), which
    are joined and counted at their instants (docs/cql.md, "Aggregates over joins of three or more streams")."""
    from helpers.join_aggregate_reference import multi_join_aggregate_reference
    from helpers.streaming import run_memory

    rnd = random.Random(17)
    extra = {"A": "v", "B": "w", "C": "x"}
    batches = {side: [_side(rnd, col, 40 * i, 40 * i + 40, 12) for i in range(3)] for side, col in extra.items()}
    late = {side: _side(rnd, col, 0, 20, 3) for side, col in extra.items()}
    joined_late = _side(rnd, "x", 5, 20, 3)   # C: late for the input watermark only
    late["C"] = _side(rnd, "x", -60, -40, 3)
    for side, col in extra.items():
        batches[side][2] += late[side] + (joined_late if side == "C" else [])
        batches[side] += [_side(rnd, col, 400, 401, 2, keys=[99]), _side(rnd, col, 800, 801, 2, keys=[99])]
    root = tmp_path / "in"
    for side in extra:
        os.makedirs(root / side)
        for i, rows in enumerate(batches[side]):
            write_in_order(pa.Table.from_pylist(rows), root / side / f"b{i}.parquet", i)

    def read(side):
        return (spark.readStream.schema(f"ts timestamp, k long, {extra[side]} long").option("maxFilesPerTrigger", 1)
                .parquet(str(root / side)).withWatermark("ts", "10 seconds"))

    (q,) = run_memory((cq.cql(spark, THREE, {s: read(s) for s in extra}), "cql_three", str(tmp_path / "ck")))
    rows = spark.table("cql_three").collect()
    got = {(r["k"], _us(r["cq_at"])): (r["n"], round(r["x"], 9)) for r in rows if r["k"] != 99}
    accepted = [[dict(r, t=_us(r["ts"])) for b in batches[side][:3] for r in b if r not in late[side]]
                for side in extra]
    ref = multi_join_aggregate_reference(accepted, "k", [30 * 10**6, 20 * 10**6, 30 * 10**6], 10 * 10**6, (2, "x"),
                                         where=lambda a, b, c: a["v"] < c["x"] + 5)
    assert got == {k: (n, round(x, 9)) for k, (n, x) in ref.items()} and len(got) > 10
    assert len(rows) == len({(r["k"], r["cq_at"]) for r in rows})   # each (group, instant) once
    # the late rows are counted by the joins that drop them, not lost silently
    assert sum(op.numRowsDroppedByWatermark for p in q.recentProgress for op in p.stateOperators) == 9
