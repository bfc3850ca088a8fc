"""Spark's Python worker daemon, importing PySpark from its installed package instead of ``pyspark.zip``.

Spark starts its Python workers with ``SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``.
Python compiles modules imported from a zip archive from source every time (it never caches their
bytecode), so every new daemon and every forked worker re-compiles the parts of PySpark it imports:
about 8 s of CPU on this machine before the first micro-batch of a stateful query can run (measured
with py-spy; docs/benchmark-log-2026.md). When the zip is the one shipped inside the installed ``pyspark``
package (a pip install, as in local mode), the installed package is the same code with cached bytecode,
so this module drops the zip from ``sys.path`` and then runs :mod:`pyspark.daemon`.

``pyspark_cq.spark()`` selects it in local mode (``spark.python.daemon.module``). Any other layout (a
cluster's own ``SPARK_HOME``) keeps ``sys.path`` as it is.

It also keeps a worker quiet when the JVM has already closed its connection (:func:`quiet_when_closed`).
"""
from __future__ import annotations

import functools
import os
import sys


def installed_zip_entries(path: list[str]) -> list[str]:
    """The ``pyspark.zip`` entries of ``path`` that lie inside an installed ``pyspark`` package which
    ``path`` also reaches (``<dir>/pyspark/python/lib/pyspark.zip`` with ``<dir>`` on ``path``).
    """
    dirs = {os.path.realpath(p) for p in path if p and not p.endswith(".zip")}
    out = []
    for entry in path:
        if os.path.basename(entry) != "pyspark.zip":
            continue
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(entry))))
        if (os.path.basename(package) == "pyspark" and os.path.isfile(os.path.join(package, "__init__.py"))
                and os.path.dirname(package) in dirs):
            out.append(entry)
    return out


def quiet_when_closed(worker):
    """``pyspark.daemon.worker`` ending without a traceback when the JVM closed the connection first.

    Over a Unix domain socket (``cq.spark()``'s default in local mode) the worker's last flush to a
    connection the JVM has closed fails at once with EPIPE, where loopback TCP buffers it. The JVM closes
    the connections of idle workers after a minute and of all workers at ``spark.stop()``, so PySpark's
    daemon would print a ``BrokenPipeError`` traceback each time, while the JVM is no longer listening.
    The wrapped call returns 1 instead, a failed worker's code, so the daemon ends that worker process
    (without reusing it), as after the traceback; any other error still raises.
    """
    @functools.wraps(worker)
    def run(sock, authenticated):
        try:
            return worker(sock, authenticated)
        except BrokenPipeError:
            return 1

    return run


def main() -> None:
    for entry in installed_zip_entries(sys.path):
        sys.path.remove(entry)
    import pyspark.daemon as daemon

    daemon.worker = quiet_when_closed(daemon.worker)
    daemon.manager()


if __name__ == "__main__":
    main()
