"""Viglas & Naughton §5.3 on Spark: the 5-way join in the paper's three plan shapes, predicted vs measured.

- **Query.** Five sources A…E joined on one key (``--keys`` values, uniform) and the chain of Table 5's
  predicates C–A–B–D–E, each a symmetric time band ``|t_v − t_u| ≤ w`` whose half-width makes the
  selectivity per second of event time Table 5's: ``f = 2w/K`` (A⋈C 5·10⁻³, A⋈B 2·10⁻³, B⋈D 10⁻⁴,
  D⋈E 10⁻⁵). Rows per second of event time: §5's rates (A 50, B 500, C 100, D 250, E 1000) times
  ``--scale``; E is the fastest stream, D the second.
- **Backlog replay.** One file per source and step (1 s of event time), written beforehand; the run copies
  one step into the query's input directories and processes it as one micro-batch (as
  ``plan_switch_backlog.py``), so each batch's time is the work its data brings, not the wall clock.
  Measured: outputs by cumulative Spark batch time (``batchDuration``).
- **Static binary trees.** Spark's own stream-stream joins (``df.join`` with the time bands and watermarks)
  in Figure 11's shapes (``rate_5_2_5_3.plans_5_3``): Left Deep (E at the top), Fast Leaves, Evenly Spread.
  Spark 4 allows one event-time column per joined stream (``MULTIPLE_EVENT_TIME_COLUMNS``): after each join
  every event-time column is demoted to a plain timestamp and the watermark is set again on the column the
  parent join's band uses, so each join's state is still evicted by its band.
- **Run-time switchable.** One 5-way ``cq.multi_join`` with the probe orders that follow each tree
  (``rate.tree_probe_orders``), static, and under the ``rate`` policy started in Left Deep's orders.
- **Predicted.** Per step of event time (1 s) the model's work: trees — ``rate.plan_work`` (Equation 2's
  denominator summed over the joins; Table 3's symmetric nested-loops join within a key, see ``tree_work``);
  ``multi_join`` — ``MultiJoinModel(scan=True)`` (state rows met by the partial matches) with the states'
  sizes measured in the first static run. Predicted order = order of the work. Predicted times: batch time
  = a + c·work, (a, c) fitted by least squares on the OTHER plans of the same kind (leave one out), so every
  plan's curve is predicted out of sample; the error is |predicted − measured| / measured of the time to the
  first step's outputs and to all outputs.
- **Rates changing mid-stream** (``--swap AB``): from step ``steps // 2`` on, the listed pairs of sources
  swap their rates (``AB``: A gets B's rows per step and B gets A's). The static runs add, besides the
  trees' orders, the model's best probe orders for each half's rates (``best 1st half``, ``best 2nd
  half``: :meth:`~pyspark_cq.cost.rate.MultiJoinModel.best_orders` among orders without key-only steps);
  ``rate+reset`` runs the policy with ``reset_factor`` (``--reset-factor``). The predicted work per step
  follows each half's rates. For the policy runs the script prints, per step, the output rate the policy
  predicted for the plan it ran against the measured one (outputs of the step over its batch time).

Usage::

    sparkslot --all python -m benchmarks.experiments.rate_5_3_spark [--steps 10] [--scale 10] [--keys 100] \
        [--swap AB] [--kinds mj,rate,rate+reset] [--reset-factor 3] \
        [--json benchmarks/results/rate_5_3_spark.json] [--plot docs/figures/rate_5_3_spark.png]
    python -m benchmarks.experiments.rate_5_3_spark --from-json benchmarks/results/rate_5_3_spark.json --plot ...
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from pyspark_cq import plan as P  # noqa: E402
from pyspark_cq.control import join_plan_id  # noqa: E402
from pyspark_cq.cost import rate as R  # noqa: E402

from .. import harness
from ..common import F_AB, F_AC, F_BD, F_DE, RATES, _write, plans_5_3

NAMES = "ABCDE"
EDGES = {("A", "C"): F_AC, ("A", "B"): F_AB, ("B", "D"): F_BD, ("D", "E"): F_DE}   # Table 5, chain C–A–B–D–E
BASE_US = 1_700_000_000_000_000
DELAY = "1 second"
OP = "mj5"
#: seconds of input a Spark join state holds: the watermark delay plus the step the watermark lags behind
RETAIN = 2.0


def half_widths(keys: int, f_scale: float) -> dict:
    """Band half-width (µs) per predicate so that ``2w/K`` per second is Table 5's selectivity × f_scale."""
    return {e: int(round(f * f_scale * keys / 2 * 1e6)) for e, f in EDGES.items()}


def shapes(f_scale: float = 1.0, method: str = "hash"):
    """Figure 11's three plans without §5.2's 5 ms handling cost of A⋈C (not simulated on Spark)."""
    return plans_5_3(ac_cost=0.0, f_scale=f_scale, method=method)


def swap_map(swap: str | None) -> dict:
    """``"AB,CD"`` -> {A: B, B: A, C: D, D: C}: whose §5 rate each source takes after the change."""
    out = {}
    for pair in (swap or "").split(","):
        pair = pair.strip()
        if not pair:
            continue
        if len(pair) != 2 or not set(pair) <= set(NAMES) or pair[0] == pair[1] or set(pair) & set(out):
            raise ValueError(f"swap must be comma-separated pairs of two different sources of {NAMES}, got {swap!r}")
        out[pair[0]], out[pair[1]] = pair[1], pair[0]
    return out


def step_rows(scale: float, swap: str | None = None) -> dict:
    """Rows per step of each source: §5's rates times ``scale``, with the pairs of ``swap`` exchanged."""
    m = swap_map(swap)
    return {n: int(round(RATES[m.get(n, n)] * scale)) for n in NAMES}


def rows_at(args, step: int) -> dict:
    """Rows per step of each source at ``step`` (after ``steps // 2`` with ``--swap``: the swapped rates)."""
    args = args if isinstance(args, dict) else vars(args)
    swapped = args.get("swap") and step >= args["steps"] // 2
    return step_rows(args["scale"], args["swap"] if swapped else None)


def write_inputs(root: str, args, seed: int = 7) -> dict:
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    keys = args.keys
    for s in range(args.steps):
        rows = rows_at(args, s)
        for n in NAMES:
            k = rows[n]
            t = BASE_US + s * 1_000_000 + np.sort(rng.integers(0, 1_000_000, k))
            _write(os.path.join(root, n), s, pa.table({
                f"k{n}": pa.array(rng.integers(0, keys, k), pa.int64()),
                f"t{n}": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                f"v{n}": pa.array(np.arange(k) + s * 10**7, pa.int64())}))
    return rows_at(args, 0)


def _edge(left: P.Node, right: P.Node) -> tuple[str, str, int]:
    ls, rs = P.source_names(left), P.source_names(right)
    for (u, v) in EDGES:
        if u in ls and v in rs:
            return u, v, 0
        if v in ls and u in rs:
            return v, u, 0
    raise ValueError("no predicate between the subtrees")


def _distance(u: str, v: str, widths: dict) -> int:
    """The implied band (µs) between two inputs: the half-widths summed along the predicates' path."""
    todo, seen = [(u, 0)], {u}
    while todo:
        x, d = todo.pop()
        if x == v:
            return d
        for (a, b), w in widths.items():
            for y, z in ((a, b), (b, a)):
                if y == x and z not in seen:
                    seen.add(z)
                    todo.append((z, d + w))
    raise ValueError(f"no predicate path between {u} and {v}")


def spark_tree(node: P.Node, dfs: dict, widths: dict, want: str | None = None):
    """Spark's binary stream-stream joins in the plan's shape; returns (DataFrame, watermarked input).

    Spark 4 allows one event-time column per joined stream and refuses to redefine a watermark, so each
    subtree keeps the watermark of one input (the one on the side of the parent's predicate) and the others
    are demoted to plain timestamps. When the kept columns of the two sides are not the predicate's own
    columns, the join also gets the implied band between them (the half-widths summed along the path), which
    changes no result but lets Spark evict both states.
    """
    from pyspark.sql import functions as F

    if isinstance(node, P.Source):
        return dfs[node.name], node.name
    u, v, _ = _edge(node.left, node.right)
    w = widths.get((u, v), widths.get((v, u)))
    left, kl = spark_tree(node.left, dfs, widths, want=u)
    right, kr = spark_tree(node.right, dfs, widths, want=v)
    cond = f"k{u} = k{v} AND t{v} BETWEEN t{u} - INTERVAL {w} MICROSECONDS AND t{u} + INTERVAL {w} MICROSECONDS"
    if (kl, kr) != (u, v):
        d = _distance(kl, kr, widths)
        cond += f" AND t{kr} BETWEEN t{kl} - INTERVAL {d} MICROSECONDS AND t{kl} + INTERVAL {d} MICROSECONDS"
    out = left.join(right, F.expr(cond))
    if want is None:
        return out, kl
    keep = kl if want in P.source_names(node.left) else kr
    out = out.select(*[F.col(c).alias(c, metadata={}) if c.startswith("t") and c != f"t{keep}" else F.col(c)
                       for c in out.columns])
    return out, keep


def _sources(spark, live: dict) -> dict:
    return {n: spark.readStream.schema(f"k{n} long, t{n} timestamp, v{n} long").option("maxFilesPerTrigger", 1)
            .parquet(live[n]).withWatermark(f"t{n}", DELAY) for n in NAMES}


def _bounds(widths: dict) -> list:
    idx = {n: i for i, n in enumerate(NAMES)}
    return [(idx[u], idx[v], f"-{w} microseconds", f"{w} microseconds") for (u, v), w in widths.items()]


def tree_plan_ids() -> dict:
    return {p.label: join_plan_id(R.tree_probe_orders(p, NAMES, EDGES)) for p in shapes()}


def model_best_plan(scale: float, f_scale: float, swap: str | None = None) -> str:
    """The model's best probe orders (local rate, t_p = 2 s) among those without a step into an input with
    no predicate to the bound inputs, for the rates of ``swap`` and states of RETAIN seconds."""
    import itertools

    from pyspark_cq.policies import plan_stats as S

    m = mj_model(scale, f_scale, [RETAIN] * 5, swap)
    idx = {n: i for i, n in enumerate(NAMES)}
    bands = frozenset(frozenset((idx[u], idx[v])) for u, v in EDGES)
    allowed = [[o for o in itertools.permutations([j for j in range(5) if j != i])
                if not S.key_only_steps([()] * i + [o], bands)] for i in range(5)]
    return join_plan_id(m.best_orders(t_p=2.0, allowed=allowed)[0])


def run_once(spark, root: str, kind: str, label: str, args, plan_id: str | None = None) -> dict:
    """One run over the backlog: ``kind`` 'tree' (Spark's joins, plan ``label``), 'mj' (static probe orders
    ``plan_id``) or 'rate' (multi_join under the rate policy, starting in ``plan_id``)."""
    import pyspark_cq as cq
    from pyspark_cq.runtime import CQRuntime

    run_dir = os.path.join(root, f"run-{time.time_ns()}")
    live = {n: os.path.join(run_dir, n) for n in NAMES}
    for d in live.values():
        os.makedirs(d)
    widths = half_widths(args.keys, args.fscale)
    policy = None
    if kind == "rate":
        from pyspark_cq_plugins.rate_based import RateBased

        policy = RateBased(objective="rate", t_p=2.0, margin=0.1, min_batches=1, d=3,
                           reset_factor=args.reset_factor if label == "rate+reset" else None)
    rt = CQRuntime(spark, policies=[policy] if policy else [], control_path=os.path.join(run_dir, "ct.json"),
                   every_batches=10**9)

    def build(ctx):
        dfs = _sources(ctx.spark, live)
        if kind == "tree":
            out = spark_tree({p.label: p for p in shapes()}[label], dfs, widths)[0]
        else:
            out = cq.multi_join([dfs[n] for n in NAMES], [f"k{n}" for n in NAMES], [f"t{n}" for n in NAMES],
                                _bounds(widths), control=ctx.control(OP, plan_id=plan_id), name=OP)
        return out.writeStream.format("noop").option("checkpointLocation", os.path.join(run_dir, "ck"))

    rt.register("Q", build)
    ran, predicted, step_end = [], [], []
    with rt:
        q = rt.query("Q")
        for step in range(args.steps):
            if kind != "tree":
                ran.append(rt.control_table().entry(OP).params.get("plan_id"))
            for n in NAMES:      # hidden copies first, then the renames: one batch sees all five files
                shutil.copy2(os.path.join(root, "data", n, f"b{step:04d}.parquet"), os.path.join(live[n], f".b{step:04d}"))
            for n in NAMES:
                os.replace(os.path.join(live[n], f".b{step:04d}"), os.path.join(live[n], f"b{step:04d}.parquet"))
            q.processAllAvailable()
            step_end.append(q.lastProgress["batchId"])
            if policy is not None:
                want = cq.read_metrics([p for p in q.recentProgress if p["numInputRows"] > 0][-1], OP)
                deadline = time.monotonic() + 60
                while dict(rt.statistics().queries["Q"].operators[OP].report) != want and time.monotonic() < deadline:
                    time.sleep(0.02)
                rt.run_policies()
                predicted.append({k: float(v) for k, v in policy.predictions.get(("Q", OP), {}).items()})
        batches = []
        for p in q.recentProgress:
            if not p["numInputRows"]:
                continue
            r = cq.read_metrics(p, OP) or {}
            batches.append({"batch": p["batchId"], "seconds": p["batchDuration"] / 1000.0,
                            "input_rows": p["numInputRows"],
                            "output_rows": (p.get("sink") or {}).get("numOutputRows") or r.get("output_rows", 0),
                            "state_rows": ([r.get(f"state_rows_{i}", 0) for i in range(5)] if r else
                                           [o.get("numRowsTotal", 0) for o in p["stateOperators"]]),
                            "scanned": sum(v * r.get(f"state_rows_{k.rsplit('_', 1)[1]}", 0)
                                           for k, v in r.items() if k.startswith("probed_"))})
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"kind": kind, "label": label, "plan_id": plan_id, "ran": ran, "predicted": predicted,
            "step_end": step_end, "batches": batches, "resets": list(policy.resets) if policy else []}


def per_step(run: dict, what: str) -> list[float]:
    out, prev = [], -1
    for end in run["step_end"]:
        out.append(sum(b[what] for b in run["batches"] if prev < b["batch"] <= end))
        prev = end
    return out


# ------------------------------------------------------------------------------------------ model


def tree_work(scale: float, f_scale: float, keys: int, swap: str | None = None) -> dict:
    """Predicted work per step of each tree: Spark's stream-stream join keeps a list of rows per key and an
    arrival is checked against every row of its key in the other side's state, so each join is Table 3's
    symmetric nested-loops join within a key: ``C_l = move + |S_r|/K·comp`` with ``|S_r| = r_r·RETAIN``
    (``plan_work`` at t = 1 with ``comp = RETAIN/K``). Units: comparisons; an arrival counts one."""
    rates = {n: float(r) for n, r in step_rows(scale, swap).items()}
    costs = R.JoinCosts(move=1.0, comp=RETAIN / keys)
    return {p.label: R.plan_work(p, rates, 1.0, costs=costs) for p in shapes(f_scale, "nested_loops")}


def mj_model(scale: float, f_scale: float, retention: list[float], swap: str | None = None) -> R.MultiJoinModel:
    """The 5-way multi_join in its steady state: states of ``retention_j`` seconds of input j, the pair
    selectivities per state row (Table 5's per second over the retention), a probe meets the probed state."""
    rows = step_rows(scale, swap)
    idx = {n: i for i, n in enumerate(NAMES)}
    rates = [float(rows[n]) for n in NAMES]
    states = [r * h for r, h in zip(rates, retention)]
    held = float(np.mean(retention))      # one pair selectivity per predicate: the mean retention
    sel = {frozenset((idx[u], idx[v])): min(1.0, f * f_scale / held) for (u, v), f in EDGES.items()}
    return R.MultiJoinModel(tuple(rates), sel, states=tuple(states), growth=(0.0,) * 5, probe_cost=1.0,
                            scan=True)


def mj_work(model: R.MultiJoinModel, plan_id: str) -> float:
    from pyspark_cq.control.plans import parse_join_plan

    orders = parse_join_plan(plan_id, 5)
    return sum(r * c for r, c in zip(model.rates, model.arrival_costs(orders, 0.0)))


def fit_leave_one_out(work: dict, measured: dict) -> dict:
    """Per plan: (a, c) of batch time = a + c·work fitted on the other plans' batches (``work[p]``: per
    step, as ``measured[p]``); returns a, c."""
    out = {}
    for p in work:
        xs = [w for q in work if q != p for w in work[q]]
        ys = [s for q in work if q != p for s in measured[q]]
        if len(set(xs)) < 2:       # one other plan: no slope to fit; scale its mean by the work
            c = float(np.mean(ys)) / xs[0] if xs else 0.0
            out[p] = (0.0, c)
            continue
        c, a = np.polyfit(xs, ys, 1)
        out[p] = (float(a), float(c))
    return out


def analyse(res: dict) -> dict:
    runs, args = res["runs"], res["args"]
    first_n = None
    an = {"tree": {}, "mj": {}}
    for kind in ("tree", "mj"):
        rs = {r["label"]: r for r in runs if r["kind"] == kind}
        if not rs:
            continue
        secs = {k: per_step(r, "seconds")[1:] for k, r in rs.items()}      # the first step: empty states
        halves = [args.get("swap") if args.get("swap") and s >= args["steps"] // 2 else None
                  for s in range(1, args["steps"])]
        if kind == "tree":
            per = {h: tree_work(args["scale"], args["fscale"], args["keys"], h) for h in set(halves)}
            work = {k: [per[h][k] for h in halves] for k in rs}
        else:
            models = {h: mj_model(args["scale"], args["fscale"], res["retention"], h) for h in set(halves)}
            work = {k: [mj_work(models[h], rs[k]["plan_id"]) for h in halves] for k in rs}
        fits = fit_leave_one_out(work, secs)
        for k, r in rs.items():
            s, o = per_step(r, "seconds"), np.cumsum(per_step(r, "output_rows"))
            a, c = fits[k]
            pred = np.cumsum([s[0]] + [a + c * w for w in work[k]])     # step 0 measured (warm-up of states)
            meas = np.cumsum(s)
            first_n = first_n or int(o[1]) if len(o) > 1 else None
            k1 = int(np.searchsorted(o, first_n)) if first_n else 1
            an[kind][k] = {"work": work[k], "a": a, "c": c, "outputs": o.tolist(), "measured_t": meas.tolist(),
                           "predicted_t": pred.tolist(),
                           "err_first": abs(pred[k1] - meas[k1]) / meas[k1], "err_all": abs(pred[-1] - meas[-1]) / meas[-1],
                           "t_first": float(meas[k1]), "t_first_pred": float(pred[k1])}
        an[kind + "_order_predicted"] = sorted(work, key=lambda k: sum(work[k]))
        an[kind + "_order_measured"] = sorted(an[kind], key=lambda k: an[kind][k]["measured_t"][-1])
        an[kind + "_order_measured_first"] = sorted(an[kind], key=lambda k: an[kind][k]["t_first"])
    an["first_n"] = first_n
    return an


def report(res: dict) -> None:
    an = analyse(res)
    print(f"# §5.3 on Spark — {res['date']}, {res['machine']}, {os.cpu_count()} cores\n# start: {res['load_start']}\n"
          f"# end:   {res['load_end']}\n# args: {res['args']}\n# rows per step: {res['rows_per_step']}")
    print(f"outputs per run: { {r['kind'] + ' ' + r['label']: int(sum(per_step(r, 'output_rows'))) for r in res['runs']} }")
    print(f"first outputs: the first {an['first_n']} (the end of step 1)")
    print("| plan | kind | predicted work / step | measured time to first / all outputs (s) | predicted (s) | error first / all |")
    print("|---|---|---|---|---|---|")
    for kind in ("tree", "mj"):
        for k, v in an[kind].items():
            w = " → ".join(f"{x:,.3g}" for x in dict.fromkeys(v["work"]))      # per half with --swap
            print(f"| {k} | {'Spark join tree' if kind == 'tree' else 'multi_join, static orders'} | {w} | "
                  f"{v['t_first']:.2f} / {v['measured_t'][-1]:.2f} | {v['t_first_pred']:.2f} / {v['predicted_t'][-1]:.2f} | "
                  f"{100 * v['err_first']:.0f} % / {100 * v['err_all']:.0f} % |")
        if an[kind]:
            print(f"{kind}: predicted order {an[kind + '_order_predicted']}; measured to all {an[kind + '_order_measured']}; "
                  f"measured to the first {an[kind + '_order_measured_first']}")
    if an["tree"]:     # the registration-time choice among the trees, at the fitted cost per comparison
        from pyspark_cq_plugins.rate_based import choose_join_tree

        args = res["args"]
        c = float(np.median([v["c"] for v in an["tree"].values()]))
        costs = R.JoinCosts(move=c, comp=c * RETAIN / args["keys"])
        rates = {n: float(r) for n, r in step_rows(args["scale"]).items()}     # the first half's with --swap
        plans = shapes(args["fscale"], "nested_loops")
        total = float(sum(per_step(res["runs"][0], "output_rows")))
        rate_pick = choose_join_tree(plans, rates, objective="rate", t_p=float(args["steps"]), costs=costs)[0]
        time_pick = choose_join_tree(plans, rates, objective="time", n=total, costs=costs)[0]
        print(f"choose_join_tree (c = {c:.3g} s per comparison): objective rate, t_p = {args['steps']} s -> "
              f"{rate_pick.label}; objective time, n = {total:.0f} -> {time_pick.label}")
    names = {**res["tree_plans"], **res.get("extra_plans", {})}
    for r in res["runs"]:
        if r["kind"] == "rate":
            secs, outs = per_step(r, "seconds"), per_step(r, "output_rows")
            s = np.cumsum(secs)
            print(f"{r['label']}: time to all outputs {s[-1]:.2f} s, to half of them "
                  f"{s[int(np.searchsorted(np.cumsum(outs), sum(outs) / 2))]:.2f} s; resets at batches "
                  f"{[b for _, _, b in r.get('resets', [])]}; plans per step: "
                  f"{[next((k for k, v in names.items() if v == p), p) for p in r['ran']]}")
            rows, errs = [], []
            for k in range(1, len(secs)):       # the rate predicted (after step k-1) for the plan that ran step k
                pred = r["predicted"][k - 1].get(r["ran"][k]) if k - 1 < len(r["predicted"]) else None
                meas = outs[k] / secs[k] if secs[k] > 0 else float("nan")
                rows.append(f"{pred:.0f}/{meas:.0f}" if pred is not None else f"–/{meas:.0f}")
                if pred is not None and meas > 0:
                    errs.append(abs(pred - meas) / meas)
            print(f"  predicted/measured output rate per step 2…: {', '.join(rows)}; median error "
                  f"{100 * float(np.median(errs)) if errs else float('nan'):.0f} %")
    for r in res["runs"]:
        if r["kind"] == "mj":
            secs, outs = per_step(r, "seconds"), per_step(r, "output_rows")
            half = int(np.searchsorted(np.cumsum(outs), sum(outs) / 2))
            print(f"static {r['label']}: time to all {sum(secs):.2f} s, to half {np.cumsum(secs)[half]:.2f} s; "
                  f"measured output rate per step {[round(o / t) if t else 0 for o, t in zip(outs, secs)]}")


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    an = analyse(res)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = {"Left Deep": "C3", "Fast Leaves": "C1", "Evenly Spread": "C2"}
    for ax, kind, title in ((axes[0], "tree", "Spark's binary join trees"), (axes[1], "mj", "multi_join, tree probe orders")):
        for k, v in an[kind].items():
            ax.plot([0] + v["measured_t"], [0] + v["outputs"], "-o", ms=3, color=colors.get(k), label=f"{k} measured")
            ax.plot([0] + v["predicted_t"], [0] + v["outputs"], ":", color=colors.get(k), label=f"{k} predicted")
        ax.set(xlabel="cumulative Spark batch time (s)", ylabel="outputs", title=f"§5.3 backlog: {title}")
        ax.legend(fontsize=7)
    for r in res["runs"]:
        if r["kind"] in ("mj", "rate"):
            label = f"static {r['label']}" if r["kind"] == "mj" else f"under {r['label']} (starts in Left Deep)"
            axes[2].plot(range(1, len(r["step_end"]) + 1), per_step(r, "seconds"), "-o" if r["kind"] == "rate" else "--o",
                         ms=3, color=colors.get(r["label"], "k"), label=label)
    axes[2].set(yscale="log", xlabel="step (one micro-batch)", ylabel="batch time (s)",
                title="multi_join: static probe orders vs rate")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--steps", type=int, default=10, help="steps (1 s of event time, one micro-batch each)")
    ap.add_argument("--scale", type=float, default=10.0, help="rows per step = §5's rate × scale")
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--fscale", type=float, default=0.25, help="Table 5's selectivities times this")
    ap.add_argument("--kinds", default="tree,mj,rate", help="of tree, mj, rate, rate+reset")
    ap.add_argument("--swap", default=None, help="pairs of sources whose rates swap halfway, e.g. AB or AB,CD")
    ap.add_argument("--reset-factor", type=float, default=3.0, help="reset_factor of the rate+reset run")
    ap.add_argument("--reverse", action="store_true", help="run the plans in the reverse order")
    ap.add_argument("--from-json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    before = harness.start()
    if args.from_json:
        with open(args.from_json) as fh:
            res = json.load(fh)
    else:
        import pyspark_cq as cq

        load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        spark = cq.spark("local[2]", "rate-5-3", shuffle_partitions=2,
                         conf={"spark.sql.streaming.metricsEnabled": "false", "spark.ui.enabled": "false",
                               "spark.sql.streaming.noDataMicroBatches.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        root = tempfile.mkdtemp(prefix="rate53-")
        swap_map(args.swap)      # validate before Spark work
        rows = write_inputs(os.path.join(root, "data"), args)
        kinds = args.kinds.split(",")
        plans = tree_plan_ids()
        extra = {}
        if args.swap:
            extra = {"best 1st half": model_best_plan(args.scale, args.fscale),
                     "best 2nd half": model_best_plan(args.scale, args.fscale, args.swap)}
        runs = []
        warm = argparse.Namespace(**{**vars(args), "steps": 2})
        run_once(spark, root, "tree", "Left Deep", warm)                       # JVM / worker warm-up, discarded
        run_once(spark, root, "mj", "Left Deep", warm, plans["Left Deep"])
        jobs = [(kind, label, plans.get(label)) for label in plans for kind in ("tree", "mj") if kind in kinds]
        jobs += [("mj", label, plan_id) for label, plan_id in extra.items() if "mj" in kinds]
        jobs += [("rate", label, plans["Left Deep"]) for label in ("rate", "rate+reset") if label in kinds]
        if args.reverse:      # a second pass in the other order: later runs of a session tend to be faster
            jobs.reverse()
        for kind, label, plan_id in jobs:
            runs.append(run_once(spark, root, kind, label, args, None if kind == "tree" else plan_id))
            print(f"  {kind} {label}: {sum(per_step(runs[-1], 'seconds')):.2f} s", flush=True)
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
        # the states' sizes (seconds of each input kept) measured in the first static multi_join run
        mj = sorted((r for r in runs if r["kind"] == "mj"), key=lambda r: r["label"] != "Left Deep")
        retention = [1.0] * 5
        if mj:      # with --swap: from the first half's batches
            first = mj[0]["batches"][1:args.steps // 2] if args.swap else mj[0]["batches"][1:]
            st = np.array([b["state_rows"] for b in first], dtype=float).mean(axis=0)
            retention = [max(float(s) / rows[n], 1e-3) for s, n in zip(st, NAMES)]
        res = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "load_start": load0, "load_end": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
               "args": vars(args), "rows_per_step": rows, "tree_plans": plans, "extra_plans": extra,
               "retention": retention, "runs": runs}
        harness.write_result("rate_5_3_spark", res, args, before)
    report(res)
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
