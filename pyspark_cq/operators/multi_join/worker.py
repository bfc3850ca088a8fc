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

from ..._native import load
from ..._validate import micro_batch_id
from ...control import ControlHandle, parse_join_plan
from .._common import metrics as _metrics
from .._common import state_bytes as _state_bytes
from .._common.chunks import WHOLE_BATCHES, ChunkScheduler, Schedule, schedule_from_params
from .._common.codec import ColumnCodec
from .._common.payload import KEPT, PayloadSide, split_sides, timeout_ms
from .._common.shards import MULTI_JOIN, check_shard_count, default_rule
from .._common.shed import SHED, shed_mask

__all__ = ["SHARD", "TIME", "MICROS", "KEY", "KEY_NULL", "PEAKS", "band_names", "metric_names",
           "step_names", "closure", "default_orders", "timeout_at", "MultiJoinConfig", "MultiJoinWorker"]
from ...vocabulary import metrics as M

SHARD = "__cq_shard"
TIME = "__cq_t"         # the event-time column, carrying the watermark marker (Spark drops late rows)
MICROS = "__cq_tus"     # the same instant as epoch microseconds (TIMESTAMP_NTZ: of its wall-clock time)
KEY = "__cq_key"        # the kernel's int64 key (0 when the key is null)
KEY_NULL = "__cq_keynull"
_I64_MAX = np.iinfo(np.int64).max


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

    def input_schema(self, i: int) -> pa.Schema:
        """Input ``i``'s decoded columns (what the shedding hash sees)."""
        return pa.schema([c.payload_field for c in self.codecs[i]])

    def payload_schema(self, i: int) -> pa.Schema:
        """Input ``i``'s stored rows: its columns, and with ``kept`` the kept fraction of the row's batch."""
        schema = self.input_schema(i)
        return schema.append(pa.field(KEPT, pa.float64())) if self.kept else schema

    def columns(self) -> dict:
        """The key and input columns the state depends on (recorded in and checked against the state;
        a state saved before ``kept`` was recorded was saved without it).
        """
        return {"on": [self.codecs[i][self.key_pos[i]].name for i in range(self.n)],
                "inputs": [[c.name for c in self.codecs[i]] for i in range(self.n)], "kept": self.kept}


class MultiJoinWorker:
    """The per-group function. One micro-batch of one shard: restore the kernel and the payload tables,
    feed the inputs in input order (each call probes the state as it was before it, so every result tuple
    is emitted once, by the batch and input that brought its last row), evict what the watermark
    guarantees can no longer match, compact and save.
    """

    def __init__(self, config: MultiJoinConfig):
        self.config = config
        self.metrics = metric_names(config.n)
        self._bands = {M.banded(b[0], b[1]): 1 for b in config.bounds}

    # -- plan

    def orders(self, entry) -> tuple[tuple[int, ...], ...]:
        """The probe orders of this batch: the entry's ``plan_id``, else the default."""
        plan = entry.get("plan_id") if entry is not None else None
        if plan is None:
            return self.config.orders
        try:
            return parse_join_plan(plan, self.config.n, operator=f"multi_join {self.config.name!r}")
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
        return kernel, [PayloadSide(config.payload_schema(i)) for i in range(config.n)]

    def _restore(self, state):
        if not state.exists:
            return self._new()
        config = self.config
        blobs = state.get
        kernel = load("_mjoin").MultiJoinState.deserialize(_state_bytes.unpack(blobs[0]))
        sides = [PayloadSide.from_bytes(config.payload_schema(i), blobs[1 + i]) for i in range(config.n)]
        check_shard_count(sides[0].table, config.shards, MULTI_JOIN, default_rule(MULTI_JOIN))
        sides[0].check_columns(config.columns(), MULTI_JOIN)
        return kernel, sides

    def _save(self, state, kernel, sides, wm_ms: int) -> int:
        """Compact the payload tables to the live rows, keep the state (or remove it when empty) and set the
        timeout at which its first row expires; returns the bytes kept.
        """
        n = self.config.n
        if sum(kernel.rows(i) for i in range(n)) == 0:
            state.remove()
            return 0
        for i in range(n):
            sides[i].keep(kernel.canonical_ids(i))
        blobs = (_state_bytes.pack(kernel.serialize()),) + tuple(
            s.to_bytes(*((self.config.shards, self.config.columns()) if i == 0 else ())) for i, s in enumerate(sides))
        state.update(blobs)
        timeout = timeout_at(wm_ms, [kernel.min_end(i) for i in range(n)])
        if timeout is not None:
            state.setTimeoutTimestamp(timeout)
        return sum(len(b) for b in blobs)

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

    def _verified(self, sides, matches: np.ndarray) -> np.ndarray:
        """The matches whose key values are equal in every input (hashed keys only: drops hash collisions)."""
        config = self.config
        if not config.hashed or len(matches) == 0:
            return matches
        first = sides[0].take(matches[:, 0]).column(config.key_pos[0])
        ok = np.ones(len(matches), dtype=bool)
        for i in range(1, config.n):
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

    def _process(self, kernel, sides, inputs, wm_ms: int | None, orders, counters: dict, ratio: float = 0.0,
                 schedule: Schedule = WHOLE_BATCHES) -> list:
        """Feed the inputs (in input order) through the kernel, shedding the share ``ratio`` of every input
        first (the entry's ``drop_ratio``, RTStream §4.4; a hash of input, time and payload decides, as in
        the two-way join); returns the output tables. Under a chunk ``schedule`` (the entry's ``params``)
        each input's probe steps run over chunks (:meth:`_probe_in_chunks`).
        """
        config = self.config
        parts = []
        for i in range(config.n):
            pdf = inputs[i]
            if pdf is None or len(pdf) == 0:
                continue
            table, keys, micros, malformed = self._input(pdf, i, wm_ms is not None)
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
                continue
            if config.kept:   # after the shedding hash, which must not see it
                table = table.append_column(KEPT, pa.array(np.full(len(keys), 1.0 - ratio)))
            ids = sides[i].append(table)
            if schedule is WHOLE_BATCHES:
                matches, probed, matched = kernel.insert_probe(i, keys, micros, ids, None, list(orders[i]))
                for step, j in enumerate(orders[i]):
                    counters[M.probed(i, j)] += int(probed[step])
                    counters[M.matched(i, j)] += int(matched[step])
                found = [matches]
            else:
                found = self._probe_in_chunks(kernel, i, list(orders[i]), keys, micros, ids, schedule, counters)
            for matches in found:
                matches = self._verified(sides, matches)
                if len(matches):
                    parts.append(self._rows(sides, matches))
        if wm_ms is not None:  # every row still to come is later than the watermark (later ones are late)
            counters[M.EVICTED_ROWS] += sum(len(kernel.evict(i, wm_ms * 1000)) for i in range(config.n))
        return parts

    def _report(self, parts, counters: dict, kernel) -> pd.DataFrame:
        out = None
        if parts:
            out = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        counters[M.OUTPUT_ROWS] = 0 if out is None else out.num_rows
        for i in range(self.config.n):
            counters[M.per_input(M.STATE_ROWS, i)] = kernel.rows(i)
        counters[M.STATE_ROWS] = sum(kernel.rows(i) for i in range(self.config.n))
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
        kernel, sides = self._restore(state)
        inputs = [None] * self.config.n if state.hasTimedOut else split_sides(list(pdf_iter), self.config.n)
        wm_ms = state.getCurrentWatermarkMs()
        counters = self._counters()
        parts = self._process(kernel, sides, inputs, wm_ms, orders, counters, self._ratio(entry), schedule)
        counters[M.STATE_BYTES] = self._save(state, kernel, sides, wm_ms)
        yield self._report(parts, counters, kernel)

    # -- batch: one call per shard with every input; nothing is kept

    def batch(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """``applyInPandas`` function: one shard of a batch join, every input at once."""
        entry = self._entry()
        orders = self.orders(entry)
        schedule = self.schedule(entry, f"multi_join {self.config.name!r}")
        kernel, sides = self._new()
        counters = self._counters()
        parts = self._process(kernel, sides, split_sides([pdf], self.config.n), None, orders, counters,
                              self._ratio(entry), schedule)
        return self._report(parts, counters, kernel)


def _partials(keys, ids, times, names) -> pa.RecordBatch:
    """Partial matches as one Arrow batch (the chunk scheduler's unit): key, then per input id and time."""
    n = ids.shape[1]
    arrays = [pa.array(keys, pa.int64())] + [pa.array(ids[:, c], pa.int64()) for c in range(n)] + [
        pa.array(times[:, c], pa.int64()) for c in range(n)]
    return pa.RecordBatch.from_arrays(arrays, names=["key"] + names)


def _same_key(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Element-wise SQL join equality of two non-null key columns (floats: ``-0.0 == 0.0``, ``NaN == NaN``)."""
    if pa.types.is_floating(a.type):
        x = a.to_numpy().astype(np.float64)
        y = b.to_numpy().astype(np.float64)
        return (x == y) | (np.isnan(x) & np.isnan(y))
    if a.type != b.type:
        b = b.cast(a.type)
    return pc.equal(a, b).to_numpy(zero_copy_only=False)
