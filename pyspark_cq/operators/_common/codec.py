"""Exact value transport for the interval join: Spark columns -> pandas -> Arrow -> pandas -> Spark.

``applyInPandasWithState`` hands the operator pandas frames, and pandas loses information on the way:
a nullable ``long`` with a null becomes ``float64`` (values above 2**53 change) and a null ``double``
becomes ``NaN`` (indistinguishable from a real NaN). So every numeric column travels as the value with
nulls replaced by 0 plus a boolean null flag, and is rebuilt as an exact Arrow array on the worker.
A ``TIMESTAMP`` column travels the same way as its epoch microseconds: PySpark would hand it over as a
naive time in the session zone, in which the repeated hour of a daylight-saving fold names two
instants. Output frames use pandas' nullable extension dtypes (timestamps as UTC instants), which Spark
converts back without loss.

Keys are turned into byte strings (:func:`encode_keys`) that the native kernel compares in full, with
SQL equality: a null never equals anything, ``-0.0 == 0.0`` and ``NaN == NaN`` (as Spark normalises
floating-point join keys).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

#: Suffix of the null-flag column that accompanies an encoded numeric column.
NULL_SUFFIX = "__n"

_FLAGGED = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.TimestampType)
_FLOATS = (T.FloatType, T.DoubleType)


@dataclass(frozen=True)
class ColumnCodec:
    """How one value column travels: its transport name, Spark type and whether it has a null flag."""

    name: str
    dtype: T.DataType
    flagged: bool

    @property
    def arrow_type(self) -> pa.DataType:
        """The column's Arrow type."""
        from pyspark.sql.pandas.types import to_arrow_type

        return to_arrow_type(self.dtype, timezone="UTC")

    @property
    def _micros(self) -> bool:
        return isinstance(self.dtype, T.TimestampType)

    def spark_columns(self, source) -> list:
        """Spark columns carrying ``source`` (a Column, or None for an all-null column of this type)."""
        if source is None:
            if not self.flagged:
                return [F.lit(None).cast(self.dtype).alias(self.name)]
            # A 0, not a null: one null would turn the whole pandas column into float64.
            zero = F.lit(0).cast("long" if self._micros else self.dtype)
            return [zero.alias(self.name), F.lit(True).alias(self.name + NULL_SUFFIX)]
        if not self.flagged:
            # An explicit metadata replaces the source's, so no watermark marker is copied along.
            return [source.alias(self.name, metadata={"pyspark_cq": "payload"})]
        if self._micros:
            source = F.unix_micros(source)
        zero = F.lit(0).cast("long" if self._micros else self.dtype)
        return [F.coalesce(source, zero).alias(self.name, metadata={"pyspark_cq": "payload"}),
                source.isNull().alias(self.name + NULL_SUFFIX)]

    @property
    def payload_field(self) -> pa.Field:
        """The Arrow field of this column in a stored payload table: its type, except that TIMESTAMP_NTZ is
        kept as pandas' naive nanoseconds (TIMESTAMP travels as exact UTC microseconds) so that the way back
        to Spark is the identity.
        """
        atype = self.arrow_type
        if pa.types.is_timestamp(atype) and atype.tz is None:
            atype = pa.timestamp("ns")
        return pa.field(self.name, atype)

    def to_arrow(self, pdf: pd.DataFrame) -> pa.Array:
        """Rebuild the exact Arrow column from a transported pandas frame."""
        series = pdf[self.name]
        atype = self.arrow_type
        if self.flagged:
            mask = pdf[self.name + NULL_SUFFIX].to_numpy(dtype=bool, na_value=True)
            if self._micros:
                return pa.array(np.asarray(series, dtype=np.int64), type=pa.int64(), mask=mask).cast(atype)
            # No na_value: a float NaN is a value here (nulls travel in the flag column).
            values = np.asarray(series, dtype=atype.to_pandas_dtype())
            return pa.array(values, type=atype, mask=mask, from_pandas=False)
        if pa.types.is_timestamp(atype):
            # TIMESTAMP_NTZ: pandas holds it as naive datetime64; keep it naive (nanoseconds) so that
            # the way back to Spark is the identity.
            return pa.Array.from_pandas(series, type=pa.timestamp("ns"))
        return pa.Array.from_pandas(series, type=atype)


def codecs_for(schema: T.StructType, columns: list[str], prefix: str) -> list[ColumnCodec]:
    """Codecs for ``columns`` of ``schema``, named ``<prefix><i>`` in transport."""
    out = []
    for i, c in enumerate(columns):
        dtype = schema[c].dataType
        out.append(ColumnCodec(f"{prefix}{i}", dtype, isinstance(dtype, _FLAGGED)))
    return out


def normalized_key(col, dtype: T.DataType):
    """A Spark column equal under SQL join equality (float keys: -0.0 -> 0.0, one NaN)."""
    if isinstance(dtype, _FLOATS):
        return F.when(F.isnan(col), F.lit(float("nan")).cast(dtype)).when(
            col == 0, F.lit(0.0).cast(dtype)).otherwise(col)
    return col


def _fixed_width(arr: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a fixed-width array's value bytes (null slots hold arbitrary bytes)."""
    n = len(arr)
    buf = arr.buffers()[1]
    data = np.frombuffer(buf, dtype=np.uint8)[arr.offset * width:(arr.offset + n) * width]
    return np.arange(n + 1, dtype=np.int64) * width, np.ascontiguousarray(data)


def _key_part(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    t = arr.type
    if pa.types.is_floating(t):
        values = arr.to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(np.isnan(values), np.float64("nan"), values)
        values = np.where(values == 0, 0.0, values)
        return np.arange(len(values) + 1, dtype=np.int64) * 8, values.view(np.uint8)
    if pa.types.is_boolean(t):
        values = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return np.arange(len(values) + 1, dtype=np.int64), values
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        arr = arr.cast(pa.large_binary())
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
        data_buf = arr.buffers()[2]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        return np.ascontiguousarray(offsets), data
    if pa.types.is_timestamp(t):
        return _key_part(arr.cast(pa.int64()))
    width = getattr(t, "bit_width", 0) // 8
    if width <= 0 or len(arr.buffers()) != 2:
        raise TypeError(f"on: join keys of type {t} are not supported; use numbers, strings, binary, "
                        f"booleans, dates, timestamps or decimals")
    if len(arr) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    return _fixed_width(arr, width)


def encode_keys(arrays: list[pa.Array], concat) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Byte keys ``(offsets, data, null_mask)`` of the rows of ``arrays`` (one array per key column).

    ``concat`` is the kernel's ``concat_keys`` (joins several columns into one injective encoding).
    ``null_mask`` is None when no key component is null.
    """
    parts = [_key_part(a) for a in arrays]
    offsets, data = parts[0] if len(parts) == 1 else concat(parts)
    null = None
    for a in arrays:
        if a.null_count:
            m = a.is_null().to_numpy(zero_copy_only=False)
            null = m if null is None else (null | m)
    return offsets, data, (None if null is None else null.astype(np.uint8))


#: The instants pandas' ``datetime64[ns]`` holds (1677-09-21 .. 2262-04-11), in epoch microseconds.
#: ``applyInPandasWithState`` hands timestamp columns to the worker in that type, so a time outside it
#: would fail in PySpark's conversion with a worker traceback naming no argument.
PANDAS_MIN_US, PANDAS_MAX_US = -9_223_372_036_854_775, 9_223_372_036_854_775


def checked_micros(micros, operator: str, argument: str, column: str):
    """``micros`` (epoch microseconds of the time column ``column``), raising a Spark error that names
    the operator, the argument and the supported range for a time pandas cannot hold (docs/errors.md,
    "Times outside 1677–2262"). A Spark-side check: it fails before any row reaches a Python worker.
    """
    msg = (f"{operator}: {argument} column {column!r} holds a time outside 1677-09-21 .. 2262-04-11, the range "
           f"the operator's pandas transport holds; filter or clamp such rows before the join")
    return F.when((micros < PANDAS_MIN_US) | (micros > PANDAS_MAX_US), F.raise_error(F.lit(msg))).otherwise(micros)
