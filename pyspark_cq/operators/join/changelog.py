"""The join's changelog state value (``state_persistence="changelog"``, issue 39): a snapshot plus deltas.

The ``GroupState`` value keeps its schema (``kernel``, ``left``, ``right`` binaries, so a checkpoint can
switch between the layouts both ways): ``left`` / ``right`` are the payload snapshots, exactly as in the
full layout, and ``kernel`` is a log::

    "CQL1" | token (16 B) | u32 deltas | u64 n | kernel snapshot (n B, the full layout's kernel field)
           | per delta: u64 m | delta (m B)

A *delta* is what one micro-batch did to the state, in the order it did it: per ``insert_probe`` call of
the kernel the rows stored (the payload rows as appended, their instants, expiry keys and, under a control
table, their bounds), the left rows a semi join marked as output, and the watermark whose eviction closed
the batch. Replaying the deltas on the snapshot repeats the kernel's calls on the same rows in the same
order, so it rebuilds the same state -- matched flags included, since probing sets them -- and the payload
ids come out the same (appends after the same snapshot). The shape is that of RocksDB's changelog
checkpointing: the writer's cost follows the batch's rows, and a new snapshot every ``snapshot_every``
batches (or when the deltas exceed half of it) bounds the replay.

The token identifies the value's version for the resident cache (:mod:`.._common.resident`).

``state_persistence="files"`` keeps the same deltas and snapshots in immutable files and only a *manifest*
in the value's ``kernel`` field. The framing of the value, the manifest, the snapshot files and when a snapshot
is due are shared with ``multi_join`` (:mod:`.._common.changelog`, whose names this module re-exports).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .._common import state_bytes as _state_bytes
from .._common.changelog import (
    FILES_MAGIC,
    MAGIC,
    LogInfo,
    Manifest,
    append_delta,
    is_log,
    is_manifest,
    pack_snapshot,
    parse,
    snapshot_field,
    token_of,
    unpack_snapshot,
)

__all__ = ["MAGIC", "FILES_MAGIC", "Delta", "LogInfo", "Manifest", "is_log", "is_manifest", "token_of", "parse",
           "snapshot_field", "append_delta", "pack_snapshot", "unpack_snapshot"]

_DELTA = struct.Struct("<4sqII")      # magic, watermark (ms), parts, emitted ids
_DMAGIC = b"CQD1"
_PART = struct.Struct("<BQ")          # side, IPC length
# Columns a delta part adds to the stored payload rows (never payload column names: those are __cq_k / __cq_p).
T_COL, END_COL, LO_COL, HI_COL = "__cq_d_t", "__cq_d_end", "__cq_d_lo", "__cq_d_hi"
_EXTRA = (T_COL, END_COL, LO_COL, HI_COL)


@dataclass
class Delta:
    """One micro-batch's changes to a group's join state (see the module docstring)."""

    wm_ms: int
    parts: list = field(default_factory=list)    # (side, stored table, micros, ends, lower | None, upper | None)
    emitted: list = field(default_factory=list)  # semi join: arrays of left payload ids marked as output

    def store(self, side: int, table: pa.Table, micros, ends, lower, upper) -> None:
        """Record one ``insert_probe`` call that stored ``table``'s rows (bounds: arrays or None)."""
        self.parts.append((side, table, np.asarray(micros, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                           None if lower is None else np.asarray(lower, dtype=np.int64),
                           None if upper is None else np.asarray(upper, dtype=np.int64)))

    def encode(self) -> bytes:
        """The delta's bytes (payload rows as zstd Arrow IPC)."""
        emitted = np.concatenate(self.emitted).astype(np.int64) if self.emitted else np.empty(0, np.int64)
        out = [_DELTA.pack(_DMAGIC, self.wm_ms, len(self.parts), len(emitted)), emitted.tobytes()]
        for side, table, micros, ends, lower, upper in self.parts:
            extra = [(T_COL, micros), (END_COL, ends)]
            if lower is not None:
                extra += [(LO_COL, np.broadcast_to(lower, micros.shape)),
                          (HI_COL, np.broadcast_to(upper, micros.shape))]
            for name, values in extra:
                table = table.append_column(name, pa.array(np.ascontiguousarray(values), type=pa.int64()))
            blob = _state_bytes.table_to_bytes(table)
            out += [_PART.pack(side, len(blob)), blob]
        return b"".join(out)

    @classmethod
    def decode(cls, blob) -> Delta:
        """The delta of :meth:`encode`."""
        view = memoryview(blob)
        magic, wm_ms, n_parts, n_emitted = _DELTA.unpack_from(view)
        if magic != _DMAGIC:
            raise ValueError("join state: a changelog delta is corrupt (bad magic); restore from an earlier "
                             "checkpoint")
        pos = _DELTA.size
        emitted = np.frombuffer(view[pos:pos + 8 * n_emitted], dtype=np.int64).copy()
        pos += 8 * n_emitted
        delta = cls(wm_ms, emitted=[emitted] if len(emitted) else [])
        for _ in range(n_parts):
            side, size = _PART.unpack_from(view, pos)
            pos += _PART.size
            table = _state_bytes.table_from_bytes(view[pos:pos + size])
            pos += size
            cols = {name: table.column(name).to_numpy() if name in table.schema.names else None for name in _EXTRA}
            table = table.drop_columns([c for c in _EXTRA if c in table.schema.names])
            delta.parts.append((side, table, cols[T_COL], cols[END_COL], cols[LO_COL], cols[HI_COL]))
        return delta
