"""Outer joins in a QueryGroup's shared stage (issue 40): outer join classes (one type and band each, never with inner
members), each member's rows and ``cq_at`` from its class's pairs and padded rows (pure: a plain-Python outer join
is the oracle), end to end on Spark in ``tests/test_group_joins.py`` (outer members beside inner ones, across a restart)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pyspark_cq.group.joins import (
    JoinMember,
    canonical_names,
    class_sides,
    config_windows,
    join_classes,
    member_rows,
    outer_rows,
)

S = 1_000_000


def jm(wl, wr, how="left", at="valid_to", refs=("c", "v"), left="clicks", right="views"):
    return JoinMember(left=left, right=right, pairs=(("x", "x"),), windows=(wl * S, wr * S), refs=refs,
                      times=("ts", "ts"), columns=(("ts", "x", "p"), ("ts", "x", "q")), at=at, how=how)


def test_outer_members_share_a_class_only_with_their_type_and_band():
    ms = [SimpleNamespace(key=k, join=j) for k, j in (
        ("inner", jm(10, 20, how="inner")), ("l1", jm(10, 20)), ("l2", jm(10, 20, at="valid_from", refs=("a", "b"))),
        ("l3", jm(10, 30)), ("r", jm(10, 20, how="right")), ("f", jm(10, 20, how="full")),
        ("inner2", jm(99, 99, how="inner")))]
    assert join_classes(ms) == {"inner": "inner", "l1": "l1", "l2": "l1", "l3": "l3", "r": "r", "f": "f",
                                "inner2": "inner"}
    # ... and the same predicates on each input (they decide which rows may match, and the input's watermark)
    ons = [SimpleNamespace(key=k, join=JoinMember(**{**jm(10, 20).__dict__, "pushed": f}))
           for k, f in (("a", (None, "(`q` > 3)")), ("b", (None, None)), ("c", (None, "(`q` > 3)")),
                        ("d", ("(`p` = 1)", "(`q` > 3)")))]
    assert join_classes(ons) == {"a": "a", "b": "b", "c": "a", "d": "d"}
    # a filtered input keeps its clock apart (its query alone has its watermark over the rows that pass)
    sides = [class_sides(o.join) for o in ons]
    assert sides[1] == ("clicks", "views") and sides[0] == sides[2] and sides[0][0] == "clicks"
    assert sides[0][1].startswith("views#") and sides[3][0].startswith("clicks#") and sides[3][1] == sides[0][1]
    # an inner member's predicates pushed to its inputs too (its query alone's watermark: issue 40)
    inner = class_sides(JoinMember(**{**jm(10, 20, how="inner").__dict__, "pushed": ("x", None)}))
    assert inner[0].startswith("clicks#") and inner[1] == "views"
    # an inner member's signature is what it was (a checkpoint's class ids stay)
    assert jm(10, 20, how="inner").signature() == ("clicks", "views", (("x", "x"),))
    # an outer class's config is the interval join with the windows' band (-w_right + 1, w_left - 1)
    assert config_windows(SimpleNamespace(window=None, lower=-20 * S + 1, upper=10 * S - 1)) == (10 * S, 20 * S)
    assert config_windows(SimpleNamespace(window=(3, 4), lower=0, upper=0)) == (3, 4)


def _outer_join(rows_l, rows_r, wl, wr, how):
    """A plain-Python outer window join on x (validities [t, t + w) intersect): (lx, lt, p, rx, rt, q), None padded."""
    pairs = [(lx, lt, p, rx, rt, q) for (lx, lt, p), (rx, rt, q) in itertools.product(rows_l, rows_r)
             if lx == rx and lt < rt + wr and rt < lt + wl]
    out = list(pairs)
    if how in ("left", "full"):
        out += [(*row, None, None, None) for row in rows_l if not any(pr[:3] == row for pr in pairs)]
    if how in ("right", "full"):
        out += [(None, None, None, *row) for row in rows_r if not any(pr[3:] == row for pr in pairs)]
    return out


@pytest.mark.parametrize("how,at", [("left", "valid_to"), ("right", "valid_from"), ("full", "valid_to"),
                                    ("full", "valid_from")])
def test_an_outer_member_gets_its_query_rows_and_cq_at(how, at):
    rng = np.random.default_rng(5)
    rows_l = [(int(rng.integers(0, 15)), int(rng.integers(0, 60)) * S, i) for i in range(30)]
    rows_r = [(int(rng.integers(0, 15)), int(rng.integers(0, 60)) * S, 100 + i) for i in range(30)]
    j = jm(10, 20, how=how, at=at)
    joined = _outer_join(rows_l, rows_r, *j.windows, how)
    ts = pa.timestamp("us", tz="UTC")
    cols = list(zip(*joined))
    # the class's rows: its coalesced key, then each side's columns (keys too), as the class's interval join gives them
    key = [lx if lx is not None else rx for lx, _, _, rx, _, _ in joined]
    rows = pa.table({"cq_k0": pa.array(key, pa.int64()), "l__ts": pa.array(cols[1], pa.int64()).cast(ts),
                     "l__x": pa.array(cols[0], pa.int64()), "l__p": pa.array(cols[2], pa.int64()),
                     "r__ts": pa.array(cols[4], pa.int64()).cast(ts), "r__x": pa.array(cols[3], pa.int64()),
                     "r__q": pa.array(cols[5], pa.int64())})
    assert canonical_names(j) == {"l__ts": "c__ts", "l__x": "c__x", "l__p": "c__p", "r__ts": "v__ts",
                                  "r__x": "v__x", "r__q": "v__q"}
    schema = pa.schema([("c__ts", ts), ("c__x", pa.int32()), ("c__p", pa.int64()), ("v__ts", ts),
                        ("v__x", pa.int64()), ("v__q", pa.int64()), ("cq_at", ts)])
    got = member_rows(rows, j, schema)
    assert got.schema == schema
    wl, wr = j.windows

    def at_of(lt, rt):     # the compiler's greatest / least, which skip the padded side's null
        if at == "valid_from":
            return max(t for t in (lt, rt) if t is not None)
        return min(t + w for t, w in ((lt, wl), (rt, wr)) if t is not None)

    want = sorted(((lt, lx, p, rt, rx, q, at_of(lt, rt)) for lx, lt, p, rx, rt, q in joined),
                  key=repr)
    have = sorted(zip(*[got.column(i).cast(pa.int64()).to_pylist() for i in range(7)]), key=repr)
    assert have == want
    assert any(r[0] is None for r in have) == (how in ("right", "full"))
    assert any(r[3] is None for r in have) == (how in ("left", "full"))
    with pytest.raises(ValueError, match="j.how must be one of"):
        outer_rows(rows, jm(10, 20, how="inner"), schema)
