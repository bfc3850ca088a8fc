"""What the workers of :func:`pyspark_cq.sliding_aggregate` share: the picklable :class:`AggConfig`, the
column layout of the sliced rows, the parameters in effect for a micro-batch (control table) and the
transport of the key columns.

Column names of the intermediate (sliced) rows all start with ``__cq_`` so they cannot clash with user
columns, which never reach this stage except as ``by`` keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from ...control import ControlHandle, Entry
from ...vocabulary import metrics as M
from .spec import OP_MAX_F, OP_MIN_F, OP_SUM_F, AggSpec, KeyColumn, arrow_type, from_int64, nonnull_numpy, to_int64

__all__ = ["TIME", "HASH", "SHARD", "KHASH", "START", "BAD", "TAG", "SHED_COL", "SLICES", "MAXT", "METRICS", "key_name",
           "null_name", "value_name", "partial_name", "AggConfig", "BatchParams", "read_entry", "batch_params",
           "round_starts", "last_window_end", "encode_key", "decode_keys"]

_FLOAT_OPS = (OP_SUM_F, OP_MIN_F, OP_MAX_F)

# Input projection (before the slicer).
TIME, HASH = "__cq_t", "__cq_h"
# Sliced rows (slicer output, stateful input).
SHARD, KHASH, START, BAD, TAG = "__cq_shard", "__cq_hash", "__cq_start", "__cq_bad", "__cq_tag"
SHED_COL = "__cq_shed"   # rows the slicer shed (drop_ratio), carried by the marker rows like BAD
SLICES = "__cq_slices"   # packed transport: slices of one shard as an Arrow IPC message (see Slicer._pack)
#: state="files": the latest event time (microseconds) a slicer task saw, carried by its marker rows (else null)
MAXT = "__cq_maxt"
#: Columns of the row transport that a packed row carries itself (the rest travel inside SLICES).
_ROW_ONLY = (SHARD, BAD, SHED_COL, TAG)
#: The streaming aggregation's report: the shared counters plus ``shed_rows``.
METRICS = M.AGGREGATE


def key_name(i: int) -> str:
    """Sliced rows' column of the ``i``-th key."""
    return f"__cq_k{i}"


def null_name(i: int) -> str:
    """Sliced rows' null flag of the ``i``-th key (nullable keys of a numeric transport)."""
    return f"__cq_k{i}_null"


def value_name(i: int) -> str:
    """Input projection's column of the ``i``-th value column."""
    return f"__cq_v{i}"


def partial_name(j: int) -> str:
    """Sliced rows' column of the ``j``-th partial aggregate."""
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
        """The partial counting a slice's shed rows (``kept_column``, :func:`~.spec.with_kept`), or None."""
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

    def packed_schema(self, tag_metadata: dict | None, max_time: bool = False) -> T.StructType:
        """Spark schema of the packed slice transport (streaming, shard layout): per row slices of one shard
        in an Arrow IPC message (``SLICES``, :meth:`slices_arrow_schema`), and the malformed and shed row
        counts (non-zero in marker rows only, whose message is empty). ``max_time`` (``state="files"``): one
        more column, ``MAXT``, the latest event time the slicer task saw, in its marker rows.

        The stateful input then has a few rows per task and batch instead of one per slice: the JVM
        moves each slice as bytes, not as a row through the shuffle, the sort and the pandas conversion.
        """
        row = self.sliced_schema(tag_metadata)
        fields = [row[SHARD], T.StructField(SLICES, T.BinaryType(), False), row[BAD], row[SHED_COL]]
        if max_time:
            fields.append(T.StructField(MAXT, T.LongType(), True))
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

# ---- key transport -----------------------------------------------------------------------------------

def encode_key(k: KeyColumn, arr: pa.Array) -> list[pa.Array]:
    """Physical transport of one key column (see spec.KeyColumn)."""
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
