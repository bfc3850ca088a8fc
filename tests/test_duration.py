"""Duration arguments: the string grammar is Spark's ``CAST(s AS INTERVAL)``, checked against Spark itself.

Pure tests pin the grammar with cases verified on Spark 4.3; the ``spark`` tests compare a generated corpus
(hypothesis: signs per unit, several units, fractions, abbreviations, case, ``INTERVAL`` prefix,
whitespace, overflow) with Spark's own cast, one query per example set, and run ``interval_join`` against
Spark's join with the same bound.
"""
from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

import pyspark_cq
from pyspark_cq._duration import ABBREVIATIONS, format_duration, parse_duration

S = 1_000_000
MINUTE, HOUR, DAY = 60 * S, 3600 * S, 86_400 * S
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1


# ---------------------------------------------------------------------------------------------
# the grammar, cases checked on Spark 4.3's CAST(s AS INTERVAL)

# each unit has its own sign (issue 16)
ISSUE_CASES = [("-1 minute -30 seconds", -90 * S), ("-1 minute 30 seconds", -30 * S)]


PARSE_CASES = ISSUE_CASES + [
    ("10 seconds", 10 * S), ("-10 seconds", -10 * S), ("+5 seconds", 5 * S), ("2 minutes", 2 * MINUTE),
    ("1 minute 30 seconds", 90 * S), ("1 minute -30 seconds", 30 * S), ("- 10 seconds", -10 * S),
    ("1.5 seconds", 1_500_000), ("-1.5 seconds", -1_500_000), (".5 seconds", 500_000), ("5. seconds", 5 * S),
    ("-. seconds", 0), ("1.0000009 seconds", S), ("-1.0000009 seconds", -S), ("1.123456789 seconds", 1_123_456),
    ("interval 2 hours", 2 * HOUR), ("INTERVAL 2 HOURS", 2 * HOUR), ("interval\t1 second", S),
    ("interval  1 second", S), ("1 SECONDS", S), ("1 secondS", S), (" \t1 second\n", S), ("1  second", S),
    ("1\tsecond", S), ("\x00\x1b1 second\x7f", S),
    ("3 microseconds", 3), ("250 milliseconds", 250_000), ("1 microsecond 1 millisecond", 1001),
    ("1 day", DAY), ("1 week", 7 * DAY), ("1 day 2 hours", DAY + 2 * HOUR), ("0 seconds", 0),
    ("1 year -12 months 3 days", 3 * DAY), ("0 months 1 second", S), ("007 seconds", 7 * S),
    ("1 second 1 second", 2 * S), ("9223372036854775807 microseconds", LONG_MAX),
    ("-9223372036854775807 microseconds -1 microsecond", LONG_MIN), ("106751991 days", 106_751_991 * DAY),
]


@pytest.mark.parametrize("text, micros", PARSE_CASES)
def test_parse(text, micros):
    assert parse_duration(text, "window") == micros


# Spark's cast gives NULL for all of these: a silent different reading would be the worst outcome
SPARK_INVALID = [
    "--10 seconds", "+-10 seconds", "", "   ", "interval", "interval ", "intervals 1 second", "interval1 second",
    "10", "-", "ten seconds", "10 fortnights", "10 seconds and", "1 second,", "1 secondss", "10seconds",
    "10s", "1 hr", "1 d", "1 usec", "1 msec", "1 nanosecond", "1.5 ms", "1.5 min", "1 ms,", "1 sx", ". seconds", "1.5 minutes", "1.5 milliseconds", "1.5 days",
    "1.1234567891 seconds", "1.5seconds", "1 . seconds", "1.2.3 seconds", "\xa01 second", "1 second\xa0",
    "1\xa0second", "١ second", "9223372036854775808 microseconds", "-9223372036854775808 microseconds",
    "1000000000000 weeks", "3000000000 days", "interval interval 1 second",
]


# the abbreviations CQL takes too (issue 41): Spark's cast gives NULL for them, so no Spark reading changes
ABBREVIATED = [
    ("10 s", 10 * S), ("-2 secs", -2 * S), ("1 sec", S), ("1.5 s", 1_500_000), ("500 ms", 500_000), ("1 us", 1),
    ("2 min", 2 * MINUTE), ("1 mins", MINUTE), ("1 h", HOUR), ("1 H 30 MIN", 90 * MINUTE),
    ("-1 min -30 s", -90 * S), ("INTERVAL 1 minute 30 s", 90 * S),
]


@pytest.mark.parametrize("text, micros", ABBREVIATED)
def test_abbreviations_of_cql_are_read(text, micros):
    assert parse_duration(text, "window") == micros


def test_abbreviations_are_the_ones_cql_reads():
    from pyspark_cq.lang import parse

    for abbreviation in ABBREVIATIONS:
        window = parse(f"ISTREAM(SELECT * FROM s [RANGE 3 {abbreviation.upper()}])").query.sources[0].window
        assert window.size.micros == parse_duration(f"3 {abbreviation}"), abbreviation


@pytest.mark.parametrize("bad", SPARK_INVALID)
def test_spark_invalid_is_rejected_naming_the_argument(bad):
    with pytest.raises(ValueError, match="^window"):
        parse_duration(bad, "window")


def test_issue_16_double_sign():
    with pytest.raises(ValueError, match="^lower .*'--10 seconds'"):
        parse_duration("--10 seconds", "lower")


@pytest.mark.parametrize("text", ["1 month", "1 year", "-2 months 3 days", "1 year -11 months", "INTERVAL 1 MONTH"])
def test_months_and_years_are_not_durations(text):
    with pytest.raises(ValueError, match="^slide .*month"):
        parse_duration(text, "slide")


@pytest.mark.parametrize("text", [
    "1000000000000 weeks",               # Spark: days overflow an int, the cast is NULL
    "1000000000 days",                   # Spark accepts the interval, but it is more than a long of µs
    "106751992 days",
    "9223372036854775807 microseconds 1 microsecond",
    "-9223372036854775807 microseconds -2 microseconds",
    "2562047789 hours",
    "99999999999999999999999 seconds",
    "interval 9999999999999 minutes",
])
def test_too_large_fails_at_definition_naming_the_argument(text):
    with pytest.raises(ValueError, match="^upper .*(range|overflow)"):
        parse_duration(text, "upper")


def test_too_large_timedelta_forms():
    with pytest.raises(ValueError, match="^upper .*range"):
        parse_duration(dt.timedelta(days=999_999_999), "upper")
    with pytest.raises(ValueError, match="^upper .*range"):
        parse_duration(np.timedelta64(10 ** 12, "D"), "upper")          # numpy's astype would wrap silently
    with pytest.raises(ValueError, match="^upper .*range"):
        parse_duration(np.timedelta64(-(10 ** 12), "h"), "upper")


def test_timedelta_forms():
    assert parse_duration(dt.timedelta(seconds=-10), "lower") == -10 * S
    assert parse_duration(dt.timedelta(days=1, microseconds=-1), "lower") == DAY - 1
    assert parse_duration(np.timedelta64(3, "ms"), "lower") == 3_000
    assert parse_duration(np.timedelta64(2, "W"), "lower") == 14 * DAY
    assert parse_duration(np.timedelta64(1500, "ns"), "lower") == 1
    # truncated toward zero, as Spark truncates "-0.0000015 seconds" (numpy's astype floors to -2)
    assert parse_duration(np.timedelta64(-1500, "ns"), "lower") == -1
    with pytest.raises(ValueError, match="^lower .*NaT"):
        parse_duration(np.timedelta64("NaT"), "lower")
    for bad in (np.timedelta64(1, "M"), np.timedelta64(1, "Y"), np.timedelta64(5)):
        with pytest.raises(ValueError, match="^lower"):
            parse_duration(bad, "lower")


def test_bad_types_and_signs():
    with pytest.raises(TypeError, match="slide must be a duration"):
        parse_duration(10, "slide")
    with pytest.raises(TypeError, match="slide must be a duration"):
        parse_duration(b"10 seconds", "slide")
    with pytest.raises(ValueError, match="slide must be a positive duration"):
        parse_duration("-1 second", "slide", allow_negative=False)
    with pytest.raises(ValueError, match="slide must be a positive duration"):
        parse_duration("0 seconds", "slide", allow_zero=False)
    with pytest.raises(ValueError, match="slide must be a positive duration"):
        parse_duration("-. seconds", "slide", allow_zero=False)


@pytest.mark.parametrize("micros", [0, 1, 1000, 1_500_000, 60_000_000, 86_400_000_000, -5_000_000, LONG_MAX])
def test_format_round_trips(micros):
    assert parse_duration(format_duration(micros), "x") == micros


# ---------------------------------------------------------------------------------------------
# a generated corpus

# a valid string, then at most a few deliberate faults; weights by repetition
_UNITS = ["week", "day", "hour", "hour", "minute", "minute", "second", "second", "second", "millisecond",
          "millisecond", "microsecond", "month", "year"]
_BAD_UNITS = ["hr", "d", "msec", "usec", "nanosecond", "sx", "m", "hs",
              "fortnight", "mon", "secondss", "sec0nd", "minutes_"]
_SIGNS = ["", "", "", "", "-", "-", "-", "+", "- ", "+\t"]
_BAD_SIGNS = ["--", "+-", "-+", "\u2212", "- -"]
_GAPS = [" ", " ", " ", " ", "  ", "\t", "\n", "\x0b", "\x1c", "\r\n"]        # Character.isWhitespace
_BAD_GAPS = ["", "\xa0", "\x00", "_", "\u3000"]
_ENDS = ["", "", "", "", " ", "\t ", "\n", "\x00", "\x1b", "\x7f"]            # trimmed by UTF8String.trimAll
_BAD_ENDS = ["\xa0", "\u3000", "x", ","]
_PREFIXES = ["", "", "", "", "interval ", "INTERVAL ", "Interval\t", "interval  ", "iNtErVaL\n"]
_BAD_PREFIXES = ["interval", "intervals ", "interval\xa0", "interval interval "]
_BAD_NUMBERS = ["", ".", "1.2.3", "\u0661", "1e3", "0x10", "1,5"]


def _cased(draw, word):
    case = draw(st.sampled_from(["lower", "lower", "lower", "upper", "title", "mixed"]))
    if case == "mixed":
        mask = draw(st.integers(0, 2 ** len(word) - 1))
        return "".join(c.upper() if mask >> i & 1 else c for i, c in enumerate(word))
    return getattr(word, case)()


@st.composite
def _number(draw, fraction):
    whole = str(draw(st.one_of(st.integers(0, 99), st.integers(0, 99), st.integers(0, 10 ** 7),
                               st.integers(0, 10 ** 20))))
    if not fraction or draw(st.booleans()):
        return whole
    digits = draw(st.text("0123456789", max_size=9))
    return draw(st.sampled_from([whole + "." + digits, "." + digits if digits else whole + "."]))


@st.composite
def _term(draw, fault):
    unit = draw(st.sampled_from(_UNITS))
    sign, gap = draw(st.sampled_from(_SIGNS)), draw(st.sampled_from(_GAPS))
    number = draw(_number(unit == "second"))
    unit = _cased(draw, unit + draw(st.sampled_from(["", "s"])))
    if fault == "sign":
        sign = draw(st.sampled_from(_BAD_SIGNS))
    elif fault == "number":
        number = draw(st.one_of(st.sampled_from(_BAD_NUMBERS),                        # not a number
                                st.integers(0, 99).map(lambda w: f"{w}.5"),            # a fraction on any unit
                                st.text("0123456789", min_size=10, max_size=12).map(lambda d: "1." + d)))
    elif fault == "gap":
        gap = draw(st.sampled_from(_BAD_GAPS))
    elif fault == "unit":
        unit = _cased(draw, draw(st.sampled_from(_BAD_UNITS)))
    return sign + number + gap + unit


@st.composite
def duration_text(draw):
    """A string of Spark's interval grammar with at most one deliberate fault (none in about half)."""
    fault = draw(st.sampled_from([None] * 8 + ["sign", "number", "gap", "unit", "sep", "ends", "prefix"]))
    n = draw(st.integers(0 if fault in ("ends", "prefix") else 1, 4))
    faulty = draw(st.integers(0, max(n - 1, 0)))
    terms = [draw(_term(fault if i == faulty else None)) for i in range(n)]
    seps = [draw(st.sampled_from(_GAPS)) for _ in range(max(n - 1, 0))]
    if fault == "sep" and seps:
        seps[draw(st.integers(0, len(seps) - 1))] = draw(st.sampled_from(["", ",", ", ", "\xa0", " and "]))
    body = terms[0] + "".join(sep + t for sep, t in zip(seps, terms[1:])) if terms else ""
    prefix = draw(st.sampled_from(_BAD_PREFIXES if fault == "prefix" else _PREFIXES))
    lead, trail = draw(st.sampled_from(_ENDS)), draw(st.sampled_from(_ENDS))
    if fault == "ends":
        trail = draw(st.sampled_from(_BAD_ENDS))
    return lead + prefix + body + trail


@settings(max_examples=300, deadline=None)
@given(duration_text())
def test_generated_text_only_raises_value_error(text):
    try:
        micros = parse_duration(text, "lower")
    except ValueError as exc:
        assert str(exc).startswith("lower")
    else:
        assert isinstance(micros, int) and LONG_MIN <= micros <= LONG_MAX


# ---------------------------------------------------------------------------------------------
# against Spark's own cast

_CALENDAR = re.compile(r"(-?\d+(?:\.\d+)?) (years|months|days|hours|minutes|seconds)")
_MICROS = {"days": DAY, "hours": HOUR, "minutes": MINUTE, "seconds": S}


def _calendar(text):
    """(months, microseconds) of Spark's ``CalendarInterval.toString`` (e.g. '-1 minutes -30.5 seconds')."""
    if text is None:
        return None
    parts = _CALENDAR.findall(text)
    assert " ".join(f"{v} {u}" for v, u in parts) == text, text
    months = sum(int(v) * (12 if u == "years" else 1) for v, u in parts if u in ("years", "months"))
    micros = sum(Decimal(v) * _MICROS[u] for v, u in parts if u in _MICROS)
    assert micros == int(micros)
    return months, int(micros)


def spark_cast(spark, texts):
    """Spark's ``CAST(s AS INTERVAL)`` of every text in one query: (months, microseconds), or None (invalid)."""
    df = spark.createDataFrame(list(enumerate(texts)), "i int, s string")
    rows = df.selectExpr("i", "cast(cast(s as interval) as string) as iv").orderBy("i").collect()
    return [_calendar(r.iv) for r in rows]


def assert_same_as_spark(spark, texts):
    mismatches = []
    for text, want in zip(texts, spark_cast(spark, texts)):
        try:
            got = parse_duration(text, "lower")
        except ValueError as exc:
            got = exc
        if want is None or want[0] != 0 or not LONG_MIN <= want[1] <= LONG_MAX:
            ok = isinstance(got, ValueError) and str(got).startswith("lower")
        else:
            ok = got == want[1]
        if not ok:
            mismatches.append((text, want, got))
    assert not mismatches, "\n".join(f"{t!r}: Spark {w}, ours {g!r}" for t, w, g in mismatches)


# strings whose reading hangs on one rule of Spark's parser
EDGES = [
    "- 10 seconds", "-. seconds", "+. seconds", "- . seconds", "5. seconds", ".5 seconds", "1.000000001 seconds",
    "-0.0000015 seconds", "1 year -12 months 3 days", "1 month", "0 years", "2147483647 days",
    "2147483647 days 1 day", "-2147483648 days", "306783378 weeks", "306783379 weeks", "178956970 years",
    "178956971 years", "9223372036854775807 microseconds", "-9223372036854775807 microseconds -1 microsecond",
    "9223372036854775 milliseconds", "9223372036854776 milliseconds", "9223372036854 seconds",
    "9223372036854 seconds 0.775807 seconds", "9223372036854 seconds 0.775808 seconds", "106751991 days",
    "106751992 days", "\x1c1 second\x1f", "\x001 second\x7f", "\x01\x001 second",
    "1\x00second", "1 second\x00 1 second", "1\x0bsecond", "1 second\x0c1 second",
    "INTERVAL\t-1 MINUTE\t+30 SECONDS", "interval\n1 day", "1 MilliSecondS", "1 weeks 1 days 1 hours",
]


@pytest.mark.spark
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])
@given(texts=st.lists(duration_text(), min_size=50, max_size=50))
@example(texts=EDGES)
def test_same_as_spark_cast(spark, texts):
    assert_same_as_spark(spark, texts)


@pytest.mark.spark
def test_tables_are_spark_verified(spark):
    texts = [t for t, _ in PARSE_CASES] + SPARK_INVALID + [t for t, _ in ABBREVIATED]
    got = spark_cast(spark, texts)
    assert got[:len(PARSE_CASES)] == [(0, m) for _, m in PARSE_CASES]
    for text, want in zip(SPARK_INVALID + [t for t, _ in ABBREVIATED], got[len(PARSE_CASES):]):
        assert want is None or not LONG_MIN <= want[1] <= LONG_MAX, text


@pytest.mark.spark
def test_format_duration_is_read_by_spark(spark):
    values = [0, 1, 1000, 1_500_000, 60_000_000, 86_400_000_000, -5_000_000, -DAY - 1, LONG_MAX]
    assert [w[1] for w in spark_cast(spark, [format_duration(v) for v in values])] == values


# ---------------------------------------------------------------------------------------------
# end to end: the operators read a bound as Spark does


@pytest.fixture(scope="module")
def band(spark):
    t0 = dt.datetime(2024, 1, 1, 12, 0, 0)
    left = spark.createDataFrame([(1, t0, "l")], "k long, ts timestamp, lv string")
    offsets = [-120, -91, -90, -89, -60, -31, -30, -29, -1, 0, 1]
    right = spark.createDataFrame([(1, t0 + dt.timedelta(seconds=o), str(o)) for o in offsets],
                                  "k long, ts timestamp, rv string")
    return left, right


@pytest.mark.spark
@pytest.mark.parametrize("lower, first", [("-1 minute -30 seconds", -90), ("-1 minute 30 seconds", -30),
                                          ("INTERVAL -1 MINUTE -30.5 SECONDS", -90)])
def test_interval_join_bound_as_spark_join(spark, band, lower, first):
    left, right = band
    ours = pyspark_cq.interval_join(left, right, "k", "ts", "ts", lower=lower, upper="0 seconds",
                                    suffixes=("_l", "_r"))
    theirs = left.alias("l").join(right.alias("r"), F.expr(
        f"l.k = r.k AND r.ts >= l.ts + INTERVAL '{lower}' AND r.ts <= l.ts + INTERVAL '0 seconds'"))
    got = sorted((r.lv, r.rv) for r in ours.select("lv", "rv").collect())
    want = sorted((r.lv, r.rv) for r in theirs.select("lv", "rv").collect())
    assert got == want
    assert sorted(int(rv) for _, rv in got) == [o for o in [-90, -89, -60, -31, -30, -29, -1, 0] if o >= first]


@pytest.mark.spark
@pytest.mark.parametrize("bound", ["1000000000000 weeks", "1000000000 days", "1 month", "--10 seconds", "10s"])
def test_interval_join_rejects_at_definition(spark, band, bound):
    left, right = band
    with pytest.raises(ValueError, match="^lower"):
        pyspark_cq.interval_join(left, right, "k", "ts", "ts", lower=bound, upper="0 seconds", suffixes=("_l", "_r"))
    with pytest.raises(ValueError, match="^upper"):
        pyspark_cq.interval_join(left, right, "k", "ts", "ts", lower="0 seconds", upper=bound, suffixes=("_l", "_r"))
