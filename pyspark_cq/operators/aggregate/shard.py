"""The stateful side of :func:`pyspark_cq.sliding_aggregate`: one shard's step for one micro-batch
(:func:`run_shard`), whichever transport and state home drive it (:mod:`.transport`, :mod:`.tws`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..._native import load
from ...control import Entry
from ...vocabulary import metrics as M
from .._common import state_bytes as _state_bytes
from .._common.shards import AGGREGATE, check_shard_count, default_rule, with_shard_count
from .._common.shed import SHED
from .config import (
    BAD,
    KHASH,
    SHED_COL,
    START,
    AggConfig,
    BatchParams,
    batch_params,
    decode_keys,
    last_window_end,
    partial_name,
)
from .finish import _output_table
from .spec import arrow_type

__all__ = ["StepResult", "run_shard", "run_shared"]

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
    """What :func:`run_shard` returns: the output rows, the state to save and the report's counters."""

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


def run_shared(configs: list[AggConfig], table: pa.Table, state: tuple | None, watermark_us: int | None,
               counts: tuple[int, int]) -> tuple[list[StepResult], tuple[bytes, bytes] | None]:
    """One shard's step for several queries that read the same slices (a query group's slice class,
    :func:`pyspark_cq.group.worker.slice_classes`): one slice table, restored, ingested, evicted and saved
    once, from which each query emits its own windows (PIPES's shared partial aggregates, Cammert et al.,
    §2.4.1; STREAM's shared synopses, Motwani et al., §3.2).

    ``configs`` differ at most in window, slide, granularity, name and output names; each has
    ``emit="windows"``, a streaming mode and no control table. ``table`` and ``counts`` are as for
    :func:`run_shard` (packed transport); its slices may be finer than a query's granularity (a class across
    granularities slices at their gcd): a window of a query is a run of whole slices either way, its partials
    combine to the same sums, counts, minima and maxima, and a slice lies in the same windows as the coarser
    slice around it, so lateness and eviction are decided alike. Each query's rows and late rows are those
    :func:`run_shard` gives it alone:

    - a slice is late for a query when each of *its* windows containing the slice ended by the late-event
      watermark (as Spark drops its (window, key) rows); it enters the table unless it is late for all;
    - the table keeps a slice until ``last_end(r, W_max, gcd(S))``, at least as long as any query's last
      window containing it, so no query loses a slice it needs; a query emits only windows ending after
      the late-event watermark, so the slices kept for others never reach its rows.

    Returns each query's :class:`StepResult` (state ``None``) and the table's state. The table's size and
    evictions are reported once, on the first query (a shared state is counted once).
    """
    if not configs or any(c.emit != "windows" or c.mode == "batch" or c.control is not None for c in configs):
        raise ValueError("run_shared: configs must be streaming emit='windows' configurations without a control "
                         "table, at least one")
    kernel = load("_aggregate")
    first = configs[0]
    params = [batch_params(c, None) for c in configs]
    data, (bad, shed) = table, counts
    rows = _int64(data, partial_name(0))
    input_rows = int(rows.sum())
    st, keys_tbl, late_end = _restore(kernel, first, state)
    late = [0] * len(configs)
    if late_end is not None and data.num_rows:
        starts = _int64(data, START)
        live = np.zeros(len(starts), dtype=bool)
        for i, (c, p) in enumerate(zip(configs, params)):
            mine = last_window_end(starts, p.segments, c.slide) > late_end
            late[i] = int(rows[~mine].sum())
            live |= mine
        if not live.all():
            data = data.take(pa.array(np.flatnonzero(live)))
    # one bound for the table: the latest window end of any query (gcd of the slides, widest window)
    widest = replace(params[0], w_max=max(p.w_max for p in params))
    step = math.gcd(*(c.slide for c in configs))
    keys_tbl, _ = _ingest(st, first, widest, data, keys_tbl, step, None)
    outs = [_emit(st, c, p, c.slide, late_end, watermark_us, keys_tbl) for c, p in zip(configs, params)]
    evicted, keys_tbl = _evict(st, first, widest, step, watermark_us, keys_tbl)
    new_state = _save(st, first, keys_tbl)
    results = []
    for i, out in enumerate(outs):
        results.append(StepResult(out, None, {
            M.INPUT_ROWS: input_rows + shed, SHED: shed, M.OUTPUT_ROWS: out.num_rows,
            M.STATE_ROWS: st.num_slices + st.num_runs if i == 0 else 0,
            M.STATE_BYTES: len(new_state[0]) + len(new_state[1]) if i == 0 else 0,
            M.EVICTED_ROWS: int(evicted) if i == 0 else 0, M.LATE_ROWS: late[i], M.MALFORMED_ROWS: bad}))
    return results, new_state


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
