"""multi_join(constraints=...) (STREAM §5.2, docs/constraints.md): argument checks, and the worker's rules against a
plain-Python enumeration of the join on generated orders / fulfilments / payments streams, batch by batch (pure: no
Spark; the worker runs as PySpark's Python worker would run it, with its state serialized between batches).
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import types as T
from test_join_resident import _unpacked

from pyspark_cq import constraints as C
from pyspark_cq.operators._common import metrics as _metrics
from pyspark_cq.operators._common.codec import NULL_SUFFIX, codecs_for
from pyspark_cq.operators._common.payload import SIDE
from pyspark_cq.operators.multi_join.driver import check_multi_constraints
from pyspark_cq.operators.multi_join.worker import (
    KEY,
    KEY_NULL,
    MICROS,
    SHARD,
    TIME,
    MultiJoinConfig,
    MultiJoinWorker,
    default_orders,
    metric_names,
)
from pyspark_cq.vocabulary import metrics as M

S = 1_000_000   # µs
#: orders (0), fulfilments (1: up to 20 s after their order), payments (2: up to 30 s after their order)
BOUNDS = ((0, 1, 0, 20 * S), (0, 2, 0, 30 * S))
#: the same with fulfilments allowed up to 20 s before their order (so an order may come after its delay bound)
WIDE = ((0, 1, -20 * S, 20 * S), (0, 2, 0, 30 * S))
BATCH_US = 10 * S
ORDERS = [C.unique(0, "k"), C.many_to_one(child=1, parent=0), C.unique(2, "k")]


# -- argument checks ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("constraints, how, error, words", [
    ([C.unique(3, "k")], (), ValueError, ["constraints[0]", "side 3", "not an input of multi_join", "0, 1, 2"]),
    ([C.many_to_one(child=1, parent=5)], (), ValueError, ["constraints[0]", "parent 5", "not an input"]),
    ([C.unique("left", "k")], (), ValueError, ["constraints[0]", "'left'", "not an input of multi_join"]),
    ([C.unique(1, "user")], (), ValueError, ["constraints[0]", "['user']", "not join-key columns of input 1",
                                             "['k1']"]),
    ([C.clustered(1, 2), C.clustered(1, 3)], (), ValueError, ["constraints[1]", "second clustered()"]),
    ([C.ordered(4)], (), ValueError, ["constraints[0]", "side 4", "not an input of multi_join"]),
    ([C.clustered(1)], ("left", "left"), ValueError, ["a left input before the last", "how=['left', 'left']"]),
    ([C.unique(0, "k0")], ("left", "inner"), ValueError, ["constraints", "a left input before the last",
                                                           "how=['left', 'inner']"]),
    ([C.unique(0, "k0"), C.unique(0, "k0")], (), ValueError, ["constraints[1]", "second unique()"]),
    (C.unique(0, "k0"), (), TypeError, ["constraints must be a list"]),
    (["unique"], (), TypeError, ["constraints[0] must be a constraint"]),
])
def test_checks_name_the_argument(constraints, how, error, words):
    with pytest.raises(error) as exc:
        check_multi_constraints(constraints, ["k0", "k1", "k2"], how)
    for w in words:
        assert w in str(exc.value)


def test_inputs_by_index_and_their_names():
    assert C.unique(2, "user").name == "unique_2"
    assert C.many_to_one(child=2, parent=0, delay="5 seconds").name == "many_to_one_2"
    for bad in (-1, True, 1.5, "middle"):
        with pytest.raises(ValueError, match="side must be 'left' or 'right'.*input index"):
            C.unique(bad, "k")
    with pytest.raises(ValueError, match="child and parent must be different"):
        C.many_to_one(child=1, parent=1)
    checked = check_multi_constraints([C.unique(0, "k"), C.many_to_one(2, 1, "1 second")], ["k", "k", "k"])
    assert [c.name for c in checked] == ["unique_0", "many_to_one_2"]
    assert check_multi_constraints(None, ["k", "k"]) == ()
    # the two-input joins refuse an index, naming their inputs
    with pytest.raises(ValueError, match="side 1, which is not an input of interval_join.*'left', 'right'"):
        C.check_constraints([C.unique(1, "k")], {"left": ["k"], "right": ["k"]}, "interval_join")


def test_eviction_rules_of_the_declared_constraints():
    ev = C.multi_eviction(ORDERS, 3)
    assert ev.unique == (True, False, True)
    assert ev.drop_held == (False, True, False)         # only the fulfilments: both other inputs are unique
    assert ev.delay == ((), ((0, 0),), ())
    assert not C.multi_eviction([C.unique(0, "k")], 3).active
    off = C.multi_eviction(ORDERS, 3, {"unique_2": False, "many_to_one_1": False})
    assert off.unique == (True, False, False) and not off.active
    # rule 1 on a snapshot: a fulfilment goes once its order and its payment are held; rule 2 past its delay
    keys = [np.array([1, 2, 3]), np.array([1, 2, 4, 5]), np.array([1, 3])]
    micros = np.array([0, 0, 0, 9 * S])
    drop = C.multi_drop(ev, 1, keys, micros, wm_ms=5_000)
    assert drop.tolist() == [True, False, True, False]   # 4: no order held and 0 + 0 <= 5 s; 5: not yet due
    # n = 2 is the interval join's rule: unique(0) drops input 1's rows whose key input 0 holds
    two = C.multi_eviction([C.unique(0, "k")], 2)
    assert two.drop_held == (False, True)
    assert C.multi_drop(two, 1, [np.array([7]), np.array([7, 8])], np.zeros(2, np.int64), 0).tolist() == [True, False]


def test_control_entry_switches_and_checks_them():
    worker = MultiJoinWorker(_config(ORDERS))
    assert worker.eviction(None).drop_held == (False, True, False)
    assert worker.eviction({"params": {"constraint_unique_2": False}}).drop_held == (False, False, False)
    assert worker.eviction({"params": {"constraint_unique_2": False, "constraint_many_to_one_1": False}}) is None
    with pytest.raises(TypeError, match=r"params\['constraint_unique_0'\] must be true or false"):
        worker.eviction({"params": {"constraint_unique_0": "off"}})
    assert M.CONSTRAINT_VIOLATIONS in worker.metrics
    assert M.CONSTRAINT_VIOLATIONS not in MultiJoinWorker(_config(())).metrics   # the columns stay as they were


# -- the worker, driven as Spark would -------------------------------------------------------------------------

def _config(constraints, n: int = 3, bounds=BOUNDS, hashed: bool = False) -> MultiJoinConfig:
    """Inputs ``k`` (long; with ``hashed`` a string whose kernel key is a hash), ``v`` (long, the row's id)."""
    key = T.StringType() if hashed else T.LongType()
    schema = T.StructType([T.StructField("k", key), T.StructField("v", T.LongType())])
    codecs = tuple(tuple(codecs_for(schema, ["k", "v"], f"__cq_p{i}_")) for i in range(n))
    out = tuple((i, c) for i in range(n) for c in (0, 1))
    out_schema = T.StructType([T.StructField(f"{c}{i}", key if c == "k" else T.LongType())
                               for i in range(n) for c in "kv"])
    return MultiJoinConfig(n, codecs, (0,) * n, out, _metrics.arrow_schema(out_schema), bounds,
                           default_orders(n, bounds), hashed=hashed, name="mj", constraints=tuple(constraints))


def _frame(config, i: int, rows) -> pd.DataFrame:
    """Input ``i``'s rows ``(key, time µs, id)`` in the transport layout (other inputs' columns null). Hashed keys
    travel as strings, and every kernel key is 0: a hash collision between all of them."""
    m = len(rows)
    keys = np.array([r[0] for r in rows], np.int64)
    times = np.array([r[1] for r in rows], np.int64)
    ident = np.array([r[2] for r in rows], np.int64)
    cols = {SIDE: np.full(m, i, np.int8), SHARD: np.zeros(m, np.int64), TIME: pd.to_datetime(times, unit="us"),
            MICROS: times, KEY: np.zeros(m, np.int64) if config.hashed else keys, KEY_NULL: np.zeros(m, bool)}
    for s in range(config.n):
        for codec, values in zip(config.codecs[s], (keys, ident)):
            if not codec.flagged:   # the string key
                cols[codec.name] = [f"order-{v}" for v in values] if s == i else [None] * m
                continue
            cols[codec.name] = values if s == i else np.zeros(m, np.int64)
            cols[codec.name + NULL_SUFFIX] = np.zeros(m, bool) if s == i else np.ones(m, bool)
    return pd.DataFrame(cols)


class _State:
    """The part of PySpark's GroupState the worker uses; the value kept as bytes, as Spark keeps it."""

    def __init__(self, value, wm_ms: int):
        self.exists, self.get, self.hasTimedOut, self._wm = value is not None, value, False, wm_ms

    def getCurrentWatermarkMs(self):
        return self._wm

    def update(self, value):
        self.exists, self.get = True, tuple(bytes(v) for v in value)

    def remove(self):
        self.exists, self.get = False, None

    def setTimeoutTimestamp(self, _ms):
        pass


def _drive(config, batches, params=None):
    """Per batch (sorted id tuples output, counters) from the worker; ``params`` as a control entry's."""
    worker, value, out = MultiJoinWorker(config), None, []
    if params is not None:
        worker._entry = lambda: {"params": params}
    names = metric_names(config.n, False, bool(config.constraints))
    for rows, wm in batches:
        frames = [_frame(config, i, rows[i]) for i in range(config.n) if rows[i]]
        state = _State(value, wm)
        (packed,) = worker.streaming((0,), iter(frames), state)
        counters = {m: int(packed[_metrics.PREFIX + m].iloc[0]) for m in names}
        value = state.get if state.exists else None
        out.append((sorted(_tuples(packed, config.n)), counters))
    return out


def _tuples(packed, n):
    """The output rows' ids, one per input."""
    return [tuple((r[f"v{i}"] if isinstance(r, dict) else r[2 * i + 1]) for i in range(n)) for r in _unpacked(packed)]


def reference(batches, n: int = 3, bounds=BOUNDS):
    """Per batch the id tuples the join outputs, enumerated: every tuple of one row per input with equal keys and
    every bound holding, output in the batch that brings its last row (no row is late in these streams)."""
    rows = [[(k, t, rid, b) for b, (batch, _) in enumerate(batches) for k, t, rid in batch[i]] for i in range(n)]
    out = [[] for _ in batches]
    for combo in itertools.product(*rows):
        if len({r[0] for r in combo}) != 1:
            continue
        if all(lo <= combo[j][1] - combo[i][1] <= up for i, j, lo, up in bounds):
            out[max(r[3] for r in combo)].append(tuple(r[2] for r in combo))
    return [sorted(o) for o in out]


def orders_stream(n_batches: int = 8, per_batch: int = 12, seed: int = 7, duplicates: int = 0, late_parents=0):
    """Orders (unique ids), 0-3 fulfilments each 0-20 s after it, a payment for most orders 0-30 s after it, in
    10 s micro-batches by event time (watermark: the batch's start - 1 ms, so no row is late). ``duplicates``:
    that many orders get a second payment 1-5 s after the first (breaks ``unique(2)``). ``late_parents``: that
    many fulfilments whose order (and its payment) comes 15-20 s after them, two batches later (breaks
    ``many_to_one(1, 0)``'s delay 0; they match under :data:`WIDE` bounds)."""
    rng = np.random.default_rng(seed)
    events, rid = [[], [], []], itertools.count()
    horizon = (n_batches - 4) * BATCH_US
    for k in range(n_batches * per_batch // 2):
        t = int(rng.integers(0, horizon))
        events[0].append((k, t, next(rid)))
        for _ in range(int(rng.integers(0, 4))):
            events[1].append((k, t + int(rng.integers(0, 20 * S)), next(rid)))
        if rng.random() < 0.8:
            tp = t + int(rng.integers(0, 25 * S))
            events[2].append((k, tp, next(rid)))
            if duplicates and len(events[2]) % 3 == 0:
                duplicates -= 1
                events[2].append((k, tp + int(rng.integers(1, 5)) * S, next(rid)))
    for j in range(late_parents):   # the order two batches after its fulfilment: past the child's delay bound
        k = 10_000 + j
        t = int(rng.integers(0, n_batches - 3)) * BATCH_US + int(rng.integers(5 * S, BATCH_US))
        to = t + int(rng.integers(15 * S, 20 * S))
        events[1].append((k, t, next(rid)))
        events[0].append((k, to, next(rid)))
        events[2].append((k, to + int(rng.integers(0, 5 * S)), next(rid)))
    batches = []
    for b in range(n_batches):
        lo, hi = b * BATCH_US, (b + 1) * BATCH_US
        rows = [[e for e in events[i] if lo <= e[1] < hi] for i in range(3)]
        batches.append((rows, b * BATCH_US // 1000 - 1))
    assert sum(len(r) for rows, _ in batches for r in rows) == sum(len(e) for e in events)
    return batches


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("constraints", [
    ORDERS,
    [C.unique(0, "k"), C.many_to_one(child=1, parent=0, delay="5 seconds"), C.unique(2, "k")],
    [C.many_to_one(child=1, parent=0), C.many_to_one(child=2, parent=0)],
    [C.unique(0, "k"), C.unique(2, "k")],
])
def test_worker_equals_the_enumerated_join_with_less_state(seed, constraints):
    batches = orders_stream(seed=seed)
    expected = reference(batches)
    plain = _drive(_config(()), batches)
    got = _drive(_config(constraints), batches)
    assert [o for o, _ in plain] == expected
    assert [o for o, _ in got] == expected
    assert sum(len(o) for o in expected) > 50
    assert all(c[M.CONSTRAINT_VIOLATIONS] == 0 for _, c in got)
    assert all(g[M.STATE_ROWS] <= p[M.STATE_ROWS] for (_, g), (_, p) in zip(got, plain))
    assert sum(c[M.STATE_ROWS] for _, c in got) < sum(c[M.STATE_ROWS] for _, c in plain)


def test_hashed_keys_are_compared_on_their_values():
    """Every kernel key collides: the rules must look at the key values, as the matches do."""
    batches = orders_stream(n_batches=6, per_batch=6, seed=8)
    expected = reference(batches)
    plain = _drive(_config((), hashed=True), batches)
    got = _drive(_config(ORDERS, hashed=True), batches)
    assert [o for o, _ in plain] == [o for o, _ in got] == expected
    assert sum(c[M.STATE_ROWS] for _, c in got) < sum(c[M.STATE_ROWS] for _, c in plain)


def test_delay_rule_alone_drops_children_whose_parent_never_came():
    """Fulfilments of orders that never arrive: only rule 2 can drop them (rule 1 needs a payment)."""
    batches = orders_stream(seed=4)
    for rows, _ in batches:   # remove every other order
        rows[0][:] = [r for r in rows[0] if r[0] % 2]
    constraints = [C.many_to_one(child=1, parent=0)]
    plain, got = _drive(_config(()), batches), _drive(_config(constraints), batches)
    assert [o for o, _ in got] == [o for o, _ in plain] == reference(batches)
    assert sum(c[M.STATE_ROWS] for _, c in got) < sum(c[M.STATE_ROWS] for _, c in plain)


def test_violations_are_counted_and_miss_matches():
    batches = orders_stream(seed=5, duplicates=6)
    got = _drive(_config(ORDERS), batches)
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, c in got) == 6
    # a late parent (past its child's delay bound 0): the child is gone, its match missed, as documented
    batches = orders_stream(seed=6, late_parents=3)
    got = _drive(_config([C.many_to_one(child=1, parent=0)], bounds=WIDE), batches)
    expected = reference(batches, bounds=WIDE)
    assert [o for o, _ in _drive(_config((), bounds=WIDE), batches)] == expected
    found = {t for o, _ in got for t in o}
    missed = {t for o in expected for t in o} - found
    assert len(missed) == 3 and found <= {t for o in expected for t in o}


def test_a_switched_off_constraint_drops_nothing_and_still_counts():
    batches = orders_stream(seed=5, duplicates=6)
    plain = _drive(_config(()), batches)
    off = _drive(_config(ORDERS), batches, {"constraint_unique_0": False, "constraint_unique_2": False,
                                            "constraint_many_to_one_1": False})
    assert [c[M.STATE_ROWS] for _, c in off] == [c[M.STATE_ROWS] for _, c in plain]
    assert [o for o, _ in off] == [o for o, _ in plain]
    assert sum(c[M.CONSTRAINT_VIOLATIONS] for _, c in off) == 6
