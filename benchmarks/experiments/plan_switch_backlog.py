"""What plan switching buys on Spark: OM, rate-based, RAND, each static plan and the per-round oracle (issues 18, 19).

One 3-way ``multi_join`` over a backlog whose rates change halfway, run once per policy over the same files in
one Spark session (medians over ``--repeat`` passes, the order of the runs rotated between passes):

- **Workload.** Inputs 0, 1, 2 share one key (``--keys`` values) with time bands of ±100 µs between every
  pair and a 3 s watermark delay, so each state holds ~4 s of rows and few probes match. Each round (one
  micro-batch, one file per input, 1 s of event time) brings ``(hi, lo, hi)`` rows in the first half and
  ``(lo, hi, hi)`` in the second (``--phases 2``; ``--phases 1`` gives ``(lo, hi, lo)`` then ``(hi, lo, hi)``,
  whose second half outweighs the first). Our kernel walks the probed state's rows of the key for every
  partial match, so a batch's time is the state rows its probes scan: probing the small state first is
  cheap, and the best plan changes halfway — ``0:1>2;1:2>0;2:1>0`` (the slow input 1 is probed first) in the
  first half, ``0:2>1;1:0>2;2:0>1`` (the slow input 0 is probed first) in the second. Every adaptive run
  starts in the plan ``0:1>2;1:0>2;2:0>1``, best in neither half.
- **Runs.** ``static:<plan>`` for the three left-deep plans; ``oracle``: each round the plan whose static run
  scanned the fewest state rows in that round (written before the batch: what no policy can know); ``om`` (charts
  costed by our operator's probe steps, ``join_model="mjoin"``), ``om-tree`` (OM's left-deep tree model, as
  before this change), ``rate`` (Viglas & Naughton, objective ``rate``) and ``rand``. The policies run one
  round after every batch (the decision applies to the next batch), through the runtime and the control table.
- **Measures.** Spark's batch time summed (the backlog's catch-up time), input rows/s over it, partial
  matches (``probed_*``) and the state rows they scanned (``probed_i_j · state_rows_j``), mean state bytes, time to half and to all outputs (cumulative batch time), the
  policy's round time, and for ``rate`` its predicted output rate of the plan that ran vs the measured one
  (outputs / batch time), and whether its predicted best plan is the fastest plan measured in that round.
  Every run's output count is checked equal.

Usage::

    sparkslot --all python -m benchmarks.experiments.plan_switch_backlog [--rounds 12] [--repeat 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from pyspark_cq.policies import plan_stats as ps  # noqa: E402

from .. import harness
from ..common import _write

OP = "mj"
PLANS = ps.left_deep_plans(3)          # (0,1,2), (0,2,1), (1,2,0)
START = PLANS[0]
BASE_US = 1_700_000_000_000_000
BANDS = ((0, 1, 100), (0, 2, 100), (1, 2, 100))      # ± microseconds
WATERMARK = "3 seconds"


def rows_per_round(rounds: int, lo: int, hi: int, phases: int = 2) -> list[tuple[int, int, int]]:
    if phases == 1:
        return [(lo, hi, lo) if r < rounds // 2 else (hi, lo, hi) for r in range(rounds)]
    return [(hi, lo, hi) if r < rounds // 2 else (lo, hi, hi) for r in range(rounds)]


def write_inputs(root: str, rounds: int, lo: int, hi: int, keys: int, phases: int = 2,
                 seed: int = 3) -> list[tuple[int, int, int]]:
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    counts = rows_per_round(rounds, lo, hi, phases)
    for r, per in enumerate(counts):
        for i, n in enumerate(per):
            t = BASE_US + r * 1_000_000 + np.sort(rng.integers(0, 1_000_000, n))
            _write(os.path.join(root, f"in{i}"), r, pa.table({
                f"k{i}": pa.array(rng.integers(0, keys, n), pa.int64()),
                f"t{i}": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                f"v{i}": pa.array(np.arange(n) + r * 10**6, pa.int64())}))
    return counts


def _policy(mode: str, args):
    if mode in ("om", "om-tree"):
        from pyspark_cq_plugins.om import OMPolicy

        rng = (0.5 * args.lo, 2.0 * args.hi)
        return OMPolicy(k=args.k, d=args.d, decay=0.5, window=1.0, join_cost=args.join_cost,
                        join_model="tree" if mode == "om-tree" else "mjoin",
                        ranges={OP: {f"rate:{i}": rng for i in range(3)}})
    if mode == "rate":
        from pyspark_cq_plugins.rate_based import RateBased

        return RateBased(objective="rate", t_p=2.0, margin=0.1, min_batches=1, d=args.d)
    if mode == "rand":
        from pyspark_cq_plugins.plan_baselines import RandPolicy

        return RandPolicy(seed=args.seed, d=args.d)
    return None


def run_once(spark, root: str, mode: str, args, oracle: list[str] | None) -> dict:
    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    run_dir = os.path.join(root, f"run-{mode.replace(':', '_').replace('>', '').replace(';', '')}-{time.time_ns()}")
    live = [os.path.join(run_dir, f"in{i}") for i in range(3)]
    for d in live:
        os.makedirs(d)
    policy = _policy(mode, args)
    start = mode.split(":", 1)[1] if mode.startswith("static:") else oracle[0] if mode == "oracle" else START
    rt = CQRuntime(spark, policies=[policy] if policy else [], control_path=os.path.join(run_dir, "ct.json"),
                   every_batches=10**9)

    def build(ctx):
        h = ctx.control(OP, plan_id=start)
        dfs = [ctx.spark.readStream.schema(f"k{i} long, t{i} timestamp, v{i} long").option("maxFilesPerTrigger", 1)
               .parquet(live[i]).withWatermark(f"t{i}", WATERMARK) for i in range(3)]
        out = cq.multi_join(dfs, ["k0", "k1", "k2"], ["t0", "t1", "t2"],
                            [(i, j, f"-{b} microseconds", f"{b} microseconds") for i, j, b in BANDS],
                            control=h, name=OP)
        return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck"))

    rt.register("Q", build)
    ran, policy_s, predicted, step_end = [], [], [], []
    with rt:
        q = rt.query("Q")
        for step in range(args.rounds):
            if mode == "oracle":
                rt.control_table().set(OP, plan_id=oracle[step], reason="oracle")
            ran.append(rt.control_table().entry(OP).params.get("plan_id"))
            for i in range(3):     # hidden copies first, then three renames: one batch sees all three files
                shutil.copy2(os.path.join(root, "data", f"in{i}", f"b{step:04d}.parquet"),
                             os.path.join(live[i], f".b{step:04d}.parquet"))
            for i in range(3):
                os.replace(os.path.join(live[i], f".b{step:04d}.parquet"), os.path.join(live[i], f"b{step:04d}.parquet"))
            q.processAllAvailable()
            step_end.append(q.lastProgress["batchId"])     # a step's files can land in two batches
            want = cq.read_metrics([p for p in q.recentProgress if p["numInputRows"] > 0][-1], OP)
            deadline = time.monotonic() + 60
            while dict(rt.statistics().queries["Q"].operators[OP].report) != want and time.monotonic() < deadline:
                time.sleep(0.02)
            if policy is not None:
                t0 = time.perf_counter()
                rt.run_policies()
                policy_s.append(time.perf_counter() - t0)
                if mode == "rate":
                    predicted.append(dict(policy.predictions.get(("Q", OP), {})))
        batches = []
        for p in q.recentProgress:
            r = cq.read_metrics(p, OP)
            if r and r.get("input_rows"):
                batches.append({"batch": p["batchId"], "seconds": p["batchDuration"] / 1000.0,
                                "input_rows": r["input_rows"], "output_rows": r["output_rows"],
                                "probes": sum(v for k, v in r.items() if k.startswith("probed_")),
                                # rows the partial matches met: the kernel walks the probed state's key chain
                                "scanned": sum(v * r.get(f"state_rows_{k.rsplit('_', 1)[1]}", 0)
                                               for k, v in r.items() if k.startswith("probed_")),
                                "inputs": [r.get(f"input_rows_{i}", 0) for i in range(3)],
                                "state_bytes": r.get("state_bytes", 0)})
    out = {"mode": mode, "ran": ran, "batches": batches, "step_end": step_end, "policy_s": policy_s, "predicted": predicted,
           "status": policy.status() if hasattr(policy, "status") else None}
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def per_step(run: dict, what: str) -> list[float]:
    """``what`` summed over the batches of each step (a step's three files can land in two batches)."""
    if "step_end" not in run:          # a run saved before steps were recorded: one batch per step
        return [b[what] for b in run["batches"]]
    out, prev = [], -1
    for end in run["step_end"]:
        out.append(sum(b[what] for b in run["batches"] if prev < b["batch"] <= end))
        prev = end
    return out


def summarize(run: dict) -> dict:
    b = run["batches"]
    secs = [x["seconds"] for x in b]
    outs = np.cumsum([x["output_rows"] for x in b])
    t = np.cumsum(secs)
    total = int(outs[-1]) if len(outs) else 0
    half = float(t[int(np.searchsorted(outs, total / 2))]) if total else float("nan")
    return {"seconds": float(sum(secs)), "rows_per_s": sum(x["input_rows"] for x in b) / sum(secs),
            "probes": int(sum(x["probes"] for x in b)), "scanned": int(sum(x["scanned"] for x in b)),
            "split_batches": sum(1 for x in b if not all(x["inputs"])), "state_bytes_mean": float(np.mean([x["state_bytes"] for x in b])),
            "outputs": total, "t_half": half, "t_all": float(t[-1]),
            "switches": sum(a != c for a, c in zip(run["ran"], run["ran"][1:])),
            "policy_s_median": float(np.median(run["policy_s"])) if run["policy_s"] else 0.0}


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--lo", type=int, default=1500, help="rows per round of a slow input")
    ap.add_argument("--hi", type=int, default=15000, help="rows per round of a fast input")
    ap.add_argument("--keys", type=int, default=1)
    ap.add_argument("--phases", type=int, choices=(1, 2), default=2, help="the rate schedule (see the module)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--d", type=int, default=3)
    ap.add_argument("--join-cost", type=float, default=1e-9, help="OM's seconds per state row a probe scans")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--modes", default="static,oracle,om,om-tree,rate,rand")
    ap.add_argument("--from-json", default=None, help="report (and plot) a saved run instead of running")
    ap.add_argument("--plot", default=None, help="PNG of the outputs-by-time curves")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.from_json:
        with open(args.from_json) as fh:
            res = json.load(fh)
        report(res)
        if args.plot:
            plot(res, args.plot)
        return 0
    import pyspark_cq as cq

    load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    spark = cq.spark("local[2]", "plan-switch-backlog", shuffle_partitions=2,
                     conf={"spark.sql.streaming.metricsEnabled": "false", "spark.ui.enabled": "false",
                           "spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    root = tempfile.mkdtemp(prefix="plan-switch-")
    counts = write_inputs(os.path.join(root, "data"), args.rounds, args.lo, args.hi, args.keys, args.phases)
    wanted = args.modes.split(",")
    statics = [f"static:{p}" for p in PLANS] if "static" in wanted else []
    adaptive = [m for m in wanted if m not in ("static", "oracle")]
    runs: dict[str, list[dict]] = {}
    oracle = None
    # a warm-up query (discarded): the first run of a session pays the JVM's and the workers' start
    run_once(spark, root, f"static:{START}", argparse.Namespace(**{**vars(args), "rounds": 2}), None)
    for rep in range(args.repeat):
        order = statics + (["oracle"] if "oracle" in wanted and rep > 0 else []) + adaptive
        order = order[rep % len(order):] + order[:rep % len(order)]
        for mode in order:
            runs.setdefault(mode, []).append(run_once(spark, root, mode, args, oracle))
            print(f"  {mode}: {summarize(runs[mode][-1])}", flush=True)
        if oracle is None and statics:
            probes = {m: per_step(runs[m][0], "scanned") for m in statics}
            oracle = [min(statics, key=lambda m: probes[m][r]).split(":", 1)[1] for r in range(args.rounds)]
            if "oracle" in wanted:
                runs.setdefault("oracle", []).append(run_once(spark, root, "oracle", args, oracle))
                print(f"  oracle: {summarize(runs['oracle'][-1])}", flush=True)
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    load1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    res = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_start": load0, "load_end": load1, "args": vars(args), "rows_per_round": counts,
           "oracle": oracle, "runs": runs}
    report(res)
    if args.plot:
        plot(res, args.plot)
    harness.write_result("plan_switch_backlog", res, args, before)
    return 0


def report(res: dict) -> None:
    runs = res["runs"]
    print(f"# plan switching on a backlog — {res['date']}, {res['machine']}\n# start: {res['load_start']}\n"
          f"# end:   {res['load_end']}\n# rows per round: {res['rows_per_round'][0]} then {res['rows_per_round'][-1]}")
    print(f"oracle plans: {res['oracle']}")
    summ = {m: [summarize(r) for r in rs] for m, rs in runs.items()}
    med = {m: {k: statistics.median(s[k] for s in ss) for k in ss[0]} for m, ss in summ.items()}
    statics = [m for m in med if m.startswith("static:")]
    best = min(statics, key=lambda m: med[m]["seconds"]) if statics else None
    print(f"best static plan (least batch time): {best}")
    print("| run | passes | batch time, sum (s) | vs best static | rows/s | partial matches | state rows scanned | "
          "state bytes (mean) | time to half / all outputs (s) | switches | policy round (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m, s in med.items():
        ratio = med[best]["seconds"] / s["seconds"] if best else float("nan")
        print(f"| {m} | {len(summ[m])} | {s['seconds']:.2f} | {ratio:.2f}× | {s['rows_per_s']:.0f} | {s['probes']:,.0f} | "
              f"{s['scanned'] / 1e6:,.0f} M | "
              f"{s['state_bytes_mean']:,.0f} | {s['t_half']:.2f} / {s['t_all']:.2f} | {s['switches']:.0f} | "
              f"{s['policy_s_median']:.3f} |")
    outs = {m: s["outputs"] for m, s in med.items()}
    print("batches missing an input's file (split rounds):", {m: s["split_batches"] for m, s in med.items()})
    print("outputs equal in every run:", len(set(outs.values())) == 1, outs if len(set(outs.values())) > 1 else "")
    for m in runs:
        if m in ("om", "om-tree", "rate", "rand"):
            print(f"{m} plans per round (first pass): {[PLANS.index(p) if p in PLANS else p for p in runs[m][0]['ran']]}")
    # per round: the fastest static plan measured vs the one rate predicted, and predicted vs measured rates
    if "rate" in runs and statics:
        r0 = runs["rate"][0]
        secs = {m: per_step(runs[m][0], "seconds") for m in statics}
        fastest = [min(statics, key=lambda m: secs[m][r]).split(":", 1)[1] for r in range(len(r0["ran"]))]
        outs, took = per_step(r0, "output_rows"), per_step(r0, "seconds")
        agree, errs = 0, []
        for r, pred in enumerate(r0["predicted"][:-1]):
            if pred:
                agree += max(pred, key=pred.get) == fastest[r + 1]
                plan = r0["ran"][r + 1]
                if plan in pred and took[r + 1] > 0:
                    errs.append((pred[plan], outs[r + 1] / took[r + 1]))
        n = sum(1 for p in r0["predicted"][:-1] if p)
        print(f"rate: predicted best = fastest measured static plan of the next round in {agree} of {n} rounds")
        if errs:
            rel = [abs(p - m) / m for p, m in errs if m > 0]
            print("rate: predicted vs measured output rate of the plan that ran (rows/s): "
                  + ", ".join(f"{p:.0f}/{m:.0f}" for p, m in errs)
                  + f"; median |error| {100 * statistics.median(rel):.0f} %")


def plot(res: dict, path: str) -> None:
    """Measured outputs by cumulative batch time per run, and rate's predicted curve (its predicted output
    rate of the plan that ran, times the measured batch time, summed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for m, rs in res["runs"].items():
        b = rs[0]["batches"]
        t = np.cumsum([0.0] + [x["seconds"] for x in b])
        o = np.cumsum([0] + [x["output_rows"] for x in b])
        style = "--" if m.startswith("static:") else "-"
        axes[0].plot(t, o, style, label=m if not m.startswith("static:") else f"static {PLANS.index(m[7:])}")
        axes[1].plot(range(1, len(b) + 1), [x["seconds"] for x in b], style + "o", ms=3,
                     label=m if not m.startswith("static:") else f"static {PLANS.index(m[7:])}")
    if "rate" in res["runs"]:
        r0 = res["runs"]["rate"][0]
        pred, acc = [0.0], 0.0
        for r, x in enumerate(r0["batches"]):
            p = r0["predicted"][r - 1] if 0 < r <= len(r0["predicted"]) else {}
            rate = p.get(r0["ran"][r]) if r < len(r0["ran"]) else None
            acc += (rate if rate is not None else x["output_rows"] / x["seconds"]) * x["seconds"]
            pred.append(acc)
        t = np.cumsum([0.0] + [x["seconds"] for x in r0["batches"]])
        axes[0].plot(t, pred, ":", color="k", label="rate: predicted")
    axes[0].set(xlabel="cumulative Spark batch time (s)", ylabel="outputs", title="outputs by catch-up time")
    axes[1].set(xlabel="round (micro-batch)", ylabel="batch time (s)", title="batch time per round")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
