"""Python workers started ahead of a query's first micro-batch (``pyspark_cq.spark(warm_workers=True)``)."""
from __future__ import annotations

import importlib

__all__ = ["WARM_JOB_GROUP", "warm_python_workers"]

#: Spark job group of :func:`warm_python_workers`' job.
WARM_JOB_GROUP = "pyspark-cq-warm-workers"


def _load_worker_modules(batches):
    """A ``mapInArrow`` function that imports what an operator's Python worker needs, then passes through.

    The worker modules are the registered operators' (:func:`pyspark_cq.vocabulary.operators.worker_modules`),
    imported by name: the session knows no operator.
    """
    import pandas  # noqa: F401

    from ..vocabulary.operators import worker_modules

    for name in worker_modules():
        importlib.import_module(name)
    yield from batches


def warm_python_workers(session, tasks: int | None = None) -> None:
    """Start Python workers with the operators' modules imported, and leave them idle for reuse.

    Spark keeps an idle Python worker for a minute and gives it to the next Python task. A query's first
    micro-batch otherwise starts one worker per task and Python stage, each importing pandas, pyarrow and
    PySpark's SQL modules (about a second of CPU each on a 2-core machine; docs/benchmark-log-2026.md, "First
    micro-batch"). The job runs two chained Python stages, the shape of a stateful operator followed by its
    unpacking, over ``tasks`` partitions (default: half the default parallelism, which ``spark()`` sets to
    twice the local cores: one per core). The job group is the calling thread's for the job only. A failure
    is ignored: warming is an optimisation.
    """
    try:
        sc = session.sparkContext
        tasks = tasks or max(1, sc.defaultParallelism // 2)
        sc.setJobGroup(WARM_JOB_GROUP, "pyspark-cq: start Python workers")
        try:
            (session.range(0, tasks, numPartitions=tasks).mapInArrow(_load_worker_modules, "id long")
             .mapInArrow(_load_worker_modules, "id long").collect())
        finally:   # later jobs of this thread are not the warm-up's
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
                sc.setLocalProperty(key, None)
    except Exception:  # the session stopped, or workers cannot start (the query will say why)
        pass
