"""Finishing the aggregates of :func:`pyspark_cq.sliding_aggregate`: the kernel's emitted windows to the
output table (:func:`output_table`), with the maths of the derived aggregates (moments, HyperLogLog,
quantiles) and Spark's long-overflow error.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from ..._native import load
from .config import AggConfig
from .spec import (
    HLL_THRESHOLD,
    OUT_AVG_F,
    OUT_AVG_I,
    OUT_MAX,
    OUT_MIN,
    OUT_QUANTILE,
    OUT_SUM_F,
    OUT_SUM_I_CHECKED,
    arrow_type,
    from_int64,
    kept_fraction,
)

__all__ = ["check_overflow", "moment", "hll_estimate", "quantile_column"]


def check_overflow(config: AggConfig, output, valid: np.ndarray, slot, frm, to, keys_tbl) -> None:
    """Raise Spark's ARITHMETIC_OVERFLOW (ANSI mode) for the first emitted window whose exact long sum
    ``output`` left the long range (the kernel marks it with validity 2).

    Raises
    ------
    OverflowError
        Naming the operator (its metrics name), the aggregate, the group key and the window.
    """
    bad = np.flatnonzero(valid == 2)
    if not len(bad):
        return
    i = int(bad[0])
    bounds = [from_int64(np.array([x[i]]), None, config.time_type)[0].as_py() for x in (frm, to)]
    key = {}
    if config.keys:
        row = keys_tbl.take(pa.array([slot[i]])).to_pylist()[0]
        key = {k.name: row[k.name] for k in config.keys}
    lo, hi = config.out_names[0], config.out_names[1]
    raise OverflowError(
        f"[ARITHMETIC_OVERFLOW] long overflow in sliding_aggregate {config.name!r}: {output.name} "
        f"(sum of the long column {output.column!r}) for the group {key} in the window "
        f"[{lo}={bounds[0]}, {hi}={bounds[1]}) is outside the long range; Spark's sum raises this error "
        f"with spark.sql.ansi.enabled=true (the setting when the query was defined). Cast the column to "
        f"decimal or double first, or set spark.sql.ansi.enabled to false to get Spark's wrapped-around "
        f"value (the query must be defined again). SQLSTATE: 22003")


def moment(agg: str, n: np.ndarray, m2: np.ndarray) -> pa.Array:
    """``stddev`` / ``variance`` (sample or population, Spark's names) from the count ``n`` and the sum
    of squared deviations ``M2`` (doubles) that the kernel keeps per slice and window.

    The kernel merges ``(n, mean, M2)`` with the pairwise update of Chan, Golub and LeVeque (1983,
    eq. 2.1) and computes each slice's with Welford's update, as Spark's ``CentralMomentAgg`` does; no
    large sums of squares are subtracted, so the relative error is about ``eps * |mean| / std`` rather
    than ``eps * mean**2 / var`` (docs/aggregate.md). Like Spark: null for ``n = 0``, and for ``n = 1`` with the sample
    forms; NaN or infinite values give NaN.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        sample = agg in ("stddev", "stddev_samp", "variance", "var_samp")
        var = m2 / (n - 1) if sample else m2 / n
        value = np.sqrt(var) if agg.startswith("stddev") else var
    return pa.array(value, mask=n < (2 if sample else 1), type=pa.float64())


def hll_estimate(words: np.ndarray) -> np.ndarray:
    """Distinct counts from HyperLogLog sketches, ``words`` an ``(n, 2^p / 8)`` int64 array of packed
    registers (one sketch per row; register ``j`` in byte ``j % 8`` of word ``j // 8``).

    Heule, Nunkesser and Hall, "HyperLogLog in Practice" (HLL++), Fig. 6 without the empirical bias
    correction: the raw estimate ``E = alpha_m m^2 / sum(2^-M[j])`` (Flajolet et al.'s harmonic mean,
    ``alpha_m = 0.7213 / (1 + 1.079 / m)``), and linear counting ``m ln(m / V)`` (``V`` empty registers)
    while ``V > 0`` and the latter is at most the paper's threshold (400 at p = 9) or ``E <= 5m / 2``;
    rounded to the nearest integer (Java's ``Math.round``). With
    the registers Spark's ``approx_count_distinct`` builds (the same hash, index and rank), the result
    equals Spark's wherever Spark uses linear counting (up to its threshold, 400 distinct values at
    p = 9); above, the relative standard error is ``1.04 / sqrt(m)`` (4.6 % at p = 9), Spark's ``rsd``.
    """
    words = np.ascontiguousarray(words, dtype=np.int64)
    regs = words.view(np.uint8).reshape(len(words), 8 * words.shape[1])
    m = regs.shape[1]
    alpha = 0.7213 / (1 + 1.079 / m)
    raw = alpha * m * m / np.ldexp(1.0, -regs.astype(np.int64)).sum(axis=1)
    empty = (regs == 0).sum(axis=1)
    with np.errstate(divide="ignore"):
        linear = m * np.log(m / np.maximum(empty, 1))
    est = np.where((empty > 0) & ((linear <= HLL_THRESHOLD) | (raw <= 2.5 * m)), linear, raw)
    return np.floor(est + 0.5).astype(np.int64)


def quantile_column(bits: np.ndarray, valid: np.ndarray | None, dtype: T.DataType) -> pa.Array:
    """``percentile_approx`` results in the column's type (Spark's) from the kernel's doubles.

    The kernel returns a DDSketch bucket's value clamped to the window's [min, max] (native/aggregate_core.hpp,
    ``dd_quantile``); an integral column's result is rounded to the nearest integer (within
    ``alpha·|x| + 0.5`` of the true value ``x``, so exact while ``|x| < 0.5 / alpha = 25``); Spark truncates
    its own double, which is a data value and hence an integer already.
    """
    x = np.asarray(bits, dtype=np.int64).view(np.float64)
    mask = None if valid is None else valid == 0
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        return pa.array(x, mask=mask, type=pa.float64()).cast(arrow_type(dtype))
    with np.errstate(invalid="ignore"):
        ints = np.rint(np.where(np.isfinite(x), x, 0.0))
    # |x| <= 2^63 by the clamp to the column's min / max as doubles; 2^63 saturates as Java's (long) cast does
    big = ints >= 2.0**63
    ints = np.where(big, np.iinfo(np.int64).max, np.where(big, 0.0, ints).astype(np.int64))
    return from_int64(ints, valid, dtype)


def _derived(o, values: list) -> pa.Array:
    """The value of a derived aggregate (``spec.DERIVED``) from its kernel outputs."""
    if o.agg in ("first", "last"):  # (value, time) of the earliest / latest row; no row: the identity time
        value, t = values
        valid = t != (np.iinfo(np.int64).max if o.agg == "first" else np.iinfo(np.int64).min)
        if isinstance(o.dtype, (T.FloatType, T.DoubleType)):
            arr = pa.array(load("_aggregate").keys_f64(value), mask=~valid, type=pa.float64())
            return arr.cast(arrow_type(o.dtype))
        return from_int64(value, valid, o.dtype)
    if o.agg == "approx_count_distinct":
        return pa.array(hll_estimate(np.stack(values, axis=1)), type=pa.int64())
    if o.agg == "kept":   # kept_column: (count(*), shed rows) of the window
        return pa.array(kept_fraction(*values), type=pa.float64())
    n, _mean, m2 = values
    return moment(o.agg, n.view(np.float64), m2.view(np.float64))


def _output_table(config: AggConfig, emitted, keys_tbl: pa.Table | None) -> pa.Table:
    slot, frm, to, values, valids = emitted
    cols = [from_int64(frm, None, config.time_type), from_int64(to, None, config.time_type)]
    if config.keys:
        taken = keys_tbl.take(pa.array(slot))
        cols += [taken.column(i).combine_chunks() for i in range(len(config.keys))]
    f64_keys = None
    pos = 0
    for o in config.spec.outputs:
        width = len(o.kernel_outputs)
        v, ok = values[pos], valids[pos]
        if o.extra:
            cols.append(_derived(o, values[pos:pos + width]))
            pos += width
            continue
        pos += width
        if o.kind == OUT_SUM_I_CHECKED and config.ansi:
            check_overflow(config, o, ok, slot, frm, to, keys_tbl)
        valid = None if ok.all() else ok
        if o.kind == OUT_QUANTILE:
            cols.append(quantile_column(v, valid, o.dtype))
        elif o.kind in (OUT_SUM_F, OUT_AVG_I, OUT_AVG_F):
            cols.append(pa.array(v.view(np.float64), mask=None if valid is None else valid == 0, type=pa.float64()))
        elif o.kind in (OUT_MIN, OUT_MAX) and isinstance(o.dtype, (T.FloatType, T.DoubleType)):
            f64_keys = f64_keys or load("_aggregate").keys_f64
            arr = pa.array(f64_keys(v), mask=None if valid is None else valid == 0, type=pa.float64())
            cols.append(arr.cast(arrow_type(o.dtype)))
        else:
            cols.append(from_int64(v, valid, o.dtype))
    return pa.Table.from_arrays(cols, names=list(config.out_names))
