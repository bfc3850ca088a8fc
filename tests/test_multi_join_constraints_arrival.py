"""multi_join with ``clustered`` / ``ordered`` constraints (STREAM §5.2, docs/constraints.md, rule 3), pure: the
worker run as PySpark runs it (state serialized between batches) against a plain-Python enumeration of the join
on generated streams that adhere (their k measured by plain loops), violations counted against plain loops on
streams that do not, the multi-way rule on a snapshot, old-format states restored, and the resident layouts
(changelog / files) replaying the trackers and the drops.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from test_multi_join_constraints import BATCH_US, S, _config, _drive, orders_stream, reference
from test_multi_join_resident import _call, _image, _same

from pyspark_cq import constraints as C
from pyspark_cq.experiments import constraint_streams as CS
from pyspark_cq.operators._common import resident as R
from pyspark_cq.operators.multi_join import changelog as MC
from pyspark_cq.operators.multi_join import worker as W
from pyspark_cq.operators.multi_join.arrivals import FORMAT_META
from pyspark_cq.operators.multi_join.worker import MultiJoinWorker
from pyspark_cq.vocabulary import metrics as M

#: orders (0), fulfilments (1: 0-20 s after their order), payments (2: 0-30 s after their order)
ORDER_BOUNDS = ((0, 1, 0, 20 * S), (0, 2, 0, 30 * S))
#: clicks (0), carts (1: 0-10 s after a click), purchases (2: 0-20 s after a click)
FUNNEL_BOUNDS = ((0, 1, 0, 10 * S), (0, 2, 0, 20 * S))


def enumerate_join(batches, n: int = 3, bounds=ORDER_BOUNDS):
    """:func:`test_multi_join_constraints.reference` (every tuple of one row per input with equal keys and every
    bound holding, output in the batch of its last row), enumerated per key so that larger streams stay cheap."""
    by_key = defaultdict(lambda: [[] for _ in range(n)])
    for b, (rows, _) in enumerate(batches):
        for i in range(n):
            for k, t, rid in rows[i]:
                by_key[k][i].append((t, rid, b))
    out = [[] for _ in batches]
    for per in by_key.values():
        for combo in itertools.product(*per):
            if all(lo <= combo[j][0] - combo[i][0] <= up for i, j, lo, up in bounds):
                out[max(r[2] for r in combo)].append(tuple(r[1] for r in combo))
    return [sorted(o) for o in out]


def _batched(events, n_batches: int):
    """Rows ``(key, t, id)`` per input into 10 s micro-batches by event time; the watermark at a batch's start
    - 1 ms (no row is late)."""
    batches = []
    for b in range(n_batches):
        lo, hi = b * BATCH_US, (b + 1) * BATCH_US
        batches.append(([[e for e in events[i] if lo <= e[1] < hi] for i in range(3)], b * BATCH_US // 1000 - 1))
    assert sum(len(r) for rows, _ in batches for r in rows) == sum(len(e) for e in events)
    return batches


def arrival_streams(kind: str, jitter: int, seed: int = 3, n_batches: int = 8, violate: int = 0):
    """``"orders"``: fulfilments (input 1) clustered by order id, 1-3 per order, displaced by < ``jitter`` rows,
    0.2 s apart; each order (0) 0-4 s before its first fulfilment (a tenth of the orders without any); a payment
    (2) for 4 orders in 5, 0-25 s after the order. ``"funnel"``: sessions start 0.3 s apart, 1-3 clicks (0) in
    their first 2 s, 0-2 carts (1) 2-5 s after the start, two sessions in three buy once (2), the purchases in
    session order displaced by < ``jitter`` rows, 0.45 s apart from 3 s on. ``violate``: that many rows of input
    1 (orders) or 2 (funnel) repeating a key of 6 s before. The constrained input's times are distinct (its
    arrival order is the sequence). Returns (batches, the adherence k of input 1 / 2, the adherence k of the clicks' order).
    """
    rng = np.random.default_rng(seed)
    ids = itertools.count()
    events = [[], [], []]
    horizon = (n_batches - 4) * BATCH_US
    if kind == "orders":
        n = horizon // 400_000
        seq = CS.clustered_keys(np.arange(n), rng.integers(1, 4, n), jitter, rng)
        k = CS.clustered_k(seq)
        t = 5 * S + np.arange(len(seq)) * 200_000
        events[1] = [(int(key), int(ti), next(ids)) for key, ti in zip(seq, t)]
        first = {}
        for key, ti in zip(seq, t):
            first.setdefault(int(key), int(ti))
        for key in range(n + n // 10):
            at = first.get(key, 5 * S + int(rng.integers(0, len(seq))) * 200_000)
            to = at - int(rng.integers(0, 4_000)) * 1000 - 1
            events[0].append((key, to, next(ids)))
            if rng.random() < 0.8:
                events[2].append((key, to + int(rng.integers(0, 25_000)) * 1000 + 3, next(ids)))
        constrained, clicks_k = 1, None
    else:
        n = horizon // 300_000 - 20
        for s in range(n):
            start = s * 300_000
            for _ in range(int(rng.integers(1, 4))):
                events[0].append((s, start + int(rng.integers(0, 2_000)) * 1000 + 1, next(ids)))
            for _ in range(int(rng.integers(0, 3))):
                events[1].append((s, start + int(rng.integers(2_000, 5_000)) * 1000 + 2, next(ids)))
        seq = CS.ordered_keys(np.array([s for s in range(n) if s % 3]), jitter, rng)
        k = CS.ordered_k(seq)
        t = 3 * S + np.arange(len(seq)) * 450_000
        events[2] = [(int(key), int(ti) + 3, next(ids)) for key, ti in zip(seq, t)]
        constrained = 2
        clicks_k = CS.ordered_k([e[0] for e in sorted(events[0], key=lambda e: (e[1], e[0]))])
    rows = events[constrained]
    for i in range(violate):   # a row repeating a key of 6 s before
        key, ti, _ = rows[(i + 1) * len(rows) // (violate + 2)]
        rows.append((key, ti + 6 * S + 7 + i, next(ids)))
    times = [e[1] for e in rows]
    assert len(set(times)) == len(times)   # the arrival order (time, then key) is the generated sequence
    return _batched(events, n_batches), k, clicks_k


def plain_violations(batches, constraint, reach_us: int):
    """Violations of ``constraint`` in plain loops over its input's per-batch arrival order (event time, then
    key): clustered -- a row whose key's last row has more than k rows of other keys after it, while the key's
    record is kept (until the watermark passes its last row's time + ``reach_us``); ordered -- a row below the
    largest key more than k rows before it."""
    seq, last, expire, found = [], {}, {}, 0
    for rows, wm in batches:
        for key, t, _ in sorted(rows[constraint.side], key=lambda r: (r[1], r[0])):
            if constraint.kind == "clustered":
                if key in last and len(seq) - last[key] - 1 > constraint.k:
                    found += 1
                last[key] = len(seq)
                expire[key] = max(expire.get(key, 0), -(-(t + reach_us) // 1000))
            else:
                back = seq[:max(len(seq) - constraint.k, 0)]
                found += bool(back) and key < max(back)
            seq.append(key)
        for key in [key for key, e in expire.items() if e <= wm]:
            del expire[key], last[key]
    return found


ORDERS_CASES = [(1, lambda k: [C.clustered(1, 0), C.unique(2, "k")]),
                (4, lambda k: [C.clustered(1, k), C.unique(2, "k")]),
                (4, lambda k: [C.unique(0, "k"), C.many_to_one(child=1, parent=0), C.unique(2, "k"), C.clustered(1, k)])]
FUNNEL_CASES = [(1, lambda k, kc: [C.ordered(2, 0)]),
                (5, lambda k, kc: [C.ordered(2, k), C.unique(2, "k")]),
                (5, lambda k, kc: [C.ordered(2, k), C.ordered(0, kc)])]


def test_generated_streams_and_the_enumeration():
    batches = orders_stream(n_batches=6, per_batch=8, seed=2)
    assert enumerate_join(batches) == reference(batches)   # the cheaper enumeration is the tested one
    for jitter, build in ORDERS_CASES:
        batches, k, _ = arrival_streams("orders", jitter)
        assert k <= max(c.k for c in build(k) if c.kind == "clustered")
        assert sum(len(o) for o in enumerate_join(batches)) > 100
    assert arrival_streams("orders", 1)[1] == 0 and arrival_streams("orders", 4)[1] > 0
    for jitter, _ in FUNNEL_CASES:
        batches, k, kc = arrival_streams("funnel", jitter)
        assert k == 0 if jitter == 1 else k > 0
        assert kc > 0 and sum(len(o) for o in enumerate_join(batches, bounds=FUNNEL_BOUNDS)) > 100


def test_multi_way_rule_on_a_snapshot():
    """Rule 3: a row goes when every other input has closed its key, or one has closed it and holds none."""
    ev = C.multi_eviction([C.clustered(1, 0)], 3)
    assert ev.arrival == ((), ("clustered",), ()) and ev.active
    assert [ev.closes(y) for y in range(3)] == [True, False, True]
    keys = [np.array([1, 2, 3]), np.array([1, 3]), np.array([1, 2, 3])]
    closed = {1: np.array([True, True, False])}   # input 1 brings keys 1 and 2 no more
    # key 1: input 1 closed it but holds a row (payments may still come); key 2: closed, not held; key 3: open
    assert C.multi_drop(ev, 0, keys, np.zeros(3, np.int64), 0, closed).tolist() == [False, True, False]
    # with payments unique, key 1 goes once a payment of it is held (every other input has closed it)
    ev = C.multi_eviction([C.clustered(1, 0), C.unique(2, "k")], 3)
    assert C.multi_drop(ev, 0, keys, np.zeros(3, np.int64), 0, closed).tolist() == [True, True, False]
    # n = 2 is the interval join's clustered rule: the other input's rows of a closed key go
    two = C.multi_eviction([C.clustered(0, 1)], 2)
    drop = C.multi_drop(two, 1, [np.array([5]), np.array([5, 6])], np.zeros(2, np.int64), 0,
                        {0: np.array([True, False])})
    assert drop.tolist() == [True, False]
    # switched off: the trackers still count, nothing drops by them
    assert C.multi_eviction([C.clustered(1, 0)], 3, {"clustered_1": False}).active is False


@pytest.mark.parametrize("case", range(len(ORDERS_CASES) + len(FUNNEL_CASES)))
def test_worker_equals_the_enumerated_join_with_less_state(case):
    if case < len(ORDERS_CASES):
        jitter, build = ORDERS_CASES[case]
        batches, k, _ = arrival_streams("orders", jitter)
        constraints, bounds = build(k), ORDER_BOUNDS
    else:
        jitter, build = FUNNEL_CASES[case - len(ORDERS_CASES)]
        batches, k, kc = arrival_streams("funnel", jitter)
        constraints, bounds = build(k, kc), FUNNEL_BOUNDS
    expected = enumerate_join(batches, bounds=bounds)
    plain = _drive(_config((), bounds=bounds), batches)
    got = _drive(_config(constraints, bounds=bounds), batches)
    assert [o for o, _ in plain] == expected
    assert [o for o, _ in got] == expected
    assert all(c[M.CONSTRAINT_VIOLATIONS] == 0 for _, c in got)
    assert all(g[M.STATE_ROWS] <= p[M.STATE_ROWS] for (_, g), (_, p) in zip(got, plain))
    assert sum(c[M.STATE_ROWS] for _, c in got) < 0.8 * sum(c[M.STATE_ROWS] for _, c in plain)


def test_more_constraints_keep_less():
    """On the k = 0 orders stream: clustered fulfilments drop orders and payments (which many_to_one cannot) once
    the payment is unique; alone, a closed cluster drops only keys whose fulfilments are gone, which the kernel's
    staged eviction has dropped already (rule 3: the payments may still come)."""
    batches, _, _ = arrival_streams("orders", 1)
    rows = {name: sum(c[M.STATE_ROWS] for _, c in _drive(_config(cs, bounds=ORDER_BOUNDS), batches))
            for name, cs in [("none", ()), ("clustered", [C.clustered(1, 0)]),
                             ("m2o", [C.unique(0, "k"), C.many_to_one(1, 0), C.unique(2, "k")]),
                             ("all", [C.unique(0, "k"), C.many_to_one(1, 0), C.unique(2, "k"), C.clustered(1, 0)])]}
    assert rows["all"] < rows["m2o"] < rows["none"]
    assert rows["clustered"] == rows["none"]


def test_hashed_keys_are_tracked_by_value():
    """Every kernel key collides (all 0): clusters are tracked on the key values, so they still close."""
    batches, _, _ = arrival_streams("orders", 1, n_batches=6)
    expected = enumerate_join(batches)
    plain = _drive(_config((), bounds=ORDER_BOUNDS, hashed=True), batches)
    constraints = [C.clustered(1, 0), C.unique(2, "k")]
    got = _drive(_config(constraints, bounds=ORDER_BOUNDS, hashed=True), batches)
    assert [o for o, _ in plain] == [o for o, _ in got] == expected
    # fewer rows (fewer than with direct keys: colliding kernel keys keep the staged eviction from dropping the
    # fulfilments early, and a payment goes only once its key's fulfilments are gone)
    assert sum(c[M.STATE_ROWS] for _, c in got) < 0.9 * sum(c[M.STATE_ROWS] for _, c in plain)


@pytest.mark.parametrize("kind, constraint, bounds", [("orders", C.clustered(1, 0), ORDER_BOUNDS),
                                                      ("funnel", C.ordered(2, 0), FUNNEL_BOUNDS)])
def test_violations_are_counted_and_may_miss_matches(kind, constraint, bounds):
    batches, _, _ = arrival_streams(kind, 1, violate=3)
    got = _drive(_config([constraint], bounds=bounds), batches)
    d = W.closure(3, bounds)   # a cluster record stays while a row of its key can still join
    reach = int(max(d[constraint.side][j] for j in range(3) if j != constraint.side))
    last = max(b for b, (rows, _) in enumerate(batches) if any(rows))
    assert all(c[M.STATE_ROWS] > 0 for _, c in got[:last])   # no empty state resets the trackers before the end
    found = sum(c[M.CONSTRAINT_VIOLATIONS] for _, c in got)
    assert found == plain_violations(batches, constraint, reach) >= 3
    expected = enumerate_join(batches, bounds=bounds)
    seen = {t for o, _ in got for t in o}
    assert seen <= {t for o in expected for t in o}   # never a wrong row; matches of the repeats may be missed
    # switched off: the plain state and output, the same count
    off = _drive(_config([constraint], bounds=bounds), batches, {f"constraint_{constraint.name}": False})
    plain = _drive(_config((), bounds=bounds), batches)
    assert [o for o, _ in off] == [o for o, _ in plain] == expected
    assert [c[M.STATE_ROWS] for _, c in off] == [c[M.STATE_ROWS] for _, c in plain]
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, c in off) == found


# -- the state: format 2, old states, resident layouts ---------------------------------------------------------

def _value_after(worker, batches):
    value = None
    for rows, wm in batches:
        _, _, value = _call(worker, rows, wm, value)
    return value


def test_an_old_format_state_restores_and_a_newer_one_is_refused():
    """A value written without arrival constraints is format 1 (no entry: byte for byte what every multi_join
    wrote before); a query that now declares clustered restores it with empty trackers and stays exact."""
    batches, _, _ = arrival_streams("orders", 1)
    cut = 4
    old = _value_after(MultiJoinWorker(_config((), bounds=ORDER_BOUNDS)), batches[:cut])
    assert FORMAT_META not in W.PayloadSide.from_bytes(_config(()).payload_schema(0), old[1]).table.schema.metadata
    worker = MultiJoinWorker(_config([C.clustered(1, 0)], bounds=ORDER_BOUNDS))
    value, out = old, []
    for rows, wm in batches[cut:]:
        got, counters, value = _call(worker, rows, wm, value)
        out.append(got)
    assert out == enumerate_join(batches)[cut:]
    meta = W.PayloadSide.from_bytes(_config(()).payload_schema(0), value[1]).table.schema.metadata
    assert meta[FORMAT_META] == b"2" and any(k.startswith(C.Arrivals.META) for k in meta)
    # and the other way: a format-2 state restores in a query without the constraint (the trackers are ignored)
    plain = MultiJoinWorker(_config((), bounds=ORDER_BOUNDS))
    _, _, written = _call(plain, [[], [], []], batches[-1][1] - 1, value)
    assert FORMAT_META not in W.PayloadSide.from_bytes(_config(()).payload_schema(0), written[1]).table.schema.metadata
    # a newer format than this version reads is refused, naming both
    side = W.PayloadSide.from_bytes(_config(()).payload_schema(0), value[1])
    side.table = side.table.replace_schema_metadata({**meta, FORMAT_META: b"3"})
    newer = (value[0], side.to_bytes()) + tuple(value[2:])
    with pytest.raises(ValueError, match="state format 3.*formats 1 to 2.*new checkpoint location"):
        _call(worker, [[], [], []], batches[-1][1], newer)


def test_delta_format_versions():
    """A delta with arrival ops is CQM2 and round-trips; a CQM1 delta decodes as before; an arrival op in a CQM1
    delta is refused."""
    delta = MC.Delta()
    delta.ops += [(MC.EVICT, 1, 5), (MC.ARRIVE, 1, pa.table({"key": pa.array([3, 1]), "t": pa.array([7, 8])})),
                  (MC.FORGET, 0, 9)]
    blob = delta.encode()
    assert blob[:4] == b"CQM2"
    back = MC.Delta.decode(blob)
    assert [(k, i) for k, i, _ in back.ops] == [(MC.EVICT, 1), (MC.ARRIVE, 1), (MC.FORGET, 0)]
    assert back.ops[1][2].column("key").to_pylist() == [3, 1] and back.ops[2][2] == 9
    old = MC.Delta([(MC.EVICT, 2, 4)])
    assert old.encode()[:4] == b"CQM1" and MC.Delta.decode(old.encode()).ops == [(MC.EVICT, 2, 4)]
    with pytest.raises(ValueError, match="unknown operation"):
        MC.Delta.decode(b"CQM1" + blob[4:])


def _trackers(config, value):
    """The trackers a value holds (snapshot and deltas replayed), as plain rows."""
    if value is None:
        return None
    worker = MultiJoinWorker(dataclasses.replace(config, persistence="full", state_id=""))
    arrivals = worker._restore_state(_State0(value), (0,))[4]
    return {name: t.to_table().to_pylist() for name, t in arrivals.arrivals.trackers.items()
            if not isinstance(t, C.KeyOrder) or t.bound is not None or t.pending is not None}


class _State0:
    def __init__(self, value):
        self.exists, self.get = True, value


def _run_layout(config, batches, clear=False):
    worker, value, out = MultiJoinWorker(config), None, []
    for rows, wm in batches:
        if clear:
            R.cache().clear()
        got, counters, value = _call(worker, rows, wm, value)
        out.append((got, counters, _image(config, value), _trackers(config, value)))
    return out


def _restored(run) -> int:
    """The calls that found a state (the previous call left one)."""
    return sum(before is not None for (_, _, before, _) in run[:-1])


@pytest.fixture()
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(W, "SNAPSHOT_RATIO", 1e9)   # snapshots by count only: the replays see several deltas
    R.cache().clear()
    yield
    R.cache().clear()


@pytest.mark.usefixtures("_fresh_cache")
@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("kind", ["orders", "funnel", "orders-left"])
def test_resident_layouts_replay_the_trackers_and_the_drops(tmp_path, layout, kind):
    """Resident (cache hits) and replayed (the cache dropped before every call: the snapshot's trackers, then the
    deltas' arrive / forget and remove calls) give the full layout's output, counters, state and trackers."""
    if kind != "funnel":
        batches, k, _ = arrival_streams("orders", 4, n_batches=8)
        constraints, bounds = [C.unique(0, "k"), C.many_to_one(1, 0), C.clustered(1, k)], ORDER_BOUNDS
    else:
        batches, k, kc = arrival_streams("funnel", 5, n_batches=8)
        constraints, bounds = [C.ordered(2, k), C.ordered(0, kc)], FUNNEL_BOUNDS
    base = _config(constraints, bounds=bounds)
    if kind == "orders-left":   # payments left: the waiting tuples travel in the deltas too
        base = _outer(_config(constraints + [C.unique(2, "k")], bounds=bounds))
    full = _run_layout(base, batches)
    if kind != "orders-left":
        assert [o for o, _, _, _ in full] == enumerate_join(batches, bounds=bounds)
    assert sum(c[M.EVICTED_ROWS] for _, c, _, _ in full) > 0
    for clear in (False, True):
        config = dataclasses.replace(base, persistence=layout, snapshot_every=3, state_id=f"a-{layout}-{clear}",
                                     state_dir=str(tmp_path / str(clear)) if layout == "files" else None)
        got = _run_layout(config, batches, clear=clear)
        _same([g[:3] for g in got], [f[:3] for f in full])
        assert [g[3] for g in got] == [f[3] for f in full]
        assert sum(c[M.STATE_CACHE_HITS if not clear else M.STATE_CACHE_MISSES] for _, c, _, _ in got) == \
            _restored(full) > 3


# -- a left last input (how=[..., "left"]): the prefix rows' rule (docs/constraints.md, *Left inputs*) -----------

def _outer(config):
    """``config`` with its last input left (as the driver configures ``how=["inner", "left"]``)."""
    z, bounds = config.n - 1, config.bounds
    return dataclasses.replace(config, outer=z, orders=W.outer_last(config.orders, z), outer_bounds=tuple(
        (i if j == z else j, W._LEFT if j == z else W._RIGHT, lo, up) for i, j, lo, up in bounds if z in (i, j)))


def _everything(run):
    """All output rows of a run (null-padded rows come when their deadline passes: compared over the run)."""
    return sorted((t for o, _ in run for t in o), key=repr)


@pytest.mark.parametrize("kind", ["orders", "funnel"])
def test_left_last_input_equals_the_chain_with_less_state(kind):
    """Orders ⋈ fulfilments LEFT JOIN payments (clustered fulfilments, unique orders and payments) and clicks ⋈
    carts LEFT JOIN purchases (purchases ordered): over the run, flushed by a last batch whose watermark passes
    everything, the rows of the plain-Python chain (tests/helpers/outer_join_reference.py); the orders with fewer
    rows kept."""
    from helpers.outer_join_reference import chain_join

    if kind == "orders":
        batches, k, _ = arrival_streams("orders", 4)
        constraints, bounds = [C.unique(0, "k"), C.many_to_one(1, 0), C.unique(2, "k"), C.clustered(1, k)], \
            ORDER_BOUNDS
    else:
        batches, k, _ = arrival_streams("funnel", 5)
        constraints, bounds = [C.ordered(2, k), C.unique(2, "k")], FUNNEL_BOUNDS
    batches.append(([[], [], []], batches[-1][1] + 10**9))
    rows = [[{"k": key, "t": t, "row": (rid,)} for rows, _ in batches for key, t, rid in rows[i]] for i in range(3)]
    expected = sorted(chain_join(rows, ["inner", "left"], list(bounds), widths=[1, 1, 1]), key=repr)
    assert sum(t[2] is None for t in expected) > 10 and sum(t[2] is not None for t in expected) > 50
    plain = _drive(_outer(_config((), bounds=bounds)), batches)
    got = _drive(_outer(_config(constraints, bounds=bounds)), batches)
    assert _everything(plain) == expected
    assert _everything(got) == expected
    assert all(c[M.CONSTRAINT_VIOLATIONS] == 0 for _, c in got)
    if kind == "orders":
        assert sum(c[M.STATE_ROWS] for _, c in got) < 0.8 * sum(c[M.STATE_ROWS] for _, c in plain)
    else:   # the left input's closure alone drops no click or cart: their null-padded rows are still owed
        assert [c[M.STATE_ROWS] for _, c in got] == [c[M.STATE_ROWS] for _, c in plain]


def test_left_last_input_rule_on_a_snapshot():
    """A prefix row is kept for its null-padded rows: z closing the key (or z, the parent, never coming) drops it
    only when every other prefix input has closed the key too."""
    ev = C.multi_eviction([C.clustered(2, 0)], 3)
    keys = [np.array([1, 2]), np.array([1, 2]), np.array([3])]
    closed = {2: np.array([True, True])}   # z brings keys 1 and 2 no more and holds neither
    assert C.multi_drop(ev, 0, keys, np.zeros(2, np.int64), 0, closed).tolist() == [True, True]   # inner
    assert C.multi_drop(ev, 0, keys, np.zeros(2, np.int64), 0, closed, outer=2).tolist() == [False, False]
    ev = C.multi_eviction([C.clustered(2, 0), C.unique(1, "k")], 3)
    assert C.multi_drop(ev, 0, keys, np.zeros(2, np.int64), 0, closed, outer=2).tolist() == [True, True]
    # rule 2 with z the parent: only with every other prefix input closed (two inputs: none to wait for)
    ev = C.multi_eviction([C.many_to_one(0, 2)], 3)
    assert not C.multi_drop(ev, 0, keys, np.zeros(2, np.int64), 10, None, outer=2).any()
    two = C.multi_eviction([C.many_to_one(0, 1)], 2)
    assert C.multi_drop(two, 0, [np.array([1]), np.array([2])], np.zeros(1, np.int64), 10, None, outer=1).all()


def test_arguments_of_arrival_constraints_are_checked():
    from pyspark.sql import types as T

    from pyspark_cq.operators.multi_join.driver import check_multi_constraints

    checked = check_multi_constraints([C.clustered(1, 3), C.ordered(2)], ["k0", "k1", "k2"], ("inner", "left"))
    assert [c.name for c in checked] == ["clustered_1", "ordered_2"]
    with pytest.raises(ValueError, match=r"ordered\(\) compares join keys.*floating point"):
        check_multi_constraints([C.ordered(2)], ["k0", "k1", "k2"], (), T.DoubleType())
    assert check_multi_constraints([C.clustered(2)], ["k0", "k1", "k2"], (), T.DoubleType())   # clusters: fine
    with pytest.raises(ValueError, match="a left input before the last"):
        check_multi_constraints([C.ordered(2)], ["k0", "k1", "k2"], ("left", "left"))
