"""The group's micro-batch function (``foreachBatch``): each query's rows to its sink, then the changes asked
for while the batch ran (queries added, removed, paused, resumed) into the plan for the next one.

It holds only the group's directory, so it runs wherever Spark runs ``foreachBatch`` (the driver, or the
Spark Connect server's Python); everything else it reads from the plan (:mod:`.doc`).
"""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pyarrow as pa

from .. import _validate
from ..vocabulary import metrics as M
from . import clock as C
from . import doc as D
from .post import run_post
from .sinks import deliver
from .worker import batch_setting, stream_clocks

__all__ = ["GroupBatch", "apply_changes", "finish", "combine_shards", "HISTORY"]

#: Micro-batches whose counters the group keeps per query (as Spark keeps a query's recent progresses).
HISTORY = 100


def combine_shards(reports: list[dict]) -> dict:
    """One query's counters of one micro-batch from its shards' reports: counts and state sizes add up (the
    shards hold disjoint state), per-batch maxima (``peak_*``) take the largest.
    """
    out: dict = {}
    for r in reports:
        for k, v in r.items():
            if not isinstance(v, int):
                continue
            out[k] = max(out.get(k, v), v) if M.is_peak(k) else out.get(k, 0) + v
    return out


class GroupBatch:
    """``foreachBatch`` function of a :class:`~pyspark_cq.QueryGroup`."""

    def __init__(self, directory: str):
        self.directory = directory
        self._query = None   # the group's Spark query id, read once (it stays with the checkpoint)

    def __call__(self, df, batch_id: int):
        """Deliver micro-batch ``batch_id`` (``df``: the group's output rows) and apply the queued changes."""
        from pyspark.sql.pandas.types import from_arrow_schema

        table = self._rows(df, batch_id)
        plan = D.read_plan(self.directory)
        payloads: dict[str, list] = {}
        counters: dict[str, list] = {}
        for key, payload, c in zip(table.column(0).to_pylist(), table.column(1).to_pylist(),
                                   table.column(2).to_pylist()):
            if payload is not None:
                payloads.setdefault(key, []).append(payload)
            counters.setdefault(key, []).append(c)
        stats = D.read_stats(self.directory)
        for key, m in plan.members.items():
            if not m.active:
                continue
            parts = [pa.ipc.open_stream(p).read_all() for p in payloads.get(key, [])]
            rows = pa.concat_tables(parts) if parts else (m.stage_schema or m.arrow_schema).empty_table()
            post = {}
            if m.post is not None:   # an aggregate over a join: its aggregation over the pairs (.post)
                rows, post = run_post(self.directory, df.sparkSession, rows, m, plan, batch_id, self._query or "")
                m = replace(m, stage_schema=m.post.stage_schema)
            if m.finish is not None:
                rows = finish(df.sparkSession, rows, m)
            deliver(m.sink, rows, batch_id, from_arrow_schema(m.arrow_schema), df.sparkSession, m.name)
            entry = stats.setdefault(m.name, {"rows": 0, "batches": 0, "history": []})
            entry["rows"] += rows.num_rows
            entry["batches"] += 1
            report = combine_shards([json.loads(c) for c in counters.get(key, [])])
            for k, v in post.items():   # the join's state and the aggregation's, both the query's
                report[k] = report.get(k, 0) + v
            report[M.OUTPUT_ROWS] = rows.num_rows   # what reached the sink (after a finish's HAVING)
            entry["history"] = [h for h in entry["history"] if h[0] != batch_id][-(HISTORY - 1):] + [[batch_id, report]]
        seen, per_stream = stream_clocks(counters)
        max_time = plan.max_time if seen is None else max(seen, plan.max_time or seen)
        # several streams: each stream's largest event time, for its watermark in the next micro-batches
        clocks = C.record(plan.clocks, batch_id, per_stream) if per_stream else plan.clocks
        changes = D.take_pending(self.directory)
        if changes or max_time != plan.max_time or clocks != plan.clocks:
            D.write_plan(self.directory, replace(apply_changes(plan, changes, max_time), clocks=clocks))
        D.write_stats(self.directory, stats)

    def _rows(self, df, batch_id: int) -> pa.Table:
        """The group's output rows of micro-batch ``batch_id``: ``df`` run, with what its tasks need set."""
        from ..operators._common.offsets import OWN_WATERMARK_PROPERTY

        session = df.sparkSession
        # Spark Connect runs this function apart from the stream's thread, and the batch's tasks then lack Spark's
        # "streaming.sql.batchId" and "sql.streaming.queryId" properties; session settings reach them as local
        # properties (Spark propagates the SQL settings to the tasks it runs): the group's workers read the id
        # under a name of this group's (worker._batch_id), a multi_join member's stateless stage under the
        # general names (_validate); all removed again once the rows are in (no later job of the session sees them)
        settings = {batch_setting(self.directory): str(batch_id), _validate.BATCH_ID_SETTING: str(batch_id),
                    # a multi_join member's stateless stage would read Spark's watermark from the offset log of the
                    # group's query: the group clock, not its query's alone; it computes that of its own streams
                    # from the rows it reads, as Spark does for the query alone
                    OWN_WATERMARK_PROPERTY: "true"}
        if self._query is None:
            self._query = _query_id(self.directory)
        if self._query is not None:
            settings[_validate.QUERY_ID_SETTING] = self._query
        for k, v in settings.items():
            session.conf.set(k, v)
        try:
            return df.toArrow()
        finally:
            for k in settings:
                session.conf.unset(k)


def _query_id(directory: str) -> str | None:
    """The group's Spark query id, from its checkpoint's metadata (``<checkpoint>/spark/metadata``, written by Spark
    when the query starts; the group's files are in ``<checkpoint>/cq_group``, :func:`~.doc.group_dir`).
    """
    path = os.path.join(os.path.dirname(os.path.abspath(directory)), "spark", "metadata")
    try:
        with open(path) as f:
            return json.loads(f.readline()).get("id")
    except (OSError, ValueError):
        return None


def finish(session, table: pa.Table, m: D.MemberSpec) -> pa.Table:
    """A member's rows from the shared stage's (``MemberSpec.finish``): its HAVING and select list, as the
    compiler's Spark SQL over them (one small Spark job; only queries that compute need it).
    """
    if not table.num_rows:
        return m.arrow_schema.empty_table()
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    having, items = m.finish
    sdf = session.createDataFrame(table, schema=from_arrow_schema(m.stage_schema))
    if having is not None:
        sdf = sdf.filter(F.expr(having))
    at = m.arrow_schema.names[-1]
    out = sdf.select(*[F.expr(text).alias(name) for text, name in items], F.col(at)).toArrow()
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(out.columns, m.arrow_schema)], schema=m.arrow_schema)


def apply_changes(plan: D.Plan, changes: list, max_time: int | None) -> D.Plan:
    """The next plan: ``changes`` (oldest first) applied to ``plan``, the clock at ``max_time``. A shared query
    added or resumed starts with its first window that begins after ``max_time``.
    """
    from .api import next_window

    members = dict(plan.members)
    for change in changes:
        op, arg = change[0], change[1]
        if op == "add":
            spec = arg
            if spec.kind == "shared":
                spec = replace(spec, start_us=next_window(spec, max_time))
            members = {k: v for k, v in members.items() if v.name != spec.name}
            members[spec.key] = spec
            continue
        found = [k for k, v in members.items() if v.name == arg]
        if not found:
            continue
        key = found[0]
        if op == "remove":
            del members[key]
        elif op == "pause":
            members[key] = replace(members[key], active=False)
        elif op == "window":       # a re-plan under a memory budget (QueryGroup.set_window), with its record
            members[key] = replace(members[key], config=replace(members[key].config, window=change[2]),
                                   replan=change[3] if len(change) > 3 else None)
        elif op == "resume" and not members[key].active:
            spec = replace(members[key], active=True)
            if spec.kind == "shared":
                spec = replace(spec, start_us=next_window(spec, max_time))
            members[key] = spec
    return plan.with_members(members, max_time=max_time)
