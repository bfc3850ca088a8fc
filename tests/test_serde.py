"""The state byte format (native/serde.hpp through pyspark_cq._serde)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyspark_cq._native import load

serde = load("_serde")
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(DTYPES).flatmap(
    lambda d: hnp.arrays(np.dtype(d), st.integers(0, 50))), max_size=6))
def test_round_trip(columns):
    back = serde.unpack(serde.pack(columns))
    assert len(back) == len(columns)
    for a, b in zip(columns, back):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_non_contiguous_input_is_packed_in_order():
    a = np.arange(20, dtype=np.int64)[::3]
    (b,) = serde.unpack(serde.pack([a]))
    np.testing.assert_array_equal(a, b)


def test_every_truncation_is_rejected():
    blob = serde.pack([np.arange(7, dtype=np.int32), np.array([1.5])])
    for cut in range(len(blob)):
        with pytest.raises(ValueError):
            serde.unpack(blob[:cut])
    with pytest.raises(ValueError, match="trailing"):
        serde.unpack(blob + b"\0")
    with pytest.raises(ValueError, match="magic"):
        serde.unpack(b"XXXX" + blob[4:])


def test_bad_columns_name_their_position():
    with pytest.raises(TypeError, match=r"columns\[1\] has unsupported dtype"):
        serde.pack([np.arange(3), np.array(["a"], dtype=object)])
    with pytest.raises(ValueError, match=r"columns\[0\] must be 1-D"):
        serde.pack([np.zeros((2, 2))])
    with pytest.raises(TypeError, match=r"columns\[0\] must be a 1-D numpy array"):
        serde.pack([[1, 2, 3]])


# --- GroupState blobs: zstd framing (pyspark_cq.operators._common.state_bytes) -------------------------------


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=5000))
def test_state_blob_round_trip(blob):
    from pyspark_cq.operators._common import state_bytes as _state_bytes

    packed = _state_bytes.pack(blob)
    assert packed[:4] == b"CQZ1"
    assert _state_bytes.unpack(packed) == blob


def test_state_blob_compresses_kernel_images_and_reads_old_state():
    from pyspark_cq.operators._common import state_bytes as _state_bytes

    raw = serde.pack([np.arange(100_000, dtype=np.int64), np.full(100_000, 7, dtype=np.int64)])
    packed = _state_bytes.pack(raw)
    assert len(packed) * 4 < len(raw)
    assert _state_bytes.unpack(packed) == raw
    assert _state_bytes.unpack(raw) == raw  # a checkpoint written before compression: no header
    with pytest.raises(TypeError, match="blob must be bytes"):
        _state_bytes.pack("text")


def test_state_table_round_trip():
    import pyarrow as pa

    from pyspark_cq.operators._common import state_bytes as _state_bytes

    table = pa.table({"k": pa.array([1, None, 3], pa.int64()), "s": ["a", "b", None]})
    assert _state_bytes.table_from_bytes(_state_bytes.table_to_bytes(table)).equals(table)
