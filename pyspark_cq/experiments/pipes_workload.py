"""Random continuous queries as in the PIPES scalability experiment (Cammert et al., §5.4, Table 3).

"The query workload was randomly composed of the plans shown in Table 3 including aggregation,
nested-loops (33% of all joins) and hash joins (67%). Join selectivities were chosen between 0.005 to
0.02. In addition, we uniformly picked QoS constraints for the window sizes with range from 1 to 30
minutes, and for the granularities with range from 1 to 10000 milliseconds. We used 50 synthetic data
streams with Poisson-distributed stream arrival rates between 2 and 600 elements per minute."

=====================================================  ==========
Table 3 plan type                                      share
=====================================================  ==========
ω(S1) ⋈ ω(S2)                                          30 %
(ω(S1) ⋈ ω(S2)) ⋈ ω(S3)                                20 %
((ω(S1) ⋈ ω(S2)) ⋈ ω(S3)) ⋈ ω(S4)                      10 %
(ω(S1) ⋈ ω(S2)) ⋈ (ω(S3) ⋈ ω(S4))                      10 %
α(Γ(ω(S)))                                             10 %
α(Γ(ω(S1))) ⋈ ω(S2)                                    10 %
α(Γ(ω(S1))) ⋈ α(Γ(ω(S2)))                              10 %
=====================================================  ==========

One deviation: the PIPES cost model requires equal granularities at a join's inputs (§3.3.2, "achieved
by applying the granularity operator to all inputs"), so in the plan α(Γ(ω(S1))) ⋈ ω(S2) the right input
also passes Γ with the query's granularity. Every query has one window parameter (all its ω share it,
``"<query>-w.window"``) and, with aggregation, one granularity parameter (``"<query>-g.granularity"``).
Plan sizes are in µs.
"""
from __future__ import annotations

import numpy as np

from pyspark_cq import plan as P
from pyspark_cq.policies import QoSRange, QueryInfo, SourceStats, label

__all__ = ["PLAN_TYPES", "make_sources", "make_query", "make_queries"]

_S, _MS, _MIN = 1_000_000, 1_000, 60_000_000

#: Table 3: (name, share, number of sources).
PLAN_TYPES = (
    ("join2", 0.30, 2), ("join3", 0.20, 3), ("join4_left_deep", 0.10, 4), ("join4_bushy", 0.10, 4),
    ("aggregate", 0.10, 1), ("aggregate_join", 0.10, 2), ("aggregate_join_aggregate", 0.10, 2),
)


def make_sources(rng: np.random.Generator, count: int = 50, low_per_minute: float = 2.0,
                 high_per_minute: float = 600.0) -> dict[str, float]:
    """``count`` source streams with rates uniform in [low, high] elements per minute; name -> d (seconds)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    if not (isinstance(count, int) and count >= 4):
        raise ValueError(f"count must be an int >= 4 (plans read up to 4 streams), got {count!r}")
    rates = rng.uniform(low_per_minute, high_per_minute, count)
    return {f"S{i:02d}": 60.0 / float(r) for i, r in enumerate(rates)}


def make_query(rng: np.random.Generator, name: str, sources: dict[str, float], kind: str | None = None) -> QueryInfo:
    """One random query of Table 3 over ``sources`` (name -> d in seconds), as a :class:`QueryInfo`."""
    if kind is None:
        names, shares = zip(*[(n, s) for n, s, _ in PLAN_TYPES])
        kind = str(rng.choice(names, p=np.asarray(shares) / sum(shares)))
    arity = {n: k for n, _, k in PLAN_TYPES}
    if kind not in arity:
        raise ValueError(f"kind must be one of {sorted(arity)}, got {kind!r}")
    streams = [str(s) for s in rng.choice(sorted(sources), size=arity[kind], replace=False)]
    wl, gl = label(f"{name}-w", "window"), label(f"{name}-g", "granularity")
    w_lo, w_hi = sorted(rng.uniform(1, 30, 2) * _MIN)
    g_fine, g_coarse = sorted(rng.uniform(1, 10_000, 2) * _MS)
    w0 = int(w_hi)
    g0 = int(round(g_fine / _MS)) * _MS or _MS

    def win(i):
        return P.Window(P.Source(streams[i]), w0, label=wl)

    def join(a, b):
        method = "nested_loops" if rng.random() < 1 / 3 else "hash"
        return P.Join(a, b, selectivity=float(rng.uniform(0.005, 0.02)), method=method)

    def agg(node):
        return P.Aggregate(P.Granularity(node, g0, label=gl))

    if kind == "join2":
        plan = join(win(0), win(1))
    elif kind == "join3":
        plan = join(join(win(0), win(1)), win(2))
    elif kind == "join4_left_deep":
        plan = join(join(join(win(0), win(1)), win(2)), win(3))
    elif kind == "join4_bushy":
        plan = join(join(win(0), win(1)), join(win(2), win(3)))
    elif kind == "aggregate":
        plan = agg(win(0))
    elif kind == "aggregate_join":
        plan = join(agg(win(0)), P.Granularity(win(1), g0, label=gl))
    else:
        plan = join(agg(win(0)), agg(win(1)))
    qos = {wl: QoSRange.window(int(w_lo), int(w_hi), step=_MS)}
    if kind.startswith("aggregate"):
        fine = int(round(g_fine / _MS)) * _MS or _MS
        coarse = max(int(round(g_coarse / _MS)) * _MS, fine)
        qos[gl] = QoSRange.granularity(coarse, fine)
    stats = {s: SourceStats(s, 1.0 / sources[s], sources[s]) for s in streams}
    return QueryInfo(name, plan, qos, stats)


def make_queries(rng: np.random.Generator, count: int, sources: dict[str, float], *, prefix: str = "q",
                 start: int = 0) -> list[QueryInfo]:
    """``count`` random queries named ``<prefix><start>``, ``<prefix><start+1>`` and so on."""
    return [make_query(rng, f"{prefix}{i}", sources) for i in range(start, start + count)]
