"""The state of a query group's slice classes: estimate, admission control and window re-plans under a bound.

PIPES's resource manager keeps the estimated memory of thousands of queries within a bound by admission control
and by adjusting windows within the users' QoS ranges (Cammert et al., §4.1.1, §4.3, §5.4). In a query group
(docs/groups.md) the queries of one *slice class* share one slice table, which keeps a slice as long as the
class's widest window needs it, so the state is a property of the class, not of a query:

- a class's state rows are PIPES's eq. (15) for the class's stream through its widest window (Cost Formula 7)
  and its granularity (Cost Formula 8), per grouping key — :func:`pyspark_cq.cost.pipes.aggregation_state_rows`,
  the one place of that formula, with the watermark retention ``window + δ + B`` a Spark operator keeps;
- a query that joins an existing class adds only what the class does not hold yet (nothing unless its window is
  the class's widest), a query of a new class adds the class (:func:`admit`);
- a *join class* (two-stream inner joins on the same streams, roles and key, docs/groups.md "Joins") holds one
  symmetric hash state for its widest windows: PIPES's eq. (9) (Cammert et al., §3.6.3) for the two streams
  through those windows with the retention ``window + δ + B`` —
  :func:`pyspark_cq.cost.pipes.join_state_rows`, the one place of that formula — counted once per class
  (:func:`join_class_state_rows`); a join class's windows are not adjustable (:func:`fixed_classes`);
- a re-plan changes windows only where the table really changes: of a class whose members all have a QoS range
  of their window (a member alone in its class is such a class); a class with a member whose window is fixed is
  left as it is (:func:`fixed_classes`, the one place of that rule; :func:`replan`);
- a re-plan reduces windows when the measured state passes the budget and grows reduced windows back toward
  the windows the queries were registered with when it falls below :data:`GROW_BELOW` of it, to
  :data:`GROW_TO` of it (:func:`replan_target`, the hysteresis; PIPES §4.1.1: released resources go back as
  larger windows).

Pure: no Spark. Times in µs (windows), seconds (rates, delays).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import pipes

__all__ = ["MemberLoad", "JoinLoad", "StreamLoad", "join_class_state_rows", "class_state_rows", "group_state_rows",
           "GroupAdmission", "admit", "Replan", "replan", "window_at", "window_toward", "fixed_classes",
           "replan_target", "GROW_BELOW", "GROW_TO", "DIRECTIONS", "growth_filled_at", "growth_filled", "MERGE_RATIO",
           "granularity_classes", "class_granularity"]

_MS = 1000          # the cost model's time unit here: 1 ms (µs windows / 1000)

#: The directions of a re-plan: ``"reduce"`` (the measured state passed the budget) or ``"grow"`` (it fell well
#: below it and windows reduced earlier grow back toward the windows the queries were registered with).
DIRECTIONS = ("reduce", "grow")

#: Grow windows back only when the measured state is below this share of the budget. The band between it and
#: the budget is the hysteresis: a reduction leaves the state near the budget and a growth at :data:`GROW_TO`,
#: both inside the band, so neither triggers the other unless the stream itself changes by more than the band
#: (the state falls by half: a factor 0.5 / 0.8 = 0.625 below where a growth leaves it, more than the
#: estimate's calibration error on a steady stream).
GROW_BELOW = 0.5
#: A growth aims at this share of the budget, not the budget: PIPES keeps "a portion of the system resources as
#: reserve" for adaptation delays and bursts (Cammert et al., §5.4, §4.1.2), and a grown window's state is fully
#: visible only after the new window size (§4.2), so a growth to the budget itself would pass it on any error of
#: the calibrated estimate and be reduced again.
GROW_TO = 0.8

#: Slice classes across granularities: queries whose slices differ only in granularity share one table at the
#: gcd of their granularities while the coarsest granularity is at most this many times that gcd
#: (:func:`granularity_classes`). The price of merging is bounded by it: a query of granularity ``g`` sweeping a
#: table of slice length ``g_c`` passes ``g / g_c`` slices where it passed one (the kernel's sliding sweep is
#: amortised O(1) per slice, so its work per event time grows by that factor, not by ``W / g_c`` per window), and
#: the table keeps its widest window in slices of ``g_c``: at most this factor times the rows of the coarse
#: queries' own table (PIPES eq. (15) at granularity ``g_c``, Cammert et al., §3.6.4, Cost Formula 8). What
#: merging saves: one slicer pass over the class's rows, one unpack and one ingest per micro-batch and one table's
#: bookkeeping. 6 merges the common pairs of a minute and ten seconds (1 min / 10 s with 1 h / 1 min) and keeps a
#: 5-minute slice query off a table of 10-second slices (ratio 30).
MERGE_RATIO = 6


@dataclass(frozen=True)
class MemberLoad:
    """One query of a group as the state estimate sees it.

    Attributes
    ----------
    name : str
        The query's name.
    slice_class : str
        Its slice class (any id its class's members share; :func:`pyspark_cq.group.worker.slice_classes`).
    stream : str
        The stream it reads.
    window, slide, granularity : int
        Its window, slide and slice length (µs; the window and slide are multiples of the granularity).
    window_min, window_max : int or None
        The QoS range of its window (µs, PIPES §4.3); None: the window is fixed.
    key : str
        Its grouping key as text (e.g. ``"page"``; a :class:`StreamLoad`'s ``keys`` may give its key count).
    registered : int or None
        The window it was registered with (µs, its text's): a re-plan grows a reduced window back toward it,
        never above it. None: its current window (it does not grow).
    """

    name: str
    slice_class: str
    stream: str
    window: int
    slide: int
    granularity: int
    window_min: int | None = None
    window_max: int | None = None
    key: str = ""
    registered: int | None = None

    def __post_init__(self):
        if not isinstance(self.key, str):
            raise TypeError(f"MemberLoad key must be a str (the grouping key as text), got {self.key!r}")
        for k in ("name", "slice_class", "stream"):
            if not isinstance(getattr(self, k), str) or not getattr(self, k):
                raise TypeError(f"MemberLoad {k} must be a non-empty str, got {getattr(self, k)!r}")
        for k in ("window", "slide", "granularity"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"MemberLoad {k} must be a positive int of µs, got {v!r}")
        r = self.registered
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r <= 0):
            raise ValueError(f"MemberLoad registered must be None or a positive int of µs (the window of its "
                             f"text), got {r!r}")
        if (self.window_min is None) != (self.window_max is None):
            raise ValueError(f"MemberLoad window_min and window_max must be given together, got "
                             f"{self.window_min!r}, {self.window_max!r}")
        if self.window_min is not None and not 0 < self.window_min <= self.window_max:
            raise ValueError(f"MemberLoad window_min must be in (0, window_max], got {self.window_min!r} > "
                             f"{self.window_max!r}")

    @property
    def adjustable(self) -> bool:
        """Whether its window has a QoS range below its current window."""
        return self.window_min is not None and window_at(self, 0.0) < self.window

    @property
    def streams(self) -> tuple[str]:
        """The streams its state is estimated from: its one stream."""
        return (self.stream,)

    @property
    def state_class(self) -> str:
        """The class whose state it shares: its slice class."""
        return self.slice_class


@dataclass(frozen=True)
class JoinLoad:
    """One two-stream inner join of a group as the state estimate sees it: a member of a *join class*
    (:func:`pyspark_cq.group.joins.join_classes`), whose one symmetric hash state is the window join of the
    class's widest windows.

    Attributes
    ----------
    name : str
        The query's name.
    join_class : str
        Its join class (any id its class's members share; the group uses the class's first member's name).
    left, right : str
        The streams it joins, in their roles (left: first in FROM).
    left_window, right_window : int
        The ``[RANGE …]`` sizes (µs) of its left and right input the class's state must keep for it. A join's
        windows have no QoS range in a group: the class's band is part of the group's Spark plan.
    """

    name: str
    join_class: str
    left: str
    right: str
    left_window: int
    right_window: int

    def __post_init__(self):
        for k in ("name", "join_class", "left", "right"):
            if not isinstance(getattr(self, k), str) or not getattr(self, k):
                raise TypeError(f"JoinLoad {k} must be a non-empty str, got {getattr(self, k)!r}")
        for k in ("left_window", "right_window"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"JoinLoad {k} must be a positive int of µs, got {v!r}")

    @property
    def streams(self) -> tuple[str, str]:
        """The streams its state is estimated from: ``(left, right)``."""
        return self.left, self.right

    @property
    def state_class(self) -> str:
        """The class whose state it shares: its join class."""
        return self.join_class


@dataclass(frozen=True)
class StreamLoad:
    """What the estimate assumes of a stream.

    Attributes
    ----------
    rate : float
        Rows per second (>= 0).
    keys : int or mapping str -> int
        Distinct grouping keys of a slice class over it (an upper bound; >= 1), or per grouping key as text
        (``MemberLoad.key``; a key not listed counts as the largest listed).
    selectivity : float
        Share of the rows passing a class's WHERE, in (0, 1] (1: an upper bound).
    watermark_delay, batch_span : float
        The watermark delay δ and the event time B of one micro-batch (seconds, >= 0): a Spark operator keeps
        ``window + δ + B`` of event time (:func:`pyspark_cq.cost.pipes.watermark_retention`).
    """

    rate: float
    keys: int | Mapping[str, int] = 1
    selectivity: float = 1.0
    watermark_delay: float = 0.0
    batch_span: float = 0.0

    def __post_init__(self):
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate < math.inf:
            raise ValueError(f"StreamLoad rate must be a finite number of rows/s >= 0, got {self.rate!r}")
        counts = list(self.keys.values()) if isinstance(self.keys, Mapping) else [self.keys]
        if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
            raise ValueError(f"StreamLoad keys must be an int >= 1 or a non-empty mapping of grouping key -> "
                             f"int >= 1, got {self.keys!r}")
        if isinstance(self.keys, Mapping):
            object.__setattr__(self, "keys", dict(self.keys))
        if isinstance(self.selectivity, bool) or not isinstance(self.selectivity, (int, float)) \
                or not 0 < self.selectivity <= 1:
            raise ValueError(f"StreamLoad selectivity must be in (0, 1], got {self.selectivity!r}")
        for k in ("watermark_delay", "batch_span"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"StreamLoad {k} must be a finite number of seconds >= 0, got {v!r}")

    def keys_of(self, key: str) -> int:
        """The key count of a class grouped by ``key`` (text)."""
        if isinstance(self.keys, int):
            return self.keys
        return self.keys.get(key, max(self.keys.values()))


def window_at(m: MemberLoad, f: float) -> int:
    """The window of ``m`` at fraction ``f`` of its QoS range (PIPES §4.3: ``min + f·(max − min)``), rounded down
    to a multiple of its granularity and at least its slide (windows are runs of whole slices, ``W >= S``);
    its current window when it has no range.
    """
    if m.window_min is None:
        return m.window
    g = m.granularity
    w = m.window_min + f * (m.window_max - m.window_min)
    lowest = max(m.slide, -(-m.window_min // g) * g)
    return int(max(lowest, (int(w) // g) * g))


def window_toward(m: MemberLoad, f: float, direction: str) -> int:
    """The window of ``m`` a re-plan in ``direction`` sets at fraction ``f``: the one formula of both directions.

    ``"reduce"``: ``min(current, window_at(m, f))`` (a reduction never widens a window); ``"grow"``:
    ``max(current, min(registered, window_at(m, f)))`` — back toward the window it was registered with, never
    above it nor above its QoS maximum (``window_at`` <= max for f <= 1), never below the current one.

    Parameters
    ----------
    m : MemberLoad
        The query (its current window, QoS range, registered window).
    f : float
        The fraction of its QoS range, in [0, 1].
    direction : {"reduce", "grow"}
        The re-plan's direction.

    Returns
    -------
    int
        The window (µs), a multiple of its granularity, at least its slide.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    at = window_at(m, f)
    if direction == "reduce":
        return min(m.window, at)
    cap = m.window if m.registered is None else m.registered
    return max(m.window, min(cap, at))


def granularity_classes(granularities: Sequence[int], max_ratio: int = MERGE_RATIO) -> list[int]:
    """Which queries of equal slices but for the granularity share one slice table: for each granularity (µs, in
    the group's plan order) the index of the first query of its class.

    A query joins the first class (in order) that stays within ``max_ratio`` with it: the class's coarsest
    granularity at most ``max_ratio`` times the gcd of its granularities, the slice length of its table
    (:func:`class_granularity`); else it starts a class. Every window and slide of a class's queries is a
    multiple of the gcd, so each window is a run of whole slices of the table (PIPES split-based aggregation,
    Cammert et al., §2.4.1, Algorithm 1) and the sums, counts, minima and maxima of the finer slices combine to the
    window's exactly. ``max_ratio`` 1 merges equal granularities only (the classes of checkpoints written before
    classes spanned granularities). See :data:`MERGE_RATIO` for the cost it bounds.

    Parameters
    ----------
    granularities : sequence of int
        Positive slice lengths (µs).
    max_ratio : int
        The bound, >= 1.

    Returns
    -------
    list of int
        Per granularity, the index of its class's first query.
    """
    if isinstance(max_ratio, bool) or not isinstance(max_ratio, int) or max_ratio < 1:
        raise ValueError(f"max_ratio must be an int >= 1, got {max_ratio!r}")
    if isinstance(granularities, (str, bytes)) or not isinstance(granularities, Sequence):
        raise TypeError(f"granularities must be a sequence of positive ints (µs), got {type(granularities).__name__}")
    classes: list[list[int]] = []     # [first index, gcd, coarsest]
    out = []
    for i, g in enumerate(granularities):
        if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
            raise ValueError(f"granularities must hold positive ints (µs), got {g!r} at {i}")
        for c in classes:
            fine, coarse = math.gcd(c[1], g), max(c[2], g)
            if coarse <= max_ratio * fine:
                c[1], c[2] = fine, coarse
                out.append(c[0])
                break
        else:
            classes.append([i, g, g])
            out.append(i)
    return out


def class_granularity(granularities: Sequence[int]) -> int:
    """The slice length (µs) of a class's table: the gcd of its queries' granularities (positive ints)."""
    gs = list(granularities)
    if not gs or any(isinstance(g, bool) or not isinstance(g, int) or g <= 0 for g in gs):
        raise ValueError(f"granularities must be a non-empty sequence of positive ints (µs), got {gs!r}")
    return math.gcd(*gs)


def _classes(members: Sequence[MemberLoad | JoinLoad]) -> dict[str, list]:
    """The members by the class whose state they share (slice classes and join classes)."""
    out: dict[str, list] = {}
    for m in members:
        if not isinstance(m, (MemberLoad, JoinLoad)):
            raise TypeError(f"members must hold MemberLoad or JoinLoad, got {type(m).__name__}")
        same = out.setdefault(m.state_class, [])
        if same and type(same[0]) is not type(m):
            raise ValueError(f"members: class {m.state_class!r} holds both a slice class's and a join class's "
                             f"queries ({same[0].name!r}, {m.name!r}); give the two kinds of class distinct ids")
        same.append(m)
    return out


#: why a join class is never adjusted by a re-plan (:func:`fixed_classes`)
_JOIN_FIXED = ("a join class: its band (the widest windows of its members) is part of the group's Spark plan, "
               "fixed at start(); its members' windows have no QoS range in a group")


def fixed_classes(members: Sequence[MemberLoad]) -> dict[str, str]:
    """The slice classes of ``members`` whose windows a re-plan must not change, each with the reason.

    A class's table keeps slices for its widest window, so changing one member's window frees (or takes) state
    only when the class's widest window changes with it. A class is adjustable only when **every** member has a
    QoS range of its window (a member alone in its class is such a class), and then all its members move at the
    same fraction; a class with a member whose window is fixed keeps all its windows: reducing the others would
    free nothing the fixed member's window still holds, or would have to shrink what it needs. The one place of
    this rule: :func:`replan` and the PIPES resource manager plugin (``pipes``) use it.

    A join class (:class:`JoinLoad`) is always fixed: its state is the window join of its widest windows, fixed
    with the group's Spark plan; a re-plan counts it as it is and makes room in the slice classes.
    """
    if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
        raise TypeError(f"members must be a sequence of MemberLoad or JoinLoad, got {type(members).__name__}")
    out = {}
    for cls, ms in _classes(members).items():
        if isinstance(ms[0], JoinLoad):
            out[cls] = _JOIN_FIXED
        elif any(m.window_min is None for m in ms):
            out[cls] = f"member {next(m.name for m in ms if m.window_min is None)!r} has no QoS range of its window"
    return out


def class_state_rows(members: Sequence[MemberLoad], load: StreamLoad,
                     windows: Mapping[str, int] | None = None) -> float:
    """Estimated rows of one slice class's table: eq. (15) (Cammert et al., §3.6.4) per key for the stream through
    the class's widest window (Formula 7, with the watermark retention) and its granularity (Formula 8), via
    :func:`pyspark_cq.cost.pipes.aggregation_state_rows`. ``windows`` (name -> µs) overrides members' windows.
    The class's granularity is its table's slice length, the gcd of its members' (:func:`class_granularity`): a
    class spanning granularities is counted once, at its finer slices.
    """
    if not members:
        raise ValueError("members must hold the class's queries, at least one")
    if not isinstance(load, StreamLoad):
        raise TypeError(f"load must be a StreamLoad, got {type(load).__name__}")
    if load.rate == 0:
        return 0.0
    windows = windows or {}
    widest = max(windows.get(m.name, m.window) for m in members)
    g = class_granularity([m.granularity for m in members])
    d_ms = 1000.0 / (load.rate * load.selectivity)     # ms between rows passing the class's WHERE
    return pipes.aggregation_state_rows(pipes.SC(d_ms, 1.0), window=widest / _MS, granularity=g / _MS,
                                        groups=load.keys_of(members[0].key),
                                        watermark_delay=load.watermark_delay * 1000.0,
                                        batch_span=load.batch_span * 1000.0)


def join_class_state_rows(members: Sequence[JoinLoad], loads: Mapping[str, StreamLoad]) -> float:
    """Estimated rows of one join class's symmetric hash state, both sides: PIPES's eq. (9) (Cammert et al.,
    §3.6.3; :func:`pyspark_cq.cost.pipes.join_state_rows`) for the two streams through the class's widest windows
    (Cost Formula 7), each kept for ``window + δ + B``.

    The class's state is the window join of its members' widest windows (each input's largest ``[RANGE …]``,
    :func:`pyspark_cq.group.joins.class_windows`): a left row is kept while a right row of the class's band may
    still match it (the widest left window), a right row for the widest right window, each plus the watermark
    retention (:func:`pyspark_cq.cost.pipes.watermark_retention`). The join runs at the watermark Spark gives the
    join alone, the minimum over its two streams of their event time minus their delay, so a row is kept for the
    larger of the two delays and batch spans (an upper bound when the streams' event times differ). Every row of
    both streams enters the state (a member's WHERE is applied to the class's pairs), so ``selectivity`` and
    ``keys`` do not apply: the rows within the band are kept whatever their keys. A stream without rows keeps no
    state and the other side is still evicted by its own watermark (Spark's minimum over the streams that had
    rows): its side is then counted against itself.

    Parameters
    ----------
    members : sequence of JoinLoad
        The class's queries (at least one; one join class: the same two streams in the same roles).
    loads : mapping str -> StreamLoad
        By stream; both of the class's streams.

    Returns
    -------
    float
        Estimated rows of the class's state (left + right).
    """
    if isinstance(members, (str, bytes)) or not isinstance(members, Sequence) or not members:
        raise ValueError("members must be a non-empty sequence of the join class's JoinLoad")
    if any(not isinstance(j, JoinLoad) for j in members):
        raise TypeError(f"members must hold JoinLoad, got {[type(j).__name__ for j in members]}")
    if len({j.streams for j in members}) != 1:
        raise ValueError(f"members must join the same two streams in the same roles (one join class), got "
                         f"{sorted({j.streams for j in members})}")
    ins = []
    for s in members[0].streams:
        if s not in loads or not isinstance(loads[s], StreamLoad):
            raise KeyError(f"loads has no StreamLoad for stream {s!r} (join class {members[0].join_class!r})")
        ins.append(loads[s])
    sides = [pipes.SC(1000.0 / ld.rate, 1.0) if ld.rate > 0 else None for ld in ins]
    if sides == [None, None]:
        return 0.0
    left, right = sides[0] or sides[1], sides[1] or sides[0]
    rows = pipes.join_state_rows(left, right,
                                 left_window=max(j.left_window for j in members) / _MS,
                                 right_window=max(j.right_window for j in members) / _MS,
                                 watermark_delay=max(ld.watermark_delay for ld in ins) * 1000.0,
                                 batch_span=max(ld.batch_span for ld in ins) * 1000.0)
    return float(sum(r for r, side in zip(rows, sides) if side is not None))


def group_state_rows(members: Sequence[MemberLoad | JoinLoad], loads: Mapping[str, StreamLoad],
                     windows: Mapping[str, int] | None = None) -> dict[str, float]:
    """Estimated state rows per class of ``members``, each class counted once: a slice class's table
    (:func:`class_state_rows`), a join class's symmetric hash state (:func:`join_class_state_rows`); ``loads``
    by stream; ``windows`` (name -> µs) overrides slice-class members' windows (a join's are fixed).
    """
    out = {}
    for cls, ms in _classes(members).items():
        if isinstance(ms[0], JoinLoad):
            out[cls] = join_class_state_rows(ms, loads)
            continue
        if ms[0].stream not in loads:
            raise KeyError(f"loads has no StreamLoad for stream {ms[0].stream!r} (class {cls!r})")
        out[cls] = class_state_rows(ms, loads[ms[0].stream], windows)
    return out


@dataclass(frozen=True)
class GroupAdmission:
    """The answer of :func:`admit`: accepted or not, the rows the query adds (what its class does not hold yet),
    the group's estimated rows and bytes with it, and the reason (it names the query, its class and the bound).
    """

    accepted: bool
    added_rows: float
    rows: float
    bytes: float
    reason: str


def admit(members: Sequence[MemberLoad], new: MemberLoad, loads: Mapping[str, StreamLoad], budget: float,
          row_bytes: float) -> GroupAdmission:
    """Admission control of ``new`` into a group of ``members`` under the memory bound ``budget`` (bytes):
    accepted when the group's estimated state with it (each class once, :func:`group_state_rows`) times
    ``row_bytes`` stays within ``budget`` (PIPES §4.1.1, at the group's current windows). ``new`` may be a join
    (:class:`JoinLoad`): it adds its join class's state, or what its windows widen of an existing class's.
    """
    if not isinstance(new, (MemberLoad, JoinLoad)):
        raise TypeError(f"new must be a MemberLoad or a JoinLoad, got {type(new).__name__}")
    for k, v in (("budget", budget), ("row_bytes", row_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"{k} must be a positive finite number of bytes, got {v!r}")
    before = sum(group_state_rows(members, loads).values())
    after = sum(group_state_rows(list(members) + [new], loads).values())
    added = after - before
    peers = [m.name for m in members if m.state_class == new.state_class]
    kind = ("the join state", "join class") if isinstance(new, JoinLoad) else ("the slices", "slice class")
    where = f"shares {kind[0]} of {peers[0]!r} ({len(peers)} queries)" if peers else f"a new {kind[1]}"
    total = after * row_bytes
    if total <= budget:
        return GroupAdmission(True, added, after, total, f"accepted {new.name!r} ({where}): adds "
                              f"{added:,.0f} estimated state rows, the group's estimate {total:,.0f} B <= the "
                              f"memory budget {budget:,.0f} B")
    return GroupAdmission(False, added, after, total, f"rejected {new.name!r} ({where}): it adds {added:,.0f} "
                          f"estimated state rows ({added * row_bytes:,.0f} B); the group's estimate with it "
                          f"{total:,.0f} B > the memory budget {budget:,.0f} B")


@dataclass(frozen=True)
class Replan:
    """The outcome of :func:`replan`: the new windows (µs, only those that change), the fraction ``f`` of the
    adjustable windows' QoS ranges, the estimated rows before and after, the target, whether it fits, per
    class that could not be changed the reason, and the ``direction`` (``"reduce"`` or ``"grow"``).
    """

    windows: dict
    f: float
    rows_before: float
    rows_after: float
    target_rows: float
    feasible: bool
    fixed: dict = field(default_factory=dict)
    direction: str = "reduce"


def replan(members: Sequence[MemberLoad], loads: Mapping[str, StreamLoad], target_rows: float, *,
           tolerance: float = 1e-3, direction: str = "reduce") -> Replan:
    """Window changes that bring the group's estimated state rows within ``target_rows``.

    PIPES §4.3 step 2 (bisection of a common fraction ``f`` of the windows' QoS ranges), over the slice classes
    whose members all have a QoS range (:func:`fixed_classes`; the others are listed in ``fixed``): the largest
    ``f`` in [0, 1] at which the estimate fits, a member's new window at ``f`` being
    :func:`window_toward` ``(m, f, direction)``.

    ``"reduce"`` (the state is over its bound): only reductions; infeasible when every adjustable window at its
    QoS minimum (f = 0) does not fit. ``"grow"`` (the state is well below its bound, PIPES §4.1.1: released
    resources go back as larger windows): only growths, toward the windows the members were registered with
    (``MemberLoad.registered``) and within their QoS ranges; nothing changes when the current windows do not
    fit ``target_rows`` already (``feasible`` false), all windows back at their registered size when they fit
    (f = 1).
    """
    if isinstance(target_rows, bool) or not isinstance(target_rows, (int, float)) or not target_rows >= 0:
        raise ValueError(f"target_rows must be a number >= 0, got {target_rows!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    classes = _classes(members)
    fixed = fixed_classes(members)
    free = [m for cls, ms in classes.items() if cls not in fixed for m in ms]
    base = group_state_rows(members, loads)
    rows_before = sum(base.values())
    fixed_rows = sum(r for cls, r in base.items() if cls in fixed)

    def at(f: float) -> tuple[dict, float]:
        windows = {m.name: window_toward(m, f, direction) for m in free}
        rows = sum(group_state_rows(free, loads, windows).values()) if free else 0.0
        return windows, fixed_rows + rows

    current = {m.name: m.window for m in free}
    if direction == "reduce" and rows_before <= target_rows:
        return Replan({}, 1.0, rows_before, rows_before, target_rows, True, fixed, direction)
    if direction == "grow" and rows_before > target_rows:   # no room: the current windows stay
        return Replan({}, 0.0, rows_before, rows_before, target_rows, False, fixed, direction)
    hi_windows, hi_rows = at(1.0)
    lo_windows, lo_rows = at(0.0)
    if hi_rows <= target_rows:           # every window at f = 1 fits (a growth all the way back)
        f, windows, rows, feasible = 1.0, hi_windows, hi_rows, True
    elif lo_rows > target_rows:          # reduce only: even f = 0 does not fit
        f, windows, rows, feasible = 0.0, lo_windows, lo_rows, False
    else:
        lo, hi = 0.0, 1.0
        windows, rows = lo_windows, lo_rows
        while hi - lo > tolerance:
            mid = (lo + hi) / 2
            w, r = at(mid)
            if r <= target_rows:
                lo, windows, rows = mid, w, r
            else:
                hi = mid
        f, feasible = lo, True
    changed = {n: w for n, w in windows.items() if w != current[n]}
    return Replan(changed, f, rows_before, rows, target_rows, feasible, fixed, direction)


def replan_target(measured_rows: float, measured_bytes: float, estimated_rows: float, budget: float
                  ) -> tuple[str | None, float]:
    """Whether a group re-plans, in which direction, and the target of its estimate (rows).

    The estimate is calibrated to the measurement: the budget in rows at the measured bytes per row, times
    estimated / measured rows (the estimate is an upper bound: the target is in the estimate's rows).
    ``"reduce"`` to the budget when the measured state passes it; ``"grow"`` to :data:`GROW_TO` of it when the
    state is below :data:`GROW_BELOW` of it (the hysteresis; see their notes); else ``(None, 0.0)``, as
    without a measurement (no rows, no bytes) or without an estimate.

    Parameters
    ----------
    measured_rows, measured_bytes : float
        The group's measured state (its slice tables', each counted once), >= 0.
    estimated_rows : float
        The estimate at the current windows (:func:`group_state_rows` summed), >= 0.
    budget : float
        The memory budget in bytes, > 0.

    Returns
    -------
    tuple of (str or None, float)
        The direction (``"reduce"``, ``"grow"`` or None) and the target of the estimate in rows.
    """
    for k, v in (("measured_rows", measured_rows), ("measured_bytes", measured_bytes),
                 ("estimated_rows", estimated_rows)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < math.inf:
        raise ValueError(f"budget must be a positive finite number of bytes, got {budget!r}")
    if measured_rows <= 0 or measured_bytes <= 0 or estimated_rows <= 0:
        return None, 0.0
    rows_in_budget = budget / (measured_bytes / measured_rows) * (estimated_rows / measured_rows)
    if measured_bytes > budget:
        return "reduce", rows_in_budget
    if measured_bytes < GROW_BELOW * budget:
        return "grow", GROW_TO * rows_in_budget
    return None, 0.0


def growth_filled_at(grown: Mapping[str, int], members: Sequence[MemberLoad],
                     event_times: Mapping[str, int | None]) -> dict[str, int]:
    """Per stream, the event time (µs) by which the tables of the windows grown now hold them fully.

    A slice table evicts by its class's widest window, so a window grown from ``w`` to ``w'`` at event time ``t``
    is held fully at ``t + (w' − w)`` (the class's widest grows by at most that much; PIPES §4.2: a grown
    window's state is fully visible only after the new window). ``grown``: name -> new window (µs); ``members``:
    the members before the growth; ``event_times``: each stream's largest event time now (µs; None: unknown,
    that stream is not held).
    """
    before = {m.name: m for m in members}
    out: dict[str, int] = {}
    for name, w in grown.items():
        if name not in before:
            raise KeyError(f"grown names {name!r}, not one of members")
        m = before[name]
        t = event_times.get(m.stream)
        if t is not None:
            out[m.stream] = max(out.get(m.stream, t), t + w - m.window)
    return out


def growth_filled(hold: Mapping[str, int], event_times: Mapping[str, int | None]) -> bool:
    """Whether every stream held by :func:`growth_filled_at` has reached its time (a stream whose event time is
    unknown has not).
    """
    return all(event_times.get(s) is not None and event_times[s] >= until for s, until in hold.items())
