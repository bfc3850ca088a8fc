"""A real Spark cluster (issue 24, part 2): a standalone master and two workers on this machine whose executors
run the Python environment the job ships them (the built wheel, venv-pack'ed, through ``spark.archives``), not
the driver's. ``pyspark-cq doctor`` must hear from every executor, and the streaming join and aggregation must give
on the cluster exactly what they give in local mode. Both run in one application: doctor in the job's driver, on
its session, then the job.

The wheel and the environment are built once per run (~2-3 min); the cluster runs six JVMs (master, two
workers, two executors, the job's driver), so these tests are ``slow``.
"""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from helpers import cluster as C


@pytest.fixture(scope="session")
def executor_env(tmp_path_factory):
    """The executors' environment: this checkout's wheel with the workers' dependencies, venv-pack'ed."""
    out = tmp_path_factory.mktemp("executor_env")
    return C.pack_executor_env(C.build_wheel(out / "wheel"), out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = C.StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    yield c
    c.stop()


def _conf_args(archive):
    return [a for k, v in C.executor_conf(archive).items() for a in ("--conf", f"{k}={v}")]


@pytest.fixture(scope="module")
def on_the_cluster(cluster, executor_env, tmp_path_factory):
    """One application on the cluster: ``pyspark-cq doctor`` in the job's driver, on its session, then the job
    over ``write_input``'s files (one driver JVM and one set of executors, each unpacking the environment once;
    two applications, one per test, cost 20-30 s more: issue 41). (its directory, the driver's process)"""
    root = tmp_path_factory.mktemp("on_the_cluster")
    C.write_input(root / "in")
    proc = subprocess.run([sys.executable, C.__file__, "--doctor", "--master", cluster.url, *_conf_args(executor_env),
                           str(root / "in"), str(root / "cluster")], cwd=root, env=C.clean_env(),
                          capture_output=True, text=True, timeout=900)
    return root, proc


@pytest.mark.spark
@pytest.mark.slow
def test_doctor_hears_from_every_executor_in_its_shipped_environment(cluster, on_the_cluster):
    _, proc = on_the_cluster
    out = proc.stdout
    assert "DOCTOR 0" in out.splitlines() and "all checks passed" in out, out + proc.stderr[-3000:]
    assert "checking the running Spark session's Python workers (master spark://" in out, out
    executors = [line for line in out.splitlines() if "[ok]   executor " in line]
    assert len(executors) == 2 and "of 2" in executors[0], out
    for line in executors:
        # each executor's Python is the unpacked archive in its own working directory, not the driver's
        assert f"/{C.ENV_NAME}/bin/python" in line and sys.executable not in line, line
        assert str(cluster.root) in line, line
    modules = [line for line in out.splitlines() if "native modules" in line]
    assert len(modules) == 2 and all(f"{C.ENV_NAME}/lib/" in m and "_join=" in m for m in modules), out


@pytest.mark.spark
@pytest.mark.slow
def test_join_and_aggregation_on_the_cluster_equal_local_mode(spark, on_the_cluster):
    root, proc = on_the_cluster
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    C.run_job(spark, root / "in", root / "local")                     # local mode: the test session
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("EXECUTORS ")]
    assert len(line.split()[1].split(",")) == 2, line
    for name in ("join", "agg"):
        local, remote = (pd.read_parquet(root / where / name) for where in ("local", "cluster"))
        cols = sorted(local.columns)
        local, remote = (df[cols].sort_values(cols).reset_index(drop=True) for df in (local, remote))
        assert len(local) > 0
        # doubles summed in another order may differ in the last bits
        pd.testing.assert_frame_equal(local, remote, check_dtype=True, check_exact=False, rtol=1e-12)


def test_runtime_warns_when_the_control_table_is_on_the_drivers_machine_only(tmp_path):
    from pyspark_cq.runtime import CQRuntime

    class Conf:
        def get(self, key, default=None):
            return "spark://10.0.0.1:7077" if key == "spark.master" else default

    class ClusterSession:        # what CQRuntime asks of a session before any query runs
        conf, readStream, streams = Conf(), None, None

    with pytest.warns(UserWarning, match="executors on other machines cannot read it"):
        CQRuntime(ClusterSession(), control_path=str(tmp_path / "ct.json"))
