"""Multi-way join state kernel (issue 15, MJoin): probe steps per second for a 3-way band join."""
import time

import numpy as np

from pyspark_cq._native import load


class MultiJoinKernel:
    """1 M rows over 3 inputs on one timeline (10 us apart); chunks of 10 k rows per input rotate over the
    inputs, each inserts and probes the other two in a fixed order, then rows older than 1 s expire.

    Inputs 1 and 2 are bounded against input 0: t1 - t0 and t2 - t0 in [-30 ms, 30 ms]. A probe step is
    one partial match entering one step of the probe order (the sum of the `probed` counters).
    """

    params = [20_000, 200_000]
    param_names = ["keys"]
    n = 1_000_000
    chunk = 10_000

    def setup(self, keys):
        self.mj = load("_mjoin")
        rng = np.random.default_rng(0)
        self.k = rng.integers(0, keys, self.n).astype(np.int64)
        self.t = np.arange(self.n, dtype=np.int64) * 10 + rng.integers(0, 1000, self.n)
        self.ids = np.arange(self.n, dtype=np.int64)

    def _run(self):
        state = self.mj.MultiJoinState(3, [(0, 1, -30_000, 30_000), (0, 2, -30_000, 30_000)])
        steps = 0
        matches = 0
        span = 3 * self.chunk
        for s in range(0, self.n, span):
            for inp in range(3):
                sl = slice(s + inp, s + span, 3)
                order = [o for o in range(3) if o != inp]
                m, probed, _ = state.insert_probe(inp, self.k[sl], self.t[sl], self.ids[sl], None, order)
                steps += int(probed.sum())
                matches += len(m)
            horizon = int(self.t[min(s + span, self.n) - 1]) - 1_000_000
            for i in range(3):
                state.evict(i, horizon)
        return steps, matches

    def time_insert_probe_expire_1m(self, keys):
        self._run()

    def track_probe_steps_per_second(self, keys):
        start = time.perf_counter()
        steps, _ = self._run()
        return steps / (time.perf_counter() - start)

    track_probe_steps_per_second.unit = "probe steps/s"
