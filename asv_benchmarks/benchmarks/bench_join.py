"""Interval-join state kernel (PIPES §2.4.4, §3.6.3): insert + probe + expire, and eviction scaling."""
import numpy as np

from pyspark_cq._native import load


class JoinKernel:
    """A sliding symmetric band join: batches alternate sides, each inserts and probes, then expires."""

    params = [20_000, 200_000]
    param_names = ["keys"]
    n = 1_000_000
    batch = 100_000

    def setup(self, keys):
        self.join = load("_join")
        rng = np.random.default_rng(0)
        self.k = rng.integers(0, keys, self.n).astype(np.int64)
        self.t = np.arange(self.n, dtype=np.int64) * 10 + rng.integers(0, 1000, self.n)
        self.offsets = np.arange(self.batch + 1, dtype=np.int64) * 8
        self.ids = np.arange(self.n, dtype=np.int64)

    def _run(self):
        state = self.join.JoinState(-30_000, 30_000)
        for s in range(0, self.n, self.batch):
            sl = slice(s, s + self.batch)
            state.insert_probe((s // self.batch) % 2, self.offsets, self.k[sl].view(np.uint8), None,
                               self.t[sl], self.ids[sl])
            horizon = int(self.t[s + self.batch - 1]) - 5_000_000
            state.evict(0, horizon)
            state.evict(1, horizon)
        return state

    def time_insert_probe_expire_1m(self, keys):
        self._run()

    def track_tuples_per_second(self, keys):
        import time

        start = time.perf_counter()
        self._run()
        return self.n / (time.perf_counter() - start)

    track_tuples_per_second.unit = "tuples/s"


class JoinEviction:
    """Expiring a fixed 10k rows must not get slower with 10x more state (PIPES temporal linkage)."""

    params = [100_000, 1_000_000]
    param_names = ["state_rows"]

    def setup(self, size):
        self.join = load("_join")
        rng = np.random.default_rng(1)
        self.k = rng.integers(0, max(1, size // 5), size).astype(np.int64)
        self.t = np.arange(size, dtype=np.int64)
        self.offsets = np.arange(size + 1, dtype=np.int64) * 8

    def track_evict_10k_ms(self, size):
        """Median of 5 builds: milliseconds to expire the 10k oldest rows (state build not timed)."""
        import statistics
        import time

        times = []
        for _ in range(5):
            state = self.join.JoinState(0, 0)
            state.insert_probe(0, self.offsets, self.k.view(np.uint8), None, self.t, self.t)
            start = time.perf_counter()
            state.evict(0, 9_999)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    track_evict_10k_ms.unit = "ms"


class JoinSerde:
    """State (de)serialization per micro-batch: the cost GroupState adds on top of the kernel."""

    def setup(self):
        join = load("_join")
        rng = np.random.default_rng(2)
        n = 1_000_000
        k = rng.integers(0, 200_000, n).astype(np.int64)
        state = join.JoinState(-30_000, 30_000)
        state.insert_probe(0, np.arange(n + 1, dtype=np.int64) * 8, k.view(np.uint8), None,
                           np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64))
        self.join, self.state = join, state
        self.blob = state.serialize()

    def time_serialize_1m_rows(self):
        self.state.serialize()

    def time_deserialize_1m_rows(self):
        self.join.JoinState.deserialize(self.blob)

    def time_pack_1m_rows(self):
        """zstd framing of the image before it goes into GroupState (operators/_common/state_bytes.py)."""
        from pyspark_cq.operators._common import state_bytes as _state_bytes

        _state_bytes.pack(self.blob)

    def track_packed_bytes_per_row(self):
        from pyspark_cq.operators._common import state_bytes as _state_bytes

        return len(_state_bytes.pack(self.blob)) / 1_000_000

    track_packed_bytes_per_row.unit = "bytes"
