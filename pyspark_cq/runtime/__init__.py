"""pyspark_cq.runtime (see docs/architecture.md)."""
