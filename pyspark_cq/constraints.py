"""Constraints over streams that let a join keep less state (STREAM, Motwani, Widom et al., §5.2).

STREAM §5.2 ("Exploiting Constraints Over Data Streams") names many-one join / referential-integrity constraints
between two streams and unique-value, clustered-arrival and ordered-arrival constraints on one stream, each with
an *adherence parameter* (a tolerance ``k``, or a delay bound): "the closer the streams adhere to the specified
constraints at run-time, the smaller the required synopses". This module is the vocabulary (one place): the
declarations, their checks, the eviction rule a two-input join derives from them (:func:`join_eviction`) and the
arrival bookkeeping of ``clustered`` / ``ordered`` (:class:`Clusters`, :class:`KeyOrder`, :class:`Arrivals`).
docs/constraints.md states which state each constraint lets the join drop, and what a violation costs.

    >>> from pyspark_cq.constraints import many_to_one, unique
    >>> unique("right", "order_id")
    unique('right', ('order_id',))
    >>> many_to_one(child="right", parent="left", delay="10 seconds").delay
    10000000

Pure: no Spark, so a Spark worker loads it cheaply.
"""
from __future__ import annotations

import base64
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._duration import parse_duration

__all__ = ["SIDES", "KINDS", "Constraint", "unique", "many_to_one", "clustered", "ordered", "check_constraints",
           "JoinEviction", "join_eviction", "delay_due_ms", "delay_ends", "drop_matched_ends", "control_enabled",
           "MultiEviction", "multi_eviction", "multi_drop", "ARRIVAL_KINDS",
           "arrival_order", "key_bytes", "Clusters", "KeyOrder", "Arrivals"]

#: The two inputs of a join, as a constraint names them.
SIDES = ("left", "right")
#: The constraint kinds (STREAM §5.2).
KINDS = ("unique", "many_to_one", "clustered", "ordered")
#: The kinds that constrain one input's arrival order (they need per-shard positions kept with the state).
ARRIVAL_KINDS = ("clustered", "ordered")
_IPC = pa.ipc.IpcWriteOptions(compression="zstd")
#: Expiry key that the next eviction removes whatever the watermark (the kernel's smallest int64).
DROP_NOW = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Constraint:
    """One declared constraint; build it with :func:`unique`, :func:`many_to_one`, :func:`clustered` or
    :func:`ordered` (they check the arguments).

    ``side`` is the constrained input (for ``many_to_one``: the child; ``"left"`` / ``"right"`` of a two-input
    join, an input index of :func:`pyspark_cq.multi_join`), ``other`` the parent of ``many_to_one``,
    ``cols`` the unique columns, ``k`` the adherence tolerance (rows), ``delay`` the delay bound (µs).
    """

    kind: str
    side: str | int
    cols: tuple[str, ...] = ()
    other: str | int | None = None
    k: int = 0
    delay: int = 0

    @property
    def name(self) -> str:
        """The constraint's name in a control-table entry's ``params`` (``constraint_<name>``), e.g.
        ``unique_right`` or ``many_to_one_right`` (``unique_2`` for input 2 of a ``multi_join``).
        """
        return f"{self.kind}_{self.side}"

    def __repr__(self) -> str:
        if self.kind == "unique":
            return f"unique({self.side!r}, {self.cols!r})"
        if self.kind == "many_to_one":
            return f"many_to_one(child={self.side!r}, parent={self.other!r}, delay={self.delay})"
        return f"{self.kind}({self.side!r}, k={self.k})"


def _side(value, name: str) -> str | int:
    if isinstance(value, str) and value in SIDES:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= 0:
        return int(value)
    raise ValueError(f"{name} must be 'left' or 'right' (the join input it constrains) or, for multi_join, an input "
                     f"index >= 0, got {value!r}")


def _input_name(side: str | int) -> str:
    return f"input {side}" if isinstance(side, int) else f"the {side} input"


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
    side : {"left", "right"} or int
        The input whose rows are unique (an input index for :func:`pyspark_cq.multi_join`).
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
    child : {"left", "right"} or int
        The referencing input (e.g. fulfilments).
    parent : {"left", "right"} or int
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
    at most ``k`` rows of other keys between two rows of the same key (the paper's tolerance: "no more than k
    tuples with a different orderID appear between two tuples with same orderID").

    Once ``k + 1`` rows of other keys have arrived after the last row of a key, no row of that key comes again:
    the *other* input's rows of that key are dropped (they could only match a future row of it). Arrival order:
    micro-batch by micro-batch, within a batch by event time, then key (docs/constraints.md).

    Parameters
    ----------
    side : {"left", "right"} or int
        The clustered input.
    k : int
        The adherence parameter (>= 0).
    """
    return Constraint("clustered", _side(side, "side"), k=_k(k, "k"))


def ordered(side: str, k: int = 0) -> Constraint:
    """Ordered-arrival constraint (STREAM §5.2): the rows of input ``side`` arrive in join-key order, with at most
    ``k`` rows out of order: a row that arrives more than ``k`` rows after another has a key >= that row's.

    So every future row has a key >= the largest key of the rows up to ``k`` rows back: the *other* input's rows
    below it are dropped. Arrival order as :func:`clustered`; keys compare column by column (not floating point).

    Parameters
    ----------
    side : {"left", "right"} or int
        The ordered input.
    k : int
        The adherence parameter (>= 0).
    """
    return Constraint("ordered", _side(side, "side"), k=_k(k, "k"))


def check_constraints(constraints, keys: Mapping[str, Sequence[str]], function: str,
                      arrival: bool = False) -> tuple[Constraint, ...]:
    """``constraints`` (None or a list of :class:`Constraint`) checked against a join with join-key columns
    ``keys`` (``{"left": [...], "right": [...]}``, or by input index for ``multi_join``: ``{0: [...], ...}``);
    ``function`` names the operator in errors.

    Refuses what the operator cannot exploit (``clustered``, ``ordered`` unless ``arrival``) rather than ignoring
    it.
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
        for role, input_ in (("side" if c.kind != "many_to_one" else "child", c.side), ("parent", c.other)):
            if input_ is not None and input_ not in keys:
                raise ValueError(f"constraints[{i}]: {c!r} names {role} {input_!r}, which is not an input of "
                                 f"{function} (its inputs: {', '.join(repr(k) for k in keys)})")
        if c.kind in ARRIVAL_KINDS and not arrival:
            raise ValueError(f"constraints[{i}]: {function} does not exploit {c.kind}() constraints yet (only "
                             f"unique and many_to_one); remove it")
        if c.kind == "unique":
            missing = [col for col in c.cols if col not in keys[c.side]]
            if missing:
                raise ValueError(f"constraints[{i}]: unique({c.side!r}, ...) columns {missing!r} are not join-key "
                                 f"columns of {_input_name(c.side)} {list(keys[c.side])!r}; only a unique join key "
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
    key, so a row whose key is already stored on ``s`` is a violation. ``arrival[s]``: the enabled arrival
    constraints on input ``s`` (``"clustered"``, ``"ordered"``): the *other* input's rows of keys that ``s`` will
    not bring again go.
    """

    drop_matched: tuple[bool, bool] = (False, False)
    delay: tuple[int | None, int | None] = (None, None)
    unique: tuple[bool, bool] = (False, False)
    arrival: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    @property
    def active(self) -> bool:
        """Whether the constraints change anything."""
        return any(self.drop_matched) or any(d is not None for d in self.delay) or any(self.arrival)


def join_eviction(constraints: Sequence[Constraint], enabled: Mapping[str, bool] | None = None) -> JoinEviction:
    """The :class:`JoinEviction` of checked ``constraints``, without those ``enabled`` turns off (by
    :attr:`Constraint.name`; absent names are on).

    STREAM §5.2: a unique key on one input bounds the other input's partners to one (so its matched rows are
    useless); a many-one constraint does the same for the child, and its delay bound ends the wait of an
    unmatched child ("we need not maintain a join synopsis for the [child] operand at all" when the parent always
    comes first: delay 0); clustered or ordered arrival on one input ends the wait of the other input's rows of a
    key it will not bring again ("we need only save O tuples for a given orderID until the next orderID is seen").
    """
    drop, delay, uniq, arrival = [False, False], [None, None], [False, False], [(), ()]
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
        else:   # clustered / ordered arrival on s: the other input's rows of keys s brings no more go
            arrival[s] += (c.kind,)
    return JoinEviction(tuple(drop), tuple(delay), tuple(uniq), tuple(arrival))


@dataclass(frozen=True)
class MultiEviction:
    """What an ``n``-input equi-join (:func:`pyspark_cq.multi_join`, inner) may drop under its enabled
    constraints, per input (docs/constraints.md, *Joins of three or more streams*).

    ``unique[i]``: input i's key is unique (declared ``unique``, or a many-to-one parent): the set U.
    ``drop_held[y]``: every other input is in U, so a row of y goes once every other input holds a row of its key
    (rule 1). ``delay[y]``: per many-to-one constraint with child y, ``(parent, delay µs)``: a row of y goes once
    the watermark passes its time + delay and the parent holds no row of its key (rule 2). ``arrival[j]``: the
    enabled arrival constraints on input j (``"clustered"``, ``"ordered"``): keys j will not bring again (rule 3).
    """

    unique: tuple[bool, ...]
    drop_held: tuple[bool, ...]
    delay: tuple[tuple[tuple[int, int], ...], ...]
    arrival: tuple[tuple[str, ...], ...] = ()

    def closes(self, y: int) -> bool:
        """Whether rule 1 or 3 can drop rows of input ``y``: all other inputs unique, or one with an enabled
        arrival constraint.
        """
        return self.drop_held[y] or any(a for j, a in enumerate(self.arrival) if j != y)

    @property
    def active(self) -> bool:
        """Whether the constraints let the join drop anything."""
        return any(self.drop_held) or any(self.delay) or any(self.arrival)


def multi_eviction(constraints: Sequence[Constraint], n: int,
                   enabled: Mapping[str, bool] | None = None) -> MultiEviction:
    """The :class:`MultiEviction` of checked ``constraints`` on an ``n``-input join, without those ``enabled``
    turns off (by :attr:`Constraint.name`; absent names are on).

    STREAM §5.2's unique-value and many-one constraints generalised from two inputs: a row can only join rows of
    every other input with its key; when each of them is unique on the key and has brought its one row of that
    key, no future row of another input can complete a new result with it (with n = 2 this is
    :func:`join_eviction`'s "a matched row goes"). A many-one child whose parent, bound to arrive within the delay,
    did not is useless as well. Clustered or ordered arrival on an input closes the keys it will not bring again
    (:func:`multi_drop` says when that makes another input's row useless).
    """
    uniq, delay, arrival = [False] * n, [[] for _ in range(n)], [()] * n
    for c in constraints:
        if enabled is not None and not enabled.get(c.name, True):
            continue
        if c.kind == "unique":
            uniq[c.side] = True
        elif c.kind == "many_to_one":
            uniq[c.other] = True   # each child joins exactly one parent row: the parent's key is unique
            delay[c.side].append((c.other, c.delay))
        else:   # clustered / ordered arrival on c.side: the keys it will not bring again are closed
            arrival[c.side] += (c.kind,)
    held = tuple(n > 1 and all(uniq[j] for j in range(n) if j != y) for y in range(n))
    return MultiEviction(tuple(uniq), held, tuple(tuple(d) for d in delay), tuple(arrival))


def _holds(keys, held) -> np.ndarray:
    """Per key of ``keys``, whether ``held`` has it (numpy int64 arrays, or Arrow arrays compared by value)."""
    if isinstance(keys, np.ndarray):
        return np.isin(keys, held)
    return pc.is_in(keys, value_set=held).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def multi_drop(eviction: MultiEviction, y: int, keys: Sequence, micros: np.ndarray, wm_ms: int,
               closed: Mapping[int, np.ndarray] | None = None, outer: int | None = None) -> np.ndarray:
    """Which live rows of input ``y`` the rules of :func:`multi_eviction` drop at watermark ``wm_ms``: ``keys[i]``
    the keys of input i's live rows (int64 values, or Arrow arrays of the key values), ``micros`` the times of
    y's, ``closed[j]`` (for the inputs j with enabled arrival constraints) per row of y whether j's arrivals say
    it brings no row of that row's key again. Decide every input from the same snapshot of the state (a row
    another input drops still has arrived).

    Input j has *closed* a key when it brings no row of it again: j is unique and holds a row of the key, or
    ``closed[j]`` says so. A row goes when every other input has closed its key (a new result containing it
    needs a future row of another input: rules 1 and 3), or when one of them has closed it and holds no row of
    it (no result can contain it any more: rule 3).

    ``outer``: the join's left last input z (``how=[..., "left"]``; docs/constraints.md, *Left inputs*). A row of
    another input still yields a null-padded result for every prefix tuple that forms later, whatever z does: z
    then closes no key for the second disjunct and, as the parent of rule 2, only with every other prefix input
    closed.
    """
    n = len(keys)
    drop = np.zeros(len(micros), dtype=bool)
    if not len(micros) or not (eviction.closes(y) or eviction.delay[y]):
        return drop
    closed = closed or {}
    prefix = outer is not None and y != outer
    every = np.ones(len(micros), dtype=bool)   # every other input (with a left z: every other prefix one) closed it
    some = np.zeros(len(micros), dtype=bool)   # one of them closed it and holds none of it
    shut_z = np.zeros(len(micros), dtype=bool)
    for j in range(n):
        if j == y:
            continue
        if not eviction.unique[j] and j not in closed:   # j may bring any key again
            if not (prefix and j == outer):
                every[:] = False
            continue
        held = _holds(keys[y], keys[j])
        shut = held if eviction.unique[j] else np.zeros(len(micros), dtype=bool)
        if j in closed:
            shut = shut | closed[j]
        if prefix and j == outer:   # z closing the key ends the row's matches, not its null-padded rows
            shut_z = shut
            continue
        if j in closed:
            some |= closed[j] & ~held
        every &= shut
    if eviction.closes(y):
        drop = some | (every & shut_z if prefix else every)
    for parent, delay_us in eviction.delay[y]:   # rule 2: past the delay bound, and the parent never came
        due = delay_due_ms(micros, delay_us) <= wm_ms
        if due.any():
            gone = due & ~_holds(keys[y], keys[parent])
            drop |= gone & every if prefix and parent == outer else gone
    return drop


def delay_due_ms(micros: np.ndarray, delay_us: int) -> np.ndarray:
    """The watermark (ms) from which a many-to-one child row at ``micros`` is past its delay bound: its time +
    ``delay_us``, rounded up to ms (the parent, while the streams adhere, has arrived by then).
    """
    t = np.asarray(micros, dtype=np.int64) + int(delay_us)
    return -(-t // 1000)


def delay_ends(ends_ms: np.ndarray, micros: np.ndarray, delay_us: int | None) -> np.ndarray:
    """Expiry keys (the watermark in ms that evicts each row) shortened by a many-to-one delay bound: a child row
    goes once the watermark reaches :func:`delay_due_ms`, or earlier if its band says so.
    """
    if delay_us is None:
        return ends_ms
    return np.minimum(np.asarray(ends_ms, dtype=np.int64), delay_due_ms(micros, delay_us))


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


# -- clustered / ordered arrival: per-shard positions ------------------------------------------------------------
#
# Arrival order is what a shard's stateful function sees: micro-batch after micro-batch, and inside one batch by
# event time, then key (Spark does not define the order of a batch's rows). A shard sees a subsequence of its
# input; between two rows of it lie at most as many rows as in the whole input, so a rule that holds for the input
# with tolerance k holds for every shard's subsequence with the same k (closing a cluster or raising the key bound
# per shard is safe, only later than on the whole input).

def arrival_order(micros: np.ndarray, keys: Sequence[pa.Array]) -> np.ndarray:
    """Indices that put one batch's rows of an input in arrival order: event time (µs), then key columns."""
    cols = {"t": pa.array(np.asarray(micros, dtype=np.int64), pa.int64())}
    cols.update({f"k{i}": a for i, a in enumerate(keys)})
    return pc.sort_indices(pa.table(cols), sort_keys=[(c, "ascending") for c in cols]).to_numpy()


def key_bytes(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """The kernel's byte keys (``encode_keys``' offsets and data) as one large_binary array: equal keys under
    the join's SQL equality are equal values.
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1,
                                            [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])


class Clusters:
    """The positions :func:`clustered` needs on one shard: rows counted so far and, per key seen, the position of
    its last row and the watermark (ms) after which its record is forgotten.

    A key's cluster is *closed* once ``k + 1`` rows of other keys came after its last row (STREAM §5.2's
    tolerance); a row of a closed key is a violation (and reopens it). A forgotten record only makes the rule
    keep rows it could have dropped.
    """

    def __init__(self, k: int, n: int = 0, keys: pa.Array | None = None, last=None, expire=None):
        self.k, self.n = k, n
        self.keys = pa.array([], pa.large_binary()) if keys is None else keys
        self.last = np.zeros(0, np.int64) if last is None else np.asarray(last, np.int64)
        self.expire = np.zeros(0, np.int64) if expire is None else np.asarray(expire, np.int64)

    def advance(self, keys: pa.Array, expire: np.ndarray) -> int:
        """Count one batch's rows (``keys``: byte keys in arrival order, no nulls; ``expire``: per row the
        watermark in ms after which its record may go); returns the rows that break the constraint.
        """
        m = len(keys)
        if m == 0:
            return 0
        r = len(self.keys)
        enc = pc.dictionary_encode(pa.concat_arrays([self.keys, keys.cast(pa.large_binary())]))
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        old, new = codes[:r], codes[r:]
        pos = self.n + 1 + np.arange(m, dtype=np.int64)
        last = np.full(len(enc.dictionary), -1, np.int64)
        last[old] = self.last
        # the previous row of each new row's key: the row before it in the batch, else the record's last row
        order = np.lexsort((pos, new))
        sc, sp = new[order], pos[order]
        same = np.r_[False, sc[1:] == sc[:-1]]
        prev = np.empty(m, np.int64)
        prev[order] = np.where(same, np.r_[0, sp[:-1]], last[sc])
        violations = int(((prev >= 0) & (pos - prev - 1 > self.k)).sum())
        np.maximum.at(last, new, pos)
        ends = np.full(len(enc.dictionary), np.iinfo(np.int64).min, np.int64)
        ends[old] = self.expire
        np.maximum.at(ends, new, np.asarray(expire, np.int64))
        self.keys, self.last, self.expire, self.n = enc.dictionary, last, ends, self.n + m
        return violations

    def closed(self) -> pa.Array:
        """The byte keys whose cluster is closed (no row of them comes again while the input adheres)."""
        return self.keys.filter(pa.array(self.n - self.last > self.k))

    def forget(self, wm_ms: int) -> None:
        """Drop the records whose watermark has passed."""
        keep = self.expire > wm_ms
        if not keep.all():
            self.keys, self.last, self.expire = self.keys.filter(pa.array(keep)), self.last[keep], self.expire[keep]

    def to_table(self) -> pa.Table:
        """The records as a table (``n`` in the schema metadata)."""
        return pa.table({"key": self.keys, "last": self.last, "expire": self.expire}).replace_schema_metadata(
            {b"n": str(self.n).encode()})

    @classmethod
    def from_table(cls, k: int, table: pa.Table) -> Clusters:
        """The records of :meth:`to_table`."""
        return cls(k, int(table.schema.metadata[b"n"]), table.column("key").combine_chunks(),
                   table.column("last").to_numpy(), table.column("expire").to_numpy())


def _dense_ranks(table: pa.Table) -> np.ndarray:
    """Per row its rank among the distinct rows of ``table`` (column by column ascending; no nulls)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    idx = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in table.column_names]).to_numpy()
    s = table.take(pa.array(idx))
    new = np.zeros(n, bool)
    new[0] = True
    for col in s.columns:
        a = col.combine_chunks()
        new[1:] |= pc.not_equal(a.slice(1), a.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    ranks = np.empty(n, np.int64)
    ranks[idx] = np.cumsum(new) - 1
    return ranks


def _below(keys: pa.Table, bound: pa.Table) -> np.ndarray:
    """Whether each row of ``keys`` is below the one row of ``bound`` (column by column; a null is not)."""
    out = None
    for name in reversed(keys.column_names):
        col, b = keys.column(name), bound.column(name)[0]
        less = pc.less(col, b)
        out = less if out is None else pc.or_(less, pc.and_(pc.equal(col, b), out))
    return out.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


class KeyOrder:
    """The positions :func:`ordered` needs on one shard: the largest key of the rows more than ``k`` rows back
    (``bound``, one row of key columns, or None) and the last ``k`` rows' keys (``pending``, arrival order).

    Every future row's key is >= ``bound`` while the input adheres (STREAM §5.2's ordered arrival with tolerance
    k); a row below the largest key more than ``k`` rows before it is a violation.
    """

    def __init__(self, k: int, bound: pa.Table | None = None, pending: pa.Table | None = None):
        self.k, self.bound, self.pending = k, bound, pending

    def advance(self, keys: pa.Table) -> int:
        """Count one batch's rows (``keys``: key columns in arrival order, no nulls); returns the rows that break
        the constraint.
        """
        if keys.num_rows == 0:
            return 0
        seq = keys if self.pending is None else pa.concat_tables([self.pending, keys.cast(self.pending.schema)])
        p = 0 if self.pending is None else self.pending.num_rows
        both = seq if self.bound is None else pa.concat_tables([self.bound, seq.cast(self.bound.schema)])
        ranks = _dense_ranks(both)
        b, rs = (-1, ranks) if self.bound is None else (ranks[0], ranks[1:])
        top = np.maximum.accumulate(rs)
        back = np.arange(len(rs)) - self.k - 1       # the newest row more than k rows before each row
        before = np.maximum(np.where(back >= 0, top[np.maximum(back, 0)], -1), b)
        violations = int((rs < before)[p:].sum())
        settled = len(rs) - self.k                   # rows that are now more than k rows back
        if settled > 0 and top[settled - 1] > b:
            i = int(np.argmax(rs[:settled] == top[settled - 1]))
            self.bound = seq.slice(i, 1)
        self.pending = seq.slice(max(settled, 0)) if self.k else None
        return violations

    def below(self, keys: pa.Table) -> np.ndarray:
        """Whether each row of ``keys`` (key columns) is below the bound: no future row of the input has its key."""
        if self.bound is None or keys.num_rows == 0:
            return np.zeros(keys.num_rows, bool)
        return _below(keys.rename_columns(self.bound.column_names), self.bound)

    def to_table(self) -> pa.Table:
        """Bound and pending rows as one table (``bound`` in the schema metadata: whether row 0 is the bound)."""
        parts = [t for t in (self.bound, self.pending) if t is not None]
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return table.replace_schema_metadata({b"bound": b"1" if self.bound is not None else b"0"})


class Arrivals:
    """The arrival trackers of one shard: one :class:`Clusters` / :class:`KeyOrder` per declared ``clustered`` /
    ``ordered`` constraint, kept in the state as schema metadata of a payload table (:meth:`to_metadata`).
    """

    META = b"pyspark_cq.arrival."

    def __init__(self, constraints: Sequence[Constraint]):
        self.trackers: dict[str, Clusters | KeyOrder] = {}
        for c in constraints:
            if c.kind == "clustered":
                self.trackers[c.name] = Clusters(c.k)
            elif c.kind == "ordered":
                self.trackers[c.name] = KeyOrder(c.k)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def on(self, side: str) -> list[tuple[str, Clusters | KeyOrder]]:
        """The (kind, tracker) pairs of input ``side``."""
        return [(name.rsplit("_", 1)[0], t) for name, t in self.trackers.items() if name.endswith("_" + side)]

    def to_metadata(self) -> dict[bytes, bytes]:
        """Schema metadata entries holding the trackers (base64 Arrow IPC)."""
        out = {}
        for name, t in self.trackers.items():
            table = t.to_table() if not isinstance(t, KeyOrder) or t.bound is not None or t.pending is not None \
                else None
            if table is not None:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema, options=_IPC) as writer:
                    writer.write_table(table)
                out[self.META + name.encode()] = base64.b64encode(sink.getvalue().to_pybytes())
        return out

    def restore(self, metadata: Mapping[bytes, bytes] | None) -> Arrivals:
        """Fill the trackers from schema metadata written by :meth:`to_metadata` (absent entries: empty)."""
        for name, t in list(self.trackers.items()):
            blob = (metadata or {}).get(self.META + name.encode())
            if blob is None:
                continue
            table = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(blob))).read_all()
            if isinstance(t, Clusters):
                self.trackers[name] = Clusters.from_table(t.k, table)
            else:
                bound = table.schema.metadata[b"bound"] == b"1"
                table = table.replace_schema_metadata(None)
                first = 1 if bound else 0
                self.trackers[name] = KeyOrder(t.k, table.slice(0, 1) if bound else None,
                                               table.slice(first) if table.num_rows > first else None)
        return self
