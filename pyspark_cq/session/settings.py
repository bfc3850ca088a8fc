"""The Spark settings of a pyspark-cq session and the process environment a Spark started from here needs."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from pathlib import Path

from .java import find_java

__all__: list[str] = []   # internals of spark() and start_connect_server


#: The directory of the workers' start-up hook (``_worker_site/sitecustomize.py``), first on the ``PYTHONPATH``
#: of a local session's Python workers.
WORKER_SITE = str(Path(__file__).with_name("_worker_site"))
_WORKER_PATH = "spark.executorEnv.PYTHONPATH"


def _settings(local: bool, ui: bool, shuffle_partitions: int | None, conf: dict | None, extra_conf: dict) -> dict:
    """The Spark settings of a pyspark-cq session (or local Connect server); prepares this process's
    environment (Java, the workers' Python) for a Spark started from here.
    """
    java_home, _ = find_java()
    os.environ.setdefault("JAVA_HOME", java_home)
    if local:
        # Workers must run this interpreter, where pyspark_cq and its compiled modules are installed.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        # Workers start as `python -m pyspark.daemon` in the JVM's working directory; from a source
        # checkout that directory holds pyspark_cq/ without its compiled modules and would shadow the
        # installed package. PYTHONSAFEPATH (Python >= 3.11) keeps the working directory off sys.path.
        os.environ.setdefault("PYTHONSAFEPATH", "1")
        # Local mode needs no network interface; loopback avoids hostname-resolution surprises.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Numba compiles on first call in each worker; a shared cache dir makes that once per machine.
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(tempfile.gettempdir()) / "pyspark_cq_numba"))

    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.executorEnv.NUMBA_CACHE_DIR": os.environ["NUMBA_CACHE_DIR"],
        # Int.MaxValue switches off Spark's byte limit on the Arrow batches it feeds Python workers;
        # the limit is checked once per *row* (ArrowWriter.sizeInBytes walks every vector), ~20 % of the
        # JVM's time in our operators' input stages. Batches stay bounded by arrow.maxRecordsPerBatch.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    }
    if local:
        cores = os.cpu_count() or 2
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions or 2 * cores)
        settings["spark.default.parallelism"] = str(2 * cores)
        # Workers import PySpark from its installed package (cached bytecode), not from pyspark.zip,
        # which Python recompiles in every new worker (see pyspark_cq/_daemon.py).
        settings["spark.python.daemon.module"] = "pyspark_cq._daemon"
        # ... and so do the workers that plan a Python data source, which Spark starts with a hard-coded
        # `-m pyspark.daemon`: a start-up hook on their PYTHONPATH hands them to the same daemon (see
        # WORKER_SITE's sitecustomize.py), which also ends them quietly when let go. Here for the workers of
        # Python functions; _worker_site_env gives it to the JVM, for the runners that build their own env.
        settings["spark.executorEnv.PYTHONPATH"] = WORKER_SITE
        # Over loopback TCP (Spark's default) a Python round trip that sends little waits ~40 ms, as when
        # Nagle's algorithm meets the worker's delayed ACK: e.g. the event-time timeout phase every
        # applyInPandasWithState task runs after its groups, ~100 ms per micro-batch of our operators over
        # 2 tasks. A Unix domain socket has no such wait (docs/benchmark-log-2026.md, "A fair order, ...").
        if os.name == "posix" and hasattr(socket, "AF_UNIX"):
            settings["spark.python.unix.domain.socket.enabled"] = "true"
    elif shuffle_partitions:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    for key, value in (conf or {}).items():
        settings[str(key)] = str(value)
    for key, value in extra_conf.items():
        settings[key.replace("_", ".")] = str(value)
    if local and settings.get(_WORKER_PATH, WORKER_SITE) != WORKER_SITE:   # the user's path too, after ours
        settings[_WORKER_PATH] = os.pathsep.join([WORKER_SITE, settings[_WORKER_PATH]])
    if not local and "spark.pyspark.python" in settings:
        # A driver started as plain `python` (not by spark-submit) tells the executors which Python to run
        # from $PYSPARK_PYTHON alone (SparkContext.pythonExec); the setting by itself would leave them on
        # `python3`, without the environment shipped to them (docs/deploy.md).
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    return settings


#: The log configuration of a classic session started by :func:`pyspark_cq.spark` (see the file's comment).
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
_DRIVER_OPTIONS = "spark.driver.extraJavaOptions"


@contextlib.contextmanager
def _worker_site_env():
    """While a local session's JVM starts: :data:`WORKER_SITE` first on this process's ``PYTHONPATH``, which the
    JVM inherits and passes to every Python worker it starts. ``spark.executorEnv.PYTHONPATH`` reaches the
    workers of Python functions only; the runner that looks up the Python data sources builds its own, empty
    environment. Restored afterwards: this process and what it starts later keep their own path.
    """
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([WORKER_SITE, old]) if old else WORKER_SITE
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _quiet_logs(settings: dict) -> dict:
    """``settings`` with the driver JVM logging through :data:`LOG_CONFIG`, unless they name a log4j
    configuration of their own (then they are returned as they are).
    """
    options = settings.get(_DRIVER_OPTIONS, "")
    if "log4j" in options or not LOG_CONFIG.is_file():
        return settings
    return {**settings, _DRIVER_OPTIONS: f"{options} -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}".strip()}


def _remote_url(master: str | None, remote: str | None) -> str | None:
    """The Spark Connect URL asked for (``remote`` or ``$SPARK_REMOTE``), or None for a classic session."""
    env = os.environ.get("SPARK_REMOTE") or None
    if remote is not None:
        if not isinstance(remote, str) or not (remote == "local" or remote.startswith(("sc://", "local["))):
            raise ValueError(f"remote must be a Spark Connect URL 'sc://host[:port][/;param=value]' or 'local' / "
                             f"'local[N]' (a local server started in this process), got {remote!r}")
        if master is not None:
            raise ValueError(f"give master (a classic session) or remote (Spark Connect), not both: "
                             f"master={master!r}, remote={remote!r}")
        return remote
    if env is None:
        return None
    if master is not None:
        raise ValueError(f"master={master!r} asks for a classic session, but SPARK_REMOTE={env!r} is set and "
                         f"PySpark would refuse the master (CANNOT_CONFIGURE_SPARK_CONNECT_MASTER): unset "
                         f"SPARK_REMOTE, or call pyspark_cq.spark() without master for a Connect session")
    return _remote_url(None, env)
