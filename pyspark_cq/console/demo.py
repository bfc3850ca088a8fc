"""The query ``pyspark-cq console`` runs when given none: a sliding aggregation over Spark's rate source
whose window and granularity are control-table parameters with QoS ranges, so the console has live
statistics to chart and an entry to edit.
"""
from __future__ import annotations

import tempfile

from .. import plan as P

__all__ = ["demo_query"]


def demo_query(runtime, name: str = "sensors", *, rows_per_second: int = 200, keys: int = 10,
               window: str = "6 seconds", slide: str = "1 second", window_range=("2 seconds", "30 seconds"),
               granularity_range=("2 seconds", "1 second"), watermark: str = "1 second"):
    """Register the demo query on ``runtime``: per-key counts and maxima over sliding windows of a rate stream.

    The rate source's ``value`` is split into ``keys`` sensors (``value % keys``) and aggregated by
    :func:`pyspark_cq.sliding_aggregate` (windows ``window`` every ``slide``, append mode, watermark
    ``watermark`` on the rate source's ``timestamp``) into a memory table named ``name``. The operator
    ``"<name>_agg"`` reads its window and granularity from the control table; the plan
    γ(Γ(ω(rate))) declares the QoS ranges ``window_range`` (min, max) and ``granularity_range``
    (coarsest, finest), within which the console and the policies may change them.

    Returns
    -------
    QueryContext
        As :meth:`CQRuntime.register`.
    """
    from pyspark.sql import functions as F

    from ..operators.aggregate import sliding_aggregate
    from ..policies import QoSRange
    from ..policies.decisions import duration_value

    op = f"{name}_agg"
    if isinstance(rows_per_second, bool) or not isinstance(rows_per_second, int) or rows_per_second < 1:
        raise ValueError(f"rows_per_second must be a positive int, got {rows_per_second!r}")
    if isinstance(keys, bool) or not isinstance(keys, int) or keys < 1:
        raise ValueError(f"keys must be a positive int, got {keys!r}")
    w_us = duration_value(window, "window", allow_negative=False, allow_zero=False)
    g_us = duration_value(slide, "slide", allow_negative=False, allow_zero=False)
    plan = P.Aggregate(P.Granularity(P.Window(P.Source("rate"), w_us, label=f"{op}.window"), g_us,
                                     label=f"{op}.granularity"), groups=keys)
    qos = {f"{op}.window": QoSRange.window(*window_range),
           f"{op}.granularity": QoSRange.granularity(*granularity_range)}
    checkpoint = tempfile.mkdtemp(prefix=f"pyspark-cq-console-{name}-")

    def build(ctx):
        rate = (ctx.spark.readStream.format("rate").option("rowsPerSecond", rows_per_second)
                .option("numPartitions", 1).load())
        readings = (rate.withColumn("sensor", (F.col("value") % keys).cast("string"))
                    .withWatermark("timestamp", watermark))
        handle = ctx.control(op, window=w_us, granularity=g_us)
        out = sliding_aggregate(readings, "timestamp", window, slide, by="sensor",
                                aggs={"*": ["count"], "value": ["max"]}, control=handle)
        return (out.writeStream.format("memory").outputMode("append")
                .option("checkpointLocation", checkpoint))

    return runtime.register(name, build, plan=plan, qos=qos, sources={"rate": "Rate"})
