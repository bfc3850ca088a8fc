"""``pyspark-cq demo``: the main job, an adaptive streaming pipeline on local Spark under a memory budget.

A generated packet stream (:mod:`pyspark_cq.demo.source`: requests and their responses, quiet → burst →
quiet) feeds two continuous queries, both registered with the adaptive runtime
(:class:`pyspark_cq.runtime.CQRuntime`) and the PIPES resource manager (policy ``pipes``, with
``retention=True``: windows costed as window + watermark delay + batch span) under a memory budget:

- ``pairs``: an interval join of requests and responses on the flow id,
  ``response.ts ∈ [request.ts − 1 s, request.ts + upper]`` (operator ``join1``; the resource manager adjusts
  ``upper`` within [2 s, 30 s]); the matched pairs land in Parquet.
- ``traffic``: a sliding aggregation of all packets per host (count, bytes) over windows of ``window``
  sliding by 10 s at time granularity ``granularity`` (operator ``agg1``; ``window`` within [10 s, 60 s],
  ``granularity`` within [10 s, 1 s]); the windows land in Parquet.

During the burst the cost-model estimate at the largest windows exceeds the budget, so the resource manager
shrinks the join bound and the aggregation window and coarsens the granularity; after the burst it grows
them back. A line of progress is printed every few seconds; at the end a summary, the integrity checks
(rows written = rows reported; every malformed row injected is counted by both operators) and a report
(``report.html`` with PNG plots and ``timeseries.json``, :mod:`pyspark_cq.demo.report`).

=========  ===================================================================================
module     what
=========  ===================================================================================
`job`      the arguments, the queries on the runtime, watching them, the summary (:func:`run`)
`model`    the queries' plans, QoS ranges and cost-model estimates (pure)
`source`   the generated packet stream (a Spark Python data source)
`report`   the HTML report with its plots
`group`    ``--group``: five CQL queries over the stream as one query group
=========  ===================================================================================
"""
from __future__ import annotations

from .job import add_arguments, run
from .model import (  # noqa: F401 - the demo's constants, as pyspark_cq.demo has always had them
    AGGREGATE_BYTES,
    ELEMENT_BYTES,
    GRANULARITY_CHOICES,
    LOWER,
    SLIDE,
    TRIGGER,
    UPPER_QOS,
    WATERMARK,
    WINDOW_QOS,
    S,
    cost_profile,
    estimate,
    plans,
    qos,
)

__all__ = ["run", "add_arguments", "plans", "qos", "cost_profile", "estimate"]
