"""interval_join / window_join driven by a control table (PIPES §4.2 per-element bounds) and load shedding.

Kernel level: per-row bounds and expiry keys against a plain-Python reference of "the earlier element's
bounds decide", with eviction at random watermarks (no evicted row could have matched later input).
Spark level: bound / window changes at an event time inside the stream, a change made while a query
runs (reaches it within two micro-batches), and deterministic load shedding with ``shed_rows``.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import pyarrow as pa
import pytest
from helpers.files import write_in_order
from hypothesis import given, settings
from hypothesis import strategies as st

import pyspark_cq
from pyspark_cq._native import load
from pyspark_cq.control import ControlHandle, ControlTable
from pyspark_cq.operators._common.codec import encode_keys
from pyspark_cq.operators.join.worker import LEFT, RIGHT, JoinWorker, evict_at_ms, shed_mask, state_watermarks

join = load("_join")
S = 1_000_000
BASE_US = 1_700_000_000_000_000


# --- kernel: per-row bounds, earlier element decides ----------------------------------------------------


def _bounds_fn(schedule):
    """schedule: [(at, lower, upper), ...] with ascending at; the first applies since always."""
    def bounds(t):
        lo, up = schedule[0][1], schedule[0][2]
        for at, a, b in schedule[1:]:
            if t >= at:
                lo, up = a, b
        return lo, up
    return bounds


def _matches(bounds, lt, rt):
    lo, up = bounds(min(lt, rt))
    return lo <= rt - lt <= up


def _keys(keys):
    offsets, data, _ = encode_keys([pa.array(keys, type=pa.string())], join.concat_keys)
    return offsets, data


def _reach(side, lo, up):
    return up if side == LEFT else -lo


# Piecewise-constant bounds: the first point applies since always; one-sided and empty bands included.
schedules = st.lists(st.tuples(st.integers(1, 40), st.integers(-15, 6), st.integers(-6, 15)), min_size=1,
                     max_size=4).map(lambda pts: [(None,) + pts[0][1:]] + sorted(pts[1:]))
events = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 1),
              st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 25)), max_size=8)),
    st.tuples(st.just("watermark"), st.just(0), st.integers(0, 15)),
    st.tuples(st.just("roundtrip"), st.just(0), st.just(None))), max_size=25)


@settings(max_examples=250, deadline=None)
@given(schedules, events)
def test_kernel_earlier_element_decides_and_eviction_is_safe(schedule, steps):
    bounds = _bounds_fn(schedule)
    kernel = join.JoinState(-3, 3)
    rows = ([], [])       # reference state per side: [key, t, id, lo, up]
    ghosts = ([], [])     # evicted rows: must never match any later input
    wm, next_id = 0, 0
    for op, side, arg in steps:
        if op == "insert":
            keys = [k for k, _ in arg]
            times = [wm + dt for _, dt in arg]        # never late: t > watermark
            lo = [bounds(t)[0] for t in times]
            up = [bounds(t)[1] for t in times]
            # Expiry key: the row's own end, but never before the watermark passes its time (guard).
            ends = [max(t + _reach(side, a, b), t) for t, a, b in zip(times, lo, up)]
            ids = list(range(next_id, next_id + len(arg)))
            next_id += len(arg)
            offsets, data = _keys(keys)
            idx, other = kernel.insert_probe(side, offsets, data, None, np.array(times, np.int64),
                                             np.array(ids, np.int64), lower=np.array(lo, np.int64),
                                             upper=np.array(up, np.int64), ends=np.array(ends, np.int64))
            got = sorted(zip(idx.tolist(), other.tolist()))
            expected = []
            for i, (k, t) in enumerate(zip(keys, times)):
                for r in rows[1 - side]:
                    lt, rt = (t, r[1]) if side == LEFT else (r[1], t)
                    if r[0] == k and _matches(bounds, lt, rt):
                        expected.append((i, r[2]))
                for g in ghosts[1 - side]:
                    lt, rt = (t, g[1]) if side == LEFT else (g[1], t)
                    assert not (g[0] == k and _matches(bounds, lt, rt)), "an evicted row would have matched"
            assert got == sorted(expected)
            for k, t, i, a, b, e in zip(keys, times, ids, lo, up, ends):
                rows[side].append([k, t, i, a, b, e])
        elif op == "watermark":
            wm += arg
            for s in (LEFT, RIGHT):
                gone, _ = kernel.evict(s, wm)
                expected = sorted(r[2] for r in rows[s] if r[5] <= wm)
                assert sorted(gone.tolist()) == expected
                ghosts[s].extend(r for r in rows[s] if r[5] <= wm)
                rows[s][:] = [r for r in rows[s] if r[5] > wm]
        else:
            kernel = join.JoinState.deserialize(kernel.serialize())
        for s in (LEFT, RIGHT):
            assert kernel.rows(s) == len(rows[s])
            assert kernel.min_end(s) == (min(r[5] for r in rows[s]) if rows[s] else None)


@settings(max_examples=300, deadline=None)
@given(st.integers(-10**7, 10**7), st.integers(-10**7, 0), st.integers(0, 10**7), st.integers(0, 1),
       st.integers(-10**4, 10**4), st.booleans())
def test_evict_at_ms_is_the_smallest_evicting_watermark(t, lower, upper, side, wm, guard):
    t = BASE_US + t
    wm = BASE_US // 1000 + wm
    at = int(evict_at_ms(np.array([t]), lower, upper, side, guard=guard)[0])
    evicts = t <= state_watermarks(wm, lower, upper)[side] and (not guard or t <= wm * 1000)
    assert (at <= wm) == evicts


def _columns(blob: bytes) -> list[bytes]:
    ncols = struct.unpack_from("<I", blob, 4)[0]
    pos, cols = 8, []
    for _ in range(ncols):
        code, size, n = struct.unpack_from("<BBQ", blob, pos)
        cols.append(blob[pos:pos + 10 + size * n])
        pos += 10 + size * n
    return cols


def _to_format_2(blob: bytes) -> bytes:
    """A format-3 join blob rewritten as format 2 (payload ids and expiry keys stored as they are)."""
    cols = _columns(blob)
    assert len(cols) == 1 + 2 * 9
    meta = bytearray(cols[0])
    struct.pack_into("<q", meta, 10, 2)
    cols[0] = bytes(meta)
    for base in (1, 10):  # per side: klen, kdata, count, times, ids, flags, los, ups, ends
        times = np.frombuffer(cols[base + 3][10:], np.int64)
        ids = np.cumsum(np.frombuffer(cols[base + 4][10:], np.int64)) - 1
        ends = times + np.frombuffer(cols[base + 8][10:], np.int64)
        cols[base + 4] = cols[base + 4][:10] + ids.tobytes()
        cols[base + 8] = cols[base + 8][:10] + ends.tobytes()
    return b"CQS1" + struct.pack("<I", len(cols)) + b"".join(cols)


def _strip_to_format_1(blob: bytes) -> bytes:
    """A format-3 join blob rewritten as format 1 (no per-row bounds and expiry keys)."""
    cols = _columns(_to_format_2(blob))
    meta = bytearray(cols[0])
    struct.pack_into("<q", meta, 10, 1)
    keep = [bytes(meta)] + cols[1:7] + cols[10:16]
    return b"CQS1" + struct.pack("<I", len(keep)) + b"".join(keep)


def test_format_2_state_restores_the_same_rows():
    kernel = join.JoinState(-2_000_000, 3_000_000)
    offsets, data = _keys(["a", "b", "a", "c"])
    times = np.array([BASE_US, BASE_US + 500, BASE_US + 7, BASE_US - 3], np.int64)
    ends = np.array([BASE_US + 10, np.iinfo(np.int64).max, BASE_US, np.iinfo(np.int64).min + 1], np.int64)
    for side in (LEFT, RIGHT):
        kernel.insert_probe(side, offsets, data, None, times, np.array([9, 4, 7, 0]) + side, ends=ends)
    blob = kernel.serialize()
    old = join.JoinState.deserialize(_to_format_2(blob))
    assert old.restored_format == 2 and join.JoinState.deserialize(blob).restored_format == 3
    for side in (LEFT, RIGHT):
        assert old.min_end(side) == kernel.min_end(side)
        got, want = old.evict(side, np.iinfo(np.int64).max), kernel.evict(side, np.iinfo(np.int64).max)
        assert sorted(zip(*(a.tolist() for a in got))) == sorted(zip(*(a.tolist() for a in want)))


def test_format_1_state_is_restored_with_recomputed_expiry():
    kernel = join.JoinState(-2_000_000, 3_000_000)
    offsets, data = _keys(["a", "b"])
    times = np.array([BASE_US, BASE_US + 500], np.int64)
    for side in (LEFT, RIGHT):
        kernel.insert_probe(side, offsets, data, None, times, np.arange(2))
    old = join.JoinState.deserialize(_strip_to_format_1(kernel.serialize()))
    assert old.restored_format == 1 and old.rows(LEFT) == 2 and old.min_end(LEFT) == BASE_US
    worker = JoinWorker(None)
    restored = worker._kernel(_strip_to_format_1(kernel.serialize()))
    for side in (LEFT, RIGHT):
        assert restored.min_end(side) == int(evict_at_ms(times, -2_000_000, 3_000_000, side).min())
    assert join.JoinState.deserialize(restored.serialize()).restored_format == join.FORMAT_VERSION == 3
    bad = bytearray(kernel.serialize())
    struct.pack_into("<q", bad, 18, 7)
    with pytest.raises(ValueError, match="new checkpoint"):
        join.JoinState.deserialize(bytes(bad))


def test_shed_mask_is_deterministic_and_binomial():
    rng = np.random.default_rng(3)
    n = 4000
    table = pa.table({"k": pa.array(rng.integers(0, 50, n)), "v": pa.array(rng.normal(size=n))})
    micros = BASE_US + np.arange(n, dtype=np.int64) * 1000
    drop = shed_mask(table, micros, LEFT, 7, 0.5)
    assert np.array_equal(drop, shed_mask(table, micros, LEFT, 7, 0.5))
    assert abs(int(drop.sum()) - n // 2) < 5 * np.sqrt(n * 0.25)          # binomial, 5 sigma
    assert not np.array_equal(drop, shed_mask(table, micros, LEFT, 8, 0.5))  # the seed matters
    assert not np.array_equal(drop, shed_mask(table, micros, RIGHT, 7, 0.5))
    assert not shed_mask(table, micros, LEFT, 7, 0.0).any()
    # A row's decision does not depend on the other rows of its batch (restarts, other batch splits).
    assert np.array_equal(shed_mask(table.slice(100, 50), micros[100:150], LEFT, 7, 0.5), drop[100:150])
    small = shed_mask(table, micros, LEFT, 7, 0.1)
    assert abs(int(small.sum()) - n // 10) < 5 * np.sqrt(n * 0.09)
    assert not (small & ~drop).any()      # a smaller ratio drops a subset of the rows


# --- Spark ----------------------------------------------------------------------------------------------


def _write(root, side, i, keys, times, values):
    os.makedirs(os.path.join(root, side), exist_ok=True)
    table = pa.table({"k": pa.array(keys, pa.int64()),
                      "ts": pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                      f"{side}v": pa.array(values, pa.int64())})
    path = os.path.join(root, side, f"b{i:03d}.parquet")
    write_in_order(table, path, i)  # file order = batch order


def _source(spark, root, side, delay="30 seconds"):
    return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, side)).withWatermark("ts", delay))


def _random_files(root, files, rows, seed):
    """Files of both sides; file i spans [10 s·i − 5 s, 10 s·(i + 1)): out of order, never late."""
    rng = np.random.default_rng(seed)
    data = {"l": [], "r": []}
    for i in range(files):
        for side in ("l", "r"):
            keys = rng.integers(0, 4, rows).tolist()
            times = (BASE_US + i * 10 * S + rng.integers(-5_000, 10_000, rows) * 1000).tolist()
            values = list(range(len(data[side]), len(data[side]) + rows))
            _write(root, side, i, keys, times, values)
            data[side] += list(zip(keys, times, values))
    return data


def _collect(df, *cols):
    from pyspark.sql import functions as F

    exprs = [F.unix_micros(c).alias(c) if c.startswith(("ts", "valid")) else F.col(c) for c in cols]
    return sorted(tuple(r) for r in df.select(*exprs).collect())


@pytest.mark.slow
def test_bound_and_window_changes_at_an_event_time(spark, tmp_dir):
    root = str(tmp_dir / "in")
    data = _random_files(root, files=5, rows=25, seed=21)
    at = BASE_US + 30 * S
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("ij1", lower="-3 seconds", upper="5 seconds")
    table.set("ij1", lower="-6 seconds", upper="2 seconds", at=at, reason="test")
    table.register("wj1", window="4 seconds")
    table.set("wj1", window="7 seconds", at=at, reason="test")

    ij = pyspark_cq.interval_join(_source(spark, root, "l"), _source(spark, root, "r"), "k", "ts", "ts",
                                  "-1 second", "1 second", suffixes=("_l", "_r"), control=table.handle("ij1"))
    wj = pyspark_cq.window_join(_source(spark, root, "l"), _source(spark, root, "r"), "k", "ts", "ts",
                                "4 seconds", "3 seconds", suffixes=("_l", "_r"), control=table.handle("wj1"))
    queries = [df.writeStream.format("memory").queryName(name).trigger(availableNow=True)
               .option("checkpointLocation", str(tmp_dir / name)).start()
               for df, name in ((ij, "ctl_ij"), (wj, "ctl_wj"))]
    for q in queries:
        q.awaitTermination()

    bounds = _bounds_fn([(None, -3 * S, 5 * S), (at, -6 * S, 2 * S)])
    expected = sorted((kl, tl, lv, tr, rv) for kl, tl, lv in data["l"] for kr, tr, rv in data["r"]
                      if kl == kr and _matches(bounds, tl, tr))
    assert _collect(spark.table("ctl_ij"), "k", "ts_l", "lv", "ts_r", "rv") == expected
    assert any(tr - tl > 2 * S for _, tl, _, tr, _ in expected)     # the old band still applies before `at`
    assert any(tr - tl < -3 * S for _, tl, _, tr, _ in expected)    # the new band applies from `at` on

    def w(t):
        return 4 * S if t < at else 7 * S
    expected = sorted((kl, tl, lv, tr, rv, max(tl, tr), min(tl + w(tl), tr + w(tr)))
                      for kl, tl, lv in data["l"] for kr, tr, rv in data["r"]
                      if kl == kr and tl < tr + w(tr) and tr < tl + w(tl))
    assert _collect(spark.table("ctl_wj"), "k", "ts_l", "lv", "ts_r", "rv", "valid_from", "valid_to") == expected
    assert any(pyspark_cq.read_metrics(p, "ij1") for p in queries[0].recentProgress)  # under the operator id


@pytest.mark.slow
def test_change_reaches_a_running_query_within_two_batches(spark, tmp_dir):
    """Issue 6 acceptance: after batch k the entry changes; from batch k + 2 on the new bound holds."""
    root, keys, k = str(tmp_dir / "in"), list(range(5)), 1
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("join1", upper="2 seconds")
    handle = table.handle("join1")

    def write_file(i):
        t = BASE_US + i * 20 * S     # per key: a right row 1 s after the left row (always matches) and
        _write(root, "l", i, keys, [t] * len(keys), [i] * len(keys))          # one 4 s after (new bound only)
        _write(root, "r", i, keys * 2, [t + S] * len(keys) + [t + 4 * S] * len(keys), [i] * 2 * len(keys))

    write_file(0)
    df = pyspark_cq.interval_join(_source(spark, root, "l", "10 seconds"), _source(spark, root, "r", "10 seconds"),
                                  "k", "ts", "ts", "-2 seconds", "2 seconds", suffixes=("_l", "_r"),
                                  control=handle)
    q = (df.writeStream.format("memory").queryName("ctl_running")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    try:
        per_file = []
        for i in range(4):
            if i:
                write_file(i)
            q.processAllAvailable()
            if i == k:   # after batch k: widen the band for the event times of the next file on
                table.set("join1", upper="6 seconds", at=BASE_US + (k + 1) * 20 * S, reason="issue 6")
        out = spark.table("ctl_running").groupBy("lv").count().collect()
        per_file = {r["lv"]: r["count"] for r in out}
        reports = [pyspark_cq.read_metrics(p, "join1") for p in q.recentProgress]
    finally:
        q.stop()
    assert [per_file.get(i, 0) for i in range(4)] == [5, 5, 10, 10]   # files 0..k old band, then new
    assert any(r for r in reports)


@pytest.mark.slow
def test_load_shedding_accounts_for_every_row_and_is_reproducible(spark, tmp_dir):
    root, n, files = str(tmp_dir / "in"), 120, 3
    for i in range(files):
        t = BASE_US + i * 20 * S
        ids = list(range(i * n, (i + 1) * n))
        for side in ("l", "r"):     # unique keys: each left row has exactly one partner at the same time
            _write(root, side, i, ids, [t + j * 1000 for j in range(n)], ids)
    for side in ("l", "r"):         # far-future rows push the watermark past everything else
        _write(root, side, files, [-1], [BASE_US + 3600 * S], [-1])
    total = 2 * (files * n + 1)

    def query(name):
        df = pyspark_cq.interval_join(_source(spark, root, "l", "5 seconds"), _source(spark, root, "r", "5 seconds"),
                                      "k", "ts", "ts", "0 seconds", "0 seconds", how="full",
                                      suffixes=("_l", "_r"), drop_ratio=0.5, seed=42, name=f"shed_{name}")
        return (df.writeStream.format("memory").queryName(name).trigger(availableNow=True)
                .option("checkpointLocation", str(tmp_dir / name)).start())

    queries = [query("shed_a"), query("shed_b")]
    for q in queries:
        q.awaitTermination()
    rows = _collect(spark.table("shed_a"), "k", "lv", "rv")
    assert rows == _collect(spark.table("shed_b"), "k", "lv", "rv")           # same seed, same output
    reports = [r for r in (pyspark_cq.read_metrics(p, "shed_shed_a") for p in queries[0].recentProgress) if r]
    shed = sum(r["shed_rows"] for r in reports)
    kept_left = {lv for k, lv, _ in rows if lv is not None and k >= 0}
    kept_right = {rv for k, _, rv in rows if rv is not None and k >= 0}
    # Every row is shed or joined (matched or emitted unmatched), except the far-future rows, which stay
    # in the state: both kept when they paired, else at most one of them.
    kept_sentinels = total - shed - len(kept_left) - len(kept_right)
    assert kept_sentinels == 2 if any(k == -1 for k, _, _ in rows) else kept_sentinels in (0, 1)
    assert sum(r["input_rows"] for r in reports) == total
    sigma = np.sqrt(files * n * 0.25)
    for kept in (kept_left, kept_right):
        assert abs(len(kept) - files * n / 2) < 5 * sigma
    # A pair survives only when both rows do.
    assert all((lv is None) != (rv is None) or lv == rv for _, lv, rv in rows)


@pytest.mark.slow
def test_per_input_drop_ratios_from_the_argument_or_the_control_entry(spark, tmp_dir):
    """RTStream §4.4: each input shed by its own ratio. The control entry's ``params["drop_left"]`` /
    ``["drop_right"]`` override its ``drop_ratio`` per input and shed exactly the rows the argument pair
    ``drop_ratio=(left, right)`` sheds, in a stream and in a batch (the decision hashes the row, not its
    batch); ``shed_rows_left`` / ``shed_rows_right`` count them; ``kept_column`` is ε_left·ε_right."""
    from pyspark.sql import functions as F

    root, n, files, ratios = str(tmp_dir / "in"), 120, 3, (0.1, 0.7)
    for i in range(files):
        ids = list(range(i * n, (i + 1) * n))
        for side in ("l", "r"):     # unique keys: each left row has exactly one partner at the same time
            _write(root, side, i, ids, [BASE_US + i * 20 * S + j * 1000 for j in range(n)], ids)
    for side in ("l", "r"):         # far-future rows push the watermark past everything else
        _write(root, side, files, [-1], [BASE_US + 3600 * S], [-1])
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("pj", drop_ratio=0.5, params={"drop_left": ratios[0], "drop_right": ratios[1]})

    def join(left, right, **kw):
        return pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "0 seconds", how="full",
                                        suffixes=("_l", "_r"), seed=42, kept_column="kept", **kw)

    def query(name, **kw):
        df = join(_source(spark, root, "l", "5 seconds"), _source(spark, root, "r", "5 seconds"), name=name, **kw)
        return (df.writeStream.format("memory").queryName(name).trigger(availableNow=True)
                .option("checkpointLocation", str(tmp_dir / name)).start())

    queries = [query("pj_ctl", control=table.handle("pj")), query("pj_arg", drop_ratio=ratios)]
    for q in queries:
        q.awaitTermination()
    batch = join(*(spark.read.schema(f"k long, ts timestamp, {s}v long").parquet(os.path.join(root, s))
                   for s in ("l", "r")), drop_ratio=ratios)
    everything = _collect(batch, "k", "lv", "rv", "kept")            # batch: every kept row is emitted
    rows = _collect(spark.table("pj_ctl"), "k", "lv", "rv", "kept")
    assert rows == _collect(spark.table("pj_arg"), "k", "lv", "rv", "kept")
    assert rows == [r for r in everything if r[0] >= 0]          # the sentinels stay in the streams' state
    kept = [{r[1 + s] for r in everything if r[1 + s] is not None} for s in (0, 1)]
    reports = [r for r in (pyspark_cq.read_metrics(p, "pj_ctl") for p in queries[0].recentProgress) if r]
    for s, side in enumerate(("left", "right")):
        assert sum(r[f"shed_rows_{side}"] for r in reports) == files * n + 1 - len(kept[s])
        sigma = np.sqrt(files * n * ratios[s] * (1 - ratios[s]))
        assert abs(len(kept[s]) - files * n * (1 - ratios[s])) < 5 * sigma
    assert sum(r["shed_rows"] for r in reports) == 2 * (files * n + 1) - len(kept[0]) - len(kept[1])
    # a pair survives only when both rows do; ε_left·ε_right for a pair, ε of its side for a lonely row
    for _, lv, rv, eps in rows:
        assert (lv in kept[0] and rv in kept[1]) if lv is not None and rv is not None else True
        assert eps == pytest.approx((1 - ratios[0]) ** (lv is not None) * (1 - ratios[1]) ** (rv is not None))
    assert {lv for _, lv, rv, _ in rows if lv is not None and rv is not None} == kept[0] & kept[1] - {-1}
    assert batch.select(F.col("kept")).distinct().count() == 3


def test_bad_control_arguments_are_named(spark, tmp_dir):
    from pyspark.sql import functions as F

    left = spark.createDataFrame([(1, 0)], "k long, t long").withColumn("ts", F.timestamp_seconds("t"))
    right = spark.createDataFrame([(1, 0)], "k long, t long").withColumn("ts", F.timestamp_seconds("t"))

    def call(**kw):
        return pyspark_cq.interval_join(left, right, "k", "ts", "ts", "-1 second", "1 second",
                                        suffixes=("_l", "_r"), **kw)

    with pytest.raises(TypeError, match="control must be a pyspark_cq.control.ControlHandle"):
        call(control=str(tmp_dir / "control.json"))
    for ratio in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"drop_ratio must be in \[0, 1\)"):
            call(drop_ratio=ratio)
    with pytest.raises(TypeError, match="drop_ratio must be a real number"):
        call(drop_ratio="half")
    with pytest.raises(ValueError, match=r"drop_ratio\[1\] \(right\) must be in \[0, 1\)"):
        call(drop_ratio=(0.2, 1.0))
    with pytest.raises(ValueError, match=r"a \(left, right\) pair"):
        call(drop_ratio=(0.2, 0.3, 0.4))
    for seed in (1.5, True, "1"):
        with pytest.raises(TypeError, match="seed must be an int"):
            call(seed=seed)
    with pytest.raises(TypeError, match="control must be"):
        pyspark_cq.window_join(left, right, "k", "ts", "ts", "1 second", "1 second", suffixes=("_l", "_r"),
                               control=ControlTable(str(tmp_dir / "c2.json")))
    handle = ControlHandle(str(tmp_dir / "c3.json"), "op7")
    assert call(control=handle, drop_ratio=0.25, seed=np.int64(3)) is not None


@pytest.mark.slow
def test_kept_column_is_the_product_of_each_rows_batch_fraction(spark, tmp_dir):
    """RTStream §4.4's kept fraction per result: a pair of a left row of batch i and a right row of batch
    i + 1 says ε_i · ε_(i+1), each ε = 1 − the drop ratio in force in that batch (changed between batches)."""
    root, n, ratios = str(tmp_dir / "in"), 60, [0.0, 0.5, 0.25, 0.0]
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register("kj", drop_ratio=ratios[0])

    def write_file(i):   # left rows of batch i pair with the right rows of batch i + 1 (1 s later)
        t = BASE_US + i * 20 * S
        _write(root, "l", i, list(range(i * n, (i + 1) * n)), [t] * n, [i] * n)
        prev = list(range((i - 1) * n, i * n)) if i else [-1]
        _write(root, "r", i, prev, [t - 20 * S + S] * len(prev), [i] * len(prev))

    write_file(0)
    df = pyspark_cq.interval_join(_source(spark, root, "l"), _source(spark, root, "r"), "k", "ts", "ts",
                                  "0 seconds", "2 seconds", suffixes=("_l", "_r"), control=table.handle("kj"),
                                  kept_column="kept")
    assert df.columns[-1] == "kept" and dict(df.dtypes)["kept"] == "double"
    q = (df.writeStream.format("memory").queryName("kept_join")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    try:
        for i, ratio in enumerate(ratios):
            if i:
                table.set("kj", drop_ratio=ratio, reason="test")
                write_file(i)
            q.processAllAvailable()
        rows = spark.table("kept_join").select("lv", "rv", "kept").collect()
    finally:
        q.stop()
    assert rows, "no pair survived the shedding"
    for r in rows:
        assert r["rv"] == r["lv"] + 1
        assert r["kept"] == pytest.approx((1 - ratios[r["lv"]]) * (1 - ratios[r["rv"]]))
    assert {r["lv"] for r in rows} == {0, 1, 2}


def test_kept_column_on_batch_outer_and_semi_joins(spark):
    from pyspark.sql import functions as F

    left = spark.range(200).select(F.col("id").alias("k"), F.timestamp_seconds(F.col("id")).alias("ts"),
                                   F.col("id").alias("lv"))
    right = spark.range(100, 300).select(F.col("id").alias("k"), F.timestamp_seconds(F.col("id")).alias("ts"),
                                         F.col("id").alias("rv"))
    out = pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "0 seconds", how="full",
                                   suffixes=("_l", "_r"), drop_ratio=0.3, kept_column="kept").collect()
    pairs = [r for r in out if r["lv"] is not None and r["rv"] is not None]
    lonely = [r for r in out if (r["lv"] is None) != (r["rv"] is None)]
    assert pairs and lonely
    assert all(r["kept"] == pytest.approx(0.49) for r in pairs)
    assert all(r["kept"] == pytest.approx(0.7) for r in lonely)
    plain = pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "0 seconds", how="left_semi",
                                     kept_column="kept").collect()
    assert plain and all(r["kept"] == 1.0 for r in plain) and len(plain) == 100
    with pytest.raises(ValueError, match="kept_column must be a new column name"):
        pyspark_cq.interval_join(left, right, "k", "ts", "ts", "0 seconds", "0 seconds", suffixes=("_l", "_r"),
                                 kept_column="lv")
    with pytest.raises(ValueError, match="kept_column must be a new column name"):
        pyspark_cq.window_join(left, right, "k", "ts", "ts", "1 second", "1 second", suffixes=("_l", "_r"),
                               kept_column="valid_to")
