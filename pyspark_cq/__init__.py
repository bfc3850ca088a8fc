"""pyspark-cq: continuous-query operators, cost models and an adaptive runtime for Spark Structured Streaming.

Public API (functions first, so they compose with ``DataFrame.transform``)::

    import pyspark_cq as cq
    spark = cq.spark()                                   # a configured SparkSession
    coarse = cq.granularity(df, "start", "end", "1 second")
"""
from ._duration import parse_duration
from ._native import NativeBuildError, check_build
from .operators import granularity
from .operators._report import read as read_metrics
from .session import find_java, spark

__version__ = "0.1.0"

__all__ = [
    "NativeBuildError",
    "check_build",
    "find_java",
    "granularity",
    "parse_duration",
    "read_metrics",
    "spark",
    "__version__",
]
