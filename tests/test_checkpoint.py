"""``cq.clear_unstarted_checkpoint``: a first start killed while it wrote its first offset (issue 41's CI risk).

The oracle is Spark itself: it refuses the checkpoint with the leftover temporary and, once cleared, runs the
query to the rows of a run on an empty checkpoint.
"""
from __future__ import annotations

import pytest

import pyspark_cq as cq
from tests.helpers.streaming import run_memory


def _leftover(ck, sub="offsets", name=".0.3b9d7c1e-4f6a-4a53-9d0e-2f8c1a7b6e55.tmp"):
    (ck / sub).mkdir(parents=True, exist_ok=True)
    (ck / sub / name).write_text("v1\n")
    return ck / sub / name


def test_removes_only_temporaries_of_a_checkpoint_without_a_committed_batch(tmp_path):
    ck = tmp_path / "ck"
    tmp = _leftover(ck)
    crc = _leftover(ck, name="..0.3b9d.tmp.crc")
    state_tmp = _leftover(ck, "state/0/1", ".1.delta.77aa.tmp")
    kept = _leftover(ck, "state/0/1", "1.delta")          # not a temporary: left for Spark to judge
    metadata = ck / "metadata"
    metadata.write_text('{"id":"x"}\n')
    removed = cq.clear_unstarted_checkpoint(f"file:{ck}")
    assert removed == sorted(map(str, (tmp, crc, state_tmp)))
    assert kept.exists() and metadata.exists() and not tmp.exists()
    assert cq.clear_unstarted_checkpoint(ck) == []


def test_leaves_a_checkpoint_with_a_committed_batch_alone(tmp_path):
    ck = tmp_path / "ck"
    tmp = _leftover(ck, name=".1.aa.tmp")
    (ck / "offsets" / "0").write_text("v1\n")
    assert cq.clear_unstarted_checkpoint(ck) == [] and tmp.exists()
    assert cq.clear_unstarted_checkpoint(tmp_path / "missing") == []


@pytest.mark.parametrize("bad, error, words", [(None, TypeError, "checkpoint must be a local directory"),
                                               ("", TypeError, "checkpoint must be"),
                                               ("s3a://bucket/ck", ValueError, "checkpoint must be a local")])
def test_bad_checkpoint_is_named(bad, error, words):
    with pytest.raises(error, match=words):
        cq.clear_unstarted_checkpoint(bad)


def test_spark_starts_on_the_cleared_checkpoint_with_the_rows_of_an_empty_one(spark, tmp_path):
    src = tmp_path / "in"
    spark.range(6).selectExpr("id", "id % 2 AS k").write.parquet(str(src / "0"))

    def stream():
        return spark.readStream.schema("id long, k long").parquet(str(src / "0")).groupBy("k").count()

    ck = tmp_path / "killed"
    _leftover(ck)
    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        run_memory((stream(), "cq_ck_refused", str(ck)), mode="complete")
    # Spark's failed start may have left temporaries of its own: cleared too
    assert cq.clear_unstarted_checkpoint(ck)
    run_memory((stream(), "cq_ck_cleared", str(ck)), (stream(), "cq_ck_fresh", str(tmp_path / "fresh")),
               mode="complete")
    rows = {t: sorted(map(tuple, spark.table(t).collect())) for t in ("cq_ck_cleared", "cq_ck_fresh")}
    assert rows["cq_ck_cleared"] == rows["cq_ck_fresh"] == [(0, 3), (1, 3)]
