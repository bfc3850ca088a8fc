"""State that stays in the Python worker between micro-batches (issue 39): a process-global LRU cache.

``applyInPandasWithState`` hands every call the group's state value as bytes and takes new bytes back;
rebuilding a native kernel from them and serializing it again costs what the whole state costs, every
batch. A worker process that ran a group's previous batch still holds the objects it built, so the
stateful operators may keep them here, keyed by (operator, group), with the *version token* they wrote
into the group's state value. A call uses its cached copy only when that token equals the token in the
``GroupState`` it is given: a copy from a batch Spark retried or never committed, from another query or
from an older version has another token and is refused (the operator then restores from the value, as
without the cache). Tokens are random (:func:`new_token`), so two writers never share one.

An entry is *taken* out of the cache for the call (:meth:`ResidentCache.take`) and put back only with
the token of the value the call wrote (:meth:`ResidentCache.put`): a call that fails half way leaves
nothing behind that a later call could mistake for a committed version.

The cache is bounded by bytes (least recently used first out): ``PYSPARK_CQ_STATE_CACHE_MB`` in the
workers' environment (default 512 MiB per Python worker process; 0 turns the cache off).
"""
from __future__ import annotations

import os
from collections import OrderedDict

__all__ = ["ENV_LIMIT", "DEFAULT_LIMIT_MB", "ResidentCache", "cache", "new_token", "limit_bytes"]

ENV_LIMIT = "PYSPARK_CQ_STATE_CACHE_MB"
DEFAULT_LIMIT_MB = 512
TOKEN_BYTES = 16


def new_token() -> bytes:
    """A fresh version token: 16 random bytes (never shared by two writes of any query or process)."""
    return os.urandom(TOKEN_BYTES)


def limit_bytes() -> int:
    """The cache's byte bound from ``PYSPARK_CQ_STATE_CACHE_MB`` (a non-negative number of MiB)."""
    raw = os.environ.get(ENV_LIMIT)
    if raw is None or raw == "":
        return DEFAULT_LIMIT_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_LIMIT} must be a non-negative number of MiB, got {raw!r}") from None
    if not mb >= 0:
        raise ValueError(f"{ENV_LIMIT} must be a non-negative number of MiB, got {raw!r}")
    return int(mb * (1 << 20))


class ResidentCache:
    """(operator, group) -> (token, object, bytes), least recently used out first beyond ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._entries: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key, token: bytes | None):
        """Remove ``key``'s entry and return its object if its token is ``token``; else None (a stale or
        foreign copy is dropped: it can never become current again).
        """
        return self.take_behind(key, [] if token is None else [token])[0]

    def take_behind(self, key, tokens):
        """``(object, behind)``: remove ``key``'s entry and return its object if its token is one of ``tokens``
        (the versions of one line, oldest first), with how many versions of the line came after it (0: current);
        else ``(None, 0)`` (the copy is dropped). A copy whose token a committed line names is that version's
        state: tokens are never shared, and only the write that made a version carries its token.
        """
        entry = self._entries.pop(key, None)
        if entry is None:
            return None, 0
        self.used -= entry[2]
        tokens = list(tokens)
        if entry[0] not in tokens:
            return None, 0
        return entry[1], len(tokens) - 1 - tokens.index(entry[0])

    def put(self, key, token: bytes, obj, nbytes: int) -> None:
        """Keep ``obj`` as the version ``token`` of ``key`` (``nbytes``: its memory), evicting the least
        recently used entries beyond the limit; an object larger than the limit is not kept.
        """
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old[2]
        if nbytes > self.limit:
            return
        self._entries[key] = (token, obj, nbytes)
        self.used += nbytes
        while self.used > self.limit:
            _, (_, _, n) = self._entries.popitem(last=False)
            self.used -= n

    def discard(self, key) -> None:
        """Forget ``key`` (its state was removed)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used -= entry[2]

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0


_CACHE: ResidentCache | None = None


def cache() -> ResidentCache:
    """The cache of this process (created at first use with :func:`limit_bytes`)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = ResidentCache(limit_bytes())
    return _CACHE
