"""Where a control table lives: a local file, a pyarrow filesystem, or Hadoop's FileSystem through the JVM.

Every store offers the same five operations: ``stamp`` (cheap change detection), ``read``,
``write_atomic`` (temporary file + rename), ``append_log`` / ``read_log`` (the append-only change log)
and ``lock`` (mutual exclusion of writers).

- :class:`LocalStore`: a path on this machine (no scheme or ``file:``); rename with ``os.replace``,
  the change log is a JSON-lines file opened with ``O_APPEND``, writers lock ``<path>.lock`` with
  ``fcntl.flock`` (threads of one process with a lock).
- :class:`ArrowStore`: any ``pyarrow.fs`` URI (``s3://``, ``gs://``, ``abfs://``, ``hdfs://`` with
  libhdfs, ``file://``); what Spark's Python workers use to read a non-local table (they have no JVM).
- :class:`HadoopStore`: any Hadoop-compatible URI through the driver's JVM (``spark._jvm``); the
  driver writes with it when it has a SparkSession, so the table lands wherever Spark can write.

Remote stores keep the change log as one object per change under ``<uri>.log.d/`` (object stores
cannot append). Renames on object stores are copies, not atomic: readers may briefly see the old
version, never a partial one (the new object appears whole).
"""
from __future__ import annotations

import contextlib
import os
import threading
import uuid
from urllib.parse import urlparse

__all__ = ["is_local", "local_path", "LocalStore", "ArrowStore", "HadoopStore", "reader_store"]

_THREAD_LOCKS: dict[str, threading.RLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(key: str) -> threading.RLock:
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.RLock())


def is_local(uri: str) -> bool:
    """True for a plain path or a ``file:`` URI."""
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")  # C:\ on Windows


def local_path(uri: str) -> str:
    """The filesystem path of a local ``uri``."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme == "file" else uri


class LocalStore:
    """A control table in a local file."""

    def __init__(self, uri: str):
        self.uri = uri
        self.path = os.path.abspath(local_path(uri))
        self.log_path = self.path + ".log"

    def stamp(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def write_atomic(self, data: bytes) -> None:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def append_log(self, version: int, line: bytes) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.rstrip(b"\n") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_log(self) -> list[bytes]:
        try:
            with open(self.log_path, "rb") as fh:
                return [line for line in fh.read().splitlines() if line.strip()]
        except FileNotFoundError:
            return []

    @contextlib.contextmanager
    def lock(self):
        with _thread_lock(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                import fcntl
            except ImportError:  # Windows: threads of this process only
                yield
                return
            with open(self.path + ".lock", "a+b") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class ArrowStore:
    """A control table on a ``pyarrow.fs`` filesystem."""

    def __init__(self, uri: str):
        from pyarrow import fs as pafs

        self.uri = uri
        self._pafs = pafs
        self.fs, self.path = pafs.FileSystem.from_uri(uri)
        self.log_dir = self.path + ".log.d"

    def stamp(self):
        info = self.fs.get_file_info(self.path)
        if info.type == self._pafs.FileType.NotFound:
            return None
        mtime = info.mtime_ns if info.mtime_ns is not None else None
        return (mtime, info.size)

    def read(self) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.path) as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def write_atomic(self, data: bytes) -> None:
        parent = self.path.rsplit("/", 1)[0] if "/" in self.path else ""
        if parent:
            self.fs.create_dir(parent, recursive=True)
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as fh:
            fh.write(data)
        self.fs.move(tmp, self.path)

    def append_log(self, version: int, line: bytes) -> None:
        self.fs.create_dir(self.log_dir, recursive=True)
        with self.fs.open_output_stream(f"{self.log_dir}/{version:012d}.json") as fh:
            fh.write(line)

    def read_log(self) -> list[bytes]:
        selector = self._pafs.FileSelector(self.log_dir, allow_not_found=True)
        infos = sorted((i for i in self.fs.get_file_info(selector) if i.path.endswith(".json")),
                       key=lambda i: i.path)
        out = []
        for info in infos:
            with self.fs.open_input_stream(info.path) as fh:
                out.append(fh.read())
        return out

    @contextlib.contextmanager
    def lock(self):
        with _thread_lock(self.uri):
            yield


class HadoopStore:
    """A control table on a Hadoop-compatible filesystem, through the driver's JVM (classic Spark only)."""

    def __init__(self, uri: str, spark):
        sc = getattr(spark, "sparkContext", None)
        jvm = getattr(sc, "_jvm", None) if sc is not None else None
        if jvm is None:
            raise TypeError("spark must be a classic SparkSession with a JVM (Spark Connect has none); "
                            "without one the table is written through pyarrow.fs")
        self.uri = uri
        self._jvm = jvm
        self._gateway = sc._gateway
        self._conf = sc._jsc.hadoopConfiguration()
        self._path = jvm.org.apache.hadoop.fs.Path(uri)
        self._fs = self._path.getFileSystem(self._conf)
        self._log_dir = jvm.org.apache.hadoop.fs.Path(uri + ".log.d")

    def stamp(self):
        if not self._fs.exists(self._path):
            return None
        st = self._fs.getFileStatus(self._path)
        return (st.getModificationTime(), st.getLen())

    def _read_path(self, path) -> bytes:
        stream = self._fs.open(path)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def _write_path(self, path, data: bytes, overwrite: bool) -> None:
        out = self._fs.create(path, overwrite)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def read(self) -> bytes | None:
        if not self._fs.exists(self._path):
            return None
        return self._read_path(self._path)

    def write_atomic(self, data: bytes) -> None:
        hpath = self._jvm.org.apache.hadoop.fs.Path
        tmp = hpath(f"{self.uri}.{uuid.uuid4().hex}.tmp")
        self._write_path(tmp, data, True)
        try:
            # FileContext.rename(..., OVERWRITE) replaces the target atomically where the filesystem can
            rename = getattr(self._jvm.org.apache.hadoop.fs, "Options$Rename")
            opts = self._gateway.new_array(rename, 1)
            opts[0] = rename.OVERWRITE
            fc = self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(self._path.toUri(), self._conf)
            fc.rename(tmp, self._path, opts)
        except Exception:
            # filesystems without FileContext support: delete, then rename (a reader may miss one read)
            if self._fs.exists(self._path):
                self._fs.delete(self._path, False)
            if not self._fs.rename(tmp, self._path):
                raise OSError(f"could not rename {tmp.toString()} to {self.uri}") from None

    def append_log(self, version: int, line: bytes) -> None:
        self._fs.mkdirs(self._log_dir)
        target = self._jvm.org.apache.hadoop.fs.Path(self._log_dir, f"{version:012d}.json")
        self._write_path(target, line, False)

    def read_log(self) -> list[bytes]:
        if not self._fs.exists(self._log_dir):
            return []
        names = sorted(st.getPath().getName() for st in self._fs.listStatus(self._log_dir))
        return [self._read_path(self._jvm.org.apache.hadoop.fs.Path(self._log_dir, n))
                for n in names if n.endswith(".json")]

    @contextlib.contextmanager
    def lock(self):
        with _thread_lock(self.uri):
            yield


def reader_store(uri: str):
    """The store a reader (e.g. a Spark Python worker, without JVM) uses for ``uri``."""
    return LocalStore(uri) if is_local(uri) else ArrowStore(uri)
