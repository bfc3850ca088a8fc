"""Python start-up hook of the Python workers of a local session started by ``pyspark_cq.spark()``.

``spark()`` puts this directory on its workers' ``PYTHONPATH`` (``spark.executorEnv.PYTHONPATH``), so
Python imports this module while it starts any worker process. Spark selects the daemon module of its
Python UDF and data-source read workers from ``spark.python.daemon.module`` (``pyspark_cq._daemon``), but
starts the workers that plan a Python data source (``pyspark.sql.worker.create_data_source``,
``plan_data_source_read``, …; ``PythonPlannerRunner``) with the hard-coded ``python -m pyspark.daemon``
from ``pyspark.zip``. Those workers idle in Spark's pool once the query has started and are let go
after a minute, and over the session's Unix domain socket PySpark's daemon then prints a
``BrokenPipeError`` traceback for each (issue 41, item 4). In such a process this hook runs
:func:`pyspark_cq._daemon.main` instead, exactly as ``python -m pyspark_cq._daemon <worker module>``
would, and exits. A worker Spark starts without a daemon (``python -m pyspark.<module>``, e.g. the runner of
a Python streaming source, whose connection the JVM closes when the query stops) runs as ``-m`` would run it,
but ends without a traceback when a ``BrokenPipeError`` ends it. Every other process continues its start-up
with the next ``sitecustomize`` on ``sys.path`` (e.g. a distribution's), as if this one were not there.
"""
import os
import sys


def _module_argv():
    """``(module, arguments)`` when this process was started as ``python -m module ...``, else None."""
    argv = list(getattr(sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg == "-m":
            return argv[i + 1], argv[i + 2:]
        if not arg.startswith("-"):      # a script or -c: not run as a module
            return None
    return None


def _run_quietly(module: str, args) -> None:
    """Run PySpark's worker ``module`` as ``-m`` would, then exit; a ``BrokenPipeError`` that ends it (the JVM
    closed the connection first, e.g. the source runner of a stopped streaming query) ends it without a
    traceback, with a failed worker's code, as :func:`pyspark_cq._daemon.quiet_when_closed` does.
    """
    import runpy
    import traceback

    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BrokenPipeError:
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this directory hides, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


_MODULE = _module_argv() if __name__ == "sitecustomize" else None   # not when imported by its package path
_MAIN = None
if _MODULE is not None and _MODULE[0] == "pyspark.daemon":
    try:
        from pyspark_cq._daemon import main as _MAIN
    except ImportError:              # not this interpreter's package: PySpark's own daemon starts as asked
        _MAIN = None
if _MAIN is not None:
    # as runpy would set it for `-m pyspark.daemon <worker module>`: pyspark.daemon reads sys.argv[1]
    sys.argv = ["pyspark.daemon", *_MODULE[1]]
    code = 1
    try:
        _MAIN()
        code = 0
    except SystemExit as exc:        # the daemon's shutdown(code)
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
elif _MODULE is not None and _MODULE[0].startswith("pyspark.") and _MODULE[0] != "pyspark.daemon":
    _next_sitecustomize()
    _run_quietly(*_MODULE)           # a worker Spark starts without a daemon
elif __name__ == "sitecustomize":
    _next_sitecustomize()
