"""A recursive-descent parser for CQL (Motwani et al., STREAM, §2) with QoS clauses (PIPES §4.3, RTStream §2).

Grammar (keywords are case-insensitive; ``{x}`` is zero or more, ``[x]`` optional)::

    statement   := ( R2S "(" select ")" | select ) [ "WITH" "(" qos { "," qos } ")" ] [ ";" ]
    R2S         := ISTREAM | DSTREAM | RSTREAM
    select      := SELECT [DISTINCT] item { "," item } FROM source { ( "," | join ) source [ ON expr ] }
                   [ WHERE expr ] [ GROUP BY expr { "," expr } ] [ HAVING expr ]
    join        := [ INNER | ( LEFT | RIGHT | FULL ) [ OUTER ] ] JOIN      -- each JOIN takes its ON expr
    item        := "*" | ident "." "*" | expr [ [AS] ident ]
    source      := ( ident | "(" select ")" ) [ [AS] ident ] [ window ] [ sample ]
    window      := "[" ( RANGE duration [ SLIDE duration ] | RANGE UNBOUNDED | NOW
                        | [ PARTITION BY column { "," column } ] ROWS int ) [ PRECEDING ] [ WHERE expr ] "]"
    sample      := SAMPLE "(" number ")" | number "%" SAMPLE               -- percent, 0 < p <= 100
    duration    := number unit        -- unit: MICROSECOND(S) … WEEK(S), also US, MS, S, SEC(S), MIN(S), H
    qos         := WINDOW [ident] BETWEEN duration AND duration
                 | GRANULARITY [ident] BETWEEN duration AND duration     -- coarsest AND finest
                 | SAMPLE BETWEEN number AND number | PERIOD duration | DEADLINE duration | WEIGHT number
                 | CONSTRAINT constraint                                  -- STREAM §5.2, docs/constraints.md
                 | OUTPUT_MODE ( APPEND | UPDATE )                        -- the sink's output mode
    constraint  := UNIQUE ident "(" ident { "," ident } ")" | MANY_TO_ONE ident REFERENCES ident [ DELAY duration ]
                 | ( CLUSTERED | ORDERED ) ident [ TOLERANCE int ]
    expr        := or-expression with SQL precedence: OR < AND < NOT < comparison / LIKE / BETWEEN / IN / IS
                   < + - < * / % < unary - < primary (literal, column, call, "(" expr ")")

Errors are :class:`CQLSyntaxError`: ``line:column``, the offending text and what was expected.

This module is pure (no Spark).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .._duration import ABBREVIATIONS
from . import ast as A

__all__ = ["CQLSyntaxError", "parse", "parse_expression", "KEYWORDS", "JOIN_WORDS"]

#: Reserved words: they cannot be identifiers unless double-quoted.
KEYWORDS = frozenset("""
    SELECT DISTINCT FROM WHERE GROUP BY HAVING AS AND OR NOT IS NULL TRUE FALSE LIKE BETWEEN IN
    RANGE ROWS SLIDE PARTITION NOW UNBOUNDED PRECEDING SAMPLE ISTREAM DSTREAM RSTREAM WITH
""".split())

# the unit words: each of ast.TIME_UNITS, singular or plural, and the abbreviations the Python API takes too
_UNIT_ALIASES = {**{u: u for u in A.TIME_UNITS}, **{u + "S": u for u in A.TIME_UNITS},
                 **{a.upper(): unit.upper() for a, unit in ABBREVIATIONS.items()}}
_QOS_NAMES = ("WINDOW", "GRANULARITY", "SAMPLE", "PERIOD", "DEADLINE", "WEIGHT", "CONSTRAINT", "OUTPUT_MODE")
#: The words of a join in FROM: contextual (not reserved), but never taken as an implicit alias.
JOIN_WORDS = frozenset({"JOIN", "INNER", "LEFT", "RIGHT", "FULL", "OUTER", "CROSS", "NATURAL", "ON", "USING"})


class CQLSyntaxError(ValueError):
    """A CQL text that does not parse.

    Attributes
    ----------
    line, column : int
        1-based position of the offending text.
    found : str
        The offending text (``"end of input"`` at the end).
    expected : tuple of str
        What would have been accepted there.
    """

    def __init__(self, message: str, line: int, column: int, found: str, expected=(), source: str | None = None):
        self.line, self.column, self.found = line, column, found
        self.expected = tuple(expected)
        self.detail = message
        text = f"line {line}:{column}: {message}"
        if source is not None:
            lines = source.splitlines() or [""]
            if 1 <= line <= len(lines):
                text += f"\n    {lines[line - 1]}\n    {' ' * (column - 1)}^"
        super().__init__(text)


@dataclass(frozen=True)
class _Tok:
    kind: str  # KW IDENT NUMBER STRING OP EOF
    text: str
    value: object
    line: int
    column: int

    def show(self) -> str:
        return "end of input" if self.kind == "EOF" else repr(self.text)


_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n]*)
  | (?P<number>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<string>'(?:[^']|'')*')
  | (?P<op><>|!=|<=|>=|\|\||[-+*/%=<>(),.;\[\]])
""", re.VERBOSE)


def _tokens(text: str) -> list[_Tok]:
    out, pos, line, line_start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            ch = text[pos]
            if ch == "'":
                raise CQLSyntaxError("unterminated string literal", line, col, text[pos:pos + 10],
                                     ("a closing '",), text)
            if ch == '"':
                raise CQLSyntaxError("unterminated quoted identifier", line, col, text[pos:pos + 10],
                                     ('a closing "',), text)
            hint = " (CQL strings use single quotes: 'text')" if ch in "`´‘’" else ""
            raise CQLSyntaxError(f"unexpected character {ch!r}{hint}", line, col, ch, ("a CQL token",), text)
        kind, s = m.lastgroup, m.group()
        if kind == "number":
            value = float(s) if any(c in s for c in ".eE") else int(s)
            out.append(_Tok("NUMBER", s, value, line, col))
        elif kind == "ident":
            up = s.upper()
            out.append(_Tok("KW", s, up, line, col) if up in KEYWORDS else _Tok("IDENT", s, s, line, col))
        elif kind == "qident":
            out.append(_Tok("IDENT", s, s[1:-1].replace('""', '"'), line, col))
        elif kind == "string":
            out.append(_Tok("STRING", s, s[1:-1].replace("''", "'"), line, col))
        elif kind == "op":
            out.append(_Tok("OP", s, "<>" if s == "!=" else s, line, col))
        newlines = s.count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + s.rindex("\n") + 1
        pos = m.end()
    col = pos - line_start + 1
    out.append(_Tok("EOF", "", None, line, col))
    return out


class _Parser:
    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str holding a CQL query, got {type(text).__name__}")
        self.source = text
        self.toks = _tokens(text)
        self.i = 0

    # -- token helpers ----------------------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def error(self, expected, message: str | None = None, tok: _Tok | None = None):
        tok = tok or self.tok
        expected = (expected,) if isinstance(expected, str) else tuple(expected)
        if message is None:
            message = f"expected {' or '.join(expected)}, found {tok.show()}"
        return CQLSyntaxError(message, tok.line, tok.column, tok.show() if tok.kind == "EOF" else tok.text,
                              expected, self.source)

    def at_kw(self, *words) -> bool:
        return self.tok.kind == "KW" and self.tok.value in words

    def at_op(self, *ops) -> bool:
        return self.tok.kind == "OP" and self.tok.value in ops

    def at_word(self, *words) -> bool:
        """A contextual word (reserved or not), e.g. a QoS item name or a unit."""
        return self.tok.kind in ("KW", "IDENT") and self.tok.text.upper() in words and self.tok.text[0] != '"'

    def advance(self) -> _Tok:
        tok = self.tok
        if tok.kind != "EOF":
            self.i += 1
        return tok

    def kw(self, *words) -> _Tok:
        if not self.at_kw(*words):
            raise self.error(words)
        return self.advance()

    def op(self, op: str, expected: str | None = None) -> _Tok:
        if not self.at_op(op):
            raise self.error(expected or f"'{op}'")
        return self.advance()

    def ident(self, what: str = "an identifier") -> str:
        if self.tok.kind == "IDENT":
            return self.advance().value
        if self.tok.kind == "KW":
            raise self.error(what, f"expected {what}, found the keyword {self.tok.text.upper()} "
                                   f"(quote it as \"{self.tok.text}\" to use it as a name)")
        raise self.error(what)

    @staticmethod
    def pos(tok: _Tok) -> dict:
        return {"line": tok.line, "column": tok.column}

    # -- statements -------------------------------------------------------------------------------
    def statement(self) -> A.Statement:
        start = self.tok
        stream = None
        if self.at_kw(*A.R2S):
            stream = self.advance().value
            self.op("(", f"'(' after {stream}")
            query = self.select()
            self.op(")", "')' closing " + stream + "(…)")
        elif self.at_kw("SELECT"):
            query = self.select()
        else:
            raise self.error(("SELECT", "ISTREAM", "DSTREAM", "RSTREAM"))
        qos: tuple = ()
        if self.at_kw("WITH"):
            qos = self.qos_clause()
        if self.at_op(";"):
            self.advance()
        if self.tok.kind != "EOF":
            raise self.error("end of input", f"unexpected {self.tok.show()} after the end of the query"
                                             + (" (a second query? one query per text)" if self.at_kw("SELECT")
                                                else ""))
        return A.Statement(query, stream, qos, **self.pos(start))

    def select(self) -> A.Select:
        start = self.kw("SELECT")
        distinct = False
        if self.at_kw("DISTINCT"):
            self.advance()
            distinct = True
        if self.at_kw("FROM"):
            raise self.error("a select list", "expected a select list (e.g. * or columns), found FROM")
        items = [self.select_item()]
        while self.at_op(","):
            self.advance()
            if self.at_kw("FROM"):
                raise self.error("an expression", "expected an expression after ',', found FROM "
                                                  "(a trailing comma in the select list?)")
            items.append(self.select_item())
        if not self.at_kw("FROM"):
            raise self.error(("',' or FROM",) if self.tok.kind != "EOF" else ("FROM",))
        self.advance()
        sources = [self.source_item()]
        joins: list = []
        while True:
            if self.at_op(","):
                self.advance()
                sources.append(self.source_item())
                joins.append(None)
            elif self.at_word(*JOIN_WORDS - {"OUTER", "ON", "USING"}):
                joins.append(self.join_clause(sources))
            else:
                break
        if all(j is None for j in joins):
            joins = []
        where = having = None
        group: list = []
        if self.at_kw("WHERE"):
            self.advance()
            where = self.expr()
        if self.at_kw("GROUP"):
            self.advance()
            if not self.at_kw("BY"):
                raise self.error("BY", f"expected BY after GROUP, found {self.tok.show()}")
            self.advance()
            group = [self.expr()]
            while self.at_op(","):
                self.advance()
                group.append(self.expr())
        if self.at_kw("HAVING"):
            self.advance()
            having = self.expr()
        return A.Select(tuple(items), tuple(sources), where, tuple(group), having, distinct, tuple(joins),
                        **self.pos(start))

    def join_clause(self, sources: list) -> A.JoinOn:
        """``[INNER | LEFT | RIGHT | FULL [OUTER]] JOIN source ON expr``: appends the source, returns its join."""
        start = self.tok
        word = self.advance().text.upper()
        if word in ("CROSS", "NATURAL"):
            raise self.error("JOIN … ON", f"{word} JOIN is not part of this CQL dialect: write JOIN … ON a.k = b.k "
                                          "(or a comma and WHERE)", start)
        how = {"JOIN": "inner", "INNER": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}[word]
        outer = ""
        if word in ("LEFT", "RIGHT", "FULL") and self.at_word("OUTER"):
            outer = " " + self.advance().text.upper()
        if word != "JOIN":
            if not self.at_word("JOIN"):
                raise self.error("JOIN", f"expected JOIN after {word}{outer}, found {self.tok.show()}")
            self.advance()
        sources.append(self.source_item())
        if not self.at_word("ON"):
            raise self.error("ON", f"expected ON and the join condition after the joined stream, found "
                                   f"{self.tok.show()}" + (" (USING is not supported: write ON a.k = b.k)"
                                                           if self.at_word("USING") else ""))
        self.advance()
        return A.JoinOn(how, self.expr(), **self.pos(start))

    def select_item(self) -> A.SelectItem:
        start = self.tok
        if self.at_op("*"):
            self.advance()
            return A.SelectItem(A.Star(None, **self.pos(start)), **self.pos(start))
        if self.tok.kind == "IDENT" and self.peek().text == "." and self.peek(2).text == "*":
            name = self.advance().value
            self.advance()
            self.advance()
            return A.SelectItem(A.Star(name, **self.pos(start)), **self.pos(start))
        expr = self.expr()
        alias = None
        if self.at_kw("AS"):
            self.advance()
            alias = self.ident("an alias after AS")
        elif self.tok.kind == "IDENT":
            alias = self.advance().value
        return A.SelectItem(expr, alias, **self.pos(start))

    def source_item(self):
        start = self.tok
        if self.at_op("("):
            self.advance()
            query = self.select()
            self.op(")", "')' closing the subquery")
            if self.at_kw("AS"):
                self.advance()
            if self.tok.kind != "IDENT":
                raise self.error("an alias", f"a subquery in FROM needs an alias, found {self.tok.show()}")
            alias = self.advance().value
            window, sample = self.window_and_sample()
            return A.SubqueryRef(query, alias, window, sample, **self.pos(start))
        name = self.ident("a stream name")
        alias = None
        if self.at_kw("AS"):
            self.advance()
            alias = self.ident("an alias after AS")
        elif self.tok.kind == "IDENT" and not self.at_word(*JOIN_WORDS):
            alias = self.advance().value
        window, sample = self.window_and_sample()
        return A.StreamRef(name, alias, window, sample, **self.pos(start))

    def window_and_sample(self):
        window = sample = None
        if self.at_op("["):
            window = self.window()
        if self.at_kw("SAMPLE") or (self.tok.kind == "NUMBER" and self.peek().text == "%"):
            sample = self.sample()
        if window is None and self.at_op("["):
            window = self.window()
        return window, sample

    def sample(self) -> float:
        if self.at_kw("SAMPLE"):
            self.advance()
            self.op("(", "'(' after SAMPLE")
            tok = self.tok
            p = self.number("a sampling percentage")
            if self.at_op("%"):
                self.advance()
            self.op(")", "')' closing SAMPLE(…)")
        else:
            tok = self.tok
            p = self.number("a sampling percentage")
            self.op("%")
            self.kw("SAMPLE")
        if not 0 < p <= 100:
            raise self.error("a percentage in (0, 100]", f"SAMPLE percentage must be in (0, 100], got {tok.text}",
                             tok)
        return p

    def window(self) -> A.WindowSpec:
        start = self.op("[")
        size = slide = None
        partition: list = []
        if self.at_kw("NOW"):
            self.advance()
            kind = "now"
        elif self.at_kw("RANGE"):
            self.advance()
            if self.at_kw("UNBOUNDED"):
                self.advance()
                kind = "unbounded"
            else:
                kind = "range"
                size = self.duration("a window size (e.g. 10 SECONDS) or UNBOUNDED after RANGE", positive=True)
                if self.at_kw("SLIDE"):
                    self.advance()
                    tok = self.tok
                    slide = self.duration("a slide (e.g. 1 SECOND) after SLIDE", positive=True)
                    if slide.micros > size.micros:
                        raise self.error("a slide no longer than the range",
                                         f"SLIDE {_show(slide)} is longer than RANGE {_show(size)}", tok)
        elif self.at_kw("PARTITION", "ROWS"):
            if self.at_kw("PARTITION"):
                self.advance()
                self.kw("BY")
                partition = [self.column_ref()]
                while self.at_op(","):
                    self.advance()
                    partition.append(self.column_ref())
                if not self.at_kw("ROWS"):
                    raise self.error(("',' or ROWS",), f"expected ROWS after PARTITION BY …, found {self.tok.show()}"
                                     " (a partitioned window is tuple-based: [PARTITION BY a ROWS n])")
            self.advance()
            kind = "rows"
            tok = self.tok
            if tok.kind != "NUMBER" or not isinstance(tok.value, int) or tok.value < 1:
                raise self.error("a positive integer after ROWS",
                                 f"expected a positive integer number of rows after ROWS, found {tok.show()}")
            size = self.advance().value
            if self.at_kw("SLIDE"):
                raise self.error("']'", "SLIDE applies to RANGE windows only, not to ROWS windows")
        else:
            raise self.error(("RANGE", "ROWS", "PARTITION BY", "NOW"))
        if self.at_kw("PRECEDING"):
            self.advance()
        where = None
        if self.at_kw("WHERE"):
            self.advance()
            where = self.expr()
        self.op("]", "']' closing the window")
        return A.WindowSpec(kind, size, slide, tuple(partition), where, **self.pos(start))

    def column_ref(self) -> A.Column:
        start = self.tok
        name = self.ident("a column")
        if self.at_op("."):
            self.advance()
            return A.Column(name, self.ident("a column name after '.'"), **self.pos(start))
        return A.Column(None, name, **self.pos(start))

    def number(self, what: str) -> int | float:
        if self.tok.kind != "NUMBER":
            raise self.error(what)
        return self.advance().value

    def duration(self, what: str, positive: bool = False) -> A.Duration:
        start = self.tok
        if self.at_op("-"):
            raise self.error(what, f"expected {what}, found '-': durations are not negative")
        value = self.number(what)
        if not (self.tok.kind in ("IDENT", "KW") and self.tok.text.upper() in _UNIT_ALIASES):
            raise self.error("a time unit", f"expected a time unit (MICROSECONDS, MILLISECONDS, SECONDS, MINUTES, "
                                            f"HOURS, DAYS, WEEKS) after {start.text}, found {self.tok.show()}")
        unit = _UNIT_ALIASES[self.advance().text.upper()]
        d = A.Duration(value, unit, **self.pos(start))
        if positive and d.micros <= 0:
            raise self.error(what, f"a window size or slide must be positive, got {_show(d)}", start)
        return d

    # -- QoS --------------------------------------------------------------------------------------
    def qos_clause(self) -> tuple[A.QoSItem, ...]:
        self.kw("WITH")
        self.op("(", "'(' after WITH")
        items = [self.qos_item()]
        while self.at_op(","):
            self.advance()
            items.append(self.qos_item())
        self.op(")", "',' or ')' in the QoS clause")
        seen = set()
        for q in items:
            key = (q.name, q.target, getattr(q, "kind", None))
            if key in seen:
                what = f"{q.name}{' ' + q.kind if isinstance(q, A.ConstraintItem) else ''}"
                raise CQLSyntaxError(f"QoS item {what}{' ' + q.target if q.target else ''} is given twice",
                                     q.line, q.column, q.name, ("each QoS item once",), self.source)
            seen.add(key)
        return tuple(items)

    def qos_item(self) -> A.QoSItem:
        start = self.tok
        if not self.at_word(*_QOS_NAMES):
            raise self.error(_QOS_NAMES, f"expected a QoS item ({', '.join(_QOS_NAMES)}), found {self.tok.show()}")
        name = self.advance().text.upper()
        if name == "CONSTRAINT":
            return self.constraint_item(start)
        if name == "OUTPUT_MODE":
            if not self.at_word(*A.OUTPUT_MODES):
                raise self.error(A.OUTPUT_MODES, f"expected APPEND or UPDATE after OUTPUT_MODE, found "
                                                 f"{self.tok.show()} (complete mode is not supported)")
            return A.ModeItem(self.advance().text.upper(), **self.pos(start))
        if name in ("WINDOW", "GRANULARITY", "SAMPLE"):
            target = None
            if name != "SAMPLE" and self.tok.kind == "IDENT":
                target = self.advance().value
            self.kw("BETWEEN")
            if name == "SAMPLE":
                lo_tok = self.tok
                lo = self.number("a percentage")
                self.kw("AND")
                hi = self.number("a percentage")
                if not 0 < lo <= hi <= 100:
                    raise self.error("0 < low <= high <= 100", f"SAMPLE BETWEEN needs 0 < low <= high <= 100, "
                                                               f"got {lo} AND {hi}", lo_tok)
            else:
                lo_tok = self.tok
                lo = self.duration("a duration", positive=True)
                self.kw("AND")
                hi = self.duration("a duration", positive=True)
                if name == "WINDOW" and lo.micros > hi.micros:
                    raise self.error("low <= high", f"WINDOW BETWEEN {_show(lo)} AND {_show(hi)}: the smallest "
                                                    "window comes first", lo_tok)
                if name == "GRANULARITY" and lo.micros < hi.micros:
                    raise self.error("coarsest AND finest",
                                     f"GRANULARITY BETWEEN {_show(lo)} AND {_show(hi)}: the coarsest granularity "
                                     "(lowest quality, PIPES §4.3) comes first", lo_tok)
            return A.QoSItem(name, lo, hi, target, **self.pos(start))
        if name == "WEIGHT":
            tok = self.tok
            w = self.number("a weight")
            if not w > 0:
                raise self.error("a positive weight", f"WEIGHT must be positive, got {tok.text}", tok)
            return A.QoSItem(name, w, **self.pos(start))
        return A.QoSItem(name, self.duration(f"a duration after {name}", positive=True), **self.pos(start))

    def constraint_item(self, start) -> A.ConstraintItem:
        """After ``CONSTRAINT``: one stream constraint (STREAM §5.2)."""
        if not self.at_word(*A.CONSTRAINT_KINDS):
            raise self.error(A.CONSTRAINT_KINDS, f"expected a constraint ({', '.join(A.CONSTRAINT_KINDS)}) after "
                                                 f"CONSTRAINT, found {self.tok.show()}")
        kind = self.advance().text.upper()
        target = self.ident("a stream name")
        if kind == "UNIQUE":
            self.op("(", f"'(' and the unique columns of {target}")
            cols = [self.ident("a column name")]
            while self.at_op(","):
                self.advance()
                cols.append(self.ident("a column name"))
            self.op(")", "',' or ')' after the unique columns")
            return A.ConstraintItem(kind, target, columns=tuple(cols), **self.pos(start))
        if kind == "MANY_TO_ONE":
            if not self.at_word("REFERENCES"):
                raise self.error("REFERENCES", f"expected REFERENCES and the parent stream after MANY_TO_ONE "
                                               f"{target}, found {self.tok.show()}")
            self.advance()
            parent = self.ident("the parent stream's name")
            delay = None
            if self.at_word("DELAY"):
                self.advance()
                delay = self.duration("a duration after DELAY")
            return A.ConstraintItem(kind, target, parent=parent, delay=delay, **self.pos(start))
        k = 0
        if self.at_word("TOLERANCE"):
            self.advance()
            tok = self.tok
            k = self.number("a tolerance (rows)")
            if not isinstance(k, int) or k < 0:
                raise self.error("an integer >= 0", f"TOLERANCE must be an integer >= 0 (rows of other keys), got "
                                                    f"{tok.text}", tok)
        return A.ConstraintItem(kind, target, tolerance=k, **self.pos(start))

    # -- expressions ------------------------------------------------------------------------------
    def expr(self) -> A.Expr:
        return self.or_expr()

    def or_expr(self):
        left = self.and_expr()
        while self.at_kw("OR"):
            tok = self.advance()
            left = A.Binary("OR", left, self.and_expr(), **self.pos(tok))
        return left

    def and_expr(self):
        left = self.not_expr()
        while self.at_kw("AND"):
            tok = self.advance()
            left = A.Binary("AND", left, self.not_expr(), **self.pos(tok))
        return left

    def not_expr(self):
        if self.at_kw("NOT"):
            tok = self.advance()
            return A.Unary("NOT", self.not_expr(), **self.pos(tok))
        return self.predicate()

    def predicate(self):
        left = self.additive()
        tok = self.tok
        if self.at_op("=", "<>", "<", "<=", ">", ">="):
            op = self.advance().value
            return A.Binary(op, left, self.additive(), **self.pos(tok))
        if self.at_kw("IS"):
            self.advance()
            negated = False
            if self.at_kw("NOT"):
                self.advance()
                negated = True
            if not self.at_kw("NULL"):
                raise self.error("NULL" if negated else ("NULL", "NOT NULL"))
            self.advance()
            return A.IsNull(left, negated, **self.pos(tok))
        negated = False
        if self.at_kw("NOT"):
            if not (self.peek().kind == "KW" and self.peek().value in ("LIKE", "BETWEEN", "IN")):
                self.advance()
                raise self.error(("LIKE", "BETWEEN", "IN"), f"expected LIKE, BETWEEN or IN after NOT, found "
                                                            f"{self.tok.show()}")
            self.advance()
            negated = True
        if self.at_kw("LIKE"):
            self.advance()
            return A.Binary("NOT LIKE" if negated else "LIKE", left, self.additive(), **self.pos(tok))
        if self.at_kw("BETWEEN"):
            self.advance()
            low = self.additive()
            if not self.at_kw("AND"):
                raise self.error("AND", f"expected AND in BETWEEN … AND …, found {self.tok.show()}")
            self.advance()
            return A.Between(left, low, self.additive(), negated, **self.pos(tok))
        if self.at_kw("IN"):
            self.advance()
            self.op("(", "'(' after IN")
            items = [self.expr()]
            while self.at_op(","):
                self.advance()
                items.append(self.expr())
            self.op(")", "',' or ')' closing IN (…)")
            return A.InList(left, tuple(items), negated, **self.pos(tok))
        return left

    def additive(self):
        left = self.term()
        while self.at_op("+", "-", "||"):
            tok = self.advance()
            left = A.Binary(tok.value, left, self.term(), **self.pos(tok))
        return left

    def term(self):
        left = self.unary()
        while self.at_op("*", "/", "%"):
            tok = self.advance()
            left = A.Binary(tok.value, left, self.unary(), **self.pos(tok))
        return left

    def unary(self):
        if self.at_op("-"):
            tok = self.advance()
            return A.Unary("-", self.unary(), **self.pos(tok))
        return self.primary()

    def primary(self):
        tok = self.tok
        p = self.pos(tok)
        if tok.kind == "NUMBER":
            return A.Literal(self.advance().value, **p)
        if tok.kind == "STRING":
            return A.Literal(self.advance().value, **p)
        if self.at_kw("TRUE", "FALSE"):
            return A.Literal(self.advance().value == "TRUE", **p)
        if self.at_kw("NULL"):
            self.advance()
            return A.Literal(None, **p)
        if self.at_op("("):
            self.advance()
            if self.at_kw("SELECT"):
                raise self.error("an expression", "a subquery inside an expression is not part of this CQL dialect")
            inner = self.expr()
            self.op(")", "')' closing '('")
            return inner
        if tok.kind == "IDENT":
            if self.peek().text == "(":
                name = self.advance().value.upper()
                self.advance()
                distinct = False
                if self.at_kw("DISTINCT"):
                    self.advance()
                    distinct = True
                args: list = []
                if self.at_op("*"):
                    star = self.advance()
                    if name != "COUNT":
                        raise self.error("an argument", f"only COUNT takes *, not {name}", star)
                    args = [A.Star(None, **self.pos(star))]
                elif not self.at_op(")"):
                    args = [self.expr()]
                    while self.at_op(","):
                        self.advance()
                        args.append(self.expr())
                self.op(")", f"',' or ')' closing {name}(…)")
                if name in A.AGGREGATES and len(args) != 1:
                    raise self.error("one argument", f"{name} takes one argument, got {len(args)}", tok)
                return A.Call(name, tuple(args), distinct, **p)
            return self.column_ref()
        if tok.kind == "KW":
            raise self.error("an expression", f"expected an expression, found the keyword {tok.text.upper()}"
                             + (" (quote it as \"" + tok.text + "\" to use it as a column name)"
                                if tok.value not in ("FROM", "WHERE", "GROUP", "HAVING", "AND", "OR") else ""))
        raise self.error("an expression")


def _show(d: A.Duration) -> str:
    return f"{d.value:g} {d.unit}{'' if d.value == 1 else 'S'}"


def parse(text: str) -> A.Statement:
    """Parse a CQL query into its :class:`~pyspark_cq.lang.ast.Statement`.

    Examples
    --------
    >>> from pyspark_cq.lang import parse
    >>> s = parse("ISTREAM(SELECT COUNT(*) FROM Requests S [RANGE 1 DAY SLIDE 1 HOUR] "
    ...           "WHERE S.domain = 'stanford.edu')")
    >>> s.stream, s.query.sources[0].window.size.micros
    ('ISTREAM', 86400000000)
    >>> parse("SELECT a FROM S [ROWS 0]")
    Traceback (most recent call last):
      ...
    pyspark_cq.lang.parser.CQLSyntaxError: line 1:23: expected a positive integer number of rows after ROWS, found '0'
        SELECT a FROM S [ROWS 0]
                              ^
    """
    return _Parser(text).statement()


def parse_expression(text: str) -> A.Expr:
    """Parse one CQL expression (e.g. a predicate)."""
    p = _Parser(text)
    e = p.expr()
    if p.tok.kind != "EOF":
        raise p.error("end of input", f"unexpected {p.tok.show()} after the expression")
    return e
