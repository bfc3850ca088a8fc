"""Spark Connect (issue 24, part 1): a streaming differential test of every operator, CQL, the query group and
the runtime, run through a Spark Connect session of one shared local server (the ``connect_server`` fixture).

PySpark holds one kind of session per process (``pyspark.sql.functions`` build classic or Connect columns for the
whole process), and this run's ``spark`` fixture is classic; so the selected tests run in a pytest of their own
whose ``spark`` fixture joins the server (tests/conftest.py, ``PYSPARK_CQ_TEST_REMOTE``). They are the same test
functions as in classic mode, compared with the same oracles (Spark's own operators, here through Connect too,
and the plain-Python references); every one must pass, none may be skipped.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONNECT_ENV

TESTS = Path(__file__).parent

#: operator -> the tests that run through Spark Connect (their classic versions live in the same files). One
#: streaming test per operator family (the suite's time, issue 41): the CQL test runs ``sliding_aggregate`` (RSTREAM
#: … SLIDE) and ``window_join`` (two RANGE windows) through Connect against Spark's own window aggregation and join;
#: joins in update mode are the interval join's driver and worker with another output mode. Their own streaming
#: tests run classic only (test_aggregate_streaming.py, test_join_stream.py, test_join_update_mode.py).
THROUGH_CONNECT = {
    "interval_join": ["test_join_stream.py::test_stream_equals_spark_join[full-no_nulls]"],
    "window": ["test_window_op.py::test_streaming_time_based_window_keeps_watermark_and_counts_nulls"],
    "granularity": ["test_granularity.py::test_operator_streaming_counts_dropped_and_malformed"],
    # the left outer chain with late rows runs the inner steps too (one streaming test per operator: the suite's time)
    "multi_join": ["test_multi_join_outer.py::test_stream_equals_spark_chain_with_late_rows[3]"],
    "select_chain": ["test_select_chain.py::test_stream_switches_plans_between_batches_and_reports_each_step"],
    # sliding_aggregate and window_join compiled from CQL, each against Spark's own operator
    "cql": ["test_cql_compile.py::test_streaming_aggregate_and_join_equal_spark_streaming"],
    # two streams (the group clock's watermark policy and settings go through the Connect session), an aggregate,
    # inner and outer join classes, a ROWS window, admission control and a restart from the checkpoint (one group
    # test: the suite's time). Through Connect the group's foreachBatch runs apart from the stream's thread: its
    # tasks get the micro-batch id from the group (found by this test: an outer and an inner join each lost a
    # pair to a wrong late-event watermark)
    "query_group": ["test_group_joins.py::test_join_members_equal_their_queries_alone_across_a_restart"],
    "runtime": ["test_runtime.py::test_runtime_policy_loop_drives_query_and_survives_broken_policy"],
}


def _run_through_connect(server, node_ids, tmp_path):
    env = dict(os.environ, **{CONNECT_ENV: server.url})
    env.pop("SPARK_REMOTE", None)
    # cwd tests/: `python -m` puts the working directory on sys.path; the source tree's root there would
    # shadow the installed package and its compiled modules.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           f"--basetemp={tmp_path / 'inner'}", *node_ids], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=1500)
    passed = {line[len("PASSED "):].strip() for line in proc.stdout.splitlines() if line.startswith("PASSED ")}
    return proc, passed


# --- cq.spark(remote=...) / SPARK_REMOTE (issue 17, defect 6) ------------------------------------------------

_LOCAL_SERVER_SCRIPT = r"""
import json, os, sys
import pyspark_cq as cq
spark = cq.spark()                                     # SPARK_REMOTE=local[2]: a local Connect server
import pyarrow as pa

def probe(batches):
    from pyspark_cq._native import check_build
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"python": [sys.executable], "join": [check_build()["_join"]]})

row = spark.range(1).mapInArrow(probe, "python string, join string").collect()[0]
print("SESSION " + json.dumps({"type": type(spark).__module__, "python": row.python, "join": row.join,
                               "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                               "zone": spark.conf.get("spark.sql.session.timeZone")}))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_spark_remote_env_starts_a_local_connect_server_configured_for_pyspark_cq(tmp_path):
    """Before: cq.spark() with SPARK_REMOTE set failed (CANNOT_CONFIGURE_SPARK_CONNECT_MASTER). Its own process:
    PySpark starts a local Connect server only where no classic session runs."""
    import json

    env = dict(os.environ, SPARK_REMOTE="local[2]")
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", CONNECT_ENV):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", _LOCAL_SERVER_SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("SESSION ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("SESSION "):])
    assert got["type"].startswith("pyspark.sql.connect")
    assert got["python"] == sys.executable and got["join"].endswith(".so")    # workers run this interpreter
    assert got["partitions"] == str(2 * (os.cpu_count() or 2)) and got["zone"] == "UTC"


def test_spark_remote_arguments_are_checked(monkeypatch):
    import pyspark_cq as cq

    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    with pytest.raises(ValueError, match="remote must be a Spark Connect URL"):
        cq.spark(remote="http://localhost:15002")
    with pytest.raises(ValueError, match="not both"):
        cq.spark("local[1]", remote="sc://localhost")
    monkeypatch.setenv("SPARK_REMOTE", "sc://localhost:15002")
    with pytest.raises(ValueError, match="SPARK_REMOTE='sc://localhost:15002' is set"):
        cq.spark("local[1]")
    monkeypatch.setenv("SPARK_REMOTE", "localhost:15002")
    with pytest.raises(ValueError, match="remote must be a Spark Connect URL"):
        cq.spark()


@pytest.mark.spark
@pytest.mark.slow
def test_operators_cql_and_runtime_through_spark_connect(connect_server, tmp_path):
    node_ids = [n for ids in THROUGH_CONNECT.values() for n in ids]
    proc, passed = _run_through_connect(connect_server, node_ids, tmp_path)
    missing = [n for n in node_ids if f"tests/{n}" not in passed and n not in passed]
    assert proc.returncode == 0 and not missing, (
        f"not passed through Spark Connect: {missing}\n{proc.stdout[-12000:]}\n{proc.stderr[-3000:]}\n"
        f"server log:\n{connect_server.log_tail()}")



@pytest.mark.spark
def test_a_connect_session_beside_a_classic_one_is_refused_with_the_reason(spark):
    import pyspark_cq as cq

    with pytest.raises(RuntimeError, match="one kind of session per process"):
        cq.spark(remote="sc://127.0.0.1:1")


def test_statistics_read_connect_progress_without_top_level_row_counts():
    """Spark Connect's progress JSON has no numInputRows / inputRowsPerSecond (PySpark reads None there and
    sums the sources in the properties); the runtime's statistics must still count the rows."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from pyspark_cq.runtime import StatisticsStore

    store = StatisticsStore(alpha=0.5)
    store.register("q", sources={"rate": "Rate"})
    src = {"description": "RateStreamV2[rowsPerSecond=50]", "startOffset": 0, "endOffset": 100,
           "latestOffset": 100, "numInputRows": 100, "inputRowsPerSecond": 50.0, "processedRowsPerSecond": 80.0}
    progress = StreamingQueryProgress.fromJson({
        "id": "00000000-0000-0000-0000-000000000000", "runId": "00000000-0000-0000-0000-000000000001",
        "name": "q", "timestamp": "2024-01-01T00:00:00.000Z", "batchId": 0, "batchDuration": 200,
        "durationMs": {}, "eventTime": {}, "stateOperators": [], "sources": [src],
        "sink": {"description": "memory", "numOutputRows": 0}, "observedMetrics": {}})
    assert progress["numInputRows"] is None and progress.numInputRows == 100
    store.update(progress)
    info = store.query_info("q")
    assert info.batches == 1 and info.input_rate == pytest.approx(50.0)
    assert info.sources["rate"].input_rate == pytest.approx(50.0)


def test_control_table_of_a_connect_session_goes_through_pyarrow(tmp_path):
    """A non-local URI with a Spark Connect session: no JVM here, so pyarrow.fs (before: TypeError)."""
    from pyspark_cq.control import ControlTable

    class ConnectLike:          # what a Connect session answers for sparkContext
        @property
        def sparkContext(self):
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported in Spark Connect")

    table = ControlTable("mock:///pyspark-cq/ct.json", spark=ConnectLike())   # pyarrow's in-memory filesystem
    assert table.backend == "arrow"
    table.register("op", window=10_000_000)
    assert table.entry("op").params["window"] == 10_000_000


def test_connect_server_command_refuses_bad_arguments(capsys):
    from pyspark_cq.cli import main

    assert main(["connect-server", "--conf", "spark.driver.memory"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["connect-server", "--port", "70000"]) == 1
    assert "port must be an int in [0, 65535]" in capsys.readouterr().err


def _ps() -> list[list[str]]:
    """pid, process group, parent and command of every process."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,pgid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    return [line.split(None, 3) for line in ps.splitlines()]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_connect_server_command_stops_its_server_on_every_stop_signal(sig, monkeypatch):
    """Each stop signal ends the command with exit code 0 after stopping its server, and the command gives the
    handlers it replaced back. A stand-in server (a real one is the test below, on SIGTERM) sends the signal to
    this process while the command waits on it; handlers installed before the command catch a signal it left
    alone (a SIGHUP at its default would end pytest)."""
    import argparse
    import signal
    import time

    import pyspark_cq.session
    from pyspark_cq.cli.connect import connect_server

    signum, caught, events = getattr(signal, sig), [], []

    class Process:
        pid = 4242

        def wait(self):
            os.kill(os.getpid(), signum)
            for _ in range(100):     # the command's handler raises here (at once, or within the first sleep)
                time.sleep(0.1)
            events.append("not stopped")
            return 7

    class Server:
        url, log, process = "sc://127.0.0.1:15002", "server.log", Process()

        def stop(self):
            events.append("server stopped")

    monkeypatch.setattr(pyspark_cq.session, "start_connect_server", lambda *a, **kw: Server())
    stops = (signal.SIGTERM, signal.SIGHUP)
    original = {s: signal.getsignal(s) for s in stops}
    ours = {s: (lambda signum, frame: caught.append(signum)) for s in stops}
    try:
        for s, handler in ours.items():
            signal.signal(s, handler)
        code = connect_server(argparse.Namespace(port=0, master="local[1]", conf=None))
        assert (code, events, caught) == (0, ["server stopped"], [])
        assert all(signal.getsignal(s) is h for s, h in ours.items())    # given back
    finally:
        for s, handler in original.items():
            signal.signal(s, handler)


@pytest.mark.spark
@pytest.mark.slow
def test_connect_server_command_stops_its_server_on_a_stop_signal(tmp_path):
    """issue 41: on SIGTERM the command exited and left the server's JVM (its own session) holding the port
    (SIGHUP goes to the same handler: the test above; one real server's start is the suite's time)."""
    import signal
    import socket
    import time

    sig = "SIGTERM"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    log = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "pyspark_cq.cli", "connect-server", "--port", str(port),
                             "--master", "local[1]"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    server = []
    try:
        deadline = time.monotonic() + 180
        while not listening() or "join it" not in (tmp_path / "out.txt").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.txt").read_text()
            time.sleep(0.5)
        # the server's processes: the JVM holding the port and the scripts of its process group
        jvm = [p for p in _ps() if f"binding.port={port}" in p[3] and "java" in p[3]]
        assert len(jvm) == 1
        server = [p[0] for p in _ps() if p[1] == jvm[0][1]]
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(120) == 0
        assert not listening()
        assert not [p for p in _ps() if p[0] in server]
        assert f"server pid {jvm[0][1]}" in (tmp_path / "out.txt").read_text()
    finally:
        proc.kill()
        proc.wait()
        log.close()
        left = {p[0] for p in _ps() if p[0] in server or f"binding.port={port}" in p[3]}
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)


def test_removing_the_last_listener_does_not_wait_on_an_event_in_flight():
    """``session.connect.remove_listener`` against the shape of PySpark's Connect listener bus: its event thread
    delivers one more event (taking the bus's lock) only after the server was asked to end the stream. PySpark's own
    ``remove`` joins that thread while holding the lock (a deadlock: seen in the Connect test run); ours returns
    with the event delivered and the listener off the bus. The real bus runs in the Connect run above."""
    import threading
    from types import SimpleNamespace

    from pyspark_cq.session.connect import remove_listener

    ended, delivered = threading.Event(), []
    bus = SimpleNamespace(_lock=threading.Lock(), _listener_bus=[], _execution_thread=None)

    def events():           # the reader: one last event after the server's removal, then the stream ends
        ended.wait(10)
        with bus._lock:
            delivered.extend(bus._listener_bus)

    bus._sqm = SimpleNamespace(_session=SimpleNamespace(client=SimpleNamespace(
        execute_command=lambda command: ended.set())))
    listener = object()
    bus._listener_bus.append(listener)
    bus._execution_thread = threading.Thread(target=events, daemon=True)
    bus._execution_thread.start()
    done = threading.Thread(target=remove_listener, args=(SimpleNamespace(streams=SimpleNamespace(_sqlb=bus)),
                                                          listener), daemon=True)
    done.start()
    done.join(20)
    assert not done.is_alive() and delivered == [listener]
    assert bus._listener_bus == [] and bus._execution_thread is None
