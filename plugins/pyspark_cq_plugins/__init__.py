"""The policies shipped with pyspark-cq, packaged and registered exactly as a third-party plugin would be.

They live in ``plugins/`` (installed as the top-level package ``pyspark_cq_plugins``) and are registered
under the entry-point group ``pyspark_cq.policies`` in ``pyproject.toml`` (``tests/test_policies.py`` checks
that this table names every one):

=============================  =============================================  ==========================================
name                           class                                          what
=============================  =============================================  ==========================================
``pipes``                      ``pipes_rm.PipesResourceManager``              PIPES resource manager (Cammert et al.,
                                                                              §4): window / granularity adjustment
                                                                              within QoS ranges, admission control
``om``                         ``om.OMPolicy``                                OM (Kulkarni & Ravishankar): each round's
                                                                              plan from the sel-λ / λ-λ chart
``rand``                       ``plan_baselines.RandPolicy``                  OM's RAND baseline (§5.2): a random plan
``static``                     ``plan_baselines.StaticPolicy``                OM's RATE baseline (§5.2): the cheapest
                                                                              plan after a warm-up, never switched
``rate``                       ``rate_based.RateBased``                       rate-based plan switching for select_chain
                                                                              / multi_join (Viglas & Naughton, §4)
``chain``                      ``chain_scheduler.ChainScheduler``             Chain priorities (Babcock et al.; STREAM
                                                                              §5.3) for chunked operator stages
``rtstream``                   ``rtstream.RTStreamQoS``                       prediction-based QoS of periodic queries
                                                                              (Wei et al., §4)
``rtstream_best_effort``       ``rtstream_baselines.BestEffort``              RTStream baseline: no load shedding
                                                                              (§5.2.3)
``rtstream_feedback``          ``rtstream_baselines.FeedbackControl``         RTStream baseline: drop ratio from the
                                                                              last instance's lateness (§5.2.3)
``rtstream_fixed_sampling``    ``rtstream_fixed_sampling.FixedSampling``      QoS profiled from a sampler plan at a
                                                                              fixed ratio (§5.2.3)
``rtstream_dynamic_sampling``  ``rtstream_dynamic_sampling.DynamicSampling``  QoS profiled from a sampler plan with per-
                                                                              operator ratios (§5.1)
``precision``                  ``precision.PrecisionAllocator``               STREAM §5.1: a memory bound allocated
                                                                              across windows and per-input shedding
                                                                              for the best predicted F1
=============================  =============================================  ==========================================

Nothing here is imported by ``pyspark_cq`` itself; the registry loads a plugin on first use.
"""

# The policies are loaded through their entry points (or `import pyspark_cq_plugins.pipes_rm`).
__all__: list[str] = []
