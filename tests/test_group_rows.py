"""ROWS windows in a QueryGroup's shared stage (issue 40): per shard, each partition through the rows_window
operator's step with its kept rows (pure: a plain-Python ``[PARTITION BY page ROWS n]`` is the oracle); end to end on
Spark in ``tests/test_group_joins.py`` (a ROWS member beside the join classes, across a restart)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pyspark_cq.group.rows import RowsMember, partitions, run_rows
from pyspark_cq.operators.rows_window.worker import _RowsWorker

S = 1_000_000
T0 = 1_704_067_200_000_000
TS = pa.timestamp("us", tz="UTC")


def _worker(n):
    fields = [("ts", TS), ("page", pa.string()), ("x", pa.int64())]
    return _RowsWorker(n, "ts", ["page", "x"], pa.schema(fields + [("__cq_t", pa.int64())]),
                       pa.schema(fields + [("cq_sign", pa.int32()), ("cq_at", TS)]))


def _table(rows):
    t, page, x = zip(*rows) if rows else ((), (), ())
    return pa.table({"ts": pa.array(t, pa.int64()).cast(TS), "page": pa.array(page, pa.string()),
                     "x": pa.array(x, pa.int64()), "__cq_t": pa.array(t, pa.int64())})


def _oracle(batches, n):
    """Per page, rows in (time, page, x) order enter; the n-th later one pushes a row out; a row older than its
    partition's newest kept row (an earlier micro-batch's) is late."""
    kept: dict = {}
    out = []
    for batch in batches:
        for page in dict.fromkeys(p for _, p, _ in batch):
            rows = sorted(r for r in batch if r[1] == page)
            k = kept.setdefault(page, [])
            if k:
                rows = [r for r in rows if r[0] >= k[-1][0]]
            for r in rows:
                k.append(r)
                out.append((+1, *r, r[0]))
                if len(k) > n:
                    gone = k.pop(0)
                    out.append((-1, *gone, r[0]))
    return out


def test_partitions_keep_nulls_and_first_seen_order():
    t = pa.table({"a": ["x", None, "x", "y"], "b": [1, 2, 1, None]})
    got = [(k, list(ix)) for k, ix in partitions(t, ["a", "b"])]
    assert got == [(("x", 1), [0, 2]), ((None, 2), [1]), (("y", None), [3])]
    assert [(k, list(ix)) for k, ix in partitions(t, ())] == [((), [0, 1, 2, 3])]
    assert partitions(t.slice(0, 0), ()) == []


@pytest.mark.parametrize("sign", [1, -1])
def test_each_shard_runs_each_partition_as_the_operator_alone(sign):
    rng = np.random.default_rng(4)
    pages = ["a", "b", "c", "d"]
    batches = []
    for b in range(3):     # later batches hold rows late for their page (behind its newest kept row)
        rows = [(T0 + (b * 60 + int(rng.integers(-20, 60))) * S, pages[int(rng.integers(0, 4))],
                 int(rng.integers(0, 5))) for _ in range(25)]
        batches.append(rows)
    member = RowsMember(stream="clicks", partition_by=("page",), worker=_worker(3), sign=sign)
    shards = {0: ("a", "c"), 1: ("b", "d")}
    held = {0: None, 1: None}
    got, late = [], 0
    for batch in batches:
        for shard, own in shards.items():
            part = [r for r in batch if r[1] in own]
            rows, held[shard], counters = run_rows(member, _table(part) if part else None, held[shard])
            assert rows.column_names == ["ts", "page", "x", "cq_at"]
            flat = pa.table({"ts": rows["ts"].cast(pa.int64()), "page": rows["page"], "x": rows["x"],
                             "at": rows["cq_at"].cast(pa.int64())})
            got += [(sign, *r.values()) for r in flat.to_pylist()]
            late += counters["late_rows"]
            assert counters["state_rows"] == sum(min(3, n) for n, _ in held[shard].values())
    want = [r for r in _oracle(batches, 3) if r[0] == sign]
    assert sorted(got) == sorted(want)
    assert late > 0
