"""Group keys of state shards that Spark's hash partitioning spreads evenly over its tasks.

A stateful operator groups its rows by shard (``applyInPandasWithState`` per shard), and Spark places
each group in shuffle partition ``pmod(murmur3(key, seed 42), partitions)``. With the shard index itself
as the key, a few distinct values land where murmur3 puts them: four shards over two partitions split
3 : 1 and eight split 5 : 3, so one task does most of the work while the other core idles. The key of
shard ``i`` is therefore the smallest non-negative ``long`` whose murmur3 hash has ``i`` in its low
bits: with ``partitions`` a power of two dividing the (power-of-two rounded) shard count, every task
gets the same number of shards. Any other partition count is no worse than before.

The keys depend on the shard count only, never on the session's configuration, so a query restarted
from its checkpoint finds its state under the same keys (Spark keeps the checkpoint's partition count).
Keys are ``long`` where the earlier layout grouped by an ``int`` shard index: Spark's state schema check
rejects a checkpoint of that layout on restart instead of silently starting from empty state.

Both stateful operators also take their ``shards`` argument from here (:func:`resolve_shards`: an int,
None for the default, or ``"key"`` for one group per raw key) and record / check the count a state was
written with (:func:`with_shard_count`, :func:`check_shard_count`). Their default counts differ, for the
reason :func:`default_shard_count` gives.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

_SEED = 42  # Spark's HashPartitioning: Murmur3Hash(keys, 42)
_M32 = np.uint64(0xFFFFFFFF)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return ((x << np.uint64(r)) | (x >> np.uint64(32 - r))) & _M32


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    k1 = (k1 * np.uint64(0xCC9E2D51)) & _M32
    k1 = _rotl(k1, 15)
    return (k1 * np.uint64(0x1B873593)) & _M32


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * np.uint64(5) + np.uint64(0xE6546B64)) & _M32


def murmur3_long(values: np.ndarray, seed: int = _SEED) -> np.ndarray:
    """Spark's ``hash(col)`` of a ``long`` column (Murmur3_x86_32.hashLong), as int32."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    h1 = np.full(v.shape, seed, dtype=np.uint64)
    h1 = _mix_h1(h1, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> np.uint64(32)))
    h1 ^= np.uint64(8)  # length in bytes
    h1 ^= h1 >> np.uint64(16)
    h1 = (h1 * np.uint64(0x85EBCA6B)) & _M32
    h1 ^= h1 >> np.uint64(13)
    h1 = (h1 * np.uint64(0xC2B2AE35)) & _M32
    h1 ^= h1 >> np.uint64(16)
    return h1.astype(np.uint32).view(np.int32)


@functools.lru_cache(maxsize=64)
def shard_keys(shards: int) -> np.ndarray:
    """The group key of each shard ``0 .. shards-1`` (int64, read-only): the smallest non-negative
    value whose murmur3 hash has the shard index in its low ``ceil(log2(shards))`` bits.
    """
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    bits = max(1, int(shards - 1).bit_length())
    mask = (1 << bits) - 1
    keys = np.full(shards, -1, dtype=np.int64)
    missing, start, step = shards, 0, max(1024, 8 << bits)
    while missing:
        cand = np.arange(start, start + step, dtype=np.int64)
        low = murmur3_long(cand).astype(np.int64) & mask
        for value, slot in zip(cand.tolist(), low.tolist()):
            if slot < shards and keys[slot] < 0:
                keys[slot] = value
                missing -= 1
        start += step
    keys.setflags(write=False)
    return keys


def shard_key_column(key_hash: Column, shards: int) -> Column:
    """Spark expression: the group key (``long``) of the shard of a 64-bit key hash (shard
    ``pmod(key_hash, shards)``); :func:`shard_key_values` is the same on numpy arrays.
    """
    index = F.pmod(key_hash, F.lit(shards)).cast("int")
    return F.element_at(F.array(*[F.lit(int(k)) for k in shard_keys(shards)]), index + 1).cast("long")


def shard_key_values(key_hashes: np.ndarray, shards: int) -> np.ndarray:
    """The group keys (int64) of the shards of 64-bit key hashes, as :func:`shard_key_column`."""
    return shard_keys(shards)[np.mod(np.asarray(key_hashes, dtype=np.int64), shards)]


# The shard count a state was written with, kept in the schema metadata of an Arrow table of the state:
# with another count, keys would be routed to shards that do not hold their state.
_COUNT_META = b"pyspark_cq.shards"


def with_shard_count(table: pa.Table, shards: int) -> pa.Table:
    """``table`` with ``shards`` recorded in its schema metadata (see :func:`check_shard_count`)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), _COUNT_META: str(int(shards)).encode()})


def check_shard_count(table: pa.Table, shards: int, operator: str, default: str) -> None:
    """Raise ValueError if ``table`` (restored state) was written with another shard count.

    Keys would otherwise meet their own state in another shard: a join would miss matches, an
    aggregation would split a group. Tables saved before the count was recorded pass. ``default``
    says how the operator picks ``shards`` when not given, for the message.
    """
    saved = (table.schema.metadata or {}).get(_COUNT_META)
    if saved is not None and int(saved) != shards:
        raise ValueError(f"shards: this checkpoint's {operator} state was written with shards={int(saved)}, the query "
                         f"now has shards={shards}. Pass shards={int(saved)} ({default}) or start with a new "
                         f"checkpoint location.")


# --- the ``shards`` argument of the stateful operators -----------------------------------------------------

#: Operators whose ``shards=`` this module resolves (the names their checkpoint errors use).
JOIN, AGGREGATE, MULTI_JOIN = "join", "sliding_aggregate", "multi_join"

#: ``shards=None`` with grouping keys: the aggregation's fixed count.
AGGREGATE_DEFAULT_SHARDS = 8
#: ``shards=None``: the join's count is this many times ``spark.sql.shuffle.partitions``.
JOIN_SHARDS_PER_PARTITION = 2
#: The partition count assumed when the session's configuration cannot be read (Spark Connect without
#: conf access).
FALLBACK_PARTITIONS = 8


def resolve_shards(shards, operator: str, *, keyed: bool = True, df=None) -> tuple[str, int]:
    """The state layout and shard count of an operator's ``shards`` argument, the one spelling of both
    stateful operators (:func:`~pyspark_cq.interval_join`, :func:`~pyspark_cq.sliding_aggregate`).

    Parameters
    ----------
    shards : int, None or "key"
        A positive int: that many shards (hash shards of the key, each one Spark group holding one
        native table for many keys). None: :func:`default_shard_count`. ``"key"``: one group per raw
        key, kept to measure the shard layout against (docs/join.md, docs/aggregate.md).
    operator : {"join", "sliding_aggregate"}
        Whose default applies.
    keyed : bool
        Whether the operator has grouping keys (``by``); without them one shard holds everything.
    df : DataFrame, optional
        An input, whose session's configuration the join's default reads.

    Returns
    -------
    tuple of (str, int)
        ``("shard", count)``, or ``("key", 1)``: the per-key layout keeps one table per group, and the
        aggregation records 1 as its count (checkpoints of that layout carry it).
    """
    if isinstance(shards, str) and shards == "key":
        return "key", 1
    if shards is None:
        return "shard", default_shard_count(operator, keyed=keyed, df=df)
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"shards must be a positive int, None or 'key', got {shards!r}")
    return "shard", int(shards)


def default_shard_count(operator: str, *, keyed: bool = True, df=None) -> int:
    """The shard count of ``shards=None``: one function for both operators, two historical rules.

    - ``"join"``: twice ``spark.sql.shuffle.partitions`` of ``df``'s session when the query is defined
      (``2 * 8`` when the configuration cannot be read);
    - ``"sliding_aggregate"``: 8 with grouping keys, 1 without;
    - ``"multi_join"``: 8 (the fixed rule, as a new operator should).

    Why the rules differ and stay so: a state records the shard count it was written with and a restore
    with another count is refused (:func:`check_shard_count`; keys would meet their state in the wrong
    shard). Each operator's existing checkpoints were written under its own default, so unifying the two
    (either way) would make every checkpoint written under the other rule unrestorable without an
    explicit ``shards=``. A new operator should take the aggregation's fixed rule: it does not depend on
    the session's configuration at definition time, which is what makes the join's default fragile.
    """
    if operator in (AGGREGATE, MULTI_JOIN):
        return AGGREGATE_DEFAULT_SHARDS if keyed else 1
    if operator == JOIN:
        try:
            partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        except Exception:  # Spark Connect without conf access (or no DataFrame): a sensible default
            partitions = FALLBACK_PARTITIONS
        return max(1, JOIN_SHARDS_PER_PARTITION * partitions)
    raise ValueError(f"operator must be {JOIN!r}, {AGGREGATE!r} or {MULTI_JOIN!r}, got {operator!r}")


def default_rule(operator: str) -> str:
    """How ``shards=None`` picks the count of ``operator``, in words (for :func:`check_shard_count`)."""
    if operator == AGGREGATE:
        return f"the default is {AGGREGATE_DEFAULT_SHARDS} when by is given"
    if operator == MULTI_JOIN:
        return f"it always uses {AGGREGATE_DEFAULT_SHARDS}"
    return (f"the default is twice spark.sql.shuffle.partitions when the query is defined, "
            f"{AGGREGATE_DEFAULT_SHARDS} with state_persistence='stateless'")
