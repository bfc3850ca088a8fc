"""One Python process with a classic Spark session of its own (``cq.spark("local[2]")``), as a user's script
starts one, whose output two tests read: tests/test_package.py (issue 41 item 4: the workers that planned a Python
data source end without a traceback when Spark lets idle workers go) and tests/test_newcomer_defects.py (issue 41
item 8: such a session logs only what matters, to its stop). One JVM start for both instead of one each (issue 41:
the suite's time); the data source's workers are counted before the streaming query runs, so only they count."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: A Python data source whose schema (computed in the worker that plans it) says which daemon runs there.
PROBE_SOURCE = '''
import sys
from pyspark.sql.datasource import DataSource, DataSourceReader


class DaemonProbe(DataSource):
    """A data source whose schema (computed in the worker that plans it) says which daemon runs there."""

    @classmethod
    def name(cls):
        return "daemon_probe"

    def schema(self):
        ours = "pyspark_cq._daemon" in sys.modules
        zipped = ".zip" in sys.modules["pyspark"].__file__
        return f"{'cq_daemon' if ours else 'spark_daemon'}_{'zip' if zipped else 'installed'} int"

    def reader(self, schema):
        return _Reader()


class _Reader(DataSourceReader):
    def read(self, partition):
        yield (1,)
'''

#: The process (``python -c SCRIPT <directory holding daemon_probe_source.py>``): prints ``rows``, ``idle workers N
#: processes M``, ``stopped idle workers <bool>`` and ``DONE``.
SCRIPT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import pyspark_cq as cq
import daemon_probe_source
from pyspark import cloudpickle
cloudpickle.register_pickle_by_value(daemon_probe_source)
from daemon_probe_source import DaemonProbe


def parents():
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            out[int(pid)] = int(fields[1])
    return out


def workers():
    # the daemons' forked workers: grandchildren of the JVM, itself this process's child
    tree = parents()
    jvms = {p for p, pp in tree.items() if pp == os.getpid()}
    daemons = {p for p, pp in tree.items() if pp in jvms}
    return {p for p, pp in tree.items() if pp in daemons}


# a classic session of its own, as a user's script starts one (the quiet-logs checks read all of its stderr)
spark = cq.spark("local[2]", warm_workers=False)
# issue 41 item 4: the workers that planned a Python data source end without a traceback when Spark lets them go
spark.dataSource.register(DaemonProbe)
print("rows", spark.read.format("daemon_probe").load().count(), flush=True)
# SparkEnv's private map of worker factories, through reflection (py4j cannot list SparkEnv's own methods here:
# one signature names a protobuf class this classpath lacks)
field = spark._jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField("pythonWorkers")
field.setAccessible(True)
it = field.get(spark.sparkContext._jsc.sc().env()).valuesIterator()
factories = []
while it.hasNext():
    factories.append(it.next())
idle, alive = sum(f.idleWorkers().size() for f in factories), workers()
print("idle workers", idle, "processes", len(alive), flush=True)
# Spark's monitor thread (every 10 s) stops a factory's idle workers once its last activity lies a minute back
# (PythonWorkerFactory.IDLE_WORKER_TIMEOUT_NS, fixed): date the activity back instead of waiting the minute out.
back = spark._jvm.System.nanoTime() - 61 * 10**9
for f in factories:
    getattr(f, "org$apache$spark$api$python$PythonWorkerFactory$$lastActivityNs_$eq")(back)
deadline = time.monotonic() + 120
while time.monotonic() < deadline and (any(f.idleWorkers().size() for f in factories) or alive & workers()):
    time.sleep(0.5)
print("stopped idle workers", sum(f.idleWorkers().size() for f in factories) == 0 and not alive & workers(),
      flush=True)
# issue 41 item 8: a streaming query on the same session; the stop must log no maintenance error
rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
agg = cq.sliding_aggregate(rate.withWatermark("timestamp", "1 second"), "timestamp", "10 seconds", "5 seconds",
                           aggs={"value": ["sum"]})
q = agg.writeStream.format("noop").trigger(availableNow=True).start()   # no checkpoint: a temporary one
q.awaitTermination()
spark.stop()
print("DONE")
"""


def run(directory: Path) -> subprocess.CompletedProcess:
    """Run ``SCRIPT`` in ``directory`` (the probe's module written there), without ``SPARK_REMOTE``: its output."""
    (directory / "daemon_probe_source.py").write_text(PROBE_SOURCE)
    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=600)
