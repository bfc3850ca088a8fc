# Type stub of the compiled module pyspark_cq._mjoin (pybind11, native/mjoin.cpp).
from collections.abc import Sequence
from typing import Final, SupportsIndex

import numpy as np
import numpy.typing as npt

FORMAT_VERSION: Final[int]

class MultiJoinState:
    def __init__(
        self, n_inputs: SupportsIndex, bounds: Sequence[tuple[int, int, int, int]]
    ) -> None: ...
    @property
    def n_inputs(self) -> int: ...
    @property
    def bounds(self) -> list[tuple[int, int, int, int]]: ...
    def insert_probe(
        self,
        input: SupportsIndex,
        keys: npt.ArrayLike,
        times: npt.ArrayLike,
        ids: npt.ArrayLike,
        null_key: npt.ArrayLike | None,
        order: Sequence[int],
        ends: npt.ArrayLike | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def probe_step(
        self,
        input: SupportsIndex,
        order: Sequence[int],
        step: SupportsIndex,
        keys: npt.ArrayLike,
        ids: npt.ArrayLike,
        times: npt.ArrayLike,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def store(
        self,
        input: SupportsIndex,
        keys: npt.ArrayLike,
        times: npt.ArrayLike,
        ids: npt.ArrayLike,
        null_key: npt.ArrayLike | None = None,
        ends: npt.ArrayLike | None = None,
    ) -> None: ...
    def evict(self, input: SupportsIndex, threshold: SupportsIndex) -> npt.NDArray[np.int64]: ...
    def closure(self) -> list[list[float]]: ...
    def live_rows(
        self, input: SupportsIndex
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def remove_ids(self, input: SupportsIndex, ids: npt.ArrayLike) -> int: ...
    def canonical_ids(self, input: SupportsIndex) -> npt.NDArray[np.int64]: ...
    def min_end(self, input: SupportsIndex) -> int | None: ...
    def rows(self, input: SupportsIndex) -> int: ...
    def keys(self, input: SupportsIndex) -> int: ...
    def serialize(self) -> bytes: ...
    @staticmethod
    def deserialize(blob: bytes) -> MultiJoinState: ...
