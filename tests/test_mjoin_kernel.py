"""The multi-way join kernel (pyspark_cq._mjoin, issue 15 part 1) against a plain-Python reference.

No Spark. The reference keeps every stored row and, for the rows of each call, enumerates by nested loops
all tuples (one row per input, the arriving row among them) with equal non-null keys that satisfy every
bound, where the other rows were stored by earlier calls: over a run each qualifying tuple is emitted
exactly once, by the call that inserted its last row.
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq._native import load

mj = load("_mjoin")


class Reference:
    def __init__(self, n, bounds):
        self.n, self.bounds = n, bounds
        self.rows = [[] for _ in range(n)]  # (key, time, id, end)

    def ok(self, tup):
        return all(lo <= tup[j][1] - tup[i][1] <= up for i, j, lo, up in self.bounds)

    def insert_probe(self, inp, keys, times, ids, nulls, ends):
        out = []
        for k, t, i, nl in zip(keys, times, ids, nulls):
            if nl:
                continue
            others = [[r for r in self.rows[o] if r[0] == k] if o != inp else [(k, t, i, None)]
                      for o in range(self.n)]
            for tup in itertools.product(*others):
                if self.ok(tup):
                    out.append(tuple(r[2] for r in tup))
        for k, t, i, nl, e in zip(keys, times, ids, nulls, ends):
            if not nl:
                self.rows[inp].append((k, t, i, e))
        return out

    def evict(self, inp, threshold):
        gone = [r[2] for r in self.rows[inp] if r[3] <= threshold]
        self.rows[inp] = [r for r in self.rows[inp] if r[3] > threshold]
        return gone


def _tuples(matches):
    return Counter(map(tuple, matches.tolist()))


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 4))
    # a spanning tree of bounds (connected), plus a few extra ones
    bounds = []
    for j in range(1, n):
        i = draw(st.integers(0, j - 1))
        a, b = draw(st.integers(-10, 2)), draw(st.integers(0, 20))
        pair = (i, j) if draw(st.booleans()) else (j, i)
        bounds.append((pair[0], pair[1], a, a + b))
    for _ in range(draw(st.integers(0, 2))):
        i, j = draw(st.permutations(range(n)))[:2]
        a, b = draw(st.integers(-10, 2)), draw(st.integers(0, 20))
        bounds.append((i, j, a, a + b))
    calls = []
    next_id = 0
    for c in range(draw(st.integers(1, 12))):
        # mostly round robin, so that every input holds rows and n-way matches occur
        inp = c % n if draw(st.integers(0, 3)) else draw(st.integers(0, n - 1))
        m = draw(st.integers(0, 6))
        keys = draw(st.lists(st.integers(0, 1), min_size=m, max_size=m))
        times = draw(st.lists(st.integers(0, 12), min_size=m, max_size=m))
        nulls = draw(st.lists(st.sampled_from([False, False, False, True]), min_size=m, max_size=m))
        ends = [t + draw(st.integers(0, 5)) for t in times]
        ids = list(range(next_id, next_id + m))
        next_id += m
        order = draw(st.permutations([o for o in range(n) if o != inp]))
        evict = draw(st.none() | st.none() | st.tuples(st.integers(0, n - 1), st.integers(-1, 17)))
        calls.append((inp, keys, times, ids, nulls, ends, list(order), evict))
    roundtrip_at = draw(st.integers(0, len(calls)))
    return n, bounds, calls, roundtrip_at


def _arrays(keys, times, ids, nulls, ends):
    return (np.array(keys, np.int64), np.array(times, np.int64), np.array(ids, np.int64),
            np.array(nulls, np.uint8), np.array(ends, np.int64))


def _check_run(n, bounds, calls, roundtrip_at):
    """Run `calls` through the kernel and the reference; returns the number of emitted tuples."""
    state = mj.MultiJoinState(n, bounds)
    ref = Reference(n, bounds)
    emitted = 0
    for c, (inp, keys, times, ids, nulls, ends, order, evict) in enumerate(calls):
        if c == roundtrip_at:
            blob = state.serialize()
            state = mj.MultiJoinState.deserialize(blob)
            assert state.serialize() == blob
            assert state.n_inputs == n and state.bounds == bounds
        k, t, i, nl, e = _arrays(keys, times, ids, nulls, ends)
        matches, probed, matched = state.insert_probe(inp, k, t, i, nl, order, ends=e)
        expect = ref.insert_probe(inp, keys, times, ids, nulls, ends)
        emitted += len(expect)
        assert matches.shape == (len(expect), n)
        assert _tuples(matches) == Counter(expect)
        # per-step counters
        assert len(probed) == len(matched) == n - 1
        assert probed[0] == sum(1 for x in nulls if not x)
        assert list(matched[:-1]) == list(probed[1:])
        assert matched[-1] == len(expect)
        for o in range(n):
            assert state.rows(o) == len(ref.rows[o])
        if evict is not None:
            eo, thr = evict
            got = state.evict(eo, thr)
            assert sorted(got.tolist()) == sorted(ref.evict(eo, thr))
            assert state.rows(eo) == len(ref.rows[eo])
            me = state.min_end(eo)
            assert me == (min(r[3] for r in ref.rows[eo]) if ref.rows[eo] else None)
    return emitted


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_against_reference(sc):
    _check_run(*sc)


@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("seed", range(4))
def test_dense_runs_against_reference(n, seed):
    """Many rows, few keys, wide bounds: n-way matches in numbers (hypothesis favours small cases)."""
    rng = np.random.default_rng(seed)
    bounds = [(int(rng.integers(0, j)), j, int(lo), int(lo) + int(rng.integers(8, 25)))
              for j, lo in zip(range(1, n), rng.integers(-12, 0, n - 1))]
    bounds.append((0, n - 1, -20, 20))
    calls, next_id = [], 0
    for c in range(30):
        inp = c % n if c < 2 * n else int(rng.integers(0, n))
        m = int(rng.integers(0, 8))
        times = [int(x) for x in rng.integers(c, c + 15, m)]
        others = [o for o in range(n) if o != inp]
        calls.append((inp, [int(x) for x in rng.integers(0, 3, m)], times, list(range(next_id, next_id + m)),
                      [bool(x) for x in rng.random(m) < 0.1], [x + int(rng.integers(0, 6)) for x in times],
                      [int(x) for x in rng.permutation(others)],
                      (int(rng.integers(0, n)), c - 12) if c % 5 == 4 else None))
        next_id += m
    assert _check_run(n, bounds, calls, roundtrip_at=15) > 0


@settings(max_examples=60, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_order_does_not_change_output(sc, rnd):
    n, bounds, calls, _ = sc
    a, b = mj.MultiJoinState(n, bounds), mj.MultiJoinState(n, bounds)
    for inp, keys, times, ids, nulls, ends, order, _ in calls:
        other = list(order)
        rnd.shuffle(other)
        arrs = _arrays(keys, times, ids, nulls, ends)
        ma = a.insert_probe(inp, *arrs[:4], order, ends=arrs[4])[0]
        mb = b.insert_probe(inp, *arrs[:4], other, ends=arrs[4])[0]
        assert _tuples(ma) == _tuples(mb)


def test_each_tuple_once_in_the_call_of_its_last_row():
    s = mj.MultiJoinState(3, [(0, 1, 0, 10), (0, 2, 0, 10)])
    one = np.ones(1, np.int64)
    assert s.insert_probe(0, one, [0], [100], None, [1, 2])[0].shape == (0, 3)
    assert s.insert_probe(1, one, [5], [200], None, [0, 2])[0].shape == (0, 3)
    m, probed, matched = s.insert_probe(2, one, [7], [300], None, [1, 0])
    assert m.tolist() == [[100, 200, 300]]
    assert probed.tolist() == [1, 1] and matched.tolist() == [1, 1]
    # rows of one call do not see each other
    s2 = mj.MultiJoinState(2, [(0, 1, -5, 5)])
    assert s2.insert_probe(0, [1, 1], [0, 0], [1, 2], None, [1])[0].shape == (0, 2)


def test_null_keys_never_match_and_are_not_stored():
    s = mj.MultiJoinState(2, [(0, 1, -5, 5)])
    s.insert_probe(0, [0, 0], [0, 0], [1, 2], np.array([1, 0], np.uint8), [1])
    assert s.rows(0) == 1
    m, probed, _ = s.insert_probe(1, [0, 0], [0, 0], [3, 4], np.array([0, 1], np.uint8), [0])
    assert m.tolist() == [[2, 3]] and probed.tolist() == [1]


def test_evict_by_expiry_key():
    s = mj.MultiJoinState(2, [])
    s.insert_probe(0, [1, 2, 3], [0, 1, 2], [10, 11, 12], None, [1], ends=[5, 3, 9])
    assert s.min_end(0) == 3
    assert sorted(s.evict(0, 5).tolist()) == [10, 11]
    assert s.rows(0) == 1 and s.keys(0) == 1
    assert s.evict(0, 5).tolist() == []
    assert s.evict(1, 100).tolist() == []


@pytest.mark.parametrize(
    ("call", "word"),
    [
        (lambda s: s.insert_probe(0, [1], [0], [0], None, [1]), "order"),
        (lambda s: s.insert_probe(0, [1], [0], [0], None, [1, 1]), "order"),
        (lambda s: s.insert_probe(0, [1], [0], [0], None, [0, 1]), "order"),
        (lambda s: s.insert_probe(0, [1], [0], [0], None, [1, 5]), "order"),
        (lambda s: s.insert_probe(3, [1], [0], [0], None, [0, 1]), "input"),
        (lambda s: s.insert_probe(0, [1], [0, 1], [0], None, [1, 2]), "times"),
        (lambda s: s.insert_probe(0, [1], [0], [0, 2], None, [1, 2]), "ids"),
        (lambda s: s.insert_probe(0, [1], [0], [0], [0, 0], [1, 2]), "null_key"),
        (lambda s: s.insert_probe(0, [1], [0], [0], None, [1, 2], ends=[1, 2]), "ends"),
        (lambda s: s.insert_probe(0, [[1]], [0], [0], None, [1, 2]), "keys"),
        (lambda s: s.evict(-1, 0), "input"),
        (lambda s: s.rows(7), "input"),
    ],
)
def test_bad_arguments_name_the_argument(call, word):
    s = mj.MultiJoinState(3, [(0, 1, 0, 1)])
    with pytest.raises(ValueError, match=word):
        call(s)


@pytest.mark.parametrize(
    ("n", "bounds", "word"),
    [(1, [], "n_inputs"), (7, [], "n_inputs"), (2, [(0, 0, 0, 1)], "bounds"), (2, [(0, 2, 0, 1)], "bounds"),
     (2, [(0, 1, 2, 1)], "bounds"), (2, [(0, 1, 2)], "bounds")],
)
def test_bad_constructor_arguments(n, bounds, word):
    with pytest.raises(ValueError, match=word):
        mj.MultiJoinState(n, bounds)


def test_corrupt_blob_raises():
    s = mj.MultiJoinState(2, [(0, 1, 0, 1)])
    s.insert_probe(0, [1], [0], [0], None, [1])
    blob = s.serialize()
    for bad in (blob[:-3], b"nope", blob + b"x"):
        with pytest.raises(ValueError):
            mj.MultiJoinState.deserialize(bad)


# --- staged expiry (no explicit ends): never loses a result, keeps less than the full reach -------------


@st.composite
def watermarked_runs(draw):
    """Batches whose rows are all later than the previous threshold (the watermark), with the threshold
    advancing between batches; contradictory bound sets are avoided by drawing a spanning tree first.
    """
    n = draw(st.integers(2, 4))
    bounds = []
    for j in range(1, n):
        i = draw(st.integers(0, j - 1))
        a, b = draw(st.integers(-8, 4)), draw(st.integers(0, 10))
        bounds.append((i, j, a, a + b) if draw(st.booleans()) else (j, i, -(a + b), -a))
    batches, wm = [], 0
    for _ in range(draw(st.integers(1, 8))):
        rows = []
        for _ in range(n):
            m = draw(st.integers(0, 5))
            rows.append((draw(st.lists(st.integers(0, 2), min_size=m, max_size=m)),
                         draw(st.lists(st.integers(wm + 1, wm + 12), min_size=m, max_size=m))))
        wm += draw(st.integers(0, 8))
        batches.append((rows, wm))
    return n, bounds, batches


def _run_staged(n, bounds, batches, *, evict, roundtrip):
    state = mj.MultiJoinState(n, bounds)
    out, next_id, peak = Counter(), 0, 0
    for b, (rows, wm) in enumerate(batches):
        for inp, (keys, times) in enumerate(rows):
            ids = np.arange(next_id, next_id + len(keys), dtype=np.int64)
            next_id += len(keys)
            order = [o for o in range(n) if o != inp]
            matches, _, _ = state.insert_probe(inp, np.array(keys, np.int64), np.array(times, np.int64), ids,
                                               None, order)
            out += _tuples(matches)
        if evict:
            for inp in range(n):
                state.evict(inp, wm)
        peak = max(peak, sum(state.rows(i) for i in range(n)))
        if roundtrip and b % 2:
            state = mj.MultiJoinState.deserialize(state.serialize())
    return out, peak


@settings(max_examples=300, deadline=None)
@given(watermarked_runs(), st.booleans())
def test_staged_expiry_never_loses_a_result(run, roundtrip):
    n, bounds, batches = run
    kept, _ = _run_staged(n, bounds, batches, evict=False, roundtrip=False)
    evicted, _ = _run_staged(n, bounds, batches, evict=True, roundtrip=roundtrip)
    assert evicted == kept


def test_staged_expiry_drops_rows_without_a_partner_before_the_full_reach():
    # funnel: t1 in [t0, t0 + 10], t2 in [t1, t1 + 60]; an impression (input 0) reaches purchases 70 later
    state = mj.MultiJoinState(3, [(0, 1, 0, 10), (1, 2, 0, 60)])
    order = {0: [1, 2], 1: [0, 2], 2: [1, 0]}
    state.insert_probe(0, np.array([1, 2]), np.array([0, 0]), np.array([0, 1]), None, order[0])
    state.insert_probe(1, np.array([1]), np.array([5]), np.array([2]), None, order[1])  # a click for key 1
    assert list(state.evict(0, 10)) == [1]   # key 2: no click stored, none can come: gone at 10, not 70
    assert state.rows(0) == 1
    assert list(state.evict(0, 69)) == []    # key 1 has its click: kept until purchases can no longer come
    assert list(state.evict(0, 70)) == [0]
