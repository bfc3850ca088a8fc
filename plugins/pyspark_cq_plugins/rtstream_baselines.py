"""The baselines of RTStream's evaluation (Wei, Prasad, Son & Stankovic, §5.2.3) as policies.

- **Best effort** (``rtstream_best_effort``): drops no input; a periodic query's instances run to the end
  whatever their deadlines.
- **Feedback control** (``rtstream_feedback``): the drop ratio follows the deadline misses after they
  happen ("the output query miss ratios are fed back to control the incoming data streams"): after every
  instance, ``drop += gain · lateness / D`` (lateness > 0 is a miss; an early instance lowers the drop),
  within [0, ``max_drop``]. Unlike the prediction-based policy it reacts only to instances that already
  missed or finished early.

Both act on the query's shedding operator (:func:`pyspark_cq.policies.shedding_operator`).
"""
from __future__ import annotations

from pyspark_cq.policies import Decisions, Policy, Snapshot, drop_decision, shedding_operator, written_drop_ratio

__all__ = ["BestEffort", "FeedbackControl"]


class BestEffort(Policy):
    """No load shedding (§5.2.3): resets every periodic query's shedding operator to ``drop_ratio = 0``."""

    name = "rtstream_best_effort"

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Set ``drop_ratio = 0`` where it is not."""
        self._check(snapshot)
        out = []
        for q in snapshot.queries.values():
            op = shedding_operator(q) if q.period is not None else None
            d = drop_decision(q, op, 1.0, "best effort: drop nothing", self.name) if op else None
            if d is not None:
                out.append(d)
        return Decisions(out, self.name)


class FeedbackControl(Policy):
    """Drop ratio from the last instance's lateness (§5.2.3's feedback baseline).

    Parameters
    ----------
    gain : float
        Change of the drop ratio per deadline of lateness, > 0.
    max_drop : float
        The largest drop ratio, in [0, 1).
    """

    name = "rtstream_feedback"

    def __init__(self, gain: float = 0.5, max_drop: float = 0.95):
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not gain > 0:
            raise ValueError(f"gain must be a positive number, got {gain!r}")
        if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0 <= max_drop < 1:
            raise ValueError(f"max_drop must be in [0, 1), got {max_drop!r}")
        self.gain, self.max_drop = gain, max_drop
        self._seen: dict[str, int] = {}

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Move each periodic query's drop ratio by ``gain`` times its newest instance's lateness over D."""
        self._check(snapshot)
        out = []
        for q in snapshot.queries.values():
            op = shedding_operator(q) if q.period is not None else None
            if op is None or not q.instances or q.instances[-1].batch <= self._seen.get(q.name, -1):
                continue
            last = q.instances[-1]
            self._seen[q.name] = last.batch
            drop = written_drop_ratio(q, op)
            drop = min(max(drop + self.gain * last.lateness / q.deadline, 0.0), self.max_drop)
            d = drop_decision(q, op, 1.0 - drop, f"feedback: instance {last.batch} lateness "
                                                  f"{last.lateness:+.3g} s", self.name)
            if d is not None:
                out.append(d)
        return Decisions(out, self.name)

    def remove(self, query: str) -> Decisions:
        """Forget the query's last instance."""
        super().remove(query)
        self._seen.pop(query, None)
        return Decisions((), self.name)
