"""RTStream §5 on Spark: deadline misses and delivered quality of periodic queries against the offered load.

Wei, Prasad, Son & Stankovic, "Prediction-Based QoS Management for Real-Time Data Streams", §5.2: several
periodic queries, offered load from 60 % to 150 % of capacity, the prediction-based policy (``rtstream``)
against the four baselines of §5.2.3 (best effort, feedback control, fixed sampling, dynamic sampling), all
through the same runtime, control table and operator
(``select_chain`` with a scoring predicate of ~``COST · ROUNDS`` sine evaluations per row, a stand-in for a
model as in benchmarks/perf/select_chain_vs_filter.py).

1. **Capacity.** ``--queries`` queries side by side run a few best-effort instances of two sizes; the fixed
   per-instance cost c0 and the cost per row c are fitted (the line through each size's median duration),
   and the capacity is the rows per instance that finish within D: ``(D − c0) / c``.
2. **Runs.** For every load L and strategy, ``--queries`` periodic queries (period P, deadline D) run
   ``--instances`` instances each, every instance reading one file of ``L · capacity`` rows
   (``maxFilesPerTrigger = 1``), the queries side by side on local[2]. Every query is registered with a plan
   whose cost per row is the fitted instance time at that size over its rows and the source rate those
   rows per period (``--a-priori``, the default): the admission control of the prediction-based policies
   (§4.4 before the query starts) sheds the first instances, which no measurement can reach yet.
3. **Reported** per (strategy, load): the deadline-miss ratio, the mean delivered quality (the fraction of
   input kept through a linear input/quality table; a missed instance delivers 0, §5.2.2), over the
   instances after the first (the first one of every strategy runs before anything is measured) and in the
   steady state (from the ``WARMUP``-th instance on: a decision made after instance k reaches instance k + 2
   when instance k + 1 was triggered at once after an overrun); and for
   the prediction-based policies the relative error of their predicted instance times (equation (1) over the
   learned profile, scaled to the rows the instance really processed; each instance against the prediction
   in force for it, ``pyspark_cq_plugins.rtstream.matched_predictions``).

Usage::

    python -m benchmarks.experiments.rtstream_qos [--loads 0.6 0.9 1.2 1.5] [--instances 8] [--queries 2] [--quick] [--plot out.png]
    python -m benchmarks.experiments.rtstream_qos --from-logs run1.txt run2.txt --plot out.png   # medians over earlier runs
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import harness

#: strategy -> policy name (entry point): the prediction-based policy and §5.2.3's four baselines
STRATEGIES = {"best_effort": "rtstream_best_effort", "feedback": "rtstream_feedback",
              "fixed_sampling": "rtstream_fixed_sampling", "dynamic_sampling": "rtstream_dynamic_sampling",
              "rtstream": "rtstream"}
WARMUP = 3    # instances before the steady state: the first runs unmeasured, the second may be triggered
              # before the first's statistics arrive (an overrun), the third is the first a decision reaches
COST = 200    # sine evaluations per row and round of the scoring predicate
CALIBRATION_STAGES = 4   # capacity fits at most (fit_capacity)
ROUNDS = 10   # rounds: ~2000 sines (~15 µs) per row, so that capacity is ~10^5 rows per instance


def score(batch):
    """The scoring predicate: ~COST·ROUNDS sines per row; keeps every row (its score is finite)."""
    x = np.asarray(batch["f"], dtype=np.float64)
    total = np.zeros(len(x))
    for r in range(ROUNDS):
        total += np.sin(np.outer(x + r, np.arange(1, COST + 1, dtype=np.float64))).sum(axis=1)
    return np.isfinite(total)


def write_files(directory, sizes, seed, files=1):
    """One instance's rows per entry of ``sizes``, split into ``files`` files (one task each)."""
    os.makedirs(directory)
    rng = np.random.default_rng(seed)
    k = 0
    for n in sizes:
        for part in np.array_split(np.arange(n, dtype=np.int64), files):
            path = os.path.join(directory, f"f{k:04d}.parquet")
            pq.write_table(pa.table({"x": part, "f": rng.random(len(part))}), path)
            os.utime(path, (1_000_000 + 10 * k, 1_000_000 + 10 * k))
            k += 1


def run(spark, root, tag, policies, sizes_per_query, period, deadline, cost_per_row=None, align=True, files=1,
        edf=None):
    """Run the queries under ``policies``; returns ({query: instances}, the runtime). ``deadline`` is one D or
    one per query; with ``cost_per_row`` every query is registered with a one-selection plan of that cost and
    its source's rate (rows per period); ``files`` per instance; ``edf`` as ``CQRuntime``'s."""
    import pyspark_cq as cq
    from pyspark_cq import plan as P
    from pyspark_cq.runtime import CQRuntime

    rt = CQRuntime(spark, policies=policies, control_path=os.path.join(root, f"ct_{tag}.json"), every_batches=1,
                   edf=edf)
    deadlines = list(deadline) if isinstance(deadline, (list, tuple)) else [deadline] * len(sizes_per_query)
    names = []
    for qi, sizes in enumerate(sizes_per_query):
        src = os.path.join(root, f"in_{tag}_{qi}")
        write_files(src, sizes, seed=qi, files=files)

        def build(ctx, src=src, qi=qi):
            handle = ctx.control(f"chain_{tag}_{qi}", drop_ratio=0.0)
            df = spark.readStream.schema("x long, f double").option("maxFilesPerTrigger", files).parquet(src)
            out = cq.select_chain(df, {"score": score}, control=handle)
            return out.writeStream.format("noop").option("checkpointLocation", os.path.join(root, f"ck_{tag}_{qi}"))

        name = f"{tag}_{qi}"
        known = {}
        if cost_per_row is not None:
            known = {"plan": P.Select(P.Source("files"), 1.0, cost=cost_per_row),
                     "sources": {"files": period / sizes[-1]}}     # a fixed gap between rows: the rate
        rt.register(name, build, period=period, deadline=deadlines[qi], align=align, **known)
        names.append(name)
    # one policy round before the queries start: the shedding stages exist now (the builders made them), so
    # the admission's a-priori drop ratio reaches the first instance, which Spark starts at once
    rt.run_policies()
    with rt:   # with align, the runtime starts each query at a multiple of P (CQRuntime.register)
        for name, sizes in zip(names, sizes_per_query):
            rt.await_batches(name, len(sizes), timeout=60 + 4 * period * len(sizes))
    return {n: [i for i in rt.instances(n) if i.input_rows > 0] for n in names}, rt


def fit_capacity(spark, root, period, deadline, queries, files=1, verbose=False):
    """Fit ``duration = c0 + c·rows`` on best-effort instances of ``queries`` queries side by side (as the
    runs will share the cores), again at half and all of each estimate of the capacity, where the fit matters,
    until the estimate is within 25 % of the largest size measured (at most ``CALIBRATION_STAGES`` fits): the
    instance time grows faster than linearly with its rows here (49 k rows took 1.7 s, 127 k rows 5–7 s in
    run 9), so a line extrapolated 2.6× overstated the capacity by half."""
    guess = 10_000
    for stage in range(CALIBRATION_STAGES):
        sizes = [guess // 2, guess, guess // 2, guess, guess // 2, guess]
        got, _ = run(spark, root, f"calib{stage}", ["rtstream_best_effort"], [sizes] * queries, period, deadline,
                     files=files, edf=False)
        inst = [i for q in got.values() for i in q[1:]]   # the first instance includes the workers' start-up
        n = np.array([i.input_rows for i in inst], dtype=float)
        d = np.array([i.duration for i in inst])
        # the line through each size's median duration: an instance that shares the cores with another
        # process on this machine runs up to twice as long, and a least-squares fit over all points follows it
        sizes_seen = np.unique(n)
        per_row, fixed = np.polyfit(sizes_seen, [np.median(d[n == x]) for x in sizes_seen], 1)
        if verbose:   # the points behind the fit: a bad fit shows as a capacity the runs do not meet
            print(f"#   calibration {stage}: " + " ".join(f"{r:.0f}:{t:.2f}s" for r, t in zip(n, d)), flush=True)
        if per_row <= 0 or fixed >= deadline:
            # a fixed cost per instance above D: no input size meets the deadline (the machine is too busy
            # now, or D too short for Spark's per-batch cost); say so rather than fail on a negative size
            raise SystemExit(f"capacity fit: c0 = {fixed:.2f} s per instance, c = {per_row * 1e6:.1f} µs per row "
                             f"(load {os.getloadavg()[0]:.2f}): no input fits D = {deadline} s; run again on a "
                             f"quieter machine or with a larger --deadline")
        measured, guess = guess, int((deadline - fixed) / per_row)
        if stage > 0 and abs(guess / measured - 1) <= 0.25:
            break
    return fixed, per_row, guess


def prediction_errors(policy, query, instances):
    """Relative error of each of the query's instances against the prediction behind it, rescaled to the rows
    it processed (the policy's own matching and rescale: ``matched_predictions``, ``predicted_for``)."""
    from pyspark_cq_plugins.rtstream import matched_predictions, predicted_for

    return [abs(predicted_for(p, i) - i.duration) / i.duration
            for p, i in matched_predictions(policy.predictions, query, instances) if p.rows > 0]


#: a result row as main() prints it: load, strategy, mode, instances, miss ratio, quality, steady miss, steady q.
ROW = re.compile(r"^\s*(\d+)%\s+(\w+)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def read_rows(lines) -> list[dict]:
    """The result rows of a run's printed output (the lines of a log written by this script)."""
    rows = []
    for line in lines:
        m = ROW.match(line)
        if m:
            rows.append({"load": int(m[1]) / 100, "strategy": m[2], "mode": m[3], "miss": float(m[5]),
                         "quality": float(m[6]), "steady_miss": float(m[7]), "steady_quality": float(m[8])})
    return rows


def plot(runs: list[list[dict]], path: str) -> None:
    """§5's two figures: deadline-miss ratio and delivered quality against the offered load, one line per
    strategy through the median over ``runs`` (each run's rows as :func:`read_rows` gives them), every
    run's value as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k, sname in enumerate(STRATEGIES):
        for ax, key in zip(axes, ("miss", "quality")):
            points = {}
            for rows in runs:
                for r in rows:
                    if r["strategy"] == sname:
                        points.setdefault(r["load"], []).append(r[key])
            if not points:
                continue
            loads = sorted(points)
            color = f"C{k}"
            ax.plot([x * 100 for x in loads], [statistics.median(points[x]) for x in loads], "-o", color=color,
                    label=sname.replace("_", " "), lw=2 if sname == "rtstream" else 1)
            for x in loads:
                ax.scatter([x * 100] * len(points[x]), points[x], color=color, s=8, alpha=0.4)
    axes[0].set(xlabel="offered load (% of capacity)", ylabel="deadline-miss ratio", ylim=(-0.03, 1.03))
    axes[0].axhline(0.05, color="grey", ls=":", lw=1)
    axes[1].set(xlabel="offered load (% of capacity)", ylabel="delivered quality", ylim=(-0.03, 1.03))
    axes[1].legend(fontsize=8)
    fig.suptitle(f"RTStream on Spark: median of {len(runs)} run(s), dots: each run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--loads", type=float, nargs="+", default=[0.6, 0.9, 1.2, 1.5])
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--period", type=float, default=3.0)
    ap.add_argument("--deadline", type=float, default=2.5)
    ap.add_argument("--quick", action="store_true", help="two loads, five instances")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--no-align", dest="align", action="store_false",
                    help="start the queries at once, not at a multiple of P (Spark's default; runs D-F)")
    ap.add_argument("--verbose", action="store_true", help="print every instance (kept fraction, lateness)")
    ap.add_argument("--no-a-priori", dest="a_priori", action="store_false",
                    help="register the queries without plan and rates (no admission-time shedding)")
    ap.add_argument("--deadlines", type=float, nargs="+",
                    help="one relative deadline per query (default: --deadline for all); capacity is fitted at "
                         "--deadline")
    ap.add_argument("--files", type=int, default=1, help="files (tasks) per instance")
    ap.add_argument("--target", type=float, default=None,
                    help="RTStreamQoS's target (share of D its prediction aims at) for the prediction-based "
                         "strategies; default: the policy's own")
    ap.add_argument("--plot", default=None, help="also draw miss ratio and quality against load (PNG)")
    ap.add_argument("--from-logs", nargs="+", default=None, metavar="LOG",
                    help="no run: --plot the medians over these logs of earlier runs (this script's output)")
    ap.add_argument("--edf", action="store_true",
                    help="a session with pyspark-cq's scheduler pools; every (load, strategy) runs twice: all "
                         "queries in one fair pool (shared) and the tightest deadline first (edf)")
    args = ap.parse_args(argv)
    if args.deadlines is not None and len(args.deadlines) != args.queries:
        ap.error(f"--deadlines needs one deadline per query ({args.queries}), got {args.deadlines}")
    if args.from_logs:
        if not args.plot:
            ap.error("--from-logs needs --plot")
        runs = []
        for path in args.from_logs:
            with open(path) as f:
                runs.append(read_rows(f))
            if not runs[-1]:
                ap.error(f"--from-logs: no result rows in {path}")
        plot(runs, args.plot)
        return
    if args.quick:
        args.loads, args.instances = [0.6, 1.5], 5
    before = harness.start()
    harness.worker_env()
    from pyspark_cq_plugins.rtstream import RTStreamQoS

    import pyspark_cq
    from pyspark_cq.policies import create
    from pyspark_cq.policies import load as load_policy

    spark = pyspark_cq.spark("local[2]", "rtstream-bench", shuffle_partitions=2, edf=args.edf,
                             conf={"spark.sql.adaptive.enabled": "false", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="rtstream_bench_")
    try:
        fixed, per_row, capacity = fit_capacity(spark, root, args.period, args.deadline, args.queries, args.files,
                                                 args.verbose)
        print(f"# capacity: c0 = {fixed:.3f} s per instance, c = {per_row * 1e6:.1f} µs per row -> "
              f"{capacity} rows per instance within D = {args.deadline} s (P = {args.period} s)")
        deadlines = args.deadlines or args.deadline
        modes = {"shared": False, "edf": True} if args.edf else {"": None}
        printed = []
        print("load  strategy          mode    instances  miss_ratio  quality  steady_miss  steady_quality  "
              "pred_err_median  pred_err_p90  steady_miss_per_query")
        for load, sname, mode in ((ld, sn, m) for ld in args.loads for sn in args.strategies for m in modes):
            rows = int(load * capacity)
            cost = (fixed + per_row * rows) / rows if args.a_priori else None
            opts = ({"target": args.target} if args.target is not None
                    and issubclass(load_policy(STRATEGIES[sname]), RTStreamQoS) else {})
            policies = [create(STRATEGIES[sname], **opts)]
            tag = f"{sname}_{int(load * 100)}{'_' + mode if mode else ''}"
            got, rt = run(spark, root, tag, policies, [[rows] * args.instances] * args.queries,
                         args.period, deadlines, cost, args.align, args.files, modes[mode])
            inst = [i for q in got.values() for i in q[1:]]
            steady = [i for q in got.values() for i in q[WARMUP:]]
            misses = sum(i.missed for i in inst)
            quality = statistics.fmean(0.0 if i.missed else i.kept for i in inst)
            steady_miss = sum(i.missed for i in steady) / len(steady)
            steady_quality = statistics.fmean(0.0 if i.missed else i.kept for i in steady)
            err = ""
            if hasattr(policies[0], "predictions"):
                e = [x for n, q in got.items() for x in prediction_errors(policies[0], n, q)]
                if e:
                    err = f"{statistics.median(e):15.3f}  {np.percentile(e, 90):12.3f}"
            if args.verbose:
                for q in got.values():
                    print("#   " + " ".join(f"{i.batch}:{i.kept:.2f}/{i.lateness:+.2f}" for i in q))
                first = next(iter(got))   # why the first query's drop ratio changed, round by round
                for rec in rt.decisions_log():
                    for d in rec.get("decisions") or []:
                        if d.get("query") == first and rec.get("applied"):
                            print(f"#     round {rec['round']}: {d.get('reason', '')[:220]}")
            per_query = " ".join(f"{sum(i.missed for i in q[WARMUP:]) / max(len(q[WARMUP:]), 1):.2f}"
                                 for q in got.values())
            printed.append(f"{load:4.0%}  {sname:<16}  {mode or '-':<6}  {len(inst):9d}  "
                           f"{misses / len(inst):10.3f}  {quality:7.3f}  {steady_miss:11.3f}  {steady_quality:14.3f}  "
                           f"{err or ' ' * 29:>29}  {per_query}")
            print(printed[-1], flush=True)
        if args.plot:
            plot([read_rows(printed)], args.plot)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    harness.write_result("rtstream_qos", {"capacity": {"c0_s": fixed, "c_s_per_row": per_row, "rows": capacity},
                                          "rows": printed}, args, before)


if __name__ == "__main__":
    main()
