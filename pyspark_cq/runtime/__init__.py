"""The adaptive runtime: statistics, the control table, the policy loop (see docs/runtime.md).

==================  =======================================================================
name                what
==================  =======================================================================
`CQRuntime`         registers and starts queries, watches them, runs the policies
`ControlTable`      versioned per-operator parameters (STREAM §6.1), from :mod:`pyspark_cq.control`
`StatisticsStore`   per-query / per-operator statistics fed by query progress
`PolicyLoop`        one round: snapshot -> policies -> decisions -> control table
==================  =======================================================================

The control table itself (and the reader operators use on Spark's workers) is :mod:`pyspark_cq.control`;
the runtime is the one place that ties operators, statistics, policies and the control table together.
The Spark-facing :class:`CQRuntime` is imported only when first used.
"""
from .._lazy import lazy_exports
from ..control import ControlHandle, ControlTable, Entry

__all__ = ["CQRuntime", "QueryRejected", "ControlTable", "ControlHandle", "Entry", "StatisticsStore",
           "PolicyLoop"]

_LAZY = {"CQRuntime": ".core", "QueryRejected": ".core", "StatisticsStore": ".stats", "PolicyLoop": ".loop"}


__getattr__ = lazy_exports(__name__, _LAZY)
