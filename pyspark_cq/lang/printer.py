"""Print a CQL syntax tree back as text that parses to the same tree (:func:`to_text`).

Sub-expressions that are operators are parenthesised, so the tree's shape never depends on precedence;
identifiers that are keywords or not plain names are double-quoted. Expressions are printed in Spark SQL's
syntax as well, which the compiler uses for them (:func:`expression`).
"""
from __future__ import annotations

import re

from . import ast as A
from .parser import JOIN_WORDS, KEYWORDS

__all__ = ["to_text", "expression", "identifier", "duration"]

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def identifier(name: str) -> str:
    """``name`` as a CQL identifier, double-quoted when needed."""
    if _PLAIN.match(name) and name.upper() not in KEYWORDS | JOIN_WORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def _number(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def duration(d: A.Duration) -> str:
    """``10 SECONDS``."""
    return f"{_number(d.value)} {d.unit}{'' if d.value == 1 else 'S'}"


def _literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return _number(v)


def expression(e: A.Expr, name=None) -> str:
    """The text of an expression; ``name(column)`` renders column references (default: CQL's own)."""
    def col(c: A.Column) -> str:
        if name is not None:
            return name(c)
        return (identifier(c.table) + "." if c.table else "") + identifier(c.name)

    def sub(x: A.Expr) -> str:
        text = go(x)
        return f"({text})" if isinstance(x, (A.Binary, A.Unary, A.IsNull, A.Between, A.InList)) else text

    def go(x: A.Expr) -> str:
        if isinstance(x, A.Column):
            return col(x)
        if isinstance(x, A.Star):
            return (identifier(x.table) + ".*") if x.table else "*"
        if isinstance(x, A.Literal):
            return _literal(x.value)
        if isinstance(x, A.Unary):
            return ("NOT " if x.op == "NOT" else "-") + sub(x.operand)
        if isinstance(x, A.Binary):
            return f"{sub(x.left)} {x.op} {sub(x.right)}"
        if isinstance(x, A.IsNull):
            return f"{sub(x.operand)} IS {'NOT ' if x.negated else ''}NULL"
        if isinstance(x, A.Between):
            return f"{sub(x.operand)} {'NOT ' if x.negated else ''}BETWEEN {sub(x.low)} AND {sub(x.high)}"
        if isinstance(x, A.InList):
            return f"{sub(x.operand)} {'NOT ' if x.negated else ''}IN ({', '.join(go(i) for i in x.items)})"
        if isinstance(x, A.Call):
            return f"{x.name}({'DISTINCT ' if x.distinct else ''}{', '.join(go(a) for a in x.args)})"
        raise TypeError(f"not a CQL expression node: {x!r}")

    return go(e)


def _window(w: A.WindowSpec) -> str:
    if w.kind == "now":
        body = "NOW"
    elif w.kind == "unbounded":
        body = "RANGE UNBOUNDED"
    elif w.kind == "range":
        body = "RANGE " + duration(w.size) + (" SLIDE " + duration(w.slide) if w.slide else "")
    else:
        part = ("PARTITION BY " + ", ".join(expression(c) for c in w.partition_by) + " ") if w.partition_by else ""
        body = f"{part}ROWS {w.size}"
    if w.where is not None:
        body += " WHERE " + expression(w.where)
    return f"[{body}]"


def _source(s) -> str:
    if isinstance(s, A.SubqueryRef):
        text = f"({_select(s.query)}) {identifier(s.alias)}"
    else:
        text = identifier(s.name) + (" " + identifier(s.alias) if s.alias else "")
    if s.window is not None:
        text += " " + _window(s.window)
    if s.sample is not None:
        text += f" SAMPLE({_number(s.sample)})"
    return text


def _select(q: A.Select) -> str:
    items = []
    for it in q.items:
        text = expression(it.expr)
        items.append(text + (" AS " + identifier(it.alias) if it.alias else ""))
    text = "SELECT " + ("DISTINCT " if q.distinct else "") + ", ".join(items)
    text += " FROM " + _source(q.sources[0])
    for i, s in enumerate(q.sources[1:]):
        j = q.joins[i] if q.joins else None
        if j is None:
            text += ", " + _source(s)
        else:
            kind = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN", "full": "FULL JOIN"}[j.how]
            text += f" {kind} {_source(s)} ON {expression(j.on)}"
    if q.where is not None:
        text += " WHERE " + expression(q.where)
    if q.group_by:
        text += " GROUP BY " + ", ".join(expression(g) for g in q.group_by)
    if q.having is not None:
        text += " HAVING " + expression(q.having)
    return text


def _qos(q: A.QoSItem | A.ConstraintItem | A.ModeItem) -> str:
    if isinstance(q, A.ModeItem):
        return f"OUTPUT_MODE {q.mode}"
    target = " " + identifier(q.target) if q.target else ""
    if isinstance(q, A.ConstraintItem):
        if q.kind == "UNIQUE":
            return f"CONSTRAINT UNIQUE{target} ({', '.join(identifier(c) for c in q.columns)})"
        if q.kind == "MANY_TO_ONE":
            delay = f" DELAY {duration(q.delay)}" if q.delay is not None else ""
            return f"CONSTRAINT MANY_TO_ONE{target} REFERENCES {identifier(q.parent)}{delay}"
        return f"CONSTRAINT {q.kind}{target} TOLERANCE {q.tolerance}"

    def value(v):
        return duration(v) if isinstance(v, A.Duration) else _number(v)

    if q.high is not None:
        return f"{q.name}{target} BETWEEN {value(q.low)} AND {value(q.high)}"
    return f"{q.name} {value(q.low)}"


def to_text(node) -> str:
    """The CQL text of a :class:`~pyspark_cq.lang.ast.Statement`, ``Select`` or expression.

    Examples
    --------
    >>> from pyspark_cq.lang import parse, to_text
    >>> to_text(parse("istream(select a+b*2 x from S [range 10 seconds] where not a<1 or b is null) "
    ...               "with (weight 2)"))
    'ISTREAM(SELECT a + (b * 2) AS x FROM S [RANGE 10 SECONDS] WHERE (NOT (a < 1)) OR (b IS NULL)) WITH (WEIGHT 2)'
    """
    if isinstance(node, A.Statement):
        text = _select(node.query)
        if node.stream:
            text = f"{node.stream}({text})"
        if node.qos:
            text += " WITH (" + ", ".join(_qos(q) for q in node.qos) + ")"
        return text
    if isinstance(node, A.Select):
        return _select(node)
    if isinstance(node, A.Expr):
        return expression(node)
    raise TypeError(f"node must be a CQL Statement, Select or expression, got {type(node).__name__}")
