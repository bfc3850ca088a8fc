"""Split-based sliding-window aggregation (Cammert et al., PIPES, Algorithm 1) on Spark DataFrames."""
from __future__ import annotations

import math
import numbers

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from ..._duration import parse_duration
from ..._native import load
from ...control import operator_handle
from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common import offsets as _offsets
from .._common.partitions import stage_partitions, warn_shuffle_partitions
from .._common.shards import AGGREGATE, resolve_shards, shard_key_column
from .config import (
    BAD,
    HASH,
    KHASH,
    SHARD,
    SHED_COL,
    START,
    TIME,
    AggConfig,
    batch_params,
    key_name,
    null_name,
    partial_name,
    value_name,
)
from .config import METRICS as AGG_METRICS
from .slicer import Slicer
from .spec import (
    NATIVE_ONLY_OPS,
    OP_COUNT,
    OP_MAX_F,
    OP_MAX_I,
    OP_MIN_F,
    OP_MIN_I,
    OP_ROWS,
    OP_SUM_F,
    OP_SUM_HI,
    OP_SUM_I,
    OUT_COUNT,
    AggSpec,
    Output,
    has_high_half,
    key_columns,
    parse_aggs,
    with_kept,
)
from .transport import StatefulShard, batch_function

__all__ = ["sliding_aggregate"]

EMIT_MODES = ("windows", "changes")
OUTPUT_MODES = ("append", "update", "complete")
STATE_HOMES = ("groupstate", "tws", "files")
_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Hidden column of ``output_mode="complete"``: a window's count(*), which grows with every update of it.
_ROWS = "__cq_rows"
#: Name of the per-batch report when neither ``name`` nor ``control`` is given.
DEFAULT_NAME = "cq_sliding_aggregate"
STATE_SCHEMA = "blob binary, keys binary"
#: Streams in the shard layout pack their slices (AggConfig.packed_schema). False: one row per slice, the
#: transport before 2026-11-27, kept so that benchmarks/perf/small_batches.py --row-slices can compare both.
_PACK_SLICES = True
_I64_MAX, _I64_MIN = 2**63 - 1, -(2**63)


def sliding_aggregate(df, time, window, slide=None, by=(), aggs=None, granularity=None, emit="windows", *,
                      output_mode="append", shards=None, name=None, control=None, state="groupstate",
                      kept_column=None, state_dir=None, tasks=None):
    """Sliding-window aggregation over slices, exact against Spark's ``window()`` aggregation.

    Spark evaluates ``groupBy(window(time, W, S), *by).agg(...)`` by copying every row into each of its
    ``ceil(W/S)`` windows. This operator follows PIPES instead (Cammert, Kraemer, Seeger, Vaupel, "A Cost
    Model for Adaptive Resource Management in Data Stream Systems": Algorithm 1, split-based scalar
    aggregation, §2.4.1; granularity Γ, §2.4.3): with time granularity ``g`` every split point of the
    validity intervals lies on the grid ``g·Z``, so the state of a group is one partial aggregate per
    granule ("slice") and every window is a run of slices. Rows are pre-aggregated into slices by a
    stateless vectorised map step; a stateful step per hash shard of the keys merges slices into a
    native table and sweeps windows with subtract-on-evict (counts, integer sums) and two-stacks queues
    (min, max, floating sums), so each slice costs O(1) amortized whatever ``W/S`` is. The state per
    group is about ``(W + watermark delay) / g`` slices (PIPES Cost Formula 5 and memory formula (15)
    with ``d < l``: one aggregate per occupied granule), hence a coarser granularity means less state.

    Parameters
    ----------
    df : DataFrame
        Batch or streaming input. A streaming input in append mode needs a watermark on ``time``
        (``withWatermark``).
    time : str
        Event-time column (timestamp or timestamp_ntz). Rows with a null time are dropped, as by Spark's
        ``window()``, and reported as ``malformed_rows``.
    window : str or datetime.timedelta
        Window size ``W``, positive.
    slide : str or datetime.timedelta, optional
        Slide ``S`` with ``0 < S <= W``; None means tumbling windows (``S = W``). ``W`` need not be a
        multiple of ``S`` (windows are ``[k·S, k·S + W)``, epoch-aligned, as Spark's).
    by : str or list of str
        Grouping columns. Keep them for the life of a checkpoint: restoring with others raises ValueError.
    aggs : mapping of str to list of str, optional
        ``{column: [aggregate, ...]}`` with aggregates ``"count"``, ``"sum"``, ``"min"``, ``"max"``,
        ``"avg"``, ``"stddev"`` / ``"stddev_samp"``, ``"stddev_pop"``, ``"variance"`` / ``"var_samp"``,
        ``"var_pop"`` (Welford / Chan et al. moments), ``"first"`` / ``"last"`` (the value of the
        earliest / latest row by event time among non-null values; ties: the smaller / larger value),
        ``"approx_count_distinct"`` (HyperLogLog, p = 9, Spark's rsd 0.05),
        ``"percentile_approx(p)"`` / ``"approx_percentile(p)"`` (Spark's names; one percentage ``p`` in
        [0, 1] per entry, of a numeric column; the column's type), plus ``"*": ["count"]`` for
        ``count(*)`` (the default when None); see docs/aggregate.md, *Statistical aggregates*. Output columns are
        named ``<agg>_<column>`` (``percentile_approx_0_95_<column>`` for ``"percentile_approx(0.95)"``)
        and ``count``; types follow Spark (count long, sum long for integral and
        double for floating columns, avg double, min/max the column's type). Nulls are ignored; an
        aggregate over only nulls is null.

        ``percentile_approx`` keeps a DDSketch per slice (Masson, Rim, Lee, "DDSketch: A Fast and
        Fully-Mergeable Quantile Sketch with Relative-Error Guarantees", VLDB 2019): a value ``x`` counts
        in bucket ``i = ceil(log_gamma |x|)`` with ``gamma = (1 + alpha) / (1 - alpha)``, and the bucket
        stands for ``2 gamma^i / (gamma + 1)``, within relative error ``alpha = 0.02`` of each of its values
        (§2); 1024 bins, all for one sign or 512 per sign, the lowest
        collapsing (§2.2). The result is the value of rank ``ceil(p·n)`` as in Spark's
        ``percentile_approx``: ``p = 0`` / ``1`` are the exact min / max, infinities, NaN and zeros are
        exact, other values within ``alpha·|x|`` (integral columns: rounded, ``+ 0.5``) for magnitudes
        within ``gamma^1023`` (~5e17; ``gamma^511``, ~7e8, when the window has both signs) of the largest
        of their sign in the window.
    granularity : str or datetime.timedelta, optional
        Time granularity ``g`` (PIPES §2.4.3, Cost Formula 8): every row's time is rounded down to a
        multiple of ``g`` before windowing. It must divide ``W``; the default is ``gcd(W, S)`` (the
        slide when it divides the window). Results equal Spark's exactly when ``g`` divides ``S``; a
        coarser ``g`` keeps ``W/g`` slices per group instead of ``W/S`` and counts each row in the
        windows containing its rounded time.
    emit : {"windows", "changes"}
        ``"windows"``: exactly the rows of Spark's ``groupBy(window(time, W, S), *by).agg(...)``, as
        columns ``window_start``, ``window_end``, then ``by``, then the aggregates. ``"changes"``: the
        PIPES output (snapshot-reducible): per group, maximal intervals ``[valid_from, valid_to)`` over
        which the aggregate values are constant, where the value over granule ``[t, t + g)`` is the
        aggregate of the window ``[t + g - W, t + g)``. Intervals without rows are not emitted.
    output_mode : {"append", "update", "complete"}
        Streaming only; must match the query's output mode. ``"append"`` emits each window once, when
        the watermark passes its end (as Spark); ``"update"`` emits every window that changed in the
        micro-batch (as Spark's update mode; a watermark is optional and bounds the state).
        ``"complete"`` emits every window ever seen in every micro-batch (Spark's complete mode: the
        watermark drops neither rows nor windows, so the state grows without bound); emit="windows" only.
        ``emit="changes"`` supports append only. Write the result with the same
        ``writeStream.outputMode(...)``: Spark checks it only at ``start()``, and a mismatch raises its
        own AnalysisException ("applyInPandasWithState in append mode is not supported with Update
        output mode", docs/errors.md, *Output modes*).
    shards : int, "key" or None
        Number of state tables (hash shards of the keys, each a Spark group); None (default): 8, 1
        without ``by``. ``"key"`` groups the state by the raw key instead, one group per key (kept for
        comparison; see docs/aggregate.md). The same knob as :func:`~pyspark_cq.interval_join`'s. Keep
        it fixed for the life of a checkpoint: restoring with another raises ValueError.
    name : str, optional
        Name of the observed metrics reported per micro-batch (see :func:`pyspark_cq.read_metrics`):
        ``input_rows``, ``output_rows``, ``state_rows`` (slices and pending intervals held),
        ``state_bytes``, ``evicted_rows`` (slices evicted), ``late_rows`` (rows whose every window
        had closed: dropped, as Spark drops them) and ``malformed_rows`` (null time). Default: the
        operator id of ``control`` (so the runtime files the report under it), else
        ``"cq_sliding_aggregate"``.
    control : pyspark_cq.control.ControlHandle, optional
        The operator's control-table entry (``ctx.control(op_id, ...)``, ``ControlTable(path).handle(op_id)``
        or ``ControlHandle(path, op_id)``), read at every micro-batch by the map-side slicer and the
        stateful step; None, or no entry in the table, means the arguments above apply. The entry's
        ``granularity`` schedule replaces ``granularity``: each row is rounded down with the granularity
        in effect at its time; a change applies from the instant the table recorded for it, an instant
        of the coarser granularity (PIPES §2.4.3, ``granularity_effective_at``). Under control the
        granularity need not divide the window. The entry's ``window`` schedule replaces ``window``
        (PIPES §2.4.2, §4.2: a new size applies to new elements only): with ``emit="windows"`` a window
        ``[k·S, k·S + W)`` takes the size ``W`` in effect at its start ``k·S`` (a size below the slide
        is an error); ``emit="changes"`` supports granularity changes only (a window change raises an
        error on the workers). The entry's ``drop_ratio`` (a stream in the shard layout) sheds that share
        of the input in the slicer, before the aggregation (RTStream §4.4), counted as ``shed_rows``.
        See docs/aggregate.md, "Control table".
    state : {"groupstate", "tws"}
        Where a streaming shard's state lives between micro-batches: ``"groupstate"`` (default) in
        ``applyInPandasWithState``'s ``GroupState``; ``"tws"`` in a ``ValueState`` of Spark 4's
        ``transformWithStateInPandas`` with an event-time timer, which needs
        ``spark.sql.streaming.stateStore.providerClass`` set to Spark's RocksDB provider. Both give the
        same rows; see docs/benchmark-log-2026.md, "transformWithStateInPandas as the state home" for what each
        costs. ``"files"``: no Spark state at all; the stage is stateless (one Python task, or ``repartition``
        by shard into ``tasks``, so ``spark.sql.shuffle.partitions`` does not matter) and each shard's state is a file
        per micro-batch under ``state_dir``, the watermark computed by the operator as Spark does. Without a
        stateful operator Spark runs no micro-batch without new rows: windows are emitted by the next batch with
        data (Spark's rows with ``spark.sql.streaming.noDataMicroBatches.enabled=false``). Streaming
        ``output_mode="append"`` and the shard layout only; see docs/aggregate.md, "State in files". Keep it
        fixed for the life of a checkpoint (they are different Spark operators).
    kept_column : str, optional
        A new output column (double, last): per window the fraction of its input rows the shedding stage
        kept, ``kept / (kept + shed)`` over the rows that fell into the window (RTStream, Wei et al., §4.4;
        1.0 without shedding, and for a batch DataFrame, which is never shed). The slicer then counts shed
        rows per slice and the state keeps that count (one more partial per slice): keep the option for the
        life of a checkpoint. ``emit="windows"`` and ``output_mode`` ``"append"`` or ``"update"`` only. In
        update mode a window is also emitted again when only shed rows of it arrived (its kept fraction
        changed). See docs/aggregate.md, "Control table".
    state_dir : str, optional
        ``state="files"``: the directory of the shards' state files, one per operator of one query (a path
        every executor shares, or a URI pyarrow understands). Default: ``<spark.sql.streaming.checkpointLocation
        or spark.sql.warehouse.dir>/pyspark_cq_state/<query id>/<name>`` where every executor reaches it (a
        local master, or a warehouse on a shared file system), otherwise required. Ignored by the other homes.
    tasks : int, optional
        ``state="files"``: the Python tasks of the stage. ``1``: no shuffle at all, the micro-batch's rows merged
        into one task (``coalesce(1)``) that slices them and runs every shard: the least fixed cost per
        micro-batch, one core's throughput. ``n > 1``: the slices ``repartition``-ed by shard into ``n`` tasks.
        Default: 1 on a local master, else one per core of the session (at most ``shards``). The state is the
        same either way (a restart may change it). Refused with the other homes.

    Returns
    -------
    DataFrame
        Batch or streaming, as ``df``; a stream is written in ``output_mode``.

    Notes
    -----
    Late data follows Spark exactly: a slice contributes to a window unless the window's end is at or
    before the previous micro-batch's watermark (Spark's late-event watermark; eviction uses the
    current one). A long ``sum`` follows ``spark.sql.ansi.enabled`` as read when the operator is
    defined: with ANSI (Spark 4's default) a window whose exact sum leaves the long range raises
    ``[ARITHMETIC_OVERFLOW]`` naming ``name``, the group and the window; without it the sum wraps as
    Spark's. ``avg`` of integral columns is the exact sum over the count and never wraps (Spark sums it
    in doubles). See docs/errors.md, "Arithmetic overflow".

    Work per batch also includes rewriting each shard's state snapshot (the state lives in
    ``GroupState``), proportional to the state size.

    Examples
    --------
    >>> import pyspark_cq as cq
    >>> from datetime import datetime
    >>> readings = spark.createDataFrame(
    ...     [("a", datetime(2024, 1, 1, 0, 0, 10), 1.0), ("a", datetime(2024, 1, 1, 0, 0, 13), 3.0),
    ...      ("b", datetime(2024, 1, 1, 0, 0, 11), 5.0)], "sensor string, ts timestamp, value double")
    >>> out = cq.sliding_aggregate(readings, "ts", "4 seconds", "2 seconds", by="sensor", aggs={"value": ["max"]})
    >>> [(r.sensor, r.window_start.second, r.window_end.second, r.max_value)
    ...  for r in out.orderBy("sensor", "window_start").collect()]
    [('a', 8, 12, 1.0), ('a', 10, 14, 3.0), ('a', 12, 16, 3.0), ('b', 8, 12, 5.0), ('b', 10, 14, 5.0)]
    """
    config, layout, delay, complete = configure(
        df, time, window, slide, by, aggs, granularity, emit, output_mode=output_mode, shards=shards, name=name,
        control=control, state=state, kept_column=kept_column)
    streaming, spec, keys, out_names = df.isStreaming, config.spec, config.keys, config.out_names
    by = [k.name for k in keys]
    _check_tasks(tasks, state)
    if streaming and state == "files":
        return _files_stage(df, time, config, delay,
                            _changelog.files_dir(state_dir, df.sparkSession, config.name, "state='files'"),
                            _files_tasks(df, tasks, config.shards))
    _changelog.check_state_dir(state_dir)   # checked, though only state="files" uses it
    warn_shuffle_partitions(df)
    group_col = SHARD if layout == "shard" else KHASH
    if streaming:
        # Streaming: Spark's aggregation would be stateful, so the map side is ours (mapInArrow).
        tag = {_validate.WATERMARK_KEY: delay} if delay is not None else None
        sliced_schema = config.sliced_schema(tag)
        # The shard layout packs each shard's slices into bytes (AggConfig.packed_schema): far fewer rows
        # for the JVM to shuffle, sort and convert. The key layout groups by key hash: one row per slice.
        by_shard = layout == "shard"
        pack = by_shard and _PACK_SLICES
        slicer = Slicer(config, tag is not None, markers=by_shard, packed=pack)
        sliced = df.select(*_projection(df, time, keys, spec)).mapInArrow(
            slicer, config.packed_schema(tag) if pack else sliced_schema)
        packed_schema = _metrics.packed_schema(config.output_schema(), AGG_METRICS)
        if state == "tws":
            from .tws import TwsShard

            packed = sliced.groupBy(group_col).transformWithStateInPandas(
                TwsShard(config, sliced_schema, pack), packed_schema,
                "Append" if complete else output_mode.capitalize(),
                "EventTime" if delay is not None else "None")
        else:
            timeout = "EventTimeTimeout" if delay is not None else "NoTimeout"
            packed = sliced.groupBy(group_col).applyInPandasWithState(
                StatefulShard(config, sliced_schema, pack), packed_schema,
                STATE_SCHEMA, "append" if complete else output_mode, timeout)
        out = _metrics.attach_packed(packed, config.name, config.output_schema(), AGG_METRICS)
        return _complete_table(out, out_names, by) if complete else out
    elif any(op in NATIVE_ONLY_OPS for op, _ in spec.ops):
        # Batch with sketches or (time, value) pairs (approx_count_distinct, first, last): Spark has no
        # aggregate that builds them as the kernel stores them, so the slices come from the streaming
        # path's native slicer.
        sliced_schema = config.sliced_schema(None)
        sliced = df.select(*_projection(df, time, keys, spec)).mapInArrow(
            Slicer(config, False, markers=layout == "shard"), sliced_schema)
        raw = sliced.groupBy(group_col).applyInPandas(batch_function(config, sliced_schema, False),
                                                      _metrics.metrics_schema(config.output_schema()))
        return _metrics.attach(raw, config.name)
    else:
        # Batch: Spark's own (codegen) hash aggregation computes the slices, so raw rows never cross
        # into Python; only slices reach the sweep.
        sliced_schema = config.sliced_schema(None, float_partials=True)
        sliced = _native_slices(df, config, time).select(*sliced_schema.names)
        raw = sliced.groupBy(group_col).applyInPandas(batch_function(config, sliced_schema, True),
                                                      _metrics.metrics_schema(config.output_schema()))
        return _metrics.attach(raw, config.name)


def _check_tasks(tasks, state: str) -> None:
    """TypeError / ValueError naming ``tasks`` unless it is None or an int >= 1 given with ``state="files"`` (a
    batch input ignores it).
    """
    if tasks is None:
        return
    if isinstance(tasks, bool) or not isinstance(tasks, numbers.Integral) or tasks < 1:
        raise TypeError(f"tasks must be an int >= 1 (the Python tasks of state='files''s stage) or None, "
                        f"got {tasks!r}")
    if state != "files":
        raise ValueError(f"tasks: only state='files' runs a stage of its own; got tasks={tasks!r} with "
                         f"state={state!r}")


def _files_tasks(df, tasks: int | None, shards: int) -> int:
    """The tasks of ``state="files"``'s stage (``tasks`` checked by :func:`_check_tasks`): as given, else 1 on a
    local master and one per core elsewhere (at most ``shards``).
    """
    if tasks is not None:
        return int(tasks)
    try:   # one machine: the shuffle costs more than a second core gives (docs/aggregate.md, "State in files")
        local = (df.sparkSession.conf.get("spark.master", "") or "").startswith("local")
    except Exception:   # a Connect server that does not say
        local = False
    return 1 if local else stage_partitions(df, shards)


def _files_stage(df, time, config: AggConfig, delay, root: str, tasks: int):
    """The streaming plan of ``state="files"`` (:mod:`.files`): with one task, ``coalesce(1)`` and one
    ``mapInArrow`` step that slices and runs every shard; with more, the packed slicer, ``repartition`` by shard
    into ``tasks`` and a ``mapInPandas`` step; either way a stateless stage whose state is in files, its report
    the stateful stage's.
    """
    from .files import FileShards, OneTask

    _offsets.watch(df.sparkSession)   # the tasks read Spark's watermark from the offset log

    rows = df.select(*_projection(df, time, config.keys, config.spec))
    packed_schema = _metrics.packed_schema(config.output_schema(), AGG_METRICS)
    if tasks == 1:   # no shuffle: one Python task slices and runs every shard
        packed = rows.coalesce(1).mapInArrow(
            OneTask(config, root, delay, _metrics.arrow_schema(packed_schema)), packed_schema)
    else:
        slicer = Slicer(config, False, markers=True, packed=True, max_time=True)
        sliced = rows.mapInArrow(slicer, config.packed_schema(None, max_time=True))
        packed = sliced.repartition(tasks, F.col(SHARD)).mapInPandas(
            FileShards(config, root, delay), packed_schema)
    return _metrics.attach_packed(packed, config.name, config.output_schema(), AGG_METRICS)


def configure(df, time, window, slide=None, by=(), aggs=None, granularity=None, emit="windows", *,
              output_mode="append", shards=None, name=None, control=None, state="groupstate", kept_column=None):
    """The validated :class:`~.config.AggConfig` of :func:`sliding_aggregate`'s arguments (same meaning, same
    errors), its state layout, the watermark delay (ms, or None) and whether it runs in complete mode. Also
    used by :class:`pyspark_cq.QueryGroup`, which hosts many aggregations in one stage.
    """
    _validate.dataframe(df, "df")
    time_type = _validate.time_column(df, time, "time")
    w = _positive_duration(window, "window")
    s = w if slide is None else _positive_duration(slide, "slide")
    if s > w:
        raise ValueError(f"slide must not exceed window (Spark's rule), got slide={slide!r} > window={window!r}")
    by = _validate.column_list(df, by, "by")
    if time in by:
        raise ValueError(f"by must not contain the time column {time!r}")
    g = math.gcd(w, s) if granularity is None else _positive_duration(granularity, "granularity")
    if w % g:
        raise ValueError(f"granularity must divide the window (a window is a whole number of granules); "
                         f"got granularity={granularity!r} for window={window!r}")
    if emit not in EMIT_MODES:
        raise ValueError(f"emit must be one of {EMIT_MODES}, got {emit!r}")
    if state not in STATE_HOMES:
        raise ValueError(f"state must be one of {STATE_HOMES}, got {state!r}")
    if state == "tws":
        _check_tws(df)
    if output_mode not in OUTPUT_MODES:
        raise ValueError(f"output_mode must be one of {OUTPUT_MODES}, got {output_mode!r}")
    layout, shards = resolve_shards(shards, AGGREGATE, keyed=bool(by))
    if state == "files" and df.isStreaming and (output_mode != "append" or layout != "shard"):
        raise ValueError(f"state='files' runs output_mode='append' in the shard layout (a stateless stage emits "
                         f"each window once); got output_mode={output_mode!r}, layout {layout!r}")
    control = operator_handle(control, "sliding_aggregate")
    if name is None:
        name = control.operator if control is not None else DEFAULT_NAME
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    ansi = ansi_enabled(df)
    spec = parse_aggs(df, aggs, by, ansi, time)
    keys = key_columns(df, by)
    bounds = ("window_start", "window_end") if emit == "windows" else ("valid_from", "valid_to")
    out_names = bounds + tuple(by) + tuple(o.name for o in spec.outputs)
    clash = sorted({n for n in out_names if out_names.count(n) > 1})
    if clash:
        raise ValueError(f"by: output column name(s) {clash} would appear twice; rename the by column(s)")
    if kept_column is not None:
        spec = _check_kept_column(kept_column, out_names, spec, emit, output_mode, df.isStreaming)
        out_names += (kept_column,)

    streaming = df.isStreaming
    delay = _validate.watermark_delay_ms(df, time) if streaming else None
    if streaming:
        if output_mode == "append":
            _validate.require_watermark(df, time, "sliding_aggregate (output_mode='append')")
        if emit == "changes" and output_mode != "append":
            raise ValueError("emit='changes' needs output_mode='append': change intervals are final once "
                             "emitted (PIPES streams are insert-only)")
    complete = streaming and output_mode == "complete"
    if complete:
        # Spark's complete mode keeps every window and drops no late row: the operator emits its
        # update-mode rows as if without a watermark, and a Spark aggregation on top (_complete_table)
        # holds the table. Spark accepts an aggregation after applyInPandasWithState only when the
        # latter is declared in append mode (UnsupportedOperationChecker), which its rows need not be.
        delay, output_mode = None, "update"
        spec = AggSpec(spec.values, spec.ops, spec.outputs + (Output(_ROWS, "count", None, OUT_COUNT, 0, -1,
                                                                     T.LongType()),))
        out_names += (_ROWS,)
    mode = output_mode if streaming else "batch"
    config = AggConfig(spec=spec, keys=keys, time_type=time_type, window=w, slide=s, granularity=g, emit=emit,
                mode=mode, watermark=delay is not None, shards=shards, out_names=out_names,
                control=control, name=name, ansi=ansi)
    load("_aggregate")  # fail on the driver, readably, if the build is broken
    if control is not None:
        entry = control.entry()
        batch_params(config, entry)  # an entry the workers would reject fails here already
        if entry is not None and not streaming and entry.get("drop_ratio", 0.0) > 0:
            raise ValueError(f"sliding_aggregate {name!r}: drop_ratio {entry.get('drop_ratio')} sheds a streaming "
                             f"aggregation only; a batch DataFrame is aggregated whole")

    return config, layout, delay, complete


def _check_kept_column(kept_column, out_names, spec, emit, output_mode, streaming):
    """The aggregation with ``kept_column`` (:func:`~.spec.with_kept`); ValueError naming the argument
    for a name that is not new, ``emit="changes"`` or ``output_mode="complete"``.
    """
    if not isinstance(kept_column, str) or not kept_column or kept_column in out_names:
        raise ValueError(f"kept_column must be a new column name (not one of the output's {list(out_names)}), "
                         f"got {kept_column!r}")
    if emit != "windows":
        raise ValueError(f"kept_column needs emit='windows' (a change interval spans several windows), got "
                         f"emit={emit!r}")
    if streaming and output_mode == "complete":
        raise ValueError("kept_column is not supported with output_mode='complete'; use 'append' or 'update'")
    return with_kept(spec, kept_column)


def _check_tws(df):
    """A stream with ``state="tws"`` needs Spark's RocksDB state store, which Spark requires for
    ``transformWithStateInPandas`` (it reads the provider when the query starts; on the default store the
    query fails with ``UNSUPPORTED_FEATURE.STORE_BACKEND_NOT_SUPPORTED_FOR_TWS``). A batch DataFrame keeps
    no state, so there the argument has no effect.
    """
    if not df.isStreaming:
        return
    provider = df.sparkSession.conf.get(_PROVIDER_CONF, "") or ""
    if "RocksDB" not in provider:
        raise ValueError(f"state='tws' needs Spark's RocksDB state store: set {_PROVIDER_CONF} to "
                         f"{_ROCKSDB!r} before defining and starting the query (got {provider or 'the default'!r})")


def _complete_table(updates, out_names, by):
    """The result table of ``output_mode="complete"`` from the operator's update-mode rows: per window
    and group the row of its latest update (the largest count(*): every update of a window adds rows,
    since no row is dropped as late), kept by Spark's own streaming aggregation, which a complete-mode
    writer accepts.
    """
    group = list(out_names[:2]) + list(by)
    values = [c for c in out_names[2 + len(by):] if c != _ROWS]
    latest = F.max_by(F.struct(*[_validate.ref(c) for c in values]), _validate.ref(_ROWS)).alias("__cq_latest")
    table = updates.groupBy(*[_validate.ref(c) for c in group]).agg(latest)
    return table.select(*[_validate.ref(c) for c in group],
                        *[F.col("__cq_latest").getField(c).alias(c) for c in values])


def ansi_enabled(df) -> bool:
    """``spark.sql.ansi.enabled`` of ``df``'s session (Spark 4's default: true). With it a long ``sum``
    whose window value leaves the long range raises ARITHMETIC_OVERFLOW, as Spark's own sum does; without
    it the sum wraps around, as Spark's.
    """
    value = df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")
    return str(value).strip().lower() == "true"


def _positive_duration(value, name: str) -> int:
    # a plain number (no unit) is refused by parse_duration, with the same message as every other
    # duration argument (e.g. the join's lower / upper)
    return parse_duration(value, name, allow_negative=False, allow_zero=False)


def _projection(df, time, keys, spec):
    """Columns fed to the slicer: time, key hash, normalised keys, aggregated values."""
    return [e.alias(n) for n, e in projection_exprs(time, keys, spec)]


def projection_exprs(time, keys, spec) -> list:
    """The slicer's input as ``(column name, Spark expression)`` pairs: time, key hash, normalised keys,
    aggregated values (:class:`pyspark_cq.QueryGroup` computes the distinct ones of many aggregations once).
    """
    key_exprs = _key_exprs(keys)
    cols = [(TIME, _validate.ref(time)), (HASH, _hash_expr(keys, key_exprs))]
    cols += [(key_name(i), e) for i, e in enumerate(key_exprs)]
    # the shed-row marker (kept_column) is the slicer's own: not a column, so the shedding hash never sees it
    cols += [(value_name(i), value_expr(v)) for i, v in enumerate(spec.values) if v.derive != "shed"]
    return cols


def value_expr(v):
    """The Spark column a value column of the aggregation is fed from (``ValueColumn.derive``)."""
    if v.derive == "shed":  # a batch DataFrame is never shed (kept_column: the shed-row count is 0)
        return F.lit(0).cast("long")
    c = _validate.ref(v.name)
    if v.derive == "double":
        return c.cast("double")
    if v.derive == "time":   # the event time (first / last), as the kernel's int64
        return _as_long(c, v.dtype)
    if v.derive == "hash":  # Spark's HyperLogLogPlusPlus hashes each non-null value with xxhash64, seed 42
        return F.when(c.isNotNull(), F.xxhash64(c))
    return c


def _key_exprs(keys):
    out = []
    for k in keys:
        c = _validate.ref(k.name)
        if isinstance(k.dtype, (T.FloatType, T.DoubleType)):
            # Spark groups -0.0 with 0.0 and all NaNs together (NormalizeFloatingNumbers); hash and keep
            # the normalised value so groups and their output keys match Spark's.
            c = F.when(F.isnan(c), F.lit(float("nan")).cast(k.dtype)).when(c == 0, F.lit(0).cast(k.dtype)).otherwise(c)
        out.append(c)
    return out


def _hash_expr(keys, key_exprs):
    if not keys:
        return F.lit(0).cast("long")
    # Null flags make (null, 1) and (1, null) hash differently (xxhash64 skips nulls).
    flags = [F.isnull(_validate.ref(k.name)) for k in keys if k.nullable]
    return F.xxhash64(*key_exprs, *flags)


def _as_long(c, dtype):
    """Spark expression of an integral / boolean / date / timestamp value as int64 (microseconds for
    timestamps, the wall clock for timestamp_ntz), the kernel's encoding of ordered values.
    """
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(c)
    if isinstance(dtype, T.TimestampNTZType):
        return F.timestamp_diff("MICROSECOND", F.expr("TIMESTAMP_NTZ'1970-01-01 00:00:00'"), c)
    if isinstance(dtype, T.DateType):
        return F.unix_date(c).cast("long")
    if isinstance(dtype, T.BooleanType):
        return c.cast("int").cast("long")
    return c.cast("long")


def _granularity_expr(config: AggConfig, micros):
    """The granularity of each row: the argument, or (batch input under control) the entry's schedule
    as read when the query is defined -- the value in effect at the row's time (PIPES §2.4.3).
    """
    entry = config.control.entry() if config.control is not None else None
    sched = entry.schedule("granularity") if entry is not None else None
    if sched is None:
        return F.lit(config.granularity)
    expr = F.lit(sched.points[0][1]).cast("long")
    for at, g in sched.points[1:]:
        expr = F.when(micros >= F.lit(at), F.lit(g).cast("long")).otherwise(expr)
    return expr


def _native_slices(df, config: AggConfig, time: str):
    """Slices of a batch DataFrame computed by Spark's hash aggregation, in the sliced-row layout of
    :meth:`AggConfig.sliced_schema` (floating partials as doubles). Rows with a null time form one slice per
    key whose count(*) is moved to the malformed counter.
    """
    keys, spec = config.keys, config.spec
    micros = _as_long(_validate.ref(time), config.time_type)
    start = micros - F.pmod(micros, _granularity_expr(config, micros))
    key_exprs = _key_exprs(keys)
    cols = [start.alias(START), _hash_expr(keys, key_exprs).alias(KHASH)]
    group = [START, KHASH]
    for i, (k, e) in enumerate(zip(keys, key_exprs)):
        if k.transport == "raw":
            cols.append(e.alias(key_name(i)))
            group.append(key_name(i))
            continue
        value = _as_long(e, k.dtype) if k.transport == "i" else e.cast("double")
        cols.append(F.coalesce(value, F.lit(0).cast("long" if k.transport == "i" else "double")).alias(key_name(i)))
        group.append(key_name(i))
        if k.nullable:
            cols.append(F.isnull(_validate.ref(k.name)).alias(null_name(i)))
            group.append(null_name(i))
    cols += [value_expr(v).alias(value_name(i)) for i, v in enumerate(spec.values)]
    partials = []
    for j, (op, ci) in enumerate(spec.ops):
        if op == OP_ROWS:
            expr = F.count(F.lit(1))
        else:
            v = F.col(value_name(ci))
            dtype = spec.values[ci].dtype
            if op == OP_COUNT:
                expr = F.count(v)
            elif op == OP_SUM_I and has_high_half(spec.ops, j):
                # the low halves; BatchShard joins them with the high ones (join_sum_halves), so that a
                # long overflow is the operator's error (naming group and window), not Spark's
                expr = F.coalesce(F.sum(v.cast("long").bitwiseAND(F.lit(0xFFFFFFFF))), F.lit(0).cast("long"))
            elif op == OP_SUM_HI:
                expr = F.coalesce(F.sum(F.shiftright(v.cast("long"), 32)), F.lit(0).cast("long"))
            elif op == OP_SUM_I:
                expr = F.coalesce(F.sum(v.cast("long")), F.lit(0).cast("long"))
            elif op in (OP_MIN_I, OP_MAX_I):
                agg = F.min if op == OP_MIN_I else F.max
                identity = _I64_MAX if op == OP_MIN_I else _I64_MIN
                expr = F.coalesce(agg(_as_long(v, dtype)), F.lit(identity).cast("long"))
            else:  # floating partials stay doubles; BatchShard encodes them (encode_float_partials)
                agg = {OP_SUM_F: F.sum, OP_MIN_F: F.min, OP_MAX_F: F.max}[op]
                expr = agg(v.cast("double"))
        partials.append(expr.alias(partial_name(j)))
    sliced = df.select(*cols).groupBy(*group).agg(*partials)
    no_time = F.col(START).isNull()
    fixed = {partial_name(0): F.when(no_time, F.lit(0).cast("long")).otherwise(F.col(partial_name(0))),
             BAD: F.when(no_time, F.col(partial_name(0))).otherwise(F.lit(0).cast("long")),
             SHED_COL: F.lit(0).cast("long"),
             START: F.coalesce(F.col(START), F.lit(0).cast("long")),
             SHARD: shard_key_column(F.col(KHASH), config.shards)}
    return sliced.withColumns(fixed)
