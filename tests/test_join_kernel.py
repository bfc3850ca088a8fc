"""The native join state (pyspark_cq._join) against a plain-Python reference, plus its byte format."""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq._native import load
from pyspark_cq.operators._common.codec import encode_keys
from pyspark_cq.operators.join.worker import state_watermarks

join = load("_join")


class Reference:
    """Symmetric band join state as per-key lists: the obviously-correct version of the kernel."""

    def __init__(self, lower, upper):
        self.lower, self.upper = lower, upper
        self.rows = ({}, {})  # per side: key (None for a null key) -> [[time, id, matched, expiry key], ...]

    def insert_probe(self, side, keys, nulls, times, ids, ends=None):
        out = []
        for i, (k, null, t, pid) in enumerate(zip(keys, nulls, times, ids)):
            matched = False
            if not null:
                for r in self.rows[1 - side].get(k, []):
                    lt, rt = (t, r[0]) if side == 0 else (r[0], t)
                    if lt + self.lower <= rt <= lt + self.upper:
                        out.append((i, r[1]))
                        r[2] = True
                        matched = True
            self.rows[side].setdefault(None if null else k, []).append([t, pid, matched, t if ends is None else ends[i]])
        return out

    def evict(self, side, threshold):
        gone = sorted((r[1], r[2]) for r in self.live(side) if r[3] <= threshold)
        for rows in self.rows[side].values():
            rows[:] = [r for r in rows if r[3] > threshold]
        return gone

    def live(self, side):
        return [r for rows in self.rows[side].values() for r in rows]

    def keys(self, side):
        return sum(1 for k, rows in self.rows[side].items() if k is not None and rows)


def _bytes_keys(keys):
    offsets, data, _ = encode_keys([pa.array(keys, type=pa.string())], join.concat_keys)
    return offsets, data


def _run_kernel(kernel, side, keys, nulls, times, ids):
    offsets, data = _bytes_keys(keys)
    idx, other = kernel.insert_probe(side, offsets, data, np.array(nulls, dtype=np.uint8),
                                     np.array(times, dtype=np.int64), np.array(ids, dtype=np.int64))
    return sorted(zip(idx.tolist(), other.tolist()))


row = st.tuples(st.sampled_from(["a", "b", "c", "", "ab", "a long key of many bytes"]),
                st.booleans(), st.integers(-50, 50))
step = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 1), st.lists(row, max_size=12)),
    st.tuples(st.just("evict"), st.integers(0, 1), st.integers(-60, 60)),
    st.tuples(st.just("roundtrip"), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(-20, 10), st.integers(0, 20), st.lists(step, max_size=25))
def test_kernel_matches_reference(lower, width, steps):
    upper = lower + width
    kernel = join.JoinState(lower, upper)
    ref = Reference(lower, upper)
    next_id = 0
    for op, side, arg in steps:
        if op == "insert":
            keys = [k for k, _, _ in arg]
            nulls = [n and i % 3 == 0 for i, (_, n, _) in enumerate(arg)]
            times = [t for _, _, t in arg]
            ids = list(range(next_id, next_id + len(arg)))
            next_id += len(arg)
            assert _run_kernel(kernel, side, keys, nulls, times, ids) == sorted(
                ref.insert_probe(side, keys, nulls, times, ids))
        elif op == "evict":
            got_ids, got_flags = kernel.evict(side, arg)
            assert sorted(zip(got_ids.tolist(), (got_flags != 0).tolist())) == ref.evict(side, arg)
        else:
            kernel = join.JoinState.deserialize(kernel.serialize())
        for s in (0, 1):
            assert kernel.rows(s) == len(ref.live(s))
            times = [r[0] for r in ref.live(s)]
            assert kernel.min_time(s) == (min(times) if times else None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 40)), max_size=60),
       st.integers(0, 40))
def test_canonical_ids_renumber_in_serialization_order(rows, threshold):
    kernels = [join.JoinState(-5, 5), join.JoinState(-5, 5)]
    for i, (side, key, t) in enumerate(rows):
        offsets, data = _bytes_keys([str(key)])
        for kernel in kernels:
            kernel.insert_probe(side, offsets, data, None, np.array([t]), np.array([i]))
    plain, canon = kernels
    for kernel in kernels:
        kernel.evict(0, threshold)
    old = canon.canonical_ids(0, len(rows))
    assert sorted(old.tolist()) == sorted(i for i, (side, _, t) in enumerate(rows) if side == 0 and t > threshold)
    # the image lists the rows in the new id order: its delta-coded ids column is all ones (format 3)
    assert (_image_columns(canon.serialize())[1][4] == 1).all()
    ids_plain, flags_plain = plain.evict(0, 10**6)
    ids_canon, flags_canon = canon.evict(0, 10**6)
    assert sorted(zip(ids_plain.tolist(), flags_plain.tolist())) == \
        sorted(zip(old[ids_canon].tolist(), flags_canon.tolist()))
    with pytest.raises(ValueError, match="payload_len"):
        join.JoinState(-5, 5).canonical_ids(0, -1)


def _image_columns(blob: bytes) -> list[list[np.ndarray]]:
    """The columns of a kernel image: [meta], then per side klen, kdata, count, times, ids, flags, ..."""
    ncols = struct.unpack_from("<I", blob, 4)[0]
    pos, cols = 8, []
    for _ in range(ncols):
        code, size, n = struct.unpack_from("<BBQ", blob, pos)
        dtype = {1: np.uint8, 4: np.uint32, 8: np.int64}[size]
        cols.append(np.frombuffer(blob, dtype=dtype, count=n, offset=pos + 10))
        pos += 10 + size * n
    per = (ncols - 1) // 2
    return [cols[:1], cols[1:1 + per], cols[1 + per:]]


def test_probe_band_is_inclusive_at_both_bounds():
    kernel = join.JoinState(-10, 20)
    offsets, data = _bytes_keys(["k"])
    kernel.insert_probe(0, offsets, data, None, np.array([100]), np.array([7]))
    offsets, data = _bytes_keys(["k"] * 4)
    idx, other = kernel.insert_probe(1, offsets, data, None, np.array([89, 90, 120, 121]), np.arange(4))
    assert idx.tolist() == [1, 2] and other.tolist() == [7, 7]


def test_eviction_touches_only_expiring_rows():
    kernel = join.JoinState(0, 0)
    n = 10_000
    keys = np.arange(n, dtype=np.int64)
    kernel.insert_probe(0, np.arange(n + 1, dtype=np.int64) * 8, keys.view(np.uint8), None,
                        np.arange(n, dtype=np.int64), keys)
    ids, _ = kernel.evict(0, 9)
    assert sorted(ids.tolist()) == list(range(10)) and kernel.rows(0) == n - 10
    ids, _ = kernel.evict(0, 9)
    assert len(ids) == 0


def test_keys_compare_exactly_not_by_hash():
    # Distinct keys of equal length and prefix must never match, whatever their hashes.
    kernel = join.JoinState(0, 0)
    n = 5000
    left = [f"key-{i:06d}" for i in range(n)]
    offsets, data = _bytes_keys(left)
    kernel.insert_probe(0, offsets, data, None, np.zeros(n, dtype=np.int64), np.arange(n))
    right = [f"key-{i:06d}" for i in range(n, 2 * n)] + ["key-000042"]
    offsets, data = _bytes_keys(right)
    idx, other = kernel.insert_probe(1, offsets, data, None, np.zeros(len(right), dtype=np.int64),
                                     np.arange(len(right)))
    assert idx.tolist() == [n] and other.tolist() == [42]


def test_concat_keys_is_injective():
    a = (np.array([0, 2, 3], dtype=np.int64), np.frombuffer(b"abc", dtype=np.uint8))   # "ab", "c"
    b = (np.array([0, 1, 3], dtype=np.int64), np.frombuffer(b"abc", dtype=np.uint8))   # "a", "bc"
    offsets, data = join.concat_keys([a, b])
    first = bytes(data[offsets[0]:offsets[1]])
    second = bytes(data[offsets[1]:offsets[2]])
    assert first != second


def test_float_keys_follow_sql_equality():
    arr = pa.array([0.0, -0.0, float("nan"), float("-nan"), 1.5, None])
    offsets, data, null = encode_keys([arr], join.concat_keys)
    enc = [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(arr))]
    assert enc[0] == enc[1] and enc[2] == enc[3] and enc[0] != enc[4]
    assert null.tolist() == [0, 0, 0, 0, 0, 1]


def test_state_blob_errors_are_readable():
    kernel = join.JoinState(-1, 1)
    offsets, data = _bytes_keys(["x"])
    kernel.insert_probe(0, offsets, data, None, np.array([5]), np.array([0]))
    blob = kernel.serialize()
    restored = join.JoinState.deserialize(blob)
    assert restored.rows(0) == 1 and (restored.lower, restored.upper) == (-1, 1)
    with pytest.raises(ValueError, match="truncated|corrupt"):
        join.JoinState.deserialize(blob[:-3])
    with pytest.raises(ValueError, match="not pyspark-cq state"):
        join.JoinState.deserialize(b"garbage!")
    with pytest.raises(ValueError, match="lower must be <= upper"):
        join.JoinState(2, 1)
    with pytest.raises(ValueError, match="side must be 0"):
        kernel.evict(2, 0)
    with pytest.raises(ValueError, match="offsets"):
        kernel.insert_probe(0, np.array([0, 5], dtype=np.int64), np.zeros(2, np.uint8), None,
                            np.array([1]), np.array([1]))


@pytest.mark.parametrize("wm_ms, lower, upper", [
    (10_000, -5_000_000, 10_000_000), (10_000, 0, 0), (1_700_000_000_123, -1, 999),
    (0, -10_000_000, 10_000_000), (5, 1_500, 2_500)])
def test_state_watermarks_follow_spark(wm_ms, lower, upper):
    # Spark: value = wm*1000 - upper (left) / wm*1000 + lower (right) µs, to ms truncating toward
    # zero, minus 1 ms; rows with t <= value*1000 are evicted.
    left, right = state_watermarks(wm_ms, lower, upper)
    exp_left = (int((wm_ms * 1000 - upper) / 1000) - 1) * 1000
    exp_right = (int((wm_ms * 1000 + lower) / 1000) - 1) * 1000
    assert (left, right) == (exp_left, exp_right)
    # Safety: no evicted left row can match a right row that is not late (right.t > wm).
    assert left + upper < wm_ms * 1000 + 1
    assert right - lower < wm_ms * 1000 + 1


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([3, 40, 1000]), st.booleans())
def test_kernel_matches_reference_at_scale(seed, nkeys, ordered_ends):
    """Large and many calls, expiry keys unrelated to times: sorted runs and their merges, the radix
    sort, rows leaving out of chain order (the kernel's slow path), out-of-order inserts, reloads."""
    rng = np.random.default_rng(seed)
    lower, upper = -20, 30
    kernel = join.JoinState(lower, upper)
    ref = Reference(lower, upper)
    next_id, clock = 0, 0
    for _ in range(60):
        op = rng.choice(["insert", "insert", "insert", "evict", "roundtrip", "rekey"], p=[.3, .3, .15, .15, .05, .05])
        side = int(rng.integers(0, 2))
        if op == "insert":
            n = int(rng.choice([1, 3, 20, 300, 700]))
            keys = rng.integers(0, nkeys, n).astype(np.int64)
            times = clock + rng.integers(-50, 100, n)
            ends = times + rng.integers(0, 60, n) if ordered_ends else clock + rng.integers(-100, 400, n)
            ids = np.arange(next_id, next_id + n, dtype=np.int64)
            next_id += n
            clock += int(rng.integers(0, 40))
            idx, other = kernel.insert_probe(side, np.arange(n + 1, dtype=np.int64) * 8, keys.view(np.uint8), None,
                                             times, ids, ends=ends)
            expected = ref.insert_probe(side, keys.tolist(), [False] * n, times.tolist(), ids.tolist(), ends.tolist())
            assert sorted(zip(idx.tolist(), other.tolist())) == sorted(expected)
        elif op == "evict":
            threshold = clock + int(rng.integers(-100, 100))
            got_ids, got_flags = kernel.evict(side, threshold)
            assert sorted(zip(got_ids.tolist(), (got_flags != 0).tolist())) == ref.evict(side, threshold)
        elif op == "rekey":  # new expiry keys for a side's rows, a function of their times (set_ends)
            a = int(rng.integers(1, 1000))

            def rekey(t, a=a):
                return t + (t * a) % 97 - 20
            times, _, _ = kernel.row_bounds(side)
            kernel.set_ends(side, np.array([rekey(t) for t in times.tolist()], dtype=np.int64))
            for r in ref.live(side):
                r[3] = rekey(r[0])
        else:
            kernel = join.JoinState.deserialize(kernel.serialize())
        for s in (0, 1):
            live = ref.live(s)
            assert kernel.rows(s) == len(live)
            assert kernel.keys(s) == ref.keys(s)
            assert kernel.min_end(s) == (min(r[3] for r in live) if live else None)


def test_a_row_leaving_before_an_older_row_keeps_the_older_row_reachable():
    # Expiry keys need not follow times (per-row bands): the newer row leaves first, the older stays
    # and must still match.
    kernel = join.JoinState(-20, 30)
    offsets, key = np.arange(2, dtype=np.int64) * 8, np.array([7], dtype=np.int64).view(np.uint8)
    kernel.insert_probe(0, offsets, key, None, np.array([10]), np.array([1]), ends=np.array([100]))
    kernel.insert_probe(0, offsets, key, None, np.array([20]), np.array([2]), ends=np.array([50]))
    ids, _ = kernel.evict(0, 60)
    assert ids.tolist() == [2] and kernel.rows(0) == 1 and kernel.keys(0) == 1
    idx, other = kernel.insert_probe(1, offsets, key, None, np.array([15]), np.array([3]))
    assert other.tolist() == [1]


def test_new_expiry_keys_keep_older_rows_reachable():
    # set_ends (used when restoring a format-1 image) may give an older row a later expiry key than a
    # newer row of its chain; the newer row leaving must not take the older one with it.
    kernel = join.JoinState(-20, 30)
    offsets, key = np.arange(3, dtype=np.int64) * 8, np.array([7, 7], dtype=np.int64).view(np.uint8)
    kernel.insert_probe(0, offsets, key, None, np.array([10, 20]), np.array([1, 2]))
    times, _, _ = kernel.row_bounds(0)
    kernel.set_ends(0, np.where(times == 10, 100, 50).astype(np.int64))
    ids, _ = kernel.evict(0, 60)
    assert ids.tolist() == [2] and kernel.rows(0) == 1
    idx, other = kernel.insert_probe(1, offsets[:2], key[:8], None, np.array([15]), np.array([3]))
    assert other.tolist() == [1]
