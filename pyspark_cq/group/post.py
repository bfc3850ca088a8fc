"""Aggregates over a two-stream join in a :class:`~pyspark_cq.QueryGroup`: the join in a join class of the shared
stage, the aggregation by the group's micro-batch function over the join's pairs.

Alone, the compiler runs such a query as Spark's stream-stream join, each pair copied to the slide instants at which
it is in the joined relation, then a tumbling :func:`~pyspark_cq.sliding_aggregate` of the slide's width
(docs/cql.md, "Aggregates over joins"). A group allows one ``applyInPandasWithState`` (its shared stage) and, with
several streams, one stateful operator: so the query's join is a member of a join class (its pairs are those of its
query alone, in the same micro-batches: docs/groups.md, "Joins"), and its aggregation runs where every shard's pairs
meet, in the micro-batch function: the same copy to the instants (:func:`~pyspark_cq.lang.builder.join_instants`),
the operator's own slicer and shard step (:class:`~pyspark_cq.operators.aggregate.slicer.Slicer`,
:func:`~pyspark_cq.operators.aggregate.shard.run_shard`) at the watermark Spark gives the aggregation alone (the
join's output watermark, :func:`join_output_watermark_ms`, of the class's input watermark,
:func:`~.joins.join_watermark_ms`), its state a version per micro-batch in files under the group's directory (a
micro-batch run again reads what its first run read: nothing lost, nothing twice).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..vocabulary import metrics as M

__all__ = ["JoinAggregate", "join_output_watermark_ms", "run_post"]


@dataclass(frozen=True)
class JoinAggregate:
    """The aggregation of an aggregate over a join member's pairs (its :class:`~.doc.MemberSpec`'s ``post``).

    Attributes
    ----------
    config : AggConfig
        The tumbling aggregation of the slide's width over the instants' time
        (:data:`~pyspark_cq.lang.builder.EVAL_TIME`), one shard.
    where : str or None
        The query's predicates over the pairs (Spark SQL): those the compiler applies to one input and the residual.
    computed : tuple of (str, str)
        The aggregation's computed input columns (GROUP BY expressions, aggregate arguments) as ``(name, Spark SQL)``.
    times : tuple of str
        The pairs' two time columns.
    windows : tuple of int
        The two inputs' windows (µs).
    at : tuple of (str, int)
        ``cq_at`` as ``(aggregation output column, µs added)``.
    stage_schema : pyarrow.Schema
        The aggregation's rows and ``cq_at``: what the member's ``finish`` reads.
    """

    config: object
    where: str | None
    computed: tuple
    times: tuple
    windows: tuple
    at: tuple
    stage_schema: object


def run_post(directory: str, session, pairs: pa.Table, m, plan, batch_id: int, query: str) -> tuple[pa.Table, dict]:
    """Member ``m``'s aggregation over its pairs of micro-batch ``batch_id``: its rows in ``m.post.stage_schema``
    and the step's counters. The state: the newest version before ``batch_id``, saved as ``batch_id``
    (:class:`~pyspark_cq.operators._common.batch_versions.BatchVersions`, of the group's Spark query ``query``).
    """
    from ..operators._common.batch_versions import BatchVersions
    from ..operators._common.state_files import StateFiles
    from ..operators.aggregate.shard import run_shard
    from .joins import join_watermark_ms
    from .worker import join_class_id

    post = m.post
    config, sides = plan.catalogue["__joins__"][join_class_id(m.join.signature())]
    delays = plan.catalogue.get("__delays__", {})
    side_delays = {name: delays[fam] for name, fam in zip(sides, (m.join.left, m.join.right))}
    wm_ms = join_output_watermark_ms(join_watermark_ms(plan.clocks, batch_id, tuple(dict.fromkeys(sides)),
                                                       side_delays), post.windows)
    table, counts = _slices(session, pairs, m)
    versions = BatchVersions(StateFiles(os.path.join(directory, "post", m.key)), (0,), query, batch_id,
                             f"query {m.name!r}")
    result = run_shard(post.config, table, versions.value, wm_ms * 1000, None, counts)
    versions.save(result.state)
    out = result.output
    col, add = post.at
    us = pa.timestamp("us", tz=getattr(post.stage_schema.field(len(post.stage_schema) - 1).type, "tz", None))
    at = pc.add(out.column(col).cast(us).cast(pa.int64()), pa.scalar(add, pa.int64())).cast(us)
    rows = out.append_column(post.stage_schema.names[-1], at)
    rows = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(rows.columns, post.stage_schema)],
                                schema=post.stage_schema)
    counters = {k: result.metrics[k] for k in (M.LATE_ROWS, M.STATE_ROWS, M.STATE_BYTES, M.EVICTED_ROWS)}
    return rows, counters


def join_output_watermark_ms(watermark_ms: int, windows) -> int:
    """The watermark (ms) the aggregation after a window join sees alone: Spark propagates a watermark through
    its stateful operators, and a stream-stream join's output watermark is the smaller of its two state
    watermarks, each solved from the join's time-band condition (``StreamingSymmetricHashJoinExec.
    produceOutputWatermark``, ``StreamingJoinHelper.getStateValueWatermark``): for ``t_r > t_l - w_r`` and
    ``t_r < t_l + w_l`` the left state's is ``watermark - w_l`` and the right's ``watermark - w_r``, each
    ``(watermark · 1000 − w) / 1000`` truncated to ms (``windows`` in µs).
    """
    return min(int((watermark_ms * 1000 - w) / 1000) for w in windows)


def _slices(session, pairs: pa.Table, m) -> tuple[pa.Table, tuple[int, int]]:
    """The aggregation's slices of ``pairs`` (one small Spark job: the predicates, the instants, the computed
    columns and the slicer's projection, as the compiler's), and its malformed and shed counts.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from ..lang.builder import EVAL_TIME, join_instants
    from ..operators.aggregate.driver import projection_exprs
    from ..operators.aggregate.slicer import Slicer
    from ..operators.aggregate.transport import unpack_slices

    post = m.post
    config = post.config
    rows = None
    if pairs.num_rows:
        sdf = session.createDataFrame(pairs, schema=from_arrow_schema(m.stage_schema))
        if post.where is not None:
            sdf = sdf.filter(F.expr(post.where))
        sdf = join_instants(sdf, post.times, post.windows, config.slide)
        for name, text in post.computed:
            sdf = sdf.withColumn(name, F.expr(text))
        rows = sdf.select(*[e.alias(n) for n, e in projection_exprs(EVAL_TIME, config.keys, config.spec)]).toArrow()
    slicer = Slicer(config, False, markers=True, packed=True)
    packed = [b.to_pandas() for b in slicer(iter(rows.to_batches() if rows is not None else [])) if b.num_rows]
    return unpack_slices(config.slices_arrow_schema(), packed)

