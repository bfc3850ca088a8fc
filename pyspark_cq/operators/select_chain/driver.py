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
expensive operators) is applied by a shedding stage in front of the first predicate (:func:`.worker._shed`), which
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

from collections.abc import Callable, Mapping

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ... import _validate
from ...control import operator_handle
from ...control.plans import SAMPLE, check_predicate_name, sample_ratios
from ...vocabulary import metrics as M
from .._common import metrics as _metrics
from .worker import _COLUMN, _Chain

__all__ = ["select_chain", "DEFAULT_NAME", "sample_ratios", "SAMPLE"]

#: Name of the per-batch report when neither ``name`` nor ``control`` is given.
DEFAULT_NAME = "cq_select_chain"
_KIND = "select_chain"
_DATA = "__cq_col_"           # the data columns in transport, by position
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


