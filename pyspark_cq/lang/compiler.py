"""Compile CQL (Motwani et al., STREAM, §2) to the logical plan (:mod:`pyspark_cq.plan`) and to Spark DataFrames
built from pyspark-cq's operators.

Two stages, two modules. :func:`analyze` (:mod:`pyspark_cq.lang.analysis`) is pure: it classifies the
query, resolves its columns (given the sources' column names), and builds the logical plan, the QoS ranges and
the operator ids the runtime's policies read. :func:`compile_cql` (:mod:`pyspark_cq.lang.builder`) then builds
the DataFrame: a windowed GROUP BY becomes
:func:`~pyspark_cq.sliding_aggregate`, a join of two windowed streams :func:`~pyspark_cq.window_join`, of
three to six :func:`~pyspark_cq.multi_join`, ``[ROWS n]`` / ``[PARTITION BY … ROWS n]``
:func:`~pyspark_cq.rows_window`, ``SAMPLE(p)`` the shedding stage. The relation-to-stream operators follow
§2.4 and are exact (docs/cql.md, "Semantics"); what has no exact translation is a
:class:`~pyspark_cq.lang.CQLCompileError` naming the construct, never a query with another meaning.

Every output stream ends with the column ``cq_at``: the CQL timestamp of each output tuple (the instant
it is inserted into, for DSTREAM deleted from, the relation; for RSTREAM the instant of the relation).

This module is the public path of both (``pyspark_cq.lang.compiler.cql``, docs/cql.md).
"""
from __future__ import annotations

from .analysis import AT, DEFAULT_GROUPS, DEFAULT_SELECTIVITY, Analysis, analyze, explain
from .builder import CompiledQuery, compile_cql, cql

__all__ = ["cql", "compile_cql", "analyze", "explain", "CompiledQuery", "Analysis", "AT",
           "DEFAULT_SELECTIVITY", "DEFAULT_GROUPS"]
