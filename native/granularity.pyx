# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Granularity kernel Γ (Cammert et al., PIPES, §2.4.3).

An interval ``[t_s, t_e)`` becomes ``[ceil(t_s / g) * g, floor(t_e / g) * g)``; an interval that is
empty after rounding is flagged so the caller drops it. Arithmetic is exact on the whole int64 range:
a rounding that would leave int64 can only belong to an empty interval and is flagged as such.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, int8_t, INT64_MAX, INT64_MIN

cnp.import_array()

# Status codes written per row (shared with pyspark_cq.operators.granularity).
cdef enum:
    _OK = 0
    _EMPTY = 1       # empty after rounding: dropped by Γ's definition
    _MALFORMED = 2   # end < start or a null bound: counted and reported

STATUS_OK = _OK
STATUS_EMPTY = _EMPTY
STATUS_MALFORMED = _MALFORMED

cdef int64_t I64_MAX = INT64_MAX
cdef int64_t I64_MIN = INT64_MIN


cdef inline bint _round_up(int64_t t, int64_t g, int64_t q_max, int64_t* out) noexcept nogil:
    """ceil(t/g)*g into out; False when it exceeds int64. ``q_max`` is I64_MAX / g."""
    # C division truncates toward zero: for t > 0 the ceiling is q + 1, for t <= 0 it is q itself.
    cdef int64_t q = t / g
    cdef int64_t r = t % g
    if r == 0:
        out[0] = t
        return True
    if r < 0:              # t < 0: truncation already rounded up, and |q*g| < |t| cannot overflow
        out[0] = q * g
        return True
    if q >= q_max:         # (q + 1) * g > I64_MAX
        return False
    out[0] = (q + 1) * g
    return True


cdef inline bint _round_down(int64_t t, int64_t g, int64_t q_min, int64_t* out) noexcept nogil:
    """floor(t/g)*g into out; False when it is below int64's minimum. ``q_min`` is I64_MIN / g."""
    cdef int64_t q = t / g
    if t % g < 0:          # negative non-exact quotient: floor is one below the truncation
        if q <= q_min:     # (q - 1) * g < I64_MIN (q_min = ceil(I64_MIN / g) by C truncation)
            return False
        q -= 1
    out[0] = q * g
    return True


def round_intervals(start, end, granularity, valid=None, on_invalid="raise"):
    """Round validity intervals to a time granularity (PIPES Γ, §2.4.3).

    Parameters
    ----------
    start, end : array_like of int64
        Interval bounds ``[start, end)`` in ticks (e.g. microseconds).
    granularity : int
        Positive time distance ``g`` of the new granularity, in the same ticks.
    valid : array_like of bool, optional
        False marks rows whose bounds are null; they get status ``STATUS_MALFORMED``.
    on_invalid : {"raise", "flag"}
        What a row with ``end < start`` (or a null bound) does: raise ``ValueError``, or get status
        ``STATUS_MALFORMED``.

    Returns
    -------
    (start, end, status) : tuple of ndarray
        Rounded bounds and an int8 status per row: ``STATUS_OK``, ``STATUS_EMPTY`` (empty after
        rounding, to be dropped) or ``STATUS_MALFORMED``. Bounds of non-OK rows are left unrounded.
    """
    if isinstance(granularity, bool) or not isinstance(granularity, (int, np.integer)):
        raise TypeError(f"granularity must be a positive integer number of ticks, got {granularity!r}")
    if granularity <= 0:
        raise ValueError(f"granularity must be a positive integer number of ticks, got {granularity}")
    if granularity > I64_MAX:
        raise ValueError(f"granularity must fit in int64, got {granularity}")
    if on_invalid not in ("raise", "flag"):
        raise ValueError(f"on_invalid must be 'raise' or 'flag', got {on_invalid!r}")
    cdef cnp.ndarray[int64_t, ndim=1] s = np.ascontiguousarray(start, dtype=np.int64)
    cdef cnp.ndarray[int64_t, ndim=1] e = np.ascontiguousarray(end, dtype=np.int64)
    if s.shape[0] != e.shape[0]:
        raise ValueError(f"start and end must have the same length, got {s.shape[0]} and {e.shape[0]}")
    cdef Py_ssize_t n = s.shape[0], i
    cdef cnp.ndarray[cnp.uint8_t, ndim=1, cast=True] ok
    cdef bint has_valid = valid is not None
    if has_valid:
        ok = np.ascontiguousarray(valid, dtype=np.bool_)
        if ok.shape[0] != n:
            raise ValueError(f"valid must have the same length as start ({n}), got {ok.shape[0]}")
    cdef cnp.ndarray[int64_t, ndim=1] rs = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray[int64_t, ndim=1] re = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray[int8_t, ndim=1] st = np.empty(n, dtype=np.int8)
    cdef int64_t g = granularity, a, b
    cdef int64_t q_max = I64_MAX / g, q_min = I64_MIN / g
    cdef Py_ssize_t first_bad = -1
    with nogil:
        for i in range(n):
            rs[i] = s[i]
            re[i] = e[i]
            if (has_valid and not ok[i]) or e[i] < s[i]:
                st[i] = _MALFORMED
                if first_bad < 0:
                    first_bad = i
                continue
            if not _round_up(s[i], g, q_max, &a) or not _round_down(e[i], g, q_min, &b) or a >= b:
                st[i] = _EMPTY
                continue
            rs[i] = a
            re[i] = b
            st[i] = _OK
    if first_bad >= 0 and on_invalid == "raise":
        if has_valid and not ok[first_bad]:
            raise ValueError(f"start/end must not be null: row {first_bad} has a null bound")
        raise ValueError(
            f"end must be >= start: row {first_bad} has start={s[first_bad]} and end={e[first_bad]}")
    return rs, re, st
