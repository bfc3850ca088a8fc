"""The adaptive runtime: statistics, the control table, the policy loop (see docs/runtime.md).

==================  =======================================================================
name                what
==================  =======================================================================
`CQRuntime`         registers and starts queries, watches them, runs the policies
`ControlTable`      versioned per-operator parameters (STREAM §6.1), driver side
`control`           the worker-side reader operators use (``control.entry``, ``ControlHandle``)
`StatisticsStore`   per-query / per-operator statistics fed by query progress
`PolicyLoop`        one round: snapshot -> policies -> decisions -> control table
==================  =======================================================================

Importing :mod:`pyspark_cq.runtime.control` stays cheap on Spark's workers: the Spark-facing
:class:`CQRuntime` is imported only when first used.
"""
from . import control
from .control import ControlHandle, ControlTable, Entry

__all__ = ["CQRuntime", "QueryRejected", "ControlTable", "ControlHandle", "Entry", "StatisticsStore",
           "PolicyLoop", "control"]

_LAZY = {"CQRuntime": ".core", "QueryRejected": ".core", "StatisticsStore": ".stats", "PolicyLoop": ".loop"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
