"""PIPES §5.1 (window change) and §5.3 (window reduction vs load shedding) on Spark with our window join.

Cammert, Krämer, Seeger & Vaupel, "A Cost Model for Adaptive Resource Management in Data Stream Systems":

- §5.1 / Figure 7: a join's windows go from 60 s to 30 s at t = 80 s and back to 60 s at t = 150 s. The
  state "starts to be visible after the new window size (80 + 30 = 110) and reaches its full impact after
  the old window size (80 + 60 = 140)"; back at 150 s: visible from 180 s, full at 210 s (§4.2).
- §5.3 / Figures 9 and 11: an equi-join of two streams of random integers 0–49 at 100 elements/s with
  10 s windows; to save 50 % memory either the windows are halved (5 s) or every input element is dropped
  with probability 1/2 (random load shedding on both inputs). Both halve the state; window reduction keeps
  1/2 of the results (exactly those whose start timestamps are closest), load shedding about 1/4, spread over
  all |Δt|.

Both run ``pyspark_cq.window_join`` on Spark (local[2]) over parquet files of synthetic event time
(``maxFilesPerTrigger=1``, ``availableNow``). Event time ``t`` is seconds since the experiment start, stored
as ``BASE_US + t`` (Spark's watermark starts at 0, so the experiment stays clear of the epoch). The §5.1
schedule is written into the control table before the query starts, with explicit application times.

Everything that is not Spark — the input, the exact expected join output (PIPES semantics, the test
oracle), the expected state per micro-batch and the PIPES estimates with transition interpolation — is
plain Python/numpy here and reused by ``tests/test_pipes_experiments.py``.

Usage::

    python -m benchmarks.experiments.pipes_5_1_5_3 [--part 5.1|5.3|all] [--quick] [--print-json] [--out docs/figures] [--json PATH]
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import harness

S = 1_000_000                      # µs per second
MS = 1_000
BASE_US = 1_700_000_000 * S        # event time 0 s of the experiments
OP = "join1"                       # control-table operator id and metrics name

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
                    "state_rows": state, "valid_at_wm": valid, "above_wm": above,
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
        rec = {"batch": p["batchId"], "input_rows": p.get("numInputRows", 0),
               "t_max_s": _rel_s(et.get("max")), "wm_s": _rel_s(et.get("watermark")),
               "duration_ms": p.get("durationMs", {}).get("triggerExecution")}
        for key in ("state_rows", "state_bytes", "output_rows", "evicted_rows", "late_rows", "shed_rows"):
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


def make_spark(partitions: int = 2):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pyspark_cq

    spark = pyspark_cq.spark("local[2]", "pipes-5.1-5.3", shuffle_partitions=partitions, conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000", "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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


# ---------------------------------------------------------------------------------------------------------
# §5.3


def dt_histogram(pairs: pd.DataFrame, bin_s: float, max_s: float) -> tuple[np.ndarray, np.ndarray]:
    edges = np.arange(0.0, max_s + bin_s / 2, bin_s)
    dt = np.abs(pairs.tr.to_numpy() - pairs.tl.to_numpy()) / S
    counts, _ = np.histogram(dt, bins=edges)
    return edges, counts


def part_5_3(spark, args, work: str) -> dict:
    duration = 40.0 if args.quick else args.duration_5_3
    streams = make_streams(duration, 100, 50, file_s=args.file_s, seed=args.seed)
    root = os.path.join(work, "in53")
    write_streams(root, streams)
    base_sched, wr_sched = window_schedule(initial_s=10), window_schedule(initial_s=5)
    expected = {"baseline": oracle_pairs(streams.left, streams.right, base_sched),
                "window_reduction": oracle_pairs(streams.left, streams.right, wr_sched)}
    runs = {"baseline": dict(window_s=10.0), "window_reduction": dict(window_s=5.0),
            "load_shedding": dict(window_s=10.0, drop_ratio=0.5, seed=args.seed)}
    shedding = join_supports("drop_ratio")
    res = {}
    for name, kw in runs.items():
        if kw.get("drop_ratio") and not shedding:
            print("  load_shedding: skipped, window_join has no drop_ratio yet", flush=True)
            continue
        t0 = time.perf_counter()
        r = run_spark_join(spark, root, os.path.join(work, "run53_" + name), delay_s=args.delay, **kw)
        sched = wr_sched if name == "window_reduction" else base_sched
        if name == "load_shedding":
            mask = kept_rows(r["pairs"], streams)
            ref = oracle_pairs(streams.left[mask[0]], streams.right[mask[1]], sched)
        else:
            mask = None
            ref = expected[name]
        r["check"] = compare_pairs(r["pairs"], ref)
        r["expected_state"] = oracle_state(streams, sched, args.delay, kept=mask)
        res[name] = r
        print(f"  {name}: {len(r['batches'])} batches, {len(r['pairs']):,} results, "
              f"{time.perf_counter() - t0:.0f} s, output check {r['check']}", flush=True)
    return summarize_5_3(streams, res, expected, args)


def _steady(df: pd.DataFrame, col: str, from_s: float) -> float:
    sel = df[(df.t_max_s >= from_s) & (df.input_rows > 0)] if "input_rows" in df else df[df.t_max_s >= from_s]
    return float(sel[col].mean()) if len(sel) else float("nan")


def summarize_5_3(streams, res, expected, args) -> dict:
    rate = streams.rate
    lag = args.file_s + args.delay                       # Spark keeps what is after its watermark
    warm = 10.0 + lag + args.file_s                      # from here on the state is steady
    base_n = len(res["baseline"]["pairs"])

    def steady_n(pairs):
        # results whose later element arrives once a full 10 s window lies behind it: each such element
        # meets all its partners, as in the paper's long-running streams (no start-up edge)
        return int((np.maximum(pairs.tl.to_numpy(), pairs.tr.to_numpy()) >= 10 * S).sum())

    base_steady = steady_n(res["baseline"]["pairs"])
    out = {"setup": {"rate_per_side": rate, "keys": 50, "duration_s": streams.duration_s, "file_s": args.file_s,
                     "watermark_delay_s": args.delay, "steady_from_s": warm, "seed": args.seed},
           "paper": {"memory_saving": 0.5, "results_kept": {"window_reduction": 0.5, "load_shedding": 0.25},
                     "baseline_memory": "about 140 kB"},
           "runs": {}}
    for name, r in res.items():
        b = r["batches"]
        keep = 0.5 if name == "load_shedding" else 1.0
        w = 5.0 if name == "window_reduction" else 10.0
        sched = window_schedule(initial_s=w)
        pipes = float(pipes_state_estimate(np.array([1000.0]), rate, sched, keep=keep)[0])
        exp = r["expected_state"]
        state = _steady(b, "state_rows", warm)
        n_in = 2 * len(streams.left)
        shed = int(b["shed_rows"].sum()) if "shed_rows" in b else None
        run = {"window_s": w, "drop_ratio": 0.5 if name == "load_shedding" else 0.0,
               "state_rows_steady_mean": state,
               "state_rows_expected_steady_mean": _steady(exp, "state_rows", warm),
               "state_valid_at_watermark_steady_mean": _steady(exp, "valid_at_wm", warm),
               "state_above_watermark_steady_mean": _steady(exp, "above_wm", warm),
               "pipes_estimate_state_rows": pipes,
               "pipes_plus_lag_estimate_state_rows": pipes + 2 * rate * keep * lag,
               "state_bytes_steady_mean": _steady(b, "state_bytes", warm) if "state_bytes" in b else None,
               "results": len(r["pairs"]), "results_share_of_baseline": len(r["pairs"]) / base_n if base_n else None,
               "results_steady": steady_n(r["pairs"]),
               "results_steady_share_of_baseline": steady_n(r["pairs"]) / base_steady if base_steady else None,
               "input_rows": n_in, "shed_rows": shed, "shed_share": None if shed is None else shed / n_in,
               "output_check": r["check"], "wall_s": r["wall_s"], "batches": len(b)}
        if name == "window_reduction":
            run["expected_share"] = len(expected["window_reduction"]) / len(expected["baseline"])
            close = np.abs(expected["baseline"].tr - expected["baseline"].tl) < 5 * S
            run["baseline_pairs_with_abs_dt_below_5s"] = int(close.sum())
        if name == "load_shedding":
            run["expected_share"] = 0.25
            run["note"] = ("output checked against the oracle join of the rows that appear in the output; "
                           "a non-shed row without any partner is invisible to this check")
        out["runs"][name] = run
    base = out["runs"].get("baseline")
    for run in out["runs"].values():
        if base:
            run["state_ratio_to_baseline"] = run["state_rows_steady_mean"] / base["state_rows_steady_mean"]
            run["state_valid_at_wm_ratio_to_baseline"] = (run["state_valid_at_watermark_steady_mean"]
                                                           / base["state_valid_at_watermark_steady_mean"])
    bin_s = 0.1
    hist = {}
    for name, r in res.items():
        p = r["pairs"]
        edges, counts = dt_histogram(p[np.maximum(p.tl, p.tr) >= 10 * S], bin_s, 10.0)
        hist[name] = counts.tolist()
    out["dt_histogram"] = {"bin_s": bin_s, "edges_s": np.round(edges, 6).tolist(), "counts": hist,
                           "pairs": "results whose later element is at >= 10 s (steady state)"}
    out["series"] = {name: {"measured": r["batches"].to_dict("list"),
                             "expected": r["expected_state"].to_dict("list")} for name, r in res.items()}
    return out


def plot_5_3(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"baseline": "tab:blue", "window_reduction": "tab:green", "load_shedding": "tab:red"}
    labels = {"baseline": "10 s windows", "window_reduction": "window reduction (5 s)",
              "load_shedding": "load shedding (p = 1/2)"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    for name, ser in summary["series"].items():
        m = pd.DataFrame(ser["measured"])
        m = m[m.input_rows > 0]
        e = pd.DataFrame(ser["expected"])
        run = summary["runs"][name]
        ax.plot(m.t_max_s, m.state_rows, "o-", ms=3, color=colors[name], label=f"{labels[name]}: measured")
        ax.plot(e.wm_s, e.valid_at_wm, ":", color=colors[name], lw=1.2)
        ax.axhline(run["pipes_estimate_state_rows"], color=colors[name], ls="--", lw=0.9)
        ax.axhline(run["pipes_plus_lag_estimate_state_rows"], color=colors[name], ls="-.", lw=0.7)
    ax.plot([], [], "k--", lw=0.9, label="PIPES estimate (eq. 9)")
    ax.plot([], [], "k-.", lw=0.7, label="PIPES + 2λ·(file + watermark delay)")
    ax.plot([], [], "k:", lw=1.2, label="expected rows valid at the watermark")
    ax.set_xlabel("event time (s)")
    ax.set_ylabel("join state (rows, both inputs)")
    ax.set_title("§5.3 memory (cf. Figure 9)")
    ax.legend(fontsize=7)
    ax = axes[1]
    h = summary["dt_histogram"]
    centers = np.asarray(h["edges_s"][:-1]) + h["bin_s"] / 2
    for name, counts in h["counts"].items():
        wide = name == "baseline"
        ax.step(centers, counts, where="mid", color=colors[name], label=labels[name], lw=3.5 if wide else 1.2,
                alpha=0.45 if wide else 1.0, zorder=1 if wide else 2)
    ax.set_xlabel("|Δt| of the joined elements' start timestamps (s)")
    ax.set_ylabel(f"results per {h['bin_s'] * 1000:.0f} ms bin")
    ax.set_title("§5.3 results by |Δt|, steady state (cf. Figure 11)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax = axes[2]
    names = list(summary["runs"])
    x = np.arange(len(names))
    mem = [summary["runs"][n]["state_ratio_to_baseline"] for n in names]
    memv = [summary["runs"][n]["state_valid_at_wm_ratio_to_baseline"] for n in names]
    res = [summary["runs"][n]["results_steady_share_of_baseline"] for n in names]
    paper_mem = [1.0] + [0.5] * (len(names) - 1)
    paper_res = [{"baseline": 1.0, "window_reduction": 0.5, "load_shedding": 0.25}[n] for n in names]
    ax.bar(x - 0.27, mem, 0.18, label="state rows (Spark, measured)", color="tab:gray")
    ax.bar(x - 0.09, memv, 0.18, label="state valid at watermark", color="lightgray")
    ax.bar(x + 0.09, res, 0.18, label="results (measured, steady state)", color="tab:orange")
    ax.scatter(x - 0.18, paper_mem, marker="_", s=400, color="k", label="paper")
    ax.scatter(x + 0.09, paper_res, marker="_", s=400, color="k")
    ax.set_xticks(x, [labels[n] for n in names], fontsize=8)
    ax.set_ylabel("share of the 10 s baseline")
    ax.set_title("§5.3 shares")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# §5.1

SCHEDULE_5_1 = ((80.0, 30.0), (150.0, 60.0))   # (application time s, new window s); initially 60 s


def part_5_1(spark, args, work: str) -> dict:
    from pyspark_cq.control import ControlTable

    duration = args.duration_5_1
    streams = make_streams(duration, args.rate_5_1, args.keys_5_1, file_s=args.file_s_5_1, seed=args.seed)
    root = os.path.join(work, "in51")
    write_streams(root, streams)
    sched = window_schedule(SCHEDULE_5_1, initial_s=60)
    expected_pairs = oracle_pairs(streams.left, streams.right, sched)
    expected_state = oracle_state(streams, sched, args.delay)
    table = ControlTable(os.path.join(work, "control51.json"))
    table.register(OP, query="pipes51", window="60 seconds")
    for at, w in SCHEDULE_5_1:
        table.set(OP, window=f"{int(w)} seconds", at=BASE_US + int(at * S), reason=f"PIPES §5.1: window {w:g} s",
                  who="pipes_5_1_5_3")
    out = {"setup": {"rate_per_side": args.rate_5_1, "keys": args.keys_5_1, "duration_s": duration,
                     "file_s": args.file_s_5_1, "watermark_delay_s": args.delay, "initial_window_s": 60,
                     "changes": [{"at_s": a, "window_s": w} for a, w in SCHEDULE_5_1], "seed": args.seed},
           "effect_windows_s": effect_windows(sched),
           "paper_effect_windows_s": [[110, 140], [180, 210]]}
    if not join_supports("control"):
        out["spark"] = "not run: window_join has no control= yet"
        out["series"] = {"expected": expected_state.to_dict("list")}
        print("  §5.1: window_join has no control= yet; Spark run skipped", flush=True)
        return out
    r = run_spark_join(spark, root, os.path.join(work, "run51"), window_s=60.0, delay_s=args.delay,
                       control=table.handle(OP))
    b = r["batches"]
    check = compare_pairs(r["pairs"], expected_pairs)
    merged = b.merge(expected_state[["batch", "state_rows", "valid_at_wm", "above_wm", "slack"]], on="batch",
                     how="left",
                     suffixes=("", "_expected"))
    data = merged[merged.input_rows > 0]
    diff = (data.state_rows - data.state_rows_expected)
    out["spark"] = {"batches": len(b), "wall_s": r["wall_s"], "results": len(r["pairs"]),
                    "output_check": check,
                    "state_rows_minus_expected": {"max_abs": int(diff.abs().max()) if len(diff) else None,
                                                  "batches_differing": int((diff != 0).sum())},
                    "late_rows": int(b.late_rows.sum()) if "late_rows" in b else None}
    data = data[data.wm_s.notna()]
    est = pipes_state_estimate(data.wm_s.to_numpy(), args.rate_5_1, sched)
    measured_valid = data.state_rows - data.above_wm - data.slack
    after = (data.wm_s >= 60).to_numpy()                  # once the first window has filled
    dev = np.abs(measured_valid.to_numpy() - est)
    out["spark"]["measured_valid_at_wm_vs_pipes"] = {
        "what": "measured state_rows minus the rows after the watermark (and the 1 ms slack), against the "
                "PIPES estimate at the watermark with linear transitions",
        "max_abs_rows": float(dev.max()) if len(dev) else None,
        "max_abs_rows_from_60s": float(dev[after].max()) if after.any() else None,
        "max_rel_from_60s": float((dev[after] / est[after]).max()) if after.any() else None}
    # when does the measured state start / stop moving (in watermark time)?
    out["spark"]["observed_effects_s"] = observed_effects(data.wm_s.to_numpy(), measured_valid.to_numpy())
    out["series"] = {"measured": b.to_dict("list"), "expected": expected_state.to_dict("list")}
    print(f"  §5.1: {len(b)} batches, {len(r['pairs']):,} results, {r['wall_s']:.0f} s, output check {check}",
          flush=True)
    return out


def observed_effects(wm_s, valid, tol: float = 0.005) -> dict:
    """First watermark instants at which the rows valid at the watermark leave / reach their plateaus."""
    wm_s, valid = np.asarray(wm_s, float), np.asarray(valid, float)
    res = {}
    for lo, hi, level_from, level_to in ((80, 150, 60, 30), (150, 400, 30, 60)):
        sel = (wm_s >= lo) & (wm_s <= hi)
        if not sel.any():
            continue
        w, v = wm_s[sel], valid[sel]
        top = v[0]
        moving = np.nonzero(np.abs(v - top) > tol * top)[0]
        done = np.nonzero(np.abs(v - v[-1]) <= tol * abs(v[-1]))[0]
        res[f"{level_from}->{level_to}"] = {"last_before_change_s": float(w[moving[0] - 1]) if len(moving) else None,
                                            "first_changed_s": float(w[moving[0]]) if len(moving) else None,
                                            "first_at_new_level_s": float(w[done[0]]) if len(done) else None}
    return res


def plot_5_1(summary: dict, rate: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sched = window_schedule(SCHEDULE_5_1, initial_s=60)
    e = pd.DataFrame(summary["series"]["expected"])
    tau = np.linspace(0, summary["setup"]["duration_s"], 1201)
    lag = summary["setup"]["file_s"] + summary["setup"]["watermark_delay_s"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for ax in axes:
        for lo, hi in summary["effect_windows_s"]:
            ax.axvspan(lo, hi, color="gold", alpha=0.25, lw=0)
        for at, _ in SCHEDULE_5_1:
            ax.axvline(at, color="gray", ls=":", lw=1)
    ax = axes[0]
    if "measured" in summary["series"]:
        m = pd.DataFrame(summary["series"]["measured"])
        m = m[m.input_rows > 0]
        ax.plot(m.t_max_s, m.state_rows, "o", ms=3.5, color="tab:blue", label="measured state_rows (Spark)")
    ax.plot(e.t_max_s, e.state_rows, "-", color="tab:blue", lw=0.8, alpha=0.6, label="expected (exact semantics)")
    ax.plot(tau, pipes_state_estimate(tau, rate, sched), "--", color="k", lw=1.2, label="PIPES estimate at τ")
    ax.plot(tau, pipes_state_estimate(tau - lag, rate, sched) + 2 * rate * lag, "-.", color="tab:red", lw=1,
            label=f"PIPES estimate at τ − {lag:g} s + 2λ·{lag:g} s (Spark: watermark delay + batch)")
    ax.set_ylabel("join state (rows, both inputs)")
    ax.set_title("PIPES §5.1 on Spark: window 60 s → 30 s at 80 s, → 60 s at 150 s (x = batch's max event time)")
    ax.legend(fontsize=8, loc="lower left")
    ax = axes[1]
    if "measured" in summary["series"]:
        m = pd.DataFrame(summary["series"]["measured"])
        mm = m[[c for c in m.columns if c not in ("above_wm", "slack", "valid_at_wm")]].merge(
            e[["batch", "above_wm", "slack"]], on="batch")
        mm = mm[(mm.input_rows > 0) & mm.wm_s.notna()]
        ax.plot(mm.wm_s, mm.state_rows - mm.above_wm - mm.slack, "o", ms=3.5, color="tab:blue",
                label="measured state_rows − rows after the watermark (− the 1 ms slack)")
    ee = e[e.wm_s.notna()]
    ax.plot(ee.wm_s, ee.valid_at_wm, "-", color="tab:blue", lw=0.8, alpha=0.6,
            label="expected rows valid at the watermark")
    ax.plot(tau, pipes_state_estimate(tau, rate, sched), "--", color="k", lw=1.2,
            label="PIPES estimate (eq. 9, linear transitions §4.2)")
    ax.set_xlabel("event time (s); lower panel: the batch's watermark")
    ax.set_ylabel("rows valid at the watermark")
    ax.legend(fontsize=8, loc="lower left")
    ax.text(125, ax.get_ylim()[1] * 0.97, "110–140 s", ha="center", va="top", fontsize=8)
    ax.text(195, ax.get_ylim()[1] * 0.97, "180–210 s", ha="center", va="top", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return None if not np.isfinite(obj) else round(float(obj), 6)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _fix_initial_watermark(data: dict) -> dict:
    """Series written before ``_rel_s`` mapped Spark's initial watermark (epoch 0) to None."""
    def fix(series):
        if isinstance(series, dict) and "wm_s" in series:
            series["wm_s"] = [None if (v is None or v < -1e6) else v for v in series["wm_s"]]
        return series

    for value in data.get("series", {}).values():
        if isinstance(value, dict) and "wm_s" in value:
            fix(value)
        elif isinstance(value, dict):
            for sub in value.values():
                fix(sub)
    return data


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--part", choices=("5.1", "5.3", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="§5.3 over 40 s of event time, §5.1 at 40 elements/s")
    ap.add_argument("--print-json", action="store_true", help="print the summaries as JSON")
    ap.add_argument("--out", default=str(harness.FIGURES), help="directory of the figures (PNG)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay", type=float, default=1.0, help="watermark delay (s)")
    ap.add_argument("--file-s", type=float, default=2.0, help="§5.3: seconds of event time per file / batch")
    ap.add_argument("--duration-5-3", type=float, default=90.0)
    ap.add_argument("--file-s-5-1", type=float, default=5.0, help="§5.1: seconds of event time per file / batch")
    ap.add_argument("--duration-5-1", type=float, default=300.0)
    ap.add_argument("--rate-5-1", type=int, default=100, help="§5.1 elements per second and side")
    ap.add_argument("--keys-5-1", type=int, default=2000, help="§5.1 distinct join keys")
    ap.add_argument("--replot", metavar="JSON", nargs="+",
                    help="redraw the figures from results of this script (or the per-part pipes_5_3.json / "
                         "pipes_5_1.json in benchmarks/results)")
    args = ap.parse_args(argv)
    if args.replot:
        out_dir = os.path.abspath(args.out)
        plots = {"5.3": lambda d, p: plot_5_3(d, p), "5.1": lambda d, p: plot_5_1(d, d["setup"]["rate_per_side"], p)}
        for path in args.replot:
            with open(path) as f:
                doc = json.load(f)
            name = os.path.basename(path)
            parts = {k: doc[k] for k in plots if k in doc} or {k: doc for k in plots if f"pipes_{k.replace('.', '_')}" in name}
            for part, data in parts.items():
                if args.part in (part, "all"):
                    plots[part](_fix_initial_watermark(data), os.path.join(out_dir, f"pipes_{part.replace('.', '_')}.png"))
        return
    if args.quick:
        args.rate_5_1 = 40
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    before = harness.start()
    spark = make_spark()
    work = tempfile.mkdtemp(prefix="pipes51_53_")
    results = {}
    try:
        if args.part in ("5.3", "all"):
            print("PIPES §5.3", flush=True)
            s53 = part_5_3(spark, args, work)
            s53["machine"] = {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            plot_5_3(s53, os.path.join(out_dir, "pipes_5_3.png"))
            results["5.3"] = s53
            harness.write_result("pipes_5_1_5_3", _jsonable(results), args, before)
            for name, run in s53["runs"].items():
                print(f"  {name:17s} state {run['state_rows_steady_mean']:8.1f} rows "
                      f"(x{run['state_ratio_to_baseline']:.3f}; "
                      f"valid at wm x{run['state_valid_at_wm_ratio_to_baseline']:.3f}; "
                      f"PIPES {run['pipes_estimate_state_rows']:.0f}, "
                      f"+lag {run['pipes_plus_lag_estimate_state_rows']:.0f}), "
                      f"results {run['results']:,} (x{run['results_share_of_baseline']:.4f}; steady state "
                      f"x{run['results_steady_share_of_baseline']:.4f}), shed {run['shed_rows']}", flush=True)
        if args.part in ("5.1", "all"):
            print("PIPES §5.1", flush=True)
            s51 = part_5_1(spark, args, work)
            s51["machine"] = {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            plot_5_1(s51, args.rate_5_1, os.path.join(out_dir, "pipes_5_1.png"))
            results["5.1"] = s51
            harness.write_result("pipes_5_1_5_3", _jsonable(results), args, before)
        if args.print_json:
            print(json.dumps(_jsonable({part: {k: v for k, v in res.items() if k != "series"}
                                        for part, res in results.items()}), indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
