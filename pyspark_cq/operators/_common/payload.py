"""What the stateful joins share on Spark's Python workers: the transport's input tag and kept fraction
columns, the rows of a group per input (:func:`split_sides`), the payload tables the kernels address by id
(:class:`PayloadSide`) and the event-time timeout (:func:`timeout_ms`).

Used by :func:`pyspark_cq.interval_join`, :func:`pyspark_cq.window_join` and :func:`pyspark_cq.multi_join`.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa

from . import state_bytes as _state_bytes
from .shards import JOIN, check_shard_count, default_rule, with_shard_count

SIDE = "__cq_side"       # the input a row of the tagged union comes from (0, 1, ...)
KEPT = "__cq_kept"       # kept_column: the fraction of its micro-batch's input the row's shedding kept
# The key and input columns a join state was written with, in the schema metadata of its first payload
# table (PayloadSide.check_columns): JSON {"left_on": [...], "right_on": [...], "left": [...], ...}.
_COLUMNS_META = b"pyspark_cq.columns"


def timeout_ms(wm_ms: int, min_ends) -> int | None:
    """The event-time timeout (ms) at which the earliest stored row becomes evictable, or None.

    ``min_ends`` are the kernel's smallest expiry keys per side (:func:`evict_at_ms`), or None.
    """
    ends = [e for e in min_ends if e is not None]
    if not ends:
        return None
    # Spark fires an event-time timeout when timeout < watermark, so fire at watermark >= min(ends).
    return max(min(ends) - 1, wm_ms, 1)


def split_sides(frames, n: int) -> list:
    """The rows of a group's input ``frames`` per input (by the ``SIDE`` column): ``n`` frames, or ``n``
    Nones when there are no rows.
    """
    frames = [f for f in frames if len(f)]
    if not frames:
        return [None] * n
    if len(frames) > 1:
        # Column by column: a DataFrame concat in which one frame's column is all-NA (e.g. the other
        # side's payload, or a column null throughout one Arrow batch) makes pandas warn that it will
        # stop ignoring such entries when choosing the dtype; a Series concat of non-empty pieces
        # already keeps every piece's dtype, which is what the kernel's codecs are given anyway.
        pdf = pd.DataFrame({c: pd.concat([f[c] for f in frames], ignore_index=True) for c in frames[0].columns})
    else:
        pdf = frames[0]
    side = pdf[SIDE].to_numpy()
    return [pdf[side == i].reset_index(drop=True) for i in range(n)]


class PayloadSide:
    """One input's payload rows (Arrow) addressed by the kernel's payload ids."""

    def __init__(self, schema: pa.Schema, table: pa.Table | None = None):
        self.schema = schema
        self.table = table if table is not None else schema.empty_table()

    def append(self, table: pa.Table) -> np.ndarray:
        """Append ``table``'s rows; returns their payload ids."""
        start = self.table.num_rows
        self.table = pa.concat_tables([self.table, table]) if start else table
        return np.arange(start, start + table.num_rows, dtype=np.int64)

    def take(self, ids) -> pa.Table:
        """The rows ``ids``, in that order."""
        return self.table.take(pa.array(ids, type=pa.int64()))

    def canonicalize(self, kernel, side: int) -> None:
        """Reorder the payload to the kernel's serialization order (renumbering the kernel's ids).

        Moving the state between the JVM and Python costs far more per byte than this ``take``
        (see docs/join.md): it drops dead rows, puts each key's rows next to each other (the payload's
        columns compress better) and makes the kernel image's ids implicit (kernel state format 3).
        """
        self.keep(kernel.canonical_ids(side, self.table.num_rows))

    def keep(self, ids) -> None:
        """Keep only the rows ``ids``, in that order (the kernel's new ids are their positions)."""
        ids = np.asarray(ids)
        if len(ids) == self.table.num_rows and (len(ids) == 0 or (ids[0] == 0 and (np.diff(ids) == 1).all())):
            return  # already in order (e.g. a batch without input)
        self.table = self.take(ids).combine_chunks()

    def to_bytes(self, shards: int | None = None, columns: dict | None = None) -> bytes:
        """The payload as bytes; ``shards`` (the shard layout) is recorded for :meth:`check_shards`,
        ``columns`` (the operator's key and input columns) for :meth:`check_columns`.
        """
        table = self.table if shards is None else with_shard_count(self.table, shards)
        if columns is not None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                   _COLUMNS_META: json.dumps(columns).encode()})
        return _state_bytes.table_to_bytes(table)

    def check_columns(self, columns: dict, operator: str) -> None:
        """Refuse state written with other key or input columns (recorded by :meth:`to_bytes`): its rows
        would be matched on the wrong keys or read into the wrong columns, a silently wrong result.
        States saved before the columns were recorded pass.
        """
        saved = (self.table.schema.metadata or {}).get(_COLUMNS_META)
        if saved is None:
            return
        saved = {"kept": False, **json.loads(saved)}   # recorded before kept_column existed: without it
        changed = [k for k in columns if saved.get(k) != columns[k]]
        if changed:
            raise ValueError(
                f"{', '.join(changed)}: this checkpoint's {operator} state was written with "
                f"{', '.join(f'{k}={saved.get(k)}' for k in changed)}, the query now has "
                f"{', '.join(f'{k}={columns[k]}' for k in changed)}. Keep the join keys, the inputs' columns and "
                f"kept_column for the life of a checkpoint, or start with a new checkpoint location.")

    def check_shards(self, shards: int | None) -> None:
        """Refuse state written with another shard count, e.g. after ``spark.sql.shuffle.partitions``
        changed under the default ``shards``.
        """
        if shards is not None:
            check_shard_count(self.table, shards, JOIN, default_rule(JOIN))

    @classmethod
    def from_bytes(cls, schema: pa.Schema, blob: bytes) -> PayloadSide:
        """The payload saved by :meth:`to_bytes`."""
        return cls(schema, _state_bytes.table_from_bytes(blob))
