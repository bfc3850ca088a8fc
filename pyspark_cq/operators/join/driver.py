"""Interval and window stream-stream joins with native symmetric hash state (PIPES, §2.4, §3.6.3).

The join state follows Cammert, Krämer, Seeger and Vaupel, "A Cost Model for Adaptive Resource
Management in Data Stream Systems" (PIPES): per input a hash table from the join key to its rows, and
the rows linked by expiry time (sorted runs, §3.4.1), so temporal expiration (§2.4.4) touches only the
rows it removes. The kernel is :mod:`pyspark_cq._join` (C++, ``native/join_core.hpp``); this module
wires it into Spark (the driver side): the argument checks are in :mod:`.spec`, the per-group
function that runs on Spark's Python workers in :mod:`.worker`.

Data path (one streaming micro-batch)::

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

With a control table (``control=``, :mod:`pyspark_cq.control`) the bounds (or the window) may
change while the query runs. Following PIPES §4.2 a change applies to elements whose timestamp is at
or after its application time; every stored row keeps the band of its own timestamp and a pair is
decided by the band of the earlier element (§2.4.1). Load shedding (``drop_ratio``, PIPES §5.3; one ratio
or one per input, RTStream §4.4) drops input rows by a deterministic hash before they are inserted or
probed and counts them as ``shed_rows``.
"""
from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..._duration import parse_duration
from ..._native import load
from ..._validate import ref
from .._common import metrics as _metrics
from .._common.codec import ColumnCodec, checked_micros, codecs_for, normalized_key
from .._common.partitions import stage_partitions, warn_shuffle_partitions
from .._common.payload import SIDE
from .._common.shards import shard_key_column
from .bucket import BUCKET, OWN, own_column, targets_column
from .spec import JoinSpec
from .worker import BATCH_METRICS, LEFT, METRICS, MICROS, RIGHT, SHARD, SHED_METRICS, TIME, JoinConfig, JoinWorker

__all__ = ["interval_join", "window_join", "window_band"]

_STATE_SCHEMA = T.StructType([T.StructField("kernel", T.BinaryType(), True),
                              T.StructField("left", T.BinaryType(), True),
                              T.StructField("right", T.BinaryType(), True)])


def interval_join(left, right, on=None, left_time=None, right_time=None, lower=None, upper=None, how="inner", *,
                  left_on=None, right_on=None, suffixes=None, shards=None, grouping=None, name=None, control=None,
                  drop_ratio=0.0, seed=0, kept_column=None, bucket=None, state_persistence=None, snapshot_every=10,
                  state_dir=None, constraints=None, output_mode="append"):
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
        a null key never matches). Output once. Give either ``on`` or ``left_on`` / ``right_on``.
    left_time, right_time : str
        Timestamp columns of ``left`` and ``right`` (required).
    lower, upper : str, datetime.timedelta or numpy.timedelta64
        The band, e.g. ``"-10 seconds"`` and ``"1 minute"``; ``lower <= upper`` (required).
    how : {"inner", "left", "right", "full", "left_semi", "left_anti"}
        Join type, with Spark's names (also ``"left_outer"``, ``"outer"``, ``"semi"``, ``"anti"``, ...).
        Outer joins emit an unmatched row (null-padded) once the watermark guarantees that no match can
        come, as Spark does; on batch inputs at once. ``"left_semi"`` outputs each left row that has a
        match once, at its first match (Spark's stream-stream semi join); ``"left_anti"`` each left row
        that never matched, when it is evicted (as a left outer join's unmatched rows). Both output the
        left columns only, in the left input's order.
    left_on, right_on : str or list of str, optional
        Key columns named differently on the two sides, paired in order (``left_on[i] = right_on[i]``).
        A pair with one name is output once (as with ``on``); a pair with two names keeps both columns,
        each among its side's columns.
    suffixes : tuple of (str, str), optional
        Appended to non-key columns that exist on both sides (left, right), e.g. two time columns
        named ``ts``. Default ``("_left", "_right")``.
    shards : int, "key" or None
        Number of state shards (groups of ``applyInPandasWithState``), each keeping one native table
        for many keys; None (default): twice ``spark.sql.shuffle.partitions`` when the query is
        defined. ``"key"`` groups the state by the raw key instead, one state per key (kept for
        comparison; see docs/join.md for the numbers). The same knob as
        :func:`~pyspark_cq.sliding_aggregate`'s. A checkpoint keeps its count: restoring it with
        another raises ValueError.
    grouping : {"shard", "key"}, optional
        Deprecated (DeprecationWarning; removed in the next release): ``grouping="key"`` is
        ``shards="key"``, ``grouping="shard"`` the default layout.
    name : str, optional
        Name under which the per-batch counters are observed (``pyspark_cq.read_metrics``):
        input_rows, output_rows, state_rows, state_bytes, evicted_rows, late_rows, malformed_rows,
        shed_rows, shed_rows_left, shed_rows_right; streaming also state_cache_hits, state_cache_misses,
        state_cache_catch_ups, constraint_violations. Default: the control handle's operator id, else
        ``"cq_interval_join"``. Read them with ``cq.read_metrics``: ``late_rows`` is only complete there
        (Spark drops late rows before the operator's function, so
        ``progress.observedMetrics[name]["late_rows"]`` is always 0; ``read_metrics`` adds the rows counted
        under ``<name>__input`` that never reached it).
    control : pyspark_cq.control.ControlHandle, optional
        The operator's control-table entry (``ctx.control(op_id)``, ``ControlTable(path).handle(op_id)``
        or ``ControlHandle(path, op_id)``), read at every micro-batch. Its ``lower`` / ``upper``
        schedules override the arguments per element (PIPES §4.2: a change applies to rows whose
        timestamp is at or after its application time); a pair is decided by the bounds in force at the
        earlier row's timestamp. Its ``drop_ratio`` overrides the argument for both inputs, and its
        ``params["drop_left"]`` / ``params["drop_right"]`` override that for one input (RTStream §4.4:
        per-input ratios from the query's input/quality table; docs/rtstream.md, *Joins*).
    drop_ratio : float or (float, float)
        Load shedding (PIPES §5.3): the probability in [0, 1) with which each input row is dropped before
        it is inserted or probed, one for both inputs or a ``(left, right)`` pair; counted as
        ``shed_rows`` (``shed_rows_left`` / ``shed_rows_right`` per input).
    seed : int
        Seed of the shedding decisions, which hash (seed, side, time, key, payload) so that a restart
        from a checkpoint drops the same rows.
    kept_column : str, optional
        Adds a double column of that name: the fraction of the input that load shedding kept for the row
        (Wei et al., RTStream §4.4: each result says what fraction of its input it reflects). Every input
        row is kept with probability ``ε = 1 − drop_ratio`` of its input and micro-batch, so a pair gets
        the product ``ε_left·ε_right`` of its two rows' ε (both had to be kept), an unmatched row of an
        outer join and a semi or anti join's left row their own; 1.0 without shedding. A downstream
        estimate of a count divides by it. Recorded in the state: a checkpoint keeps it (restoring with
        another raises ValueError).
    bucket : None, "auto" or duration, optional
        Streaming inner joins: keep the state per (key shard, time bucket of width ``bucket``) instead of
        per key shard, so that a micro-batch moves only the buckets near its rows between the JVM and
        Python, not the whole state (docs/join.md, *Time buckets*). ``"auto"``: ``max(3 * (upper -
        lower), 1 second)``. None (default): the shard layout. Results are the same. Refused (ValueError) with
        another ``how``, ``control`` or ``shards="key"``; ignored on batch inputs. A checkpoint keeps
        its layout and width: restoring it with another is refused.
    state_persistence : {None, "auto", "full", "changelog", "files", "stateless"}, optional
        How a streaming join keeps each shard's state between micro-batches (docs/join.md, *State
        persistence*). ``"auto"`` (None, the default): ``"files"`` under ``state_dir`` or, without one,
        under ``<spark.sql.streaming.checkpointLocation or spark.sql.warehouse.dir>/pyspark_cq_state/<query
        id>/<name>`` where every executor reaches that directory (a local master, or a warehouse on a shared
        file system); ``"full"`` otherwise and where ``"files"`` is refused. ``"full"``: the whole state image is
        rebuilt from Spark's state and written back every batch. ``"changelog"``: the state stays resident
        in the Python worker between batches (used only when its version token equals the one in Spark's
        state, so a copy from a retried batch or another query is never used) and a batch appends only
        what it changed (rows stored, the eviction watermark) to the state value, with a new snapshot every
        ``snapshot_every`` batches; the counters ``state_cache_hits`` / ``state_cache_misses`` say how
        often the resident copy was used. ``"files"``: as ``"changelog"``, but the snapshots and deltas are
        immutable files under ``state_dir`` and Spark's state holds only a small manifest naming them, so
        a batch no longer copies the state through the JVM; a resident copy one or more versions behind is
        brought up to date with the delta files it missed (``state_cache_catch_ups``). Results are the
        same; a checkpoint may switch between the three. Refused (ValueError) with ``bucket`` (and
        ``"files"`` with ``shards="key"``); ignored on batch inputs. ``"stateless"`` (inner joins): the
        files layout's state in a stateless stage (``repartition`` by shard, one task per core, and
        ``mapInPandas``; ``shards=None`` is 8), no stateful Spark operator, so the session's
        ``spark.sql.shuffle.partitions`` does not matter; the join reads Spark's watermark from the query's
        offset log (computes it under Spark Connect), drops late rows itself, and runs a shard only when rows
        arrive for it (docs/join.md, *A stateless stage*). Keep it for the life of a checkpoint.
    snapshot_every : int
        ``"changelog"`` / ``"files"``: write a new snapshot at the latest every this many micro-batches
        (>= 1; default 10), earlier when the deltas exceed half of it.
    state_dir : str, optional
        ``"files"``: the directory of the state files, one per operator of one query (like a checkpoint
        location; a path every executor shares, or a URI pyarrow understands). Default for ``"files"``:
        ``<spark.sql.streaming.checkpointLocation>/pyspark_cq_state/<name>`` when the session sets that
        option, otherwise required (ValueError); for ``"auto"`` see above (two joins of one query need distinct
        names). Another layout restoring a checkpoint written by ``"files"`` needs it too.
    constraints : list of pyspark_cq.constraints.Constraint, optional
        What the inputs are known to satisfy (STREAM §5.2): ``unique(side, cols)`` on join-key columns,
        ``many_to_one(child, parent, delay)``, ``clustered(side, k)`` and ``ordered(side, k)``. A streaming join
        drops the state they make useless (a row whose one partner has matched, a many-to-one child after its delay
        bound, the other input's rows of a key the clustered / ordered input brings no more); while the inputs
        adhere the output is the same, a row that breaks one is counted (``constraint_violations``) and may miss
        matches (docs/constraints.md). A control entry's ``params["constraint_<name>"]`` (a bool, e.g.
        ``constraint_unique_right``) turns one off or on. ``clustered`` / ``ordered`` need the default full state
        and no ``bucket``; ignored on batch inputs.
    output_mode : {"append", "update"}
        The output mode the streaming query will be written with (Spark requires the stateful stage to
        declare it; default ``"append"``). ``"update"`` where Spark 4.3 runs its own stream-stream join in
        update mode: ``how="inner"`` and ``"left_semi"``. The rows are the same in both modes. With an
        aggregation after the join keep ``"append"`` whatever the query's mode (Spark refuses an update-mode
        stateful stage before an aggregation).

    Returns
    -------
    DataFrame
        The key columns named alike on both sides once, then the other left columns, then the other right
        columns (semi / anti: the left columns). A stream is
        append-only: write it with the ``output_mode`` given (Spark rejects another mode at ``start()``,
        docs/join.md, *Output mode*).

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> from datetime import datetime
    >>> clicks = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 0, 5)), (2, datetime(2024, 1, 1, 12, 1))],
    ...                                "user long, ts timestamp")
    >>> views = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 0), "home"),
    ...                                (2, datetime(2024, 1, 1, 12, 5), "cart")],
    ...                               "user long, ts timestamp, page string")
    >>> pairs = cq.interval_join(clicks, views, "user", "ts", "ts", "-10 seconds", "10 seconds", how="left",
    ...                          suffixes=("_click", "_view"))
    >>> pairs.columns
    ['user', 'ts_click', 'ts_view', 'page']
    >>> [(r.user, r.page) for r in pairs.orderBy("user").collect()]
    [(1, 'home'), (2, None)]
    """
    spec = JoinSpec.build(left, right, on, left_time, right_time, how, suffixes, shards, grouping, name,
                          window=None, control=control, drop_ratio=drop_ratio, seed=seed, function="interval_join",
                          left_on=left_on, right_on=right_on, kept_column=kept_column)
    for value, arg in ((lower, "lower"), (upper, "upper")):
        if value is None:
            raise TypeError(f"{arg} is required: a duration such as '-10 seconds' (docs/errors.md, *Durations*)")
    lo = parse_duration(lower, "lower")
    hi = parse_duration(upper, "upper")
    if lo > hi:
        raise ValueError(f"lower must be <= upper, got lower={lower!r} and upper={upper!r}")
    spec.lower, spec.upper = lo, hi
    spec.set_bucket(bucket, control)
    spec.set_persistence(state_persistence, snapshot_every, state_dir)
    spec.set_constraints(constraints)
    spec.set_output_mode(output_mode)
    if not spec.stateless:
        warn_shuffle_partitions(left)
    return _execute(spec)


def window_join(left, right, on=None, left_time=None, right_time=None, left_window=None, right_window=None, *,
                left_on=None, right_on=None, suffixes=None, shards=None, grouping=None, name=None, control=None,
                drop_ratio=0.0, seed=0, kept_column=None, state_persistence=None, snapshot_every=10,
                state_dir=None, output_mode="append", constraints=None):
    """Window join of PIPES (Cammert et al., §2.4.1–§2.4.2): keys equal and validities intersect.

    Each row is valid during ``[t, t + window)`` (the time-based window operator ω, §2.4.2). A left
    and a right row join when their keys are equal and their validities intersect; the result carries
    the intersection as ``valid_from`` / ``valid_to`` (§2.4.1). This is the interval join with
    ``lower = -right_window + 1 µs`` and ``upper = left_window - 1 µs``.

    Parameters
    ----------
    left, right, on, left_time, right_time, left_on, right_on, suffixes, shards, grouping, drop_ratio, seed
    kept_column, state_persistence, snapshot_every, state_dir, output_mode, constraints
        As for :func:`interval_join` (``constraints``: docs/constraints.md; CQL's ``WITH (CONSTRAINT …)``).
    left_window, right_window : str, datetime.timedelta or numpy.timedelta64
        Positive window sizes of the two inputs.
    name : str, optional
        As for :func:`interval_join`; default the control handle's operator id, else
        ``"cq_window_join"``.
    control : pyspark_cq.control.ControlHandle, optional
        As for :func:`interval_join`, with the parameter ``window``: when the entry has it, its schedule
        sets the window of *both* inputs per element (§4.2: a row keeps the window in force at its
        timestamp; the earlier row of a pair decides whether the validities intersect, and
        ``valid_to`` uses each row's own window). Without it the arguments apply.

    Returns
    -------
    DataFrame
        As :func:`interval_join` (inner), plus ``valid_from`` and ``valid_to`` (timestamps).

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> from datetime import datetime
    >>> left = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 0, 0), "a")], "k long, ts timestamp, lv string")
    >>> right = spark.createDataFrame([(1, datetime(2024, 1, 1, 12, 0, 20), "b"),
    ...                                (1, datetime(2024, 1, 1, 12, 1), "c")], "k long, ts timestamp, rv string")
    >>> out = cq.window_join(left, right, "k", "ts", "ts", "30 seconds", "1 minute", suffixes=("_l", "_r"))
    >>> [(r.lv, r.rv, (r.valid_to - r.valid_from).total_seconds()) for r in out.collect()]
    [('a', 'b', 10.0)]
    """
    for value, arg in ((left_window, "left_window"), (right_window, "right_window")):
        if value is None:
            raise TypeError(f"{arg} is required: a positive duration such as '30 seconds'")
    wl = parse_duration(left_window, "left_window", allow_negative=False, allow_zero=False)
    wr = parse_duration(right_window, "right_window", allow_negative=False, allow_zero=False)
    spec = JoinSpec.build(left, right, on, left_time, right_time, "inner", suffixes, shards, grouping, name,
                          window=(wl, wr), control=control, drop_ratio=drop_ratio, seed=seed,
                          function="window_join", left_on=left_on, right_on=right_on, kept_column=kept_column)
    spec.lower, spec.upper = window_band(wl, wr)
    spec.set_persistence(state_persistence, snapshot_every, state_dir)
    spec.set_constraints(constraints, "window_join")
    spec.set_output_mode(output_mode)
    if not spec.stateless:
        warn_shuffle_partitions(left)
    return _execute(spec)


def window_band(left_window: int, right_window: int) -> tuple[int, int]:
    """The interval join band ``(lower, upper)`` (µs, inclusive) of a window join: validities ``[t, t + w)``
    intersect exactly when ``-right_window < t_right - t_left < left_window`` (PIPES, Cammert et al., §2.4.1).
    """
    return -right_window + 1, left_window - 1


# --- Spark wiring ------------------------------------------------------------------------------------


def _tagged(spec: JoinSpec, side: int, streaming_union: bool):
    """One input in the transport layout (side flag, shard, time, keys, payload of one or both sides)."""
    df = spec.left if side == LEFT else spec.right
    time_col = spec.left_time if side == LEFT else spec.right_time
    keys = spec.left_keys if side == LEFT else spec.right_keys
    key_codecs = codecs_for(df.schema, keys, "__cq_k")
    cols = [F.lit(side).cast("byte").alias(SIDE)]
    norm = [normalized_key(ref(k).cast(t), t) for k, t in zip(keys, spec.key_types)]
    if spec.layout == "shard":
        cols.append(shard_key_column(F.xxhash64(*norm), spec.shards).alias(SHARD))
    else:
        cols += [n.alias(f"__cq_g{i}") for i, n in enumerate(norm)]
    argument = "left_time" if side == LEFT else "right_time"
    cols += [ref(time_col).alias(TIME),
             checked_micros(F.unix_micros(ref(time_col)), spec.name, argument, time_col).alias(MICROS)]
    for codec, k, t in zip(key_codecs, keys, spec.key_types):
        cols += ColumnCodec(codec.name, t, codec.flagged).spark_columns(ref(k).cast(t))
    for s in ((LEFT, RIGHT) if streaming_union else (side,)):
        src = spec.left if s == LEFT else spec.right
        others = spec.left_others if s == LEFT else spec.right_others
        for codec, c in zip(codecs_for(src.schema, others, f"__cq_p{s}_"), others):
            cols += codec.spark_columns(ref(c) if s == side else None)
    return df.select(*cols)


def _group_cols(spec: JoinSpec) -> list[str]:
    if spec.bucket_width is not None:
        return [SHARD, BUCKET]
    return [SHARD] if spec.layout == "shard" else [f"__cq_g{i}" for i in range(len(spec.left_keys))]


def _with_buckets(union, spec: JoinSpec):
    """The tagged union with each row's own bucket and one row per bucket it goes to (itself in its own
    bucket, probe copies in the others: :mod:`.bucket`).
    """
    w, micros = spec.bucket_width, F.col(MICROS)
    targets = F.when(F.col(SIDE) == LEFT, targets_column(micros, LEFT, spec.lower, spec.upper, w)) \
        .otherwise(targets_column(micros, RIGHT, spec.lower, spec.upper, w))
    return union.select("*", own_column(micros, w).alias(OWN), F.explode(targets).alias(BUCKET))


def _execute(spec: JoinSpec):
    load("_join")  # fail on the driver, readably, if the build is broken
    out_schema = spec.output_schema()
    worker = JoinWorker(JoinConfig.of(spec))
    if spec.streaming:
        from pyspark.sql.streaming.state import GroupStateTimeout

        union = _tagged(spec, LEFT, True).union(_tagged(spec, RIGHT, True))
        union = _metrics.observe_input(union, spec.name)   # before the bucket copies: they are no input
        if spec.stateless:   # no stateful operator: spark.sql.shuffle.partitions does not matter (.stateless)
            from .._common.stateless import StatelessShards

            shards = StatelessShards(worker, spec.watermark_delays, spec.watermark_policy, f"join {spec.name!r}",
                                     doc="docs/join.md", shard=SHARD, micros=MICROS)
            packed = union.repartition(stage_partitions(spec.left, spec.shards), F.col(SHARD)).mapInPandas(
                shards, _metrics.packed_schema(out_schema, METRICS))
            return _metrics.attach_packed(packed, spec.name, out_schema, METRICS)
        if spec.bucket_width is not None:
            union = _with_buckets(union, spec)
        packed = union.groupBy(*_group_cols(spec)).applyInPandasWithState(
            worker.streaming, _metrics.packed_schema(out_schema, METRICS), _STATE_SCHEMA, spec.output_mode,
            GroupStateTimeout.EventTimeTimeout)
        return _metrics.attach_packed(packed, spec.name, out_schema, METRICS)
    else:
        lt = _tagged(spec, LEFT, False).groupBy(*_group_cols(spec))
        rt = _tagged(spec, RIGHT, False).groupBy(*_group_cols(spec))
        # A plain 3-argument function: Spark picks (key, left, right) by counting parameters.
        raw = lt.cogroup(rt).applyInPandas(lambda key, lpdf, rpdf: worker.batch(lpdf, rpdf),
                                           _metrics_schema(out_schema))
    cols = [_metrics.PREFIX + m for m in BATCH_METRICS]
    return _metrics.attach(raw, spec.name, counters={m: F.sum(c) for m, c in zip(BATCH_METRICS, cols)},
                          keep=~F.col(_metrics.METRICS_ROW), drop=[_metrics.METRICS_ROW] + cols)


def _metrics_schema(out_schema: T.StructType) -> T.StructType:
    """The shared report columns plus the join's own ``shed_rows`` (in all and per input)."""
    schema = _metrics.metrics_schema(out_schema)
    return T.StructType(list(schema.fields) + [T.StructField(_metrics.PREFIX + m, T.LongType(), True)
                                               for m in SHED_METRICS])

