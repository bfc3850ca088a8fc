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


#: Set by tests/test_connect.py for the pytest run it starts: the Spark Connect URL the ``spark`` fixture joins.
CONNECT_ENV = "PYSPARK_CQ_TEST_REMOTE"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A local[2] SparkSession with few shuffle partitions and no UI, shared by all Spark tests.

    In the pytest run tests/test_connect.py starts, a Spark Connect session of the shared server instead
    (``$PYSPARK_CQ_TEST_REMOTE``), so the same tests run through Spark Connect.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyspark_cq

    if os.environ.get(CONNECT_ENV):
        session = pyspark_cq.spark(remote=os.environ[CONNECT_ENV], shuffle_partitions=2,
                                   conf={"spark.sql.streaming.metricsEnabled": "false",
                                         "spark.sql.adaptive.enabled": "false"})
        yield session
        session.stop()
        return
    session = pyspark_cq.spark(
        "local[2]", "pyspark-cq-tests", shuffle_partitions=2,
        conf={
            "spark.sql.streaming.metricsEnabled": "false",
            "spark.driver.memory": "2g",
            # Small state-store maintenance interval keeps streaming tests quick.
            "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
            "spark.sql.adaptive.enabled": "false",
            # Spark's tables and the joins' default state files (state_persistence="auto") out of the work tree.
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """One local Spark Connect server (its own JVM, ``sbin/start-connect-server.sh``) for the whole run;
    its Python workers run this interpreter. Yields the ``ConnectServer`` (``.url`` joins it)."""
    from pyspark_cq.session import start_connect_server

    server = start_connect_server(0, master="local[2]", shuffle_partitions=2,
                                  log_dir=str(tmp_path_factory.mktemp("connect_server")),
                                  conf={"spark.driver.memory": "1536m",
                                        "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
                                        "spark.sql.streaming.metricsEnabled": "false",
                                        "spark.sql.adaptive.enabled": "false",
                                        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def own_session_run(tmp_path_factory):
    """The output (``subprocess.CompletedProcess``) of tests/helpers/own_session.py's process: a classic session of
    its own, as a user's script starts one; two tests read it (one JVM start for both)."""
    from helpers import own_session

    return own_session.run(tmp_path_factory.mktemp("own_session"))


@pytest.fixture
def tmp_dir(tmp_path):
    """A per-test directory for streaming input, checkpoints and sinks."""
    return tmp_path
