"""``multi_join(..., state_persistence="files")`` in Spark (issue 39): a 3-way stream (tests/test_multi_join.py's
streams: skewed keys, duplicates, null keys, an empty micro-batch) run in two parts on one checkpoint -- three
micro-batches, stop, two more -- with a snapshot every two batches, so the run goes through snapshot and delta
files, resident hits, misses and a restart that reads the files back. The output must equal the plain-Python
enumeration of Spark's chain of joins (which tests/test_multi_join.py checks against Spark's chain itself).
"""
from __future__ import annotations

import os
import shutil

import pytest
from test_multi_join import _bounds, _cols, _python_oracle, _rows, _sources, _write_stream

import pyspark_cq as cq
from pyspark_cq.vocabulary import metrics as M

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_files_stream_with_a_restart_equals_the_chain(spark, tmp_dir):
    n = 3
    root, live, ck = str(tmp_dir / "in"), str(tmp_dir / "live"), str(tmp_dir / "ck")
    state_dir = str(tmp_dir / "state")
    tables = _write_stream(root, n, seed=3)
    for i in range(n):
        os.makedirs(os.path.join(live, f"in{i}"))
    names = sorted(os.listdir(os.path.join(root, "in0")))
    reports = []
    for files in (names[:3], names[3:]):
        for f in files:
            for i in range(n):
                shutil.copy2(os.path.join(root, f"in{i}", f), os.path.join(live, f"in{i}", f))
        out = cq.multi_join(_sources(spark, live, n), [f"k{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                            _bounds(n), name="mjf", state_persistence="files", snapshot_every=2, state_dir=state_dir)
        q = (out.writeStream.format("parquet").option("path", str(tmp_dir / "out")).trigger(availableNow=True)
             .option("checkpointLocation", ck).start())
        q.awaitTermination()
        reports += [r for r in (cq.read_metrics(p, "mjf") for p in q.recentProgress) if r]
    got = _rows(spark.read.parquet(str(tmp_dir / "out")).select(*_cols(n)))
    assert got == _python_oracle(tables, n)
    assert sum(r["output_rows"] for r in reports) == len(got) > 0
    assert sum(r[M.STATE_CACHE_HITS] + r[M.STATE_CACHE_MISSES] for r in reports) > 0
    # Spark's state holds manifests only; the shards' snapshots and deltas are files under state_dir
    files = [f for _, _, fs in os.walk(state_dir) for f in fs]
    assert any(f.startswith("s") for f in files) and any(f.startswith("d") for f in files)
