"""Checkpoint fixtures of the stateful operators' current state formats (issue 23, docs/reliability.md).

``tests/fixtures/checkpoints/<operator>/`` holds a checkpoint written after the first ``SPLIT`` input
files (one micro-batch each) and ``expected.json``, the rows an uninterrupted run emits in the batches
after them. The inputs themselves are regenerated from a seed (:func:`write_inputs`), and the paths the
file source logged under ``sources/`` are stored relative to a placeholder (:data:`PLACEHOLDER`), so a
fixture restores anywhere. ``make_fixtures.py`` in that directory writes them; ``tests/test_state_compat.py``
restores each one and continues to the expected output.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
PLACEHOLDER = "@INPUT_ROOT@"
FILES, SPLIT = 4, 2
T0 = 1_704_067_200           # 2024-01-01T00:00:00Z, seconds
OPERATORS = ("interval_join", "sliding_aggregate", "multi_join")
INPUTS = {"interval_join": ("l", "r"), "sliding_aggregate": ("in",), "multi_join": ("a", "b", "c")}


def write_inputs(root: Path, operator: str, files: int = FILES) -> None:
    """Deterministic parquet inputs: file i of every input holds times in [10·i, 10·i + 10) seconds."""
    for j, name in enumerate(INPUTS[operator]):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            rng = np.random.default_rng([23, j, i])    # file i is the same whatever ``files`` is
            n, keys = (40, 6) if operator == "sliding_aggregate" else (20, 12)   # joins: a few hundred matches
            t = (T0 + 10 * i) * 1_000_000 + rng.integers(0, 10_000, n) * 1000
            path = d / f"part-{i:03d}.parquet"
            pq.write_table(pa.table({f"ts_{name}": pa.array(t, pa.timestamp("us", tz="UTC")),
                                     "k": pa.array(rng.integers(0, keys, n), pa.int64()),
                                     f"v_{name}": pa.array(rng.integers(-50, 50, n), pa.int64())}), path)
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))


def build(spark, operator: str, root: Path, **options):
    """The fixture's query over the inputs under ``root`` (``options`` override the operator's)."""
    import pyspark_cq as cq

    def src(name):
        return (spark.readStream.schema(f"ts_{name} timestamp, k long, v_{name} long")
                .option("maxFilesPerTrigger", 1).parquet(str(root / name)).withWatermark(f"ts_{name}", "10 seconds"))

    if operator == "interval_join":
        args = dict(on="k", shards=4)
        args.update(options)
        return cq.interval_join(src("l"), src("r"), args.pop("on"), "ts_l", "ts_r", "-5 seconds", "5 seconds",
                                name="fixture", **args)
    if operator == "sliding_aggregate":
        args = dict(by="k", shards=4)
        args.update(options)
        return cq.sliding_aggregate(src("in"), "ts_in", "20 seconds", "5 seconds",
                                    aggs={"v_in": ["sum", "max"], "*": ["count"]}, name="fixture", **args)
    if operator == "multi_join":
        args = dict(on="k")
        args.update(options)
        return cq.multi_join([src(n) for n in INPUTS[operator]], args.pop("on"), [f"ts_{n}" for n in INPUTS[operator]],
                             [(0, 1, "-3 seconds", "3 seconds"), (1, 2, "0 seconds", "4 seconds")], name="fixture",
                             **args)
    raise ValueError(operator)


def run(spark, operator: str, root: Path, checkpoint: Path, **options) -> list:
    """Run the query on ``checkpoint`` until the available input is read; the rows it emitted.
    (``foreachBatch``: Spark's memory sink cannot restart from a checkpoint in append mode.)"""
    got = []

    def collect(batch, _batch_id):
        got.extend([_plain(v) for v in r] for r in batch.collect())

    q = (build(spark, operator, root, **options).writeStream.foreachBatch(collect).outputMode("append")
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    q.awaitTermination()
    return sorted(got)


def _plain(v):
    if isinstance(v, dt.datetime):
        return v.isoformat()
    return v


def _source_logs(checkpoint: Path):
    for d in (checkpoint / "sources").glob("*"):
        for f in d.iterdir():
            if f.is_file() and not f.name.startswith("."):
                yield f


def restore(operator: str, into: Path) -> tuple[Path, Path, list]:
    """Copy ``operator``'s fixture under ``into`` with its inputs: (input root, checkpoint, expected rows)."""
    src = FIXTURES / operator
    root, checkpoint = into / "input", into / "checkpoint"
    write_inputs(root, operator)
    shutil.copytree(src / "checkpoint", checkpoint)
    for f in _source_logs(checkpoint):
        f.write_text(f.read_text().replace(PLACEHOLDER, str(root.resolve())))
    return root, checkpoint, json.loads((src / "expected.json").read_text())


def make(spark, operator: str, work: Path) -> dict:
    """Write ``operator``'s fixture: a checkpoint after ``SPLIT`` files, and the rows an uninterrupted run
    emits after them."""
    out = FIXTURES / operator
    shutil.rmtree(out, ignore_errors=True)
    root = work / operator / "input"
    write_inputs(root, operator)
    full = run(spark, operator, root, work / operator / "ck_full")
    shutil.rmtree(root)
    write_inputs(root, operator, SPLIT)
    first = run(spark, operator, root, work / operator / "ck")
    rest = Counter(map(json.dumps, full)) - Counter(map(json.dumps, first))
    expected = sorted(json.loads(r) for r in rest.elements())
    # The checkpoint without the .crc files Hadoop writes next to each file (they are optional on read).
    shutil.copytree(work / operator / "ck", out / "checkpoint", ignore=shutil.ignore_patterns("*.crc"))
    for f in _source_logs(out / "checkpoint"):
        f.write_text(f.read_text().replace(str(root.resolve()), PLACEHOLDER))
    logged = "".join(f.read_text() for f in _source_logs(out / "checkpoint"))
    assert PLACEHOLDER in logged and str(work) not in logged, "the source log's paths were not made relative"
    (out / "expected.json").write_text(json.dumps(expected, separators=(",", ":")))
    return {"operator": operator, "first_rows": len(first), "expected_rows": len(expected)}
