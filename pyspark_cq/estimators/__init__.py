"""pyspark_cq.estimators (see docs/architecture.md)."""
