"""A multi-way stream join with a probe order chosen while the query runs (MJoin): :func:`multi_join`.

``driver`` (the public function, :class:`~.driver.MultiJoinSpec`, the Spark plan), ``worker`` (what runs on
Spark's Python workers).
"""
from ..._lazy import moved_names
from .driver import multi_join

__all__ = ["multi_join"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.multi_join
