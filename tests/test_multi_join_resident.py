"""``multi_join(..., state_persistence="changelog" | "files")`` (issue 39), outside Spark.

The worker is driven batch by batch as PySpark's worker drives it (the value kept as bytes between calls), with
the full layout as the oracle: every batch's output, counters and state image (the value restored by a
full-layout worker and compacted) must be the same when the resident copy is used, when it is dropped before
every call (restore from the snapshot and replay of the deltas, in the value or in files), after a restart from
a value (a new worker: another resident name space), and when a batch is retried from an older value (its first
attempt's copy carries another token and must be refused). Inner joins, stream constraints, a left last input
and nested left inputs; plain-Python enumeration of the inner join as a second oracle.
"""
from __future__ import annotations

import dataclasses
import types

import pyarrow as pa
import pytest
from test_multi_join_constraints import ORDERS, _config, _frame, _State, _tuples, orders_stream, reference

from pyspark_cq.cost import chain
from pyspark_cq.operators._common import changelog as L
from pyspark_cq.operators._common import metrics as _metrics
from pyspark_cq.operators._common import resident as R
from pyspark_cq.operators._common.chunks import Schedule
from pyspark_cq.operators.multi_join import changelog as MC
from pyspark_cq.operators.multi_join import worker as W
from pyspark_cq.operators.multi_join.driver import MultiJoinSpec
from pyspark_cq.operators.multi_join.nested import nested_orders, retention
from pyspark_cq.operators.multi_join.worker import MultiJoinWorker, outer_last
from pyspark_cq.vocabulary import metrics as M


def _shaped(shape: str, layout: str, state_dir: str, every: int = 4) -> W.MultiJoinConfig:
    """The 3-input orders / fulfilments / payments join in one of the shapes, as the driver would configure it."""
    config = _config(ORDERS if shape == "constraints" else ())
    n, bounds = config.n, config.bounds
    if shape == "outer":   # payments left: (order, fulfilment, null) once the payment's band has closed
        z = n - 1
        config = dataclasses.replace(config, outer=z, orders=outer_last(config.orders, z), outer_bounds=tuple(
            (i if j == z else j, W._LEFT if j == z else W._RIGHT, lo, up) for i, j, lo, up in bounds if z in (i, j)))
    elif shape == "nested":   # how=["left", "left"]
        hows = ("first", "left", "left")
        config = dataclasses.replace(config, hows=hows, retain=retention(n, bounds, hows),
                                     orders=nested_orders(config.orders, hows))
    return dataclasses.replace(config, persistence=layout, snapshot_every=every, state_id=f"t-{layout}" if
                               layout != "full" else "", state_dir=state_dir if layout == "files" else None)


def _call(worker, rows, wm, value):
    """One call: (sorted output id tuples, counters, the value written)."""
    config = worker.config
    frames = [_frame(config, i, rows[i]) for i in range(config.n) if rows[i]]
    state = _State(value, wm)
    (packed,) = worker.streaming((0,), iter(frames), state)
    counters = {m: int(packed[_metrics.PREFIX + m].iloc[0]) for m in worker.metrics}
    outer = config.outer is not None or config.nested
    out = sorted(_tuples(packed, config.n), key=repr) if outer else sorted(_tuples(packed, config.n))
    return out, counters, (state.get if state.exists else None)


def _image(config, value):
    """The state a value holds, as the full layout would write it: restored by a full-layout worker (snapshot,
    deltas replayed) and compacted; comparable across layouts (tables as rows, the kernel's image as bytes)."""
    if value is None:
        return None
    worker = MultiJoinWorker(dataclasses.replace(config, persistence="full", state_id=""))
    kernel, sides, pending, _ = worker._restore(_State(value, 0), (0,))
    blobs = worker._snapshot(kernel, sides, pending)
    image = [bytes(blobs[0])]
    for i, s in enumerate(sides):
        image.append(s.table.select(list(range(len(config.payload_schema(i))))).to_pylist())
    if pending is not None:
        image.append(sorted(map(repr, pending.table.to_pylist())))
    return image


def _run(config, batches, clear=False, worker=None, value=None):
    """Per batch (output, counters, state image) and the last value; ``clear``: drop the resident copies before
    every call."""
    worker = worker or MultiJoinWorker(config)
    out = []
    for rows, wm in batches:
        if clear:
            R.cache().clear()
        got, counters, value = _call(worker, rows, wm, value)
        out.append((got, counters, _image(config, value)))
    return out, value


def _same(a, b) -> None:
    """Batch by batch the same output, counters (the cache's aside) and state image."""
    assert len(a) == len(b)
    for k, ((oa, ca, ia), (ob, cb, ib)) in enumerate(zip(a, b)):
        assert oa == ob, f"batch {k}: output"
        skip = set(M.STATE_CACHE) | {M.STATE_BYTES, M.PEAK_WORKER_RSS} | {m for m in ca if m.startswith("probe_nanos")}
        assert {m: v for m, v in ca.items() if m not in skip} == {m: v for m, v in cb.items() if m not in skip}, k
        assert ia == ib, f"batch {k}: state"


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    """An empty resident cache; snapshots by count only (these states are small: by the byte rule nearly every
    batch would write a snapshot and the replays would see few deltas)."""
    monkeypatch.setattr(W, "SNAPSHOT_RATIO", 1e9)
    R.cache().clear()
    yield
    R.cache().clear()


BATCHES = orders_stream(n_batches=10, seed=5)


@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("shape", ["inner", "constraints", "outer", "nested"])
def test_resident_equals_full_with_hits_and_misses(tmp_path, layout, shape):
    full, _ = _run(_shaped(shape, "full", ""), BATCHES)
    if shape == "inner":
        assert [o for o, _, _ in full] == reference(BATCHES)
    if shape in ("outer", "nested"):
        assert sum(c[M.PADDED_ROWS] for _, c, _ in full) > 0
    config = _shaped(shape, layout, str(tmp_path / "hit"))
    hits, value = _run(config, BATCHES)
    _same(hits, full)
    # one worker process: every call after the first finds its copy
    assert [c[M.STATE_CACHE_HITS] for _, c, _ in hits][1:] == [1] * (len(BATCHES) - 1)
    assert sum(c[M.STATE_CACHE_MISSES] for _, c, _ in hits) == 0
    assert (L.is_manifest if layout == "files" else L.is_log)(value[0])
    misses, _ = _run(_shaped(shape, layout, str(tmp_path / "miss")), BATCHES, clear=True)
    _same(misses, full)
    assert sum(c[M.STATE_CACHE_MISSES] for _, c, _ in misses) == len(BATCHES) - 1
    assert sum(c[M.STATE_CACHE_HITS] for _, c, _ in misses) == 0


@pytest.mark.parametrize("layout", ["changelog", "files"])
def test_chunked_probe_steps_are_recorded_too(tmp_path, monkeypatch, layout):
    """Under a chunk schedule (the control entry's params, docs/chain.md) the rows are stored by ``store`` after
    the steps: the same output and state, resident or replayed."""
    monkeypatch.setattr(MultiJoinWorker, "schedule", lambda self, entry, where: Schedule(chain.STRATEGIES[0], 8))
    full, _ = _run(_shaped("inner", "full", ""), BATCHES)
    assert sum(c[M.CHUNK_STEPS] for _, c, _ in full) > 0
    _same(_run(_shaped("inner", layout, str(tmp_path / "a")), BATCHES)[0], full)
    _same(_run(_shaped("inner", layout, str(tmp_path / "b")), BATCHES, clear=True)[0], full)


@pytest.mark.parametrize("layout", ["changelog", "files"])
def test_values_hold_deltas_and_files_only_a_manifest(tmp_path, layout):
    config = _shaped("inner", layout, str(tmp_path / "s"), every=4)
    worker, value, deltas = MultiJoinWorker(config), None, []
    for rows, wm in BATCHES:
        _, _, value = _call(worker, rows, wm, value)
        if layout == "files":
            manifest = L.Manifest.decode(value[0])
            assert all(v == b"" for v in value[1:]) and len(value) == 1 + config.n
            deltas.append(len(manifest.deltas))
        else:
            deltas.append(L.parse(value[0])[3].deltas)
    assert deltas == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]   # a snapshot every 4 batches
    if layout == "files":
        names = sorted(p.name for p in (tmp_path / "s" / "g0").iterdir())
        assert [n[0] for n in names].count("s") == 3 and [n[0] for n in names].count("d") == 7


@pytest.mark.parametrize("layout", ["changelog", "files"])
@pytest.mark.parametrize("shape", ["inner", "outer"])
def test_restart_from_a_value_and_from_the_full_layout(tmp_path, layout, shape):
    """A new worker (a restarted query: its own resident name space) continues from the value of batch 5 --
    written by this layout, or by the full layout (a checkpoint switched to it) -- and matches the full run."""
    full, full_value = _run(_shaped(shape, "full", ""), BATCHES[:5])
    rest, _ = _run(_shaped(shape, "full", ""), BATCHES[5:], value=full_value)
    config = _shaped(shape, layout, str(tmp_path / "s"))
    first, value = _run(config, BATCHES[:5])
    _same(first, full)
    again = MultiJoinWorker(dataclasses.replace(config, state_id="restarted"))
    cont, _ = _run(config, BATCHES[5:], worker=again, value=value)
    _same(cont, rest)
    assert cont[0][1][M.STATE_CACHE_MISSES] == 1 and cont[1][1][M.STATE_CACHE_HITS] == 1
    switched, _ = _run(config, BATCHES[5:], worker=MultiJoinWorker(dataclasses.replace(config, state_id="x")),
                       value=full_value)
    _same(switched, rest)
    back, _ = _run(_shaped(shape, "full", ""), BATCHES[5:],
                   worker=MultiJoinWorker(dataclasses.replace(config, persistence="full")), value=value)
    _same(back, rest)


@pytest.mark.parametrize("layout", ["changelog", "files"])
def test_retried_batch_refuses_its_first_attempts_copy(tmp_path, layout):
    """Spark retries batch 6 from the value of batch 5: the cache holds batch 6's first attempt (another token),
    which must be refused; relabelled with the current token (the control) it is used and the output differs."""
    config = _shaped("inner", layout, str(tmp_path / "s"))
    worker = MultiJoinWorker(config)
    _, v5 = _run(config, BATCHES[:6], worker=worker)
    rows, wm = BATCHES[6]
    first, c1, _ = _call(worker, rows, wm, v5)
    assert c1[M.STATE_CACHE_HITS] == 1
    again, c2, _ = _call(worker, rows, wm, v5)
    assert c2[M.STATE_CACHE_MISSES] == 1 and again == first and len(first) > 0
    # the control: batch 6's copy offered as batch 5's version is used, and its rows are there twice
    key = (config.state_id, (0,))
    entry = R.cache()._entries[key]
    R.cache()._entries[key] = (L.token_of(v5[0]), entry[1], entry[2])
    wrong, c3, _ = _call(worker, rows, wm, v5)
    assert c3[M.STATE_CACHE_HITS] == 1 and wrong != first


def test_missing_files_and_state_dir_are_named(tmp_path):
    config = _shaped("inner", "files", str(tmp_path / "s"))
    _, value = _run(config, BATCHES[:3])
    R.cache().clear()
    with pytest.raises(ValueError, match="state_dir"):
        _call(MultiJoinWorker(dataclasses.replace(config, state_dir=None)), *BATCHES[3], value)
    with pytest.raises(FileNotFoundError, match="state directory"):
        _call(MultiJoinWorker(dataclasses.replace(config, state_dir=str(tmp_path / "other"))), *BATCHES[3], value)


def test_delta_round_trip_and_replay():
    delta = MC.Delta()
    delta.ops += [(MC.APPEND, 1, pa.table({"a": [1, 2]})),
                  (MC.STORE, 1, {"keys": [5, 6], "times": [1, 2], "ids": [0, 1], "null_key": None, "ends": None}),
                  (MC.REMOVE, 1, {"ids": [0]}), (MC.EVICT, 2, 123_000)]
    delta.pending = pa.table({"p": [7]})
    back = MC.Delta.decode(delta.encode())
    assert [op[:2] for op in back.ops] == [(MC.APPEND, 1), (MC.STORE, 1), (MC.REMOVE, 1), (MC.EVICT, 2)]
    assert back.ops[0][2].equals(delta.ops[0][2]) and back.ops[3][2] == 123_000
    assert list(back.ops[1][2]["keys"]) == [5, 6] and "ends" not in back.ops[1][2]
    assert back.pending.equals(delta.pending)
    with pytest.raises(ValueError, match="corrupt"):
        MC.Delta.decode(delta.encode()[:-1])


def _spec(streaming=True, checkpoint=None):
    conf = types.SimpleNamespace(get=lambda key, default=None: checkpoint if key.endswith("checkpointLocation")
                                 else default)
    session = types.SimpleNamespace(conf=conf)
    return MultiJoinSpec([types.SimpleNamespace(sparkSession=session)], [], None, [], (), [], streaming, 8, "mj",
                         None)


def test_state_persistence_is_validated(tmp_path):
    spec = _spec()
    spec.set_persistence(None, 10)
    assert spec.persistence == "full"
    spec.set_persistence("files", 3, "rel/dir")
    assert (spec.persistence, spec.snapshot_every) == ("files", 3) and spec.state_dir.endswith("/rel/dir")
    assert spec.state_dir.startswith("/")
    with pytest.raises(ValueError, match="state_persistence must be one of 'full', 'changelog', 'files'"):
        _spec().set_persistence("rocksdb", 10)
    with pytest.raises(TypeError, match="snapshot_every must be an int"):
        _spec().set_persistence("files", 2.5, "x")
    with pytest.raises(ValueError, match="snapshot_every must be an int >= 1"):
        _spec().set_persistence("changelog", 0)
    with pytest.raises(TypeError, match="state_dir must be a directory path"):
        _spec().set_persistence("files", 10, 5)
    with pytest.raises(ValueError, match="state_persistence='files' needs state_dir="):
        _spec().set_persistence("files", 10)
    spec = _spec(checkpoint=str(tmp_path))
    spec.set_persistence("files", 10)
    assert spec.state_dir == f"{tmp_path}/pyspark_cq_state/mj"
    batch = _spec(streaming=False)
    batch.set_persistence("files", 10)   # batch inputs keep no state
    assert batch.persistence == "full"
    assert M.STATE_CACHE_HITS not in MultiJoinWorker(_config(())).metrics   # the full layout's columns as they were
    assert M.STATE_CACHE_HITS in MultiJoinWorker(dataclasses.replace(_config(()), persistence="files")).metrics


@pytest.mark.parametrize("shape", ["inner", "constraints", "outer", "nested"])
def test_a_copy_behind_catches_up_with_the_deltas_it_missed(tmp_path, shape):
    """Files layout, two Python workers taking turns: before batch 6 the cache holds worker B's copy as of batch
    2 (restored from that batch's value: objects of their own), worker A having run batches 3-5. B's copy is used
    with the three delta files it missed replayed (a catch-up), and every batch equals the full layout's (output,
    counters, state image)."""
    full, _ = _run(_shaped(shape, "full", ""), BATCHES)
    config = _shaped(shape, "files", str(tmp_path / "s"), every=20)
    worker, value, out, behind = MultiJoinWorker(config), None, [], None
    for b, (rows, wm) in enumerate(BATCHES):
        if b == 6:
            R.cache().put((config.state_id, (0,)), L.token_of(behind[0][0]), behind[1], 1)
        got, counters, value = _call(worker, rows, wm, value)
        out.append((got, counters, _image(config, value)))
        if b == 6:
            assert [counters[m] for m in M.STATE_CACHE] == [0, 0, 1]
        if b == 2:
            behind = (value, worker._restore_state(_State(value, wm), (0,)))
    _same(out, full)
