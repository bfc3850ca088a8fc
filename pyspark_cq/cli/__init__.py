"""The ``pyspark-cq`` console script: ``doctor`` checks an installation (``--master`` a cluster's executors),
``demo`` runs the main job, ``run`` and ``explain`` run / explain a CQL query file (docs/cql.md), ``console``
serves the live web console over a demo query (docs/console.md), ``connect-server`` runs a Spark Connect server
for pyspark-cq clients (docs/deploy.md).
"""
# One module per command group: doctor, connect (connect-server),
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

__all__ = ["main", "build_parser", "doctor", "console", "connect_server"]


#: command -> (one-line help, description of its help page); plain text: argparse prints it as it is
COMMANDS = {
    "doctor": ("check the installation and a Spark worker",
               "Print the versions, the compiled modules and Java, then start Spark and check that a Python "
               "worker imports the compiled modules and runs a kernel (with a cluster --master: every executor)."),
    "connect-server": ("run a Spark Connect server for pyspark-cq clients (Ctrl-C, SIGTERM or SIGHUP stops it)",
                       "Run a Spark Connect server configured for pyspark-cq (Java, Python workers, settings as "
                       "pyspark_cq.spark) until Ctrl-C, SIGTERM or SIGHUP stops it; clients join it with "
                       "pyspark_cq.spark(remote='sc://127.0.0.1:PORT'). See docs/deploy.md."),
    "demo": ("run the main streaming job on local Spark",
             "Run the demo job on local Spark: a generated packet stream (quiet, burst, quiet) through an interval "
             "join and a sliding aggregation that the PIPES resource manager adapts to a memory budget; prints "
             "progress, a summary and writes a report (report.html). With --group: several window queries over "
             "the stream as one query group (docs/groups.md), each query's rows per micro-batch."),
    "run": ("run CQL query files over file sources",
            "Compile a CQL query file (docs/cql.md) to pyspark-cq's operators and run it over directories of "
            "parquet / json / csv files, printing progress per micro-batch. Several queries (files, or a file of "
            "';'-separated queries) run as one query group (docs/groups.md), each into <sink>/<name>. The "
            "queries are checked against the --source names and columns before Spark starts."),
    "explain": ("the plan, operators and cost estimate of a CQL query",
                "Print the logical plan, the operators chosen and the PIPES cost estimate of a CQL query file, "
                "without Spark (--source directories resolve unqualified columns)."),
    "console": ("serve the live web console over a demo query",
                "Start a runtime with the demo query (or --cql FILE over --source directories) and serve the "
                "live web console (docs/console.md) until Ctrl-C or --seconds."),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``pyspark-cq`` argument parser: one subcommand per entry of ``COMMANDS``."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="pyspark-cq", description="pyspark-cq: continuous queries (CQL) and adaptive streaming operators "
        "for Spark Structured Streaming. Every command's --master defaults to $SPARK_MASTER, else local[*]; "
        "'pyspark-cq COMMAND --help' describes a command.")
    parser.add_argument("--version", action="version", version=f"pyspark-cq {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders = {"doctor": add_doctor_arguments, "connect-server": add_connect_arguments, "demo": add_demo_arguments,
              "run": add_run_arguments, "explain": add_explain_arguments, "console": add_console_arguments}
    for name, (summary, description) in COMMANDS.items():
        adders[name](sub.add_parser(name, help=summary, description=description))
    return parser


def main(argv=None) -> int:
    """Run the ``pyspark-cq`` command line (``doctor``, ``connect-server``, ``demo``, ``run``, ``explain``,
    ``console``); returns the exit status.
    """
    args = build_parser().parse_args(argv)
    commands = {"doctor": doctor, "connect-server": connect_server, "demo": run_demo, "run": run_cql,
                "explain": explain_command, "console": console}
    return commands[args.command](args)
