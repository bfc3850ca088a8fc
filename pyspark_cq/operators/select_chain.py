"""Selection predicates evaluated in an order chosen while the query runs (a plan-switchable operator).

OM (Kulkarni & Ravishankar, §4.4: the sel-λ chart's plans are orders of selections) and rate-based
optimization (Viglas & Naughton, §4.2: local rate maximization over the orders of a chain of selections)
choose an evaluation order from measured selectivities and costs. The result of a conjunction does not
depend on the order; its cost does: each predicate sees only the rows the ones before it passed, so an
expensive predicate placed after a selective cheap one runs on few rows.

Spark fixes a query's plan when it starts. Here the order is the operator's ``plan_id`` in the control
table (:mod:`pyspark_cq.control.plans`: ``"cheap>model"``), read by every task at every micro-batch, and the
operator reports per predicate and batch the rows in, the rows passed and the time spent — the
selectivity and cost-per-row estimates those policies need.

Its ``drop_ratio`` (load shedding, RTStream §4.4: keep ε = 1 − drop_ratio of the input, dropped before the
expensive operators) is applied by a shedding stage in front of the first predicate (:func:`_shed`), which
counts the rows it drops as ``shed_rows``. With ``kept_column`` every output row carries the fraction of its
micro-batch's input kept (ε = 1 − drop_ratio, the probability that the shedding stage kept a row).

Its ``params['sample_ratio']`` runs a **sampler plan** (RTStream §4.2): the same predicates in the same order
over a sample of the micro-batch's input before shedding (a hash of the row picks it), reporting
``sample_rows_in_p``, ``sample_rows_passed_p`` and ``sample_nanos_p``, the selectivity and cost estimates of
the fixed and dynamic sampling policies (§5.1, §5.2.3). Its cost is paid inside the micro-batch, as the
paper's sampler queries are.

Data path (one micro-batch)::

    df ─► select(columns, Column predicates as booleans)
       ─► mapInArrow(shed, chain in plan order) ─► observe ─► out
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .. import _validate
from ..control import operator_handle, parse_chain_plan
from ..control.plans import SAMPLE, check_predicate_name, sample_ratios
from ..vocabulary import metrics as M
from . import _metrics
from ._chunks import ChunkScheduler, schedule_from_params
from ._shed import SHED, row_uniform, shed_batch

__all__ = ["select_chain", "DEFAULT_NAME", "sample_ratios", "SAMPLE"]

#: Name of the per-batch report when neither ``name`` nor ``control`` is given.
DEFAULT_NAME = "cq_select_chain"
_KIND = "select_chain"
_COLUMN = "__cq_pred_"        # a Column predicate's value, computed by Spark before the chain
_DATA = "__cq_col_"           # the data columns in transport, by position
_SAMPLE_SEED = 1              # the sample is independent of the rows shedding drops (seed 0)
_KEPT = "__cq_kept"           # the kept fraction in transport
#: Per-batch maxima over the tasks (the others are sums): the chunk scheduler's memory figures.
_PEAKS = M.PEAKS


def select_chain(df, predicates, *, control=None, name=None, kept_column=None):
    """Keep the rows that pass every predicate, evaluating the predicates in a run-time order.

    Parameters
    ----------
    df : DataFrame
        Batch or streaming input.
    predicates : mapping of str to callable or Column
        Name -> predicate, in the default evaluation order. A callable is vectorised: it takes a
        ``pyarrow.RecordBatch`` of ``df``'s columns (only the rows the earlier predicates passed) and
        returns a boolean array of the same length (pyarrow, numpy or pandas); it runs in Spark's Python
        workers, so it must be picklable. A Spark boolean Column is evaluated by Spark on every row before
        the chain (it is cheap and vectorised there); its place in the order decides which rows the later
        predicates see. A null result rejects the row, as in SQL's ``WHERE``. Names are letters, digits and
        ``_`` (they name the metrics).
    control : pyspark_cq.control.ControlHandle, optional
        The operator's control-table entry. Its ``plan_id`` is the evaluation order, predicate names joined
        by ``>`` (``"cheap>model"``, see :func:`pyspark_cq.control.chain_plan_id`), read at every
        micro-batch; without one the order of ``predicates`` applies. Its ``drop_ratio`` sheds that share
        of the input before the first predicate (a hash of the row decides, so a replay drops the same rows).
        Its ``params`` may schedule the predicates over chunks of a large batch (``schedule``,
        ``chunk_rows``, ``max_buffered_rows``, ``priorities``, ``selectivities``; docs/chain.md), as the
        ``chain`` policy writes them; the rows kept never depend on it. ``params['sample_ratio']`` (a
        fraction, or a mapping predicate -> fraction) runs the sampler plan over that sample of the input
        (:func:`sample_ratios`); the rows kept never depend on it either.
    name : str, optional
        Name of the per-batch report (``cq.read_metrics(query, name)``); default the control handle's
        operator id, else ``"cq_select_chain"``.
    kept_column : str, optional
        Adds a double column of that name: the fraction of its micro-batch's input the shedding stage kept
        (1 − drop_ratio; 1.0 without shedding). Off by default (the output keeps ``df``'s columns).

    Returns
    -------
    DataFrame
        The rows of ``df`` that pass every predicate, with ``df``'s columns (and ``kept_column``). The
        per-batch report holds
        ``input_rows`` (before shedding), ``shed_rows``, ``output_rows`` and, for every predicate ``p``,
        ``rows_in_p``, ``rows_passed_p`` and ``nanos_p`` (time spent in it): ``rows_passed_p / rows_in_p``
        is its observed selectivity and ``nanos_p / rows_in_p`` its cost per row; ``chunk_steps``
        (predicate invocations), and the largest over the tasks of ``peak_buffered_rows`` (rows that passed a
        predicate and wait for the next) and ``peak_worker_rss`` (the Python worker's resident memory in
        bytes, sampled after every step); with a sampler plan ``sample_rows_in_p``, ``sample_rows_passed_p``
        and ``sample_nanos_p`` (0 without one).

    Examples
    --------
    >>> import pyarrow.compute as pc
    >>> import pyspark_cq as cq
    >>> from pyspark.sql import functions as F
    >>> df = spark.createDataFrame([(1, "a"), (2, "bb"), (3, "ccc"), (4, "dd")], "x long, s string")
    >>> preds = {"even": F.col("x") % 2 == 0, "short": lambda b: pc.less(pc.utf8_length(b["s"]), 3)}
    >>> sorted(r.x for r in cq.select_chain(df, preds).collect())
    [2, 4]
    """
    _validate.dataframe(df, "df")
    names, callables, columns = _check_predicates(df, predicates)
    control = operator_handle(control, _KIND)
    if name is None:
        name = control.operator if control is not None else DEFAULT_NAME
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if kept_column is not None and (not isinstance(kept_column, str) or not kept_column
                                    or kept_column in df.columns):
        raise ValueError(f"kept_column must be a new column name (not one of {df.columns}), got {kept_column!r}")
    label = f"select_chain {name!r}"
    # The data travel under internal names: PySpark's mapInArrow refers to its input's columns by
    # unquoted name, which a name with a backtick (or a dot) would break.
    transport = tuple(_DATA + str(i) for i in range(len(df.columns)))
    data_fields = [T.StructField(t, f.dataType, True) for t, f in zip(transport, df.schema.fields)]
    counters = list(M.select_chain_names(names))
    if kept_column is not None:
        data_fields.append(T.StructField(_KEPT, T.DoubleType(), True))
    raw_schema = T.StructType(data_fields + [T.StructField(_metrics.METRICS_ROW, T.BooleanType(), False)]
                              + [T.StructField(_metrics.PREFIX + c, T.LongType(), True) for c in counters])
    worker = _Chain(label, tuple(names), callables, tuple(df.columns), control,
                    _metrics.arrow_schema(raw_schema), tuple(counters), transport, kept=kept_column is not None)
    if control is not None:   # a bad plan, schedule or sample ratio fails here, not in a task
        entry = control.entry(when="when the operator was defined")
        worker.schedule(entry, worker.order(entry), label)
        sample_ratios(entry.get("params"), worker.order(entry), where=label)
    staged = df.select(*[_validate.ref(c).alias(t) for c, t in zip(df.columns, transport)],
                       *[col.alias(_COLUMN + n) for n, col in columns.items()])
    raw = staged.mapInArrow(worker, raw_schema)
    aggregate = {c: (F.max if c in _PEAKS else F.sum)(_metrics.PREFIX + c) for c in counters}
    out = _metrics.attach(raw, name, aggregate,
                          keep=~F.col(_metrics.METRICS_ROW),
                          drop=[_metrics.METRICS_ROW] + [_metrics.PREFIX + c for c in counters])
    kept = [F.col(_KEPT).alias(kept_column)] if kept_column is not None else []
    return out.select(*[F.col(t).alias(c) for t, c in zip(transport, df.columns)], *kept)


def _shed(batch: pa.RecordBatch, ratio: float, totals: dict) -> pa.RecordBatch:
    """The shedding stage at the start of the chain: drops the share ``ratio`` of ``batch`` (the control
    entry's ``drop_ratio``), counting the rows in (``input_rows``) and those dropped (``shed_rows``).
    """
    totals[M.INPUT_ROWS] += batch.num_rows
    batch, shed = shed_batch(batch, ratio)
    totals[SHED] += shed
    return batch


def _check_predicates(df, predicates) -> tuple[list[str], dict[str, Callable], dict]:
    if not isinstance(predicates, Mapping) or not predicates:
        raise TypeError(f"predicates must be a non-empty mapping of name -> callable(pyarrow.RecordBatch) or "
                        f"boolean Column, got {predicates!r}")
    names, callables, columns = [], {}, {}
    for key, pred in predicates.items():
        check_predicate_name(key, "predicates")
        if _validate.is_column(pred):
            dtype = df.select(pred.alias("p")).schema["p"].dataType
            if not isinstance(dtype, T.BooleanType):
                raise TypeError(f"predicates[{key!r}] must be a boolean Column, got a {dtype.simpleString()} one")
            columns[key] = pred
        elif callable(pred):
            callables[key] = pred
        else:
            raise TypeError(f"predicates[{key!r}] must be a callable(pyarrow.RecordBatch) -> boolean array or a "
                            f"boolean Column, got {type(pred).__name__}")
        names.append(key)
    return names, callables, columns


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
