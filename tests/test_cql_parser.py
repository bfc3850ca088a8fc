"""CQL parser and printer: the paper's queries, a hypothesis round trip, and the error messages (no Spark)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.lang import CQLSyntaxError, parse, parse_expression, to_text
from pyspark_cq.lang import ast as A

# Motwani et al., §2.1 (the paper writes `stanford.edu' with a backquote: a PDF artefact, fixed here)
PAPER_QUERIES = [
    "SELECT COUNT(*) FROM Requests S [RANGE 1 DAY PRECEDING] WHERE S.domain = 'stanford.edu'",
    "SELECT COUNT(*) FROM Requests S [PARTITION BY S.client_id ROWS 10 PRECEDING WHERE S.domain = 'stanford.edu'] "
    "WHERE S.URL LIKE 'http://cs.stanford.edu/%'",
    "SELECT COUNT(*) FROM (SELECT R.class FROM Requests S 10% SAMPLE, Domains R WHERE S.domain = R.domain) T "
    "[ROWS 10000 PRECEDING] WHERE T.class = 'commerce'",
]


def test_paper_queries_parse_to_the_expected_trees():
    q1 = parse(PAPER_QUERIES[0])
    src = q1.query.sources[0]
    assert (src.name, src.alias, src.window.kind, src.window.size) == ("Requests", "S", "range", A.Duration(1, "DAY"))
    assert q1.query.items[0].expr == A.Call("COUNT", (A.Star(),))
    assert q1.query.where == A.Binary("=", A.Column("S", "domain"), A.Literal("stanford.edu"))
    q2 = parse(PAPER_QUERIES[1]).query
    w = q2.sources[0].window
    assert (w.kind, w.size, w.partition_by) == ("rows", 10, (A.Column("S", "client_id"),))
    assert w.where == A.Binary("=", A.Column("S", "domain"), A.Literal("stanford.edu"))
    assert q2.where.op == "LIKE"
    q3 = parse(PAPER_QUERIES[2]).query
    sub = q3.sources[0]
    assert isinstance(sub, A.SubqueryRef) and sub.alias == "T" and sub.window.size == 10000
    assert sub.query.sources[0].sample == 10 and sub.query.sources[1].name == "Domains"


def test_qos_clause_and_stream_operators():
    s = parse("RSTREAM(SELECT host, SUM(bytes) AS total FROM Packets [RANGE 10 MINUTES SLIDE 10 SECONDS] "
              "GROUP BY host) WITH (WINDOW BETWEEN 10 SECONDS AND 10 MINUTES, "
              "GRANULARITY BETWEEN 10 SECONDS AND 1 SECOND, PERIOD 5 SECONDS, DEADLINE 2 SECONDS, WEIGHT 2);")
    assert s.stream == "RSTREAM"
    assert [q.name for q in s.qos] == ["WINDOW", "GRANULARITY", "PERIOD", "DEADLINE", "WEIGHT"]
    assert s.qos_item("GRANULARITY").low.micros == 10_000_000 and s.qos_item("WEIGHT").low == 2
    assert s.qos_item("DEADLINE").low == A.Duration(2, "SECOND")


def test_positions_are_recorded_but_not_compared():
    s = parse("SELECT a\n  FROM S [RANGE 5 SECONDS]\n WHERE b > 1")
    assert s.query.where.at == "3:10"
    assert s.query.sources[0].window.at == "2:10"
    assert s == parse("SELECT a FROM S [RANGE 5 SECONDS] WHERE b > 1")


def test_precedence():
    e = parse_expression("a OR b AND NOT c = 1 + 2 * 3")
    assert e == A.Binary("OR", A.Column(None, "a"), A.Binary("AND", A.Column(None, "b"), A.Unary(
        "NOT", A.Binary("=", A.Column(None, "c"), A.Binary("+", A.Literal(1), A.Binary(
            "*", A.Literal(2), A.Literal(3)))))))


@pytest.mark.parametrize("text", PAPER_QUERIES)
def test_paper_queries_round_trip(text):
    tree = parse(text)
    assert parse(to_text(tree)) == tree


# --- hypothesis: generated trees survive print -> parse ---------------------------------------------------

NAMES = st.sampled_from(["a", "b", "x1", "S", "Requests", "client_id", "select", "From", "my col", 'q"x', "Range",
                         "seconds", "now", "Left", "on", "outer"])
COLUMNS = st.builds(A.Column, st.none() | NAMES, NAMES)
LITERALS = st.builds(A.Literal, st.integers(0, 10**12) | st.floats(0, 1e20, allow_nan=False) | st.text(max_size=8)
                     | st.booleans() | st.none())


def _exprs(leaves):
    def extend(inner):
        return (st.builds(A.Binary, st.sampled_from(["OR", "AND", "=", "<>", "<", "<=", ">", ">=", "+", "-", "*",
                                                     "/", "%", "LIKE", "NOT LIKE", "||"]), inner, inner)
                | st.builds(A.Unary, st.sampled_from(["-", "NOT"]), inner)
                | st.builds(A.IsNull, inner, st.booleans())
                | st.builds(A.Between, inner, inner, inner, st.booleans())
                | st.builds(A.InList, inner, st.lists(inner, min_size=1, max_size=3).map(tuple), st.booleans())
                | st.builds(A.Call, st.sampled_from(["SUM", "MIN", "AVG"]), inner.map(lambda x: (x,)), st.booleans())
                | st.builds(A.Call, st.sampled_from(["ABS", "LOWER", "COALESCE"]),
                            st.lists(inner, max_size=3).map(tuple)))
    return st.recursive(leaves, extend, max_leaves=4)


EXPRS = _exprs(COLUMNS | LITERALS)
UNITS = st.sampled_from(list(A.TIME_UNITS))


@st.composite
def windows(draw):
    kind = draw(st.sampled_from(["range", "rows", "now", "unbounded"]))
    where = draw(st.none() | EXPRS)
    if kind == "range":
        unit = draw(UNITS)
        size = draw(st.integers(1, 1000))
        slide = draw(st.none() | st.integers(1, size).map(lambda v: A.Duration(v, unit)))
        return A.WindowSpec("range", A.Duration(size, unit), slide, where=where)
    if kind == "rows":
        return A.WindowSpec("rows", draw(st.integers(1, 10**6)), None,
                            tuple(draw(st.lists(COLUMNS, max_size=2))), where)
    return A.WindowSpec(kind, where=where)


SAMPLES = st.none() | st.integers(1, 100) | st.floats(0.5, 100)
ITEMS = (st.builds(A.SelectItem, EXPRS | st.just(A.Call("COUNT", (A.Star(),))), st.none() | NAMES)
         | st.builds(A.SelectItem, st.builds(A.Star, st.none() | NAMES)))


JOINS = st.none() | st.builds(A.JoinOn, st.sampled_from(A.JOIN_TYPES), EXPRS)


def selects(sources):
    @st.composite
    def build(draw):
        froms = tuple(draw(st.lists(sources, min_size=1, max_size=3)))
        joins = tuple(draw(st.lists(JOINS, min_size=len(froms) - 1, max_size=len(froms) - 1)))
        return A.Select(tuple(draw(st.lists(ITEMS, min_size=1, max_size=2))), froms, draw(st.none() | EXPRS),
                        tuple(draw(st.lists(EXPRS, max_size=2))), draw(st.none() | EXPRS), draw(st.booleans()),
                        joins if any(j is not None for j in joins) else ())   # all commas: no joins
    return build()


STREAMS = st.builds(A.StreamRef, NAMES, st.none() | NAMES, st.none() | windows(), SAMPLES)
SUBQUERIES = st.builds(A.SubqueryRef, selects(STREAMS), NAMES, st.none() | windows(), SAMPLES)


@st.composite
def qos(draw):
    out = []
    for name in draw(st.lists(st.sampled_from(["WINDOW", "GRANULARITY", "SAMPLE", "PERIOD", "DEADLINE", "WEIGHT"]),
                              unique=True, max_size=4)):
        if name in ("WINDOW", "GRANULARITY"):
            a, b = sorted(draw(st.lists(st.integers(1, 100), min_size=2, max_size=2)))
            lo, hi = (A.Duration(a, "SECOND"), A.Duration(b, "MINUTE"))
            if name == "GRANULARITY":
                lo, hi = A.Duration(b, "SECOND"), A.Duration(a, "MILLISECOND")
            out.append(A.QoSItem(name, lo, hi, draw(st.none() | NAMES)))
        elif name == "SAMPLE":
            a, b = sorted(draw(st.lists(st.integers(1, 100), min_size=2, max_size=2)))
            out.append(A.QoSItem(name, a, b))
        elif name == "WEIGHT":
            out.append(A.QoSItem(name, draw(st.integers(1, 10) | st.floats(0.1, 10))))
        else:
            out.append(A.QoSItem(name, A.Duration(draw(st.integers(1, 60)), draw(UNITS))))
    if draw(st.booleans()):
        out.append(A.ModeItem(draw(st.sampled_from(A.OUTPUT_MODES))))
    return tuple(out)


STATEMENTS = st.builds(A.Statement, selects(STREAMS | SUBQUERIES), st.none() | st.sampled_from(A.R2S), qos())


@settings(max_examples=150, deadline=None)
@given(STATEMENTS)
def test_round_trip_generated(tree):
    text = to_text(tree)
    again = parse(text)
    assert again == tree, text
    assert to_text(again) == text


@settings(max_examples=200, deadline=None)
@given(EXPRS)
def test_expression_round_trip(e):
    assert parse_expression(to_text(e)) == e


def test_join_syntax():
    s = parse("ISTREAM(SELECT * FROM A [RANGE 1 MINUTE] LEFT OUTER JOIN B b [RANGE 30 SECONDS] ON A.k = b.k "
              "INNER JOIN C ON C.k = A.k, D RIGHT JOIN E ON E.k = D.k FULL OUTER JOIN F ON F.k = E.k "
              "JOIN G ON G.k = A.k) WITH (OUTPUT_MODE update)")
    q = s.query
    assert [x.ref for x in q.sources] == ["A", "b", "C", "D", "E", "F", "G"]
    assert [j.how if j else None for j in q.joins] == ["left", "inner", None, "right", "full", "inner"]
    assert q.joins[0].on == A.Binary("=", A.Column("A", "k"), A.Column("b", "k"))
    assert (q.joins[0].line, q.joins[0].column) == (1, 42)
    assert s.qos == (A.ModeItem("UPDATE"),) and s.qos_item("OUTPUT_MODE").mode == "UPDATE"
    assert parse(to_text(s)) == s
    # a comma list has no joins; a stream or alias named like a join word is quoted when printed
    assert parse("SELECT * FROM A, B WHERE A.k = B.k").query.joins == ()
    t = A.Statement(A.Select((A.SelectItem(A.Star()),), (A.StreamRef("S", "left"), A.StreamRef("on"))))
    assert to_text(t) == 'SELECT * FROM S "left", "on"' and parse(to_text(t)) == t


# --- error messages --------------------------------------------------------------------------------------

ERRORS = [
    # (text, line, column, found, message fragment)
    ("SELECT a FROM A LEFT B ON A.k = B.k", 1, 22, "B", "expected JOIN after LEFT, found 'B'"),
    ("SELECT a FROM A FULL OUTER B ON A.k = B.k", 1, 28, "B", "expected JOIN after FULL OUTER"),
    ("SELECT a FROM A JOIN B WHERE A.k = B.k", 1, 24, "WHERE", "expected ON and the join condition"),
    ("SELECT a FROM A JOIN B USING (k)", 1, 24, "USING", "USING is not supported"),
    ("SELECT a FROM A CROSS JOIN B", 1, 17, "CROSS", "CROSS JOIN is not part of this CQL dialect"),
    ("SELECT a FROM A NATURAL JOIN B", 1, 17, "NATURAL", "NATURAL JOIN is not part"),
    ("SELECT a FROM A JOIN B ON", 1, 26, "end of input", "expected an expression"),
    ("SELECT a FROM A WITH (OUTPUT_MODE COMPLETE)", 1, 35, "COMPLETE", "expected APPEND or UPDATE after OUTPUT_MODE"),
    ("SELECT a FROM A WITH (OUTPUT_MODE APPEND, OUTPUT_MODE UPDATE)", 1, 43, "OUTPUT_MODE", "is given twice"),
    ("", 1, 1, "end of input", "expected SELECT or ISTREAM or DSTREAM or RSTREAM"),
    ("SELECT a WHERE b = 1", 1, 10, "WHERE", "expected ',' or FROM"),
    ("SELECT FROM S", 1, 8, "FROM", "expected a select list"),
    ("SELECT a, FROM S", 1, 11, "FROM", "trailing comma"),
    ("SELECT a FROM S WHERE b = 'abc", 1, 27, "'abc", "unterminated string literal"),
    ("SELECT a FROM S WHERE b = `x'", 1, 27, "`", "CQL strings use single quotes"),
    ('SELECT "a FROM S', 1, 8, '"a FROM S', "unterminated quoted identifier"),
    ("SELECT a FROM S [RANGE 10 SECONDS", 1, 34, "end of input", "']' closing the window"),
    ("SELECT a FROM S [RANGE]", 1, 23, "]", "a window size"),
    ("SELECT a FROM S [RANGE 10 PARSECS]", 1, 27, "PARSECS", "expected a time unit"),
    ("SELECT a FROM S [ROWS 2.5]", 1, 23, "2.5", "positive integer number of rows"),
    ("SELECT a FROM S [ROWS 0]", 1, 23, "0", "positive integer number of rows"),
    ("SELECT a FROM S [ROWS 10 SLIDE 1 SECOND]", 1, 26, "SLIDE", "SLIDE applies to RANGE windows only"),
    ("SELECT a FROM S [PARTITION BY a RANGE 10 SECONDS]", 1, 33, "RANGE", "expected ROWS after PARTITION BY"),
    ("SELECT a FROM S [RANGE 10 SECONDS SLIDE 1 MINUTE]", 1, 41, "1", "is longer than RANGE"),
    ("SELECT a FROM S [RANGE 0 SECONDS]", 1, 24, "0", "must be positive"),
    ("SELECT a FROM S [RANGE -5 SECONDS]", 1, 24, "-", "durations are not negative"),
    ("SELECT a FROM S [FOO 1]", 1, 18, "FOO", "expected RANGE or ROWS or PARTITION BY or NOW"),
    ("SELECT a FROM S SAMPLE(150)", 1, 24, "150", "SAMPLE percentage must be in (0, 100]"),
    ("SELECT a FROM S WHERE (b = 1", 1, 29, "end of input", "')' closing '('"),
    ("SELECT a FROM S WHERE b = 1 AND", 1, 32, "end of input", "expected an expression"),
    ("SELECT a FROM S GROUP a", 1, 23, "a", "expected BY after GROUP"),
    ("SELECT a FROM S WHERE b IS 1", 1, 28, "1", "expected NULL or NOT NULL"),
    ("SELECT a FROM S WHERE b NOT 1", 1, 29, "1", "expected LIKE, BETWEEN or IN after NOT"),
    ("SELECT a FROM S WHERE b BETWEEN 1 OR 2", 1, 35, "OR", "expected AND in BETWEEN"),
    ("SELECT S. FROM S", 1, 11, "FROM", "expected a column name after '.'"),
    ("SELECT select FROM S", 1, 8, "select", 'quote it as "select"'),
    ("ISTREAM SELECT a FROM S", 1, 9, "SELECT", "expected '(' after ISTREAM"),
    ("ISTREAM(SELECT a FROM S", 1, 24, "end of input", "')' closing ISTREAM(…)"),
    ("SELECT a FROM S) x", 1, 16, ")", "after the end of the query"),
    ("SELECT a FROM S; SELECT b FROM S", 1, 18, "SELECT", "one query per text"),
    ("SELECT a FROM S WITH (SPEED 5)", 1, 23, "SPEED", "expected a QoS item"),
    ("SELECT a FROM S WITH (WINDOW BETWEEN 10 MINUTES AND 1 SECOND)", 1, 38, "10", "the smallest window comes first"),
    ("SELECT a FROM S WITH (GRANULARITY BETWEEN 1 SECOND AND 10 SECONDS)", 1, 43, "1", "coarsest granularity"),
    ("SELECT a FROM S WITH (PERIOD 5 SECONDS, PERIOD 6 SECONDS)", 1, 41, "PERIOD", "is given twice"),
    ("SELECT a FROM S WITH (WEIGHT 0)", 1, 30, "0", "WEIGHT must be positive"),
    ("SELECT a FROM S WITH (PERIOD 5)", 1, 31, ")", "expected a time unit"),
    ("SELECT SUM(*) FROM S", 1, 12, "*", "only COUNT takes *"),
    ("SELECT MAX(a, b) FROM S", 1, 8, "MAX", "MAX takes one argument"),
    ("SELECT a FROM (SELECT b FROM S) [ROWS 5]", 1, 33, "[", "a subquery in FROM needs an alias"),
    ("SELECT a\nFROM S\nWHERE b = = 1", 3, 11, "=", "expected an expression"),
    ("SELECT a FROM S WHERE b IN (1, 2", 1, 33, "end of input", "closing IN"),
]


@pytest.mark.parametrize("text,line,column,found,fragment", ERRORS)
def test_error_messages(text, line, column, found, fragment):
    with pytest.raises(CQLSyntaxError) as info:
        parse(text)
    err = info.value
    assert (err.line, err.column, err.found) == (line, column, found), str(err)
    assert fragment in str(err)
    assert str(err).startswith(f"line {line}:{column}: ")
    assert err.expected, "every error says what was expected"
    if text:
        # the message shows the offending line with a caret under the column
        src_line = text.splitlines()[line - 1]
        assert f"\n    {src_line}\n    {' ' * (column - 1)}^" in str(err)


def test_error_kinds_are_many():
    assert len({fragment for *_, fragment in ERRORS}) >= 20


def test_bad_argument_type():
    with pytest.raises(TypeError, match="text must be a str"):
        parse(b"SELECT a FROM S")
