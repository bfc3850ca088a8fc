"""The ``pyspark-cq`` console script: ``doctor`` checks an installation, ``demo`` runs the main job, ``run`` and
``explain`` run / explain a CQL query file (docs/cql.md), ``console`` serves the live web console over a demo
query (docs/console.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

__all__ = ["main", "doctor", "console"]


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
    yield pa.RecordBatch.from_pydict({
        "pid": [os.getpid()],
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
    spark = pyspark_cq.spark(args.master or "local[1]", "pyspark-cq-doctor", shuffle_partitions=1)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = spark.range(1).mapInArrow(
            _worker_probe, "pid long, python string, modules string, kernel string").collect()
    except Exception as exc:
        _fail("spark worker", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        spark.stop()
        return 1
    spark.stop()
    row = rows[0]
    expected = "[4, 5] [8, 6] [0, 1] serde=ok"  # row 2 is empty after rounding: left unrounded
    if row.pid == os.getpid() or row.kernel != expected:
        _fail("spark worker", f"unexpected answer from the worker: {row}")
        return 1
    _ok("spark worker", f"pid {row.pid} (driver {os.getpid()}), python {row.python}")
    _ok("worker native modules", row.modules)
    _ok("worker kernel run", row.kernel)
    print(f"\nall checks passed ({time.time() - t0:.1f} s for Spark)")
    return 0


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
    p_doc.add_argument("--master", help="Spark master (default local[1])")
    p_doc.add_argument("--no-spark", action="store_true", help="skip the Spark worker check")
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
    if args.command == "run":
        return run_cql(args)
    if args.command == "explain":
        return explain_command(args)
    from .demo import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
