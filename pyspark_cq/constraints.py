"""Constraints over streams that let a join keep less state (STREAM, Motwani, Widom et al., §5.2).

STREAM §5.2 ("Exploiting Constraints Over Data Streams") names many-one join / referential-integrity constraints
between two streams and unique-value, clustered-arrival and ordered-arrival constraints on one stream, each with
an *adherence parameter* (a tolerance ``k``, or a delay bound): "the closer the streams adhere to the specified
constraints at run-time, the smaller the required synopses". This module is the vocabulary (one place): the
declarations, their checks, and the eviction rule a two-input join derives from them (:func:`join_eviction`).
docs/constraints.md states which state each constraint lets the join drop, and what a violation costs.

    >>> from pyspark_cq.constraints import many_to_one, unique
    >>> unique("right", "order_id")
    unique('right', ('order_id',))
    >>> many_to_one(child="right", parent="left", delay="10 seconds").delay
    10000000

Pure: no Spark, so a Spark worker loads it cheaply.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._duration import parse_duration

__all__ = ["SIDES", "KINDS", "Constraint", "unique", "many_to_one", "clustered", "ordered", "check_constraints",
           "JoinEviction", "join_eviction", "delay_ends", "drop_matched_ends", "control_enabled"]

#: The two inputs of a join, as a constraint names them.
SIDES = ("left", "right")
#: The constraint kinds (STREAM §5.2).
KINDS = ("unique", "many_to_one", "clustered", "ordered")
#: Expiry key that the next eviction removes whatever the watermark (the kernel's smallest int64).
DROP_NOW = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Constraint:
    """One declared constraint; build it with :func:`unique`, :func:`many_to_one`, :func:`clustered` or
    :func:`ordered` (they check the arguments).

    ``side`` is the constrained input (for ``many_to_one``: the child), ``other`` the parent of ``many_to_one``,
    ``cols`` the unique columns, ``k`` the adherence tolerance (rows), ``delay`` the delay bound (µs).
    """

    kind: str
    side: str
    cols: tuple[str, ...] = ()
    other: str | None = None
    k: int = 0
    delay: int = 0

    @property
    def name(self) -> str:
        """The constraint's name in a control-table entry's ``params`` (``constraint_<name>``), e.g.
        ``unique_right`` or ``many_to_one_right``.
        """
        return f"{self.kind}_{self.side}"

    def __repr__(self) -> str:
        if self.kind == "unique":
            return f"unique({self.side!r}, {self.cols!r})"
        if self.kind == "many_to_one":
            return f"many_to_one(child={self.side!r}, parent={self.other!r}, delay={self.delay})"
        return f"{self.kind}({self.side!r}, k={self.k})"


def _side(value, name: str) -> str:
    if not isinstance(value, str) or value not in SIDES:
        raise ValueError(f"{name} must be 'left' or 'right' (the join input it constrains), got {value!r}")
    return value


def _cols(value, name: str) -> tuple[str, ...]:
    cols = (value,) if isinstance(value, str) else value
    if (not isinstance(cols, Sequence) or isinstance(cols, (bytes, bytearray)) or not cols
            or not all(isinstance(c, str) and c for c in cols)):
        raise TypeError(f"{name} must be a column name or a non-empty list of column names, got {value!r}")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{name} names a column twice: {list(cols)!r}")
    return tuple(cols)


def _k(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (rows of other keys tolerated in between), got {value!r}")
    return int(value)


def unique(side: str, cols) -> Constraint:
    """Unique-value constraint (STREAM §5.2): no two rows of input ``side`` share the values of ``cols``.

    In a join whose key includes ``cols``, a row of the *other* input has at most one partner on ``side``:
    once matched it is dropped.

    Parameters
    ----------
    side : {"left", "right"}
        The input whose rows are unique.
    cols : str or list of str
        The unique column(s) of that input; they must be among its join-key columns.
    """
    return Constraint("unique", _side(side, "side"), _cols(cols, "cols"))


def many_to_one(child: str, parent: str, delay="0 seconds") -> Constraint:
    """Many-one join / referential-integrity constraint (STREAM §5.2): each row of input ``child`` joins exactly
    one row of input ``parent`` (the parent's join key is unique), and that parent row arrives before the
    watermark passes the child row's time plus ``delay`` (the paper's delay bound; 0: the parent never comes
    later than the watermark allows for the child).

    A child row is dropped once matched, and an unmatched one once the watermark passes its time + ``delay``.

    Parameters
    ----------
    child : {"left", "right"}
        The referencing input (e.g. fulfilments).
    parent : {"left", "right"}
        The referenced input (e.g. orders); not ``child``.
    delay : str, int or timedelta
        The delay bound (a duration, as ``lower`` / ``upper`` of :func:`pyspark_cq.interval_join`), >= 0.
    """
    child = _side(child, "child")
    parent = _side(parent, "parent")
    if child == parent:
        raise ValueError(f"child and parent must be different inputs, got both {child!r}")
    return Constraint("many_to_one", child, other=parent,
                      delay=parse_duration(delay, "delay", allow_negative=False))


def clustered(side: str, k: int = 0) -> Constraint:
    """Clustered-arrival constraint (STREAM §5.2): the rows of input ``side`` arrive clustered by join key, with
    at most ``k`` rows of other keys between two rows of the same key.

    Parameters
    ----------
    side : {"left", "right"}
        The clustered input.
    k : int
        The adherence parameter (>= 0).
    """
    return Constraint("clustered", _side(side, "side"), k=_k(k, "k"))


def ordered(side: str, k: int = 0) -> Constraint:
    """Ordered-arrival constraint (STREAM §5.2): the rows of input ``side`` arrive in join-key order, with at most
    ``k`` rows out of order.

    Parameters
    ----------
    side : {"left", "right"}
        The ordered input.
    k : int
        The adherence parameter (>= 0).
    """
    return Constraint("ordered", _side(side, "side"), k=_k(k, "k"))


def check_constraints(constraints, keys: Mapping[str, Sequence[str]], function: str) -> tuple[Constraint, ...]:
    """``constraints`` (None or a list of :class:`Constraint`) checked against a join with join-key columns
    ``keys`` (``{"left": [...], "right": [...]}``); ``function`` names the operator in errors.

    Refuses what the operator cannot exploit yet (``clustered``, ``ordered``: declared in the vocabulary, used by
    no operator so far) rather than ignoring it.
    """
    if constraints is None:
        return ()
    if isinstance(constraints, Constraint) or not isinstance(constraints, (list, tuple)):
        raise TypeError(f"constraints must be a list of constraints (pyspark_cq.constraints.unique(...), "
                        f"many_to_one(...), ...), got {constraints!r}")
    out = []
    for i, c in enumerate(constraints):
        if not isinstance(c, Constraint):
            raise TypeError(f"constraints[{i}] must be a constraint built by pyspark_cq.constraints (unique, "
                            f"many_to_one, clustered, ordered), got {c!r}")
        if c.kind in ("clustered", "ordered"):
            raise ValueError(f"constraints[{i}]: {function} does not exploit {c.kind}() constraints yet (only "
                             f"unique and many_to_one); remove it")
        if c.kind == "unique":
            missing = [col for col in c.cols if col not in keys[c.side]]
            if missing:
                raise ValueError(f"constraints[{i}]: unique({c.side!r}, ...) columns {missing!r} are not join-key "
                                 f"columns of the {c.side} input {list(keys[c.side])!r}; only a unique join key "
                                 f"lets {function} drop state")
        if any(c.name == o.name for o in out):
            raise ValueError(f"constraints[{i}]: a second {c.kind}() constraint on the {c.side} input")
        out.append(c)
    return tuple(out)


@dataclass(frozen=True)
class JoinEviction:
    """What a two-input equi-join with a time band may drop under its enabled constraints (per input, 0 left,
    1 right; docs/constraints.md).

    ``drop_matched[s]``: a row of input ``s`` goes as soon as it has matched (its one partner was seen: the other
    input is unique on the key, or ``s`` is a many-to-one child). ``delay[s]``: µs after its time at which a row
    of ``s`` goes even unmatched (many-to-one child), or None. ``unique[s]``: input ``s`` is declared unique on the
    key, so a row whose key is already stored on ``s`` is a violation.
    """

    drop_matched: tuple[bool, bool] = (False, False)
    delay: tuple[int | None, int | None] = (None, None)
    unique: tuple[bool, bool] = (False, False)

    @property
    def active(self) -> bool:
        """Whether the constraints change anything."""
        return any(self.drop_matched) or any(d is not None for d in self.delay)


def join_eviction(constraints: Sequence[Constraint], enabled: Mapping[str, bool] | None = None) -> JoinEviction:
    """The :class:`JoinEviction` of checked ``constraints``, without those ``enabled`` turns off (by
    :attr:`Constraint.name`; absent names are on).

    STREAM §5.2: a unique key on one input bounds the other input's partners to one (so its matched rows are
    useless); a many-one constraint does the same for the child, and its delay bound ends the wait of an
    unmatched child ("we need not maintain a join synopsis for the [child] operand at all" when the parent always
    comes first: delay 0).
    """
    drop, delay, uniq = [False, False], [None, None], [False, False]
    for c in constraints:
        if enabled is not None and not enabled.get(c.name, True):
            continue
        s = SIDES.index(c.side)
        if c.kind == "unique":
            uniq[s] = True
            drop[1 - s] = True
        elif c.kind == "many_to_one":
            uniq[1 - s] = True   # each child joins exactly one parent row: the parent's key is unique
            drop[s] = True
            delay[s] = c.delay if delay[s] is None else min(delay[s], c.delay)
    return JoinEviction(tuple(drop), tuple(delay), tuple(uniq))


def delay_ends(ends_ms: np.ndarray, micros: np.ndarray, delay_us: int | None) -> np.ndarray:
    """Expiry keys (the watermark in ms that evicts each row) shortened by a many-to-one delay bound: a child row
    goes once the watermark reaches its time + ``delay_us`` (ms, rounded up), or earlier if its band says so.
    """
    if delay_us is None:
        return ends_ms
    t = np.asarray(micros, dtype=np.int64) + int(delay_us)
    return np.minimum(np.asarray(ends_ms, dtype=np.int64), -(-t // 1000))


def drop_matched_ends(ends_ms: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """Expiry keys with every matched row's set to :data:`DROP_NOW` (the next eviction removes it)."""
    return np.where(np.asarray(matched, dtype=bool), DROP_NOW, np.asarray(ends_ms, dtype=np.int64))


def control_enabled(params: Mapping | None, constraints: Sequence[Constraint]) -> dict[str, bool] | None:
    """Which constraints a control-table entry's free-form ``params`` turns on or off: the key
    ``constraint_<name>`` (a bool; e.g. ``constraint_unique_right``), absent keys leave the constraint on.
    None when the entry sets none.
    """
    if not params:
        return None
    out = {}
    for c in constraints:
        value = params.get(f"constraint_{c.name}")
        if value is None:
            continue
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"params['constraint_{c.name}'] must be true or false, got {value!r}")
        out[c.name] = bool(value)
    return out or None
