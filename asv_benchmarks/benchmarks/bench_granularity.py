"""Γ kernel (PIPES §2.4.3): rounded intervals per second."""
import numpy as np

from pyspark_cq._native import load


class GranularityKernel:
    params = [1_000, 1_000_000]
    param_names = ["granularity_us"]

    def setup(self, g):
        rng = np.random.default_rng(0)
        self.kernel = load("_granularity")
        self.start = rng.integers(0, 10**12, 1_000_000)
        self.end = self.start + rng.integers(0, 5_000_000, 1_000_000)
        self.kernel.round_intervals(self.start[:10], self.end[:10], g)  # warm up

    def time_round_1m_intervals(self, g):
        self.kernel.round_intervals(self.start, self.end, g, on_invalid="flag")


class Serde:
    def setup(self):
        self.serde = load("_serde")
        self.columns = [np.arange(1_000_000, dtype=np.int64), np.random.default_rng(0).random(1_000_000)]
        self.blob = self.serde.pack(self.columns)

    def time_pack_16mb(self):
        self.serde.pack(self.columns)

    def time_unpack_16mb(self):
        self.serde.unpack(self.blob)
