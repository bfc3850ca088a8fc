"""Benchmarks of the cost models and the online estimators (asv).

- ``CostJoinOrders``: costing every left-deep (60) and bushy (105) order of a 5-way join with each model.
- ``EstimatorUpdates``: estimator updates per second, batch (Numba kernel) and one at a time; the
  kernels are compiled (or loaded from the cache) in ``setup``.
"""
import itertools

import numpy as np

from pyspark_cq import plan as P
from pyspark_cq.cost import om, pipes, rate, rtstream
from pyspark_cq.estimators import (
    ArrivalRate,
    DecayedMean,
    ExponentialSmoothing,
    JoinSelectivityHistogram,
    SampledSelectivity,
    sample_mask,
)

STREAMS = ("A", "B", "C", "D", "E")
RATES = {"A": 50.0, "B": 500.0, "C": 100.0, "D": 200.0, "E": 1000.0}


def five_way_query():
    """A 5-way join with a predicate between every pair (no Cartesian products), windows on every stream."""
    rng = np.random.default_rng(0)
    joins = {pair: P.JoinPredicate(float(rng.uniform(1e-5, 5e-3)), arrival_cost=float(rng.uniform(1e-4, 1e-3)),
                                   pair_cost=1e-6)
             for pair in itertools.combinations(STREAMS, 2)}
    return P.Query(streams=STREAMS, joins=joins, windows={s: 60.0 for s in STREAMS},
                   selections={"A": [P.Predicate(0.5, cost=1e-5)]})


class CostJoinOrders:
    params = (["left_deep", "bushy"], ["pipes", "om", "rate_local_rate", "rate_local_time", "rtstream"])
    param_names = ["shape", "model"]

    def setup(self, shape, model):
        self.plans = P.enumerate_plans(five_way_query(), shape=shape)
        self.sources = {s: pipes.StreamCharacteristics(1.0 / r, 1.0) for s, r in RATES.items()}
        self.counts = {s: r * 10 for s, r in RATES.items()}
        self.profile = pipes.CostProfile(hash_buckets=1024)
        self.score = {
            "pipes": lambda p: pipes.cost_plan(p, self.sources, profile=self.profile).processing,
            "om": lambda p: om.plan_utility(p, RATES, 1.0, 0.4, 0.6),
            "rate_local_rate": lambda p: -rate.local_rate_estimate(p, RATES, 100.0),
            "rate_local_time": lambda p: rate.local_time_estimate(p, RATES, 1e4),
            "rtstream": lambda p: rtstream.plan_execution_time(p, self.counts),
        }[model]

    def time_cost_all_orders(self, shape, model):
        P.best_plan(self.plans, self.score)


class EnumeratePlans:
    params = ["left_deep", "bushy"]
    param_names = ["shape"]

    def setup(self, shape):
        self.query = five_way_query()

    def time_enumerate(self, shape):
        P.enumerate_plans(self.query, shape=shape)


N = 1_000_000
SCALAR_N = 10_000


def _make(name):
    return {
        "ExponentialSmoothing": lambda: ExponentialSmoothing(alpha=0.1),
        "DecayedMean": lambda: DecayedMean(window=50, decay=0.1),
        "ArrivalRate": ArrivalRate,
        "SampledSelectivity": SampledSelectivity,
        "JoinSelectivityHistogram": lambda: JoinSelectivityHistogram(0, 1_000, 100),
    }[name]()


class EstimatorUpdates:
    """Seconds per N = 10⁶ batch updates, or per 10⁴ single updates."""

    params = ["ExponentialSmoothing", "DecayedMean", "ArrivalRate", "SampledSelectivity", "JoinSelectivityHistogram"]
    param_names = ["estimator"]

    def setup(self, name):
        rng = np.random.default_rng(1)
        self.data = rng.random(N) < 0.3 if name == "SampledSelectivity" else rng.uniform(0, 1_000, N)
        self.scalars = [bool(x) if name == "SampledSelectivity" else float(x) for x in self.data[:SCALAR_N]]
        _make(name).update_many(self.data[:10])  # compile or load the kernel before timing
        self.name = name

    def time_update_many(self, name):
        _make(name).update_many(self.data)

    def time_update(self, name):
        est = _make(name)
        for x in self.scalars:
            est.update(x)


class SampleMask:
    def setup(self):
        sample_mask(100, size=10, rng=0)

    def time_sample_mask_1e6(self):
        sample_mask(N, ratio=0.01, rng=0)
