"""Benchmarks of pyspark-cq, run as modules from the repository root (docs/benchmarks.md, "How to run").

``perf`` holds side-by-sides against Spark's built-ins and profiles, ``experiments`` the papers' §5
reproductions; ``harness`` is what every script's ``main`` uses, ``common`` the code several scripts share.
"""
