"""multi_join's probe steps over chunks under the chunk scheduler (STREAM §5.3, Chain): the same matches and
per-step counters as the kernel's depth-first ``insert_probe`` under every strategy, chunk size and bound.

Oracle: ``insert_probe`` on an identical state (itself tested against a nested-loop reference and, through
the operator, against Spark's chain of joins in ``test_multi_join.py``, where the chunked operator is tested
on Spark too).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq._native import load
from pyspark_cq.cost import chain
from pyspark_cq.operators._common.chunks import WHOLE_BATCHES, Schedule
from pyspark_cq.operators.multi_join.worker import MultiJoinConfig, MultiJoinWorker, metric_names, step_names

BOUNDS = {3: [(0, 1, 0, 50), (1, 2, -20, 30)], 4: [(0, 1, 0, 50), (1, 2, -20, 30), (0, 3, -40, 10)]}


def _worker(n):
    """The real worker; ``_probe_in_chunks`` reads only the number of inputs from the config."""
    return MultiJoinWorker(MultiJoinConfig(n, (), (), (), pa.schema([]), tuple(BOUNDS[n]), (), False, "mj"))


def _rows(rng, n_rows, rnd, i, nkeys):
    keys = rng.integers(0, nkeys, n_rows)
    times = rng.integers(rnd * 100, rnd * 100 + 150, n_rows)
    ids = np.arange(n_rows, dtype=np.int64) + 100_000 * (rnd * 8 + i)
    return keys.astype(np.int64), times.astype(np.int64), ids


def _both(n, seed, rounds, n_rows, nkeys, schedule_of):
    """Feed the same rows to two states, one by insert_probe, one by the worker's chunked steps; returns the
    sorted matches of each and the counters of each, plus the worker's schedulers' peaks."""
    rng = np.random.default_rng(seed)
    mjoin = load("_mjoin")
    ref, ours = (mjoin.MultiJoinState(n, [list(b) for b in BOUNDS[n]]) for _ in range(2))
    worker = _worker(n)
    want, got = [], []
    c_ref, c_ours = dict.fromkeys(metric_names(n), 0), dict.fromkeys(metric_names(n), 0)
    for rnd in range(rounds):
        for i in range(n):
            keys, times, ids = _rows(rng, n_rows, rnd, i, nkeys)
            order = list(rng.permutation([j for j in range(n) if j != i]))
            m, probed, matched = ref.insert_probe(i, keys, times, ids, None, order)
            want += map(tuple, m)
            for step, j in enumerate(order):
                c_ref[f"probed_{i}_{j}"] += int(probed[step])
                c_ref[f"matched_{i}_{j}"] += int(matched[step])
            for part in worker._probe_in_chunks(ours, i, order, keys, times, ids, schedule_of(n), c_ours):
                got += map(tuple, part)
    return sorted(want), sorted(got), c_ref, c_ours


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from([3, 4]), seed=st.integers(0, 10_000), strategy=st.sampled_from(chain.STRATEGIES),
       chunk=st.integers(8, 300), bound=st.one_of(st.none(), st.integers(1, 2000)), nkeys=st.integers(4, 30),
       prio=st.lists(st.floats(0, 10), min_size=12, max_size=12))
def test_chunked_probe_steps_equal_insert_probe(n, seed, strategy, chunk, bound, nkeys, prio):
    names = step_names(n)

    def schedule(_n):
        return Schedule(strategy, chunk, bound, tuple(prio[:len(names)]), tuple(prio[::-1][:len(names)]))

    want, got, c_ref, c_ours = _both(n, seed, 3, 40, nkeys, schedule)
    assert got == want
    for name in c_ref:
        if name.startswith(("probed_", "matched_")):
            assert c_ours[name] == c_ref[name], name
    assert c_ours["chunk_steps"] > 0


def test_the_bound_holds_the_partial_matches_back():
    """A fan-out join (few keys, many matches per step): operator-at-a-time (one chunk of everything) holds
    every partial match of an input's first step at once; Chain under a bound holds the bound plus what one
    chunk of the first step produces (a chunk of rows on a hot key fans out: no tighter figure is fixed)."""
    n, rows, chunk, bound = 3, 200, 32, 500
    whole = _both(n, 7, 2, rows, 4, lambda _n: Schedule("fifo", rows, None))
    under = _both(n, 7, 2, rows, 4, lambda _n: Schedule("chain", chunk, bound, (3.0, 1.0) * 3, None))
    assert whole[1] == whole[0] == under[1]
    peak_whole, peak_under = whole[3]["peak_buffered_rows"], under[3]["peak_buffered_rows"]
    assert peak_under * 3 < peak_whole


def test_schedule_from_params_names_probe_steps():
    worker = _worker(3)
    assert worker.schedule(None, "mj") is WHOLE_BATCHES
    s = worker.schedule({"params": {"max_buffered_rows": 100, "priorities": {"0_1": 2.0, "2_0": 1.0}}}, "mj")
    assert s.strategy == "chain" and s.priorities == (2.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"params\['priorities'\] names unknown predicates \['0_0'\]"):
        worker.schedule({"params": {"priorities": {"0_0": 1.0}}}, "mj")
    with pytest.raises(ValueError, match=r"mj: params\['chunk_rows'\] must be an integer >= 1"):
        worker.schedule({"params": {"chunk_rows": 0}}, "mj")
