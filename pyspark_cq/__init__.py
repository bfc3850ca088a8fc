"""pyspark-cq: continuous-query operators, cost models and an adaptive runtime for Spark Structured Streaming.

Public API (functions first, so they compose with ``DataFrame.transform``)::

    import pyspark_cq as cq
    spark = cq.spark()                                   # a configured SparkSession
    coarse = cq.granularity(df, "start", "end", "1 second")

Names are imported lazily (PEP 562): ``import pyspark_cq.cost`` or ``pyspark_cq.estimators`` does not
load PySpark, so pure modules stay cheap in Spark workers and in tools.
"""
from __future__ import annotations

from ._lazy import lazy_exports
from .vocabulary.operators import OPERATORS

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS = {
    "NativeBuildError": "._native",
    "check_build": "._native",
    "parse_duration": "._duration",
    "clear_unstarted_checkpoint": "._checkpoint",
    "explain_error": "._errors",
    "spark": ".session",
    "find_java": ".session",
    "read_metrics": ".operators._common.metrics",
    "cql": ".lang.compiler",
    "QueryGroup": ".group",
    # cost models, plans and estimators (pure: no Spark)
    "StreamCharacteristics": ".cost.pipes",
    "CostProfile": ".cost.pipes",
    "Query": ".plan",
    "enumerate_plans": ".plan",
    "DecayedMean": ".estimators",
    "ExponentialSmoothing": ".estimators",
    "ArrivalRate": ".estimators",
    "MeanDistance": ".estimators",
    "SampledSelectivity": ".estimators",
    "JoinSelectivityHistogram": ".estimators",
    # adaptive runtime and policies
    "CQRuntime": ".runtime.core",
    "QueryRejected": ".runtime.core",
    "ControlTable": ".control",
    "QoSRange": ".policies",
    "Policy": ".policies",
}
# every registered operator's public function (its kind), from its package: a new operator is one package
# plus one registration (pyspark_cq.vocabulary.operators)
_EXPORTS.update({d.kind: d.package.removeprefix(__name__) for d in OPERATORS.values()})
_ALIASES = {"read_metrics": "read"}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__ = lazy_exports(__name__, _EXPORTS, _ALIASES)


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
