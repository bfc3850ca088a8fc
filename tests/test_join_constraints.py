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


def _probe(stored, side, key, t, rid, pairs) -> bool:
    """The references' probe: row ``(key, t, rid)`` of ``side`` against the other side's stored rows ``[key, t, id,
    end, matched]`` (the band LOWER..UPPER); its pairs appended to ``pairs``, the rows it meets marked matched.
    Whether it met one."""
    matched = False
    for other in stored[1 - side]:
        lt, rt = (t, other[1]) if side == LEFT else (other[1], t)
        if key is not None and other[0] == key and lt + LOWER <= rt <= lt + UPPER:
            other[4] = matched = True
            pairs.append((rid, other[2]) if side == LEFT else (other[2], rid))
    return matched


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
                matched = _probe(stored, side, key, t, rid, pairs)
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


def _drive(config, batches, switches=None):
    """Per batch (sorted (left id, right id) pairs, unmatched ids per side, counters) from the worker; ``switches``
    (``{"constraint_<name>": bool}``) as a control entry's params would set them."""
    worker, value, out = JoinWorker(config), None, []
    if switches is not None:
        entry = type("Entry", (), {"params": {"params": switches}})()
        eviction = worker._eviction
        worker._eviction = lambda _entry: eviction(entry)
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


def test_a_switched_off_constraint_still_counts_its_violations():
    """A policy watches adherence before it turns a constraint on: switched off, a constraint drops nothing (the
    plain join's state) and counts the violations it counts when on."""
    batches = _streams("unique_right", duplicates=4)
    declared = dataclasses.replace(_config("inner", "full"), constraints=(C.unique("right", "k"),))
    off = _drive(declared, batches, {"constraint_unique_right": False})
    on = _drive(declared, batches)
    plain = _drive(_config("inner", "full"), batches)
    assert [c[M.STATE_ROWS] for _, _, c in off] == [c[M.STATE_ROWS] for _, _, c in plain]
    assert [c[M.CONSTRAINT_VIOLATIONS] for _, _, c in off] == [c[M.CONSTRAINT_VIOLATIONS] for _, _, c in on]
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, _, c in off) == 4 * (len(batches) - 1)
    arrival, _ = arrival_streams("orders", 1, violate=3)
    clustered = dataclasses.replace(_config("inner", "full"), constraints=(C.clustered("right", 0),))
    off = _drive(clustered, arrival, {"constraint_clustered_right": False})
    plain = _drive(_config("inner", "full"), arrival)
    assert [c[M.STATE_ROWS] for _, _, c in off] == [c[M.STATE_ROWS] for _, _, c in plain]
    assert [p for p, _, _ in off] == [p for p, _, _ in plain]          # nothing missed while off
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, _, c in off) >= 3       # the 3 repeated keys at least


# -- clustered / ordered arrival ----------------------------------------------------------------------------------

def arrival_reference(batches, constraints, k_rows=None):
    """:func:`reference` with ``clustered`` / ``ordered`` constraints (and any ``unique`` / ``many_to_one`` in
    ``constraints``), in plain Python: per batch each input's rows are counted in arrival order (event time, then
    key; null keys not counted); after the batch, rows of the other input whose key the constrained input will not
    bring again go -- a key whose last row has k + 1 rows of other keys after it (clustered), a key below the
    largest key more than k rows back (ordered); a cluster record is forgotten once the watermark passes its last
    row's band, and all positions when the state empties. Returns per batch (sorted pairs, stored rows,
    violations).
    """
    eviction = C.join_eviction([c for c in constraints if c.kind not in C.ARRIVAL_KINDS])
    arrival = [c for c in constraints if c.kind in C.ARRIVAL_KINDS]
    stored = ([], [])   # rows [key, t, id, end, matched]
    fresh = lambda: {c.name: {"n": 0, "last": {}, "expire": {}, "seq": []} for c in arrival}  # noqa: E731
    track = fresh()
    out = []
    for rows, wm in batches:
        pairs, violations = [], 0
        for side in (LEFT, RIGHT):
            for key, t, rid in rows[side]:
                matched = _probe(stored, side, key, t, rid, pairs)
                natural = int(evict_at_ms(np.array([t]), LOWER, UPPER, side)[0])
                end = natural
                if eviction.delay[side] is not None:
                    end = min(end, -(-(t + eviction.delay[side]) // 1000))
                stored[side].append([key, t, rid, end, matched])
            for c in arrival:
                if C.SIDES.index(c.side) != side:
                    continue
                tr = track[c.name]
                for key, t, _ in sorted((r for r in rows[side] if r[0] is not None), key=lambda r: (r[1], r[0])):
                    tr["n"] += 1
                    if c.kind == "clustered":
                        if key in tr["last"] and tr["n"] - tr["last"][key] - 1 > c.k:
                            violations += 1
                        tr["last"][key] = tr["n"]
                        end = int(evict_at_ms(np.array([t]), LOWER, UPPER, side)[0])
                        tr["expire"][key] = max(tr["expire"].get(key, end), end)
                    else:
                        back = tr["seq"][:max(len(tr["seq"]) - c.k, 0)]
                        violations += bool(back) and key < max(back)
                        tr["seq"].append(key)
        for side in (LEFT, RIGHT):
            gone = set()
            for c in arrival:
                if C.SIDES.index(c.side) == 1 - side:
                    tr = track[c.name]
                    if c.kind == "clustered":
                        gone |= {r[2] for r in stored[side] if r[0] in tr["last"] and tr["n"] - tr["last"][r[0]] > c.k}
                    else:
                        back = tr["seq"][:max(len(tr["seq"]) - c.k, 0)]
                        gone |= {r[2] for r in stored[side] if back and r[0] is not None and r[0] < max(back)}
            drop = eviction.drop_matched[side]
            stored[side][:] = [r for r in stored[side] if r[3] > wm and not (drop and r[4]) and r[2] not in gone]
        for c in arrival:
            tr = track[c.name]
            for key in [key for key, e in tr["expire"].items() if e <= wm]:
                del tr["expire"][key], tr["last"][key]
        if not stored[0] and not stored[1]:
            track = fresh()
        out.append((sorted(pairs), len(stored[0]) + len(stored[1]), violations))
    return out


def _batched(left, right, n_batches):
    """Rows ``(key, t, id)`` per side into micro-batches of 6 s of event time (each row in the batch its time falls
    in), the watermark trailing as :func:`_streams`'."""
    rows = [([], []) for _ in range(n_batches)]
    for side, part in ((LEFT, left), (RIGHT, right)):
        for r in part:
            rows[min(max((r[1] - BASE_US) // 6_000_000, 0), n_batches - 1)][side].append(r)
    out, wm = [], 0
    for b in range(n_batches):
        out.append((rows[b], wm))
        wm = max(wm, (BASE_US + b * 6_000_000 + 8_000_000) // 1000 - DELAY_MS)
    return out


def arrival_streams(kind: str, jitter: int, seed: int = 3, n_batches: int = 8, violate: int = 0):
    """``"orders"``: fulfilments (right) clustered by order id (1-3 per order, displaced by < ``jitter`` rows),
    0.1 s apart; each order (left) 0-4 s before its first fulfilment, a tenth of the orders without any.
    ``"funnel"``: sessions start 0.3 s apart, 1-3 clicks (left) in their first 2 s; two sessions in three buy
    once (right), the purchases in session order displaced by < ``jitter`` rows, 0.45 s apart from 3 s on.
    ``violate`` > 0: that many right rows repeat a key of 6 s before (breaking the constraint).
    Returns (batches, the adherence k of the right input).
    """
    from pyspark_cq.experiments import constraint_streams as S

    rng = np.random.default_rng(seed)
    ids = iter(range(10**9))
    left, right = [], []
    if kind == "orders":
        n = n_batches * 25
        seq = S.clustered_keys(np.arange(n), rng.integers(1, 4, n), jitter, rng)
        k = S.clustered_k(seq)
        t = BASE_US + 5_000_000 + np.arange(len(seq)) * 100_000
        right = [(int(key), int(ti), 2 * next(ids) + 1) for key, ti in zip(seq, t)]
        first = {}
        for key, ti in zip(seq, t):
            first.setdefault(int(key), int(ti))
        for key in range(n + n // 10):
            at = first.get(key, BASE_US + 5_000_000 + int(rng.integers(0, len(seq))) * 100_000)
            left.append((key, at - int(rng.integers(0, 4_000_000)), 2 * next(ids)))
    else:
        n = n_batches * 20
        for s in range(n):
            for _ in range(int(rng.integers(1, 4))):
                left.append((s, BASE_US + s * 300_000 + int(rng.integers(0, 2_000_000)), 2 * next(ids)))
        seq = S.ordered_keys(np.array([s for s in range(n) if s % 3]), jitter, rng)
        k = S.ordered_k(seq)
        t = BASE_US + 3_000_000 + np.arange(len(seq)) * 450_000
        right = [(int(key), int(ti), 2 * next(ids) + 1) for key, ti in zip(seq, t)]
    for i in range(violate):   # a right row repeating a key of 6 s before
        key, ti, _ = right[(i + 1) * len(right) // (violate + 2)]
        right.append((key, ti + 6_000_000 + 7 + i, 2 * next(ids) + 1))
    return _batched(left, right, n_batches), k


ARRIVAL_CASES = [("orders", 1, [C.clustered("right", 0)]), ("orders", 4, [C.clustered("right", 6)]),
                 ("orders", 4, [C.many_to_one(child="right", parent="left"), C.clustered("right", 6)]),
                 ("funnel", 1, [C.ordered("right", 0)]), ("funnel", 5, [C.ordered("right", 8)])]


def test_generated_streams_adhere_with_their_k():
    from pyspark_cq.experiments import constraint_streams as S

    assert S.clustered_k([1, 1, 2, 3, 2, 1]) == 3 and S.clustered_k([1, 1, 2, 2]) == 0
    assert S.ordered_k([1, 2, 3]) == 0 and S.ordered_k([2, 1, 3]) == 1 and S.ordered_k([5, 1, 2, 3]) == 3
    for kind, jitter, constraints in ARRIVAL_CASES:
        _, k = arrival_streams(kind, jitter)
        assert k <= max(c.k for c in constraints if c.kind in C.ARRIVAL_KINDS)
    assert arrival_streams("orders", 6)[1] > 0 and arrival_streams("funnel", 6)[1] > 0


@pytest.mark.parametrize("kind, jitter, constraints", ARRIVAL_CASES)
def test_arrival_reference_keeps_the_output_with_less_state(kind, jitter, constraints):
    batches, _ = arrival_streams(kind, jitter)
    plain = reference(batches)
    ruled = arrival_reference(batches, constraints)
    assert [p for p, _, _ in ruled] == [p for p, _ in plain]
    assert sum(len(p) for p, _ in plain) > 100
    assert sum(s for _, s, _ in ruled) < 0.75 * sum(s for _, s in plain)
    assert all(v == 0 for _, _, v in ruled)


@pytest.mark.parametrize("kind, jitter, constraints", ARRIVAL_CASES)
def test_worker_arrival_equals_the_reference(kind, jitter, constraints):
    batches, _ = arrival_streams(kind, jitter)
    config = dataclasses.replace(_config("inner", "full"), constraints=tuple(constraints))
    got = _drive(config, batches)
    ruled = arrival_reference(batches, constraints)
    assert [p for p, _, _ in got] == [p for p, _ in reference(batches)]
    assert [c[M.STATE_ROWS] for _, _, c in got] == [s for _, s, _ in ruled]
    assert all(c[M.CONSTRAINT_VIOLATIONS] == 0 for _, _, c in got)


@pytest.mark.parametrize("how", ["left", "right", "full", "left_semi", "left_anti"])
@pytest.mark.parametrize("kind, jitter, constraints", [ARRIVAL_CASES[1], ARRIVAL_CASES[4]])
def test_arrival_outer_joins_output_the_same_rows(how, kind, jitter, constraints):
    """Over the run, flushed by a last batch whose watermark passes everything: a row dropped unmatched comes out
    as unmatched earlier than without the constraint."""
    batches, _ = arrival_streams(kind, jitter)
    batches.append((([], []), batches[-1][1] + 10**9))
    base = _config(how, "full")
    plain = _drive(base, batches)
    got = _drive(dataclasses.replace(base, constraints=tuple(constraints)), batches)

    def everything(run):
        return (sorted(p for b in run for p in b[0]), sorted(i for b in run for i in b[1][0]),
                sorted(i for b in run for i in b[1][1]))

    assert everything(got) == everything(plain)
    assert sum(c[M.STATE_ROWS] for _, _, c in got) < sum(c[M.STATE_ROWS] for _, _, c in plain)


@pytest.mark.parametrize("kind, constraints", [("orders", [C.clustered("right", 0)]),
                                               ("funnel", [C.ordered("right", 0)])])
def test_arrival_violations_are_counted_and_miss_what_the_rule_says(kind, constraints):
    batches, _ = arrival_streams(kind, 1, violate=3)
    config = dataclasses.replace(_config("inner", "full"), constraints=tuple(constraints))
    got = _drive(config, batches)
    ruled = arrival_reference(batches, constraints)
    assert [c[M.CONSTRAINT_VIOLATIONS] for _, _, c in got] == [v for _, _, v in ruled]
    # the 3 repeated keys, plus any cluster a repeat lands inside (it adds a row of another key between two)
    assert sum(v for _, _, v in ruled) >= 3
    assert sum(len(p) for p, _, _ in ruled) < sum(len(p) for p, _ in reference(batches))   # matches missed
    assert [p for p, _, _ in got] == [p for p, _, _ in ruled]
    assert [c[M.STATE_ROWS] for _, _, c in got] == [s for _, s, _ in ruled]


def test_arrival_constraint_off_keeps_the_plain_state():
    class Entry:
        params = {"params": {"constraint_clustered_right": False}}

    batches, _ = arrival_streams("orders", 1)
    config = dataclasses.replace(_config("inner", "full"), constraints=(C.clustered("right", 0),))
    worker = JoinWorker(config)
    assert worker._eviction(Entry()) is None
    assert worker._eviction(None).arrival == ((), ("clustered",))


def test_kernel_row_ids_follow_row_flags():
    from pyspark_cq._native import load

    join = load("_join")
    js = join.JoinState(0, 10)
    offsets = np.arange(5, dtype=np.int64) * 8
    data = np.array([3, 1, 3, 2], dtype=np.int64).view(np.uint8)
    js.insert_probe(0, offsets, data, None, np.array([5, 6, 7, 8], np.int64), np.array([10, 11, 12, 13], np.int64))
    js.evict(0, 0)
    assert sorted(js.row_ids(0).tolist()) == [10, 11, 12, 13]
    assert len(js.row_ids(0)) == len(js.row_flags(0)[0]) == js.rows(0)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_trackers_against_plain_loops(k):
    """Clusters and KeyOrder batch by batch, through their saved form, against the definitions written as loops:
    violations, closed clusters and the key bound."""
    import pyarrow as pa

    rng = np.random.default_rng(k)
    for _ in range(20):
        batches = [[int(x) for x in rng.integers(0, 6, 9)] for _ in range(4)]
        arrivals, found = C.Arrivals([C.clustered("left", k), C.ordered("left", k)]), [0, 0]
        seen = []
        for b in batches:
            clusters, order = arrivals.trackers["clustered_left"], arrivals.trackers["ordered_left"]
            found[0] += clusters.advance(pa.array([str(x).encode() for x in b], pa.large_binary()),
                                         np.zeros(len(b), np.int64))
            found[1] += order.advance(pa.table({"k0": pa.array(b, pa.int64())}))
            arrivals = C.Arrivals([C.clustered("left", k), C.ordered("left", k)]).restore(arrivals.to_metadata())
            seen += b
        last, expect = {}, [0, 0]
        for n, key in enumerate(seen):
            expect[0] += key in last and n - last[key] - 1 > k
            expect[1] += n - k > 0 and key < max(seen[:n - k])
            last[key] = n
        assert found == expect
        closed = {x.decode() for x in arrivals.trackers["clustered_left"].closed().to_pylist()}
        assert closed == {str(x) for x, p in last.items() if len(seen) - 1 - p > k}
        bound = max(seen[:len(seen) - k])
        order = arrivals.trackers["ordered_left"]
        assert order.below(pa.table({"x": [bound - 1, bound]})).tolist() == [True, False]
