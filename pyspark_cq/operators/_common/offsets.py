"""Spark's own watermark for a stateless stage: the streaming query's offset log, read in the task (issue 39).

A stateless stage (:mod:`.stateless`) has no stateful Spark operator, so Spark does not hand it the micro-batch's
event-time watermark. Spark decides that watermark on the driver before the batch runs and writes it into the
offset log, ``<checkpoint>/offsets/<batch id>`` (``OffsetSeqMetadata.batchWatermarkMs``), which is there before
any task of the batch starts and is kept for ``spark.sql.streaming.minBatchesToRetain`` batches. It is the
global watermark over every ``withWatermark`` of the query (also those outside the operator, and computed from the
rows at the ``withWatermark``, before any filter), under the session's ``multipleWatermarkPolicy``. A stateful
operator evicts with batch ``b``'s and drops late rows with batch ``b - 1``'s (``IncrementalExecution``:
``eventTimeWatermarkForLateEvents``).

A task knows its query's id and batch id but not the checkpoint: :func:`watch` adds a
``StreamingQueryListener`` to the session whose ``onQueryStarted`` -- called on the query's thread before its
first micro-batch -- sets the resolved checkpoint root in the query's own session configuration
(:data:`CHECKPOINT_PROPERTY`), which Spark hands every task of the query as a local property. Spark Connect
sessions have no such listener here: the stage falls back to computing the watermark (:mod:`.batch_versions`).
"""
from __future__ import annotations

import atexit
import json
import threading

__all__ = ["CHECKPOINT_PROPERTY", "OWN_WATERMARK_PROPERTY", "watch", "checkpoint_root", "task_watermarks",
           "batch_watermarks", "parse_offset_log"]

#: The query session's configuration key (and so the tasks' local property) holding the checkpoint root.
CHECKPOINT_PROPERTY = "spark.pyspark_cq.checkpointRoot"
#: A setting under which a query's stateless stages compute the watermark of their own inputs instead of reading
#: the query's (a query group's ``foreachBatch`` sets it: its query's watermark is the group clock, while a member
#: runs at the watermark of its own streams, as alone).
OWN_WATERMARK_PROPERTY = "spark.pyspark_cq.ownWatermark"

_LOCK = threading.Lock()
_WATCHED: dict[int, object] = {}       # id(JVM session) -> its listener (kept: PySpark holds only a proxy)
_CACHE: dict[tuple[str, int], int] = {}


def watch(session) -> bool:
    """Make every streaming query of ``session`` hand its tasks its checkpoint root (once per session).

    Returns False where that cannot be done (a Spark Connect session): the stateless stages of its queries then
    compute the watermark themselves.
    """
    jsession = getattr(session, "_jsparkSession", None)
    if jsession is None:
        return False
    key = jsession.hashCode()
    with _LOCK:
        if key in _WATCHED:
            return True
        from pyspark.sql.streaming import StreamingQueryListener

        class _CheckpointRoot(StreamingQueryListener):
            """Sets :data:`CHECKPOINT_PROPERTY` in a query's session when it starts."""

            def onQueryStarted(self, event):
                try:
                    query = session.streams.get(str(event.id))
                    execution = query._jsq.streamingQuery()
                    execution.sparkSessionForStream().conf().set(CHECKPOINT_PROPERTY,
                                                                 execution.resolvedCheckpointRoot())
                except Exception:   # a query not reachable this way: its stages compute the watermark
                    pass

            def onQueryProgress(self, event):
                pass

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        listener = _CheckpointRoot()
        session.streams.addListener(listener)
        _WATCHED[key] = listener
        # Removed before the interpreter exits: the JVM's listener bus would otherwise call into a Python that is
        # shutting down and log a stack trace per pending event (a script that ends without spark.stop()).
        atexit.register(_unwatch, session, listener)
    return True


def _unwatch(session, listener) -> None:
    """Remove ``listener`` and let the JVM's listener bus finish what it may be delivering to it (up to 2 s)."""
    try:
        session.streams.removeListener(listener)
        session.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(2000)
    except Exception:   # the session or its JVM already gone, or events still flowing: nothing more to wait for
        pass


def checkpoint_root() -> str | None:
    """The running task's streaming query checkpoint root (None: not set, e.g. under Spark Connect, or the task's
    stages compute their own watermark, :data:`OWN_WATERMARK_PROPERTY`).
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or context.getLocalProperty(OWN_WATERMARK_PROPERTY) == "true":
        return None
    return context.getLocalProperty(CHECKPOINT_PROPERTY)


def task_watermarks(batch: int) -> tuple[int, int] | None:
    """:func:`batch_watermarks` of micro-batch ``batch`` of the running task's query; None where the task does not
    know its checkpoint (Spark Connect): the stage then computes the watermark itself.
    """
    root = checkpoint_root()
    return batch_watermarks(root, batch) if root else None


def parse_offset_log(text: str) -> int:
    """``batchWatermarkMs`` of an offset log entry's text (a version line, the metadata JSON, the offsets);
    ValueError when there is none.
    """
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and "batchWatermarkMs" in line:
            return int(json.loads(line)["batchWatermarkMs"])
    raise ValueError("not a Spark offset log entry (no batchWatermarkMs)")


def batch_watermarks(root: str, batch: int) -> tuple[int, int]:
    """``(watermark of batch, watermark of batch - 1)`` in ms from the offset log under the checkpoint ``root``
    (a URI such as ``file:/tmp/ck`` or a path); batch 0 has no batch before it and gives its own twice.
    """
    now = _watermark(root, batch)
    return now, (now if batch == 0 else _watermark(root, batch - 1))


def _watermark(root: str, batch: int) -> int:
    key = (root, batch)
    if key not in _CACHE:
        path = f"{_local(root).rstrip('/')}/offsets/{batch}"
        try:
            text = _read(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"stateless stage: Spark's offset log entry {path!r} of micro-batch {batch} is "
                                    "missing; the checkpoint must not be cleaned while its query runs") from None
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = parse_offset_log(text)
    return _CACHE[key]


def _local(root: str) -> str:
    """A ``file:`` URI as a local path (Spark writes ``file:/x``, which pyarrow does not take); others as given."""
    if root.startswith("file:"):
        path = root[len("file:"):]
        return "/" + path.lstrip("/") if path.startswith("//") else path
    return root


def _read(path: str) -> str:
    from pyarrow import fs as pafs

    filesystem, inner = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)
    with filesystem.open_input_stream(inner) as f:
        return f.read().decode("utf-8")
