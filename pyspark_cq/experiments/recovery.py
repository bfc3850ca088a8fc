"""Crash recovery's oracle: a sink's rows against an uninterrupted run's (benchmarks/experiments/fault_injection.py)."""
from __future__ import annotations

from collections import Counter

__all__ = ["compare"]


def compare(expected: list, got: list) -> dict:
    """Multiset differences (not set differences) between the ``expected`` rows and the rows ``got``.

    Parameters
    ----------
    expected, got : list
        Rows as sequences (each made a tuple).

    Returns
    -------
    dict
        ``expected_rows`` and ``rows`` (the counts), ``lost`` (expected rows missing, with multiplicity),
        ``duplicated`` (extra copies of expected rows) and ``unexpected`` (rows not expected at all).
    """
    want = Counter(tuple(r) for r in expected)
    have = Counter(tuple(r) for r in got)
    lost = sum((want - have).values())
    extra = have - want
    duplicated = sum(c for r, c in extra.items() if r in want)
    return {"expected_rows": len(expected), "rows": len(got), "lost": lost, "duplicated": duplicated,
            "unexpected": sum(extra.values()) - duplicated}
