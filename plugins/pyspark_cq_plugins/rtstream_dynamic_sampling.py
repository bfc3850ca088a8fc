"""RTStream's *dynamic sampling* (Wei, Prasad, Son & Stankovic, §5.1 and §5.2.3) as a policy.

Like fixed sampling (:mod:`pyspark_cq_plugins.rtstream_fixed_sampling`) the prediction-based policy profiles
from a sampler plan, but every operator gets its own sample ratio from its cost (§5.1: "if an operator is
expensive to sample ... its sampling ratio should be small; if an operator is cheap to sample ... its
sampling ratio should be large"). Each of the m predicates gets an equal share of a sampling budget (a
fraction ``budget`` of the chain's predicted time): step j, whose share of equation (1) per input row is
``c_j = t_j·Π_{k<j} s_k``, is sampled at ``r_j = budget·Σc / (m·c_j)``, within [``min_ratio``,
``max_ratio``]. Until a profile exists every step is sampled at ``max_ratio``.
"""
from __future__ import annotations

from pyspark_cq.policies import QueryInfo

from .rtstream import Profile, RTStreamQoS

__all__ = ["DynamicSampling"]


class DynamicSampling(RTStreamQoS):
    """Prediction-based QoS profiled from a sampler plan with per-operator ratios (§5.1's dynamic sampling).

    Parameters
    ----------
    budget : float
        The sampler plan's share of the chain's time, in (0, 1) (§5.2.3 measured ~5 % for dynamic sampling).
    min_ratio, max_ratio : float
        Bounds of every step's sample ratio, 0 < min_ratio <= max_ratio <= 1.
    **kwargs
        :class:`~pyspark_cq_plugins.rtstream.RTStreamQoS`'s parameters.
    """

    name = "rtstream_dynamic_sampling"

    def __init__(self, budget: float = 0.05, min_ratio: float = 0.01, max_ratio: float = 0.2, **kwargs):
        for value, what in ((budget, "budget"), (min_ratio, "min_ratio"), (max_ratio, "max_ratio")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{what} must be in (0, 1], got {value!r}")
        if budget >= 1:
            raise ValueError(f"budget must be in (0, 1), got {budget!r}")
        if min_ratio > max_ratio:
            raise ValueError(f"min_ratio must be <= max_ratio, got {min_ratio!r} > {max_ratio!r}")
        super().__init__(**kwargs)
        self.budget, self.min_ratio, self.max_ratio = float(budget), float(min_ratio), float(max_ratio)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"budget": 0.1, "max_ratio": 0.5, "capacity": 1.0}]

    def sampler(self, query: QueryInfo, profile: Profile):
        """Per step ``budget·Σc / (m·c_j)`` within the bounds (3 decimals), or ``max_ratio`` before a profile."""
        t, s = profile.chain()
        if not t or not any(t):
            return self.max_ratio
        shares, reach = [], 1.0
        for tj, sj in zip(t, s):
            shares.append(tj * reach)
            reach *= sj
        total, m = sum(shares), len(shares)
        steps = [step for step in profile.order if step in profile.steps]
        return {step: round(min(max(self.budget * total / (m * c) if c > 0 else self.max_ratio, self.min_ratio),
                                self.max_ratio), 3)
                for step, c in zip(steps, shares)}
