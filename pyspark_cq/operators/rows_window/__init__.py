"""Tuple-based windows on streams (CQL's ``[ROWS n]``): :func:`rows_window`, :func:`rows_aggregate`.

``driver`` (the public functions: checks, the Spark plan), ``worker`` (the stateful steps on Spark's Python
workers).
"""
from ..._lazy import moved_names
from .driver import AT, SIGN, rows_aggregate, rows_window

__all__ = ["rows_window", "rows_aggregate", "SIGN", "AT"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.rows_window
