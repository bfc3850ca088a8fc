"""``sliding_aggregate(..., state="files")``: the stateful step in a *stateless* Spark stage (issue 39).

The slices go through ``repartition`` by shard (one task per core: :func:`.._common.partitions.stage_partitions`)
into a ``mapInPandas`` step, and each shard's state (the same
native blob and keys as in ``GroupState``) is a version per micro-batch in files (:mod:`.._common.batch_versions`:
why, and the rules that keep it exactly-once). The watermark: every slicer task sends its latest event time to
every shard in its marker rows, so each shard keeps the maximum in its own state and derives the same watermark
as its peers, with no shared file; the marker rows also make every shard run in every micro-batch, so the
windows the watermark closes are emitted in the batch that closes them.

With one task (:class:`OneTask`, ``tasks=1``) there is no shuffle: the source's partitions are merged into one
Python task (``coalesce(1)``) that slices and runs every shard itself, the same functions on the same packed
slices, so the rows and the state files are those of the shuffled stage (a restart may switch between them).
A shuffle and a second Python stage cost about 200 ms per micro-batch on 2 cores (docs/benchmarks.md): far more
than the work of a small batch.
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common import offsets as _offsets
from .._common.batch_versions import BatchVersions, batch_context, spark_watermark, trunc_ms
from .config import MAXT, METRICS, SHARD, AggConfig, read_entry
from .shard import run_shard
from .slicer import Slicer
from .transport import unpack_slices

__all__ = ["FileShards", "OneTask"]


class FileShards:
    """``mapInPandas`` function of ``state="files"``: the shards of one partition for one micro-batch.

    ``root``: the state directory (``{query}`` filled in by the worker); ``delay_ms``: the watermark delay of
    the time column (None without a watermark).
    """

    def __init__(self, config: AggConfig, root: str, delay_ms: int | None):
        self.config, self.root, self.delay_ms = config, root, delay_ms
        self.slices_schema = config.slices_arrow_schema()
        self.out_schema = _metrics.arrow_schema(config.output_schema())

    def __call__(self, frames):
        """The packed output row of every shard in the partition's packed slices ``frames``."""
        parts = [p for p in frames if len(p)]
        if not parts:
            return
        what = f"sliding_aggregate {self.config.name!r}"
        batch, query = batch_context(what)
        files = _changelog.state_files(self.root, "docs/aggregate.md")
        pdf = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        entry = read_entry(self.config)
        # Spark's own watermark from the offset log where the task knows the checkpoint (.offsets), else computed
        spark = _offsets.task_watermarks(batch) if self.delay_ms is not None else None
        for shard, rows in pdf.groupby(SHARD, sort=True):
            versions = BatchVersions(files, (int(shard),), query, batch, what)
            yield self._shard(versions, rows, entry, None if spark is None else spark[0])

    def _shard(self, versions: BatchVersions, rows: pd.DataFrame, entry, spark_wm_ms: int | None):
        table, counts = unpack_slices(self.slices_schema, [rows])
        saved, max_ms = versions.value if versions.value is not None else (None, None)
        if self.delay_ms is None:
            wm_us = None
        else:
            wm_ms = spark_wm_ms if spark_wm_ms is not None else spark_watermark([max_ms], [self.delay_ms])
            wm_us = wm_ms * 1000
        result = run_shard(self.config, table, saved, wm_us, entry, counts)
        seen = rows[MAXT].dropna()
        if len(seen):
            latest = trunc_ms(int(seen.max()))
            max_ms = latest if max_ms is None else max(max_ms, latest)
        versions.save((result.state, max_ms))
        return _metrics.packed_row(result.output, self.out_schema, METRICS, **result.metrics)


class OneTask:
    """``mapInArrow`` function of ``state="files"`` with one task: the whole micro-batch's raw rows (after
    ``coalesce(1)``) sliced by :class:`~.slicer.Slicer` and handed to :class:`FileShards` in the same task.

    ``packed_schema``: the Arrow form of the stage's output (``_metrics.packed_schema``); the other arguments as
    for :class:`FileShards`.
    """

    def __init__(self, config: AggConfig, root: str, delay_ms: int | None, packed_schema: pa.Schema):
        self.slicer = Slicer(config, False, markers=True, packed=True, max_time=True)
        self.shards = FileShards(config, root, delay_ms)
        self.packed_schema = packed_schema

    def __call__(self, batches):
        """The packed output row of every shard, from the task's raw rows ``batches``."""
        slices = [b.to_pandas() for b in self.slicer(batches) if b.num_rows]
        for row in self.shards(slices):
            yield pa.RecordBatch.from_pandas(row, schema=self.packed_schema, preserve_index=False)
