"""Slice classes across granularities (issue 40): queries that differ only in granularity share one slice table
at the gcd of their granularities while the ratio stays within the bound (``pyspark_cq.cost.groups``), and each
query's sweep over the finer slices gives exactly its windows: checked against a plain-Python reference of
Spark's append-mode windowed aggregation (``helpers.aggregate_reference.spark_stream_windows``), with late rows,
over random rows and several window / slide pairs, the shared table saved and restored between micro-batches.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
from helpers.aggregate_pipeline import agg_list, assert_same, make_plan, packed_shard_inputs, rows_of, values
from helpers.aggregate_reference import spark_stream_windows, watermarks
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.cost.groups import (
    MERGE_RATIO,
    MemberLoad,
    StreamLoad,
    class_granularity,
    class_state_rows,
    granularity_classes,
)
from pyspark_cq.group import doc as D
from pyspark_cq.group.worker import _by_table, class_granularities, slice_classes
from pyspark_cq.operators.aggregate.shard import run_shard, run_shared

S, M = 1_000_000, 60_000_000


# ---- class forming ------------------------------------------------------------------------------------------

def test_granularity_classes_merge_within_the_ratio():
    assert MERGE_RATIO == 6
    # issue 40's mix: 1 min / 10 s and 5 min / 10 s (10 s), 15 min / 1 min and 1 h / 1 min (1 min): one class
    assert granularity_classes([10 * S, 10 * S, M, M]) == [0, 0, 0, 0]
    assert granularity_classes([M, 10 * S]) == [0, 0]                  # the coarse one first: the same class
    assert granularity_classes([10 * S, 5 * M]) == [0, 1]               # ratio 30 > 6: two tables
    assert granularity_classes([10 * S, M, 5 * M, 10 * M]) == [0, 0, 2, 2]
    # the class's gcd, not each pair, bounds it: 4 and 6 (gcd 2, ratio 3) then 9 (gcd 1, ratio 9 > 6)
    assert granularity_classes([4, 6, 9]) == [0, 0, 2]
    assert granularity_classes([10 * S, M, M], max_ratio=1) == [0, 1, 1]    # checkpoints before: equal only
    assert granularity_classes([]) == []
    assert class_granularity([10 * S, M, 4 * S]) == 2 * S


@pytest.mark.parametrize("args, match", [
    (([0],), r"granularities must hold positive ints \(µs\), got 0 at 0"),
    (([1, True],), r"got True at 1"),
    (([1], 0), r"max_ratio must be an int >= 1, got 0"),
    (("ab",), r"granularities must be a sequence"),
])
def test_granularity_classes_bad_input(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        granularity_classes(*args)


def test_class_granularity_bad_input():
    with pytest.raises(ValueError, match="granularities must be a non-empty sequence"):
        class_granularity([])


@dataclasses.dataclass(frozen=True)
class _Cfg:
    """What slice_classes reads of an AggConfig."""

    window: int
    slide: int
    granularity: int
    emit: str = "windows"
    name: str = ""
    out_names: tuple = ()


def _spec(name, window, slide, mask="__cq_c1", start=None):
    cfg = _Cfg(window, slide, math.gcd(window, slide))
    return D.MemberSpec(key=f"{name}-k", name=name, text="", kind="shared", sink="/x", arrow_schema=None,
                        family="clicks", config=cfg, mask=mask, columns=(("__cq_v0", "__cq_c2"),), start_us=start)


def test_slice_classes_span_granularities_by_the_plans_ratio():
    specs = [_spec("a", M, 10 * S), _spec("b", 60 * M, M), _spec("c", 5 * M, 5 * M), _spec("d", M, 10 * S, "__cq_c3"),
             _spec("e", 60 * M, M, start=7 * M)]
    merged = slice_classes(specs, MERGE_RATIO)
    assert merged == {"a-k": "a-k", "b-k": "a-k", "c-k": "c-k", "d-k": "d-k", "e-k": "e-k"}  # c: ratio 30
    assert class_granularities(specs, merged) == {"a-k": 10 * S, "c-k": 5 * M, "d-k": 10 * S, "e-k": M}
    # a plan written before classes spanned granularities: equal granularities only (its tables as they were)
    assert D.Plan().granularity_ratio == 1
    assert slice_classes(specs) == slice_classes(specs, 1) == {k: k for k in merged}
    with pytest.raises(ValueError, match="max_ratio must be an int >= 1"):
        slice_classes(specs, 0)


def test_members_of_two_former_classes_keep_their_own_tables():
    """A class formed anew after a member left: each member goes on with the table that holds it, new members
    with the first; a former class split in two restores its table in each part."""
    specs = [_spec(n, M, 10 * S) for n in "abcd"]
    t1, t2 = (("a-k",), b"1"), (("b-k", "c-k"), b"2")
    parts = _by_table(specs, [t1, t2])
    assert [(t, [m.name for m in ms]) for t, ms in parts] == [(t1, ["a", "d"]), (t2, ["b", "c"])]
    assert [(t, [m.name for m in ms]) for t, ms in _by_table(specs[2:], [t2])] == [(t2, ["c", "d"])]
    assert [(t, [m.name for m in ms]) for t, ms in _by_table(specs[:2], [])] == [(None, ["a", "b"])]


def test_the_cost_model_counts_a_merged_table_once_at_its_finer_granularity():
    load = StreamLoad(rate=100.0, keys=10)
    fine = MemberLoad("a", "a", "clicks", M, 10 * S, 10 * S)
    coarse = MemberLoad("b", "a", "clicks", 60 * M, M, M)
    alone = MemberLoad("b", "b", "clicks", 60 * M, M, M)
    merged = class_state_rows([fine, coarse], load)
    # the widest window (1 h) in slices of 10 s: as one query of 1 h / 10 s would hold
    assert merged == class_state_rows([MemberLoad("x", "x", "clicks", 60 * M, 10 * S, 10 * S)], load)
    assert merged > class_state_rows([fine], load) + class_state_rows([alone], load)


# ---- the sweep over finer slices ----------------------------------------------------------------------------

#: (window, slide) pairs of granularities 5, 10, 20, 30 and 60 (µs stand for time units here)
PAIRS = [(60, 10), (120, 30), (360, 60), (20, 20), (15, 5), (90, 30), (240, 60)]
AGGS = {"v": ["sum", "min", "max", "avg", "count"], "*": ["count"]}
rows_st = st.lists(st.fixed_dictionaries({"t": st.integers(0, 899), "k": st.integers(0, 3), "v": values,
                                          "delay": st.sampled_from([0, 0, 0, 1, 2])}), max_size=80)


@settings(max_examples=60, deadline=None)
@given(rows_st, st.lists(st.sampled_from(PAIRS), min_size=2, max_size=3, unique=True), st.sampled_from([0, 25]))
def test_each_query_sweeps_its_windows_over_the_finer_slices(rows, pairs, delay):
    batches = [[] for _ in range(7)]
    for r in rows:
        batches[r["t"] // 180 + r["delay"]].append({"t": r["t"], "k": r["k"], "v": r["v"], "x": 0.0})
    wms = watermarks(batches, "t", delay)
    plans = [make_plan(w, s, mode="append", watermark=True, aggs=AGGS) for w, s in pairs]
    g = class_granularity([p.granularity for p in plans])
    slicer_plan = dataclasses.replace(plans[0], granularity=g)     # the class's slicer: at the gcd
    got = [{} for _ in plans]
    states: dict = {}
    for b, batch in enumerate(batches + [[]]):
        for s, (slices, counts) in packed_shard_inputs(slicer_plan, batch).items():
            results, states[s] = run_shared(plans, slices, states.get(s), wms[b], counts)
            for i, res in enumerate(results):
                out = rows_of(res.output, plans[i])
                assert not set(out) & set(got[i]), "a window emitted twice"
                got[i].update(out)
    for i, (w, s) in enumerate(pairs):
        want, _ = spark_stream_windows(batches, "t", "k", w, s, agg_list(AGGS), delay)
        assert_same(got[i], want)


@settings(max_examples=40, deadline=None)
@given(rows_st, st.sampled_from([(60, 30, 10), (120, 60, 20), (90, 30, 5)]), st.sampled_from(["windows", "changes"]))
def test_a_query_on_a_table_of_its_own_gives_the_same_rows_over_finer_slices(rows, wsg, emit):
    """A class's member that keeps a table of its own (ISTREAM / DSTREAM change intervals, or a table from an
    older checkpoint) steps alone (``run_shard``) over the class's finer slices: the same rows as over slices of its
    own granularity."""
    w, s, fine = wsg
    batches = [[] for _ in range(7)]
    for r in rows:
        batches[r["t"] // 180 + r["delay"]].append({"t": r["t"], "k": r["k"], "v": r["v"], "x": 0.0})
    wms = watermarks(batches, "t", 20)
    plan = make_plan(w, s, mode="append", watermark=True, aggs=AGGS, emit=emit)
    got = {}
    for slicer_plan in (plan, dataclasses.replace(plan, granularity=fine)):
        out, states = [], {}
        for b, batch in enumerate(batches + [[]]):
            for sh, (slices, counts) in packed_shard_inputs(slicer_plan, batch).items():
                res = run_shard(plan, slices, states.get(sh), wms[b], None, counts)
                states[sh] = res.state
                out.append(sorted(rows_of(res.output, plan).items(), key=repr))
        got[slicer_plan.granularity] = out
    assert got[fine] == got[plan.granularity]


# ---- checkpoints and end to end -----------------------------------------------------------------------------

def test_a_plan_written_before_keeps_equal_granularity_classes(tmp_path):
    """A plan pickled before classes spanned granularities has no ``granularity_ratio``: it reads 1, and a group
    started again on its checkpoint keeps that bound (so its shards' tables stay as they were); a new checkpoint
    takes :data:`MERGE_RATIO`."""
    from pyspark_cq.group.api import QueryGroup

    old = D.Plan(version=3)
    old.__dict__.pop("granularity_ratio")      # as pickled by the version before
    D.write_plan(str(tmp_path), old)
    restored = D.read_plan(str(tmp_path))
    assert restored.granularity_ratio == 1 and "granularity_ratio" not in restored.__dict__
    assert QueryGroup._granularity_ratio(restored) == 1
    assert QueryGroup._granularity_ratio(None) == MERGE_RATIO
    assert QueryGroup._granularity_ratio(D.Plan(granularity_ratio=MERGE_RATIO)) == MERGE_RATIO
