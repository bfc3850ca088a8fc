"""STREAM §5.1 precision model (pyspark_cq.cost.stream_precision): the formulas against hand-computed values and
a plain-numpy simulation of the operators (the paper's "shown to be correct ... empirically"), the memory
against PIPES eq. 9, and the allocator against a brute-force grid search."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pyspark_cq import plan as P
from pyspark_cq.cost import pipes
from pyspark_cq.cost.stream_precision import (
    EXACT,
    Precision,
    allocate,
    join_precision,
    kept_precision,
    measured_precision,
    plan_memory,
    plan_precision,
    selection_precision,
    window_band,
)


def _join(w=10_000, sel=None):
    left = P.Source("L") if sel is None else P.Select(P.Source("L"), sel)
    return P.Join(P.Window(left, w, label="j.window"), P.Window(P.Source("R"), w, label="j.window"))


# ---------------------------------------------------------------------------------------------
# formulas, by hand


def test_precision_definitions_by_hand():
    p = Precision(0.25, 3.0)          # a quarter of the correct tuples produced, a quarter of the output false
    assert p.recall == 0.25
    assert p.f1 == pytest.approx(2 * 0.75 * 0.25 / (0.75 + 0.25))
    assert EXACT.f1 == 1.0 and EXACT.recall == 1.0
    assert Precision.from_recall(0.0).fn == math.inf and Precision.from_recall(0.0).f1 == 0.0
    assert Precision.from_recall(0.2, 0.1) == Precision(0.1, 4.0)


def test_measured_precision_by_hand():
    assert measured_precision(50, 40, 100) == Precision(0.2, 1.5)
    assert measured_precision(0, 0, 10) == Precision(0.0, math.inf)
    assert measured_precision(0, 0, 0) == EXACT
    assert measured_precision(10, 10, 10) == EXACT


def test_unary_operators_by_hand():
    inp = Precision(0.1, 1.0)
    assert selection_precision(inp) == inp
    out = kept_precision(inp, 0.4)               # recall 0.5 -> 0.2, FP kept
    assert out.fp == 0.1 and out.recall == pytest.approx(0.2) and out.fn == pytest.approx(4.0)
    assert kept_precision(EXACT, 1.0) == EXACT


def test_join_by_hand():
    # recall 0.5·0.8 = 0.4 times the band 0.5: 0.2; FP 1 − 0.9·0.8 = 0.28
    out = join_precision(Precision(0.1, 1.0), Precision(0.2, 0.25), band=window_band([5, 5], [10, 10]))
    assert out.recall == pytest.approx(0.2) and out.fp == pytest.approx(0.28)
    # a window wider than the query's: 15/10 of the exact pairs produced, 10/10 correct: FP 1/3
    b = window_band([15, 15], [10, 10])
    assert b == (1.5, 1.0)
    wide = join_precision(EXACT, EXACT, band=b)
    assert wide.fp == pytest.approx(1 / 3) and wide.fn == 0.0
    # asymmetric windows: band (8 + 2)/(10 + 10)
    assert window_band([8, 2], [10, 10]) == (0.5, 0.5)


def test_plan_precision_composes_bottom_up():
    q = _join(10_000, sel=0.5)
    got = plan_precision(q, windows={"j.window": 2_500}, kept={"L": 0.5, "R": 0.8})
    assert got.recall == pytest.approx(0.25 * 0.5 * 0.8) and got.fp == 0.0
    assert plan_precision(q) == EXACT


def test_plan_precision_rejects_what_the_model_leaves_out():
    agg = P.Aggregate(P.Window(P.Source("L"), 10, label="a.window"))
    with pytest.raises(ValueError, match="Aggregate"):
        plan_precision(agg)
    with pytest.raises(ValueError, match="Union"):
        plan_precision(P.Union((P.Source("A"), P.Source("B"))))
    with pytest.raises(ValueError, match="feeds no join"):
        plan_precision(P.Select(P.Window(P.Source("L"), 10, label="w.window"), 0.5), windows={"w.window": 5})


# ---------------------------------------------------------------------------------------------
# formulas against a simulation: the operators run on generated streams in plain numpy


def _streams(rng, n_left, n_right, keys, duration):
    left = (rng.integers(0, keys, n_left), np.sort(rng.uniform(0, duration, n_left)))
    right = (rng.integers(0, keys, n_right), np.sort(rng.uniform(0, duration, n_right)))
    return left, right


def _pairs(left, right, w_left, w_right):
    """Index pairs (i, j) with equal keys and −w_right < t_l − t_r < w_left (the window join's band)."""
    out = []
    for i, (k, t) in enumerate(zip(*left)):
        sel = (right[0] == k) & (t - right[1] < w_left) & (right[1] - t < w_right)
        out.extend((i, j) for j in np.flatnonzero(sel))
    return set(out)


@pytest.mark.parametrize("w, kept_l, kept_r", [(10.0, 0.5, 1.0), (5.0, 0.7, 0.6), (2.5, 1.0, 0.3), (15.0, 0.8, 0.9)])
def test_join_formula_matches_a_simulation(w, kept_l, kept_r):
    rng = np.random.default_rng(7)
    left, right = _streams(rng, 3000, 1500, 20, 400.0)
    W = 10.0
    exact = _pairs(left, right, W, W)
    keep_l, keep_r = rng.random(3000) < kept_l, rng.random(1500) < kept_r
    got = {(i, j) for i, j in _pairs(left, right, w, w) if keep_l[i] and keep_r[j]}
    measured = measured_precision(len(got), len(got & exact), len(exact))
    predicted = plan_precision(_join(W), windows={"j.window": w}, kept={"L": kept_l, "R": kept_r})
    assert measured.recall == pytest.approx(predicted.recall, rel=0.06)
    assert measured.fp == pytest.approx(predicted.fp, abs=0.02)


def test_false_positives_propagate_through_a_join_as_simulated():
    # the left input carries false tuples (FP_L = 0.25 of it): a pair is correct iff its left tuple is
    rng = np.random.default_rng(3)
    left, right = _streams(rng, 4000, 2000, 20, 400.0)
    false_left = rng.random(4000) < 0.25
    pairs = _pairs(left, right, 10.0, 10.0)
    correct = {(i, j) for i, j in pairs if not false_left[i]}
    exact_n = len(correct)              # the exact result is the join of the correct tuples
    measured = measured_precision(len(pairs), len(correct), exact_n)
    predicted = join_precision(Precision(float(false_left.mean()), 0.0), EXACT)
    assert measured.fp == pytest.approx(predicted.fp, abs=0.02)
    assert measured.fn == predicted.fn == 0.0


# ---------------------------------------------------------------------------------------------
# memory: the PIPES formulas


def test_plan_memory_is_pipes_eq_9_with_thinned_sources():
    q = _join(10_000)
    for kept in ({}, {"L": 0.5}, {"L": 0.3, "R": 0.7}):
        d = {"L": 2.0 / kept.get("L", 1.0), "R": 5.0 / kept.get("R", 1.0)}
        expected = pipes.join_memory(pipes.window_output(pipes.SC(d["L"], 1), 4000),
                                     pipes.window_output(pipes.SC(d["R"], 1), 4000))
        assert plan_memory(q, {"L": 2.0, "R": 5.0}, windows={"j.window": 4000}, kept=kept) == pytest.approx(expected)
    # retention: a watermark-driven operator keeps window + δ + B
    assert plan_memory(q, {"L": 2.0, "R": 5.0}, windows={"j.window": 4000}, watermark_delay=500, batch_span=500) == \
        pytest.approx(plan_memory(q, {"L": 2.0, "R": 5.0}, windows={"j.window": 5000}))


# ---------------------------------------------------------------------------------------------
# the allocator against a brute-force grid search


def _grid_best(q, d, bound, w_rng, k_rng, n=21):
    best = (-1.0, None)
    ws = np.linspace(*w_rng, n)
    ks = np.linspace(*k_rng, n)
    for w, kl, kr in itertools.product(ws, ks, ks):
        settings = {"windows": {"j.window": w}, "kept": {"L": kl, "R": kr}}
        if plan_memory(q, d, **settings) <= bound:
            f1 = plan_precision(q, **settings).f1
            if f1 > best[0]:
                best = (f1, (w, kl, kr))
    return best


# the quick subset keeps the cheapest case; the grid searches of the others take 4-5 s each
@pytest.mark.parametrize("d_left, d_right, share, w_min", [
    pytest.param(1.0, 4.0, 0.4, 5000, marks=pytest.mark.slow), pytest.param(2.0, 2.0, 0.3, 2000, marks=pytest.mark.slow),
    pytest.param(1.0, 10.0, 0.6, 8000, marks=pytest.mark.slow), (3.0, 1.0, 0.15, 1000)])
def test_allocation_is_at_least_the_grid_optimum(d_left, d_right, share, w_min):
    q = _join(10_000, sel=0.5)
    d = {"L": d_left, "R": d_right}
    bound = share * plan_memory(q, d)
    grid_f1, _ = _grid_best(q, d, bound, (w_min, 10_000), (0.05, 1.0))
    a = allocate(q, d, bound, windows={"j.window": (w_min, 10_000)}, kept={"L": (0.05, 1.0), "R": (0.05, 1.0)})
    assert a.feasible and a.memory <= bound
    assert a.memory == pytest.approx(plan_memory(q, d, windows=a.windows, kept=a.kept))
    assert a.precision == plan_precision(q, windows=a.windows, kept=a.kept)
    assert a.precision.f1 >= grid_f1 - 2e-3
    assert w_min <= a.windows["j.window"] <= 10_000 and all(0.05 <= a.kept[s] <= 1 for s in "LR")


def test_allocation_when_everything_fits_and_when_nothing_does():
    q = _join(10_000)
    d = {"L": 1.0, "R": 4.0}
    full = plan_memory(q, d)
    a = allocate(q, d, full * 1.01, windows={"j.window": (5000, 10_000)}, kept={"L": (0.1, 1), "R": (0.1, 1)})
    assert a.feasible and a.precision.f1 == pytest.approx(1.0, abs=1e-6)
    none = allocate(q, d, full * 0.01, windows={"j.window": (5000, 10_000)}, kept={"L": (0.1, 1), "R": (0.1, 1)})
    assert not none.feasible and none.windows == {"j.window": 5000} and none.kept == {"L": 0.1, "R": 0.1}


@pytest.mark.parametrize("call, match", [
    (lambda: Precision(1.0, 0), "fp"),
    (lambda: Precision(0, -1), "fn"),
    (lambda: kept_precision(EXACT, 1.5), "kept"),
    (lambda: kept_precision("x", 0.5), "inp"),
    (lambda: window_band([1], [1, 2]), "windows and full"),
    (lambda: window_band([1, -1], [1, 1]), r"windows\[1\]"),
    (lambda: join_precision(EXACT, EXACT, band=(0.5, 0.6)), "band"),
    (lambda: measured_precision(5, 6, 10), "correct"),
    (lambda: plan_precision(_join(), windows={"x.window": 1}), "windows names"),
    (lambda: plan_precision(_join(), kept={"Z": 0.5}), "kept names"),
    (lambda: plan_precision(_join(), kept={"L": 2}), r"kept\['L'\]"),
    (lambda: plan_memory(_join(), {"L": 1.0}), "distances lacks"),
    (lambda: allocate(_join(), {"L": 1.0, "R": 1.0}, 0), "memory"),
    (lambda: allocate(_join(), {"L": 1.0, "R": 1.0}, 10, windows={"j.window": (5, 1)}), "min <= max"),
    (lambda: allocate(_join(), {"L": 1.0, "R": 1.0}, 10, kept={"L": (0.5, 2)}), r"kept\['L'\]"),
    (lambda: allocate(_join(), {"L": 1.0, "R": 1.0}, 10, starts=0), "starts"),
])
def test_arguments_validated(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()
