"""The group's plan document: which queries a :class:`~pyspark_cq.QueryGroup` runs, shared by the driver, the
Spark workers and the micro-batch function through files under the group's checkpoint.

STREAM keeps the state of its queries in the system's own catalogue and lets queries be added, removed and
made inactive while others run (Motwani et al., §2.3, §3.2); here the catalogue is ``<checkpoint>/cq_group/``:

- ``plan.pkl``, the current :class:`Plan` (version, members, the largest event time seen), written
  atomically (a temporary file renamed over it), read by the workers at every micro-batch;
- ``pending/``, one file per change asked for while the group runs (:func:`ask`), applied by the micro-batch
  function between two micro-batches (:func:`take_pending`), so every task of one micro-batch sees one plan;
- ``stats.json``, the rows each query received and delivered (:class:`~.api.QueryGroup.queries`).

Pure: no Spark. The files hold pickles written by the group itself (never read from elsewhere).
"""
from __future__ import annotations

import json
import os
import pickle
import time
import uuid
from dataclasses import dataclass, field, replace

__all__ = ["MemberSpec", "Plan", "group_dir", "read_plan", "write_plan", "ask", "take_pending", "read_stats",
           "write_stats"]

_PLAN, _PENDING, _STATS = "plan.pkl", "pending", "stats.json"
_cache: dict = {}


@dataclass(frozen=True)
class MemberSpec:
    """One query of the group as the workers and the micro-batch function run it.

    Attributes
    ----------
    key : str
        The query's state key: its name and a digest of its text (a query replaced under the same name
        starts afresh).
    name : str
        The query's name in the group.
    text : str
        Its CQL text.
    kind : {"shared", "join", "rows", "alone"}
        ``"shared"``: a windowed aggregation in its stream's shared stage; ``"join"``: a two-stream inner or outer join
        in a join class of the shared stage (``join``); ``"rows"``: a ROWS window in the shared stage
        (:mod:`.rows`); ``"alone"``: its own operators inside the group's Spark query.
    family : str or None
        The stream whose shared stage runs it (``"shared"``; ``"rows"``: the stream it reads).
    config : object
        Its :class:`~pyspark_cq.operators.aggregate.config.AggConfig` (``"shared"``), its
        :class:`~.rows.RowsMember` (``"rows"``).
    mask : str or None
        The projection column holding its WHERE (None: every row, or ``arrow_filter``).
    arrow_filter : object or None
        Its WHERE evaluated on the projection's Arrow batches (:mod:`.predicates`): a query that joined a running
        group with a predicate the running projection does not compute.
    columns : tuple of (str, str)
        The slicer's input columns as ``(slicer name, projection column)``.
    select : tuple of (str, str)
        The shared stage's output columns for it as ``(name, aggregation output column)``, then ``cq_at``.
    at : tuple of (str, int)
        ``cq_at`` as ``(aggregation output column, µs added)``: the window's end for RSTREAM, a change's
        start / end plus the slide for ISTREAM / DSTREAM (docs/cql.md).
    finish : tuple or None
        For a query whose HAVING or select list computes: ``(having, ((expression, name), ...))`` as Spark SQL
        over the shared stage's rows, applied by the micro-batch function; None: the stage's rows are its rows.
    stage_schema : pyarrow.Schema or None
        The Arrow schema of the shared stage's rows for it (None: ``arrow_schema``).
    arrow_schema : pyarrow.Schema
        The Arrow schema of its rows (as :func:`pyspark_cq.cql` gives them).
    sink : str or bytes
        A directory, or a pickled callable ``f(df, batch_id)``.
    start_us : int or None
        Event time (µs) from which it counts rows: the start of the first window after the event times seen
        when it joined a running group; None: from the group's start.
    active : bool
        False while paused: no rows are processed or delivered.
    replan : dict or None
        What set its window when a re-plan changed it (``QueryGroup.set_window``), else None; kept with the plan
        so that a restart goes on with the window.
    join : JoinMember or None
        ``kind == "join"``: its streams, keys, windows and names (:class:`~.joins.JoinMember`).
    clock : str or None
        ``"shared"`` with a WHERE that holds predicates not naming the time column: the clock its watermark comes
        from (:func:`~.clock.filtered`: Spark pushes those predicates below ``withWatermark``, so the query alone
        computes its watermark from the rows that pass them); None: its stream's.
    clock_mask : str or None
        The projection column holding those predicates (None: none, or ``clock_filter``).
    clock_filter : object or None
        Those predicates on the projection's Arrow batches (:mod:`.predicates`), for a query that joined a running
        group whose projection lacks them.
    post : JoinAggregate or None
        ``kind == "join"`` of an aggregate over the join: its aggregation over the pairs, run by the micro-batch
        function (:mod:`.post`); its ``finish`` then reads the aggregation's rows.
    """

    key: str
    name: str
    text: str
    kind: str
    sink: object
    arrow_schema: object
    family: str | None = None
    config: object = None
    mask: str | None = None
    arrow_filter: object = None
    columns: tuple = ()
    select: tuple = ()
    at: tuple = ()
    finish: tuple | None = None
    stage_schema: object = None
    start_us: int | None = None
    active: bool = True
    #: a class attribute too, so plans pickled before it read None
    replan: dict | None = None
    #: ``kind == "join"``: its :class:`~.joins.JoinMember` (a member of a join class of the shared stage)
    join: object = None
    #: class attributes too, so plans pickled before them read None (their stream's watermark)
    clock: str | None = None
    clock_mask: str | None = None
    clock_filter: object = None
    post: object = None


@dataclass(frozen=True)
class Plan:
    """A version of the group's plan: its members by key, the projection columns of each shared stage, the
    largest event time (µs) the group has seen (None before the first micro-batch), with several streams in
    the shared stage each stream's largest event times by micro-batch, and the bound of its slice classes across
    granularities.
    """

    version: int = 0
    members: dict = field(default_factory=dict)
    catalogue: dict = field(default_factory=dict)  # family -> {expression text: projection column}
    max_time: int | None = None
    #: several streams in the shared stage: ``((batch id, {stream: largest event time ms}), ...)`` (:mod:`.clock`);
    #: a class attribute, so plans pickled before it read ``()``
    clocks: tuple = ()
    #: slice classes across granularities (:func:`pyspark_cq.cost.groups.granularity_classes`): the bound on the
    #: coarsest / finest slice length of a class; fixed when the group first starts on its checkpoint. A class
    #: attribute, so plans pickled before classes spanned granularities read 1 (equal granularities only) and
    #: keep the slice tables their shards hold
    granularity_ratio: int = 1

    def with_members(self, members: dict, **changes) -> Plan:
        """The next version with ``members``."""
        return replace(self, version=self.version + 1, members=members, **changes)

    def by_name(self, name: str) -> MemberSpec | None:
        """The member called ``name``, or None."""
        return next((m for m in self.members.values() if m.name == name), None)


def group_dir(checkpoint: str) -> str:
    """The directory of the group's own files under ``checkpoint``."""
    return os.path.join(checkpoint, "cq_group")


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_plan(directory: str) -> Plan | None:
    """The current plan under ``directory`` (cached per process while the file is unchanged), or None."""
    path = os.path.join(directory, _PLAN)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _cache.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    with open(path, "rb") as f:
        plan = pickle.load(f)
    _cache[path] = (stamp, plan)
    return plan


def write_plan(directory: str, plan: Plan) -> None:
    """Write ``plan`` as the current one (atomically)."""
    os.makedirs(directory, exist_ok=True)
    _atomic_write(os.path.join(directory, _PLAN), pickle.dumps(plan))


def ask(directory: str, change: tuple) -> None:
    """Queue ``change`` (``("add", MemberSpec)``, ``("remove", name)``, ``("pause", name)``,
    ``("resume", name)``, ``("window", name, µs[, replan])``) for the next micro-batch boundary.
    """
    pending = os.path.join(directory, _PENDING)
    os.makedirs(pending, exist_ok=True)
    _atomic_write(os.path.join(pending, f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.pkl"), pickle.dumps(change))


def pending_changes(directory: str) -> list[tuple[str, tuple]]:
    """The queued changes in the order they were asked for, as ``(file, change)``."""
    pending = os.path.join(directory, _PENDING)
    try:
        names = sorted(n for n in os.listdir(pending) if n.endswith(".pkl"))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        with open(os.path.join(pending, n), "rb") as f:
            out.append((os.path.join(pending, n), pickle.load(f)))
    return out


def take_pending(directory: str) -> list[tuple]:
    """Remove and return the queued changes, oldest first."""
    changes = pending_changes(directory)
    for path, _ in changes:
        os.remove(path)
    return [c for _, c in changes]


def read_stats(directory: str) -> dict:
    """The per-query counters the micro-batch function keeps (``{}`` before the first micro-batch)."""
    try:
        with open(os.path.join(directory, _STATS)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def write_stats(directory: str, stats: dict) -> None:
    """Replace the per-query counters (atomically)."""
    _atomic_write(os.path.join(directory, _STATS), json.dumps(stats, sort_keys=True).encode())
