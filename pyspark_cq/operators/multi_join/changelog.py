"""``multi_join``'s delta (``state_persistence="changelog"`` / ``"files"``, issue 39): what one batch did to a shard.

The value's framing, the manifest, the snapshot files and when a snapshot is due are the interval join's
(:mod:`.._common.changelog`). A delta here is the batch's *mutations of the state, in the order they ran*,
recorded where they happen -- on the kernel and the payload tables the batch was given (:class:`Recorder`), so
no code path of the operator (plain, chunked, left inputs, constraints) needs its own logging:

* ``append``: rows appended to input ``i``'s payload table (the table as appended; ids follow from the order);
* ``store``: the kernel's ``store`` half of ``insert_probe`` / ``store`` (keys, times, payload ids, null mask,
  expiry keys);
* ``remove``: ``remove_ids`` (rows the stream constraints dropped; the decision is recorded, not re-made);
* ``evict``: ``evict(i, threshold)`` (the staged eviction is deterministic given the same rows);
* ``arrive``: a batch's stored rows of input ``i`` counted by its ``clustered`` / ``ordered`` trackers (their
  keys as tracked and times: :meth:`.arrivals.InputArrivals.arrive`, deterministic);
* ``forget``: the trackers' records forgotten at a watermark (:meth:`.arrivals.InputArrivals.forget`);

and, with a left input, the waiting tuples' table as the batch left it (whole: it changes in ways a row log
would not capture cheaply, and it holds only the tuples still waiting). Probing does not change the kernel's
state (MJoin keeps no partial match), so replaying these calls on the snapshot rebuilds the same rows, chains,
expiry stages and payload ids (appends after the same snapshot). The native kernel needs no new call: the
rows inserted and the eviction thresholds are what the batch passed to it anyway.

Bytes: ``"CQM1" | u32 ops | u8 pending`` then per op ``u8 kind | u8 input | i64 threshold | u64 m | m B``
(an Arrow IPC table, zstd, for the other kinds), then ``u64 m | pending table``. A delta with ``arrive`` /
``forget`` ops starts ``"CQM2"`` (the same layout; a reader that knows only CQM1 refuses it instead of
misreading the new kinds); CQM1 deltas, written before, decode as they did.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .._common import state_bytes as _state_bytes

__all__ = ["Delta", "Recorder"]

_HEAD = struct.Struct("<4sIB")     # magic, ops, has pending
_OP = struct.Struct("<BBqQ")       # kind, input, threshold, blob length
_LEN = struct.Struct("<Q")
_MAGIC = b"CQM1"
_MAGIC_ARRIVALS = b"CQM2"   # the same layout, with ARRIVE / FORGET ops (clustered / ordered constraints)
APPEND, STORE, REMOVE, EVICT, ARRIVE, FORGET = range(6)
_THRESHOLD_OPS = (EVICT, FORGET)   # an op that is one int64 (no table)


@dataclass
class Delta:
    """One micro-batch's changes to a ``multi_join`` shard (see the module docstring)."""

    ops: list = field(default_factory=list)   # (kind, input, payload): table (APPEND), dict of arrays, int
    pending: pa.Table | None = None

    def encode(self) -> bytes:
        """The delta's bytes."""
        magic = _MAGIC_ARRIVALS if any(kind in (ARRIVE, FORGET) for kind, _, _ in self.ops) else _MAGIC
        out = [_HEAD.pack(magic, len(self.ops), self.pending is not None)]
        for kind, i, payload in self.ops:
            if kind in _THRESHOLD_OPS:
                out.append(_OP.pack(kind, i, int(payload), 0))
                continue
            table = payload if kind in (APPEND, ARRIVE) else pa.table(
                {k: pa.array(np.ascontiguousarray(v)) for k, v in payload.items() if v is not None})
            blob = _state_bytes.table_to_bytes(table)
            out += [_OP.pack(kind, i, 0, len(blob)), blob]
        if self.pending is not None:
            blob = _state_bytes.table_to_bytes(self.pending)
            out += [_LEN.pack(len(blob)), blob]
        return b"".join(out)

    @classmethod
    def decode(cls, blob) -> Delta:
        """The delta of :meth:`encode`."""
        view = memoryview(blob)
        magic, n_ops, has_pending = _HEAD.unpack_from(view)
        if magic not in (_MAGIC, _MAGIC_ARRIVALS):
            raise ValueError("multi_join state: a delta is corrupt (bad magic); restore from an earlier checkpoint")
        pos, delta = _HEAD.size, cls()
        for _ in range(n_ops):
            kind, i, threshold, size = _OP.unpack_from(view, pos)
            pos += _OP.size
            if kind > FORGET or (kind in (ARRIVE, FORGET) and magic != _MAGIC_ARRIVALS):
                raise ValueError(f"multi_join state: a delta holds an unknown operation {kind}; restore from an "
                                 f"earlier checkpoint")
            if kind in _THRESHOLD_OPS:
                delta.ops.append((kind, i, threshold))
                continue
            table = _state_bytes.table_from_bytes(_part(view, pos, size))
            pos += size
            delta.ops.append((kind, i, table if kind in (APPEND, ARRIVE) else
                              {name: table.column(name).to_numpy() for name in table.schema.names}))
        if has_pending:
            (size,) = _LEN.unpack_from(view, pos)
            pos += _LEN.size
            delta.pending = _state_bytes.table_from_bytes(_part(view, pos, size))
            pos += size
        if pos != len(view):
            raise ValueError("multi_join state: a delta is truncated or corrupt; restore from an earlier checkpoint")
        return delta

    def replay(self, kernel, sides, arrivals=None) -> pa.Table | None:
        """Repeat the recorded calls on ``kernel``, the payload ``sides`` and the ``clustered`` / ``ordered``
        trackers ``arrivals`` (:class:`.arrivals.InputArrivals`; None: the query declares none now, their ops
        are skipped) -- the state the delta was recorded on; returns the waiting tuples' table (None without a
        left input).
        """
        for kind, i, payload in self.ops:
            if kind in (ARRIVE, FORGET):
                if arrivals:
                    if kind == ARRIVE:
                        arrivals.arrive(i, payload.column("key").combine_chunks(), payload.column("t").to_numpy())
                    else:
                        arrivals.forget(payload)
                continue
            if kind == APPEND:
                sides[i].append(payload)
            elif kind == STORE:
                kernel.store(i, payload["keys"], payload["times"], payload["ids"], payload.get("null_key"),
                             payload.get("ends"))
            elif kind == REMOVE:
                kernel.remove_ids(i, payload["ids"])
            else:
                kernel.evict(i, payload)
        return self.pending


def _part(view: memoryview, pos: int, size: int) -> memoryview:
    """``size`` bytes of a delta from ``pos``; a ValueError when the delta ends first."""
    if pos + size > len(view):
        raise ValueError("multi_join state: a delta is truncated or corrupt; restore from an earlier checkpoint")
    return view[pos:pos + size]


class _Kernel:
    """The kernel, with its state-changing calls recorded in a :class:`Delta` (the others pass through)."""

    def __init__(self, kernel, delta: Delta):
        self._kernel, self._delta = kernel, delta

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def _stored(self, i, keys, times, ids, null_key, ends) -> None:
        arrays = {"keys": keys, "times": times, "ids": ids, "null_key": null_key, "ends": ends}
        self._delta.ops.append((STORE, int(i), {k: None if v is None else np.asarray(
            v, dtype=np.uint8 if k == "null_key" else np.int64).copy() for k, v in arrays.items()}))

    def insert_probe(self, input, keys, times, ids, null_key, order, ends=None):
        out = self._kernel.insert_probe(input, keys, times, ids, null_key, order, ends)
        self._stored(input, keys, times, ids, null_key, ends)
        return out

    def store(self, input, keys, times, ids, null_key=None, ends=None):
        self._kernel.store(input, keys, times, ids, null_key, ends)
        self._stored(input, keys, times, ids, null_key, ends)

    def remove_ids(self, input, ids):
        ids = np.asarray(ids, dtype=np.int64).copy()
        self._delta.ops.append((REMOVE, int(input), {"ids": ids}))
        return self._kernel.remove_ids(input, ids)

    def evict(self, input, threshold):
        self._delta.ops.append((EVICT, int(input), int(threshold)))
        return self._kernel.evict(input, threshold)


class _Side:
    """A payload table whose appends are recorded in a :class:`Delta` (everything else is the table's)."""

    def __init__(self, side, delta: Delta, i: int):
        object.__setattr__(self, "_parts", (side, delta, i))

    def __getattr__(self, name):
        return getattr(self._parts[0], name)

    def __setattr__(self, name, value):
        setattr(self._parts[0], name, value)

    def append(self, table: pa.Table) -> np.ndarray:
        side, delta, i = self._parts
        delta.ops.append((APPEND, i, table))
        return side.append(table)


class _Arrivals:
    """The ``clustered`` / ``ordered`` trackers, with their state-changing calls recorded in a :class:`Delta`."""

    def __init__(self, arrivals, delta: Delta):
        self._arrivals, self._delta = arrivals, delta

    def __getattr__(self, name):
        return getattr(self._arrivals, name)

    def __bool__(self) -> bool:
        return bool(self._arrivals)

    def arrive(self, i, keys, micros) -> int:
        table = pa.table({"key": keys, "t": pa.array(np.asarray(micros, dtype=np.int64))})
        self._delta.ops.append((ARRIVE, int(i), table))
        return self._arrivals.arrive(i, keys, micros)

    def forget(self, wm_ms) -> None:
        self._delta.ops.append((FORGET, 0, int(wm_ms)))
        self._arrivals.forget(wm_ms)


class Recorder:
    """The kernel, payload tables and arrival trackers of one batch, recording what changes them into
    :attr:`delta`.
    """

    def __init__(self, kernel, sides, arrivals=None):
        self.delta = Delta()
        self.kernel = _Kernel(kernel, self.delta)
        self.sides = [_Side(s, self.delta, i) for i, s in enumerate(sides)]
        self.arrivals = _Arrivals(arrivals, self.delta) if arrivals else arrivals
