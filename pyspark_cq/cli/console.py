"""``pyspark-cq console``: the live web console over a runtime built here, running the demo query or a CQL
query over file streams (docs/console.md).
"""
from __future__ import annotations

import os
import sys
import time

from ._common import add_master_argument
from .cql import _read_query, add_source_arguments, open_streams, source_paths

__all__ = ["console", "add_console_arguments"]


def add_console_arguments(p) -> None:
    """Arguments of ``pyspark-cq console``."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="TCP port (default 8050; 0: any free port)")
    p.add_argument("--token", help="the token edits need (default: a new random one, printed)")
    p.add_argument("--policies", default="", help="comma-separated policies to run, e.g. pipes (default none)")
    p.add_argument("--memory-budget", help="the runtime's memory budget, e.g. '64 MB' (for --policies pipes)")
    p.add_argument("--rows-per-second", type=int, default=200, help="the demo query's input rate (default 200)")
    p.add_argument("--window", default="6 seconds", help="the demo query's initial window (default 6 seconds)")
    p.add_argument("--name", help="the query's name (default sensors for the demo, q for --cql)")
    p.add_argument("--cql", metavar="FILE", help="serve this CQL query over --source directories instead of the demo")
    add_source_arguments(p, required=False)
    p.add_argument("--sink", default="memory",
                   help="with --cql: 'memory' (a table named after the query, default), 'console' or a directory")
    p.add_argument("--seconds", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    add_master_argument(p)


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

    from ..lang import CQLSyntaxError
    from ..lang.errors import CQLCompileError

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
