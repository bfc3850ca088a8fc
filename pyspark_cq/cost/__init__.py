"""pyspark_cq.cost (see docs/architecture.md)."""
