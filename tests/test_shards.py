"""Shard group keys (operators/_common/shards.py) against Spark's own hash function and partitioner."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from pyspark_cq.operators._common.shards import murmur3_long, shard_key_column, shard_key_values, shard_keys


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


# ---- the one sharding knob (shards=) and its defaults ----------------------------------------------------


def test_resolve_shards_spellings(spark):
    from pyspark_cq.operators._common.shards import AGGREGATE, JOIN, resolve_shards

    df = spark.createDataFrame([(1,)], "k long")
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert resolve_shards(None, JOIN, df=df) == ("shard", 2 * partitions)
    assert resolve_shards(None, AGGREGATE, keyed=True) == ("shard", 8)
    assert resolve_shards(None, AGGREGATE, keyed=False)[1] == 1
    assert resolve_shards(5, JOIN, df=df) == ("shard", 5) and resolve_shards(3, AGGREGATE) == ("shard", 3)
    assert resolve_shards("key", AGGREGATE)[0] == "key" and resolve_shards("key", JOIN, df=df)[0] == "key"
    for bad in (0, -2, "keys", 2.5, True):
        with pytest.raises((TypeError, ValueError), match="shards"):
            resolve_shards(bad, JOIN, df=df)


def test_grouping_is_a_deprecated_alias_of_shards(spark):
    import pyspark_cq as cq

    left = spark.createDataFrame([(1, 10)], "k long, v long").selectExpr("k", "v", "timestamp_seconds(v) AS ts")
    right = spark.createDataFrame([(1, 11)], "k long, w long").selectExpr("k", "w", "timestamp_seconds(w) AS ts2")
    args = (left, right, "k", "ts", "ts2", "-5 seconds", "5 seconds")
    want = sorted(cq.interval_join(*args, shards="key").collect())
    with pytest.warns(DeprecationWarning, match="shards='key'") as caught:
        got = sorted(cq.interval_join(*args, grouping="key").collect())
    assert got == want and len(got) == 1
    assert caught[0].filename == __file__          # the warning points at the caller's line
    with pytest.raises(ValueError, match="grouping must be 'shard' or 'key'"):
        cq.interval_join(*args, grouping="rows")
    with pytest.raises(ValueError, match="grouping"):
        cq.interval_join(*args, grouping="shard", shards="key")
