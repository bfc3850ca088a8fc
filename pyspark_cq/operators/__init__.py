"""Spark-facing operators, one package per operator (its public functions in ``driver``, what runs on Spark's
Python workers in ``worker``), plus ``_common`` for what several share. Each is described by one
:class:`~pyspark_cq.vocabulary.operators.OperatorDescriptor` (docs/architecture.md, "An operator's package").
"""
from .aggregate import sliding_aggregate
from .granularity import granularity
from .join import interval_join, window_join
from .window import window

__all__ = ["granularity", "interval_join", "sliding_aggregate", "window", "window_join"]
