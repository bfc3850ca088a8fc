"""Plan ids: what the ``plan_id`` parameter names for each plan-switchable operator.

A plan-switchable operator keeps the same output whatever its plan; only its cost changes (OM, Kulkarni
& Ravishankar §4.4; rate-based optimization, Viglas & Naughton §4). Policies choose among plans and write
the choice as a ``plan_id`` string into the operator's control-table entry; the operator reads it at
every micro-batch. The id is readable and canonical, so the change log says which plan ran:

- ``select_chain``: the evaluation order of its predicates, names joined by ``>``: ``"cheap>regex>model"``.

Examples
--------
>>> chain_plan_id(["cheap", "model"])
'cheap>model'
>>> parse_chain_plan("model>cheap", ["cheap", "model"])
('model', 'cheap')
"""
from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["PREDICATE_NAME", "check_predicate_name", "chain_plan_id", "parse_chain_plan"]

#: A predicate's name: letters, digits and ``_``, not starting with a digit (it also names its metrics).
PREDICATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEP = ">"


def check_predicate_name(name, where: str = "predicates") -> str:
    """Check one predicate name (see :data:`PREDICATE_NAME`)."""
    if not isinstance(name, str) or not PREDICATE_NAME.match(name):
        raise ValueError(f"{where}: a predicate name must be letters, digits and _ (not starting with a digit), "
                         f"got {name!r}")
    return name


def chain_plan_id(order: Sequence[str]) -> str:
    """The plan id of a predicate order: the names joined by ``>``."""
    if isinstance(order, str) or not isinstance(order, Sequence) or not order:
        raise TypeError(f"order must be a non-empty sequence of predicate names, got {order!r}")
    names = [check_predicate_name(n, "order") for n in order]
    if len(set(names)) != len(names):
        raise ValueError(f"order names a predicate twice: {names}")
    return _SEP.join(names)


def parse_chain_plan(plan_id: str, names: Sequence[str], *, operator: str = "select_chain") -> tuple[str, ...]:
    """The predicate order a ``plan_id`` names; it must be a permutation of ``names``.

    Parameters
    ----------
    plan_id : str
        E.g. ``"cheap>model"``.
    names : sequence of str
        The operator's predicate names.
    operator : str
        Named in errors (e.g. ``"select_chain 'filter1'"``).

    Raises
    ------
    ValueError
        When the id is not a permutation of ``names``, saying which names are missing or unknown.
    """
    if not isinstance(plan_id, str) or not plan_id:
        raise ValueError(f"{operator}: plan_id must be a predicate order such as {_SEP.join(names)!r}, "
                         f"got {plan_id!r}")
    order = tuple(part.strip() for part in plan_id.split(_SEP))
    expected = set(names)
    if len(order) != len(expected) or set(order) != expected:
        missing = sorted(expected - set(order))
        unknown = sorted(set(order) - expected)
        twice = sorted({n for n in order if order.count(n) > 1})
        detail = "; ".join(part for part in (
            f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else "",
            f"repeated {twice}" if twice else "") if part)
        raise ValueError(f"{operator}: plan_id {plan_id!r} is not a permutation of its predicates "
                         f"{list(names)} ({detail}); write e.g. {_SEP.join(names)!r}")
    return order
