"""The sliding aggregation's worker pipeline without Spark: inputs, the slicer and per-shard step run
batch by batch (state serialized in between, as in ``applyInPandasWithState``), and hypothesis
strategies for rows and streams. Shared by tests/test_aggregate_kernel.py and test_aggregate_control.py.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import strategies as st
from pyspark.sql import types as T

from pyspark_cq._native import load
from pyspark_cq.operators._common.shards import shard_keys
from pyspark_cq.operators.aggregate import spec as S
from pyspark_cq.operators.aggregate.config import HASH, SHARD, TIME, AggConfig, key_name, value_name
from pyspark_cq.operators.aggregate.shard import run_shard
from pyspark_cq.operators.aggregate.slicer import Slicer
from pyspark_cq.operators.aggregate.transport import unpack_slices

K = load("_aggregate")


class _Schema:
    """Stands in for a DataFrame where only ``.schema`` is read (spec parsing)."""

    def __init__(self, schema: T.StructType):
        self.schema = schema


SCHEMA = T.StructType([
    T.StructField("t", T.TimestampType()),
    T.StructField("k", T.LongType()),
    T.StructField("v", T.LongType()),
    T.StructField("x", T.DoubleType()),
])
ALL_AGGS = {"v": ["sum", "min", "max", "avg", "count"], "x": ["sum", "max", "min", "avg"], "*": ["count"]}


def agg_list(aggs):
    return [(c, a) for c, names in aggs.items() for a in names]


def make_plan(window, slide, granularity=None, aggs=None, emit="windows", mode="batch", shards=3,
              watermark=False, schema=SCHEMA, by=("k",)):
    df = _Schema(schema)
    aggs = aggs or ALL_AGGS
    spec = S.parse_aggs(df, aggs, list(by))
    keys = S.key_columns(df, list(by))
    g = granularity or math.gcd(window, slide)
    bounds = ("window_start", "window_end") if emit == "windows" else ("valid_from", "valid_to")
    names = bounds + tuple(by) + tuple(o.name for o in spec.outputs)
    return AggConfig(spec, keys, T.TimestampType(), window, slide, g, emit, mode, watermark, shards, names)


def input_batch(rows, plan, hash_of=None):
    """The slicer's input as Spark would send it: time, key hash, keys, values."""
    hash_of = hash_of or (lambda k: -1 if k is None else k * 7919 + 3)
    cols = {TIME: pa.array([r["t"] for r in rows], type=pa.timestamp("us", tz="UTC")),
            HASH: pa.array([hash_of(r.get("k")) for r in rows], type=pa.int64())}
    for i, k in enumerate(plan.keys):
        cols[key_name(i)] = pa.array([r[k.name] for r in rows], type=S.arrow_type(k.dtype))
    for i, vc in enumerate(plan.spec.values):
        if vc.derive != "shed":   # kept_column's shed-row marker is the slicer's own, not an input column
            cols[value_name(i)] = pa.array([r[vc.name] for r in rows], type=S.arrow_type(vc.dtype))
    return pa.RecordBatch.from_pydict(cols)


def slice_rows(plan, rows, tasks=2, hash_of=None, packed=False):
    """Sliced rows of one micro-batch, produced by ``tasks`` map tasks (so slices of one key and granule
    may arrive twice and must merge); ``packed``: in the packed transport (markers included)."""
    out = []
    for part in range(tasks):
        chunk = rows[part::tasks]
        batches = [input_batch(chunk, plan, hash_of)] if chunk else []
        out += list(Slicer(plan, tag=False, packed=packed)(batches))
    return pa.Table.from_batches(out)


def packed_shard_inputs(plan, batch):
    """Per shard: the packed slices of one micro-batch and its counts, as the stateful side unpacks them (a
    marker-only batch when ``batch`` is empty)."""
    if batch:
        table = slice_rows(plan, batch, packed=True)
    else:
        table = pa.Table.from_batches([Slicer(plan, tag=False, packed=True).markers(0)])
    shard_col = np.asarray(table.column(SHARD).to_numpy())
    out = {}
    for s in shard_keys(plan.shards):
        part = table.take(pa.array(np.flatnonzero(shard_col == s)))
        out[s] = unpack_slices(plan.slices_arrow_schema(), [part.to_pandas()])
    return out


def rows_of(table: pa.Table, plan):
    """{(from, to, key): aggregates} of an output table, times in microseconds."""
    d = table.to_pydict()
    names = plan.out_names
    out = {}
    for i in range(table.num_rows):
        frm = table.column(0)[i].cast(pa.int64()).as_py()
        to = table.column(1)[i].cast(pa.int64()).as_py()
        key = d[names[2]][i] if plan.keys else None
        vals = tuple(d[n][i] for n in names[2 + len(plan.keys):])
        out[(frm, to, key)] = vals
    return out


def run_stream(plan, batches, wms, hash_of=None, packed=False):
    """Drive run_shard over micro-batches like applyInPandasWithState; returns (outputs per batch, metrics).
    ``packed``: the slices travel in the packed transport, through its pandas form (as the stateful side
    receives them)."""
    states = {}
    outputs, metrics = [], []
    for b, batch in enumerate(batches + [[]]):
        if batch:
            table = slice_rows(plan, batch, hash_of=hash_of, packed=packed)
        else:
            table = pa.Table.from_batches([Slicer(plan, tag=False, packed=packed).markers(0)])
        shard_col = np.asarray(table.column(SHARD).to_numpy())
        emitted, m = {}, {}
        for s in shard_keys(plan.shards):  # the shards' group keys (operators/_common/shards.py)
            part = table.take(pa.array(np.flatnonzero(shard_col == s)))
            if packed:
                slices, counts = unpack_slices(plan.slices_arrow_schema(), [part.to_pandas()])
                res = run_shard(plan, slices, states.get(s), wms[b], None, counts)
            else:
                res = run_shard(plan, part, states.get(s), wms[b])
            states[s] = res.state
            emitted.update(rows_of(res.output, plan))
            for name, value in res.metrics.items():
                m[name] = m.get(name, 0) + value
        outputs.append(emitted)
        metrics.append(m)
    return outputs, metrics


def assert_same(got: dict, want: dict):
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5])
    for key in want:
        for g, w in zip(got[key], want[key]):
            if isinstance(w, float) and isinstance(g, float):
                assert (math.isnan(w) and math.isnan(g)) or g == pytest.approx(w, rel=1e-9, abs=1e-9), (key, got[key], want[key])
            else:
                assert g == w, (key, got[key], want[key])


values = st.one_of(st.none(), st.integers(-1000, 1000))
floats = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([math.nan, 0.0, -0.0, math.inf]))
rows_st = st.lists(st.fixed_dictionaries({
    "t": st.integers(0, 200), "k": st.one_of(st.none(), st.integers(0, 6)), "v": values, "x": floats}),
    max_size=60)
window_slide = st.sampled_from([(1, 1), (3, 1), (12, 4), (10, 4), (6, 6), (60, 1), (7, 3), (9, 2)])


# ---- constants and small kernels ---------------------------------------------------------------------


def split_batches(rows, cuts):
    """Rows in arrival order cut into micro-batches (some empty)."""
    bounds = sorted(set(min(c, len(rows)) for c in cuts))
    out, prev = [], 0
    for b in bounds + [len(rows)]:
        out.append(rows[prev:b])
        prev = b
    return out


stream_st = st.tuples(
    st.lists(st.fixed_dictionaries({"t": st.integers(0, 300), "k": st.integers(0, 9), "v": values, "x": floats}),
             max_size=80),
    st.lists(st.integers(0, 80), max_size=5),
    st.sampled_from([0, 5, 20]),
)


def arrival_order(rows):
    """Mostly increasing times with disorder: sort by time plus a jitter, so late rows occur."""
    return sorted(rows, key=lambda r: r["t"] + ((r["k"] * 37 + (r["v"] or 0)) % 41) - 20)
