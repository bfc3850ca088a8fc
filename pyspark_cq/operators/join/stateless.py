"""``interval_join(..., state_persistence="stateless")``: the join in a *stateless* Spark stage (issue 39).

The tagged union goes through ``repartition`` by shard (one task per core) into a ``mapInPandas`` step that runs
:meth:`.worker.JoinWorker.streaming` per shard with a :class:`~.._common.batch_versions.VersionedGroupState`
in place of Spark's ``GroupState``: the worker keeps its state as in the files layout (snapshot and delta files,
the objects resident in the Python worker), and the manifest that ``GroupState`` would hold is a version per
micro-batch in files (:mod:`.._common.batch_versions`: why, and the rules that keep it exactly-once).

What Spark does around ``applyInPandasWithState``, done here:

* **The watermark.** Each shard's version records the latest event time of each input among the rows it has
  seen (its *clock*) and the watermark the batch ran with. A shard reads every shard's newest version before
  this batch: the maximum of their clocks gives Spark's watermark of this batch (:func:`spark_watermark`).
* **Late rows.** Spark drops the rows of a group's input whose event time is at or before the previous batch's
  watermark before the function sees them (event-time timeout; ``FlatMapGroupsWithStateExec``). That watermark
  is the one recorded by the shards that ran in the previous batch, or, when none ran (its input had no row),
  this batch's (no clock moved).
* **No timeouts.** A shard runs only in a batch that brings it rows; an inner join's rows do not depend on when
  its state is evicted, only its size does (between two batches of a shard its expired rows stay).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._common import changelog as _changelog
from .._common.batch_versions import (
    BatchVersions,
    VersionedGroupState,
    batch_context,
    parse_version,
    spark_watermark,
    trunc_ms,
)
from .._common.payload import SIDE
from .worker import MICROS, SHARD, JoinWorker

__all__ = ["StatelessShards", "VERSIONS_DIR"]

#: The sub-directory of ``state_dir`` holding each shard's versions (beside the snapshot and delta files).
VERSIONS_DIR = "versions"


class StatelessShards:
    """``mapInPandas`` function: the shards of one partition of the tagged union for one micro-batch.

    ``delays_ms``: each input's watermark delay; ``policy``: ``spark.sql.streaming.multipleWatermarkPolicy``.
    """

    def __init__(self, worker: JoinWorker, delays_ms: tuple[int, int], policy: str, what: str):
        self.worker, self.delays_ms, self.policy, self.what = worker, tuple(delays_ms), policy, what

    def __call__(self, frames):
        """The packed output rows of every shard in the partition's rows ``frames``."""
        parts = [p for p in frames if len(p)]
        if not parts:
            return
        batch, query = batch_context(self.what)
        root = self.worker.config.state_dir
        versions = _changelog.state_files(f"{root.rstrip('/')}/{VERSIONS_DIR}", "docs/join.md")
        wm_ms, late_ms = self._watermarks(versions, query, batch)
        pdf = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        for shard, rows in pdf.groupby(SHARD, sort=True):
            mine = BatchVersions(versions, (int(shard),), query, batch, self.what)
            value, clock = (None, [None, None]) if mine.value is None else mine.value[:2]
            clock = list(clock)
            for side in (0, 1):
                micros = rows[MICROS].to_numpy()[rows[SIDE].to_numpy() == side]
                micros = micros[~pd.isna(micros)]
                if len(micros):
                    latest = trunc_ms(int(np.max(micros)))
                    clock[side] = latest if clock[side] is None else max(clock[side], latest)
            # Spark's filter of late rows (the previous batch's watermark), before the function sees them
            times = rows[MICROS]
            rows = rows[~(times.notna() & (times <= late_ms * 1000))].reset_index(drop=True)
            state = VersionedGroupState(value, wm_ms)
            yield from self.worker.streaming((int(shard),), [rows], state)
            mine.save((state.new, clock, wm_ms))

    def _watermarks(self, versions, query: str, batch: int) -> tuple[int, int]:
        """The watermark of ``batch`` and of the batch before (late rows), from every shard's newest version
        before ``batch``: ``(clock, watermark it ran with)`` of each.
        """
        clocks, previous = [None, None], None
        for shard in versions.groups():
            peer = BatchVersions(versions, shard, query, batch, self.what)
            if peer.value is None:
                continue
            _, clock, ran_with = peer.value
            for side in (0, 1):
                if clock[side] is not None:
                    clocks[side] = clock[side] if clocks[side] is None else max(clocks[side], clock[side])
            if parse_version(peer.read) == batch - 1:
                previous = ran_with
        wm = spark_watermark(clocks, self.delays_ms, self.policy)
        return wm, wm if previous is None else previous
