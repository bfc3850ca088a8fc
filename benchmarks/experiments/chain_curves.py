"""Queue-size curves of Chain, FIFO, greedy and round-robin scheduling (STREAM §5.3), from the pure model.

Motwani et al., "Query Processing, Approximation, and Resource Management in a Data Stream Management
System" (STREAM), §5.3, and Babcock, Babu, Datar & Motwani's Chain. Everything here is
:mod:`pyspark_cq.cost.chain` (no Spark): the total queued tuples at t = 0 … horizon of one operator path
under the four strategies of :data:`~pyspark_cq.cost.chain.STRATEGIES`.

- ``chain_5_3.png``: the paper's example (O1: b tuples per unit, selectivity 0.2; O2: 0.2b per unit,
  selectivity 0; 2b tuples at t = 0, b at t = 2 and t = 3). Strategy 1 of the paper is ``fifo``, strategy 2
  is ``chain``; the script checks both against the paper's table.
- ``chain_3op.png``: two 3-operator paths with bursty arrivals. (a) a fast halving operator, a
  selective one, a slow last one: Chain runs the fast operator first and holds the fewest tuples.
  (b) a slow, very selective middle operator that feeds a fast last one: Chain's two last operators
  share one envelope segment, so FIFO order among them makes the last one run on 0.05 tuples in a whole
  time unit after each run of the middle one, while greedy lets the middle one's output pile up — the
  waste STREAM's refinement "favor operators with full batches" (§5.3) avoids and this model does not.

Usage::

    python -m benchmarks.experiments.chain_curves [--out docs/figures] [--no-plot]
"""
from __future__ import annotations

import os
import sys

from pyspark_cq.cost import chain

from .. import harness

PAPER = {
    "title": "STREAM §5.3 (units of b): O1 (b/unit, s=0.2) → O2 (0.2b/unit, s=0)",
    "operators": [(1, 0.2), (0.2, 0.0)],
    "arrivals": {0: 2, 2: 1, 3: 1},
    "horizon": 8,
}
# The paper's table: total size of both queues, multiples of b, t = 0 … 8.
PAPER_TABLE = {"fifo": [2, 1.2, 2, 2.2, 2, 1.2, 1, 0.2, 0], "chain": [2, 1.2, 1.4, 1.6, 0.8, 0.6, 0.4, 0.2, 0]}

BURSTS = {0: 8, 5: 4, 6: 4, 12: 8}
THREE_OP = [
    {
        "title": "(a) O1 (4/unit, s=0.5) → O2 (1/unit, s=0.2) → O3 (0.2/unit, s=0.5)",
        "operators": [(4, 0.5), (1, 0.2), (0.2, 0.5)],
        "arrivals": BURSTS,
        "horizon": 32,
    },
    {
        "title": "(b) O1 (4/unit, s=0.5) → O2 (0.5/unit, s=0.1) → O3 (1/unit, s=1)",
        "operators": [(4, 0.5), (0.5, 0.1), (1, 1.0)],
        "arrivals": BURSTS,
        "horizon": 60,
    },
]
STYLE = {"chain": ("C0", "-", "o"), "fifo": ("C3", "--", "s"), "greedy": ("C2", "-.", "^"),
         "round_robin": ("C7", ":", "x")}


def curves(case: dict) -> dict[str, list[float]]:
    """Total queued tuples per strategy for one case."""
    return {s: chain.simulate(case["operators"], case["arrivals"], s, case["horizon"]) for s in chain.STRATEGIES}


def summary(values: list[float]) -> tuple[float, float, int | None]:
    """(peak, mean, first t from which every queue stays empty or None)."""
    drained = next((t for t in range(len(values)) if all(v == 0 for v in values[t:])), None)
    return max(values), sum(values) / len(values), drained


def print_case(case: dict, result: dict[str, list[float]]) -> None:
    ops = case["operators"]
    print(f"\n{case['title']}")
    print(f"  arrivals {case['arrivals']}")
    print(f"  progress chart {[(round(x, 4), round(y, 4)) for x, y in chain.progress_chart(ops)]}")
    print(f"  lower envelope {[(round(x, 4), round(y, 4)) for x, y in chain.lower_envelope(ops)]}")
    print(f"  priorities     {[round(p, 4) for p in chain.priorities(ops)]}")
    print("  t   " + "".join(f"{s:>12}" for s in chain.STRATEGIES))
    for t in range(case["horizon"] + 1):
        print(f"  {t:<4}" + "".join(f"{result[s][t]:>12.4g}" for s in chain.STRATEGIES))
    print("  peak/mean/drained at: " + "; ".join(
        f"{s} {p:.3g}/{m:.3g}/{d}" for s, (p, m, d) in ((s, summary(result[s])) for s in chain.STRATEGIES)))


def plot(ax, case: dict, result: dict[str, list[float]], unit: str) -> None:
    t = list(range(case["horizon"] + 1))
    for s in chain.STRATEGIES:
        color, ls, marker = STYLE[s]
        peak, mean, _ = summary(result[s])
        ax.plot(t, result[s], color=color, linestyle=ls, marker=marker, markersize=4, drawstyle="default",
                label=f"{s} (peak {peak:.3g}, mean {mean:.3g})")
    ax.set_title(case["title"], fontsize=9)
    ax.set_xlabel("time unit t (after the arrivals of t)")
    ax.set_ylabel(f"queued tuples ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main(argv=None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default=str(harness.FIGURES), help="directory of the PNGs (default docs/figures)")
    parser.add_argument("--no-plot", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    before = harness.start()

    paper = curves(PAPER)
    print_case(PAPER, paper)
    ok = all(paper[s] == [float(v) for v in PAPER_TABLE[s]] for s in PAPER_TABLE)
    print(f"  paper's table (strategy 1 = fifo, strategy 2 = chain) reproduced exactly: {ok}")
    three = [curves(case) for case in THREE_OP]
    for case, result in zip(THREE_OP, three):
        print_case(case, result)

    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        os.makedirs(args.out, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        plot(ax, PAPER, paper, "multiples of b")
        ax.plot(range(9), PAPER_TABLE["fifo"], linestyle="none", marker="o", markersize=10,
                markerfacecolor="none", color="C3", label="paper, strategy 1")
        ax.plot(range(9), PAPER_TABLE["chain"], linestyle="none", marker="o", markersize=10,
                markerfacecolor="none", color="C0", label="paper, strategy 2")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(args.out, "chain_5_3.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"\nwrote {path}")

        fig, axes = plt.subplots(2, 1, figsize=(8, 8))
        for ax, case, result in zip(axes, THREE_OP, three):
            plot(ax, case, result, "tuples")
        fig.tight_layout()
        path = os.path.join(args.out, "chain_3op.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")
    harness.write_result("chain_curves", {"paper": paper, "paper_table_reproduced": ok,
                                          "three_operators": dict(zip((c["title"] for c in THREE_OP), three))},
                         args, before)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
