"""multi_join(..., state_persistence="stateless"): the join in a stateless stage, its state in files only (issue 39).

A 3-input join against Spark's chain of stream-stream joins on the same files and micro-batches, across a lost
commit (the batch Spark runs again reads the state version before it and gives the same rows); the shared stage
(:class:`pyspark_cq.operators._common.stateless.StatelessShards`) with three inputs against a plain-Python account of
Spark's watermark and late-row rule; and bad arguments.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from helpers import join_data as jd
from helpers.streaming import lose_commit, run_memory, run_per_batch
from test_multi_join import _bounds, _cols, _rows, _schema, _sources, _spark_chain, _table

import pyspark_cq as cq
from pyspark_cq.operators._common import stateless as _stateless
from pyspark_cq.operators._common.batch_versions import spark_watermark, trunc_ms
from pyspark_cq.operators._common.payload import SIDE
from pyspark_cq.operators._common.stateless import StatelessShards

N = 3
SEC = 1_000_000


def _write(root: str, seed: int) -> None:
    """Five micro-batches per input (tests/test_multi_join.py's rows: skewed keys, duplicates, null keys, an empty
    file), and in batch 3 three rows per input far behind the watermark (late: dropped by Spark and by us)."""
    rng = np.random.default_rng(seed)
    for b in range(5):
        for i in range(N):
            t = _table(rng, i, 30, jd.BASE_US + b * 10 * SEC)
            if (i, b) == (1, 2):
                t = t.slice(0, 0)
            if b == 3:
                t = pa.concat_tables([t, _table(rng, i, 3, jd.BASE_US - 600 * SEC).slice(0, 3)])
            jd.write(os.path.join(root, f"in{i}"), f"b{b:03d}.parquet", t)


def _join(spark, root, state_dir, **kw):
    return cq.multi_join(_sources(spark, root, N), [f"k{i}" for i in range(N)], [f"t{i}" for i in range(N)],
                         _bounds(N), name="mjs", state_persistence=kw.pop("state_persistence", "stateless"),
                         snapshot_every=2, state_dir=state_dir, **kw)


@pytest.mark.spark
@pytest.mark.slow
def test_stateless_multi_join_equals_spark_chain_across_a_lost_commit(spark, tmp_dir):
    """Our query stops after four batches and loses its last commit, as a crash between the state write and the
    commit leaves it: Spark runs batch 3 again on restart, with the state of batch 2, and gives the same rows;
    batch 4 continues from its state. The union equals Spark's chain of joins, late rows dropped alike."""
    full, live, ck = str(tmp_dir / "full"), tmp_dir / "live", tmp_dir / "ck"
    _write(full, seed=21)

    def run(files: int, out: Path):
        for i in range(N):
            os.makedirs(live / f"in{i}", exist_ok=True)
            for b in range(files):
                name = f"b{b:03d}.parquet"
                if not (live / f"in{i}" / name).exists():
                    shutil.copy2(os.path.join(full, f"in{i}", name), live / f"in{i}" / name)   # keeps the order
        return run_per_batch(_join(spark, str(live), str(tmp_dir / "state")), ck, out)

    first, progress1 = run(4, tmp_dir / "out1")
    lose_commit(ck, 3)
    second, progress2 = run(5, tmp_dir / "out2")
    assert sorted(first) == [0, 1, 2, 3] and sorted(second) == [3, 4]   # batch 3 ran again
    redone = _rows(first[3].select(*_cols(N)))
    assert redone and redone == _rows(second[3].select(*_cols(N)))
    ours = [r for b in (first[0], first[1], first[2], second[3], second[4]) for r in _rows(b.select(*_cols(N)))]
    run_memory((_spark_chain(_sources(spark, full, N), N).select(*_cols(N)), "spark_mjs_ref",
                str(tmp_dir / "ck_spark")))
    assert sorted(ours, key=repr) == _rows(spark.table("spark_mjs_ref"))
    reports = [cq.read_metrics(p, "mjs") for p in progress1[:3] + progress2]
    assert sum(r["output_rows"] for r in reports) == len(ours)
    assert [sum(r[f"late_rows_{i}"] for r in reports) for i in range(N)] == [3, 3, 3]
    assert sum(r["evicted_rows"] for r in reports) > 0
    assert sum(r["state_cache_hits"] + r["state_cache_misses"] for r in reports) > 0
    # no stateful Spark operator: the checkpoint holds no state store, the versions are files under state_dir
    assert not (ck / "state").exists()
    assert os.listdir(tmp_dir / "state" / _stateless.VERSIONS_DIR)


class _Worker:
    """A stand-in for an operator worker: records what each shard call saw and counts its rows in the state."""

    def __init__(self, state_dir):
        self.config = type("Config", (), {"state_dir": state_dir})()
        self.calls = []

    def streaming(self, key, frames, state):
        (rows,) = frames
        self.calls.append((key[0], state.getCurrentWatermarkMs(), sorted(rows["__cq_tus"].dropna().tolist())))
        before = state.get[0] if state.exists else 0
        state.update((before + len(rows),))
        yield pd.DataFrame({"shard": [key[0]], "held": [before + len(rows)]})


def _batch(rows):
    """The tagged union's rows ``(side, shard, seconds)``."""
    return pd.DataFrame({SIDE: [r[0] for r in rows], "__cq_shard": [r[1] for r in rows],
                         "__cq_tus": [None if r[2] is None else r[2] * SEC for r in rows]})


def test_stateless_shards_take_sparks_watermark_over_three_inputs(tmp_dir, monkeypatch):
    """Three inputs over two shards: each batch's watermark is Spark's rule (each input's latest time before the
    batch, over all shards, less its delay; the minimum) and a batch drops the rows at or before the previous
    batch's watermark; a batch run again reads the versions before it and gives the same calls and output."""
    delays = (5_000, 10_000, 2_000)
    batches = [
        [(0, 0, 100), (1, 1, 90), (2, 0, 50)],
        [(0, 1, 130), (1, 0, 120), (2, 1, 125), (0, 0, None)],
        [(0, 0, 40), (1, 1, 140), (2, 0, 150), (1, 0, 48)],   # 40 s and 48 s: at or before batch 1's 48 s, late
        [(2, 1, 160), (0, 1, 170)],
    ]
    current = {}
    monkeypatch.setattr(_stateless, "batch_context", lambda what: (current["batch"], "query-1"))
    worker = _Worker(str(tmp_dir / "state"))
    stage = StatelessShards(worker, delays, "min", "multi_join 'x'", doc="docs/multi_join.md", shard="__cq_shard",
                            micros="__cq_tus")

    def run(b):
        current["batch"] = b
        worker.calls = []
        out = pd.concat(list(stage([_batch(batches[b]), _batch([])])))
        return worker.calls, sorted(zip(out["shard"], out["held"]))

    # the plain account: latest time per input over every batch before, Spark's watermark, the previous one
    latest, marks = [None] * 3, []
    for b, rows in enumerate(batches):
        marks.append(spark_watermark(latest, delays))
        late_ms = marks[b - 1] if b else marks[0]
        calls, _ = run(b)
        for shard in sorted({r[1] for r in rows}):
            kept = sorted(t * SEC for s, g, t in rows if g == shard and t is not None and t * SEC > late_ms * 1000)
            assert (shard, marks[b], kept) in calls, (b, shard, calls)
        for side, _, t in rows:
            if t is not None:
                latest[side] = max(latest[side] or 0, trunc_ms(t * SEC))
    assert marks == [0, 48_000, 110_000, 125_000]
    again = run(3)
    assert again == run(3)                      # batch 3 again: the same versions read, the same rows
    assert again[1] == [(1, 6)]                 # shard 1's rows of batches 0, 1 and 3 (none late), counted once each


@pytest.mark.spark
def test_stateless_multi_join_refuses_what_it_cannot_run(spark, tmp_dir):
    root = str(tmp_dir / "in")
    _write(root, seed=4)
    state = str(tmp_dir / "s")
    with pytest.raises(ValueError, match=r"state_persistence='stateless' runs inner multi_joins only .*'left'"):
        _join(spark, root, state, how=["inner", "left"])
    with pytest.raises(ValueError, match="state_persistence='stateless' runs output_mode='append' only"):
        _join(spark, root, state, output_mode="update")
    with pytest.raises(ValueError, match="state_persistence='stateless' does not take constraints"):
        _join(spark, root, state, constraints=[cq.constraints.unique(0, "k0")])
    with pytest.raises(ValueError, match="state_persistence must be one of .*'stateless'"):
        _join(spark, root, state, state_persistence="stateles")
    with pytest.raises(TypeError, match="state_dir must be a directory path"):
        _join(spark, root, 5)
    with pytest.raises(TypeError, match="snapshot_every must be an int"):
        cq.multi_join(_sources(spark, root, N), [f"k{i}" for i in range(N)], [f"t{i}" for i in range(N)],
                      _bounds(N), state_persistence="stateless", snapshot_every="2", state_dir=state)
    no_watermark = _sources(spark, root, N)[:2] + [spark.readStream.schema(_schema(2)).parquet(f"{root}/in2")]
    with pytest.raises(ValueError, match=r"times\[2\]: the streaming input needs a watermark"):
        cq.multi_join(no_watermark, [f"k{i}" for i in range(N)], [f"t{i}" for i in range(N)], _bounds(N),
                      state_persistence="stateless", state_dir=state)
    # the default, inner and append: a stateless stage, without a stateful Spark operator in the plan
    plan = _join(spark, root, state)._jdf.queryExecution().logical().toString()
    assert "MapInPandas" in plan and "FlatMapGroupsInPandasWithState" not in plan
