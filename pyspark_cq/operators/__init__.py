"""Spark-facing operators: Γ (granularity), ω (window), interval join, sliding aggregation."""
from .granularity import granularity

__all__ = ["granularity"]
