"""pyspark_cq.policies (see docs/architecture.md)."""
