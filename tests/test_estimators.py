"""Online estimators: one shared check suite run against every estimator, then per-estimator checks."""
import math
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_cq.estimators import (
    ArrivalRate,
    DecayedMean,
    Estimator,
    ExponentialSmoothing,
    JoinSelectivityHistogram,
    MeanDistance,
    Mergeable,
    SampledSelectivity,
    sample_mask,
)


@pytest.fixture(scope="module", autouse=True)
def numba_cache_dir(tmp_path_factory):
    """Compile the kernels into a writable cache (kept across runs) unless NUMBA_CACHE_DIR is set."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        yield
        return
    path = tmp_path_factory.getbasetemp().parent / "pyspark-cq-numba-cache"
    path.mkdir(exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    try:
        from numba.core import config

        config.reload_config()
        yield
    finally:
        del os.environ["NUMBA_CACHE_DIR"]


# --------------------------------------------------------------------------- plain-Python references


def ses_reference(xs, alpha):
    level = None
    for x in xs:
        level = x if level is None else level * (1 - alpha) + x * alpha
    return level


def decayed_reference(xs, window, decay):
    last = list(xs[-window:])[::-1]          # newest first: r = 0, 1, ...
    weights = [math.exp(-decay * r) for r in range(len(last))]
    return sum(w * x for w, x in zip(weights, last)) / sum(weights)


def exact_equijoin_selectivity(left, right):
    matches = sum(1 for a in left for b in right if a == b)
    return matches / (len(left) * len(right))


# --------------------------------------------------------------------------- the shared suite


@dataclass
class Case:
    name: str
    make: Callable[[], Estimator]
    data: Callable[[np.random.Generator], list]          # a list of observations (each an argument tuple)
    reference: Callable[[list], float]
    stationary_truth: float | None = None                  # value on the stationary `data`, if known
    tolerance: float = 0.0

    def feed(self, est, items):
        for args in items:
            est.update(*args)
        return est

    def feed_many(self, est, items):
        # group by the extra arguments (the histogram's side), keep order within a group
        groups = {}
        for args in items:
            groups.setdefault(args[1:], []).append(args[0])
        for extra, xs in groups.items():
            est.update_many(np.asarray(xs), *extra)
        return est


def arrivals(rng, n=2_000, lam=4.0):
    return [(t,) for t in np.cumsum(rng.exponential(1 / lam, n))]


CASES = [
    Case("ExponentialSmoothing", lambda: ExponentialSmoothing(alpha=0.05),
         lambda rng: [(x,) for x in rng.normal(3.0, 1.0, 3_000)],
         lambda items: ses_reference([x for x, in items], 0.05), 3.0, 5 * math.sqrt(0.05 / 1.95)),
    Case("DecayedMean", lambda: DecayedMean(window=200, decay=0.01),
         lambda rng: [(x,) for x in rng.normal(-2.0, 1.0, 1_000)],
         lambda items: decayed_reference([x for x, in items], 200, 0.01), -2.0, 0.6),
    Case("ArrivalRate", ArrivalRate, arrivals,
         lambda items: (len(items) - 1) / (max(items)[0] - min(items)[0]), 4.0, 0.4),
    Case("MeanDistance", MeanDistance, arrivals,
         lambda items: (max(items)[0] - min(items)[0]) / (len(items) - 1), 0.25, 0.025),
    Case("SampledSelectivity", SampledSelectivity,
         lambda rng: [(bool(x),) for x in rng.random(4_000) < 0.3],
         lambda items: sum(x for x, in items) / len(items), 0.3, 0.03),
    Case("JoinSelectivityHistogram", lambda: JoinSelectivityHistogram(0, 20, 20),
         lambda rng: [(float(k), "left") for k in rng.integers(0, 20, 300)]
         + [(float(k), "right") for k in rng.integers(0, 20, 200)],
         lambda items: exact_equijoin_selectivity([k for k, s in items if s == "left"],
                                                  [k for k, s in items if s == "right"]), 1 / 20, 0.01),
]
IDS = [c.name for c in CASES]


@pytest.fixture(params=CASES, ids=IDS)
def case(request):
    return request.param


def data_of(case, seed=0):
    return case.data(np.random.default_rng(seed))


def test_matches_plain_reference(case):
    items = data_of(case)
    est = case.feed(case.make(), items)
    assert est.value == pytest.approx(case.reference(items), rel=1e-9)
    assert est.n == len(items)


def test_update_many_equals_updates(case):
    items = data_of(case, 1)
    one = case.feed(case.make(), items)
    half = len(items) // 3
    many = case.feed_many(case.make(), items[:half])
    case.feed_many(many, items[half:])
    assert many.value == pytest.approx(one.value, rel=1e-9)
    assert many.n == one.n
    case.feed_many(many, [])  # an empty batch changes nothing
    assert many.value == pytest.approx(one.value, rel=1e-9)


def test_pickle_round_trip(case):
    items = data_of(case, 2)
    est = case.feed_many(case.make(), items[:100])
    copy = pickle.loads(pickle.dumps(est))
    assert type(copy) is type(est) and copy.n == est.n
    assert copy.value == pytest.approx(est.value, rel=0, abs=0) or (math.isnan(copy.value) and math.isnan(est.value))
    case.feed(est, items[100:])
    case.feed(copy, items[100:])
    assert copy.value == est.value


def test_clone_and_empty(case):
    est = case.make()
    assert math.isnan(est.value) and est.n == 0
    case.feed(est, data_of(case)[:50])
    fresh = est.clone()
    assert type(fresh) is type(est) and fresh.params() == est.params()
    assert fresh.n == 0 and math.isnan(fresh.value)
    assert type(est).__name__ in repr(est)


def test_merge(case):
    items = data_of(case, 3)
    est = case.make()
    if not isinstance(est, Mergeable):
        with pytest.raises(TypeError):
            est + case.make()
        return
    rng = np.random.default_rng(4)
    mask = rng.random(len(items)) < 0.4
    a = case.feed(case.make(), [x for x, m in zip(items, mask) if m])
    b = case.feed(case.make(), [x for x, m in zip(items, mask) if not m])
    whole = case.feed(case.make(), items)
    merged = a + b
    assert merged.value == pytest.approx(whole.value, rel=1e-9) and merged.n == whole.n
    assert a.n == int(mask.sum())          # `+` does not change its operands
    a += b
    assert a.value == pytest.approx(whole.value, rel=1e-9)
    with pytest.raises(TypeError):
        a + ExponentialSmoothing()
    with pytest.raises(TypeError):
        a.merge(3)


def test_converges_on_stationary_input(case):
    est = case.feed_many(case.make(), data_of(case, 5))
    assert est.value == pytest.approx(case.stationary_truth, abs=case.tolerance)


def test_rejects_bad_input(case):
    est = case.make()
    extra = data_of(case)[0][1:]
    with pytest.raises(TypeError):
        est.update("1", *extra)
    with pytest.raises(ValueError):
        est.update(float("nan"), *extra)
    with pytest.raises(ValueError):
        est.update_many(np.ones((2, 2)), *extra)
    with pytest.raises(TypeError):
        est.update_many(np.array(["a", "b"]), *extra)
    assert est.n == 0


# --------------------------------------------------------------------------- per estimator


@pytest.mark.parametrize("bad, exc", [({"alpha": 0}, ValueError), ({"alpha": 1}, ValueError),
                                      ({"alpha": "0.5"}, TypeError), ({"initial": float("inf")}, ValueError)])
def test_exponential_smoothing_arguments(bad, exc):
    with pytest.raises(exc, match=next(iter(bad))):
        ExponentialSmoothing(**{"alpha": 0.5, **bad})


def test_exponential_smoothing_formula():
    # C = C·(1-α) + C_new·α (RTStream §4.1.3), from a given initial level
    est = ExponentialSmoothing(alpha=0.25, initial=10.0).update(2.0)
    assert est.value == pytest.approx(10 * 0.75 + 2 * 0.25)
    assert ExponentialSmoothing(alpha=0.25, initial=10.0).update_many(np.array([2.0])).value == est.value
    assert ExponentialSmoothing(alpha=0.25).update(7.0).value == 7.0


def test_decayed_mean_formula():
    # OM §4.3 with a = ln 2: weights 1, 1/2, 1/4 for the three newest observations
    est = DecayedMean(window=3, decay=math.log(2)).update_many(np.array([100.0, 1.0, 2.0, 4.0]))
    assert est.value == pytest.approx((4 + 2 / 2 + 1 / 4) / (1 + 1 / 2 + 1 / 4))
    assert list(est.observations()) == [4.0, 2.0, 1.0]
    assert DecayedMean(window=4, decay=0).update_many(np.arange(10.0)).value == pytest.approx(7.5)
    with pytest.raises(ValueError, match="window"):
        DecayedMean(window=0)
    with pytest.raises(ValueError, match="decay"):
        DecayedMean(decay=-1)


def test_arrival_rate_details():
    est = ArrivalRate().update_many(np.array([5.0, 1.0, 3.0]))   # order does not matter
    assert est.value == pytest.approx(0.5) and est.mean_distance == pytest.approx(2.0) and est.span == 4.0
    assert math.isnan(ArrivalRate().update(1.0).value)
    assert ArrivalRate().update(1.0).update(1.0).value == math.inf


def test_sample_mask():
    mask = sample_mask(1_000, ratio=0.1, rng=3)
    assert mask.dtype == bool and mask.sum() == 100
    assert sample_mask(10, size=10, rng=1).all() and not sample_mask(10, size=0).any()
    assert sample_mask(0, size=0).size == 0
    # every element is equally likely: selection frequencies over many draws
    rng = np.random.default_rng(11)
    freq = sum(sample_mask(20, size=5, rng=rng).astype(int) for _ in range(4_000)) / 4_000
    assert np.allclose(freq, 0.25, atol=0.03)
    for kwargs, exc in [({}, ValueError), ({"ratio": 0.1, "size": 1}, ValueError), ({"size": 11}, ValueError),
                        ({"ratio": 1.5}, ValueError), ({"size": 2, "rng": "x"}, TypeError)]:
        with pytest.raises(exc):
            sample_mask(10, **kwargs)


def test_sampled_selectivity_error_matches_sampling_distribution():
    # population of 1000 with 300 qualifying elements; samples of 200 without replacement
    population = np.zeros(1_000, dtype=bool)
    population[:300] = True
    rng = np.random.default_rng(5)
    estimates, errors = [], []
    for _ in range(1_500):
        est = SampledSelectivity(population=1_000).update_many(population[sample_mask(1_000, size=200, rng=rng)])
        estimates.append(est.value)
        errors.append(est.stderr)
    true_se = math.sqrt((1_000 - 200) / (1_000 - 1) * 0.3 * 0.7 / 200)
    assert np.mean(estimates) == pytest.approx(0.3, abs=0.005)
    assert np.std(estimates) == pytest.approx(true_se, rel=0.08)
    assert np.mean(errors) == pytest.approx(true_se, rel=0.03)
    lo, hi = est.interval()
    assert 0 <= lo < est.value < hi <= 1


def test_sampled_selectivity_details():
    est = SampledSelectivity(population=4).update(True).update(0).update(1)
    assert est.value == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="population"):
        est.update(True).update(True)
    with pytest.raises(ValueError, match="xs"):
        SampledSelectivity().update_many(np.array([0.0, 2.0]))
    with pytest.raises(ValueError, match="x"):
        SampledSelectivity().update(0.5)
    # merging needs equal sampling fractions
    a = SampledSelectivity(population=100).update_many(np.ones(10))
    b = SampledSelectivity(population=200).update_many(np.zeros(20))
    assert (a + b).value == pytest.approx(1 / 3) and (a + b).population == 300
    with pytest.raises(ValueError, match="fraction"):
        a + SampledSelectivity(population=200).update_many(np.zeros(10))
    with pytest.raises(ValueError, match="population"):
        a + SampledSelectivity().update_many(np.zeros(10))


def test_join_histogram_details():
    h = JoinSelectivityHistogram(0, 100, 10)      # bins of 10 keys: keys uniform within a bin
    h.update_many(np.array([1.0, 2.0]), "left").update(5.0, side="right").update(250.0, side="right")
    # bin 0: 2 left × 1 right / 10 values; the key 250 lands in the last bin; 2 × 2 pairs in all
    assert h.value == pytest.approx(2 * 1 / 10 / (2 * 2))
    assert h.n == 4
    with pytest.raises(ValueError, match="side"):
        h.update(1.0, side="middle")
    with pytest.raises(ValueError, match="high"):
        JoinSelectivityHistogram(5, 5, 3)
    with pytest.raises(ValueError, match="other"):
        h + JoinSelectivityHistogram(0, 100, 20)


@settings(max_examples=40, deadline=None)
@given(c=st.floats(-1e6, 1e6), alpha=st.floats(0.01, 0.99), window=st.integers(1, 30), n=st.integers(1, 60),
       decay=st.floats(0, 3))
def test_constant_input_is_a_fixed_point(c, alpha, window, n, decay):
    xs = np.full(n, c)
    assert ExponentialSmoothing(alpha=alpha).update_many(xs).value == pytest.approx(c, abs=1e-9)
    assert DecayedMean(window=window, decay=decay).update_many(xs).value == pytest.approx(c, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(start=st.floats(-1e6, 1e6), step=st.floats(1e-3, 1e3), n=st.integers(2, 200))
def test_regular_arrivals(start, step, n):
    ts = start + step * np.arange(n)
    est = MeanDistance().update_many(ts)
    assert est.value == pytest.approx(step, rel=1e-6)
    assert ArrivalRate().update_many(ts).value == pytest.approx(1 / step, rel=1e-6)
