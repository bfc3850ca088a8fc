"""Policies: a statistics snapshot in, control-table decisions out; plugins under ``pyspark_cq.policies``.

============================  ===================================================================
name                          what
============================  ===================================================================
`Policy`                      base class: ``name``, ``decide(snapshot)``, ``admit``, ``bounds``
`Decision`, `Decisions`       parameter changes of control-table entries (what the table accepts)
`Admission`                   accept (with decisions) or reject (with a reason), PIPES §4.1.1
`QoSRange`                    a QoS range ``[min, max]`` of a window or granularity, PIPES §4.3
`Snapshot`, `QueryInfo`, …    the statistics a policy sees
`shedding_operator`,          a query's shedding stage, a decision setting its drop ratio, and the
`drop_decision`, `drop_for`,  ratio written for a kept fraction, and the ratio the control table holds
`written_drop_ratio`
`available`, `load`,          the plugin registry (entry-point group ``pyspark_cq.policies``)
`create`, `problems`
`checks.check_policy`         the check suite every registered policy passes
============================  ===================================================================

This package imports neither Spark nor the runtime. Importing it loads no plugin.
"""
from .base import Policy
from .decisions import PARAMETERS, TRANSITION_PARAMETERS, Admission, Decision, Decisions, QoSRange, parse_size
from .registry import GROUP, PolicyLoadError, PolicyPluginWarning, available, create, load, problems, refresh
from .snapshot import (
    DROP_TOLERANCE,
    INSTANCES_KEPT,
    Instance,
    OperatorStats,
    QueryInfo,
    Snapshot,
    SourceStats,
    drop_decision,
    drop_for,
    label,
    parse_label,
    periodic_spec,
    shedding_operator,
    written_drop_ratio,
)

__all__ = [
    "Policy", "Decision", "Decisions", "Admission", "QoSRange", "PARAMETERS", "TRANSITION_PARAMETERS",
    "Snapshot", "QueryInfo", "SourceStats", "OperatorStats", "Instance", "periodic_spec", "label",
    "parse_label", "parse_size", "shedding_operator", "drop_decision", "drop_for", "DROP_TOLERANCE",
    "written_drop_ratio", "INSTANCES_KEPT",
    "GROUP", "PolicyLoadError", "PolicyPluginWarning", "available", "create", "load", "problems", "refresh",
]
