"""Cost models of continuous queries, one module per paper (pure: no Spark, no runtime).

==================  ==========================================================================
module              paper and what it estimates
==================  ==========================================================================
`pipes`             Cammert, Krämer, Seeger & Vaupel (PIPES), §3: stream characteristics (d, l, g),
                    output characteristics (Cost Formulas 1–8), memory and processing costs
                    (9)–(19), bottom-up plan costing, adaptation delays (§4.2)
`rate`              Viglas & Naughton: output rates of π, σ, ⋈ (§3, Equation 2), join arrival
                    costs (Table 3), outputs by time (Equation 3), local rate maximization and
                    local time minimization (§4.2)
`om`                Kulkarni & Ravishankar (OM): per-operator output rate and memory (§4.1), plan
                    C_r and C_m, utility ``w_r/C_r + w_m·C_m`` (§3.2)
`rtstream`          Wei, Prasad, Son & Stankovic (RTStream): execution time (eq. 1, Fig. 5),
                    remaining time (eq. 2), kept fraction ε = D/T (§4.4)
`chain`             Motwani et al. (STREAM) §5.3: Chain scheduling's progress chart and priorities
`stream_precision`  Motwani et al. (STREAM) §5.1: precision (FP, FN) propagated bottom-up through a
                    plan, memory per setting (PIPES eq. 9), allocation of a memory bound for F1
`groups`            PIPES §4.1.1, §4.3, §5.4 for query groups: state per slice class (eq. 15 at the
                    class's widest window), admission under a memory bound, window re-plans
==================  ==========================================================================

Plans come from :mod:`pyspark_cq.plan`; statistics from :mod:`pyspark_cq.estimators`.
See ``docs/cost-model.md`` for the formulas and the reconstructions of garbled ones.
"""
from . import chain, groups, om, pipes, rate, rtstream, stream_precision
from .pipes import CostProfile, StreamCharacteristics

__all__ = ["chain", "groups", "om", "pipes", "rate", "rtstream", "stream_precision", "StreamCharacteristics",
           "CostProfile"]
