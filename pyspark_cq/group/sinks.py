"""Where a group's query delivers its rows: a directory of parquet files, or a callable ``f(df, batch_id)``.

A directory sink is written by the micro-batch function, once per micro-batch and query, under a file name
that holds the batch id; a micro-batch Spark runs again after a failure first removes that batch's files, so
a restart never duplicates a row (Spark's own file sink keeps a log for the same purpose). Files are written
under a hidden temporary name and renamed, so a reader never sees half a file. Spark's readers skip names
that start with ``_`` or ``.``.
"""
from __future__ import annotations

import os
import pickle
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["check_sink", "encode_sink", "deliver", "same_sink"]

_PREFIX = "part-"


def check_sink(sink, name: str):
    """``sink`` normalised (a directory as an absolute path) or TypeError naming the query."""
    if isinstance(sink, os.PathLike):
        sink = os.fspath(sink)
    if isinstance(sink, str):
        if not sink:
            raise ValueError(f"query {name!r}: sink must be a directory path or a callable f(df, batch_id), got ''")
        if sink.startswith("file:"):
            sink = sink[len("file:"):]
        if "://" in sink:
            raise ValueError(f"query {name!r}: sink {sink!r}: a directory sink is a local or mounted path "
                             f"(the group writes it with pyarrow); for other stores give a callable f(df, batch_id)")
        if os.path.exists(sink) and not os.path.isdir(sink):
            raise ValueError(f"query {name!r}: sink {sink!r} exists and is not a directory")
        return os.path.abspath(sink)
    if callable(sink):
        return sink
    raise TypeError(f"query {name!r}: sink must be a directory path (str) or a callable f(df, batch_id), "
                    f"got {type(sink).__name__}")


def same_sink(a, b) -> bool:
    """Whether two normalised sinks are the same place (the same directory or the same callable object)."""
    if isinstance(a, str) and isinstance(b, str):
        return os.path.normpath(a) == os.path.normpath(b)
    return a is b


#: Callable sinks of the groups of this process by token: the micro-batch function runs in the driver's process
#: in classic Spark, so a callable need not be picklable there (a closure over the group itself is not).
_CALLABLES: dict = {}


def encode_sink(sink):
    """A normalised sink as the plan keeps it: a directory as its path; a callable as ``(token, pickled)``, with
    ``pickled`` its cloudpickle (None when it cannot be pickled) for a micro-batch function in another process
    (Spark Connect runs it in the server's Python) and ``token`` the key of the callable in this process.
    """
    if isinstance(sink, str):
        return sink
    from pyspark import cloudpickle

    token = uuid.uuid4().hex
    _CALLABLES[token] = sink
    try:
        pickled = cloudpickle.dumps(sink)
    except Exception:   # e.g. a closure over a SparkSession: usable in this process only
        pickled = None
    return (token, pickled)


def deliver(sink, table: pa.Table, batch_id: int, spark_schema, session, query: str = "?") -> None:
    """Write ``table`` (one micro-batch's rows of one query) to ``sink`` idempotently by ``batch_id``."""
    if isinstance(sink, str):
        _write_directory(sink, table, batch_id)
        return
    token, pickled = sink
    fn = _CALLABLES.get(token)
    if fn is None:
        if pickled is None:
            raise RuntimeError(f"query {query!r}: its callable sink cannot be pickled, so it runs only where the group "
                               f"was made (classic Spark's driver); give a picklable function (no SparkSession in "
                               f"its closure) under Spark Connect")
        fn = _CALLABLES[token] = pickle.loads(pickled)
    df = session.createDataFrame(table, schema=spark_schema) if table.num_rows else \
        session.createDataFrame([], spark_schema)
    fn(df, batch_id)


def _write_directory(path: str, table: pa.Table, batch_id: int) -> None:
    os.makedirs(path, exist_ok=True)
    stem = f"{_PREFIX}{batch_id:012d}"
    for n in os.listdir(path):      # a micro-batch run again: its earlier files go first
        if n.startswith(stem + "."):
            os.remove(os.path.join(path, n))
    if not table.num_rows and any(n.startswith(_PREFIX) for n in os.listdir(path)):
        return   # nothing to add; the first batch writes an empty file so that the directory has a schema
    tmp = os.path.join(path, f".{stem}-{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(path, f"{stem}.parquet"))
