"""CQL, the continuous query language of STREAM (Motwani et al., §2), with PIPES / RTStream QoS clauses.

``parse`` (text -> syntax tree), ``to_text`` (tree -> text) and the errors are pure Python; the compiler
(:mod:`pyspark_cq.lang.compiler`: ``cql``, ``compile_cql``, ``explain``) loads Spark when first used.
See docs/cql.md.
"""
from __future__ import annotations

from .._lazy import lazy_exports
from .parser import CQLSyntaxError, parse, parse_expression
from .printer import to_text

__all__ = ["parse", "parse_expression", "to_text", "CQLSyntaxError", "CQLCompileError", "cql", "compile_cql",
           "explain", "CompiledQuery"]

_LAZY = {"CQLCompileError": ".errors", "cql": ".compiler", "compile_cql": ".compiler", "explain": ".compiler",
         "CompiledQuery": ".compiler"}


__getattr__ = lazy_exports(__name__, _LAZY)
