"""The PIPES resource manager (Cammert et al., §4.3) over 5,000 queries (goal: one re-plan <= 100 ms).

The workload is the §5.4 one (Table 3 plans, 50 streams of 2–600 elements/min; see
``pyspark_cq/experiments/pipes_workload.py``). ``setup_cache`` installs the 5,000 queries and runs the first
re-plans at two memory bounds, which evaluates the PIPES cost model of every query at the knots the
strategy uses (the cold start, minutes; not timed). The timed re-plans then alternate between the two
bounds, so each one searches anew:

- ``time_replan``: the strategy alone (step 1 over the granularity levels, step 2 bisection), i.e.
  ``PipesResourceManager.replan()``;
- ``time_decide``: what a policy round costs: sync with a 5,000-query snapshot, re-plan, and the
  decisions (one per query whose window / granularity changes);
- ``time_admit``: admission control of one new query (its cost-model evaluations and a re-plan).
"""
import numpy as np
from pyspark_cq_plugins.pipes_rm import PipesResourceManager

from pyspark_cq.experiments import pipes_workload as W
from pyspark_cq.policies import Snapshot

QUERIES = 5000


def _build():
    rng = np.random.default_rng(0)
    sources = W.make_sources(rng)
    rm = PipesResourceManager(reserve=0.1)
    for s, d in sources.items():
        rm.set_distance(s, d)
    queries = W.make_queries(rng, QUERIES, sources)
    for q in queries:
        rm.add(q)
    rows = rm._planned_rows()
    low, high = rm._totals(rm.p, 0.0, rows)[0], rm._totals(0, 1.0, rows)[0]
    budgets = [(low + share * (high - low)) / 0.9 for share in (0.35, 0.30)]
    for b in budgets:                      # cold start: evaluate and cache what both re-plans need
        rm.set_budget(memory=b)
        rm.replan()
    snapshots = [Snapshot(0.0, {q.name: q for q in queries}, memory_budget=b) for b in budgets]
    newcomers = W.make_queries(rng, 200, sources, prefix="new")
    return rm, budgets, snapshots, newcomers


class ResourceManager5000:
    timeout = 3600
    number = 1
    repeat = 20
    warmup_time = 0

    def setup_cache(self):
        return _build()

    def setup(self, cache):
        self.rm, self.budgets, self.snapshots, self.newcomers = cache
        self.turn = 0

    def time_replan(self, cache):
        self.turn ^= 1
        self.rm.set_budget(memory=self.budgets[self.turn])
        self.rm.replan()

    def time_decide(self, cache):
        self.turn ^= 1
        self.rm.decide(self.snapshots[self.turn])

    def time_admit(self, cache):
        self.rm.admit_query(self.newcomers[self.turn])
        self.turn += 1

    def track_replan_queries(self, cache):
        return self.rm.replan().queries

    track_replan_queries.unit = "queries"
