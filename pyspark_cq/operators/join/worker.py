"""Worker side of :func:`pyspark_cq.interval_join` and :func:`pyspark_cq.window_join`.

Everything here runs in Spark's Python workers (``applyInPandasWithState`` per shard and micro-batch,
``cogroup().applyInPandas`` per shard of a batch join): the per-group function :class:`JoinWorker`
with the payload tables of both inputs (:class:`PayloadSide`), the watermark arithmetic that gives each
stored row its expiry key (:func:`state_watermarks`, :func:`evict_at_ms`) and the load-shedding
decision (:func:`shed_mask`). It holds only a picklable :class:`JoinConfig` and loads the compiled
kernel lazily (``pyspark_cq._join``), so nothing here needs a SparkSession.

Column names of the transport layout (the tagged union of both inputs) all start with ``__cq_``.
"""
from __future__ import annotations

import functools
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ... import constraints as _constraints
from ..._native import load
from ...control import ControlHandle
from ...control.schema import side_drop_ratios
from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common import state_bytes as _state_bytes
from .._common import state_files as _state_files
from .._common.codec import ColumnCodec, codecs_for, encode_keys
from .._common.payload import KEPT, SIDE, PayloadSide, split_sides, timeout_ms
from .._common.shed import SHED, shed_mask
from . import changelog as _log

__all__ = ["LEFT", "RIGHT", "SHARD", "TIME", "MICROS", "WINDOW", "EMITTED", "SHED_SIDES", "SHED_METRICS", "METRICS",
           "BATCH_METRICS", "SNAPSHOT_RATIO", "JoinConfig", "state_watermarks", "validity", "evict_at_ms", "JoinWorker"]
from ...vocabulary import metrics as M

if TYPE_CHECKING:
    from .spec import JoinSpec

LEFT, RIGHT = 0, 1
SHARD = "__cq_shard"
TIME = "__cq_t"          # the event-time column, carrying the watermark marker (Spark drops late rows)
MICROS = "__cq_tus"      # the same instant as epoch microseconds, for the kernel
WINDOW = "__cq_w"        # window join under a control table: the row's own window (µs)
EMITTED = "__cq_e"       # left semi join: the left row has been output (at its first match)
SHED_SIDES = (M.SHED_ROWS_LEFT, M.SHED_ROWS_RIGHT)   # shed_rows per input
SHED_METRICS = M.JOIN_SHED                           # the join's own report columns, after the shared ones
METRICS = M.JOIN_STREAMING   # the streaming report: JOIN, then the resident-state cache's counters
BATCH_METRICS = M.JOIN       # a batch join keeps no state
#: A changelog writes a new snapshot when its deltas' bytes would exceed this fraction of the snapshot's. Every
#: byte of the value crosses the JVM each batch (~25 ms per MB, mostly the JVM -> Python pickle) and a snapshot
#: costs about as much per MB of state once (~30 ms, docs/benchmark-log-2026.md, issue 39): with deltas growing
#: by 1/W of the state per batch (W batches of retention) the per-batch sum is smallest at a snapshot every
#: ~sqrt(2.5 W) batches, i.e. deltas of ~0.5 of the snapshot for W ~ 8-10.
SNAPSHOT_RATIO = 0.5
#: The layouts that keep the state resident in the worker and persist deltas.
RESIDENT = _changelog.RESIDENT
_STORES = _changelog._STORES   # state_dir -> StateFiles of this worker process (shared with multi_join)
_I64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class JoinConfig:
    """The picklable subset of a :class:`~pyspark_cq.operators.join.spec.JoinSpec` the workers need
    (fixed when the query is defined, shipped with the closures).
    """

    key_codecs: tuple[ColumnCodec, ...]
    side_codecs: tuple[tuple[ColumnCodec, ...], tuple[ColumnCodec, ...]]
    out_columns: tuple[str, ...]
    n_keys: int
    how: str
    lower: int
    upper: int
    window: tuple[int, int] | None
    control: ControlHandle | None = None
    drop_ratio: tuple[float, float] = (0.0, 0.0)   # (left, right), the argument
    seed: int = 0
    out_arrow: pa.Schema | None = None  # the output's Arrow schema (packed streaming output)
    shards: int | None = None         # layout "shard": the shard count, recorded in and checked against the state
    out_keys: tuple[int, ...] | None = None  # the key pairs output once (one name on both sides); None: all
    key_names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())   # left_on, right_on
    kept: bool = False                # kept_column: each stored row keeps its batch's kept fraction
    bucket_width: int | None = None   # bucket layout (bucket): groups are (shard, bucket of this width)
    persistence: str = "full"         # state_persistence: "full", "changelog" or "files" (resident copy + deltas)
    snapshot_every: int = 10          # changelog / files: a new snapshot at the latest every this many batches
    state_id: str = ""                # changelog / files: this operator's name space in the worker's resident cache
    state_dir: str | None = None      # files: the directory of the snapshot and delta files (also read by others)
    retain: int = 100                 # files: spark.sql.streaming.minBatchesToRetain (garbage collection)
    constraints: tuple = ()           # stream constraints (STREAM §5.2), checked: pyspark_cq.constraints

    @classmethod
    def of(cls, spec: JoinSpec) -> JoinConfig:
        """The worker configuration of ``spec``."""
        keys = tuple(ColumnCodec(c.name, t, c.flagged)
                     for c, t in zip(codecs_for(spec.left.schema, spec.left_keys, "__cq_k"), spec.key_types))
        lc = tuple(codecs_for(spec.left.schema, spec.left_others, f"__cq_p{LEFT}_"))
        rc = tuple(codecs_for(spec.right.schema, spec.right_others, f"__cq_p{RIGHT}_"))
        out = tuple(spec.keys) + tuple(spec.left_out) + tuple(spec.right_out)
        if spec.window:
            out += ("valid_from", "valid_to")
        if spec.kept_column is not None:
            out += (spec.kept_column,)
        return cls(keys, (lc, rc), out, len(spec.left_keys), spec.how, spec.lower, spec.upper, spec.window,
                   spec.control, spec.drop_ratio, spec.seed, out_arrow=_metrics.arrow_schema(spec.output_schema()),
                   shards=spec.shards if spec.layout == "shard" else None, out_keys=tuple(spec.out_keys),
                   key_names=(tuple(spec.left_keys), tuple(spec.right_keys)), kept=spec.kept_column is not None,
                   bucket_width=spec.bucket_width, persistence=spec.persistence, snapshot_every=spec.snapshot_every,
                   state_id=uuid.uuid4().hex if spec.persistence in RESIDENT else "", state_dir=spec.state_dir,
                   retain=spec.retain, constraints=tuple(spec.constraints))

    def columns(self) -> dict:
        """The key and input columns the state depends on (recorded in and checked against the state);
        the bucket layout adds its width (absent from the shard layout's record, which stays as it was).
        """
        if self.bucket_width is not None:
            return {**self._columns(), "bucket_width": self.bucket_width}
        return self._columns()

    def _columns(self) -> dict:
        return {"left_on": list(self.key_names[LEFT]), "right_on": list(self.key_names[RIGHT]),
                "left": [c.name for c in self.side_codecs[LEFT]], "right": [c.name for c in self.side_codecs[RIGHT]],
                "kept": self.kept}   # with kept_column the stored rows carry their kept fraction

    def payload_schema(self, side: int) -> pa.Schema:
        """Arrow schema of the payload table of input ``side``."""
        fields = [c.payload_field for c in self.key_codecs + self.side_codecs[side]]
        if self.how == "left_semi" and side == LEFT:
            fields.append(pa.field(EMITTED, pa.bool_()))
        if self.window:  # valid_from / valid_to need each row's instant; the plain band join does not
            fields.append(pa.field(MICROS, pa.int64()))
            if self.control is not None:  # ... and, when windows can change, each row's own window
                fields.append(pa.field(WINDOW, pa.int64()))
        if self.kept:
            fields.append(pa.field(KEPT, pa.float64()))
        return pa.schema(fields)

    def row_bounds(self, entry, side: int, micros: np.ndarray):
        """Per-row ``(lower, upper, window)`` in force at each row's timestamp (PIPES §4.2), from the
        control-table ``entry``; ``(None, None, None)`` when no entry (the kernel's own bounds apply).

        Interval join: the ``lower`` / ``upper`` schedules. Window join: the ``window`` schedule sets both
        inputs' windows, ``lower = -w_right + 1``, ``upper = w_left - 1`` (§2.4.1: validities
        ``[t, t + w)`` intersect); ``window`` is this side's own window, for ``valid_to``.
        """
        if entry is None:
            if self.window and self.control is not None:
                return None, None, np.full(len(micros), self.window[side], dtype=np.int64)
            return None, None, None
        if not self.window:
            return (entry.values_at("lower", micros, default=self.lower),
                    entry.values_at("upper", micros, default=self.upper), None)
        wl = entry.values_at("window", micros, default=self.window[LEFT])
        wr = entry.values_at("window", micros, default=self.window[RIGHT])
        return -wr + 1, wl - 1, (wl if side == LEFT else wr)


def state_watermarks(wm_ms, lower, upper):
    """Eviction thresholds (µs, inclusive) of the left and right state for watermark ``wm_ms``.

    Reproduces Spark's ``StreamingJoinHelper.getStateValueWatermark`` for the condition
    ``left.t + lower <= right.t <= left.t + upper``: the constraint ``wm*1000 - upper`` (left) or
    ``wm*1000 + lower`` (right) in double microseconds, divided by 1000 and truncated to milliseconds,
    minus 1 ms for the non-strict inequality; rows with ``t <= that * 1000 µs`` are removed.
    Vectorised: array arguments (broadcast together) give int64 arrays, scalars give ints.
    """
    wm = np.asarray(wm_ms, dtype=np.float64)
    left_ms = np.trunc((wm * 1000.0 - np.asarray(upper, dtype=np.float64)) / 1000.0) - 1
    right_ms = np.trunc((wm * 1000.0 + np.asarray(lower, dtype=np.float64)) / 1000.0) - 1
    if left_ms.ndim == 0 and right_ms.ndim == 0:
        return int(left_ms) * 1000, int(right_ms) * 1000
    return left_ms.astype(np.int64) * 1000, right_ms.astype(np.int64) * 1000


def evict_at_ms(times, lower, upper, side: int, *, guard: bool = False) -> np.ndarray:
    """Per row, the smallest watermark (ms) at which :func:`state_watermarks` evicts it: the row's expiry
    key in the kernel (rows with key <= the batch's watermark are evicted).

    ``lower`` / ``upper`` are the rows' own bounds (arrays or scalars). With ``guard`` (bounds that may
    change, PIPES §4.2) a row is also kept until the watermark reaches its own time: a later-arriving
    row with an earlier timestamp is decided by *its* bounds (the earlier element's, §2.4.1), which may
    differ, so only rows no future (non-late, ``t > watermark``) row can precede may go.
    """
    t = np.asarray(times, dtype=np.int64)
    reach = np.asarray(upper if side == LEFT else -np.asarray(lower), dtype=np.int64)
    # First guess from the continuous formula, then step to the exact smallest watermark.
    guess = (t + reach) // 1000 + 2
    for step, moves in ((-1, lambda g: state_watermarks(g - 1, lower, upper)[side] >= t),
                        (1, lambda g: state_watermarks(g, lower, upper)[side] < t)):
        for _ in range(64):
            move = moves(guess)
            if not np.any(move):
                break
            guess = np.where(move, guess + step, guess)
        else:  # pragma: no cover - the guess is within a few ms of the answer
            raise RuntimeError("evict_at_ms did not converge")
    if guard:
        guess = np.maximum(guess, -(-t // 1000))
    return np.asarray(guess, dtype=np.int64)


def validity(tl, tr, wl, wr) -> list:
    """``valid_from`` / ``valid_to`` (UTC timestamp arrays) of window-join pairs with left / right times ``tl`` /
    ``tr`` (µs) and windows ``wl`` / ``wr`` (µs, scalars or per row): the intersection of the rows' validities
    ``[t, t + w)`` (PIPES, Cammert et al., §2.4.1).
    """
    utc = pa.timestamp("us", tz="UTC")
    return [pa.array(np.maximum(tl, tr), type=pa.int64()).cast(utc),
            pa.array(np.minimum(np.add(tl, wl), np.add(tr, wr)), type=pa.int64()).cast(utc)]


def _shed_counters(shed) -> dict:
    """The report's shedding counters from the rows shed per input: ``shed_rows`` and per input."""
    return {SHED: int(shed[0] + shed[1]), SHED_SIDES[0]: int(shed[0]), SHED_SIDES[1]: int(shed[1])}


class JoinWorker:
    """The per-group function: kernel + payload tables, driven as Spark's join drives its state.

    One micro-batch of one group (:meth:`streaming`) goes through named steps: :meth:`_restore` the
    kernel and payload, and per input side (left first, as Spark) :meth:`_side_input` (decode, drop
    rows without a time, shed) and :meth:`_insert_probe`; then :meth:`_evict`, :meth:`_emit` the
    matched and the expired unmatched rows, and :meth:`_save`. Rows behind the watermark never get
    here: Spark drops them before the stateful operator (they are ``late_rows``).
    """

    def __init__(self, config: JoinConfig):
        self.config = config

    # -- input decoding

    def _decode(self, pdf: pd.DataFrame, side: int) -> tuple[pa.Table, np.ndarray]:
        """Arrow payload table (keys, side's columns, micros) and the micros of the rows of one side."""
        config = self.config
        codecs = config.key_codecs + config.side_codecs[side]
        arrays = [c.to_arrow(pdf) for c in codecs]
        micros = pdf[MICROS].to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).min)
        if config.window:
            arrays.append(pa.array(micros, type=pa.int64()))
        schema = config.payload_schema(side)
        for late in (WINDOW, EMITTED, KEPT):  # appended per batch by _insert_probe
            if late in schema.names:
                schema = schema.remove(schema.get_field_index(late))
        return pa.Table.from_arrays(arrays, schema=schema), micros

    def _side_input(self, pdf: pd.DataFrame, side: int, streaming: bool, ratio: float):
        """One side's rows of this batch, decoded: ``(table, micros, null_time, malformed, shed)``.

        Streaming drops (and counts as malformed) rows without a time: Spark keeps them in its state
        forever and never emits them. Load shedding (PIPES §5.3) then drops rows by :func:`shed_mask`;
        they are not part of the input.
        """
        table, micros = self._decode(pdf, side)
        null_time = pdf[MICROS].isna().to_numpy()
        malformed = shed = 0
        if streaming and null_time.any():
            malformed = int(null_time.sum())
            keep = ~null_time
            table, micros = table.filter(pa.array(keep)), micros[keep]
            null_time = np.zeros(len(micros), dtype=bool)
        drop = shed_mask(table, micros, side, self.config.seed, ratio)
        if drop.any():
            shed = int(drop.sum())
            keep = ~drop
            table, micros, null_time = table.filter(pa.array(keep)), micros[keep], null_time[keep]
        return table, micros, null_time, malformed, shed

    # -- one batch through the kernel

    def _insert_probe(self, kernel, sides, side: int, table: pa.Table, micros: np.ndarray, null_time: np.ndarray,
                      wm_ms: int | None, entry, ratio: float, store: bool = True, log=None, eviction=None,
                      violations=None, arrivals=None):
        """Probe the other side's state with one side's rows and store them (kernel ``insert_probe``);
        returns the matched pairs as (left payload ids, right payload ids). ``ratio`` is the batch's drop
        ratio (stored with each row as its kept fraction ``1 - ratio`` with ``kept_column``). With
        ``store=False`` (probe copies of the bucket layout) the rows only probe; their payload rows are
        appended for the output and dropped again by :meth:`PayloadSide.canonicalize`. ``log`` (a
        :class:`~.changelog.Delta`, changelog persistence) records the stored rows. ``eviction`` (a
        :class:`~pyspark_cq.constraints.JoinEviction`, streaming) shortens a many-to-one child's expiry keys and,
        for an input declared unique, adds the stored rows whose key it already held to ``violations`` (a
        one-element list); ``arrivals`` (:class:`~pyspark_cq.constraints.Arrivals`) counts the stored rows'
        arrival positions (:meth:`_arrive`).
        """
        config = self.config
        lower, upper, window = config.row_bounds(entry, side, micros)
        if window is not None:
            table = table.append_column(WINDOW, pa.array(window, type=pa.int64()))
        if EMITTED in sides[side].schema.names:
            table = table.append_column(EMITTED, pa.array(np.zeros(len(micros), dtype=bool)))
        if config.kept:
            table = table.append_column(KEPT, pa.array(np.full(len(micros), 1.0 - ratio)))
        if null_time.any():  # batch: a row without time never matches, but outer joins keep it
            micros = np.where(null_time, 0, micros)
        ends = None
        if wm_ms is not None:  # streaming: expiry keys = the watermark (ms) that evicts each row
            ends = evict_at_ms(micros, config.lower if lower is None else lower,
                               config.upper if upper is None else upper, side, guard=entry is not None)
            if arrivals and store:
                violations[0] += self._arrive(arrivals, side, table, micros, ends)
            if eviction is not None:
                ends = _constraints.delay_ends(ends, micros, eviction.delay[side])
            if log is not None and store:
                log.store(side, table, micros, ends, lower, upper)
        if store and wm_ms is not None and violations is not None and self._declared_unique[side]:
            # A unique input stores one row per key: each stored row that adds no new key (null keys aside,
            # they are kept apart) repeats a key the state holds -- the violations the state can show. Counted
            # while the constraint is switched off too, so that a policy can watch adherence before turning it on.
            before = kernel.rows(side) - kernel.keys(side)
            pairs = self._kernel_insert(kernel, sides, side, table, micros, null_time, lower, upper, ends, store)
            nulls = np.zeros(len(micros), dtype=bool) if null_time is None else null_time.astype(bool).copy()
            for i in range(config.n_keys):
                nulls |= table.column(i).is_null().to_numpy(zero_copy_only=False)
            violations[0] += kernel.rows(side) - kernel.keys(side) - before - int(nulls.sum())
            return pairs
        return self._kernel_insert(kernel, sides, side, table, micros, null_time, lower, upper, ends, store)

    def _kernel_insert(self, kernel, sides, side: int, table: pa.Table, micros, null_time, lower, upper, ends,
                       store: bool = True):
        """Append ``table`` (the payload rows as stored) and run the kernel's ``insert_probe`` on them; the
        matched pairs as (left payload ids, right payload ids). A changelog replay calls it with what a
        delta recorded.
        """
        ids = sides[side].append(table)
        key_arrays = [table.column(i).combine_chunks() for i in range(self.config.n_keys)]
        offsets, data, null_key = encode_keys(key_arrays, load("_join").concat_keys)
        if null_time is not None and null_time.any():
            null_key = (null_time if null_key is None else (null_key.astype(bool) | null_time)).astype(np.uint8)
        idx, other = kernel.insert_probe(side, offsets, data, null_key, micros, ids, store=store, lower=lower,
                                         upper=upper, ends=ends)
        return (ids[idx], other) if side == LEFT else (other, ids[idx])

    def _arrive(self, arrivals, side: int, table: pa.Table, micros, ends) -> int:
        """Count one side's stored rows of the batch in its ``clustered`` / ``ordered`` trackers, in arrival order
        (event time, then key; rows with a null key are not counted); returns the violations, of switched-off
        constraints too (a policy watches adherence before it turns one on).
        ``ends`` (the rows' expiry keys by their band) is how long a key's cluster record stays.
        """
        trackers = arrivals.on(_constraints.SIDES[side])
        if not trackers:
            return 0
        keys = [table.column(i).combine_chunks() for i in range(self.config.n_keys)]
        valid = np.ones(len(micros), dtype=bool)
        for k in keys:
            if k.null_count:
                valid &= ~k.is_null().to_numpy(zero_copy_only=False)
        if not valid.all():
            mask = pa.array(valid)
            keys, micros, ends = [k.filter(mask) for k in keys], micros[valid], ends[valid]
        order = pa.array(_constraints.arrival_order(micros, keys))
        keys = [k.take(order) for k in keys]
        count = 0
        for kind, tracker in trackers:
            if kind == "clustered":
                offsets, data, _ = encode_keys(keys, load("_join").concat_keys)
                found = tracker.advance(_constraints.key_bytes(offsets, data), np.asarray(ends)[order.to_numpy()])
            else:
                found = tracker.advance(pa.table({f"k{i}": k for i, k in enumerate(keys)}))
            count += found
        return count

    def _arrivals(self, sides) -> _constraints.Arrivals | None:
        """The ``clustered`` / ``ordered`` trackers of this shard, kept in the right payload's schema metadata;
        None without such constraints.
        """
        arrivals = _constraints.Arrivals(self.config.constraints)
        return arrivals.restore(sides[RIGHT].table.schema.metadata) if arrivals else None

    @staticmethod
    def _keep_arrivals(sides, arrivals, wm_ms: int) -> None:
        """Forget the cluster records the watermark has passed and put the trackers into the right payload's
        schema metadata (which the state's bytes carry).
        """
        for tracker in arrivals.trackers.values():
            if isinstance(tracker, _constraints.Clusters):
                tracker.forget(wm_ms)
        table = sides[RIGHT].table
        meta = {k: v for k, v in (table.schema.metadata or {}).items() if not k.startswith(arrivals.META)}
        sides[RIGHT].table = table.replace_schema_metadata({**meta, **arrivals.to_metadata()})

    def _drop_unreachable(self, kernel, sides, eviction, arrivals) -> None:
        """Give each stored row whose key the other input will not bring again (its enabled ``clustered`` cluster
        closed, or below its ``ordered`` bound: STREAM §5.2) an expiry key the next eviction passes.
        """
        if eviction is None or not arrivals:
            return
        n_keys = self.config.n_keys
        for x in (LEFT, RIGHT):
            trackers = [(kind, t) for kind, t in arrivals.on(_constraints.SIDES[x]) if kind in eviction.arrival[x]]
            y = 1 - x
            if not trackers or kernel.rows(y) == 0:
                continue
            keys = sides[y].table.select(list(range(n_keys))).take(pa.array(kernel.row_ids(y)))
            keys = keys.rename_columns([f"k{i}" for i in range(n_keys)])
            drop = np.zeros(keys.num_rows, dtype=bool)
            for kind, tracker in trackers:
                if kind == "ordered":
                    drop |= tracker.below(keys)
                    continue
                closed = tracker.closed()
                if len(closed):
                    offsets, data, null = encode_keys([c.combine_chunks() for c in keys.columns],
                                                      load("_join").concat_keys)
                    hit = pc.is_in(_constraints.key_bytes(offsets, data), value_set=closed)
                    hit = hit.to_numpy(zero_copy_only=False).astype(bool)
                    drop |= hit if null is None else hit & ~null.astype(bool)
            if drop.any():
                _, ends = kernel.row_flags(y)
                kernel.set_ends(y, np.where(drop, _constraints.DROP_NOW, ends))

    @functools.cached_property
    def _declared_unique(self) -> tuple[bool, bool]:
        """Which inputs the declared constraints make unique on the key, whatever the control table switches."""
        return _constraints.join_eviction(self.config.constraints).unique

    def _eviction(self, entry) -> _constraints.JoinEviction | None:
        """The state the declared constraints let this batch drop (STREAM §5.2), with the control entry's
        ``params["constraint_<name>"]`` switches; None without constraints.
        """
        constraints = self.config.constraints
        if not constraints:
            return None
        extra = None if entry is None else (entry.params.get("params") or None)
        eviction = _constraints.join_eviction(constraints, _constraints.control_enabled(extra, constraints))
        return eviction if eviction.active or any(eviction.unique) else None

    @staticmethod
    def _drop_matched(kernel, eviction) -> None:
        """Give the matched rows of each input whose one partner has been seen (``eviction.drop_matched``,
        docs/constraints.md) an expiry key the next eviction passes: they leave with the watermark's rows.
        """
        if eviction is None:
            return
        for side in (LEFT, RIGHT):
            if not eviction.drop_matched[side] or kernel.rows(side) == 0:
                continue
            matched, ends = kernel.row_flags(side)
            if matched.any():
                kernel.set_ends(side, _constraints.drop_matched_ends(ends, matched))

    @staticmethod
    def _evict(kernel, wm_ms: int | None) -> list:
        """Per side, the (payload ids, matched flags) of the rows the watermark evicts (all in batch mode)."""
        threshold = _I64_MAX if wm_ms is None else wm_ms
        return [kernel.evict(side, threshold) for side in (LEFT, RIGHT)]

    def _emit(self, sides, pairs, evicted, log=None) -> list:
        """Output tables: the matched pairs, then (outer joins) the evicted rows that never matched.

        A left semi join outputs each left row at its first match instead of the pairs (as Spark's
        stream-stream semi join: once, as soon as a match is known); a left anti join outputs only the
        evicted left rows that never matched (as a left outer join's unmatched rows).
        """
        how = self.config.how
        if how == "left_semi":
            return self._first_matches(sides, pairs, log)
        parts = [] if how == "left_anti" else [self._rows(sides, p[0], p[1])
                                               for p in pairs if p is not None and len(p[0])]
        for side, hows in ((LEFT, ("left", "full", "left_anti")), (RIGHT, ("right", "full"))):
            if self.config.how in hows:
                ids, matched = evicted[side]
                lonely = ids[matched == 0]
                if len(lonely):
                    parts.append(self._rows(sides, lonely, None) if side == LEFT else self._rows(sides, None, lonely))
        return parts

    def _first_matches(self, sides, pairs, log=None) -> list:
        """Left semi join: the left rows matched in this batch that were not output before (marked in
        the left payload's ``EMITTED`` column, which travels with the state; ``log`` records the marks).
        """
        matched = [p[0] for p in pairs if p is not None and len(p[0])]
        if not matched:
            return []
        ids = np.unique(np.concatenate(matched))
        ids = ids[~sides[LEFT].table.column(EMITTED).to_numpy()[ids]]
        if not len(ids):
            return []
        self._mark_emitted(sides, ids)
        if log is not None:
            log.emitted.append(ids)
        return [self._rows(sides, ids, None)]

    @staticmethod
    def _mark_emitted(sides, ids) -> None:
        """Set the semi join's ``EMITTED`` flag of the left payload rows ``ids``."""
        table = sides[LEFT].table
        pos = table.schema.get_field_index(EMITTED)
        emitted = table.column(pos).to_numpy(zero_copy_only=False).copy()
        emitted[ids] = True
        sides[LEFT].table = table.set_column(pos, EMITTED, pa.array(emitted))

    def _process(self, kernel, sides, inputs, wm_ms: int | None, entry=None, copies=None, log=None):
        """Run one batch through the kernel.

        ``entry`` is the operator's control-table entry of this batch (None: the arguments apply).
        ``copies`` (bucket layout) are the probe copies per side from earlier and from later buckets,
        ``(earlier, later)``: the earlier ones probe the old state, the later ones after this group's
        own rows are stored (the order that gives each pair once, :mod:`.bucket`). ``log`` (changelog
        persistence) records what the batch changes in the state.
        Returns (output tables, evicted rows, malformed rows, [shed left rows, shed right rows], constraint
        violations). Streaming joins with constraints drop the state they make useless before the eviction
        (:meth:`_drop_matched`, :meth:`_drop_unreachable`, STREAM §5.2). Each input
        is shed by its own ratio (the entry's ``params["drop_left"]`` / ``["drop_right"]``, else its
        ``drop_ratio``, else the argument: :func:`~pyspark_cq.control.schema.side_drop_ratios`).
        """
        config = self.config
        pairs = [None, None]
        malformed, shed = 0, [0, 0]
        ratios = config.drop_ratio if entry is None else side_drop_ratios(entry.params, config.drop_ratio)
        eviction = self._eviction(entry) if wm_ms is not None else None
        arrivals = self._arrivals(sides) if wm_ms is not None else None
        violations = [0]
        if copies is not None:
            pairs += self._probe_copies(kernel, sides, copies[0], wm_ms, entry, ratios)
        for side in (LEFT, RIGHT):  # Spark's order: left input first, then right input
            pdf = inputs[side]
            if pdf is None or len(pdf) == 0:
                continue
            table, micros, null_time, bad, dropped = self._side_input(pdf, side, wm_ms is not None, ratios[side])
            malformed, shed[side] = malformed + bad, dropped
            if len(micros):
                pairs[side] = self._insert_probe(kernel, sides, side, table, micros, null_time, wm_ms, entry,
                                                 ratios[side], log=log, eviction=eviction, violations=violations,
                                                 arrivals=arrivals)
        if copies is not None:
            pairs += self._probe_copies(kernel, sides, copies[1], wm_ms, entry, ratios)
        self._drop_matched(kernel, eviction)
        self._drop_unreachable(kernel, sides, eviction, arrivals)
        evicted = self._evict(kernel, wm_ms)
        if arrivals:
            self._keep_arrivals(sides, arrivals, wm_ms)
        return (self._emit(sides, pairs, evicted, log), sum(len(e[0]) for e in evicted), malformed, shed,
                violations[0])

    def _probe_copies(self, kernel, sides, frames, wm_ms, entry, ratios) -> list:
        """Probe (never store) with the bucket layout's copies of each side (``ratios``: the drop ratio per
        side); their shed decision is the stored row's (same hash), and neither it nor a null time is
        counted again (only the own row is).
        """
        pairs = []
        for side in (LEFT, RIGHT):
            pdf = frames[side]
            if pdf is None or len(pdf) == 0 or kernel.rows(1 - side) == 0:
                continue
            table, micros, null_time, _, _ = self._side_input(pdf, side, True, ratios[side])
            if len(micros):
                pairs.append(self._insert_probe(kernel, sides, side, table, micros, null_time, wm_ms, entry,
                                                ratios[side], store=False))
        return pairs

    @staticmethod
    def _bucket_inputs(key, frames) -> tuple[list, tuple[list, list]]:
        """Bucket layout: this group's own rows per side, and the probe copies per side whose own bucket is
        earlier / later than the group's (``key`` is ``(shard, bucket)``; a null bucket holds null times).

        One stable sort by (side, earlier / own / later) and one ``take``, then slices: a boolean mask per
        part copied every column six times (measured 100-200 ms per batch of 300 k rows and 300 k copies).
        """
        from .bucket import OWN

        bucket = key[1]
        if bucket is None or pd.isna(bucket):
            return split_sides(frames, 2), ([None, None], [None, None])
        frames = [f for f in frames if len(f)]
        if not frames:
            return [None, None], ([None, None], [None, None])
        pdf = frames[0] if len(frames) == 1 else pd.DataFrame(
            {c: pd.concat([f[c] for f in frames], ignore_index=True) for c in frames[0].columns})
        b = int(bucket)
        own = pd.array(pdf[OWN], dtype="Int64").fillna(b).to_numpy(dtype=np.int64)
        # part: 0 earlier, 1 own, 2 later; code = side * 3 + part
        code = pdf[SIDE].to_numpy(dtype=np.int64) * 3 + (own >= b) + (own > b)
        order = np.argsort(code, kind="stable")
        bounds = np.searchsorted(code[order], np.arange(7))
        pdf = pdf.take(order)
        parts = [None] * 6
        for c in range(6):
            if bounds[c + 1] > bounds[c]:
                parts[c] = pdf.iloc[bounds[c]:bounds[c + 1]].reset_index(drop=True)
        return [parts[1], parts[4]], ([parts[0], parts[3]], [parts[2], parts[5]])

    # -- output

    def _rows(self, sides, left_ids, right_ids) -> pa.Table:
        """Output rows for matched pairs (both ids), or unmatched rows of one side (other ids None).

        Payload types as stored (TIMESTAMP columns naive in the session zone); see :meth:`_packed`.
        """
        config = self.config
        n = len(left_ids) if left_ids is not None else len(right_ids)
        lt = sides[LEFT].take(left_ids) if left_ids is not None else None
        rt = sides[RIGHT].take(right_ids) if right_ids is not None else None
        cols = []
        for i in (range(config.n_keys) if config.out_keys is None else config.out_keys):
            cols.append((lt if lt is not None else rt).column(i))
        for side, t in ((LEFT, lt), (RIGHT, rt)):
            codecs = config.side_codecs[side]
            schema = sides[side].schema
            for j in range(len(codecs)):
                pos = config.n_keys + j
                cols.append(t.column(pos) if t is not None else pa.nulls(n, schema.field(pos).type))
        if config.window:
            cols += self._validity(lt, rt)
        if config.kept:  # a pair exists only when both rows were kept: the product of their fractions
            kept = [t.column(KEPT).to_numpy() for t in (lt, rt) if t is not None]
            cols.append(pa.array(kept[0] * kept[1] if len(kept) == 2 else kept[0]))
        return pa.Table.from_arrays(cols, names=list(config.out_columns[:len(cols)]))

    def _validity(self, lt: pa.Table, rt: pa.Table) -> list:
        """``valid_from`` / ``valid_to`` of window-join pairs: the intersection of the rows' validities."""
        config = self.config
        tl = lt.column(MICROS).to_numpy()
        tr = rt.column(MICROS).to_numpy()
        if config.control is not None:  # each row's own window (PIPES §4.2)
            wl, wr = lt.column(WINDOW).to_numpy(), rt.column(WINDOW).to_numpy()
        else:
            wl, wr = config.window
        return validity(tl, tr, wl, wr)

    def _packed(self, parts) -> pa.Table | None:
        """The streaming output rows in the output's Arrow schema (TIMESTAMP columns are exact UTC
        instants already: see _common.codec).
        """
        if not parts:
            return None
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return table.cast(self.config.out_arrow)


    def _metrics_row(self, **counters) -> pd.DataFrame:
        own = {m: counters.pop(m, 0) for m in SHED_METRICS}
        row = _metrics.metrics_row(self.config.out_columns, **counters)
        for m, v in own.items():
            row[_metrics.PREFIX + m] = [int(v)]
        return row

    @staticmethod
    def _data(part: pd.DataFrame) -> pd.DataFrame:
        out = _metrics.data_rows(part)
        for m in SHED_METRICS:
            out[_metrics.PREFIX + m] = pd.arrays.IntegerArray(np.zeros(len(out), dtype=np.int64),
                                                              np.ones(len(out), dtype=bool))
        return out

    # -- state

    def _entry(self):
        """The control-table entry of this batch (one stat when unchanged), or None."""
        return None if self.config.control is None else self.config.control.entry()

    def _kernel(self, blob):
        """The kernel state restored from ``blob``; format-1 rows get their expiry keys recomputed."""
        join = load("_join")
        kernel = join.JoinState.deserialize(_state_bytes.unpack(blob))
        if kernel.restored_format == 1:  # format 1 kept no expiry keys: all rows had the state's bounds
            for side in (LEFT, RIGHT):
                t, lo, up = kernel.row_bounds(side)
                kernel.set_ends(side, evict_at_ms(t, lo, up, side))
        return kernel

    def _new(self):
        """An empty kernel and payload tables."""
        config = self.config
        kernel = load("_join").JoinState(config.lower, config.upper)
        return kernel, [PayloadSide(config.payload_schema(LEFT)), PayloadSide(config.payload_schema(RIGHT))]

    def _restore(self, state, key=None):
        """The kernel and payload tables of group ``key``: from its GroupState (and its files), or new."""
        kernel, sides, _ = self._restore_log(state, key)
        return kernel, sides

    def _files(self) -> _state_files.StateFiles:
        """The worker process's handle on the state directory (files layout, or a value it wrote)."""
        return _changelog.state_files(self.config.state_dir, "docs/join.md")

    def _restore_log(self, state, key=None):
        """``(kernel, payload tables, LogInfo, Manifest or None)`` of this group from its GroupState (full
        layout; changelog: the snapshot with its deltas replayed; files: the same read from the files the
        manifest names), or new.
        """
        if not state.exists:
            return (*self._new(), None)
        config = self.config
        (blob, lblob, rblob), deltas, log = _changelog.load(state.get, self._files, key)
        kernel = self._kernel(blob)
        sides = [PayloadSide.from_bytes(config.payload_schema(LEFT), lblob),
                 PayloadSide.from_bytes(config.payload_schema(RIGHT), rblob)]
        sides[LEFT].check_shards(config.shards)
        sides[LEFT].check_columns(config.columns(), "interval_join" if not config.window else "window_join")
        for delta in deltas:
            self._replay(kernel, sides, _log.Delta.decode(delta))
        return kernel, sides, log

    def _replay(self, kernel, sides, delta) -> None:
        """Repeat one changelog delta's kernel calls on the state it was recorded on (see :mod:`.changelog`)."""
        for side, table, micros, ends, lower, upper in delta.parts:
            self._kernel_insert(kernel, sides, side, table, micros, None, lower, upper, ends)
        for ids in delta.emitted:
            self._mark_emitted(sides, ids)
        # Constraints with changelog or files persistence come without a control table (set_constraints): the
        # batch dropped what the declared constraints drop.
        self._drop_matched(kernel, self._eviction(None))
        self._evict(kernel, delta.wm_ms)

    def _save(self, state, kernel, sides, wm_ms: int) -> int:
        """Keep the state in the GroupState (remove it when empty), set the timeout at which its first row
        expires; returns the bytes kept.
        """
        if kernel.rows(LEFT) + kernel.rows(RIGHT) == 0:
            state.remove()
            return 0
        blobs = self._snapshot(kernel, sides)
        state.update(blobs)
        self._set_timeout(state, kernel, wm_ms)
        return sum(len(b) for b in blobs)

    def _snapshot(self, kernel, sides) -> tuple[bytes, bytes, bytes]:
        """The full image of the state: packed kernel, left and right payload (canonical order)."""
        for side in (LEFT, RIGHT):
            sides[side].canonicalize(kernel, side)
        return (_state_bytes.pack(kernel.serialize()), sides[LEFT].to_bytes(self.config.shards, self.config.columns()),
                sides[RIGHT].to_bytes())

    @staticmethod
    def _set_timeout(state, kernel, wm_ms: int) -> None:
        timeout = timeout_ms(wm_ms, (kernel.min_end(LEFT), kernel.min_end(RIGHT)))
        if timeout is not None:
            state.setTimeoutTimestamp(timeout)

    def _save_log(self, state, key, kernel, sides, wm_ms: int, log, delta) -> int:
        """Changelog or files persistence (:func:`.._common.changelog.save`): this batch's ``delta`` appended to
        the group's value or written as a file, or a new snapshot (every ``snapshot_every`` batches, when the
        deltas would exceed ``SNAPSHOT_RATIO`` of it, or when the value is of another layout); the objects stay in
        the resident cache under the new token. Returns the bytes the state's value (and files) hold.
        """
        config = self.config
        if kernel.rows(LEFT) + kernel.rows(RIGHT) == 0:
            _changelog.forget(state, config.state_id, key)
            return 0
        files = self._files() if config.persistence == "files" else None
        _, held = _changelog.save(
            state, key, config.persistence, log, lambda: self._snapshot(kernel, sides), delta.encode,
            state_id=config.state_id, snapshot_every=config.snapshot_every, ratio=SNAPSHOT_RATIO, files=files,
            retain=config.retain, resident=lambda new: (kernel, sides, new),
            nbytes=kernel.nbytes() + sides[LEFT].table.nbytes + sides[RIGHT].table.nbytes)
        self._set_timeout(state, kernel, wm_ms)
        return held

    # -- streaming: one call per shard (or key) and micro-batch

    def streaming(self, key, pdf_iter, state):
        """``applyInPandasWithState`` function: one shard, one micro-batch."""
        # Spark's worker concatenates our frames with all-null padding frames; pandas warns about it.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*concatenation with empty")
        entry = self._entry()
        resident = self.config.persistence in RESIDENT
        hits = misses = catch_ups = 0
        cached = None
        if resident and state.exists:
            cached, missed, current = _changelog.take_resident(state.get, self.config.state_id, key, self._files)
            if cached is not None and current is not None:   # the files layout: the value's manifest, and what
                kernel, sides, _ = cached                     # another worker wrote since this copy
                for blob in missed:
                    self._replay(kernel, sides, _log.Delta.decode(blob))
                cached = (kernel, sides, current)
            hits, misses, catch_ups = (0, 1, 0) if cached is None else (0, 0, 1) if missed else (1, 0, 0)
        kernel, sides, log = cached if cached is not None else self._restore_log(state, key)
        copies = None
        if state.hasTimedOut:
            inputs = [None, None]
        elif self.config.bucket_width is not None:
            inputs, copies = self._bucket_inputs(key, list(pdf_iter))
        else:
            inputs = split_sides(list(pdf_iter), 2)
        n_in = sum(len(x) for x in inputs if x is not None)   # own rows only: copies are no input
        wm_ms = state.getCurrentWatermarkMs()
        delta = _log.Delta(wm_ms) if resident else None
        rows_before = kernel.rows(LEFT) + kernel.rows(RIGHT)
        parts, n_evicted, malformed, shed, violations = self._process(kernel, sides, inputs, wm_ms, entry, copies,
                                                                      delta)
        rows_after = kernel.rows(LEFT) + kernel.rows(RIGHT)
        if resident:
            state_bytes = self._save_log(state, key, kernel, sides, wm_ms, log, delta)
        elif copies is not None and state.exists and not n_evicted and rows_after == rows_before:
            # Bucket layout, only probed (no row stored or evicted): the JVM keeps its copy of the state; the
            # timeout is set again (each invocation starts without one).
            state_bytes = sum(len(b) for b in state.get)
            self._set_timeout(state, kernel, wm_ms)
        else:
            state_bytes = self._save(state, kernel, sides, wm_ms)
        out = self._packed(parts)
        yield _metrics.packed_row(out, self.config.out_arrow, METRICS, **{
            M.INPUT_ROWS: n_in, M.OUTPUT_ROWS: 0 if out is None else out.num_rows,
            M.STATE_ROWS: kernel.rows(LEFT) + kernel.rows(RIGHT), M.STATE_BYTES: state_bytes,
            M.EVICTED_ROWS: n_evicted, M.MALFORMED_ROWS: malformed, M.STATE_CACHE_HITS: hits,
            M.STATE_CACHE_MISSES: misses, M.STATE_CACHE_CATCH_UPS: catch_ups,
            M.CONSTRAINT_VIOLATIONS: violations}, **_shed_counters(shed))

    # -- batch: one call per shard with both sides; everything expires at the end

    def batch(self, left_pdf, right_pdf):
        """``cogroup().applyInPandas`` function: one shard of a batch join, both inputs at once."""
        kernel, sides = self._new()
        parts, _, _, shed, _ = self._process(kernel, sides, [left_pdf, right_pdf], None, self._entry())
        n_out = sum(p.num_rows for p in parts)
        row = self._metrics_row(**{M.INPUT_ROWS: len(left_pdf) + len(right_pdf), M.OUTPUT_ROWS: n_out},
                                **_shed_counters(shed))
        if not parts:
            return row
        data = self._data(_metrics.to_pandas(pa.concat_tables(parts) if len(parts) > 1 else parts[0]))
        # The metrics row in the data rows' dtypes: pandas warns (FutureWarning) when a concat meets an
        # all-NA entry of another dtype (the row's null data columns, the data rows' null counters).
        row = row.astype({c: data[c].dtype for c in data.columns})
        return pd.concat([data, row], ignore_index=True)
