"""PIPES transition semantics of window and granularity changes (Cammert et al., §2.4.2, §2.4.3, §4.2).

Pure functions and values (standard library and numpy), called by the operators on Spark's workers and
by the runtime on the driver:

- **Windows and join bounds** (``window``, ``lower``, ``upper``): "adjusting the window size means to
  change it to a new value w′ at a certain application time instant t" (§2.4.2). Each element keeps the
  window in force at its own timestamp, so a change applies to *new elements only*
  (:meth:`Schedule.value_at`, :meth:`Schedule.values_at`). Its effect on a join's state "starts to be
  observable at t + min{w′, w} and reaches its full impact at t + max{w′, w}" (§4.2;
  :func:`pyspark_cq.cost.pipes.window_change_delay`); in between the state moves linearly from the old to
  the new size (:meth:`Transition.progress`; exact for a constant-rate stream up to one element).
- **Granularity**: a change requested at t takes effect at the next instant of the coarser granularity
  (§2.4.3: refining "only at time instants belonging to the coarser granularity", so rounding keeps the
  output ordered). Here the rule applies to coarsening too, and for two granularities neither of which
  divides the other it takes the next instant common to both (the least common multiple), so an
  aggregation's windows switch grids at an instant of both grids (:func:`granularity_effective_at`).

For a pair of elements of an interval join, the window of the *earlier* element decides (PIPES §2.4.1:
the later element must start within the earlier one's validity): left ``l`` and right ``r`` match when
``b.lower <= r.t - l.t <= b.upper`` with ``b`` the bounds at ``min(l.t, r.t)`` (the left row's on a tie);
for ``lower <= 0 <= upper`` that is ``0 <= r.t - l.t <= upper(l.t)`` or ``0 < l.t - r.t <= -lower(r.t)``.

Times are integers (µs since the epoch in the control table); ``None`` as the time of a schedule's first
point means "since always".
"""
from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _human

__all__ = ["Schedule", "Transition", "granularity_effective_at", "WINDOW_LIKE"]

#: Parameters whose change applies by element timestamp, with the §4.2 adaptation delays.
WINDOW_LIKE = ("window", "lower", "upper")
_PARAMS = WINDOW_LIKE + ("granularity",)


def _int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer (µs), got {value!r}")
    return int(value)


def granularity_effective_at(t: int, old: int, new: int) -> int:
    """The instant a granularity change from ``old`` to ``new`` requested at ``t`` takes effect.

    The smallest instant ``>= t`` that belongs to both granularities (Cammert et al., §2.1: a
    granularity G with distance g holds the multiples of g, 0 ∈ G): for a refinement (``new`` divides
    ``old``) the next instant of the coarser granularity, as §2.4.3 requires.

    Parameters
    ----------
    t : int
        Requested time (µs).
    old, new : int
        Granularity distances (µs, > 0).
    """
    t = _int(t, "t")
    old, new = _int(old, "old"), _int(new, "new")
    if old <= 0 or new <= 0:
        raise ValueError(f"old and new must be positive granularities (µs), got old={old}, new={new}")
    step = math.lcm(old, new)
    return -(-t // step) * step


@dataclass(frozen=True)
class Transition:
    """One change of a transition parameter and when its effect shows (Cammert et al., §4.2).

    Attributes
    ----------
    param : str
    at : int
        Application time from which new elements get ``new``.
    old, new : int
    effect_start, effect_complete : int or None
        For window-like parameters ``at + min(|old|, |new|)`` and ``at + max(|old|, |new|)`` (the sizes
        of the windows; a join bound's window is its absolute value); None for a granularity, whose
        effect on an aggregation depends on the input (:func:`pyspark_cq.cost.pipes.granularity_change_delay`).
    """

    param: str
    at: int
    old: int
    new: int
    effect_start: int | None
    effect_complete: int | None

    def progress(self, tau) -> float | np.ndarray:
        """Share of the change's effect on the state achieved at time ``tau`` (0 before ``effect_start``,
        1 from ``effect_complete`` on, linear in between; vectorised over ``tau``).

        For a stream with a constant rate the number of valid elements at ``tau`` is
        ``old_size + progress(tau)·(new_size − old_size)`` (up to one element at the boundaries): an
        element at ``s < at`` stays until ``s + old``, one at ``s >= at`` until ``s + new``.
        """
        if self.effect_start is None:
            raise ValueError(f"progress is defined for window-like parameters {WINDOW_LIKE}, not {self.param!r}")
        span = self.effect_complete - self.effect_start
        tau = np.asarray(tau, dtype=np.float64)
        if span == 0:
            out = (tau >= self.effect_start).astype(np.float64)
        else:
            out = np.clip((tau - self.effect_start) / span, 0.0, 1.0)
        return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Schedule:
    """The history of one transition parameter: ``(at, value)`` points with ascending ``at``.

    The first point's ``at`` may be None ("since always"). An element with timestamp ``ts`` gets the value
    of the last point with ``at <= ts`` (timestamps before the first point get the first value).
    """

    param: str
    points: tuple

    def __post_init__(self):
        if self.param not in _PARAMS:
            raise ValueError(f"param must be one of {_PARAMS}, got {self.param!r}")
        if isinstance(self.points, (str, bytes)) or not isinstance(self.points, Iterable):
            raise TypeError(f"points must be a sequence of (at, value) pairs, got {self.points!r}")
        pts = []
        for i, point in enumerate(self.points):
            if not isinstance(point, Sequence) or len(point) != 2:
                raise TypeError(f"points[{i}] must be an (at, value) pair, got {point!r}")
            at, value = point
            if at is None:
                if i != 0:
                    raise ValueError(f"points[{i}]: only the first point may have at=None")
            else:
                at = _int(at, f"points[{i}] at")
            pts.append((at, _int(value, f"points[{i}] value")))
        if not pts:
            raise ValueError("points must hold at least one (at, value) pair")
        times = [p[0] for p in pts if p[0] is not None]
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError(f"points must have non-decreasing times, got {times}")
        object.__setattr__(self, "points", tuple(pts))

    def __repr__(self) -> str:
        # for people: values as durations, times as UTC event times (the points themselves stay µs)
        def at(t):
            return "" if t is None else " from " + np.datetime_as_string(np.datetime64(t, "us"), unit="auto")
        return f"Schedule({self.param}: {'; '.join(_human.duration(v) + at(t) for t, v in self.points)})"

    @classmethod
    def constant(cls, param: str, value: int) -> Schedule:
        """A schedule that never changed."""
        return cls(param, ((None, value),))

    @property
    def _times(self) -> list[int]:
        first = self.points[0][0]
        return [(-(2**63) if first is None else first)] + [p[0] for p in self.points[1:]]

    @property
    def latest(self) -> int:
        """The most recently requested value (it may not be in force yet)."""
        return self.points[-1][1]

    def value_at(self, ts: int) -> int:
        """The value that applies to an element with timestamp ``ts`` (new elements only, §4.2)."""
        ts = _int(ts, "ts")
        i = bisect.bisect_right(self._times, ts) - 1
        return self.points[max(i, 0)][1]

    def values_at(self, ts) -> np.ndarray:
        """:meth:`value_at` for an integer array of timestamps (int64 in, int64 out)."""
        arr = np.asarray(ts)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"ts must be an integer array of timestamps (µs), got dtype {arr.dtype}")
        times = np.asarray(self._times, dtype=np.int64)
        values = np.asarray([p[1] for p in self.points], dtype=np.int64)
        idx = np.searchsorted(times, arr.astype(np.int64, copy=False), side="right") - 1
        return values[np.maximum(idx, 0)]

    def transitions(self) -> list[Transition]:
        """The changes, each with its effect window (PIPES §4.2)."""
        from ..cost.pipes import window_change_delay

        out = []
        for (_, old), (at, new) in zip(self.points, self.points[1:]):
            if self.param == "granularity":
                out.append(Transition(self.param, at, old, new, None, None))
            else:
                start, complete = window_change_delay(at, abs(old), abs(new))
                out.append(Transition(self.param, at, old, new, int(start), int(complete)))
        return out

    def with_change(self, at: int, value: int, *, keep: int = 32) -> Schedule:
        """A new schedule with ``value`` from ``at`` on.

        ``at`` earlier than the last point is moved to it (the past of a pending change is not
        rewritten); at the same instant the last value is replaced; a change back to the value before
        it cancels the pending point. For a granularity, ``at`` is first moved to
        :func:`granularity_effective_at`. At most ``keep`` points are kept (the oldest are dropped).
        """
        at, value = _int(at, "at"), _int(value, "value")
        keep = _int(keep, "keep")
        if keep < 2:
            raise ValueError(f"keep must be >= 2, got {keep}")
        pts = list(self.points)
        last_at, last_value = pts[-1]
        if self.param == "granularity":
            at = granularity_effective_at(at, last_value, value)
        if last_at is not None and at < last_at:
            at = last_at
        if last_at is not None and at == last_at:
            pts.pop()
            if pts and pts[-1][1] == value:
                return Schedule(self.param, tuple(pts))
            if not pts:
                return Schedule(self.param, ((at, value),))
        elif value == last_value:
            return self
        pts.append((at, value))
        if len(pts) > keep:
            pts = pts[-keep:]
        return Schedule(self.param, tuple(pts))

    def to_list(self) -> list[list]:
        """A JSON-able form: ``[[at or None, value], ...]``."""
        return [[at, value] for at, value in self.points]
