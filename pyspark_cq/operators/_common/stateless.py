"""A stateful operator's per-shard function in a *stateless* Spark stage (issue 39): ``interval_join(...,
state_persistence="stateless")`` and ``multi_join(..., state_persistence="stateless")``.

The tagged union goes through ``repartition`` by shard (one task per core, :func:`.partitions.stage_partitions`)
into a ``mapInPandas`` step that runs the operator worker's ``streaming(key, frames, state)`` per shard with a
:class:`~.batch_versions.VersionedGroupState` in place of Spark's ``GroupState``: the worker keeps its state as in
the files layout (snapshot and delta files, the objects resident in the Python worker), and the manifest that
``GroupState`` would hold is a version per micro-batch in files (:mod:`.batch_versions`: why, and the rules that
keep it exactly-once).

What Spark does around ``applyInPandasWithState``, done here:

* **The watermark.** Spark's own: the one it wrote into the query's offset log for this batch (:mod:`.offsets`;
  the session's queries hand their tasks the checkpoint root). Where the checkpoint is not known (Spark Connect)
  the stage computes it: each shard's version records the latest event time of each input among the rows it has
  seen (its *clock*, one entry per input) and the watermark the batch ran with; a shard reads every shard's
  newest version before this batch, and the maximum of their clocks per input gives the watermark
  (:func:`~.batch_versions.spark_watermark`, with the session's ``spark.sql.streaming.multipleWatermarkPolicy``)
  -- Spark's, unless a filter on the time column between ``withWatermark`` and the operator drops an input's
  latest rows (Spark pushes other filters below ``withWatermark``) or the query has other watermarked inputs.
* **Late rows.** Spark drops the rows of a group's input whose event time is at or before the previous batch's
  watermark before the function sees them (event-time timeout; ``FlatMapGroupsWithStateExec``): the offset
  log's entry of the batch before; computed, the one recorded by the shards that ran in the previous batch, or,
  when none ran (its input had no row), this batch's (no clock moved).
* **No timeouts.** A shard runs only in a batch that brings it rows; an inner join's rows do not depend on when
  its state is evicted, only its size does (between two batches of a shard its expired rows stay).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import changelog as _changelog
from . import offsets as _offsets
from .batch_versions import BatchVersions, VersionedGroupState, batch_context, parse_version, spark_watermark, trunc_ms
from .payload import SIDE

__all__ = ["STATELESS", "STATELESS_RETAIN", "StatelessShards", "VERSIONS_DIR", "watermark_settings",
           "stateless_settings"]

#: The ``state_persistence`` value that runs an operator in a stateless stage.
STATELESS = "stateless"
#: The sub-directory of ``state_dir`` holding each shard's versions (beside the snapshot and delta files).
VERSIONS_DIR = "versions"
#: The versions whose snapshot and delta files a stateless stage keeps (the files layout's ``retain``): a batch
#: reads the newest version before it and only the last batch is ever run again, so no version older than the
#: one before the newest is read (:class:`~.batch_versions.BatchVersions` deletes them), where a stateful
#: operator keeps Spark's ``spark.sql.streaming.minBatchesToRetain`` (100) for Spark's state store.
STATELESS_RETAIN = 2


def watermark_settings(inputs, session) -> tuple[tuple[int, ...], str]:
    """``(delays_ms, policy)`` of a stateless stage: each input's ``withWatermark`` delay (ms) on its time column
    (``inputs``: ``(DataFrame, column)`` pairs, each checked to have one when the operator was defined) and the
    session's ``spark.sql.streaming.multipleWatermarkPolicy`` (``"min"``, Spark's default, where unreadable).
    """
    from ... import _validate

    delays = tuple(_validate.watermark_delay_ms(df, t) for df, t in inputs)
    try:
        policy = session.conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min") or "min"
    except Exception:   # a Connect server that does not return it: Spark's default
        policy = "min"
    return delays, policy.strip().lower()


def stateless_settings(snapshot_every, state_dir, session, name: str, inputs) -> tuple:
    """``(persistence, snapshot_every, state_dir, retain, delays_ms, policy)`` of a streaming operator in a stateless
    stage: the files layout's settings (:func:`.changelog.settings`) under ``state_dir``, else the ``"auto"``
    directory (:func:`.changelog.files_dir`: ValueError naming ``state_dir`` when there is none), with
    :data:`STATELESS_RETAIN`, and :func:`watermark_settings` of ``inputs``.
    """
    root = _changelog.files_dir(state_dir, session, name, "state_persistence='stateless'")
    persistence, every, root, _ = _changelog.settings("files", snapshot_every, root, streaming=True, session=session,
                                                      name=name)
    _offsets.watch(session)
    return (persistence, every, root, STATELESS_RETAIN, *watermark_settings(inputs, session))


_CHECKED: set[str] = set()   # the version directories this process has checked (and made)


def _check_layout(versions, what: str) -> None:
    """Make the version directory ``versions`` (a :class:`~.state_files.StateFiles`) before anything else is
    written; ValueError naming ``what`` when its parent already holds group directories without it: the
    stateful files layout wrote them, and their manifests are in Spark's state store, which this stage does not
    read. It is made first, so that a stage killed after its first snapshot is not mistaken for that.
    """
    if versions.root in _CHECKED:
        return
    from pyarrow import fs as pafs

    fs, path = versions.fs, versions.path
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        parent = path.rsplit("/", 1)[0]
        try:
            infos = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
        except FileNotFoundError:   # made or removed while listed: no group directory to find
            infos = []
        if any(i.type == pafs.FileType.Directory and i.base_name.startswith("g") for i in infos):
            raise ValueError(f"{what}: the state directory {parent!r} holds the state of the stateful layout "
                             "(state_persistence='files', or 'auto' where it took 'files'): its manifests are "
                             "in this checkpoint's Spark state store. Restart this checkpoint with "
                             "state_persistence='files', or start a new checkpoint and state_dir")
        fs.create_dir(path, recursive=True)
    _CHECKED.add(versions.root)


class StatelessShards:
    """``mapInPandas`` function: the shards of one partition of the tagged union for one micro-batch.

    ``worker``: the operator's worker, whose ``streaming(key, frames, state)`` runs per shard and whose
    ``config.state_dir`` holds the state; ``delays_ms``: each input's watermark delay (one per input, the union's
    ``SIDE`` values ``0 .. n - 1``); ``policy``: ``spark.sql.streaming.multipleWatermarkPolicy``; ``what`` names
    the operator in errors, ``doc`` the page explaining ``state_dir``; ``shard`` / ``micros``: the union's shard
    and event-time (epoch µs) columns.
    """

    def __init__(self, worker, delays_ms, policy: str, what: str, *, doc: str, shard: str, micros: str):
        self.worker, self.delays_ms, self.policy, self.what = worker, tuple(delays_ms), policy, what
        self.doc, self.shard, self.micros = doc, shard, micros

    def __call__(self, frames):
        """The packed output rows of every shard in the partition's rows ``frames``."""
        parts = [p for p in frames if len(p)]
        if not parts:
            return
        batch, query = batch_context(self.what)
        root = self.worker.config.state_dir
        versions = _changelog.state_files(f"{root.rstrip('/')}/{VERSIONS_DIR}", self.doc)
        _check_layout(versions, self.what)
        wm_ms, late_ms = self._watermarks(versions, query, batch)
        pdf = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        n = len(self.delays_ms)
        for shard, rows in pdf.groupby(self.shard, sort=True):
            mine = BatchVersions(versions, (int(shard),), query, batch, self.what)
            value, clock = (None, [None] * n) if mine.value is None else mine.value[:2]
            clock = list(clock)
            sides, times = rows[SIDE].to_numpy(), rows[self.micros]
            for side in range(n):
                micros = times.to_numpy()[sides == side]
                micros = micros[~pd.isna(micros)]
                if len(micros):
                    latest = trunc_ms(int(np.max(micros)))
                    clock[side] = latest if clock[side] is None else max(clock[side], latest)
            # Spark's filter of late rows (the previous batch's watermark), before the function sees them
            rows = rows[~(times.notna() & (times <= late_ms * 1000))].reset_index(drop=True)
            state = VersionedGroupState(value, wm_ms)
            yield from self.worker.streaming((int(shard),), [rows], state)
            mine.save((state.new, clock, wm_ms))

    def _watermarks(self, versions, query: str, batch: int) -> tuple[int, int]:
        """The watermark of ``batch`` and of the batch before (late rows): Spark's offset log's where the task
        knows the checkpoint, else from every shard's newest version before ``batch`` (``(clock, watermark it ran
        with)`` of each).
        """
        spark = _offsets.task_watermarks(batch)
        if spark is not None:
            return spark
        n = len(self.delays_ms)
        clocks, previous = [None] * n, None
        for shard in versions.groups():
            peer = BatchVersions(versions, shard, query, batch, self.what)
            if peer.value is None:
                continue
            _, clock, ran_with = peer.value
            if len(clock) != n:
                raise ValueError(f"{self.what}: the state directory {versions.root!r} holds the versions of an "
                                 f"operator with {len(clock)} inputs, this one has {n}: give it a state_dir of its "
                                 f"own")
            for side in range(n):
                if clock[side] is not None:
                    clocks[side] = clock[side] if clocks[side] is None else max(clocks[side], clock[side])
            if parse_version(peer.read) == batch - 1:
                previous = ran_with
        wm = spark_watermark(clocks, self.delays_ms, self.policy)
        return wm, wm if previous is None else previous
