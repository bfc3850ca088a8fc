"""PIPES §5.1 and §5.3 (Cammert et al.) on Spark: the streams, the exact window-join oracle, the PIPES estimates
and the Spark run, shared by ``benchmarks/experiments/pipes_5_1_5_3.py`` (the full runs, the figures) and
``tests/test_pipes_experiments.py`` (shortened runs checked against the oracle).

Event time ``t`` is seconds since the experiment start, stored as ``BASE_US + t`` (Spark's watermark starts
at 0, so the experiment stays clear of the epoch). Everything but :func:`run_spark_join` is plain
Python/numpy.
"""
from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..vocabulary import metrics as M

__all__ = ["S", "MS", "BASE_US", "OP", "Streams", "make_streams", "write_streams", "window_schedule", "oracle_pairs",
           "batch_bounds", "oracle_state", "pipes_state_estimate", "effect_windows", "join_supports", "run_spark_join",
           "compare_pairs", "kept_rows"]

S = 1_000_000                      # µs per second
MS = 1_000
BASE_US = 1_700_000_000 * S        # event time 0 s of the experiments
OP = "join1"                       # control-table operator id and metrics name
SCHEDULE_5_1 = ((80.0, 30.0), (150.0, 60.0))   # §5.1: (application time s, new window s); initially 60 s

# ---------------------------------------------------------------------------------------------------------
# input


@dataclass
class Streams:
    """Two synthetic streams (pandas frames with ``k``, ``t`` (µs since the start) and a row id ``v``)."""

    left: pd.DataFrame
    right: pd.DataFrame
    rate: int              # elements per second and side
    duration_s: float
    file_s: float          # seconds of event time per parquet file (one file per side and micro-batch)

    @property
    def n_files(self) -> int:
        """Files per side (one per ``file_s`` seconds of event time, i.e. one per micro-batch)."""
        return int(np.ceil(self.duration_s / self.file_s))


def make_streams(duration_s: float, rate: int, keys: int, *, file_s: float, seed: int = 0) -> Streams:
    """Constant-rate streams: left element i at i/rate s, right element i at i/rate + half a period.

    Keys are uniform random integers in ``[0, keys)`` (§5.3: 0–49). The half-period offset avoids equal
    timestamps on both sides, so |Δt| is never exactly a multiple of the period (no ties at a window edge).
    """
    rng = np.random.default_rng(seed)
    n = int(round(duration_s * rate))
    step = S // rate
    sides = []
    for side, offset in ((0, 0), (1, step // 2)):
        sides.append(pd.DataFrame({"k": rng.integers(0, keys, n).astype(np.int64),
                                   "t": np.arange(n, dtype=np.int64) * step + offset,
                                   "v": np.arange(n, dtype=np.int64) + side * 10**9}))
    return Streams(sides[0], sides[1], rate, duration_s, file_s)


def write_streams(root: str, streams: Streams) -> None:
    """One parquet file per ``file_s`` seconds of event time and side: ``root/l``, ``root/r``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    span = int(streams.file_s * S)
    for side, df, vcol in (("l", streams.left, "lv"), ("r", streams.right, "rv")):
        os.makedirs(os.path.join(root, side), exist_ok=True)
        for i in range(streams.n_files):
            part = df[(df.t >= i * span) & (df.t < (i + 1) * span)]
            table = pa.table({"k": pa.array(part.k.to_numpy(), pa.int64()),
                              "ts": pa.array(BASE_US + part.t.to_numpy(), pa.int64()).cast(
                                  pa.timestamp("us", tz="UTC")),
                              vcol: pa.array(part.v.to_numpy(), pa.int64())})
            path = os.path.join(root, side, f"b{i:05d}.parquet")
            pq.write_table(table, path)
            # file order = batch order: the file source sorts by modification time (ms), ties in listing
            # order, so files written within one millisecond could be read out of order
            os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))


# ---------------------------------------------------------------------------------------------------------
# the oracle: exact PIPES semantics in plain Python / numpy


def window_schedule(changes=(), initial_s: float = 10.0):
    """A :class:`Schedule` of the window (µs, relative event time): ``changes`` = [(at_s, window_s), ...]."""
    from pyspark_cq.control.schedule import Schedule

    pts = [(None, int(initial_s * S))] + [(int(at * S), int(w * S)) for at, w in changes]
    return Schedule("window", tuple(pts))


def oracle_pairs(left: pd.DataFrame, right: pd.DataFrame, schedule) -> pd.DataFrame:
    """All result pairs of the window join (PIPES §2.4.1–2.4.2, §4.2): keys equal and validities intersect.

    Each element gets the window in force at its own timestamp, ``[t, t + w(t))``; ``l`` and ``r`` join
    when ``t_l < t_r + w(t_r)`` and ``t_r < t_l + w(t_l)`` (so the earlier element's window decides).
    Returns ``lv, rv, tl, tr`` (the row ids and times), sorted.
    """
    m = left.rename(columns={"t": "tl", "v": "lv"}).merge(right.rename(columns={"t": "tr", "v": "rv"}), on="k")
    tl, tr = m.tl.to_numpy(), m.tr.to_numpy()
    keep = (tl < tr + schedule.values_at(tr)) & (tr < tl + schedule.values_at(tl))
    return m.loc[keep, ["lv", "rv", "tl", "tr"]].sort_values(["lv", "rv"]).reset_index(drop=True)


def batch_bounds(streams: Streams, delay_s: float) -> pd.DataFrame:
    """Per micro-batch (one file per side): its max event time and Spark's watermark (ms, relative).

    Spark's watermark for batch N is min over the inputs of (max event time in ms of batches < N) − delay
    (``multipleWatermarkPolicy=min``); 0 (absolute) before anything was seen.
    """
    span = int(streams.file_s * S)
    rows, seen = [], None
    for i in range(streams.n_files):
        lo, hi = i * span, (i + 1) * span
        maxes = [int(df.t[(df.t >= lo) & (df.t < hi)].max()) // MS for df in (streams.left, streams.right)]
        wm = None if seen is None else min(seen) - int(delay_s * 1000)
        rows.append({"batch": i, "max_ms": max(maxes), "wm_ms": wm})
        seen = maxes if seen is None else [max(a, b) for a, b in zip(seen, maxes)]
    return pd.DataFrame(rows)


def oracle_state(streams: Streams, schedule, delay_s: float, *, kept=None, slack_us: int = MS) -> pd.DataFrame:
    """Expected state rows after every micro-batch, and the parts of it.

    An element stays in a join's state while a future element can still join it (PIPES §2.4.4): in Spark,
    future elements are those after the watermark ``wm``, so an element at ``t`` with window ``w(t)`` is
    needed while ``t + w(t) > wm``. Spark's state watermark
    (``pyspark_cq.operators.join.state_watermarks``, ``StreamingJoinHelper.getStateValueWatermark``)
    subtracts one more millisecond for the inclusive band bound, so the operator keeps the element while
    ``t + w(t) + 1 ms > wm`` (``slack_us``; exact for whole-ms watermarks and windows, positive absolute
    times). The operator stores each row's expiry from its own window, so this holds per element under a
    control table too.

    ``kept``: optional pair of boolean masks (left, right) of the rows that survive load shedding.

    Columns: ``state_rows`` (expected), ``valid_at_wm`` (elements valid at the watermark: PIPES's state at
    application time ``wm``), ``above_wm`` (elements after the watermark, which Spark keeps whatever
    their window: the watermark-delay and per-batch term), ``slack`` (expired elements kept for the 1 ms),
    ``t_max_s`` and ``wm_s`` (relative seconds).
    """
    bounds = batch_bounds(streams, delay_s)
    span = int(streams.file_s * S)
    sides = []
    for j, df in enumerate((streams.left, streams.right)):
        t = df.t.to_numpy()
        if kept is not None:
            t = t[kept[j]]
        sides.append((t, t + schedule.values_at(t)))
    out = []
    for b in bounds.itertuples():
        hi = (b.batch + 1) * span
        no_wm = b.wm_ms is None or pd.isna(b.wm_ms)
        wm = -BASE_US if no_wm else int(b.wm_ms) * MS          # relative µs
        state = valid = above = 0
        for t, end in sides:
            seen = t < hi
            state += int(np.sum(seen & (end + slack_us > wm)))
            above += int(np.sum(seen & (t > wm)))
            valid += int(np.sum(seen & (t <= wm) & (end > wm)))
        out.append({"batch": b.batch, "t_max_s": b.max_ms / 1000, "wm_s": np.nan if no_wm else b.wm_ms / 1000,
                    M.STATE_ROWS: state, "valid_at_wm": valid, "above_wm": above,
                    "slack": state - valid - above})
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------------------
# PIPES estimates


def pipes_state_estimate(tau_s, rate: float, schedule, *, keep: float = 1.0, start_s: float | None = 0.0) -> np.ndarray:
    """PIPES estimate of the join's state rows (both sides) at application time ``tau_s`` (seconds).

    The steady state for window w is ``sum(join_state_rows(...))`` (eq. 9 with Cost Formula 7; time unit
    1 ms, source streams (d, 1, 1)); during a change the state moves linearly from the old to the new
    estimate between t + min(w, w') and t + max(w, w') (§4.2, :meth:`Transition.progress`). ``keep`` scales
    the input rate (load shedding keeps a share ``keep`` of every input). The streams start at
    ``start_s``: the state fills linearly during the first window (None: steady state from always).
    """
    from pyspark_cq.cost.pipes import StreamCharacteristics as SC
    from pyspark_cq.cost.pipes import join_state_rows

    d_ms = 1000.0 / (rate * keep)

    def steady(w_us):
        w_ms = w_us / MS
        return float(sum(join_state_rows(SC(d_ms, 1.0), SC(d_ms, 1.0), left_window=w_ms, right_window=w_ms)))

    tau_us = np.asarray(tau_s, dtype=np.float64) * S
    est = np.full(tau_us.shape, steady(schedule.points[0][1]))
    for tr in schedule.transitions():
        est = est + tr.progress(tau_us) * (steady(tr.new) - steady(tr.old))
    if start_s is not None:
        est = est * np.clip((tau_us - start_s * S) / schedule.points[0][1], 0.0, 1.0)
    return est


def effect_windows(schedule) -> list[tuple[float, float]]:
    """(start, complete) in seconds of every change's effect on the state (§4.2)."""
    return [(tr.effect_start / S, tr.effect_complete / S) for tr in schedule.transitions()]


# ---------------------------------------------------------------------------------------------------------
# Spark


def join_supports(arg: str) -> bool:
    """Whether ``pyspark_cq.window_join`` takes ``arg`` (the control interface of issue 6)."""
    import pyspark_cq

    return arg in inspect.signature(pyspark_cq.window_join).parameters


def run_spark_join(spark, root: str, work: str, *, window_s: float, delay_s: float, control=None,
                   drop_ratio: float = 0.0, seed: int = 0, shards: int | None = None) -> dict:
    """Run ``window_join`` over ``root/l`` and ``root/r``; returns per-batch records and the output pairs."""
    import pyarrow.dataset as ds

    import pyspark_cq

    def source(side):
        return (spark.readStream.schema(f"k long, ts timestamp, {side}v long").option("maxFilesPerTrigger", 1)
                .parquet(os.path.join(root, side)).withWatermark("ts", f"{int(delay_s * 1000)} milliseconds"))

    extra = {}
    if control is not None:
        extra["control"] = control
    if drop_ratio:
        extra["drop_ratio"] = drop_ratio
        extra["seed"] = seed
    w = f"{int(window_s * 1000)} milliseconds"
    joined = pyspark_cq.window_join(source("l"), source("r"), "k", "ts", "ts", w, w, suffixes=("_l", "_r"),
                                    shards=shards, name=OP, **extra)
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
        et = p.get("eventTime") or {}
        rec = {"batch": p["batchId"], M.INPUT_ROWS: p.get("numInputRows", 0),
               "t_max_s": _rel_s(et.get("max")), "wm_s": _rel_s(et.get("watermark")),
               "duration_ms": p.get("durationMs", {}).get("triggerExecution")}
        for key in (M.STATE_ROWS, M.STATE_BYTES, M.OUTPUT_ROWS, M.EVICTED_ROWS, M.LATE_ROWS, M.SHED_ROWS):
            if key in m:
                rec[key] = m[key]
        batches.append(rec)
    pairs = ds.dataset(out, format="parquet").to_table().to_pandas() if os.path.isdir(out) else pd.DataFrame()
    if len(pairs):
        pairs = pd.DataFrame({"lv": pairs.lv.to_numpy(), "rv": pairs.rv.to_numpy(),
                              "tl": _micros(pairs.ts_l) - BASE_US, "tr": _micros(pairs.ts_r) - BASE_US})
        pairs = pairs.sort_values(["lv", "rv"]).reset_index(drop=True)
    else:
        pairs = pd.DataFrame({c: np.zeros(0, np.int64) for c in ("lv", "rv", "tl", "tr")})
    return {"batches": pd.DataFrame(batches), "pairs": pairs, "wall_s": wall}


def _micros(series) -> np.ndarray:
    s = pd.to_datetime(series, utc=True)
    return (s - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(microseconds=1)


def _rel_s(iso):
    """Relative event time (s) of a progress timestamp; None for none or for Spark's initial watermark 0."""
    if iso is None:
        return None
    us = (pd.Timestamp(iso) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(microseconds=1)
    return None if us <= 0 else (us - BASE_US) / S


def compare_pairs(measured: pd.DataFrame, expected: pd.DataFrame) -> dict:
    """Equal multisets of (lv, rv)? Returns counts of missing / unexpected / duplicated pairs."""
    a = measured[["lv", "rv"]]
    b = expected[["lv", "rv"]]
    dup = int(a.duplicated().sum())
    ma = a.drop_duplicates().merge(b, how="outer", indicator=True)
    return {"measured": len(a), "expected": len(b), "duplicates": dup,
            "missing": int((ma._merge == "right_only").sum()), "unexpected": int((ma._merge == "left_only").sum()),
            "equal": bool(dup == 0 and (ma._merge == "both").all())}


def kept_rows(pairs: pd.DataFrame, streams: Streams):
    """Masks of the left/right rows that appear in some output pair (a lower bound of the non-shed rows)."""
    return (streams.left.v.isin(pairs.lv).to_numpy(), streams.right.v.isin(pairs.rv).to_numpy())
