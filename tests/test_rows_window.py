"""``cq.rows_window`` on a stream: exact against a plain-Python reference, across a checkpoint restart."""
import os
from collections import Counter
from datetime import datetime, timedelta

import pyarrow as pa
import pytest
from helpers.files import write_in_order
from helpers.rows_reference import rows_window_reference

import pyspark_cq as cq

SCHEMA = "ts timestamp, user string, v long"
BASE = datetime(2024, 1, 1)


def _batches(seed=3):
    import random

    rnd = random.Random(seed)
    batches, t = [], 0
    for b in range(4):
        rows = []
        for _ in range(40):
            t += rnd.choice([0, 0, 1, 2])  # ties on purpose
            rows.append({"ts": BASE + timedelta(seconds=t), "user": f"u{rnd.randrange(4)}", "v": rnd.randrange(5)})
        if b == 2:
            rows.append({"ts": BASE, "user": "u1", "v": 99})    # late: u1 has newer rows already
            rows.append({"ts": None, "user": "u2", "v": 98})    # malformed
        rnd.shuffle(rows)
        batches.append(rows)
    return batches


def _write(root, i, rows):
    table = pa.Table.from_pylist(rows, pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("user", pa.string()),
                                                 ("v", pa.int64())]))
    os.makedirs(root, exist_ok=True)
    write_in_order(table, os.path.join(root, f"b{i:03d}.parquet"), i)


def _key(row, sign, at):
    return (tuple(sorted(row.items())), sign, at)


def test_validation(spark):
    df = spark.createDataFrame([(BASE, "a", 1)], SCHEMA)
    with pytest.raises(ValueError, match="rows must be a positive int"):
        cq.rows_window(df, "ts", 0)
    with pytest.raises(ValueError, match="partition_by: no column 'nope'"):
        cq.rows_window(df, "ts", 2, "nope")
    with pytest.raises(TypeError, match="partition_by must be"):
        cq.rows_window(df, "ts", 2, [1])


@pytest.mark.spark
@pytest.mark.slow
def test_stream_equals_reference_across_restart(spark, tmp_path):
    batches = _batches()
    src, sink, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")

    def run():
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(src)
        out = cq.rows_window(df, "ts", 3, "user", name="rows3")
        q = (out.writeStream.format("parquet").option("path", sink).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return q

    for i in range(2):
        _write(src, i, batches[i])
    run()
    for i in range(2, 4):
        _write(src, i, batches[i])
    q = run()  # restarted from the checkpoint: the state of the first run continues
    reports = [cq.read_metrics(p, "rows3") for p in q.recentProgress]
    reports = [r for r in reports if r]
    got = Counter(_key({"ts": r.ts, "user": r.user, "v": r.v}, r.cq_sign, r.cq_at)
                  for r in spark.read.parquet(sink).collect())
    events, late, malformed = rows_window_reference(batches, 3, ["user"], ties=("user", "v"))
    assert got == Counter(events)
    assert sum(r["late_rows"] for r in reports) == late == 1
    assert sum(r["malformed_rows"] for r in reports) == malformed == 1
    assert sum(c for (_, s, _), c in got.items() if s == -1) == sum(len(b) for b in batches) - 2 - 4 * 3


@pytest.mark.spark
@pytest.mark.slow
def test_stream_without_partition_is_one_window(spark, tmp_path):
    """``[ROWS n]`` without PARTITION BY on a stream (one Spark group: a constant group column, as Spark cannot group
    applyInPandasWithState by a literal)."""
    batches = _batches()[:2]
    src = str(tmp_path / "in")
    for i, rows in enumerate(batches):
        _write(src, i, rows)
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(src)
    q = (cq.rows_window(df, "ts", 4).writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    got = Counter(_key({"ts": r.ts, "user": r.user, "v": r.v}, r.cq_sign, r.cq_at)
                  for r in spark.read.parquet(str(tmp_path / "out")).collect())
    events, _, _ = rows_window_reference(batches, 4, [], ties=("user", "v"))
    assert got == Counter(events) and len(got) > 0
