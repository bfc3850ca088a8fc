"""``pyspark_cq.spark()``: a SparkSession with sensible defaults for pyspark-cq on a laptop or cluster.

=================  ==========================================================================
module             what
=================  ==========================================================================
`java`             where the Java runtime comes from (:func:`find_java`, :func:`java_version`)
`settings`         the Spark settings and the environment of a session (or local Connect server)
`connect`          Spark Connect: a client session, :func:`start_connect_server`
`workers`          Python workers started ahead of the first micro-batch
`pools`            the FAIR scheduler pools of ``edf=True``
=================  ==========================================================================

The session knows no operator, runtime, policy or language (docs/architecture.md, "Layers").
"""
from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings

from .connect import ConnectServer, _connect_session, start_connect_server
from .java import find_java, java_version
from .pools import allocation_file, has_pools
from .settings import _quiet_logs, _remote_url, _settings, _worker_site_env
from .workers import WARM_JOB_GROUP, warm_python_workers

__all__ = ["spark", "find_java", "java_version", "ConnectServer", "start_connect_server", "warm_python_workers",
           "WARM_JOB_GROUP"]


def default_master() -> str:
    """The master of :func:`spark` (and of every ``pyspark-cq`` command) when none is given: ``$SPARK_MASTER``,
    else ``local[*]``.
    """
    return os.environ.get("SPARK_MASTER") or "local[*]"


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
    master = master or default_master()
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

        conf = {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": allocation_file(), **(conf or {})}
    settings = _settings(local, ui, shuffle_partitions, conf, extra_conf)
    if remote is not None:
        session = _connect_session(remote, app_name, settings, user_keys={*map(str, conf or {}),
                                                                          *(k.replace("_", ".") for k in extra_conf)})
        settings = {k: v for k, v in settings.items() if k.startswith("spark.sql.")}
    else:
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in (_quiet_logs(settings) if local else settings).items():
            builder = builder.config(key, value)
        new = SparkSession.getActiveSession() is None
        with _worker_site_env() if local else contextlib.nullcontext():
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
        if not has_pools(session):
            raise RuntimeError("edf=True: this process already runs a SparkSession without pyspark-cq's scheduler "
                               "pools (spark.scheduler.mode is static); stop it first (spark.stop()), then call "
                               "pyspark_cq.spark(..., edf=True)")
    return session


#: Names that moved to the operators (an operator's advice, not a session setting), kept here for one release.
_MOVED = {"warn_shuffle_partitions": "pyspark_cq.operators._common.partitions",
          "PARTITIONS_PER_CORE_LIMIT": "pyspark_cq.operators._common.partitions"}


def __getattr__(name: str):
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"pyspark_cq.session.{name} is deprecated: import it from {module}", DeprecationWarning,
                  stacklevel=2)
    # imported by name on first use, so that the session itself never loads an operator
    return getattr(importlib.import_module(module), name)
