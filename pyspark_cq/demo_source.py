"""Deprecated: the demo's packet stream moved to :mod:`pyspark_cq.demo.source` (import it from there)."""
import warnings

from .demo import source as _moved

__all__ = _moved.__all__

warnings.warn("pyspark_cq.demo_source is deprecated: import from pyspark_cq.demo.source", DeprecationWarning,
              stacklevel=2)


def __getattr__(name: str):
    return getattr(_moved, name)
