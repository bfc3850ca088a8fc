"""Selection predicates evaluated in an order chosen while the query runs: :func:`select_chain`.

``driver`` (the public function: checks, the Spark plan), ``worker`` (the chain on Spark's Python workers).
"""
from ..._lazy import moved_names
from .driver import DEFAULT_NAME, SAMPLE, sample_ratios, select_chain

__all__ = ["select_chain", "DEFAULT_NAME", "sample_ratios", "SAMPLE"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.select_chain
