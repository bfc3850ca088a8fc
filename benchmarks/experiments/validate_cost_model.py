"""Validate the PIPES cost model against pyspark-cq's operators running on Spark; calibrate its constants.

Cammert, Krämer, Seeger & Vaupel, "A Cost Model for Adaptive Resource Management in Data Stream Systems"
(PIPES), §3 and §5; Viglas & Naughton, "Rate-Based Query Optimization for Streaming Information Sources",
§3.3 (Equation 2). Method and results: docs/cost-model.md, "Validation on Spark" and "Calibration".

Validation (default): synthetic streams of known rate — constant distances (keys round robin) or Poisson
arrivals (keys uniform) — are written as parquet files, each covering ``B`` seconds of event time, and
read as file streams (``maxFilesPerTrigger=1``, ``availableNow``) with a watermark delay ``δ``. For every
configuration the script runs ``cq.interval_join`` or ``cq.sliding_aggregate`` on a ``local[2]``
SparkSession and compares, over the steady-state micro-batches (those whose whole retained event time
lies inside the input), the operator's reported ``state_rows`` and ``output_rows`` per second of event
time with

- the plain PIPES estimate: ``pipes.join_state_rows(SC(d_L, 1), SC(d_R, 1), left_window=upper,
  right_window=-lower)`` (eq. 9 after Formula 7) and ``pipes.aggregation_state_rows(SC(d, 1), window=W,
  granularity=g, groups=n)`` (eq. 15 after Formulas 7, 8, per group);
- the same with the watermark correction (``watermark_delay=δ, batch_span=B``): a Spark operator expires
  rows only at the end of a micro-batch, once the batch's watermark (the previous batches' largest event
  time minus δ) has passed ``t + window``, so the state after a batch spans ``window + δ + B``;
- output rates: the join's Formula 4 with Formula 2 (``join_output(...).rate``, σ⋈ = 1/keys) and
  Viglas & Naughton's Equation 2 with negligible costs (``f·r_l·r_r·t``, t the band length); the
  aggregation's Formula 6 (``group_aggregation_output``) for ``emit="changes"``, and ``keys/S`` times the
  probability that a window holds a row for ``emit="windows"``.

Times are in milliseconds inside the model (g = 1 ms, Spark's watermark resolution).

Calibration (``--calibrate``): the native kernels (``pyspark_cq._join.JoinState``,
``pyspark_cq._aggregate.ShardState``) are timed on synthetic batches whose event counts are known, and
``CostProfile.calibrate`` fits the per-event constants (non-negative least squares).

Usage::

    python -m benchmarks.experiments.validate_cost_model [--quick] [--json benchmarks/results/cost_validation.json]
        [--plot docs/figures/cost_validation.png] [--only J1,A3] [--calibrate]
"""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from .. import harness

BASE_S = 1_700_006_400  # a multiple of 3600 s: windows of up to 1 h are aligned with the first file


# --- configurations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinConfig:
    """An interval join ``right.t ∈ [left.t + lower, left.t + upper]`` on synthetic streams."""

    name: str
    lower_s: float
    upper_s: float
    rate_left: float      # rows per second of event time
    rate_right: float
    keys: int
    delay_s: float        # watermark delay δ
    batch_s: float        # event time per file (= per micro-batch) B
    files: int
    arrivals: str = "constant"   # "constant" (keys round robin) or "poisson" (keys uniform)

    @property
    def retained_s(self) -> float:
        """Event time a side keeps beyond the watermark: the larger of upper and -lower."""
        return max(self.upper_s, -self.lower_s, 0.0)


@dataclass(frozen=True)
class AggConfig:
    """A sliding aggregation (window W, slide S, granularity g) by key on a synthetic stream."""

    name: str
    window_s: float
    slide_s: float
    rate: float
    keys: int
    delay_s: float
    batch_s: float
    files: int
    arrivals: str = "constant"
    granularity_s: float | None = None
    emit: str = "windows"

    @property
    def g_s(self) -> float:
        return self.granularity_s or self.slide_s


JOINS = [
    JoinConfig("J1", -10, 10, 100, 100, 100, 5, 5, 10),
    JoinConfig("J2", -60, 60, 10, 10, 10, 10, 20, 12, "poisson"),
    JoinConfig("J3", 0, 600, 10, 10, 1000, 30, 120, 10),
    JoinConfig("J4", 0, 10, 10_000, 1_000, 10_000, 1, 2, 8),
    JoinConfig("J5", -30, 30, 1_000, 1_000, 30_000, 5, 5, 10, "poisson"),
    JoinConfig("J6", -300, 300, 50, 50, 10_000, 30, 60, 14, "poisson"),
]
AGGS = [
    AggConfig("A1", 10, 1, 100, 10, 2, 5, 8),
    AggConfig("A2", 60, 1, 1_000, 100, 5, 10, 10, "poisson"),
    AggConfig("A3", 600, 1, 100, 10, 10, 60, 14),
    AggConfig("A4", 600, 1, 100, 10, 10, 60, 14, granularity_s=10),
    AggConfig("A5", 60, 1, 10, 100, 5, 10, 12, "poisson"),
    AggConfig("A6", 60, 1, 100, 10, 5, 10, 10, "poisson", emit="changes"),
    AggConfig("A7", 60, 1, 10, 100, 5, 10, 12, "poisson", emit="changes"),
]
QUICK = ("J1", "J4", "A1", "A5")


# --- synthetic streams -------------------------------------------------------------------------------------


def arrival_times_us(rate: float, span_s: float, arrivals: str, rng) -> np.ndarray:
    """Event times (µs from BASE_S) of a stream of ``rate`` rows/s over ``[0, span_s)``.

    Constant distances: ``t_j = ⌊j·d⌋`` with ``d = 10⁶/rate`` µs. Poisson: cumulative exponential gaps of
    mean d (the number of rows is then random, mean ``rate·span``).
    """
    d = 1e6 / rate
    end = span_s * 1e6
    if arrivals == "constant":
        return np.floor(np.arange(int(round(rate * span_s))) * d).astype(np.int64)
    if arrivals != "poisson":
        raise ValueError(f"arrivals must be 'constant' or 'poisson', got {arrivals!r}")
    n = int(rate * span_s + 10 * math.sqrt(rate * span_s) + 10)
    t = np.cumsum(rng.exponential(d, n))
    return np.floor(t[t < end]).astype(np.int64)


def stream_keys(n: int, keys: int, arrivals: str, rng) -> np.ndarray:
    """Keys round robin (constant distances: every key has distance keys·d) or uniform (Poisson)."""
    if arrivals == "constant":
        return np.arange(n, dtype=np.int64) % keys
    return rng.integers(0, keys, n).astype(np.int64)


def write_stream(directory: str, times_us: np.ndarray, keys: np.ndarray, batch_s: float, files: int, rng) -> None:
    """Split a stream into ``files`` parquet files of ``batch_s`` seconds of event time each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    edges = np.searchsorted(times_us, np.arange(files + 1) * batch_s * 1e6)
    maxima = []
    for i in range(files):
        sl = slice(edges[i], edges[i + 1])
        maxima.append(float(times_us[sl].max()) / 1000 if edges[i + 1] > edges[i] else float("nan"))
        t = BASE_S * 1_000_000 + times_us[sl]
        table = pa.table({
            "k": pa.array(keys[sl], pa.int64()),
            "ts": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "v": pa.array(rng.random(len(t)), pa.float64()),
        })
        path = os.path.join(directory, f"b{i:04d}.parquet")
        pq.write_table(table, path)
        # file order = batch order: the file source sorts by modification time (ms), ties in listing order
        os.utime(path, (1_000_000 + i * 10, 1_000_000 + i * 10))
    return maxima


def write_join_inputs(root: str, cfg: JoinConfig, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    span = cfg.batch_s * cfg.files
    counts, maxima = {}, []
    for side, rate in (("l", cfg.rate_left), ("r", cfg.rate_right)):
        t = arrival_times_us(rate, span, cfg.arrivals, rng)
        if side == "r" and cfg.arrivals == "constant":
            # Half a distance out of phase: two lattices of equal period would put partners exactly on
            # the band's (inclusive) ends and add one match per row (+1/(band/d_key) of output).
            t = t + int(5e5 / rate)
        maxima.append(write_stream(os.path.join(root, side), t, stream_keys(len(t), cfg.keys, cfg.arrivals, rng),
                                   cfg.batch_s, cfg.files, rng))
        counts[side] = len(t)
    return counts, [max(a, b) for a, b in zip(*maxima)]


def write_agg_input(root: str, cfg: AggConfig, seed: int = 11) -> int:
    rng = np.random.default_rng(seed)
    t = arrival_times_us(cfg.rate, cfg.batch_s * cfg.files, cfg.arrivals, rng)
    maxima = write_stream(os.path.join(root, "in"), t, stream_keys(len(t), cfg.keys, cfg.arrivals, rng), cfg.batch_s,
                          cfg.files, rng)
    return len(t), maxima


# --- Spark runs --------------------------------------------------------------------------------------------


def run_to_end(df, checkpoint: str) -> list[dict]:
    """Run a streaming DataFrame to the end of its files (noop sink); the progress of every batch."""
    query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return [json.loads(p.json) for p in query.recentProgress]


def _source(spark, path: str, delay_s: float):
    return (spark.readStream.schema("k long, ts timestamp, v double").option("maxFilesPerTrigger", 1)
            .parquet(path).withWatermark("ts", f"{int(delay_s * 1000)} milliseconds"))


def _batches(progress: list[dict], name: str, maxima: list[float]) -> list[dict]:
    """Per data batch: the operator's counters, the batch's watermark (ms since BASE_S) and ``max_ms``,
    the largest event time of its file (data batch i reads file i)."""
    import pyspark_cq as cq

    out = []
    for p in progress:
        r = cq.read_metrics(p, name)
        if not r or r["input_rows"] == 0:
            continue  # the final no-data batch (eviction only) is not a steady state
        r = dict(r, batch=p["batchId"])
        value = p.get("eventTime", {}).get("watermark")
        if value:
            r["watermark_ms"] = round((_iso_s(value) - BASE_S) * 1000)
        if len(out) < len(maxima):
            r["max_ms"] = maxima[len(out)]
        out.append(r)
    return out


def _iso_s(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def lag_ms(batch: dict, cfg) -> float:
    """``T_k − wm_k``: the largest event time of the batch's file minus the watermark Spark reported.

    Normally ``δ + B`` (the watermark is the previous batches' maximum minus δ); in some runs Spark
    gave a batch a watermark that already included that batch's own maximum (lag δ, see
    docs/cost-model.md), so the observed lag is recorded per batch.
    """
    if "max_ms" in batch and "watermark_ms" in batch:
        return max(batch["max_ms"] - batch["watermark_ms"], 0.0)
    return (cfg.delay_s + cfg.batch_s) * 1000


def anomalous(batch: dict, cfg) -> bool:
    """A batch whose watermark lag differs from ``δ + B`` by more than a tenth of B."""
    return abs(lag_ms(batch, cfg) - (cfg.delay_s + cfg.batch_s) * 1000) > 100 * cfg.batch_s


def steady(batches: list[dict], batch_s: float, delay_s: float, retained_s: float) -> list[dict]:
    """The batches k whose state can hold the full retention: ``k·B − δ − window ≥ 0``.

    Batch k's watermark is the largest event time of batches < k (≈ k·B) minus δ, and the oldest row it
    keeps is ``window`` older than that.
    """
    first = math.ceil((delay_s + retained_s) / batch_s - 1e-9)
    return [b for i, b in enumerate(batches) if i >= first]


def rel(est: float, meas: float) -> float:
    return (est - meas) / meas if meas else float("nan")


def measure(df, root: str, cfg, maxima: list[float], retained_s: float) -> tuple[list[dict], dict]:
    """Run an operator's query (observed as ``"cv"``) to the end and measure its steady state.

    Returns the steady batches and the record fields every configuration shares: wall time, per-batch
    state and watermarks, late rows, the mean steady state and the output rate per second of event time.
    """
    start = time.perf_counter()
    progress = run_to_end(df, os.path.join(root, cfg.name + "_ck"))
    wall = time.perf_counter() - start
    batches = _batches(progress, "cv", maxima)
    st = steady(batches, cfg.batch_s, cfg.delay_s, retained_s)
    if not st:
        raise RuntimeError(f"{cfg.name}: no steady-state batch (batches {len(batches)})")
    return st, {
        "config": asdict(cfg), "wall_s": round(wall, 1),
        "batches": len(batches), "steady_batches": [b["batch"] for b in st],
        "state_per_batch": [b["state_rows"] for b in batches],
        "watermarks_ms": [b.get("watermark_ms") for b in batches],
        "late_rows": sum(b.get("late_rows", 0) for b in batches),
        "state_measured": statistics.mean(b["state_rows"] for b in st),
        "lags_ms": [lag_ms(b, cfg) for b in batches], "anomalous_batches": [b["batch"] for b in st if anomalous(b, cfg)],
        "output_measured_per_s": sum(b["output_rows"] for b in st) / (len(st) * cfg.batch_s),
    }


def run_join(spark, cfg: JoinConfig, root: str) -> dict:
    """Run one interval-join configuration; measured vs estimated state rows and output rate."""
    import pyspark_cq as cq
    from pyspark_cq.cost import pipes, rate
    from pyspark_cq.cost.pipes import StreamCharacteristics as SC

    data = os.path.join(root, cfg.name)
    counts, maxima = write_join_inputs(data, cfg)
    joined = cq.interval_join(_source(spark, os.path.join(data, "l"), cfg.delay_s),
                              _source(spark, os.path.join(data, "r"), cfg.delay_s), "k", "ts", "ts",
                              f"{int(cfg.lower_s * 1000)} milliseconds", f"{int(cfg.upper_s * 1000)} milliseconds",
                              suffixes=("_l", "_r"), name="cv")
    st, common = measure(joined, root, cfg, maxima, cfg.retained_s)
    measured_state, measured_out = common["state_measured"], common["output_measured_per_s"]

    d_l, d_r = 1000 / cfg.rate_left, 1000 / cfg.rate_right      # ms
    lo, hi = cfg.lower_s * 1000, cfg.upper_s * 1000
    plain = pipes.join_state_rows(SC(d_l, 1), SC(d_r, 1), left_window=max(hi, 0), right_window=max(-lo, 0))
    corrected = pipes.join_state_rows(SC(d_l, 1), SC(d_r, 1), left_window=hi, right_window=-lo,
                                      watermark_delay=cfg.delay_s * 1000, batch_span=cfg.batch_s * 1000)
    observed = statistics.mean(
        sum(pipes.join_state_rows(SC(d_l, 1), SC(d_r, 1), left_window=hi, right_window=-lo,
                                  watermark_delay=lag_ms(b, cfg))) for b in st)
    sel = 1 / cfg.keys
    # Formula 4 + 2: validity intervals of the band's two sides, [t, t + upper] and [t, t - lower].
    out_pipes = pipes.join_output(pipes.window_output(SC(d_l, 1), max(hi, 0)),
                                  pipes.window_output(SC(d_r, 1), max(-lo, 0)), sel).rate * 1000
    # Viglas & Naughton Eq. 2 with the band length as t and negligible per-arrival costs (rates per ms).
    out_viglas = rate.join_output_rate(1 / d_l, 1 / d_r, sel, 0.0, 0.0, hi - lo, saturate=True) * 1000
    return {
        **common, "kind": "join", "rows": counts,
        "state_pipes": sum(plain), "state_pipes_sides": plain,
        "state_corrected": sum(corrected), "state_corrected_sides": corrected,
        "err_state_pipes": rel(sum(plain), measured_state),
        "err_state_corrected": rel(sum(corrected), measured_state),
        "state_observed_lag": observed, "err_state_observed_lag": rel(observed, measured_state),
        "output_pipes_per_s": out_pipes, "output_viglas_per_s": out_viglas,
        "err_output_pipes": rel(out_pipes, measured_out), "err_output_viglas": rel(out_viglas, measured_out),
    }


def window_output_rate(cfg: AggConfig) -> float:
    """Windows emitted per second by ``emit="windows"``: ``keys/S`` times the probability that a window
    holds at least one of its key's rows, ``1 − (1 − 1/d_k)^W`` (the hit fraction of Formula 5 with
    granule W; d_k = keys·d in ms). Not a PIPES formula: PIPES' α emits change intervals (Formula 5)."""
    d_k = cfg.keys * 1000 / cfg.rate
    hit = 1 - max(0.0, 1 - 1 / d_k) ** (cfg.window_s * 1000)
    return cfg.keys / cfg.slide_s * hit


def run_agg(spark, cfg: AggConfig, root: str) -> dict:
    """Run one sliding-aggregation configuration; measured vs estimated state rows and output rate."""
    import pyspark_cq as cq
    from pyspark_cq.cost import pipes
    from pyspark_cq.cost.pipes import StreamCharacteristics as SC

    data = os.path.join(root, cfg.name)
    n, maxima = write_agg_input(data, cfg)
    aggs = {"v": ["sum"]} if cfg.emit == "changes" else {"*": ["count"]}
    out = cq.sliding_aggregate(_source(spark, os.path.join(data, "in"), cfg.delay_s), "ts",
                               f"{int(cfg.window_s)} seconds", f"{int(cfg.slide_s)} seconds", by="k", aggs=aggs,
                               granularity=None if cfg.granularity_s is None else f"{int(cfg.granularity_s)} seconds",
                               emit=cfg.emit, name="cv")
    st, common = measure(out, root, cfg, maxima, cfg.window_s)
    measured_state, measured_out = common["state_measured"], common["output_measured_per_s"]

    d = 1000 / cfg.rate
    w, g = cfg.window_s * 1000, cfg.g_s * 1000
    plain = pipes.aggregation_state_rows(SC(d, 1), window=w, granularity=g, groups=cfg.keys)
    corrected = pipes.aggregation_state_rows(SC(d, 1), window=w, granularity=g, groups=cfg.keys,
                                             watermark_delay=cfg.delay_s * 1000, batch_span=cfg.batch_s * 1000)
    runs = cfg.keys if cfg.emit == "changes" else 0  # one pending change interval per key (see docs)
    observed = statistics.mean(
        pipes.aggregation_state_rows(SC(d, 1), window=w, granularity=g, groups=cfg.keys,
                                     watermark_delay=lag_ms(b, cfg)) for b in st) + runs
    if cfg.emit == "changes":
        s = pipes.granularity_output(pipes.window_output(SC(d, 1), w), g)
        out_model = pipes.group_aggregation_output(s, cfg.keys).rate * 1000
        out_label = "PIPES Formula 6 (ω, Γ, γ)"
    else:
        out_model = window_output_rate(cfg)
        out_label = "keys/S · P(window non-empty)"
    return {
        **common, "kind": "aggregate", "rows": n,
        "state_pipes": plain + runs, "state_corrected": corrected + runs, "pending_runs_added": runs,
        "err_state_pipes": rel(plain + runs, measured_state),
        "err_state_corrected": rel(corrected + runs, measured_state),
        "state_observed_lag": observed, "err_state_observed_lag": rel(observed, measured_state),
        "output_model_per_s": out_model, "output_model": out_label,
        "err_output_model": rel(out_model, measured_out),
    }


# --- report ------------------------------------------------------------------------------------------------


def describe(r: dict) -> str:
    c = r["config"]
    if r["kind"] == "join":
        return (f"join [{c['lower_s']:g}, {c['upper_s']:g}] s, {c['rate_left']:g}/{c['rate_right']:g} rows/s, "
                f"{c['keys']} keys, {c['arrivals']}, δ={c['delay_s']:g} s, B={c['batch_s']:g} s")
    g = f", g={c['granularity_s']:g} s" if c["granularity_s"] else ""
    return (f"agg W={c['window_s']:g} s, S={c['slide_s']:g} s{g} (W/g={c['window_s'] / (c['granularity_s'] or c['slide_s']):g}), "
            f"{c['rate']:g} rows/s, {c['keys']} keys, {c['arrivals']}, {c['emit']}, δ={c['delay_s']:g} s, "
            f"B={c['batch_s']:g} s")


def table(results: list[dict]) -> str:
    """A markdown table of the relative errors (estimate − measured) / measured."""
    lines = ["| config | setting | state measured | PIPES | err | PIPES + δ + B | err | PIPES + (T_k − wm_k) | err | "
             "output/s measured | model | err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        model = r.get("output_pipes_per_s", r.get("output_model_per_s"))
        err_out = r.get("err_output_pipes", r.get("err_output_model"))
        lines.append(
            f"| {r['config']['name']} | {describe(r)} | {r['state_measured']:,.0f} | {r['state_pipes']:,.0f} | "
            f"{r['err_state_pipes']:+.1%} | {r['state_corrected']:,.0f} | {r['err_state_corrected']:+.1%} | "
            f"{r['state_observed_lag']:,.0f} | {r['err_state_observed_lag']:+.1%} | "
            f"{r['output_measured_per_s']:,.1f} | {model:,.1f} | {err_out:+.1%} |")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    ax = axes[0]
    for r in results:
        m = "o" if r["kind"] == "join" else "s"
        ax.scatter(r["state_measured"], r["state_pipes"], marker=m, facecolors="none", edgecolors="tab:red")
        ax.scatter(r["state_measured"], r["state_corrected"], marker=m, color="tab:blue")
        ax.scatter(r["state_measured"], r["state_observed_lag"], marker="x", color="tab:green", s=18)
        ax.annotate(r["config"]["name"], (r["state_measured"], r["state_corrected"]), fontsize=7,
                    xytext=(3, -8), textcoords="offset points")
    ax.scatter([], [], marker="o", color="gray", label="interval join")
    ax.scatter([], [], marker="s", color="gray", label="sliding aggregation")
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="tab:red", label="PIPES (eq. 9 / 15)")
    ax.scatter([], [], marker="o", color="tab:blue", label="PIPES, window + δ + B")
    ax.scatter([], [], marker="x", color="tab:green", label="PIPES, window + (T_k − wm_k) observed")
    _identity(ax, [r["state_measured"] for r in results] + [r["state_pipes"] for r in results])
    ax.set_xlabel("measured state rows (steady state, end of batch)")
    ax.set_ylabel("estimated state rows")
    ax.set_title("State rows")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[1]
    for r in results:
        est = r.get("output_pipes_per_s", r.get("output_model_per_s"))
        m = "o" if r["kind"] == "join" else "s"
        ax.scatter(r["output_measured_per_s"], est, marker=m, color="tab:green")
        ax.annotate(r["config"]["name"], (r["output_measured_per_s"], est), fontsize=7, xytext=(3, -8),
                    textcoords="offset points")
    _identity(ax, [r["output_measured_per_s"] for r in results])
    ax.set_xlabel("measured output rows per second of event time")
    ax.set_ylabel("estimated (Formulas 4+2 / 6; windows: keys/S)")
    ax.set_title("Output rate")
    fig.suptitle("PIPES cost model vs pyspark-cq operators on Spark (local[2]); band ±10 %", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _identity(ax, values) -> None:
    values = [v for v in values if v and v > 0]
    lo, hi = min(values) / 2, max(values) * 2
    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, "k-", lw=0.8)
    ax.fill_between(x, 0.9 * x, 1.1 * x, color="gray", alpha=0.2, lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


# --- calibration -------------------------------------------------------------------------------------------


def _join_batches(rows: int, keys: int, band_ms: int, batch: int, rate: float, seed: int):
    """Synthetic batches for the join kernel: alternating sides, in event-time order."""
    rng = np.random.default_rng(seed)
    t = np.floor(np.cumsum(rng.exponential(1e6 / rate, rows))).astype(np.int64)
    k = rng.integers(0, keys, rows).astype(np.int64)
    return [(i // batch % 2, t[i:i + batch], k[i:i + batch]) for i in range(0, rows, batch)]


def calibrate_join(repeats: int = 3) -> tuple[list[dict], list[float], list[dict]]:
    """Time JoinState.insert_probe / evict on batches of known event counts.

    Counted events (observable from outside the kernel), mapped to CostProfile names:
    ``hash_function`` ← rows inserted (each: one hash, one bucket insertion, one heap insertion and the
    probe's terminating predicate call: C_H + C_B + C_R of eq. 11 and C_H of eq. 12 per row);
    ``build_result`` ← result pairs (each: one successful join-predicate call and one result, C_P + C_F
    of eqs. 12, 13); ``expiration_predicate`` ← rows evicted (2·C_E + C_B + C_R of eq. 14).
    """
    from pyspark_cq._native import load

    join = load("_join")
    counts, times, detail = [], [], []
    for keys in (1_000, 30_000, 300_000):
        for band_ms in (1_000, 10_000, 60_000):
            for rate in (10_000, 100_000):
                batches = _join_batches(200_000, keys, band_ms, 10_000, rate, seed=keys + band_ms)
                best = None
                for _ in range(repeats):
                    state = join.JoinState(-band_ms * 1000, band_ms * 1000)
                    ins = res = ev = 0
                    t_insert = t_evict = 0.0
                    for side, t, k in batches:
                        offsets = np.arange(len(k) + 1, dtype=np.int64) * 8
                        ids = np.arange(len(k), dtype=np.int64)
                        start = time.perf_counter()
                        idx, _other = state.insert_probe(side, offsets, k.view(np.uint8), None, t, ids)
                        mid = time.perf_counter()
                        horizon = int(t[-1])
                        e0, _ = state.evict(0, horizon - band_ms * 1000)
                        e1, _ = state.evict(1, horizon - band_ms * 1000)
                        t_insert += mid - start
                        t_evict += time.perf_counter() - mid
                        ins += len(k)
                        res += len(idx)
                        ev += len(e0) + len(e1)
                    if best is None or t_insert + t_evict < sum(best):
                        best = (t_insert, t_evict)
                # insert_probe and evict are timed apart: one measurement row each (eqs. 11-13 and 14).
                for c, sec, phase in (({"hash_function": ins, "build_result": res}, best[0], "insert_probe"),
                                      ({"expiration_predicate": ev}, best[1], "evict")):
                    counts.append(c)
                    times.append(sec)
                    detail.append(dict(c, keys=keys, band_ms=band_ms, rate=rate, phase=phase, seconds=sec))
    return counts, times, detail


def calibrate_aggregate(repeats: int = 3) -> tuple[list[dict], list[float], list[dict]]:
    """Time ShardState.ingest / emit_windows / evict on slices of known event counts.

    ``aggregate_init`` ← new slices (C_L + C_I of eq. 18: list append and initialisation),
    ``aggregate_update`` ← slices merged into an existing one (C_O + C_U of eq. 17),
    ``overlap_check`` ← windows emitted (the per-output reorganisation of eq. 19, (C_O + C_L)/d'),
    ``list_operation`` ← slices evicted (the remove-first of eq. 19).
    """
    from pyspark_cq._native import load

    K = load("_aggregate")
    kinds = np.array([K.KIND_ADD_I64], dtype=np.uint8)
    outs = np.array([K.OUT_COUNT, 0, -1], dtype=np.int32)
    counts, times, detail = [], [], []
    for keys in (10, 300, 3_000):
        for w_slices in (10, 60, 300):
            for dup in (1, 3):  # each (key, slice) delivered dup times: merges vs inits
                s = 1_000_000
                w = w_slices * s
                n_slices = max(2 * w_slices + 20, 600_000 // keys)
                batch_slices = max(1, n_slices // 10)
                best = None
                for _ in range(repeats):
                    st = K.ShardState(kinds, outs, False)
                    new = merged = emitted = evicted = 0
                    spent = np.zeros(3)
                    late = None
                    for b0 in range(0, n_slices, batch_slices):
                        sl = np.arange(b0, min(b0 + batch_slices, n_slices), dtype=np.int64)
                        starts = np.repeat(sl * s, keys * dup)
                        hashes = np.tile(np.repeat(np.arange(keys, dtype=np.int64) * 7919 + 1, dup), len(sl))
                        parts = [np.ones(len(starts), dtype=np.int64)]
                        wm_new = int(sl[-1] * s)
                        t0 = time.perf_counter()
                        st.ingest(hashes, starts, parts, w, s, late)
                        t1 = time.perf_counter()
                        em = st.emit_windows(w, s, late, wm_new, False)
                        t2 = time.perf_counter()
                        _kept, n_ev, _ = st.evict(w, s, wm_new)
                        spent += (t1 - t0, t2 - t1, time.perf_counter() - t2)
                        st.watermark = wm_new
                        late = wm_new
                        new += len(sl) * keys
                        merged += len(sl) * keys * (dup - 1)
                        emitted += len(em[0])
                        evicted += int(n_ev)
                    if best is None or spent.sum() < best.sum():
                        best = spent
                # ingest, emit_windows and evict are timed apart: one measurement row each.
                for c, sec, phase in (({"aggregate_init": new, "aggregate_update": merged}, best[0], "ingest"),
                                      ({"overlap_check": emitted}, best[1], "emit_windows"),
                                      ({"list_operation": evicted}, best[2], "evict")):
                    counts.append(c)
                    times.append(float(sec))
                    detail.append(dict(c, keys=keys, window_slices=w_slices, dup=dup, phase=phase, seconds=float(sec)))
    return counts, times, detail


def fit(counts, times):
    """``CostProfile.calibrate`` on the measurements that count at least one event (a call that had
    nothing to do, e.g. an eviction before any row expired, measures only the call's overhead, which
    no PIPES constant models); returns the profile, the fitted constants, relative residuals and R²."""
    from pyspark_cq.cost.pipes import CostProfile

    keep = [i for i, c in enumerate(counts) if sum(c.values()) > 0]
    counts, times = [counts[i] for i in keep], [times[i] for i in keep]

    names = sorted({n for c in counts for n in c})
    prof = CostProfile().calibrate(counts, times)
    a = np.array([[c.get(n, 0) for n in names] for c in counts], dtype=float)
    x = np.array([getattr(prof, n) for n in names])
    pred = a @ x
    t = np.asarray(times)
    resid = (pred - t) / t
    r2 = 1 - ((t - pred) ** 2).sum() / ((t - t.mean()) ** 2).sum()
    return prof, {n: float(getattr(prof, n)) for n in names}, resid, float(r2)


def run_calibration(out_json: str | None) -> dict:
    print("# calibration: timing the native kernels (best of 3 per configuration)", flush=True)
    res = {}
    for label, fn in (("join", calibrate_join), ("aggregate", calibrate_aggregate)):
        counts, times, detail = fn()
        _prof, consts, resid, r2 = fit(counts, times)
        print(f"{label}: constants (ns per event): " +
              ", ".join(f"{n}={v * 1e9:.1f}" for n, v in consts.items()))
        print(f"  relative residuals: median |r| {np.median(np.abs(resid)):.1%}, max |r| {np.max(np.abs(resid)):.1%}, "
              f"R² {r2:.4f} over {len(resid)} measurements (calls with no event left out)", flush=True)
        detail = [d for d, c in zip(detail, counts) if sum(c.values()) > 0]
        res[label] = {"constants_ns": {n: v * 1e9 for n, v in consts.items()},
                      "residuals": [float(r) for r in resid], "r2": r2, "measurements": detail,
                      "load_average": os.getloadavg()[0]}
    if out_json:
        with open(out_json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {out_json}")
    return res


def _doc(results: list[dict]) -> dict:
    return {"generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "results": results}


# --- main --------------------------------------------------------------------------------------------------


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--only", help="comma-separated configuration names (e.g. J1,A3)")
    ap.add_argument("--plot", default=None, help="write the figure here (e.g. docs/figures/cost_validation.png)")
    ap.add_argument("--calibrate", action="store_true", help="fit CostProfile constants from kernel timings instead")
    ap.add_argument("--calibration-json", default=None,
                    help="with --calibrate: write the fit here "
                         "(e.g. benchmarks/results/cost_validation_calibration.json)")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.calibrate:
        run_calibration(args.calibration_json)
        return

    wanted = set(args.only.split(",")) if args.only else (set(QUICK) if args.quick else None)
    configs = [c for c in AGGS + JOINS if wanted is None or c.name in wanted]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["TZ"] = "UTC"
    spark = harness.cq_session("cost-validation", conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
        "spark.driver.memory": "3g", "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.session.timeZone": "UTC"})
    root = tempfile.mkdtemp(prefix="cq_costval_")
    results = []
    try:
        for cfg in configs:
            print(f"{cfg.name}: running ...", flush=True)
            r = run_join(spark, cfg, root) if isinstance(cfg, JoinConfig) else run_agg(spark, cfg, root)
            results.append(r)
            # after every configuration, so a long run's results survive an interruption
            harness.write_result("validate_cost_model", _doc(results), args, before)
            out_model = r.get("output_pipes_per_s", r.get("output_model_per_s"))
            print(f"{cfg.name}: {describe(r)}: {r['batches']} batches ({r['wall_s']} s), steady {r['steady_batches']}; "
                  f"state measured {r['state_measured']:,.0f}, PIPES {r['state_pipes']:,.0f} ({r['err_state_pipes']:+.1%}), "
                  f"+δ+B {r['state_corrected']:,.0f} ({r['err_state_corrected']:+.1%}), +observed lag "
                  f"{r['state_observed_lag']:,.0f} ({r['err_state_observed_lag']:+.1%}), watermark anomalies in "
                  f"batches {r['anomalous_batches']}; output/s measured "
                  f"{r['output_measured_per_s']:,.1f}, model {out_model:,.1f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    print()
    print(table(results))
    harness.write_result("validate_cost_model", _doc(results), args, before)
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
