"""``multi_join(..., state_persistence="files")`` in Spark (issue 39): a 3-way stream (tests/test_multi_join.py's
streams: skewed keys, duplicates, null keys, an empty micro-batch; five micro-batches) with a snapshot every two
batches, so the run goes through snapshot and delta files and resident hits or misses. The output must equal the
plain-Python enumeration of Spark's chain of joins (which tests/test_multi_join.py checks against Spark's chain
itself). Restarts, retried batches and dropped copies are tested outside Spark
(tests/test_multi_join_resident.py); the interval join's Spark tests restart the shared files code
(tests/test_join_resident_stream.py). One query only: the suite is at its time bound.
"""
from __future__ import annotations

import os

import pytest
from test_multi_join import _bounds, _python_oracle, _rows, _run, _sources, _write_stream

import pyspark_cq as cq
from pyspark_cq.vocabulary import metrics as M

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_files_stream_equals_the_chain(spark, tmp_dir):
    n = 3
    root, state_dir = str(tmp_dir / "in"), str(tmp_dir / "state")
    tables = _write_stream(root, n, seed=3)
    out = cq.multi_join(_sources(spark, root, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                        _bounds(n), name="mjf", state_persistence="files", snapshot_every=2, state_dir=state_dir)
    q = _run(out, "ours_mjf", str(tmp_dir / "ck"))
    reports = [r for r in (cq.read_metrics(p, "mjf") for p in q.recentProgress) if r]
    got = _rows(spark.table("ours_mjf"))
    assert got == _python_oracle(tables, n)
    assert sum(r["output_rows"] for r in reports) == len(got) > 0
    assert sum(r[M.STATE_CACHE_HITS] + r[M.STATE_CACHE_MISSES] for r in reports) > 0
    # Spark's state holds manifests only; the shards' snapshots and deltas are files under state_dir
    files = [f for _, _, fs in os.walk(state_dir) for f in fs]
    assert any(f.startswith("s") for f in files) and any(f.startswith("d") for f in files)
