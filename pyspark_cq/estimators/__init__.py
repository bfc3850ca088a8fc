"""Online estimators of stream statistics (leaf modules: numpy, and Numba for batch updates).

==========================  =====================================================================
estimator                   what it estimates (paper)
==========================  =====================================================================
`DecayedMean`               decay-weighted mean of the last d observations (OM §4.3)
`ExponentialSmoothing`      single exponential smoothing (RTStream §4.1.3; PIPES §3.2.2)
`ArrivalRate`               arrival rate λ = 1/d from timestamps (PIPES §3.2.2); mergeable
`MeanDistance`              PIPES's mean distance d from timestamps; mergeable
`SampledSelectivity`        selectivity on a simple random sample without replacement, with its
                            standard error (RTStream §4.2); mergeable at equal sampling fractions
`JoinSelectivityHistogram`  equi-join selectivity from key histograms (OM §4.3); mergeable
==========================  =====================================================================

All share one interface: ``update(x)``, ``update_many(array)`` (a Numba kernel, compiled on first use
and cached), ``value``, ``n``, ``clone()``; mergeable ones support ``merge`` / ``+`` / ``+=``; all pickle.
"""
from ._base import Estimator, Mergeable
from .arrival import ArrivalRate, MeanDistance
from .histogram import JoinSelectivityHistogram
from .sampling import SampledSelectivity, sample_mask
from .smoothing import DecayedMean, ExponentialSmoothing

__all__ = [
    "Estimator", "Mergeable",
    "DecayedMean", "ExponentialSmoothing",
    "ArrivalRate", "MeanDistance",
    "SampledSelectivity", "sample_mask",
    "JoinSelectivityHistogram",
]
