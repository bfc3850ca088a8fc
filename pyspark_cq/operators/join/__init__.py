"""Interval and window stream-stream joins: :func:`interval_join`, :func:`window_join`.

``driver`` (the public functions: the Spark plan), ``spec`` (argument checks, :class:`~.spec.JoinSpec`),
``worker`` (what runs on Spark's Python workers), ``bucket`` (the time-bucket state layout).
"""
from ..._lazy import moved_names
from .driver import interval_join, window_join

__all__ = ["interval_join", "window_join"]

# the names of the former module pyspark_cq.operators.join (state_watermarks was documented there)
__getattr__ = moved_names(__name__, ".driver", ".worker")
