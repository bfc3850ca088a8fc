"""One slice table for a query group's slice class (issue 40): ``run_shared`` over several window / slide pairs
gives each query the rows and the late-row count ``run_shard`` gives it alone (the oracle: the per-query step,
itself tested against a plain-Python reference and Spark's ``window()``), batch by batch, with the shared
table saved and restored between micro-batches as ``applyInPandasWithState`` does.
"""
from __future__ import annotations

from helpers.aggregate_pipeline import make_plan, packed_shard_inputs, rows_of, values
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.operators.aggregate.shard import run_shard, run_shared
from pyspark_cq.vocabulary import metrics as M

#: (window, slide) pairs on one granularity (1): a slice class of issue 40's mix in miniature
PAIRS = [(3, 1), (12, 4), (10, 2), (7, 7), (60, 1), (5, 5)]


def _drive(plans, batches, wms):
    """Per plan and batch: (rows, late rows) alone (``run_shard``) and shared (``run_shared``), and the shared
    table's state rows per batch."""
    alone_state, shared_state = {}, {}
    alone = [[] for _ in plans]
    shared = [[] for _ in plans]
    table_rows = []
    for b, batch in enumerate(batches + [[]]):
        inputs = packed_shard_inputs(plans[0], batch)   # the slices depend on the granularity only
        got_a = [({}, 0) for _ in plans]
        got_s = [({}, 0) for _ in plans]
        rows_b = 0
        for s, (slices, counts) in inputs.items():
            for i, plan in enumerate(plans):
                res = run_shard(plan, slices, alone_state.get((i, s)), wms[b], None, counts)
                alone_state[(i, s)] = res.state
                got_a[i][0].update(rows_of(res.output, plan))
                got_a[i] = (got_a[i][0], got_a[i][1] + res.metrics[M.LATE_ROWS])
            results, shared_state[s] = run_shared(list(plans), slices, shared_state.get(s), wms[b], counts)
            for i, (plan, res) in enumerate(zip(plans, results)):
                got_s[i][0].update(rows_of(res.output, plan))
                got_s[i] = (got_s[i][0], got_s[i][1] + res.metrics[M.LATE_ROWS])
                assert res.state is None
                if i:   # the shared table is counted once, on the first query
                    assert res.metrics[M.STATE_ROWS] == 0 and res.metrics[M.EVICTED_ROWS] == 0
            rows_b += results[0].metrics[M.STATE_ROWS]
        for i in range(len(plans)):
            alone[i].append(got_a[i])
            shared[i].append(got_s[i])
        table_rows.append(rows_b)
    return alone, shared, table_rows


#: rows of 5 micro-batches, 60 time units each; a row arrives 0 to 2 batches after its own (late rows)
stream = st.lists(st.fixed_dictionaries({"t": st.integers(0, 299), "k": st.integers(0, 4), "v": values,
                                         "delay": st.sampled_from([0, 0, 0, 1, 2])}), max_size=80)


@settings(max_examples=60, deadline=None)
@given(stream, st.lists(st.sampled_from(PAIRS), min_size=2, max_size=4, unique=True),
       st.sampled_from(["append", "update"]), st.sampled_from([0, 10]))
def test_shared_table_gives_each_query_its_rows_alone(rows, pairs, mode, lag):
    batches = [[] for _ in range(7)]
    for r in rows:
        batches[r["t"] // 60 + r["delay"]].append({**r, "x": 0.0})
    wms, seen = [], 0
    for batch in batches:   # the watermark after a batch: the largest time seen so far minus the lag (Spark's)
        seen = max([seen] + [r["t"] for r in batch])
        wms.append(max(0, seen - lag))
    wms.append(wms[-1] + 1000)   # a final watermark closes every window
    plans = [make_plan(w, s, granularity=1, mode=mode, watermark=True, aggs={"v": ["sum", "min", "max"], "*": ["count"]})
             for w, s in pairs]
    alone, shared, _ = _drive(plans, batches, wms)
    for i, (w, s) in enumerate(pairs):
        for b, (want, got) in enumerate(zip(alone[i], shared[i])):
            assert got[0] == want[0], (w, s, b)
            assert got[1] == want[1], ("late rows", w, s, b)


def test_each_query_counts_its_own_late_rows():
    """A row at 50 arriving after the watermark passed 95: late for a 3-unit window, not for a 60-unit one."""
    plans = [make_plan(w, s, granularity=1, mode="append", watermark=True, aggs={"*": ["count"]})
             for w, s in [(3, 1), (60, 1)]]
    batches = [[{"t": t, "k": 1, "v": 1, "x": 0.0} for t in range(0, 100, 5)], [{"t": 97, "k": 1, "v": 1, "x": 0.0}],
               [{"t": 50, "k": 1, "v": 1, "x": 0.0}]]
    alone, shared, _ = _drive(plans, batches, [0, 95, 100, 10_000])
    assert [late for _, late in shared[0]] == [late for _, late in alone[0]] == [0, 0, 1, 0]
    assert [late for _, late in shared[1]] == [late for _, late in alone[1]] == [0, 0, 0, 0]
    assert shared[1] == alone[1]


def test_shared_table_keeps_what_the_widest_window_needs_and_no_more():
    """Three batches of one key: the table holds the slices of the widest window only, and after the watermark
    passes every window the table is empty (nothing leaks)."""
    plans = [make_plan(w, s, granularity=1, mode="append", watermark=True, aggs={"*": ["count"]})
             for w, s in [(3, 1), (10, 2)]]
    batches = [[{"t": t, "k": 1, "v": 1, "x": 0.0} for t in range(0, 20)], [{"t": 25, "k": 1, "v": 1, "x": 0.0}], []]
    alone, shared, table_rows = _drive(plans, batches, [0, 20, 10_000, 20_000])
    assert [a[0] for a in alone[1]] == [s[0] for s in shared[1]]
    # after batch 2 (watermark 20): slices 11..19 and 25 stay for windows of size 10 ending after 20
    assert table_rows[1] == 10
    assert table_rows[-1] == 0
    # the late rows of the narrow query alone: none here (its windows over 0..19 end by 20 only after batch 1)
    assert sum(late for _, late in shared[0]) == sum(late for _, late in alone[0])
