"""Worker instrumentation for issue 14 (join_gap_metrics.py --trace): per Python task, where its time goes.

Only active when CQ_TRACE names a file (one JSON line per task is appended); Spark starts its Python workers
with this directory on PYTHONPATH, so Python imports this module at start-up in the daemon and its workers.
"""
import os
import time

_LOG = os.environ.get("CQ_TRACE")


def calibrate(n=200_000):
    """Seconds (wall, this thread's CPU) of a fixed pure-Python loop and of a fixed numpy sort: the CPU speed
    the caller gets now."""
    import numpy as np

    t, c = time.perf_counter(), time.thread_time()
    x = 0
    for i in range(n):
        x += i
    t1, c1 = time.perf_counter(), time.thread_time()
    np.sort(np.random.default_rng(0).integers(0, 1 << 40, 200_000))
    return t1 - t, c1 - c, time.perf_counter() - t1, time.thread_time() - c1
if _LOG:
    import json

    import pyspark.worker as _W

    _orig = _W.read_udfs

    def _read_udfs(*a, **k):
        func, prof, deser, ser = _orig(*a, **k)
        acc = {"read": 0.0, "produce": 0.0, "udf": 0.0, "batches_in": 0, "batches_out": 0,
               "t0": time.time(), "cpu0": time.process_time(), "tcpu0": time.thread_time()}
        _W._cq_acc = acc
        load, dump = deser.load_stream, ser.dump_stream

        def timed(iterable, seconds, count):
            """``iterable``'s items, the time spent getting each added to acc[seconds], each counted in
            acc[count]."""
            it = iter(iterable)
            while True:
                t = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    acc[seconds] += time.perf_counter() - t
                    return
                acc[seconds] += time.perf_counter() - t
                acc[count] += 1
                yield b

        def load_stream(stream):
            for b in timed(load(stream), "read", "batches_in"):
                acc.setdefault("first_in", time.time())
                if "calib" not in acc and os.environ.get("CQ_TRACE_CALIBRATE"):
                    acc["calib"] = calibrate()
                yield b

        def dump_stream(iterator, stream):
            t = time.perf_counter()
            try:
                return dump(timed(iterator, "produce", "batches_out"), stream)
            finally:
                acc["dump"] = time.perf_counter() - t
                acc["cpu"] = time.process_time() - acc["cpu0"]
                if os.environ.get("CQ_TRACE_CALIBRATE"):
                    acc["calib_end"] = calibrate()
                acc["tcpu"] = time.thread_time() - acc["tcpu0"]
                acc["pid"] = os.getpid()
                acc["end"] = time.time()
                with open(_LOG, "a") as f:
                    f.write(json.dumps(acc) + "\n")

        deser.load_stream = load_stream
        ser.dump_stream = dump_stream
        return func, prof, deser, ser

    _W.read_udfs = _read_udfs

    try:
        import resource

        from pyspark_cq.operators.join import worker as _J

        _RU = ("ru_utime", "ru_stime", "ru_minflt", "ru_majflt", "ru_nvcsw", "ru_nivcsw")

        def _traced(call):
            """A stateful group function ``call`` (a generator) timed per call: wall time, and this thread's
            CPU (user, system), page faults and context switches, summed per task."""
            def traced(self, key, pdfs, state):
                acc = getattr(_W, "_cq_acc", None)
                t, r = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
                try:
                    yield from call(self, key, pdfs, state)
                finally:
                    if acc is not None:
                        acc["udf"] += time.perf_counter() - t
                        acc["calls"] = acc.get("calls", 0) + 1
                        r1 = resource.getrusage(resource.RUSAGE_THREAD)
                        for f in _RU:
                            acc["udf " + f] = acc.get("udf " + f, 0) + getattr(r1, f) - getattr(r, f)
            return traced

        _J.JoinWorker.streaming = _traced(_J.JoinWorker.streaming)

        # the steps join_worker_profile.py times outside Spark, here inside it (ms per task, summed)
        from pyspark_cq.operators._common import metrics as _M
        from pyspark_cq.operators._common import state_bytes as _SB

        _steps = [(_J.JoinWorker, "_restore"), (_J.JoinWorker, "_kernel"), (_J.PayloadSide, "from_bytes"),
                  (_J, "split_sides"), (_J.JoinWorker, "_process"), (_J.JoinWorker, "_side_input"),
                  (_J.JoinWorker, "_insert_probe"), (_J.JoinWorker, "_evict"), (_J.JoinWorker, "_emit"),
                  (_J.JoinWorker, "_save"), (_J.PayloadSide, "canonicalize"), (_SB, "pack"), (_SB, "unpack"),
                  (_J.PayloadSide, "to_bytes"), (_J.JoinWorker, "_packed"), (_M, "packed_row")]

        def _timer(owner, name):
            raw = owner.__dict__[name]
            fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    acc = getattr(_W, "_cq_acc", None)
                    if acc is not None:
                        key = "step " + name
                        acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
                        if name == "_restore" and len(a) > 1 and getattr(a[1], "exists", False):
                            acc["state types"] = [type(b).__name__ for b in a[1].get]

            setattr(owner, name, type(raw)(timed) if isinstance(raw, (staticmethod, classmethod)) else timed)

        for _owner, _name in _steps:
            _timer(_owner, _name)

        # the sliding aggregation's stateful function and its steps (the same accounting, "agg" calls)
        from pyspark_cq.operators.aggregate import shard as _AS
        from pyspark_cq.operators.aggregate import transport as _A

        _A.StatefulShard.__call__ = _traced(_A.StatefulShard.__call__)
        for _name in ("to_arrow", "unpack_slices", "run_shard"):   # as the stateful function calls them
            _timer(_A, _name)
        for _name in ("_restore", "_ingest", "_emit", "_evict", "_save", "_unmarked"):   # run_shard's steps
            _timer(_AS, _name)
    except Exception as e:  # noqa: BLE001
        with open(_LOG, "a") as f:
            f.write(json.dumps({"patch_error": repr(e)}) + "\n")
