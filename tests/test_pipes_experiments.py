"""PIPES §5.1 and §5.3 on Spark, shortened (benchmarks/experiments/pipes_5_1_5_3.py holds the full runs).

The plain-Python oracle of the benchmark (pyspark_cq.experiments.pipes_join) (exact PIPES window-join semantics, expected state per
micro-batch) is checked on its own first, then the window join on Spark against it:

- §5.3 window reduction: the output is exactly the pairs whose validities intersect under 5 s windows,
  i.e. the baseline pairs with |Δt| < 5 s; load shedding: the output is the oracle's join of the rows that
  were not shed, the shed share and the kept-result share lie within a binomial-type bound of 1/2 and 1/4;
- §5.1 (time-scaled: 4 s → 2 s at 6 s, back to 4 s at 12 s, from the control table with explicit
  application times): the output equals the oracle, the state equals the expected state in every batch, and
  the rows valid at the watermark start to shrink only after t + min(w, w') and to grow only after the
  second change's t + min(w, w').

No timing assertions.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from pyspark_cq.experiments import pipes_join as B

S = B.S


# --- the oracle alone -----------------------------------------------------------------------------------


def test_oracle_window_reduction_keeps_exactly_the_close_pairs():
    st = B.make_streams(30, 100, 50, file_s=5, seed=2)
    base = B.oracle_pairs(st.left, st.right, B.window_schedule(initial_s=10))
    half = B.oracle_pairs(st.left, st.right, B.window_schedule(initial_s=5))
    close = base[np.abs(base.tr - base.tl) < 5 * S].reset_index(drop=True)
    assert B.compare_pairs(half, close)["equal"]
    # a finite stream loses more 10 s pairs than 5 s pairs at its ends: (2·5T − 25)/(2·10T − 100)
    t = 30.0
    assert len(half) / len(base) == pytest.approx((10 * t - 25) / (20 * t - 100), rel=0.02)


def test_oracle_state_and_pipes_estimate_follow_the_transitions():
    sched = B.window_schedule(B.SCHEDULE_5_1, initial_s=60)
    assert B.effect_windows(sched) == [(110.0, 140.0), (180.0, 210.0)]
    st = B.make_streams(300, 20, 100, file_s=5)
    e = B.oracle_state(st, sched, 1.0).dropna()
    est = B.pipes_state_estimate(e.wm_s.to_numpy(), 20, sched)
    # rows valid at the watermark = PIPES's estimate up to the per-element terms
    # (eq. 9: ⌈l/d⌉ and d_j / 2d_i per side)
    # (and during the first window, while the state fills, up to one element per side)
    assert np.max(np.abs(e.valid_at_wm.to_numpy() - est)) <= 5
    plateau = e[(e.wm_s >= 60) & (e.wm_s <= 110)]
    assert (plateau.valid_at_wm == 2 * 20 * 60).all()
    low = e[(e.wm_s >= 140) & (e.wm_s <= 180)]
    assert (low.valid_at_wm == 2 * 20 * 30).all()
    # Spark keeps every row after the watermark: λ·(delay + one file) per side, here 1 s + 5 s
    assert e.above_wm.iloc[1:].between(2 * 20 * 6 - 2, 2 * 20 * 6 + 2).all()


# --- on Spark -------------------------------------------------------------------------------------------


def _needs(arg):
    if not B.join_supports(arg):
        pytest.skip(f"window_join has no {arg}= yet")


def _pair_variance(pairs, keep):
    """Variance of the number of kept pairs when every element is kept independently with ``keep``:
    n·(q − q²) for q = keep², plus (keep³ − keep⁴) for every ordered pair of pairs sharing one element."""
    q = keep * keep
    shared = 0
    for col in ("lv", "rv"):
        deg = pairs[col].value_counts().to_numpy()
        shared += int(np.sum(deg * (deg - 1)))
    return len(pairs) * (q - q * q) + shared * (keep ** 3 - q * q)


@pytest.fixture(scope="module")
def streams_5_3(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pipes53"))
    st = B.make_streams(20, 100, 50, file_s=10, seed=5)       # two micro-batches
    B.write_streams(os.path.join(root, "in"), st)
    return root, st


@pytest.mark.slow
def test_5_3_window_reduction_on_spark(spark, streams_5_3):
    root, st = streams_5_3
    r = B.run_spark_join(spark, os.path.join(root, "in"), os.path.join(root, "wr"), window_s=5, delay_s=0.5)
    base = B.oracle_pairs(st.left, st.right, B.window_schedule(initial_s=10))
    close = base[np.abs(base.tr - base.tl) < 5 * S]
    check = B.compare_pairs(r["pairs"], close)
    assert check["equal"], check
    assert len(r["pairs"]) / len(base) == len(close) / len(base)
    # the state is exactly the expected one (Spark keeps what is after the watermark, plus 1 ms)
    exp = B.oracle_state(st, B.window_schedule(initial_s=5), 0.5)
    got = r["batches"][r["batches"].input_rows > 0].merge(exp, on="batch", suffixes=("", "_expected"))
    assert len(got) == st.n_files
    assert (got.state_rows == got.state_rows_expected).all(), got[["batch", "state_rows", "state_rows_expected"]]


def test_5_3_load_shedding_on_spark(spark, streams_5_3):
    _needs("drop_ratio")
    root, st = streams_5_3
    r = B.run_spark_join(spark, os.path.join(root, "in"), os.path.join(root, "ls"), window_s=10, delay_s=0.5,
                         drop_ratio=0.5, seed=11)
    b = r["batches"]
    n_in = 2 * len(st.left)
    shed = int(b.shed_rows.sum())
    assert abs(shed - n_in / 2) <= 5 * math.sqrt(n_in / 4)
    # the output is the join of the rows that were not shed: every pair of surviving rows that should join
    # does, and nothing else (a surviving row without any partner is invisible to this check)
    kept = B.kept_rows(r["pairs"], st)
    assert int(kept[0].sum() + kept[1].sum()) <= n_in - shed
    ref = B.oracle_pairs(st.left[kept[0]], st.right[kept[1]], B.window_schedule(initial_s=10))
    check = B.compare_pairs(r["pairs"], ref)
    assert check["equal"], check
    base = B.oracle_pairs(st.left, st.right, B.window_schedule(initial_s=10))
    assert set(map(tuple, r["pairs"][["lv", "rv"]].to_numpy())) <= set(map(tuple, base[["lv", "rv"]].to_numpy()))
    # every non-shed row is in the state right after its batch (its time is after the watermark), so the
    # state exceeds that of the rows seen in the output by exactly the non-shed rows that met no partner
    exp = B.oracle_state(st, B.window_schedule(initial_s=10), 0.5, kept=kept)
    got = b[b.input_rows > 0].merge(exp, on="batch", suffixes=("", "_expected"))
    assert len(got) == st.n_files
    unseen = n_in - shed - int(kept[0].sum() + kept[1].sum())
    assert ((got.state_rows >= got.state_rows_expected) & (got.state_rows - got.state_rows_expected <= unseen)).all()
    sd = math.sqrt(_pair_variance(base, 0.5))
    assert abs(len(r["pairs"]) - len(base) / 4) <= 5 * sd, (len(r["pairs"]), len(base), sd)


@pytest.mark.slow
def test_5_1_window_change_on_spark(spark, tmp_dir):
    _needs("control")
    from pyspark_cq.control import ControlTable

    changes = ((6.0, 2.0), (12.0, 4.0))        # §5.1 scaled by 1/15: 60 → 30 s at 80 s, back at 150 s
    sched = B.window_schedule(changes, initial_s=4)
    st = B.make_streams(20, 100, 50, file_s=2.5, seed=3)      # eight micro-batches, watermarks 2.5 s apart
    B.write_streams(str(tmp_dir / "in"), st)
    table = ControlTable(str(tmp_dir / "control.json"))
    table.register(B.OP, window="4 seconds")
    for at, w in changes:
        table.set(B.OP, window=f"{int(w)} seconds", at=B.BASE_US + int(at * S), reason="§5.1 scaled")
    r = B.run_spark_join(spark, str(tmp_dir / "in"), str(tmp_dir / "run"), window_s=4, delay_s=0.5,
                         control=table.handle(B.OP))
    check = B.compare_pairs(r["pairs"], B.oracle_pairs(st.left, st.right, sched))
    assert check["equal"], check
    exp = B.oracle_state(st, sched, 0.5)
    got = r["batches"][r["batches"].input_rows > 0].merge(exp, on="batch", suffixes=("", "_expected"))
    assert len(got) == st.n_files
    assert (got.state_rows == got.state_rows_expected).all(), got[["batch", "state_rows", "state_rows_expected"]]
    got = got[got.wm_s.notna()]
    valid = (got.state_rows - got.above_wm - got.slack).to_numpy()
    wm = got.wm_s.to_numpy()
    (s1, c1), (s2, c2) = B.effect_windows(sched)
    assert (s1, c1, s2, c2) == (8.0, 10.0, 14.0, 16.0)
    full, half = 2 * 100 * 4, 2 * 100 * 2
    assert (valid[(wm >= 4) & (wm <= s1)] == full).all()          # unchanged until 6 + min(4, 2) = 8 s
    assert (valid[(wm > s1) & (wm < c1)] < full).all()            # shrinking between 8 and 10 s
    assert (valid[(wm >= c1) & (wm <= s2)] == half).all()         # new size from 6 + max = 10 s to 14 s
    assert (valid[(wm > s2) & (wm < c2)] > half).all()            # growing again from 12 + 2 = 14 s
    assert (valid[wm >= c2] == full).all()
    for lo, hi in ((4, s1), (s1, c1), (c1, s2), (s2, c2), (c2, 20)):   # every phase was observed
        assert ((wm > lo) & (wm < hi)).any(), (lo, hi, wm)
