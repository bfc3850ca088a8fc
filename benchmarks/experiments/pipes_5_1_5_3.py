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
plain Python/numpy in :mod:`pyspark_cq.experiments.pipes_join`, which ``tests/test_pipes_experiments.py`` checks too.

Usage::

    python -m benchmarks.experiments.pipes_5_1_5_3 [--part 5.1|5.3|all] [--quick] [--print-json] [--out docs/figures] [--json PATH]
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pandas as pd

from pyspark_cq.experiments.pipes_join import (
    BASE_US,
    OP,
    SCHEDULE_5_1,
    S,
    compare_pairs,
    effect_windows,
    join_supports,
    kept_rows,
    make_streams,
    oracle_pairs,
    oracle_state,
    pipes_state_estimate,
    run_spark_join,
    window_schedule,
    write_streams,
)

from .. import harness


def make_spark(partitions: int = 2):
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return harness.cq_session("pipes-5.1-5.3", partitions, conf={
        "spark.sql.adaptive.enabled": "false", "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000", "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC"})


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
