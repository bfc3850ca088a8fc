"""The control vocabulary and the control table (STREAM's control tables, Motwani et al., §6.1).

The neutral module that operators, policies and the runtime all import; it imports none of them (and no
Spark), so a Spark Python worker that reads its operator's entry loads only this package.

=======================  ===================================================================
name                     what
=======================  ===================================================================
`schema`                 the parameters of an entry, their validation, operator ids, which
                         parameters each operator reads
`schedule`               PIPES §4.2 transition semantics: ``Schedule``, ``Transition``
`reader`                 worker side: ``ControlHandle``, ``Entry``, ``entry``, ``read_table``
`table`                  driver side: ``ControlTable`` (register, set, apply, change log)
`decision`               ``Decision`` / ``Decisions``: validated changes a policy returns
`plans`                  what ``plan_id`` names for each plan-switchable operator
=======================  ===================================================================
"""
from .decision import Decision, Decisions
from .plans import chain_plan_id, join_plan_id, parse_chain_plan, parse_join_plan
from .reader import FORMAT, ControlHandle, Entry, clear_cache, entry, operator_handle, read_table
from .schedule import Schedule, Transition, granularity_effective_at
from .schema import (
                     OPERATOR_PARAMETERS,
                     PARAMETERS,
                     TRANSITION_PARAMETERS,
                     check_reads,
                     duration_value,
                     unread_parameters,
                     validate_changes,
                     validate_operator_id,
)
from .table import Change, ControlTable

__all__ = ["ControlTable", "Change", "ControlHandle", "operator_handle", "Entry", "entry", "read_table",
           "clear_cache", "FORMAT", "Schedule", "Transition", "granularity_effective_at", "Decision", "Decisions",
           "PARAMETERS", "TRANSITION_PARAMETERS", "OPERATOR_PARAMETERS", "validate_changes", "validate_operator_id",
           "duration_value", "unread_parameters", "check_reads", "chain_plan_id", "parse_chain_plan",
           "join_plan_id", "parse_join_plan"]
