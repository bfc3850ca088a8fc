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

``state_persistence="files"`` keeps the same deltas and snapshots in immutable files
(:mod:`.._common.state_files`) and only a *manifest* in the value's ``kernel`` field (``left`` / ``right``
empty)::

    "CQF1" | token (16 B) | u64 base | snapshot token (16 B) | u64 snapshot bytes | u64 start | u64 floor
           | u32 deltas | per delta: token (16 B) | u64 bytes

naming the snapshot file written at call index ``base`` and the delta files written at ``base + 1 ..
base + deltas`` (each call writes one or the other, so the indices are contiguous). ``start`` / ``floor``: the
index at which this line of versions started above the directory's files (a new group, a group whose state
Spark removed, a checkpoint from another layout) and the lowest file index present then, which the garbage
collection keeps while older versions may still be retained (:func:`.._common.state_files.collectable`).
A snapshot file is the full layout's three fields: ``"CQS1" | u64 x 3 lengths | kernel | left | right``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .._common import state_bytes as _state_bytes

__all__ = ["MAGIC", "FILES_MAGIC", "Delta", "LogInfo", "Manifest", "is_log", "is_manifest", "token_of", "parse",
           "snapshot_field", "append_delta", "pack_snapshot", "unpack_snapshot"]

MAGIC = b"CQL1"
FILES_MAGIC = b"CQF1"
_MANIFEST = struct.Struct("<4s16sQ16sQQQI")  # magic, token, base, snapshot token, snapshot bytes, start, floor, deltas
_MDELTA = struct.Struct("<16sQ")            # delta token, bytes
_SNAP = struct.Struct("<4sQQQ")             # magic, kernel / left / right lengths
_SMAGIC = b"CQS1"
_HEAD = struct.Struct("<4s16sIQ")     # magic, token, number of deltas, snapshot length
_LEN = struct.Struct("<Q")
_DELTA = struct.Struct("<4sqII")      # magic, watermark (ms), parts, emitted ids
_DMAGIC = b"CQD1"
_PART = struct.Struct("<BQ")          # side, IPC length
# Columns a delta part adds to the stored payload rows (never payload column names: those are __cq_k / __cq_p).
T_COL, END_COL, LO_COL, HI_COL = "__cq_d_t", "__cq_d_end", "__cq_d_lo", "__cq_d_hi"
_EXTRA = (T_COL, END_COL, LO_COL, HI_COL)


@dataclass
class LogInfo:
    """The size of a group's log: deltas since its snapshot and their bytes (decides the next snapshot)."""

    deltas: int
    snapshot_bytes: int
    delta_bytes: int


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


def is_log(blob) -> bool:
    """True when a state value's kernel field is a changelog (else the full layout's packed kernel)."""
    return blob is not None and len(blob) >= _HEAD.size and bytes(memoryview(blob)[:4]) == MAGIC


def is_manifest(blob) -> bool:
    """True when a state value's kernel field is a files-layout manifest."""
    return blob is not None and len(blob) >= _MANIFEST.size and bytes(memoryview(blob)[:4]) == FILES_MAGIC


def token_of(blob) -> bytes | None:
    """The version token of a changelog kernel field or a manifest (None for the full layout)."""
    return _HEAD.unpack_from(blob)[1] if is_log(blob) or is_manifest(blob) else None


@dataclass
class Manifest:
    """The files layout's state value: the files that hold a group's state (see the module docstring)."""

    token: bytes
    base: int                 # call index of the snapshot file
    snapshot_token: bytes
    snapshot_bytes: int
    start: int = 0            # the line of versions started here, above every file then present ...
    floor: int = 0            # ... of which the lowest index was this
    deltas: list = field(default_factory=list)   # (token, bytes) of the delta files at base + 1, base + 2, ...

    @property
    def index(self) -> int:
        """The call index of the write this manifest describes."""
        return self.base + len(self.deltas)

    @property
    def delta_bytes(self) -> int:
        """The bytes of the delta files."""
        return sum(n for _, n in self.deltas)

    def encode(self) -> bytes:
        """The manifest's bytes (the value's ``kernel`` field)."""
        return b"".join([_MANIFEST.pack(FILES_MAGIC, self.token, self.base, self.snapshot_token, self.snapshot_bytes,
                                        self.start, self.floor, len(self.deltas))]
                        + [_MDELTA.pack(t, n) for t, n in self.deltas])

    @classmethod
    def decode(cls, blob) -> Manifest:
        """The manifest of :meth:`encode`."""
        view = memoryview(blob)
        _, token, base, snap, snap_bytes, start, floor, n = _MANIFEST.unpack_from(view)
        if len(view) != _MANIFEST.size + n * _MDELTA.size:
            raise ValueError("join state: the files manifest is truncated or corrupt; restore from an earlier "
                             "checkpoint")
        deltas = [_MDELTA.unpack_from(view, _MANIFEST.size + i * _MDELTA.size) for i in range(n)]
        return cls(token, base, snap, snap_bytes, start, floor, [(bytes(t), int(m)) for t, m in deltas])


def pack_snapshot(kernel: bytes, left: bytes, right: bytes) -> bytes:
    """A snapshot file's bytes: the full layout's three fields."""
    return b"".join((_SNAP.pack(_SMAGIC, len(kernel), len(left), len(right)), kernel, left, right))


def unpack_snapshot(blob) -> tuple[memoryview, memoryview, memoryview]:
    """The three fields of a snapshot file (views into ``blob``)."""
    view = memoryview(blob)
    magic, nk, nl, nr = _SNAP.unpack_from(view)
    if magic != _SMAGIC or len(view) != _SNAP.size + nk + nl + nr:
        raise ValueError("join state: a snapshot file is truncated or corrupt; restore from an earlier checkpoint")
    pos = _SNAP.size
    return view[pos:pos + nk], view[pos + nk:pos + nk + nl], view[pos + nk + nl:]


def parse(blob) -> tuple[bytes, memoryview, list, LogInfo]:
    """``(token, kernel snapshot, [delta, ...], LogInfo)`` of a changelog kernel field (views into ``blob``)."""
    view = memoryview(blob)
    _, token, n, size = _HEAD.unpack_from(view)
    pos = _HEAD.size
    snapshot = view[pos:pos + size]
    pos += size
    deltas = []
    for _ in range(n):
        (m,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        deltas.append(view[pos:pos + m])
        pos += m
    if pos != len(view) or len(snapshot) != size:
        raise ValueError("join state: the changelog value is truncated or corrupt; restore from an earlier checkpoint")
    return token, snapshot, deltas, LogInfo(n, size, len(view) - _HEAD.size - size)


def snapshot_field(token: bytes, kernel_blob: bytes) -> bytes:
    """A kernel field holding the snapshot ``kernel_blob`` (the full layout's packed kernel) and no delta."""
    return _HEAD.pack(MAGIC, token, 0, len(kernel_blob)) + kernel_blob


def append_delta(blob, token: bytes, delta: bytes) -> bytes:
    """The kernel field ``blob`` with one more delta, under the new version ``token``."""
    _, _, n, size = _HEAD.unpack_from(blob)
    return b"".join((_HEAD.pack(MAGIC, token, n + 1, size), memoryview(blob)[_HEAD.size:], _LEN.pack(len(delta)),
                     delta))
