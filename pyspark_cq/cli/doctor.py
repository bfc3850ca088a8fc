"""``pyspark-cq doctor``: versions, the compiled modules, Java, and a Spark Python worker (every executor of a
cluster with ``--master``) that imports the compiled modules and runs a kernel.
"""
from __future__ import annotations

import os
import platform
import re
import sys
import time
from importlib import metadata

from ._common import MASTER_HELP, _key_value, add_master_argument

__all__ = ["doctor", "add_doctor_arguments", "extras", "USER_EXTRAS"]


def add_doctor_arguments(p) -> None:
    """Arguments of ``pyspark-cq doctor``."""
    add_master_argument(p, MASTER_HELP + "; on a cluster every executor is probed")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE",
                   help="a Spark setting, e.g. spark.archives=env.tar.gz#environment (repeatable)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark worker check")


#: The optional extras a user installs for a feature (``test`` and ``bench`` are the project's own).
USER_EXTRAS = ("jdk", "report", "console", "connect")

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?[^;]*(?:;(.*))?$")


def _requirements(dist: str, extra: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(distribution, its extras)`` that ``dist``'s extra ``extra`` asks for (from the installed metadata)."""
    out = []
    for req in metadata.requires(dist) or []:
        m = _REQUIREMENT.match(req)
        if m and m.group(3) and re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", m.group(3)):
            out.append((m.group(1), tuple(e.strip() for e in (m.group(2) or "").split(",") if e.strip())))
    return out


def _missing(dist: str, extras: tuple[str, ...] = ()) -> list[str]:
    """The distributions that ``dist`` (with ``extras``) needs and that are not installed, itself included."""
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return [dist]
    return [m for extra in extras for name, sub in _requirements(dist, extra) for m in _missing(name, sub)]


def extras(names=USER_EXTRAS) -> dict[str, list[str]]:
    """For each of pyspark-cq's optional extras ``names``, the packages it needs that are missing (an empty list:
    installed), read from the installed package's metadata.

    Parameters
    ----------
    names : iterable of str
        Extras of ``pyspark-cq`` (``pip install "pyspark-cq[<name>]"``), default :data:`USER_EXTRAS`.
    """
    names = list(names)
    known = set(metadata.metadata("pyspark-cq").get_all("Provides-Extra") or [])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"names must be extras of pyspark-cq ({sorted(known)}), got {unknown}")
    return {n: [m for dist, sub in _requirements("pyspark-cq", n) for m in _missing(dist, sub)] for n in names}


def _ok(label: str, value: str) -> None:
    print(f"  [ok]   {label:<22} {value}")


def _fail(label: str, value: str) -> None:
    print(f"  [FAIL] {label:<22} {value}")


def _worker_probe(batches):
    """Runs in a Spark Python worker: import every compiled module and run the Γ kernel once."""
    import numpy as np
    import pyarrow as pa

    from pyspark_cq._native import check_build, load

    paths = check_build()
    s, e, st = load("_granularity").round_intervals(np.array([1, 5]), np.array([9, 6]), 4)
    blob = load("_serde").pack([s, e])
    same = all((a == b).all() for a, b in zip(load("_serde").unpack(blob), (s, e)))
    for _ in batches:
        pass
    import socket

    time.sleep(0.2)    # several probe tasks at once spread over the executors
    yield pa.RecordBatch.from_pydict({
        "pid": [os.getpid()],
        # an executor's Python workers run in its working directory (standalone: work/<app>/<executor id>,
        # YARN: the container's directory) on its host
        "executor": [f"{socket.gethostname()}:{os.getcwd()}"],
        "python": [sys.executable],
        "modules": [";".join(f"{k}={v}" for k, v in sorted(paths.items()))],
        "kernel": [f"{s.tolist()} {e.tolist()} {st.tolist()} serde={'ok' if same else 'BAD'}"],
    })


def doctor(args) -> int:
    """Print versions and prove a Spark Python worker imports the compiled modules: in a session of its own, or,
    called in-process where a classic session runs, in that session (on a cluster: every executor), kept as it
    is.
    """
    failures = 0
    print("pyspark-cq doctor")
    _ok("python", f"{platform.python_version()} ({sys.executable})")
    for mod in ("pyspark", "pyarrow", "pandas", "numpy", "numba"):
        try:
            _ok(mod, __import__(mod).__version__)
        except Exception as exc:  # report every missing piece, not only the first
            _fail(mod, f"not importable: {exc}")
            failures += 1
    from pyspark_cq import __version__
    from pyspark_cq._native import NativeBuildError, check_build
    from pyspark_cq.session import find_java, java_version

    _ok("pyspark-cq", __version__)
    try:
        for name, missing in extras().items():
            if missing:   # optional: not a failure
                print(f"  [--]   {'extra ' + name:<22} not installed (missing {', '.join(missing)}): "
                      f"pip install \"pyspark-cq[{name}]\"")
            else:
                _ok(f"extra {name}", "installed")
    except metadata.PackageNotFoundError:   # running from a source tree that was never installed
        print("  [--]   extras                 unknown: pyspark-cq's metadata is not installed")
    try:
        for name, path in check_build().items():
            _ok(f"native {name}", path)
    except NativeBuildError as exc:
        _fail("native modules", str(exc))
        failures += 1
    try:
        home, source = find_java()
        _ok("java", f"{java_version(home)} (from {source}: {home})")
    except Exception as exc:
        _fail("java", str(exc))
        return 1
    if failures:
        print(f"\n{failures} problem(s) found; fix them before starting Spark.")
        return 1
    if args.no_spark:
        print("\nskipped the Spark worker check (--no-spark)")
        return 0

    from pyspark.sql import SparkSession

    import pyspark_cq

    t0 = time.time()
    from ..session import default_master

    try:
        conf = dict(_key_value(c) for c in args.conf or ())
    except ValueError as exc:
        _fail("--conf", str(exc))
        return 1
    # Called in-process where a classic session runs (a notebook, a job's driver): check that session's workers
    # (on a cluster its executors) and leave it as it is, its settings and its end its owner's, as `console` does.
    active = SparkSession.getActiveSession()
    try:
        master = active.sparkContext.master if active is not None else None
    except Exception:  # a Spark Connect session has no SparkContext here: doctor starts its own, as before
        active = None
    if active is None:
        print("\nstarting Spark to check a Python worker ...", flush=True)
        master = args.master or default_master()
        spark = pyspark_cq.spark(master, "pyspark-cq-doctor", shuffle_partitions=1, conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
    else:
        spark = active
        ignored = " (--master and --conf are for a session of its own)" if args.master or conf else ""
        print(f"\nchecking the running Spark session's Python workers (master {master}){ignored} ...", flush=True)
    try:
        executors = _executors(spark) if not master.startswith("local") else []
        rows = _probe(spark, len(executors))
    except Exception as exc:
        lines = [x for x in str(exc).strip().splitlines() if x.strip()]
        # a worker's failure: Spark's first line, then the end of the Python traceback (the actual error)
        tail = [x for x in lines[1:] if not x.lstrip().startswith(("at ", "File ", "^"))][-3:]
        _fail("spark worker", "\n         ".join([f"{type(exc).__name__}: {lines[0] if lines else ''}", *tail]))
        if active is None:
            spark.stop()
        return 1
    if active is None:
        spark.stop()
    expected = "[4, 5] [8, 6] [0, 1] serde=ok"  # row 2 is empty after rounding: left unrounded
    bad = [r for r in rows if r.pid == os.getpid() or r.kernel != expected]
    if bad:
        _fail("spark worker", f"unexpected answer from a worker: {bad[0]}")
        return 1
    seen = sorted({r.executor: r for r in rows}.items())
    if not executors:
        row = rows[0]
        _ok("spark worker", f"pid {row.pid} (driver {os.getpid()}), python {row.python}")
        _ok("worker native modules", row.modules)
        _ok("worker kernel run", row.kernel)
    else:
        for i, (where, row) in enumerate(seen):
            _ok(f"executor {i + 1} of {len(executors)}", f"{where}: python {row.python}")
            _ok("  native modules", row.modules)
            _ok("  kernel run", row.kernel)
        if len(seen) < len(executors):
            _fail("executors", f"{len(executors) - len(seen)} of the {len(executors)} executors ran no probe task "
                               f"(answered: {[w for w, _ in seen]})")
            return 1
    print(f"\nall checks passed ({time.time() - t0:.1f} s for Spark)")
    return 0


def _executors(spark, settle: float = 3.0, timeout: float = 120.0) -> list[str]:
    """The executor ids of a cluster session, once their number has not changed for ``settle`` seconds."""
    jsc = spark.sparkContext._jsc.sc()
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while True:
        ids = jsc.getExecutorIds()
        found = sorted(str(ids.apply(i)) for i in range(ids.size()))
        if found != last:
            last, since = found, time.monotonic()
        if last and time.monotonic() - since >= settle:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"no executor registered within {timeout:.0f} s (does the cluster have free cores "
                               f"and memory for spark.executor.memory?)")
        time.sleep(0.5)


def _probe(spark, executors: int, attempts: int = 5) -> list:
    """Run the worker probe in enough tasks that every one of ``executors`` executors answers."""
    tasks = max(1, 4 * executors)
    rows: list = []
    for _ in range(attempts):
        rows += spark.range(tasks, numPartitions=tasks).mapInArrow(
            _worker_probe, "pid long, executor string, python string, modules string, kernel string").collect()
        if len({r.executor for r in rows}) >= executors:
            break
    return rows
