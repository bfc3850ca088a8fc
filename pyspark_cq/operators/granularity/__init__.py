"""Granularity operator Γ (PIPES, §2.4.3): :func:`granularity`.

``driver`` (the public function), ``worker`` (the rounding on Spark's Python workers).
"""
from ..._lazy import moved_names
from .driver import granularity

__all__ = ["granularity"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.granularity
