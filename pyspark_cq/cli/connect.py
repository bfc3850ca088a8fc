"""``pyspark-cq connect-server``: a Spark Connect server for pyspark-cq clients (docs/deploy.md)."""
from __future__ import annotations

import signal
import sys

from ._common import MASTER_HELP, _key_value, add_master_argument

__all__ = ["connect_server", "add_connect_arguments"]


def add_connect_arguments(p) -> None:
    """Arguments of ``pyspark-cq connect-server``."""
    p.add_argument("--port", type=int, default=15002, help="gRPC port (default 15002)")
    add_master_argument(p, "the server's " + MASTER_HELP[0].lower() + MASTER_HELP[1:])
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="a server setting (repeatable)")


class _Stopped(Exception):
    """A stop signal arrived (SIGTERM, SIGHUP; SIGINT is Python's KeyboardInterrupt)."""


def _stop(signum, frame):
    raise _Stopped(signum)


def connect_server(args) -> int:
    """Run a Spark Connect server configured for pyspark-cq until SIGINT (Ctrl-C), SIGTERM or SIGHUP stops it
    (docs/deploy.md).
    """
    from ..session import default_master, start_connect_server

    # A process manager stops with SIGTERM (systemd, docker stop, kill) or SIGHUP (a closed terminal): their
    # default action ends Python without the finally below, leaving the server's JVM (its own session) running
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    server = None
    try:
        try:
            conf = dict(_key_value(c) for c in args.conf or ())
            master = args.master or default_master()
            server = start_connect_server(args.port, master=master, conf=conf)
        except (ValueError, TypeError, RuntimeError) as exc:
            print(f"pyspark-cq connect-server: {exc}", file=sys.stderr)
            return 1
        print(f"Spark Connect server on {server.url} (master {master}, server pid {server.process.pid}, "
              f"log {server.log}); join it with\n"
              f"  pyspark_cq.spark(remote={server.url!r})   or   SPARK_REMOTE={server.url}\n"
              f"Ctrl-C, SIGTERM or SIGHUP stops it.", flush=True)
        return server.process.wait()
    except (KeyboardInterrupt, _Stopped):
        return 0
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
