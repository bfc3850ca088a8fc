"""CQL, the continuous query language of STREAM (Motwani et al., §2), with PIPES / RTStream QoS clauses.

``parse`` (text -> syntax tree), ``to_text`` (tree -> text), the errors and the analysis
(:mod:`pyspark_cq.lang.analysis`: plan, QoS, ``explain``) are pure Python; the builder of DataFrames
(:mod:`pyspark_cq.lang.builder`: ``cql``, ``compile_cql``) loads Spark when first used. Both are public under
:mod:`pyspark_cq.lang.compiler`.
See docs/cql.md.
"""
from __future__ import annotations

from .._lazy import lazy_exports
from .parser import CQLSyntaxError, parse, parse_expression
from .printer import to_text

__all__ = ["parse", "parse_expression", "to_text", "CQLSyntaxError", "CQLCompileError", "cql", "compile_cql",
           "explain", "CompiledQuery"]

_LAZY = {"CQLCompileError": ".errors", "cql": ".builder", "compile_cql": ".builder", "explain": ".analysis",
         "CompiledQuery": ".builder"}


__getattr__ = lazy_exports(__name__, _LAZY)
