"""The chunk scheduler of multi-step worker stages (STREAM §5.3, Chain): same rows under every strategy,
the same schedule as the pure model, bounded buffered rows.

Oracles: numpy masks (the conjunction of the predicates), :func:`pyspark_cq.cost.chain.simulate_trace` (the
model's sequence of operators and queue sizes), and the memory bound's arithmetic.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.cost import chain
from pyspark_cq.operators._common.chunks import ChunkScheduler, Schedule, schedule_from_params
from pyspark_cq.operators.select_chain.worker import _Chain, _shed


def _filter(fn):
    return lambda b: b.filter(fn(b))


def _batch(x):
    return pa.RecordBatch.from_arrays([pa.array(np.asarray(x, dtype=np.int64))], names=["x"])


# Steps with exact selectivities on 0, 1, 2, ... when chunks are multiples of 16: 1/2, then 1/4 of those,
# then 1/2 of those.
EXACT = [(_filter(lambda b: pc.equal(pc.bit_wise_and(b["x"], 1), 0)), 0.5),
         (_filter(lambda b: pc.equal(pc.bit_wise_and(b["x"], 6), 0)), 0.25),
         (_filter(lambda b: pc.equal(pc.bit_wise_and(b["x"], 8), 0)), 0.5)]


@pytest.mark.parametrize("strategy", chain.STRATEGIES)
@pytest.mark.parametrize("chunks, capacities", [(16, (1, 1, 1)), (64, (1, 1, 1))])
def test_the_worker_schedules_as_the_model(strategy, chunks, capacities):
    """One input batch of ``chunks`` chunks is the model's burst at t = 0; every step consumes one chunk per
    time unit: the worker's steps and buffered rows are simulate_trace's ``ran`` and queues."""
    chunk = 16
    ops = [(c * chunk, sel) for c, (_, sel) in zip(capacities, EXACT)]
    prio = chain.priorities(ops)
    sched = ChunkScheduler([f for f, _ in EXACT], Schedule(strategy, chunk, None, tuple(prio),
                                                           tuple(s for _, s in ops)), trace=True)
    out = list(sched.run(iter([_batch(np.arange(chunks * chunk))])))
    trace = chain.simulate_trace(ops, {0: chunks * chunk}, strategy, 4 * chunks)
    ran = [i for i in trace.ran if i is not None]
    assert sched.ran == ran
    model_buffered = [sum(q[1:]) for q in trace.queues[1:len(ran) + 1]]
    assert sched.buffered_after == model_buffered
    x = np.arange(chunks * chunk)
    assert sorted(np.concatenate([b.column(0).to_numpy() for b in out]).tolist()) == x[(x & 15) == 0].tolist()


def test_chain_runs_by_priority_and_fifo_depth_first():
    """With a slow second step Chain's first step is the steepest, so without a bound it reads everything
    first (operator at a time); fifo runs every chunk to completion and never buffers more than one chunk's
    survivors."""
    steps = [f for f, _ in EXACT]
    prio = tuple(chain.priorities([(16, 0.5), (1, 0.25), (16, 0.5)]))
    assert prio[0] > prio[1] == prio[2]
    batches = [_batch(np.arange(i * 64, (i + 1) * 64)) for i in range(4)]
    chain_run = ChunkScheduler(steps, Schedule("chain", 16, None, prio), trace=True)
    list(chain_run.run(iter(batches)))
    assert chain_run.ran[:16] == [0] * 16 and chain_run.peak_buffered == 128
    fifo = ChunkScheduler(steps, Schedule("fifo", 16), trace=True)
    list(fifo.run(iter(batches)))
    assert fifo.peak_buffered <= 8 and fifo.ran[:3] == [0, 1, 2]


@pytest.mark.parametrize("strategy", chain.STRATEGIES)
def test_the_bound_holds_input_back(strategy):
    steps = [f for f, _ in EXACT]
    prio = tuple(chain.priorities([(16, s) for _, s in EXACT]))
    sel = tuple(s for _, s in EXACT)
    batches = [_batch(np.arange(i * 256, (i + 1) * 256)) for i in range(8)]
    sched = ChunkScheduler(steps, Schedule(strategy, 32, 40, prio, sel), trace=True)
    out = list(sched.run(iter(batches)))
    assert sched.peak_buffered <= 40 + 32 // 2       # the bound + one chunk of the first step's survivors
    x = np.arange(8 * 256)
    assert sorted(np.concatenate([b.column(0).to_numpy() for b in out]).tolist()) == x[(x & 15) == 0].tolist()


# ---- same rows under every strategy (hypothesis, numpy oracle) ---------------------------------------------

def _even(b):
    return pc.equal(pc.bit_wise_and(b["x"], 1), 0)


def _small(b):
    return pc.less(b["x"], 50)


def _y3(b):
    return np.asarray(b["y"]) % 3 != 0


PREDICATES = {"even": _even, "small": _small, "y3": _y3}
COUNTERS = tuple(f"{k}_{n}" for n in PREDICATES for k in ("rows_in", "rows_passed", "nanos")) + (
    "input_rows", "output_rows", "shed_rows")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-100, 100), st.integers(-100, 100)), max_size=40), max_size=5),
       st.permutations(list(PREDICATES)), st.sampled_from(chain.STRATEGIES), st.integers(1, 17),
       st.one_of(st.none(), st.integers(1, 30)),
       st.lists(st.floats(0, 5), min_size=3, max_size=3), st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_rows_and_counts_do_not_depend_on_the_schedule(batches, order, strategy, chunk, bound, prio, sel):
    schema = pa.schema([("x", pa.int64()), ("y", pa.int64())])
    arrow = [pa.RecordBatch.from_arrays([pa.array([r[0] for r in b], pa.int64()), pa.array([r[1] for r in b],
                                                                                              pa.int64())],
                                        schema=schema) for b in batches]
    worker = _Chain("select_chain 't'", tuple(PREDICATES), dict(PREDICATES), ("x", "y"), None, schema, COUNTERS)
    totals = dict.fromkeys(COUNTERS, 0)
    params = {"schedule": strategy, "chunk_rows": chunk, "priorities": dict(zip(order, prio)),
              "selectivities": dict(zip(order, sel))}
    if bound is not None:
        params["max_buffered_rows"] = bound
    sched = ChunkScheduler(worker.steps(tuple(order), totals), schedule_from_params(params, order, where="t"))
    out = list(sched.run(_shed(b, 0.0, totals) for b in arrow))
    got = sorted((a, b) for o in out for a, b in zip(o.column(0).to_pylist(), o.column(1).to_pylist()))
    x = np.array([r[0] for b in batches for r in b], dtype=np.int64)
    y = np.array([r[1] for b in batches for r in b], dtype=np.int64)
    keep = (x % 2 == 0) & (x < 50) & (y % 3 != 0)
    assert got == sorted(zip(x[keep].tolist(), y[keep].tolist()))
    assert totals["input_rows"] == len(x) and totals["output_rows"] == int(keep.sum())
    alive = np.ones(len(x), dtype=bool)
    masks = {"even": x % 2 == 0, "small": x < 50, "y3": y % 3 != 0}
    for name in order:
        assert totals[f"rows_in_{name}"] == int(alive.sum())
        alive &= masks[name]
        assert totals[f"rows_passed_{name}"] == int(alive.sum())
    if bound is not None:
        assert sched.peak_buffered <= bound + chunk
    assert sched.peak_rss > 0


# ---- the parameters -----------------------------------------------------------------------------------------

def test_params_defaults():
    order = ("a", "b")
    assert schedule_from_params(None, order, where="w") == Schedule()
    assert schedule_from_params({"other": 1}, order, where="w") == Schedule()
    assert schedule_from_params({"max_buffered_rows": 10}, order, where="w").strategy == "chain"
    assert schedule_from_params({"chunk_rows": 10}, order, where="w").strategy == "fifo"
    s = schedule_from_params({"schedule": "greedy", "selectivities": {"b": 0.5}}, order, where="w")
    assert s.selectivities == (0.0, 0.5) and s.chunk_rows == 65_536 and s.max_buffered_rows is None


@pytest.mark.parametrize("params, match", [
    ({"schedule": "edf"}, r"select_chain 'f': params\['schedule'\] must be one of"),
    ({"chunk_rows": 0}, r"params\['chunk_rows'\] must be an integer >= 1"),
    ({"chunk_rows": 2.5}, r"params\['chunk_rows'\] must be an integer >= 1"),
    ({"max_buffered_rows": -1}, r"params\['max_buffered_rows'\] must be an integer >= 1"),
    ({"schedule": "chain", "priorities": [1, 2]}, r"params\['priorities'\] must be a mapping"),
    ({"schedule": "chain", "priorities": {"c": 1}}, r"params\['priorities'\] names unknown predicates \['c'\]"),
    ({"schedule": "chain", "priorities": {"a": -1}}, r"params\['priorities'\]\['a'\] must be a finite number"),
    ({"schedule": "greedy", "selectivities": {"a": "x"}}, r"params\['selectivities'\]\['a'\] must be"),
])
def test_bad_params_name_the_operator_and_key(params, match):
    with pytest.raises(ValueError, match=match):
        schedule_from_params(params, ("a", "b"), where="select_chain 'f'")


def test_chooser_rejects_bad_arguments():
    with pytest.raises(ValueError, match="strategy must be one of"):
        chain.chooser("edf")
    with pytest.raises(TypeError, match="priorities must be a sequence"):
        chain.chooser("chain", priorities="ab")
    with pytest.raises(ValueError, match=r"selectivities\[1\] must be a real number"):
        chain.chooser("greedy", selectivities=[0.5, float("nan")])
