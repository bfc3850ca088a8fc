"""The map side of :func:`pyspark_cq.sliding_aggregate`: raw rows to slices (:class:`Slicer`, ``mapInArrow``).

It runs in Spark's Python workers, holds only a picklable :class:`~.config.AggConfig` and loads the
compiled kernel lazily (``pyspark_cq._aggregate``), so nothing here needs a SparkSession.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import _validate
from ..._native import load
from .._common.shards import shard_key_values
from .._common.shed import batch_shed_mask, shed_batch
from .config import HASH, KHASH, TIME, AggConfig, encode_key, key_name, read_entry, round_starts, value_name
from .spec import arrow_type, nonnull_numpy, to_int64

__all__ = ["PACK_ROWS", "Slicer"]

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
    ``max_time`` (packed, ``state="files"``): the marker rows also carry the latest event time of the task's
    rows (before shedding, as Spark's watermark sees them), so that every shard learns the batch's maximum.
    """

    def __init__(self, config: AggConfig, tag: bool, markers: bool = True, packed: bool = False,
                 max_time: bool = False):
        if packed and not markers:
            raise ValueError("packed: the packed transport needs the shard layout's marker rows")
        if max_time and not packed:
            raise ValueError("max_time: only the packed transport carries the latest event time")
        self.config, self.tag, self.emit_markers, self.packed = config, tag, markers, packed
        self.max_time = max_time
        # what every output batch has, built once per task (not per Arrow batch)
        meta = {} if tag else None
        self.out_names = (config.packed_schema(meta, max_time) if packed else config.sliced_schema(meta)).names
        self.slices_schema = config.slices_arrow_schema() if packed else None

    def __call__(self, batches):
        """Slices of the task's Arrow ``batches``, then the marker rows."""
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
        latest = None             # max_time: the latest event time of the task's rows
        held, held_rows = [], 0   # packed: slices not yet sent (fewer, larger messages)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self.max_time:
                t = pc.max(to_int64(batch.column(TIME))).as_py()
                if t is not None and (latest is None or t > latest):
                    latest = t
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
            yield self.markers(bad, shed, latest)

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

    def _packed_rows(self, shards: np.ndarray, blobs: list, bad: np.ndarray, shed: np.ndarray,
                     latest: int | None = None) -> pa.RecordBatch:
        cols = [pa.array(shards, type=pa.int64()), pa.array(blobs, type=pa.binary()),
                pa.array(bad, type=pa.int64()), pa.array(shed, type=pa.int64())]
        if self.max_time:
            cols.append(pa.array([latest] * len(blobs), type=pa.int64()))
        return self._with_tag(cols)

    def _with_tag(self, cols: list) -> pa.RecordBatch:
        """``cols`` and, with a watermark, the all-null tag column, as an output batch."""
        if self.tag:
            cols = cols + [pa.nulls(len(cols[0]), type=arrow_type(self.config.time_type))]
        return pa.RecordBatch.from_arrays(cols, names=self.out_names)

    def markers(self, bad: int, shed: int = 0, latest: int | None = None) -> pa.RecordBatch:
        """One row per shard with count(*) = 0 (never a slice; packed: no slices at all); shard 0's
        carries the null-time and shed counts, every one the latest event time (``max_time``).
        """
        k = self.config.shards
        hashes = np.arange(k, dtype=np.int64)
        zeros = np.zeros(k, dtype=np.int64)
        badcol, shedcol = zeros.copy(), zeros.copy()
        badcol[0], shedcol[0] = bad, shed
        if self.packed:
            return self._packed_rows(shard_key_values(hashes, k), [b""] * k, badcol, shedcol, latest)
        keys = [pa.nulls(k, type=arrow_type(kc.dtype)) for kc in self.config.keys]
        return self._rows(hashes, keys, zeros, [zeros] * len(self.config.spec.ops), badcol, shedcol)
