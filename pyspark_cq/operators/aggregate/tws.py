"""The sliding aggregation's stateful step on ``transformWithStateInPandas`` (Spark 4's state API v2).

An alternative state home for :class:`~pyspark_cq.operators.aggregate.transport.StatefulShard` (issue 14): the
same per-shard step (:func:`~pyspark_cq.operators.aggregate.shard.run_shard`) with the shard's ``(blob, keys)``
image in a ``ValueState`` and an event-time timer in place of ``GroupState`` and its timeout. Spark runs
it on the RocksDB state store only; each state call is one request to the task's state server.
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor

from .._common import metrics as _metrics
from .._common.arrow import to_arrow
from .config import METRICS, AggConfig, read_entry
from .shard import run_shard
from .transport import _arrow_schema, unpack_slices

__all__ = ["VALUE_SCHEMA", "TwsShard"]

#: Schema of the shard's ValueState (the same pair GroupState holds).
VALUE_SCHEMA = "blob binary, keys binary"


class TwsShard(StatefulProcessor):
    """``transformWithStateInPandas`` processor: one shard, one micro-batch."""

    def __init__(self, config: AggConfig, sliced, packed: bool = False):
        self.config, self.packed = config, packed
        self.arrow_schema = config.slices_arrow_schema() if packed else _arrow_schema(sliced)
        # the input columns read, in their order (the packed layout's first four; the tag is not read)
        self.in_names = config.packed_schema(None).names if packed else self.arrow_schema.names
        self.out_schema = _metrics.arrow_schema(config.output_schema())

    def init(self, handle) -> None:
        """Open the shard's state (one value: the ``(blob, keys)`` pair)."""
        self.handle = handle
        self.image = handle.getValueState("image", VALUE_SCHEMA)

    def _step(self, frames, watermark_ms):
        config = self.config
        # PySpark regroups the input row by row (itertuples), which renames the columns (a leading
        # underscore is not a namedtuple field): they arrive in the input layout's order, the null
        # watermark tag last
        names = self.in_names
        frames = [p.iloc[:, :len(names)].set_axis(names, axis=1) for p in frames if len(p)]
        counts = None
        if self.packed:
            table, counts = unpack_slices(self.arrow_schema, frames)
        else:
            frames = [to_arrow(p, self.arrow_schema) for p in frames]
            table = pa.concat_tables(frames) if frames else self.arrow_schema.empty_table()
        wm_us = max(int(watermark_ms), 0) * 1000 if config.watermark else None
        saved = self.image.get() if self.image.exists() else None
        result = run_shard(config, table, tuple(saved) if saved is not None else None, wm_us, read_entry(config),
                           counts)
        if result.state:
            self.image.update(result.state)
        else:
            self.image.clear()
        if config.watermark:
            # one pending timer per shard, just past the current watermark: the shard runs again at the
            # next watermark advance even without data, so windows close in no-data batches
            for t in list(self.handle.listTimers()):
                self.handle.deleteTimer(t)
            self.handle.registerTimer(max(int(watermark_ms), 0) + 1)
        return _metrics.packed_row(result.output, self.out_schema, METRICS, **result.metrics)

    def handleInputRows(self, key, rows, timerValues):
        """One shard's micro-batch with input."""
        yield self._step(list(rows), timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        """One shard's micro-batch without input (the watermark moved)."""
        yield self._step([], timerValues.getCurrentWatermarkInMs())

    def close(self) -> None:
        """Nothing to release."""
        pass

