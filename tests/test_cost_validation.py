"""The PIPES state-size estimates against the operators' reported state on Spark (docs/cost-model.md,
"Validation on Spark").

Constant distances make the measured state exact up to boundary terms, so each assertion's tolerance is
the sum of those terms (derived in each test), not a fudge factor. The checks are of correctness (row
counts), never of timing. The full validation over many configurations is
``benchmarks/experiments/validate_cost_model.py``.
"""
from __future__ import annotations

import json
import math
import os
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_cq.cost import pipes
from pyspark_cq.cost.pipes import StreamCharacteristics as SC

BASE_S = 1_700_006_400  # a multiple of 3600 s, so the files start on a window boundary


def _write(directory, rate, files, batch_s, keys, phase_us=0):
    """``files`` parquet files of ``batch_s`` s of event time each: constant distance 1/rate, keys round robin.

    Returns each file's largest event time in ms after BASE_S."""
    os.makedirs(directory, exist_ok=True)
    d_us = int(1e6 / rate)
    per_file = int(rate * batch_s)
    maxima = []
    for i in range(files):
        j = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        t = BASE_S * 1_000_000 + j * d_us + phase_us
        pq.write_table(pa.table({"k": pa.array(j % keys), "ts": pa.array(t).cast(pa.timestamp("us", tz="UTC")),
                                 "v": pa.array(np.ones(len(j)))}), os.path.join(directory, f"b{i:03d}.parquet"))
        # file order = batch order: the file source sorts by modification time (ms), ties in listing order
        os.utime(os.path.join(directory, f"b{i:03d}.parquet"), (1_000_000 + i * 10, 1_000_000 + i * 10))
        maxima.append((int(j[-1]) * d_us + phase_us) / 1000)
    return maxima


def _source(spark, path, delay_s):
    return (spark.readStream.schema("k long, ts timestamp, v double").option("maxFilesPerTrigger", 1)
            .parquet(path).withWatermark("ts", f"{delay_s} seconds"))


def _ms(iso):
    return round((datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() - BASE_S) * 1000)


def _run(df, checkpoint, name, maxima):
    """Run to the end of the files; per data batch the operator's report plus ``lag_ms``, the largest
    event time of the batch's file (data batch i reads file i) minus the watermark Spark reported
    (normally δ + B). The progress's own ``eventTime.max`` is not used: for the aggregation it describes
    the pre-aggregated slices, not the input rows."""
    import pyspark_cq as cq

    q = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    out = []
    for p in q.recentProgress:
        r = cq.read_metrics(p, name)
        if r and r["input_rows"] > 0:
            wm = _ms(json.loads(p.json)["eventTime"]["watermark"])
            out.append(dict(r, lag_ms=max(maxima[len(out)] - wm, 0.0)))
    return out


@pytest.mark.spark
def test_join_state_rows_match_pipes_with_watermark_retention(spark, tmp_dir):
    """Interval join [-2 s, +3 s], 50 rows/s a side, δ = 1 s, B = 4 s per micro-batch.

    After batch k the left side keeps rows newer than ``wm_k − upper`` and the right side rows newer than
    ``wm_k + lower``, where ``wm_k`` is the previous batch's largest event time minus δ: the retained event
    time is ``window + δ + B`` per side — eq. (9) with those windows (``join_state_rows(...,
    watermark_delay=δ, batch_span=B)``). Boundary terms, per side, in rows: 1 for the lattice position of
    the oldest kept row, 1 for the ceiling in eq. (9), the growth term ``d_other/(2·d_own)`` = 0.5 that the
    per-batch eviction does not have, and (2 ms + d)/d for the watermark's millisecond truncation and the
    min-watermark of the two sides (right shifted by d/2): 1.1 — together 3.6 per side.
    """
    import pyspark_cq as cq

    rate, keys, delay, batch, files, lower, upper = 50, 5, 1, 4, 3, -2, 3
    d_ms = 1000 / rate
    left_max = _write(str(tmp_dir / "l"), rate, files, batch, keys)
    right_max = _write(str(tmp_dir / "r"), rate, files, batch, keys, phase_us=int(d_ms * 500))
    joined = cq.interval_join(_source(spark, str(tmp_dir / "l"), delay), _source(spark, str(tmp_dir / "r"), delay),
                              "k", "ts", "ts", f"{lower} seconds", f"{upper} seconds", suffixes=("_l", "_r"),
                              name="cv_join")
    reports = _run(joined, str(tmp_dir / "ck"), "cv_join", [max(a, b) for a, b in zip(left_max, right_max)])
    assert len(reports) == files
    first_steady = math.ceil((delay + max(upper, -lower)) / batch)   # k·B − δ − window ≥ 0
    plain = sum(pipes.join_state_rows(SC(d_ms, 1), SC(d_ms, 1), left_window=upper * 1000, right_window=-lower * 1000))
    tolerance = 2 * (1 + 1 + 0.5 + (2 + d_ms) / d_ms)
    steady = reports[first_steady:]
    assert steady, "no steady-state batch"
    for r in steady:
        # The retention beyond the window is T_k − wm_k (δ + B unless Spark's watermark already holds
        # this batch's maximum, see docs/cost-model.md): the model takes it from the batch's progress.
        est = sum(pipes.join_state_rows(SC(d_ms, 1), SC(d_ms, 1), left_window=upper * 1000,
                                        right_window=-lower * 1000, watermark_delay=r["lag_ms"]))
        assert abs(r["state_rows"] - est) <= tolerance, (r, est)
        # The plain estimate misses exactly that retention on each side.
        assert abs((r["state_rows"] - plain) - 2 * rate * r["lag_ms"] / 1000) <= tolerance
    if all(abs(r["lag_ms"] - (delay + batch) * 1000) <= d_ms for r in steady):  # the usual watermark sequence
        est = sum(pipes.join_state_rows(SC(d_ms, 1), SC(d_ms, 1), left_window=upper * 1000,
                                        right_window=-lower * 1000, watermark_delay=delay * 1000,
                                        batch_span=batch * 1000))
        assert all(abs(r["state_rows"] - est) <= tolerance for r in steady)
    assert sum(r["late_rows"] for r in reports) == 0


@pytest.mark.spark
def test_aggregation_state_rows_match_eq15_with_watermark_retention(spark, tmp_dir):
    """Sliding count, W = 6 s, S = g = 1 s, 4 keys at 20 rows/s (every granule of every key occupied),
    δ = 1 s, B = 4 s.

    A slice (granule) is evicted once every window containing it has ended by the watermark; after batch
    k the state holds the granules of ``(wm_k − W, T_k]``: ``(W + δ + B)/g`` per key — eq. (15) after ω
    (Formula 7) and Γ (Formula 8) with window ``W + δ + B``. Boundary terms per key: Γ rounds the interval
    inward and loses one granule (``l − ĝ``; the operator rounds a row's time down and keeps its own
    granule), 1 granule for the phase of the watermark against the grid, and the ceiling in eq. (15) adds
    at most one — 2 per key, since the first is never positive and the last never negative.
    """
    import pyspark_cq as cq

    rate, keys, delay, batch, files, window = 20, 4, 1, 4, 3, 6
    maxima = _write(str(tmp_dir / "in"), rate, files, batch, keys)
    agg = cq.sliding_aggregate(_source(spark, str(tmp_dir / "in"), delay), "ts", f"{window} seconds", "1 second",
                               by="k", name="cv_agg", shards=2)
    reports = _run(agg, str(tmp_dir / "ck"), "cv_agg", maxima)
    assert len(reports) == files
    first_steady = math.ceil((delay + window) / batch)
    d_ms = 1000 / rate
    tolerance = 2 * keys
    steady = reports[first_steady:]
    assert steady, "no steady-state batch"
    for r in steady:
        est = pipes.aggregation_state_rows(SC(d_ms, 1), window=window * 1000, granularity=1000, groups=keys,
                                           watermark_delay=r["lag_ms"])  # δ + B normally (see the join test)
        assert abs(r["state_rows"] - est) <= tolerance, (r, est)
    assert sum(r["output_rows"] for r in reports) > 0


def test_calibrate_recovers_nanosecond_constants():
    """``CostProfile.calibrate`` on kernel-scale numbers (counts ~1e5–1e6, times ~1e-2 s, constants
    ~1e-8 s per event, as ``benchmarks/experiments/validate_cost_model.py --calibrate`` measures them). The NNLS
    once compared the solution with a tolerance in the units of the gradient and returned all zeros."""
    rng = np.random.default_rng(0)
    counts = [{"hash_function": float(rng.integers(100_000, 1_000_000)),
               "build_result": float(rng.integers(0, 1_000_000))} for _ in range(20)]
    times = [c["hash_function"] * 3e-8 + c["build_result"] * 5e-9 for c in counts]
    fitted = pipes.CostProfile().calibrate(counts, times)
    assert fitted.hash_function == pytest.approx(3e-8, rel=1e-9)
    assert fitted.build_result == pytest.approx(5e-9, rel=1e-9)
