"""RTStream's *fixed sampling* (Wei, Prasad, Son & Stankovic, §4.2 and §5.2.3) as a policy.

The prediction-based policy (:class:`~pyspark_cq_plugins.rtstream.RTStreamQoS`) whose selectivities and
costs per row come from a **sampler plan**: every instance first runs the query's predicates over a fixed
sample (``sample_ratio`` = 10 %, §5.2 Table 2) of its whole input, before shedding, and the policy profiles
from that sample (``select_chain``'s ``sample_*`` metrics). The sampler's time is part of every instance (the
overhead §5.2.3 reports, up to 10 % of the CPU) and is predicted as such: it is not reduced by shedding.
"""
from __future__ import annotations

from pyspark_cq.policies import QueryInfo

from .rtstream import Profile, RTStreamQoS

__all__ = ["FixedSampling"]


class FixedSampling(RTStreamQoS):
    """Prediction-based QoS profiled from a sampler plan at a fixed ratio (§5.2.3's "fixed sampling").

    Parameters
    ----------
    sample_ratio : float
        The sample of every instance's input the sampler plan runs on, in (0, 1] (the paper's 10 %).
    **kwargs
        :class:`~pyspark_cq_plugins.rtstream.RTStreamQoS`'s parameters.
    """

    name = "rtstream_fixed_sampling"

    def __init__(self, sample_ratio: float = 0.1, **kwargs):
        if isinstance(sample_ratio, bool) or not isinstance(sample_ratio, (int, float)) or not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio!r}")
        super().__init__(**kwargs)
        self.sample_ratio = float(sample_ratio)

    @classmethod
    def _unit_test_params(cls) -> list[dict]:
        return [{}, {"sample_ratio": 0.2, "capacity": 1.0}]

    def sampler(self, query: QueryInfo, profile: Profile):
        """The fixed ratio, for every predicate."""
        return self.sample_ratio
