"""Deprecated: the ``run`` and ``explain`` commands moved to :mod:`pyspark_cq.cli.cql` (import them from there)."""
import warnings

from ..cli.cql import *  # noqa: F403 - the alias re-exports the whole module
from ..cli.cql import __all__  # noqa: F401

warnings.warn("pyspark_cq.lang.cli is deprecated: import from pyspark_cq.cli.cql", DeprecationWarning, stacklevel=2)
