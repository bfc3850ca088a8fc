"""Plan ids: what the ``plan_id`` parameter names for each plan-switchable operator.

A plan-switchable operator keeps the same output whatever its plan; only its cost changes (OM, Kulkarni
& Ravishankar §4.4; rate-based optimization, Viglas & Naughton §4). Policies choose among plans and write
the choice as a ``plan_id`` string into the operator's control-table entry; the operator reads it at
every micro-batch. The id is readable and canonical, so the change log says which plan ran:

- ``select_chain``: the evaluation order of its predicates, names joined by ``>``: ``"cheap>regex>model"``.
- ``multi_join``: for every input (by index) the order in which its arriving rows probe the other inputs,
  ``<input>:<first>><second>...`` per input, in input order, joined by ``;``: ``"0:1>2;1:0>2;2:1>0"``.

Examples
--------
>>> chain_plan_id(["cheap", "model"])
'cheap>model'
>>> parse_chain_plan("model>cheap", ["cheap", "model"])
('model', 'cheap')
>>> join_plan_id([[1, 2], [2, 0], [1, 0]])
'0:1>2;1:2>0;2:1>0'
>>> parse_join_plan("0:1>2; 1:2>0; 2:1>0", 3)
((1, 2), (2, 0), (1, 0))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..vocabulary.metrics import PREDICATE_NAME, SAMPLE

__all__ = ["PREDICATE_NAME", "check_predicate_name", "chain_plan_id", "parse_chain_plan", "join_plan_id",
           "parse_join_plan", "SAMPLE", "sample_ratios"]

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


_INPUTS = ";"


def _check_probe_order(i: int, order, n: int, where: str) -> tuple[int, ...]:
    others = [j for j in range(n) if j != i]
    if sorted(order) != others:
        raise ValueError(f"{where}: the probe order of input {i} must be a permutation of the other inputs "
                         f"{others}, got {list(order)}")
    return tuple(order)


def join_plan_id(orders: Sequence[Sequence[int]]) -> str:
    """The plan id of a multi-way join's probe orders: ``orders[i]`` lists the other inputs in the order
    in which rows arriving on input ``i`` probe them.
    """
    if isinstance(orders, str) or not isinstance(orders, Sequence) or not 2 <= len(orders) <= 6:
        raise TypeError(f"orders must be a list with one probe order per input (2 to 6 inputs), got {orders!r}")
    n = len(orders)
    parts = []
    for i, order in enumerate(orders):
        if isinstance(order, str) or not isinstance(order, Sequence) or not all(
                isinstance(j, int) and not isinstance(j, bool) for j in order):
            raise TypeError(f"orders[{i}] must be a list of input indexes, got {order!r}")
        parts.append(f"{i}:" + _SEP.join(map(str, _check_probe_order(i, order, n, "orders"))))
    return _INPUTS.join(parts)


def parse_join_plan(plan_id: str, n_inputs: int, *, operator: str = "multi_join") -> tuple[tuple[int, ...], ...]:
    """The probe orders a multi-way join's ``plan_id`` names (see :func:`join_plan_id`).

    Parameters
    ----------
    plan_id : str
        E.g. ``"0:1>2;1:0>2;2:1>0"``; whitespace around the parts is ignored.
    n_inputs : int
        The join's number of inputs.
    operator : str
        Named in errors.

    Raises
    ------
    ValueError
        When the id does not give every input exactly one permutation of the other inputs.
    """
    example = join_plan_id([[j for j in range(n_inputs) if j != i] for i in range(n_inputs)])
    if not isinstance(plan_id, str) or not plan_id.strip():
        raise ValueError(f"{operator}: plan_id must give each input's probe order, e.g. {example!r}, got {plan_id!r}")
    orders: dict[int, tuple[int, ...]] = {}
    for part in plan_id.split(_INPUTS):
        head, colon, tail = part.partition(":")
        try:
            i = int(head.strip())
            order = tuple(int(x.strip()) for x in tail.split(_SEP))
        except ValueError:
            raise ValueError(f"{operator}: plan_id part {part.strip()!r} is not '<input>:<input>>...'; "
                             f"write e.g. {example!r}") from None
        if not colon or not 0 <= i < n_inputs or i in orders:
            raise ValueError(f"{operator}: plan_id {plan_id!r} must give each input 0..{n_inputs - 1} "
                             f"exactly one probe order; write e.g. {example!r}")
        orders[i] = _check_probe_order(i, order, n_inputs, f"{operator}: plan_id {plan_id!r}")
    if len(orders) != n_inputs:
        missing = sorted(set(range(n_inputs)) - set(orders))
        raise ValueError(f"{operator}: plan_id {plan_id!r} gives no probe order for input(s) {missing}; "
                         f"write e.g. {example!r}")
    return tuple(orders[i] for i in range(n_inputs))


def sample_ratios(params: Mapping | None, order: Sequence[str], *, where: str) -> list[float] | None:
    """The sample ratio of every step of the sampler plan (RTStream §4.2), in evaluation ``order``; None
    without ``params['sample_ratio']`` (or when all are 0).

    ``params['sample_ratio']`` is a fraction in [0, 1] for every predicate, or a mapping predicate ->
    fraction (missing ones 0: dynamic sampling, §5.1). A step must see the rows its predecessors passed in
    its own sample, so a step is evaluated on the largest ratio of itself and the steps after it (the
    samples are nested: a hash of the row below the ratio).

    >>> sample_ratios({"sample_ratio": {"cheap": 0.02, "model": 0.2}}, ["cheap", "model"], where="")
    [0.2, 0.2]
    >>> sample_ratios({"sample_ratio": {"model": 0.02, "cheap": 0.2}}, ["model", "cheap"], where="")
    [0.2, 0.2]
    >>> sample_ratios({"sample_ratio": {"model": 0.2, "cheap": 0.02}}, ["model", "cheap"], where="")
    [0.2, 0.02]
    """
    value = (params or {}).get("sample_ratio")
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(order))
        if unknown:
            raise ValueError(f"{where}: params['sample_ratio'] names unknown predicates {unknown}; "
                             f"known: {list(order)}")
        ratios = [value.get(step, 0.0) for step in order]
    else:
        ratios = [value] * len(order)
    for step, r in zip(order, ratios):
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise ValueError(f"{where}: params['sample_ratio'] must be a fraction in [0, 1] or a mapping predicate "
                             f"-> fraction, got {r!r} for {step!r}")
    out, running = [], 0.0
    for r in reversed(ratios):
        running = max(running, float(r))
        out.append(running)
    out.reverse()
    return out if out[0] > 0 else None
