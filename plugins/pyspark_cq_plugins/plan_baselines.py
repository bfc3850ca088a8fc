"""The baselines OM is compared with (Kulkarni & Ravishankar, §5.2–5.3), as policies.

- ``rand`` (RAND): a random candidate plan every round, from a seeded generator (deterministic per seed).
- ``static`` (the paper's RATE, Viglas & Naughton's static rate-based choice): after ``warmup`` rounds the
  plan of minimum OM cost at the estimates of those rounds, never switched afterwards.

Both share :class:`~pyspark_cq_plugins.om.PlanPolicy` with ``om``: the same candidate plans, estimates,
cost model and hit / switch accounting (:meth:`status`), so their fidelity is measured the same way.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pyspark_cq import _args as chk

from .om import PlanPolicy, _OpState

__all__ = ["RandPolicy", "StaticPolicy"]


class RandPolicy(PlanPolicy):
    """RAND (§5.2): a uniformly random candidate plan each round.

    Parameters
    ----------
    seed : int
        Seed of the generator (a clone starts again from it).
    window, d, decay, w_r, w_m, join_cost, every
        As for :class:`~pyspark_cq_plugins.om.OMPolicy` (they only score the rounds).
    """

    name = "rand"

    def __init__(self, seed: int = 0, window: float = 1.0, d: int = 5, decay: float = 0.5, w_r: float = 0.4,
                 w_m: float = 0.6, join_cost: float = 1e-6, every: int = 1):
        super().__init__(window, d, decay, w_r, w_m, join_cost, every)
        self.seed = chk.integer(seed, "seed", minimum=0)
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"seed": 7, "every": 2}]

    def choose(self, key, state: _OpState, point: Mapping[str, float]) -> str | None:
        """A uniformly random candidate plan."""
        plans = state.model.plans
        return plans[int(self._rng.integers(len(plans)))]


class StaticPolicy(PlanPolicy):
    """RATE (§5.2): the plan of minimum cost at the estimates after ``warmup`` rounds, then never switched.

    Parameters
    ----------
    warmup : int
        Rounds whose observations form the estimate (>= 1).
    window, d, decay, w_r, w_m, join_cost, every, join_model
        As for :class:`~pyspark_cq_plugins.om.OMPolicy`.
    """

    name = "static"

    def __init__(self, warmup: int = 3, window: float = 1.0, d: int = 5, decay: float = 0.5, w_r: float = 0.4,
                 w_m: float = 0.6, join_cost: float = 1e-6, every: int = 1, join_model: str = "mjoin"):
        super().__init__(window, d, decay, w_r, w_m, join_cost, every, join_model)
        self.warmup = chk.integer(warmup, "warmup", minimum=1)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"warmup": 1}]

    def choose(self, key, state: _OpState, point: Mapping[str, float]) -> str | None:
        """The best plan at the estimate once ``warmup`` rounds were seen; that plan from then on."""
        if state.plan is None and state.seen >= self.warmup:
            return state.model.best(point)
        return state.plan
