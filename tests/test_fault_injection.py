"""Crash recovery, quick variant of benchmarks/experiments/fault_injection.py (issue 23, docs/reliability.md): the
interval join in a child process (6 files, one per batch) is SIGKILLed at a random moment and
restarted on its checkpoint; the file sink then holds exactly the rows of an uninterrupted run (none
lost, none duplicated). The full run (>= 20 kills per operator, every operator) is the script's. Its three kinds
of state persistence run in one invocation of the script, which makes their reference run once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_cq.experiments.recovery import compare

ROOT = Path(__file__).resolve().parents[1]   # the script runs as a module from here, never imported by a test


#: The interval join under its three kinds of state persistence: one invocation of the script, so that their
#: uninterrupted run (the same inputs, the same rows) is made once; each is killed and restarted on its own.
INTERVAL_JOINS = ("interval_join", "interval_join_changelog", "interval_join_files")


@pytest.fixture(scope="module")
def interval_joins_killed(tmp_path_factory):
    """The script's results for ``INTERVAL_JOINS`` (seed 5, one kill over 6 files each) by operator, and its exit
    code."""
    results, code = _run_script(tmp_path_factory.mktemp("interval_joins"), "--operator", ",".join(INTERVAL_JOINS),
                                "--kills", "1", "--files", "6", "--seed", "5")
    return {r["operator"]: r for r in results}, code


@pytest.mark.spark
@pytest.mark.slow
def test_a_kill_loses_and_duplicates_nothing(interval_joins_killed):
    _loses_nothing(*interval_joins_killed, "interval_join")


def test_comparison_counts_lost_and_duplicated_rows():
    """The oracle side of the script: multiset differences, not set differences."""
    want = [[1, "a"], [1, "a"], [2, "b"]]
    assert compare(want, [[1, "a"], [2, "b"], [2, "b"], [3, "c"]]) == {
        "expected_rows": 3, "rows": 4, "lost": 1, "duplicated": 1, "unexpected": 1}
    assert compare(want, list(reversed(want)))["lost"] == 0


def _run_script(tmp_path, *extra) -> tuple[list[dict], int]:
    """The fault-injection script in a child process (as the tests here run it): (its results, exit code)."""
    out = tmp_path / "result.json"
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "path"),
                                                                    os.environ.get("PYTHONPATH")])))
    code = subprocess.run([sys.executable, "-m", "benchmarks.experiments.fault_injection", *extra, "--workdir",
                           str(tmp_path / "work"), "--out", str(out), "--no-json"], cwd=tmp_path / "path",
                          env=env).returncode
    return json.loads(out.read_text()), code


def _loses_nothing(results: dict, code: int, operator: str) -> None:
    """``operator``'s run of the script, SIGKILLed once: the sink holds exactly the uninterrupted run's rows (the exit
    code says so for every operator of the run)."""
    result = results[operator]
    assert "error" not in result, result
    assert result["kills"] == 1 and result["expected_rows"] > 0
    assert (result["lost"], result["duplicated"], result["unexpected"]) == (0, 0, 0), result
    assert result["rows"] == result["expected_rows"] and code == 0


@pytest.mark.spark
@pytest.mark.slow
def test_changelog_join_killed_loses_and_duplicates_nothing(interval_joins_killed):
    """The same with ``state_persistence="changelog"`` (issue 39): the restarted child's workers hold no
    resident state, so every shard restores from its snapshot and deltas. Its reference is the uninterrupted
    run of the resident join (the same rows)."""
    _loses_nothing(*interval_joins_killed, "interval_join_changelog")


@pytest.mark.spark
@pytest.mark.slow
def test_files_join_killed_loses_and_duplicates_nothing(interval_joins_killed):
    """The same with ``state_persistence="files"`` (issue 39): the restarted child rebuilds every shard from
    the snapshot and delta files its checkpoint's manifests name; files of batches a kill interrupted are
    orphans."""
    _loses_nothing(*interval_joins_killed, "interval_join_files")


@pytest.mark.spark
@pytest.mark.slow
def test_query_group_killed_loses_and_duplicates_nothing(tmp_path):
    """A QueryGroup (issue 40: shared aggregations, one with HAVING, one ISTREAM, and a query running alone)
    SIGKILLed and restarted on its checkpoint: every query's sink holds exactly the uninterrupted run's rows (its
    directory sinks are rewritten by batch id when a batch runs again)."""
    results, code = _run_script(tmp_path, "--operator", "query_group", "--kills", "1", "--files", "6", "--seed", "4")
    _loses_nothing({r["operator"]: r for r in results}, code, "query_group")
