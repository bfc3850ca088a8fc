"""A multi-way stream join with one state per input and a probe order chosen while the query runs (MJoin).

Spark joins n streams as a chain of binary stream-stream joins, each keeping its inputs as state, so
every intermediate result is stored and another join order means another query with lost state. This
operator follows the MJoin design that OM (Kulkarni & Ravishankar, §4.4) and rate-based optimization
(Viglas & Naughton, §4) choose plans for: one symmetric hash state per input (the binary join's native
design, PIPES §2.4.4: expiry ordered by end timestamp, so eviction touches only the rows it removes) and no
intermediate state. A row arriving on input i probes the other inputs one after another in its **probe
order**, extending partial matches that live only on the kernel's stack. The probe orders are the plan:
read from the control table (``plan_id``, :mod:`pyspark_cq.control.plans`) at every micro-batch, they
change the work, never the result.

Data path (one streaming micro-batch)::

    input 0 ─► tag (side, shard, time, key, payload) ─┐
    input 1 ─► tag ...                                 ├─ union ─► groupBy(shard).applyInPandasWithState
    input n ─► tag ...                                 ┘             └ per shard: kernel + payload tables

The kernel is :mod:`pyspark_cq._mjoin` (``native/mjoin_core.hpp``), the per-shard function
:mod:`.worker`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from ..._duration import parse_duration
from ..._native import load
from ...constraints import control_enabled
from ...control import ControlHandle, operator_handle, parse_join_plan
from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common.chunks import schedule_from_params
from .._common.codec import checked_micros, codecs_for, normalized_key
from .._common.partitions import stage_partitions, warn_shuffle_partitions
from .._common.payload import SIDE
from .._common.shards import MULTI_JOIN, resolve_shards, shard_key_column
from .._common.stateless import STATELESS, StatelessShards, stateless_settings
from .nested import nested_orders, retention
from .worker import (
    _LEFT,
    _RIGHT,
    KEY,
    KEY_NULL,
    MICROS,
    PEAKS,
    SHARD,
    TIME,
    MultiJoinConfig,
    MultiJoinWorker,
    band_names,
    closure,
    default_orders,
    metric_names,
    outer_last,
    step_names,
)

__all__ = ["multi_join"]

MAX_INPUTS = 6
#: Key types the kernel takes by value (as int64): equal values, equal keys. Others are hashed and the
#: matches checked on the values.
DIRECT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType, T.DateType, T.TimestampType)


def multi_join(inputs, on, times, bounds, *, how=None, control=None, name=None, output_mode="append",
               constraints=None, state_persistence=None, snapshot_every=10, state_dir=None):
    """Join 2 to 6 DataFrames on one equal key and time bounds, with one state per input (MJoin).

    A tuple of rows, one per input, joins when all its keys are equal (SQL equality: a null key never
    matches) and every bound holds. On streaming inputs each input keeps one native hash table per shard
    keyed by the join key, with expiry by end timestamp (PIPES, Cammert et al., §2.4.4); a row arriving on
    input i probes the other inputs in its probe order and no partial result is stored. The result is the
    multiset Spark's chain of binary stream-stream inner joins with the same conditions gives.

    Parameters
    ----------
    inputs : list of DataFrame
        2 to 6 DataFrames, all streaming (each with a watermark on its time column) or all batch.
    on : str or list of str
        A key column present in every input (it then appears once in the output, first, with the first
        input's value), or one key column per input (all kept). Integral keys of different widths
        compare as ``long``; other key types must be the same in every input.
    times : list of str
        One event-time column per input, all TIMESTAMP or all TIMESTAMP_NTZ.
    bounds : list of (int, int, duration, duration)
        ``(i, j, lower, upper)``: ``times[j]`` BETWEEN ``times[i] + lower`` AND ``times[i] + upper``
        (inclusive; durations as for :func:`~pyspark_cq.interval_join`, e.g. ``"10 minutes"``). The bounds
        must connect all inputs.
    how : list of str, optional
        One join type per input after the first, ``"inner"`` or ``"left"`` (``"left_outer"``): the result is
        Spark's left-deep chain of binary joins with these types. Default all inner. A tuple of the inputs before a
        left input that no row of it matches is output once with nulls for its columns (and extended by the later
        inputs) when the watermark passes the end of its band (docs/multi_join.md). With a left input before the
        last, every input after the first needs a bound to an earlier input.
    control : pyspark_cq.control.ControlHandle, optional
        The operator's control-table entry, read at every micro-batch. Its ``plan_id`` gives every input's
        probe order (``"0:1>2;1:0>2;2:1>0"``, see :func:`pyspark_cq.control.join_plan_id`); a change
        applies from the next batch. Without it, a static order: the input with the narrowest implied time
        band to the inputs bound so far first.
        Its ``params`` may run every input's probe steps over chunks of partial matches under a scheduling
        strategy and a memory bound (``schedule``, ``chunk_rows``, ``max_buffered_rows``, ``priorities`` and
        ``selectivities`` keyed by step ``"<i>_<j>"``; STREAM §5.3 Chain, docs/chain.md, written by the
        ``chain`` policy); the result is the same under every schedule.
        Its ``drop_ratio`` sheds that share of every input before it is inserted or probed (RTStream
        §4.4; a hash of input, time and row decides), counted as ``shed_rows`` and ``shed_rows_<i>``.
        ``params["kept_column"]`` (a new column name), read once when the operator is defined, adds a
        double column: the product over a result's input rows of the fraction ``1 - drop_ratio`` each row's
        micro-batch kept (as ``interval_join(..., kept_column=)``); keep it for the life of a checkpoint.
    name : str, optional
        Name under which the per-batch counters are observed (:func:`pyspark_cq.read_metrics`): the
        shared ones (input_rows, output_rows, state_rows, state_bytes, evicted_rows, late_rows,
        malformed_rows), per input ``input_rows_<i>``, ``state_rows_<i>``, ``late_rows_<i>`` and
        ``malformed_rows_<i>``, and per
        probe step ``probed_<i>_<j>`` / ``matched_<i>_<j>`` (partial matches of rows arriving on input i
        entering / leaving the step that probes input j: the step's observed selectivity is their ratio;
        under a chunk schedule also ``probe_nanos_<i>_<j>``, its time), and ``chunk_steps``,
        ``peak_buffered_rows`` and ``peak_worker_rss`` (maxima over the shards; see docs/chain.md), and
        ``banded_<i>_<j>`` (i < j): 1 when ``bounds`` link inputs i and j, else 0 (the bounds graph, for
        plan policies).
        Default: the control handle's operator id, else ``"cq_multi_join"``. ``late_rows`` and
        ``late_rows_<i>`` are only complete through ``cq.read_metrics`` (the raw counters under
        ``progress.observedMetrics[name]`` are always 0: Spark drops late rows before the operator).

    output_mode : {"append", "update"}, optional
        The output mode the streaming query will be written with (Spark requires the stateful stage to
        declare it). ``"update"`` is allowed where Spark 4.3 allows its own stream-stream join in update mode:
        inner joins only. The rows are the same in both modes (the result is append-only).
    constraints : list of pyspark_cq.constraints.Constraint, optional
        Stream constraints (STREAM §5.2, docs/constraints.md) with inputs named by index: ``unique(i, key)``,
        ``many_to_one(child=i, parent=j, delay=...)``, ``clustered(i, k)``, ``ordered(i, k)``. A streaming join
        then drops the rows they make useless: a row of input y once every other input has *closed* its key (is
        unique and holds a row of it, or will not bring it again by its clustered / ordered arrival), or once one
        of them has closed it and holds no row of it; and a many-to-one child once the watermark passes its time +
        delay while its parent input holds no row of its key. While the inputs adhere the output is the same; a
        row that breaks a constraint is counted (``constraint_violations``) and may miss matches. A control
        entry's ``params["constraint_<name>"]`` (a bool, e.g. ``constraint_unique_2``) turns one off or on. Inner
        joins, or a left last input (whose closing a key then drops another input's row only with every other
        input closed: its null-padded rows stay exact); not with a left input before the last. Batch inputs
        ignore them.
    state_persistence : {None, "auto", "full", "changelog", "files", "stateless"}, optional
        How a streaming join keeps each shard's state between micro-batches (docs/multi_join.md, *State
        persistence*; as :func:`~pyspark_cq.interval_join`'s). ``"auto"`` (None, the default): ``"files"`` under
        ``state_dir`` or a directory found without a setting (the session's checkpoint location or Spark's
        warehouse, then ``pyspark_cq_state/<query id>/<name>``, where every executor reaches it), else ``"full"``.
        ``"full"``: the whole state image goes through Spark's state store every batch. ``"changelog"``: the state
        stays in the Python worker (checked by a version token) and the value holds a snapshot plus the batches'
        deltas. ``"files"``: the same, with the snapshot and deltas as immutable files under ``state_dir`` and only
        a small manifest in Spark's state. Both report ``state_cache_hits`` / ``state_cache_misses`` /
        ``state_cache_catch_ups``. A checkpoint may switch layouts. ``"stateless"`` (inner joins in append mode,
        without ``constraints``): the files layout's state in a stateless stage (``repartition`` by shard, one task
        per core, and ``mapInPandas``), no stateful Spark operator, so the session's ``spark.sql.shuffle.partitions``
        does not matter; the join reads Spark's watermark from the query's offset log (computes it under Spark
        Connect), drops late rows itself, and runs a shard only when rows arrive for it (docs/multi_join.md, *A
        stateless stage*). Keep it for the life of a checkpoint.
    snapshot_every : int
        ``"changelog"`` / ``"files"``: a new snapshot at the latest every this many micro-batches (default 10).
    state_dir : str, optional
        ``"files"`` / ``"stateless"``: the directory of the state files, on a file system every executor shares, one
        per operator, kept as long as the checkpoint. Default for ``"stateless"`` as for ``"auto"``, else required;
        for ``"files"``:
        ``<spark.sql.streaming.checkpointLocation>/pyspark_cq_state/<name>`` when the session sets that, otherwise
        required; for ``"auto"`` see above (two joins of one query need distinct names).

    Returns
    -------
    DataFrame
        Every column of every input, in input order (with ``on`` a string: the key once, first), then the
        entry's ``params["kept_column"]`` if set. Column
        names other than a shared key must not clash: rename them first. A stream is append-only: write
        it with ``outputMode("append")``.

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> from datetime import datetime
    >>> views = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 0))], "user long, view_ts timestamp")
    >>> clicks = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 3))], "user long, click_ts timestamp")
    >>> buys = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 30), 9.5)],
    ...                              "user long, buy_ts timestamp, amount double")
    >>> out = cq.multi_join([views, clicks, buys], "user", ["view_ts", "click_ts", "buy_ts"],
    ...                     [(0, 1, "0 seconds", "10 minutes"), (1, 2, "0 seconds", "1 hour")])
    >>> out.columns
    ['user', 'view_ts', 'click_ts', 'buy_ts', 'amount']
    >>> [(r.user, r.amount) for r in out.collect()]
    [(1, 9.5)]
    """
    spec = MultiJoinSpec.build(inputs, on, times, bounds, control, name, how, output_mode, constraints)
    spec.set_persistence(state_persistence, snapshot_every, state_dir)
    if not spec.stateless:   # a stateless stage runs one task per core whatever the session's partitions
        warn_shuffle_partitions(spec.inputs[0])
    return _execute(spec)


@dataclass
class MultiJoinSpec:
    """What the driver decided when the query was defined."""

    inputs: list = field(repr=False)
    keys: list[str]
    key_type: T.DataType
    times: list[str]
    bounds: tuple[tuple[int, int, int, int], ...]
    out: list[tuple[int, str]]            # output columns: (input, column)
    streaming: bool
    shards: int
    name: str
    control: ControlHandle | None
    kept_column: str | None = None        # the entry's params["kept_column"] when the query was defined
    how: tuple[str, ...] = ()             # per input after the first: "inner" or "left"
    output_mode: str = "append"           # the applyInPandasWithState's mode: the query's output mode
    constraints: tuple = ()               # stream constraints (STREAM §5.2), checked: pyspark_cq.constraints
    persistence: str = "full"             # state_persistence: "full", "changelog" or "files" (also for "stateless")
    snapshot_every: int = 10              # changelog / files: batches per snapshot (at most)
    state_dir: str | None = None          # files: the directory of the state files (absolute path or URI)
    retain: int = _changelog.RETAIN_DEFAULT   # files: the session's spark.sql.streaming.minBatchesToRetain
    stateless: bool = False               # state_persistence="stateless": a stateless stage, the files layout's state
    watermark_delays: tuple = ()          # stateless: each input's withWatermark delay (ms)
    watermark_policy: str = "min"         # stateless: spark.sql.streaming.multipleWatermarkPolicy

    def set_persistence(self, state_persistence, snapshot_every, state_dir=None) -> None:
        """Decide ``state_persistence`` / ``snapshot_every`` / ``state_dir`` (:func:`.._common.changelog.settings`:
        ValueError / TypeError naming the argument); batch inputs keep no state and ignore them.
        """
        if isinstance(state_persistence, str) and state_persistence == STATELESS:
            self._set_stateless(snapshot_every, state_dir)
            return
        if state_persistence is not None and state_persistence not in _changelog.CHOICES:
            raise ValueError(f"state_persistence must be one of {', '.join(map(repr, _changelog.CHOICES))}, "
                             f"{STATELESS!r} or None (the default, 'auto'), got {state_persistence!r}")
        persistence, every, state_dir, retain = _changelog.settings(
            state_persistence, snapshot_every, state_dir, streaming=self.streaming,
            session=self.inputs[0].sparkSession if self.streaming else None, name=self.name)
        if self.streaming:
            self.persistence, self.snapshot_every, self.state_dir, self.retain = persistence, every, state_dir, retain

    def _set_stateless(self, snapshot_every, state_dir) -> None:
        """``state_persistence="stateless"`` (:mod:`.._common.stateless`): the files layout's state in a stateless
        stage. Inner joins only (every ``how`` inner: a stateless stage runs a shard only when rows arrive, so a
        null-padded tuple could wait forever), in append mode, without ``constraints`` (not tried yet); each input
        has a watermark (checked when the spec was built). The state directory as for ``"auto"``, else
        ``state_dir=`` is required. Batch inputs keep no state and ignore it (the arguments are still checked).
        """
        _changelog.settings("files", snapshot_every, state_dir, streaming=False, session=None, name="")
        if any(h != "inner" for h in self.how):
            raise ValueError(f"state_persistence='stateless' runs inner multi_joins only (every how 'inner'; a "
                             f"stateless stage runs a shard only when rows arrive, so a tuple waiting to be output "
                             f"null-padded could wait forever); got how={list(self.how)}: use state_persistence="
                             f"'files' or None")
        if self.output_mode != "append":
            raise ValueError(f"state_persistence='stateless' runs output_mode='append' only (the query's output "
                             f"mode; the rows are append-only), got output_mode={self.output_mode!r}")
        if self.constraints:
            raise ValueError("state_persistence='stateless' does not take constraints= yet (their drops and arrival "
                             "trackers are untested without timeouts); drop one of them")
        if not self.streaming:
            return
        (self.persistence, self.snapshot_every, self.state_dir, self.retain, self.watermark_delays,
         self.watermark_policy) = stateless_settings(snapshot_every, state_dir, self.inputs[0].sparkSession, self.name,
                                                     zip(self.inputs, self.times))
        self.stateless = True

    @property
    def outer(self) -> int | None:
        """The left input when it is the last one and the only one, else None."""
        return self.n - 1 if self.how and self.how[-1] == "left" and not self.nested else None

    @property
    def nested(self) -> bool:
        """A left input before the last one (:mod:`.nested`)."""
        return "left" in self.how[:-1]

    @classmethod
    def build(cls, inputs, on, times, bounds, control, name, how=None, output_mode="append",
              constraints=None) -> MultiJoinSpec:
        """Check the arguments (TypeError / ValueError naming the argument) and decide."""
        inputs = _check_inputs(inputs)
        n = len(inputs)
        keys = _check_on(inputs, on)
        times = _check_times(inputs, times)
        streaming = inputs[0].isStreaming
        mixed = [i for i, df in enumerate(inputs) if df.isStreaming != streaming]
        if mixed:
            raise ValueError(f"inputs must be all streaming or all batch DataFrames; inputs[0].isStreaming="
                             f"{streaming} but inputs{mixed} differ")
        if streaming:
            for i, (df, t) in enumerate(zip(inputs, times)):
                _validate.require_watermark(df, t, f"times[{i}]")
        checked = _check_bounds(bounds, n)
        how = _check_how(how, n, checked)
        output_mode = _check_output_mode(output_mode, how)
        constraints = check_multi_constraints(constraints, keys, how, _key_type(inputs, keys))
        control = operator_handle(control, "multi_join")
        if name is None:
            name = control.operator if control is not None else "cq_multi_join"
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        entry = None
        if control is not None:  # a bad plan fails here, not in a task
            entry = control.entry(when="when the operator was defined")
            if entry is not None and entry.get("plan_id") is not None:
                parse_join_plan(entry.get("plan_id"), n, operator=f"multi_join {name!r}")
            if entry is not None:   # and a bad chunk schedule (params, docs/chain.md) or constraint switch
                schedule_from_params(entry.get("params"), step_names(n), where=f"multi_join {name!r}")
                control_enabled(entry.get("params"), constraints)
        out = _output_columns(inputs, on, keys)
        kept = _check_kept_column(entry, [c for _, c in out], name)
        _, shards = resolve_shards(None, MULTI_JOIN)
        return cls(inputs, keys, _key_type(inputs, keys), times, checked, out, streaming, shards, name, control,
                   kept, how, output_mode, constraints)

    @property
    def n(self) -> int:
        return len(self.inputs)

    def output_schema(self) -> T.StructType:
        fields = [T.StructField(c, self.inputs[i].schema[c].dataType, True) for i, c in self.out]
        if self.kept_column is not None:
            fields.append(T.StructField(self.kept_column, T.DoubleType(), True))
        return T.StructType(fields)

    def config(self) -> MultiJoinConfig:
        codecs = tuple(tuple(codecs_for(df.schema, df.columns, f"__cq_p{i}_")) for i, df in enumerate(self.inputs))
        key_pos = tuple(df.columns.index(k) for df, k in zip(self.inputs, self.keys))
        out = tuple((i, self.inputs[i].columns.index(c)) for i, c in self.out)
        z = self.outer
        outer_bounds = () if z is None else tuple(
            (i if j == z else j, _LEFT if j == z else _RIGHT, lo, up) for i, j, lo, up in self.bounds if z in (i, j))
        hows = ("first",) + tuple(self.how) if self.nested else ()
        orders = default_orders(self.n, self.bounds)
        orders = nested_orders(orders, hows) if self.nested else outer_last(orders, z)
        return MultiJoinConfig(self.n, codecs, key_pos, out, _metrics.arrow_schema(self.output_schema()),
                               self.bounds, orders, hashed=not isinstance(self.key_type, DIRECT), name=self.name,
                               control=self.control, shards=self.shards, kept=self.kept_column is not None,
                               outer=z, outer_bounds=outer_bounds, hows=hows,
                               retain=retention(self.n, self.bounds, hows) if self.nested else (),
                               constraints=self.constraints, persistence=self.persistence,
                               snapshot_every=self.snapshot_every, state_dir=self.state_dir, versions=self.retain,
                               state_id=uuid.uuid4().hex if self.persistence in _changelog.RESIDENT else "")


# --- argument checks -----------------------------------------------------------------------------------


def _check_inputs(inputs) -> list:
    if _validate.is_dataframe(inputs) or isinstance(inputs, (str, bytes)) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a list of 2 to {MAX_INPUTS} DataFrames, got {type(inputs).__name__}")
    if not 2 <= len(inputs) <= MAX_INPUTS:
        raise ValueError(f"inputs must be a list of 2 to {MAX_INPUTS} DataFrames, got {len(inputs)}")
    for i, df in enumerate(inputs):
        _validate.dataframe(df, f"inputs[{i}]")
    return list(inputs)


def _check_on(inputs, on) -> list[str]:
    n = len(inputs)
    if isinstance(on, str):
        for i, df in enumerate(inputs):
            _validate.column(df, on, f"on (inputs[{i}])")
        return [on] * n
    if _validate.is_column(on) or not isinstance(on, (list, tuple)):
        raise _validate.not_a_name(on, "on", f"a column name (str) or a list of {n} column names, one per input")
    if len(on) != n:
        raise ValueError(f"on must list one key column per input ({n}), got {len(on)}: {list(on)}")
    return [_validate.column(df, k, f"on[{i}]") for i, (df, k) in enumerate(zip(inputs, on))]


def _check_times(inputs, times) -> list[str]:
    n = len(inputs)
    if isinstance(times, str) or not isinstance(times, (list, tuple)):
        raise TypeError(f"times must be a list of {n} column names, one per input, got {times!r}")
    if len(times) != n:
        raise ValueError(f"times must list one time column per input ({n}), got {len(times)}: {list(times)}")
    kinds = [type(_validate.time_column(df, t, f"times[{i}]")) for i, (df, t) in enumerate(zip(inputs, times))]
    if len(set(kinds)) > 1:
        types = [inputs[i].schema[t].dataType.simpleString() for i, t in enumerate(times)]
        raise TypeError(f"times: the time columns must be all TIMESTAMP or all TIMESTAMP_NTZ, got {types}; cast "
                        f"them to one type first")
    return list(times)


def _check_bounds(bounds, n: int) -> tuple[tuple[int, int, int, int], ...]:
    if isinstance(bounds, (str, bytes)) or not isinstance(bounds, (list, tuple)) or not bounds:
        raise TypeError(f"bounds must be a non-empty list of (i, j, lower, upper), got {bounds!r}")
    out = []
    for b, item in enumerate(bounds):
        if isinstance(item, (str, bytes)) or not isinstance(item, (list, tuple)) or len(item) != 4:
            raise TypeError(f"bounds[{b}] must be (i, j, lower, upper), got {item!r}")
        i, j, lower, upper = item
        for pos, v in (("i", i), ("j", j)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise ValueError(f"bounds[{b}]: {pos} must be an input index in 0..{n - 1}, got {v!r}")
        if i == j:
            raise ValueError(f"bounds[{b}]: i and j must be two different inputs, got {i} twice")
        lo = parse_duration(lower, f"bounds[{b}] lower")
        hi = parse_duration(upper, f"bounds[{b}] upper")
        if lo > hi:
            raise ValueError(f"bounds[{b}]: lower must be <= upper, got lower={lower!r} and upper={upper!r}")
        out.append((i, j, lo, hi))
    d = closure(n, out)
    unreached = [j for j in range(n) if d[0][j] == float("inf") or d[j][0] == float("inf")]
    if unreached:
        raise ValueError(f"bounds must connect all inputs: no bound links inputs {unreached} to input 0 "
                         f"(directly or through other inputs); add a bound for each")
    if any(d[i][i] < 0 for i in range(n)):
        raise ValueError("bounds contradict each other: no tuple of times satisfies all of them")
    return tuple(out)


#: ``how`` per input after the first, with Spark's other spelling of a left outer join.
HOWS = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left"}
#: Output modes (``output_mode``); ``"update"`` only where Spark's own stream-stream join allows it.
OUTPUT_MODES = ("append", "update")


def _check_how(how, n: int, bounds=()) -> tuple[str, ...]:
    """``how`` as one ``"inner"`` / ``"left"`` per input after the first (None: all inner). With a left input
    before the last, every input after the first needs a bound to an earlier one: the time condition of its join
    in the chain, by which the watermark proves that no row can match a tuple any more.
    """
    form = (f"a list of {n - 1} join types, one per input after the first, each 'inner' or 'left' (e.g. "
            f"{['inner'] * (n - 2) + ['left']})")
    if how is None:
        return ("inner",) * (n - 1)
    if isinstance(how, (str, bytes)) or not isinstance(how, (list, tuple)):
        raise TypeError(f"how must be {form}, got {how!r}")
    if len(how) != n - 1:
        raise ValueError(f"how must be {form}, got {len(how)} item(s): {list(how)}")
    out = []
    for k, h in enumerate(how):
        if not isinstance(h, str) or h.lower() not in HOWS:
            raise ValueError(f"how[{k}] (input {k + 1}) must be 'inner' or 'left', got {h!r}")
        out.append(HOWS[h.lower()])
    if "left" in out[:-1]:
        loose = [j for j in range(1, n) if not any(max(a, b) == j and min(a, b) < j for a, b, *_ in bounds)]
        if loose:
            raise ValueError(f"how={list(how)} with a left input before the last needs, for every input after the "
                             f"first, a bound to an earlier input (its join's time condition in the chain); inputs "
                             f"{loose} have none: add bounds (i, j, lower, upper) with i < j for them")
    return tuple(out)


def check_multi_constraints(constraints, keys: list[str], how: tuple[str, ...] = (), key_type=None) -> tuple:
    """``constraints=`` of :func:`multi_join` checked (:func:`pyspark_cq.constraints.check_constraints`, inputs by
    index, ``keys`` the key column of each input, ``key_type`` their Spark type) and refused where the operator
    cannot honour them yet.
    """
    from ...constraints import check_constraints

    checked = check_constraints(constraints, {i: [k] for i, k in enumerate(keys)}, "multi_join", arrival=True)
    if isinstance(key_type, (T.FloatType, T.DoubleType)) and any(c.kind == "ordered" for c in checked):
        raise ValueError(f"constraints: ordered() compares join keys, and {list(keys)!r} are floating point (NaN has "
                         "no order); use integer, decimal, string, date or timestamp keys")
    if checked and "left" in how[:-1]:
        raise ValueError(f"constraints: multi_join takes constraints on inner joins and with the last input left "
                         f"only, but how={list(how)} has a left input before the last (its entries with nulls wait "
                         f"for rows of later inputs, for which no drop rule is derived: docs/constraints.md); drop "
                         f"that left input from how or the constraints")
    return checked


def _check_output_mode(output_mode, how: tuple[str, ...]) -> str:
    """``output_mode``: the streaming query's output mode, which Spark requires the stateful stage to declare."""
    if not isinstance(output_mode, str) or output_mode.lower() not in OUTPUT_MODES:
        raise ValueError(f"output_mode must be 'append' or 'update' (the mode the query is written with), "
                         f"got {output_mode!r}")
    output_mode = output_mode.lower()
    if output_mode == "update" and "left" in how:
        raise ValueError("output_mode='update' with a left input: Spark 4.3 runs outer stream-stream joins in "
                         "append mode only (as its own LeftOuter join); write with outputMode('append')")
    return output_mode


def _check_kept_column(entry, taken: list[str], name: str) -> str | None:
    """The entry's ``params["kept_column"]`` (None without it): a new output column name. The output schema
    is fixed when the query is defined, so this is the one moment it is read.
    """
    value = ((entry.get("params") or {}) if entry is not None else {}).get("kept_column")
    if value is not None and (not isinstance(value, str) or not value or value in taken):
        raise ValueError(f"multi_join {name!r}: params['kept_column'] must be a new column name (not one of the "
                         f"output's {taken}), got {value!r}")
    return value


def _key_type(inputs, keys) -> T.DataType:
    types = [df.schema[k].dataType for df, k in zip(inputs, keys)]
    if all(isinstance(t, T.IntegralType) for t in types):
        return T.LongType()
    if any(t != types[0] for t in types):
        raise TypeError(f"on: the key columns have different types {[t.simpleString() for t in types]}; cast "
                        f"them to one type first")
    if isinstance(types[0], (T.ArrayType, T.MapType, T.StructType, T.NullType)):
        raise TypeError(f"on: key columns of type {types[0].simpleString()} are not supported")
    return types[0]


def _output_columns(inputs, on, keys) -> list[tuple[int, str]]:
    """(input, column) of every output column; raises on names that clash."""
    shared = isinstance(on, str)
    out = [(0, on)] if shared else []
    for i, df in enumerate(inputs):
        out += [(i, c) for c in df.columns if not (shared and c == on)]
    names = [c for _, c in out]
    clash = sorted({c for c in names if names.count(c) > 1})
    if clash:
        where = {c: [i for i, x in out if x == c] for c in clash}
        c0 = clash[0]
        raise ValueError(f"inputs: the output would have the column(s) {clash} more than once (in inputs "
                         f"{where}); rename them first, e.g. inputs[{where[c0][1]}].withColumnRenamed("
                         f"{c0!r}, {c0 + '_' + str(where[c0][1])!r})")
    return out


# --- Spark wiring --------------------------------------------------------------------------------------


def _micros(col, dtype):
    """Epoch microseconds of a time column (TIMESTAMP_NTZ: of its wall-clock time, no time zone)."""
    if isinstance(dtype, T.TimestampNTZType):
        return F.timestamp_diff("MICROSECOND", F.lit("1970-01-01 00:00:00").cast("timestamp_ntz"), col)
    return F.unix_micros(col)


def _kernel_key(col, key_type):
    """The int64 the kernel compares: the value itself for :data:`DIRECT` types, else Spark's xxhash64
    of the normalised key (matches are then checked on the values).
    """
    col = col.cast(key_type)
    if isinstance(key_type, T.DateType):
        return F.unix_date(col).cast("long")
    if isinstance(key_type, T.TimestampType):
        return F.unix_micros(col)
    if isinstance(key_type, DIRECT):
        return col.cast("long")
    return F.xxhash64(normalized_key(col, key_type))


def _tagged(spec: MultiJoinSpec, config: MultiJoinConfig, i: int):
    df = spec.inputs[i]
    ref = _validate.ref
    key = ref(spec.keys[i])
    kernel_key = F.coalesce(_kernel_key(key, spec.key_type), F.lit(0).cast("long"))
    cols = [F.lit(i).cast("byte").alias(SIDE),
            shard_key_column(F.xxhash64(kernel_key), spec.shards).alias(SHARD),
            ref(spec.times[i]).alias(TIME),
            checked_micros(_micros(ref(spec.times[i]), df.schema[spec.times[i]].dataType), spec.name,
                           f"times[{i}]", spec.times[i]).alias(MICROS),
            kernel_key.alias(KEY), key.isNull().alias(KEY_NULL)]
    for s, codecs in enumerate(config.codecs):
        src = spec.inputs[s]
        for codec, c in zip(codecs, src.columns):
            cols += codec.spark_columns(ref(c) if s == i else None)
    return df.select(*cols)


def _execute(spec: MultiJoinSpec):
    load("_mjoin")  # fail on the driver, readably, if the build is broken
    config = spec.config()
    worker = MultiJoinWorker(config)
    metrics = metric_names(spec.n, spec.outer is not None or spec.nested, bool(spec.constraints),
                           config.resident)
    union = _tagged(spec, config, 0)
    for i in range(1, spec.n):
        union = union.union(_tagged(spec, config, i))
    if spec.streaming:
        from pyspark.sql.streaming.state import GroupStateTimeout

        state_schema = T.StructType([T.StructField("kernel", T.BinaryType(), True)] + [
            T.StructField(f"input{i}", T.BinaryType(), True) for i in range(spec.n)] + (
            [T.StructField("pending", T.BinaryType(), True)] if spec.outer is not None or spec.nested else []))
        # rows reaching the stateful stage, in all and per input: read_metrics reports those Spark dropped
        # as late (late_rows, late_rows_<i>)
        arrived = _metrics.observe_input(union, spec.name, per=(SIDE, spec.n))
        if spec.stateless:   # no stateful operator: spark.sql.shuffle.partitions does not matter
            shards = StatelessShards(worker, spec.watermark_delays, spec.watermark_policy,
                                     f"multi_join {spec.name!r}", doc="docs/multi_join.md", shard=SHARD, micros=MICROS)
            packed = arrived.repartition(stage_partitions(spec.inputs[0], spec.shards), F.col(SHARD)).mapInPandas(
                shards, _metrics.packed_schema(spec.output_schema(), metrics))
            return _metrics.attach_packed(packed, spec.name, spec.output_schema(), metrics,
                                          peaks=PEAKS + band_names(spec.n))
        packed = arrived.groupBy(SHARD).applyInPandasWithState(
            worker.streaming, _metrics.packed_schema(spec.output_schema(), metrics), state_schema, spec.output_mode,
            GroupStateTimeout.EventTimeTimeout)
    else:
        # A plain 1-argument function: Spark picks (pdf) or (key, pdf) by counting parameters.
        packed = union.groupBy(SHARD).applyInPandas(lambda pdf: worker.batch(pdf),
                                                    _metrics.packed_schema(spec.output_schema(), metrics))
    return _metrics.attach_packed(packed, spec.name, spec.output_schema(), metrics, peaks=PEAKS + band_names(spec.n))
