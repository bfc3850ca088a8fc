"""Worker side of :func:`pyspark_cq.rows_window` and :func:`pyspark_cq.rows_aggregate`: the stateful step of
one partition and micro-batch, run in Spark's Python workers (``applyInPandasWithState``, or
``applyInPandas`` for a batch DataFrame).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ...vocabulary import metrics as M
from .._common import metrics as _metrics
from .._common.arrow import to_arrow
from .._common.state_bytes import table_from_bytes, table_to_bytes

__all__ = ["SIGN", "AT"]

#: Output columns: +1 when a row enters the window, -1 when it leaves; and the instant it does.
SIGN, AT = "cq_sign", "cq_at"


_T = "__cq_t"  # the time as µs since the epoch (long), added before the stateful step


class _RowsWorker:
    """The stateful step of one partition and micro-batch (picklable for Spark's Python workers)."""

    def __init__(self, rows: int, time: str, ties: list[str], in_schema: pa.Schema, out_schema: pa.Schema):
        self.rows, self.time, self.ties = rows, time, ties
        self.in_schema, self.out_schema = in_schema, out_schema

    def batch(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """``applyInPandas`` form (batch input): one call with no previous state."""
        table = to_arrow(pdf, self.in_schema)
        out, _, counters = self.step(table, None)
        return _metrics.packed_row(out, self.out_schema, **counters)

    def __call__(self, key, pdfs, state):
        frames = [p for p in pdfs if len(p)]
        table = (pa.concat_tables([to_arrow(p, self.in_schema) for p in frames]) if frames
                 else self.in_schema.empty_table())
        kept = table_from_bytes(state.get[0]) if state.exists else None
        out, new_state, counters = self.step(table, kept)
        blob = table_to_bytes(new_state)
        state.update((blob,))
        counters[M.STATE_BYTES] = len(blob)
        yield _metrics.packed_row(out, self.out_schema, **counters)

    def step(self, table: pa.Table, kept: pa.Table | None):
        """Insertions and deletions caused by ``table`` given the ``kept`` rows; the new kept rows; counters."""
        table, combined, m, counters = self._advance(table, kept)
        k, n = table.num_rows, self.rows
        # Arrival p (0-based over kept + new) pushes out row p - n.
        positions = np.arange(m, m + k)
        pushed = positions - n
        leaving = pushed >= 0
        ins = table.append_column(SIGN, pa.array(np.ones(k, dtype=np.int32))).append_column(AT, table[self.time])
        dels = combined.take(pa.array(pushed[leaving]))
        dels = dels.append_column(SIGN, pa.array(np.full(dels.num_rows, -1, dtype=np.int32))).append_column(
            AT, table[self.time].take(pa.array(np.nonzero(leaving)[0])))
        out = pa.concat_tables([ins, dels]).drop_columns([_T])
        new_kept = combined.slice(max(0, combined.num_rows - n))
        counters.update({M.OUTPUT_ROWS: out.num_rows, M.STATE_ROWS: new_kept.num_rows, M.EVICTED_ROWS: dels.num_rows})
        return out, new_kept, counters

    def _advance(self, table: pa.Table, kept: pa.Table | None):
        """The on-time new rows in window order, kept + them, the number kept before, and the input counters."""
        n_in = table.num_rows
        valid = pc.is_valid(table[_T])
        malformed = n_in - pc.sum(valid).as_py() if n_in else 0
        table = table.filter(valid)
        order = [(_T, "ascending")] + [(c, "ascending") for c in self.ties]
        table = table.sort_by(order) if table.num_rows > 1 else table
        if kept is None:
            kept = self.in_schema.empty_table()
        late = 0
        if kept.num_rows and table.num_rows:
            newest = kept[_T][kept.num_rows - 1].as_py()
            on_time = pc.greater_equal(table[_T], newest)
            late = table.num_rows - pc.sum(on_time).as_py()
            table = table.filter(on_time)
        m = kept.num_rows
        combined = pa.concat_tables([kept, table]) if m else table
        return table, combined, m, {M.INPUT_ROWS: n_in, M.LATE_ROWS: late, M.MALFORMED_ROWS: malformed}


_FLAG = "__cq_flag"


class _RowsAggregateWorker(_RowsWorker):
    """:func:`rows_aggregate`'s step: the window's aggregates at every instant with arrivals."""

    def __init__(self, rows, time, ties, in_schema, out_schema, parts, specs, emit):
        super().__init__(rows, time, ties, in_schema, out_schema)
        self.parts, self.specs, self.emit = parts, specs, emit

    def step(self, table: pa.Table, kept: pa.Table | None):
        """The emitted aggregates caused by ``table`` given the ``kept`` rows; the new kept rows; counters."""
        table, combined, m, counters = self._advance(table, kept)
        n, total = self.rows, combined.num_rows
        t = combined[_T].to_numpy()
        # instants: the last new row of every run of equal times; with the last kept row (the instant
        # before this batch) first, for the change streams
        p = np.arange(m, total)
        inst = p[(p == total - 1) | (t[np.minimum(p + 1, total - 1)] != t[p])]
        at = np.concatenate([[m - 1], inst]) if m else inst
        lo = np.maximum(at - n + 1, 0)
        flag = combined[_FLAG].to_numpy(zero_copy_only=False).astype(bool)
        columns, same = [], np.ones(len(at), dtype=bool)
        agg_fields = list(self.out_schema)[len(self.parts):len(self.parts) + len(self.specs)]
        for (_, col, fn), field in zip(self.specs, agg_fields):
            values, valid = self._column(combined, col, flag)
            cnt = _window_sum(valid.astype(np.int64), at, lo)
            if fn == "count":
                v, null = cnt, np.zeros(len(at), dtype=bool)
            elif fn in ("sum", "avg"):
                integral = np.issubdtype(values.dtype, np.integer)
                x = np.where(valid, values, 0).astype(np.int64 if integral else np.float64)
                v = _window_sum(x, at, lo)
                v, null = (v / np.maximum(cnt, 1) if fn == "avg" else v), cnt == 0
            else:
                s = pd.Series(np.where(valid, values.astype(np.float64), np.nan))
                roll = s.rolling(n, min_periods=1)
                v = (roll.min() if fn == "min" else roll.max()).to_numpy()[at]
                null = np.isnan(v)
            prev_v, prev_null = np.roll(v, 1), np.roll(null, 1)
            same &= (null == prev_null) & ((v == prev_v) | null)
            columns.append(pa.array(v, mask=null).cast(field.type, safe=False))
        keep = np.arange(len(at)) >= (1 if m else 0)   # the instant before the batch is not emitted itself
        if self.emit == "istream":
            keep &= ~same | (np.arange(len(at)) == 0)
        elif self.emit == "dstream":
            # the previous values, when they change; the first instant of a partition has none
            keep &= ~same & (np.arange(len(at)) > 0)
            columns = [c.take(pa.array(np.maximum(np.arange(len(at)) - 1, 0))) for c in columns]
        idx = np.nonzero(keep)[0]
        parts = [pa.array([combined[c][total - 1].as_py()] * len(idx) if total else [], combined.schema.field(c).type)
                 for c in self.parts]
        out = pa.Table.from_arrays(parts + [c.take(pa.array(idx)) for c in columns]
                                   + [combined[self.time].take(pa.array(at[idx]))], schema=self.out_schema)
        new_kept = combined.slice(max(0, total - n))
        counters.update({M.OUTPUT_ROWS: out.num_rows, M.STATE_ROWS: new_kept.num_rows,
                         M.EVICTED_ROWS: max(0, total - n) - max(0, m - n)})
        return out, new_kept, counters

    @staticmethod
    def _column(combined: pa.Table, col, flag):
        """The column's values (numpy) and which rows count: in ``where`` and not null."""
        if col is None:
            return np.ones(combined.num_rows, dtype=np.int64), flag
        arr = combined[col]
        valid = flag & arr.is_valid().to_numpy(zero_copy_only=False)
        values = arr.fill_null(0).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy()
        if values.dtype == bool:
            values = values.astype(np.int64)
        return values, valid


def _window_sum(x: np.ndarray, at: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Sums of ``x[lo[i] .. at[i]]`` (inclusive) by cumulative sums: exact for integers."""
    cs = np.concatenate([np.zeros(1, dtype=x.dtype), np.cumsum(x)])
    return cs[at + 1] - cs[lo]
