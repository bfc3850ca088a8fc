"""Worker side of :func:`pyspark_cq.multi_join` (MJoin: one state per input, no intermediate state).

Runs in Spark's Python workers, once per shard and micro-batch (``applyInPandasWithState``) or once per
shard of a batch join (``applyInPandas``). The kernel is :mod:`pyspark_cq._mjoin` (``native/mjoin_core.hpp``);
it sees only int64 keys, times and payload ids. The rows themselves stay here, in one Arrow table per input
(:class:`~pyspark_cq.operators._common.payload.PayloadSide`), compacted to the kernel's live rows before the
state is saved.

Keys reach the kernel as int64 (:data:`DIRECT` key types: the value itself, which is injective) or as
Spark's 64-bit ``xxhash64`` of the normalised key (other types); a hashed key's matches are checked on the
key values themselves (:meth:`MultiJoinWorker._verified`), so a hash collision never joins rows.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ... import constraints as _constraints
from ..._native import load
from ..._validate import micro_batch_id
from ...control import ControlHandle, parse_join_plan
from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common import state_bytes as _state_bytes
from .._common.chunks import WHOLE_BATCHES, ChunkScheduler, Schedule, schedule_from_params
from .._common.codec import ColumnCodec
from .._common.payload import KEPT, PayloadSide, split_sides, timeout_ms
from .._common.shards import MULTI_JOIN, check_shard_count, default_rule
from .._common.shed import SHED, shed_mask
from .arrivals import FORMAT_META, InputArrivals, strip_metadata
from .changelog import Delta, Recorder
from .nested import NestedLeft, entry_schema, nested_orders

__all__ = ["SHARD", "TIME", "MICROS", "KEY", "KEY_NULL", "PEAKS", "band_names", "metric_names",
           "step_names", "closure", "default_orders", "timeout_at", "MultiJoinConfig", "MultiJoinWorker"]
from ...vocabulary import metrics as M

SHARD = "__cq_shard"
TIME = "__cq_t"         # the event-time column, carrying the watermark marker (Spark drops late rows)
MICROS = "__cq_tus"     # the same instant as epoch microseconds (TIMESTAMP_NTZ: of its wall-clock time)
KEY = "__cq_key"        # the kernel's int64 key (0 when the key is null)
KEY_NULL = "__cq_keynull"
_I64_MAX = np.iinfo(np.int64).max
DEADLINE = "__cq_deadline"   # an unmatched prefix tuple: the watermark (ms) from which it is output null-padded
_LEFT, _RIGHT = 0, 1         # the sides of a bound (i, j, ...): i is the interval join's left input, j its right
#: A changelog / files shard writes a new snapshot when its deltas' bytes would exceed this fraction of the
#: snapshot's (the interval join's rule and reasoning: :data:`pyspark_cq.operators.join.worker.SNAPSHOT_RATIO`).
SNAPSHOT_RATIO = 0.5
#: The kernel's memory per stored row (bytes) for the resident cache's bound: its slot columns (key, time, id,
#: end, stage, prev, next: 7 x 8 B, alive 1 B), a heap entry (16 B) and the key index's share. An estimate: the
#: kernel has no ``nbytes()`` call (the binary join's has).
KERNEL_ROW_BYTES = 80


def _pid(i: int) -> str:
    return f"__cq_id{i}"


def _pcol(i: int, name: str) -> str:
    return f"__cq_o{i}_{name}"


def outer_last(orders, outer: int | None) -> tuple[tuple[int, ...], ...]:
    """The probe orders with the left input ``outer`` moved last in every other input's order: the partial
    matches before that step are the prefix tuples whose match it decides.
    """
    if outer is None:
        return tuple(tuple(o) for o in orders)
    return tuple(tuple(o) if i == outer else tuple(j for j in o if j != outer) + (outer,)
                 for i, o in enumerate(orders))


def outer_deadlines(times: dict, outer_bounds) -> np.ndarray:
    """Per prefix tuple, the watermark (ms) from which no row of the left input can match it: the earliest over
    the bounds to the left input of the watermark at which the interval join's left outer rule
    (:func:`~pyspark_cq.operators.join.worker.evict_at_ms`, Spark's ``getStateValueWatermark``) evicts the
    tuple's row of that bound unmatched. ``times``: the tuple's micros per prefix input.
    """
    from ..join.worker import evict_at_ms

    out = None
    for k, side, lo, up in outer_bounds:
        at = evict_at_ms(times[k], lo, up, side)
        out = at if out is None else np.minimum(out, at)
    return out


#: Per-batch maxima over the shards (the other counters are sums): the chunk scheduler's memory figures.
PEAKS = M.PEAKS
#: The bounds-graph flags of an ``n``-input join, ``banded_<i>_<j>`` for i < j: 1 when the query gives a bound
#: between inputs i and j (the kernel checks a time band when one of them probes the other), else 0. Maxima over
#: the shards like :data:`PEAKS`: constant per query, reported so that a plan policy can tell a banded probe step
#: from one that matches on the key alone.
band_names = M.band_names
#: The counters of an ``n``-input join (:func:`pyspark_cq.vocabulary.metrics.multi_join_names`).
metric_names = M.multi_join_names


def step_names(n: int) -> tuple[str, ...]:
    """The probe steps' names in ``params["priorities"]`` / ``["selectivities"]``: ``"<i>_<j>"``, the step of
    rows arriving on input ``i`` that probes input ``j``.
    """
    return tuple(f"{i}_{j}" for i in range(n) for j in range(n) if i != j)


def closure(n: int, bounds) -> np.ndarray:
    """``D[i][j]``: the largest ``t_j - t_i`` the bounds ``(i, j, lower, upper)`` allow (their shortest-path
    closure, computed by the kernel, which expires rows by it); ``inf`` where unconstrained. A negative
    ``D[i][i]`` means the bounds contradict each other.
    """
    return np.array(load("_mjoin").MultiJoinState(n, [list(b) for b in bounds]).closure())


def default_orders(n: int, bounds) -> tuple[tuple[int, ...], ...]:
    """The static probe order of every input: greedily the input whose implied time band to the inputs
    already bound is narrowest (fewest candidate rows per probe at a steady rate), ties by index.
    """
    d = closure(n, bounds)
    width = d + d.T  # width of the band of t_j - t_i
    orders = []
    for a in range(n):
        bound, order = [a], []
        while len(order) < n - 1:
            nxt = min((j for j in range(n) if j not in bound), key=lambda j: (min(width[b][j] for b in bound), j))
            bound.append(nxt)
            order.append(nxt)
        orders.append(tuple(order))
    return tuple(orders)


def timeout_at(wm_ms: int, min_ends_us) -> int | None:
    """The event-time timeout (ms) of a shard: when the watermark (every row still to come is later than
    it) reaches the earliest expiry deadline of its rows (µs, the kernel's ``min_end``), or None.
    """
    return timeout_ms(wm_ms, [None if e is None else -(-e // 1000) for e in min_ends_us])


@dataclass(frozen=True)
class MultiJoinConfig:
    """What the workers need, fixed when the query is defined (picklable)."""

    n: int
    codecs: tuple[tuple[ColumnCodec, ...], ...]   # per input: its columns, in order
    key_pos: tuple[int, ...]                      # per input: position of its key among its columns
    out: tuple[tuple[int, int], ...]              # per output column: (input, column position)
    out_arrow: pa.Schema
    bounds: tuple[tuple[int, int, int, int], ...]
    orders: tuple[tuple[int, ...], ...]           # the default plan
    hashed: bool                                   # keys are hashes: verify matches on the values
    name: str
    control: ControlHandle | None = None
    shards: int = 1
    kept: bool = False                             # params["kept_column"]: stored rows carry their kept fraction
    #: ``how``: the left (outer) input, the last one, or None (all inner)
    outer: int | None = None
    #: per bound linking the left input z to an earlier input k: ``(k, side, lower, upper)``, side the join's LEFT
    #: (0) when the bound is ``(k, z, ...)``, RIGHT (1) when it is ``(z, k, ...)``: what closes z's band for k
    outer_bounds: tuple[tuple[int, int, int, int], ...] = ()
    #: ``how`` with a left input before the last (:mod:`.nested`): per input its join type (input 0: ``"first"``)
    hows: tuple[str, ...] = ()
    #: per input, how long (µs past its time) a row is kept with nested left inputs (:func:`.nested.retention`)
    retain: tuple[int, ...] = ()
    #: stream constraints (STREAM §5.2) with inputs by index, checked (:func:`.driver.check_multi_constraints`)
    constraints: tuple = ()
    #: state_persistence: "full", "changelog" or "files" (resident copy + deltas, :mod:`.._common.changelog`)
    persistence: str = "full"
    snapshot_every: int = 10        # changelog / files: a new snapshot at the latest every this many batches
    state_id: str = ""              # changelog / files: this operator's name space in the worker's resident cache
    state_dir: str | None = None    # files: the directory of the snapshot and delta files
    versions: int = 100             # files: spark.sql.streaming.minBatchesToRetain (garbage collection)

    @property
    def resident(self) -> bool:
        """The state stays in the worker between batches and deltas are persisted."""
        return self.persistence in _changelog.RESIDENT

    @property
    def nested(self) -> bool:
        """A left input before the last one (entries with nulls, :mod:`.nested`)."""
        return bool(self.retain)

    def input_schema(self, i: int) -> pa.Schema:
        """Input ``i``'s decoded columns (what the shedding hash sees)."""
        return pa.schema([c.payload_field for c in self.codecs[i]])

    def payload_schema(self, i: int) -> pa.Schema:
        """Input ``i``'s stored rows: its columns, and with ``kept`` the kept fraction of the row's batch."""
        schema = self.input_schema(i)
        return schema.append(pa.field(KEPT, pa.float64())) if self.kept else schema

    def columns(self) -> dict:
        """The key and input columns the state depends on (recorded in and checked against the state;
        a state saved before ``kept`` was recorded was saved without it). A left input adds ``how`` (absent
        from an inner join's record, which stays as it was).
        """
        out = {"on": [self.codecs[i][self.key_pos[i]].name for i in range(self.n)],
               "inputs": [[c.name for c in self.codecs[i]] for i in range(self.n)], "kept": self.kept}
        if self.outer is not None:
            out["outer"] = self.outer
        if self.nested:
            out["how"] = list(self.hows[1:])
        return out

    @property
    def prefix(self) -> tuple[int, ...]:
        """The inputs before the left input (all of them without one)."""
        return tuple(i for i in range(self.n) if i != self.outer)

    def pending_schema(self) -> pa.Schema:
        """The unmatched prefix tuples of a join with a left input: per prefix input its payload id (-1 once
        the row left the state) and its stored columns, the deadline (watermark, ms) from which no row of the
        left input can match, and the product of the rows' kept fractions (``kept``).
        """
        fields = [pa.field(_pid(i), pa.int64()) for i in self.prefix] + [pa.field(DEADLINE, pa.int64())]
        for i in self.prefix:
            fields += [pa.field(_pcol(i, f.name), f.type) for f in self.input_schema(i)]
        if self.kept:
            fields.append(pa.field(KEPT, pa.float64()))
        return pa.schema(fields)


class MultiJoinWorker:
    """The per-group function. One micro-batch of one shard: restore the kernel and the payload tables,
    feed the inputs in input order (each call probes the state as it was before it, so every result tuple
    is emitted once, by the batch and input that brought its last row), evict what the watermark
    guarantees can no longer match, compact and save.
    """

    def __init__(self, config: MultiJoinConfig):
        self.config = config
        self.metrics = metric_names(config.n, config.outer is not None or config.nested, bool(config.constraints),
                                    config.resident)
        self._bands = {M.banded(b[0], b[1]): 1 for b in config.bounds}
        # the inputs the declared constraints make unique on the key, whatever the control table switches: their
        # violations are counted while a constraint is off too (a policy watches adherence before turning it on)
        self._declared_unique = _constraints.multi_eviction(config.constraints, config.n).unique
        self._arrival = any(c.kind in _constraints.ARRIVAL_KINDS for c in config.constraints)
        self._reach_us = None

    def _new_arrivals(self) -> InputArrivals | None:
        """Empty ``clustered`` / ``ordered`` trackers of a shard; None without such constraints."""
        if not self._arrival:
            return None
        if self._reach_us is None:   # per input: the largest t_j - t_i the bounds allow (a row's last chance)
            d = closure(self.config.n, self.config.bounds)
            n = self.config.n
            self._reach_us = [int(min(max(d[i][j] for j in range(n) if j != i), _I64_MAX // 2)) for i in range(n)]
        return InputArrivals(self.config.constraints, self._reach_us)

    # -- constraints (STREAM §5.2, docs/constraints.md)

    def eviction(self, entry) -> _constraints.MultiEviction | None:
        """What the declared constraints let this batch drop, with the control entry's
        ``params["constraint_<name>"]`` switches; None without constraints or when all are off.
        """
        constraints = self.config.constraints
        if not constraints:
            return None
        params = entry.get("params") if entry is not None else None
        eviction = _constraints.multi_eviction(constraints, self.config.n,
                                               _constraints.control_enabled(params or None, constraints))
        return eviction if eviction.active else None

    def _held_keys(self, kernel, sides, i: int):
        """Input ``i``'s live rows as (keys, times, payload ids); keys as the kernel's int64 values, or (hashed
        keys) the key values themselves, normalised as SQL equality compares them, so a hash collision never
        counts as holding a key.
        """
        keys, times, ids = kernel.live_rows(i)
        if self.config.hashed:
            keys = self._key_values(sides, i, ids)
        return keys, times, ids

    def _key_values(self, sides, i: int, ids) -> pa.Array:
        """The key values of input ``i``'s payload rows ``ids``, normalised as SQL equality compares them."""
        values = sides[i].take(ids).column(self.config.key_pos[i]).combine_chunks()
        if pa.types.is_floating(values.type):   # -0.0 == 0.0 (NaN == NaN already holds for is_in)
            values = pc.add(values, pa.scalar(0.0, values.type))
        return values

    def _tracked(self, sides, i: int, keys, ids) -> pa.Array:
        """Keys as the arrival trackers see them: the kernel's int64 keys (direct types: the values), else the
        key values (a hash collision never closes another key).
        """
        if self.config.hashed:
            return keys if isinstance(keys, pa.Array) else self._key_values(sides, i, ids)
        return pa.array(np.asarray(keys, dtype=np.int64), pa.int64())

    def _constrain(self, kernel, sides, eviction, wm_ms: int, arrivals=None) -> int:
        """Remove the rows the constraints make useless (:func:`pyspark_cq.constraints.multi_drop`, every input
        decided on the same snapshot of the state; ``arrivals``: the shard's ``clustered`` / ``ordered``
        trackers after the batch's rows); returns how many went.
        """
        n = self.config.n
        live = [self._held_keys(kernel, sides, i) for i in range(n)]
        keys = [k for k, _, _ in live]
        gone = 0
        for y in range(n):
            if not (eviction.closes(y) or eviction.delay[y]):
                continue
            closed = {}
            if arrivals and len(live[y][2]):
                tracked = None
                for j in range(n):
                    if j != y and eviction.arrival and eviction.arrival[j]:
                        tracked = self._tracked(sides, y, keys[y], live[y][2]) if tracked is None else tracked
                        closed[j] = arrivals.closed(j, eviction.arrival[j], tracked)
            drop = _constraints.multi_drop(eviction, y, keys, live[y][1], wm_ms, closed, self.config.outer)
            if drop.any():
                gone += int(kernel.remove_ids(y, live[y][2][drop]))
        return gone

    # -- plan

    def orders(self, entry) -> tuple[tuple[int, ...], ...]:
        """The probe orders of this batch: the entry's ``plan_id``, else the default."""
        plan = entry.get("plan_id") if entry is not None else None
        if plan is None:
            return self.config.orders
        try:
            parsed = parse_join_plan(plan, self.config.n, operator=f"multi_join {self.config.name!r}")
            if self.config.nested:
                return nested_orders(parsed, self.config.hows)
            return outer_last(parsed, self.config.outer)
        except ValueError as exc:
            raise ValueError(f"{exc} (micro-batch {micro_batch_id()})") from None

    def schedule(self, entry, where: str) -> Schedule:
        """The chunk schedule of the probe steps the entry's ``params`` ask for (:mod:`._chunks`; keys of
        ``priorities`` / ``selectivities``: :func:`step_names`), or whole batches.
        """
        params = entry.get("params") if entry is not None else None
        return schedule_from_params(params, step_names(self.config.n), where=where)

    # -- state

    def _new(self):
        config = self.config
        kernel = load("_mjoin").MultiJoinState(config.n, [list(b) for b in config.bounds])
        pending = PayloadSide(config.pending_schema()) if config.outer is not None else None
        if config.nested:
            pending = NestedLeft(config)
        return kernel, [PayloadSide(config.payload_schema(i)) for i in range(config.n)], pending

    def _restore(self, state, key=None):
        """The kernel, payload tables and waiting tuples of this shard from its GroupState, or new; also the
        value's changelog / files log (None for the full layout): the snapshot with its deltas replayed.
        """
        return self._restore_state(state, key)[:4]

    def _restore_state(self, state, key=None):
        """:meth:`_restore`, and the shard's ``clustered`` / ``ordered`` trackers (None without such
        constraints; from input 0's payload metadata, format 2, and the deltas' arrive / forget calls).
        """
        arrivals = self._new_arrivals()
        if not state.exists:
            return (*self._new(), None, arrivals)
        config = self.config
        blobs, deltas, log = _changelog.load(state.get, self._files, key)
        kernel = load("_mjoin").MultiJoinState.deserialize(_state_bytes.unpack(blobs[0]))
        sides = [PayloadSide.from_bytes(config.payload_schema(i), blobs[1 + i]) for i in range(config.n)]
        check_shard_count(sides[0].table, config.shards, MULTI_JOIN, default_rule(MULTI_JOIN))
        sides[0].check_columns(config.columns(), MULTI_JOIN)
        pending = None
        if config.outer is not None:
            pending = PayloadSide.from_bytes(config.pending_schema(), blobs[1 + config.n])
        if config.nested:
            pending = NestedLeft(config, PayloadSide.from_bytes(entry_schema(config), blobs[1 + config.n]).table)
        if arrivals is not None:
            arrivals.restore(sides[0].table.schema.metadata)
        return kernel, sides, self._replay(kernel, sides, pending, arrivals, deltas), log, arrivals

    @staticmethod
    def _replay(kernel, sides, pending, arrivals, deltas):
        """Repeat the changelog ``deltas`` (blobs, in order) on the state; returns ``pending`` (its table replaced
        by the last delta that recorded one).
        """
        for blob in deltas:
            waiting = Delta.decode(blob).replay(kernel, sides, arrivals)
            if waiting is not None:
                pending.table = waiting
        return pending

    def _files(self):
        """The worker process's handle on the state directory (files layout, or a value it wrote)."""
        return _changelog.state_files(self.config.state_dir, "docs/multi_join.md")

    def _waiting(self, pending) -> int:
        return 0 if pending is None else pending.table.num_rows

    def _empty(self, kernel, pending) -> bool:
        return sum(kernel.rows(i) for i in range(self.config.n)) == 0 and not self._waiting(pending)

    def _snapshot(self, kernel, sides, pending, arrivals=None) -> tuple[bytes, ...]:
        """The full image of the state: compact the payload tables to the live rows (renumbering the kernel's
        and the waiting tuples' ids), then the packed kernel, the payload per input (input 0's metadata holding
        the ``clustered`` / ``ordered`` trackers, state format 2) and the waiting tuples.
        """
        n = self.config.n
        waiting = self._waiting(pending)
        nested = isinstance(pending, NestedLeft)
        for i in range(n):
            old = kernel.canonical_ids(i)
            if waiting and nested:
                pending.renumber(i, old, sides[i].table.num_rows)
            elif waiting and i != self.config.outer:
                _renumber(pending, i, old, sides[i].table.num_rows)
            sides[i].keep(old)
        table = sides[0].table
        if arrivals is not None:   # written afresh: a tracker that emptied leaves no stale entry behind
            sides[0].table = table.replace_schema_metadata({**strip_metadata(table.schema.metadata),
                                                            **arrivals.metadata()})
        elif FORMAT_META in (table.schema.metadata or {}):   # the query dropped its arrival constraints: format 1
            sides[0].table = table.replace_schema_metadata(strip_metadata(table.schema.metadata))
        blobs = (_state_bytes.pack(kernel.serialize()),) + tuple(
            s.to_bytes(*((self.config.shards, self.config.columns()) if i == 0 else ())) for i, s in enumerate(sides))
        if nested:
            blobs += (PayloadSide(pending.schema, pending.table).to_bytes(),)
        elif pending is not None:
            blobs += (pending.to_bytes(),)
        return blobs

    def _set_timeout(self, state, kernel, pending, wm_ms: int) -> None:
        """The timeout at which the shard's first row expires or its first waiting tuple is due."""
        if isinstance(pending, NestedLeft):
            first = pending.min_deadline_us()
            due = [] if first is None else [first]
        else:
            due = [] if not self._waiting(pending) else [int(pc.min(pending.table.column(DEADLINE)).as_py()) * 1000]
        timeout = timeout_at(wm_ms, [kernel.min_end(i) for i in range(self.config.n)] + due)
        if timeout is not None:
            state.setTimeoutTimestamp(timeout)

    def _save(self, state, kernel, sides, pending, wm_ms: int, arrivals=None) -> int:
        """Compact the payload tables to the live rows (renumbering the unmatched prefix tuples' ids), keep
        the state (or remove it when empty) and set the timeout at which its first row expires or its first
        unmatched tuple is due; returns the bytes kept.
        """
        if self._empty(kernel, pending):
            state.remove()
            return 0
        blobs = self._snapshot(kernel, sides, pending, arrivals)
        state.update(blobs)
        self._set_timeout(state, kernel, pending, wm_ms)
        return sum(len(b) for b in blobs)

    def _save_log(self, state, key, kernel, sides, pending, wm_ms: int, log, delta: Delta, arrivals=None) -> int:
        """Changelog or files persistence (:func:`.._common.changelog.save`): the batch's ``delta`` (with the
        waiting tuples as the batch left them), or a new snapshot by the shared rules; the objects stay in the
        resident cache under the new token. Returns the bytes the state's value (and files) hold.
        """
        config = self.config
        if self._empty(kernel, pending):
            _changelog.forget(state, config.state_id, key)
            return 0
        if pending is not None:
            delta.pending = pending.table
        nbytes = sum(s.table.nbytes for s in sides) + KERNEL_ROW_BYTES * sum(kernel.rows(i) for i in range(config.n))
        nbytes += 0 if pending is None else pending.table.nbytes
        _, held = _changelog.save(
            state, key, config.persistence, log, lambda: self._snapshot(kernel, sides, pending, arrivals), delta.encode,
            state_id=config.state_id, snapshot_every=config.snapshot_every, ratio=SNAPSHOT_RATIO,
            files=self._files() if config.persistence == "files" else None, retain=config.versions,
            resident=lambda new: (kernel, sides, pending, new, arrivals), nbytes=nbytes)
        self._set_timeout(state, kernel, pending, wm_ms)
        return held

    # -- one batch

    def _input(self, pdf: pd.DataFrame, i: int, streaming: bool):
        """Input ``i``'s rows of this batch: ``(payload table, keys, micros, malformed)``. Rows without a time
        are malformed in a stream (Spark keeps them in its state forever and never emits them); rows without
        a time or a key never match, so they are not kept.
        """
        config = self.config
        table = pa.Table.from_arrays([c.to_arrow(pdf) for c in config.codecs[i]], schema=config.input_schema(i))
        null_time = pdf[MICROS].isna().to_numpy()
        micros = pdf[MICROS].to_numpy(dtype=np.int64, na_value=0)
        keys = pdf[KEY].to_numpy(dtype=np.int64, na_value=0)
        keep = ~(null_time | pdf[KEY_NULL].to_numpy(dtype=bool, na_value=True))
        malformed = int(null_time.sum()) if streaming else 0
        if not keep.all():
            table, micros, keys = table.filter(pa.array(keep)), micros[keep], keys[keep]
        return table, keys, micros, malformed

    def _verified(self, sides, matches: np.ndarray, inputs=None) -> np.ndarray:
        """The matches whose key values are equal in every input (of ``inputs``, default all; hashed keys only:
        drops hash collisions).
        """
        config = self.config
        if not config.hashed or len(matches) == 0:
            return matches
        inputs = list(range(config.n) if inputs is None else inputs)
        first = sides[inputs[0]].take(matches[:, inputs[0]]).column(config.key_pos[inputs[0]])
        ok = np.ones(len(matches), dtype=bool)
        for i in inputs[1:]:
            other = sides[i].take(matches[:, i]).column(config.key_pos[i])
            ok &= _same_key(first, other)
        return matches if ok.all() else matches[ok]

    def _rows(self, sides, matches: np.ndarray) -> pa.Table:
        config = self.config
        taken = [sides[i].take(matches[:, i]) for i in range(config.n)]
        # Payload types as stored (TIMESTAMP_NTZ in ns); _metrics.packed_row casts to the output schema.
        cols = [taken[i].column(p) for i, p in config.out]
        if config.kept:  # a result exists only when all its rows were kept: RTStream §4.4, the product of their ε
            cols.append(pa.array(np.prod([t.column(KEPT).to_numpy() for t in taken], axis=0), type=pa.float64()))
        return pa.Table.from_arrays(cols, names=config.out_arrow.names)

    def _probe_in_chunks(self, kernel, i: int, order: list, keys, micros, ids, schedule: Schedule, counters: dict):
        """Input ``i``'s probe steps over chunks of partial matches under ``schedule`` (STREAM §5.3, Chain;
        :class:`~._chunks.ChunkScheduler`), then its rows are stored: yields the complete matches (payload ids,
        ``(rows, n)``) as the last step emits them.

        Exact: no row is stored while input i's steps run, so every step probes the state insert_probe's
        depth-first probe would see, and the steps together extend the same partial matches (the kernel's
        ``probe_step``); only the order of the matches and the memory held between the steps differ.
        """
        n = self.config.n
        names = step_names(n)
        mine = [names.index(f"{i}_{j}") for j in order]

        def pick(v):
            return None if v is None else tuple(v[k] for k in mine)
        schedule = Schedule(schedule.strategy, schedule.chunk_rows, schedule.max_buffered_rows,
                            pick(schedule.priorities), pick(schedule.selectivities))
        cols = [f"i{c}" for c in range(n)] + [f"t{c}" for c in range(n)]

        def step(k: int, j: int):
            probed, matched, nanos = M.probed(i, j), M.matched(i, j), M.probe_nanos(i, j)

            def run(batch: pa.RecordBatch) -> pa.RecordBatch:
                col = [batch.column(c).to_numpy() for c in range(1 + 2 * n)]
                start = time.perf_counter_ns()
                key, pid, t = kernel.probe_step(i, order, k, col[0], np.column_stack(col[1:1 + n]),
                                                np.column_stack(col[1 + n:]))
                counters[nanos] += time.perf_counter_ns() - start
                counters[probed] += batch.num_rows
                counters[matched] += len(key)
                return _partials(key, pid, t, cols)
            return run

        first = np.zeros((len(keys), n), dtype=np.int64)
        pid, t = first.copy(), first
        pid[:, i], t[:, i] = ids, micros
        scheduler = ChunkScheduler([step(k, j) for k, j in enumerate(order)], schedule)
        for done in scheduler.run(iter([_partials(keys, pid, t, cols)])):
            yield np.column_stack([done.column(1 + c).to_numpy() for c in range(n)])
        kernel.store(i, keys, micros, ids)
        counters[M.CHUNK_STEPS] += scheduler.steps_run
        counters[M.PEAK_BUFFERED_ROWS] = max(counters[M.PEAK_BUFFERED_ROWS], scheduler.peak_buffered)
        counters[M.PEAK_WORKER_RSS] = max(counters[M.PEAK_WORKER_RSS], scheduler.peak_rss)

    # -- a left input (how): the prefix tuples still waiting for its match

    def _probe_prefix(self, kernel, sides, i: int, order, keys, micros, ids, counters: dict):
        """Rows of prefix input ``i`` probe in ``order`` (the left input last) one step at a time, then are
        stored: returns the prefix tuples they complete (payload ids and micros, ``(m, n)``; hash collisions
        dropped) and their complete matches (ids, ``(k, n)``).
        """
        n = self.config.n
        pid = np.zeros((len(keys), n), dtype=np.int64)
        t = pid.copy()
        pid[:, i], t[:, i] = ids, micros
        key = keys
        prefix = (pid, t)
        for k, j in enumerate(order):
            if k == len(order) - 1:
                prefix = (pid, t)
            counters[M.probed(i, j)] += len(key)
            key, pid, t = kernel.probe_step(i, list(order), k, key, pid, t)
            counters[M.matched(i, j)] += len(key)
        kernel.store(i, keys, micros, ids)
        prefix_ids, prefix_t = prefix
        if self.config.hashed and len(prefix_ids):
            ok = _row_keys(self._verified(sides, prefix_ids, self.config.prefix), self.config.prefix)
            keep = np.isin(_row_keys(prefix_ids, self.config.prefix), ok)
            prefix_ids, prefix_t = prefix_ids[keep], prefix_t[keep]
        return prefix_ids, prefix_t, pid

    def _wait(self, sides, pending, ids: np.ndarray, times: np.ndarray, matched: np.ndarray) -> None:
        """Keep the prefix tuples ``ids`` (their rows' ``times``) that are not among the ``matched`` ones as
        unmatched, with their deadline and their rows' columns (the rows may leave the state first).
        """
        config = self.config
        if len(ids) and len(matched):
            ids_keys = _row_keys(ids, config.prefix)
            hit = np.isin(ids_keys, _row_keys(matched, config.prefix))
            ids, times = ids[~hit], times[~hit]
        if not len(ids):
            return
        deadline = outer_deadlines({k: times[:, k] for k in config.prefix}, config.outer_bounds)
        cols = [pa.array(ids[:, i], pa.int64()) for i in config.prefix] + [pa.array(deadline, pa.int64())]
        kept = np.ones(len(ids))
        for i in config.prefix:
            taken = sides[i].take(ids[:, i])
            cols += [taken.column(c) for c in range(len(config.codecs[i]))]
            if config.kept:
                kept = kept * taken.column(KEPT).to_numpy()
        if config.kept:
            cols.append(pa.array(kept, pa.float64()))
        pending.append(pa.Table.from_arrays(cols, schema=config.pending_schema()))

    def _matched(self, pending, matches: np.ndarray) -> None:
        """Drop the unmatched prefix tuples that the complete ``matches`` (ids) now match."""
        config = self.config
        if not len(matches) or not pending.table.num_rows:
            return
        waiting = np.column_stack([pending.table.column(_pid(i)).to_numpy() for i in config.prefix])
        full = np.zeros((len(waiting), config.n), dtype=np.int64)
        full[:, list(config.prefix)] = waiting
        hit = np.isin(_row_keys(full, config.prefix), _row_keys(matches, config.prefix))
        if hit.any():
            pending.table = pending.table.filter(pa.array(~hit))

    def _padded(self, pending, wm_ms: int | None, counters: dict) -> pa.Table | None:
        """Output the unmatched prefix tuples that are due (deadline <= the watermark; all in a batch join),
        null-padded for the left input's columns, and drop them.
        """
        config = self.config
        table = pending.table
        if not table.num_rows:
            return None
        due = np.ones(table.num_rows, dtype=bool) if wm_ms is None else table.column(DEADLINE).to_numpy() <= wm_ms
        if not due.any():
            return None
        rows = table.filter(pa.array(due))
        pending.table = table.filter(pa.array(~due))
        counters[M.PADDED_ROWS] += rows.num_rows
        z = config.outer
        cols = [pa.nulls(rows.num_rows, config.input_schema(z).field(p).type) if i == z
                else rows.column(_pcol(i, config.input_schema(i).field(p).name)) for i, p in config.out]
        if config.kept:
            cols.append(rows.column(KEPT))
        return pa.Table.from_arrays(cols, names=config.out_arrow.names)

    def _lonely(self, pdf: pd.DataFrame, i: int, streaming: bool, ratio: float):
        """A two-input join's first input: its rows that can never match (a null key; in a batch join also a
        null time) but are output null-padded as Spark's left outer join does: ``(table, micros, shed)``, the
        rows left after load shedding and the number shed.
        """
        config = self.config
        null_time = pdf[MICROS].isna().to_numpy()
        lonely = pdf[KEY_NULL].to_numpy(dtype=bool, na_value=True) & ~null_time
        if not streaming:
            lonely |= null_time
        if not lonely.any():
            return None, None, 0
        part = pdf[lonely].reset_index(drop=True)
        table = pa.Table.from_arrays([c.to_arrow(part) for c in config.codecs[i]], schema=config.input_schema(i))
        micros = part[MICROS].to_numpy(dtype=np.int64, na_value=0)
        keep = ~shed_mask(table, micros, i, 0, ratio)
        return table.filter(pa.array(keep)), micros[keep], int((~keep).sum())

    def _admit_lonely(self, sides, pdf: pd.DataFrame, i: int, streaming: bool, ratio: float, counters: dict):
        """The first input's rows that can never match (:meth:`_lonely`), shed rows counted, stored in its side:
        ``(row ids, micros)``, or None when there is none.
        """
        table, micros, shed = self._lonely(pdf, i, streaming, ratio)
        counters[SHED] += shed
        counters[M.per_input(SHED, i)] += shed
        if table is None or not len(micros):
            return None
        if self.config.kept:
            table = table.append_column(KEPT, pa.array(np.full(len(micros), 1.0 - ratio)))
        return sides[0].append(table), micros

    def _admit(self, sides, pdf: pd.DataFrame, i: int, streaming: bool, ratio: float, counters: dict):
        """Input ``i``'s rows of this batch counted (input, malformed), shed (``ratio``) and stored in its side:
        ``(keys, micros, row ids)``, or None when no row is left.
        """
        config = self.config
        table, keys, micros, malformed = self._input(pdf, i, streaming)
        counters[M.INPUT_ROWS] += len(pdf)
        counters[M.per_input(M.INPUT_ROWS, i)] += len(pdf)
        counters[M.MALFORMED_ROWS] += malformed
        counters[M.per_input(M.MALFORMED_ROWS, i)] += malformed
        drop = shed_mask(table, micros, i, 0, ratio)
        if drop.any():
            keep = ~drop
            table, keys, micros = table.filter(pa.array(keep)), keys[keep], micros[keep]
            counters[SHED] += int(drop.sum())
            counters[M.per_input(SHED, i)] += int(drop.sum())
        if not len(keys):
            return None
        if config.kept:   # after the shedding hash, which must not see it
            table = table.append_column(KEPT, pa.array(np.full(len(keys), 1.0 - ratio)))
        return keys, micros, sides[i].append(table)

    def _process(self, kernel, sides, inputs, wm_ms: int | None, orders, counters: dict, ratio: float = 0.0,
                 schedule: Schedule = WHOLE_BATCHES, pending=None, eviction=None, arrivals=None) -> list:
        """Feed the inputs (in input order) through the kernel, shedding the share ``ratio`` of every input
        first (the entry's ``drop_ratio``, RTStream §4.4; a hash of input, time and payload decides, as in
        the two-way join); returns the output tables. Under a chunk ``schedule`` (the entry's ``params``)
        each input's probe steps run over chunks (:meth:`_probe_in_chunks`). With a left input the prefix
        inputs' rows probe it last, step by step, and the prefix tuples it does not match wait in ``pending``
        until their deadline, when they are output null-padded (:meth:`_padded`); the steps then run whole.
        A streaming join with constraints counts the rows stored on a unique input whose key it already held
        (``constraint_violations``) and, after every input, drops what ``eviction`` (:meth:`eviction`) allows;
        ``arrivals`` (``clustered`` / ``ordered``) counts each input's stored rows and their violations first,
        and forgets the records the watermark passed last.
        """
        config = self.config
        if config.nested:
            return self._process_nested(kernel, sides, inputs, wm_ms, orders, counters, ratio, pending)
        parts = []
        for i in range(config.n):
            pdf = inputs[i]
            if pdf is None or len(pdf) == 0:
                continue
            if config.outer is not None and config.n == 2 and i == 0:   # a null key never matches, is output
                lonely = self._admit_lonely(sides, pdf, i, wm_ms is not None, ratio, counters)
                if lonely is not None:
                    row_ids, micros = lonely
                    ids = np.zeros((len(micros), config.n), dtype=np.int64)
                    ids[:, 0] = row_ids
                    times = np.zeros_like(ids)
                    times[:, 0] = micros
                    self._wait(sides, pending, ids, times, ids[:0])
            admitted = self._admit(sides, pdf, i, wm_ms is not None, ratio, counters)
            if admitted is None:
                continue
            keys, micros, ids = admitted
            watch = wm_ms is not None and self._declared_unique and self._declared_unique[i]
            if watch:   # a unique input stores one row per key: each stored row adding no key repeats one
                repeated = kernel.rows(i) - kernel.keys(i)
            if wm_ms is not None and arrivals:   # the stored rows' arrival positions (STREAM §5.2 tolerance k)
                counters[M.CONSTRAINT_VIOLATIONS] += arrivals.arrive(i, self._tracked(sides, i, keys, ids), micros)
            if config.outer is not None and i != config.outer:
                prefix_ids, prefix_t, matches = self._probe_prefix(kernel, sides, i, orders[i], keys, micros, ids,
                                                                   counters)
                if watch:
                    counters[M.CONSTRAINT_VIOLATIONS] += kernel.rows(i) - kernel.keys(i) - repeated
                matches = self._verified(sides, matches)
                self._wait(sides, pending, prefix_ids, prefix_t, matches)
                if len(matches):
                    parts.append(self._rows(sides, matches))
                continue
            if schedule is WHOLE_BATCHES or config.outer is not None:
                matches, probed, matched = kernel.insert_probe(i, keys, micros, ids, None, list(orders[i]))
                for step, j in enumerate(orders[i]):
                    counters[M.probed(i, j)] += int(probed[step])
                    counters[M.matched(i, j)] += int(matched[step])
                found = [matches]
            else:
                found = self._probe_in_chunks(kernel, i, list(orders[i]), keys, micros, ids, schedule, counters)
                if watch:   # it stores the rows once its matches are consumed
                    found = list(found)
            if watch:
                counters[M.CONSTRAINT_VIOLATIONS] += kernel.rows(i) - kernel.keys(i) - repeated
            for matches in found:
                matches = self._verified(sides, matches)
                if len(matches):
                    parts.append(self._rows(sides, matches))
                    if pending is not None:
                        self._matched(pending, matches)
        if pending is not None:   # after every input of the batch: a match in it comes first
            padded = self._padded(pending, wm_ms, counters)
            if padded is not None:
                parts.append(padded)
        if wm_ms is not None and eviction is not None:   # after every input: a match in the batch comes first
            counters[M.EVICTED_ROWS] += self._constrain(kernel, sides, eviction, wm_ms, arrivals)
        if wm_ms is not None:  # every row still to come is later than the watermark (later ones are late)
            counters[M.EVICTED_ROWS] += sum(len(kernel.evict(i, wm_ms * 1000)) for i in range(config.n))
            if arrivals:
                arrivals.forget(wm_ms)
        return parts

    def _process_nested(self, kernel, sides, inputs, wm_ms: int | None, orders, counters: dict, ratio: float,
                        nested: NestedLeft) -> list:
        """:meth:`_process` with a left input before the last (:mod:`.nested`): each input's rows probe step by
        step in the nested order; the partial matches before the step probing a later left input L that it does not
        extend wait for L (:meth:`.NestedLeft.wait_prefixes`), those a row of a left input completes stop waiting;
        the rows are stored with their end (:func:`.nested.retention`) and meet the entries with a null waiting for
        their input; after every input of the batch the entries the watermark decides are padded or dropped.
        """
        config = self.config
        n, hows = config.n, config.hows
        parts = []
        for i in range(n):
            pdf = inputs[i]
            if pdf is None or len(pdf) == 0:
                continue
            if i == 0 and hows[1] == "left":   # a first row that never matches: (row, null, ...) as in Spark's chain
                lonely = self._admit_lonely(sides, pdf, i, wm_ms is not None, ratio, counters)
                if lonely is not None:
                    row_ids, micros = lonely
                    ids = np.full((len(micros), n), -1, dtype=np.int64)
                    ids[:, 0] = row_ids
                    times = np.zeros_like(ids)
                    times[:, 0] = micros
                    nested.settle(nested.from_rows(sides, ids, times, np.zeros(len(micros), dtype=np.int64), 1,
                                                   keynull=np.ones(len(micros), dtype=bool)), sides, kernel)
            admitted = self._admit(sides, pdf, i, wm_ms is not None, ratio, counters)
            if admitted is None:
                continue
            keys, micros, ids = admitted
            order = list(orders[i])
            pid = np.zeros((len(keys), n), dtype=np.int64)
            t = pid.copy()
            pid[:, i], t[:, i] = ids, micros
            key, bound, decided = keys, {i}, i == 0 or hows[i] != "left"
            for k, j in enumerate(order):
                before = (key, pid, t)
                counters[M.probed(i, j)] += len(key)
                key, pid, t = kernel.probe_step(i, order, k, key, pid, t)
                bound.add(j)
                if config.hashed and len(key):
                    ok = self._verified_mask(sides, pid, sorted(bound))
                    key, pid, t = key[ok], pid[ok], t[ok]
                counters[M.matched(i, j)] += len(key)
                if hows[j] == "left" and j > i and len(before[0]):   # the prefixes over 0 .. j-1 it decides
                    cols = list(range(j))
                    unmatched = ~np.isin(_row_keys(before[1], cols), _row_keys(pid, cols))
                    nested.wait_prefixes(sides, j, before[1][unmatched], before[2][unmatched], before[0][unmatched])
                if not decided and bound.issuperset(range(i)):   # rows of left input i match these prefixes
                    nested.matched_prefixes(i, pid)
                    decided = True
            if len(key):
                parts.append(self._rows(sides, pid))
            kernel.store(i, keys, micros, ids, None, micros + config.retain[i])
            nested.arrive(kernel, sides, i, keys, micros, ids)
        nested.due(sides, kernel, wm_ms)   # after every input of the batch: a match in it comes first
        padded = nested.output(counters)
        if padded is not None:
            parts.append(padded)
        if wm_ms is not None:
            counters[M.EVICTED_ROWS] += sum(len(kernel.evict(i, wm_ms * 1000)) for i in range(n))
        return parts

    def _verified_mask(self, sides, matches: np.ndarray, inputs) -> np.ndarray:
        """Per partial match, whether its key values are equal in ``inputs`` (hashed keys)."""
        config = self.config
        first = sides[inputs[0]].take(matches[:, inputs[0]]).column(config.key_pos[inputs[0]])
        ok = np.ones(len(matches), dtype=bool)
        for i in inputs[1:]:
            ok &= _same_key(first, sides[i].take(matches[:, i]).column(config.key_pos[i]))
        return ok

    def _report(self, parts, counters: dict, kernel, pending=None) -> pd.DataFrame:
        out = None
        if parts:
            out = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        counters[M.OUTPUT_ROWS] = 0 if out is None else out.num_rows
        for i in range(self.config.n):
            counters[M.per_input(M.STATE_ROWS, i)] = kernel.rows(i)
        counters[M.STATE_ROWS] = sum(kernel.rows(i) for i in range(self.config.n))
        if pending is not None:
            counters[M.UNMATCHED_ROWS] = pending.table.num_rows
        return _metrics.packed_row(out, self.config.out_arrow, self.metrics, **counters)

    def _counters(self) -> dict:
        counters = dict.fromkeys(self.metrics, 0)
        counters.update(self._bands)
        return counters

    def _entry(self):
        return None if self.config.control is None else self.config.control.entry()

    @staticmethod
    def _ratio(entry) -> float:
        return float(entry.get("drop_ratio", 0.0)) if entry is not None else 0.0

    # -- streaming: one call per shard and micro-batch

    def streaming(self, key, pdf_iter, state):
        """``applyInPandasWithState`` function: one shard, one micro-batch."""
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*concatenation with empty")
        entry = self._entry()
        orders = self.orders(entry)
        schedule = self.schedule(entry, f"multi_join {self.config.name!r} (micro-batch {micro_batch_id()})")
        config = self.config
        cached = None
        counters = self._counters()
        if config.resident and state.exists:
            cached, missed, current = _changelog.take_resident(state.get, config.state_id, key, self._files)
            if cached is not None and current is not None:   # the files layout: the value's manifest, and what
                kernel, sides, pending, _, arrivals = cached  # another worker wrote since this copy
                pending = self._replay(kernel, sides, pending, arrivals, missed)
                cached = (kernel, sides, pending, current, arrivals)
            counters[M.STATE_CACHE_MISSES if cached is None else M.STATE_CACHE_CATCH_UPS if missed
                     else M.STATE_CACHE_HITS] = 1
        kernel, sides, pending, log, arrivals = cached if cached is not None else self._restore_state(state, key)
        inputs = [None] * config.n if state.hasTimedOut else split_sides(list(pdf_iter), config.n)
        wm_ms = state.getCurrentWatermarkMs()
        recorder = Recorder(kernel, sides, arrivals) if config.resident else None
        parts = self._process(kernel if recorder is None else recorder.kernel,
                              sides if recorder is None else recorder.sides, inputs, wm_ms, orders, counters,
                              self._ratio(entry), schedule, pending, self.eviction(entry),
                              arrivals if recorder is None else recorder.arrivals)
        if recorder is None:
            counters[M.STATE_BYTES] = self._save(state, kernel, sides, pending, wm_ms, arrivals)
        else:
            counters[M.STATE_BYTES] = self._save_log(state, key, kernel, sides, pending, wm_ms, log, recorder.delta,
                                                     arrivals)
        yield self._report(parts, counters, kernel, pending)

    # -- batch: one call per shard with every input; nothing is kept

    def batch(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """``applyInPandas`` function: one shard of a batch join, every input at once."""
        entry = self._entry()
        orders = self.orders(entry)
        schedule = self.schedule(entry, f"multi_join {self.config.name!r}")
        kernel, sides, pending = self._new()
        counters = self._counters()
        parts = self._process(kernel, sides, split_sides([pdf], self.config.n), None, orders, counters,
                              self._ratio(entry), schedule, pending)
        return self._report(parts, counters, kernel, pending)


def _partials(keys, ids, times, names) -> pa.RecordBatch:
    """Partial matches as one Arrow batch (the chunk scheduler's unit): key, then per input id and time."""
    n = ids.shape[1]
    arrays = [pa.array(keys, pa.int64())] + [pa.array(ids[:, c], pa.int64()) for c in range(n)] + [
        pa.array(times[:, c], pa.int64()) for c in range(n)]
    return pa.RecordBatch.from_arrays(arrays, names=["key"] + names)


def _row_keys(ids: np.ndarray, cols) -> np.ndarray:
    """The rows of ``ids[:, cols]`` as single comparable values (for ``np.isin``)."""
    sub = np.ascontiguousarray(ids[:, list(cols)], dtype=np.int64)
    return sub.view(np.dtype((np.void, 8 * sub.shape[1]))).ravel()


def _renumber(pending, i: int, old: np.ndarray, rows: int) -> None:
    """Input ``i``'s payload ids of the unmatched prefix tuples after the payload keeps the rows ``old`` (in
    that order): a kept row's new id is its position, a row that left the state gets -1 (it can match no more).
    """
    new = np.full(rows + 1, -1, dtype=np.int64)   # index -1 (already gone) reads the extra last slot
    new[old] = np.arange(len(old), dtype=np.int64)
    col = pending.table.column(_pid(i)).to_numpy()
    pending.table = pending.table.set_column(pending.table.schema.get_field_index(_pid(i)), _pid(i),
                                             pa.array(new[col], pa.int64()))


def _same_key(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Element-wise SQL join equality of two non-null key columns (floats: ``-0.0 == 0.0``, ``NaN == NaN``)."""
    if pa.types.is_floating(a.type):
        x = a.to_numpy().astype(np.float64)
        y = b.to_numpy().astype(np.float64)
        return (x == y) | (np.isnan(x) & np.isnan(y))
    if a.type != b.type:
        b = b.cast(a.type)
    return pc.equal(a, b).to_numpy(zero_copy_only=False)
