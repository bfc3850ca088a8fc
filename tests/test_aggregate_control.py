"""sliding_aggregate driven by the control table (issue 6): granularity and window schedules.

Kernel/worker level (no Spark): rows go through the real slicer and ``run_shard`` with a real control
table on disk, against plain-Python references with per-element schedules (hypothesis). Spark level:
a file stream with a granularity and a window change at an explicit event time, and a change made
while the query runs, driven batch by batch (no timing).
"""
from __future__ import annotations

import math
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import aggregate_pipeline, aggregate_reference
from helpers.files import write_in_order
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_cq.control import ControlHandle, ControlTable
from pyspark_cq.operators._common.shards import shard_keys
from pyspark_cq.operators.aggregate.config import SHARD, batch_params, read_entry
from pyspark_cq.operators.aggregate.shard import run_shard
from pyspark_cq.operators.aggregate.slicer import Slicer

R = aggregate_reference
KT = aggregate_pipeline
AGGS = KT.ALL_AGGS
AGG_LIST = KT.agg_list(AGGS)


# ---- plain-Python references ---------------------------------------------------------------------------

class Sched:
    """A per-element schedule: [(at, value)], first at None (since always); value_at(t) = last at <= t."""

    def __init__(self, points):
        self.points = list(points)

    def __call__(self, t):
        value = self.points[0][1]
        for at, v in self.points[1:]:
            if t >= at:
                value = v
        return value

    @property
    def values(self):
        return [v for _, v in self.points]


def rounded(t, g: Sched):
    return t - t % g(t)


def windows_of(r, s, w: Sched):
    """Windows [kS, kS + W(kS)) that contain r."""
    out = []
    for k in range((r - max(w.values)) // s, r // s + 1):
        end = k * s + w(k * s)
        if k * s <= r < end:
            out.append((k * s, end))
    return out


def ref_windows(batches, s, w: Sched, g: Sched, wms=None, aggs=None):
    """emit='windows': each row counts in the windows [kS, kS + W(kS)) that contain its time rounded
    down with the granularity in effect at its time. With ``wms`` (Spark's per-batch watermarks,
    append mode) a (row, window) pair is dropped when the window ended by the previous batch's
    watermark and a window is emitted once the watermark reaches its end. Returns (rows, late rows)."""
    open_, out, late = {}, {}, 0
    for b, batch in enumerate(batches + ([[]] if wms else [])):
        late_wm = (wms[b - 1] if b > 0 else 0) if wms else None
        for row in batch:
            live = [x for x in windows_of(rounded(row["t"], g), s, w) if late_wm is None or x[1] > late_wm]
            late += not live
            for ws, we in live:
                open_.setdefault((ws, we, row["k"]), []).append(row)
        for key in [x for x in open_ if wms is not None and x[1] <= wms[b]]:
            out[key] = R.finalize(open_.pop(key), aggs or AGG_LIST)
    if wms is None:  # one batch run: every window
        out = {key: R.finalize(members, aggs or AGG_LIST) for key, members in open_.items()}
    return out, late


def ref_changes(rows, w: int, g: Sched):
    """emit='changes' (PIPES Algorithm 1 per group, coalesced): each row is the element valid over
    [r, r + W) with r its time rounded down with the granularity in effect at its time."""
    groups = {}
    for row in rows:
        groups.setdefault(row["k"], []).append(row)
    out = {}
    for key, members in groups.items():
        elements = sorted(((row, rounded(row["t"], g), rounded(row["t"], g) + w) for row in members),
                          key=lambda e: e[1])
        stream = sorted(R.pipes_algorithm1(elements, lambda a, e: (a or ()) + (e,)), key=lambda x: x[1])
        runs = []
        for a, s0, x in stream:
            value = R.finalize(a, AGG_LIST)
            if runs and runs[-1][2] == s0 and R.same_value(runs[-1][0], value):
                runs[-1] = (runs[-1][0], runs[-1][1], x)
            else:
                runs.append((value, s0, x))
        for value, s0, x in runs:
            out[(s0, x, key)] = value
    return out


# ---- driving the worker with a control table --------------------------------------------------------

def control_table(tmp, window, granularity, w_changes=(), g_changes=()):
    """A control table with entry 'agg1' registered with (window, granularity), then the changes."""
    table = ControlTable(str(tmp / f"control-{uuid.uuid4().hex[:8]}.json"))
    table.register("agg1", window=window, granularity=granularity)
    for at, value in w_changes:
        table.set("agg1", window=value, at=at, reason="test")
    for at, value in g_changes:
        table.set("agg1", granularity=value, at=at, reason="test")
    return table


def plan_with(plan, handle):
    return KT.AggConfig(**{**plan.__dict__, "control": handle})


def run_batches(plan, batches, wms=None):
    """Slicer + run_shard per shard and batch (states serialized in between), the entry read per batch.
    ``wms``: watermark per batch (plus one for the trailing no-data batch); None = one batch run."""
    states, outputs, metrics = {}, [], []
    for b, batch in enumerate(batches + ([[]] if wms else [])):
        table = KT.slice_rows(plan, batch) if batch else Slicer(plan, tag=False).markers(0)
        table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        shard_col = np.asarray(table.column(SHARD).to_numpy())
        emitted, m = {}, {}
        for s in shard_keys(plan.shards):  # the shards' group keys (operators/_common/shards.py)
            part = table.take(pa.array(np.flatnonzero(shard_col == s)))
            res = run_shard(plan, part, states.get(s), wms[b] if wms else None, read_entry(plan))
            states[s] = res.state
            out = KT.rows_of(res.output, plan)
            assert not set(out) & set(emitted)
            emitted.update(out)
            for name, value in res.metrics.items():
                m[name] = m.get(name, 0) + value
        outputs.append(emitted)
        metrics.append(m)
    return outputs, metrics


def union(outputs):
    got = {}
    for out in outputs:
        assert not set(out) & set(got), "a row was emitted twice"
        got.update(out)
    return got


# Short streams cut into many micro-batches, so the watermark moves by less than a window per batch and
# windows of both sizes are open around a change (eviction must keep what they need).
stream_st = st.tuples(
    st.lists(st.fixed_dictionaries({"t": st.integers(0, 90), "k": st.integers(0, 3), "v": KT.values, "x": KT.floats}),
             max_size=50),
    st.lists(st.integers(0, 50), max_size=10),
    st.sampled_from([0, 2, 6]),
)
rows_st = st.lists(st.fixed_dictionaries({"t": st.integers(0, 240), "k": st.integers(0, 4), "v": KT.values,
                                          "x": KT.floats}), max_size=60)
# (slide, window schedule, granularity schedule); change times inside the data.
sched_st = st.tuples(
    st.sampled_from([1, 2, 3, 4]),
    st.integers(2, 12), st.lists(st.tuples(st.integers(1, 80), st.integers(2, 16)), max_size=2),
    st.sampled_from([1, 2, 3, 4, 6]), st.lists(st.tuples(st.integers(1, 80), st.sampled_from([1, 2, 3, 4, 5, 6, 8])),
                                               max_size=2),
)


def schedules(table):
    e = table.entry("agg1")
    ws = e.schedule("window").points
    gs = e.schedule("granularity").points
    return Sched([(None, ws[0][1])] + list(ws[1:])), Sched([(None, gs[0][1])] + list(gs[1:]))


def setup(tmp_path, sched, emit="windows", mode="batch", watermark=False, with_window_changes=True):
    s, w0, w_changes, g0, g_changes = sched
    w0 = max(w0, s)
    w_changes = sorted((at, max(v, s)) for at, v in w_changes) if with_window_changes else []
    table = control_table(tmp_path, w0, g0, w_changes, sorted(g_changes))
    w, g = schedules(table)
    plan = plan_with(KT.make_plan(w0, s, granularity=math.gcd(w0, s), emit=emit, mode=mode, watermark=watermark),
                     table.handle("agg1"))
    return plan, w, g


# ---- properties -----------------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows_st, sched_st)
def test_batch_windows_follow_schedules(tmp_path, rows, sched):
    plan, w, g = setup(tmp_path, sched)
    got = union(run_batches(plan, [rows])[0])
    KT.assert_same(got, ref_windows([rows], plan.slide, w, g)[0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(stream_st, sched_st)
def test_append_stream_windows_follow_schedules(tmp_path, data, sched):
    """Out-of-order and late rows: exact late-row counts and windows, none emitted twice, with window
    ends that move backwards (shrinking sizes) and forwards."""
    rows, cuts, delay = data
    plan, w, g = setup(tmp_path, sched, mode="append", watermark=True)
    batches = KT.split_batches(KT.arrival_order(rows), cuts)
    wms = R.watermarks(batches, "t", delay)
    outputs, metrics = run_batches(plan, batches, wms)
    want, late = ref_windows(batches, plan.slide, w, g, wms)
    KT.assert_same(union(outputs), want)
    assert sum(m["late_rows"] for m in metrics) == late
    assert sum(m["input_rows"] for m in metrics) == len(rows)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(stream_st, sched_st)
def test_update_stream_last_values_follow_schedules(tmp_path, data, sched):
    """Update mode: the last value emitted for each window is the window's final value."""
    rows, cuts, delay = data
    plan, w, g = setup(tmp_path, sched, mode="update", watermark=True)
    batches = KT.split_batches(KT.arrival_order(rows), cuts)
    wms = R.watermarks(batches, "t", delay)
    outputs, _ = run_batches(plan, batches, wms)
    last = {}
    for out in outputs:
        last.update(out)
    # Final values under Spark's late-pair rule: the closed windows, plus those still open at the end.
    want, _ = ref_windows(batches, plan.slide, w, g, wms)
    want.update(_ref_open_windows(batches, plan.slide, w, g, wms))
    KT.assert_same(last, want)


def _ref_open_windows(batches, s, w, g, wms):
    """Windows never closed by the final watermark, with their contributions (update mode)."""
    open_ = {}
    for b, batch in enumerate(batches):
        late_wm = wms[b - 1] if b > 0 else 0
        for row in batch:
            for ws, we in windows_of(rounded(row["t"], g), s, w):
                if we > late_wm:
                    open_.setdefault((ws, we, row["k"]), []).append(row)
    return {k: R.finalize(v, AGG_LIST) for k, v in open_.items() if k[1] > wms[-1]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows_st, sched_st)
def test_batch_changes_follow_granularity_schedule(tmp_path, rows, sched):
    plan, w, g = setup(tmp_path, sched, emit="changes", with_window_changes=False)
    got = union(run_batches(plan, [rows])[0])
    KT.assert_same(got, ref_changes(rows, plan.window, g))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows_st, st.lists(st.integers(0, 60), max_size=4), sched_st)
def test_stream_changes_follow_granularity_schedule(tmp_path, rows, cuts, sched):
    """In-order input, a final watermark past everything: the union over batches is Algorithm 1's
    output with per-element rounding, each interval emitted once."""
    plan, w, g = setup(tmp_path, sched, emit="changes", mode="append", watermark=True, with_window_changes=False)
    rows = sorted(rows, key=lambda r: r["t"])
    batches = KT.split_batches(rows, cuts)
    wms = R.watermarks(batches, "t", 0)[:-1] + [10**6]
    outputs, metrics = run_batches(plan, batches, wms)
    KT.assert_same(union(outputs), ref_changes(rows, plan.window, g))
    assert sum(m["late_rows"] for m in metrics) == 0


@pytest.mark.parametrize("w_from,w_to", [(10, 4), (4, 10)])
def test_eviction_keeps_slices_of_open_windows(tmp_path, w_from, w_to):
    """Window size change at 20 (slide 2) with the watermark moving 15 -> 21 -> 40: a slice at 15 must
    survive until every window containing it closed, whichever way the size changed."""
    table = control_table(tmp_path, w_from, 2, w_changes=[(20, w_to)])
    plan = plan_with(KT.make_plan(w_from, 2, granularity=2, mode="append", watermark=True), table.handle("agg1"))
    batches = [[{"t": t, "k": 0, "v": 1, "x": 1.0}] for t in (15, 21, 40)]
    wms = R.watermarks(batches, "t", 0)
    outputs, metrics = run_batches(plan, batches, wms)
    want, _ = ref_windows(batches, 2, Sched([(None, w_from), (20, w_to)]), Sched([(None, 2)]), wms)
    KT.assert_same(union(outputs), want)
    assert sum(m["evicted_rows"] for m in metrics) >= 2


# ---- no entry = unchanged; a change reaches the next batch; bad input ----------------------------------

@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(KT.stream_st, KT.window_slide)
def test_without_entry_results_are_unchanged(tmp_path, data, ws):
    rows, cuts, delay = data
    w, s = ws
    batches = KT.split_batches(KT.arrival_order(rows), cuts)
    wms = R.watermarks(batches, "t", delay)
    plain = KT.make_plan(w, s, mode="append", watermark=True)
    ControlTable(str(tmp_path / "empty.json"))  # a table without the operator's entry
    handles = (ControlHandle(str(tmp_path / "empty.json"), "agg1"), ControlHandle(str(tmp_path / "none.json"), "a"))
    for handle in handles:
        got, m_got = run_batches(plan_with(plain, handle), batches, wms)
        want, m_want = run_batches(plain, batches, wms)
        assert m_got == m_want and len(got) == len(want)
        for a, b in zip(got, want):
            KT.assert_same(a, b)


def test_a_change_applies_from_the_next_batch(tmp_path):
    """The entry is read at every batch: a coarser granularity set between batches (at an instant
    ahead of the data) changes how the next batch's rows are sliced."""
    table = control_table(tmp_path, 8, 1)
    plan = plan_with(KT.make_plan(8, 8, granularity=1, mode="append", watermark=True, aggs={"*": ["count"]}),
                     table.handle("agg1"))
    first = [{"t": t, "k": 0, "v": 1, "x": 1.0} for t in range(0, 20)]
    res = run_shard(plan, KT.slice_rows(plan, first, tasks=1), None, 0, read_entry(plan))
    assert res.metrics["state_rows"] == 20            # one slice per µs
    table.set("agg1", granularity=4, at=21, reason="coarser")   # takes effect at 24 (§2.4.3)
    assert read_entry(plan).schedule("granularity").points[-1] == (24, 4)
    second = [{"t": t, "k": 0, "v": 1, "x": 1.0} for t in range(20, 40)]
    res = run_shard(plan, KT.slice_rows(plan, second, tasks=1), res.state, 0, read_entry(plan))
    assert res.metrics["state_rows"] == 20 + 4 + 4    # 20..23 stay fine, then 24, 28, 32, 36
    assert batch_params(plan, read_entry(plan)).version == 2


@pytest.mark.spark
def test_control_argument_is_validated(spark, tmp_dir):
    from pyspark_cq import sliding_aggregate

    df = spark.createDataFrame([(1,)], "k long").selectExpr("timestamp_seconds(k) AS ts", "k")
    with pytest.raises(TypeError, match="control must be a pyspark_cq.control.ControlHandle"):
        sliding_aggregate(df, "ts", "10 seconds", control="control.json")
    table = control_table(tmp_dir, 10 * SEC, SEC, w_changes=[(20 * SEC, 2 * SEC)])
    with pytest.raises(TypeError, match="got ControlTable"):
        sliding_aggregate(df, "ts", "10 seconds", control=table)
    # An entry the workers would reject fails when the query is defined.
    with pytest.raises(ValueError, match="smaller than the slide"):
        sliding_aggregate(df, "ts", "10 seconds", "5 seconds", control=table.handle("agg1"))
    with pytest.raises(ValueError, match="emit='changes' supports granularity changes only"):
        sliding_aggregate(df, "ts", "10 seconds", granularity="1 second", emit="changes", control=table.handle("agg1"))
    # No name: the report is filed under the operator id.
    out = sliding_aggregate(df, "ts", "10 seconds", control=ControlHandle(str(tmp_dir / "absent.json"), "agg7"))
    assert "agg7" in out._jdf.queryExecution().analyzed().toString()
    # An entry that sets what the aggregation does not read (a plan) is refused, naming it.
    table.register("agg8", drop_ratio=0.3, plan_id="p1")
    with pytest.raises(ValueError, match=r"sliding_aggregate 'agg8'.*plan_id.*does not read"):
        sliding_aggregate(df, "ts", "10 seconds", control=table.handle("agg8"))
    table.register("agg9", drop_ratio=0.0)    # drops nothing: accepted
    sliding_aggregate(df, "ts", "10 seconds", control=table.handle("agg9"))
    # load shedding applies to a stream; a batch DataFrame is aggregated whole
    table.register("agg10", drop_ratio=0.3)
    with pytest.raises(ValueError, match=r"sliding_aggregate 'agg10': drop_ratio 0.3 sheds a streaming"):
        sliding_aggregate(df, "ts", "10 seconds", control=table.handle("agg10"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows_st, st.sampled_from([0.0, 0.3, 0.6]), st.sampled_from([(20, 10), (6, 3), (5, 5)]))
def test_kept_column_is_the_kept_share_of_each_windows_rows(tmp_path, rows, ratio, ws):
    """RTStream §4.4, a window's kept fraction (kept_column): the aggregates are those of the rows the hash
    keeps, and the fraction is kept / all of the rows whose time falls into the window (plain Python over
    all rows); windows whose every row was shed are not emitted. The same rows are shed as without it."""
    from pyspark_cq.operators._common.shed import shed_mask
    from pyspark_cq.operators.aggregate.spec import with_kept

    table = ControlTable(str(tmp_path / f"control-{uuid.uuid4().hex[:8]}.json"))
    table.register("agg1", drop_ratio=ratio)
    base = plan_with(KT.make_plan(*ws, mode="update"), table.handle("agg1"))
    plan = KT.AggConfig(**{**base.__dict__, "spec": with_kept(base.spec, "kept"),
                           "out_names": base.out_names + ("kept",)})
    outputs, metrics = run_batches(plan, [rows])
    drop = np.zeros(len(rows), dtype=bool)
    if rows:
        drop = shed_mask(pa.Table.from_batches([KT.input_batch(rows, base)]), np.zeros(len(rows), dtype=np.int64),
                         0, 0, ratio)
    kept = [r for r, d in zip(rows, drop) if not d]
    w, g = Sched([(None, ws[0])]), Sched([(None, math.gcd(*ws))])
    aggregates = ref_windows([kept], ws[1], w, g)[0]
    every = ref_windows([rows], ws[1], w, g, aggs=[("*", "count")])[0]
    want = {key: value + (value[-1] / every[key][0],) for key, value in aggregates.items()}
    KT.assert_same(union(outputs), want)
    assert metrics[0]["shed_rows"] == int(drop.sum()) and metrics[0]["input_rows"] == len(rows)
    plain, plain_metrics = run_batches(base, [rows])    # the same rows are shed without kept_column
    KT.assert_same(union(plain), {key: value[:-1] for key, value in union(outputs).items()})
    # the state also holds the slices of shed rows (to count them): state_rows and state_bytes differ
    assert [{**m, "state_rows": 0, "state_bytes": 0} for m in plain_metrics] == [
        {**m, "state_rows": 0, "state_bytes": 0} for m in metrics]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows_st, st.sampled_from([0.3, 0.6]))
def test_drop_ratio_sheds_before_the_aggregation_and_counts(tmp_path, rows, ratio):
    """RTStream §4.4 in the aggregation: the windows are those of the rows the hash keeps (the same
    decision whichever task a row reaches), and every input row is either aggregated or counted as shed."""
    from pyspark_cq.operators._common.shed import shed_mask

    table = ControlTable(str(tmp_path / f"control-{uuid.uuid4().hex[:8]}.json"))
    table.register("agg1", drop_ratio=ratio)
    plan = plan_with(KT.make_plan(20, 10, mode="update"), table.handle("agg1"))
    outputs, metrics = run_batches(plan, [rows])
    if rows:
        whole = pa.Table.from_batches([KT.input_batch(rows, plan)])
        drop = shed_mask(whole, np.zeros(len(rows), dtype=np.int64), 0, 0, ratio)
    else:
        drop = np.zeros(0, dtype=bool)
    kept = [r for r, d in zip(rows, drop) if not d]
    const = Sched([(None, 20)])
    KT.assert_same(union(outputs), ref_windows([kept], plan.slide, const, Sched([(None, 10)]))[0])
    assert metrics[0]["shed_rows"] == int(drop.sum()) and metrics[0]["input_rows"] == len(rows)


def test_window_below_slide_and_window_change_in_changes_mode_are_errors(tmp_path):
    table = control_table(tmp_path, 8, 2, w_changes=[(10, 2)])
    plan = plan_with(KT.make_plan(8, 4, granularity=2), table.handle("agg1"))
    with pytest.raises(ValueError, match=r"entry 'agg1' sets window=2 µs \(from 10 µs\), smaller than the slide 4"):
        batch_params(plan, read_entry(plan))
    plan = plan_with(KT.make_plan(8, 2, granularity=2, emit="changes"), table.handle("agg1"))
    with pytest.raises(ValueError, match="emit='changes' supports granularity changes only"):
        batch_params(plan, read_entry(plan))


def test_granularity_need_not_divide_the_window(tmp_path):
    """Documented handling: under control a granularity that does not divide the window is accepted;
    rows round down to it and count in the windows containing the rounded time (changes: the sweep
    runs on the gcd grid)."""
    rows = [{"t": t, "k": t % 2, "v": t, "x": float(t)} for t in range(0, 60, 3)]
    table = control_table(tmp_path, 10, 5, g_changes=[(20, 7)])   # 7 does not divide 10; effective at 35
    g = Sched([(None, 5), (35, 7)])
    for emit, slide in (("windows", 5), ("changes", 5)):
        plan = plan_with(KT.make_plan(10, slide, granularity=5, emit=emit), table.handle("agg1"))
        got = union(run_batches(plan, [rows])[0])
        want = ref_windows([rows], slide, Sched([(None, 10)]), g)[0] if emit == "windows" else ref_changes(rows, 10, g)
        KT.assert_same(got, want)


# ---- Spark ----------------------------------------------------------------------------------------------

SEC = 1_000_000
SPARK_AGGS = {"v": ["sum", "max"], "*": ["count"]}
SPARK_AGG_LIST = KT.agg_list(SPARK_AGGS)


def spark_rows(seed, start_s, end_s, n, keys=4):
    """In-order rows (µs times, millisecond-aligned) between start_s and end_s seconds."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(start_s * 1000, end_s * 1000, n)) * 1000
    return [{"t": int(t), "k": int(rng.integers(0, keys)), "v": int(rng.integers(-50, 50)), "x": 0.0} for t in ts]


def write_file(directory: Path, i: int, rows):


    directory.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("k", pa.int64()), ("v", pa.int64())])
    cols = {"ts": [r["t"] for r in rows], "k": [r["k"] for r in rows], "v": [r["v"] for r in rows]}
    path = directory / f"part-{i:03d}.parquet"
    write_in_order(pa.table(cols, schema=schema), path, i)


def _us(value) -> int:
    import datetime as dt

    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(round(value.timestamp() * SEC))


def spark_result(df):
    return {(_us(r["window_start"]), _us(r["window_end"]), r["k"]): (r["sum_v"], r["max_v"], r["count"])
            for r in df.collect()}


def last_watermark(query) -> int:
    """The watermark of the query's last micro-batch (µs), as Spark reports it."""
    import datetime as dt

    marks = [p["eventTime"].get("watermark") for p in query.recentProgress if p.get("eventTime")]
    marks = [dt.datetime.fromisoformat(m.replace("Z", "+00:00")) for m in marks if m]
    return max(_us(m) for m in marks) if marks else 0


def assert_rows(got, want):
    assert got.keys() == want.keys(), (sorted(set(got) - set(want))[:4], sorted(set(want) - set(got))[:4])
    for k in want:
        assert got[k] == want[k], (k, got[k], want[k])


@pytest.mark.slow
@pytest.mark.spark
def test_stream_follows_granularity_and_window_changes(spark, tmp_dir):
    """A file stream (one file per micro-batch) with a granularity change 1 s -> 5 s requested at 21 s
    (in effect from 25 s, PIPES §2.4.3) and a window change 10 s -> 20 s from 35 s, both set before the
    query starts at explicit event times inside the stream: the sink holds exactly the reference rows,
    and the per-batch report is filed under the operator id."""
    import pyspark_cq
    from pyspark_cq import sliding_aggregate

    batches = [spark_rows(0, 0, 20, 40), spark_rows(1, 20, 60, 80)]
    for i, rows in enumerate(batches):
        write_file(tmp_dir / "in", i, rows)
    table = control_table(tmp_dir, 10 * SEC, SEC, w_changes=[(35 * SEC, 20 * SEC)], g_changes=[(21 * SEC, 5 * SEC)])
    assert table.entry("agg1").schedule("granularity").points[-1] == (25 * SEC, 5 * SEC)
    src = (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
           .parquet(str(tmp_dir / "in")).withWatermark("ts", "2 seconds"))
    out = sliding_aggregate(src, "ts", "10 seconds", "5 seconds", by="k", aggs=SPARK_AGGS, granularity="1 second",
                            shards=1, control=table.handle("agg1"))
    name = "q_" + uuid.uuid4().hex[:10]
    q = (out.writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    got = spark_result(spark.table(name))
    w = Sched([(None, 10 * SEC), (35 * SEC, 20 * SEC)])
    g = Sched([(None, SEC), (25 * SEC, 5 * SEC)])
    want, late = ref_windows(batches, 5 * SEC, w, g, aggs=SPARK_AGG_LIST)   # in order: no late pairs
    final_wm = last_watermark(q)
    assert final_wm >= 40 * SEC
    assert_rows(got, {k: v for k, v in want.items() if k[1] <= final_wm})
    assert any(k[1] - k[0] == 20 * SEC for k in got) and any(k[1] - k[0] == 10 * SEC for k in got)
    reports = [pyspark_cq.read_metrics(p, "agg1") for p in q.recentProgress]
    assert all(r is not None for r in reports)
    assert sum(r["input_rows"] for r in reports) == sum(len(b) for b in batches)
    assert sum(r["late_rows"] for r in reports) == late == 0


@pytest.mark.spark
@pytest.mark.slow
def test_change_reaches_a_running_query(spark, tmp_dir):
    """Batch by batch (one file, then processAllAvailable): a granularity and a window change set
    while the query runs, at event times ahead of the data seen, apply to the next file's rows."""
    import pyspark_cq
    from pyspark_cq import sliding_aggregate

    table = control_table(tmp_dir, 10 * SEC, SEC)
    (tmp_dir / "in").mkdir()
    src = (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
           .parquet(str(tmp_dir / "in")).withWatermark("ts", "2 seconds"))
    out = sliding_aggregate(src, "ts", "10 seconds", "5 seconds", by="k", aggs=SPARK_AGGS, shards=1,
                            control=table.handle("agg1"))
    name = "q_" + uuid.uuid4().hex[:10]
    batches = [spark_rows(10, 0, 20, 30), spark_rows(11, 20, 60, 60)]
    write_file(tmp_dir / "in", 0, batches[0])
    q = (out.writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck")).start())
    try:
        q.processAllAvailable()
        state_before = pyspark_cq.read_metrics(q, "agg1")["state_rows"]
        table.set("agg1", granularity=5 * SEC, window=20 * SEC, at=20 * SEC, reason="test: coarser, longer")
        write_file(tmp_dir / "in", 1, batches[1])
        q.processAllAvailable()
        # The first batch after the change slices at 5 s: at most 4 keys x 8 granules of 20..60 s added
        # (60 rows at 1 s would add about 4 x 40 slices).
        reports = [pyspark_cq.read_metrics(p, "agg1") for p in q.recentProgress]
        assert sum(r["input_rows"] for r in reports) == 90
        state_after = pyspark_cq.read_metrics(q, "agg1")["state_rows"]
        assert state_after <= state_before + 32
    finally:
        q.stop()
    got = spark_result(spark.table(name))
    w = Sched([(None, 10 * SEC), (20 * SEC, 20 * SEC)])
    g = Sched([(None, SEC), (20 * SEC, 5 * SEC)])
    want, _ = ref_windows(batches, 5 * SEC, w, g, aggs=SPARK_AGG_LIST)
    final_wm = last_watermark(q)
    assert final_wm >= 50 * SEC
    assert_rows(got, {k: v for k, v in want.items() if k[1] <= final_wm})
    assert any(k[1] - k[0] == 20 * SEC for k in got)


@pytest.mark.spark
def test_batch_dataframe_follows_the_entry(spark, tmp_dir):
    """A batch DataFrame: Spark's own aggregation slices with the granularity schedule (a CASE over the
    schedule's instants), the sweep takes each window's size from the window schedule."""
    from pyspark_cq import sliding_aggregate

    rows = spark_rows(3, 0, 60, 60)
    table = control_table(tmp_dir, 10 * SEC, SEC, w_changes=[(30 * SEC, 20 * SEC)], g_changes=[(21 * SEC, 5 * SEC)])
    df = spark.createDataFrame([(r["t"], r["k"], r["v"]) for r in rows], "t long, k long, v long") \
        .selectExpr("timestamp_micros(t) AS ts", "k", "v")
    out = sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k", aggs=SPARK_AGGS, shards=2,
                            control=table.handle("agg1"))
    want, _ = ref_windows([rows], 5 * SEC, Sched([(None, 10 * SEC), (30 * SEC, 20 * SEC)]),
                          Sched([(None, SEC), (25 * SEC, 5 * SEC)]), aggs=SPARK_AGG_LIST)
    assert_rows(spark_result(out), want)


@pytest.mark.spark
def test_stream_sheds_by_drop_ratio_and_reports_it(spark, tmp_dir):
    """drop_ratio on a streaming aggregation (RTStream §4.4): the sink's counts add up to the rows kept,
    and the report's shed_rows to the rest; with drop_ratio 0.5 about half are shed."""
    import pyspark_cq
    from pyspark_cq import sliding_aggregate

    batches = [spark_rows(10, 0, 20, 400), spark_rows(11, 20, 40, 400)]
    for i, rows in enumerate(batches):
        write_file(tmp_dir / "in", i, rows)
    table = ControlTable(str(tmp_dir / "shed.json"))
    table.register("agg_shed", drop_ratio=0.5)
    src = spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1).parquet(
        str(tmp_dir / "in"))
    out = sliding_aggregate(src, "ts", "10 seconds", by="k", aggs={"*": ["count"]}, shards=2,
                            output_mode="update", control=table.handle("agg_shed"))
    name = "q_" + uuid.uuid4().hex[:10]
    q = (out.writeStream.format("memory").queryName(name).outputMode("update")
         .option("checkpointLocation", str(tmp_dir / "ck_shed")).trigger(availableNow=True).start())
    q.awaitTermination()
    reports = [pyspark_cq.read_metrics(p, "agg_shed") for p in q.recentProgress if p["numInputRows"]]
    shed = sum(r["shed_rows"] for r in reports)
    total = sum(len(b) for b in batches)
    assert sum(r["input_rows"] for r in reports) == total
    assert 0.35 * total < shed < 0.65 * total
    # tumbling windows, update mode: the last value of every window is its count of kept rows
    last = {}
    for r in spark.table(name).collect():
        last[(r["window_start"], r["k"])] = max(last.get((r["window_start"], r["k"]), 0), r["count"])
    assert sum(last.values()) == total - shed


@pytest.mark.slow
@pytest.mark.spark
def test_stream_kept_column_says_each_windows_kept_share(spark, tmp_dir):
    """kept_column on a streaming sliding aggregation in append mode, with the drop ratio changed between
    micro-batches (RTStream §4.4): every window says kept / all of the rows whose time falls into it, all
    counted in plain Python over the whole input; a window of rows from batches that shed nothing is
    exact (count and sum); every window with such a row is emitted."""
    import pyspark_cq
    from pyspark_cq import sliding_aggregate

    ratios = [0.0, 0.5, 0.0]
    batches = [spark_rows(20 + i, 20 * i, 20 * (i + 1), 150) for i in range(len(ratios))]
    batches.append([{"t": 200 * SEC, "k": 0, "v": 0, "x": 0.0}])   # moves the watermark past the rest
    ratios.append(0.0)
    table = ControlTable(str(tmp_dir / "kept.json"))
    table.register("agg_kept", drop_ratio=0.0)
    (tmp_dir / "in").mkdir()
    src = (spark.readStream.schema("ts timestamp, k long, v long").option("maxFilesPerTrigger", 1)
           .parquet(str(tmp_dir / "in")).withWatermark("ts", "5 seconds"))
    out = sliding_aggregate(src, "ts", "10 seconds", "5 seconds", by="k", aggs={"v": ["sum"], "*": ["count"]},
                            shards=2, control=table.handle("agg_kept"), kept_column="kept")
    assert out.columns[-1] == "kept" and dict(out.dtypes)["kept"] == "double"
    name = "q_" + uuid.uuid4().hex[:10]
    q = (out.writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", str(tmp_dir / "ck_kept")).start())
    try:
        for i, (rows, ratio) in enumerate(zip(batches, ratios)):
            table.set("agg_kept", drop_ratio=ratio, reason="test")
            write_file(tmp_dir / "in", i, rows)
            q.processAllAvailable()
        got = {(_us(r["window_start"]), r["k"]): r for r in spark.table(name).collect()}
        reports = [pyspark_cq.read_metrics(p, "agg_kept") for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    every, exact = {}, {}   # (window start, key) -> rows; -> whether all came in batches that shed nothing
    for rows, ratio in zip(batches[:-1], ratios):
        for r in rows:
            for start in (r["t"] // (5 * SEC) * 5 * SEC - 5 * SEC, r["t"] // (5 * SEC) * 5 * SEC):
                every.setdefault((start, r["k"]), []).append(r)
                exact[(start, r["k"])] = exact.get((start, r["k"]), True) and ratio == 0
    assert set(got) <= set(every) and {key for key, ok in exact.items() if ok} <= set(got)
    for key, r in got.items():
        assert r["kept"] == pytest.approx(r["count"] / len(every[key]))
        if exact[key]:
            assert r["kept"] == 1.0 and r["sum_v"] == sum(x["v"] for x in every[key])
    assert 0 < min(r["kept"] for r in got.values()) < 1
    shed = sum(r["shed_rows"] for r in reports)
    assert 0 < shed < len(batches[1])
    # tumbling count of what was kept: every kept row is in exactly two windows of the sliding ones
    assert sum(r["count"] for r in got.values()) == 2 * (sum(len(b) for b in batches[:-1]) - shed)


@pytest.mark.spark
def test_kept_column_on_a_batch_dataframe_and_bad_arguments(spark):
    """A batch DataFrame is never shed: kept_column is 1.0 on the rows the aggregation gives without it
    (Spark's slicing and the native slicer's, for first / last); bad uses are refused naming kept_column."""
    from pyspark_cq import sliding_aggregate

    rows = spark_rows(5, 0, 30, 80)
    df = spark.createDataFrame([(r["t"], r["k"], r["v"]) for r in rows], "t long, k long, v long") \
        .selectExpr("timestamp_micros(t) AS ts", "k", "v")
    plain = sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k", aggs=SPARK_AGGS, shards=2)
    kept = sliding_aggregate(df, "ts", "10 seconds", "5 seconds", by="k", aggs=SPARK_AGGS, shards=2,
                             kept_column="kept")
    assert kept.columns == plain.columns + ["kept"]
    got = kept.collect()
    assert sorted(tuple(r)[:-1] for r in got) == sorted(tuple(r) for r in plain.collect())
    assert {r["kept"] for r in got} == {1.0}
    native = sliding_aggregate(df, "ts", "10 seconds", by="k", aggs={"v": ["first"]}, kept_column="kept")
    assert {r["kept"] for r in native.collect()} == {1.0}
    for kw, message in (({"kept_column": "count"}, "kept_column must be a new column name"),
                        ({"kept_column": ""}, "kept_column must be a new column name"),
                        ({"kept_column": "kept", "emit": "changes"}, "kept_column needs emit='windows'")):
        with pytest.raises(ValueError, match=message):
            sliding_aggregate(df, "ts", "10 seconds", by="k", **kw)
    stream = spark.readStream.format("rate").load().withWatermark("timestamp", "1 second")
    with pytest.raises(ValueError, match="kept_column is not supported with output_mode='complete'"):
        sliding_aggregate(stream, "timestamp", "10 seconds", output_mode="complete", kept_column="kept")
