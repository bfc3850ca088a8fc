"""State compatibility (issue 23): a state blob of an unknown (future) format fails with a message naming
both format versions; the join, multi-join and aggregation kernels each check it when they restore.

Layout of a blob (native/serde.hpp): ``CQS1`` | u32 ncols | per column u8 dtype, u8 item size, u64 length,
the values. Every kernel's first column is its meta, whose first value is the state format version.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

import pyspark_cq as cq
from pyspark_cq._native import load

_VERSION_AT = 4 + 4 + 1 + 1 + 8   # the first int64 of the first column


def _version(blob: bytes) -> int:
    return struct.unpack_from("<q", blob, _VERSION_AT)[0]


def _with_version(blob: bytes, version: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into("<q", out, _VERSION_AT, version)
    return bytes(out)


def test_join_state_from_a_future_format_names_both_versions():
    join = load("_join")
    blob = join.JoinState(-5, 5).serialize()
    current = _version(blob)
    assert join.JoinState.deserialize(blob) is not None
    with pytest.raises(ValueError) as info:
        join.JoinState.deserialize(_with_version(blob, current + 1))
    msg = str(info.value)
    assert f"format version {current + 1}" in msg and f"formats 1 to {current}" in msg
    assert "new checkpoint location" in msg


def test_multi_join_state_from_a_future_format_names_both_versions():
    mj = load("_mjoin")
    blob = mj.MultiJoinState(2, [(0, 1, 0, 10)]).serialize()
    current = _version(blob)
    with pytest.raises(ValueError) as info:
        mj.MultiJoinState.deserialize(_with_version(blob, current + 1))
    msg = str(info.value)
    assert f"format version {current + 1}" in msg and f"formats 1 to {current}" in msg


def test_aggregation_state_from_a_future_format_names_both_versions():
    agg = load("_aggregate")
    kinds = np.array([agg.KIND_ADD_I64], dtype=np.uint8)
    outs = np.array([agg.OUT_COUNT, 0, -1], dtype=np.int32)
    blob = agg.ShardState(kinds, outs, False).to_bytes()
    current = _version(blob)
    assert agg.ShardState.from_bytes(blob, kinds, outs, False) is not None
    with pytest.raises(ValueError) as info:
        agg.ShardState.from_bytes(_with_version(blob, current + 1), kinds, outs, False)
    msg = str(info.value)
    assert f"format version {current + 1}" in msg and f"state format {current}" in msg


# ---- checkpoints of the current formats, restored and continued (Spark) ------------------------------------

@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("operator", ["interval_join", "sliding_aggregate", "multi_join"])
def test_checkpoint_fixture_restores_and_continues(spark, tmp_path, operator):
    """A checkpoint written after two micro-batches (tests/fixtures/checkpoints/<operator>), restored with
    the rest of the input: the query emits exactly the rows an uninterrupted run emits after them."""
    from helpers import checkpoint_fixtures as CF

    root, checkpoint, expected = CF.restore(operator, tmp_path)
    assert expected
    assert CF.run(spark, operator, root, checkpoint) == expected


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("operator, options, message", [
    ("sliding_aggregate", {"by": ["k", "v_in"]},
     "by: this checkpoint's sliding_aggregate state 'fixture' was written with by=['k'], the query now has "
     "by=['k', 'v_in']"),
    ("sliding_aggregate", {"shards": 2}, "state was written with shards=4, the query now has shards=2"),
    ("sliding_aggregate", {"kept_column": "kept"},
     "kept_column, which adds a partial to every slice, is part of the layout too: keep it for the life of a "
     "checkpoint; the query now has kept_column set"),
    ("interval_join", {"shards": 8}, "state was written with shards=4, the query now has shards=8"),
])
def test_incompatible_option_change_on_restart_fails_clearly(spark, tmp_path, operator, options, message):
    """Restarting a fixture checkpoint with another shard count or other key columns fails with a message
    naming the option and both values, not with wrong output."""
    from helpers import checkpoint_fixtures as CF

    root, checkpoint, _ = CF.restore(operator, tmp_path)
    with pytest.raises(Exception) as info:
        CF.run(spark, operator, root, checkpoint, **options)
    assert message in str(info.value)
    # the sentence, without the page of Java and Python stack traces around it (issue 17, defect 9)
    sentence = cq.explain_error(info.value)
    assert sentence.startswith("ValueError: ") and message in sentence and "\n" not in sentence


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("operator, first, then, message", [
    ("interval_join", {}, {"on": None, "left_on": "v_l", "right_on": "v_r"},
     ("this checkpoint's interval_join state was written with left_on=['k'], right_on=['k']",
      "the query now has left_on=['v_l'], right_on=['v_r']")),
])
def test_changed_join_keys_on_restart_fail_clearly(spark, tmp_path, operator, first, then, message):
    """A join restarted on its checkpoint with other key columns (same types, so nothing else notices) fails
    with a message naming the arguments and both values, instead of matching rows on the wrong keys."""
    from helpers import checkpoint_fixtures as CF

    root, checkpoint = tmp_path / "input", tmp_path / "checkpoint"
    CF.write_inputs(root, operator, files=2)
    assert CF.run(spark, operator, root, checkpoint, **first)
    CF.write_inputs(root, operator, files=3)
    with pytest.raises(Exception) as info:
        CF.run(spark, operator, root, checkpoint, **then)
    sentence = cq.explain_error(info.value)
    assert sentence.startswith("ValueError: left_on, right_on") and all(m in sentence for m in message)


def test_join_state_records_and_checks_its_columns():
    """The payload table records the operator's key and input columns; a restore with other ones is refused
    naming what changed; a state saved before the columns were recorded passes."""
    import pyarrow as pa

    from pyspark_cq.operators._common.payload import PayloadSide

    schema = pa.schema([("__cq_k0", pa.int64()), ("__cq_p0_0", pa.int64())])
    side = PayloadSide(schema, pa.table({"__cq_k0": [1, 2], "__cq_p0_0": [3, 4]}, schema=schema))
    columns = {"on": ["k", "k", "k"], "inputs": [["ts_a", "k", "v_a"], ["ts_b", "k", "v_b"], ["ts_c", "k", "v_c"]]}
    restored = PayloadSide.from_bytes(schema, side.to_bytes(4, columns))
    restored.check_columns(columns, "multi_join")                    # the same columns: fine
    with pytest.raises(ValueError, match=r"^on: this checkpoint's multi_join state was written with "
                                         r"on=\['k', 'k', 'k'\], the query now has on=\['k', 'k', 'v_c'\]"):
        restored.check_columns({**columns, "on": ["k", "k", "v_c"]}, "multi_join")
    PayloadSide.from_bytes(schema, side.to_bytes(4)).check_columns({**columns, "on": ["x"] * 3}, "multi_join")


def test_join_state_checks_kept_column():
    """A join state records whether its rows carry their kept fraction (``kept_column``); a restart that
    turns it on or off is refused naming it, and states recorded before it existed count as without."""
    import json

    import pyarrow as pa

    from pyspark_cq.operators._common.payload import _COLUMNS_META, PayloadSide

    schema = pa.schema([("__cq_k0", pa.int64())])
    side = PayloadSide(schema, pa.table({"__cq_k0": [1]}, schema=schema))
    base = {"left_on": ["k"], "right_on": ["k"], "left": ["ts"], "right": ["ts"]}
    without = PayloadSide.from_bytes(schema, side.to_bytes(4, {**base, "kept": False}))
    without.check_columns({**base, "kept": False}, "interval_join")
    with pytest.raises(ValueError, match=r"^kept: .* written with kept=False, the query now has kept=True"):
        without.check_columns({**base, "kept": True}, "interval_join")
    with_kept = PayloadSide.from_bytes(schema, side.to_bytes(4, {**base, "kept": True}))
    with pytest.raises(ValueError, match="kept_column for the life of a checkpoint"):
        with_kept.check_columns({**base, "kept": False}, "interval_join")
    older = PayloadSide.from_bytes(schema, side.to_bytes(4, base))     # recorded before kept_column
    assert b"kept" not in older.table.schema.metadata[_COLUMNS_META]
    older.check_columns({**base, "kept": False}, "interval_join")
    assert json.loads(older.table.schema.metadata[_COLUMNS_META]) == base


def test_shard_count_error_names_each_defaults_rule():
    """A restore with another shard count names how ``shards=None`` picks it, for the form the query runs in
    (the stateless join takes the fixed 8, not twice the session's partitions)."""
    import pyarrow as pa

    from pyspark_cq.operators._common.shards import (
        AGGREGATE,
        JOIN,
        MULTI_JOIN,
        check_shard_count,
        default_rule,
        default_shard_count,
        with_shard_count,
    )

    saved = with_shard_count(pa.table({"x": [1]}), 4)
    check_shard_count(saved, 4, JOIN, default_rule(JOIN))   # the same count passes
    with pytest.raises(ValueError, match=r"written with shards=4, the query now has shards=8\. Pass shards=4 "
                                         r"\(the default is twice spark\.sql\.shuffle\.partitions when the query is "
                                         r"defined, 8 with state_persistence='stateless'\)"):
        check_shard_count(saved, 8, JOIN, default_rule(JOIN))
    assert default_shard_count(MULTI_JOIN) == 8 and "8" in default_rule(MULTI_JOIN)
    assert "8 when by is given" in default_rule(AGGREGATE)
