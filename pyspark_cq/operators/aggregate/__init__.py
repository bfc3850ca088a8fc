"""Split-based sliding-window aggregation: :func:`sliding_aggregate` (PIPES, Algorithm 1).

``driver`` (the public function: the Spark plan), ``spec`` (the ``aggs`` spec, key transport), ``config``
(what the workers share: :class:`~.config.AggConfig`, the sliced-row layout, the parameters in effect),
``slicer`` (the map side), ``shard`` (one shard's stateful step), ``finish`` (the output columns),
``transport`` (the stateful stage's Spark functions per transport), ``tws`` (the ``transformWithState`` home).
"""
from ..._lazy import moved_names
from .driver import sliding_aggregate

__all__ = ["sliding_aggregate"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.aggregate
