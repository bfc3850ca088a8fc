"""Interval and window stream-stream joins with native symmetric hash state (PIPES, §2.4, §3.6.3).

The join state follows Cammert, Krämer, Seeger and Vaupel, "A Cost Model for Adaptive Resource
Management in Data Stream Systems" (PIPES): per input a hash table from the join key to its rows, and
the rows linked by expiry time (sorted runs, §3.4.1), so temporal expiration (§2.4.4) touches only the
rows it removes. The kernel is :mod:`pyspark_cq._join` (C++); this module wires it into Spark.

Streaming plan (one micro-batch)::

    left  ─► tag (side 0, key, time, payload) ─┐
                                                ├─ union ─► groupBy(shard).applyInPandasWithState
    right ─► tag (side 1, key, time, payload) ─┘              └ per shard: native state, GroupState bytes

Semantics are those of Spark's built-in stream-stream join with the condition
``left_time + lower <= right_time <= left_time + upper``, so that the output multisets are equal:

* rows behind the watermark of the previous batch are dropped before the join (Spark itself drops them
  for the stateful operator; the operator reports them as ``late_rows``);
* within a batch the left rows probe the right state first and are stored, then the right rows probe
  the left state (which now holds this batch's left rows) and are stored;
* at the end of the batch each side evicts the rows that no future row can match, with the state
  watermarks Spark derives from the condition (``StreamingJoinHelper.getStateValueWatermark``);
  outer joins emit the evicted rows that never matched, null-padded.

With a control table (``control=``, :mod:`pyspark_cq.runtime.control`) the bounds (or the window) may
change while the query runs. Following PIPES §4.2 a change applies to elements whose timestamp is at
or after its application time; every stored row keeps the band of its own timestamp and a pair is
decided by the band of the earlier element (§2.4.1). Load shedding (``drop_ratio``, PIPES §5.3) drops
input rows by a deterministic hash before they are inserted or probed and counts them as ``shed_rows``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .. import _validate
from .._duration import parse_duration
from .._native import load
from ..policies.decisions import validate_changes
from ..runtime.control import ControlHandle
from . import _report, _state_bytes
from ._join_codec import ColumnCodec, codecs_for, encode_keys, normalized_key
from ._shards import check_shard_count, shard_key_column, with_shard_count

LEFT, RIGHT = 0, 1
_SIDE = "__cq_side"
_SHARD = "__cq_shard"
_TIME = "__cq_t"          # the event-time column, carrying the watermark marker (Spark drops late rows)
_MICROS = "__cq_tus"      # the same instant as epoch microseconds, for the kernel
_WINDOW = "__cq_w"        # window join under a control table: the row's own window (µs)
_SHED = "shed_rows"       # the join's own counter next to _report.METRICS
_METRICS = _report.METRICS + (_SHED,)
_I64_MAX = np.iinfo(np.int64).max
_HOW = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
        "right": "right", "right_outer": "right", "rightouter": "right",
        "full": "full", "outer": "full", "full_outer": "full", "fullouter": "full"}
_GROUPINGS = ("shard", "key")
_STATE_SCHEMA = T.StructType([T.StructField("kernel", T.BinaryType(), True),
                              T.StructField("left", T.BinaryType(), True),
                              T.StructField("right", T.BinaryType(), True)])


def interval_join(left, right, on, left_time, right_time, lower, upper, how="inner", *, suffixes=None,
                  shards=None, grouping="shard", name=None, control=None, drop_ratio=0.0, seed=0):
    """Join two DataFrames on equal keys and a time band (PIPES join, Cammert et al., §2.4.1, §3.6.3).

    A left row ``l`` and a right row ``r`` join when every ``on`` column is equal and
    ``l[left_time] + lower <= r[right_time] <= l[left_time] + upper`` (both bounds inclusive).
    On streaming inputs the state is a native symmetric hash table per shard whose rows are linked by
    expiry time, so eviction costs only what it removes (PIPES §2.4.4, §3.4.1); results equal those of
    Spark's built-in stream-stream join with the same condition and watermarks.

    Parameters
    ----------
    left, right : DataFrame
        Both batch or both streaming. Streaming inputs need a watermark on their time column.
    on : str or list of str
        Key column(s), present under the same name in both inputs; equality on each (SQL semantics:
        a null key never matches).
    left_time, right_time : str
        Timestamp columns of ``left`` and ``right``.
    lower, upper : str, datetime.timedelta or numpy.timedelta64
        The band, e.g. ``"-10 seconds"`` and ``"1 minute"``; ``lower <= upper``.
    how : {"inner", "left", "right", "full"}
        Join type. Outer joins emit an unmatched row (null-padded) once the watermark guarantees that
        no match can come, as Spark does; on batch inputs at once.
    suffixes : tuple of (str, str), optional
        Appended to non-key columns that exist on both sides (left, right). Without it such a clash
        is an error naming the columns.
    shards : int, optional
        Number of state shards (groups of ``applyInPandasWithState``); default: twice
        ``spark.sql.shuffle.partitions``. Each shard keeps one native table for many keys. A
        checkpoint keeps its count: restoring it with another raises ValueError.
    grouping : {"shard", "key"}
        ``"shard"`` groups the state by a hash shard of the key (default, fast); ``"key"`` groups by
        the raw key, one state per key (kept for comparison; see docs/join.md for the numbers).
    name : str, optional
        Name under which the per-batch counters are observed (``pyspark_cq.read_metrics``):
        input_rows, output_rows, state_rows, state_bytes, evicted_rows, late_rows, malformed_rows,
        shed_rows. Default: the control handle's operator id, else ``"cq_interval_join"``.
    control : pyspark_cq.runtime.control.ControlHandle, optional
        The operator's control-table entry (``ctx.control(op_id)``, ``ControlTable(path).handle(op_id)``
        or ``ControlHandle(path, op_id)``), read at every micro-batch. Its ``lower`` / ``upper``
        schedules override the arguments per element (PIPES §4.2: a change applies to rows whose
        timestamp is at or after its application time); a pair is decided by the bounds in force at the
        earlier row's timestamp. Its ``drop_ratio`` overrides the argument.
    drop_ratio : float
        Load shedding (PIPES §5.3): the probability in [0, 1) with which each input row of either side
        is dropped before it is inserted or probed; counted as ``shed_rows``.
    seed : int
        Seed of the shedding decisions, which hash (seed, side, time, key, payload) so that a restart
        from a checkpoint drops the same rows.

    Returns
    -------
    DataFrame
        The ``on`` columns once, then the other left columns, then the other right columns.
    """
    spec = _JoinSpec.build(left, right, on, left_time, right_time, how, suffixes, shards, grouping, name,
                           window=None, control=control, drop_ratio=drop_ratio, seed=seed,
                           default_name="cq_interval_join")
    lo = parse_duration(lower, "lower")
    hi = parse_duration(upper, "upper")
    if lo > hi:
        raise ValueError(f"lower must be <= upper, got lower={lower!r} and upper={upper!r}")
    spec.lower, spec.upper = lo, hi
    return _execute(spec)


def window_join(left, right, on, left_time, right_time, left_window, right_window, *, suffixes=None,
                shards=None, grouping="shard", name=None, control=None, drop_ratio=0.0, seed=0):
    """Window join of PIPES (Cammert et al., §2.4.1–§2.4.2): keys equal and validities intersect.

    Each row is valid during ``[t, t + window)`` (the time-based window operator ω, §2.4.2). A left
    and a right row join when their keys are equal and their validities intersect; the result carries
    the intersection as ``valid_from`` / ``valid_to`` (§2.4.1). This is the interval join with
    ``lower = -right_window + 1 µs`` and ``upper = left_window - 1 µs``.

    Parameters
    ----------
    left, right, on, left_time, right_time, suffixes, shards, grouping, drop_ratio, seed
        As for :func:`interval_join`.
    left_window, right_window : str, datetime.timedelta or numpy.timedelta64
        Positive window sizes of the two inputs.
    name : str, optional
        As for :func:`interval_join`; default the control handle's operator id, else
        ``"cq_window_join"``.
    control : pyspark_cq.runtime.control.ControlHandle, optional
        As for :func:`interval_join`, with the parameter ``window``: when the entry has it, its schedule
        sets the window of *both* inputs per element (§4.2: a row keeps the window in force at its
        timestamp; the earlier row of a pair decides whether the validities intersect, and
        ``valid_to`` uses each row's own window). Without it the arguments apply.

    Returns
    -------
    DataFrame
        As :func:`interval_join` (inner), plus ``valid_from`` and ``valid_to`` (timestamps).
    """
    wl = parse_duration(left_window, "left_window", allow_negative=False, allow_zero=False)
    wr = parse_duration(right_window, "right_window", allow_negative=False, allow_zero=False)
    spec = _JoinSpec.build(left, right, on, left_time, right_time, "inner", suffixes, shards, grouping, name,
                           window=(wl, wr), control=control, drop_ratio=drop_ratio, seed=seed,
                           default_name="cq_window_join")
    spec.lower, spec.upper = -wr + 1, wl - 1
    return _execute(spec)


@dataclass
class _JoinSpec:
    """Everything the driver decided, in a picklable form the workers receive."""

    left: object = field(repr=False)
    right: object = field(repr=False)
    keys: list[str]
    key_types: list[T.DataType]
    left_time: str
    right_time: str
    how: str
    left_others: list[str]
    right_others: list[str]
    left_out: list[str]
    right_out: list[str]
    streaming: bool
    shards: int
    grouping: str
    name: str
    window: tuple[int, int] | None
    control: ControlHandle | None = None
    drop_ratio: float = 0.0
    seed: int = 0
    lower: int = 0
    upper: int = 0

    @classmethod
    def build(cls, left, right, on, left_time, right_time, how, suffixes, shards, grouping, name, window, *,
              control=None, drop_ratio=0.0, seed=0, default_name="cq_interval_join"):
        _validate.dataframe(left, "left")
        _validate.dataframe(right, "right")
        keys = _validate.column_list(left, on, "on", allow_empty=False)
        _validate.column_list(right, keys, "on")
        for col, df, arg in ((left_time, left, "left_time"), (right_time, right, "right_time")):
            dtype = _validate.time_column(df, col, arg)
            if not isinstance(dtype, T.TimestampType):
                raise TypeError(f"{arg} must be a TIMESTAMP column (with time zone semantics); column "
                                f"{col!r} has type {dtype.simpleString()}")
        if not isinstance(how, str) or how.lower() not in _HOW:
            raise ValueError(f"how must be one of 'inner', 'left', 'right', 'full', got {how!r}")
        if grouping not in _GROUPINGS:
            raise ValueError(f"grouping must be 'shard' or 'key', got {grouping!r}")
        if control is not None and not isinstance(control, ControlHandle):
            raise TypeError("control must be a pyspark_cq.runtime.control.ControlHandle (from ctx.control(op_id), "
                            "ControlTable(path).handle(op_id) or ControlHandle(path, op_id)) or None, got "
                            f"{type(control).__name__}: {control!r}")
        drop_ratio = validate_changes({"drop_ratio": drop_ratio})["drop_ratio"]
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if name is None:
            name = control.operator if control is not None else default_name
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        if left.isStreaming != right.isStreaming:
            raise ValueError("left and right must both be streaming or both be batch DataFrames; got "
                             f"left.isStreaming={left.isStreaming}, right.isStreaming={right.isStreaming}")
        if left.isStreaming:
            _validate.require_watermark(left, left_time, "left_time")
            _validate.require_watermark(right, right_time, "right_time")
        key_types = []
        for k in keys:
            lt, rt = left.schema[k].dataType, right.schema[k].dataType
            if lt == rt:
                key_types.append(lt)
            elif isinstance(lt, T.IntegralType) and isinstance(rt, T.IntegralType):
                key_types.append(T.LongType())
            else:
                raise TypeError(f"on: key column {k!r} has type {lt.simpleString()} on the left and "
                                f"{rt.simpleString()} on the right; cast one side first")
            if isinstance(key_types[-1], (T.ArrayType, T.MapType, T.StructType)):
                raise TypeError(f"on: key column {k!r} has the unsupported type {lt.simpleString()}")
        left_others = [c for c in left.columns if c not in keys]
        right_others = [c for c in right.columns if c not in keys]
        left_out, right_out = _output_names(keys, left_others, right_others, suffixes,
                                            extra=("valid_from", "valid_to") if window else ())
        shards = _shard_count(left, shards)
        return cls(left, right, keys, key_types, left_time, right_time, _HOW[how.lower()], left_others,
                   right_others, left_out, right_out, left.isStreaming, shards, grouping, name, window,
                   control, drop_ratio, int(seed))

    def output_schema(self) -> T.StructType:
        fields = [T.StructField(k, t, True) for k, t in zip(self.keys, self.key_types)]
        fields += [T.StructField(o, self.left.schema[c].dataType, True)
                   for c, o in zip(self.left_others, self.left_out)]
        fields += [T.StructField(o, self.right.schema[c].dataType, True)
                   for c, o in zip(self.right_others, self.right_out)]
        if self.window:
            fields += [T.StructField("valid_from", T.TimestampType(), True),
                       T.StructField("valid_to", T.TimestampType(), True)]
        return T.StructType(fields)


def _output_names(keys, left_others, right_others, suffixes, extra=()):
    clash = sorted(set(left_others) & set(right_others))
    if suffixes is not None:
        if (not isinstance(suffixes, (tuple, list)) or len(suffixes) != 2
                or not all(isinstance(s, str) for s in suffixes) or suffixes[0] == suffixes[1]):
            raise ValueError(f"suffixes must be a pair of two different strings, got {suffixes!r}")
    elif clash:
        raise ValueError(f"left and right both have the column(s) {clash}; rename them or pass "
                         f"suffixes=('_left', '_right')")
    ls, rs = suffixes if suffixes is not None else ("", "")
    left_out = [c + ls if c in clash else c for c in left_others]
    right_out = [c + rs if c in clash else c for c in right_others]
    names = list(keys) + left_out + right_out + list(extra)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"the output would have the column(s) {dup} twice; choose other suffixes or "
                         f"rename the input columns")
    return left_out, right_out


def _shard_count(df, shards) -> int:
    if shards is None:
        try:
            partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        except Exception:  # Spark Connect without conf access: a sensible default
            partitions = 8
        return max(1, 2 * partitions)
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    return int(shards)


# --- Spark plan --------------------------------------------------------------------------------------


def _tagged(spec: _JoinSpec, side: int, streaming_union: bool):
    """One input in the transport layout (side flag, shard, time, keys, payload of one or both sides)."""
    df = spec.left if side == LEFT else spec.right
    time_col = spec.left_time if side == LEFT else spec.right_time
    key_codecs = codecs_for(df.schema, spec.keys, "__cq_k")
    cols = [F.lit(side).cast("byte").alias(_SIDE)]
    norm = [normalized_key(F.col(k).cast(t), t) for k, t in zip(spec.keys, spec.key_types)]
    if spec.grouping == "shard":
        cols.append(shard_key_column(F.xxhash64(*norm), spec.shards).alias(_SHARD))
    else:
        cols += [n.alias(f"__cq_g{i}") for i, n in enumerate(norm)]
    cols += [F.col(time_col).alias(_TIME), F.unix_micros(F.col(time_col)).alias(_MICROS)]
    for codec, k, t in zip(key_codecs, spec.keys, spec.key_types):
        cols += ColumnCodec(codec.name, t, codec.flagged).spark_columns(F.col(k).cast(t))
    for s in ((LEFT, RIGHT) if streaming_union else (side,)):
        src = spec.left if s == LEFT else spec.right
        others = spec.left_others if s == LEFT else spec.right_others
        for codec, c in zip(codecs_for(src.schema, others, f"__cq_p{s}_"), others):
            cols += codec.spark_columns(F.col(c) if s == side else None)
    return df.select(*cols)


def _group_cols(spec: _JoinSpec) -> list[str]:
    return [_SHARD] if spec.grouping == "shard" else [f"__cq_g{i}" for i in range(len(spec.keys))]


def _execute(spec: _JoinSpec):
    load("_join")  # fail on the driver, readably, if the build is broken
    out_schema = spec.output_schema()
    worker = _Worker(_WorkerPlan.of(spec))
    if spec.streaming:
        from pyspark.sql.streaming.state import GroupStateTimeout

        union = _tagged(spec, LEFT, True).union(_tagged(spec, RIGHT, True))
        union = _report.observe_input(union, spec.name)
        packed = union.groupBy(*_group_cols(spec)).applyInPandasWithState(
            worker.streaming, _report.packed_schema(_METRICS), _STATE_SCHEMA, "append",
            GroupStateTimeout.EventTimeTimeout)
        return _report.attach_packed(packed, spec.name, out_schema, _METRICS)
    else:
        lt = _tagged(spec, LEFT, False).groupBy(*_group_cols(spec))
        rt = _tagged(spec, RIGHT, False).groupBy(*_group_cols(spec))
        # A plain 3-argument function: Spark picks (key, left, right) by counting parameters.
        raw = lt.cogroup(rt).applyInPandas(lambda key, lpdf, rpdf: worker.batch(lpdf, rpdf),
                                           _report_schema(out_schema))
    cols = [_report.PREFIX + m for m in _METRICS]
    return _report.attach(raw, spec.name, counters={m: F.sum(c) for m, c in zip(_METRICS, cols)},
                          keep=~F.col(_report.REPORT), drop=[_report.REPORT] + cols)


def _report_schema(out_schema: T.StructType) -> T.StructType:
    """The shared report columns plus the join's own ``shed_rows``."""
    schema = _report.report_schema(out_schema)
    return T.StructType(list(schema.fields) + [T.StructField(_report.PREFIX + _SHED, T.LongType(), True)])


# --- worker side --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WorkerPlan:
    """The picklable subset of a spec that the Python workers need."""

    key_codecs: tuple[ColumnCodec, ...]
    side_codecs: tuple[tuple[ColumnCodec, ...], tuple[ColumnCodec, ...]]
    out_columns: tuple[str, ...]
    n_keys: int
    how: str
    lower: int
    upper: int
    window: tuple[int, int] | None
    control: ControlHandle | None = None
    drop_ratio: float = 0.0
    seed: int = 0
    out_arrow: pa.Schema | None = None  # the output's Arrow schema (packed streaming output)
    shards: int | None = None         # grouping="shard": the shard count, recorded in and checked against the state

    @classmethod
    def of(cls, spec: _JoinSpec) -> _WorkerPlan:
        keys = tuple(ColumnCodec(c.name, t, c.flagged)
                     for c, t in zip(codecs_for(spec.left.schema, spec.keys, "__cq_k"), spec.key_types))
        lc = tuple(codecs_for(spec.left.schema, spec.left_others, f"__cq_p{LEFT}_"))
        rc = tuple(codecs_for(spec.right.schema, spec.right_others, f"__cq_p{RIGHT}_"))
        out = tuple(spec.keys) + tuple(spec.left_out) + tuple(spec.right_out)
        if spec.window:
            out += ("valid_from", "valid_to")
        return cls(keys, (lc, rc), out, len(spec.keys), spec.how, spec.lower, spec.upper, spec.window,
                   spec.control, spec.drop_ratio, spec.seed, out_arrow=_report.arrow_schema(spec.output_schema()),
                   shards=spec.shards if spec.grouping == "shard" else None)

    def payload_schema(self, side: int) -> pa.Schema:
        codecs = self.key_codecs + self.side_codecs[side]
        # TIMESTAMP travels as exact UTC microseconds; TIMESTAMP_NTZ as pandas' naive nanoseconds
        types = [pa.timestamp("ns") if pa.types.is_timestamp(c.arrow_type) and c.arrow_type.tz is None
                 else c.arrow_type for c in codecs]
        fields = [pa.field(c.name, t) for c, t in zip(codecs, types)]
        if self.window:  # valid_from / valid_to need each row's instant; the plain band join does not
            fields.append(pa.field(_MICROS, pa.int64()))
            if self.control is not None:  # ... and, when windows can change, each row's own window
                fields.append(pa.field(_WINDOW, pa.int64()))
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


def _timeout_ms(wm_ms: int, min_ends) -> int | None:
    """The event-time timeout (ms) at which the earliest stored row becomes evictable, or None.

    ``min_ends`` are the kernel's smallest expiry keys per side (:func:`evict_at_ms`), or None.
    """
    ends = [e for e in min_ends if e is not None]
    if not ends:
        return None
    # Spark fires an event-time timeout when timeout < watermark, so fire at watermark >= min(ends).
    return max(min(ends) - 1, wm_ms, 1)


_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def shed_mask(table: pa.Table, micros: np.ndarray, side: int, seed: int, ratio: float) -> np.ndarray:
    """Which rows load shedding drops (PIPES §5.3, random load shedding): True with probability ``ratio``.

    The decision is a hash of (seed, side, the row's time, its key and payload values), not of its
    position, so a restart from a checkpoint (or another split into micro-batches) drops the same rows.
    Equal rows get equal decisions.

    Parameters
    ----------
    table : pyarrow.Table
        The decoded rows of one side (keys first, then payload).
    micros : numpy.ndarray
        Their times (int64 µs).
    side : int
        0 left, 1 right.
    seed : int
        Any int.
    ratio : float
        Drop probability in [0, 1).
    """
    n = table.num_rows
    if ratio <= 0.0 or n == 0:
        return np.zeros(n, dtype=bool)
    values = pd.util.hash_pandas_object(_report.to_pandas(table), index=False).to_numpy(dtype=np.uint64)
    h = _mix64(np.full(n, (int(seed) * 2 + side) % 2**64, dtype=np.uint64))
    h = _mix64(h ^ np.asarray(micros, dtype=np.int64).view(np.uint64))
    h = _mix64(h ^ values)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53) < ratio


class _Side:
    """One input's payload rows (Arrow) addressed by the kernel's payload ids."""

    def __init__(self, schema: pa.Schema, table: pa.Table | None = None):
        self.schema = schema
        self.table = table if table is not None else schema.empty_table()

    def append(self, table: pa.Table) -> np.ndarray:
        start = self.table.num_rows
        self.table = pa.concat_tables([self.table, table]) if start else table
        return np.arange(start, start + table.num_rows, dtype=np.int64)

    def take(self, ids) -> pa.Table:
        return self.table.take(pa.array(ids, type=pa.int64()))

    def canonicalize(self, kernel, side: int) -> None:
        """Reorder the payload to the kernel's serialization order (renumbering the kernel's ids).

        Moving the state between the JVM and Python costs far more per byte than this ``take``
        (see docs/join.md): it drops dead rows, puts each key's rows next to each other (the payload's
        columns compress better) and makes the kernel image's ids implicit (kernel state format 3).
        """
        old = kernel.canonical_ids(side, self.table.num_rows)
        if len(old) == self.table.num_rows and (len(old) == 0 or (old[0] == 0 and (np.diff(old) == 1).all())):
            return  # already in order (e.g. a batch without input)
        self.table = self.take(old).combine_chunks()

    def to_bytes(self, shards: int | None = None) -> bytes:
        """The payload as bytes; ``shards`` (grouping by shard) is recorded for :meth:`check_shards`."""
        table = self.table if shards is None else with_shard_count(self.table, shards)
        return _state_bytes.table_to_bytes(table)

    def check_shards(self, shards: int | None) -> None:
        """Refuse state written with another shard count, e.g. after ``spark.sql.shuffle.partitions``
        changed under the default ``shards``."""
        if shards is not None:
            check_shard_count(self.table, shards, "join",
                              "the default is twice spark.sql.shuffle.partitions when the query is defined")

    @classmethod
    def from_bytes(cls, schema: pa.Schema, blob: bytes) -> _Side:
        return cls(schema, _state_bytes.table_from_bytes(blob))


class _Worker:
    """The per-group function: kernel + payload tables, driven as Spark's join drives its state."""

    def __init__(self, plan: _WorkerPlan):
        self.plan = plan

    # -- input decoding

    def _decode(self, pdf: pd.DataFrame, side: int) -> tuple[pa.Table, np.ndarray]:
        """Arrow payload table (keys, side's columns, micros) and the micros of the rows of one side."""
        plan = self.plan
        codecs = plan.key_codecs + plan.side_codecs[side]
        arrays = [c.to_arrow(pdf) for c in codecs]
        micros = pdf[_MICROS].to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).min)
        if plan.window:
            arrays.append(pa.array(micros, type=pa.int64()))
        schema = plan.payload_schema(side)
        if _WINDOW in schema.names:  # appended once the row's window is known (_process)
            schema = schema.remove(schema.get_field_index(_WINDOW))
        return pa.Table.from_arrays(arrays, schema=schema), micros

    def _process(self, kernel, sides, inputs, wm_ms: int | None, entry=None):
        """Run one batch through the kernel.

        ``entry`` is the operator's control-table entry of this batch (None: the arguments apply).
        Returns (output frames, evicted rows, malformed rows, shed rows).
        """
        plan = self.plan
        join = load("_join")
        pairs = [None, None]
        malformed = shed = 0
        ratio = plan.drop_ratio if entry is None else float(entry.get("drop_ratio", plan.drop_ratio))
        for side in (LEFT, RIGHT):  # Spark's order: left input first, then right input
            pdf = inputs[side]
            if pdf is None or len(pdf) == 0:
                continue
            table, micros = self._decode(pdf, side)
            null_time = pdf[_MICROS].isna().to_numpy()
            if wm_ms is not None and null_time.any():
                # Spark keeps such rows in its state forever and never emits them; drop and count them.
                malformed += int(null_time.sum())
                keep = ~null_time
                table, micros = table.filter(pa.array(keep)), micros[keep]
                null_time = np.zeros(len(micros), dtype=bool)
            drop = shed_mask(table, micros, side, plan.seed, ratio)
            if drop.any():  # load shedding (PIPES §5.3): these rows are not part of the input
                shed += int(drop.sum())
                keep = ~drop
                table, micros, null_time = table.filter(pa.array(keep)), micros[keep], null_time[keep]
            if len(micros) == 0:
                continue
            lower, upper, window = plan.row_bounds(entry, side, micros)
            if window is not None:
                table = table.append_column(_WINDOW, pa.array(window, type=pa.int64()))
            ids = sides[side].append(table)
            key_arrays = [table.column(i).combine_chunks() for i in range(plan.n_keys)]
            offsets, data, null_key = encode_keys(key_arrays, join.concat_keys)
            if null_time.any():  # batch: a row without time never matches, but outer joins keep it
                null_key = (null_time if null_key is None else (null_key.astype(bool) | null_time)).astype(np.uint8)
                micros = np.where(null_time, 0, micros)
            ends = None
            if wm_ms is not None:  # streaming: expiry keys = the watermark (ms) that evicts each row
                ends = evict_at_ms(micros, plan.lower if lower is None else lower,
                                   plan.upper if upper is None else upper, side, guard=entry is not None)
            idx, other = kernel.insert_probe(side, offsets, data, null_key, micros, ids, lower=lower, upper=upper,
                                             ends=ends)
            pairs[side] = (ids[idx], other) if side == LEFT else (other, ids[idx])
        threshold = _I64_MAX if wm_ms is None else wm_ms
        evicted = [kernel.evict(side, threshold) for side in (LEFT, RIGHT)]
        parts = []
        for p in pairs:
            if p is not None and len(p[0]):
                parts.append(self._rows(sides, p[0], p[1]))
        if plan.how in ("left", "full"):
            ids, matched = evicted[LEFT]
            lonely = ids[matched == 0]
            if len(lonely):
                parts.append(self._rows(sides, lonely, None))
        if plan.how in ("right", "full"):
            ids, matched = evicted[RIGHT]
            lonely = ids[matched == 0]
            if len(lonely):
                parts.append(self._rows(sides, None, lonely))
        n_evicted = sum(len(e[0]) for e in evicted)
        return parts, n_evicted, malformed, shed

    def _rows(self, sides, left_ids, right_ids) -> pa.Table:
        """Output rows for matched pairs (both ids), or unmatched rows of one side (other ids None).

        Payload types as stored (TIMESTAMP columns naive in the session zone); see :meth:`_packed`."""
        plan = self.plan
        n = len(left_ids) if left_ids is not None else len(right_ids)
        lt = sides[LEFT].take(left_ids) if left_ids is not None else None
        rt = sides[RIGHT].take(right_ids) if right_ids is not None else None
        cols = []
        for i in range(plan.n_keys):
            cols.append((lt if lt is not None else rt).column(i))
        for side, t in ((LEFT, lt), (RIGHT, rt)):
            codecs = plan.side_codecs[side]
            schema = sides[side].schema
            for j in range(len(codecs)):
                pos = plan.n_keys + j
                cols.append(t.column(pos) if t is not None else pa.nulls(n, schema.field(pos).type))
        if plan.window:
            tl = lt.column(_MICROS).to_numpy()
            tr = rt.column(_MICROS).to_numpy()
            if plan.control is not None:  # each row's own window (PIPES §4.2)
                wl, wr = lt.column(_WINDOW).to_numpy(), rt.column(_WINDOW).to_numpy()
            else:
                wl, wr = plan.window
            utc = pa.timestamp("us", tz="UTC")
            cols += [pa.array(np.maximum(tl, tr), type=pa.int64()).cast(utc),
                     pa.array(np.minimum(tl + wl, tr + wr), type=pa.int64()).cast(utc)]
        return pa.Table.from_arrays(cols, names=list(plan.out_columns[:len(cols)]))

    def _packed(self, parts) -> pa.Table | None:
        """The streaming output rows in the output's Arrow schema (TIMESTAMP columns are exact UTC
        instants already: see _join_codec)."""
        if not parts:
            return None
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return table.cast(self.plan.out_arrow)

    def _split(self, frames) -> list:
        frames = [f for f in frames if len(f)]
        if not frames:
            return [None, None]
        pdf = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        side = pdf[_SIDE].to_numpy()
        return [pdf[side == LEFT].reset_index(drop=True), pdf[side == RIGHT].reset_index(drop=True)]

    def _report(self, shed_rows=0, **counters) -> pd.DataFrame:
        row = _report.report_row(self.plan.out_columns, **counters)
        row[_report.PREFIX + _SHED] = [int(shed_rows)]
        return row

    @staticmethod
    def _data(part: pd.DataFrame) -> pd.DataFrame:
        out = _report.data_rows(part)
        out[_report.PREFIX + _SHED] = pd.arrays.IntegerArray(np.zeros(len(out), dtype=np.int64),
                                                             np.ones(len(out), dtype=bool))
        return out

    def _entry(self):
        """This batch's control-table entry (one stat when unchanged), or None."""
        return None if self.plan.control is None else self.plan.control.entry()

    def _kernel(self, blob):
        """The kernel state restored from ``blob``; format-1 rows get their expiry keys recomputed."""
        join = load("_join")
        kernel = join.JoinState.deserialize(_state_bytes.unpack(blob))
        if kernel.restored_format == 1:  # format 1 kept no expiry keys: all rows had the state's bounds
            for side in (LEFT, RIGHT):
                t, lo, up = kernel.row_bounds(side)
                kernel.set_ends(side, evict_at_ms(t, lo, up, side))
        return kernel

    # -- streaming: one call per shard (or key) and micro-batch

    def streaming(self, key, pdf_iter, state):
        # Spark's worker concatenates our frames with all-null padding frames; pandas warns about it.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*concatenation with empty")
        plan = self.plan
        join = load("_join")
        entry = self._entry()
        if state.exists:
            blob, lblob, rblob = state.get
            kernel = self._kernel(blob)
            sides = [_Side.from_bytes(plan.payload_schema(LEFT), lblob),
                     _Side.from_bytes(plan.payload_schema(RIGHT), rblob)]
            sides[LEFT].check_shards(plan.shards)
        else:
            kernel = join.JoinState(plan.lower, plan.upper)
            sides = [_Side(plan.payload_schema(LEFT)), _Side(plan.payload_schema(RIGHT))]
        inputs = [None, None] if state.hasTimedOut else self._split(list(pdf_iter))
        n_in = sum(len(x) for x in inputs if x is not None)
        wm_ms = state.getCurrentWatermarkMs()
        parts, n_evicted, malformed, shed = self._process(kernel, sides, inputs, wm_ms, entry)
        state_bytes = 0
        if kernel.rows(LEFT) + kernel.rows(RIGHT) == 0:
            state.remove()
        else:
            for side in (LEFT, RIGHT):
                sides[side].canonicalize(kernel, side)
            blobs = (_state_bytes.pack(kernel.serialize()), sides[LEFT].to_bytes(plan.shards), sides[RIGHT].to_bytes())
            state_bytes = sum(len(b) for b in blobs)
            state.update(blobs)
            timeout = _timeout_ms(wm_ms, (kernel.min_end(LEFT), kernel.min_end(RIGHT)))
            if timeout is not None:
                state.setTimeoutTimestamp(timeout)
        out = self._packed(parts)
        yield _report.packed_row(out, plan.out_arrow, _METRICS, input_rows=n_in,
                                 output_rows=0 if out is None else out.num_rows,
                                 state_rows=kernel.rows(LEFT) + kernel.rows(RIGHT), state_bytes=state_bytes,
                                 evicted_rows=n_evicted, malformed_rows=malformed, shed_rows=shed)

    # -- batch: one call per shard with both sides; everything expires at the end

    def batch(self, left_pdf, right_pdf):
        plan = self.plan
        kernel = load("_join").JoinState(plan.lower, plan.upper)
        sides = [_Side(plan.payload_schema(LEFT)), _Side(plan.payload_schema(RIGHT))]
        parts, _, _, shed = self._process(kernel, sides, [left_pdf, right_pdf], None, self._entry())
        frames = [self._data(_report.to_pandas(p)) for p in parts]
        n_out = sum(p.num_rows for p in parts)
        frames.append(self._report(input_rows=len(left_pdf) + len(right_pdf), output_rows=n_out, shed_rows=shed))
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
