"""OM's charts (issue 18): the O(1) plan lookup of Algorithm 2 (goal <= 1 µs) and building a chart.

- ``ChartLookup``: one ``Chart.lookup`` of a sel-λ chart (2 dimensions) and a λ-λ chart of a 3-way join
  (3 dimensions), k = 10 and 40, points spread over and beyond the ranges.
- ``ChartBuild``: Algorithm 1 for a 2-predicate chain's sel-λ chart costed by the §4.1 formulas.
"""
import numpy as np

from pyspark_cq.cost import om


def _cost(plan, point):
    return sum(v * (i + 1 + plan) for i, v in enumerate(point.values()))


class ChartLookup:
    params = [[2, 3], [10, 40]]
    param_names = ["dims", "k"]

    def setup(self, dims, k):
        if dims == 3 and k == 40:
            k = 20                                   # 8000 regions are enough to show the lookup is O(1)
        ranges = [("sel", 0.0, 1.0), ("rate", 0.0, 1000.0), ("rate:2", 0.0, 1000.0)][:dims]
        self.chart = om.Chart(ranges, k, [0, 1, 2], _cost)
        rng = np.random.default_rng(0)
        self.points = [tuple(float(rng.uniform(lo - 0.1 * (hi - lo), hi * 1.1)) for _, lo, hi in ranges)
                       for _ in range(1000)]

    def time_lookup_1000(self, dims, k):
        lookup = self.chart.lookup
        for p in self.points:
            lookup(*p)


class ChartBuild:
    params = [10, 40]
    param_names = ["k"]

    def _cost(self, plan, point):
        node = om.chain_plan(plan.split(">"), {"a": point["sel"], "b": 0.5}, {"a": 1e-7, "b": 1e-6})
        return om.cost_plan(node, {"S": point["rate"]}, 1.0).utility(0.4, 0.6)

    def time_sel_lambda_chart(self, k):
        om.sel_lambda_chart((0.0, 1.0), (10.0, 10_000.0), k, ["a>b", "b>a"], self._cost)
