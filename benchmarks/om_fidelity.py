"""OM (Kulkarni & Ravishankar, §5): fidelity of the chart-driven plan choice, and what it buys on Spark.

Two parts, both over generated packet streams (``packets``; the DEC-PKT traces the paper used are not
available here):

``--part figures``: Q1 and Q2's fidelity figures. Algorithm 2 (:func:`pyspark_cq.cost.om.schedule`) runs over
   ``--rounds`` rounds of the generated statistics with the OM cost of our operators (per-row costs measured
   on Spark by ``--part spark``, or the defaults below), against RAND and STATIC (the paper's RATE):
   Fig. 3(a) fidelity per 100 rounds, Fig. 3(b) / 4(a) fidelity vs the coefficient of variation of λ
   (0.09 … 0.26), Fig. 3(c) / 4(b) fidelity vs k (2 … 40 for Q1, 2 … 10 for Q2), with moves and switches.
``--part spark``: Q1 (a ``select_chain``) and Q2 (a 3-way ``multi_join``) run on Spark for ``--spark-rounds``
   micro-batches (one round each) three times over the same files: plans chosen by the ``om`` policy through
   the runtime and the control table, the best static plan (the one of least total OM cost over the run,
   chosen offline), and the per-round oracle (each round's optimal plan for its true statistics, written
   before the batch). Prints rows/s, Spark's batch time, the join's state memory, and OM's fidelity, moves
   and switches measured on Spark; checks the three runs return the same rows.

The generator. DEC-PKT's packet traces (TCP/UDP wide-area traffic) have bursty, heavy-tailed arrival counts
with slow trends, and the share of packets to one host changes as connections come and go. Per round (1 s)
a stream's count is ``base · trend(t) · exp(σ·AR(1)) + Pareto bursts``, rescaled so that its coefficient of
variation is the requested one (the paper filtered DEC-PKT into datasets of CV 0.09 … 0.26 the same way:
§5.1); the share of packets to host 2 is a mean-reverting random walk with occasional jumps (a popular
connection opening or closing), clipped to [0.02, 0.98]. Q2's three streams (TCP, UDP, SF) have their own
rate processes (independent noise and bursts, different bases) and join on the host.

Q1 is "σ dest_host = 2, then π" in the paper (two plans). ``select_chain`` has no projection step, so Q1 runs
as two predicates whose order is the plan: ``dest`` (dest_host = 2, drifting selectivity: the chart's sel
axis) and ``tcp`` (proto = TCP, selectivity ≈ 0.5, held). Q2 is the 3-way equi-join on host; its candidate
plans are the 3 left-deep orders (§5.3), run as probe orders.

Usage::

    python benchmarks/om_fidelity.py --part figures [--rounds 600] [--plots docs/img]
    python benchmarks/om_fidelity.py --part spark [--spark-rounds 24]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from pyspark_cq.cost import om
from pyspark_cq.policies import plan_stats as ps

HOSTS = 50                 # distinct hosts of Q2's join key
WINDOW = 1.0               # W: one round = one second of packets (Q1 and Q2: WINDOW [1])
W_R, W_M = 0.4, 0.6        # §5.1's default weights
#: Seconds per row of Q1's predicates and per joined tuple of Q2 when not measured (order of magnitude of
#: select_chain's nanos_p / rows_in_p on this machine; the kernel's probe step, bench_mjoin)
COSTS = {"dest": 1.5e-7, "tcp": 1.5e-7}
JOIN_COST = 1e-6
TCP_SHARE = 0.45


# ---------------------------------------------------------------------------------------------
# the generator


def rates(rng, rounds: int, base: float, cv: float, phase: float = 0.0) -> np.ndarray:
    """Per-round packet counts with coefficient of variation ``cv``: trend × lognormal AR(1) + Pareto bursts.

    The trend is a slow sine (period 400 rounds) shifted by ``phase``: TCP, UDP and SF traffic peak at
    different times, so which stream is fastest changes over a run.
    """
    t = np.arange(rounds)
    trend = 1.0 + 0.5 * np.sin(2 * np.pi * t / 400.0 + phase)
    ar = np.zeros(rounds)
    for i in range(1, rounds):
        ar[i] = 0.8 * ar[i - 1] + rng.normal()
    bursts = np.where(rng.random(rounds) < 0.03, rng.pareto(2.5, rounds), 0.0)
    raw = trend * np.exp(0.3 * ar / ar.std()) + bursts
    z = (raw - raw.mean()) / raw.std()
    return np.maximum(base * (1 + cv * z), 1.0)


def share(rng, rounds: int, start: float = 0.5) -> np.ndarray:
    """Share of packets to host 2: a mean-reverting walk with occasional jumps, in [0.02, 0.98]."""
    s = np.empty(rounds)
    x, target = start, start
    for i in range(rounds):
        if rng.random() < 0.02:
            target = rng.uniform(0.15, 0.85)
        x += 0.15 * (target - x) + rng.normal(0, 0.04)
        x = min(max(x, 0.02), 0.98)
        s[i] = x
    return s


def q1_observed(seed: int, rounds: int, cv: float, base: float = 500.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"sel": float(s), "rate": float(r) / WINDOW}
            for s, r in zip(share(rng, rounds), rates(rng, rounds, base, cv))]


def q2_observed(seed: int, rounds: int, cv: float, bases=(500.0, 450.0, 400.0)) -> list[dict]:
    rng = np.random.default_rng(seed)
    per = [rates(rng, rounds, b, cv, phase) for b, phase in zip(bases, (0.0, 2.1, 4.2))]
    return [{f"rate:{i}": float(per[i][r]) / WINDOW for i in range(3)} for r in range(rounds)]


# ---------------------------------------------------------------------------------------------
# the OM cost of our operators (the policy's model, plugins/pyspark_cq_plugins/om.py)


def q1_model(costs=COSTS):
    from pyspark_cq_plugins.om import PlanModel

    held = {"sel:tcp": TCP_SHARE, "sel:dest": 0.5, **{f"cost:{p}": c for p, c in costs.items()}}
    return PlanModel(ps.SELECT_CHAIN, tuple(ps.chain_plans(["dest", "tcp"])), ("sel", "rate"), held, WINDOW,
                     W_R, W_M, ("dest", "tcp"), "dest")


def q2_model(join_cost=JOIN_COST, join_model="tree"):
    """Q2's model; the recorded figures used OM's left-deep tree (``"tree"``), the policy now costs our
    multi_join's probe steps (``"mjoin"``, see docs/om.md)."""
    from pyspark_cq_plugins.om import PlanModel

    held = {f"pair:{i},{j}": 1.0 / HOSTS for i in range(3) for j in range(i + 1, 3)}
    held["join_cost"] = join_cost
    return PlanModel(ps.MULTI_JOIN, tuple(ps.left_deep_plans(3)), tuple(f"rate:{i}" for i in range(3)), held,
                     WINDOW, W_R, W_M, (0, 1, 2), join_model=join_model)


def run_all(model, observed, k, d=5, decay=0.5, ranges=None, seed=0):
    """OM (Algorithm 2), RAND and STATIC (RATE: estimate of the first d rounds) over ``observed``."""
    if ranges is None:
        ranges = [(dim, 0.0, 1.0) if dim == "sel" else
                  (dim, 0.5 * min(o[dim] for o in observed[:d]), 2.0 * max(o[dim] for o in observed[:d]))
                  for dim in model.dims]
    chart = om.Chart(ranges, k, list(model.plans), model.cost)
    run_om = om.schedule(chart, observed, model.cost, d=d, decay=decay)
    rng = np.random.default_rng(seed)
    scored = observed[1:]
    rand = om.score_plans([model.plans[i] for i in rng.integers(len(model.plans), size=len(scored))], scored,
                          model.plans, model.cost)
    first = {dim: float(np.mean([o[dim] for o in observed[:d]])) for dim in model.dims}
    static = om.score_plans([model.best(first)] * len(scored), scored, model.plans, model.cost)
    return run_om, rand, static


def figures(args) -> dict:
    out = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg()}
    cvs = [0.09, 0.13, 0.17, 0.21, 0.26]
    for name, model, observe, ks in (("Q1", q1_model(), q1_observed, [2, 5, 10, 20, 30, 40]),
                                     ("Q2", q2_model(), q2_observed, [2, 3, 4, 5, 6, 8, 10])):
        seeds = range(args.seeds)
        # Fig. 3(a): fidelity over time at k = 10, CV 0.17
        om_run, _, _ = run_all(model, observe(1, args.rounds, 0.17), 10)
        out[f"{name}_time"] = {"fidelity_per_100": om_run.fidelity_over(100), "fidelity": om_run.fidelity,
                               "moves": om_run.moves, "switches": om_run.switches, "rounds": om_run.rounds}
        # Fig. 3(b) / 4(a): fidelity vs CV for OM, RAND, STATIC (k = 10), mean over seeds
        table = []
        for cv in cvs:
            runs = [run_all(model, observe(s, args.rounds, cv), 10, seed=s) for s in seeds]
            cv_real = float(np.mean([np.std([o[model.dims[-1]] for o in observe(s, args.rounds, cv)])
                                     / np.mean([o[model.dims[-1]] for o in observe(s, args.rounds, cv)])
                                     for s in seeds]))
            table.append({"cv": cv, "cv_measured": cv_real,
                          **{p: float(np.mean([r[i].fidelity for r in runs])) for i, p in
                             enumerate(("om", "rand", "static"))},
                          "moves": float(np.mean([r[0].moves for r in runs])),
                          "switches": float(np.mean([r[0].switches for r in runs])),
                          "optimal_changes": float(np.mean([sum(a != b for a, b in zip(r[0].optimal, r[0].optimal[1:]))
                                                            for r in runs]))})
        out[f"{name}_cv"] = table
        # Fig. 3(c) / 4(b): fidelity vs k (CV 0.17)
        out[f"{name}_k"] = [{"k": k, "om": float(np.mean([run_all(model, observe(s, args.rounds, 0.17), k)[0].fidelity
                                                          for s in seeds]))} for k in ks]
    return out


def print_figures(res: dict) -> None:
    print(f"# OM fidelity (Algorithm 2 over generated packet streams) — {res['date']}, {res['machine']}, "
          f"load {tuple(round(x, 2) for x in res['load'])}")
    for name in ("Q1", "Q2"):
        t = res[f"{name}_time"]
        print(f"\n{name} Fig. 3(a)-style: fidelity {t['fidelity']:.3f} over {t['rounds']} rounds, "
              f"{t['moves']} moves, {t['switches']} switches; per 100 rounds: "
              + ", ".join(f"{f:.2f}" for f in t["fidelity_per_100"]))
        print(f"{name} fidelity vs CV (k = 10):")
        print("| CV (target) | CV (measured) | OM | RAND | STATIC | OM moves | OM switches | optimum changes |")
        print("|---|---|---|---|---|---|---|---|")
        for row in res[f"{name}_cv"]:
            print(f"| {row['cv']:.2f} | {row['cv_measured']:.3f} | {row['om']:.3f} | {row['rand']:.3f} | "
                  f"{row['static']:.3f} | {row['moves']:.1f} | {row['switches']:.1f} | {row['optimal_changes']:.1f} |")
        print(f"{name} fidelity vs k (CV 0.17): " + ", ".join(f"k={r['k']}: {r['om']:.3f}" for r in res[f"{name}_k"]))


def plot(res: dict, directory: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    for name in ("Q1", "Q2"):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        per = res[f"{name}_time"]["fidelity_per_100"]
        axes[0].plot([100 * (i + 1) for i in range(len(per))], per, marker="o")
        axes[0].set(title=f"{name}: fidelity per 100 rounds", xlabel="round", ylabel="fidelity", ylim=(0, 1.05))
        rows = res[f"{name}_cv"]
        for p in ("om", "rand", "static"):
            axes[1].plot([r["cv_measured"] for r in rows], [r[p] for r in rows], marker="o", label=p.upper())
        axes[1].set(title=f"{name}: fidelity vs CV of λ", xlabel="coefficient of variation", ylim=(0, 1.05))
        axes[1].legend()
        ks = res[f"{name}_k"]
        axes[2].plot([r["k"] for r in ks], [r["om"] for r in ks], marker="o")
        axes[2].set(title=f"{name}: fidelity vs k", xlabel="k (partitions per dimension)", ylim=(0, 1.05))
        fig.tight_layout()
        fig.savefig(os.path.join(directory, f"om_{name.lower()}_fidelity.png"), dpi=90)
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# on Spark


def _packets(rng, n: int, dest_share: float, hosts: int = HOSTS):
    import pyarrow as pa

    dest = np.where(rng.random(n) < dest_share, 2, rng.integers(3, hosts + 3, n))
    proto = np.where(rng.random(n) < TCP_SHARE, 6, 17)
    return pa.table({"src_host": pa.array(rng.integers(0, hosts, n), pa.int64()),
                     "dest_host": pa.array(dest, pa.int64()), "proto": pa.array(proto, pa.int64()),
                     "size": pa.array(rng.integers(40, 1500, n), pa.int64())})


def _join_input(rng, i: int, n: int, step: int):
    import pyarrow as pa

    base = 1_700_000_000_000_000 + step * 1_000_000
    return pa.table({f"h{i}": pa.array(rng.integers(0, HOSTS, n), pa.int64()),
                     f"t{i}": pa.array(base + rng.integers(0, 1_000_000, n), pa.int64()).cast(
                         pa.timestamp("us", tz="UTC")),
                     f"v{i}": pa.array(rng.integers(0, 2**40, n), pa.int64())})


def _write(directory: str, step: int, table) -> None:
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".b{step:04d}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(directory, f"b{step:04d}.parquet"))


def spark_part(args) -> dict:
    import pyarrow.compute as pc
    from pyspark_cq_plugins.om import OMPolicy

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    # no no-data batches: a round's statistics are then always its batch's report (see docs/om.md)
    spark = cq.spark("local[2]", "om-fidelity", shuffle_partitions=2,
                     conf={"spark.sql.streaming.metricsEnabled": "false", "spark.ui.enabled": "false",
                           "spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    root = tempfile.mkdtemp(prefix="om-bench-")
    rounds = args.spark_rounds
    rng = np.random.default_rng(5)
    q1 = q1_observed(11, rounds, 0.17, base=args.q1_rows)
    q2 = q2_observed(12, rounds, 0.17, bases=(args.q2_rows, 0.8 * args.q2_rows, 0.6 * args.q2_rows))
    # the files, written once per step (all runs read the same data)
    files = os.path.join(root, "data")
    for step in range(rounds):
        _write(os.path.join(files, "q1"), step, _packets(rng, int(q1[step]["rate"]), q1[step]["sel"]))
        for i in range(3):
            _write(os.path.join(files, f"q2_{i}"), step, _join_input(rng, i, int(q2[step][f"rate:{i}"]), step))
    m1, m2 = q1_model(), q2_model()
    best_static = {"Q1": min(m1.plans, key=lambda p: sum(m1.cost(p, o) for o in q1)),
                   "Q2": min(m2.plans, key=lambda p: sum(m2.cost(p, o) for o in q2))}
    oracle = {"Q1": [m1.best(o) for o in q1], "Q2": [m2.best(o) for o in q2]}
    results = {}
    for mode in ("om", "static", "oracle"):
        run_dir = os.path.join(root, mode)
        policy = OMPolicy(k=args.k, d=5, window=WINDOW, w_r=W_R, w_m=W_M, join_cost=JOIN_COST,
                          ranges={"q1f": {"sel": (0.0, 1.0), "rate": (0.5 * args.q1_rows, 2.0 * args.q1_rows)},
                                  "q2j": {f"rate:{i}": (0.25 * args.q2_rows, 2.0 * args.q2_rows) for i in range(3)}},
                          chart_predicate={"q1f": "dest"})
        rt = CQRuntime(spark, policies=[policy] if mode == "om" else [], control_path=os.path.join(run_dir, "ct.json"),
                       every_batches=10**9)
        live = [os.path.join(run_dir, "q1")] + [os.path.join(run_dir, f"q2_{i}") for i in range(3)]
        for d in live:
            os.makedirs(d)
        start = {"Q1": best_static["Q1"] if mode == "static" else oracle["Q1"][0] if mode == "oracle" else "tcp>dest",
                 "Q2": best_static["Q2"] if mode == "static" else oracle["Q2"][0] if mode == "oracle"
                 else ps.left_deep_plans(3)[0]}

        def build_q1(ctx, start=start, live=live, run_dir=run_dir):
            h = ctx.control("q1f", plan_id=start["Q1"])
            df = ctx.spark.readStream.schema("src_host long, dest_host long, proto long, size long") \
                .option("maxFilesPerTrigger", 1).parquet(live[0])
            out = cq.select_chain(df, {"dest": lambda b: pc.equal(b["dest_host"], 2),
                                       "tcp": lambda b: pc.equal(b["proto"], 6)}, control=h) \
                .select("src_host", "dest_host")                       # Q1's projection
            return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck1"))

        def build_q2(ctx, start=start, live=live, run_dir=run_dir):
            h = ctx.control("q2j", plan_id=start["Q2"])
            dfs = [ctx.spark.readStream.schema(f"h{i} long, t{i} timestamp, v{i} long")
                   .option("maxFilesPerTrigger", 1).parquet(live[1 + i]).withWatermark(f"t{i}", "2 seconds")
                   for i in range(3)]
            out = cq.multi_join(dfs, ["h0", "h1", "h2"], ["t0", "t1", "t2"],
                                [(0, 1, "-1 second", "1 second"), (1, 2, "-1 second", "1 second")], control=h)
            return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck2"))

        rt.register("Q1", build_q1)
        rt.register("Q2", build_q2)
        reports = {"Q1": [], "Q2": []}
        with rt:
            for step in range(rounds):
                if mode == "oracle":
                    rt.control_table().set("q1f", plan_id=oracle["Q1"][step], reason="oracle")
                    rt.control_table().set("q2j", plan_id=oracle["Q2"][step], reason="oracle")
                shutil.copy2(os.path.join(files, "q1", f"b{step:04d}.parquet"), live[0])
                for i in range(3):   # hidden copies, then renames: narrows the window in which a batch
                    shutil.copy2(os.path.join(files, f"q2_{i}", f"b{step:04d}.parquet"),   # sees one input's file only:
                                 os.path.join(live[1 + i], f".b{step:04d}.parquet"))       # it skews the rounds
                for i in range(3):
                    os.replace(os.path.join(live[1 + i], f".b{step:04d}.parquet"),
                               os.path.join(live[1 + i], f"b{step:04d}.parquet"))
                for name, op in (("Q1", "q1f"), ("Q2", "q2j")):
                    q = rt.query(name)
                    q.processAllAvailable()
                    want = cq.read_metrics([p for p in q.recentProgress if p["numInputRows"] > 0][-1], op)
                    deadline = time.monotonic() + 60
                    while dict(rt.statistics().queries[name].operators[op].report) != want \
                            and time.monotonic() < deadline:
                        time.sleep(0.02)
                if mode == "om":
                    rt.run_policies()
            for name, op in (("Q1", "q1f"), ("Q2", "q2j")):
                for p in rt.query(name).recentProgress:
                    r = cq.read_metrics(p, op)
                    if r and r["input_rows"]:
                        reports[name].append((p["batchDuration"] / 1000.0, r))
        res = {}
        for name in ("Q1", "Q2"):
            rows = sum(r["input_rows"] for _, r in reports[name])
            secs = sum(d for d, _ in reports[name])
            res[name] = {"batches": len(reports[name]), "rows": rows, "seconds": secs, "rows_per_s": rows / secs,
                         "median_batch_s": statistics.median(d for d, _ in reports[name]),
                         "output_rows": sum(r["output_rows"] for _, r in reports[name])}
            if name == "Q2":
                res[name]["state_bytes_mean"] = statistics.mean(r["state_bytes"] for _, r in reports[name])
                res[name]["state_rows_mean"] = statistics.mean(r["state_rows"] for _, r in reports[name])
                res[name]["probe_steps"] = sum(v for _, r in reports[name] for k, v in r.items()
                                               if k.startswith("probed_"))
            if name == "Q1":
                res[name]["predicate_rows"] = sum(v for _, r in reports[name] for k, v in r.items()
                                                  if k.startswith("rows_in_"))
                nanos = {p: sum(r[f"nanos_{p}"] for _, r in reports[name]) /
                         max(sum(r[f"rows_in_{p}"] for _, r in reports[name]), 1) / 1e9 for p in ("dest", "tcp")}
                res[name]["cost_per_row"] = nanos
        if mode == "om":
            res["status"] = policy.status()
        results[mode] = res
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    out = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg(), "rounds": rounds, "best_static": best_static, "results": results,
           "oracle_switches": {n: sum(a != b for a, b in zip(oracle[n], oracle[n][1:])) for n in oracle}}
    for name in ("Q1", "Q2"):
        outs = {m: results[m][name]["output_rows"] for m in results}
        assert len(set(outs.values())) == 1, f"{name}: the runs' outputs differ: {outs}"
    return out


def print_spark(res: dict) -> None:
    print(f"# OM on Spark — {res['date']}, {res['machine']}, load {tuple(round(x, 2) for x in res['load'])}, "
          f"{res['rounds']} rounds")
    print(f"best static plans: {res['best_static']}; the oracle switches {res['oracle_switches']}")
    print("| query | run | rows/s | Spark batch time (s, sum) | median batch (s) | work | state bytes (mean) |")
    print("|---|---|---|---|---|---|---|")
    for name in ("Q1", "Q2"):
        base = res["results"]["static"][name]["rows_per_s"]
        for mode in ("om", "static", "oracle"):
            r = res["results"][mode][name]
            work = r.get("predicate_rows", r.get("probe_steps"))
            print(f"| {name} | {mode} | {r['rows_per_s']:.0f} ({r['rows_per_s'] / base:.2f}×) | {r['seconds']:.2f} | "
                  f"{r['median_batch_s']:.3f} | {work} | {r.get('state_bytes_mean', float('nan')):.0f} |")
    print("OM on Spark (policy.status()):", json.dumps(res["results"]["om"]["status"], default=str))
    print("measured cost per row (Q1, static run):", res["results"]["static"]["Q1"]["cost_per_row"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("figures", "spark"), required=True)
    ap.add_argument("--rounds", type=int, default=600, help="rounds per run of the figures (the paper: 600 s)")
    ap.add_argument("--seeds", type=int, default=5, help="runs per point of the figures")
    ap.add_argument("--plots", default=None, help="directory for PNG plots of the figures")
    ap.add_argument("--spark-rounds", type=int, default=24)
    ap.add_argument("--q1-rows", type=float, default=20000.0, help="Q1's mean packets per round on Spark")
    ap.add_argument("--q2-rows", type=float, default=2000.0, help="Q2's mean rows per round of its first input")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.part == "figures":
        res = figures(args)
        print_figures(res)
        if args.plots:
            plot(res, args.plots)
    else:
        res = spark_part(args)
        print_spark(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
