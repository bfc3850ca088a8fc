"""The control table: versioned per-operator parameters that running operators read at every micro-batch.

STREAM gives every entity "a table of attribute-value pairs called its Control Table", updated to
"dynamically control the behavior of an entity" (Motwani et al., §6.1). Here the control table is a small
JSON document: one entry per operator id with its window / join bounds, granularity, drop ratio, plan id
and free-form params (:mod:`pyspark_cq.control.schema` defines and validates them). Users and policies
change entries on the driver through :class:`ControlTable`; every change is validated, versioned and
logged (time, who, reason, old and new values) in an append-only change log. Operators read entries
through :mod:`pyspark_cq.control.reader`.

This module imports no Spark (a Hadoop store reaches the JVM through the SparkSession it is given).
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .. import _human
from ._stores import ArrowStore, HadoopStore, LocalStore, is_local
from .decision import Decision, Decisions
from .reader import FORMAT, FORMAT_VERSION, ControlHandle, Entry, parse_document
from .schedule import Schedule
from .schema import PARAMETERS, TRANSITION_PARAMETERS, duration_value, validate_changes, validate_operator_id

__all__ = ["ControlTable", "Change", "HISTORY"]

#: Points kept per transition parameter (older changes no live element can still refer to are dropped).
HISTORY = 32


def _empty_document() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "version": 0, "updated": None, "operators": {}}


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


def _has_jvm(spark) -> bool:
    """Whether ``spark`` is a classic SparkSession (a Spark Connect client has no ``sparkContext``)."""
    try:
        return spark is not None and spark.sparkContext._jvm is not None
    except Exception:
        return False


def _wall_clock_us(operator: str) -> int:
    return time.time_ns() // 1000


class ControlTable:
    """The driver-side handle of a control table: register, change and inspect entries.

    Parameters
    ----------
    path : str
        Where the document lives: a local path, or a URI. A local path is written with temp file + rename.
        With ``spark`` a classic SparkSession, a non-local URI is written through Hadoop's FileSystem in the
        driver's JVM; otherwise (no session, or Spark Connect) through ``pyarrow.fs``. Workers read it with
        :func:`entry`.
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
            # a Spark Connect session has no JVM in this process: its table goes through pyarrow.fs
            backend = "local" if is_local(path) else ("hadoop" if _has_jvm(spark) else "arrow")
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
        return _empty_document() if data is None else parse_document(data, repr(self.path))

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

    @property
    def uri(self) -> str:
        """The table's location as its handles name it (``ControlHandle.path``)."""
        return self._store.uri

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
        # durations in human units (30 s, 5 min); the table itself holds µs
        cells = [[_human.duration(r[c]) if c in TRANSITION_PARAMETERS and c in r else str(r.get(c, ""))
                  for c in cols] for r in rows]
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
            Initial parameters (see :mod:`pyspark_cq.control.schema`).
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
