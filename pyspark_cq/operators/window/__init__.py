"""Window operator ω (PIPES, §2.4.2): :func:`window` (Spark SQL only, no Python worker)."""
from ..._lazy import moved_names
from .driver import window

__all__ = ["window"]

__getattr__ = moved_names(__name__, ".driver")   # the names of the former module pyspark_cq.operators.window
