"""What every benchmark's ``main`` uses: the shared options, the machine and load record, sessions, results.

A script builds its parser with :func:`parser`, adds its own options, records the machine with :func:`start`
and ends with :func:`write_result`, which writes its result with ``"benchmark"``, ``"machine"`` (before and
after: the load) and ``"args"`` as JSON to ``--json PATH`` or, by default, to
``benchmarks/results/<name>-<UTC date>.json``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]          # the repository root: Spark's workers import from here
RESULTS = ROOT / "benchmarks" / "results"     # the JSON results (docs/benchmarks.md links them)
FIGURES = ROOT / "docs" / "figures"           # the images the docs show


def parent_parser() -> argparse.ArgumentParser:
    """The options most scripts share (``add_help=False``, for ``parents=[...]``)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("harness")
    g.add_argument("--json", metavar="PATH", default=None,
                   help="where to write the result as JSON (default: benchmarks/results/<name>-<UTC date>.json)")
    g.add_argument("--no-json", action="store_true", help="write no result file")
    return p


def parser(doc: str | None, **kw) -> argparse.ArgumentParser:
    """The script's parser: its docstring's first line as description, the shared options as parent."""
    return argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None,
                                   parents=[parent_parser()], **kw)


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:   # not installed as a distribution (a source checkout): no version to record
        return None


def machine() -> dict:
    """The machine, the software and the load now (``os.getloadavg()``: 1, 5 and 15 min averages)."""
    return {"platform": platform.platform(), "machine": platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "pyspark": _version("pyspark"),
            "pyspark_cq": _version("pyspark-cq"), "git_commit": _git_commit(),
            "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "loadavg": list(os.getloadavg())}


def start(args=None) -> dict:
    """The record before the run; pass it to :func:`write_result` (which adds the load after)."""
    before = machine()
    print(f"# machine: {before['machine']}, {before['cores']} cores, Python {before['python']}, "
          f"{before['date_utc']}, load {before['loadavg'][0]:.2f}", flush=True)
    return before


def default_path(name: str) -> Path:
    return RESULTS / f"{name}-{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}.json"


def write_result(name: str, result, args=None, before: dict | None = None) -> Path | None:
    """Write ``result`` with the machine and load record to ``args.json`` (or the default path).

    Parameters
    ----------
    name : str
        The benchmark's name (the file name's stem).
    result : object
        Anything JSON can hold (``default=str`` for the rest). A dict keeps its keys at the top level (the
        record's ``benchmark``, ``machine`` and ``args`` are added where it has no such key); anything else
        goes under ``"result"``.
    args : argparse.Namespace, optional
        The parsed options (recorded; ``json`` and ``no_json`` choose the file).
    before : dict, optional
        :func:`start`'s record; the load after the run is added to it.

    Returns
    -------
    pathlib.Path or None
        The file written, or None with ``--no-json``.
    """
    if args is not None and getattr(args, "no_json", False):
        return None
    path = Path(getattr(args, "json", None) or default_path(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(before or machine())
    record["loadavg_after"] = list(os.getloadavg())
    doc = dict(result) if isinstance(result, dict) else {"result": result}
    for key, value in (("benchmark", name), ("machine", record), ("args", vars(args) if args is not None else None)):
        doc.setdefault(key, value)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"# result: {path}", flush=True)
    return path


def rerun(module: str) -> list[str]:
    """The command that runs ``module`` (``__spec__.name``) in a fresh interpreter, for scripts that run
    their cases in child processes; the child finds the benchmarks on ``PYTHONPATH``."""
    worker_env()
    return [sys.executable, "-m", module]


def import_root() -> Path:
    """A directory holding only a link to ``benchmarks/``: what goes on ``PYTHONPATH`` so that processes import
    the benchmarks. The repository root itself would put its source ``pyspark_cq/`` (no compiled modules in a
    clean clone) before the installed package."""
    import hashlib
    import tempfile

    tag = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    home = Path(tempfile.gettempdir()) / f"pyspark_cq_benchmarks_{tag}"
    home.mkdir(exist_ok=True)
    link = home / "benchmarks"
    try:
        link.symlink_to(ROOT / "benchmarks", target_is_directory=True)
    except FileExistsError:   # made by an earlier run (or a concurrent one) for the same checkout
        pass
    return home


def worker_env(*extra: str | os.PathLike) -> None:
    """Let Spark's Python workers import the benchmarks (the repository root, plus ``extra`` directories,
    first on ``PYTHONPATH``) with this interpreter. Call before the session's JVM starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [str(p) for p in (*extra, import_root())]
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + rest)


def plain_session(app: str, partitions: int = 2, conf: dict | None = None, master: str = "local[2]"):
    """A plain local SparkSession (no pyspark-cq), quiet, its workers able to import the benchmarks."""
    from pyspark.sql import SparkSession

    worker_env()
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.sql.shuffle.partitions", str(partitions)).config("spark.ui.enabled", "false"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cq_session(app: str, partitions: int = 2, conf: dict | None = None, master: str = "local[2]"):
    """``pyspark_cq.spark(...)``: a local session with pyspark-cq's settings, quiet, its workers able to
    import the benchmarks."""
    import pyspark_cq

    worker_env()
    spark = pyspark_cq.spark(master, app, shuffle_partitions=partitions, conf=conf or {})
    spark.sparkContext.setLogLevel("ERROR")
    return spark
