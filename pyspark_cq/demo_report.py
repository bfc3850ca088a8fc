"""Deprecated: the demo's report moved to :mod:`pyspark_cq.demo.report` (import it from there)."""
import warnings

from .demo import report as _moved

__all__ = _moved.__all__

warnings.warn("pyspark_cq.demo_report is deprecated: import from pyspark_cq.demo.report", DeprecationWarning,
              stacklevel=2)


def __getattr__(name: str):
    return getattr(_moved, name)
