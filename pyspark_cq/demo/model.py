"""The demo's two queries as the resource manager sees them: their plans, QoS ranges, cost profile and the
cost-model estimates the report draws (pure: no Spark).
"""
from __future__ import annotations

import math

__all__ = ["plans", "qos", "cost_profile", "estimate"]

S = 1_000_000  # µs per second
WATERMARK = "2 seconds"
TRIGGER = "2 seconds"
LOWER = -1 * S                      # responses may be stamped up to 1 s before their request (clock skew)
UPPER_QOS = ("2 seconds", "30 seconds")
WINDOW_QOS = ("10 seconds", "60 seconds")
GRANULARITY_CHOICES = ("10 seconds", "5 seconds", "2 seconds", "1 second")
SLIDE = "10 seconds"
#: Bytes per element / per aggregate the cost model assumes, measured in runs of this demo: the join keeps
#: ~22.5 B per row of this schema in its serialized, zstd-compressed state (``state_bytes / state_rows``,
#: median; 21.8–23.9 B from the 10th to the 90th percentile of batches, join state format 3), the
#: aggregation ~6 B per slice (5.6–6.7 B; docs/demo.md).
ELEMENT_BYTES, AGGREGATE_BYTES = 22.5, 6.0


def plans(upper: float, window: float, granularity: float, hosts: int, *, unit: float = 1.0, labels: bool = True,
          lower: float = LOWER):
    """The plans of the two queries (PIPES algebra, :mod:`pyspark_cq.plan`), sizes in µs / ``unit``.

    ``pairs``: σ[¼](scans) ω[upper] ⋈ σ[¼](scans) ω[−lower]; ``traffic``:
    γ[hosts](Γ[granularity](ω[window](packets))). The join's two inputs are two filters of one packet stream,
    which Spark scans once per branch and reports as one source with the rows of both scans: the join's
    plan source ``scans`` is that doubled stream, of which requests and responses are a quarter each. With
    ``labels`` the adjustable nodes carry the control labels ``join1.upper``, ``agg1.window``,
    ``agg1.granularity``.
    """
    from pyspark_cq import plan as P

    def lab(text):
        return text if labels else None

    side = P.Select(P.Source("scans"), 0.25)
    pairs = P.Join(P.Window(side, upper / unit, label=lab("join1.upper")), P.Window(side, -lower / unit),
                   selectivity=1e-4)
    traffic = P.Aggregate(P.Granularity(P.Window(P.Source("packets"), window / unit, label=lab("agg1.window")),
                                        granularity / unit, label=lab("agg1.granularity")), groups=hosts)
    return pairs, traffic


def qos():
    """QoS ranges (PIPES §4.3) of the adjustable parameters, by label."""
    from pyspark_cq.policies import QoSRange

    return ({"join1.upper": QoSRange.window(*UPPER_QOS, step="1 second")},
            {"agg1.window": QoSRange.window(*WINDOW_QOS, step="10 seconds"),
             "agg1.granularity": QoSRange.granularity(GRANULARITY_CHOICES[0], GRANULARITY_CHOICES[-1],
                                                      choices=GRANULARITY_CHOICES)})


def cost_profile():
    """The cost profile of the resource manager and of the estimates in the report."""
    from pyspark_cq.cost.pipes import CostProfile

    return CostProfile(element_size=ELEMENT_BYTES, aggregate_size=AGGREGATE_BYTES)


def estimate(d_scans: float, d_packets: float, upper: float, window: float, granularity: float,
             hosts: int, retention: dict | None = None) -> dict:
    """Cost-model estimates at the given control values (µs) and the measured distances d (seconds) of the
    join's source (``scans``, both branches) and the aggregation's (``packets``).

    ``retention`` maps a query (``pairs``, ``traffic``) to its measured ``(watermark_delay, batch_span)``
    in seconds (None: 0); every window is then costed as window + δ + B, as the resource manager does with
    ``retention=True`` (:func:`pyspark_cq.cost.pipes.watermark_retention`).

    Returns the memory in bytes of each query (:func:`pyspark_cq.cost.pipes.cost_from_distances`, in
    milliseconds as the resource manager costs it) and the state rows by
    :func:`pyspark_cq.cost.pipes.join_state_rows` / :func:`~pyspark_cq.cost.pipes.aggregation_state_rows`.
    """
    from pyspark_cq.cost import pipes as C

    out = {}
    unit = 1000.0   # ms, the resource manager's time unit

    def extra(q):   # (δ, B) of query q in ms
        delay, span = (retention or {}).get(q) or (None, None)
        return tuple(0.0 if v is None or not math.isfinite(v) else v * S / unit for v in (delay, span))

    profile = cost_profile()
    if d_scans is not None and math.isfinite(d_scans) and d_scans > 0:
        d = d_scans * unit
        delay, span = extra("pairs")
        kept = C.watermark_retention(upper / unit, delay, span) * unit
        pairs, _ = plans(kept, window, granularity, hosts, unit=unit, labels=False,
                         lower=-C.watermark_retention(-LOWER / unit, delay, span) * unit)
        left, right = C.join_state_rows(C.SC(4 * d, 1.0, 1.0), C.SC(4 * d, 1.0, 1.0),
                                        left_window=upper / unit, right_window=-LOWER / unit,
                                        watermark_delay=delay, batch_span=span)
        out.update(join_bytes=C.cost_from_distances(pairs, {"scans": d}, profile)[0], join_rows=left + right)
    if d_packets is not None and math.isfinite(d_packets) and d_packets > 0:
        d = d_packets * unit
        delay, span = extra("traffic")
        _, traffic = plans(upper, C.watermark_retention(window / unit, delay, span) * unit, granularity, hosts,
                           unit=unit, labels=False)
        out.update(agg_bytes=C.cost_from_distances(traffic, {"packets": d}, profile)[0],
                   agg_rows=C.aggregation_state_rows(C.SC(d, 1.0, 1.0), window=window / unit,
                                                     granularity=granularity / unit, groups=hosts,
                                                     watermark_delay=delay, batch_span=span))
    return out
