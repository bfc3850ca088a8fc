"""Input files for streaming tests: one parquet file per micro-batch, in the order written."""
from __future__ import annotations

import os

import pyarrow.parquet as pq


def write_in_order(table, path, order: int) -> None:
    """Write ``table`` to ``path`` with modification time ``1_000_000 + 10·order`` seconds, atomically.

    The file source takes files in modification-time order, so distinct old times keep one file per
    micro-batch in the order written. The file is written under a hidden name (the file source skips names
    starting with ".") and renamed once its time is set: a running query that listed the file between
    the write and the ``utime`` would record today's time, take every later file (1970) for older than
    its ``maxFileAge`` and never read it.
    """
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    pq.write_table(table, tmp)
    os.utime(tmp, (1_000_000 + order * 10, 1_000_000 + order * 10))
    os.replace(tmp, path)
