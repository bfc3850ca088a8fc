"""The Spark-facing functions of the aggregation's stateful stage, one per transport: the row and packed
transports under ``applyInPandasWithState`` (:class:`StatefulShard`) and a batch DataFrame under
``applyInPandas`` (:class:`BatchShard`, with Spark's own partial aggregation: :func:`encode_float_partials`).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator  # typing.Iterator: what PySpark inspects to pick the iterator form

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import types as T

from ..._native import load
from .._common import metrics as _metrics
from .._common.arrow import to_arrow
from .config import _FLOAT_OPS, BAD, METRICS, SHED_COL, SLICES, TAG, AggConfig, partial_name, read_entry
from .shard import _int64, run_shard
from .spec import OP_COUNT, OP_MIN_F, OP_SUM_F, OP_SUM_HI, arrow_type

__all__ = ["unpack_slices", "StatefulShard", "encode_float_partials", "join_sum_halves", "BatchShard", "batch_function"]

# Spark's applyInPandasWithState pads each returned frame with an all-null frame (pyspark/worker.py),
# which makes pandas 2 warn once per report row; the warning is about Spark's code, not ours.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\.worker",
                        message="The behavior of DataFrame concatenation with empty or all-NA entries")

# ---- Spark-facing wrappers --------------------------------------------------------------------------

def _arrow_schema(sliced: T.StructType) -> pa.Schema:
    """Arrow schema of the sliced rows the stateful side reads (the all-null tag column is not read)."""
    return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in sliced.fields if f.name != TAG])

def unpack_slices(schema: pa.Schema, frames: list[pd.DataFrame]) -> tuple[pa.Table, tuple[int, int]]:
    """The slices of packed stateful input (frames of :meth:`AggConfig.packed_schema`'s first four
    columns; ``schema``: :meth:`AggConfig.slices_arrow_schema`) and its malformed and shed row counts.
    """
    batches, bad, shed = [], 0, 0
    for pdf in frames:
        bad += int(pdf[BAD].sum())
        shed += int(pdf[SHED_COL].sum())
        batches += [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for b in pdf[SLICES] if len(b)]
    return pa.Table.from_batches(batches, schema=schema), (bad, shed)


class StatefulShard:
    """``applyInPandasWithState`` function: one shard, one micro-batch. ``packed``: the input is the
    packed transport (:meth:`AggConfig.packed_schema`), else the row transport (``sliced``).
    """

    def __init__(self, config: AggConfig, sliced: T.StructType, packed: bool = False):
        self.config, self.packed = config, packed
        self.arrow_schema = config.slices_arrow_schema() if packed else _arrow_schema(sliced)
        self.out_schema = _metrics.arrow_schema(config.output_schema())

    def __call__(self, key, pdfs, state):
        """One shard's micro-batch: its output rows and report, packed in one row."""
        config = self.config
        frames = [p for p in pdfs if len(p)]
        counts = None
        if self.packed:
            table, counts = unpack_slices(self.arrow_schema, frames)
        elif frames:
            table = pa.concat_tables([to_arrow(p, self.arrow_schema) for p in frames])
        else:
            table = self.arrow_schema.empty_table()
        wm_us = None
        if config.watermark:
            wm_us = int(state.getCurrentWatermarkMs()) * 1000
        saved = state.get if state.exists else None
        result = run_shard(config, table, saved, wm_us, read_entry(config), counts)
        state.update(result.state)
        if config.watermark:
            # Fire at the next watermark advance even without data (no-data batches), so windows close.
            state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 1))
        yield _metrics.packed_row(result.output, self.out_schema, METRICS, **result.metrics)


def encode_float_partials(config: AggConfig, table: pa.Table) -> pa.Table:
    """Turn partials computed by Spark's aggregation (doubles, null without values) into the kernel's
    int64 encoding: sums bit-cast, min/max as order keys, identities where the column had no value.
    """
    ops = config.spec.ops
    count_of = {col: j for j, (op, col) in enumerate(ops) if op == OP_COUNT}
    kernel = load("_aggregate")
    for j, (op, col) in enumerate(ops):
        if op not in _FLOAT_OPS:
            continue
        name = partial_name(j)
        empty = _int64(table, partial_name(count_of[col])) == 0
        values = np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
        if op == OP_SUM_F:
            encoded = np.where(empty, 0.0, values).view(np.int64)  # all-null slice: Spark's sum is null
        else:
            identity = np.iinfo(np.int64).max if op == OP_MIN_F else np.iinfo(np.int64).min
            encoded = np.where(empty, identity, kernel.f64_keys(values))
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(encoded, type=pa.int64()))
    return table


def join_sum_halves(config: AggConfig, table: pa.Table) -> pa.Table:
    """Turn an integral sum computed by Spark's aggregation as the sum of the low halves
    (``v & 0xFFFFFFFF``, see ``_native_slices``) into the kernel's wrapped sum, ``high * 2**32 + low``
    modulo 2**64, where its high-half partial (``OP_SUM_HI``) follows it. Summing halves never
    overflows (fewer than 2**31 rows per slice), so Spark's ANSI mode cannot raise its own error first.
    """
    for j, (op, _col) in enumerate(config.spec.ops):
        if op != OP_SUM_HI:
            continue
        low, high = _int64(table, partial_name(j - 1)), _int64(table, partial_name(j))
        wrapped = (high.view(np.uint64) << np.uint64(32)) + low.view(np.uint64)
        name = partial_name(j - 1)
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(wrapped.view(np.int64), type=pa.int64()))
    return table


class BatchShard:
    """``applyInPandas`` function for batch DataFrames: all slices of one shard at once, no state."""

    def __init__(self, config: AggConfig, sliced: T.StructType, float_partials: bool = False):
        self.config = config
        self.arrow_schema = _arrow_schema(sliced)
        self.float_partials = float_partials

    def __call__(self, pdfs):
        """All slices of one shard: the output rows, then the report row."""
        frames = [to_arrow(p, self.arrow_schema) for p in pdfs if len(p)]
        table = pa.concat_tables(frames) if frames else self.arrow_schema.empty_table()
        if self.float_partials:
            table = join_sum_halves(self.config, encode_float_partials(self.config, table))
        result = run_shard(self.config, table, None, None, read_entry(self.config))
        if result.output.num_rows:
            yield _metrics.data_rows(_metrics.to_pandas(result.output))
        yield _metrics.metrics_row(list(self.config.out_names), **result.metrics)


def batch_function(config: AggConfig, sliced: T.StructType, float_partials: bool = False):
    """The iterator form of ``applyInPandas`` (inferred from the type hints), so data and report rows
    are converted to Arrow separately.
    """
    runner = BatchShard(config, sliced, float_partials)

    def apply_shard(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from runner(batches)

    return apply_shard
