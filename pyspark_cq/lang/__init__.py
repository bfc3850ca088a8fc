"""CQL, the continuous query language of STREAM (Motwani et al., §2), with PIPES / RTStream QoS clauses.

``parse`` (text -> syntax tree), ``to_text`` (tree -> text) and the errors are pure Python; the compiler
(:mod:`pyspark_cq.lang.compiler`: ``cql``, ``compile_cql``, ``explain``) loads Spark when first used.
See docs/cql.md.
"""
from __future__ import annotations

import importlib

from .parser import CQLSyntaxError, parse, parse_expression
from .printer import to_text

__all__ = ["parse", "parse_expression", "to_text", "CQLSyntaxError", "CQLCompileError", "cql", "compile_cql",
           "explain", "CompiledQuery"]

_LAZY = {"CQLCompileError": ".errors", "cql": ".compiler", "compile_cql": ".compiler", "explain": ".compiler",
         "CompiledQuery": ".compiler"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pyspark_cq.lang' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
