"""STREAM §5.1 on Spark: a three-operator query (σ on the left input, per-input load shedding, a window join)
under a memory bound, allocated for precision or reduced uniformly by the PIPES resource manager; the streams,
the plan, the exact oracle and the Spark run, shared by ``benchmarks/experiments/stream_precision.py`` and
``tests/test_precision_spark.py``.

The query: ``σ(L) ⋈_w R`` with σ = "the row id is even" (selectivity 1/2, independent of key and time), the
window join ``join1`` of windows w (both inputs, QoS range [5 s, 10 s], the query's own 10 s) whose control
entry sheds each input by its own ratio. L brings 400 rows/s, R 50 rows/s, keys uniform in [0, 50). Event time
is :data:`~pyspark_cq.experiments.pipes_join.BASE_US` + seconds since the start; right rows sit half a left
period off the left ones, so no time difference equals a window (no ties at the band's edge).

Everything but :func:`run_spark` is plain Python / numpy.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd

from .. import plan as P
from ..vocabulary import metrics as M
from .pipes_join import BASE_US, OP, S, Streams, compare_pairs, oracle_pairs, window_schedule

__all__ = ["RATE_LEFT", "RATE_RIGHT", "KEYS", "WINDOW_S", "WINDOW_MIN_S", "QUERY", "make_workload", "query_plan",
           "LABEL", "query_qos", "selected_left", "exact_pairs", "measured", "run_spark", "OP"]

RATE_LEFT, RATE_RIGHT, KEYS = 400, 50, 50
WINDOW_S, WINDOW_MIN_S = 10.0, 5.0
QUERY = "precision_q"
LABEL = f"{OP}.window"


def make_workload(duration_s: float, *, file_s: float = 2.0, seed: int = 0) -> Streams:
    """L at :data:`RATE_LEFT` rows/s (times ``i/400`` s), R at :data:`RATE_RIGHT` rows/s (times ``i/50`` s plus
    half a left period); keys uniform in [0, :data:`KEYS`); row ids ``v`` (left 0…, right 10⁹…).
    """
    rng = np.random.default_rng(seed)
    sides = []
    for side, rate, offset in ((0, RATE_LEFT, 0), (1, RATE_RIGHT, S // RATE_LEFT // 2)):
        n = int(round(duration_s * rate))
        sides.append(pd.DataFrame({"k": rng.integers(0, KEYS, n).astype(np.int64),
                                   "t": np.arange(n, dtype=np.int64) * (S // rate) + offset,
                                   "v": np.arange(n, dtype=np.int64) + side * 10**9}))
    return Streams(sides[0], sides[1], RATE_LEFT, duration_s, file_s)


def query_plan(unit: int = 1) -> P.Node:
    """The query's logical plan: ``Join(ω_w(σ(L)), ω_w(R))``, both windows labelled ``join1.window``, sizes in
    ``unit`` µs (1: µs, as the runtime's plans; 1000: ms, the policies' cost-model unit).
    """
    w = WINDOW_S * S / unit
    return P.Join(P.Window(P.Select(P.Source("L"), 0.5), w, label=LABEL), P.Window(P.Source("R"), w, label=LABEL),
                  selectivity=1 / KEYS)


def query_qos():
    """The QoS range of the join's window: [5 s, 10 s]."""
    from ..policies import QoSRange

    return {LABEL: QoSRange.window(f"{int(WINDOW_MIN_S)} seconds", f"{int(WINDOW_S)} seconds")}


def selected_left(left: pd.DataFrame) -> pd.DataFrame:
    """σ: the left rows with an even row id."""
    return left[left.v % 2 == 0]


def exact_pairs(streams: Streams) -> pd.DataFrame:
    """The exact result (the query with its own 10 s windows, nothing shed): PIPES window-join pairs."""
    return oracle_pairs(selected_left(streams.left), streams.right, window_schedule((), initial_s=WINDOW_S))


def measured(pairs: pd.DataFrame, exact: pd.DataFrame):
    """(FP, FN) of ``pairs`` against ``exact`` (:func:`pyspark_cq.cost.stream_precision.measured_precision`)
    and the comparison counts (:func:`~pyspark_cq.experiments.pipes_join.compare_pairs`).
    """
    from ..cost.stream_precision import measured_precision

    check = compare_pairs(pairs, exact)
    distinct = check["measured"] - check["duplicates"]
    correct = distinct - check["unexpected"]
    return measured_precision(check["measured"], correct, check["expected"]), check


def run_spark(spark, root: str, work: str, *, control, delay_s: float = 1.0) -> dict:
    """Run the query over ``root/l`` and ``root/r`` (one file per side and micro-batch) with the control
    handle ``control`` of ``join1``; per-batch records (state rows, shed rows) and the output pairs.
    """
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    import pyspark_cq
    from pyspark_cq.experiments.pipes_join import _micros, _rel_s

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", f"{int(delay_s * 1000)} milliseconds"))

    left = source("l").where(F.col("lv") % 2 == 0)          # σ
    w = f"{int(WINDOW_S * 1000)} milliseconds"
    joined = pyspark_cq.window_join(left, source("r"), "k", "ts", "ts", w, w, suffixes=("_l", "_r"), name=OP,
                                    control=control, seed=7)
    out, ck = os.path.join(work, "out"), os.path.join(work, "ck")
    query = (joined.select("lv", "rv", "ts_l", "ts_r").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
    start = time.perf_counter()
    query.awaitTermination()
    wall = time.perf_counter() - start
    batches = []
    for p in query.recentProgress:
        p = json.loads(p.json)
        m = pyspark_cq.read_metrics(p, OP) or {}
        rec = {"batch": p["batchId"], M.INPUT_ROWS: p.get("numInputRows", 0),
               "wm_s": _rel_s((p.get("eventTime") or {}).get("watermark"))}
        for key in (M.STATE_ROWS, M.OUTPUT_ROWS, M.SHED_ROWS, M.LATE_ROWS):
            if key in m:
                rec[key] = m[key]
        batches.append(rec)
    pairs = ds.dataset(out, format="parquet").to_table().to_pandas() if os.path.isdir(out) else pd.DataFrame()
    if len(pairs):
        pairs = pd.DataFrame({"lv": pairs.lv.to_numpy(), "rv": pairs.rv.to_numpy(),
                              "tl": _micros(pairs.ts_l) - BASE_US, "tr": _micros(pairs.ts_r) - BASE_US})
    else:
        pairs = pd.DataFrame({c: np.zeros(0, np.int64) for c in ("lv", "rv", "tl", "tr")})
    return {"batches": pd.DataFrame(batches), "pairs": pairs, "wall_s": wall}
