"""The names every layer shares: which operators exist and what they read and report.

A neutral layer below ``control``, ``operators``, ``policies``, ``runtime`` and ``lang`` (docs/architecture.md,
"Layers"): it imports nothing of the package but itself and never loads PySpark, so Spark workers, policies and
tools can all import it.

- :mod:`pyspark_cq.vocabulary.operators`: one descriptor per operator kind (its control parameters, native
  module, worker module, metrics), registered in one place;
- :mod:`pyspark_cq.vocabulary.metrics`: the names of the metrics operators report, with the builders and
  parsers of per-input and per-step counters.
"""

__all__: list[str] = []   # the submodules are the API: vocabulary.operators, vocabulary.metrics
