"""The worker-side reader of the control table: entries, the cached reader and the operators' handle.

Operators read the control table on Spark's workers, cheaply, through :func:`entry` or a picklable
:class:`ControlHandle`: the document is parsed only when the file changed (cached by its stamp: inode,
mtime and size locally, mtime and size on other filesystems). Window, bound and granularity changes carry
the application time from which they apply; :class:`Entry` answers which value applies to an element
(PIPES §4.2, see :mod:`pyspark_cq.control.schedule`).

Operator contract (what a pyspark-cq operator calls in its micro-batch function)::

    from pyspark_cq.control import operator_handle

    handle = operator_handle(control, "interval_join") # on the driver: checks the argument and the entry
    def per_batch(batches):                            # runs on a worker
        e = handle.entry()                             # None: no entry, use the operator's arguments
        upper = e.values_at("upper", ts) if e else ... # per-element bound (new elements only)
        g = e.value_at("granularity", t) if e else ... # granularity for elements at t
        ratio = e.get("drop_ratio", 0.0) if e else 0.0

This module imports no Spark: only the standard library, numpy and pyarrow (for non-local paths).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ._stores import reader_store
from .schedule import Schedule, Transition
from .schema import OPERATOR_PARAMETERS, PARAMETERS, TRANSITION_PARAMETERS, check_reads, validate_operator_id

__all__ = ["Entry", "ControlHandle", "operator_handle", "entry", "read_table", "clear_cache", "parse_document",
           "FORMAT", "FORMAT_VERSION"]

FORMAT = "pyspark-cq/control-table"
FORMAT_VERSION = 1


def parse_document(data: bytes, where: str) -> dict:
    """The control-table document in ``data`` (JSON), checked for its format; ``where`` names it in errors."""
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
    def _from_doc(cls, operator: str, raw: Mapping, table_version: int) -> Entry:
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


# (table uri, operator id) -> the kind of the operator defined on it in this (driver) process, recorded by
# ControlHandle.bind: the runtime refuses a change its operator would not read before it is written,
# instead of the query failing at its next micro-batch (the worker-side check, ControlHandle.entry).
_BOUND: dict[tuple[str, str], str] = {}


def bound_kind(path: str, operator: str) -> str | None:
    """The kind of the operator defined in this process on entry ``operator`` of the table at ``path``
    (None when no operator bound a handle to it here).
    """
    return _BOUND.get((path, operator))


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
    doc = parse_document(data, repr(path))
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
    """A picklable pointer to one operator's entry, captured by an operator's worker-side function.

    Parameters
    ----------
    path : str
        The control table's path or URI.
    operator : str
        The operator id (the entry's key).
    max_age : float
        See :func:`read_table`.
    kind : str, optional
        The pyspark-cq operator that reads the entry (a key of
        :data:`~pyspark_cq.control.schema.OPERATOR_PARAMETERS`); set by the operator through :meth:`bind`.
        With it, :meth:`entry` rejects an entry that sets a parameter the operator does not read.
    """

    path: str
    operator: str
    max_age: float = 0.0
    kind: str | None = None

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path:
            raise TypeError(f"path must be a control-table path or URI (str), got {self.path!r}")
        validate_operator_id(self.operator)
        if self.kind is not None and self.kind not in OPERATOR_PARAMETERS:
            raise ValueError(f"kind must be one of {sorted(OPERATOR_PARAMETERS)} or None, got {self.kind!r}")

    def bind(self, kind: str) -> ControlHandle:
        """A copy of this handle for an operator of ``kind``, its current entry checked now (on the driver).

        Raises ValueError naming the operator when the entry sets a parameter the operator does not read.
        """
        bound = replace(self, kind=kind)
        bound.entry(when="when the operator was defined")
        _BOUND[(self.path, self.operator)] = kind
        return bound

    def entry(self, *, when: str = "at a micro-batch") -> Entry | None:
        """The current entry (None if the table or the entry does not exist).

        With :attr:`kind` set, an entry that sets a parameter the operator does not read raises ValueError
        naming the operator, ``when`` saying where (so a query fails loudly rather than ignore a setting).
        """
        e = entry(self.path, self.operator, max_age=self.max_age)
        if e is not None and self.kind is not None:
            check_reads(self.kind, self.operator, e.params, when=when)
        return e


def operator_handle(control, kind: str) -> ControlHandle | None:
    """An operator's ``control=`` argument, checked and bound to the operator (``None`` stays None).

    Raises TypeError naming ``control`` when it is not a :class:`ControlHandle`, and ValueError naming the
    operator when its entry already sets a parameter an operator of ``kind`` does not read.
    """
    if control is None:
        return None
    if not isinstance(control, ControlHandle):
        raise TypeError(f"control must be a pyspark_cq.control.ControlHandle (from ctx.control(op_id), "
                        f"ControlTable(path).handle(op_id) or ControlHandle(path, op_id)) or None, got "
                        f"{type(control).__name__}: {control!r}")
    return control.bind(kind)
