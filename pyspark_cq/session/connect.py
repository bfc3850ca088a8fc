"""Spark Connect: a client session (``pyspark_cq.spark(remote=...)``) and a server started for pyspark-cq."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from .settings import _settings, _worker_site_env

__all__ = ["ConnectServer", "start_connect_server", "remove_listener"]


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
    with _worker_site_env() if remote.startswith("local") else contextlib.nullcontext():
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
        """Stop the server: SIGTERM to its process group (the script, spark-submit and the JVM), SIGKILL to
        what is left of it after ``timeout`` seconds; returns when the whole group has exited (the JVM outlives
        the script by a moment, holding the port).
        """
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline, killed = time.monotonic() + timeout, False
        while _group_alive(self.process.pid):
            if time.monotonic() > deadline:
                if killed:   # only zombies left, which an init that does not reap keeps
                    break
                os.killpg(self.process.pid, signal.SIGKILL)
                deadline, killed = time.monotonic() + 5, True
            self.process.poll()   # reaps the script; its children are reaped by init
            time.sleep(0.1)
        self.process.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # a process of another user took the group id: ours are gone
        return False
    return True


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
        with _worker_site_env() if master.startswith("local") else contextlib.nullcontext():
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
    try:
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                why = "it exited" if process.returncode is not None else f"not listening after {timeout} s"
                raise RuntimeError(f"the Spark Connect server on port {port} did not start ({why}); its log "
                                   f"{log}:\n{server.log_tail()}")
            time.sleep(0.5)
    except BaseException:   # also Ctrl-C or a stop signal while waiting: the server runs in a session of its own
        server.stop()
        raise
    return server


def remove_listener(spark, listener, timeout: float = 60.0) -> None:
    """``spark.streams.removeListener(listener)``, and under Spark Connect without PySpark's deadlock.

    PySpark's Connect listener bus (4.x, ``StreamingQueryListenerBus.remove``) removes the last listener by asking
    the server to end its event stream and joining the thread that reads it **while holding the lock** that thread
    takes to deliver an event: an event that arrives in between (a query's last progress) hangs both for ever (seen
    on 2026-11-29: ``CQRuntime.stop`` in the Connect test run, after a query stopped). Here the last listener's
    removal ends the server's stream and joins the reader outside the lock (at most ``timeout`` seconds), then takes
    the listener off the bus; other cases, and a bus of another shape, go through PySpark's own call.
    """
    streams = spark.streams
    bus = getattr(streams, "_sqlb", None)
    if bus is None or not all(hasattr(bus, a) for a in ("_lock", "_listener_bus", "_execution_thread", "_sqm")):
        streams.removeListener(listener)
        return
    with bus._lock:
        if listener not in bus._listener_bus:
            return
        if len(bus._listener_bus) > 1:       # not the last: PySpark only takes it off the bus
            bus._listener_bus.remove(listener)
            return
    import pyspark.sql.connect.proto as pb2

    cmd = pb2.StreamingQueryListenerBusCommand()
    cmd.remove_listener_bus_listener = True
    command = pb2.Command()
    command.streaming_query_listener_bus_command.CopyFrom(cmd)
    bus._sqm._session.client.execute_command(command)
    thread = bus._execution_thread
    if thread is not None:
        thread.join(timeout)
    with bus._lock:
        if listener in bus._listener_bus:
            bus._listener_bus.remove(listener)
        if thread is not None and not thread.is_alive():
            bus._execution_thread = None

