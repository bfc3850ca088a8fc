"""Stream constraints on the interval join (STREAM §5.2, issue 43), outside Spark.

The vocabulary's checks; the eviction rule of docs/constraints.md against a plain-Python symmetric band join
(:func:`reference`: every row probes the other side's stored rows, is stored, and leaves when the watermark
passes its expiry key -- or, under the rule, when it has matched its one partner or its delay bound passed);
the join's stateful function driven as PySpark's worker drives it (tests/test_join_resident.py's harness):
with constraints it outputs what the plain reference without them outputs, batch by batch, from exactly the
reference's smaller state; violations are counted. On Spark, against Spark's own join:
tests/test_join_constraints_spark.py.
"""
from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pandas as pd
import pytest
from test_join_resident import BASE_US, DELAY_MS, _config, _state, _unpacked, transport_frame

from pyspark_cq import constraints as C
from pyspark_cq.operators._common import metrics as _metrics
from pyspark_cq.operators.join.driver import _STATE_SCHEMA
from pyspark_cq.operators.join.worker import LEFT, RIGHT, JoinWorker, evict_at_ms
from pyspark_cq.vocabulary import metrics as M

LOWER, UPPER = -5_000_000, 10_000_000   # test_join_resident's band (µs)


# -- the vocabulary ---------------------------------------------------------------------------------------------

def test_constructors_and_names():
    u = C.unique("right", "k")
    assert (u.kind, u.side, u.cols, u.name) == ("unique", "right", ("k",), "unique_right")
    m = C.many_to_one(child="right", parent="left", delay="2 seconds")
    assert (m.side, m.other, m.delay, m.name) == ("right", "left", 2_000_000, "many_to_one_right")
    assert C.clustered("left", 3).k == 3 and C.ordered("right").k == 0


@pytest.mark.parametrize("call, error, words", [
    (lambda: C.unique("middle", "k"), ValueError, "side must be 'left' or 'right'"),
    (lambda: C.unique("left", []), TypeError, "cols must be a column name or a non-empty list"),
    (lambda: C.unique("left", ["k", "k"]), ValueError, "cols names a column twice"),
    (lambda: C.many_to_one("left", "left"), ValueError, "child and parent must be different"),
    (lambda: C.many_to_one("left", "right", "-1 second"), ValueError, "delay"),
    (lambda: C.many_to_one("up", "right"), ValueError, "child must be 'left' or 'right'"),
    (lambda: C.clustered("left", -1), ValueError, "k must be an integer >= 0"),
    (lambda: C.ordered("left", 1.5), ValueError, "k must be an integer >= 0"),
    (lambda: C.check_constraints(C.unique("left", "k"), {"left": ["k"], "right": ["k"]}, "f"), TypeError,
     "constraints must be a list"),
    (lambda: C.check_constraints(["unique"], {"left": ["k"], "right": ["k"]}, "f"), TypeError, "constraints[0]"),
    (lambda: C.check_constraints([C.unique("left", "v")], {"left": ["k"], "right": ["k"]}, "f"), ValueError,
     "are not join-key columns"),
    (lambda: C.check_constraints([C.clustered("left")], {"left": ["k"], "right": ["k"]}, "f"), ValueError,
     "does not exploit clustered"),
    (lambda: C.check_constraints([C.unique("left", "k")] * 2, {"left": ["k"], "right": ["k"]}, "f"), ValueError,
     "a second unique"),
    (lambda: C.control_enabled({"constraint_unique_left": "yes"}, [C.unique("left", "k")]), TypeError,
     "params['constraint_unique_left'] must be true or false"),
])
def test_checks_name_the_argument(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)


def test_eviction_of_each_constraint():
    assert not C.join_eviction([]).active
    e = C.join_eviction([C.unique("right", "k")])
    assert e == C.JoinEviction(drop_matched=(True, False), delay=(None, None), unique=(False, True))
    e = C.join_eviction([C.many_to_one(child="right", parent="left", delay="1 second")])
    assert e == C.JoinEviction(drop_matched=(False, True), delay=(None, 1_000_000), unique=(True, False))
    both = [C.unique("left", "k"), C.unique("right", "k")]
    assert C.join_eviction(both).drop_matched == (True, True)
    off = C.control_enabled({"constraint_unique_left": False}, both)
    assert off == {"unique_left": False}
    assert C.join_eviction(both, off) == C.JoinEviction((True, False), (None, None), (False, True))
    assert C.control_enabled({"drop_left": 0.1}, both) is None


def test_expiry_keys():
    ends = np.array([10, 20, 30])
    assert C.drop_matched_ends(ends, np.array([0, 1, 0], np.uint8)).tolist() == [10, C.DROP_NOW, 30]
    # a child goes once the watermark (ms) reaches its time + delay, rounded up; never later than its band says
    assert C.delay_ends(ends, np.array([1_000, 15_500, 40_000]), 2_000).tolist() == [3, 18, 30]
    assert C.delay_ends(ends, np.array([0, 0, 0]), None) is ends


# -- plain-Python oracle ------------------------------------------------------------------------------------------

def reference(batches, eviction=None):
    """Plain-Python band join over ``batches`` (per batch: ``[(key, t_us, id), ...]`` per side and the watermark
    in ms): per batch, left rows then right rows probe the other side's stored rows (equal non-null key,
    ``l.t + LOWER <= r.t <= l.t + UPPER``) and are stored with the expiry key of :func:`evict_at_ms`; then, under
    ``eviction``, rows of a ``drop_matched`` side that have matched leave, and a row of a ``delay`` side leaves once
    the watermark reaches its time + delay; then the watermark evicts. Returns per batch (sorted (left id, right
    id) pairs, stored rows).
    """
    stored = ([], [])   # rows [key, t, id, end, matched]
    out = []
    for rows, wm in batches:
        pairs = []
        for side in (LEFT, RIGHT):
            for key, t, rid in rows[side]:
                matched = False
                for other in stored[1 - side]:
                    lt, rt = (t, other[1]) if side == LEFT else (other[1], t)
                    if key is not None and other[0] == key and lt + LOWER <= rt <= lt + UPPER:
                        other[4] = matched = True
                        pairs.append((rid, other[2]) if side == LEFT else (other[2], rid))
                end = int(evict_at_ms(np.array([t]), LOWER, UPPER, side)[0])
                if eviction is not None and eviction.delay[side] is not None:
                    end = min(end, -(-(t + eviction.delay[side]) // 1000))
                stored[side].append([key, t, rid, end, matched])
        for side in (LEFT, RIGHT):
            drop = eviction is not None and eviction.drop_matched[side]
            stored[side][:] = [r for r in stored[side] if r[3] > wm and not (drop and r[4])]
        out.append((sorted(pairs), len(stored[0]) + len(stored[1])))
    return out


def _streams(kind: str, n_batches: int = 10, seed: int = 5, duplicates: int = 0):
    """Per batch ``([left rows], [right rows])`` and the watermark (ms), rows ``(key, t_us, id)``; ids are unique
    and the left ids even, the right ones odd. Times within ±8 s of the batch's base, 6 s apart; the watermark
    trails 20 s (test_join_resident's).

    ``"unique_right"``: every right key occurs once (``duplicates`` > 0: that many right rows per batch but the
    first repeat a key of the batch before, violating it); left keys are drawn from the right keys of the batch and its
    neighbours. ``"orders"``: STREAM's orders (left, one row per order id) and fulfilments (right, 1-3 per order,
    each 0-9 s after its order, in the order's batch or the next): ``many_to_one(child="right", parent="left")``
    (``duplicates`` > 0: that many orders of each batch but the last come again in the next, violating it).
    """
    rng = np.random.default_rng(seed)
    ids = iter(range(10**9))
    t0s = [BASE_US + b * 6_000_000 for b in range(n_batches)]
    rows = [([], []) for _ in range(n_batches)]
    if kind == "unique_right":
        per = [list(range(100 * b, 100 * b + int(rng.integers(40, 60)))) for b in range(n_batches)]
        for b in range(n_batches):
            again = rng.choice(per[b - 1], duplicates, replace=False) if b else []
            keys = list(per[b]) + [int(k) for k in again]
            for k in keys:
                rows[b][RIGHT].append((k, t0s[b] + int(rng.integers(-8_000_000, 8_000_000)), 2 * next(ids) + 1))
            near = sum((per[c] for c in (b - 1, b, b + 1) if 0 <= c < n_batches), [])
            for k in rng.choice(near, int(rng.integers(50, 80))):
                rows[b][LEFT].append((int(k), t0s[b] + int(rng.integers(-8_000_000, 8_000_000)), 2 * next(ids)))
    else:
        order = 0
        for b in range(n_batches):
            for _ in range(int(rng.integers(30, 50))):
                t = t0s[b] + int(rng.integers(-8_000_000, 8_000_000))
                rows[b][LEFT].append((order, t, 2 * next(ids)))
                for _ in range(int(rng.integers(1, 4))):
                    when = min(b + int(rng.integers(0, 2)), n_batches - 1)
                    rows[when][RIGHT].append((order, t + int(rng.integers(0, 9_000_000)), 2 * next(ids) + 1))
                order += 1
            for i in range(duplicates if b else 0):   # a second order row for an order of the batch before
                k, t, _ = rows[b - 1][LEFT][i]
                rows[b][LEFT].append((k, t + 1000, 2 * next(ids)))
    out, wm = [], 0
    for b in range(n_batches):
        for side in (LEFT, RIGHT):
            rng.shuffle(rows[b][side])
        out.append((rows[b], wm))
        wm = max(wm, (t0s[b] + 8_000_000) // 1000 - DELAY_MS)
    return out


def test_reference_rule_keeps_the_output_with_less_state():
    for kind, constraint in (("unique_right", C.unique("right", "k")),
                             ("orders", C.many_to_one(child="right", parent="left"))):
        batches = _streams(kind)
        plain = reference(batches)
        ruled = reference(batches, C.join_eviction([constraint]))
        assert [p for p, _ in ruled] == [p for p, _ in plain]
        assert sum(len(p) for p, _ in plain) > 100
        assert sum(s for _, s in ruled) < 0.75 * sum(s for _, s in plain)


def test_reference_rule_misses_matches_under_violation():
    batches = _streams("unique_right", duplicates=5)
    plain = reference(batches)
    ruled = reference(batches, C.join_eviction([C.unique("right", "k")]))
    assert sum(len(p) for p, _ in ruled) < sum(len(p) for p, _ in plain)


# -- the join's stateful function ---------------------------------------------------------------------------------

def _frame(config, side: int, rows) -> pd.DataFrame:
    """One side's rows in the transport layout; payload ``lv`` / ``rv`` carry the row's id."""
    n = len(rows)
    keys = np.array([r[0] for r in rows], dtype=np.int64)
    times = np.array([r[1] for r in rows], dtype=np.int64)
    ident = np.array([r[2] for r in rows], dtype=np.int64)
    values = {"k": keys, "ts": times, "lv": ident, "rv": ident, "ls": ["x"] * n, "rs": ["y"] * n}
    return transport_frame(config, side, keys, times, np.zeros(n, bool), values)


def _drive(config, batches):
    """Per batch (sorted (left id, right id) pairs, unmatched ids per side, counters) from the worker."""
    worker, value, out = JoinWorker(config), None, []
    for rows, wm in batches:
        frames = [_frame(config, s, rows[s]) for s in (LEFT, RIGHT) if rows[s]]
        state = _state(value, wm)
        (packed,) = worker.streaming((0,), iter(frames), state)
        counters = {m: int(packed[_metrics.PREFIX + m].iloc[0]) for m in M.JOIN_STREAMING}
        value = pickle.loads(pickle.dumps(_STATE_SCHEMA.toInternal(state._value))) if state.exists else None
        pairs, lonely = [], ([], [])
        for row in _unpacked(packed):
            row = row if isinstance(row, dict) else dict(zip(config.out_columns, row))
            lv, rv = row["lv"], row.get("rv")
            if lv is not None and rv is not None:
                pairs.append((lv, rv))
            else:
                lonely[LEFT if rv is None else RIGHT].append(lv if rv is None else rv)
        out.append((sorted(pairs), (sorted(lonely[0]), sorted(lonely[1])), counters))
    return out


CASES = [("unique_right", C.unique("right", "k")), ("orders", C.many_to_one(child="right", parent="left")),
         ("orders", C.many_to_one(child="right", parent="left", delay="3 seconds"))]


@pytest.mark.parametrize("kind, constraint", CASES)
def test_worker_equals_the_reference(kind, constraint):
    batches = _streams(kind)
    config = dataclasses.replace(_config("inner", "full"), constraints=(constraint,))
    got = _drive(config, batches)
    plain = reference(batches)
    ruled = reference(batches, C.join_eviction([constraint]))
    assert [p for p, _, _ in got] == [p for p, _ in plain]
    assert [c[M.STATE_ROWS] for _, _, c in got] == [s for _, s in ruled]
    assert all(c[M.CONSTRAINT_VIOLATIONS] == 0 for _, _, c in got)
    without = _drive(_config("inner", "full"), batches)
    assert [c[M.STATE_ROWS] for _, _, c in without] == [s for _, s in plain]


@pytest.mark.parametrize("how", ["left", "right", "full", "left_semi", "left_anti"])
@pytest.mark.parametrize("kind, constraint", CASES[:2])
def test_outer_joins_output_the_same_rows(how, kind, constraint):
    """Outer, semi and anti joins: the same rows over the run (a many-to-one child's unmatched row may come
    out earlier: at its delay bound instead of its band's end)."""
    batches = _streams(kind)
    base = _config(how, "full")
    plain = _drive(base, batches)
    got = _drive(dataclasses.replace(base, constraints=(constraint,)), batches)

    def everything(run):
        return (sorted(p for b in run for p in b[0]), sorted(i for b in run for i in b[1][0]),
                sorted(i for b in run for i in b[1][1]))

    assert everything(got) == everything(plain)
    assert sum(c[M.STATE_ROWS] for _, _, c in got) < sum(c[M.STATE_ROWS] for _, _, c in plain)


def test_violations_are_counted():
    batches = _streams("unique_right", duplicates=4)
    config = dataclasses.replace(_config("inner", "full"), constraints=(C.unique("right", "k"),))
    got = _drive(config, batches)
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, _, c in got) == 4 * (len(batches) - 1)
    batches = _streams("orders", duplicates=2)
    config = dataclasses.replace(_config("inner", "full"), constraints=(C.many_to_one("right", "left"),))
    got = _drive(config, batches)
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, _, c in got) == 2 * (len(batches) - 1)
    # ... and the documented consequence: matches missed, as the plain-Python rule predicts
    ruled = reference(batches, C.join_eviction([C.many_to_one("right", "left")]))
    assert [p for p, _, _ in got] == [p for p, _ in ruled]
    assert sum(len(p) for p, _ in ruled) < sum(len(p) for p, _ in reference(batches))


def test_control_entry_turns_a_constraint_off():
    class Entry:
        params = {"params": {"constraint_unique_right": False}}

    config = dataclasses.replace(_config("inner", "full"), constraints=(C.unique("right", "k"),))
    worker = JoinWorker(config)
    assert worker._eviction(None).drop_matched == (True, False)
    assert worker._eviction(Entry()) is None
