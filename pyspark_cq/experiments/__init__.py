"""The papers' experiment workloads and oracles, shared by the benchmarks (``benchmarks/experiments``) and the
tests; nothing in the runtime imports them.

- :mod:`.pipes_workload`: PIPES §5.4's generated queries and rates;
- :mod:`.pipes_join`: PIPES §5.1/§5.3's streams, the exact window-join oracle and the Spark run;
- :mod:`.recovery`: the crash-recovery comparison of a sink with an uninterrupted run.
"""

__all__: list[str] = []
