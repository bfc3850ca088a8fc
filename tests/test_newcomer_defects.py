"""Defects of issue 17 ("What a Spark user trips over"): items 3, 4, 5, 7, 9 and 10 (the demo report), read_metrics on Spark Connect and
the joins' late_rows (docs)."""
from __future__ import annotations

import datetime as dt
import os
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import pyspark_cq as cq
from pyspark_cq.policies import QoSRange

S = 1_000_000


# --- 9: parse_duration's name, one message for a plain number --------------------------------------


def test_parse_duration_name_defaults():
    assert cq.parse_duration("1 hour") == 3600 * S
    with pytest.raises(ValueError, match="^duration "):  # Spark's interval syntax has no "1h"
        cq.parse_duration("1h")
    with pytest.raises(TypeError, match=r"^duration must be a duration such as '10 seconds'"):
        cq.parse_duration(10)


@pytest.mark.spark
def test_plain_int_duration_is_one_message(spark):
    left = spark.createDataFrame([(1, dt.datetime(2024, 1, 1))], "k long, ts timestamp")
    right = spark.createDataFrame([(1, dt.datetime(2024, 1, 1))], "k long, ts timestamp")
    messages = {}
    with pytest.raises(TypeError) as join_err:
        cq.interval_join(left, right, "k", "ts", "ts", 10, "10 seconds", suffixes=("_l", "_r"))
    messages["lower"] = str(join_err.value)
    with pytest.raises(TypeError) as agg_err:
        cq.sliding_aggregate(left, "ts", 10)
    messages["window"] = str(agg_err.value)
    for name, msg in messages.items():
        assert msg.startswith(f"{name} must be a duration such as '10 seconds'"), msg
        assert msg.endswith("got int 10"), msg
    # the same wording, only the argument's name differs
    assert messages["lower"].replace("lower", "X", 1) == messages["window"].replace("window", "X", 1)


# --- 5: QoSRange.window default step -----------------------------------------------------------------


def test_qos_window_default_step():
    assert QoSRange.window("10 seconds", "60 seconds").step == S
    assert QoSRange.window("10 milliseconds", "60 seconds").step == 1_000
    assert QoSRange.window(500, 60 * S).step == 1
    assert QoSRange.window("10 seconds", "60 seconds", step=1).step == 1
    # the resource manager's 48.28125 s: a whole second now
    w = QoSRange.window("10 seconds", "60 seconds")
    assert w.value_at((48.28125 - 10) / 50) == 48 * S
    assert w.value_at(0) == 10 * S and w.value_at(1) == 60 * S


# --- 3: no pandas FutureWarning from the join's worker -----------------------------------------------


def _worker_inputs(spark, left_rows, right_rows, how):
    from pyspark_cq.operators.join.driver import _tagged
    from pyspark_cq.operators.join.spec import JoinSpec
    from pyspark_cq.operators.join.worker import LEFT, RIGHT, JoinConfig, JoinWorker

    schema = "k long, ts timestamp, v long, s string"
    left = spark.createDataFrame(left_rows, schema)
    right = spark.createDataFrame(right_rows, schema)
    spec = JoinSpec.build(left, right, "k", "ts", "ts", how, ("_l", "_r"), None, None, None, None)
    spec.lower, spec.upper = -10 * S, 10 * S
    worker = JoinWorker(JoinConfig.of(spec))
    return worker, _tagged(spec, LEFT, False).toPandas(), _tagged(spec, RIGHT, False).toPandas(), (LEFT, RIGHT)


def _future_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, FutureWarning)]


T0 = dt.datetime(2024, 1, 1, 12, 0)


@pytest.mark.spark
@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_join_worker_batch_no_future_warning(spark, how):
    from pyspark_cq.operators._common import metrics as _metrics

    rows_l = [(1, T0, 5, "a"), (2, T0, None, None), (3, None, None, None)]
    rows_r = [(1, T0 + dt.timedelta(seconds=3), None, None), (4, T0, 7, "x")]
    worker, lpdf, rpdf, _ = _worker_inputs(spark, rows_l, rows_r, how)
    out, caught = _future_warnings(lambda: worker.batch(lpdf, rpdf))
    assert not caught, [str(w.message) for w in caught]
    data = out[~out[_metrics.METRICS_ROW].astype(bool)]
    assert len(out) >= 2 and len(data) >= 1
    # all-NA payload on one side only, and an empty side
    for lp, rp in ((lpdf, rpdf.iloc[:0]), (lpdf.iloc[:0], rpdf.iloc[:0]), (lpdf.iloc[1:2], rpdf.iloc[:1])):
        _, caught = _future_warnings(lambda lp=lp, rp=rp: worker.batch(lp, rp))
        assert not caught, [str(w.message) for w in caught]


def test_join_worker_split_no_future_warning():
    from pyspark_cq.operators._common.payload import SIDE, split_sides

    a = pd.DataFrame({SIDE: np.array([0, 1], np.int8), "x": pd.array([1, 2], dtype="Int64"),
                      "t": pd.to_datetime(["2024-01-01", "2024-01-02"])})
    b = pd.DataFrame({SIDE: np.array([1], np.int8), "x": [None], "t": [None]})  # all-NA, other dtypes
    empty = a.iloc[:0]
    for frames in ([a, b], [b, a], [empty, a, b], [empty], []):
        parts, caught = _future_warnings(lambda frames=frames: split_sides(list(frames), 2))
        assert not caught, [str(w.message) for w in caught]
        n = sum(len(f) for f in frames)
        assert sum(0 if p is None else len(p) for p in parts) == n
    left, right = split_sides([a, b], 2)
    assert list(left["x"]) == [1] and len(right) == 2 and right["x"].isna().tolist() == [False, True]


# --- 4: leaving the runtime does not print Spark's stop-time stack traces ----------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_runtime_stop_silences_jvm_log(spark, tmp_path, monkeypatch):
    from pyspark.sql.streaming.query import StreamingQuery

    from pyspark_cq.runtime import CQRuntime

    def _jvm_root_log_level(session):
        return str(session.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())

    before = _jvm_root_log_level(spark)
    assert before == "ERROR"  # the fixture's level
    levels = []
    original = StreamingQuery.stop

    def stop(self):
        levels.append(_jvm_root_log_level(spark))
        return original(self)

    monkeypatch.setattr(StreamingQuery, "stop", stop)

    def build(ctx):
        src = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
        return (src.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds"))

    rt = CQRuntime(spark, policies=[], control_path=str(tmp_path / "ct.json"), every_batches=1)
    rt.register("files", build, sources={"rate": "Rate"})
    with rt:
        query = rt.query("files")
        deadline = time.monotonic() + 120
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert query.isActive
    assert not query.isActive
    assert levels == ["OFF"]                      # Spark's cancellation traces are not logged
    assert _jvm_root_log_level(spark) == before   # and the level is restored afterwards


# --- 1: read_metrics on Spark Connect ----------------------------------------------------------------

# The entry of StreamingQueryProgress.observedMetrics as a Spark Connect server sends it (recorded from a
# local Connect server of pyspark 4.3: the progress JSON writes a row as its values and its schema).
_CONNECT_ENTRY = {
    "values": [300, 2, 7, 164, 0, 0, None],
    "schema": {"type": "struct", "fields": [
        {"name": m, "type": "long", "nullable": False, "metadata": {}}
        for m in ("input_rows", "output_rows", "state_rows", "state_bytes", "evicted_rows", "late_rows",
                  "malformed_rows")]},
}
_CONNECT_INPUT = {"values": [305], "schema": {"type": "struct", "fields": [
    {"name": "rows", "type": "long", "nullable": False, "metadata": {}}]}}
_EXPECTED = {"input_rows": 300, "output_rows": 2, "state_rows": 7, "state_bytes": 164, "evicted_rows": 0,
             "late_rows": 5, "malformed_rows": 0}


def _progress_json(observed):
    return {"id": "8c4f8bd4-6a43-4c2a-9f36-5e0c2a3e4b11", "runId": "0d0c7c4e-7f7e-4f33-bb1e-1c6a6b8b3e29",
            "name": None, "timestamp": "2026-11-24T20:00:00.000Z", "batchId": 3, "batchDuration": 120,
            "durationMs": {}, "eventTime": {}, "stateOperators": [], "sources": [],
            "sink": {"description": "noop", "numOutputRows": 2, "metrics": {}},
            "numInputRows": 305, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0,
            "observedMetrics": observed}


def test_read_metrics_connect_shapes():
    """The shapes pyspark.sql.connect builds (StreamingQueryProgress.fromJson on the server's JSON)."""
    import json

    from pyspark.sql import Row
    from pyspark.sql import types as T
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    observed = {"agg": _CONNECT_ENTRY, "agg__input": _CONNECT_INPUT}
    raw = json.loads(json.dumps(_progress_json(observed)))
    progress = StreamingQueryProgress.fromJson(raw)          # what Connect's lastProgress returns
    assert progress.observedMetrics["agg"].values == _CONNECT_ENTRY["values"]  # Row(values=, schema=)
    assert cq.read_metrics(progress, "agg") == _EXPECTED
    assert cq.read_metrics(raw, "agg") == _EXPECTED          # the JSON dict itself

    class _Query:                                            # a StreamingQuery: its last progress
        lastProgress = progress

    assert cq.read_metrics(_Query(), "agg") == _EXPECTED
    # schema as a StructType or a JSON string; classic rows keep working
    schema = T.StructType.fromJson(_CONNECT_ENTRY["schema"])
    for s in (schema, json.dumps(_CONNECT_ENTRY["schema"])):
        shaped = {"agg": Row(values=_CONNECT_ENTRY["values"], schema=s), "agg__input": Row(rows=305)}
        assert cq.read_metrics({"observedMetrics": shaped}, "agg") == _EXPECTED
    classic = {"agg": Row(**{k: (v if k != "late_rows" else 0) for k, v in _EXPECTED.items()}),
               "agg__input": Row(rows=305)}
    assert cq.read_metrics({"observedMetrics": classic}, "agg") == _EXPECTED


_CONNECT_SCRIPT = r"""
import json, os, sys, time
from pyspark.sql import SparkSession
import pyspark_cq as cq
spark = SparkSession.builder.remote(sys.argv[1]).config("spark.sql.shuffle.partitions", "2").getOrCreate()
assert "connect" in type(spark).__module__, type(spark)
src = spark.readStream.format("rate").option("rowsPerSecond", 50).load().withWatermark("timestamp", "1 second")
out = cq.sliding_aggregate(src, "timestamp", "2 seconds", "1 second", aggs={"value": ["count"]}, name="agg")
q = out.writeStream.format("noop").outputMode("append").trigger(processingTime="1 second").start()
metrics, deadline = None, time.monotonic() + 120
while time.monotonic() < deadline and not (metrics and metrics["input_rows"] > 0):
    time.sleep(0.5)
    metrics = cq.read_metrics(q, "agg")
q.stop()
print("METRICS " + json.dumps(metrics))
"""


@pytest.mark.spark
@pytest.mark.slow
def test_read_metrics_real_connect_server(connect_server, tmp_path):
    """End to end on a real Spark Connect server: the run's shared local server (its own JVM; tests/conftest.py),
    joined from a process of its own (the test session is classic)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (grpcio)")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    proc = subprocess.run([sys.executable, "-c", _CONNECT_SCRIPT, connect_server.url], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("METRICS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    metrics = json.loads(lines[-1][len("METRICS "):])
    assert set(metrics) == set(_EXPECTED) | {"shed_rows"} and metrics["input_rows"] > 0


# --- 2: the joins' raw late_rows is 0: the docs send users to cq.read_metrics -------------------------


def test_docs_say_late_rows_only_through_read_metrics():
    import pathlib
    import re

    from pyspark_cq.operators import join, multi_join

    root = pathlib.Path(__file__).resolve().parents[1]
    texts = {p.name: p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]}
    texts["interval_join"] = join.interval_join.__doc__
    texts["multi_join"] = multi_join.multi_join.__doc__
    for where in ("join.md", "multi_join.md", "index.md", "interval_join", "multi_join"):
        text = " ".join(texts[where].split())
        assert re.search(r"late_rows.{0,60}(is|are) only complete", text) and "cq.read_metrics" in text, where
    # every page that shows the raw observedMetrics entry says to prefer cq.read_metrics
    for where, text in texts.items():
        if "observedMetrics[" in text:
            assert "only complete" in " ".join(text.split()) and "cq.read_metrics" in text, where


# --- 9 (rest): Columns where names are expected; plain ints for granularity / window size --------------


@pytest.mark.spark
def test_column_objects_name_the_argument(spark):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(1, dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2), 1.0)],
                               "user long, ts timestamp, te timestamp, v double")
    cases = {
        "on": lambda: cq.interval_join(df, df, F.col("user"), "ts", "ts", "-1 second", "1 second",
                                       suffixes=("_l", "_r")),
        "on ": lambda: cq.interval_join(df, df, ["user", F.col("user")], "ts", "ts", "-1 second", "1 second",
                                        suffixes=("_l", "_r")),
        "left_time": lambda: cq.window_join(df, df, "user", F.col("ts"), "ts", "1 second", "1 second",
                                            suffixes=("_l", "_r")),
        "by": lambda: cq.sliding_aggregate(df, "ts", "2 seconds", by=F.col("user")),
        "time": lambda: cq.sliding_aggregate(df, F.col("ts"), "2 seconds"),
        "start": lambda: cq.granularity(df, F.col("ts"), "te", "1 second"),
        "on  ": lambda: cq.multi_join([df, df], F.col("user"), ["ts", "ts"], [(0, 1, "-1 second", "1 second")]),
    }
    for arg, call in cases.items():
        arg = arg.strip()
        with pytest.raises(TypeError) as err:
            call()
        msg = str(err.value)
        assert type(err.value) is TypeError, (arg, type(err.value))    # not PySpark's [NOT_ITERABLE]
        assert msg.startswith(f"{arg} must be a column name"), msg
        assert "pass column names as strings" in msg, msg
    with pytest.raises(TypeError, match=r"pass column names as strings \(e\.g\. on='user'\)"):
        cases["on"]()


@pytest.mark.spark
def test_plain_int_granularity_and_size_one_message(spark):
    df = spark.createDataFrame([(dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2))], "ts timestamp, te timestamp")
    with pytest.raises(TypeError) as agg:
        cq.sliding_aggregate(df, "ts", "10 seconds", granularity=10)
    with pytest.raises(TypeError) as gran:
        cq.granularity(df, "ts", "te", 10)
    with pytest.raises(TypeError) as size:
        cq.window(df, "ts", size=10)
    expected = str(pytest.raises(TypeError, cq.parse_duration, 10, "granularity").value)
    assert str(agg.value) == str(gran.value) == expected
    assert str(size.value) == expected.replace("granularity", "size", 1)
    # integer (tick) columns still take plain ints
    ticks = spark.createDataFrame([(3, 25)], "s long, e long")
    assert [tuple(r) for r in cq.granularity(ticks, "s", "e", 10).collect()] == [(10, 20)]
    assert [tuple(r) for r in cq.window(ticks, "s", size=5).collect()] == [(3, 25, 3, 8)]


def test_docs_state_the_output_modes():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "docs"
    for page, mode in (("join.md", 'outputMode("append")'), ("multi_join.md", 'outputMode("append")'),
                       ("aggregate.md", 'outputMode("update")'), ("errors.md", "## Output modes")):
        text = (root / page).read_text()
        assert mode in text and "not supported with Update output mode" in text, page


# --- 7: a session of one's own with Spark's 200 shuffle partitions -----------------------------------


def _user_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, UserWarning) and "shuffle.partitions" in str(w.message)]


@pytest.mark.spark
def test_many_shuffle_partitions_warn_once(spark, monkeypatch):
    from pyspark_cq.operators._common import partitions

    monkeypatch.setattr(partitions, "_warned_sessions", set())
    cores = spark.sparkContext.defaultParallelism
    src = spark.readStream.format("rate").option("rowsPerSecond", 1).load().withWatermark("timestamp", "1 second")
    define_agg = lambda: cq.sliding_aggregate(src, "timestamp", "2 seconds", aggs={"value": ["count"]})  # noqa: E731
    define_join = lambda: cq.interval_join(src, src, "value", "timestamp", "timestamp", "-1 second",  # noqa: E731
                                           "1 second", suffixes=("_l", "_r"))
    assert not _user_warnings(define_agg)                  # the fixture's 2 partitions: no advice
    old = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        caught = _user_warnings(define_agg)
        assert len(caught) == 1, [str(w.message) for w in caught]
        msg = str(caught[0].message)
        assert "spark.sql.shuffle.partitions is 200" in msg and f"{cores} cores" in msg
        assert f"spark.conf.set('spark.sql.shuffle.partitions', {2 * cores})" in msg
        # the stateless stages, which do not depend on the setting (issue 39)
        assert "state='files'" in msg and "state_persistence='stateless'" in msg
        assert caught[0].filename == __file__                # points at the user's call
        assert not _user_warnings(define_join)               # once per session
        assert not _user_warnings(define_agg)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", old)


def test_shuffle_partition_check_unreadable_conf():
    """Spark Connect has no sparkContext; an unreadable setting gives no advice and no error."""
    from pyspark_cq.operators._common.partitions import warn_shuffle_partitions

    class _Conf:
        def get(self, key, default=None):
            return "200" if key == "spark.sql.shuffle.partitions" else default

    class _ConnectLike:
        conf = _Conf()

        @property
        def sparkContext(self):
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported in Spark Connect")

    class _Broken:
        @property
        def conf(self):
            raise RuntimeError("no conf")

    for session in (_ConnectLike(), _Broken()):
        df = type("DF", (), {"sparkSession": session, "isStreaming": True})()
        assert not _user_warnings(lambda df=df: warn_shuffle_partitions(df))


def test_installation_lists_the_session_settings():
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "installation.md").read_text()
    section = text[text.index("## A session of your own"):]
    section = section[:section.index("\n## ", 1)]
    # every setting cq.spark() makes (pyspark_cq/session/settings.py) that changes what our operators do or cost
    for key in ("spark.sql.shuffle.partitions", "spark.default.parallelism", "spark.sql.session.timeZone",
                "spark.sql.execution.arrow.pyspark.enabled", "spark.sql.execution.arrow.maxBytesPerBatch",
                "spark.python.daemon.module", "spark.python.unix.domain.socket.enabled",
                "spark.executorEnv.NUMBA_CACHE_DIR",
                "spark.sql.streaming.forceDeleteTempCheckpointLocation", "PYSPARK_PYTHON",
                "PYSPARK_DRIVER_PYTHON", "PYTHONSAFEPATH", "NUMBA_CACHE_DIR", "SPARK_LOCAL_IP"):
        assert re.search(r"\b" + re.escape(key) + r"\b", section), key


# --- 10: the demo report reads as text, not as raw floats and JSON -----------------------------------


def test_demo_report_summary_is_formatted(tmp_path):
    pytest.importorskip("matplotlib")
    from pyspark_cq.demo.report import write_report

    samples = [{"t": float(t), "offered": 200.0, "upper_s": 30.0, "window_s": 60.0, "granularity_s": 1.0,
                "join1_state_bytes": 1e5, "agg1_state_bytes": 5e4} for t in range(5)]
    summary = {"checks": [], "seconds": 120.31234, "budget_bytes": 3_000_000,
               "peak_state_bytes": {"bytes": 3412345.0, "t": 61.25},
               "measured_over_estimate": {"median": 1.0345678, "min": 0.81234}}
    write_report(tmp_path, samples=samples, batches={}, decisions=[], summary=summary, budget=3e6)
    page = (tmp_path / "report.html").read_text()
    table = page[page.index("<h2>Summary</h2>"):]
    assert "{&quot;" not in table and '{"' not in table             # no JSON dumps
    assert "3 MB" in table and "3.41 MB" in table and "t: 61.2" in table and "median: 1.03" in table
    assert "120.31234" not in table and "1.0345678" not in table   # no raw floats



# --- issue 41, item 8: a cq.spark() session prints no warning when nothing is wrong --------------------



@pytest.mark.spark
@pytest.mark.slow
def test_session_logs_only_what_matters(own_session_run):
    """No banner, no temporary-checkpoint or AQE warnings, no maintenance error at stop; a real warning
    (the rate source cannot run availableNow) still shows. The session is a process of its own with a streaming
    query (tests/helpers/own_session.py: shared with test_package.py's idle-workers test, one JVM start)."""
    proc = own_session_run
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    for noise in ("Using Spark's default log4j profile", "Setting default log level",
                  "Temporary checkpoint location created", "spark.sql.adaptive.enabled is not supported",
                  "Disabling AQE", "Error running maintenance", "native-hadoop"):
        assert noise not in proc.stderr, (noise, proc.stderr[-3000:])
    assert "does not support Trigger.AvailableNow" in proc.stderr   # the filter keeps real warnings


def test_quiet_logs_keeps_a_users_log_configuration():
    from pyspark_cq.session.settings import LOG_CONFIG, _quiet_logs

    assert LOG_CONFIG.is_file()
    got = _quiet_logs({"spark.driver.extraJavaOptions": "-Xss4m"})["spark.driver.extraJavaOptions"]
    assert got == f"-Xss4m -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    mine = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/etc/mine.properties"}
    assert _quiet_logs(mine) == mine
