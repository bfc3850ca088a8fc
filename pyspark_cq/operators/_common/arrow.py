"""Arrow tables from the pandas frames Spark hands to a stateful step (``applyInPandas[WithState]``)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa


def to_arrow(pdf: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """Sliced rows from pandas. Floating columns keep NaN as NaN (``Table.from_pandas`` would make it
    null): Spark already turned their nulls into NaN, and the partials' nulls are told apart by counts.
    """
    arrays = []
    for field in schema:
        series = pdf[field.name]
        if pa.types.is_floating(field.type):
            arrays.append(pa.array(series.to_numpy(dtype=np.float64, na_value=np.nan), type=field.type))
        else:
            arrays.append(pa.Array.from_pandas(series, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
