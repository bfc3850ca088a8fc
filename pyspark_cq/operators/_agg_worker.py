"""Worker side of :func:`pyspark_cq.sliding_aggregate`: the map-side slicer and the per-shard step.

Both run in Spark's Python workers; they only hold a picklable :class:`AggConfig` and load the compiled
kernel lazily (``pyspark_cq._aggregate``), so nothing here needs a SparkSession.

Column names of the intermediate (sliced) rows all start with ``__cq_`` so they cannot clash with user
columns, which never reach this stage except as ``by`` keys.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterator  # typing.Iterator: what PySpark inspects to pick the iterator form
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from .. import _validate
from .._native import load
from ..control import ControlHandle, Entry
from ..vocabulary import metrics as M
from . import _metrics, _state_bytes
from ._agg_spec import (
    HLL_THRESHOLD,
    OP_COUNT,
    OP_MAX_F,
    OP_MIN_F,
    OP_SUM_F,
    OP_SUM_HI,
    OUT_AVG_F,
    OUT_AVG_I,
    OUT_MAX,
    OUT_MIN,
    OUT_QUANTILE,
    OUT_SUM_F,
    OUT_SUM_I_CHECKED,
    AggSpec,
    KeyColumn,
    arrow_type,
    from_int64,
    kept_fraction,
    nonnull_numpy,
    to_int64,
)
from ._shards import AGGREGATE, check_shard_count, default_rule, shard_key_values, with_shard_count
from ._shed import SHED, batch_shed_mask, shed_batch

_FLOAT_OPS = (OP_SUM_F, OP_MIN_F, OP_MAX_F)

# Spark's applyInPandasWithState pads each returned frame with an all-null frame (pyspark/worker.py),
# which makes pandas 2 warn once per report row; the warning is about Spark's code, not ours.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\.worker",
                        message="The behavior of DataFrame concatenation with empty or all-NA entries")

# Input projection (before the slicer).
TIME, HASH = "__cq_t", "__cq_h"
# Sliced rows (slicer output, stateful input).
SHARD, KHASH, START, BAD, TAG = "__cq_shard", "__cq_hash", "__cq_start", "__cq_bad", "__cq_tag"
SHED_COL = "__cq_shed"   # rows the slicer shed (drop_ratio), carried by the marker rows like BAD
SLICES = "__cq_slices"   # packed transport: slices of one shard as an Arrow IPC message (see Slicer._pack)
#: Columns of the row transport that a packed row carries itself (the rest travel inside SLICES).
_ROW_ONLY = (SHARD, BAD, SHED_COL, TAG)
#: The streaming aggregation's report: the shared counters plus ``shed_rows``.
METRICS = M.AGGREGATE


def key_name(i: int) -> str:
    return f"__cq_k{i}"


def null_name(i: int) -> str:
    return f"__cq_k{i}_null"


def value_name(i: int) -> str:
    return f"__cq_v{i}"


def partial_name(j: int) -> str:
    return f"__cq_p{j}"


@dataclass(frozen=True)
class AggConfig:
    """Everything a worker needs, fixed when the query is defined (shipped with the closures).

    ``window``, ``slide`` and ``granularity`` are plain values in microseconds read at every batch by
    :func:`run_shard`; nothing in the kernels bakes them in, so a runtime that changes them between
    batches only has to hand new values to the next call.
    """

    spec: AggSpec
    keys: tuple[KeyColumn, ...]
    time_type: T.DataType
    window: int
    slide: int
    granularity: int
    emit: str            # "windows" | "changes"
    mode: str            # "append" | "update" | "batch"
    watermark: bool      # streaming with a watermark on the time column
    shards: int
    out_names: tuple[str, ...]   # user-visible output columns, in order
    control: ControlHandle | None = None   # read at every micro-batch (see :func:`batch_params`)
    name: str = "cq_sliding_aggregate"     # the operator's metrics name (named by its errors)
    ansi: bool = True    # spark.sql.ansi.enabled when the query was defined: a long sum overflow raises

    @property
    def shed_partial(self) -> int | None:
        """The partial counting a slice's shed rows (``kept_column``, :func:`~._agg_spec.with_kept`), or None."""
        for j, (_op, ci) in enumerate(self.spec.ops):
            if ci >= 0 and self.spec.values[ci].derive == "shed":
                return j
        return None

    @property
    def kept_output(self) -> int | None:
        """Position among the kernel's outputs of the ``kept_column`` output (its count(*)), or None."""
        pos = 0
        for o in self.spec.outputs:
            if o.agg == "kept":
                return pos
            pos += len(o.kernel_outputs)
        return None

    @property
    def step(self) -> int:
        """Distance between consecutive outputs: the slide for windows, the granularity for changes."""
        return self.slide if self.emit == "windows" else self.granularity

    def sliced_schema(self, tag_metadata: dict | None, float_partials: bool = False) -> T.StructType:
        """Spark schema of the sliced rows. With ``float_partials`` the floating partials (sums, and
        min/max of floating columns) are doubles, as Spark's own aggregation computes them, instead of
        the kernel's int64 encoding (see :func:`encode_float_partials`).
        """
        fields = [T.StructField(SHARD, T.LongType(), False), T.StructField(KHASH, T.LongType(), False)]
        for i, k in enumerate(self.keys):
            if k.transport == "raw":
                fields.append(T.StructField(key_name(i), k.dtype, True))
            else:
                fields.append(T.StructField(key_name(i), T.LongType() if k.transport == "i" else T.DoubleType(), False))
                if k.nullable:
                    fields.append(T.StructField(null_name(i), T.BooleanType(), False))
        fields.append(T.StructField(START, T.LongType(), False))
        fields += [T.StructField(partial_name(j),
                                 T.DoubleType() if float_partials and op in _FLOAT_OPS else T.LongType(),
                                 True) for j, (op, _) in enumerate(self.spec.ops)]
        fields.append(T.StructField(BAD, T.LongType(), False))
        fields.append(T.StructField(SHED_COL, T.LongType(), False))
        if tag_metadata is not None:
            # All-null event-time column carrying the watermark metadata: it makes the watermark visible
            # to applyInPandasWithState (getCurrentWatermarkMs, event-time timeouts) while Spark's own
            # late-row filter (`tag <= watermark`) never drops a slice; lateness is decided per
            # (slice, window) by the kernel instead, as Spark's aggregation does per (window, key).
            fields.append(T.StructField(TAG, self.time_type, True, tag_metadata))
        return T.StructType(fields)

    def packed_schema(self, tag_metadata: dict | None) -> T.StructType:
        """Spark schema of the packed slice transport (streaming, shard layout): per row slices of one shard
        in an Arrow IPC message (``SLICES``, :meth:`slices_arrow_schema`), and the malformed and shed row
        counts (non-zero in marker rows only, whose message is empty).

        The stateful input then has a few rows per task and batch instead of one per slice: the JVM
        moves each slice as bytes, not as a row through the shuffle, the sort and the pandas conversion.
        """
        row = self.sliced_schema(tag_metadata)
        fields = [row[SHARD], T.StructField(SLICES, T.BinaryType(), False), row[BAD], row[SHED_COL]]
        return T.StructType(fields + ([row[TAG]] if tag_metadata is not None else []))

    def slices_arrow_schema(self) -> pa.Schema:
        """Arrow schema of the slices inside a packed row: the row transport's columns without those the
        packed row carries itself.
        """
        return pa.schema([pa.field(f.name, arrow_type(f.dataType))
                          for f in self.sliced_schema(None).fields if f.name not in _ROW_ONLY])

    def output_schema(self) -> T.StructType:
        """User-visible output schema (without report columns)."""
        fields = [T.StructField(self.out_names[0], self.time_type, True),
                  T.StructField(self.out_names[1], self.time_type, True)]
        fields += [T.StructField(k.name, k.dtype, True) for k in self.keys]
        fields += [T.StructField(o.name, o.dtype, True) for o in self.spec.outputs]
        return T.StructType(fields)


# ---- parameters in effect (control table) -----------------------------------------------------------

@dataclass(frozen=True)
class BatchParams:
    """Window and granularity in effect for one micro-batch, from the control table or the arguments.

    Attributes
    ----------
    segments : tuple of (lo, hi, W)
        Window sizes by *window start*: a window ``[k·S, k·S + W)`` whose start lies in ``[lo, hi)``
        (None: unbounded) has size ``W``, the size in effect at its start (PIPES §2.4.2, §4.2: a new
        window size applies to new elements only; a window is created at its start). One segment
        without a window schedule; ``emit="changes"`` allows one size only.
    w_max : int
        The largest window size of the schedule: a slice is kept until ``last_end(r, w_max, S)``, so
        eviction never drops a slice an open window may still need, whichever way the size changed.
    granularity : Schedule or None
        Granularity schedule of the control entry (None: the argument applies to every row).
    grid : int
        Sweep step of ``emit="changes"``: the gcd of every granularity and window size in play, so every
        split point ``r`` and ``r + W`` (PIPES Algorithm 1) lies on it.
    version : int or None
        Version of the control entry read (None without one).
    """

    segments: tuple
    w_max: int
    granularity: object
    grid: int
    version: int | None


def read_entry(config: AggConfig) -> Entry | None:
    """The operator's control entry (None without a handle, a table or an entry): one read per call."""
    return None if config.control is None else config.control.entry()


def batch_params(config: AggConfig, entry: Entry | None) -> BatchParams:
    """Parameters of this micro-batch (see :class:`BatchParams`).

    Granularity changes take effect at the instant the control table recorded for them, which
    :meth:`pyspark_cq.control.schedule.Schedule.with_change` already moved to
    :func:`~pyspark_cq.control.schedule.granularity_effective_at` (PIPES §2.4.3: an instant of the
    coarser granularity); nothing is re-derived here.

    Raises
    ------
    ValueError
        When a window size of the entry is smaller than the slide (``emit="windows"``; Spark's rule
        ``slide <= window``), or when ``emit="changes"`` meets a window-size change (not supported).
    """
    if entry is None:
        return BatchParams(((None, None, config.window),), config.window, None, config.granularity, None)
    wsched = entry.schedule("window")
    gsched = entry.schedule("granularity")
    points = wsched.points if wsched is not None else ((None, config.window),)
    segments = []
    for i, (at, w) in enumerate(points):
        lo = None if i == 0 else at
        hi = points[i + 1][0] if i + 1 < len(points) else None
        if lo is not None and hi is not None and hi <= lo:
            continue
        if config.emit == "windows" and w < config.slide:
            raise ValueError(
                f"sliding_aggregate: control table entry {entry.operator!r} sets window={w} µs "
                f"(from {'always' if lo is None else f'{lo} µs'}), smaller than the slide {config.slide} µs; "
                f"windows [k·S, k·S + W) need W >= S (Spark's rule)")
        segments.append((lo, hi, int(w)))
    sizes = {w for _, _, w in segments}
    if config.emit == "changes" and len(sizes) > 1:
        raise ValueError(
            f"sliding_aggregate: control table entry {entry.operator!r} changes the window size "
            f"({sorted(sizes)} µs); emit='changes' supports granularity changes only (docs/aggregate.md)")
    grans = [v for _, v in gsched.points] if gsched is not None else [config.granularity]
    grid = 0
    for v in list(sizes) + grans:
        grid = math.gcd(grid, int(v))
    return BatchParams(tuple(segments), max(sizes), gsched, grid, entry.version)


def round_starts(times: np.ndarray, gsched) -> np.ndarray:
    """Each time rounded down to the granularity in effect at it (PIPES §2.4.3; ``Schedule.values_at``)."""
    g = gsched.values_at(times)
    return times - np.mod(times, g)


def last_window_end(starts: np.ndarray, segments, slide: int) -> np.ndarray:
    """Per slice start ``r``: the largest end of a window ``[k·S, k·S + W(k·S))`` containing ``r``
    (int64 min when none does). In a segment of constant ``W`` the latest window containing ``r`` ends
    last, so one candidate per segment suffices.
    """
    best = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
    for lo, hi, w in segments:
        top = starts if hi is None else np.minimum(starts, hi - 1)
        ks = (top // slide) * slide
        ok = ks + w > starts
        if lo is not None:
            ok &= ks >= lo
        best = np.where(ok, np.maximum(best, ks + w), best)
    return best


# ---- map side ---------------------------------------------------------------------------------------

#: Packed transport: the slicer sends the slices it holds once they reach this many rows (and at the end
#: of its input), so a task sends a few large messages per shard rather than one per Arrow batch.
PACK_ROWS = 65_536


class Slicer:
    """``mapInArrow`` function: raw rows -> one slice per (key, granule) with its partial aggregates.

    This is the stateless, vectorised partial aggregation (as Spark's own map-side HashAggregate) that
    keeps raw rows away from the per-group Python overhead of the stateful stage. After its input it
    emits one marker row per shard, so that every shard is invoked in every micro-batch and always
    knows the previous batch's watermark (see :func:`run_shard`). ``packed``: the slices leave packed by
    shard (:meth:`AggConfig.packed_schema`), else one row per slice (:meth:`AggConfig.sliced_schema`).
    """

    def __init__(self, config: AggConfig, tag: bool, markers: bool = True, packed: bool = False):
        if packed and not markers:
            raise ValueError("packed: the packed transport needs the shard layout's marker rows")
        self.config, self.tag, self.emit_markers, self.packed = config, tag, markers, packed
        # what every output batch has, built once per task (not per Arrow batch)
        meta = {} if tag else None
        self.out_names = (config.packed_schema(meta) if packed else config.sliced_schema(meta)).names
        self.slices_schema = config.slices_arrow_schema() if packed else None

    def __call__(self, batches):
        kernel = load("_aggregate")
        entry = read_entry(self.config)  # once per task: one micro-batch sees one version
        gsched = entry.schedule("granularity") if entry is not None else None
        ratio = float(entry.get("drop_ratio", 0.0)) if entry is not None else 0.0
        if ratio > 0 and not self.emit_markers:
            raise ValueError(f"sliding_aggregate {self.config.name!r}: drop_ratio {ratio} needs the shard layout "
                             f"(the marker rows carry the shed count); shards='key' cannot shed "
                             f"(micro-batch {_validate.micro_batch_id()})")
        counted = self.config.shed_partial is not None
        bad = shed = 0
        held, held_rows = [], 0   # packed: slices not yet sent (fewer, larger messages)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            drop = None
            if counted:  # kept_column: shed rows stay, masked, so that each slice counts them
                drop = batch_shed_mask(batch, ratio)
                shed += int(drop.sum())
                gone = drop & batch.column(TIME).is_null().to_numpy(zero_copy_only=False)
                if gone.any():   # shed before they could count as malformed, as without kept_column
                    batch, drop = batch.filter(pa.array(~gone)), drop[~gone]
            else:
                batch, dropped = shed_batch(batch, ratio)   # RTStream §4.4: drop before the aggregation
                shed += dropped
            if batch.num_rows == 0:
                continue
            out, null_time = self.slice(kernel, batch, gsched, drop)
            bad += null_time
            if not out.num_rows:
                continue
            if not self.packed:
                yield out
                continue
            held.append(out)
            held_rows += out.num_rows
            if held_rows >= PACK_ROWS:
                yield self._pack(held)
                held, held_rows = [], 0
        if held:
            yield self._pack(held)
        if self.emit_markers:
            yield self.markers(bad, shed)

    def slice(self, kernel, batch: pa.RecordBatch, gsched=None, drop: np.ndarray | None = None):
        """Slices of one Arrow batch; with a granularity schedule each row is rounded down with the
        granularity in effect at its time (so slices of several granularities may come out).

        ``drop`` (with ``kept_column``): the rows load shedding dropped. They reach the kernel with every
        value null, so no aggregate sees them, and are counted in the slice's shed partial; count(*) is
        then corrected to the kept rows. A slice of shed rows only has count(*) 0.
        """
        config, spec = self.config, self.config.spec
        t, tv = nonnull_numpy(to_int64(batch.column(TIME)), np.int64)
        h = np.ascontiguousarray(batch.column(HASH).to_numpy(zero_copy_only=False), dtype=np.int64)
        values, valids = [], []
        for i, vc in enumerate(spec.values):
            if vc.derive == "shed":
                values.append(np.zeros(batch.num_rows, dtype=np.int64) if drop is None else drop.astype(np.int64))
                valids.append(None)
                continue
            col = batch.column(value_name(i))
            if vc.cls == "c":
                values.append(None)
                valids.append(col.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
                              if col.null_count else None)
            else:
                v, m = nonnull_numpy(to_int64(col) if vc.cls == "i" else col.cast(pa.float64()),
                                     np.int64 if vc.cls == "i" else np.float64)
                values.append(v)
                valids.append(m)
            if drop is not None and drop.any():
                valids[-1] = ((np.ones(batch.num_rows, dtype=np.uint8) if valids[-1] is None else valids[-1])
                              & ~drop).astype(np.uint8)
        if gsched is None:
            r = kernel.preaggregate(h, t, tv, config.granularity, spec.ops_array, values, valids)
        else:
            r = kernel.preaggregate(h, round_starts(t, gsched), tv, 1, spec.ops_array, values, valids)
        first = pa.array(r["first_row"])
        keys = [batch.column(key_name(i)).take(first) for i in range(len(config.keys))]
        partials = r["partials"]
        if drop is not None:   # count(*) of the kept rows: all rows with a time less the shed ones
            partials = list(partials)
            partials[0] = partials[0] - partials[config.shed_partial]
        return self._rows(r["hash"], keys, r["start"], partials), int(r["null_time"])

    def _rows(self, hashes: np.ndarray, keys, starts, partials, bad=None, shed=None) -> pa.RecordBatch:
        """The slices in the row transport (:meth:`AggConfig.sliced_schema`; ``bad`` and ``shed``: the
        marker rows' counts), or packed: in :meth:`AggConfig.slices_arrow_schema`, for :meth:`_pack`.
        """
        config = self.config
        m = len(hashes)
        slices = [pa.array(hashes, type=pa.int64())]
        for k, arr in zip(config.keys, keys):
            slices += encode_key(k, arr)
        slices.append(pa.array(starts, type=pa.int64()))
        slices += [pa.array(p, type=pa.int64()) for p in partials]
        if self.packed:
            return pa.RecordBatch.from_arrays(slices, schema=self.slices_schema)
        counts = [pa.array(np.zeros(m, dtype=np.int64) if c is None else c, type=pa.int64()) for c in (bad, shed)]
        return self._with_tag([pa.array(shard_key_values(hashes, config.shards))] + slices + counts)

    def _pack(self, held: list[pa.RecordBatch]) -> pa.RecordBatch:
        """Packed rows of the slices ``held``: one IPC message per shard present, its slices in their order."""
        table = pa.Table.from_batches(held).combine_chunks()
        shards = shard_key_values(table.column(KHASH).to_numpy(), self.config.shards)
        order = np.argsort(shards, kind="stable")
        shards = shards[order]
        bounds = np.r_[np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]]), len(shards)]
        batch = table.take(pa.array(order)).to_batches()[0]
        blobs = [batch.slice(lo, hi - lo).serialize().to_pybytes() for lo, hi in zip(bounds[:-1], bounds[1:])]
        zeros = np.zeros(len(blobs), dtype=np.int64)
        return self._packed_rows(shards[bounds[:-1]], blobs, zeros, zeros)

    def _packed_rows(self, shards: np.ndarray, blobs: list, bad: np.ndarray, shed: np.ndarray) -> pa.RecordBatch:
        cols = [pa.array(shards, type=pa.int64()), pa.array(blobs, type=pa.binary()),
                pa.array(bad, type=pa.int64()), pa.array(shed, type=pa.int64())]
        return self._with_tag(cols)

    def _with_tag(self, cols: list) -> pa.RecordBatch:
        """``cols`` and, with a watermark, the all-null tag column, as an output batch."""
        if self.tag:
            cols = cols + [pa.nulls(len(cols[0]), type=arrow_type(self.config.time_type))]
        return pa.RecordBatch.from_arrays(cols, names=self.out_names)

    def markers(self, bad: int, shed: int = 0) -> pa.RecordBatch:
        """One row per shard with count(*) = 0 (never a slice; packed: no slices at all); shard 0's
        carries the null-time and shed counts.
        """
        k = self.config.shards
        hashes = np.arange(k, dtype=np.int64)
        zeros = np.zeros(k, dtype=np.int64)
        badcol, shedcol = zeros.copy(), zeros.copy()
        badcol[0], shedcol[0] = bad, shed
        if self.packed:
            return self._packed_rows(shard_key_values(hashes, k), [b""] * k, badcol, shedcol)
        keys = [pa.nulls(k, type=arrow_type(kc.dtype)) for kc in self.config.keys]
        return self._rows(hashes, keys, zeros, [zeros] * len(self.config.spec.ops), badcol, shedcol)


def encode_key(k: KeyColumn, arr: pa.Array) -> list[pa.Array]:
    """Physical transport of one key column (see _agg_spec.KeyColumn)."""
    if k.transport == "raw":
        return [arr.cast(arrow_type(k.dtype))]
    if k.transport == "i":
        v, valid = nonnull_numpy(to_int64(arr), np.int64)
    else:
        v, valid = nonnull_numpy(arr.cast(pa.float64()), np.float64)
    out = [pa.array(v)]
    if k.nullable:
        out.append(pa.array(np.zeros(len(v), dtype=bool) if valid is None else valid == 0))
    return out


def decode_keys(config: AggConfig, table: pa.Table, rows: np.ndarray | None = None) -> list[pa.Array]:
    """Key columns of sliced rows (optionally only ``rows``) back in their Spark types."""
    out = []
    for i, k in enumerate(config.keys):
        col = table.column(key_name(i))
        if rows is not None:
            col = col.take(pa.array(rows))
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if k.transport == "raw":
            out.append(col.cast(arrow_type(k.dtype)))
            continue
        nulls = None
        if k.nullable:
            flag = table.column(null_name(i))
            if rows is not None:
                flag = flag.take(pa.array(rows))
            nulls = np.asarray(flag.to_numpy(zero_copy_only=False), dtype=bool)
        values = col.to_numpy(zero_copy_only=False)
        if k.transport == "i":
            out.append(from_int64(values, None if nulls is None else ~nulls, k.dtype))
        else:
            arr = pa.array(np.asarray(values, dtype=np.float64), mask=nulls)
            out.append(arr.cast(arrow_type(k.dtype)))
    return out


# ---- stateful side ----------------------------------------------------------------------------------

def _same_keys(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Null-safe equality (NaN equal to NaN) of two key arrays, as a bool numpy array."""
    eq = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(a.is_null(), b.is_null())
    eq = pc.or_(eq, both_null)
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return eq.to_numpy(zero_copy_only=False)


@dataclass
class StepResult:
    output: pa.Table
    state: tuple[bytes, bytes] | None
    metrics: dict


def run_shard(config: AggConfig, table: pa.Table, state: tuple | None, watermark_us: int | None,
              entry: Entry | None = None, counts: tuple[int, int] | None = None) -> StepResult:
    """Process one shard for one micro-batch (or a whole batch DataFrame when ``config.mode == 'batch'``).

    ``table`` holds sliced rows (markers included), ``state`` the ``(blob, keys)`` saved by the previous
    batch, ``watermark_us`` the eviction watermark of this batch. The previous batch's watermark, used
    to filter late (slice, window) pairs exactly as Spark filters (window, key) rows, is kept in the
    state: marker rows and event-time timeouts make sure every shard sees every watermark change.
    ``entry`` is the operator's control entry read for this batch (None: the arguments apply; see
    :func:`batch_params`). ``counts``: the malformed and shed rows when ``table`` holds slices only (the
    packed transport, :func:`unpack_slices`); None when its marker rows carry them.

    The steps: :func:`_unmarked` (drop the markers), :func:`_restore`, :func:`_drop_late_slices`,
    :func:`_ingest` (with :func:`_update_keys`), :func:`_emit`, :func:`_evict`, :func:`_save`.
    """
    kernel = load("_aggregate")
    params = batch_params(config, entry)
    if counts is None:
        data, bad, input_rows = _unmarked(table, config.shed_partial)
        shed = int(_int64(table, SHED_COL).sum()) if table.num_rows else 0
    else:
        data, (bad, shed) = table, counts
        input_rows = int(_int64(data, partial_name(0)).sum()) if data.num_rows else 0
    st, keys_tbl, late_end = _restore(kernel, config, state)
    data, pre_late = _drop_late_slices(config, params, data, late_end)
    grid = _sweep_grid(config, params, entry, _int64(data, START))
    step = grid if config.emit == "changes" else config.slide
    keys_tbl, late_rows = _ingest(st, config, params, data, keys_tbl, step, late_end)
    wm = watermark_us
    out = _emit(st, config, params, grid, late_end, wm, keys_tbl)  # before eviction renumbers the key slots
    evicted, keys_tbl = _evict(st, config, params, step, wm, keys_tbl)
    new_state = _save(st, config, keys_tbl)
    metrics = {
        M.INPUT_ROWS: input_rows,
        M.OUTPUT_ROWS: out.num_rows,
        M.STATE_ROWS: st.num_slices + st.num_runs,
        M.STATE_BYTES: (len(new_state[0]) + len(new_state[1])) if new_state else st.payload_bytes,
        M.EVICTED_ROWS: int(evicted),
        M.LATE_ROWS: int(late_rows + pre_late),
        M.MALFORMED_ROWS: bad,
    }
    if config.mode != "batch":   # streaming: the slicer sheds (drop_ratio) and reports input before shedding
        metrics[M.INPUT_ROWS] += shed
        metrics[SHED] = shed
    return StepResult(out, new_state, metrics)


def _int64(table: pa.Table, name: str) -> np.ndarray:
    """A column of ``table`` as a contiguous int64 numpy array."""
    return np.ascontiguousarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def _unmarked(table: pa.Table, shed_partial: int | None = None) -> tuple[pa.Table, int, int]:
    """The slices of ``table`` without the marker rows (count(*) = 0), the null-time rows the markers
    carry, and the input rows the slices stand for. With ``shed_partial`` (``kept_column``) a slice of
    shed rows only (count(*) = 0, shed rows > 0) is a slice too.
    """
    bad = int(_int64(table, BAD).sum()) if table.num_rows else 0
    rows = _int64(table, partial_name(0))
    real = rows > 0  # markers carry count(*) = 0
    if shed_partial is not None:
        real |= _int64(table, partial_name(shed_partial)) > 0
    real = np.flatnonzero(real)
    data = table.take(pa.array(real)) if len(real) != table.num_rows else table
    return data, bad, int(_int64(data, partial_name(0)).sum())


def _restore(kernel, config: AggConfig, state: tuple | None):
    """The shard's kernel state, its key table (None without ``by``) and the late-event watermark (the
    previous batch's; None without a watermark), from the saved ``state`` or new.
    """
    spec = config.spec
    runs = config.emit == "changes"
    if state is not None:
        try:
            st = kernel.ShardState.from_bytes(_state_bytes.unpack(state[0]), spec.kinds, spec.outputs_array, runs)
        except ValueError as exc:
            if "different aggregation" not in str(exc):
                raise
            raise ValueError(f"sliding_aggregate {config.name!r}: {exc} (kept_column, which adds a partial to "
                             f"every slice, is part of the layout too: keep it for the life of a checkpoint; "
                             f"the query now has kept_column "
                             f"{'set' if config.shed_partial is not None else 'unset'})") from None
        keys_tbl = _state_bytes.table_from_bytes(state[1]) if state[1] else None
        _check_saved_keys(keys_tbl, config)
        if keys_tbl is not None:
            check_shard_count(keys_tbl, config.shards, "sliding_aggregate", default_rule(AGGREGATE))
        late_end = st.watermark
    else:
        st = kernel.ShardState(spec.kinds, spec.outputs_array, runs)
        keys_tbl = pa.table([pa.array([], type=arrow_type(k.dtype)) for k in config.keys],
                            names=[k.name for k in config.keys]) if config.keys else None
        # A fresh shard exists from the query's first batch on (markers reach every shard), whose
        # late-event watermark Spark sets to 0.
        late_end = 0 if config.watermark else None
    if not config.watermark or late_end is None:
        return st, keys_tbl, None
    return st, keys_tbl, int(late_end)


def _drop_late_slices(config: AggConfig, params: BatchParams, data: pa.Table, late_end: int | None):
    """``data`` without the slices every window of which ended by the late-event watermark, and the rows
    they stand for. Only with a window-size schedule: window sizes then vary by window start, and the
    test is exact per slice; with one size the kernel's ingest decides (per slice and window).
    """
    starts = _int64(data, START)
    if len(params.segments) <= 1 or late_end is None or not len(starts):
        return data, 0
    live = last_window_end(starts, params.segments, config.slide) > late_end
    if live.all():
        return data, 0
    counts = _int64(data, partial_name(0))
    return data.take(pa.array(np.flatnonzero(live))), int(counts[~live].sum())


def _sweep_grid(config: AggConfig, params: BatchParams, entry: Entry | None, starts: np.ndarray) -> int:
    """The sweep step of ``emit="changes"``: the entry's grid, refined so that every incoming slice
    start lies on it (the slicer may have read a newer entry, with a granularity this read does not
    know yet).
    """
    grid = params.grid
    if config.emit == "changes" and entry is not None and len(starts):
        grid = int(np.gcd.reduce(np.append(np.mod(starts, grid), grid)))
    return grid


def _ingest(st, config: AggConfig, params: BatchParams, data: pa.Table, keys_tbl, step: int, late_end):
    """Merge the slices into the state (the kernel drops late (slice, window) pairs when one window
    size applies); returns the updated key table and the late rows the kernel counted.
    """
    segmented = len(params.segments) > 1   # a window-size schedule: _drop_late_slices decided
    hashes = _int64(data, KHASH)
    partials = [_int64(data, partial_name(j)) for j in range(len(config.spec.ops))]
    slot, new_rows, late_rows, _late_slices = st.ingest(hashes, _int64(data, START), partials, params.w_max, step,
                                                        None if segmented else late_end)
    if config.keys:
        keys_tbl = _update_keys(config, data, keys_tbl, slot, new_rows, hashes)
    return keys_tbl, late_rows


def _update_keys(config: AggConfig, data: pa.Table, keys_tbl: pa.Table, slot, new_rows, hashes) -> pa.Table:
    """The key table with the keys of new slots appended; raises RuntimeError when an accepted slice's
    key differs from its slot's key (two keys sharing a 64-bit hash).
    """
    accepted = np.flatnonzero(slot >= 0)
    if len(new_rows):
        fresh = pa.table(decode_keys(config, data, new_rows), names=keys_tbl.column_names)
        keys_tbl = pa.concat_tables([keys_tbl, fresh]) if keys_tbl.num_rows else fresh
    if len(accepted):
        incoming = decode_keys(config, data, accepted)
        stored = keys_tbl.take(pa.array(slot[accepted]))
        for i, k in enumerate(config.keys):
            ok = _same_keys(incoming[i], stored.column(i).combine_chunks())
            if not ok.all():
                raise RuntimeError(
                    f"sliding_aggregate: two different values of the key {[k.name for k in config.keys]} share "
                    f"the 64-bit hash {int(hashes[accepted][~ok][0])}; this has a probability of about "
                    f"n^2/2^65 for n keys. Rename or re-encode a key column to change the hash.")
    return keys_tbl


def _emit(st, config: AggConfig, params: BatchParams, grid: int, late_end, wm, keys_tbl) -> pa.Table:
    """The output rows of this batch: windows (or change intervals) whose end lies in the batch's range
    -- (late_end, wm] in append mode, every touched one in update mode, all of them in batch mode.
    """
    if config.mode == "batch":
        lo, hi = None, None
    elif config.mode == "append":
        lo, hi = late_end, wm
    else:  # update: every window a non-late slice of this batch falls into
        lo, hi = late_end, None
    if config.emit == "changes":
        emitted = st.emit_changes(params.w_max, grid, lo, hi)
    elif len(params.segments) <= 1:
        emitted = st.emit_windows(params.w_max, config.slide, lo, hi, config.mode == "update")
    else:  # each window with the size in effect at its start: one pass per size segment
        parts = [st.emit_windows(w, config.slide, lo, hi, config.mode == "update", seg_lo, seg_hi)
                 for seg_lo, seg_hi, w in params.segments]
        emitted = _concat_emitted(parts)
    return _output_table(config, _with_kept_rows(config, emitted), keys_tbl)


def _with_kept_rows(config: AggConfig, emitted):
    """``emitted`` without the windows of shed rows only (count(*) 0; ``kept_column``): without shedding
    they would hold no row, and Spark emits no window without rows.
    """
    pos = config.kept_output
    if pos is None:
        return emitted
    keep = emitted[3][pos] > 0
    if keep.all():
        return emitted
    slot, frm, to, values, valids = emitted
    return (slot[keep], frm[keep], to[keep], [v[keep] for v in values], [v[keep] for v in valids])


def _evict(st, config: AggConfig, params: BatchParams, step: int, wm, keys_tbl):
    """Drop the slices whose windows all ended by the watermark (and their keys' rows of the key table
    when keys leave); returns (slices evicted, key table). Records ``wm`` as the next batch's
    late-event watermark.
    """
    if not config.watermark or wm is None:
        return 0, keys_tbl
    # With several window sizes the largest decides: no slice an open window needs is dropped.
    kept, evicted, _evicted_rows = st.evict(params.w_max, step, wm)
    if config.keys and len(kept) != keys_tbl.num_rows:
        keys_tbl = keys_tbl.take(pa.array(kept))
    st.watermark = wm
    return evicted, keys_tbl


def _check_saved_keys(keys_tbl, config: AggConfig) -> None:
    """Raise ValueError if the restored state was written with other ``by`` columns: its groups would be
    read as groups of the new keys, a silently wrong result.
    """
    saved = [] if keys_tbl is None else keys_tbl.column_names
    now = [k.name for k in config.keys]
    if saved != now:
        raise ValueError(f"by: this checkpoint's sliding_aggregate state {config.name!r} was written with by={saved}, "
                         f"the query now has by={now}. Keep the key columns for the life of a checkpoint, or start "
                         f"with a new checkpoint location.")


def _save(st, config: AggConfig, keys_tbl) -> tuple[bytes, bytes] | None:
    """The ``(blob, keys)`` state to keep (None in batch mode); the key table records the shard count."""
    if config.mode == "batch":
        return None
    return (_state_bytes.pack(st.to_bytes()),
            _state_bytes.table_to_bytes(with_shard_count(keys_tbl, config.shards)) if config.keys else b"")


def _concat_emitted(parts):
    """One ``(slot, from, to, values, valids)`` tuple of several kernel emissions."""
    slot, frm, to = (np.concatenate([p[i] for p in parts]) for i in range(3))
    n_out = len(parts[0][3])
    values = [np.concatenate([p[3][o] for p in parts]) for o in range(n_out)]
    valids = [np.concatenate([p[4][o] for p in parts]) for o in range(n_out)]
    return slot, frm, to, values, valids


def check_overflow(config: AggConfig, output, valid: np.ndarray, slot, frm, to, keys_tbl) -> None:
    """Raise Spark's ARITHMETIC_OVERFLOW (ANSI mode) for the first emitted window whose exact long sum
    ``output`` left the long range (the kernel marks it with validity 2).

    Raises
    ------
    OverflowError
        Naming the operator (its metrics name), the aggregate, the group key and the window.
    """
    bad = np.flatnonzero(valid == 2)
    if not len(bad):
        return
    i = int(bad[0])
    bounds = [from_int64(np.array([x[i]]), None, config.time_type)[0].as_py() for x in (frm, to)]
    key = {}
    if config.keys:
        row = keys_tbl.take(pa.array([slot[i]])).to_pylist()[0]
        key = {k.name: row[k.name] for k in config.keys}
    lo, hi = config.out_names[0], config.out_names[1]
    raise OverflowError(
        f"[ARITHMETIC_OVERFLOW] long overflow in sliding_aggregate {config.name!r}: {output.name} "
        f"(sum of the long column {output.column!r}) for the group {key} in the window "
        f"[{lo}={bounds[0]}, {hi}={bounds[1]}) is outside the long range; Spark's sum raises this error "
        f"with spark.sql.ansi.enabled=true (the setting when the query was defined). Cast the column to "
        f"decimal or double first, or set spark.sql.ansi.enabled to false to get Spark's wrapped-around "
        f"value (the query must be defined again). SQLSTATE: 22003")


def moment(agg: str, n: np.ndarray, m2: np.ndarray) -> pa.Array:
    """``stddev`` / ``variance`` (sample or population, Spark's names) from the count ``n`` and the sum
    of squared deviations ``M2`` (doubles) that the kernel keeps per slice and window.

    The kernel merges ``(n, mean, M2)`` with the pairwise update of Chan, Golub and LeVeque (1983,
    eq. 2.1) and computes each slice's with Welford's update, as Spark's ``CentralMomentAgg`` does; no
    large sums of squares are subtracted, so the relative error is about ``eps * |mean| / std`` rather
    than ``eps * mean**2 / var`` (docs/aggregate.md). Like Spark: null for ``n = 0``, and for ``n = 1`` with the sample
    forms; NaN or infinite values give NaN.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        sample = agg in ("stddev", "stddev_samp", "variance", "var_samp")
        var = m2 / (n - 1) if sample else m2 / n
        value = np.sqrt(var) if agg.startswith("stddev") else var
    return pa.array(value, mask=n < (2 if sample else 1), type=pa.float64())


def hll_estimate(words: np.ndarray) -> np.ndarray:
    """Distinct counts from HyperLogLog sketches, ``words`` an ``(n, 2^p / 8)`` int64 array of packed
    registers (one sketch per row; register ``j`` in byte ``j % 8`` of word ``j // 8``).

    Heule, Nunkesser and Hall, "HyperLogLog in Practice" (HLL++), Fig. 6 without the empirical bias
    correction: the raw estimate ``E = alpha_m m^2 / sum(2^-M[j])`` (Flajolet et al.'s harmonic mean,
    ``alpha_m = 0.7213 / (1 + 1.079 / m)``), and linear counting ``m ln(m / V)`` (``V`` empty registers)
    while ``V > 0`` and the latter is at most the paper's threshold (400 at p = 9) or ``E <= 5m / 2``;
    rounded to the nearest integer (Java's ``Math.round``). With
    the registers Spark's ``approx_count_distinct`` builds (the same hash, index and rank), the result
    equals Spark's wherever Spark uses linear counting (up to its threshold, 400 distinct values at
    p = 9); above, the relative standard error is ``1.04 / sqrt(m)`` (4.6 % at p = 9), Spark's ``rsd``.
    """
    words = np.ascontiguousarray(words, dtype=np.int64)
    regs = words.view(np.uint8).reshape(len(words), 8 * words.shape[1])
    m = regs.shape[1]
    alpha = 0.7213 / (1 + 1.079 / m)
    raw = alpha * m * m / np.ldexp(1.0, -regs.astype(np.int64)).sum(axis=1)
    empty = (regs == 0).sum(axis=1)
    with np.errstate(divide="ignore"):
        linear = m * np.log(m / np.maximum(empty, 1))
    est = np.where((empty > 0) & ((linear <= HLL_THRESHOLD) | (raw <= 2.5 * m)), linear, raw)
    return np.floor(est + 0.5).astype(np.int64)


def quantile_column(bits: np.ndarray, valid: np.ndarray | None, dtype: T.DataType) -> pa.Array:
    """``percentile_approx`` results in the column's type (Spark's) from the kernel's doubles.

    The kernel returns a DDSketch bucket's value clamped to the window's [min, max] (native/aggregate_core.hpp,
    ``dd_quantile``); an integral column's result is rounded to the nearest integer (within
    ``alpha·|x| + 0.5`` of the true value ``x``, so exact while ``|x| < 0.5 / alpha = 25``); Spark truncates
    its own double, which is a data value and hence an integer already.
    """
    x = np.asarray(bits, dtype=np.int64).view(np.float64)
    mask = None if valid is None else valid == 0
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        return pa.array(x, mask=mask, type=pa.float64()).cast(arrow_type(dtype))
    with np.errstate(invalid="ignore"):
        ints = np.rint(np.where(np.isfinite(x), x, 0.0))
    # |x| <= 2^63 by the clamp to the column's min / max as doubles; 2^63 saturates as Java's (long) cast does
    big = ints >= 2.0**63
    ints = np.where(big, np.iinfo(np.int64).max, np.where(big, 0.0, ints).astype(np.int64))
    return from_int64(ints, valid, dtype)


def _derived(o, values: list) -> pa.Array:
    """The value of a derived aggregate (``_agg_spec.DERIVED``) from its kernel outputs."""
    if o.agg in ("first", "last"):  # (value, time) of the earliest / latest row; no row: the identity time
        value, t = values
        valid = t != (np.iinfo(np.int64).max if o.agg == "first" else np.iinfo(np.int64).min)
        if isinstance(o.dtype, (T.FloatType, T.DoubleType)):
            arr = pa.array(load("_aggregate").keys_f64(value), mask=~valid, type=pa.float64())
            return arr.cast(arrow_type(o.dtype))
        return from_int64(value, valid, o.dtype)
    if o.agg == "approx_count_distinct":
        return pa.array(hll_estimate(np.stack(values, axis=1)), type=pa.int64())
    if o.agg == "kept":   # kept_column: (count(*), shed rows) of the window
        return pa.array(kept_fraction(*values), type=pa.float64())
    n, _mean, m2 = values
    return moment(o.agg, n.view(np.float64), m2.view(np.float64))


def _output_table(config: AggConfig, emitted, keys_tbl: pa.Table | None) -> pa.Table:
    slot, frm, to, values, valids = emitted
    cols = [from_int64(frm, None, config.time_type), from_int64(to, None, config.time_type)]
    if config.keys:
        taken = keys_tbl.take(pa.array(slot))
        cols += [taken.column(i).combine_chunks() for i in range(len(config.keys))]
    f64_keys = None
    pos = 0
    for o in config.spec.outputs:
        width = len(o.kernel_outputs)
        v, ok = values[pos], valids[pos]
        if o.extra:
            cols.append(_derived(o, values[pos:pos + width]))
            pos += width
            continue
        pos += width
        if o.kind == OUT_SUM_I_CHECKED and config.ansi:
            check_overflow(config, o, ok, slot, frm, to, keys_tbl)
        valid = None if ok.all() else ok
        if o.kind == OUT_QUANTILE:
            cols.append(quantile_column(v, valid, o.dtype))
        elif o.kind in (OUT_SUM_F, OUT_AVG_I, OUT_AVG_F):
            cols.append(pa.array(v.view(np.float64), mask=None if valid is None else valid == 0, type=pa.float64()))
        elif o.kind in (OUT_MIN, OUT_MAX) and isinstance(o.dtype, (T.FloatType, T.DoubleType)):
            f64_keys = f64_keys or load("_aggregate").keys_f64
            arr = pa.array(f64_keys(v), mask=None if valid is None else valid == 0, type=pa.float64())
            cols.append(arr.cast(arrow_type(o.dtype)))
        else:
            cols.append(from_int64(v, valid, o.dtype))
    return pa.Table.from_arrays(cols, names=list(config.out_names))


# ---- Spark-facing wrappers --------------------------------------------------------------------------

def _arrow_schema(sliced: T.StructType) -> pa.Schema:
    """Arrow schema of the sliced rows the stateful side reads (the all-null tag column is not read)."""
    return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in sliced.fields if f.name != TAG])


def _to_arrow(pdf: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """Sliced rows from pandas. Floating columns keep NaN as NaN (``Table.from_pandas`` would make it
    null): Spark already turned their nulls into NaN, and the partials' nulls are told apart by counts.
    """
    arrays = []
    for field in schema:
        series = pdf[field.name]
        if pa.types.is_floating(field.type):
            arrays.append(pa.array(series.to_numpy(dtype=np.float64, na_value=np.nan), type=field.type))
        else:
            arrays.append(pa.Array.from_pandas(series, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def unpack_slices(schema: pa.Schema, frames: list[pd.DataFrame]) -> tuple[pa.Table, tuple[int, int]]:
    """The slices of packed stateful input (frames of :meth:`AggConfig.packed_schema`'s first four
    columns; ``schema``: :meth:`AggConfig.slices_arrow_schema`) and its malformed and shed row counts.
    """
    batches, bad, shed = [], 0, 0
    for pdf in frames:
        bad += int(pdf[BAD].sum())
        shed += int(pdf[SHED_COL].sum())
        batches += [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for b in pdf[SLICES] if len(b)]
    return pa.Table.from_batches(batches, schema=schema), (bad, shed)


class StatefulShard:
    """``applyInPandasWithState`` function: one shard, one micro-batch. ``packed``: the input is the
    packed transport (:meth:`AggConfig.packed_schema`), else the row transport (``sliced``).
    """

    def __init__(self, config: AggConfig, sliced: T.StructType, packed: bool = False):
        self.config, self.packed = config, packed
        self.arrow_schema = config.slices_arrow_schema() if packed else _arrow_schema(sliced)
        self.out_schema = _metrics.arrow_schema(config.output_schema())

    def __call__(self, key, pdfs, state):
        config = self.config
        frames = [p for p in pdfs if len(p)]
        counts = None
        if self.packed:
            table, counts = unpack_slices(self.arrow_schema, frames)
        elif frames:
            table = pa.concat_tables([_to_arrow(p, self.arrow_schema) for p in frames])
        else:
            table = self.arrow_schema.empty_table()
        wm_us = None
        if config.watermark:
            wm_us = int(state.getCurrentWatermarkMs()) * 1000
        saved = state.get if state.exists else None
        result = run_shard(config, table, saved, wm_us, read_entry(config), counts)
        state.update(result.state)
        if config.watermark:
            # Fire at the next watermark advance even without data (no-data batches), so windows close.
            state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1))
        yield _metrics.packed_row(result.output, self.out_schema, METRICS, **result.metrics)


def encode_float_partials(config: AggConfig, table: pa.Table) -> pa.Table:
    """Turn partials computed by Spark's aggregation (doubles, null without values) into the kernel's
    int64 encoding: sums bit-cast, min/max as order keys, identities where the column had no value.
    """
    ops = config.spec.ops
    count_of = {col: j for j, (op, col) in enumerate(ops) if op == OP_COUNT}
    kernel = load("_aggregate")
    for j, (op, col) in enumerate(ops):
        if op not in _FLOAT_OPS:
            continue
        name = partial_name(j)
        empty = _int64(table, partial_name(count_of[col])) == 0
        values = np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
        if op == OP_SUM_F:
            encoded = np.where(empty, 0.0, values).view(np.int64)  # all-null slice: Spark's sum is null
        else:
            identity = np.iinfo(np.int64).max if op == OP_MIN_F else np.iinfo(np.int64).min
            encoded = np.where(empty, identity, kernel.f64_keys(values))
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(encoded, type=pa.int64()))
    return table


def join_sum_halves(config: AggConfig, table: pa.Table) -> pa.Table:
    """Turn an integral sum computed by Spark's aggregation as the sum of the low halves
    (``v & 0xFFFFFFFF``, see ``_native_slices``) into the kernel's wrapped sum, ``high * 2**32 + low``
    modulo 2**64, where its high-half partial (``OP_SUM_HI``) follows it. Summing halves never
    overflows (fewer than 2**31 rows per slice), so Spark's ANSI mode cannot raise its own error first.
    """
    for j, (op, _col) in enumerate(config.spec.ops):
        if op != OP_SUM_HI:
            continue
        low, high = _int64(table, partial_name(j - 1)), _int64(table, partial_name(j))
        wrapped = (high.view(np.uint64) << np.uint64(32)) + low.view(np.uint64)
        name = partial_name(j - 1)
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(wrapped.view(np.int64), type=pa.int64()))
    return table


class BatchShard:
    """``applyInPandas`` function for batch DataFrames: all slices of one shard at once, no state."""

    def __init__(self, config: AggConfig, sliced: T.StructType, float_partials: bool = False):
        self.config = config
        self.arrow_schema = _arrow_schema(sliced)
        self.float_partials = float_partials

    def __call__(self, pdfs):
        frames = [_to_arrow(p, self.arrow_schema) for p in pdfs if len(p)]
        table = pa.concat_tables(frames) if frames else self.arrow_schema.empty_table()
        if self.float_partials:
            table = join_sum_halves(self.config, encode_float_partials(self.config, table))
        result = run_shard(self.config, table, None, None, read_entry(self.config))
        if result.output.num_rows:
            yield _metrics.data_rows(_metrics.to_pandas(result.output))
        yield _metrics.metrics_row(list(self.config.out_names), **result.metrics)


def batch_function(config: AggConfig, sliced: T.StructType, float_partials: bool = False):
    """The iterator form of ``applyInPandas`` (inferred from the type hints), so data and report rows
    are converted to Arrow separately.
    """
    runner = BatchShard(config, sliced, float_partials)

    def apply_shard(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from runner(batches)

    return apply_shard
