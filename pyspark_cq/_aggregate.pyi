# Type stub of the compiled module pyspark_cq._aggregate (pybind11, native/aggregate.cpp).
from collections.abc import Sequence
from typing import Final, SupportsIndex, TypeAlias, TypedDict, type_check_only

import numpy as np
import numpy.typing as npt

OP_ROWS: Final[int]
OP_COUNT: Final[int]
OP_SUM_I: Final[int]
OP_SUM_F: Final[int]
OP_MIN_I: Final[int]
OP_MIN_F: Final[int]
OP_MAX_I: Final[int]
OP_MAX_F: Final[int]
OP_SUM_HI: Final[int]
OP_HLL: Final[int]
OP_FIRST: Final[int]
OP_LAST: Final[int]
OP_PAIR_VALUE: Final[int]
OP_MOMENTS: Final[int]
KIND_ADD_I64: Final[int]
KIND_ADD_F64: Final[int]
KIND_MIN: Final[int]
KIND_MAX: Final[int]
KIND_MAX_BYTES: Final[int]
KIND_FIRST: Final[int]
KIND_LAST: Final[int]
KIND_PAIR_VALUE: Final[int]
KIND_MOMENTS: Final[int]
OUT_COUNT: Final[int]
OUT_SUM_I: Final[int]
OUT_SUM_F: Final[int]
OUT_AVG_I: Final[int]
OUT_AVG_F: Final[int]
OUT_MIN: Final[int]
OUT_MAX: Final[int]
OUT_SUM_I_CHECKED: Final[int]
OUT_RAW: Final[int]
OP_DDSKETCH: Final[int]
KIND_DDSKETCH: Final[int]
OUT_QUANTILE: Final[int]
DD_WORDS: Final[int]
DD_BINS: Final[int]
DD_ALPHA: Final[float]
QUANTILE_UNITS: Final[int]

@type_check_only
class _Slices(TypedDict):
    first_row: npt.NDArray[np.int64]
    hash: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    partials: list[npt.NDArray[np.int64]]
    null_time: int

# (slot, start or from, end or to, values per output, valid flags per output)
_Emitted: TypeAlias = tuple[
    npt.NDArray[np.int32],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    list[npt.NDArray[np.int64]],
    list[npt.NDArray[np.uint8]],
]

def preaggregate(
    hash: npt.ArrayLike,
    time: npt.ArrayLike,
    time_valid: npt.ArrayLike | None,
    granularity: SupportsIndex,
    ops: npt.ArrayLike,
    values: Sequence[npt.ArrayLike | None],
    valids: Sequence[npt.ArrayLike | None],
) -> _Slices: ...
def f64_keys(x: npt.ArrayLike) -> npt.NDArray[np.int64]: ...
def keys_f64(keys: npt.ArrayLike) -> npt.NDArray[np.float64]: ...

class ShardState:
    def __init__(self, kinds: npt.ArrayLike, outputs: npt.ArrayLike, runs: bool) -> None: ...
    @staticmethod
    def from_bytes(blob: bytes, kinds: npt.ArrayLike, outputs: npt.ArrayLike, runs: bool) -> ShardState: ...
    def to_bytes(self) -> bytes: ...
    @property
    def num_keys(self) -> int: ...
    @property
    def key_hashes(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_slices(self) -> int: ...
    @property
    def num_runs(self) -> int: ...
    @property
    def payload_bytes(self) -> int: ...
    @property
    def watermark(self) -> int | None: ...
    @watermark.setter
    def watermark(self, value: SupportsIndex) -> None: ...
    def ingest(
        self,
        hash: npt.ArrayLike,
        start: npt.ArrayLike,
        partials: Sequence[npt.ArrayLike],
        window: SupportsIndex,
        slide: SupportsIndex,
        late_end: SupportsIndex | None,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], int, int]: ...
    def emit_windows(
        self,
        window: SupportsIndex,
        slide: SupportsIndex,
        lo_end: SupportsIndex | None,
        hi_end: SupportsIndex | None,
        only_touched: bool,
        start_lo: SupportsIndex | None = None,
        start_hi: SupportsIndex | None = None,
    ) -> _Emitted: ...
    def emit_changes(
        self,
        window: SupportsIndex,
        granularity: SupportsIndex,
        lo_end: SupportsIndex | None,
        hi_end: SupportsIndex | None,
    ) -> _Emitted: ...
    def evict(
        self, window: SupportsIndex, slide: SupportsIndex, watermark: SupportsIndex
    ) -> tuple[npt.NDArray[np.int64], int, int]: ...
