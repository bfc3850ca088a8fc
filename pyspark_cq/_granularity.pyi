# Type stub of the compiled module pyspark_cq._granularity (Cython, native/granularity.pyx).
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

STATUS_OK: Final[int]
STATUS_EMPTY: Final[int]
STATUS_MALFORMED: Final[int]

def round_intervals(
    start: npt.ArrayLike,
    end: npt.ArrayLike,
    granularity: int | np.integer[Any],
    valid: npt.ArrayLike | None = None,
    on_invalid: Literal["raise", "flag"] = "raise",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]]: ...
