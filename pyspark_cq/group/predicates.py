"""A query's WHERE evaluated on Arrow batches, for a query that joins a running group with a predicate the running
projection does not compute (its Spark plan is fixed once the group starts).

Only predicates whose Arrow evaluation equals Spark SQL's are taken: comparisons (``= <> != < <= > >=``) of a
column with a literal or a column of the same kind (numbers, strings, booleans), ``AND`` / ``OR`` / ``NOT`` in
three-valued logic (Kleene), ``IS [NOT] NULL``, ``[NOT] IN`` a list of non-null literals, ``[NOT] BETWEEN``.
Anything else (arithmetic, ``LIKE``, functions, timestamps, a string compared with a number) is
:class:`Unsupported`, and such a query must be given before the group starts. A row is kept when the predicate is
true; false and null drop it, as Spark's filter does.

Pure: pyarrow only. The predicate travels to the workers as the (frozen, picklable) CQL AST with its columns
renamed to the projection's (:func:`bind`).
"""
from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from ..lang import ast as A

__all__ = ["Unsupported", "bind", "evaluate", "names_column"]

_COMPARE = {"=": "equal", "<>": "not_equal", "!=": "not_equal", "<": "less", "<=": "less_equal",
            ">": "greater", ">=": "greater_equal"}


def names_column(expr: A.Expr, matches) -> bool:
    """Whether the CQL expression ``expr`` refers to a column for which ``matches(column)`` holds: Spark pushes a
    conjunct of a WHERE below a stream's ``withWatermark`` exactly when it does not name the time column, so the
    group asks this of each (a filtered clock, :func:`~.clock.filtered`).
    """
    from ..lang.analysis import _walk

    return any(isinstance(x, A.Column) and matches(x) for x in _walk(expr))


class Unsupported(ValueError):
    """A predicate whose Arrow evaluation would not be exactly Spark's."""


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    raise Unsupported(f"a column of type {t}")


def _literal_kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    raise Unsupported(f"the literal {v!r}")


def bind(conjuncts, name_of, types: Mapping[str, pa.DataType], column_of: Mapping[str, str]) -> A.Expr:
    """The conjuncts' AND with every column renamed to its projection column; :class:`Unsupported` when one is not
    exactly evaluable.

    Parameters
    ----------
    conjuncts : list of Expr
        The query's predicates on its stream.
    name_of : callable
        A column node's name in the stream (the compiler's resolution).
    types : mapping of str to pyarrow.DataType
        The stream's columns' Arrow types.
    column_of : mapping of str to str
        The projection column carrying each stream column.
    """
    def walk(e) -> tuple[A.Expr, str]:
        if isinstance(e, A.Column):
            name = name_of(e)
            if name not in column_of or name not in types:
                raise Unsupported(f"the column {name!r}")
            return A.Column(None, column_of[name]), _kind(types[name])
        if isinstance(e, A.Literal):
            return e, _literal_kind(e.value)
        if isinstance(e, A.Unary) and e.op == "-" and isinstance(e.operand, A.Literal):
            v = e.operand.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise Unsupported("a negated non-number")
            return A.Literal(-v), "number"
        if isinstance(e, A.Unary) and e.op == "NOT":
            x, k = walk(e.operand)
            _need(k, "bool")
            return A.Unary("NOT", x), "bool"
        if isinstance(e, A.Binary) and e.op in ("AND", "OR"):
            (lx, lk), (rx, rk) = walk(e.left), walk(e.right)
            _need(lk, "bool")
            _need(rk, "bool")
            return A.Binary(e.op, lx, rx), "bool"
        if isinstance(e, A.Binary) and e.op in _COMPARE:
            (lx, lk), (rx, rk) = walk(e.left), walk(e.right)
            if lk != rk:
                raise Unsupported(f"a comparison of a {lk} with a {rk}")
            return A.Binary(e.op, lx, rx), "bool"
        if isinstance(e, A.IsNull):
            x, _ = walk(e.operand)
            return A.IsNull(x, e.negated), "bool"
        if isinstance(e, A.Between):
            (x, k), (lo, lk), (hi, hk) = walk(e.operand), walk(e.low), walk(e.high)
            if not k == lk == hk:
                raise Unsupported("BETWEEN of different kinds")
            return A.Between(x, lo, hi, e.negated), "bool"
        if isinstance(e, A.InList):
            x, k = walk(e.operand)
            if not isinstance(x, A.Column):
                raise Unsupported("IN of an expression")
            integral = pa.types.is_integer(types[_source_of(x)])
            items = []
            for it in e.items:
                lit, ik = walk(it)
                if not isinstance(lit, A.Literal) or ik != k or (integral and not isinstance(lit.value, int)):
                    raise Unsupported("IN with a non-literal, a NULL, another kind or a fraction of an integer")
                items.append(lit)
            return A.InList(x, tuple(items), e.negated), "bool"
        if isinstance(e, A.Call):
            raise Unsupported(f"the function {e.name}")
        raise Unsupported(f"the expression {type(e).__name__}")

    source = {v: k for k, v in column_of.items()}

    def _source_of(col: A.Column) -> str:
        return source[col.name]

    bound = None
    for c in conjuncts:
        x, k = walk(c)
        _need(k, "bool")
        bound = x if bound is None else A.Binary("AND", bound, x)
    if bound is None:
        raise Unsupported("no predicate")
    return bound


def _need(kind: str, want: str) -> None:
    if kind != want:
        raise Unsupported(f"a {kind} where a condition belongs")


def evaluate(e: A.Expr, batch: pa.RecordBatch):
    """``e`` (from :func:`bind`) on ``batch``: a boolean array, null where SQL's result is null."""
    if isinstance(e, A.Column):
        return batch.column(e.name)
    if isinstance(e, A.Literal):
        return pa.scalar(e.value)
    if isinstance(e, A.Unary):   # NOT (bind keeps no other)
        return pc.invert(evaluate(e.operand, batch))
    if isinstance(e, A.Binary) and e.op in ("AND", "OR"):
        fn = pc.and_kleene if e.op == "AND" else pc.or_kleene
        return fn(evaluate(e.left, batch), evaluate(e.right, batch))
    if isinstance(e, A.Binary):
        return getattr(pc, _COMPARE[e.op])(evaluate(e.left, batch), evaluate(e.right, batch))
    if isinstance(e, A.IsNull):
        x = evaluate(e.operand, batch)
        return pc.is_valid(x) if e.negated else pc.is_null(x)
    if isinstance(e, A.Between):
        x = evaluate(e.operand, batch)
        inside = pc.and_kleene(pc.greater_equal(x, evaluate(e.low, batch)), pc.less_equal(x, evaluate(e.high, batch)))
        return pc.invert(inside) if e.negated else inside
    if isinstance(e, A.InList):
        x = evaluate(e.operand, batch)
        found = pc.is_in(x, value_set=pa.array([i.value for i in e.items]).cast(x.type))
        found = pc.if_else(pc.is_null(x), pa.scalar(None, pa.bool_()), found)   # NULL IN (...) is NULL
        return pc.invert(found) if e.negated else found
    raise Unsupported(f"the expression {type(e).__name__}")
