"""percentile_approx's DDSketch in the native kernel, without Spark: the map-side slicer
(``preaggregate``) and the sliding queue (``ShardState``: two-stacks merge, slices arriving out of
order, save / restore, eviction) against exact quantiles computed with numpy.

The oracle is the value of rank ``ceil(p * n)`` (at least 1) of the sorted window -- what Spark's
``percentile_approx`` returns while it is exact (windows of at most 10 000 rows at its default accuracy)
-- and the documented bound is the relative accuracy ``alpha`` of DDSketch (Masson, Rim, Lee, VLDB 2019,
§2), for values within the stores' ``gamma^(DD_BINS - 1)`` range below each sign's largest
magnitude (docs/aggregate.md, *Statistical aggregates*).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from pyspark_cq import _aggregate as K
from pyspark_cq.operators.aggregate import spec as S

QS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.3, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]
W, STEP = 20, 5


def _exact(v: np.ndarray, q: float) -> float:
    """Spark's rank rule (QuantileSummaries.query on an exact summary): sorted value of rank ceil(q·n)."""
    v = np.sort(v, kind="stable")
    return float(v[max(1, math.ceil(q * len(v))) - 1])


def _spec():
    ops = np.array([K.OP_ROWS, -1, K.OP_DDSKETCH, 0] + [K.OP_PAIR_VALUE, 0] * (K.DD_WORDS - 1), dtype=np.int32)
    kinds = np.array([K.KIND_ADD_I64, K.KIND_DDSKETCH] + [K.KIND_PAIR_VALUE] * (K.DD_WORDS - 1), dtype=np.uint8)
    outs = np.array([x for q in QS for x in (K.OUT_QUANTILE, 1, round(q * K.QUANTILE_UNITS))], dtype=np.int32)
    return ops, kinds, outs


def _windows(keys, times, x, chunks=6, seed=0):
    """All windows [k·STEP, k·STEP + W) of the rows, computed by the kernel: rows cut into `chunks`
    micro-batches by time, each shuffled (slices arrive out of order inside the queue), the state saved
    and restored between batches, windows emitted as the watermark passes them and slices evicted."""
    ops, kinds, outs = _spec()
    rng = np.random.default_rng(seed)
    state = K.ShardState(kinds, outs, False)
    bounds = np.linspace(times.min(), times.max() + 1, chunks + 1).astype(np.int64)
    got = {}
    late_end = None
    for c in range(chunks):
        sel = np.flatnonzero((times >= bounds[c]) & (times < bounds[c + 1]))
        sel = rng.permutation(sel)
        sl = K.preaggregate(keys[sel], times[sel], None, 1, ops, [x[sel]], [None])
        slot, _, late, _ = state.ingest(sl["hash"], sl["start"], sl["partials"], W, STEP, late_end)
        assert late == 0
        wm = int(bounds[c + 1]) - W if c + 1 < chunks else None
        slots, starts, _, values, valids = state.emit_windows(W, STEP, late_end, wm, False)
        hashes = state.key_hashes
        for i in range(len(slots)):
            got[(int(hashes[slots[i]]), int(starts[i]))] = [
                float(values[o][i:i + 1].view(np.float64)[0]) if valids[o][i] else None for o in range(len(QS))]
        if wm is not None:
            state.evict(W, STEP, wm)
            state = K.ShardState.from_bytes(state.to_bytes(), kinds, outs, False)
            state.watermark = wm
            late_end = wm
    return got


def _check(keys, times, x, *, rel=S.DD_ALPHA):
    got = _windows(keys, times, x)
    n_windows = 0
    for (key, start), vals in got.items():
        m = (keys == key) & (times >= start) & (times < start + W)
        assert m.any()
        n_windows += 1
        for q, g in zip(QS, vals):
            want = _exact(x[m], q)
            if math.isnan(want):
                assert math.isnan(g), (key, start, q, g, want)
            elif math.isinf(want) or want == 0 or q in (0.0, 1.0):
                assert g == want, (key, start, q, g, want)   # infinities, zeros, min and max are exact
            else:
                assert abs(g - want) <= rel * abs(want) * (1 + 1e-9), (key, start, q, g, want)
    # every window with rows was emitted
    want_windows = {(int(k), int(s)) for k, t in zip(keys, times) for s in range((t - W) // STEP * STEP + STEP, t + 1, STEP)}
    assert set(got) == want_windows and n_windows > 10


@pytest.mark.parametrize("dist", ["lognormal", "mixed_signs", "exponential", "integers", "pareto"])
def test_sketch_within_alpha_of_exact_quantiles(dist):
    rng = np.random.default_rng(hash(dist) % 2**32)
    n = 6000
    keys = rng.integers(0, 3, n).astype(np.int64)
    times = rng.integers(0, 120, n).astype(np.int64)
    if dist == "lognormal":      # 7 decades: within the stores' range (gamma^511 ~ 7.5e8 at alpha = 0.02)
        x = rng.lognormal(0, 2, n)
    elif dist == "mixed_signs":  # negatives, positives and exact zeros
        x = np.where(rng.random(n) < 0.1, 0.0, rng.normal(-3, 50, n))
    elif dist == "exponential":
        x = rng.exponential(1e6, n)
    elif dist == "integers":     # small integers: many ties
        x = rng.integers(-20, 60, n).astype(np.float64)
    else:
        x = -(rng.pareto(1.5, n) + 1) * 1e-3   # heavy tail, all negative
    _check(keys, times, x)


def test_infinities_nan_and_zeros_in_sparks_order():
    """Spark orders -inf < negatives < -0.0 == 0.0 < positives < +inf < NaN (checked against
    percentile_approx of [1, NaN, inf, -inf, 2, -0.0, 0.0]: -inf, -0.0, 0.0, 1, 2, inf, NaN at
    p = 0, 0.2, 0.3, 0.5, 0.7, 0.8, 1)."""
    x = np.array([1.0, np.nan, np.inf, -np.inf, 2.0, -0.0, 0.0])
    n = len(x)
    keys = np.zeros(n, dtype=np.int64)
    times = np.full(n, 7, dtype=np.int64)
    got = _windows(keys, times, x, chunks=1)
    assert len(got) == W // STEP
    for vals in got.values():
        for q, g in zip(QS, vals):
            want = _exact(x, q)   # numpy sorts NaN last, as Spark
            if math.isnan(want) or math.isinf(want) or want == 0:
                assert (math.isnan(g) and math.isnan(want)) or g == want, (q, g, want)   # exact
            else:
                assert abs(g - want) <= S.DD_ALPHA * abs(want), (q, g, want)


@pytest.mark.parametrize("signs", ["positive", "both"])
def test_collapsed_buckets_keep_the_high_quantiles_and_stay_in_range(signs):
    """Magnitudes spanning more than a store's capacity (all DD_BINS bins for one sign, half each with both
    signs): the lowest buckets collapse (DDSketch §2.2), the quantiles of the values above the collapse
    keep alpha, the others stay within [min, max] and within the collapse bound in absolute terms."""
    rng = np.random.default_rng(3)
    n = 3000
    x = 10.0 ** rng.uniform(-22, 6, n)    # 28 decades
    if signs == "both":
        x = np.where(rng.random(n) < 0.4, -x, x)
    keys = np.zeros(n, dtype=np.int64)
    times = rng.integers(0, 40, n).astype(np.int64)
    alpha = S.DD_ALPHA * 0.995            # the kernel's buckets (kDDAlphaBuild: a margin below the bound)
    gamma = (1 + alpha) / (1 - alpha)
    collapsed = 0
    for (_key, start), vals in _windows(keys, times, x).items():
        v = x[(times >= start) & (times < start + W)]
        cap = S.DD_BINS // 2 if (v < 0).any() and (v > 0).any() else S.DD_BINS
        for q, g in zip(QS, vals):
            want = _exact(v, q)
            assert v.min() <= g <= v.max()
            same_sign = v[np.sign(v) == np.sign(want)]
            floor = np.abs(same_sign).max() * gamma ** -(cap - 1)
            if abs(want) > floor * gamma:
                assert abs(g - want) <= S.DD_ALPHA * abs(want) * (1 + 1e-9), (q, g, want)
            else:
                collapsed += 1
                assert abs(g - want) <= floor * gamma ** 2, (q, g, want)
    assert collapsed > 0


def test_empty_and_all_null_windows_are_null():
    ops, kinds, outs = _spec()
    sl = K.preaggregate(np.zeros(3, dtype=np.int64), np.array([0, 1, 2], dtype=np.int64), None, 1, ops,
                        [np.array([1.0, 2.0, 3.0])], [np.array([0, 0, 0], dtype=np.uint8)])
    state = K.ShardState(kinds, outs, False)
    state.ingest(sl["hash"], sl["start"], sl["partials"], W, STEP, None)
    _, _, _, _, valids = state.emit_windows(W, STEP, None, None, False)
    assert all(not v.any() for v in valids) and len(valids[0]) > 0


def test_codes_agree_with_the_kernel():
    for name in ("OP_DDSKETCH", "KIND_DDSKETCH", "OUT_QUANTILE", "DD_WORDS", "DD_BINS", "DD_ALPHA", "QUANTILE_UNITS"):
        assert getattr(S, name) == getattr(K, name), name


def test_kernel_rejects_malformed_quantile_outputs():
    _, kinds, _ = _spec()
    with pytest.raises(ValueError, match="DDSketch partial"):
        K.ShardState(kinds, np.array([K.OUT_QUANTILE, 0, 5], dtype=np.int32), False)
    with pytest.raises(ValueError, match="percentage"):
        K.ShardState(kinds, np.array([K.OUT_QUANTILE, 1, K.QUANTILE_UNITS + 1], dtype=np.int32), False)
    with pytest.raises(ValueError, match="lacks its value partials"):
        K.ShardState(kinds[:-1], np.array([K.OUT_QUANTILE, 1, 5], dtype=np.int32), False)


def test_parse_quantile_forms_and_names():
    assert S.parse_quantile("v", "percentile_approx(0.95)") == ("percentile_approx(0.95)", 0.95)
    assert S.parse_quantile("v", " APPROX_PERCENTILE( .5 ) ") == ("approx_percentile(0.5)", 0.5)
    assert S.parse_quantile("v", "median") is None
    assert S.quantile_output_name("percentile_approx(0.95)", 0.95, "v") == "percentile_approx_0_95_v"
    assert S.quantile_output_name("percentile_approx(1.0)", 1.0, "v") == "percentile_approx_1_v"
    for bad, text in (("percentile_approx", "needs its percentage"), ("percentile_approx(1.5)", r"must be in \[0, 1\]"),
                      ("percentile_approx(0.5, 100)", "takes one argument"), ("percentile_approx(nan)", r"\[0, 1\]"),
                      ("percentile_approx(x)", "must be a number")):
        with pytest.raises(ValueError, match=r"aggs\['v'\]: .*" + text):
            S.parse_quantile("v", bad)


def test_merge_order_does_not_change_the_result():
    """The collapsing merge is associative and commutative (docs/aggregate.md): one ingest of all rows
    and six out-of-order micro-batches with save / restore give bit-identical quantiles."""
    rng = np.random.default_rng(8)
    n = 4000
    keys = rng.integers(0, 2, n).astype(np.int64)
    times = rng.integers(0, 90, n).astype(np.int64)
    x = np.where(rng.random(n) < 0.5, -1.0, 1.0) * 10.0 ** rng.uniform(-14, 14, n)   # collapses often
    once, batched = _windows(keys, times, x, chunks=1), _windows(keys, times, x, chunks=6, seed=5)
    assert once == batched and len(once) > 20


def test_change_intervals_of_quantiles():
    """emit="changes": adjacent granules with equal quantiles merge into one interval (PIPES output)."""
    ops, kinds, outs = _spec()
    t = np.array([0, 1, 2, 10], dtype=np.int64)
    sl = K.preaggregate(np.zeros(4, dtype=np.int64), t, None, 1, ops, [np.array([5.0, 5.0, 7.0, 5.0])], [None])
    state = K.ShardState(kinds, outs, True)
    state.ingest(sl["hash"], sl["start"], sl["partials"], 3, 1, None)
    _, frm, to, values, valids = state.emit_changes(3, 1, None, None)
    def column(q):
        return list(zip(frm.tolist(), to.tolist(), values[QS.index(q)].view(np.float64).tolist()))
    # granules [0,1) {5}, [1,2) {5,5}, [2,3) {5,5,7}, [3,4) {5,7}, [4,5) {7}, [10,13) {5}
    assert column(0.0) == [(0, 2, 5.0), (2, 3, 5.0), (3, 4, 5.0), (4, 5, 7.0), (10, 13, 5.0)]
    assert column(1.0) == [(0, 2, 5.0), (2, 3, 7.0), (3, 4, 7.0), (4, 5, 7.0), (10, 13, 5.0)]
    median = column(0.5)
    assert median[1][2] == pytest.approx(5.0, rel=S.DD_ALPHA) and median[2][2] == 5.0   # rank 2 of 3; rank 1 of 2
    assert valids[0].all()
