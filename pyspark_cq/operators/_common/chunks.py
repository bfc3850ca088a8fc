"""Chunk scheduling in a worker: which step of a multi-step stage gets the next chunk (STREAM §5.3, Chain).

Motwani et al., "Query Processing, Approximation, and Resource Management in a DSMS" (STREAM), §5.3, and
Babcock, Babu, Datar & Motwani's Chain. A worker stage of several steps (``select_chain``'s predicates in
plan order, or one input's probe steps of a ``multi_join`` in its probe order) keeps one queue of Arrow
record batches in front of each step. At every scheduling step one
step takes up to ``chunk_rows`` rows from the head of its queue (pieces are concatenated, so a step
downstream of a selective one runs on full chunks) and puts what it outputs on the next queue; the last
step's output leaves the worker. Which step runs is the rule of
:func:`pyspark_cq.cost.chain.chooser` — the same code as the pure model :func:`~pyspark_cq.cost.chain.simulate`:
``"chain"`` (the highest Chain priority, :func:`pyspark_cq.cost.chain.priorities` of the measured cost per
row and selectivity, written by the ``chain`` policy), ``"fifo"``, ``"greedy"`` or ``"round_robin"``.

Arrivals are Spark's input batches of the partition, pulled from its iterator: a batch is read when the
first queue is empty and the rule would run the first step; batch ``k`` arrives at time ``k``, so with one
input batch the worker's sequence of steps is :func:`~pyspark_cq.cost.chain.simulate_trace`'s ``ran`` for
capacities ``chunk_rows`` (``tests/test_chain_scheduler.py``).

Memory bound. Rows that passed a step and wait for the next one are *buffered* (copies the filters made;
the first queue holds zero-copy slices of Spark's batch and is not counted). With ``max_buffered_rows``,
the first step does not run while the buffered rows reach the bound, so the steps downstream drain the
queues first: the peak stays below the bound plus one chunk of the first step's output. Without a bound
the backlog is unlimited and Chain, whose first step usually has the highest priority, would read the
whole partition before running the second step — operator-at-a-time memory. That is why Chain is the
default only under a bound.

Without any scheduling parameter the stage runs as before: every input batch through every step
(``fifo`` with unlimited chunks), i.e. operator-at-a-time within one Arrow batch.
"""
from __future__ import annotations

import math
import os
import resource
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ...cost.chain import STRATEGIES, chooser

__all__ = ["Schedule", "ChunkScheduler", "schedule_from_params", "PARAM_KEYS", "worker_rss"]

#: Keys of an entry's ``params`` the chunk scheduler reads (the ``chain`` policy writes them).
PARAM_KEYS = ("schedule", "chunk_rows", "max_buffered_rows", "priorities", "selectivities")
#: Rows per chunk when a strategy is set without ``chunk_rows``.
DEFAULT_CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class Schedule:
    """How a multi-step worker stage schedules its chunks.

    Attributes
    ----------
    strategy : str
        One of :data:`pyspark_cq.cost.chain.STRATEGIES`.
    chunk_rows : int or None
        Rows a step takes per scheduling step; None: whole batches (no chunking).
    max_buffered_rows : int or None
        Memory bound on the buffered intermediate rows; None: unbounded.
    priorities, selectivities : tuple of float or None
        Per step in plan order (Chain's priorities, greedy's selectivities); None: not known yet, the
        strategy then chooses as ``fifo``.
    """

    strategy: str = "fifo"
    chunk_rows: int | None = None
    max_buffered_rows: int | None = None
    priorities: tuple[float, ...] | None = None
    selectivities: tuple[float, ...] | None = None


#: The stage's behaviour without scheduling parameters: every input batch through every step.
WHOLE_BATCHES = Schedule()


def _count(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: params[{name!r}] must be an integer >= 1 (rows), got {value!r}")
    return value


def _per_step(value, name: str, order: Sequence[str], where: str) -> tuple[float, ...] | None:
    """``{step name: non-negative number}`` in ``order``; steps it does not name rank lowest (0)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: params[{name!r}] must be a mapping of predicate name -> number >= 0, "
                         f"got {value!r}")
    unknown = sorted(set(value) - set(order))
    if unknown:
        raise ValueError(f"{where}: params[{name!r}] names unknown predicates {unknown}; known: {list(order)}")
    out = []
    for step in order:
        v = value.get(step, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}: params[{name!r}][{step!r}] must be a finite number >= 0, got {v!r}")
        out.append(float(v))
    return tuple(out)


def schedule_from_params(params: Mapping | None, order: Sequence[str], *, where: str) -> Schedule:
    """The :class:`Schedule` an entry's free-form ``params`` ask for (keys :data:`PARAM_KEYS`).

    Parameters
    ----------
    params : mapping or None
        The entry's ``params`` (other keys are ignored).
    order : sequence of str
        The steps' names in plan order (``priorities`` / ``selectivities`` are keyed by them).
    where : str
        Names the operator (and micro-batch) in errors.

    Raises
    ------
    ValueError
        A bad value, naming the key and the expected form.
    """
    params = params or {}
    keys = [k for k in PARAM_KEYS if k in params]
    if not keys:
        return WHOLE_BATCHES
    bound = params.get("max_buffered_rows")
    bound = None if bound is None else _count(bound, "max_buffered_rows", where)
    strategy = params.get("schedule", "chain" if bound is not None else "fifo")
    if strategy not in STRATEGIES:
        raise ValueError(f"{where}: params['schedule'] must be one of {list(STRATEGIES)}, got {strategy!r}")
    chunk = params.get("chunk_rows", DEFAULT_CHUNK_ROWS)
    chunk = _count(chunk, "chunk_rows", where)
    return Schedule(strategy, chunk, bound, _per_step(params.get("priorities"), "priorities", order, where),
                    _per_step(params.get("selectivities"), "selectivities", order, where))


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def worker_rss() -> int:
    """The resident set size of this process in bytes (``/proc/self/statm``; elsewhere the lifetime maximum)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Queue:
    """A FIFO of ``[arrival, RecordBatch]`` pieces; ``size`` and ``oldest()`` are what the rule reads."""

    __slots__ = ("pieces", "size")

    def __init__(self):
        self.pieces: deque[list] = deque()
        self.size = 0

    def push(self, arrival: int, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.pieces.append([arrival, batch])
            self.size += batch.num_rows

    def oldest(self) -> int:
        return self.pieces[0][0]

    def take(self, rows: int | None) -> tuple[int, pa.RecordBatch]:
        """Up to ``rows`` rows from the head (all with None), as one batch, and their oldest arrival."""
        arrival, taken, n = self.pieces[0][0], [], 0
        while self.pieces and (rows is None or n < rows):
            piece = self.pieces[0]
            batch = piece[1]
            k = batch.num_rows if rows is None else min(rows - n, batch.num_rows)
            if k == batch.num_rows:
                self.pieces.popleft()
                taken.append(batch)
            else:
                taken.append(batch.slice(0, k))
                piece[1] = batch.slice(k)
            n += k
        self.size -= n
        return arrival, taken[0] if len(taken) == 1 else pa.concat_batches(taken)


class _Input:
    """The first queue as the rule sees it: empty while the bound holds input back, else its rows, or one
    pending read while Spark's iterator may hold more.
    """

    __slots__ = ("queue", "allowed", "exhausted", "next_arrival")

    def __init__(self):
        self.queue, self.allowed, self.exhausted, self.next_arrival = _Queue(), True, False, 0

    @property
    def size(self) -> int:
        if not self.allowed:
            return 0
        return self.queue.size or int(not self.exhausted)

    def oldest(self) -> int:
        return self.queue.oldest() if self.queue.size else self.next_arrival


class ChunkScheduler:
    """Run batches through ``steps`` under a :class:`Schedule`, tracking buffered rows and worker memory.

    Parameters
    ----------
    steps : sequence of callable
        ``step(RecordBatch) -> RecordBatch`` in plan order (a filter, or a join's probe step, which may also
        emit several rows per row: the bound then holds with one chunk's fan-out on top).
    schedule : Schedule
        Strategy, chunk size, memory bound, priorities.

    Attributes
    ----------
    peak_buffered : int
        After :meth:`run` is exhausted: largest number of buffered intermediate rows after any scheduling step.
    peak_rss : int
        Largest resident set size of the worker sampled after every scheduling step (bytes).
    steps_run : int
        Scheduling steps (step invocations).
    ran : list of int
        The step index of every scheduling step (kept only with ``trace=True``).
    """

    def __init__(self, steps: Sequence[Callable[[pa.RecordBatch], pa.RecordBatch]], schedule: Schedule,
                 *, trace: bool = False):
        if not steps:
            raise ValueError("steps must be a non-empty sequence of callables")
        self.steps, self.schedule = list(steps), schedule
        self.peak_buffered = self.peak_rss = self.steps_run = 0
        self.trace = trace
        self.ran: list[int] = []
        self.buffered_after: list[int] = []

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The last step's outputs (non-empty batches), in the order the schedule produces them."""
        s, m = self.schedule, len(self.steps)
        rule = chooser(s.strategy, priorities=s.priorities, selectivities=s.selectivities)
        first = _Input()
        queues: list = [first] + [_Queue() for _ in range(m - 1)]
        buffered = 0
        self.peak_rss = worker_rss()
        while True:
            # the first step may run unless the buffered rows reach the bound: then the steps downstream,
            # whose queues hold those rows, drain first (the bound is >= 1, so some queue holds rows)
            first.allowed = s.max_buffered_rows is None or buffered < s.max_buffered_rows
            i = rule(queues)
            if i is None:                           # every queue empty and no input left
                return
            if i == 0 and not first.queue.size:
                batch = next(batches, None)
                if batch is None:
                    first.exhausted = True
                    continue
                first.queue.push(first.next_arrival, batch)
                first.next_arrival += 1
                if not first.queue.size:
                    continue
            source = first.queue if i == 0 else queues[i]
            arrival, chunk = source.take(s.chunk_rows)
            if i:
                buffered -= chunk.num_rows
            out = self.steps[i](chunk)
            if i == m - 1:
                if out.num_rows:
                    yield out
            else:
                queues[i + 1].push(arrival, out)
                buffered += out.num_rows
            self.steps_run += 1
            self.peak_buffered = max(self.peak_buffered, buffered)
            self.peak_rss = max(self.peak_rss, worker_rss())
            if self.trace:
                self.ran.append(i)
                self.buffered_after.append(buffered)
