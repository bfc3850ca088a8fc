"""Aggregation specification of :func:`pyspark_cq.sliding_aggregate`: parsing, types, partial layout.

The user's ``aggs`` mapping becomes two lists shared by the map side and the stateful side:

- *partials*: what a slice (one key, one granule) keeps -- ``count(*)`` first, then per value column its
  non-null count and, as needed, sum / min / max. Each partial is an ``(op, column)`` pair for the
  map-side kernel; its combine kind follows from the op.
- *outputs*: the user's aggregates in order, each computed from one or two partials.

It also fixes the physical (Arrow) transport of the grouping keys through the shuffle so they survive
the pandas conversion of ``applyInPandasWithState`` exactly (nullable integers, NaN vs null, time zones).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

__all__ = ["MOMENTS", "DERIVED", "AGG_NAMES", "QUANTILE_FUNCS", "AGG_FORMS", "DD_ALPHA", "DD_BINS", "DD_WORDS",
           "QUANTILE_UNITS", "HLL_P", "HLL_WORDS", "HLL_THRESHOLD", "OP_ROWS", "OP_COUNT", "OP_SUM_I", "OP_SUM_F",
           "OP_MIN_I", "OP_MIN_F", "OP_MAX_I", "OP_MAX_F", "OP_SUM_HI", "OP_HLL", "OP_FIRST", "OP_LAST",
           "OP_PAIR_VALUE", "OP_MOMENTS", "OP_DDSKETCH", "KIND_ADD_I64", "KIND_ADD_F64", "KIND_MIN", "KIND_MAX",
           "KIND_MAX_BYTES", "KIND_FIRST", "KIND_LAST", "KIND_PAIR_VALUE", "KIND_MOMENTS", "KIND_DDSKETCH",
           "NATIVE_ONLY_OPS", "OUT_COUNT", "OUT_SUM_I", "OUT_SUM_F", "OUT_AVG_I", "OUT_AVG_F", "OUT_MIN", "OUT_MAX",
           "OUT_SUM_I_CHECKED", "OUT_RAW", "OUT_QUANTILE", "Output", "ValueColumn", "KeyColumn", "AggSpec",
           "parse_quantile", "quantile_output_name", "parse_aggs", "SHED_VALUE", "with_kept", "kept_fraction",
           "has_high_half", "key_columns", "arrow_type", "to_int64", "from_int64", "nonnull_numpy"]

#: The second moments (Spark's names; ``stddev`` is ``stddev_samp``, ``variance`` is ``var_samp``).
MOMENTS = ("stddev", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop")
#: Aggregates finished in Python from several kernel outputs (see :class:`Output`).
DERIVED = MOMENTS + ("approx_count_distinct", "first", "last")
AGG_NAMES = ("count", "sum", "min", "max", "avg") + DERIVED
#: Spark's names of the approximate percentile, written with the percentage: ``"percentile_approx(0.95)"``.
QUANTILE_FUNCS = ("percentile_approx", "approx_percentile")
#: How the aggregates are listed in error messages.
AGG_FORMS = AGG_NAMES + tuple(f"{f}(p)" for f in QUANTILE_FUNCS)
_QUANTILE_RE = re.compile(r"\s*(percentile_approx|approx_percentile)\s*(?:\((.*)\))?\s*", re.IGNORECASE | re.DOTALL)
#: DDSketch of percentile_approx (native/aggregate_core.hpp, kDDSketch): relative accuracy alpha, bins (one
#: sign: all, both: half each; collapsing the lowest), int64 words per sketch; percentages in units of 1e-9.
DD_ALPHA = 0.02
DD_BINS = 1024
DD_WORDS = 9 + DD_BINS // 2
QUANTILE_UNITS = 10**9
#: HyperLogLog precision of ``approx_count_distinct``: Spark's default ``rsd=0.05`` gives
#: ``p = ceil(2 log2(1.106 / rsd)) = 9`` (HyperLogLogPlusPlus), 2^9 registers in 64 words.
HLL_P = 9
HLL_WORDS = (1 << HLL_P) // 8
#: Linear counting is used up to this estimate at p = 9 (Heule, Nunkesser, Hall, "HyperLogLog in
#: Practice", appendix, the empirical thresholds; Spark's HyperLogLogPlusPlusHelper uses the same).
HLL_THRESHOLD = 400

# Op / kind / output codes of native/aggregate_core.hpp (checked against the module in tests).
OP_ROWS, OP_COUNT, OP_SUM_I, OP_SUM_F, OP_MIN_I, OP_MIN_F, OP_MAX_I, OP_MAX_F, OP_SUM_HI, OP_HLL = range(10)
OP_FIRST, OP_LAST, OP_PAIR_VALUE, OP_MOMENTS, OP_DDSKETCH = 10, 11, 12, 13, 14
(KIND_ADD_I64, KIND_ADD_F64, KIND_MIN, KIND_MAX, KIND_MAX_BYTES, KIND_FIRST, KIND_LAST, KIND_PAIR_VALUE,
 KIND_MOMENTS, KIND_DDSKETCH) = range(1, 11)
#: Ops whose partials Spark's own aggregation cannot compute (the batch path slices with the native slicer).
NATIVE_ONLY_OPS = (OP_HLL, OP_FIRST, OP_LAST, OP_MOMENTS, OP_DDSKETCH)
(OUT_COUNT, OUT_SUM_I, OUT_SUM_F, OUT_AVG_I, OUT_AVG_F, OUT_MIN, OUT_MAX, OUT_SUM_I_CHECKED, OUT_RAW,
 OUT_QUANTILE) = range(1, 11)

_KIND_OF_OP = {OP_ROWS: KIND_ADD_I64, OP_COUNT: KIND_ADD_I64, OP_SUM_I: KIND_ADD_I64, OP_SUM_F: KIND_ADD_F64,
               OP_MIN_I: KIND_MIN, OP_MIN_F: KIND_MIN, OP_MAX_I: KIND_MAX, OP_MAX_F: KIND_MAX, OP_SUM_HI: KIND_ADD_I64,
               OP_HLL: KIND_MAX_BYTES, OP_FIRST: KIND_FIRST, OP_LAST: KIND_LAST, OP_PAIR_VALUE: KIND_PAIR_VALUE,
               OP_MOMENTS: KIND_MOMENTS, OP_DDSKETCH: KIND_DDSKETCH}

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOATING = (T.FloatType, T.DoubleType)
_ORDERED_INT = _INTEGRAL + (T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)
#: Types a ``by`` column may have (atomic types Spark can group by and Arrow can carry).
_KEY_TYPES = _ORDERED_INT + _FLOATING + (T.StringType, T.BinaryType, T.DecimalType)


@dataclass(frozen=True)
class Output:
    """One user aggregate: output ``name``, ``kind`` (OUT_*), partial indices, Spark result type.

    ``extra`` are further kernel outputs ``(kind, value, count)`` that a derived aggregate (``agg`` in
    :data:`DERIVED`) is finished from in Python: the moments from (count, sum, sum of squares), the
    distinct count from its HyperLogLog words.
    """

    name: str
    agg: str
    column: str | None
    kind: int
    value: int
    count: int
    dtype: T.DataType
    extra: tuple[tuple[int, int, int], ...] = ()

    @property
    def kernel_outputs(self) -> tuple[tuple[int, int, int], ...]:
        """``(kind, op index, column index)`` of each kernel output this output reads."""
        return ((self.kind, self.value, self.count),) + self.extra


@dataclass(frozen=True)
class ValueColumn:
    """A column aggregated by some output: ``cls`` is 'i' (int64 transport), 'f' (float64) or 'c' (count only).

    ``derive`` says what the map side feeds instead of the column itself: ``"double"`` the value as a
    double (second moments), ``"time"`` the event time (first / last), ``"hash"`` its 64-bit xxhash64 with seed 42, null
    for nulls (Spark's HyperLogLog hash); ``name`` is then the source column. ``"shed"``: 1 for a row the
    slicer's load shedding dropped, else 0 (``kept_column``; no source column, the slicer makes it).
    """

    name: str
    dtype: T.DataType
    cls: str
    derive: str | None = None


@dataclass(frozen=True)
class KeyColumn:
    """A ``by`` column and how it crosses the shuffle: 'raw' (as is) or 'i' / 'f' (int64 / float64 + null flag)."""

    name: str
    dtype: T.DataType
    transport: str
    nullable: bool


@dataclass(frozen=True)
class AggSpec:
    """The parsed ``aggs``: value columns, the kernel's partials (``ops``) and the outputs."""

    values: tuple[ValueColumn, ...]
    ops: tuple[tuple[int, int], ...]   # per partial: (op, value column index or -1)
    outputs: tuple[Output, ...]

    @property
    def kinds(self) -> np.ndarray:
        """The partials' kinds, as the kernel takes them."""
        return np.array([_KIND_OF_OP[op] for op, _ in self.ops], dtype=np.uint8)

    @property
    def ops_array(self) -> np.ndarray:
        """The partials ``(op, column)``, as the kernel takes them."""
        return np.array([x for pair in self.ops for x in pair], dtype=np.int32)

    @property
    def outputs_array(self) -> np.ndarray:
        """The kernel outputs of every output, as the kernel takes them."""
        return np.array([x for o in self.outputs for k in o.kernel_outputs for x in k], dtype=np.int32)


def parse_quantile(column: str, name: str) -> tuple[str, float] | None:
    """``(canonical name, percentage)`` of ``"percentile_approx(p)"`` / ``"approx_percentile(p)"``, None
    for any other aggregate.

    Raises
    ------
    ValueError
        Naming ``aggs[column]`` and the expected form, for a missing or second argument (the accuracy is
        fixed: the sketch's relative error) or a percentage outside [0, 1].
    """
    m = _QUANTILE_RE.fullmatch(name)
    if m is None:
        return None
    func = m.group(1).lower()
    form = f"e.g. '{func}(0.95)' (one percentage in [0, 1])"
    arg = m.group(2)
    if arg is None or not arg.strip():
        raise ValueError(f"aggs[{column!r}]: {name!r} needs its percentage, {form}")
    if "," in arg:
        raise ValueError(f"aggs[{column!r}]: {name!r} takes one argument, the percentage, {form}; the accuracy "
                         f"is fixed (relative error {DD_ALPHA}, docs/aggregate.md), and several percentages are "
                         f"several aggregates")
    try:
        pct = float(arg)
    except ValueError:
        raise ValueError(f"aggs[{column!r}]: {name!r}: the percentage must be a number in [0, 1], {form}") from None
    if not 0.0 <= pct <= 1.0:
        raise ValueError(f"aggs[{column!r}]: {name!r}: the percentage must be in [0, 1], {form}; got {pct!r}")
    return f"{func}({pct!r})", pct


def quantile_output_name(name: str, pct: float, column: str) -> str:
    """``percentile_approx_0_95_<column>``: ``<agg>_<column>`` with the percentage's digits.

    The dot becomes ``_``: in a column name it would make ``col()`` read a nested field.
    """
    func = name.split("(", 1)[0]
    digits = np.format_float_positional(pct, trim="-").replace(".", "_")
    return f"{func}_{digits}_{column}"


def parse_aggs(df, aggs, by: Sequence[str], ansi: bool = True, time: str | None = None) -> AggSpec:
    """Validate ``aggs`` against ``df``'s schema and lay out partials and outputs.

    An integral column's ``sum`` partial is followed by the sum of its values' high halves
    (``OP_SUM_HI``) when the column has an ``avg`` (computed from the exact sum, as Spark's avg of longs
    sums in doubles and never wraps) or, with ``ansi`` (Spark's ``spark.sql.ansi.enabled``), a ``sum``
    (then ``OUT_SUM_I_CHECKED``: the kernel flags a window whose exact sum leaves the long range).

    Raises
    ------
    TypeError, ValueError
        Naming ``aggs`` and the offending column or aggregate.
    """
    if aggs is None:
        aggs = {"*": ["count"]}
    if not isinstance(aggs, Mapping):
        raise TypeError(f"aggs must be a mapping of column name to a list of aggregates "
                        f"({', '.join(AGG_FORMS)}), e.g. {{'value': ['sum', 'max'], '*': ['count']}}; "
                        f"got {type(aggs).__name__}")
    if not aggs:
        raise ValueError("aggs must name at least one aggregate")
    schema = df.schema
    values: list[ValueColumn] = []
    value_index: dict[str, int] = {}
    requested: list[tuple[str, str]] = []
    pct_of: dict[str, float] = {}   # canonical quantile name -> percentage
    for column, names in aggs.items():
        if not isinstance(column, str):
            raise TypeError(f"aggs keys must be column names (str) or '*', got {column!r}")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, (list, tuple)) or not names:
            raise TypeError(f"aggs[{column!r}] must be a non-empty list of aggregates, got {names!r}")
        for name in names:
            quantile = parse_quantile(column, name) if isinstance(name, str) else None
            if quantile is not None:
                name, pct_of[quantile[0]] = quantile
            elif not isinstance(name, str) or name.lower() not in AGG_NAMES:
                raise ValueError(f"aggs[{column!r}]: unknown aggregate {name!r}; "
                                 f"supported: {', '.join(AGG_FORMS)}")
            name = name.lower()
            if column == "*":
                if name != "count":
                    raise ValueError(f"aggs['*'] only supports 'count' (count(*)), got {name!r}")
            else:
                if column not in schema.names:
                    raise ValueError(f"aggs: unknown column {column!r}; available columns: {schema.names}")
                _check_type(column, schema[column].dataType, name)
            requested.append((column, name))
    # Value columns and their classes.
    for column, _agg in requested:
        if column == "*":
            continue
        dtype = schema[column].dataType
        names = {n for c, n in requested if c == column}
        cls = "f" if isinstance(dtype, _FLOATING) else "i"
        needs_values = bool(names - {"count", "approx_count_distinct"} - set(MOMENTS) - set(pct_of))
        if column not in value_index:
            value_index[column] = len(values)
            values.append(ValueColumn(column, dtype, cls if needs_values else "c"))
    # Derived value columns: the value as a double (second moments, quantiles), hashes (distinct counts).
    derived: set[tuple[str, str]] = set()
    for column, name in requested:
        kinds = (("double",) if name in MOMENTS or name in pct_of else
                 ("hash",) if name == "approx_count_distinct" else ())
        for kind in kinds:
            if (column, kind) not in derived:
                derived.add((column, kind))
                values.append(ValueColumn(column, T.LongType() if kind == "hash" else T.DoubleType(),
                                          "i" if kind == "hash" else "f", kind))
        if name in ("first", "last") and "time" not in {v.derive for v in values}:
            if time is None:
                raise ValueError("first / last need the event-time column (parse_aggs(..., time=...))")
            values.append(ValueColumn(time, schema[time].dataType, "i", "time"))
    # Partials: count(*) first, then per column count, sum, min, max as needed.
    ops: list[tuple[int, int]] = [(OP_ROWS, -1)]
    where: dict[tuple[str, str], int] = {}
    for ci, vc in enumerate(values):
        if vc.derive == "double":
            names = {n for c, n in requested if c == vc.name}
            if names & set(MOMENTS):   # (n, mean, M2) of the value as a double: the second moments
                where[(vc.name, "moments")] = len(ops)
                ops += [(OP_MOMENTS, ci), (OP_PAIR_VALUE, ci), (OP_PAIR_VALUE, ci)]
            if names & set(pct_of):    # one DDSketch for all the column's percentages
                where[(vc.name, "ddsketch")] = len(ops)
                ops += [(OP_DDSKETCH, ci)] + [(OP_PAIR_VALUE, ci)] * (DD_WORDS - 1)
            continue
        if vc.derive == "hash":
            where[(vc.name, "hll")] = len(ops)
            ops += [(OP_HLL, ci)] * HLL_WORDS
            continue
        names = {n for c, n in requested if c == vc.name}
        where[(vc.name, "count")] = len(ops)
        ops.append((OP_COUNT, ci))
        f = vc.cls == "f"
        if names & {"sum", "avg"}:
            where[(vc.name, "sum")] = len(ops)
            ops.append((OP_SUM_F if f else OP_SUM_I, ci))
            if not f and ("avg" in names or ansi):
                ops.append((OP_SUM_HI, ci))
        if "min" in names:
            where[(vc.name, "min")] = len(ops)
            ops.append((OP_MIN_F if f else OP_MIN_I, ci))
        if "max" in names:
            where[(vc.name, "max")] = len(ops)
            ops.append((OP_MAX_F if f else OP_MAX_I, ci))
    # first / last: a (time, value) pair per aggregate, the time from the event-time column
    for column, name in requested:
        if name in ("first", "last"):
            t = next(i for i, v in enumerate(values) if v.derive == "time")
            where[(column, name)] = len(ops)
            ops += [(OP_FIRST if name == "first" else OP_LAST, t), (OP_PAIR_VALUE, value_index[column])]
    outputs: list[Output] = []
    seen: set[str] = set()
    for column, name in requested:
        out_name = ("count" if column == "*" else quantile_output_name(name, pct_of[name], column)
                    if name in pct_of else f"{name}_{column}")
        if out_name in seen:
            raise ValueError(f"aggs asks for {name!r} of {column!r} twice")
        seen.add(out_name)
        if column == "*":
            outputs.append(Output(out_name, name, None, OUT_COUNT, 0, -1, T.LongType()))
            continue
        dtype = schema[column].dataType
        f = isinstance(dtype, _FLOATING)
        cnt = where[(column, "count")]
        if name in MOMENTS:
            # (n, mean, M2), finished by finish.moment
            p = where[(column, "moments")]
            outputs.append(Output(out_name, name, column, OUT_RAW, p, -1, T.DoubleType(),
                                  extra=((OUT_RAW, p + 1, -1), (OUT_RAW, p + 2, -1))))
        elif name in pct_of:
            outputs.append(Output(out_name, name, column, OUT_QUANTILE, where[(column, "ddsketch")],
                                  round(pct_of[name] * QUANTILE_UNITS), dtype))
        elif name in ("first", "last"):
            p = where[(column, name)]
            outputs.append(Output(out_name, name, column, OUT_RAW, p + 1, -1, dtype, extra=((OUT_RAW, p, -1),)))
        elif name == "approx_count_distinct":
            h = where[(column, "hll")]
            outputs.append(Output(out_name, name, column, OUT_RAW, h, -1, T.LongType(),
                                  extra=tuple((OUT_RAW, h + i, -1) for i in range(1, HLL_WORDS))))
        elif name == "count":
            outputs.append(Output(out_name, name, column, OUT_COUNT, cnt, -1, T.LongType()))
        elif name == "sum":
            s = where[(column, "sum")]
            kind = OUT_SUM_F if f else (OUT_SUM_I_CHECKED if has_high_half(ops, s) else OUT_SUM_I)
            outputs.append(Output(out_name, name, column, kind, s, cnt, T.DoubleType() if f else T.LongType()))
        elif name == "avg":
            outputs.append(Output(out_name, name, column, OUT_AVG_F if f else OUT_AVG_I, where[(column, "sum")], cnt,
                                  T.DoubleType()))
        else:
            outputs.append(Output(out_name, name, column, OUT_MIN if name == "min" else OUT_MAX,
                                  where[(column, name)], cnt, dtype))
    return AggSpec(tuple(values), tuple(ops), tuple(outputs))


#: The value column of the shed-row count behind ``kept_column`` (:func:`with_kept`).
SHED_VALUE = "__cq_shed_rows"


def with_kept(spec: AggSpec, name: str) -> AggSpec:
    """``spec`` with a window's kept fraction as output ``name`` (RTStream, Wei et al., §4.4: each result
    says what fraction of its input the shedding stage kept).

    One more partial per slice, the sum of a 0/1 value column that marks the rows load shedding dropped
    (the slicer feeds it; every other value of a shed row reaches the kernel as null, so no aggregate sees
    it, and count(*) counts kept rows only). The output is finished from the window's count(*) ``k`` and its
    shed rows ``s`` as ``k / (k + s)`` (:func:`kept_fraction`).
    """
    values = spec.values + (ValueColumn(SHED_VALUE, T.LongType(), "i", "shed"),)
    ops = spec.ops + ((OP_SUM_I, len(spec.values)),)
    out = Output(name, "kept", None, OUT_COUNT, 0, -1, T.DoubleType(), extra=((OUT_COUNT, len(spec.ops), -1),))
    return AggSpec(values, ops, spec.outputs + (out,))


def kept_fraction(kept: np.ndarray, shed: np.ndarray) -> np.ndarray:
    """The kept fraction per window, ``kept / (kept + shed)`` (1.0 where nothing was shed)."""
    kept = np.asarray(kept, dtype=np.float64)
    return kept / (kept + np.asarray(shed, dtype=np.float64))


def has_high_half(ops, j: int) -> bool:
    """Whether partial ``j`` (an integral sum) is followed by its high-half sum (``OP_SUM_HI``)."""
    return j + 1 < len(ops) and ops[j + 1][0] == OP_SUM_HI


def _check_type(column: str, dtype: T.DataType, name: str) -> None:
    if name == "count":
        return
    if name == "approx_count_distinct":
        if not isinstance(dtype, _KEY_TYPES):
            raise TypeError(f"aggs[{column!r}]: approx_count_distinct needs an atomic column (numbers, booleans, "
                            f"strings, binary, decimals, dates, timestamps); {column!r} has type "
                            f"{dtype.simpleString()}")
        return
    if name in ("sum", "avg") + MOMENTS or _QUANTILE_RE.fullmatch(name):
        if isinstance(dtype, T.DecimalType):
            raise TypeError(f"aggs[{column!r}]: {name} of decimal columns is not supported by sliding_aggregate; "
                            f"cast {column!r} to double or long first")
        if not isinstance(dtype, _INTEGRAL + _FLOATING):
            raise TypeError(f"aggs[{column!r}]: {name} needs a numeric column; {column!r} has type "
                            f"{dtype.simpleString()}")
        return
    if not isinstance(dtype, _ORDERED_INT + _FLOATING):
        raise TypeError(f"aggs[{column!r}]: {name} is supported for numeric, boolean, date and timestamp columns; "
                        f"{column!r} has type {dtype.simpleString()}")


def key_columns(df, by: Sequence[str]) -> tuple[KeyColumn, ...]:
    """How the ``by`` columns travel (see module docstring)."""
    out = []
    for name in by:
        field = df.schema[name]
        dtype = field.dataType
        if not isinstance(dtype, _KEY_TYPES):
            raise TypeError(f"by: column {name!r} has type {dtype.simpleString()}; sliding_aggregate groups by "
                            f"atomic columns (numbers, booleans, strings, binary, decimals, dates, timestamps)")
        if isinstance(dtype, _FLOATING):
            transport = "f"
        elif isinstance(dtype, _ORDERED_INT):
            transport = "i"
        else:
            transport = "raw"
        out.append(KeyColumn(name, dtype, transport, field.nullable))
    return tuple(out)


# ---- Arrow conversions ------------------------------------------------------------------------------

def arrow_type(dtype: T.DataType, tz: str = "UTC") -> pa.DataType:
    """The Arrow type Spark uses for ``dtype`` (UTC for timestamps with a zone)."""
    if isinstance(dtype, T.TimestampType):
        return pa.timestamp("us", tz=tz)
    if isinstance(dtype, T.TimestampNTZType):
        return pa.timestamp("us")
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(dtype)


def to_int64(arr: pa.Array) -> pa.Array:
    """Integral / boolean / date / timestamp Arrow array as int64 (timestamps in microseconds)."""
    t = arr.type
    if pa.types.is_timestamp(t):
        arr = arr.cast(pa.timestamp("us", tz=t.tz)) if t.unit != "us" else arr
        return arr.cast(pa.int64())
    if pa.types.is_date32(t):
        return arr.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_boolean(t):
        return arr.cast(pa.int8()).cast(pa.int64())
    return arr.cast(pa.int64())


def from_int64(values: np.ndarray, valid: np.ndarray | None, dtype: T.DataType) -> pa.Array:
    """Inverse of :func:`to_int64` for a Spark type, with an optional validity mask (uint8/bool)."""
    mask = None if valid is None else ~np.asarray(valid, dtype=bool)
    base = pa.array(np.asarray(values, dtype=np.int64), mask=mask, type=pa.int64())
    if isinstance(dtype, T.TimestampType):
        return base.cast(pa.timestamp("us", tz="UTC"))
    if isinstance(dtype, T.TimestampNTZType):
        return base.cast(pa.timestamp("us"))
    if isinstance(dtype, T.DateType):
        return base.cast(pa.int32()).cast(pa.date32())
    if isinstance(dtype, T.BooleanType):
        return pc.not_equal(base, 0)
    return base.cast(arrow_type(dtype))


def nonnull_numpy(arr: pa.Array, np_type) -> tuple[np.ndarray, np.ndarray | None]:
    """(values with nulls as 0, uint8 validity or None) of a numeric Arrow array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
        arr = arr.fill_null(0)
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False), dtype=np_type), valid
