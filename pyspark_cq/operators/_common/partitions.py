"""The advice when ``spark.sql.shuffle.partitions`` is far above the session's cores, given when a stateful
operator is defined (:func:`warn_shuffle_partitions`).
"""
from __future__ import annotations

import warnings

#: ``spark.sql.shuffle.partitions`` above this many times the session's cores draws a warning.
PARTITIONS_PER_CORE_LIMIT = 4
_warned_sessions: set[int] = set()   # id() of the sessions warned about their shuffle partitions


def warn_shuffle_partitions(df) -> None:
    """Warn once per session when ``spark.sql.shuffle.partitions`` is far above the session's cores.

    Every micro-batch of a stateful operator runs one task per shuffle partition, empty or not, each
    with its Python worker round trip and state-store commit: with Spark's default 200 on a laptop the
    same streaming aggregation took 232 s instead of 15 s (issue 17). :func:`pyspark_cq.spark` sets twice the
    cores; a session built with ``SparkSession.builder`` keeps 200. Called when a stateful operator is
    defined on a streaming ``df`` (or a batch one without adaptive execution, which would coalesce the
    partitions). Does nothing when the configuration or the cores cannot be read (Spark Connect).

    Parameters
    ----------
    df : DataFrame
        The operator's input.
    """
    try:
        session = df.sparkSession
        if id(session) in _warned_sessions:
            return
        if not df.isStreaming and session.conf.get("spark.sql.adaptive.enabled", "true").lower() == "true":
            return
        partitions = int(session.conf.get("spark.sql.shuffle.partitions"))
        cores = int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect (no sparkContext) or an unreadable setting: no advice
        return
    if cores < 1 or partitions <= PARTITIONS_PER_CORE_LIMIT * cores:
        return
    _warned_sessions.add(id(session))
    suggested = 2 * cores
    warnings.warn(
        f"spark.sql.shuffle.partitions is {partitions}, far above this session's {cores} cores "
        f"(sparkContext.defaultParallelism): every micro-batch of a stateful pyspark-cq operator then runs "
        f"{partitions} tasks, most of them empty (a streaming aggregation took 232 s instead of 15 s at 200 "
        f"on 2 cores). Set spark.conf.set('spark.sql.shuffle.partitions', {suggested}) before defining the "
        f"query, or create the session with pyspark_cq.spark(), which does; a query restarted from a "
        f"checkpoint keeps the count it started with. See docs/installation.md, 'A session of your own'. "
        f"Or, for a new query, run the operator in a stateless stage, whose tasks do not follow the setting: "
        f"sliding_aggregate(..., state='files') (windows then close with the next batch of data), "
        f"interval_join / multi_join(..., state_persistence='stateless') (inner joins) -- 10-45x Spark there "
        f"(docs/aggregate.md, 'State in files'; docs/join.md, 'A stateless stage').",
        UserWarning, stacklevel=3)


def stage_partitions(df, shards: int) -> int:
    """The tasks of a stateless stage over ``shards`` shards (``repartition``): one per core of ``df``'s session
    (``sparkContext.defaultParallelism``), at most ``shards``; ``shards`` where the cores cannot be read (Spark
    Connect). A task runs the shards hashed to it one after the other, so more tasks than cores only add
    per-task overhead; the count does not matter to the state, which is kept per shard.
    """
    try:
        cores = int(df.sparkSession.sparkContext.defaultParallelism)
    except Exception:   # Spark Connect (no sparkContext)
        return shards
    return max(1, min(shards, cores))
