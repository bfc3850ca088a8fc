"""The ``pyspark-cq`` console script: ``doctor`` checks an installation (``--master`` a cluster's executors),
``demo`` runs the main job, ``run`` and ``explain`` run / explain a CQL query file (docs/cql.md), ``console``
serves the live web console over a demo query (docs/console.md), ``connect-server`` runs a Spark Connect server
for pyspark-cq clients (docs/deploy.md).
"""
# (this docstring is the --help text.) One module per command group: doctor, connect (connect-server),
# cql (run, explain), console; demo's arguments and run are pyspark_cq.demo's.
from __future__ import annotations

import argparse

from ..demo import add_arguments as add_demo_arguments
from ..demo import run as run_demo
from .connect import add_connect_arguments, connect_server
from .console import add_console_arguments, console
from .cql import add_explain_arguments, add_run_arguments, explain_command
from .cql import run as run_cql
from .doctor import add_doctor_arguments, doctor

__all__ = ["main", "doctor", "console", "connect_server"]


def main(argv=None) -> int:
    """Run the ``pyspark-cq`` command line (``doctor``, ``demo``, ``run``, ``explain``, ``console``); returns the exit
    status.
    """
    parser = argparse.ArgumentParser(prog="pyspark-cq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_doctor_arguments(sub.add_parser("doctor", help="check the installation and a Spark worker"))
    add_connect_arguments(sub.add_parser("connect-server", help="run a Spark Connect server for pyspark-cq "
                                         "clients (Ctrl-C, SIGTERM or SIGHUP stops it)"))
    add_demo_arguments(sub.add_parser("demo", help="run the main streaming job on local Spark"))
    add_run_arguments(sub.add_parser("run", help="run a CQL query file over file sources"))
    add_explain_arguments(sub.add_parser("explain", help="the plan, operators and cost estimate of a CQL query"))
    add_console_arguments(sub.add_parser("console", help="serve the live web console over a demo query"))
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
    return run_demo(args)

