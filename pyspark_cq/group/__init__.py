"""Query groups: many continuous queries over the same sources as one Spark streaming query (docs/groups.md)."""
from __future__ import annotations

from .api import QueryGroup

__all__ = ["QueryGroup"]
