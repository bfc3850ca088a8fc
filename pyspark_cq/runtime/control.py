"""Deprecated: the control table moved to :mod:`pyspark_cq.control` (import it from there)."""
import warnings

from ..control import *  # noqa: F403 - the alias re-exports the whole module
from ..control import __all__  # noqa: F401

warnings.warn("pyspark_cq.runtime.control is deprecated: import from pyspark_cq.control", DeprecationWarning,
              stacklevel=2)
