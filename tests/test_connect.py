"""Spark Connect (issue 24, part 1): the main differential tests of every operator, CQL and the runtime, run
through a Spark Connect session of one shared local server (the ``connect_server`` fixture).

PySpark holds one kind of session per process (``pyspark.sql.functions`` build classic or Connect columns for the
whole process), and this run's ``spark`` fixture is classic; so the selected tests run in a pytest of their own
whose ``spark`` fixture joins the server (tests/conftest.py, ``PYSPARK_CQ_TEST_REMOTE``). They are the same test
functions as in classic mode, compared with the same oracles (Spark's own operators, here through Connect too,
and the plain-Python references); every one must pass, none may be skipped.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONNECT_ENV

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TESTS = Path(__file__).parent

#: operator -> the tests that run through Spark Connect (their classic versions live in the same files).
THROUGH_CONNECT = {
    "interval_join": ["test_join_stream.py::test_stream_equals_spark_join[inner-nulls]",
                      "test_join_stream.py::test_stream_equals_spark_join[full-no_nulls]",
                      "test_join_stream.py::test_stream_window_join_equals_spark"],
    "sliding_aggregate": ["test_aggregate_streaming.py::test_stream_equals_spark_window[3 seconds-1 second]",
                          "test_aggregate_streaming.py::test_update_mode_last_values_equal_spark"],
    "window": ["test_window_op.py::test_time_based_window_matches_reference",
               "test_window_op.py::test_streaming_time_based_window_keeps_watermark_and_counts_nulls"],
    "granularity": ["test_granularity.py::test_operator_batch_timestamps",
                    "test_granularity.py::test_operator_streaming_counts_dropped_and_malformed"],
    "multi_join": ["test_multi_join.py::test_batch_equals_spark_chain[3]",
                   "test_multi_join.py::test_stream_equals_spark_chain[3]"],
    "select_chain": ["test_select_chain.py::test_batch_equals_spark_filter_with_column_and_callable_predicates",
                     "test_select_chain.py::test_stream_switches_plans_between_batches_and_reports_each_step"],
    "cql": ["test_cql_compile.py::test_paper_q1_count_rstream_and_istream_equal_spark_windows",
            "test_cql_compile.py::test_streaming_aggregate_and_join_equal_spark_streaming"],
    "runtime": ["test_runtime.py::test_runtime_change_reaches_running_query_within_two_batches",
                "test_runtime.py::test_runtime_policy_loop_drives_query_and_survives_broken_policy"],
}


def _run_through_connect(server, node_ids, tmp_path):
    env = dict(os.environ, **{CONNECT_ENV: server.url})
    env.pop("SPARK_REMOTE", None)
    # cwd tests/: `python -m` puts the working directory on sys.path; the source tree's root there would
    # shadow the installed package and its compiled modules.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           f"--basetemp={tmp_path / 'inner'}", *node_ids], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=1500)
    passed = set(re.findall(r"^PASSED (\S+(?:\[[^\]]*\])?)", proc.stdout, re.M))
    return proc, passed


def test_operators_cql_and_runtime_through_spark_connect(connect_server, tmp_path):
    node_ids = [n for ids in THROUGH_CONNECT.values() for n in ids]
    proc, passed = _run_through_connect(connect_server, node_ids, tmp_path)
    missing = [n for n in node_ids if f"tests/{n}" not in passed and n not in passed]
    assert proc.returncode == 0 and not missing, (
        f"not passed through Spark Connect: {missing}\n{proc.stdout[-12000:]}\n{proc.stderr[-3000:]}\n"
        f"server log:\n{connect_server.log_tail()}")
