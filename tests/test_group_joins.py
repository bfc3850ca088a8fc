"""Joins in a QueryGroup's shared stage (issue 40): join classes, each member's band, validity and ``cq_at`` from
its class's pairs, and the join's watermark (pure: the oracle is a plain-Python window join per member)."""
from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pyspark_cq.group.joins import (
    JoinMember,
    canonical_names,
    class_windows,
    join_classes,
    join_watermark_ms,
    member_rows,
)

S = 1_000_000
T0 = 1_704_067_200_000_000  # 2024-01-01 UTC, µs


def jm(wl, wr, pairs=(("page", "page"),), left="clicks", right="views", refs=("c", "v"), at="valid_to"):
    return JoinMember(left=left, right=right, pairs=tuple(pairs), windows=(wl * S, wr * S), refs=refs,
                      times=("ts", "ts"), columns=(("ts", "page", "x"), ("ts", "page", "y")), at=at)


def spec(key, j):
    return SimpleNamespace(key=key, join=j)


def test_classes_share_streams_roles_and_keys():
    ms = [spec("a", jm(10, 20)), spec("b", jm(30, 5, refs=("x", "y"))),
          spec("c", jm(10, 20, left="views", right="clicks")),        # other roles
          spec("d", jm(10, 20, pairs=(("x", "y"),))),                 # other key
          spec("e", jm(10, 20, pairs=(("x", "y"), ("page", "page")))),
          spec("f", jm(1, 1, pairs=(("page", "page"), ("x", "y"))))]  # the same equalities in another order
    assert join_classes(ms) == {"a": "a", "b": "a", "c": "c", "d": "d", "e": "e", "f": "e"}
    assert class_windows([ms[0].join, ms[1].join]) == (30 * S, 20 * S)
    with pytest.raises(ValueError, match="joins"):
        class_windows([])


def test_canonical_names_follow_the_members_key_order():
    j = jm(1, 1, pairs=(("x", "y"), ("page", "page")))
    names = canonical_names(j)
    assert names["cq_k0"] == "cq_k1" and names["cq_k1"] == "cq_k0"      # sorted: (page, page) first
    assert names["l__ts"] == "c__ts" and names["r__ts"] == "v__ts" and "l__x" not in names


def _class_pairs(rows_l, rows_r, windows):
    """A plain-Python window join (validities [t, t + w) intersect) on the key, canonical names."""
    wl, wr = windows
    out = [(k1, t1, x, t2, y) for (k1, t1, x), (k2, t2, y) in itertools.product(rows_l, rows_r)
           if k1 == k2 and t1 < t2 + wr and t2 < t1 + wl]
    ts = pa.timestamp("us", tz="UTC")
    cols = list(zip(*out)) if out else [[]] * 5
    return pa.table({"cq_k0": pa.array(cols[0], pa.string()), "l__ts": pa.array(cols[1], pa.int64()).cast(ts),
                     "l__x": pa.array(cols[2], pa.int64()), "r__ts": pa.array(cols[3], pa.int64()).cast(ts),
                     "r__y": pa.array(cols[4], pa.int64())})


def test_each_member_gets_its_own_join_from_the_class_pairs():
    rng = np.random.default_rng(3)
    rows_l = [(str(rng.integers(0, 3)), int(rng.integers(0, 60)) * S, i) for i in range(40)]
    rows_r = [(str(rng.integers(0, 3)), int(rng.integers(0, 60)) * S, 100 + i) for i in range(40)]
    members = [jm(10, 20), jm(30, 5, refs=("a", "b"), at="valid_from"), jm(1, 1)]
    pairs = _class_pairs(rows_l, rows_r, class_windows(members))
    ts = pa.timestamp("us", tz="UTC")
    for j in members:
        r1, r2 = j.refs
        schema = pa.schema([("cq_k0", pa.string()), (f"{r1}__ts", ts), (f"{r1}__x", pa.int64()),
                            (f"{r2}__ts", ts), (f"{r2}__y", pa.int64()), ("valid_from", ts), ("valid_to", ts),
                            ("cq_at", ts)])
        got = member_rows(pairs, j, schema)
        assert got.schema == schema
        wl, wr = j.windows
        want = sorted((k1, t1, x, t2, y, max(t1, t2), min(t1 + wl, t2 + wr))
                      for (k1, t1, x), (k2, t2, y) in itertools.product(rows_l, rows_r)
                      if k1 == k2 and t1 < t2 + wr and t2 < t1 + wl)
        rows = sorted(zip(*[got.column(i).cast(pa.int64()).to_pylist() if i else got.column(i).to_pylist()
                            for i in range(7)]))
        assert rows == want
        at = got.column("cq_at").cast(pa.int64()).to_pylist()
        assert at == got.column(j.at).cast(pa.int64()).to_pylist()


def test_join_watermark_is_the_minimum_of_the_streams_seen_and_never_goes_back():
    delays = {"clicks": 10_000, "views": 5_000}
    streams = ("clicks", "views")
    assert join_watermark_ms((), 0, streams, delays) == 0
    clocks = ((0, {"clicks": 100_000}),)                       # only clicks had rows: its watermark alone
    assert join_watermark_ms(clocks, 1, streams, delays) == 90_000
    assert join_watermark_ms(clocks, 0, streams, delays) == 0  # before the micro-batch that saw them
    clocks += ((1, {"clicks": 100_000, "views": 50_000}),)     # views arrive behind: the watermark stays
    assert join_watermark_ms(clocks, 2, streams, delays) == 90_000
    clocks += ((2, {"clicks": 200_000, "views": 150_000}),)
    assert join_watermark_ms(clocks, 3, streams, delays) == 145_000
    # clicks alone for six micro-batches, then views far behind and slowly: Spark keeps clicks' watermark however
    # many micro-batches later (the entry before views' first is kept: clock.record)
    from pyspark_cq.group import clock as C

    clocks = ()
    for b in range(6):
        clocks = C.record(clocks, b, {"clicks": 100_000 * (b + 1)})
    for b in range(6, 14):
        clocks = C.record(clocks, b, {"views": 10_000 * b})
    assert join_watermark_ms(clocks, 14, streams, delays) == 590_000


def test_an_aggregate_after_a_join_sees_the_joins_output_watermark_and_its_state_by_batch(tmp_path):
    """Spark's output watermark of the window join (its smaller state watermark: input watermark minus the wider
    window, truncated to ms), and the aggregation's state versions: a micro-batch reads the newest before it."""
    from pyspark_cq.group.post import join_output_watermark_ms
    from pyspark_cq.operators._common.batch_versions import BatchVersions, parse_version
    from pyspark_cq.operators._common.state_files import StateFiles

    assert join_output_watermark_ms(100_000, (60 * S, 20 * S)) == 40_000
    assert join_output_watermark_ms(100_000, (1_500, 2_500)) == 99_997     # (100,000,000 − 2,500) / 1,000
    files = StateFiles(str(tmp_path / "post"))     # as run_post keeps the aggregation's state

    def load(b):
        return BatchVersions(files, (0,), "q", b, "ja").value

    assert load(0) is None
    for b in range(4):
        BatchVersions(files, (0,), "q", b, "ja").save(("state", b))
    assert load(3) == ("state", 2) and load(4) == ("state", 3)                 # a batch run again: the same
    assert sorted(parse_version(n) for n in files.names((0,))) == [2, 3]       # older versions dropped


# ---- Spark, end to end: each member's sink against its query alone (cq.cql) --------------------------------------

VIEWS = "ts timestamp, page string, x long, y long"
#: an aggregate over clicks, two joins of clicks and views on x (one class, bands 30 s / 1 min and 1 min / 20 s,
#: the same predicate on clicks, one with a residual of its own) and one join of views with clicks (the other roles: a class of its own)
JQ = {
    "agg": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 20 SECONDS] GROUP BY page)",
    "j_eu": "DSTREAM(SELECT c.x, c.page, v.page AS vpage, v.y FROM clicks c [RANGE 30 SECONDS] "
            "JOIN views v [RANGE 1 MINUTE] ON c.x = v.x WHERE c.region = 'eu')",
    # j_eu's predicate on clicks (pushed below the clicks' watermark, as alone: the class's clock) and a residual
    # over both inputs, on the class's pairs
    "j_y": "ISTREAM(SELECT clicks.x, clicks.ts AS cts, views.ts AS vts, y * 2 AS y2 FROM clicks [RANGE 1 MINUTE], "
           "views [RANGE 20 SECONDS] WHERE clicks.x = views.x AND clicks.region = 'eu' AND y > clicks.x % 13)",
    "j_vc": "DSTREAM(SELECT v.x, v.y, c.region FROM views v [RANGE 10 SECONDS] JOIN clicks c [RANGE 10 SECONDS] "
            "ON v.x = c.x)",
    # an outer join: a class of its own (one type, band and ON filter each), its padded rows emitted at eviction,
    # its ON condition on the padded stream run by its class before the state, its WHERE on its preserved stream
    # applied after the class's join (RIGHT / FULL: tests/test_group_outer_joins.py, pure)
    "o_left": "ISTREAM(SELECT c.x, c.region, v.y, v.ts AS vts FROM clicks c [RANGE 30 SECONDS] LEFT OUTER JOIN "
              "views v [RANGE 1 MINUTE] ON c.x = v.x AND v.y > 3 WHERE c.region = 'eu')",
    # a ROWS window: its partitions' last rows in the shared stage's state (tests/test_group_rows.py, pure), its
    # window's WHERE before the window, its select list naming columns (no Spark job per micro-batch)
    "r_pg": "DSTREAM(SELECT page, x AS px, ts FROM clicks [PARTITION BY page ROWS 3 WHERE region = 'eu'])",
    # an aggregate over a join: its join a member of a join class (its own: a predicate on views too), its aggregation
    # (the pairs at each slide instant, a tumbling window) by the micro-batch function (pyspark_cq.group.post), with
    # a residual, a computed argument, HAVING and a computed select item
    "ja": "RSTREAM(SELECT c.page, COUNT(*) AS n, SUM(v.y % 7) AS s, AVG(v.y) * 2 AS a2 FROM clicks c [RANGE 1 MINUTE "
          "SLIDE 20 SECONDS] JOIN views v [RANGE 1 MINUTE SLIDE 20 SECONDS] ON c.x = v.x WHERE c.region = 'eu' "
          "AND v.y > 2 GROUP BY c.page HAVING COUNT(*) > 1)",
}


#: a join of three streams (multi_join: a stateless stage of its own in the group, state in files), with a WHERE on
#: one input (pushed below its watermark, as alone) and a residual over two
M3 = ("ISTREAM(SELECT c.x, c.page, v.y, b.y AS by2, b.ts AS bts FROM clicks c [RANGE 30 SECONDS], views v [RANGE 1 "
      "MINUTE], buys b [RANGE 20 SECONDS] WHERE c.x = v.x AND v.x = b.x AND c.region <> 'ap' AND v.y >= b.y)")


def write_join_views(directory, files, rows, seed=7, first=0):
    """Views over the clicks' event time (4 minutes a file), some late by up to 2 minutes."""
    from helpers.files import write_in_order

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed + first)
    for f in range(first, first + files):
        ts = T0 + f * 240_000_000 + rng.integers(0, 240_000_000, rows)
        ts = np.where(rng.random(rows) < 0.05, ts - 120_000_000, ts)
        table = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                          "page": pa.array(rng.choice(["a", "b"], rows), pa.string()),
                          "x": pa.array(rng.integers(0, 100, rows)), "y": pa.array(rng.integers(0, 30, rows))})
        write_in_order(table, os.path.join(directory, f"part-{f:02d}.parquet"), f)


def run_beside_alone(spark, g, texts, sources, tmp_dir):
    """Run group ``g`` (availableNow) and beside it the oracle, each query of ``texts`` alone over ``sources`` into
    ``<tmp_dir>/alone/<name>`` (their micro-batches overlap: issue 41, the suite's time); a failed one leaves nothing
    running into the next test."""
    import pyspark_cq as cq

    started = [g.start(trigger={"availableNow": True})]
    started += [cq.cql(spark, text, sources).writeStream.format("parquet")
                .option("path", os.path.join(tmp_dir, "alone", name))
                .option("checkpointLocation", os.path.join(tmp_dir, "alone_ck", name))
                .trigger(availableNow=True).start() for name, text in texts.items()]
    try:
        for q in started:
            q.awaitTermination()
            assert q.exception() is None
    finally:
        for q in started:
            if q.isActive:
                q.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_join_members_equal_their_queries_alone_across_a_restart(spark, tmp_dir):
    """Two micro-batches, a stop, a new group on the checkpoint with a third: each member's sink holds exactly
    its query's rows alone over all three files (0 lost, 0 duplicated), the two clicks-views joins in one class."""
    from test_query_group import assert_same_rows, clicks_stream, write_clicks

    import pyspark_cq as cq

    cdir, vdir, bdir = (os.path.join(tmp_dir, s) for s in ("clicks", "views", "buys"))
    # 200 rows a file: the outer member's watermark then differs with and without its pushed predicates (Spark
    # computes its query's watermark over the rows that pass them: joins.class_sides)
    write_clicks(cdir, files=2, rows=200)
    write_join_views(vdir, files=2, rows=200)
    write_join_views(bdir, files=2, rows=100, seed=29)
    # and a join of three streams (multi_join): a stateless stage of its own, at its own streams' watermark
    queries = {**JQ, "m3": M3}

    def views_stream(directory=vdir, delay="30 seconds"):
        return (spark.readStream.schema(VIEWS).option("maxFilesPerTrigger", 1).parquet(directory)
                .withWatermark("ts", delay))

    def streams():
        return {"clicks": clicks_stream(spark, cdir), "views": views_stream(), "buys": views_stream(bdir, "10 seconds")}

    def run():
        """The group on its checkpoint, and beside it the oracle: each query alone, stopped and started again at
        the same files (their micro-batches overlap: issue 41, the suite's time)."""
        g = cq.QueryGroup(spark, sources=streams(), checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
        for name, text in queries.items():
            g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
        run_beside_alone(spark, g, queries, streams(), tmp_dir)
        return g

    # admission control on the join classes' state (PIPES eq. 9 through the class's widest windows, once per
    # class; by hand with test_group_admission's eq. (9) side): clicks 1 row/s, δ 60 s; views 2 rows/s, δ 30 s
    from test_group_admission import _eq9_side

    from pyspark_cq.cost.groups import StreamLoad
    from pyspark_cq.runtime import CQRuntime, QueryRejected

    g0 = cq.QueryGroup(spark, sources={"clicks": clicks_stream(spark, cdir), "views": views_stream()},
                       checkpoint=os.path.join(tmp_dir, "ck0"), shards=2)
    rt = CQRuntime(spark, memory_budget=4_000)
    rt.register_group(g0, loads={"clicks": StreamLoad(1.0, watermark_delay=60.0),
                                 "views": StreamLoad(2.0, watermark_delay=30.0)}, row_bytes=10)
    for name in ("j_eu", "j_y"):      # one class: widest (60 s, 60 s), each side kept 60 + 60 s
        g0.add(name, JQ[name], sink=os.path.join(tmp_dir, "out0", name))
    assert rt.group_state(g0.name)["classes"]["j_eu"]["estimated_rows"] == _eq9_side(1, 120, 2) + _eq9_side(2, 120, 1)
    with pytest.raises(QueryRejected, match=r"'j_vc' \(a new join class\).*4,000 B"):   # +213.25 rows: 5,765 B
        g0.add("j_vc", JQ["j_vc"], sink=os.path.join(tmp_dir, "out0", "j_vc"))
    assert list(g0.queries) == ["j_eu", "j_y"]
    g = run()
    assert {n: (v["mode"], v["join_class"]) for n, v in g.queries.items()} == {
        "agg": ("shared", None), "j_eu": ("join", "j_eu"), "j_y": ("join", "j_eu"), "j_vc": ("join", "j_vc"),
        "o_left": ("join", "o_left"), "r_pg": ("rows", None), "m3": ("alone", None), "ja": ("join", "ja")}
    assert "three or more streams" in g.queries["m3"]["why"]
    assert os.listdir(os.path.join(tmp_dir, "ck", "members"))     # its state, under the group's checkpoint
    assert g.queries["o_left"]["stream"] == "clicks LEFT JOIN views"
    # the state estimate sees each join class once, at the band it started with (the class's widest windows)
    from pyspark_cq.cost.groups import JoinLoad, fixed_classes

    joins = [(x.name, x.join_class, x.left, x.right, x.left_window // S, x.right_window // S)
             for x in g._loads() if isinstance(x, JoinLoad)]
    assert joins == [("j_eu", "j_eu", "clicks", "views", 60, 60), ("j_y", "j_eu", "clicks", "views", 60, 20),
                     ("j_vc", "j_vc", "views", "clicks", 10, 10),
                     ("o_left", "o_left", "clicks", "views", 30, 60), ("ja", "ja", "clicks", "views", 60, 60)]
    fixed = fixed_classes(g._loads())           # agg: no QoS range; the join classes: their band is fixed
    assert set(fixed) == {"agg", "j_eu", "j_vc", "o_left", "ja"} and "join class" in fixed["j_vc"]
    # ... and the policies see each join's class, with no QoS range (the pipes plugin costs the class once)
    plans = g.member_plans()
    assert {n: (plans[n]["slice_class"], plans[n]["qos"]) for n in ("j_eu", "j_y", "j_vc")} == {
        "j_eu": ("j_eu", {}), "j_y": ("j_eu", {}), "j_vc": ("j_vc", {})}
    with pytest.raises(ValueError, match="'j_new'.*cannot join a running group"):
        g.add("j_new", JQ["j_eu"].replace("DSTREAM", "ISTREAM"), sink=os.path.join(tmp_dir, "out", "x"))
    with pytest.raises(ValueError, match="'r_new'.*a ROWS window cannot join a running group"):
        g.add("r_new", JQ["r_pg"].replace("ROWS 3", "ROWS 4"), sink=os.path.join(tmp_dir, "out", "r_new"))
    with pytest.raises(ValueError, match="'o_new'.*cannot join a running group"):
        g.add("o_new", JQ["o_left"].replace("ISTREAM", "DSTREAM"), sink=os.path.join(tmp_dir, "out", "z"))
    write_clicks(cdir + "_more", files=3, rows=200)      # the same generator: its third file
    os.replace(os.path.join(cdir + "_more", "part-02.parquet"), os.path.join(cdir, "part-02.parquet"))
    write_join_views(vdir, files=1, rows=200, first=2)
    write_join_views(bdir, files=1, rows=100, seed=29, first=2)
    g = run()                                             # a new group on the same checkpoint
    for name in queries:
        n = assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)),
                             spark.read.parquet(os.path.join(tmp_dir, "alone", name)), name)
        assert n > 0, name
    assert spark.read.parquet(os.path.join(tmp_dir, "out", "o_left")).filter("vts IS NULL").count() > 0  # padded
    assert cq.read_metrics(g, "r_pg", "total")["late_rows"] > 0
    totals = cq.read_metrics(g, "j_y", "total")
    assert totals["state_rows"] == 0 and cq.read_metrics(g, "j_eu", "total")["input_rows"] > 0


def test_a_checkpoint_keeps_its_join_classes():
    """A restart with a join class of other widest windows is refused, listing both; the same classes pass."""
    from pyspark_cq.group import doc as D
    from pyspark_cq.group.api import _join_classes, check_join_layout
    from pyspark_cq.group.worker import join_class_id

    a, b = jm(10, 20), jm(30, 5)
    specs = [SimpleNamespace(kind="join", join=a, name="a"), SimpleNamespace(kind="join", join=b, name="b")]
    classes = _join_classes(specs)
    cid = join_class_id(a.signature())
    assert list(classes) == [cid] and [s.name for s in classes[cid]] == ["a", "b"]
    previous = D.Plan(catalogue={"__joins__": {cid: (SimpleNamespace(window=(30 * S, 20 * S), n_keys=1),
                                                     ("clicks", "views"))}})
    check_join_layout("g", "ck", previous, classes)
    check_join_layout("g", "ck", None, classes)
    with pytest.raises(ValueError, match="other join classes"):
        check_join_layout("g", "ck", previous, _join_classes(specs[:1]))   # widest windows (10 s, 20 s) now


@pytest.mark.spark
def test_inner_join_member_runs_at_the_watermark_of_the_rows_its_where_keeps(spark, tmp_dir):
    """Alone, Spark pushes ``c.region = 'eu'`` below the clicks' watermark: the join's watermark comes from the eu
    clicks. A us click and a view 10 minutes ahead put the stream's watermark past the eu click of the second
    micro-batch (the third: a micro-batch drops rows by the watermark of the one before); alone (and in the group, whose class keeps the eu clicks' clock) it is not late and pairs with its
    view; the member without the WHERE drops it as late, alone and in the group (issue 40)."""
    from helpers.files import write_in_order
    from test_query_group import SCHEMA, assert_same_rows

    import pyspark_cq as cq

    cdir, vdir = os.path.join(tmp_dir, "clicks"), os.path.join(tmp_dir, "views")
    os.makedirs(cdir)
    os.makedirs(vdir)

    def write(directory, f, rows, cols):
        table = {"ts": pa.array([T0 + t * S for t, *_ in rows], pa.timestamp("us", tz="UTC"))}
        for i, (name, typ) in enumerate(cols):
            table[name] = pa.array([r[i + 1] for r in rows], typ)
        write_in_order(pa.table(table), os.path.join(directory, f"part-{f:02d}.parquet"), f)

    ccols = (("page", pa.string()), ("region", pa.string()), ("x", pa.int64()))
    vcols = (("page", pa.string()), ("x", pa.int64()), ("y", pa.int64()))
    write(cdir, 0, [(0, "a", "eu", 1), (60, "a", "eu", 2), (600, "b", "us", 3)], ccols)
    write(cdir, 1, [(601, "b", "us", 5)], ccols)
    write(cdir, 2, [(100, "a", "eu", 4), (101, "b", "us", 4)], ccols)
    write(vdir, 0, [(10, "a", 1, 10), (700, "a", 9, 90)], vcols)
    write(vdir, 1, [(701, "a", 8, 80)], vcols)
    write(vdir, 2, [(100, "a", 4, 40)], vcols)

    def sources():
        return {"clicks": spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(cdir)
                .withWatermark("ts", "1 minute"),
                "views": spark.readStream.schema(VIEWS).option("maxFilesPerTrigger", 1).parquet(vdir)
                .withWatermark("ts", "30 seconds")}

    base = "ISTREAM(SELECT c.x, c.region, v.y FROM clicks c [RANGE 1 MINUTE] JOIN views v [RANGE 1 MINUTE] ON c.x = v.x"
    texts = {"eu": base + " WHERE c.region = 'eu')", "all": base + ")"}
    g = cq.QueryGroup(spark, sources=sources(), checkpoint=os.path.join(tmp_dir, "ck"), shards=2)
    for name, text in texts.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
    run_beside_alone(spark, g, texts, sources(), tmp_dir)
    assert g.queries["eu"]["join_class"] != g.queries["all"]["join_class"]
    got = {}
    for name in texts:
        assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)),
                         spark.read.parquet(os.path.join(tmp_dir, "alone", name)), name)
        got[name] = {tuple(r)[:3] for r in spark.read.parquet(os.path.join(tmp_dir, "out", name)).collect()}
    assert (4, "eu", 40) in got["eu"] and (4, "eu", 40) not in got["all"]


@pytest.mark.spark
def test_a_join_of_three_streams_does_not_hold_back_the_shared_members_watermark(spark, tmp_dir):
    """Spark's query watermark is the minimum over the withWatermark of every stream of the query: a multi_join
    member's views and buys would hold a one-stream shared stage over clicks at their watermark. A last clicks file
    8 minutes ahead of the others: alone, the count closes its windows up to it; in the group too (the group then
    runs on its clock, each stream's watermark its own). And a join of three with a predicate on a time column is
    refused with the query's name."""
    from test_query_group import assert_same_rows, clicks_stream, write_clicks

    import pyspark_cq as cq

    dirs = {s: os.path.join(tmp_dir, s) for s in ("clicks", "views", "buys")}
    write_clicks(dirs["clicks"], files=3, rows=200)
    write_join_views(dirs["views"], files=2, rows=200)
    write_join_views(dirs["buys"], files=2, rows=100, seed=29)
    texts = {"all_1m": "RSTREAM(SELECT page, COUNT(*) AS n FROM clicks [RANGE 1 MINUTE SLIDE 30 SECONDS] GROUP BY page)",
             "m3": M3}

    def sources():
        def other(s):
            return spark.readStream.schema(VIEWS).option("maxFilesPerTrigger", 1).parquet(dirs[s]).withWatermark(
                "ts", "10 seconds")
        return {"clicks": clicks_stream(spark, dirs["clicks"]), "views": other("views"), "buys": other("buys")}

    g = cq.QueryGroup(spark, sources=sources(), checkpoint=os.path.join(tmp_dir, "ck"))
    for name, text in texts.items():
        g.add(name, text, sink=os.path.join(tmp_dir, "out", name))
    # Spark keeps a predicate on the time column above the stream's withWatermark (its query alone takes the
    # watermark from every row of the stream), the member's stage would see only the rows that pass it: refused
    # (a LEFT JOIN of three: tests/test_query_group.py)
    with pytest.raises(ValueError, match="query 'tj': .*time column of c"):
        g.add("tj", M3.replace("v.y >= b.y", "c.ts IS NOT NULL"), sink=os.path.join(tmp_dir, "out", "tj"))
    assert list(g.queries) == list(texts)
    run_beside_alone(spark, g, texts, sources(), tmp_dir)
    for name in texts:
        assert assert_same_rows(spark.read.parquet(os.path.join(tmp_dir, "out", name)),
                                spark.read.parquet(os.path.join(tmp_dir, "alone", name)), name) > 0
