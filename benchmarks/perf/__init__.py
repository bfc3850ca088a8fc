"""Side-by-sides against Spark's built-in operators, and profiles of ours (``python -m benchmarks.perf.<name>``)."""
