"""Checks of the plain-Python references of sliding_aggregate (``helpers.aggregate_reference``)."""
from __future__ import annotations

from helpers.aggregate_reference import pipes_algorithm1, pipes_changes, spark_stream_windows, spark_windows

# ---- checks of the references ------------------------------------------------------------------------

def test_algorithm1_sum_example():
    """Figure 2's kind of example: overlapping intervals split at every start and end."""
    elements = [(1, 0, 4), (2, 1, 3), (4, 2, 6)]
    out = pipes_algorithm1(elements, lambda a, e: (a or 0) + e)
    assert sorted((s, x, a) for a, s, x in out) == [(0, 1, 1), (1, 2, 3), (2, 3, 7), (3, 4, 5), (4, 6, 4)]


def test_algorithm1_disjoint_elements_pass_through():
    out = pipes_algorithm1([(1, 0, 2), (5, 3, 4)], lambda a, e: (a or 0) + e)
    assert sorted((s, x, a) for a, s, x in out) == [(0, 2, 1), (3, 4, 5)]


def test_spark_windows_example():
    rows = [{"t": 5, "k": 1, "v": 1}, {"t": 7, "k": 1, "v": 2}]
    got = spark_windows(rows, "t", "k", 4, 2, [("*", "count"), ("v", "sum")])
    assert got == {(2, 6, 1): (1, 1), (4, 8, 1): (2, 3), (6, 10, 1): (1, 2)}


def test_stream_reference_drops_late_pairs_only():
    # window 10, slide 5, delay 0: watermarks per batch are 0, 20, 40 (and 40 after the last batch).
    batches = [[{"t": 20, "k": 1}], [{"t": 40, "k": 1}], [{"t": 12, "k": 1}, {"t": 3, "k": 1}, {"t": 22, "k": 1}]]
    out, late = spark_stream_windows(batches, "t", "k", 10, 5, [("*", "count")], delay=0)
    # In batch 2 the late-event watermark is 20 (batch 1's): every window of t=12 ([5,15), [10,20)) and of
    # t=3 has closed, so both rows are late; t=22 still joins [15,25) and [20,30) -- which batch 2 then
    # emits at watermark 40 together with the windows of t=20.
    assert late == 2
    assert out == {(15, 25, 1): (2,), (20, 30, 1): (2,)}


def test_pipes_changes_coalesces_equal_neighbours():
    rows = [{"t": 0, "k": 1}, {"t": 10, "k": 1}]
    got = pipes_changes(rows, "t", "k", 10, 5, [("*", "count")])
    assert got == {(1, 0, 20): (1,)}
