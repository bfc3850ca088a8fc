"""State of a *stateless* Spark stage: a group's value per micro-batch in files, and Spark's watermark (issue 39).

Every stateful Spark operator runs one task per ``spark.sql.shuffle.partitions`` and commits a state store per
task and micro-batch; in a plain session (200 partitions) that alone costs more than Spark's own operators
(docs/benchmark-log-2026.md, "The plain session"). An operator whose stage is ``repartition(n)`` and
``mapInPandas`` runs ``n`` tasks and commits nothing, and keeps each group's value here instead:

* **A version per micro-batch** (:class:`BatchVersions`). Batch ``b`` reads the newest version written before
  ``b`` and writes version ``b`` (``v<b>-<token>``: a hidden temporary file, then renamed; :mod:`.state_files`).
  The batch id is Spark's ``streaming.sql.batchId`` task property. A batch Spark runs again (a crash before its
  commit) reads what its first run read, so it gives the same rows and state; a version two attempts wrote holds
  the same state. Versions older than the one read, and the read version's other copies, are deleted (Spark
  only ever runs the last uncommitted batch again). Each file records the streaming query's id: a directory
  another query wrote is refused, not mixed in.
* **Spark's watermark** (:func:`spark_watermark`): without a stateful operator the stage computes it from the
  latest event time of each input in the batches before this one, as Spark's ``WatermarkTracker`` does.
* **No no-data micro-batches.** Spark runs a micro-batch without new rows only for a stateful operator; such a
  stage runs only when rows arrive (Spark's rows with ``spark.sql.streaming.noDataMicroBatches.enabled=false``).
"""
from __future__ import annotations

import pickle

from . import changelog as _changelog
from .resident import new_token

__all__ = ["BatchVersions", "VersionedGroupState", "version_name", "parse_version", "spark_watermark",
           "trunc_ms", "batch_context"]

_MAGIC = b"CQBV1\n"


def version_name(batch: int, token: bytes) -> str:
    """The file name of a group's value after micro-batch ``batch``, written by the attempt ``token``."""
    return f"v{batch:012d}-{token.hex()}"


def parse_version(name: str) -> int | None:
    """The micro-batch of a version file's ``name`` (None for a temporary or another file)."""
    if not name.startswith("v") or "-" not in name:
        return None
    head = name[1:].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def trunc_ms(micros: int) -> int:
    """Microseconds to milliseconds as the JVM divides longs (toward zero), as Spark's event-time statistics do
    (``EventTimeWatermarkExec``: ``micros / 1000``).
    """
    return -((-micros) // 1000) if micros < 0 else micros // 1000


def spark_watermark(latest_ms, delays_ms, policy: str = "min") -> int:
    """Spark's event-time watermark (ms) of a micro-batch from each input's latest event time (ms) in the
    batches before it (None: no row yet) and its ``withWatermark`` delay (ms).

    An input's watermark is its latest event time less its delay, 0 before its first row; the global one is
    their minimum (``spark.sql.streaming.multipleWatermarkPolicy`` ``"min"``, Spark's default) or maximum
    (``"max"``), never below 0 (``WatermarkTracker.updateWatermark``). Each input's latest time only grows, so
    this is also never below an earlier batch's.
    """
    if policy not in ("min", "max"):
        raise ValueError(f"policy must be 'min' or 'max' (spark.sql.streaming.multipleWatermarkPolicy), "
                         f"got {policy!r}")
    if len(latest_ms) != len(delays_ms) or not delays_ms:
        raise ValueError(f"latest_ms and delays_ms must have one entry per input, got {latest_ms!r} and "
                         f"{delays_ms!r}")
    marks = [0 if t is None else max(0, int(t) - int(d)) for t, d in zip(latest_ms, delays_ms)]
    return max(0, min(marks) if policy == "min" else max(marks))


def batch_context(what: str) -> tuple[int, str]:
    """``(micro-batch id, streaming query id)`` of the running task; ValueError naming ``what`` outside a
    streaming query.
    """
    from ... import _validate

    batch = _validate.micro_batch_id()
    if not batch.isdigit():
        raise ValueError(f"{what}: a stateless stage with state in files runs in a streaming query only (no "
                         f"micro-batch id in this task)")
    return int(batch), _changelog.query_id()


class BatchVersions:
    """One group's value in ``files`` (a :class:`~.state_files.StateFiles`) as of the micro-batch ``batch``.

    ``value`` is the newest version written before ``batch`` (None: none), ``read`` its file name. ``what``
    names the operator in errors.
    """

    def __init__(self, files, group, query: str, batch: int, what: str):
        self.files, self.group, self.query, self.batch, self.what = files, group, query, batch, what
        every = sorted((v, n) for n in files.names(group) if (v := parse_version(n)) is not None)
        before = [(v, n) for v, n in every if v < batch]
        self.read, self.value = None, None
        if before:
            self.read = before[-1][1]
            self.value = self._decode(self.read)
        elif every:   # a first batch run again, or another query's files: check the newest
            self._decode(every[-1][1])

    def _decode(self, name: str):
        raw = self.files.read(self.group, name)
        where = f"{self.files.group_dir(self.group)}/{name}"
        if not raw.startswith(_MAGIC):
            raise ValueError(f"{self.what}: {where} is not a state version file; give the operator a state_dir "
                             f"of its own")
        query, value = pickle.loads(raw[len(_MAGIC):])
        if query != self.query:
            raise ValueError(f"{self.what}: the state directory {self.files.root!r} holds the state of another "
                             f"streaming query ({query}; this one is {self.query}): give each query (each "
                             f"checkpoint) its own state_dir")
        return value

    def save(self, value) -> int:
        """Write ``value`` as this batch's version and delete the versions no re-run can read; returns the bytes."""
        data = _MAGIC + pickle.dumps((self.query, value), protocol=5)
        self.files.write(self.group, version_name(self.batch, new_token()), data)
        if self.read is not None:
            read = parse_version(self.read)
            versions = [(parse_version(n), n) for n in self.files.names(self.group)]
            self.files.delete(self.group, [n for v, n in versions
                                           if v is not None and (v < read or (v == read and n != self.read))])
        return len(data)


class VersionedGroupState:
    """What an ``applyInPandasWithState`` function uses of ``GroupState`` (``exists``, ``get``, ``update``,
    ``remove``, ``getCurrentWatermarkMs``, ``hasTimedOut``, ``setTimeoutTimestamp``), held in memory for one
    call: ``value`` the group's value before the batch (None: none), ``watermark_ms`` the batch's watermark.
    After the call ``new`` is the value to keep (None: removed).
    Timeouts do nothing: a stateless stage runs a group only when rows arrive for it.
    """

    #: Not Spark's ``GroupState``: a new line of the files layout is expected here (:func:`.changelog.save`).
    stateless = True

    def __init__(self, value, watermark_ms: int):
        self._value, self.watermark_ms = value, int(watermark_ms)
        self.new = value

    @property
    def exists(self) -> bool:
        return self._value is not None

    @property
    def get(self):
        if self._value is None:
            raise ValueError("state: no value")
        return self._value

    @property
    def hasTimedOut(self) -> bool:
        return False

    def update(self, value) -> None:
        self.new = tuple(value)

    def remove(self) -> None:
        self.new = None

    def getCurrentWatermarkMs(self) -> int:
        return self.watermark_ms

    def setTimeoutTimestamp(self, timestamp_ms) -> None:
        pass
