"""A real Spark cluster for tests (issue 24, part 2): a standalone master and two workers started from the
pip-installed PySpark as separate processes, executors whose Python environment is shipped to them (the built
wheel in a venv-pack'ed environment, through ``spark.archives``, as on YARN or Kubernetes), and the streaming
job that runs on it and in local mode (``python cluster.py ...`` is the cluster job's driver)."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What the executors' environment ships besides the wheel: the packages Spark's Python workers import for
#: pyspark-cq's Arrow functions. PySpark comes from the cluster (pyspark.zip on the workers' path); Numba (the
#: estimators) and SciPy (the precision allocation, STREAM §5.1) are driver-only, so the environment leaves them
#: out, as docs/deploy.md's recipe does (SciPy was 143 of the environment's 530 MB unpacked: each executor
#: unpacks the archive, issue 41).
DRIVER_ONLY = ("pyspark", "numba", "scipy")
#: Spark settings that send the environment to every executor and make its workers use it.
ENV_NAME = "environment"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(argv, **kw) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")


def build_wheel(out: Path) -> Path:
    """``pip wheel`` of this checkout (compiles the native modules, ~1-2 min) into ``out``."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)], timeout=1200)
    (wheel,) = out.glob("pyspark_cq-*.whl")
    return wheel


def pack_executor_env(wheel: Path, out: Path) -> Path:
    """A new virtual environment with ``wheel`` and the workers' dependencies, packed by venv-pack; returns
    the ``.tar.gz`` to ship with ``spark.archives=<it>#environment``."""
    env = out / "executor-venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(env)], timeout=300)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, "--no-deps", str(wheel)], timeout=600)
    requires = [r for r in metadata.requires("pyspark-cq") or () if "extra ==" not in r
                and not r.split(">")[0].split("<")[0].split("=")[0].strip().startswith(DRIVER_ONLY)]
    _run([*pip, *requires], timeout=1200)
    archive = out / "executor-env.tar.gz"
    # level 1: the archive only crosses this machine's disk; gzip's default level 4 costs seconds of the suite
    _run([sys.executable, "-m", "venv_pack", "-q", "--compress-level", "1", "-p", str(env), "-o", str(archive)],
         timeout=600)
    return archive


def executor_conf(archive: Path) -> dict:
    """The settings a job on the cluster needs: ship the environment, run the workers' Python from it."""
    return {"spark.archives": f"{archive}#{ENV_NAME}", "spark.pyspark.python": f"./{ENV_NAME}/bin/python",
            "spark.executor.memory": "512m", "spark.executor.cores": "1"}


def clean_env() -> dict:
    """This process's environment without the Python settings of the test session (the cluster's processes
    must not learn the driver's interpreter from it)."""
    env = dict(os.environ)
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(var, None)
    from pyspark_cq.session import find_java

    env.setdefault("JAVA_HOME", find_java()[0])
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m")
    return env


class StandaloneCluster:
    """``spark-class`` Master and ``workers`` Workers (``cores`` cores, ``memory`` each) on this machine."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 120.0):
        from pyspark.find_spark_home import _find_spark_home

        spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
        self.procs: list[subprocess.Popen] = []
        self.root = root
        port = _free_port()
        self.url = f"spark://127.0.0.1:{port}"
        env = clean_env()
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(_free_port())], env)
        self._wait(lambda: self._listening(port), timeout, "the master")
        for i in range(workers):
            work = root / f"worker{i + 1}"
            work.mkdir(parents=True, exist_ok=True)
            self._start(f"worker{i + 1}", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                           "--cores", str(cores), "--memory", memory, "--work-dir", str(work),
                                           "--webui-port", str(_free_port()), self.url], env)
        self._wait(lambda: all("Successfully registered with master" in self.log(f"worker{i + 1}")
                               for i in range(workers)), timeout, "the workers' registration")

    def _start(self, name, argv, env) -> None:
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs.append(subprocess.Popen(argv, env=env, cwd=str(self.root), stdout=out,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))

    def log(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _listening(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def _wait(self, ready, timeout, what) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                                 for f in sorted(self.root.glob("*.log")))
                self.stop()
                raise RuntimeError(f"{what} did not come up:\n{logs}")
            time.sleep(0.5)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


# --- the job ---------------------------------------------------------------------------------------------

def write_input(root: Path, batches: int = 4, seed: int = 24) -> None:
    """Both sides of the join as one parquet file per micro-batch (helpers.join_data's rows)."""
    import numpy as np

    from helpers import join_data as jd

    rng = np.random.default_rng(seed)
    for i in range(batches):
        t0 = jd.BASE_US + i * 10_000_000
        for side in ("l", "r"):
            jd.write(str(root / side), f"b{i:03d}.parquet", jd.side_table(rng, side, 80, t0, late=3 if i >= 2 else 0))


def run_job(spark, root: Path, out: Path) -> None:
    """The streaming interval join and sliding aggregation over ``root``'s files, to parquet under ``out``
    (``lv`` holds values near the long range's ends: summed, they overflow, so the aggregation sums ``tag``)."""
    import pyspark_cq as cq
    from helpers import join_data as jd
    from helpers.streaming import run_side_by_side

    def side(s):
        return (spark.readStream.schema(jd.schema(s)).option("maxFilesPerTrigger", 1).parquet(str(root / s))
                .withWatermark("ts", "15 seconds"))

    queries = {
        "join": cq.interval_join(side("l"), side("r"), ["k", "s"], "ts", "ts", f"{jd.LOWER_S} seconds",
                                 f"{jd.UPPER_S} seconds", how="left", suffixes=("_l", "_r"), name="join"),
        "agg": cq.sliding_aggregate(side("l"), "ts", "20 seconds", "10 seconds", by="k",
                                    aggs={"lv": ["max", "min"], "tag": ["sum", "min"], "*": ["count"]}, name="agg"),
    }
    # side by side: the two small queries' micro-batch latencies overlap (issue 41: the suite's time)
    run_side_by_side(*(df.writeStream.format("parquet").option("path", str(out / name))
                       .option("checkpointLocation", str(out / f"_ck_{name}")) for name, df in queries.items()))


def main(argv=None) -> int:
    """The cluster job's driver: ``python cluster.py [--doctor] --master URL [--conf K=V ...] INPUT OUTPUT``.

    ``--doctor``: ``pyspark-cq doctor`` first, in this driver on its session (it checks every executor of the
    running session and keeps it), then the job on the same executors: one application, one driver JVM and one
    set of executors unpacking the environment (issue 41: the suite's time). Prints ``DOCTOR <exit code>``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--conf", action="append", default=[])
    parser.add_argument("--doctor", action="store_true")
    parser.add_argument("input")
    parser.add_argument("output")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # tests/, for helpers.join_data
    import pyspark_cq as cq

    conf = dict(c.split("=", 1) for c in args.conf)
    spark = cq.spark(args.master, "pyspark-cq-cluster-test", shuffle_partitions=2, conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.doctor:
            from pyspark_cq.cli import main as cli

            code = cli(["doctor"])
            print(f"DOCTOR {code}", flush=True)
            if code:
                return code
        run_job(spark, Path(args.input), Path(args.output))
        # where the work ran: every task's executor, from the JVM's status tracker
        ids = spark.sparkContext._jsc.sc().getExecutorIds()
        print("EXECUTORS", ",".join(sorted(str(ids.apply(i)) for i in range(ids.size()))), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
