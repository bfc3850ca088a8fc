"""Deadline order of periodic queries on Spark's FAIR scheduler (RTStream's EDF, Wei et al., §4.3).

Wei, Prasad, Son & Stankovic order the instances of periodic queries by earliest deadline first. Spark
cannot order jobs by deadline, but its FAIR scheduler has one strict priority: a pool that runs fewer tasks
than its ``minShare`` is *needy* and gets every free core before any pool that is not
(``FairSchedulingAlgorithm.comparator``). Among needy pools, or among pools that are not, a pool with no
task running always comes first, so pools give exactly **two** priority levels, not more.

pyspark-cq's pools (written to an allocation file by :func:`allocation_file`, used by
``pyspark_cq.spark(..., edf=True)``):

- ``pyspark_cq_urgent``: ``minShare`` above any cluster's cores, so always needy; FIFO inside;
- ``pyspark_cq_periodic``: every other periodic query, fair shares inside.

:func:`deadline_pools` puts the periodic queries with the smallest relative deadline D into the urgent pool.
Spark fires every processing-time trigger of period P at the multiples of P since the epoch, so periodic
queries of one period are released together; their instances' absolute deadlines are then ordered as their
D, and earliest deadline first is this fixed, deadline-monotonic order. With more than two deadlines the
order has two levels (the tightest, the rest); with different periods it is deadline-monotonic, not EDF.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

# the pools themselves are a session setting (pyspark_cq.spark(edf=True)); the runtime assigns queries to them
from ..session.pools import PERIODIC_POOL, URGENT_POOL, allocation_file, has_pools

__all__ = ["URGENT_POOL", "PERIODIC_POOL", "deadline_pools", "allocation_file", "has_pools"]


def deadline_pools(deadlines: Mapping[str, float]) -> dict[str, str]:
    """The scheduler pool of every periodic query: the ones with the smallest relative deadline go first.

    Parameters
    ----------
    deadlines : mapping str -> float
        Every periodic query's relative deadline D in seconds (> 0).

    Returns
    -------
    dict str -> str
        :data:`URGENT_POOL` for the queries whose D is the smallest, :data:`PERIODIC_POOL` for the others.

    Examples
    --------
    >>> from pyspark_cq.runtime.pools import deadline_pools
    >>> deadline_pools({"alerts": 1.5, "report": 2.8, "fraud": 1.5})
    {'alerts': 'pyspark_cq_urgent', 'report': 'pyspark_cq_periodic', 'fraud': 'pyspark_cq_urgent'}
    """
    if not isinstance(deadlines, Mapping):
        raise TypeError(f"deadlines must be a mapping query -> relative deadline (s), got {deadlines!r}")
    for name, d in deadlines.items():
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d <= 0:
            raise ValueError(f"deadlines[{name!r}] must be a positive number of seconds, got {d!r}")
    if not deadlines:
        return {}
    tightest = min(deadlines.values())
    return {name: URGENT_POOL if d <= tightest else PERIODIC_POOL for name, d in deadlines.items()}
