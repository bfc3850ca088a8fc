"""Shared fixtures: one SparkSession for the whole run (it takes ~15 s to start)."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

# Spark returns timestamps as naive local datetimes: pin the local zone so expected values are stable.
os.environ["TZ"] = "UTC"
time.tzset()

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "pyspark_cq_numba_tests"))


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession with few shuffle partitions and no UI, shared by all Spark tests."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyspark_cq

    session = pyspark_cq.spark(
        "local[2]", "pyspark-cq-tests", shuffle_partitions=2,
        conf={
            "spark.sql.streaming.metricsEnabled": "false",
            "spark.driver.memory": "2g",
            # Small state-store maintenance interval keeps streaming tests quick.
            "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def tmp_dir(tmp_path):
    """A per-test directory for streaming input, checkpoints and sinks."""
    return tmp_path
