"""``multi_join``'s ``clustered`` / ``ordered`` bookkeeping (STREAM, Motwani, Widom et al., §5.2): per shard and
constrained input the arrival positions of :class:`pyspark_cq.constraints.Clusters` /
:class:`~pyspark_cq.constraints.KeyOrder` (one place for the trackers: :mod:`pyspark_cq.constraints`).

Keys are tracked as the join compares them: the kernel's int64 key for direct key types (the value itself), the
key values for hashed ones (strings, decimals, ...; so a hash collision never closes another key). Arrival order
is the interval join's: per shard, micro-batch after micro-batch, inside one batch by event time, then key.

State format (input 0's payload schema metadata, docs/constraints.md): :data:`FORMAT_META` ``= b"2"`` and the
trackers' :meth:`~pyspark_cq.constraints.Arrivals.to_metadata` entries when the join declares arrival
constraints; a state without the entry (format 1, every state written before) restores with empty trackers, which
only keeps more rows (a key without a record is never closed).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import constraints as _constraints
from .._common.codec import encode_keys

__all__ = ["FORMAT", "FORMAT_META", "InputArrivals", "strip_metadata"]

#: The multi_join state format: 1 (no entry) without arrival positions, 2 with them.
FORMAT = 2
FORMAT_META = b"pyspark_cq.multi_join.format"


def _byte_keys(keys: pa.Array) -> pa.Array:
    """Keys as the byte strings :class:`~pyspark_cq.constraints.Clusters` groups by (equal under SQL equality)."""
    offsets, data, _ = encode_keys([keys], None)
    return _constraints.key_bytes(offsets, data)


def strip_metadata(metadata: Mapping[bytes, bytes] | None) -> dict[bytes, bytes]:
    """Schema metadata without the format entry and the trackers (before new ones are written)."""
    return {k: v for k, v in (metadata or {}).items()
            if k != FORMAT_META and not k.startswith(_constraints.Arrivals.META)}


class InputArrivals:
    """The ``clustered`` / ``ordered`` trackers of one shard of an ``n``-input join.

    ``reach_us[i]``: how long after its time a row of input i can still join (the largest ``t_j - t_i`` the
    bounds allow): a key's cluster record is forgotten once the watermark passes its last row's reach (then its
    later rows of other inputs are kept as without the constraint; forgetting only keeps more).
    """

    def __init__(self, constraints: Sequence[_constraints.Constraint], reach_us: Sequence[int]):
        self.arrivals = _constraints.Arrivals(constraints)
        self.reach_us = tuple(int(r) for r in reach_us)

    def __bool__(self) -> bool:
        return bool(self.arrivals)

    def on(self, i: int) -> list:
        """The (kind, tracker) pairs of input ``i``."""
        return self.arrivals.on(str(i))

    def arrive(self, i: int, keys: pa.Array, micros: np.ndarray) -> int:
        """Count one batch's stored rows of input ``i`` (``keys`` as tracked, ``micros`` their times; no nulls)
        in arrival order; returns the rows that break a constraint (of a switched-off one too).
        """
        trackers = self.on(i)
        if not trackers or not len(keys):
            return 0
        micros = np.asarray(micros, dtype=np.int64)
        order = _constraints.arrival_order(micros, [keys])
        keys = keys.take(pa.array(order))
        found = 0
        for kind, tracker in trackers:
            if kind == "clustered":
                expire = -(-(micros[order] + self.reach_us[i]) // 1000)
                found += tracker.advance(_byte_keys(keys), expire)
            else:
                found += tracker.advance(pa.table({"k0": keys}))
        return found

    def forget(self, wm_ms: int) -> None:
        """Forget the cluster records whose reach the watermark has passed."""
        for tracker in self.arrivals.trackers.values():
            if isinstance(tracker, _constraints.Clusters):
                tracker.forget(wm_ms)

    def closed(self, j: int, kinds: Sequence[str], keys: pa.Array) -> np.ndarray | None:
        """Per key of ``keys`` (as tracked), whether input ``j``'s enabled arrival constraints ``kinds`` say no row
        of it comes on ``j`` again (cluster closed, or below the key bound); None when ``j`` has none.
        """
        trackers = [(kind, t) for kind, t in self.on(j) if kind in kinds]
        if not trackers:
            return None
        out = np.zeros(len(keys), dtype=bool)
        if not len(keys):
            return out
        for kind, tracker in trackers:
            if kind == "ordered":
                out |= tracker.below(pa.table({"k0": keys}))
                continue
            shut = tracker.closed()
            if len(shut):
                out |= pc.is_in(_byte_keys(keys), value_set=shut).to_numpy(zero_copy_only=False).astype(bool)
        return out

    def metadata(self) -> dict[bytes, bytes]:
        """The schema metadata entries that hold the trackers (format :data:`FORMAT`)."""
        return {FORMAT_META: str(FORMAT).encode(), **self.arrivals.to_metadata()}

    def restore(self, metadata: Mapping[bytes, bytes] | None) -> InputArrivals:
        """The trackers saved in ``metadata`` (input 0's payload schema metadata); a state of format 1 (written
        before arrival positions were kept) gives empty trackers. Refuses a newer format.
        """
        version = int((metadata or {}).get(FORMAT_META, b"1"))
        if version > FORMAT:
            raise ValueError(f"multi_join state: this checkpoint was written in state format {version} by a newer "
                             f"pyspark_cq (this one reads formats 1 to {FORMAT}); upgrade pyspark_cq or start with "
                             f"a new checkpoint location")
        if version >= 2:
            self.arrivals.restore(metadata)
        return self
