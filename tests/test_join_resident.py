"""``state_persistence="changelog"`` of the interval join (issue 39), outside Spark.

The join's stateful function is driven as PySpark 4.3's worker drives it (a ``GroupState`` per call built
from the value the previous call wrote, pickled as the worker pickles it), over the same micro-batches with
the full layout as the oracle: every batch's output and state must be the same when the resident copy is
used, when it is refused (cache cleared: restore from snapshot + deltas), across snapshots, when a batch is
retried (its first attempt's copy must not be used), and when a checkpoint switches between the layouts.
The control proves the token decides: a stale copy relabelled with the current token *is* used and changes
the output.
"""
from __future__ import annotations

import dataclasses
import os
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from pyspark_cq.operators._common import metrics as _metrics
from pyspark_cq.operators._common import resident as R
from pyspark_cq.operators._common import state_files as S
from pyspark_cq.operators._common.codec import NULL_SUFFIX, codecs_for
from pyspark_cq.operators.join import changelog as L
from pyspark_cq.operators.join import worker as W
from pyspark_cq.operators.join.driver import _STATE_SCHEMA
from pyspark_cq.operators.join.spec import JoinSpec
from pyspark_cq.operators.join.worker import JoinConfig, JoinWorker
from pyspark_cq.vocabulary import metrics as M

SCHEMAS = [T.StructType([T.StructField("k", T.LongType()), T.StructField("ts", T.TimestampType()),
                         T.StructField(f"{s}v", T.LongType()), T.StructField(f"{s}s", T.StringType())])
           for s in "lr"]
OUT = ["k", "ts_l", "lv", "ls", "ts_r", "rv", "rs"]
#: The payload columns per side (plain join, semi / anti join: every left column, no right column).
_SIDE_COLUMNS = {False: (["ts", "lv", "ls"], ["ts", "rv", "rs"]), True: (["k", "ts", "lv", "ls"], [])}
BASE_US = 1_700_000_000_000_000
DELAY_MS = 20_000


def _config(how: str, persistence: str, every: int = 10, retain: int = 100) -> JoinConfig:
    left_only = how in ("left_semi", "left_anti")
    others = _SIDE_COLUMNS[left_only]
    out_cols = ["k", "ts", "lv", "ls"] if left_only else OUT
    fields = {"k": T.LongType(), "ts_l": T.TimestampType(), "ts_r": T.TimestampType(), "ts": T.TimestampType(),
              "lv": T.LongType(), "rv": T.LongType(), "ls": T.StringType(), "rs": T.StringType()}
    out = T.StructType([T.StructField(c, fields[c]) for c in out_cols])
    return JoinConfig(
        key_codecs=tuple(codecs_for(SCHEMAS[0], ["k"], "__cq_k")),
        side_codecs=(tuple(codecs_for(SCHEMAS[0], others[0], "__cq_p0_")),
                     tuple(codecs_for(SCHEMAS[1], others[1], "__cq_p1_"))),
        out_columns=tuple(out_cols), n_keys=1, how=how, lower=-5_000_000, upper=10_000_000, window=None,
        out_arrow=_metrics.arrow_schema(out), shards=1, out_keys=(0,) if not left_only else (),
        key_names=(("k",), ("k",)), persistence=persistence, snapshot_every=every,
        state_id="test" if persistence in W.RESIDENT else "", retain=retain,
        state_dir=getattr(_config, "state_dir", None))   # a fixture of this module sets it for the files layout


def _frame(config: JoinConfig, side: int, rng, n: int, t0: int) -> pd.DataFrame:
    """One side's rows of a batch in the transport layout (both sides' payload columns, the other's null)."""
    keys = rng.integers(0, 12, n)
    times = t0 + rng.integers(-8_000_000, 8_000_000, n)
    null_keys = rng.random(n) < 0.03
    values = {"k": keys, "ts": times, "lv": rng.integers(0, 1000, n), "rv": rng.integers(0, 1000, n),
              "ls": [f"s{x}" for x in rng.integers(0, 50, n)], "rs": [f"r{x}" for x in rng.integers(0, 50, n)]}
    return transport_frame(config, side, keys, times, null_keys, values)


def transport_frame(config: JoinConfig, side: int, keys, times, null_keys, values: dict) -> pd.DataFrame:
    """``side``'s rows with ``keys`` (null where ``null_keys``), ``times`` (µs) and the payload ``values`` by
    column name, in the join's transport layout: both sides' payload columns, the other side's null.
    """
    n = len(keys)
    cols = {"__cq_side": np.full(n, side, np.int8), "__cq_shard": np.zeros(n, np.int64),
            "__cq_t": pd.to_datetime(times, unit="us"), "__cq_tus": times,
            "__cq_k0": keys, "__cq_k0" + NULL_SUFFIX: null_keys}
    for s in (0, 1):
        names = _SIDE_COLUMNS[config.how in ("left_semi", "left_anti")][s]
        for codec, name in zip(config.side_codecs[s], names):
            mine = s == side
            if codec.flagged:
                cols[codec.name] = values[name] if mine else np.zeros(n, np.int64)
                cols[codec.name + NULL_SUFFIX] = np.zeros(n, bool) if mine else np.ones(n, bool)
            else:
                cols[codec.name] = values[name] if mine else [None] * n
    return pd.DataFrame(cols)


def _batches(config: JoinConfig, n_batches: int = 9, seed: int = 3):
    """Per batch (frames, watermark ms): 60-100 rows a side, times advancing 6 s a batch."""
    rng = np.random.default_rng(seed)
    out, wm = [], 0
    for b in range(n_batches):
        t0 = BASE_US + b * 6_000_000
        frames = [_frame(config, s, rng, int(rng.integers(60, 100)), t0) for s in (0, 1)]
        if b == 4:
            frames = []   # a batch without input: only eviction
        out.append((frames, wm))
        wm = max(wm, (t0 + 8_000_000) // 1000 - DELAY_MS)
    return out


def _state(value, wm_ms: int) -> GroupState:
    return GroupState(optionalValue=value, batchProcessingTimeMs=0, eventTimeWatermarkMs=wm_ms,
                      timeoutConf=GroupStateTimeout.EventTimeTimeout, hasTimedOut=False, watermarkPresent=True,
                      defined=value is not None, updated=False, removed=False, timeoutTimestamp=-1,
                      keyAsUnsafe=b"", valueSchema=_STATE_SCHEMA)


def _call(worker: JoinWorker, frames, wm: int, value):
    """One call as PySpark's worker makes it: (sorted output rows, counters, the value written)."""
    state = _state(value, wm)
    (row,) = worker.streaming((0,), iter([f.copy() for f in frames]), state)
    counters = {m: int(row[_metrics.PREFIX + m].iloc[0]) for m in M.JOIN_STREAMING}
    rows = sorted(map(repr, _unpacked(row)))
    value = pickle.loads(pickle.dumps(_STATE_SCHEMA.toInternal(state._value))) if state.exists else None
    return rows, counters, value


def _unpacked(row: pd.DataFrame) -> list:
    """The data rows of a packed output row (IPC stream or array cells)."""
    if _metrics.PACKED in row.columns:
        blob = row[_metrics.PACKED].iloc[0]
        return [] if blob is None else pa.ipc.open_stream(pa.py_buffer(blob)).read_all().to_pylist()
    cells = [row[c].iloc[0] for c in row.columns if c.startswith(_metrics._ARRAY)]
    if cells[0] is None:
        return []
    return [tuple(c[i] for c in cells) for i in range(len(cells[0]))]


def _run(worker, batches, clear=False):
    """Per batch (sorted output rows, state rows), and the last value; ``clear``: drop the resident copies
    before every call. Counts in ``_run.with_deltas`` the values written with deltas (not a snapshot).
    """
    value, results = None, []
    _run.with_deltas = 0
    for frames, wm in batches:
        if clear:
            R.cache().clear()
        rows, counters, value = _call(worker, frames, wm, value)
        results.append((rows, counters[M.STATE_ROWS]))
        _run.with_deltas += value is not None and _deltas(value) > 0
    return results, value


def _deltas(value) -> int:
    """The number of deltas a changelog value or a files manifest holds (0 for the full layout)."""
    if L.is_manifest(value[0]):
        return len(L.Manifest.decode(value[0]).deltas)
    return L.parse(value[0])[3].deltas if L.is_log(value[0]) else 0


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch, tmp_path):
    """An empty resident cache, and snapshots by count only (these states are small: by the default byte
    rule nearly every batch would write a snapshot and the replays would see few deltas); a fresh state
    directory for the files layout."""
    monkeypatch.setattr(W, "SNAPSHOT_RATIO", 1e9)
    monkeypatch.setattr(_config, "state_dir", str(tmp_path / "state"), raising=False)
    R.cache().clear()
    yield
    R.cache().clear()


def test_snapshot_when_the_deltas_outgrow_it(monkeypatch):
    monkeypatch.setattr(W, "SNAPSHOT_RATIO", 0.5)
    config = _config("inner", "changelog", 1000)
    worker, value, sizes = JoinWorker(config), None, []
    for frames, wm in _batches(config):
        _, _, value = _call(worker, frames, wm, value)
        info = L.parse(value[0])[3]
        sizes.append((info.deltas, info.delta_bytes, info.snapshot_bytes + len(value[1]) + len(value[2])))
        assert info.delta_bytes <= 0.5 * info.snapshot_bytes
    assert any(n == 0 for n, _, _ in sizes[1:]) and any(n > 0 for n, _, _ in sizes)


@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("how", ["inner", "left", "full", "left_semi", "left_anti"])
@pytest.mark.parametrize("every", [1, 3, 10])
def test_changelog_equals_full_layout(how, every, layout):
    full = _config(how, "full")
    batches = _batches(full)
    expected, _ = _run(JoinWorker(full), batches)
    assert sum(len(r) for r, _ in expected) > 0
    got, value = _run(JoinWorker(_config(how, layout, every)), batches)
    assert got == expected
    # The resident copy refused every batch: each call restores from snapshot + deltas.
    replayed, _ = _run(JoinWorker(_config(how, layout, every)), batches, clear=True)
    assert replayed == expected
    assert (_run.with_deltas > 0) == (every > 1)   # the replays ran on deltas, not only on snapshots
    if value is not None:
        assert (L.is_log if layout == "changelog" else L.is_manifest)(value[0])
        assert _deltas(value) < every


def test_hits_and_misses_are_counted():
    config = _config("inner", "changelog", 4)
    worker, value, counts = JoinWorker(config), None, []
    for frames, wm in _batches(config):
        _, counters, value = _call(worker, frames, wm, value)
        counts.append((counters[M.STATE_CACHE_HITS], counters[M.STATE_CACHE_MISSES]))
    assert counts[0] == (0, 0)            # no state yet: neither
    assert all(c == (1, 0) for c in counts[1:])
    R.cache().clear()
    _, counters, _ = _call(worker, [], batches_wm(config), value)
    assert (counters[M.STATE_CACHE_HITS], counters[M.STATE_CACHE_MISSES]) == (0, 1)
    _, full_counters, _ = _call(JoinWorker(_config("inner", "full")), [], batches_wm(config), value)
    assert (full_counters[M.STATE_CACHE_HITS], full_counters[M.STATE_CACHE_MISSES]) == (0, 0)


def batches_wm(config) -> int:
    return _batches(config)[-1][1]


@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("how", ["inner", "left_semi"])
def test_retried_batch_refuses_its_first_attempts_copy(how, layout):
    """Batch 6 runs, Spark does not commit it and runs it again on the state of batch 5: the worker holds
    batch 6's copy (another token), must refuse it and give batch 6's output once more. The control
    relabels that stale copy with batch 5's token: then it is used and the output changes."""
    config = _config(how, layout, 10)
    batches = _batches(config)
    worker, value = JoinWorker(config), None
    for frames, wm in batches[:6]:
        _, _, value = _call(worker, frames, wm, value)
    frames, wm = batches[6]
    first, first_counters, _ = _call(worker, frames, wm, value)
    retried, counters, _ = _call(worker, frames, wm, value)
    assert counters[M.STATE_CACHE_MISSES] == 1 and counters[M.STATE_CACHE_HITS] == 0
    assert retried == first and len(first) > 0
    assert counters[M.STATE_ROWS] == first_counters[M.STATE_ROWS]
    # control: the copy left by the retry holds batch 6's rows; give it batch 5's token
    cache, key = R.cache(), ("test", (0,))
    token, obj, nbytes = cache._entries[key]
    cache.put(key, L.token_of(value[0]), obj, nbytes)
    stale, counters, _ = _call(worker, frames, wm, value)
    assert counters[M.STATE_CACHE_HITS] == 1
    # batch 6's rows stored twice (a semi join outputs the same left rows again: compare the state too)
    assert (stale, counters[M.STATE_ROWS]) != (first, first_counters[M.STATE_ROWS])


@pytest.mark.parametrize("order", [("full", "changelog", "full"), ("full", "files", "full"),
                                   ("changelog", "files", "changelog"), ("files", "changelog", "files")])
def test_checkpoint_switches_between_layouts(order):
    """One state value through three layouts (e.g. full -> changelog -> full: checkpoints of today's formats
    restore in the files layout and back), same outputs as full throughout."""
    full = _config("left", "full")
    batches = _batches(full)
    expected, _ = _run(JoinWorker(full), batches)
    first, second, third = (JoinWorker(_config("left", layout, 3)) for layout in order)
    workers = [first] * 3 + [second] * 4 + [third] * 2
    value, got = None, []
    for worker, (frames, wm) in zip(workers, batches):
        rows, counters, value = _call(worker, frames, wm, value)
        got.append((rows, counters[M.STATE_ROWS]))
    assert got == expected


def test_delta_round_trip():
    delta = L.Delta(123)
    table = pa.table({"__cq_k0": pa.array([1, 2], pa.int64()), "__cq_p0_0": pa.array(["a", None])})
    delta.store(0, table, [5, 6], [7, 8], None, None)
    delta.store(1, table.slice(1), [9], [10], np.array([-1]), np.array([2]))
    delta.emitted.append(np.array([0, 1]))
    back = L.Delta.decode(delta.encode())
    assert back.wm_ms == 123 and [e.tolist() for e in back.emitted] == [[0, 1]]
    assert back.parts[0][1].equals(table) and back.parts[0][4] is None
    assert back.parts[1][2].tolist() == [9] and back.parts[1][4].tolist() == [-1] and back.parts[1][5].tolist() == [2]
    field = L.append_delta(L.snapshot_field(b"t" * 16, b"snap"), b"u" * 16, b"d1")
    token, snap, deltas, info = L.parse(field)
    assert (token, bytes(snap), [bytes(d) for d in deltas], info.deltas) == (b"u" * 16, b"snap", [b"d1"], 1)
    with pytest.raises(ValueError, match="truncated"):
        L.parse(field[:-1])


def test_cache_is_bounded_lru_by_bytes():
    cache = R.ResidentCache(100)
    cache.put("a", b"1", "A", 40)
    cache.put("b", b"2", "B", 40)
    assert cache.take("a", b"1") == "A"          # taken out: a used copy is not left behind
    cache.put("a", b"3", "A2", 40)
    cache.put("c", b"4", "C", 40)                # over the bound: b (least recently used) goes
    assert cache.take("b", b"2") is None and len(cache) == 2 and cache.used == 80
    assert cache.take("a", b"x") is None         # another token: refused and dropped
    assert cache.take("a", b"3") is None
    cache.put("big", b"5", "X", 101)             # larger than the bound: not kept
    assert cache.take("big", b"5") is None and cache.used == 40


def test_cache_limit_from_environment(monkeypatch):
    monkeypatch.setenv(R.ENV_LIMIT, "2")
    assert R.limit_bytes() == 2 << 20
    monkeypatch.setenv(R.ENV_LIMIT, "lots")
    with pytest.raises(ValueError, match=R.ENV_LIMIT):
        R.limit_bytes()
    monkeypatch.setenv(R.ENV_LIMIT, "-1")
    with pytest.raises(ValueError, match="non-negative"):
        R.limit_bytes()
    monkeypatch.delenv(R.ENV_LIMIT)
    assert R.limit_bytes() == R.DEFAULT_LIMIT_MB << 20


class _Spec:
    """The two fields ``JoinSpec.set_persistence`` reads."""

    def __init__(self, bucket_width=None, streaming=True):
        self.bucket_width, self.streaming = bucket_width, streaming
        self.persistence, self.snapshot_every = "full", 10


def test_state_persistence_is_validated():
    spec = _Spec()
    JoinSpec.set_persistence(spec, "changelog", 4)
    assert (spec.persistence, spec.snapshot_every) == ("changelog", 4)
    with pytest.raises(ValueError, match="state_persistence must be one of 'full', 'changelog'"):
        JoinSpec.set_persistence(_Spec(), "rocksdb", 10)
    with pytest.raises(TypeError, match="snapshot_every must be an int"):
        JoinSpec.set_persistence(_Spec(), "changelog", 2.5)
    with pytest.raises(ValueError, match="snapshot_every must be an int >= 1"):
        JoinSpec.set_persistence(_Spec(), "changelog", 0)
    with pytest.raises(ValueError, match="bucket="):
        JoinSpec.set_persistence(_Spec(bucket_width=10), "changelog", 10)
    batch = _Spec(streaming=False)
    JoinSpec.set_persistence(batch, "changelog", 10)
    assert batch.persistence == "full"


@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("window", [False, True])
def test_changelog_replays_per_row_bounds_of_a_control_table(tmp_path, window, layout):
    """Under a control table each stored row keeps the bounds (window) of its own time (PIPES §4.2); a
    delta records them, so a replay from snapshot + deltas gives the full layout's output."""
    from pyspark_cq.control import ControlTable

    table = ControlTable(str(tmp_path / "control.json"))
    at = BASE_US + 20_000_000
    if window:
        table.register("wj", window="20 seconds")
        table.set("wj", window="40 seconds", at=at, reason="test")
    else:
        table.register("ij", lower="-3 seconds", upper="5 seconds")
        table.set("ij", lower="-9 seconds", upper="2 seconds", at=at, reason="test")
    handle = table.handle("wj" if window else "ij")

    def config(persistence):
        c = _config("inner", persistence, 3)
        out = T.StructType([T.StructField(n, f.dataType) for n, f in zip(OUT, _out_fields())])
        if window:
            out = T.StructType(out.fields + [T.StructField("valid_from", T.TimestampType()),
                                             T.StructField("valid_to", T.TimestampType())])
        return dataclasses.replace(c, control=handle, window=(20_000_000, 20_000_000) if window else None,
                                   lower=-19_999_999 if window else c.lower, upper=19_999_999 if window else c.upper,
                                   out_columns=tuple(out.names), out_arrow=_metrics.arrow_schema(out))

    batches = _batches(config("full"))
    expected, _ = _run(JoinWorker(config("full")), batches)
    assert sum(len(r) for r, _ in expected) > 0
    got, _ = _run(JoinWorker(config(layout)), batches)
    replayed, _ = _run(JoinWorker(config(layout)), batches, clear=True)
    assert got == expected and replayed == expected and _run.with_deltas > 0
    if layout == "files":
        return
    worker, value, recorded = JoinWorker(config("changelog")), None, []
    for frames, wm in batches:
        _, _, value = _call(worker, frames, wm, value)
        recorded += [L.Delta.decode(d) for d in L.parse(value[0])[2][-1:]]
    assert any(part[4] is not None for d in recorded for part in d.parts)   # per-row bounds were recorded


def _out_fields():
    types = {"k": T.LongType(), "ts_l": T.TimestampType(), "ts_r": T.TimestampType(), "lv": T.LongType(),
             "rv": T.LongType(), "ls": T.StringType(), "rs": T.StringType()}
    return [T.StructField(n, types[n]) for n in OUT]


# -- the files layout (state_persistence="files"): manifest in the value, immutable files, garbage collection


def _files(root) -> dict:
    """name -> bytes of every state file under ``root`` (group directories included)."""
    import pathlib

    return {str(p.relative_to(root)): p.read_bytes() for p in pathlib.Path(root).rglob("*") if p.is_file()}


def test_files_value_is_a_small_manifest_and_files_are_immutable():
    config = _config("left", "files", 3)
    worker, value, seen = JoinWorker(config), None, {}
    for frames, wm in _batches(config):
        _, _, value = _call(worker, frames, wm, value)
        if value is None:
            continue
        assert L.is_manifest(value[0]) and value[1] == b"" and value[2] == b""
        manifest = L.Manifest.decode(value[0])
        assert len(value[0]) == 72 + 24 * len(manifest.deltas)     # bytes, whatever the state's size
        files = _files(config.state_dir)
        for name, data in seen.items():   # a file is never rewritten (it may only be collected)
            assert files.get(name, data) == data
        seen.update(files)
        names = {n.split("/")[-1] for n in files}
        assert S.snapshot_name(manifest.base, manifest.snapshot_token) in names
        assert all(S.delta_name(manifest.base + i + 1, manifest.base, t) in names
                   for i, (t, _) in enumerate(manifest.deltas))
        assert not any(n.startswith(".") for n in names)        # no temporary left behind


def test_files_replayed_batch_reads_the_files_of_its_version():
    """Spark re-runs a batch from any retained older version (R = 3 here): a worker without resident state
    (a new process) reads the files that version's manifest names -- after later batches wrote and
    collected files -- and gives the batch's output and state exactly. A version older than the retention
    may have lost its files: the error says what to check."""
    full = _config("inner", "full")
    batches = _batches(full, n_batches=14)
    expected, _ = _run(JoinWorker(full), batches)
    config = _config("inner", "files", 2, retain=3)
    worker, values = JoinWorker(config), [None]
    for frames, wm in batches:
        values.append(_call(worker, frames, wm, values[-1])[2])
    names = [n for n in _files(config.state_dir) if not n.split("/")[-1].startswith(".")]
    written = len(batches)   # one file per batch
    assert len(names) < written   # the collection deleted some
    last = len(batches) - 1
    for version in range(last - 3, last + 1):   # the retained versions: re-run the batch after each
        if version + 1 >= len(batches):
            continue
        R.cache().clear()
        W._STORES.clear()
        frames, wm = batches[version + 1]
        rows, counters, _ = _call(JoinWorker(config), frames, wm, values[version + 1])
        assert (rows, counters[M.STATE_ROWS]) == expected[version + 1]
    R.cache().clear()
    missing = 0
    for version in range(1, last - 6):
        try:
            _call(JoinWorker(config), [], batches[version + 1][1], values[version + 1])
        except FileNotFoundError as e:
            assert "state_dir" in str(e)
            missing += 1
    assert missing > 0


def test_files_without_state_dir_is_refused_clearly():
    config = _config("inner", "files", 3)
    value = None
    for frames, wm in _batches(config)[:3]:
        _, _, value = _call(JoinWorker(config), frames, wm, value)
    R.cache().clear()
    blind = dataclasses.replace(_config("inner", "full"), state_dir=None)
    with pytest.raises(ValueError, match="state_dir="):
        _call(JoinWorker(blind), [], 0, value)
    with pytest.raises(ValueError, match="needs state_dir="):
        JoinSpec.set_persistence(_Spec(), "files", 10)
    with pytest.raises(TypeError, match="state_dir must be a directory path"):
        JoinSpec.set_persistence(_Spec(), "files", 10, 42)
    spec = _Spec()
    spec.layout = "key"
    with pytest.raises(ValueError, match="shards='key'"):
        JoinSpec.set_persistence(spec, "files", 10, "/tmp/x")
    spec = _Spec()
    JoinSpec.set_persistence(spec, "files", 4, "relative/dir")
    assert spec.state_dir == os.path.abspath("relative/dir") and spec.retain == 100


def test_collectable_names():
    t = bytes(range(16))
    names = [S.snapshot_name(0, t), S.delta_name(1, 0, t), S.delta_name(2, 0, t), S.snapshot_name(3, t),
             S.delta_name(4, 3, t), "." + S.delta_name(2, 0, t) + ".tmp", "unrelated.txt"]
    # newest write at 10, 5 retained: cut 4, the delta at 4 needs the snapshot at 3
    assert sorted(S.collectable(names, 10, 5)) == sorted(names[:3] + names[5:6])
    # newest write at 8: cut 2, the delta at 2 (and its temporary) need the snapshot at 0
    assert S.collectable(names, 8, 5) == []
    assert S.parse_name("unrelated.txt") is None and S.parse_name(names[4]) == (4, 3)


@pytest.mark.parametrize("retain", [2, 4])   # 2: a stateless stage's (.stateless.STATELESS_RETAIN)
@pytest.mark.parametrize("seed", range(12))
def test_collection_never_deletes_a_file_a_retained_version_names(tmp_path, seed, retain):
    """A plain-Python model of one group under Spark: each batch either commits (a new version) or fails
    after writing its file (an orphan) and is re-run; sometimes Spark restarts from the version before
    the last one; the state is sometimes removed. After every write, every file named by a retained
    version (the last R + 1 committed ones) still exists, and old files do not pile up."""
    rng = np.random.default_rng(seed)
    store, every = S.StateFiles(str(tmp_path / "d")), 3
    group, versions = (0,), [None]        # committed manifests (None: no state)
    for _ in range(120):
        manifest = versions[-1]
        token = R.new_token()
        if manifest is None or len(manifest.deltas) + 1 >= every or rng.random() < 0.2:
            start, floor = (manifest.start, manifest.floor) if manifest is not None else store.next_index(group)
            index = manifest.index + 1 if manifest is not None else start
            store.write(group, S.snapshot_name(index, token), b"s")
            new = L.Manifest(token, index, token, 1, start, floor)
            store.collect(group, index, retain, start, floor)
        else:
            store.write(group, S.delta_name(manifest.index + 1, manifest.base, token), b"d")
            new = dataclasses.replace(manifest, token=token, deltas=manifest.deltas + [(token, 1)])
        roll = rng.random()
        if roll < 0.15:
            continue                       # the batch failed: its file is an orphan, the batch runs again
        versions.append(None if roll > 0.95 else new)
        if rng.random() < 0.1 and len(versions) > 2:
            versions.pop()                 # Spark restarts from the version before (the last one uncommitted)
        present = set(store.names(group))
        for m in versions[-(retain + 1):]:
            if m is not None:
                assert S.snapshot_name(m.base, m.snapshot_token) in present
                assert all(S.delta_name(m.base + i + 1, m.base, t) in present for i, (t, _) in enumerate(m.deltas))
        # orphans and rolled-back files at most double an index's files; the collection runs at snapshots
        assert len(present) <= 5 * (retain + every + 2)


def test_files_state_dir_defaults_under_the_sessions_checkpoint_location():
    class _Conf:
        def __init__(self, values):
            self.values = values

        def get(self, key, default=None):
            return self.values.get(key, default)

    class _Left:
        def __init__(self, values):
            self.sparkSession = type("S", (), {"conf": _Conf(values)})()

    spec = _Spec()
    spec.name, spec.left = "cq_pairs", _Left({"spark.sql.streaming.checkpointLocation": "/ck/root/",
                                               "spark.sql.streaming.minBatchesToRetain": "7"})
    JoinSpec.set_persistence(spec, "files", 10)
    assert (spec.state_dir, spec.retain) == ("/ck/root/pyspark_cq_state/cq_pairs", 7)
    spec = _Spec()
    spec.name, spec.left = "cq_pairs", _Left({})
    with pytest.raises(ValueError, match="spark.sql.streaming.checkpointLocation"):
        JoinSpec.set_persistence(spec, "files", 10)
    JoinSpec.set_persistence(spec, "files", 10, "hdfs://nn/state/q1")
    assert spec.state_dir == "hdfs://nn/state/q1"     # URIs are passed through


class _Session:
    """A session's ``conf.get``, all ``changelog.settings`` reads of it."""

    def __init__(self, values):
        self.conf = type("C", (), {"get": lambda _self, key, default=None: values.get(key, default)})()


def _auto(values, name="cq_pairs", **kw):
    spec = _Spec(**kw)
    spec.name, spec.left = name, type("L", (), {"sparkSession": _Session(values)})()
    JoinSpec.set_persistence(spec, None, 10)
    return spec


def test_auto_keeps_files_where_every_executor_reaches_them():
    """``state_persistence=None`` ("auto"): files under the session's checkpoint location, else under Spark's
    warehouse when every executor reaches it, with the query's id filled in by the worker; else the full layout."""
    local = {"spark.master": "local[2]", "spark.sql.warehouse.dir": "file:/work/wh"}
    spec = _auto(local)
    assert (spec.persistence, spec.state_dir) == ("files", "/work/wh/pyspark_cq_state/{query}/cq_pairs")
    assert spec.persistence_auto
    assert _auto({**local, "spark.sql.streaming.checkpointLocation": "/ck/"}).state_dir == \
        "/ck/pyspark_cq_state/{query}/cq_pairs"
    assert _auto({"spark.master": "local[*]", "spark.sql.warehouse.dir": "file:///w/h"}).state_dir == \
        "/w/h/pyspark_cq_state/{query}/cq_pairs"
    cluster = {"spark.master": "spark://host:7077", "spark.sql.warehouse.dir": "file:/work/wh"}
    assert (_auto(cluster).persistence, _auto(cluster).state_dir) == ("full", None)   # a local disk per machine
    shared = _auto({**cluster, "spark.sql.warehouse.dir": "hdfs://nn/wh"}, name="a/b")
    assert (shared.persistence, shared.state_dir) == ("files", "hdfs://nn/wh/pyspark_cq_state/{query}/a_b")
    assert _auto(local, bucket_width=10).persistence == "full"      # the bucket layout takes no other layout
    batch = _auto(local, streaming=False)
    assert batch.persistence == "full"
    spec = _Spec()
    spec.name, spec.left = "x", type("L", (), {"sparkSession": _Session(local)})()
    JoinSpec.set_persistence(spec, "auto", 10, "given/dir")
    assert (spec.persistence, spec.state_dir) == ("files", os.path.abspath("given/dir"))
    with pytest.raises(ValueError, match="'auto'"):
        JoinSpec.set_persistence(_Spec(), "rocksdb", 10)


def test_auto_state_dir_needs_a_streaming_query():
    from pyspark_cq.operators._common import changelog as C

    with pytest.raises(ValueError, match="state_dir="):
        C.state_files("/tmp/x/{query}/j", "docs/join.md")


def test_two_operators_writing_one_directory_are_refused_before_any_collection(tmp_path):
    """Two operators sharing a directory (one name twice in a query) would collect each other's files: the
    first snapshot after most of a line's calls found foreign files stops the query; an orphan of a re-run
    batch does not."""
    from pyspark_cq.operators._common import changelog as C

    store, group = S.StateFiles(str(tmp_path / "d")), (0,)
    ours, theirs = R.new_token(), R.new_token()
    store.write(group, S.snapshot_name(0, ours), b"s")
    log = L.Manifest(ours, 0, ours, 1)
    for i in range(1, 4):
        t = R.new_token()
        store.write(group, S.delta_name(i, 0, t), b"d")
        log = dataclasses.replace(log, token=t, deltas=log.deltas + [(t, 1)])
    store.write(group, S.delta_name(2, 0, theirs), b"d")        # a re-run batch's orphan
    C._check_sole_writer(store, group, log)
    for i in (0, 1, 3):
        store.write(group, (S.snapshot_name(0, theirs) if i == 0 else S.delta_name(i, 0, theirs)), b"x")
    with pytest.raises(ValueError, match="give each its own name="):
        C._check_sole_writer(store, group, log)
    assert len(store.names(group)) == 8                          # nothing collected


def test_auto_falls_back_to_full_for_constraints_the_files_layout_does_not_take():
    from pyspark_cq.constraints import clustered

    spec = _auto({"spark.master": "local[2]", "spark.sql.warehouse.dir": "/wh"})
    spec.left_keys = spec.right_keys = ["k"]
    spec.key_types, spec.control, spec.constraints = [T.LongType()], None, ()
    JoinSpec.set_constraints(spec, [clustered("left", 0)])
    assert (spec.persistence, spec.state_dir) == ("full", None)


@pytest.mark.parametrize("how", ["inner", "left", "full", "left_semi", "left_anti"])
@pytest.mark.parametrize("old", [0, 2])
def test_a_copy_behind_catches_up_with_the_deltas_it_missed(how, old):
    """Files layout, two Python workers taking turns: worker B holds the shard as of batch ``old`` (the snapshot,
    or a delta of the same line), worker A ran the batches since. B's copy is used with the delta files it missed
    replayed (a catch-up, not a miss), and every batch's output and state equal the full layout's. The control:
    B's copy relabelled with the current token is taken as a hit without the replay and gives other rows."""
    full = _config(how, "full")
    batches = _batches(full)
    expected, _ = _run(JoinWorker(full), batches)
    config = _config(how, "files", 10)
    worker, value, got = JoinWorker(config), None, []
    behind = None
    for b, (frames, wm) in enumerate(batches):
        if b == 5:   # B's turn: its copy of batch `old` replaces A's in this process's cache
            R.cache().put(("test", (0,)), L.token_of(behind[0][0]), behind[1], 1)
        rows, counters, value = _call(worker, frames, wm, value)
        got.append((rows, counters[M.STATE_ROWS]))
        if b == 5:
            assert (counters[M.STATE_CACHE_HITS], counters[M.STATE_CACHE_MISSES],
                    counters[M.STATE_CACHE_CATCH_UPS]) == (0, 0, 1)
        if b == old:
            behind = (value, worker._restore_log(_state(value, wm), (0,)))
    assert got == expected
    if how == "inner" and old == 0:   # control: the same stale copy under the current token
        R.cache().put(("test", (0,)), L.token_of(value[0]), worker._restore_log(_state(behind[0], 0), (0,)), 1)
        frames, wm = _batches(full, 10)[-1]
        stale, counters, _ = _call(worker, frames, wm, value)
        assert counters[M.STATE_CACHE_HITS] == 1
        R.cache().clear()
        fresh, counters, _ = _call(worker, frames, wm, value)
        assert counters[M.STATE_CACHE_MISSES] == 1 and stale != fresh
