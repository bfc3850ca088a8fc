"""The sliding-aggregation kernels and worker pipeline without Spark, against plain-Python references.

Rows go through the real map-side slicer and the real per-shard step (``run_shard``), batch by batch,
with the state serialized between batches exactly as in ``applyInPandasWithState``; only Spark itself
is replaced (its watermarks are computed as Spark computes them, see tests/helpers/aggregate_reference.py).
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from helpers import aggregate_reference as R
from helpers.aggregate_pipeline import (
    ALL_AGGS,
    K,
    agg_list,
    arrival_order,
    assert_same,
    floats,
    input_batch,
    make_plan,
    rows_of,
    rows_st,
    run_stream,
    slice_rows,
    split_batches,
    stream_st,
    values,
    window_slide,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from pyspark_cq.operators._common import state_bytes as _state_bytes
from pyspark_cq.operators._common.shards import shard_key_values, shard_keys
from pyspark_cq.operators.aggregate import slicer as A
from pyspark_cq.operators.aggregate import spec as S
from pyspark_cq.operators.aggregate.config import KHASH, SHARD, SLICES, partial_name
from pyspark_cq.operators.aggregate.shard import run_shard


def test_codes_match_the_compiled_module():
    assert (S.OP_ROWS, S.OP_COUNT, S.OP_SUM_I, S.OP_SUM_F) == (K.OP_ROWS, K.OP_COUNT, K.OP_SUM_I, K.OP_SUM_F)
    assert (S.OP_MIN_I, S.OP_MIN_F, S.OP_MAX_I, S.OP_MAX_F) == (K.OP_MIN_I, K.OP_MIN_F, K.OP_MAX_I, K.OP_MAX_F)
    assert (S.KIND_ADD_I64, S.KIND_ADD_F64, S.KIND_MIN, S.KIND_MAX) == (
        K.KIND_ADD_I64, K.KIND_ADD_F64, K.KIND_MIN, K.KIND_MAX)
    assert (S.OUT_COUNT, S.OUT_SUM_I, S.OUT_SUM_F, S.OUT_AVG_I, S.OUT_AVG_F, S.OUT_MIN, S.OUT_MAX) == (
        K.OUT_COUNT, K.OUT_SUM_I, K.OUT_SUM_F, K.OUT_AVG_I, K.OUT_AVG_F, K.OUT_MIN, K.OUT_MAX)


def spark_order(x: float):
    return (1, 0.0) if math.isnan(x) else (0, x)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=50))
def test_double_order_keys_follow_spark_ordering(xs):
    keys = K.f64_keys(np.array(xs, dtype=np.float64))
    for i in range(len(xs)):
        for j in range(len(xs)):
            assert (keys[i] < keys[j]) == (spark_order(xs[i]) < spark_order(xs[j]))
    back = K.keys_f64(keys)
    for x, y in zip(xs, back):
        assert (math.isnan(x) and math.isnan(y)) or x == y
    assert keys.max() < np.iinfo(np.int64).max and keys.min() > np.iinfo(np.int64).min


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(-50, 50)), values, floats), max_size=80),
       st.sampled_from([1, 2, 5, 7]))
def test_preaggregate_matches_groupby(rows, g):
    h = np.array([r[0] for r in rows], dtype=np.int64)
    t = np.array([0 if r[1] is None else r[1] for r in rows], dtype=np.int64)
    tv = np.array([r[1] is not None for r in rows], dtype=np.uint8)
    v = np.array([0 if r[2] is None else r[2] for r in rows], dtype=np.int64)
    vv = np.array([r[2] is not None for r in rows], dtype=np.uint8)
    x = np.array([0.0 if r[3] is None else r[3] for r in rows], dtype=np.float64)
    xv = np.array([r[3] is not None for r in rows], dtype=np.uint8)
    ops = np.array([K.OP_ROWS, -1, K.OP_COUNT, 0, K.OP_SUM_I, 0, K.OP_MIN_I, 0, K.OP_MAX_I, 0,
                    K.OP_COUNT, 1, K.OP_SUM_F, 1, K.OP_MIN_F, 1, K.OP_MAX_F, 1], dtype=np.int32)
    out = K.preaggregate(h, t, tv, g, ops, [v, x], [vv, xv])
    assert out["null_time"] == sum(r[1] is None for r in rows)
    groups: dict = {}
    for r in rows:
        if r[1] is not None:
            groups.setdefault((r[0], (r[1] // g) * g), []).append(r)
    got = {}
    for i in range(len(out["hash"])):
        p = [int(c[i]) for c in out["partials"]]
        got[(int(out["hash"][i]), int(out["start"][i]))] = (
            p[0], p[1], p[2], p[3], p[4], p[5], np.int64(p[6]).view(np.float64), K.keys_f64(np.array([p[7]]))[0],
            K.keys_f64(np.array([p[8]]))[0])
        assert rows[int(out["first_row"][i])][0] == out["hash"][i]
    assert set(got) == set(groups)
    for key, members in groups.items():
        ints = [m[2] for m in members if m[2] is not None]
        fl = [m[3] for m in members if m[3] is not None]
        n, cnt, sm, mn, mx, fcnt, fsum, fmin, fmax = got[key]
        assert (n, cnt) == (len(members), len(ints))
        if ints:
            assert (sm, mn, mx) == (sum(ints), min(ints), max(ints))
        assert fcnt == len(fl)
        if fl:
            assert R.finalize([{"x": f} for f in fl], [("x", "max"), ("x", "min")]) == pytest.approx((fmax, fmin), nan_ok=True)
            assert fsum == pytest.approx(sum(fl), rel=1e-12, nan_ok=True)


# ---- the worker pipeline -----------------------------------------------------------------------------

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_st, window_slide)
def test_batch_windows_equal_spark_semantics(rows, ws):
    w, s = ws
    plan = make_plan(w, s)
    table = slice_rows(plan, rows)
    got = {}
    for shard in shard_keys(plan.shards):
        part = table.filter(pa.compute.equal(table.column(SHARD), shard))
        got.update(rows_of(run_shard(plan, part, None, None).output, plan))
    assert_same(got, R.spark_windows(rows, "t", "k", w, s, agg_list(ALL_AGGS)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_st, st.sampled_from([(12, 2, 4), (12, 3, 6), (10, 1, 5), (6, 6, 3), (8, 2, 8)]))
def test_coarser_granularity_rounds_times_down(rows, wsg):
    w, s, g = wsg
    plan = make_plan(w, s, granularity=g)
    got = {}
    table = slice_rows(plan, rows)
    for shard in shard_keys(plan.shards):
        part = table.filter(pa.compute.equal(table.column(SHARD), shard))
        got.update(rows_of(run_shard(plan, part, None, None).output, plan))
    assert_same(got, R.spark_windows(rows, "t", "k", w, s, agg_list(ALL_AGGS), granularity=g))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_st, window_slide, st.booleans())
def test_append_stream_equals_spark_semantics(data, ws, packed):
    rows, cuts, delay = data
    w, s = ws
    batches = split_batches(arrival_order(rows), cuts)
    plan = make_plan(w, s, mode="append", watermark=True)
    wms = R.watermarks(batches, "t", delay)
    outputs, metrics = run_stream(plan, batches, wms, packed=packed)
    want, late = R.spark_stream_windows(batches, "t", "k", w, s, agg_list(ALL_AGGS), delay)
    got = {}
    for out in outputs:
        assert not set(out) & set(got), "a window was emitted twice"
        got.update(out)
    assert_same(got, want)
    assert sum(m["late_rows"] for m in metrics) == late
    assert sum(m["input_rows"] for m in metrics) == len(rows)


def spark_update_reference(batches, w, s, aggs, delay):
    """Spark's update mode: per batch the windows that received a live pair, with their current value."""
    wms = R.watermarks(batches, "t", delay)
    open_, last = {}, {}
    for b, batch in enumerate(batches + [[]]):
        late_wm = wms[b - 1] if b > 0 else 0
        touched = set()
        for r in batch:
            for k in range((r["t"] - w) // s + 1, r["t"] // s + 1):
                if k * s + w > late_wm:
                    key = (k * s, k * s + w, r["k"])
                    open_.setdefault(key, []).append(r)
                    touched.add(key)
        for key in touched:
            last[key] = R.finalize(open_[key], aggs)
        for key in [x for x in open_ if x[1] <= wms[b]]:
            del open_[key]
    return last


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_st, window_slide)
def test_update_stream_last_values_equal_spark_semantics(data, ws):
    rows, cuts, delay = data
    w, s = ws
    batches = split_batches(arrival_order(rows), cuts)
    plan = make_plan(w, s, mode="update", watermark=True)
    outputs, _ = run_stream(plan, batches, R.watermarks(batches, "t", delay))
    got = {}
    for out in outputs:
        got.update(out)
    assert_same(got, spark_update_reference(batches, w, s, agg_list(ALL_AGGS), delay))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_st, st.sampled_from([(4, 1), (6, 2), (6, 3), (10, 5), (1, 1), (12, 4)]))
def test_batch_changes_equal_pipes_algorithm1(rows, wg):
    w, g = wg
    plan = make_plan(w, g, granularity=g, emit="changes")
    table = slice_rows(plan, rows)
    got = {}
    for shard in shard_keys(plan.shards):
        part = table.filter(pa.compute.equal(table.column(SHARD), shard))
        for (frm, to, key), v in rows_of(run_shard(plan, part, None, None).output, plan).items():
            got[(key, frm, to)] = v
    assert_same(got, R.pipes_changes(rows, "t", "k", w, g, agg_list(ALL_AGGS)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({"t": st.integers(0, 200), "k": st.integers(0, 5), "v": values, "x": floats}),
                max_size=60),
       st.lists(st.integers(0, 60), max_size=4), st.sampled_from([(4, 1), (6, 2), (9, 3)]))
def test_streaming_changes_emit_final_intervals_once(rows, cuts, wg):
    """In order input (no late rows): the union over batches is Algorithm 1's output up to the final
    watermark -- intervals whose following granule is final; the others stay pending."""
    w, g = wg
    rows = sorted(rows, key=lambda r: r["t"])
    batches = split_batches(rows, cuts)
    plan = make_plan(w, g, granularity=g, emit="changes", mode="append", watermark=True)
    wms = R.watermarks(batches, "t", 0)
    outputs, _ = run_stream(plan, batches, wms)
    got = {}
    for out in outputs:
        for (frm, to, key), v in out.items():
            assert (key, frm, to) not in got
            got[(key, frm, to)] = v
    want = {k: v for k, v in R.pipes_changes(rows, "t", "k", w, g, agg_list(ALL_AGGS)).items()
            if k[2] + g <= wms[-1]}
    assert_same(got, want)


def test_string_and_null_keys():
    schema = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("k", T.StringType()),
                           T.StructField("v", T.LongType())])
    rows = [{"t": 1, "k": "a", "v": 1}, {"t": 2, "k": None, "v": 2}, {"t": 2, "k": "b", "v": None},
            {"t": 9, "k": "a", "v": 4}, {"t": 3, "k": None, "v": 5}]
    aggs = {"v": ["sum"], "*": ["count"]}
    plan = make_plan(4, 2, aggs=aggs, schema=schema, shards=2)
    table = slice_rows(plan, rows, hash_of=lambda k: -5 if k is None else ord(k))
    got = {}
    for shard in shard_keys(plan.shards):
        part = table.filter(pa.compute.equal(table.column(SHARD), shard))
        got.update(rows_of(run_shard(plan, part, None, None).output, plan))
    assert_same(got, R.spark_windows(rows, "t", "k", 4, 2, agg_list(aggs)))
    assert (0, 4, None) in got and got[(0, 4, None)] == (7, 2)


def test_packed_transport_carries_what_the_rows_carry():
    """The packed transport (streaming default) gives the row transport's windows, metrics and state:
    string and null keys, null times (malformed, counted by the markers) and several map tasks."""
    schema = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("k", T.StringType()),
                           T.StructField("v", T.LongType())])
    rng = np.random.default_rng(7)
    rows = [{"t": None if i % 13 == 0 else int(rng.integers(0, 400)),
             "k": None if i % 11 == 0 else "k" + str(int(rng.integers(0, 30))), "v": int(rng.integers(-9, 9))}
            for i in range(600)]
    plan = make_plan(12, 4, aggs={"v": ["sum", "max"], "*": ["count"]}, schema=schema, shards=3,
                     mode="append", watermark=True)
    batches = [rows[:250], [], rows[250:]]
    wms = [0, 100, 150, 10**6]
    hash_of = lambda k: -5 if k is None else int(k[1:]) * 7919 + 3  # noqa: E731
    by_rows = run_stream(plan, batches, wms, hash_of=hash_of)
    packed = run_stream(plan, batches, wms, hash_of=hash_of, packed=True)
    assert packed == by_rows
    assert sum(m["malformed_rows"] for m in packed[1]) == sum(r["t"] is None for r in rows) > 0
    assert sum(len(out) for out in packed[0]) > 100


@pytest.mark.parametrize("pack_rows", [A.PACK_ROWS, 7])
def test_packed_slices_are_split_by_shard(monkeypatch, pack_rows):
    """Each message holds one shard's slices; held over several input batches (sent every ``pack_rows``
    slices and at the end), they are the row transport's slices; then one marker row per shard."""
    monkeypatch.setattr(A, "PACK_ROWS", pack_rows)
    plan = make_plan(4, 2, mode="append", watermark=True, shards=4)
    rows = [{"t": t, "k": t % 7, "v": t, "x": 1.0} for t in range(60)]
    batches = [input_batch(rows[i:i + 9], plan) for i in range(0, 60, 9)]
    by_rows = pa.Table.from_batches(list(A.Slicer(plan, tag=False)(batches)))
    packed = pa.Table.from_batches(list(A.Slicer(plan, tag=False, packed=True)(batches)))
    shards, blobs = packed.column(SHARD).to_pylist(), packed.column(SLICES).to_pylist()
    assert shards[-4:] == list(shard_keys(4)) and blobs[-4:] == [b""] * 4
    messages = [pa.ipc.read_record_batch(pa.py_buffer(b), plan.slices_arrow_schema()) for b in blobs[:-4]]
    for shard, m in zip(shards, messages):
        assert set(shard_key_values(m.column(KHASH).to_numpy(), 4)) == {shard}
    assert len(messages) > (len(set(shards)) if pack_rows == 7 else 0)
    want = by_rows.filter(pa.compute.greater(by_rows.column(partial_name(0)), 0)).select(messages[0].schema.names)
    assert sorted(pa.Table.from_batches(messages).to_pylist(), key=str) == sorted(want.to_pylist(), key=str)


def test_without_keys():
    plan = make_plan(6, 3, aggs={"v": ["max"], "*": ["count"]}, by=(), shards=1)
    rows = [{"t": t, "v": t % 5} for t in (0, 1, 4, 7, 20)]
    got = rows_of(run_shard(plan, slice_rows(plan, rows, hash_of=lambda k: 0), None, None).output, plan)
    assert_same(got, R.spark_windows(rows, "t", None, 6, 3, [("v", "max"), ("*", "count")]))


def test_hash_collision_is_detected():
    schema = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("k", T.StringType()),
                           T.StructField("v", T.LongType())])
    rows = [{"t": 1, "k": "a", "v": 1}, {"t": 2, "k": "b", "v": 2}]
    plan = make_plan(4, 2, aggs={"*": ["count"]}, schema=schema, shards=1)
    with pytest.raises(RuntimeError, match="share the 64-bit hash"):
        run_shard(plan, slice_rows(plan, rows, tasks=1, hash_of=lambda k: 42), None, None)


def test_state_blob_is_checked():
    plan = make_plan(4, 2, mode="append", watermark=True, shards=1)
    res = run_shard(plan, slice_rows(plan, [{"t": 1, "k": 1, "v": 1, "x": 1.0}], tasks=1), None, 0)
    packed, keys = res.state
    blob = _state_bytes.unpack(packed)  # GroupState holds the zstd frame of the kernel's image
    kinds, outs = plan.spec.kinds, plan.spec.outputs_array
    assert K.ShardState.from_bytes(blob, kinds, outs, False).num_slices == 1
    with pytest.raises(ValueError, match="truncated|corrupt"):
        K.ShardState.from_bytes(blob[:-9], kinds, outs, False)
    with pytest.raises(ValueError, match="different aggregation"):
        K.ShardState.from_bytes(blob, kinds[:1], np.array([K.OUT_COUNT, 0, -1], dtype=np.int32), False)
    with pytest.raises(ValueError, match="not pyspark-cq state"):
        K.ShardState.from_bytes(b"junk-junk-junk", kinds, outs, False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 120), st.integers(-50, 50)), max_size=120),
       st.sampled_from([(30, 1), (12, 3), (7, 2), (5, 5)]), st.integers(1, 9), st.booleans())
def test_persistent_queue_with_out_of_order_slices(slices, ws, step, reload):
    """Slices arrive far out of order and windows are emitted a few at a time, so slices land inside the
    queue kept from the previous call (front and back): every window must still equal a fresh
    computation over the slices accepted so far. With ``reload`` the state goes through bytes each call."""
    w, s = ws
    # Mostly increasing times with a jitter of up to ±12: many slices land inside the kept window.
    slices = sorted(slices, key=lambda c: c[1] + (c[2] * 7) % 25 - 12)
    kinds = np.array([K.KIND_ADD_I64, K.KIND_ADD_I64, K.KIND_MIN, K.KIND_MAX, K.KIND_ADD_F64], dtype=np.uint8)
    outs = np.array([K.OUT_COUNT, 0, -1, K.OUT_SUM_I, 1, 0, K.OUT_MIN, 2, 0, K.OUT_MAX, 3, 0, K.OUT_SUM_F, 4, 0],
                    dtype=np.int32)
    state = K.ShardState(kinds, outs, False)
    accepted: list = []
    late_end, wm = None, 0
    for b in range(0, len(slices), step):
        chunk = slices[b:b + step]
        v = np.array([c[2] for c in chunk], dtype=np.int64)
        parts = [np.ones(len(chunk), dtype=np.int64), v, v, v, v.astype(np.float64).view(np.int64)]
        slot, _, _, _ = state.ingest(np.array([c[0] for c in chunk], dtype=np.int64),
                                     np.array([c[1] for c in chunk], dtype=np.int64), parts, w, s, late_end)
        accepted += [c for c, sl in zip(chunk, slot) if sl >= 0]
        wm = max(wm, max(c[1] for c in chunk) - 6)
        slots, starts, _, values, _ = state.emit_windows(w, s, late_end, wm, False)
        hashes = state.key_hashes
        got = {(int(hashes[sl]), int(t0)): (int(values[0][i]), int(values[1][i]), int(values[2][i]),
                                            int(values[3][i]), float(values[4][i:i + 1].view(np.float64)[0]))
               for i, (sl, t0) in enumerate(zip(slots, starts))}
        want: dict = {}
        for key, t, val in accepted:
            for k in range((t - w) // s + 1, t // s + 1):
                if (late_end is None or k * s + w > late_end) and k * s + w <= wm:
                    want.setdefault((key, k * s), []).append(val)
        assert got == {k: (len(x), sum(x), min(x), max(x), float(sum(x))) for k, x in want.items()}
        state.evict(w, s, wm)
        if reload:
            state = K.ShardState.from_bytes(state.to_bytes(), kinds, outs, False)
        state.watermark = wm
        late_end = wm
