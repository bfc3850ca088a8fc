"""The byte form of operator state kept in Spark's ``GroupState``: zstd-compressed blobs and Arrow tables.

Every micro-batch each touched group's state crosses the JVM <-> Python boundary twice. PySpark 4.3
pickles a ``binary`` state value on the JVM side one character at a time (razorvine's
``PickleUtils.rawStringFromBytes``), so that transfer costs tens of milliseconds per MB and dominates
the stateful operators' batch time (docs/benchmark-log-2026.md). Compressing the state before it leaves Python
is therefore far cheaper than moving the raw bytes: zstd level 1 packs the native kernels' columnar
images 3-4x and decompresses at several hundred MB/s.

Blobs written before compression was introduced carry no header and are returned unchanged, so
existing checkpoints still restore.
"""
from __future__ import annotations

import struct

import pyarrow as pa

_MAGIC = b"CQZ1"           # compressed blob: magic | u64 raw size | zstd frame
_HEADER = struct.Struct("<4sQ")
_LEVEL = 1                 # zstd level 1: ~200 MB/s to compress here, nearly the ratio of level 3
_CODEC = pa.Codec("zstd", compression_level=_LEVEL)
_IPC = pa.ipc.IpcWriteOptions(compression=_CODEC)


def pack(blob: bytes) -> bytes:
    """Compress a state blob for ``GroupState`` (inverse: :func:`unpack`)."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    return _HEADER.pack(_MAGIC, len(blob)) + _CODEC.compress(blob, asbytes=True)


def unpack(blob: bytes) -> bytes:
    """The raw state blob of :func:`pack`; a blob without the header (older state) is returned as is."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    view = memoryview(blob)
    if len(view) < _HEADER.size or bytes(view[:4]) != _MAGIC:
        return bytes(blob)
    _, size = _HEADER.unpack_from(view)
    return _CODEC.decompress(view[_HEADER.size:], decompressed_size=size, asbytes=True)


def table_to_bytes(table: pa.Table) -> bytes:
    """An Arrow table as an IPC stream with zstd-compressed buffers."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_bytes(blob: bytes) -> pa.Table:
    """The table of :func:`table_to_bytes` (any IPC stream, compressed or not)."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
