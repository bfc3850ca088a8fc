import datetime as dt

import numpy as np
import pytest

from pyspark_cq._duration import format_duration, parse_duration


@pytest.mark.parametrize("text, micros", [
    ("10 seconds", 10_000_000), ("-10 seconds", -10_000_000), ("2 minutes", 120_000_000),
    ("1 minute 30 seconds", 90_000_000), ("-1 minute 30 seconds", -90_000_000), ("500 ms", 500_000),
    ("1.5 seconds", 1_500_000), ("interval 2 hours", 7_200_000_000), ("3 microseconds", 3),
    ("1 day", 86_400_000_000), ("10s", 10_000_000), ("0 seconds", 0), ("+5 seconds", 5_000_000),
])
def test_parse(text, micros):
    assert parse_duration(text, "window") == micros


def test_timedelta_forms():
    assert parse_duration(dt.timedelta(seconds=-10), "lower") == -10_000_000
    assert parse_duration(np.timedelta64(3, "ms"), "lower") == 3_000


@pytest.mark.parametrize("bad", ["", "ten seconds", "10", "10 fortnights", "10 seconds and"])
def test_bad_text_names_argument(bad):
    with pytest.raises(ValueError, match="^window"):
        parse_duration(bad, "window")


def test_bad_types_and_signs():
    with pytest.raises(TypeError, match="slide must be a duration"):
        parse_duration(10, "slide")
    with pytest.raises(ValueError, match="slide must be a positive duration"):
        parse_duration("-1 second", "slide", allow_negative=False)
    with pytest.raises(ValueError, match="slide must be a positive duration"):
        parse_duration("0 seconds", "slide", allow_zero=False)


@pytest.mark.parametrize("micros", [0, 1, 1000, 1_500_000, 60_000_000, 86_400_000_000, -5_000_000])
def test_format_round_trips(micros):
    assert parse_duration(format_duration(micros), "x") == micros
