"""Changelog and files persistence of a stateful operator's ``GroupState`` value (issue 39), operator-neutral.

A state value is a tuple of binary fields whose first is the kernel's image and whose others are payload
tables (the interval join: ``kernel``, ``left``, ``right``; ``multi_join``: ``kernel``, one per input, and the
waiting tuples with a left input). The full layout writes the whole image every batch. The two resident
layouts keep the operator's objects in the worker (:mod:`.resident`) and persist what a batch changed:

* ``"changelog"``: the value keeps its schema; the payload fields are the snapshot's and the first field is a
  log::

      "CQL1" | token (16 B) | u32 deltas | u64 n | kernel snapshot (n B) | per delta: u64 m | delta (m B)

* ``"files"``: snapshots and deltas are immutable files (:mod:`.state_files`) and the first field is a
  *manifest* (the other fields empty)::

      "CQF1" | token (16 B) | u64 base | snapshot token (16 B) | u64 snapshot bytes | u64 start | u64 floor
             | u32 deltas | per delta: token (16 B) | u64 bytes

  naming the snapshot file written at call index ``base`` and the delta files written at ``base + 1 ..
  base + deltas`` (each call writes one or the other, so the indices are contiguous). ``start`` / ``floor``:
  the index at which this line of versions started above the directory's files and the lowest file index
  present then (:func:`.state_files.collectable`). A snapshot file holds the full layout's fields:
  ``"CQS2" | u32 count | u64 x count lengths | fields`` (``"CQS1" | u64 x 3 lengths | fields``, the join's
  first format, is read too).

What a *delta* holds is the operator's (:mod:`..join.changelog`, :mod:`..multi_join.changelog`): the bytes of
what one batch did, replayed on the snapshot by the operator's own kernel calls. This module decides when a
new snapshot is due (:func:`save`: every ``snapshot_every`` batches, or when the deltas would exceed a fraction
of the snapshot -- the shape of RocksDB's changelog checkpointing), frames the value, writes the files before
the ``GroupState`` update that names them, and reads them back (:func:`load`). The token identifies the value's
version for the resident cache.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
import struct
from dataclasses import dataclass, field

from . import resident as _resident
from . import state_files as _state_files

__all__ = ["MAGIC", "FILES_MAGIC", "RESIDENT", "LogInfo", "Manifest", "is_log", "is_manifest", "token_of", "parse",
           "snapshot_field", "append_delta", "pack_snapshot", "unpack_snapshot", "state_files", "load", "save",
           "forget", "query_id", "PERSISTENCE", "CHOICES", "STATE_DIR_DEFAULT", "QUERY_FIELD", "RETAIN_CONF",
           "RETAIN_DEFAULT", "auto_state_dir", "settings", "files_dir",
           "check_state_dir"]

MAGIC = b"CQL1"
FILES_MAGIC = b"CQF1"
#: Values of ``state_persistence``: the whole state image every batch, or a snapshot plus per-batch deltas with
#: the state resident in the Python worker (in the value, or in files under ``state_dir``).
PERSISTENCE = ("full", "changelog", "files")
#: What ``state_persistence`` accepts: a layout, or ``"auto"`` (and None, the default): ``"files"`` under a
#: directory found without a user setting (:func:`auto_state_dir`), else ``"full"``.
CHOICES = PERSISTENCE + ("auto",)
#: The layouts that keep the state resident in the worker and persist deltas.
RESIDENT = ("changelog", "files")
#: ``state_persistence="files"`` without ``state_dir``: this directory under the session's
#: ``spark.sql.streaming.checkpointLocation``, then the operator's name.
STATE_DIR_DEFAULT = "pyspark_cq_state"
#: In a ``state_dir`` chosen by ``"auto"``: replaced in the worker by the streaming query's id, which Spark keeps in
#: the checkpoint (the same across restarts of one checkpoint, different for every other query).
QUERY_FIELD = "{query}"
_QUERY_ID = "sql.streaming.queryId"   # the local property Spark gives every task of a streaming query
RETAIN_CONF, RETAIN_DEFAULT = "spark.sql.streaming.minBatchesToRetain", 100
_MANIFEST = struct.Struct("<4s16sQ16sQQQI")  # magic, token, base, snapshot token, snapshot bytes, start, floor, deltas
_MDELTA = struct.Struct("<16sQ")            # delta token, bytes
_SNAP1 = struct.Struct("<4sQQQ")            # magic, kernel / left / right lengths (the join's first format)
_SNAP2 = struct.Struct("<4sI")              # magic, number of fields (then a u64 length per field)
_HEAD = struct.Struct("<4s16sIQ")     # magic, token, number of deltas, snapshot length
_LEN = struct.Struct("<Q")
_STORES: dict = {}   # state_dir -> StateFiles of this worker process (a file system handle per directory)


@dataclass
class LogInfo:
    """The size of a group's log: deltas since its snapshot and their bytes (decides the next snapshot)."""

    deltas: int
    snapshot_bytes: int
    delta_bytes: int


def is_log(blob) -> bool:
    """True when a state value's kernel field is a changelog (else the full layout's packed kernel)."""
    return blob is not None and len(blob) >= _HEAD.size and bytes(memoryview(blob)[:4]) == MAGIC


def is_manifest(blob) -> bool:
    """True when a state value's kernel field is a files-layout manifest."""
    return blob is not None and len(blob) >= _MANIFEST.size and bytes(memoryview(blob)[:4]) == FILES_MAGIC


def token_of(blob) -> bytes | None:
    """The version token of a changelog kernel field or a manifest (None for the full layout)."""
    return _HEAD.unpack_from(blob)[1] if is_log(blob) or is_manifest(blob) else None


@dataclass
class Manifest:
    """The files layout's state value: the files that hold a group's state (see the module docstring)."""

    token: bytes
    base: int                 # call index of the snapshot file
    snapshot_token: bytes
    snapshot_bytes: int
    start: int = 0            # the line of versions started here, above every file then present ...
    floor: int = 0            # ... of which the lowest index was this
    deltas: list = field(default_factory=list)   # (token, bytes) of the delta files at base + 1, base + 2, ...

    @property
    def index(self) -> int:
        """The call index of the write this manifest describes."""
        return self.base + len(self.deltas)

    @property
    def delta_bytes(self) -> int:
        """The bytes of the delta files."""
        return sum(n for _, n in self.deltas)

    def encode(self) -> bytes:
        """The manifest's bytes (the value's ``kernel`` field)."""
        return b"".join([_MANIFEST.pack(FILES_MAGIC, self.token, self.base, self.snapshot_token, self.snapshot_bytes,
                                        self.start, self.floor, len(self.deltas))]
                        + [_MDELTA.pack(t, n) for t, n in self.deltas])

    @classmethod
    def decode(cls, blob) -> Manifest:
        """The manifest of :meth:`encode`."""
        view = memoryview(blob)
        _, token, base, snap, snap_bytes, start, floor, n = _MANIFEST.unpack_from(view)
        if len(view) != _MANIFEST.size + n * _MDELTA.size:
            raise ValueError("state: the files manifest is truncated or corrupt; restore from an earlier checkpoint")
        deltas = [_MDELTA.unpack_from(view, _MANIFEST.size + i * _MDELTA.size) for i in range(n)]
        return cls(token, base, snap, snap_bytes, start, floor, [(bytes(t), int(m)) for t, m in deltas])


def pack_snapshot(*fields) -> bytes:
    """A snapshot file's bytes: the full layout's fields (any number)."""
    head = _SNAP2.pack(b"CQS2", len(fields)) + b"".join(_LEN.pack(len(f)) for f in fields)
    return b"".join((head, *fields))


def unpack_snapshot(blob) -> tuple[memoryview, ...]:
    """The fields of a snapshot file (views into ``blob``)."""
    view = memoryview(blob)
    magic = bytes(view[:4])
    if magic == b"CQS1" and len(view) >= _SNAP1.size:
        _, *sizes = _SNAP1.unpack_from(view)
        pos = _SNAP1.size
    elif magic == b"CQS2" and len(view) >= _SNAP2.size:
        _, count = _SNAP2.unpack_from(view)
        pos = _SNAP2.size + count * _LEN.size
        sizes = [_LEN.unpack_from(view, _SNAP2.size + i * _LEN.size)[0] for i in range(count)] \
            if len(view) >= pos else None
    else:
        sizes = None
    if sizes is None or len(view) != pos + sum(sizes):
        raise ValueError("state: a snapshot file is truncated or corrupt; restore from an earlier checkpoint")
    out = []
    for size in sizes:
        out.append(view[pos:pos + size])
        pos += size
    return tuple(out)


def parse(blob) -> tuple[bytes, memoryview, list, LogInfo]:
    """``(token, kernel snapshot, [delta, ...], LogInfo)`` of a changelog kernel field (views into ``blob``)."""
    view = memoryview(blob)
    _, token, n, size = _HEAD.unpack_from(view)
    pos = _HEAD.size
    snapshot = view[pos:pos + size]
    pos += size
    deltas = []
    for _ in range(n):
        (m,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        deltas.append(view[pos:pos + m])
        pos += m
    if pos != len(view) or len(snapshot) != size:
        raise ValueError("state: the changelog value is truncated or corrupt; restore from an earlier checkpoint")
    return token, snapshot, deltas, LogInfo(n, size, len(view) - _HEAD.size - size)


def snapshot_field(token: bytes, kernel_blob: bytes) -> bytes:
    """A kernel field holding the snapshot ``kernel_blob`` (the full layout's packed kernel) and no delta."""
    return _HEAD.pack(MAGIC, token, 0, len(kernel_blob)) + kernel_blob


def append_delta(blob, token: bytes, delta: bytes) -> bytes:
    """The kernel field ``blob`` with one more delta, under the new version ``token``."""
    _, _, n, size = _HEAD.unpack_from(blob)
    return b"".join((_HEAD.pack(MAGIC, token, n + 1, size), memoryview(blob)[_HEAD.size:], _LEN.pack(len(delta)),
                     delta))


def state_files(root: str | None, doc: str) -> _state_files.StateFiles:
    """The worker process's handle on the state directory ``root``; ``doc`` names the page that explains
    ``state_dir`` (the error when a files-layout checkpoint is restored without one).
    """
    if root is None:
        raise ValueError(f"state: this checkpoint's state was written with state_persistence='files'; its "
                         f"snapshots are files in the state directory: pass the same state_dir= ({doc}, "
                         f"*State persistence*)")
    if QUERY_FIELD in root:
        root = root.replace(QUERY_FIELD, query_id())
    if root not in _STORES:
        _STORES[root] = _state_files.StateFiles(root)
    return _STORES[root]


def _check_sole_writer(files, key, log: Manifest) -> None:
    """ValueError when another operator writes into this group's directory: most of the calls of the current line
    (``log``) have a file that is not the line's own. Two operators of one query that share a directory (the same
    ``name`` under a default ``state_dir``) would collect each other's files; a batch Spark ran again leaves an
    orphan at only one or two calls. Checked before a snapshot's collection deletes anything.
    """
    own = {_state_files.snapshot_name(log.base, log.snapshot_token)}
    own.update(_state_files.delta_name(log.base + i + 1, log.base, t) for i, (t, _) in enumerate(log.deltas))
    foreign = {p[0] for n, p in ((n, _state_files.parse_name(n)) for n in files.names(key))
               if p is not None and not n.startswith(".") and n not in own and log.base <= p[0] <= log.index}
    calls = log.index - log.base + 1
    if len(foreign) > 2 and 2 * len(foreign) >= calls:
        raise ValueError(f"state: another operator writes state files into {files.group_dir(key)!r} ({len(foreign)} "
                         f"of this line's {calls} calls have a file that is not this operator's): two stateful "
                         "operators of one query share a state directory; give each its own name= (or state_dir=)")


def _check_not_stateless(files) -> None:
    """ValueError when a stateless stage (:mod:`.stateless`) wrote the state directory: its groups' state is in
    its version files, which Spark's state store knows nothing of, so this stateful operator would start them
    empty and lose their rows.
    """
    from pyarrow import fs as pafs

    from .stateless import VERSIONS_DIR

    if files.fs.get_file_info(f"{files.path}/{VERSIONS_DIR}").type == pafs.FileType.Directory:
        raise ValueError(f"state: the state directory {files.root!r} was written by state_persistence='stateless' "
                         "(the state is in its files, not in Spark's state store): restart this checkpoint with "
                         "state_persistence='stateless', or start a new checkpoint and state_dir for another layout")


def query_id() -> str:
    """The streaming query's id in a task (Spark's local property, else the session setting a ``foreachBatch``
    function that runs apart from the stream's thread sets, :data:`~pyspark_cq._validate.QUERY_ID_SETTING`);
    ValueError outside a streaming query.
    """
    from pyspark import TaskContext

    from ... import _validate

    context = TaskContext.get()
    query = None
    if context is not None:
        query = context.getLocalProperty(_QUERY_ID) or context.getLocalProperty(_validate.QUERY_ID_SETTING)
    if not query:
        raise ValueError("state: state_persistence='auto' keeps its files under the streaming query's id, and this "
                         "task belongs to no streaming query; pass state_dir= or state_persistence='full'")
    return query


def load(value, files, key) -> tuple[tuple, list, LogInfo | Manifest | None]:
    """``(fields, deltas, log)`` of a state value: the full layout's fields (from the value; from the changelog's
    snapshot; from the snapshot file a manifest names), the delta blobs to replay on them, in order, and the
    value's :class:`LogInfo` / :class:`Manifest` (None for the full layout). ``files``: a callable giving the
    :class:`~.state_files.StateFiles` (called only for a manifest); ``key``: the group.
    """
    head = value[0]
    if is_manifest(head):
        log = Manifest.decode(head)
        store = files()
        fields = unpack_snapshot(store.read(key, _state_files.snapshot_name(log.base, log.snapshot_token)))
        return fields, _delta_files(store, key, log), log
    if is_log(head):
        _, snapshot, deltas, log = parse(head)
        return (snapshot, *value[1:]), deltas, log
    return tuple(value), [], None


def take_resident(value, state_id: str, key, files):
    """``(objects, missed, log)`` of a group from the worker's resident cache, for the state ``value``.

    ``objects``: the cached objects when their token is the value's (``missed`` empty), or -- files layout -- an
    earlier version of the manifest's line (its snapshot or one of its deltas: another Python worker ran the
    group's batches since), with ``missed`` the delta files written after it, in order, to replay on them (read
    through ``files()``, a callable giving the :class:`~.state_files.StateFiles`); ``log`` the value's
    :class:`Manifest` then (None otherwise). ``(None, [], None)`` when the cache holds nothing usable.
    """
    head, cache = value[0], _resident.cache()
    if not is_manifest(head):
        return cache.take((state_id, key), token_of(head)), [], None
    log = Manifest.decode(head)
    objects, behind = cache.take_behind((state_id, key), [log.snapshot_token] + [t for t, _ in log.deltas])
    if objects is None or not behind:
        return objects, [], log
    return objects, _delta_files(files(), key, log, len(log.deltas) - behind), log


def _delta_files(store, key, log: Manifest, first: int = 0) -> list:
    """The bytes of the delta files ``log`` names from its ``first`` delta on, in order."""
    return [store.read(key, _state_files.delta_name(log.base + i + 1, log.base, token))
            for i, (token, _) in enumerate(log.deltas) if i >= first]


def forget(state, state_id: str, key) -> None:
    """The group's state became empty: remove it from Spark's store and the resident cache."""
    state.remove()
    _resident.cache().discard((state_id, key))


def save(state, key, layout: str, log, snapshot, delta, *, state_id: str, snapshot_every: int, ratio: float,
         files=None, retain: int = 100, resident=None, nbytes: int = 0) -> tuple[LogInfo | Manifest, int]:
    """Persist one batch of a resident layout and keep the operator's objects in the resident cache.

    ``log``: the value's :class:`LogInfo` (changelog) or :class:`Manifest` (files) as restored, or None (no
    state, or a value of another layout: a snapshot then starts the line). ``snapshot()`` gives the full
    layout's fields (called only when a snapshot is written; it may compact the objects), ``delta()`` the
    batch's delta bytes. A snapshot is written every ``snapshot_every`` batches, or when the deltas would exceed
    ``ratio`` of the snapshot's bytes. ``files`` (files layout): the :class:`~.state_files.StateFiles`; a file is
    written (temporary, renamed) *before* the ``GroupState`` update that names it, and a snapshot collects the
    group's files no retained version (``retain``) can name. ``resident(log)``: the object to cache under the new
    token (``nbytes`` of memory). Returns the new log and the bytes the value (and its files) hold.
    """
    token = _resident.new_token()
    blob = None
    kind = Manifest if layout == "files" else LogInfo
    if isinstance(log, kind) and (len(log.deltas) if kind is Manifest else log.deltas) + 1 < snapshot_every:
        blob = delta()
        if log.delta_bytes + len(blob) > ratio * log.snapshot_bytes:
            blob = None
    if layout == "files":
        if blob is None:
            # A new chain; from another layout (or none) it starts above every file in the group's directory.
            if isinstance(log, Manifest):
                _check_sole_writer(files, key, log)
                index, start, floor = log.index + 1, log.start, log.floor
            else:
                start, floor = files.next_index(key)
                index = start
                if start and not getattr(state, "stateless", False):
                    _check_not_stateless(files)
            fields = snapshot()
            size = files.write(key, _state_files.snapshot_name(index, token), pack_snapshot(*fields))
            log = Manifest(token, index, token, size, start, floor)
            files.collect(key, index, retain, start, floor)
            width = len(fields)
        else:
            files.write(key, _state_files.delta_name(log.index + 1, log.base, token), blob)
            log = dataclasses.replace(log, token=token, deltas=log.deltas + [(token, len(blob))])
            width = len(state.get)
        value = (log.encode(),) + (b"",) * (width - 1)
        held = len(value[0]) + log.snapshot_bytes + log.delta_bytes
    else:
        if blob is None:
            fields = snapshot()
            value = (snapshot_field(token, fields[0]), *fields[1:])
            log = LogInfo(0, len(fields[0]), 0)
        else:
            old = state.get
            value = (append_delta(old[0], token, blob), *old[1:])
            log = LogInfo(log.deltas + 1, log.snapshot_bytes, log.delta_bytes + _LEN.size + len(blob))
        held = sum(len(b) for b in value)
    state.update(value)
    cache = _resident.cache()
    if cache.limit and resident is not None:
        cache.put((state_id, key), token, resident(log), nbytes)
    return log, held


def auto_state_dir(session, name: str) -> str | None:
    """The files layout's directory when nobody named one (``state_persistence="auto"``), or None when there is no
    safe place. ``<root>/pyspark_cq_state/{query}/<name>`` (:data:`QUERY_FIELD`: the query's id, filled in by the
    worker), ``root`` the session's ``spark.sql.streaming.checkpointLocation`` when set, else Spark's
    ``spark.sql.warehouse.dir`` -- kept like the warehouse's tables -- when every executor reaches it: a local
    master (one machine), or a warehouse on a shared file system (a scheme other than ``file:``).
    """
    def conf(key):
        try:
            return session.conf.get(key, None)
        except Exception:   # a conf a Connect server does not return: no safe place is known
            return None

    root = conf("spark.sql.streaming.checkpointLocation")
    if not root:
        warehouse, master = conf("spark.sql.warehouse.dir"), conf("spark.master") or ""
        if not warehouse:
            return None
        shared = not warehouse.startswith("file:") and "://" in warehouse
        if not (master.startswith("local") or shared):
            return None
        root = warehouse[len("file:"):] if warehouse.startswith("file:") else warehouse
        if root.startswith("//"):   # file:///path
            root = root[2:]
    name = str(name).replace("/", "_").replace("\\", "_") or "operator"
    return f"{root.rstrip('/')}/{STATE_DIR_DEFAULT}/{QUERY_FIELD}/{name}"


def settings(state_persistence, snapshot_every, state_dir, *, streaming: bool, session, name: str):
    """``(persistence, snapshot_every, state_dir, retain)`` of a stateful operator's arguments, checked
    (ValueError / TypeError naming the argument). ``"auto"`` (None: the default) is ``"files"`` with the given
    ``state_dir``, else under :func:`auto_state_dir` when there is one, else ``"full"``. ``"files"`` without
    ``state_dir`` takes ``<spark.sql.streaming.checkpointLocation>/pyspark_cq_state/<name>`` when the ``session``
    sets it, else it is refused; a relative ``state_dir`` is made absolute (the workers do not run in the
    driver's directory); ``retain`` is the session's ``spark.sql.streaming.minBatchesToRetain``. Batch operators
    (``streaming`` False) keep no state: the checked arguments come back (``"auto"`` as ``"full"``) with
    ``state_dir`` as given.
    """
    persistence = "auto" if state_persistence is None else state_persistence
    if not isinstance(persistence, str) or persistence not in CHOICES:
        raise ValueError(f"state_persistence must be one of {', '.join(map(repr, CHOICES))} or None "
                         f"(the default, 'auto'), got {state_persistence!r}")
    if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, numbers.Integral):
        raise TypeError(f"snapshot_every must be an int >= 1 (micro-batches per snapshot), got {snapshot_every!r}")
    if snapshot_every < 1:
        raise ValueError(f"snapshot_every must be an int >= 1 (micro-batches per snapshot), got {snapshot_every!r}")
    check_state_dir(state_dir)
    if not streaming:
        return ("full" if persistence == "auto" else persistence), int(snapshot_every), state_dir, RETAIN_DEFAULT
    conf = (lambda key: session.conf.get(key, None)) if session is not None else (lambda key: None)
    if persistence == "auto":
        if state_dir is None:
            state_dir = auto_state_dir(session, name) if session is not None else None
        persistence = "full" if state_dir is None else "files"
    if state_dir is None and persistence == "files":
        checkpoint = conf("spark.sql.streaming.checkpointLocation")
        if not checkpoint:
            raise ValueError("state_persistence='files' needs state_dir=: a directory that every executor "
                             "reads and writes (a shared file system; a local path in local mode), one per "
                             "operator of one query, kept as long as the query's checkpoint -- or set the "
                             "session's spark.sql.streaming.checkpointLocation, under which the default is "
                             f"<location>/{STATE_DIR_DEFAULT}/<name>")
        state_dir = f"{checkpoint.rstrip('/')}/{STATE_DIR_DEFAULT}/{name}"
    if state_dir is not None:
        state_dir = _absolute(state_dir)
    retain = conf(RETAIN_CONF)
    return persistence, int(snapshot_every), state_dir, int(retain) if retain else RETAIN_DEFAULT


def files_dir(state_dir, session, name: str, option: str) -> str:
    """The state directory of a stateless stage (``option``, e.g. ``"state='files'"``, names it in the error):
    ``state_dir``, else :func:`auto_state_dir`; ValueError when neither is given (``"auto"`` would fall back to
    ``"full"`` there, which a stateless stage cannot), TypeError for a ``state_dir`` that is not a path.
    """
    check_state_dir(state_dir)
    root = state_dir if state_dir is not None else auto_state_dir(session, name)
    if root is None:
        raise ValueError(f"{option} needs state_dir=: a directory every executor reads and writes (a shared file "
                         "system; a local path in local mode), one per operator of one query -- or set the "
                         "session's spark.sql.streaming.checkpointLocation")
    return _absolute(root)


def check_state_dir(state_dir) -> None:
    """TypeError naming ``state_dir`` unless it is None or a non-empty path or URI."""
    if state_dir is not None and (not isinstance(state_dir, str) or not state_dir.strip()):
        raise TypeError(f"state_dir must be a directory path or URI (str), got {state_dir!r}")


def _absolute(state_dir: str) -> str:
    """A local ``state_dir`` made absolute (the workers do not run in the driver's directory); URIs as given."""
    return state_dir if "://" in state_dir else os.path.abspath(state_dir)
