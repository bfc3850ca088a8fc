"""Worker side of :func:`pyspark_cq.select_chain`: every Arrow batch through the shedding stage and the
predicates in the plan's order (:class:`_Chain`, ``mapInArrow``), then one report row per task.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from ... import _validate
from ...control import parse_chain_plan
from ...control.plans import sample_ratios
from ...vocabulary import metrics as M
from .._common.chunks import ChunkScheduler, schedule_from_params
from .._common.shed import SHED, row_uniform, shed_batch

__all__ = []

_COLUMN = "__cq_pred_"        # a Column predicate's value, computed by Spark before the chain


_SAMPLE_SEED = 1              # the sample is independent of the rows shedding drops (seed 0)


def _shed(batch: pa.RecordBatch, ratio: float, totals: dict) -> pa.RecordBatch:
    """The shedding stage at the start of the chain: drops the share ``ratio`` of ``batch`` (the control
    entry's ``drop_ratio``), counting the rows in (``input_rows``) and those dropped (``shed_rows``).
    """
    totals[M.INPUT_ROWS] += batch.num_rows
    batch, shed = shed_batch(batch, ratio)
    totals[SHED] += shed
    return batch


class _Chain:
    """The worker side: every Arrow batch through the predicates in the plan's order, then one report row."""

    def __init__(self, label: str, names: tuple, callables: dict, columns: tuple, control, schema: pa.Schema,
                 counters: tuple, transport: tuple | None = None, kept: bool = False):
        self.label, self.names, self.callables, self.columns = label, names, callables, columns
        self.kept = kept
        self.control, self.schema, self.counters = control, schema, counters
        # the data columns' names in the batches (default: the user's); predicates see the user's names
        self.transport = columns if transport is None else transport

    def order(self, entry) -> tuple[str, ...]:
        """The evaluation order under ``entry``: its ``plan_id``, else the order of ``predicates``."""
        plan = entry.get("plan_id") if entry is not None else None
        return self.names if plan is None else parse_chain_plan(plan, self.names, operator=self.label)

    def schedule(self, entry, order, where: str):
        """The chunk schedule the entry's ``params`` ask for (:func:`~._chunks.schedule_from_params`)."""
        return schedule_from_params(entry.get("params") if entry is not None else None, order, where=where)

    def __call__(self, batches):
        where = f"{self.label} (micro-batch {_validate.micro_batch_id()})"
        try:
            entry = self.control.entry() if self.control is not None else None
            order = self.order(entry)
            schedule = self.schedule(entry, order, where)
            sampler = sample_ratios(entry.get("params") if entry is not None else None, order, where=where)
        except ValueError as exc:
            text = str(exc)
            raise ValueError(text if "micro-batch" in text else f"{text} (micro-batch {_validate.micro_batch_id()})"
                             ) from None
        ratio = float(entry.get("drop_ratio", 0.0)) if entry is not None else 0.0
        totals = dict.fromkeys(self.counters, 0)
        scheduler = ChunkScheduler(self.steps(order, totals), schedule)
        for kept in scheduler.run(_shed(self._sample(batch, order, sampler, totals), ratio, totals)
                                  for batch in batches):
            yield self._data(kept, 1.0 - ratio)
        totals.update({M.CHUNK_STEPS: scheduler.steps_run, M.PEAK_BUFFERED_ROWS: scheduler.peak_buffered,
                       M.PEAK_WORKER_RSS: scheduler.peak_rss})
        yield self._metrics_row(totals)

    def steps(self, order, totals: dict) -> list:
        """One filter per predicate in ``order``, counting into ``totals`` (the chunk scheduler's steps)."""
        last = len(order) - 1

        def step(k: int, name: str):
            nanos, rows_in, passed = M.nanos(name), M.rows_in(name), M.rows_passed(name)

            def run(batch: pa.RecordBatch) -> pa.RecordBatch:
                n = batch.num_rows
                start = time.perf_counter_ns()
                out = batch.filter(self._evaluate(name, batch))   # nulls are dropped: a null rejects the row
                totals[nanos] += time.perf_counter_ns() - start
                totals[rows_in] += n
                totals[passed] += out.num_rows
                if k == last:
                    totals[M.OUTPUT_ROWS] += out.num_rows
                return out
            return run
        return [step(k, name) for k, name in enumerate(order)]

    def _sample(self, batch: pa.RecordBatch, order, ratios, totals: dict) -> pa.RecordBatch:
        """The sampler plan (RTStream §4.2) over ``batch``'s sample; counts into ``totals``, returns ``batch``."""
        if ratios is None or batch.num_rows == 0:
            return batch
        u = row_uniform(batch, _SAMPLE_SEED)
        pick = u < ratios[0]
        sample, u = batch.filter(pa.array(pick)), u[pick]
        for name, r in zip(order, ratios):
            inside = u < r
            if not inside.all():
                sample, u = sample.filter(pa.array(inside)), u[inside]
            if sample.num_rows == 0:
                break
            start = time.perf_counter_ns()
            mask = self._evaluate(name, sample)
            totals[M.nanos(name, sample=True)] += time.perf_counter_ns() - start
            totals[M.rows_in(name, sample=True)] += sample.num_rows
            passed = mask.fill_null(False).to_numpy(zero_copy_only=False)
            sample, u = sample.filter(pa.array(passed)), u[passed]
            totals[M.rows_passed(name, sample=True)] += sample.num_rows
        return batch

    def run(self, batch: pa.RecordBatch, order, totals: dict) -> pa.RecordBatch:
        """The rows of ``batch`` that pass every predicate, evaluated in ``order``; counts into ``totals``."""
        whole = schedule_from_params(None, order, where=self.label)
        out = list(ChunkScheduler(self.steps(order, totals), whole).run(iter([batch])))
        return out[0] if out else batch.slice(0, 0)

    def _evaluate(self, name: str, batch: pa.RecordBatch) -> pa.Array:
        fn = self.callables.get(name)
        if fn is None:   # a Column predicate: Spark computed it already
            return batch.column(batch.schema.get_field_index(_COLUMN + name))
        view = batch.select(list(self.transport)) if batch.num_columns != len(self.columns) else batch
        if self.transport != self.columns:
            view = view.rename_columns(list(self.columns))
        return self._mask(name, fn(view), batch.num_rows)

    def _mask(self, name: str, result, n: int) -> pa.Array:
        try:
            if isinstance(result, pa.ChunkedArray):
                result = result.combine_chunks()
            elif not isinstance(result, pa.Array):
                result = pa.array(np.asarray(result))
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise TypeError(f"{self.label}: predicate {name!r} must return a boolean array, got "
                            f"{type(result).__name__} ({exc}) (micro-batch {_validate.micro_batch_id()})") from None
        if not pa.types.is_boolean(result.type) or len(result) != n:
            raise TypeError(f"{self.label}: predicate {name!r} must return a boolean array of {n} values (one per "
                            f"row of its input batch), got {len(result)} values of type {result.type} "
                            f"(micro-batch {_validate.micro_batch_id()})")
        return result

    def _data(self, batch: pa.RecordBatch, kept: float = 1.0) -> pa.RecordBatch:
        n = batch.num_rows
        cols = [batch.column(batch.schema.get_field_index(c)) for c in self.transport]
        if self.kept:
            cols.append(pa.array(np.full(n, kept)))
        cols = [c if c.type == f.type else c.cast(f.type) for c, f in zip(cols, self.schema)]
        cols.append(pa.array(np.zeros(n, dtype=bool)))
        cols += [pa.nulls(n, pa.int64()) for _ in self.counters]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def _metrics_row(self, totals: dict) -> pa.RecordBatch:
        cols = [pa.nulls(1, self.schema.field(i).type) for i in range(len(self.columns) + self.kept)]
        cols.append(pa.array([True]))
        cols += [pa.array([int(totals[c])], pa.int64()) for c in self.counters]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
