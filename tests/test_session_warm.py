"""``cq.spark(warm_workers=True)``: a new local session starts its Python workers in the background."""
from __future__ import annotations

import pytest

import pyspark_cq
from pyspark_cq import session as S


def test_warm_workers_must_be_a_bool():
    with pytest.raises(TypeError, match="warm_workers must be True or False"):
        pyspark_cq.spark("local[1]", warm_workers=1)


@pytest.mark.spark
def test_warm_python_workers_runs_its_job_and_leaves_the_session_usable(spark):
    if not hasattr(spark, "sparkContext") or type(spark).__module__.startswith("pyspark.sql.connect"):
        pytest.skip("a classic session: warming is local-mode only")
    S.warm_python_workers(spark, tasks=2)
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(S.WARM_JOB_GROUP)
    assert jobs, "the warm-up job did not run"
    assert all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in jobs)
    # the job group was the warm-up job's only: this thread's later jobs are not in it
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None
    assert spark.range(3).count() == 3
    assert set(tracker.getJobIdsForGroup(S.WARM_JOB_GROUP)) == set(jobs)


def test_warm_python_workers_ignores_a_stopped_session():
    class Stopped:
        @property
        def sparkContext(self):
            raise RuntimeError("stopped")
    S.warm_python_workers(Stopped())   # no exception: warming is an optimisation
