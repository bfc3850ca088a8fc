# Type stub of the compiled module pyspark_cq._serde (pybind11, native/serde.cpp).
from collections.abc import Sequence
from typing import Any, Final

import numpy.typing as npt

FORMAT: Final[str]

def pack(columns: Sequence[npt.NDArray[Any]]) -> bytes: ...
def unpack(blob: bytes) -> list[npt.NDArray[Any]]: ...
