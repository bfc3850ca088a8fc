"""Sliding-aggregation kernels (PIPES Algorithm 1 over granule slices): map-side slicing, the per-shard
sweep at W/S in {1, 60, 600} (work per element must not depend on W/S), and the state snapshot."""
import time

import numpy as np

from pyspark_cq._native import load


def _rows(n, keys, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, keys, n).astype(np.int64) * 0x9E3779B1
    t = np.arange(n, dtype=np.int64) * 1000 + rng.integers(0, 1000, n)  # 1000 rows per second of event time
    v = rng.integers(0, 1000, n).astype(np.int64)
    return h, t, v


class AggregateMapKernel:
    """Raw rows -> slices (one per key and 1 s granule): count(*), count, sum, max of a long column."""

    params = [100, 100_000]
    param_names = ["keys"]
    n = 1_000_000
    batch = 100_000

    def setup(self, keys):
        self.k = load("_aggregate")
        self.h, self.t, self.v = _rows(self.n, keys)
        self.ops = np.array([self.k.OP_ROWS, -1, self.k.OP_COUNT, 0, self.k.OP_SUM_I, 0, self.k.OP_MAX_I, 0],
                            dtype=np.int32)
        self._run()  # warm caches and the allocator

    def _run(self):
        for s in range(0, self.n, self.batch):
            sl = slice(s, s + self.batch)
            self.k.preaggregate(self.h[sl], self.t[sl], None, 1_000_000, self.ops, [self.v[sl]], [None])

    def time_slice_1m_rows(self, keys):
        self._run()

    def track_rows_per_second(self, keys):
        start = time.perf_counter()
        self._run()
        return self.n / (time.perf_counter() - start)

    track_rows_per_second.unit = "rows/s"


class AggregateSweep:
    """Per-shard state: ingest slices batch by batch, emit the windows the watermark closes, evict."""

    params = [1, 60, 600]
    param_names = ["window_over_slide"]

    def setup(self, ratio):
        self.k = load("_aggregate")
        h, t, v = _rows(1_000_000, 100)
        ops = np.array([self.k.OP_ROWS, -1, self.k.OP_COUNT, 0, self.k.OP_SUM_I, 0, self.k.OP_MAX_I, 0], dtype=np.int32)
        self.sl = self.k.preaggregate(h, t, None, 1_000_000, ops, [v], [None])
        self.kinds = np.array([self.k.KIND_ADD_I64] * 3 + [self.k.KIND_MAX], dtype=np.uint8)
        self.outs = np.array([self.k.OUT_SUM_I, 2, 1, self.k.OUT_MAX, 3, 1, self.k.OUT_COUNT, 0, -1], dtype=np.int32)
        self.window = ratio * 1_000_000
        self._run()

    def _run(self):
        st = self.k.ShardState(self.kinds, self.outs, False)
        m, step, emitted = len(self.sl["hash"]), 1000, 0
        for b in range(0, m, step):
            sel = slice(b, b + step)
            st.ingest(self.sl["hash"][sel], self.sl["start"][sel], [p[sel] for p in self.sl["partials"]],
                      self.window, 1_000_000, None)
            wm = int(self.sl["start"][min(b + step, m) - 1])
            emitted += len(st.emit_windows(self.window, 1_000_000, st.watermark, wm, False)[0])
            st.evict(self.window, 1_000_000, wm)
            st.watermark = wm
        return m + emitted

    def time_sweep_100k_slices(self, ratio):
        self._run()

    def track_updates_per_second(self, ratio):
        start = time.perf_counter()
        updates = self._run()
        return updates / (time.perf_counter() - start)

    track_updates_per_second.unit = "slices+windows/s"


class AggregateSnapshot:
    """Serializing a shard's state into the GroupState blob and back (done once per micro-batch)."""

    params = [60, 600]
    param_names = ["slices_per_key"]

    def setup(self, per_key):
        k = load("_aggregate")
        keys = 1000
        h = np.repeat(np.arange(keys, dtype=np.int64), per_key)
        t = np.tile(np.arange(per_key, dtype=np.int64) * 1_000_000, keys)
        ops = np.array([k.OP_ROWS, -1, k.OP_COUNT, 0, k.OP_SUM_I, 0, k.OP_MAX_I, 0], dtype=np.int32)
        sl = k.preaggregate(h, t, None, 1_000_000, ops, [t], [None])
        self.kinds = np.array([k.KIND_ADD_I64] * 3 + [k.KIND_MAX], dtype=np.uint8)
        self.outs = np.array([k.OUT_COUNT, 0, -1], dtype=np.int32)
        st = k.ShardState(self.kinds, self.outs, False)
        st.ingest(sl["hash"], sl["start"], sl["partials"], per_key * 1_000_000, 1_000_000, None)
        self.k, self.blob = k, st.to_bytes()
        self.state = st

    def time_to_bytes(self, per_key):
        self.state.to_bytes()

    def time_from_bytes(self, per_key):
        self.k.ShardState.from_bytes(self.blob, self.kinds, self.outs, False)

    def track_blob_bytes_per_slice(self, per_key):
        return len(self.blob) / self.state.num_slices

    track_blob_bytes_per_slice.unit = "bytes"


class AggregateSlicerTransport:
    """The streaming slicer (Python wrapper and kernel) on 1 M rows in Spark's 10 k-row Arrow batches, and
    the stateful side reading its output back: one row per slice, or packed (one IPC message per shard)."""

    params = ["rows", "packed"]
    param_names = ["transport"]

    def setup(self, transport):
        import pyarrow as pa
        from pyspark.sql import types as T

        from pyspark_cq.operators._common.arrow import to_arrow
        from pyspark_cq.operators.aggregate import config as A
        from pyspark_cq.operators.aggregate import slicer
        from pyspark_cq.operators.aggregate import spec as S
        from pyspark_cq.operators.aggregate import transport as stateful

        class _Frame:  # what parse_aggs reads of a DataFrame: its schema
            schema = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("k", T.LongType()),
                                   T.StructField("v", T.LongType())])

        spec = S.parse_aggs(_Frame, {"v": ["sum", "max"], "*": ["count"]}, ["k"])
        names = ("window_start", "window_end", "k") + tuple(o.name for o in spec.outputs)
        self.config = A.AggConfig(spec, S.key_columns(_Frame, ["k"]), T.TimestampType(), 60_000_000, 1_000_000,
                                  1_000_000, "windows", "append", True, 8, names)
        h, t, v = _rows(1_000_000, 100)
        self.batches = [pa.RecordBatch.from_pydict({
            A.TIME: pa.array(t[s:s + 10_000], type=pa.timestamp("us", tz="UTC")), A.HASH: pa.array(h[s:s + 10_000]),
            A.key_name(0): pa.array(h[s:s + 10_000] // 0x9E3779B1), A.value_name(0): pa.array(v[s:s + 10_000])})
            for s in range(0, 1_000_000, 10_000)]
        self.slicer = slicer.Slicer(self.config, True, packed=transport == "packed")
        self.out = pa.Table.from_batches(list(self.slicer(iter(self.batches))))
        self.stateful, self.to_arrow = stateful, to_arrow

    def time_slice_1m_rows(self, transport):
        for _ in self.slicer(iter(self.batches)):
            pass

    def time_read_back(self, transport):
        """What the stateful side's Python does with one batch's slicer output (all shards at once): PySpark's
        Arrow-to-pandas conversion, then ours back to Arrow."""
        stateful = self.stateful
        pdf = self.out.to_pandas()
        if transport == "packed":
            stateful.unpack_slices(self.config.slices_arrow_schema(), [pdf])
        else:
            self.to_arrow(pdf, stateful._arrow_schema(self.config.sliced_schema({})))

    def track_rows_to_the_shuffle(self, transport):
        return self.out.num_rows

    track_rows_to_the_shuffle.unit = "rows"
