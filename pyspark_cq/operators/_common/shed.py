"""Load shedding shared by the operators: which input rows a ``drop_ratio`` drops, and the shedding stage.

Every operator that reads ``drop_ratio`` from its control-table entry (STREAM §4; RTStream, Wei et al.,
§4.4: keep the fraction ε = 1 − drop_ratio of the input, dropped early, before the expensive operators)
decides with :func:`shed_mask`: a hash of the row, not of its position, so a restart from a checkpoint
drops the same rows. Shed rows are counted (``shed_rows`` in the operator's report), never silently lost.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from ...vocabulary import metrics as M
from . import metrics as _metrics

__all__ = ["shed_mask", "shed_batch", "batch_shed_mask", "row_uniform", "SHED"]

SHED = M.SHED_ROWS  #: the report counter of rows dropped by load shedding


_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64_finalize(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic); native/common.hpp's
    ``splitmix64_finalize``.
    """
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def shed_mask(table: pa.Table, micros: np.ndarray, side: int, seed: int, ratio: float) -> np.ndarray:
    """Which rows load shedding drops (PIPES §5.3, random load shedding): True with probability ``ratio``.

    The decision is a hash of (seed, side, the row's time, its key and payload values), not of its
    position, so a restart from a checkpoint (or another split into micro-batches) drops the same rows.
    Equal rows get equal decisions.

    Parameters
    ----------
    table : pyarrow.Table
        The decoded rows of one side (keys first, then payload).
    micros : numpy.ndarray
        Their times (int64 µs).
    side : int
        0 left, 1 right.
    seed : int
        Any int.
    ratio : float
        Drop probability in [0, 1).
    """
    if ratio <= 0.0 or table.num_rows == 0:
        return np.zeros(table.num_rows, dtype=bool)
    return _uniform(table, micros, side, seed) < ratio


def _uniform(table: pa.Table, micros: np.ndarray, side: int, seed: int) -> np.ndarray:
    """A number in [0, 1) per row, a hash of (seed, side, time, values): equal rows get equal numbers."""
    n = table.num_rows
    values = pd.util.hash_pandas_object(_metrics.to_pandas(table), index=False).to_numpy(dtype=np.uint64)
    h = _splitmix64_finalize(np.full(n, (int(seed) * 2 + side) % 2**64, dtype=np.uint64))
    h = _splitmix64_finalize(h ^ np.asarray(micros, dtype=np.int64).view(np.uint64))
    h = _splitmix64_finalize(h ^ values)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def row_uniform(batch: pa.RecordBatch, seed: int) -> np.ndarray:
    """A number in [0, 1) per row of ``batch``, a hash of its values (no time): ``row_uniform(b, s) < r``
    is a sample of ratio r, and the samples of smaller ratios are inside those of larger ones.
    """
    if batch.num_rows == 0:
        return np.zeros(0)
    return _uniform(pa.Table.from_batches([batch]), np.zeros(batch.num_rows, dtype=np.int64), 0, seed)


def batch_shed_mask(batch: pa.RecordBatch, ratio: float, seed: int = 0) -> np.ndarray:
    """Which rows of ``batch`` the shedding stage of a stateless operator drops: :func:`shed_mask` hashing
    every column (no time).
    """
    if ratio <= 0.0 or batch.num_rows == 0:
        return np.zeros(batch.num_rows, dtype=bool)
    return shed_mask(pa.Table.from_batches([batch]), np.zeros(batch.num_rows, dtype=np.int64), 0, seed, ratio)


def shed_batch(batch: pa.RecordBatch, ratio: float, seed: int = 0) -> tuple[pa.RecordBatch, int]:
    """The shedding stage of a stateless operator: ``batch`` without the rows :func:`batch_shed_mask`
    drops, and how many it dropped.
    """
    if ratio <= 0.0 or batch.num_rows == 0:
        return batch, 0
    drop = batch_shed_mask(batch, ratio, seed)
    n = int(drop.sum())
    return (batch.filter(pa.array(~drop)) if n else batch), n
