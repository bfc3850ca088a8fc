"""A plain-Python reference of a left-deep chain of binary joins with a join type per input (``multi_join``'s
``how``): the oracle of ``tests/test_multi_join_outer.py``.

Written from the SQL definition, independently of the operator: input 0's rows are the first tuples; input j
extends every tuple with each of its rows whose key is non-null and equal to input 0's and whose time satisfies
every bound between j and an earlier input (a bound to a null-padded input is SQL NULL: no match); a tuple no
row of a ``"left"`` input extends is kept once with ``None`` for it, a tuple no row of an ``"inner"`` input
extends is dropped. Rows are dicts ``{"k": key, "t": micros or None, "row": tuple of output values}``.
"""
from __future__ import annotations

__all__ = ["chain_join"]


def chain_join(inputs, hows, bounds, *, widths=None) -> list[tuple]:
    """The output rows of the chain, sorted by ``repr``.

    Parameters
    ----------
    inputs : list of list of dict
        Per input its rows, each ``{"k", "t", "row"}`` (``t`` in µs, None when null).
    hows : list of str
        ``"inner"`` or ``"left"`` per input after the first.
    bounds : list of (int, int, int, int)
        ``(i, j, lower, upper)`` in µs: ``t_j - t_i`` in ``[lower, upper]``, inclusive.
    widths : list of int, optional
        Per input the number of output values of a null-padded row (default ``len(row)`` of its first row).
    """
    n = len(inputs)
    if widths is None:
        widths = [len(rows[0]["row"]) if rows else 0 for rows in inputs]
    tuples = [(r,) for r in inputs[0]]
    for j in range(1, n):
        checks = [(a, b, lo, up) for a, b, lo, up in bounds if max(a, b) == j]
        out = []
        for tau in tuples:
            key = tau[0]["k"]
            found = False
            for r in inputs[j]:
                if key is None or r["k"] is None or r["k"] != key:
                    continue
                chosen = tau + (r,)
                if all(_holds(chosen, a, b, lo, up) for a, b, lo, up in checks):
                    out.append(chosen)
                    found = True
            if not found and hows[j - 1] == "left":
                out.append(tau + (None,))
        tuples = out
    rows = []
    for tau in tuples:
        rows.append(tuple(v for j, r in enumerate(tau) for v in (r["row"] if r is not None else (None,) * widths[j])))
    return sorted(rows, key=repr)


def _holds(chosen, a, b, lo, up) -> bool:
    ra, rb = chosen[a], chosen[b]
    if ra is None or rb is None or ra["t"] is None or rb["t"] is None:
        return False   # SQL: a comparison with NULL is not true
    return lo <= rb["t"] - ra["t"] <= up
