"""The ``pyspark-cq`` console script: ``doctor`` checks an installation (``--master`` a cluster's executors),
``demo`` runs the main job, ``run`` and ``explain`` run / explain a CQL query file (docs/cql.md), ``console``
serves the live web console over a demo query (docs/console.md), ``connect-server`` runs a Spark Connect server
for pyspark-cq clients (docs/deploy.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

__all__ = ["main", "doctor", "console", "connect_server"]


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
    """Print versions and prove a Spark Python worker imports the compiled modules."""
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

    print("\nstarting Spark to check a Python worker ...", flush=True)
    import pyspark_cq

    t0 = time.time()
    master = args.master or "local[1]"
    try:
        conf = dict(_key_value(c) for c in args.conf or ())
    except ValueError as exc:
        _fail("--conf", str(exc))
        return 1
    spark = pyspark_cq.spark(master, "pyspark-cq-doctor", shuffle_partitions=1, conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        executors = _executors(spark) if not master.startswith("local") else []
        rows = _probe(spark, len(executors))
    except Exception as exc:
        lines = [x for x in str(exc).strip().splitlines() if x.strip()]
        # a worker's failure: Spark's first line, then the end of the Python traceback (the actual error)
        tail = [x for x in lines[1:] if not x.lstrip().startswith(("at ", "File ", "^"))][-3:]
        _fail("spark worker", "\n         ".join([f"{type(exc).__name__}: {lines[0] if lines else ''}", *tail]))
        spark.stop()
        return 1
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


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE (e.g. spark.executor.memory=1g), got {text!r}")
    return key.strip(), value


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


def connect_server(args) -> int:
    """Run a Spark Connect server configured for pyspark-cq until interrupted (docs/deploy.md)."""
    from .session import start_connect_server

    try:
        conf = dict(_key_value(c) for c in args.conf or ())
        server = start_connect_server(args.port, master=args.master, conf=conf)
    except (ValueError, TypeError, RuntimeError) as exc:
        print(f"pyspark-cq connect-server: {exc}", file=sys.stderr)
        return 1
    print(f"Spark Connect server on {server.url} (master {args.master}, log {server.log}); join it with\n"
          f"  pyspark_cq.spark(remote={server.url!r})   or   SPARK_REMOTE={server.url}\nCtrl-C stops it.",
          flush=True)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _console_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="TCP port (default 8050; 0: any free port)")
    p.add_argument("--token", help="the token edits need (default: a new random one, printed)")
    p.add_argument("--policies", default="", help="comma-separated policies to run, e.g. pipes (default none)")
    p.add_argument("--memory-budget", help="the runtime's memory budget, e.g. '64 MB' (for --policies pipes)")
    p.add_argument("--rows-per-second", type=int, default=200, help="the demo query's input rate (default 200)")
    p.add_argument("--window", default="6 seconds", help="the demo query's initial window (default 6 seconds)")
    p.add_argument("--name", help="the query's name (default sensors for the demo, q for --cql)")
    p.add_argument("--cql", metavar="FILE", help="serve this CQL query over --source directories instead of the demo")
    from .lang.cli import add_source_arguments

    add_source_arguments(p, required=False)
    p.add_argument("--sink", default="memory",
                   help="with --cql: 'memory' (a table named after the query, default), 'console' or a directory")
    p.add_argument("--seconds", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")


def console(args) -> int:
    """Start a runtime with the demo query (or a CQL query over file streams) and serve the live web console
    until Ctrl-C (or ``--seconds``).
    """
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"pyspark-cq console needs the console extra ({exc}): pip install 'pyspark-cq[console]'",
              file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    import pyspark_cq
    from pyspark_cq.console import demo_query
    from pyspark_cq.runtime import CQRuntime

    from .lang import CQLSyntaxError
    from .lang.cli import _read_query, open_streams, source_paths
    from .lang.errors import CQLCompileError

    if args.cql is not None:
        text = _read_query(args.cql)
        sources, schemas = source_paths(args)
        if not sources:
            raise SystemExit("pyspark-cq: console --cql needs its streams: --source NAME=DIR (repeat per stream)")
    elif args.source:
        raise SystemExit("pyspark-cq: --source is for a --cql query; the demo query reads Spark's rate source")
    name = args.name or ("q" if args.cql else "sensors")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    active = SparkSession.getActiveSession()  # called in-process (tests, notebooks): keep their session as is
    spark = pyspark_cq.spark(args.master, "pyspark-cq-console") if active is None else active
    if active is None:
        spark.sparkContext.setLogLevel("ERROR")
    rt = CQRuntime(spark, policies=policies, memory_budget=args.memory_budget)
    if args.cql is None:
        demo_query(rt, name, rows_per_second=args.rows_per_second, window=args.window)
    else:
        try:   # rates: a file source's progress description holds its path
            rt.register_cql(name, text, sources=open_streams(spark, sources, schemas, args), sink=args.sink,
                            rates={n: os.path.abspath(path) for n, path in sources.items()})
        except (CQLSyntaxError, CQLCompileError) as exc:
            print(f"{args.cql}: {exc}", file=sys.stderr)
            return 2
    with rt:
        server = rt.serve(args.port, host=args.host, token=args.token)
        print(f"pyspark-cq console: {server.url}#token={server.token}\n"
              f"  edits need the token: {server.token}\n  control table: {rt.control_path}\n"
              f"  press Ctrl-C to stop", flush=True)
        try:
            t_end = None if args.seconds is None else time.monotonic() + args.seconds
            while t_end is None or time.monotonic() < t_end:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    if active is None:
        spark.stop()
    return 0


def main(argv=None) -> int:
    """Run the ``pyspark-cq`` command line (``doctor``, ``demo``, ``run``, ``explain``, ``console``); returns the exit
    status.
    """
    parser = argparse.ArgumentParser(prog="pyspark-cq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_doc = sub.add_parser("doctor", help="check the installation and a Spark worker")
    p_doc.add_argument("--master", help="Spark master (default local[1]); on a cluster every executor is probed")
    p_doc.add_argument("--conf", action="append", metavar="KEY=VALUE",
                       help="a Spark setting, e.g. spark.archives=env.tar.gz#environment (repeatable)")
    p_doc.add_argument("--no-spark", action="store_true", help="skip the Spark worker check")
    p_cs = sub.add_parser("connect-server", help="run a Spark Connect server for pyspark-cq clients (Ctrl-C stops)")
    p_cs.add_argument("--port", type=int, default=15002, help="gRPC port (default 15002)")
    p_cs.add_argument("--master", default="local[*]", help="the server's Spark master (default local[*])")
    p_cs.add_argument("--conf", action="append", metavar="KEY=VALUE", help="a server setting (repeatable)")
    p_demo = sub.add_parser("demo", help="run the main streaming job on local Spark")
    from .demo import add_arguments

    add_arguments(p_demo)
    from .lang.cli import add_explain_arguments, add_run_arguments, explain_command
    from .lang.cli import run as run_cql

    add_run_arguments(sub.add_parser("run", help="run a CQL query file over file sources"))
    add_explain_arguments(sub.add_parser("explain", help="the plan, operators and cost estimate of a CQL query"))
    _console_arguments(sub.add_parser("console", help="serve the live web console over a demo query"))
    args = parser.parse_args(argv)
    if args.command == "console":
        return console(args)
    if args.command == "doctor":
        return doctor(args)
    if args.command == "connect-server":
        return connect_server(args)
    if args.command == "run":
        return run_cql(args)
    if args.command == "explain":
        return explain_command(args)
    from .demo import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
