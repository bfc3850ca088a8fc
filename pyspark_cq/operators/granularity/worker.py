"""Worker side of :func:`pyspark_cq.granularity` (Γ): each Arrow batch rounded with the compiled kernel
(``mapInArrow``).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..._native import load

__all__ = []

_STATUS = "__cq_status"


class _RoundBatches:
    """The worker side of Γ: rounds each Arrow batch with the compiled kernel."""

    def __init__(self, start: str, end: str, g: int):
        self.start, self.end, self.g = start, end, g

    def __call__(self, batches):
        kernel = load("_granularity")
        for batch in batches:
            yield self.round_batch(kernel, batch)

    def round_batch(self, kernel, batch: pa.RecordBatch) -> pa.RecordBatch:
        s_arr = batch.column(batch.schema.get_field_index(self.start))
        e_arr = batch.column(batch.schema.get_field_index(self.end))
        valid = None
        if s_arr.null_count or e_arr.null_count:
            valid = pc.and_(s_arr.is_valid(), e_arr.is_valid()).to_numpy(zero_copy_only=False)
        s = _ticks(s_arr)
        e = _ticks(e_arr)
        rs, re, status = kernel.round_intervals(s, e, self.g, valid=valid, on_invalid="flag")
        cols = list(batch.columns)
        names = batch.schema.names
        cols[names.index(self.start)] = pa.array(rs).cast(s_arr.type)
        cols[names.index(self.end)] = pa.array(re).cast(e_arr.type)
        cols.append(pa.array(status, type=pa.int8()))
        return pa.RecordBatch.from_arrays(cols, names=names + [_STATUS])


def _ticks(arr: pa.Array):
    """int64 numpy view of a timestamp / integer Arrow array (nulls become 0; the caller masks them)."""
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.timestamp("us", tz=arr.type.tz)).cast(pa.int64())
    else:
        arr = arr.cast(pa.int64())
    return arr.fill_null(0).to_numpy(zero_copy_only=False)
