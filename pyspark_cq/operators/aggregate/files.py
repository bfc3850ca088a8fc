"""``sliding_aggregate(..., state="files")``: the stateful step in a *stateless* Spark stage (issue 39).

Every stateful Spark operator runs one task per ``spark.sql.shuffle.partitions`` (200 in a plain session) and
commits a state store per task and micro-batch; that alone costs more than Spark's whole window aggregation
(docs/benchmark-log-2026.md, "The plain session"). Here the slices go through ``repartition(shards)`` into a
``mapInPandas`` step, and each shard's state lives in files of its own, versioned by the micro-batch id
(Spark's ``streaming.sql.batchId`` task property):

* **A version per batch.** Batch ``b`` of a shard reads the newest version written by a batch before ``b``
  and writes version ``b`` (a hidden temporary file, then renamed). A batch Spark runs again (after a crash
  before its commit) reads what its first run read, so its rows and state are the same again; a version ``b``
  two attempts wrote holds the same state. Older versions are deleted once a newer one is read (Spark only
  ever re-runs the last uncommitted batch).
* **The watermark without a stateful operator.** Spark's watermark for batch ``b`` is the latest event time
  of the batches before ``b`` less the delay, never below 0 (``EventTimeWatermarkExec``, ``WatermarkTracker``).
  Every slicer task sends its latest event time to every shard in its marker rows, so each shard keeps that
  maximum in its own state and derives the same watermark as its peers, with no shared file.
* **No no-data batches.** Spark runs a micro-batch without new rows only for a stateful operator, and there is
  none: windows that the watermark closes are emitted by the next batch with data (Spark behaves the same with
  ``spark.sql.streaming.noDataMicroBatches.enabled=false``, the oracle of the tests), and an
  ``availableNow`` run ends without the windows its last watermark would close.

Each file records the streaming query's id: a directory written by another query is refused, not mixed in.
"""
from __future__ import annotations

import pickle

import pandas as pd

from ... import _validate
from .._common import changelog as _changelog
from .._common import metrics as _metrics
from .._common.resident import new_token
from .config import MAXT, METRICS, SHARD, AggConfig, read_entry
from .shard import run_shard
from .transport import unpack_slices

__all__ = ["FileShards", "version_name", "parse_version"]

_MAGIC = b"CQAGG1\n"
_DOC = "docs/aggregate.md"


def version_name(batch: int, token: bytes) -> str:
    """The file name of a shard's state after micro-batch ``batch``, written by the attempt ``token``."""
    return f"v{batch:012d}-{token.hex()}"


def parse_version(name: str) -> int | None:
    """The micro-batch of a state file's ``name`` (None for a temporary or foreign file)."""
    if not name.startswith("v") or "-" not in name:
        return None
    head = name[1:].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _trunc_ms(micros: int) -> int:
    """Microseconds to milliseconds as the JVM divides longs (toward zero): Spark's event-time statistics."""
    return -((-micros) // 1000) if micros < 0 else micros // 1000


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
        batch = _validate.micro_batch_id()
        if not batch.isdigit():
            raise ValueError(f"sliding_aggregate {self.config.name!r}: state='files' runs in a streaming query "
                             f"only (no micro-batch id in this task)")
        files = _changelog.state_files(self.root, _DOC)
        query = _changelog.query_id()
        pdf = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        entry = read_entry(self.config)
        for shard, rows in pdf.groupby(SHARD, sort=True):
            yield self._shard(files, query, int(batch), int(shard), rows, entry)

    def _shard(self, files, query: str, batch: int, shard: int, rows: pd.DataFrame, entry):
        config, group = self.config, (shard,)
        table, counts = unpack_slices(self.slices_schema, [rows])
        seen = rows[MAXT].dropna()
        latest_ms = _trunc_ms(int(seen.max())) if len(seen) else None
        read, saved, max_ms = self._load(files, group, query, batch)
        wm_us = None
        if self.delay_ms is not None:
            # Spark's watermark of this batch: from the batches before it, never below 0
            wm_us = max(0, max_ms - self.delay_ms) * 1000 if max_ms is not None else 0
        result = run_shard(config, table, saved, wm_us, entry, counts)
        if latest_ms is not None:
            max_ms = latest_ms if max_ms is None else max(max_ms, latest_ms)
        data = _MAGIC + pickle.dumps({"query": query, "batch": batch, "max_ms": max_ms, "state": result.state},
                                     protocol=5)
        files.write(group, version_name(batch, new_token()), data)
        self._collect(files, group, read)
        return _metrics.packed_row(result.output, self.out_schema, METRICS, **result.metrics)

    def _load(self, files, group, query: str, batch: int):
        """``(name, state, max_ms)`` of the newest version before ``batch`` (``(None, None, None)``: none)."""
        every = sorted((v, n) for n in files.names(group) if (v := parse_version(n)) is not None)
        versions = [(v, n) for v, n in every if v < batch]
        if not versions:
            if every:   # a first batch run again, or another query's files: check the newest
                self._value(files, group, every[-1][1], query)
            return None, None, None
        name = versions[-1][1]
        value = self._value(files, group, name, query)
        return name, value["state"], value["max_ms"]

    def _value(self, files, group, name: str, query: str) -> dict:
        """The content of the state file ``name``; ValueError when it is not one or another query wrote it."""
        raw = files.read(group, name)
        if not raw.startswith(_MAGIC):
            raise ValueError(f"sliding_aggregate {self.config.name!r}: {files.group_dir(group)}/{name} is not a "
                             f"state file of state='files'; give the operator a state_dir of its own")
        value = pickle.loads(raw[len(_MAGIC):])
        if value["query"] != query:
            raise ValueError(f"sliding_aggregate {self.config.name!r}: the state directory {files.root!r} holds "
                             f"the state of another streaming query ({value['query']}, this one is {query}); "
                             f"give each query (each checkpoint) its own state_dir")
        return value

    @staticmethod
    def _collect(files, group, read: str | None) -> None:
        """Delete the versions before the file ``read`` this batch read, and that version's other copies (two
        attempts wrote it); a re-run of this batch reads ``read`` again.
        """
        if read is None:
            return
        directory, version = files.group_dir(group), parse_version(read)
        for name in files.names(group):
            v = parse_version(name)
            if v is not None and (v < version or (v == version and name != read)):
                try:
                    files.fs.delete_file(f"{directory}/{name}")
                except FileNotFoundError:   # another attempt deleted it first
                    pass

