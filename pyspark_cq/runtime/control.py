"""The control table: versioned per-operator parameters that running operators read at every micro-batch.

STREAM gives every entity "a table of attribute-value pairs called its Control Table", updated to
"dynamically control the behavior of an entity" (Motwani et al., §6.1). Here the control table is a small
JSON document: one entry per operator id with its window / join bounds, granularity, drop ratio, plan id
and free-form params (:mod:`pyspark_cq.policies.decisions` defines and validates them). Users and
policies change entries on the driver through :class:`ControlTable`; every change is validated, versioned
and logged (time, who, reason, old and new values) in an append-only change log.

Operators read it on the workers, cheaply, through :func:`entry` or a picklable :class:`ControlHandle`:
the document is parsed only when the file changed (cached by its stamp: inode, mtime and size locally,
mtime and size on other filesystems). Window, bound and granularity changes carry the application time
from which they apply; :class:`Entry` answers which value applies to an element (PIPES §4.2, see
:mod:`pyspark_cq.runtime.transitions`).

Operator contract (what a pyspark-cq operator calls in its micro-batch function)::

    from pyspark_cq.runtime import control

    handle = control.ControlHandle(path, "join1")      # built on the driver, captured by the closure
    def per_batch(batches):                            # runs on a worker
        e = handle.entry()                             # None: no entry, use the operator's arguments
        upper = e.values_at("upper", ts) if e else ... # per-element bound (new elements only)
        g = e.value_at("granularity", t) if e else ... # granularity for elements at t
        ratio = e.get("drop_ratio", 0.0) if e else 0.0

This module imports no Spark: only the standard library, numpy and pyarrow (for non-local paths).
"""
from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..policies.decisions import (PARAMETERS, TRANSITION_PARAMETERS, Decision, Decisions, duration_value,
                                  validate_changes, validate_operator_id)
from ._stores import ArrowStore, HadoopStore, LocalStore, is_local, reader_store
from .transitions import Schedule, Transition, granularity_effective_at

__all__ = ["ControlTable", "Entry", "Change", "ControlHandle", "entry", "read_table", "clear_cache",
           "Schedule", "Transition", "granularity_effective_at", "FORMAT"]

FORMAT = "pyspark-cq/control-table"
FORMAT_VERSION = 1
#: Points kept per transition parameter (older changes no live element can still refer to are dropped).
HISTORY = 32


def _empty_document() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "version": 0, "updated": None, "operators": {}}


def _parse(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"control table {where} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{where} is not a pyspark-cq control table (it lacks format {FORMAT!r})")
    if doc.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"control table {where} has format version {doc['format_version']}; this pyspark-cq "
                         f"reads up to {FORMAT_VERSION} (upgrade pyspark-cq)")
    return doc


# ---------------------------------------------------------------------------------------------
# read side: entries and the cached reader


@dataclass(frozen=True)
class Entry:
    """One operator's entry, as read (immutable).

    Attributes
    ----------
    operator : str
    version : int
        The entry's version (1 when registered, +1 per change).
    table_version : int
        The table's version when read.
    query : str or None
    params : dict
        Current parameter values; for window / bound / granularity the latest requested value, which
        may apply only from a future instant — use :meth:`value_at` / :meth:`values_at` per element.
    history : dict
        param -> :class:`Schedule` for the transition parameters that are set.
    """

    operator: str
    version: int
    table_version: int
    query: str | None
    params: Mapping
    history: Mapping = field(default_factory=dict)

    @classmethod
    def _from_doc(cls, operator: str, raw: Mapping, table_version: int) -> "Entry":
        history = {p: Schedule(p, tuple(tuple(pt) for pt in pts)) for p, pts in raw.get("history", {}).items()}
        return cls(operator, int(raw["version"]), table_version, raw.get("query"), dict(raw["params"]), history)

    def get(self, param: str, default=None):
        """The current value of ``param`` (see the note on transition parameters), or ``default``."""
        if param not in PARAMETERS:
            raise ValueError(f"param must be one of {PARAMETERS}, got {param!r}")
        return self.params.get(param, default)

    def schedule(self, param: str) -> Schedule | None:
        """The change history of a transition parameter, or None when it is not set."""
        if param not in TRANSITION_PARAMETERS:
            raise ValueError(f"param must be one of {TRANSITION_PARAMETERS}, got {param!r}")
        return self.history.get(param)

    def value_at(self, param: str, ts: int, default=None):
        """The value of ``param`` that applies to an element with timestamp ``ts`` (µs), PIPES §4.2."""
        sched = self.schedule(param)
        return default if sched is None else sched.value_at(ts)

    def values_at(self, param: str, ts, default=None) -> np.ndarray | None:
        """:meth:`value_at` for an int64 array of timestamps; ``default`` broadcast when unset (None stays None)."""
        sched = self.schedule(param)
        if sched is not None:
            return sched.values_at(ts)
        if default is None:
            return None
        return np.full(np.shape(ts), default, dtype=np.int64)

    def transitions(self, param: str) -> list[Transition]:
        """The changes of ``param`` with their effect windows (PIPES §4.2)."""
        sched = self.schedule(param)
        return [] if sched is None else sched.transitions()


_CACHE: dict[str, tuple] = {}   # uri -> (stamp, document, checked_at)
_CACHE_LOCK = threading.Lock()
_STORES: dict[str, object] = {}


def clear_cache() -> None:
    """Forget cached documents (tests; a worker never needs it)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _STORES.clear()


def read_table(path: str, *, max_age: float = 0.0) -> dict | None:
    """The control-table document at ``path`` (parsed only when it changed), or None if it does not exist.

    Parameters
    ----------
    path : str
        A local path or a ``pyarrow.fs`` URI (workers have no JVM, so HDFS needs libhdfs there).
    max_age : float
        Seconds during which a cached document is returned without even checking the file's stamp
        (0: check at every call; a stat locally, a metadata request on object stores).
    """
    if not isinstance(path, str) or not path:
        raise TypeError(f"path must be a control-table path or URI (str), got {path!r}")
    if isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or max_age < 0:
        raise ValueError(f"max_age must be a number of seconds >= 0, got {max_age!r}")
    now = time.monotonic()
    with _CACHE_LOCK:
        cached = _CACHE.get(path)
        store = _STORES.get(path)
        if store is None:
            store = _STORES[path] = reader_store(path)
    if cached is not None and max_age and now - cached[2] < max_age:
        return cached[1]
    stamp = store.stamp()
    if stamp is None:
        return None
    if cached is not None and cached[0] == stamp:
        with _CACHE_LOCK:
            _CACHE[path] = (stamp, cached[1], now)
        return cached[1]
    data = store.read()
    if data is None:
        return None
    doc = _parse(data, repr(path))
    with _CACHE_LOCK:
        _CACHE[path] = (stamp, doc, now)
    return doc


def entry(path: str, operator: str, *, max_age: float = 0.0) -> Entry | None:
    """The entry of ``operator`` in the control table at ``path``, or None (no table or no entry).

    This is what operators call at every micro-batch; see :func:`read_table` for caching.
    """
    validate_operator_id(operator)
    doc = read_table(path, max_age=max_age)
    if doc is None:
        return None
    raw = doc["operators"].get(operator)
    return None if raw is None else Entry._from_doc(operator, raw, int(doc["version"]))


@dataclass(frozen=True)
class ControlHandle:
    """A picklable pointer to one operator's entry, captured by an operator's worker-side function."""

    path: str
    operator: str
    max_age: float = 0.0

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path:
            raise TypeError(f"path must be a control-table path or URI (str), got {self.path!r}")
        validate_operator_id(self.operator)

    def entry(self) -> Entry | None:
        """The current entry (None if the table or the entry does not exist)."""
        return entry(self.path, self.operator, max_age=self.max_age)


# ---------------------------------------------------------------------------------------------
# write side


@dataclass(frozen=True)
class Change:
    """One logged change: table version, time, operator, action, who, reason, old and new values."""

    version: int
    time: str
    operator: str
    action: str
    who: str
    reason: str
    old: Mapping
    new: Mapping
    at: Mapping
    query: str | None = None

    def to_dict(self) -> dict:
        """A JSON-able form."""
        return {"version": self.version, "time": self.time, "operator": self.operator, "action": self.action,
                "who": self.who, "reason": self.reason, "old": dict(self.old), "new": dict(self.new),
                "at": dict(self.at), "query": self.query}


def _wall_clock_us(operator: str) -> int:
    return time.time_ns() // 1000


class ControlTable:
    """The driver-side handle of a control table: register, change and inspect entries.

    Parameters
    ----------
    path : str
        Where the document lives: a local path, or a URI. A local path is written with temp file + rename.
        With ``spark`` (a classic SparkSession) a non-local URI is written through Hadoop's FileSystem in the
        driver's JVM; otherwise through ``pyarrow.fs``. Workers read it with :func:`entry`.
    spark : SparkSession, optional
        For non-local URIs (see above).
    clock : callable, optional
        ``clock(operator) -> int``: the application time (µs) at which a change without an explicit ``at``
        applies to new elements. Default: wall-clock time; the runtime passes one that looks ahead of the
        query's latest event time.
    backend : {"auto", "local", "hadoop", "arrow"}
        Force a store (``"hadoop"`` needs ``spark``).

    Notes
    -----
    One writer process at a time is assumed per table (the driver); writers in one process are
    serialised, and local writers in several processes lock ``<path>.lock``.
    """

    def __init__(self, path: str, *, spark=None, clock: Callable[[str], int] | None = None, backend: str = "auto"):
        if not isinstance(path, str) or not path:
            raise TypeError(f"path must be a control-table path or URI (str), got {path!r}")
        if backend not in ("auto", "local", "hadoop", "arrow"):
            raise ValueError(f"backend must be one of 'auto', 'local', 'hadoop', 'arrow'; got {backend!r}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable(operator) -> int µs, got {clock!r}")
        if backend == "auto":
            backend = "local" if is_local(path) else ("hadoop" if spark is not None else "arrow")
        if backend == "local":
            if not is_local(path):
                raise ValueError(f"backend 'local' needs a local path, got {path!r}")
            self._store = LocalStore(path)
        elif backend == "hadoop":
            if spark is None:
                raise ValueError("backend 'hadoop' needs spark (a classic SparkSession)")
            self._store = HadoopStore(path, spark)
        else:
            self._store = ArrowStore(path)
        self.path = path
        self.backend = backend
        self.clock = clock or _wall_clock_us
        with self._store.lock():
            if self._store.stamp() is None:
                self._write(_empty_document(), [])

    # -- reading ---------------------------------------------------------------------------------

    def _read(self) -> dict:
        data = self._store.read()
        return _empty_document() if data is None else _parse(data, repr(self.path))

    @property
    def version(self) -> int:
        """The table's version (number of changes so far)."""
        return int(self._read()["version"])

    def entries(self) -> dict[str, Entry]:
        """All entries, by operator id."""
        doc = self._read()
        return {op: Entry._from_doc(op, raw, int(doc["version"])) for op, raw in sorted(doc["operators"].items())}

    def entry(self, operator: str) -> Entry:
        """The entry of ``operator``; KeyError naming the known operators if there is none."""
        validate_operator_id(operator)
        doc = self._read()
        if operator not in doc["operators"]:
            raise KeyError(f"control table has no entry {operator!r}; entries: {sorted(doc['operators'])}")
        return Entry._from_doc(operator, doc["operators"][operator], int(doc["version"]))

    def __contains__(self, operator) -> bool:
        return isinstance(operator, str) and operator in self._read()["operators"]

    def handle(self, operator: str, *, max_age: float = 0.0) -> ControlHandle:
        """A picklable handle for operators (their worker-side reader)."""
        validate_operator_id(operator)
        return ControlHandle(self._store.uri, operator, max_age)

    def changes(self, operator: str | None = None) -> list[Change]:
        """The change log, oldest first (optionally of one operator)."""
        if operator is not None:
            validate_operator_id(operator)
        out = []
        for line in self._store.read_log():
            rec = json.loads(line.decode("utf-8"))
            if operator is None or rec["operator"] == operator:
                out.append(Change(**rec))
        return out

    def to_records(self) -> list[dict]:
        """One flat dict per entry: operator, query, version and the current parameters."""
        rows = []
        for op, e in self.entries().items():
            row = {"operator": op, "query": e.query, "version": e.version}
            for p in PARAMETERS:
                if p in e.params:
                    row[p] = e.params[p]
            rows.append(row)
        return rows

    def to_pandas(self):
        """The entries as a pandas DataFrame (one row per operator)."""
        import pandas as pd

        return pd.DataFrame(self.to_records())

    def __repr__(self) -> str:
        rows = self.to_records()
        head = f"ControlTable({self.path!r}, version={self.version}, {len(rows)} entries)"
        if not rows:
            return head
        cols = ["operator", "query", "version"] + [p for p in PARAMETERS if any(p in r for r in rows)]
        cells = [[str(r.get(c, "")) for c in cols] for r in rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return head + "\n" + "\n".join(lines)

    # -- writing ---------------------------------------------------------------------------------

    def _write(self, doc: dict, records: list[dict]) -> None:
        self._store.write_atomic(json.dumps(doc, sort_keys=True, indent=1).encode("utf-8"))
        for rec in records:
            self._store.append_log(rec["version"], json.dumps(rec, sort_keys=True).encode("utf-8"))

    @staticmethod
    def _who_reason(who, reason) -> tuple[str, str]:
        if not isinstance(who, str) or not who:
            raise TypeError(f"who must be a non-empty str (a user or policy name), got {who!r}")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {reason!r}")
        return who, reason

    def _apply(self, doc: dict, operator: str, changes: dict, at: int | None, now: str, who: str, reason: str,
               action: str, query: str | None) -> dict | None:
        """Apply validated ``changes`` to ``doc`` in place; return the log record (None: nothing changed)."""
        ops = doc["operators"]
        raw = ops.get(operator)
        if raw is None:
            raw = {"version": 0, "query": query, "params": {}, "history": {}}
        params, history = dict(raw["params"]), {k: list(v) for k, v in raw.get("history", {}).items()}
        old, new, when = {}, {}, {}
        for param, value in changes.items():
            before = params.get(param)
            if param == "params":
                merged = dict(before or {})
                for key, item in value.items():
                    if item is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = item
                value = merged
            if before == value:
                continue
            if param in TRANSITION_PARAMETERS:
                if param in history and action != "register":
                    t = self.clock(operator) if at is None else at
                    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                        raise TypeError(f"clock({operator!r}) must return int µs, got {t!r}")
                    sched = Schedule(param, tuple(tuple(p) for p in history[param])).with_change(int(t), value,
                                                                                                   keep=HISTORY)
                    history[param] = sched.to_list()
                    when[param] = sched.points[-1][0] if sched.latest == value else None
                else:
                    history[param] = Schedule.constant(param, value).to_list()
            old[param], new[param] = before, value
            params[param] = value
        lower, upper = params.get("lower"), params.get("upper")
        if lower is not None and upper is not None and lower > upper:
            raise ValueError(f"control table entry {operator!r}: lower must be <= upper, got lower={lower} µs, "
                             f"upper={upper} µs")
        if not new and operator in ops:
            return None
        doc["version"] = int(doc["version"]) + 1
        ops[operator] = {"version": int(raw["version"]) + 1, "query": raw.get("query") if query is None else query,
                         "params": params, "history": history}
        doc["updated"] = now
        return {"version": doc["version"], "time": now, "operator": operator, "action": action, "who": who,
                "reason": reason, "old": old, "new": new, "at": when, "query": ops[operator]["query"]}

    def _mutate(self, items: Iterable[tuple], who: str, reason_default: str = "") -> list[Change]:
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
        with self._store.lock():
            doc = self._read()
            records = []
            for operator, changes, at, reason, action, query in items:
                if action == "set" and operator not in doc["operators"]:
                    raise KeyError(f"control table has no entry {operator!r} (register it first); "
                                   f"entries: {sorted(doc['operators'])}")
                rec = self._apply(doc, operator, changes, at, now, who, reason or reason_default, action, query)
                if rec is not None:
                    records.append(rec)
            if records:
                self._write(doc, records)
        return [Change(**r) for r in records]

    def register(self, operator: str, *, query: str | None = None, who: str = "runtime",
                 reason: str = "registered", **params) -> Entry:
        """Create the entry of ``operator`` with initial ``params`` (values since always), or return the
        existing one unchanged.

        Parameters
        ----------
        operator : str
            Operator id.
        query : str, optional
            The query it belongs to.
        who, reason : str
            Logged with the change.
        **params
            Initial parameters (see :mod:`pyspark_cq.policies.decisions`).
        """
        validate_operator_id(operator)
        if query is not None and not isinstance(query, str):
            raise TypeError(f"query must be a str or None, got {query!r}")
        who, reason = self._who_reason(who, reason)
        if operator in self:
            return self.entry(operator)
        changes = validate_changes(params, where=f"control table entry {operator!r}: ") if params else {}
        self._mutate([(operator, changes, None, reason, "register", query)], who)
        return self.entry(operator)

    def set(self, operator: str, *, reason: str, who: str = "user", at=None, **params) -> Entry:
        """Change parameters of an existing entry; validated, versioned and logged.

        Parameters
        ----------
        operator : str
            Operator id (must be registered).
        reason : str
            Why (logged).
        who : str
            Who changes it (logged): a user name or a policy name.
        at : int or duration, optional
            Application time (µs) from which window / bound / granularity changes apply to new elements
            (PIPES §4.2); default ``clock(operator)``. A granularity change is moved to the next instant of
            the coarser granularity (§2.4.3).
        **params
            New values.
        """
        validate_operator_id(operator)
        who, reason = self._who_reason(who, reason)
        changes = validate_changes(params, where=f"control table entry {operator!r}: ")
        if at is not None:
            at = duration_value(at, "at")
        self._mutate([(operator, changes, at, reason, "set", None)], who)
        return self.entry(operator)

    def apply(self, decisions: Decisions | Iterable[Decision], *, who: str | None = None) -> list[Change]:
        """Apply a policy's decisions in one write (all or nothing); returns the logged changes.

        ``who`` defaults to ``decisions.policy``. Decisions for unknown operators raise KeyError before
        anything is written.
        """
        if isinstance(decisions, Decision):
            decisions = [decisions]
        items = list(decisions)
        for i, d in enumerate(items):
            if not isinstance(d, Decision):
                raise TypeError(f"decisions[{i}] must be a Decision, got {type(d).__name__}")
        who = who or getattr(decisions, "policy", None) or "policy"
        who, _ = self._who_reason(who, "")
        return self._mutate([(d.operator, dict(d.changes), d.at, d.reason, "set", None) for d in items], who)

    def remove(self, operator: str, *, reason: str, who: str = "user") -> None:
        """Delete an entry (logged)."""
        validate_operator_id(operator)
        who, reason = self._who_reason(who, reason)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
        with self._store.lock():
            doc = self._read()
            if operator not in doc["operators"]:
                raise KeyError(f"control table has no entry {operator!r}; entries: {sorted(doc['operators'])}")
            raw = doc["operators"].pop(operator)
            doc["version"] = int(doc["version"]) + 1
            doc["updated"] = now
            rec = {"version": doc["version"], "time": now, "operator": operator, "action": "remove", "who": who,
                   "reason": reason, "old": raw["params"], "new": {}, "at": {}, "query": raw.get("query")}
            self._write(doc, [rec])
