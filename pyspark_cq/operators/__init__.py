"""Spark-facing operators: Γ (granularity), ω (window), interval join, sliding aggregation."""
from .aggregate import sliding_aggregate
from .granularity import granularity
from .join import interval_join, window_join
from .window import window

__all__ = ["granularity", "interval_join", "sliding_aggregate", "window", "window_join"]
