"""Viglas & Naughton §5.2 and §5.3 with the rate model, and on Spark.

Predicted (pure, the paper's parameters): time to N outputs of the two plans of §5.2 — (A⋈B)⋈C and
(A⋈C)⋈B over streams with inter-arrival delays 20 ms (A), 2 ms (B), 10 ms (C), Table 5's selectivities
2·10⁻³ (A⋈B) and 5·10⁻³ (A⋈C, plus a 5 ms handling cost), symmetric hash joins — and where they cross; and
§5.3's three plan shapes of the 5-way join (Left Deep, Fast Leaves, Evenly Spread) for the first outputs and
up to the last (Table 4's sizes), with the predicted order of the plans.

Measured (Spark, ``--spark``): the §5.2 query scaled to a single equal key (``multi_join`` equates one key
over its inputs; A⋈B and A⋈C differ by their time bands), the sources replayed at their rates in real time
(one file per source and second of event time, a 1-second processing-time trigger), as binary
``interval_join`` trees in both orders and as one ``multi_join`` run in each static left-deep plan and
under the ``rate`` policy, with the fast source switching from B to C halfway. Per run: outputs by wall
time since the start (cumulative output rows at the end of each micro-batch), against the model's
prediction (Equation 3 of the rate model over the measured arrivals).

Usage::

    python -m benchmarks.experiments.rate_5_2_5_3                  # predictions only (no Spark), figures to docs/figures
    sparkslot --all python -m benchmarks.experiments.rate_5_2_5_3 --spark --seconds 20
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from pyspark_cq import plan as P
from pyspark_cq.cost import rate as R

from .. import harness
from ..common import AC_COST, F_AB, F_AC, RATES, SIZES, _s, plans_5_3

#: Symmetric hash join per-arrival costs (Table 3: move + hash + probe), a few µs each as on this machine
COSTS = R.JoinCosts(move=2e-6, hash=2e-6, probe=2e-6)


def plans_5_2():
    """(A⋈B)⋈C and (A⋈C)⋈B (Figure 6)."""
    ab_c = P.Join(P.Join(_s("A"), _s("B"), selectivity=F_AB), _s("C"), selectivity=F_AC, left_cost=AC_COST,
                  right_cost=AC_COST, label="(A⋈B)⋈C")
    ac_b = P.Join(P.Join(_s("A"), _s("C"), selectivity=F_AC, left_cost=AC_COST, right_cost=AC_COST), _s("B"),
                  selectivity=F_AB, label="(A⋈C)⋈B")
    return [ab_c, ac_b]


def curve(plan, rates, ns):
    return [R.plan_time_to_outputs(plan, rates, n, costs=COSTS, rtol=1e-7) for n in ns]


def crossing(ns, a, b):
    """The first N at which the order of the two curves changes (None if it does not)."""
    diff = np.asarray(a) - np.asarray(b)
    sign = np.where(np.abs(diff) <= 1e-6 * np.maximum(np.abs(a), 1e-12), 0, np.sign(diff))
    for k in range(1, len(ns)):
        if sign[k] != 0 and sign[k - 1] != 0 and sign[k] != sign[k - 1]:
            return ns[k]
    return None


def predict(out_dir):
    res = {}
    p52 = plans_5_2()
    ns = list(range(0, 90_001, 5_000))
    ns_zoom = list(range(0, 5_001, 250))
    res["5.2"] = {"n": ns, "n_zoom": ns_zoom,
                  "time": {p.label: curve(p, RATES, ns) for p in p52},
                  "time_zoom": {p.label: curve(p, RATES, ns_zoom) for p in p52}}
    z = res["5.2"]["time_zoom"]
    res["5.2"]["crossing_n"] = crossing(ns_zoom, z["(A⋈B)⋈C"], z["(A⋈C)⋈B"])
    p53 = plans_5_3()
    total = R.output_size(p53[0], SIZES)
    ns53 = [int(x) for x in np.linspace(0, total, 11)]
    ns53_zoom = list(range(0, 20_001, 2_000))
    res["5.3"] = {"n": ns53, "n_zoom": ns53_zoom, "total_outputs": total,
                  "time": {p.label: curve(p, RATES, ns53) for p in p53},
                  "time_zoom": {p.label: curve(p, RATES, ns53_zoom) for p in p53}}
    for key in ("time", "time_zoom"):
        last = {k: v[-1] for k, v in res["5.3"][key].items()}
        res["5.3"][f"order_{key}"] = sorted(last, key=last.get)
    _plot(res, out_dir)
    return res


def _plot(res, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (sec, key, title) in zip(axes.flat, [("5.2", "time", "§5.2 to the last tuple (Fig. 7)"),
                                                  ("5.2", "time_zoom", "§5.2 first tuples (Fig. 9)"),
                                                  ("5.3", "time", "§5.3 to the last tuple (Fig. 12)"),
                                                  ("5.3", "time_zoom", "§5.3 first tuples (Fig. 14)")]):
        ns = res[sec]["n" if key == "time" else "n_zoom"]
        for label, ts in res[sec][key].items():
            ax.plot(ts, ns, label=label)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("outputs")
        ax.set_title(f"predicted: {title}")
        ax.legend()
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(os.path.join(out_dir, "rate_5_2_5_3_predicted.png"), dpi=90)


# ---------------------------------------------------------------------------------------------- Spark

BASE_US = 1_700_000_000_000_000
KEYS = 20
BAND_AB, BAND_AC = 0.5, 2.0          # seconds: B within [A, A + 0.5 s], C within [A, A + 2 s]


def _write_inputs(root, seconds, seed=5):
    """One parquet file per source and second of event time; B fast in the first half, C in the second."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    counts = {n: 0 for n in "ABC"}
    for s in range(seconds):
        swap = s >= seconds // 2
        rate = {"A": 50, "B": 100 if swap else 500, "C": 500 if swap else 100}
        for name in "ABC":
            n = rate[name]
            t = BASE_US + s * 1_000_000 + np.sort(rng.integers(0, 1_000_000, n))
            table = pa.table({"k": pa.array(rng.integers(0, KEYS, n), pa.int64()),
                              f"t{name}": pa.array(t, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              f"v{name}": pa.array(np.arange(n) + counts[name], pa.int64())})
            counts[name] += n
            d = os.path.join(root, name)
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"s{s:04d}.parquet")
            pq.write_table(table, path)
            os.utime(path, ns=(s * 10**9, s * 10**9))     # file order = event-time order
    return counts


def _sources(spark, root):
    return [spark.readStream.schema(f"k long, t{n} timestamp, v{n} long").option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(root, n)).withWatermark(f"t{n}", "5 seconds") for n in "ABC"]


def _bounds_sql(n):
    return {"B": (0, f"{int(BAND_AB * 1000)} milliseconds"), "C": (0, f"{int(BAND_AC * 1000)} milliseconds")}[n]


def _tree(spark, root, second):
    """(A⋈B)⋈C (second = 'C') or (A⋈C)⋈B (second = 'B') as two binary interval joins."""
    import pyspark_cq as cq

    a, b, c = _sources(spark, root)
    by = {"B": b, "C": c}
    first = "B" if second == "C" else "C"
    j1 = cq.interval_join(a, by[first], "k", "tA", f"t{first}", "0 seconds", _bounds_sql(first)[1],
                          name=f"j1{first}")
    return cq.interval_join(j1.withWatermark("tA", "5 seconds"), by[second], "k", "tA", f"t{second}",
                            "0 seconds", _bounds_sql(second)[1], name=f"j2{second}")


def _mjoin(spark, root, control):
    import pyspark_cq as cq

    return cq.multi_join(_sources(spark, root), "k", ["tA", "tB", "tC"],
                         [(0, 1, "0 seconds", _bounds_sql("B")[1]), (0, 2, "0 seconds", _bounds_sql("C")[1])],
                         control=control, name="mj")


def _run(spark, build, name, seconds, rt=None):
    """Run until every file is read; return [(seconds since start, cumulative outputs)] per batch."""
    counts = []

    def sink(df, batch_id):
        counts.append((time.monotonic(), df.count()))

    start = time.monotonic()
    if rt is None:
        q = build(None).writeStream.foreachBatch(sink).trigger(processingTime="1 second").queryName(name).start()
    else:
        rt.register(name, lambda ctx: build(ctx).writeStream.foreachBatch(sink).trigger(processingTime="1 second"))
        rt.start()
        q = rt.query(name)
    deadline = start + 30 * seconds + 120
    while len(counts) < seconds and time.monotonic() < deadline:
        time.sleep(0.2)
    q.processAllAvailable()
    if rt is not None:
        rt.stop()
    else:
        q.stop()
    total, out = 0, []
    for t, c in counts:
        total += c
        out.append((t - start, total))
    return out


def measured(seconds):
    from pyspark.sql import SparkSession
    from pyspark_cq_plugins.rate_based import RateBased

    from pyspark_cq.control import ControlTable
    from pyspark_cq.runtime import CQRuntime

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)      # the workers need this venv (pandas, pyarrow)
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", 2)
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="rate52-")
    try:
        counts = _write_inputs(os.path.join(root, "in"), seconds)
        runs = {}
        limits = {}
        for second in ("C", "B"):
            label = "(A⋈B)⋈C" if second == "C" else "(A⋈C)⋈B"
            try:
                runs[f"interval_join {label}"] = _run(
                    spark, lambda _c, s=second: _tree(spark, os.path.join(root, "in"), s), f"tree{second}", seconds)
            except Exception as exc:   # Spark 4: one applyInPandasWithState per streaming query
                limits[f"interval_join {label}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        for plan_id in ("0:1>2;1:0>2;2:0>1", "0:2>1;1:0>2;2:0>1", "0:1>2;1:2>0;2:1>0"):
            table = ControlTable(os.path.join(root, f"ct-{len(runs)}.json"))
            table.register("mj", plan_id=plan_id)
            runs[f"multi_join {plan_id}"] = _run(spark, lambda _c, t=table: _mjoin(spark, os.path.join(root, "in"),
                                                                                   t.handle("mj")),
                                                 f"mj{len(runs)}", seconds)
        policy = RateBased(margin=0.1, min_batches=2)
        rt = CQRuntime(spark, policies=[policy], control_path=os.path.join(root, "ct-rate.json"), every_batches=1)
        runs["multi_join + rate"] = _run(spark, lambda ctx: _mjoin(spark, os.path.join(root, "in"),
                                                                    ctx.control("mj", plan_id="0:1>2;1:2>0;2:1>0")),
                                         "mjrate", seconds, rt)
        switches = [(r["round"], [d for d in r["decisions"]]) for r in rt.decisions_log() if r["decisions"]]
        return {"counts": counts, "runs": runs, "switches": [str(s) for s in switches], "not_run": limits}
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None):
    ap = harness.parser(__doc__)
    ap.add_argument("--spark", action="store_true", help="also run the measured part on Spark")
    ap.add_argument("--seconds", type=int, default=20, help="seconds of event time replayed (measured part)")
    ap.add_argument("--out", default=str(harness.FIGURES), help="directory of the figures (PNG)")
    args = ap.parse_args(argv)
    before = harness.start()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": load, "predicted": predict(args.out)}
    p = res["predicted"]
    print(f"# {res['date']}  {load}")
    print("§5.2 predicted time (s) to N outputs")
    print("N       " + "  ".join(f"{k:>10}" for k in p["5.2"]["time"]))
    for k, n in enumerate(p["5.2"]["n"]):
        print(f"{n:<8}" + "  ".join(f"{v[k]:10.3f}" for v in p["5.2"]["time"].values()))
    print(f"§5.2 predicted crossing at N ≈ {p['5.2']['crossing_n']} (paper: about 2,000)")
    print(f"§5.3 total outputs {p['5.3']['total_outputs']:.0f}; predicted order to the last: "
          f"{p['5.3']['order_time']}; for the first 20,000: {p['5.3']['order_time_zoom']}")
    if args.spark:
        res["measured"] = measured(args.seconds)
        for label, pts in res["measured"]["runs"].items():
            last = pts[-1] if pts else (float("nan"), 0)
            print(f"{label:32} outputs {last[1]:>9}  at {last[0]:7.2f} s  ({len(pts)} batches)")
        print("rate switches:", res["measured"]["switches"])
        for label, why in res["measured"]["not_run"].items():
            print(f"{label:32} not run: {why}")
    harness.write_result("rate_5_2_5_3", res, args, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
