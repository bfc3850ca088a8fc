"""Shard group keys (operators/_shards.py) against Spark's own hash function and partitioner."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from pyspark_cq.operators._shards import murmur3_long, shard_key_column, shard_key_values, shard_keys


def test_murmur3_long_equals_sparks_hash(spark):
    values = np.concatenate([np.arange(-50, 50), [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 1 << 40,
                                                  -(1 << 33) + 7]]).astype(np.int64)
    got = spark.createDataFrame([(int(v),) for v in values], "v long").select(F.hash("v").alias("h"))
    assert got.toPandas().h.tolist() == murmur3_long(values).tolist()


@pytest.mark.parametrize("shards, partitions", [(4, 2), (8, 2), (8, 4), (16, 8), (6, 2), (1, 1)])
def test_spark_spreads_the_shard_keys_evenly(spark, shards, partitions):
    keys = shard_keys(shards)
    df = spark.createDataFrame([(int(k),) for k in keys], "k long").repartition(partitions, "k")
    per_task = df.groupBy(F.spark_partition_id().alias("p")).count().toPandas()
    counts = sorted(per_task["count"].tolist())
    assert sum(counts) == shards and len(per_task) == min(partitions, shards)
    assert counts[-1] - counts[0] <= (0 if shards % partitions == 0 else 1), counts
    # the plain shard indexes, as grouped before, are not spread evenly (what this layout fixes)
    if (shards, partitions) == (4, 2):
        plain = spark.createDataFrame([(i,) for i in range(4)], "k int").repartition(2, "k")
        assert sorted(plain.groupBy(F.spark_partition_id()).count().toPandas()["count"]) == [1, 3]


def test_shard_keys_are_stable_distinct_and_validated():
    # Checkpointed state is stored under these values: they must never change for a given shard count.
    assert shard_keys(4).tolist() == [2, 0, 14, 3]
    assert shard_keys(8).tolist() == [2, 9, 14, 3, 4, 0, 16, 13]
    big = shard_keys(1000)
    assert len(set(big.tolist())) == 1000 and big.min() >= 0
    assert ((murmur3_long(big).astype(np.int64) & 1023) == np.arange(1000)).all()
    with pytest.raises(ValueError, match="shards must be a positive int"):
        shard_keys(0)
    with pytest.raises(ValueError, match="shards"):
        shard_keys(True)


def test_shard_key_values_equal_the_spark_column(spark):
    """The slicer (numpy) and the Spark plans must route a key hash to the same group key."""
    hashes = np.random.default_rng(3).integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 200, dtype=np.int64)
    df = spark.createDataFrame([(int(h),) for h in hashes], "h long")
    for shards in (1, 3, 8):
        got = df.select(shard_key_column(F.col("h"), shards).alias("k")).toPandas().k.tolist()
        assert got == shard_key_values(hashes, shards).tolist()
