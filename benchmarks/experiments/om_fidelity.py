"""OM (Kulkarni & Ravishankar, §5): fidelity of the chart-driven plan choice, and what it buys on Spark.

Two parts, both over generated packet streams (``packets``; the DEC-PKT traces the paper used are not
available here):

``--part figures``: Q1 and Q2's fidelity figures. Algorithm 2 (:func:`pyspark_cq.cost.om.schedule`) runs over
   ``--rounds`` rounds of the generated statistics with the OM cost of our operators (per-row costs measured
   on Spark by ``--part spark``, or the defaults below), against RAND and STATIC (the paper's RATE):
   Fig. 3(a) fidelity per 100 rounds, Fig. 3(b) / 4(a) fidelity vs the coefficient of variation of λ
   (0.09 … 0.26), Fig. 3(c) / 4(b) fidelity vs k (2 … 40 for Q1, 2 … 10 for Q2), with moves and switches.
   Q2 is costed with the policy's default model (``--q2-model mjoin``: our multi_join's probe steps,
   :func:`pyspark_cq.cost.om.mjoin_plan_cost`, ``join_cost`` = :data:`PROBE_COST` s per state row), or
   with OM's left-deep tree (``--q2-model tree``, for comparison; its plot is ``om_q2_fidelity_tree.png``).
``--part spark``: Q1 (a ``select_chain``) and Q2 (a 3-way ``multi_join``) run on Spark for ``--spark-rounds``
   micro-batches (one round each) over the same files, after a discarded warm-up run (the first run of a
   session pays the JVM's and the Python workers' start): each static plan; ``om`` (the policy as shipped:
   ``join_model="mjoin"``, its per-row costs measured by the operators) through the runtime and the control
   table; and the per-round oracle, which writes before each step the plan whose static run did the least
   plan-dependent work in that step (predicate rows tested for Q1, state rows scanned by the probes for Q2:
   what no policy can know). ``--repeat`` passes, the order of the runs rotated; medians. Prints rows/s,
   Spark's batch time, the join's state memory, the best static plan (least batch time, measured), and OM's
   fidelity, moves and switches measured on Spark (``policy.status()``: against OM's model at each round's
   observed statistics; and how often OM ran the oracle's plan); checks every run returns the same rows.
   ``--plots DIR`` writes ``om_spark.png`` (batch time per step, and OM's plan vs the oracle's).
``--part spark-sweep``: the figures' points measured on Spark. Q1 and Q2 run as in ``--part spark`` (one
   session, one warm-up) under ``om``, ``rand`` (RAND) and ``static`` (RATE: the best plan at the first 5
   rounds' estimate) at each CV of ``--cvs`` (k = 10), and under ``om`` at each k of ``--ks`` (CV 0.17), the
   inputs regenerated per CV; each policy's fidelity, moves and switches are its ``status()`` (the plan that
   ran scored against OM's model at each round's observed statistics, as ``--part spark`` measures OM).
   ``--json`` is rewritten after every point; ``--from-json a.json[,b.json]`` reports saved sweeps, and with
   ``--figures-json F --plots DIR`` redraws the figures of F with the Spark points added.

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

    python -m benchmarks.experiments.om_fidelity --part figures [--rounds 600] [--seeds 5] [--q2-model mjoin|tree] [--plots docs/img]
    sparkslot --all python -m benchmarks.experiments.om_fidelity --part spark [--spark-rounds 24] [--repeat 2] [--plots docs/img]
    sparkslot --all python -m benchmarks.experiments.om_fidelity --part spark-sweep [--cvs 0.17,0.09,0.26] [--ks 2,5,10] \
        [--spark-rounds 24] [--q2-rows 600] [--json sweep.json]
    python -m benchmarks.experiments.om_fidelity --part spark-sweep --from-json sweep.json \
        --figures-json benchmarks/results/om_fidelity_figures.json --plots docs/img
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

from .. import harness
from ..common import _write

HOSTS = 50                 # distinct hosts of Q2's join key
WINDOW = 1.0               # W: one round = one second of packets (Q1 and Q2: WINDOW [1])
W_R, W_M = 0.4, 0.6        # §5.1's default weights
#: Seconds per row of Q1's predicates and per joined tuple of Q2 when not measured (order of magnitude of
#: select_chain's nanos_p / rows_in_p on this machine; the kernel's probe step, bench_mjoin)
COSTS = {"dest": 1.5e-7, "tcp": 1.5e-7}
JOIN_COST = 1e-6
#: OM's seconds per state row a probe step scans (the "mjoin" model's ``join_cost``, measured on Spark;
#: plan_switch_backlog's): Q2's figures and the Spark part
PROBE_COST = 1e-9
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


def q2_model(join_cost=None, join_model="mjoin"):
    """Q2's model; by default the policy's (``"mjoin"``: our multi_join's probe steps, see docs/om.md), or OM's
    left-deep tree (``"tree"``). ``join_cost`` defaults to :data:`PROBE_COST` (seconds per state row a probe
    scans) for ``"mjoin"`` and :data:`JOIN_COST` (seconds per joined tuple) for ``"tree"``."""
    from pyspark_cq_plugins.om import PlanModel

    held = {f"pair:{i},{j}": 1.0 / HOSTS for i in range(3) for j in range(i + 1, 3)}
    held["join_cost"] = join_cost if join_cost is not None else PROBE_COST if join_model == "mjoin" else JOIN_COST
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
    q2 = q2_model(join_cost=args.q2_join_cost, join_model=args.q2_model)
    out = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg(), "rounds": args.rounds, "seeds": args.seeds,
           "q2_join_model": q2.join_model, "q2_join_cost": q2.held["join_cost"]}
    cvs = [0.09, 0.13, 0.17, 0.21, 0.26]
    for name, model, observe, ks in (("Q1", q1_model(), q1_observed, [2, 5, 10, 20, 30, 40]),
                                     ("Q2", q2, q2_observed, [2, 3, 4, 5, 6, 8, 10])):
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
        # Fig. 3(c) / 4(b): fidelity vs k (CV 0.17; RAND and STATIC do not depend on k: the CV 0.17 row)
        out[f"{name}_k"] = []
        for k in ks:
            runs = [run_all(model, observe(s, args.rounds, 0.17), k)[0] for s in seeds]
            out[f"{name}_k"].append({"k": k, "om": float(np.mean([r.fidelity for r in runs])),
                                     "moves": float(np.mean([r.moves for r in runs])),
                                     "switches": float(np.mean([r.switches for r in runs]))})
    return out


def print_figures(res: dict) -> None:
    print(f"# OM fidelity (Algorithm 2 over generated packet streams) — {res['date']}, {res['machine']}, "
          f"load {tuple(round(x, 2) for x in res['load'])}; {res.get('rounds')} rounds, {res.get('seeds')} seeds; "
          f"Q2's join model {res.get('q2_join_model', 'tree')!r}, join_cost {res.get('q2_join_cost')}")
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
        print(f"{name} fidelity vs k (CV 0.17): " + ", ".join(
            f"k={r['k']}: {r['om']:.3f} ({r.get('moves', float('nan')):.0f} moves, "
            f"{r.get('switches', float('nan')):.0f} switches)" for r in res[f"{name}_k"]))


def plot(res: dict, directory: str, sweep: dict | None = None) -> None:
    """The figures; with ``sweep`` (a ``--part spark-sweep`` result) its Spark-measured points added to the
    fidelity-vs-CV and fidelity-vs-k panels (hollow markers, at the CV measured over the Spark rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    for name in ("Q1", "Q2"):
        model = f" ({res.get('q2_join_model', 'tree')} model)" if name == "Q2" else ""
        fig, axes = plt.subplots(1, 3, figsize=(13, 4.3 if sweep else 3.4))
        per = res[f"{name}_time"]["fidelity_per_100"]
        axes[0].plot([100 * (i + 1) for i in range(len(per))], per, marker="o")
        axes[0].set(title=f"{name}{model}: fidelity per 100 rounds", xlabel="round", ylabel="fidelity", ylim=(0, 1.05))
        rows = res[f"{name}_cv"]
        pts = [p for p in (sweep or {}).get("points", []) if p["query"] == name]
        for p, marker in (("om", "s"), ("rand", "^"), ("static", "D")):
            line, = axes[1].plot([r["cv_measured"] for r in rows], [r[p] for r in rows], marker="o",
                                 label=f"{p.upper()} (Algorithm 2)" if pts else p.upper())
            mine = [q for q in pts if q["policy"] == p and q["k"] == 10]
            if mine:
                axes[1].plot([q["cv_measured"] for q in mine], [q["fidelity"] for q in mine], marker, ls="none",
                             mfc="none", mew=1.5, ms=8, color=line.get_color(), label=f"{p.upper()} on Spark")
        axes[1].set(title=f"{name}: fidelity vs CV of λ", xlabel="coefficient of variation", ylim=(0, 1.05))
        if pts:         # below the panel: the Spark points fill the upper and the lower corners
            axes[1].legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
        else:
            axes[1].legend()
        ks = res[f"{name}_k"]
        axes[2].plot([r["k"] for r in ks], [r["om"] for r in ks], marker="o", label="OM (Algorithm 2)")
        mine = [q for q in pts if q["policy"] == "om" and abs(q["cv"] - 0.17) < 1e-9]
        if mine:
            axes[2].plot([q["k"] for q in mine], [q["fidelity"] for q in mine], "s", mfc="none", mew=1.5, ms=8,
                         color="C0", label="OM on Spark (CV 0.17)")
            axes[2].legend(fontsize=7, loc="lower right")
        axes[2].set(title=f"{name}: fidelity vs k", xlabel="k (partitions per dimension)", ylim=(0, 1.05))
        fig.tight_layout()
        tail = "_tree" if name == "Q2" and res.get("q2_join_model") == "tree" else ""   # the comparison
        fig.savefig(os.path.join(directory, f"om_{name.lower()}_fidelity{tail}.png"), dpi=90)
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


Q1_PLANS = ("dest>tcp", "tcp>dest")
Q2_PLANS = tuple(ps.left_deep_plans(3))
OPS = {"Q1": "q1f", "Q2": "q2j"}


def _spark_inputs(args, root: str, cv: float = 0.17) -> dict:
    """The Spark part's files, one per step and input (every run reads the same data); returns the statistics."""
    rng = np.random.default_rng(5)
    q1 = q1_observed(11, args.spark_rounds, cv, base=args.q1_rows)
    q2 = q2_observed(12, args.spark_rounds, cv, bases=(args.q2_rows, 0.8 * args.q2_rows, 0.6 * args.q2_rows))
    for step in range(args.spark_rounds):
        _write(os.path.join(root, "q1"), step, _packets(rng, int(q1[step]["rate"]), q1[step]["sel"]))
        for i in range(3):
            _write(os.path.join(root, f"q2_{i}"), step, _join_input(rng, i, int(q2[step][f"rate:{i}"]), step))
    return {"Q1": q1, "Q2": q2}


def _work(name: str, r: dict) -> float:
    """The plan-dependent work of one batch: predicate rows tested (Q1); state rows the partial matches scanned
    (Q2: the kernel walks the probed state's key chain for each, ``probed_i_j · state_rows_j``)."""
    if name == "Q1":
        return sum(v for k, v in r.items() if k.startswith("rows_in_"))
    return sum(v * r.get(f"state_rows_{k.rsplit('_', 1)[1]}", 0) for k, v in r.items() if k.startswith("probed_"))


def _policy(mode: str, args, k: int):
    """The plan policy of an adaptive run (None for ``static:<i>`` and ``oracle``): ``om`` as shipped
    (``join_model="mjoin"``), or the baselines ``rand`` (RAND) and ``static`` (RATE: the best plan at
    the estimate of the first 5 rounds, the figures' d). All score their rounds the same way (``status()``)."""
    from pyspark_cq_plugins.om import OMPolicy
    from pyspark_cq_plugins.plan_baselines import RandPolicy, StaticPolicy

    common = {"d": 5, "window": WINDOW, "w_r": W_R, "w_m": W_M, "join_cost": PROBE_COST}
    if mode == "om":
        return OMPolicy(k=k, **common, chart_predicate={"q1f": "dest"},
                        ranges={"q1f": {"sel": (0.0, 1.0), "rate": (0.5 * args.q1_rows, 2.0 * args.q1_rows)},
                                "q2j": {f"rate:{i}": (0.25 * args.q2_rows, 2.0 * args.q2_rows) for i in range(3)}})
    if mode == "rand":
        return RandPolicy(seed=0, **common)
    if mode == "static":                       # not "static:<i>": a fixed plan, no policy
        return StaticPolicy(warmup=5, **common)
    return None


def spark_run(spark, args, data: str, mode: str, rounds: int, oracle: dict | None = None,
              k: int | None = None) -> dict:
    """One run of Q1 and Q2 over ``rounds`` steps: ``om``, ``rand``, ``static`` (:func:`_policy`; OM's
    ``k``, default ``args.k``), ``static:<i>`` (plan i of each query; Q1 has two) or ``oracle``
    (``oracle[query][step]`` written before each step). Steps run one query at a time (Q1's file and batch,
    then Q2's), so the two queries do not share the cores."""
    import pyarrow.compute as pc

    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    run_dir = tempfile.mkdtemp(prefix=f"run-{mode.replace(':', '')}-", dir=os.path.dirname(data))
    names = ["Q1", "Q2"]
    if mode.startswith("static:"):
        i = int(mode.split(":")[1])
        start = {"Q1": Q1_PLANS[i] if i < len(Q1_PLANS) else None, "Q2": Q2_PLANS[i]}
        names = [n for n in names if start[n] is not None]
    elif mode == "oracle":
        start = {n: oracle[n][0] for n in names}
    else:                                        # the adaptive run starts in the plans of the old run
        start = {"Q1": "tcp>dest", "Q2": Q2_PLANS[0]}
    policy = _policy(mode, args, args.k if k is None else k)
    rt = CQRuntime(spark, policies=[policy] if policy else [], control_path=os.path.join(run_dir, "ct.json"),
                   every_batches=10**9)
    live = {"Q1": [os.path.join(run_dir, "q1")], "Q2": [os.path.join(run_dir, f"q2_{i}") for i in range(3)]}
    src = {"Q1": ["q1"], "Q2": [f"q2_{i}" for i in range(3)]}
    for d in live["Q1"] + live["Q2"]:
        os.makedirs(d)

    def build_q1(ctx):
        h = ctx.control("q1f", plan_id=start["Q1"])
        df = ctx.spark.readStream.schema("src_host long, dest_host long, proto long, size long") \
            .option("maxFilesPerTrigger", 1).parquet(live["Q1"][0])
        out = cq.select_chain(df, {"dest": lambda b: pc.equal(b["dest_host"], 2),
                                   "tcp": lambda b: pc.equal(b["proto"], 6)}, control=h) \
            .select("src_host", "dest_host")                       # Q1's projection
        return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck1"))

    def build_q2(ctx):
        h = ctx.control("q2j", plan_id=start["Q2"])
        dfs = [ctx.spark.readStream.schema(f"h{i} long, t{i} timestamp, v{i} long")
               .option("maxFilesPerTrigger", 1).parquet(live["Q2"][i]).withWatermark(f"t{i}", "2 seconds")
               for i in range(3)]
        out = cq.multi_join(dfs, ["h0", "h1", "h2"], ["t0", "t1", "t2"],
                            [(0, 1, "-1 second", "1 second"), (1, 2, "-1 second", "1 second")], control=h)
        return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck2"))

    for n in names:
        rt.register(n, {"Q1": build_q1, "Q2": build_q2}[n])
    ran = {n: [] for n in names}
    step_end = {n: [] for n in names}
    policy_s = []
    with rt:
        for step in range(rounds):
            for n in names:
                if mode == "oracle":
                    rt.control_table().set(OPS[n], plan_id=oracle[n][step], reason="oracle")
                ran[n].append(rt.control_table().entry(OPS[n]).params.get("plan_id"))
                for s, d in zip(src[n], live[n]):   # hidden copies, then renames: one batch sees all the files
                    shutil.copy2(os.path.join(data, s, f"b{step:04d}.parquet"), os.path.join(d, f".b{step:04d}.parquet"))
                for d in live[n]:
                    os.replace(os.path.join(d, f".b{step:04d}.parquet"), os.path.join(d, f"b{step:04d}.parquet"))
                q = rt.query(n)
                q.processAllAvailable()
                step_end[n].append(q.lastProgress["batchId"])     # a step's files can land in two batches
                want = cq.read_metrics([p for p in q.recentProgress if p["numInputRows"] > 0][-1], OPS[n])
                deadline = time.monotonic() + 60
                while dict(rt.statistics().queries[n].operators[OPS[n]].report) != want \
                        and time.monotonic() < deadline:
                    time.sleep(0.02)
            if policy is not None:
                t0 = time.perf_counter()
                rt.run_policies()
                policy_s.append(time.perf_counter() - t0)
        batches = {}
        for n in names:
            batches[n] = []
            for p in rt.query(n).recentProgress:
                r = cq.read_metrics(p, OPS[n])
                if r and r["input_rows"]:
                    batches[n].append({"batch": p["batchId"], "seconds": p["batchDuration"] / 1000.0,
                                       "input_rows": r["input_rows"], "output_rows": r["output_rows"],
                                       "work": _work(n, r), "state_bytes": r.get("state_bytes", 0),
                                       "nanos": {k[6:]: (v, r.get("rows_in_" + k[6:], 0)) for k, v in r.items()
                                                 if k.startswith("nanos_")}})
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"mode": mode, "ran": ran, "step_end": step_end, "batches": batches, "policy_s": policy_s,
            "status": policy.status() if policy is not None else None}


def per_step(run: dict, name: str, what: str) -> list[float]:
    """``what`` summed over the batches of each step of query ``name``."""
    out, prev = [], -1
    for end in run["step_end"][name]:
        out.append(sum(b[what] for b in run["batches"][name] if prev < b["batch"] <= end))
        prev = end
    return out


def summarize(run: dict, name: str) -> dict:
    b = run["batches"][name]
    secs = [x["seconds"] for x in b]
    out = {"batches": len(b), "rows": sum(x["input_rows"] for x in b), "seconds": sum(secs),
           "rows_per_s": sum(x["input_rows"] for x in b) / sum(secs), "median_batch_s": statistics.median(secs),
           "output_rows": sum(x["output_rows"] for x in b), "work": sum(x["work"] for x in b),
           "state_bytes_mean": statistics.mean(x["state_bytes"] for x in b),
           "switches": sum(a != c for a, c in zip(run["ran"][name], run["ran"][name][1:]))}
    if run["policy_s"]:
        out["policy_s_median"] = statistics.median(run["policy_s"])
    return out


def spark_part(args) -> dict:
    import subprocess

    import pyspark_cq as cq

    load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    # no no-data batches: a round's statistics are then always its batch's report (see docs/om.md)
    spark = cq.spark("local[2]", "om-fidelity", shuffle_partitions=2,
                     conf={"spark.sql.streaming.metricsEnabled": "false", "spark.ui.enabled": "false",
                           "spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    root = tempfile.mkdtemp(prefix="om-bench-")
    data = os.path.join(root, "data")
    observed = _spark_inputs(args, data)
    # a warm-up run (discarded): the first run of a session pays the JVM's and the Python workers' start
    spark_run(spark, args, data, "static:0", min(3, args.spark_rounds))
    statics = [f"static:{i}" for i in range(len(Q2_PLANS))]
    runs: dict[str, list[dict]] = {}
    oracle = None
    for rep in range(args.repeat):
        order = statics + (["oracle"] if rep > 0 else []) + ["om"]
        order = order[rep % len(order):] + order[:rep % len(order)]
        for mode in order:
            runs.setdefault(mode, []).append(spark_run(spark, args, data, mode, args.spark_rounds, oracle))
            print(f"  pass {rep + 1} {mode}: " + "; ".join(f"{n} {summarize(runs[mode][-1], n)}"
                                                          for n in runs[mode][-1]["ran"]), flush=True)
        if oracle is None:
            # the per-round oracle: each step, the plan whose static run (first pass) did the least work in it
            oracle = {}
            for n, plans in (("Q1", Q1_PLANS), ("Q2", Q2_PLANS)):
                work = {p: per_step(runs[f"static:{i}"][0], n, "work") for i, p in enumerate(plans)}
                oracle[n] = [min(plans, key=lambda p: work[p][r]) for r in range(args.spark_rounds)]
            runs.setdefault("oracle", []).append(spark_run(spark, args, data, "oracle", args.spark_rounds, oracle))
            print(f"  pass {rep + 1} oracle: " + "; ".join(f"{n} {summarize(runs['oracle'][-1], n)}"
                                                          for n in ("Q1", "Q2")), flush=True)
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    load1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    res = {"machine": platform.node(), "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load0, "load_end": load1,
           "args": vars(args), "observed": observed, "oracle": oracle, "runs": runs}
    for n in ("Q1", "Q2"):
        outs = {m: summarize(r, n)["output_rows"] for m, rs in runs.items() for r in rs if n in r["ran"]}
        assert len(set(outs.values())) == 1, f"{n}: the runs' outputs differ: {outs}"
    return res


def _cv_of(observed: list[dict], dim: str) -> float:
    v = [o[dim] for o in observed]
    return float(np.std(v) / np.mean(v))


def spark_sweep(args) -> dict:
    """Fidelity, moves and switches measured on Spark (``policy.status()``) of ``om``, ``rand`` and ``static``
    at each CV of ``--cvs`` (k = 10), and of ``om`` at each k of ``--ks`` (CV 0.17): one session, one warm-up;
    per CV the inputs regenerated (the same seeds as ``--part spark``). Points run in the order given, the JSON
    rewritten after each, so a cut-off sweep keeps the points it ran."""
    import subprocess

    import pyspark_cq as cq

    cvs = [float(c) for c in args.cvs.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    plan = [(cv, p, 10) for cv in cvs for p in ("om", "rand", "static")]
    plan += [(0.17, "om", k) for k in ks if k != 10 or 0.17 not in cvs]
    plan.sort(key=lambda x: x[0] != 0.17)        # CV 0.17 first (its data serves the k points), then as given
    load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    spark = cq.spark("local[2]", "om-fidelity-sweep", shuffle_partitions=2,
                     conf={"spark.sql.streaming.metricsEnabled": "false", "spark.ui.enabled": "false",
                           "spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    root = tempfile.mkdtemp(prefix="om-sweep-")
    res = {"machine": platform.node(), "cores": os.cpu_count(), "load_start": load0, "args": vars(args),
           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "points": [], "outputs": {}}
    data, warm = None, False
    for cv, pol, k in plan:
        if data is None or data[0] != cv:
            if data is not None:
                shutil.rmtree(data[1], ignore_errors=True)
            data = (cv, os.path.join(root, f"cv{cv}"))
            observed = _spark_inputs(args, data[1], cv)
        if not warm:            # the first run of a session pays the JVM's and the Python workers' start
            spark_run(spark, args, data[1], "static:0", min(3, args.spark_rounds))
            warm = True
        t0 = time.perf_counter()
        run = spark_run(spark, args, data[1], pol, args.spark_rounds, k=k)
        wall = time.perf_counter() - t0
        for n, dim in (("Q1", "rate"), ("Q2", "rate:2")):
            st = run["status"][f"{n}/{OPS[n]}"]
            out_rows = summarize(run, n)["output_rows"]
            prev = res["outputs"].setdefault(f"{n}@{cv}", out_rows)
            assert prev == out_rows, f"{n} at CV {cv}: the runs' outputs differ ({prev} vs {out_rows})"
            res["points"].append({"query": n, "cv": cv, "cv_measured": _cv_of(observed[n], dim), "policy": pol,
                                  "k": k, **{f: st[f] for f in ("fidelity", "rounds", "hits", "moves", "switches",
                                                                "rebuilds")},
                                  "ran": run["ran"][n], "wall_s": wall})
        print(f"  CV {cv} {pol} k={k} ({wall:.0f} s): " + "; ".join(
            f"{q['query']} fidelity {q['fidelity']:.3f} ({q['hits']}/{q['rounds']}), moves {q['moves']}, "
            f"switches {q['switches']}" for q in res["points"][-2:]), flush=True)
        res["load_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        res["date"] = f"{res['started']} – {time.strftime('%H:%M UTC', time.gmtime())}"
        harness.write_result(f"om_fidelity_{args.part}", res, args)
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    return res


#: Q1's seconds per row measured on Spark by ``--part spark`` (2026-11-26, static:0, pass 1)
SPARK_Q1_COSTS = {"dest": 9.4e-8, "tcp": 4.8e-8}


def same_rounds(args, cv: float, k: int) -> dict:
    """Algorithm 2, RAND and STATIC (:func:`run_all`) over the generated statistics of a sweep's Spark rounds (the
    same seeds, rounds and OM ranges; no Spark): what the figures' method gives on the stretch Spark ran. Q1 with
    the figures' per-row costs and with those measured on Spark; Q2 with the figures' held pair selectivities."""
    q1 = q1_observed(11, args.spark_rounds, cv, base=args.q1_rows)
    q2 = q2_observed(12, args.spark_rounds, cv, bases=(args.q2_rows, 0.8 * args.q2_rows, 0.6 * args.q2_rows))
    q1_ranges = [("sel", 0.0, 1.0), ("rate", 0.5 * args.q1_rows, 2.0 * args.q1_rows)]
    out = {}
    for label, model, obs, ranges in (("Q1", q1_model(), q1, q1_ranges),
                                      ("Q1 (Spark costs)", q1_model(SPARK_Q1_COSTS), q1, q1_ranges),
                                      ("Q2", q2_model(join_cost=PROBE_COST), q2,
                                       [(f"rate:{i}", 0.25 * args.q2_rows, 2.0 * args.q2_rows) for i in range(3)])):
        runs = run_all(model, obs, k, ranges=ranges)
        out[label] = {p: (r.fidelity, r.moves, r.switches) for p, r in zip(("om", "rand", "static"), runs)}
    return out


def print_sweep(res: dict) -> None:
    a = res["args"]
    print(f"# OM, RAND, STATIC on Spark: fidelity measured by the policies (status()) — {res['date']}, "
          f"{res['machine']} ({res['cores']} cores); {a['spark_rounds']} rounds, Q1 {a['q1_rows']:.0f} and Q2 "
          f"{a['q2_rows']:.0f} rows per round (mean)\n# start: {res['load_start']}\n# end:   {res['load_end']}")
    for n in ("Q1", "Q2"):
        pts = [p for p in res["points"] if p["query"] == n]
        print(f"\n{n} fidelity vs CV (k = 10): fidelity (moves, switches)")
        print("| CV (target) | CV of the run's rates | OM | RAND | STATIC |")
        print("|---|---|---|---|---|")
        for cv in sorted({p["cv"] for p in pts if p["k"] == 10}):
            row = {p["policy"]: p for p in pts if p["cv"] == cv and p["k"] == 10}
            cells = [f"{row[q]['fidelity']:.3f} ({row[q]['moves']}, {row[q]['switches']})" if q in row else "–"
                     for q in ("om", "rand", "static")]
            print(f"| {cv:.2f} | {next(iter(row.values()))['cv_measured']:.3f} | " + " | ".join(cells) + " |")
        print(f"{n} OM fidelity vs k (CV 0.17): " + ", ".join(
            f"k={p['k']}: {p['fidelity']:.3f} ({p['moves']} moves, {p['switches']} switches)"
            for p in sorted((p for p in pts if p["policy"] == "om" and abs(p["cv"] - 0.17) < 1e-9),
                            key=lambda p: p["k"])))
    args = argparse.Namespace(**a)
    cvs = sorted({p["cv"] for p in res["points"] if p["k"] == 10})
    print(f"\nAlgorithm 2 over the same {a['spark_rounds']} rounds' generated statistics (no Spark; k = 10): "
          "fidelity (moves, switches)")
    print("| CV | query | OM | RAND | STATIC |")
    print("|---|---|---|---|---|")
    for cv in cvs:
        for label, row in same_rounds(args, cv, 10).items():
            print(f"| {cv:.2f} | {label} | " + " | ".join(f"{row[p][0]:.3f} ({row[p][1]}, {row[p][2]})"
                                                        for p in ("om", "rand", "static")) + " |")
    ks = sorted({p["k"] for p in res["points"] if p["policy"] == "om" and abs(p["cv"] - 0.17) < 1e-9})
    print("OM vs k (CV 0.17), same rounds: " + "; ".join(
        f"k={k}: " + ", ".join(f"{label} {row['om'][0]:.3f} ({row['om'][1]}, {row['om'][2]})"
                               for label, row in same_rounds(args, 0.17, k).items()) for k in ks))


def _medians(res: dict) -> dict:
    """Per query and run, the median over the passes of every summary figure."""
    out = {}
    for n in ("Q1", "Q2"):
        for m, rs in res["runs"].items():
            ss = [summarize(r, n) for r in rs if n in r["ran"]]
            if ss:
                out.setdefault(n, {})[m] = {k: statistics.median(s[k] for s in ss) for k in ss[0]} | {"passes": len(ss)}
    return out


def pool_runs(paths: list[str]) -> dict:
    """Saved Spark parts, their passes pooled (they must have run over the same data with the same oracle)."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    for r in runs[1:]:
        if r["observed"] != first["observed"] or r["oracle"] != first["oracle"]:
            raise SystemExit("--from-json: the runs differ in data or oracle plans; they cannot be pooled")
    return {**first, "date": " and ".join(r["date"] for r in runs),
            "load_start": " | ".join(r["load_start"] for r in runs), "load_end": " | ".join(r["load_end"] for r in runs),
            "invocations": [{k: r[k] for k in ("date", "load_start", "load_end")} for r in runs],
            "args": {**first["args"], "repeat": sum(r["args"]["repeat"] for r in runs)},
            "runs": {m: [x for r in runs for x in r["runs"][m]] for m in first["runs"]}}


def print_spark(res: dict) -> None:
    print(f"# OM on Spark — {res['date']}, {res['machine']} ({res['cores']} cores), {res['args']['spark_rounds']} "
          f"rounds, medians of {res['args']['repeat']} passes\n# start: {res['load_start']}\n# end:   {res['load_end']}")
    med = _medians(res)
    print("| query | run | passes | rows/s (vs best static) | Spark batch time, sum (s) | median batch (s) | work | "
          "state bytes (mean) | switches |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in ("Q1", "Q2"):
        statics = [m for m in med[n] if m.startswith("static:")]
        best = min(statics, key=lambda m: med[n][m]["seconds"])
        plans = Q1_PLANS if n == "Q1" else Q2_PLANS
        for m, s in med[n].items():
            label = f"static {plans[int(m[7:])]}" + (" (best)" if m == best else "") if m in statics else m
            print(f"| {n} | {label} | {s['passes']} | {s['rows_per_s']:,.0f} ({med[n][best]['seconds'] / s['seconds']:.2f}×) | "
                  f"{s['seconds']:.2f} | {s['median_batch_s']:.3f} | {s['work']:,.0f} | {s['state_bytes_mean']:,.0f} | "
                  f"{s['switches']:.0f} |")
    for n in ("Q1", "Q2"):
        oracle = res["oracle"][n]
        for r in res["runs"]["om"]:
            st = r["status"].get(f"{n}/{OPS[n]}", {})
            agree = sum(a == b for a, b in zip(r["ran"][n], oracle)) / len(oracle)
            print(f"{n} om: fidelity (OM's model, policy.status()) {st.get('fidelity', float('nan')):.3f} over "
                  f"{st.get('rounds')} rounds, moves {st.get('moves')}, switches {st.get('switches')}, rebuilds "
                  f"{st.get('rebuilds')}; its plan = the measured oracle's in {agree:.0%} of steps; "
                  f"policy round median {statistics.median(r['policy_s']):.3f} s")
        print(f"{n} oracle plans: {oracle}")
        print(f"{n} om plans (pass 1): {res['runs']['om'][0]['ran'][n]}")
    r = res["runs"]["static:0"][0]["batches"]["Q1"]
    print("measured seconds per row of Q1's predicates (static:0, pass 1):",
          {p: sum(b["nanos"][p][0] for b in r) / max(sum(b["nanos"][p][1] for b in r), 1) / 1e9 for p in ("dest", "tcp")})


def plot_spark(res: dict, path: str) -> None:
    """Per query: batch time per step of each run (pass 1), and the plan OM ran vs the oracle's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5))
    for row, (n, plans) in enumerate((("Q1", Q1_PLANS), ("Q2", Q2_PLANS))):
        for m, rs in res["runs"].items():
            if n not in rs[0]["ran"]:
                continue
            secs = per_step(rs[0], n, "seconds")
            label = f"static {plans[int(m[7:])]}" if m.startswith("static:") else m
            axes[row][0].plot(range(len(secs)), secs, "--" if m.startswith("static:") else "-o", ms=3, label=label)
        axes[row][0].set(title=f"{n}: Spark batch time per step (pass 1)", xlabel="step (round)", ylabel="s")
        axes[row][0].legend(fontsize=7)
        idx = {p: i for i, p in enumerate(plans)}
        axes[row][1].step(range(len(res["oracle"][n])), [idx[p] for p in res["oracle"][n]], where="mid",
                          label="oracle (least work measured)")
        axes[row][1].step(range(len(res["runs"]["om"][0]["ran"][n])), [idx[p] for p in res["runs"]["om"][0]["ran"][n]],
                          "--", where="mid", label="om (pass 1)")
        axes[row][1].set(title=f"{n}: plan per step", xlabel="step (round)", yticks=range(len(plans)),
                         yticklabels=plans)
        axes[row][1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--part", choices=("figures", "spark", "spark-sweep"), required=True)
    ap.add_argument("--rounds", type=int, default=600, help="rounds per run of the figures (the paper: 600 s)")
    ap.add_argument("--seeds", type=int, default=5, help="runs per point of the figures")
    ap.add_argument("--q2-model", choices=("mjoin", "tree"), default="mjoin",
                    help="figures: Q2's join cost model (mjoin: the policy's default, our probe steps; "
                         "tree: OM's left-deep tree, for comparison)")
    ap.add_argument("--q2-join-cost", type=float, default=None,
                    help=f"figures: Q2's join_cost (default {PROBE_COST} s per state row for mjoin, "
                         f"{JOIN_COST} s per joined tuple for tree)")
    ap.add_argument("--plots", default=None, help="directory for PNG plots (figures: om_q*_fidelity.png; spark: om_spark.png)")
    ap.add_argument("--spark-rounds", type=int, default=24)
    ap.add_argument("--q1-rows", type=float, default=20000.0, help="Q1's mean packets per round on Spark")
    ap.add_argument("--q2-rows", type=float, default=800.0,
                    help="Q2's mean rows per round of its first input (800: 2 passes take ~12 min on 2 cores)")
    ap.add_argument("--repeat", type=int, default=2, help="passes of the Spark part (medians; run order rotated)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--cvs", default="0.09,0.17,0.26", help="spark-sweep: the CVs (om, rand, static at k = 10)")
    ap.add_argument("--ks", default="2,5,10", help="spark-sweep: OM's k at CV 0.17")
    ap.add_argument("--figures-json", default=None,
                    help="spark-sweep: a --part figures JSON; with --plots, its plots redrawn with the Spark points")
    ap.add_argument("--from-json", default=None,
                    help="spark: report (and plot) saved runs instead of running; several (a,b): their passes pooled")
    args = ap.parse_args(argv)
    before = harness.start()
    if args.part == "spark-sweep":
        if args.from_json:     # saved sweeps (several: their points together, e.g. a cut-off sweep and its rest)
            parts = []
            for path in args.from_json.split(","):
                with open(path) as f:
                    parts.append(json.load(f))
            res = {**parts[0], "points": [p for r in parts for p in r["points"]],
                   "date": " and ".join(r["date"] for r in parts),
                   "load_start": " | ".join(r["load_start"] for r in parts),
                   "load_end": " | ".join(r["load_end"] for r in parts)}
        else:
            res = spark_sweep(args)
        harness.write_result(f"om_fidelity_{args.part}", res, args, before)
        print_sweep(res)
        if args.plots and args.figures_json:
            with open(args.figures_json) as f:
                plot(json.load(f), args.plots, sweep=res)
        return 0
    if args.from_json:
        res = pool_runs(args.from_json.split(","))
        harness.write_result(f"om_fidelity_{args.part}", res, args, before)
        print_spark(res)
        if args.plots:
            plot_spark(res, os.path.join(args.plots, "om_spark.png"))
        return 0
    if args.part == "figures":
        res = figures(args)
        print_figures(res)
        if args.plots:
            plot(res, args.plots)
    else:
        res = spark_part(args)
        harness.write_result(f"om_fidelity_{args.part}", res, args, before)   # first: a failing report must not lose a long run
        print_spark(res)
        if args.plots:
            plot_spark(res, os.path.join(args.plots, "om_spark.png"))
    harness.write_result(f"om_fidelity_{args.part}", res, args, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
