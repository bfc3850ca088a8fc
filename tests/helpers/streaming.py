"""Running the tests' streaming queries and comparing their rows.

A test's streaming query is small: its time is mostly the per-micro-batch latency of planning, scheduling and
committing, not work. Queries started together in one session overlap that latency (two side by side finish
~1.2× sooner than one after the other, four ~1.3×; docs/benchmark-log-2026.md, issue 41), so a test starts its
query and its oracle together. Collecting two small outputs and comparing them as multisets costs less than
Spark's ``exceptAll`` jobs and counts.
"""
from __future__ import annotations

from collections import Counter


def run_memory(*runs, mode: str = "append") -> list:
    """Run each ``(df, table, checkpoint)`` into the memory table ``table`` with ``trigger(availableNow=True)``,
    all side by side, to the end; the queries in the order given. If one fails, the others are stopped (nothing
    keeps running into the next test) and its error is raised."""
    return run_side_by_side(*(df.writeStream.format("memory").queryName(table).outputMode(mode)
                              .option("checkpointLocation", checkpoint) for df, table, checkpoint in runs))


def run_side_by_side(*writers) -> list:
    """Start each ``DataStreamWriter`` with ``trigger(availableNow=True)``, all side by side, and run them to the
    end; the queries in the order given. If one fails, the others are stopped and its error is raised."""
    queries = []
    try:
        for writer in writers:
            queries.append(writer.trigger(availableNow=True).start())
        for q in queries:
            q.awaitTermination()
    finally:
        for q in queries:
            if q.isActive:
                q.stop()
    return queries


def run_per_batch(df, checkpoint, out) -> tuple[dict, list]:
    """Run the streaming ``df`` to the end (``trigger(availableNow=True)``) on ``checkpoint``, each micro-batch written
    to ``out/<batch id>`` as Spark's own parquet (exact types; pandas would make longs floats): returns
    ``({batch id: DataFrame}, recentProgress)``."""
    from pathlib import Path

    out = Path(out)
    out.mkdir()

    def collect(batch_df, batch_id):
        batch_df.write.mode("overwrite").parquet(str(out / f"{batch_id:06d}"))

    q = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return {int(p.name): df.sparkSession.read.parquet(str(p)) for p in out.iterdir()}, q.recentProgress


def lose_commit(checkpoint, batch: int) -> None:
    """Delete ``batch``'s commit and its checksum from ``checkpoint``, as a crash between the state write and the
    commit leaves them: Spark runs the batch again on restart."""
    from pathlib import Path

    for lost in (str(batch), f".{batch}.crc"):
        (Path(checkpoint) / "commits" / lost).unlink(missing_ok=True)


def _hashable(v):
    """``v`` comparable in a multiset: NaN equal to NaN (as ``exceptAll`` compares), arrays, maps and structs as
    tuples."""
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, (list, tuple)):   # arrays; structs arrive as Rows (tuples)
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((_hashable(k), _hashable(x)) for k, x in v.items()))
    return v


def multiset(df) -> Counter:
    """The rows of ``df`` as a multiset of tuples, NaN equal to NaN (as ``exceptAll`` compares)."""
    return Counter(_hashable(r) for r in df.collect())


def assert_same_multiset(got, want, what: str = "rows") -> int:
    """``got`` holds exactly ``want``'s rows (a multiset); the number of rows. On failure, a sample of each
    difference."""
    g, w = multiset(got), multiset(want)
    extra, missing = g - w, w - g
    assert not extra and not missing, (
        f"{what}: {sum(extra.values())} rows not in the oracle, e.g. {list(extra)[:3]}; "
        f"{sum(missing.values())} missing, e.g. {list(missing)[:3]}")
    return sum(w.values())
