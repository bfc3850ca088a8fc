"""The query group's stateful step without Spark: one table per query against one slice table per slice class.

Issue 40's 16 queries (windows 1 min / 10 s, 5 min / 10 s, 15 min / 1 min, 1 h / 1 min × 4 filters, ``SUM(x),
COUNT(*) GROUP BY page``) form 8 slice classes of 2 at one granularity each, or 4 of 4 across granularities
(``pyspark_cq.group.worker.slice_classes``). This script
slices a click stream (``--rows`` rows in ``--batches`` micro-batches of 10 minutes of event time, ``--pages``
pages, ``--shards`` shards) once per class, then runs each shard's step batch by batch as the group's
``applyInPandasWithState`` function does (state serialized in between):

- ``per_query`` — :func:`~pyspark_cq.operators.aggregate.shard.run_shard` once per query on its own table;
- ``per_class`` — :func:`~pyspark_cq.operators.aggregate.shard.run_shared` once per class;
- ``merged`` — one class per filter across both granularities, at their gcd (10 s; slice classes across
  granularities, ``pyspark_cq.cost.groups.granularity_classes``): one slicer pass and one table per filter, the
  1-minute queries sweeping 10-second slices.

The slicers' CPU seconds are printed apart (``slice``): ``per_query`` and ``per_class`` slice each filter's rows
twice (10 s and 1 min), ``merged`` once.

Both settings run alternately in one process, ``--repeat`` times; it prints the median CPU seconds
(``time.process_time``, robust to other processes' load) of the stateful step over all batches and their
ratio, and checks that both give every query the same rows. No Spark: a pure measure of the Python and kernel
work per micro-batch that sharing a table saves.

Usage::

    python -m benchmarks.perf.group_shard [--rows 400000] [--batches 8] [--pages 1000] [--shards 8] [--repeat 3]
"""
from __future__ import annotations

import math
import pickle
import statistics
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from pyspark_cq.operators._common.shards import shard_keys
from pyspark_cq.operators.aggregate import spec as S
from pyspark_cq.operators.aggregate.config import HASH, SHARD, TIME, AggConfig, key_name, value_name
from pyspark_cq.operators.aggregate.shard import run_shard, run_shared
from pyspark_cq.operators.aggregate.slicer import Slicer
from pyspark_cq.operators.aggregate.transport import unpack_slices

from .. import harness

SECOND = 1_000_000
#: (window, slide) in seconds: issue 40's four windows
WINDOWS = ((60, 10), (300, 10), (900, 60), (3600, 60))
FILTERS = 4   # none / eu / us / ap: each a subset of the rows


class _Schema:
    """Stands in for a DataFrame where only ``.schema`` is read (spec parsing)."""

    def __init__(self, schema):
        self.schema = schema


def configs(shards: int) -> list[AggConfig]:
    """Per (window, slide): the streaming configuration of ``SUM(x), COUNT(*) GROUP BY page``."""
    schema = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("page", T.LongType()),
                           T.StructField("x", T.LongType())])
    df = _Schema(schema)
    spec = S.parse_aggs(df, {"x": ["sum"], "*": ["count"]}, ["page"])
    keys = S.key_columns(df, ["page"])
    out = []
    for w, s in WINDOWS:
        names = ("window_start", "window_end", "page") + tuple(o.name for o in spec.outputs)
        out.append(AggConfig(spec, keys, T.TimestampType(), w * SECOND, s * SECOND, math.gcd(w, s) * SECOND,
                             "windows", "append", True, shards, names))
    return out


def sliced_batches(config: AggConfig, rows: int, batches: int, pages: int, seed: int) -> tuple[list[dict], float]:
    """Per micro-batch: per shard the unpacked slices and counts, at ``config``'s granularity; and the CPU seconds
    of the slicing and unpacking."""
    rng = np.random.default_rng(seed)
    per = rows // batches
    out = []
    spent = 0.0
    for b in range(batches):
        t = b * 600 * SECOND + np.sort(rng.integers(0, 600 * SECOND, per))
        page = rng.integers(0, pages, per)
        batch = pa.RecordBatch.from_pydict({
            TIME: pa.array(t, type=pa.timestamp("us", tz="UTC")), HASH: pa.array(page * 7919 + 3, type=pa.int64()),
            key_name(0): pa.array(page, type=pa.int64()), value_name(0): pa.array(rng.integers(0, 1000, per))})
        t0 = time.process_time()
        table = pa.Table.from_batches(list(Slicer(config, tag=False, packed=True)([batch])))
        shard_col = np.asarray(table.column(SHARD).to_numpy())
        shards = {}
        for s in shard_keys(config.shards):
            part = table.take(pa.array(np.flatnonzero(shard_col == s)))
            shards[s] = unpack_slices(config.slices_arrow_schema(), [part.to_pandas()])
        spent += time.process_time() - t0
        out.append(shards)
    return out, spent


def run(setting: str, classes: list[list[AggConfig]], inputs: list[list[dict]]) -> tuple[float, dict]:
    """CPU seconds of every shard's step over all batches (state pickled between batches) and the rows of each
    (batch, shard, filter, query)."""
    saved: dict = {}
    rows = {}
    spent = 0.0
    for b in range(len(inputs[0])):
        for s in inputs[0][b]:
            for c, members in enumerate(classes):
                for f in range(FILTERS):   # each filter's queries read their own rows: same sizes here
                    slices, counts = inputs[c][b][s]
                    wm = max(0, (b + 1) * 600 * SECOND - 60 * SECOND)
                    key = (s, c, f)
                    t0 = time.process_time()
                    if setting == "per_query":
                        state = pickle.loads(saved[key]) if key in saved else {}
                        results = [run_shard(m, slices, state.get(i), wm, None, counts) for i, m in enumerate(members)]
                        saved[key] = pickle.dumps({i: r.state for i, r in enumerate(results)})
                    else:
                        state = pickle.loads(saved[key]) if key in saved else None
                        results, table = run_shared(members, slices, state, wm, counts)
                        saved[key] = pickle.dumps(table)
                    spent += time.process_time() - t0
                    for m, r in zip(members, results):
                        rows[(b, s, f, m.window, m.slide)] = r.output.num_rows
    return spent, rows


def main(argv=None) -> None:
    p = harness.parser(__doc__)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    before = harness.start(args)
    cfg = configs(args.shards)
    classes = [cfg[:2], cfg[2:]]   # one class per granularity (10 s, 1 min)
    sliced = [sliced_batches(members[0], args.rows // FILTERS, args.batches, args.pages, seed=7)
              for members in classes]
    inputs = [x for x, _ in sliced]
    slicing = {"per_query": sum(t for _, t in sliced), "per_class": sum(t for _, t in sliced),
               "merged": sliced[0][1]}    # the merged class slices at 10 s, the first class's granularity
    times: dict[str, list[float]] = {"per_query": [], "per_class": [], "merged": []}
    outputs = {}
    for _ in range(args.repeat):
        for setting in times:
            if setting == "merged":
                spent, rows = run("per_class", [cfg], inputs[:1])
            else:
                spent, rows = run(setting, classes, inputs)
            times[setting].append(spent)
            outputs[setting] = rows
    if not outputs["per_query"] == outputs["per_class"] == outputs["merged"]:
        raise SystemExit("the settings gave different row counts: a bug")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:10s} {v:7.2f} CPU s  (runs: {', '.join(f'{x:.2f}' for x in times[k])}); slice "
              f"{slicing[k] * FILTERS:.2f} CPU s")
    print(f"per_query / per_class: {med['per_query'] / med['per_class']:.2f}x; per_class / merged (step + slice): "
          f"{(med['per_class'] + FILTERS * slicing['per_class']) / (med['merged'] + FILTERS * slicing['merged']):.2f}x")
    harness.write_result("group_shard", {"cpu_s": times, "median_cpu_s": med, "slice_cpu_s": {
        k: v * FILTERS for k, v in slicing.items()}, "ratio": med["per_query"] / med["per_class"]}, args, before)


if __name__ == "__main__":
    main()
